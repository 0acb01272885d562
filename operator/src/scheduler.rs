//! The lj-runtimekit-scheduler: takes pending pods from the state in order, decides each with the
//! placement engine under the state's lock, and writes the decision (one GpuSlice per card and
//! one Binding carrying the allocation annotation, all at once) in parallel tasks, so throughput
//! is bounded by the apiserver rather than by this loop.

use crate::metrics::AttemptResult;
use crate::report::Reports;
use crate::shared::Shared;
use crate::state::{Binding, Outcome};
use futures::future::join_all;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::{Client, Resource, ResourceExt};
use runtimekit_contract::allocation::Allocation;
use runtimekit_crds::{GpuSlice, SLICE_FINALIZER};
use runtimekit_placement::Decision;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

/// How many bindings may be written at once.
const BINDINGS_IN_FLIGHT: usize = 256;
/// How many pods one pass takes from the queue before it looks at the state again.
const BATCH: usize = 512;

/// The field manager of the scheduler's writes.
pub const FIELD_MANAGER: &str = "lj-runtimekit-scheduler";

/// Runs the scheduling loop until the task is dropped.
pub async fn run(shared: Arc<Shared>, client: Client, reports: Reports) {
    let permits = Arc::new(Semaphore::new(BINDINGS_IN_FLIGHT));
    let mut changes = shared.subscribe();
    loop {
        let now = Instant::now();
        let (batch, next_retry) = {
            let mut state = shared.lock();
            let moved = state.refresh_topology();
            if state.take_capacity_freed() || moved {
                state.retry_soon(now);
            }
            let batch = state.ready(now, BATCH);
            shared
                .metrics
                .queue_depth
                .set(i64::try_from(state.pending_count()).unwrap_or(i64::MAX));
            (batch, state.next_retry())
        };
        for uid in batch {
            let started = Instant::now();
            let outcome = shared.lock().schedule(&uid, Instant::now());
            shared
                .metrics
                .decision_seconds
                .observe(started.elapsed().as_secs_f64());
            match outcome {
                Outcome::Bind(binding) => {
                    let permit = Arc::clone(&permits).acquire_owned().await;
                    let (shared, client, reports) =
                        (Arc::clone(&shared), client.clone(), reports.clone());
                    tokio::spawn(async move {
                        bind(&shared, &client, &reports, *binding, permit).await;
                    });
                }
                Outcome::Unschedulable { message, changed } => {
                    shared.metrics.attempt(AttemptResult::Unschedulable);
                    if changed {
                        report_pod(&shared, &reports, &uid, "Unschedulable", &message);
                    }
                }
                Outcome::Invalid {
                    message,
                    reason,
                    changed,
                } => {
                    shared.metrics.attempt(AttemptResult::Invalid);
                    if changed {
                        report_pod(&shared, &reports, &uid, reason, &message);
                    }
                }
                Outcome::Skip => {}
            }
        }
        let wait = next_retry
            .map_or(Duration::from_secs(5), |t| {
                t.saturating_duration_since(Instant::now())
            })
            .max(Duration::from_millis(20));
        tokio::select! {
            _ = changes.changed() => {}
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// Reports why a pod waits, in a task of its own: the decision loop never waits for the
/// condition write, so a burst of unschedulable pods does not hold up the bindings. Only a
/// changed message is written, and a pod is retried after its backoff or a change of capacity,
/// so two writes for one pod are far apart compared with a write's latency.
fn report_pod(shared: &Shared, reports: &Reports, uid: &str, reason: &str, message: &str) {
    let pod = shared
        .lock()
        .pod(uid)
        .and_then(|p| p.pending.as_ref().map(|p| Arc::clone(&p.pod)));
    if let Some(pod) = pod {
        let (reports, reason, message) = (reports.clone(), reason.to_owned(), message.to_owned());
        tokio::spawn(async move { reports.unschedulable(&pod, &reason, &message).await });
    }
}

/// The name of the GpuSlice for one card of one container: unique per pod UID, so a new pod of
/// the same name never collides with the slices of an old one still being released.
pub fn slice_name(pod: &str, uid: &str, container_index: usize, replica: u32) -> String {
    let pod: String = pod.chars().take(200).collect();
    let uid: String = uid
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(8)
        .collect();
    format!(
        "{}-{uid}-{container_index}-{replica}",
        pod.trim_end_matches(['-', '.'])
    )
}

/// The allocation annotation of a decision: the cards, and the GpuSlice recording each.
pub fn allocation_of(pod: &Pod, decision: &Decision) -> Allocation {
    let name = pod.name_any();
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let containers: Vec<&str> = pod
        .spec
        .iter()
        .flat_map(|s| s.containers.iter().map(|c| c.name.as_str()))
        .collect();
    decision.allocation(|container, replica| {
        let index = containers.iter().position(|c| *c == container).unwrap_or(0);
        slice_name(&name, &uid, index, replica)
    })
}

/// The GpuSlices and the allocation annotation of a decision.
pub fn slices_and_allocation(pod: &Pod, decision: &Decision) -> (Vec<GpuSlice>, Allocation) {
    let allocation = allocation_of(pod, decision);
    let slices = slice_objects(
        &pod.namespace().unwrap_or_default(),
        &pod.name_any(),
        pod.metadata.uid.as_deref().unwrap_or_default(),
        decision,
        &slice_names(&allocation),
    );
    (slices, allocation)
}

/// The GpuSlice of each card an allocation records, in the order of
/// [`Decision::gpu_slices`].
pub fn slice_names(allocation: &Allocation) -> Vec<String> {
    allocation
        .containers
        .iter()
        .flat_map(|c| c.cards.iter().map(|card| card.slice.clone()))
        .collect()
}

/// The GpuSlices of the pod `namespace/name` (`uid`) for a decision, named by `names` in the
/// order of [`Decision::gpu_slices`]: owned by the pod, so they go when it goes, and carrying
/// the node agent's finalizer, so their capacity returns only once the agent has let go.
pub fn slice_objects(
    namespace: &str,
    name: &str,
    uid: &str,
    decision: &Decision,
    names: &[String],
) -> Vec<GpuSlice> {
    let owner = OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: name.to_owned(),
        uid: uid.to_owned(),
        controller: Some(true),
        block_owner_deletion: None,
    };
    decision
        .gpu_slices(namespace, name)
        .into_iter()
        .zip(names)
        .map(|(spec, slice)| GpuSlice {
            metadata: ObjectMeta {
                name: Some(slice.clone()),
                namespace: Some(namespace.to_owned()),
                owner_references: Some(vec![owner.clone()]),
                finalizers: Some(vec![SLICE_FINALIZER.into()]),
                ..ObjectMeta::default()
            },
            spec,
            status: None,
        })
        .collect()
}

/// Writes one decision: the slices and the Binding at once, so a pod waits for one round trip
/// rather than two. Whatever part fails is safe to leave: a pod that got its Binding has its
/// allocation annotation, from which missing slices are re-created; slices without a Binding
/// hold their cards until the pod is bound to them on the next try or they are released.
async fn bind<P>(shared: &Shared, client: &Client, reports: &Reports, binding: Binding, permit: P) {
    let Binding {
        pod,
        decision,
        warnings,
        annotation,
    } = binding;
    let uid = decision.pod_uid.clone();
    let started = Instant::now();
    let (slices, allocation) = slices_and_allocation(&pod, &decision);
    let api: Api<GpuSlice> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
    let (created, posted) = tokio::join!(
        join_all(slices.iter().map(|slice| create_slice(&api, slice))),
        post_binding(client, &pod, &annotation, &allocation),
    );
    // The writes are done: let the next binding start while the Events are published.
    drop(permit);
    shared
        .metrics
        .binding_seconds
        .observe(started.elapsed().as_secs_f64());
    shared
        .lock()
        .slices_created(slices.iter().zip(created.iter().map(Result::is_ok)));
    for error in created.iter().filter_map(|r| r.as_ref().err()) {
        tracing::warn!(pod = %pod.name_any(), %error, "writing a GpuSlice failed");
    }
    match posted {
        Ok(()) => {
            // Slices that failed are re-created from the allocation the pod now carries.
            shared.lock().bound(&uid);
            shared.metrics.attempt(AttemptResult::Scheduled);
            if let Some(created) = pod.metadata.creation_timestamp.as_ref() {
                let age = k8s_openapi::jiff::Timestamp::now().duration_since(created.0);
                shared
                    .metrics
                    .create_to_bound_seconds
                    .observe(age.as_secs_f64().max(0.0));
            }
            let reference = pod.object_ref(&());
            for warning in warnings {
                reports
                    .event(
                        &reference,
                        true,
                        warning.reason(),
                        "Scheduling",
                        &warning.to_string(),
                    )
                    .await;
            }
            reports
                .event(
                    &reference,
                    false,
                    "Scheduled",
                    "Binding",
                    &format!(
                        "Successfully assigned {}/{} to {}",
                        pod.namespace().unwrap_or_default(),
                        pod.name_any(),
                        decision.node
                    ),
                )
                .await;
        }
        Err(error) => {
            shared.metrics.attempt(AttemptResult::Error);
            tracing::warn!(pod = %pod.name_any(), %error, "binding failed; will retry");
            let changed = shared
                .lock()
                .bind_failed(&uid, Instant::now(), &error.to_string());
            if changed {
                reports
                    .unschedulable(
                        &pod,
                        "BindingFailed",
                        &format!("binding to {} failed: {error}", decision.node),
                    )
                    .await;
            }
        }
    }
    shared.wake();
}

/// Why writing a binding failed.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("creating GpuSlice {name}: {source}")]
    Slice { name: String, source: kube::Error },
    #[error("GpuSlice {name} exists for another pod")]
    SliceTaken { name: String },
    #[error("posting the Binding: {0}")]
    Binding(kube::Error),
    #[error("the pod is already bound to {node:?} with another allocation")]
    BoundElsewhere { node: String },
    #[error("encoding the allocation: {0}")]
    Encode(#[from] serde_json::Error),
}

/// Posts the Binding of a decided pod, carrying its allocation annotation (the apiserver copies
/// it onto the pod). A pod already bound is fine only if it is bound exactly so: an earlier try
/// of this decision landed.
pub async fn post_binding(
    client: &Client,
    pod: &Pod,
    annotation: &str,
    allocation: &Allocation,
) -> Result<(), BindError> {
    let namespace = pod.namespace().unwrap_or_default();
    let recorded = serde_json::to_string(allocation)?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let binding = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": pod.name_any(), "annotations": {annotation: recorded}},
        "target": {"apiVersion": "v1", "kind": "Node", "name": allocation.node},
    });
    let posted: Result<serde_json::Value, kube::Error> = pods
        .create_subresource("binding", &pod.name_any(), &PostParams::default(), &binding)
        .await;
    let error = match posted {
        Ok(_) => return Ok(()),
        // A plain rejection: the Binding did not land.
        Err(kube::Error::Api(e)) if e.code != 409 && e.code < 500 => {
            return Err(BindError::Binding(kube::Error::Api(e)));
        }
        // Already bound (an earlier try landed), or the request's fate is unknown (a timeout,
        // a dropped connection): the pod says whether this Binding is the one that holds.
        Err(e) => e,
    };
    let current = pods
        .get(&pod.name_any())
        .await
        .map_err(BindError::Binding)?;
    let node = current.spec.as_ref().and_then(|s| s.node_name.clone());
    match node {
        Some(node)
            if node == allocation.node
                && current.annotations().get(annotation) == Some(&recorded) =>
        {
            Ok(())
        }
        Some(node) => Err(BindError::BoundElsewhere { node }),
        None => Err(BindError::Binding(error)),
    }
}

/// Creates one slice; an identical slice already there (from an earlier try) is fine.
pub async fn create_slice(api: &Api<GpuSlice>, slice: &GpuSlice) -> Result<(), BindError> {
    let name = slice.name_any();
    match api
        .create(
            &PostParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..PostParams::default()
            },
            slice,
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => {
            let existing = api.get(&name).await.map_err(|source| BindError::Slice {
                name: name.clone(),
                source,
            })?;
            if existing.spec == slice.spec && existing.metadata.deletion_timestamp.is_none() {
                Ok(())
            } else {
                Err(BindError::SliceTaken { name })
            }
        }
        Err(source) => Err(BindError::Slice { name, source }),
    }
}
