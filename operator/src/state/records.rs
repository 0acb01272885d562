//! What the state keeps of each pod and GpuSlice.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use runtimekit_contract::{ContractError, GangMembership, PodRequest};
use runtimekit_placement as placement;
use std::sync::Arc;

/// Where a pod is in its life, as far as scheduling and gangs care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Life {
    /// Not running yet (phase Pending, or none reported).
    Waiting,
    /// Phase Running.
    Running,
    /// Phase Succeeded.
    Succeeded,
    /// Phase Failed.
    Failed,
    /// Being deleted, whatever its phase.
    Deleting,
}

impl Life {
    /// The life of `pod` as the API has it now.
    pub fn of(pod: &Pod) -> Life {
        if pod.metadata.deletion_timestamp.is_some() {
            return Life::Deleting;
        }
        match pod.status.as_ref().and_then(|s| s.phase.as_deref()) {
            Some("Running") => Life::Running,
            Some("Succeeded") => Life::Succeeded,
            Some("Failed") => Life::Failed,
            _ => Life::Waiting,
        }
    }

    /// Whether it ended or is being deleted: what it holds is to be released.
    pub fn ended(self) -> bool {
        matches!(self, Life::Succeeded | Life::Failed | Life::Deleting)
    }

    /// Whether it failed or is being deleted: its controller replaces it, so it no longer counts
    /// as a member of its gang.
    pub fn replaced(self) -> bool {
        matches!(self, Life::Failed | Life::Deleting)
    }

    /// Whether it ran: running, or completed successfully.
    pub fn ran(self) -> bool {
        matches!(self, Life::Running | Life::Succeeded)
    }
}

/// What is known about one pod.
#[derive(Debug, Clone)]
pub struct PodRecord {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
    /// The node it is bound to.
    pub node: Option<String>,
    /// Where it is in its life.
    pub life: Life,
    /// When it was created.
    pub created: Option<Timestamp>,
    /// The gang it belongs to (pods of our scheduler only).
    pub gang: Option<GangMembership>,
    /// For pods of our scheduler that are not bound yet: the pod (pruned) and its parsed request.
    pub pending: Option<Pending>,
    /// For bound pods of our scheduler that have not ended: what their allocation annotation
    /// records.
    pub recorded: Option<Arc<Recorded>>,
    /// What it holds of the card resources once placed, replicas counted (`None`: nothing).
    pub holding: Option<Arc<placement::quota::Holding>>,
    /// `spec.priority`, set by the apiserver from the pod's PriorityClass (0 without one).
    pub priority: i32,
    /// Whether it may evict others (`spec.preemptionPolicy` is not `Never`).
    pub preempts: bool,
    /// Its labels, for the PodDisruptionBudgets that select it.
    pub labels: Arc<std::collections::BTreeMap<String, String>>,
}

/// What a bound pod's allocation annotation records. It is the truth about the pod's cards: a
/// restarted operator accounts them from it before its first decision, re-creates GpuSlices
/// missing from it, and releases slices of the pod it does not name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// The decision it records.
    pub decision: placement::Decision,
    /// The GpuSlice of each card, in the order of [`placement::Decision::slice_inputs`].
    pub slices: Vec<String>,
}
impl Recorded {
    /// Each card's slice name and the engine's record of the card.
    pub(super) fn cards(&self) -> impl Iterator<Item = (&String, placement::SliceInput)> {
        self.slices.iter().zip(self.decision.slice_inputs())
    }
}

/// A pod waiting for this scheduler.
#[derive(Debug, Clone)]
pub struct Pending {
    /// The pod, without the fields scheduling never reads.
    pub pod: Arc<Pod>,
    /// The pod's request, or every contract rule it breaks.
    pub request: Result<PodRequest, ContractError>,
}

/// What is known about one GpuSlice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceRecord {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The owning pod's UID.
    pub pod_uid: String,
    /// The container.
    pub container: String,
    /// Which of the container's cards.
    pub replica: u32,
    /// The node.
    pub node: Option<String>,
    /// Whether deletion has begun.
    pub deleting: bool,
    /// Whether the node agent's finalizer is still on it.
    pub finalized: bool,
    /// The allocation it records, as the engine reads it.
    pub input: Option<placement::SliceInput>,
    /// The RDMA NICs it records for its container.
    pub nics: Vec<String>,
    /// Whether its node agent reports it Failed.
    pub failed: bool,
    /// Its mode, phase and MIG profile, for the ledger metrics.
    pub mode: runtimekit_crds::SliceMode,
    pub phase: Option<runtimekit_crds::SlicePhase>,
    pub profile: Option<String>,
}

/// A copy of a pending pod with what scheduling never reads removed (managed fields, container
/// commands, env, volumes, probes, status), to keep the cache small.
pub(super) fn prune(pod: &Pod) -> Pod {
    let mut pod = pod.clone();
    pod.metadata.managed_fields = None;
    pod.status = None;
    if let Some(spec) = pod.spec.as_mut() {
        spec.volumes = None;
        for container in spec
            .containers
            .iter_mut()
            .chain(spec.init_containers.iter_mut().flatten())
        {
            container.command = None;
            container.args = None;
            container.env = None;
            container.env_from = None;
            container.volume_mounts = None;
            container.liveness_probe = None;
            container.readiness_probe = None;
            container.startup_probe = None;
            container.lifecycle = None;
        }
    }
    pod
}
