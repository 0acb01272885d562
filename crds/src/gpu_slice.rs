//! GpuSlice: one allocated partition of one physical card for one container.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How a slice uses its card.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SliceMode {
    /// The whole card, for `aliyun.com/gpu` or `nvidia.com/gpu` requests.
    Whole,
    /// A time-division share of the card: a compute percentage and a memory cap.
    #[serde(rename = "TDM")]
    Tdm,
    /// A MIG hardware instance created for this slice.
    #[serde(rename = "MIG")]
    Mig,
}

/// One allocated partition of one physical card for one container. The scheduler creates it when
/// it binds the pod; the node agent on `nodeName` enacts it (creates the MIG instance or records
/// the TDM quota) and removes the finalizer once the instance is really destroyed after the pod
/// ends. Owned by its pod, so it is garbage-collected with it.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "runtimekit.aliyun.com",
    version = "v1alpha1",
    kind = "GpuSlice",
    plural = "gpuslices",
    shortname = "gslice",
    category = "runtimekit",
    namespaced,
    status = "GpuSliceStatus",
    derive = "PartialEq",
    doc = "One allocated partition of one physical card for one container.",
    printcolumn(name = "Node", type_ = "string", json_path = ".spec.nodeName", description = "node holding the card"),
    printcolumn(name = "Card", type_ = "integer", json_path = ".spec.card.index", description = "card index on the node"),
    printcolumn(name = "Mode", type_ = "string", json_path = ".spec.mode"),
    printcolumn(name = "Core", type_ = "integer", json_path = ".spec.core", description = "compute share in percent (TDM)"),
    printcolumn(name = "Memory", type_ = "string", json_path = ".spec.memory"),
    printcolumn(name = "Profile", type_ = "string", json_path = ".spec.migProfile", description = "MIG profile (MIG)"),
    printcolumn(name = "Pod", type_ = "string", json_path = ".spec.pod.name"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    selectable = ".spec.nodeName",
    validation = Rule::new("!has(oldSelf.spec.nodeName) || (has(self.spec.nodeName) && self.spec.nodeName == oldSelf.spec.nodeName)")
        .message("spec.nodeName is immutable once set"),
    validation = Rule::new("!has(oldSelf.spec.card) || (has(self.spec.card) && self.spec.card == oldSelf.spec.card)")
        .message("spec.card is immutable once set"),
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("self.mode != 'Whole' || (!has(self.core) && !has(self.slices) && !has(self.migProfile) && !has(self.migPlacementStart))")
        .message("a Whole slice takes the whole card: it carries no core, slices, migProfile or migPlacementStart"),
    validation = Rule::new("self.mode != 'TDM' || (!has(self.slices) && !has(self.migProfile) && !has(self.migPlacementStart))")
        .message("a TDM slice carries no slices, migProfile or migPlacementStart"),
    validation = Rule::new("self.mode != 'MIG' || (has(self.slices) && has(self.migProfile) && has(self.migPlacementStart) && !has(self.core))")
        .message("a MIG slice needs slices, migProfile and migPlacementStart, and carries no core"),
    validation = Rule::new("!has(self.slices) || !has(self.migPlacementStart) || (self.slices == 1 && self.migPlacementStart <= 6) || (self.slices == 2 && self.migPlacementStart in [0, 2, 4]) || (self.slices == 3 && self.migPlacementStart in [0, 4]) || (self.slices >= 4 && self.migPlacementStart == 0)")
        .message("migPlacementStart is not a legal start for this slice count (1: 0-6, 2: 0/2/4, 3: 0/4, 4 and 7: 0)"),
    validation = Rule::new("!has(self.slices) || !has(self.migProfile) || (self.slices == 1 && self.migProfile.startsWith('1g.')) || (self.slices == 2 && self.migProfile.startsWith('2g.')) || (self.slices == 3 && self.migProfile.startsWith('3g.')) || (self.slices == 4 && self.migProfile.startsWith('4g.')) || (self.slices == 7 && self.migProfile.startsWith('7g.'))")
        .message("migProfile must have as many compute slices as slices (3 slices: a 3g profile)"),
)]
pub struct GpuSliceSpec {
    /// The node holding the card. Set when the slice is reserved or bound, immutable after.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,

    /// The physical card this slice lives on. Immutable once set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub card: Option<CardRef>,

    /// How the slice uses the card: Whole, TDM (time-division share) or MIG (hardware instance).
    pub mode: SliceMode,

    /// Compute share of the card in percent, 1-100 (TDM only). Absent means no compute cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 100").message("core must be between 1 and 100 (percent of one card)"))]
    pub core: Option<u32>,

    /// Memory granted on the card, as `<n>Gi` or `<n>Mi` (for example `4Gi` or `512Mi`). For MIG
    /// slices this is the container's visible cap, at most the profile's memory. Absent means the
    /// whole memory of the card or instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // A bound length keeps the CEL rules' estimated cost within the apiserver's budget.
    #[schemars(length(max = 24))]
    #[x_kube(validation = Rule::new("self.matches('^[1-9][0-9]*(Mi|Gi)$')").message("memory must be a positive whole number of Mi or Gi, such as 4Gi or 512Mi"))]
    pub memory: Option<String>,

    /// MIG instance size in compute slices: 1, 2, 3, 4 or 7 (MIG only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self in [1, 2, 3, 4, 7]").message("slices must be one of 1, 2, 3, 4, 7"))]
    pub slices: Option<u32>,

    /// MIG profile chosen for the card's model, for example `3g.40gb` (MIG only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 24))]
    #[x_kube(validation = Rule::new("self.matches('^[1-8]g\\\\.[0-9]+gb(\\\\+me)?$')").message("migProfile must look like 3g.40gb"))]
    pub mig_profile: Option<String>,

    /// First memory slice of the MIG instance (its placement start, 0-7), chosen by the scheduler
    /// so that large profiles stay possible (MIG only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0 && self <= 7").message("migPlacementStart must be between 0 and 7"))]
    pub mig_placement_start: Option<u32>,

    /// The container this slice is allocated to.
    pub pod: PodRef,

    /// Which of the pod's cards this is, 0 to replica-1, for multi-card requests.
    #[serde(default)]
    pub replica_index: u32,

    /// Name of the GangGroup the pod belongs to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gang: Option<String>,

    /// The RDMA NICs attached to the container (`aliyun.com/rdma: 1`), recorded on its first
    /// card's slice.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nics: Vec<String>,
}

/// Parses a slice's memory value (`4Gi`, `512Mi`, as the CEL rule on `memory` admits) into MiB.
pub fn parse_slice_memory(value: &str) -> Option<u64> {
    if let Some(gib) = value.strip_suffix("Gi") {
        gib.parse::<u64>().ok()?.checked_mul(1024)
    } else {
        value.strip_suffix("Mi")?.parse().ok()
    }
}

/// A physical card on a node.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct CardRef {
    /// Index of the card on its node, as the driver numbers it.
    pub index: u32,
    /// UUID of the card, for example `GPU-5f1c...`.
    pub uuid: String,
}

/// The container a slice is allocated to.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PodRef {
    /// Namespace of the pod (the slice lives in the same namespace).
    pub namespace: String,
    /// Name of the pod.
    pub name: String,
    /// UID of the pod, so a new pod with the same name is never taken for the old one.
    pub uid: String,
    /// Name of the container within the pod.
    pub container: String,
}

/// Where a slice is in its life.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SlicePhase {
    /// Capacity held for a gang member before its Binding, as earlier versions of the
    /// scheduler wrote it. Read like no phase (a slice just written): the node agent enacts it.
    Reserved,
    /// The pod is bound; the node agent has not acted yet.
    Bound,
    /// The node agent is creating the instance or recording the quota.
    Creating,
    /// The instance exists and the container may use it.
    Ready,
    /// The pod ended; the node agent is destroying the instance.
    Releasing,
    /// The node agent could not enact the slice; see the conditions.
    Failed,
}

/// What the node agent reports about a slice.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GpuSliceStatus {
    /// Where the slice is in its life: Reserved, Bound, Creating, Ready, Releasing or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<SlicePhase>,

    /// The hardware MIG instance enacting this slice (MIG only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_instance: Option<MigInstanceRef>,

    /// A human-readable explanation of the phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,

    /// The spec generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Conditions of the slice, one per type (Ready).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}

/// The identity of a MIG instance on its card.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct MigInstanceRef {
    /// NVML GPU instance ID.
    pub gpu_instance_id: u32,
    /// NVML compute instance ID within the GPU instance.
    pub compute_instance_id: u32,
    /// MIG device UUID (`MIG-...`), as it goes into NVIDIA_VISIBLE_DEVICES.
    pub device_uuid: String,
}
