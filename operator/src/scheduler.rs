//! The lj-runtimekit-scheduler: takes pending pods from the state in order, decides each with the
//! placement engine under the state's lock, and writes the decision (one GpuSlice per card and
//! one Binding carrying the allocation annotation, all at once) in parallel tasks, so throughput
//! is bounded by the apiserver rather than by this loop.

use crate::metrics::AttemptResult;
use crate::shared::Shared;
use crate::state::{Binding, Outcome};
use crate::writes::binding::{create_slice, post_binding};
use crate::writes::{self, preemption, report::Reports};
use futures::future::join_all;
use kube::api::Api;
use kube::{Client, Resource, ResourceExt};
use runtimekit_crds::GpuSlice;
use runtimekit_placement::objects::slices_and_allocation;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

/// How many bindings may be written at once.
const BINDINGS_IN_FLIGHT: usize = 256;
/// How many pods one pass takes from the queue before it looks at the state again.
const BATCH: usize = 512;

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
            shared
                .metrics
                .holding_pods
                .set(i64::try_from(state.holding_count()).unwrap_or(i64::MAX));
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
                Outcome::Preempt {
                    eviction,
                    message,
                    changed,
                } => {
                    shared.metrics.attempt(AttemptResult::Unschedulable);
                    shared.metrics.preemption(eviction.victims.len());
                    if changed {
                        report_pod(&shared, &reports, &uid, "Unschedulable", &message);
                    }
                    let (client, reports) = (client.clone(), reports.clone());
                    let scheduler = shared.lock().config.scheduler_name.clone();
                    tokio::spawn(async move {
                        preemption::evict(&client, &reports, &scheduler, &eviction).await;
                    });
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
        join_all(
            slices
                .iter()
                .map(|slice| create_slice(&api, slice, writes::SCHEDULER))
        ),
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
            reports.scheduled(&pod, &decision.node).await;
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
