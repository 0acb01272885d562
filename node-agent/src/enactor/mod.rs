//! The GpuSlice enactor: watches the GpuSlices of this node (never its pods: the agent's
//! credentials grant no access to pods at all), and for each slice does what
//! [`decide::decide`] says through the resource layer, showing every step in the slice's
//! status (server-side apply, written only when it changes); then destroys the instances no
//! slice claims.
//!
//! The enactor is cut in two so that what it decides can be tested without an apiserver or a
//! resource layer: [`decide`] holds the pure decisions (what to do with a slice, its status,
//! which instances are orphans), and this module holds the loop that watches, calls the
//! resource layer and writes. The pure half is a child of the loop, not a sibling with a
//! similar name, so the tree says which file does I/O.

pub mod decide;

use crate::health::FaultState;
use crate::layer::InventoryRefresher;
use crate::model::{Inventory, NodeState, PreparedDevice, SliceInfo, WholeHolder};
use crate::task::AbortOnDrop;
use decide::{Decision, Orphan};
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use runtimekit_crds::{
    CONDITION_READY, GpuSlice, GpuSliceStatus, MigInstanceRef, SLICE_FINALIZER, SliceMode,
    SlicePhase,
};
use runtimekit_proto::resource::v1alpha1 as pb;
use runtimekit_proto::resource::v1alpha1::resource_layer_client::ResourceLayerClient;
use runtimekit_resource_layer::reason_of;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, watch};
use tonic::transport::Channel;

/// The field manager of slice status writes.
pub const FIELD_MANAGER: &str = "runtimekit-node-agent";
/// How long one create or destroy call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// How soon a pass that hit a transient error runs again.
const RETRY: Duration = Duration::from_secs(2);

/// Enacts the GpuSlices bound to one node.
#[derive(Clone)]
pub struct Enactor {
    /// The agent's client.
    pub client: Client,
    /// This node.
    pub node: String,
    /// The resource layer.
    pub layer: ResourceLayerClient<Channel>,
    /// What the agent knows; the enactor publishes the slices into it.
    pub state: watch::Sender<NodeState>,
    /// Lists the cards after every change.
    pub inventory: InventoryRefresher,
    /// Events on slices that cannot be enacted.
    pub recorder: Recorder,
    /// How often every slice is looked at even without a change.
    pub resync: Duration,
}

impl std::fmt::Debug for Enactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Enactor")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

/// A slice's status and resourceVersion as the agent last read or wrote them.
#[derive(Debug, Clone)]
struct Current {
    status: Option<GpuSliceStatus>,
    resource_version: Option<String>,
}

/// What executing one decision did.
#[derive(Debug, Default)]
struct Outcome {
    /// The phase the slice shows now, when it changed.
    phase: Option<SlicePhase>,
    /// A transient error: look again soon.
    retry: bool,
    /// An instance was created, adopted or destroyed.
    hardware: bool,
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// The part of a status this agent writes, to tell whether a write would change anything.
fn owned(status: &GpuSliceStatus) -> GpuSliceStatus {
    GpuSliceStatus {
        conditions: status
            .conditions
            .iter()
            .filter(|c| c.type_ == CONDITION_READY)
            .cloned()
            .collect(),
        ..status.clone()
    }
}

/// What a Ready slice's status says: stable, so a restart finds it unchanged.
fn ready_message(slice: &SliceInfo, instance: Option<&pb::Instance>) -> String {
    let card = format!("card {} ({})", slice.card, slice.card_uuid);
    match (slice.mode, instance.and_then(|i| i.mig.as_ref())) {
        (SliceMode::Mig, Some(mig)) => format!(
            "MIG instance {} at slot {} on {card}: GPU instance {}, {}",
            slice.mig_profile.as_deref().unwrap_or_default(),
            slice.mig_start.unwrap_or_default(),
            mig.gpu_instance_id,
            mig.device_uuid
        ),
        (SliceMode::Tdm, _) => format!(
            "time-division share of {card}: {}, {}",
            slice
                .core
                .map_or_else(|| "no compute cap".to_owned(), |c| format!("{c}% compute")),
            slice
                .memory_mib
                .map_or_else(|| "no memory cap".to_owned(), |m| format!("{m} MiB"))
        ),
        _ => format!("{card} is given whole to container {}", slice.container),
    }
}

fn creating_message(slice: &SliceInfo) -> String {
    match slice.mode {
        SliceMode::Mig => format!(
            "creating MIG instance {} at slot {} on card {}",
            slice.mig_profile.as_deref().unwrap_or_default(),
            slice.mig_start.unwrap_or_default(),
            slice.card
        ),
        _ => format!("recording the time-division share on card {}", slice.card),
    }
}

impl Enactor {
    /// Watches the node's slices and enacts them until the task is dropped.
    pub async fn run(self) {
        let selector = format!("spec.nodeName={}", self.node);
        let config = watcher::Config::default().fields(&selector);
        let (slices, slice_writer) = reflector::store::<GpuSlice>();
        let slice_events = reflector::reflector(
            slice_writer,
            watcher(Api::<GpuSlice>::all(self.client.clone()), config),
        )
        .default_backoff();
        let wake = Arc::new(Notify::new());
        let waker = wake.clone();
        let driver = tokio::spawn(async move {
            let mut events = Box::pin(slice_events);
            while let Some(event) = events.next().await {
                match event {
                    Ok(_) => waker.notify_one(),
                    Err(error) => tracing::warn!(%error, "watching the node's slices"),
                }
            }
        });
        let _driver = AbortOnDrop(driver);
        if slices.wait_until_ready().await.is_err() {
            return;
        }
        tracing::info!(node = %self.node, "watching the node's GpuSlices");
        let mut changes = self.state.subscribe();
        loop {
            let retry = self.pass(&slices).await;
            let mut seen = Relevant::of(&changes.borrow_and_update());
            let deadline = tokio::time::Instant::now() + if retry { RETRY } else { self.resync };
            loop {
                tokio::select! {
                    () = wake.notified() => break,
                    () = tokio::time::sleep_until(deadline) => break,
                    changed = changes.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        let now = Relevant::of(&changes.borrow_and_update());
                        if now != seen {
                            seen = now;
                            break;
                        }
                    }
                }
            }
            // Let a burst of events land before the next pass.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// One look at every slice; returns whether something should be retried soon.
    async fn pass(&self, slices: &Store<GpuSlice>) -> bool {
        let reachable = self.inventory.refresh().await;
        let objects = slices.state();
        let mut infos: Vec<(Arc<GpuSlice>, SliceInfo)> = objects
            .iter()
            .filter_map(|o| Some((o.clone(), SliceInfo::from_slice(o)?)))
            .collect();
        self.publish(&infos);
        if !reachable {
            return true;
        }
        let snapshot = self.state.borrow().clone();
        let mut retry = false;
        let mut hardware = false;
        for (object, info) in &mut infos {
            let has_finalizer = object
                .metadata
                .finalizers
                .as_ref()
                .is_some_and(|f| f.iter().any(|f| f == SLICE_FINALIZER));
            let decision = decide::decide(info, has_finalizer, &snapshot);
            if decision == Decision::Leave {
                continue;
            }
            tracing::debug!(slice = %info.key(), ?decision, "enacting");
            let outcome = match self.execute(object, info, decision).await {
                Ok(outcome) => outcome,
                Err(error) => {
                    tracing::warn!(slice = %info.key(), %error, "writing the slice failed");
                    Outcome {
                        retry: true,
                        ..Outcome::default()
                    }
                }
            };
            if let Some(phase) = outcome.phase {
                info.phase = Some(phase);
            }
            retry |= outcome.retry;
            hardware |= outcome.hardware;
        }
        self.publish(&infos);
        if let Some(inventory) = &snapshot.inventory {
            let listed: Vec<SliceInfo> = infos.iter().map(|(_, i)| i.clone()).collect();
            for orphan in decide::orphans(inventory.instances(), &listed) {
                hardware |= self.destroy_orphan(&orphan).await;
            }
        }
        if hardware {
            self.inventory.refresh().await;
        }
        retry
    }

    fn publish(&self, infos: &[(Arc<GpuSlice>, SliceInfo)]) {
        let slices: Vec<SliceInfo> = infos.iter().map(|(_, i)| i.clone()).collect();
        self.state.send_if_modified(|state| {
            let changed = state.slices != slices || !state.slices_synced;
            state.own_pods.extend(
                slices
                    .iter()
                    .map(|s| format!("{}/{}", s.pod_namespace, s.pod_name)),
            );
            state.slices = slices;
            state.slices_synced = true;
            changed
        });
    }

    async fn execute(
        &self,
        object: &GpuSlice,
        slice: &SliceInfo,
        decision: Decision,
    ) -> Result<Outcome, kube::Error> {
        let mut status = Current {
            status: object.status.clone(),
            resource_version: object.metadata.resource_version.clone(),
        };
        let mut outcome = Outcome::default();
        let bound = || {
            format!(
                "pod {}/{} is placed on this node; enacting",
                slice.pod_namespace, slice.pod_name
            )
        };
        match decision {
            Decision::Leave => {}
            Decision::Ready {
                bind_first,
                instance,
            } => {
                if bind_first {
                    status = self
                        .write(object, status, SlicePhase::Bound, bound(), None, None)
                        .await?;
                }
                let mig = instance.as_ref().and_then(decide::mig_ref);
                let message = ready_message(slice, instance.as_ref());
                self.write(object, status, SlicePhase::Ready, message, mig, None)
                    .await?;
                outcome.phase = Some(SlicePhase::Ready);
            }
            Decision::Create { bind_first, spec } => {
                if bind_first {
                    status = self
                        .write(object, status, SlicePhase::Bound, bound(), None, None)
                        .await?;
                }
                status = self
                    .write(
                        object,
                        status,
                        SlicePhase::Creating,
                        creating_message(slice),
                        None,
                        None,
                    )
                    .await?;
                outcome.phase = Some(SlicePhase::Creating);
                let mut request = tonic::Request::new(pb::CreateInstanceRequest {
                    key: slice.key(),
                    spec: Some(spec),
                });
                request.set_timeout(CALL_TIMEOUT);
                let mut layer = self.layer.clone();
                match layer.create_instance(request).await {
                    Ok(response) => {
                        let response = response.into_inner();
                        if response.adopted {
                            tracing::info!(slice = %slice.key(), "adopted the unclaimed MIG instance found on the card");
                        } else if response.created {
                            tracing::info!(slice = %slice.key(), "created the instance");
                        } else {
                            tracing::info!(slice = %slice.key(), "found the instance made earlier");
                        }
                        outcome.hardware = response.created || response.adopted;
                        let instance = response.instance;
                        let mig = instance.as_ref().and_then(decide::mig_ref);
                        let message = ready_message(slice, instance.as_ref());
                        self.write(object, status, SlicePhase::Ready, message, mig, None)
                            .await?;
                        outcome.phase = Some(SlicePhase::Ready);
                    }
                    Err(error) => {
                        let reason = reason_of(&error).unwrap_or("ResourceLayerError").to_owned();
                        if decide::permanent(&reason) {
                            self.fail(object, status, &reason, error.message()).await?;
                            outcome.phase = Some(SlicePhase::Failed);
                        } else {
                            tracing::warn!(slice = %slice.key(), %reason, error = %error.message(), "creating the instance failed; retrying");
                            let message = format!(
                                "{}; retrying: {}",
                                creating_message(slice),
                                error.message()
                            );
                            self.write(
                                object,
                                status,
                                SlicePhase::Creating,
                                message,
                                None,
                                Some(&reason),
                            )
                            .await?;
                            outcome.retry = true;
                        }
                    }
                }
            }
            Decision::Fail { reason, message } => {
                self.fail(object, status, reason, &message).await?;
                outcome.phase = Some(SlicePhase::Failed);
            }
            Decision::Release { destroy } => {
                let mig = status.status.as_ref().and_then(|s| s.mig_instance.clone());
                let releasing = if destroy {
                    "the pod ended; destroying the instance".to_owned()
                } else {
                    "the pod ended; releasing the whole card".to_owned()
                };
                status = self
                    .write(
                        object,
                        status,
                        SlicePhase::Releasing,
                        releasing,
                        mig.clone(),
                        None,
                    )
                    .await?;
                outcome.phase = Some(SlicePhase::Releasing);
                if destroy {
                    let mut request = tonic::Request::new(pb::DestroyInstanceRequest {
                        target: Some(pb::destroy_instance_request::Target::Key(slice.key())),
                    });
                    request.set_timeout(CALL_TIMEOUT);
                    let mut layer = self.layer.clone();
                    match layer.destroy_instance(request).await {
                        Ok(response) => {
                            let existed = response.into_inner().existed;
                            tracing::info!(slice = %slice.key(), existed, "destroyed the instance");
                            outcome.hardware = existed;
                        }
                        Err(error) => {
                            let reason = reason_of(&error).unwrap_or("ResourceLayerError");
                            tracing::warn!(slice = %slice.key(), %reason, error = %error.message(), "destroying the instance failed; retrying");
                            let message = format!(
                                "the pod ended; destroying the instance failed, retrying: {}",
                                error.message()
                            );
                            self.write(
                                object,
                                status,
                                SlicePhase::Releasing,
                                message,
                                mig,
                                Some(reason),
                            )
                            .await?;
                            outcome.retry = true;
                            return Ok(outcome);
                        }
                    }
                }
                self.remove_finalizer(object, &status).await?;
            }
        }
        Ok(outcome)
    }

    /// Writes a slice's status unless it would not change; returns the status now.
    async fn write(
        &self,
        object: &GpuSlice,
        current: Current,
        phase: SlicePhase,
        message: String,
        mig_instance: Option<MigInstanceRef>,
        reason: Option<&str>,
    ) -> Result<Current, kube::Error> {
        let desired = decide::slice_status(
            current.status.as_ref(),
            phase,
            message,
            mig_instance,
            reason,
            object.metadata.generation,
            now(),
        );
        if current.status.as_ref().map(owned).as_ref() == Some(&desired) {
            return Ok(current);
        }
        let namespace = object.metadata.namespace.as_deref().unwrap_or_default();
        let name = object.metadata.name.as_deref().unwrap_or_default();
        let api: Api<GpuSlice> = Api::namespaced(self.client.clone(), namespace);
        let patch = serde_json::json!({
            "apiVersion": "runtimekit.aliyun.com/v1alpha1",
            "kind": "GpuSlice",
            "status": desired,
        });
        let updated = api
            .patch_status(
                name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await?;
        tracing::info!(slice = %format!("{namespace}/{name}"), ?phase, "slice status");
        Ok(Current {
            status: updated.status,
            resource_version: updated.metadata.resource_version,
        })
    }

    async fn fail(
        &self,
        object: &GpuSlice,
        status: Current,
        reason: &str,
        message: &str,
    ) -> Result<(), kube::Error> {
        let was_failed = status.status.as_ref().and_then(|s| s.phase) == Some(SlicePhase::Failed);
        self.write(
            object,
            status,
            SlicePhase::Failed,
            message.to_owned(),
            None,
            Some(reason),
        )
        .await?;
        if !was_failed {
            tracing::warn!(slice = ?object.metadata.name, %reason, %message, "the slice cannot be enacted");
            let event = Event {
                type_: EventType::Warning,
                reason: reason.to_owned(),
                note: Some(message.chars().take(1000).collect()),
                action: "Enact".into(),
                secondary: None,
            };
            if let Err(error) = self.recorder.publish(&event, &object.object_ref(&())).await {
                tracing::warn!(%error, "could not publish an event");
            }
        }
        Ok(())
    }

    /// Removes the agent's finalizer, guarded by the resourceVersion so a concurrent change
    /// makes it fail rather than drop someone else's finalizer.
    async fn remove_finalizer(
        &self,
        object: &GpuSlice,
        current: &Current,
    ) -> Result<(), kube::Error> {
        let finalizers = object.metadata.finalizers.clone().unwrap_or_default();
        let kept: Vec<&String> = finalizers
            .iter()
            .filter(|f| *f != SLICE_FINALIZER)
            .collect();
        if kept.len() == finalizers.len() {
            return Ok(());
        }
        let namespace = object.metadata.namespace.as_deref().unwrap_or_default();
        let name = object.metadata.name.as_deref().unwrap_or_default();
        let api: Api<GpuSlice> = Api::namespaced(self.client.clone(), namespace);
        let patch = serde_json::json!({"metadata": {
            "finalizers": kept,
            "resourceVersion": current.resource_version,
        }});
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                tracing::info!(slice = %format!("{namespace}/{name}"), "released; finalizer removed");
                Ok(())
            }
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Destroys an instance no slice claims; returns whether something was destroyed.
    async fn destroy_orphan(&self, orphan: &Orphan) -> bool {
        let target = match orphan {
            Orphan::Key(key) => pb::destroy_instance_request::Target::Key(key.clone()),
            Orphan::Mig {
                card,
                gpu_instance_id,
            } => pb::destroy_instance_request::Target::MigInstance(pb::MigInstanceRef {
                device_index: *card,
                gpu_instance_id: *gpu_instance_id,
            }),
        };
        let mut request = tonic::Request::new(pb::DestroyInstanceRequest {
            target: Some(target),
        });
        request.set_timeout(CALL_TIMEOUT);
        let mut layer = self.layer.clone();
        match layer.destroy_instance(request).await {
            Ok(response) => {
                let existed = response.into_inner().existed;
                if existed {
                    tracing::warn!(?orphan, "destroyed an instance no slice claims");
                }
                existed
            }
            Err(error) => {
                tracing::warn!(?orphan, error = %error.message(), "could not destroy an instance no slice claims");
                false
            }
        }
    }
}

/// The parts of the node state whose change may change a decision.
#[derive(PartialEq)]
struct Relevant {
    inventory: Option<Inventory>,
    faults: FaultState,
    held_whole: BTreeMap<u32, Vec<WholeHolder>>,
    prepared: Vec<PreparedDevice>,
}

impl Relevant {
    fn of(state: &NodeState) -> Relevant {
        Relevant {
            inventory: state.inventory.clone(),
            faults: state.faults.clone(),
            held_whole: state.held_whole.clone(),
            prepared: state.prepared.clone(),
        }
    }
}
