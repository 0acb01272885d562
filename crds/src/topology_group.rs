//! TopologyGroup: one node of the topology tree (a Kubernetes node, a HyperNode, a leaf switch or
//! a network pod).

use crate::common::{Tier, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One node of the topology tree. Tier `Node` objects are created per GPU node, and their status
/// (cards, NICs, health, heartbeat) is written by that node's agent. Higher tiers group their
/// children: the operator derives them from node labels, or an administrator applies them with
/// `members`; the operator keeps their aggregate capacity in status.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "runtimekit.aliyun.com",
    version = "v1alpha1",
    kind = "TopologyGroup",
    plural = "topologygroups",
    shortname = "tg",
    category = "runtimekit",
    status = "TopologyGroupStatus",
    derive = "PartialEq",
    doc = "One node of the topology tree: a Kubernetes node, a HyperNode, a leaf switch or a network pod.",
    printcolumn(name = "Tier", type_ = "string", json_path = ".spec.tier"),
    printcolumn(name = "Parent", type_ = "string", json_path = ".spec.parent"),
    printcolumn(name = "Nodes", type_ = "integer", json_path = ".status.capacity.nodes"),
    printcolumn(name = "Cards", type_ = "integer", json_path = ".status.capacity.cards"),
    printcolumn(name = "Healthy", type_ = "integer", json_path = ".status.capacity.healthyCards"),
    printcolumn(name = "Free", type_ = "integer", json_path = ".status.capacity.freeCards", description = "healthy cards with nothing allocated"),
    printcolumn(name = "Heartbeat", type_ = "date", json_path = ".status.heartbeatTime", priority = 1),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    selectable = ".spec.tier",
    selectable = ".spec.nodeName",
    validation = Rule::new("!has(oldSelf.spec.nodeName) || (has(self.spec.nodeName) && self.spec.nodeName == oldSelf.spec.nodeName)")
        .message("spec.nodeName is immutable once set"),
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("self.tier == 'Node' ? has(self.nodeName) : !has(self.nodeName)")
        .message("nodeName is required for tier Node and not allowed for higher tiers"),
    validation = Rule::new("self.tier != 'Node' || !has(self.members)")
        .message("a Node group has no members; higher tiers list theirs"),
    validation = Rule::new("self.tier != 'NetworkPod' || !has(self.parent)")
        .message("NetworkPod is the widest tier and has no parent"),
)]
pub struct TopologyGroupSpec {
    /// Which tier of the tree this group is: Node, HyperNode, LeafSwitch or NetworkPod.
    /// Immutable.
    #[x_kube(validation = Rule::new("self == oldSelf").message("tier is immutable"))]
    pub tier: Tier,

    /// The Kubernetes node this group stands for (tier Node only). Immutable once set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,

    /// Name of the enclosing TopologyGroup of a wider tier, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,

    /// Names of the member groups of an administrator-applied higher tier: the TopologyGroups of
    /// a narrower tier it contains (Node groups are named after their node). Derived groups leave
    /// it empty; their members name them as parent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub members: Option<Vec<String>>,
}

/// The vendor of a card.
#[derive(
    Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash,
)]
pub enum Vendor {
    /// NVIDIA GPUs: whole cards, TDM and (on MIG-capable models) MIG.
    Nvidia,
    /// Alibaba PPU: whole cards and TDM.
    #[serde(rename = "PPU")]
    Ppu,
    /// AMD GPUs: whole cards only.
    #[serde(rename = "AMD")]
    Amd,
}

/// Whether a card may be offered to new work.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CardHealth {
    /// No fault is active on the card.
    Healthy,
    /// A fault is active (see healthReason); the card is not offered.
    Unhealthy,
}

/// What the node agent knows about one card.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CardStatus {
    /// Index of the card on its node, as the driver numbers it.
    pub index: u32,
    /// UUID of the card.
    pub uuid: String,
    /// Vendor of the card: Nvidia, PPU or AMD.
    pub vendor: Vendor,
    /// Model name, for example `NVIDIA H800` or `PPU-810E`.
    pub model: String,
    /// Memory of the card in MiB.
    pub memory_mib: u64,
    /// Whether the model supports MIG.
    #[serde(default)]
    pub mig_capable: bool,
    /// Whether MIG mode is enabled on the card (an administrator's hardware setting). A MIG card
    /// serves only gpu-slice requests; other cards serve TDM and whole-card requests.
    #[serde(default)]
    pub mig_enabled: bool,
    /// Whether the card may be offered to new work.
    pub health: CardHealth,
    /// Why the card is unhealthy, for example `XID 79: GPU has fallen off the bus`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_reason: Option<String>,
    /// PCIe switch the card sits under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_switch: Option<String>,
    /// NUMA node of the card.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<u32>,
    /// CPU socket of the card.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<u32>,
    /// Intra-node interconnect group: cards of one group talk over the fastest path (for
    /// example one PPU 810E group of four).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interconnect_group: Option<String>,
    /// Indexes of the cards this one reaches over NVLink, once per link (a peer reached over two
    /// links appears twice).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nvlink_peers: Vec<u32>,
    /// MIG instances that exist on the card now.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig_instances: Vec<MigInstanceStatus>,
    /// What holds this card outside the kit's ledger: pods (`namespace/name`) of another
    /// scheduler the kubelet gave it whole, and ResourceClaims prepared on it
    /// (`resourceclaim/namespace/name`). The runtimekit scheduler never picks a card held so.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held_by: Vec<String>,
}

/// A MIG instance as the hardware reports it.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct MigInstanceStatus {
    /// Profile of the instance, for example `3g.40gb`.
    pub profile: String,
    /// First memory slice of the instance.
    pub placement_start: u32,
    /// NVML GPU instance ID.
    pub gpu_instance_id: u32,
    /// MIG device UUID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_uuid: Option<String>,
}

/// An RDMA NIC of a node.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct NicStatus {
    /// Device name, for example `mlx5_0`.
    pub name: String,
    /// PCIe switch the NIC sits under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_switch: Option<String>,
    /// NUMA node of the NIC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<u32>,
    /// CPU socket of the NIC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<u32>,
}

/// Aggregate capacity of a group and everything under it.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct TopologyCapacity {
    /// Kubernetes nodes in the group.
    pub nodes: u32,
    /// Cards in the group.
    pub cards: u32,
    /// Cards that are healthy.
    pub healthy_cards: u32,
    /// Healthy cards with nothing allocated on them.
    pub free_cards: u32,
    /// Healthy cards in MIG mode.
    #[serde(default)]
    pub mig_cards: u32,
}

/// What is known about a group now.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TopologyGroupStatus {
    /// Cards of the node (tier Node only), written by the node agent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["index".into()]))]
    pub cards: Vec<CardStatus>,

    /// RDMA NICs of the node (tier Node only), written by the node agent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub nics: Vec<NicStatus>,

    /// Kubernetes nodes under a higher-tier group, written by the operator.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub nodes: Vec<String>,

    /// Aggregate capacity of the group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<TopologyCapacity>,

    /// When the node agent last reported (tier Node only). A group whose agent stops reporting
    /// is marked stale and its cards are not offered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_time: Option<Timestamp>,

    /// How often the node agent promises to heartbeat, in seconds (tier Node only). The operator
    /// withholds the cards after three intervals without a heartbeat, or 90 s where it is unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 3600").message("heartbeatIntervalSeconds must be between 1 and 3600"))]
    pub heartbeat_interval_seconds: Option<u32>,

    /// The spec generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Conditions of the group, one per type (Ready: the agent reports and the data is fresh).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}
