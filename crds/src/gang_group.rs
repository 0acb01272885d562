//! GangGroup: a set of pods that is placed all at once or not at all.

use crate::common::{Tier, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

fn default_timeout_seconds() -> u32 {
    180
}

fn default_highest_tier() -> Tier {
    Tier::NetworkPod
}

/// A set of pods that is placed all at once or not at all. The operator creates one for pods
/// labelled `aliyun.com/min-member` (one per JobSet, or per explicit gang-name label), or a user
/// applies it. When the group is not complete and running within its timeout, the attempt is
/// recorded, whatever its pending members hold is released, they stay Pending with the reason,
/// and the group retries with backoff. Bound members are left alone unless `onTimeout` says
/// `DeleteBoundMembers`.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "runtimekit.aliyun.com",
    version = "v1alpha1",
    kind = "GangGroup",
    plural = "ganggroups",
    shortname = "gang",
    category = "runtimekit",
    namespaced,
    status = "GangGroupStatus",
    derive = "PartialEq",
    doc = "A set of pods that is placed all at once or not at all.",
    printcolumn(name = "Min", type_ = "integer", json_path = ".spec.minMember"),
    printcolumn(name = "Seen", type_ = "integer", json_path = ".status.members.seen"),
    printcolumn(
        name = "Reserved",
        type_ = "integer",
        json_path = ".status.members.reserved"
    ),
    printcolumn(name = "Bound", type_ = "integer", json_path = ".status.members.bound"),
    printcolumn(
        name = "Running",
        type_ = "integer",
        json_path = ".status.members.running"
    ),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Tier",
        type_ = "string",
        json_path = ".status.placement.tier",
        description = "tier the gang was placed in"
    ),
    printcolumn(name = "Attempts", type_ = "integer", json_path = ".status.attempts"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct GangGroupSpec {
    /// How many pods must be placed together. For a JobSet it must equal the replicated job's
    /// parallelism.
    #[x_kube(validation = Rule::new("self >= 1").message("minMember must be at least 1"))]
    pub min_member: u32,

    /// Seconds each attempt has, from its start, to have every member bound and running before
    /// it counts as timed out: pending members release what they hold and the group retries
    /// with backoff.
    #[serde(default = "default_timeout_seconds")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 86400").message("timeoutSeconds must be between 1 and 86400"))]
    pub timeout_seconds: u32,

    /// The widest topology tier the gang may span: Node, HyperNode, LeafSwitch or NetworkPod
    /// (the default). A gang never spans network pods.
    #[serde(default = "default_highest_tier")]
    pub highest_tier: Tier,

    /// Name of the JobSet (in the same namespace) whose pods form this gang, when it comes from
    /// one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_set: Option<String>,

    /// What a timed-out attempt does to members that are bound already. `KeepBoundMembers`
    /// (the default) leaves them alone: deleting an unfinished pod is a failure to the Job
    /// controller, and a JobSet with a small `backoffLimit` would fail. `DeleteBoundMembers`
    /// deletes them (each with a UID precondition) so that a whole new gang is placed; only for
    /// owners that recreate members without counting failures.
    #[serde(default)]
    pub on_timeout: OnTimeout,
}

impl GangGroupSpec {
    /// A gang of `min_member` pods with every other field at its default, as a GangGroup
    /// applied with only `minMember` reads.
    pub fn with_min_member(min_member: u32) -> GangGroupSpec {
        GangGroupSpec {
            min_member,
            timeout_seconds: default_timeout_seconds(),
            highest_tier: default_highest_tier(),
            job_set: None,
            on_timeout: OnTimeout::default(),
        }
    }
}

/// What a timed-out attempt does to the members that are bound already.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum OnTimeout {
    /// Bound members keep their cards and are never deleted.
    #[default]
    KeepBoundMembers,
    /// Bound members that have not finished are deleted, each with a UID precondition.
    DeleteBoundMembers,
}

/// Where a gang is in its life.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GangPhase {
    /// Fewer than minMember pods exist, or no placement holds them all yet.
    Waiting,
    /// Capacity is reserved for every member; binding is under way.
    Reserved,
    /// Every member is bound to its node.
    Bound,
    /// Every member is running.
    Running,
    /// The group did not become complete and running in time; what its pending members held
    /// was released and the next attempt waits out a backoff.
    TimedOut,
    /// The group cannot be placed as declared (see message).
    Failed,
}

/// Member counts of a gang.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct GangMembers {
    /// Pods of the group that exist.
    pub seen: u32,
    /// Members with capacity reserved.
    pub reserved: u32,
    /// Members bound to a node.
    pub bound: u32,
    /// Members running.
    pub running: u32,
}

/// Where a gang was placed.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct GangPlacement {
    /// The lowest tier that holds the whole gang.
    pub tier: Tier,
    /// Name of the TopologyGroup of that tier.
    pub group: String,
    /// Nodes the members were placed on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<String>,
}

/// What the operator reports about a gang.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GangGroupStatus {
    /// Where the gang is in its life: Waiting, Reserved, Bound, Running, TimedOut or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<GangPhase>,

    /// Member counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub members: Option<GangMembers>,

    /// Where the current attempt placed the gang.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<GangPlacement>,

    /// Attempts that timed out so far; the current attempt is the next one.
    #[serde(default)]
    pub attempts: u32,

    /// When the current attempt began (its first member appeared, or the backoff after a
    /// timed-out attempt ends); the timeout counts from here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt_start_time: Option<Timestamp>,

    /// A human-readable explanation of the phase, for example why the gang does not fit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,

    /// The spec generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Conditions of the gang, one per type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}
