//! What the engine is told about the cluster and about a pod, and what it answers.
//!
//! These are plain data types with no apiserver behind them; `convert` builds them from
//! Kubernetes objects and the project's custom resources.

use runtimekit_contract::config::{DEVICE_API_DRA, SWITCHED_OFF};
use runtimekit_contract::{ContainerRequest, ResourceNames, RuntimeKitConfig};
use std::collections::BTreeMap;

/// How cards and nodes are chosen among those that fit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Scoring {
    /// Fill partially used cards and nodes first, keeping whole cards and nodes free (default).
    #[default]
    Binpack,
    /// Prefer the emptiest cards and nodes.
    Spread,
}

/// Engine settings, fixed for the life of a [`crate::Cluster`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Card and node scoring.
    pub scoring: Scoring,
    /// Resource names, used in failure messages.
    pub names: ResourceNames,
    /// The scheduler name, used in failure messages about unsupported constraints.
    pub scheduler_name: String,
    /// The cluster's function switches (`features.tdm`, `features.mig`).
    pub switches: Switches,
}

/// Which of the functions a node can have switched off are on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Switches {
    /// Time-division shares.
    pub tdm: bool,
    /// MIG instances.
    pub mig: bool,
    /// Whole cards through the extended resources: off on a node that gives its whole cards
    /// through DRA (`<prefix>/device-api=dra`), whose kubelet no longer offers them.
    pub whole_cards: bool,
}

impl Switches {
    /// What a node's labels leave on: `<prefix>/tdm-enabled=false` switches TDM off, and so on
    /// (any other value leaves it on).
    pub fn from_labels(labels: &BTreeMap<String, String>, names: &ResourceNames) -> Switches {
        let on = |label: &str| labels.get(label).map(String::as_str) != Some(SWITCHED_OFF);
        Switches {
            tdm: on(&names.tdm_switch_label),
            mig: on(&names.mig_switch_label),
            whole_cards: labels.get(&names.device_api_label).map(String::as_str)
                != Some(DEVICE_API_DRA),
        }
    }
}

impl Default for Switches {
    fn default() -> Self {
        Switches {
            tdm: true,
            mig: true,
            whole_cards: true,
        }
    }
}

/// A function an administrator can switch off for the cluster or one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Function {
    /// Time-division shares (`gpu-core`, `gpu-memory`).
    Tdm,
    /// MIG instances (`gpu-slice`).
    Mig,
}

impl Settings {
    /// Settings for a configuration, with binpack scoring.
    pub fn new(config: &RuntimeKitConfig) -> Self {
        Settings {
            scoring: Scoring::Binpack,
            names: config.names(),
            scheduler_name: config.scheduler_name.clone(),
            switches: Switches {
                tdm: config.features.tdm,
                mig: config.features.mig,
                whole_cards: true,
            },
        }
    }

    /// The same settings with another scoring.
    pub fn with_scoring(mut self, scoring: Scoring) -> Self {
        self.scoring = scoring;
        self
    }
}

impl Default for Settings {
    fn default() -> Self {
        Settings::new(&RuntimeKitConfig::default())
    }
}

pub use runtimekit_crds::{Tier, Vendor};

/// The effect of a taint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TaintEffect {
    /// New pods that do not tolerate it are not placed.
    NoSchedule,
    /// A preference only; never blocks placement.
    PreferNoSchedule,
    /// New pods are not placed and running ones are evicted.
    NoExecute,
}

/// A node taint.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Taint {
    /// The taint key.
    pub key: String,
    /// The taint value, empty when none.
    pub value: String,
    /// The taint effect.
    pub effect: TaintEffect,
}

/// How a toleration compares values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum TolerationOperator {
    /// The key and value must equal the taint's (the default).
    #[default]
    Equal,
    /// Any value; with an empty key, any taint.
    Exists,
}

/// A pod toleration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Toleration {
    /// The key; empty with `Exists` tolerates every key.
    pub key: String,
    /// How the value is compared.
    pub operator: TolerationOperator,
    /// The value, for `Equal`.
    pub value: String,
    /// The effect tolerated; `None` tolerates every effect.
    pub effect: Option<TaintEffect>,
}

/// An operator of a node selector requirement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SelectorOperator {
    /// The label's value is one of the values.
    In,
    /// The label is absent or its value is none of the values.
    NotIn,
    /// The label is present.
    Exists,
    /// The label is absent.
    DoesNotExist,
    /// The label's value, as an integer, is greater than the single value.
    Gt,
    /// The label's value, as an integer, is less than the single value.
    Lt,
}

/// One requirement of a node selector term.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SelectorRequirement {
    /// The label key, or for a field requirement the field (only `metadata.name`).
    pub key: String,
    /// How the values apply.
    pub operator: SelectorOperator,
    /// The values.
    pub values: Vec<String>,
}

/// One term of required node affinity: every requirement must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct SelectorTerm {
    /// Requirements on node labels.
    pub match_expressions: Vec<SelectorRequirement>,
    /// Requirements on node fields (`metadata.name`).
    pub match_fields: Vec<SelectorRequirement>,
}

/// Amounts of resources other than cards.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Resources {
    /// CPU in millicores.
    pub cpu_milli: u64,
    /// Memory in bytes.
    pub memory_bytes: u64,
    /// Every other resource (ephemeral-storage, hugepages, extended resources) in its units.
    pub scalar: BTreeMap<String, u64>,
}

/// Where a node sits in the network; `None` where the node carries no label for that tier.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct NetworkPosition {
    /// The HyperNode the node belongs to.
    pub hyper_node: Option<String>,
    /// The leaf switch the node sits behind.
    pub leaf_switch: Option<String>,
    /// The network pod the node is in.
    pub network_pod: Option<String>,
}

/// A node as the scheduler sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeInfo {
    /// The node's name.
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its taints.
    pub taints: Vec<Taint>,
    /// Allocatable resources other than cards.
    pub allocatable: Resources,
    /// How many pods it may run.
    pub max_pods: u64,
    /// Whether its Ready condition is True.
    pub ready: bool,
    /// Whether it is cordoned (`spec.unschedulable`).
    pub unschedulable: bool,
    /// Whether it is labelled for GPU pods (`lj_runtimekit_enable=true`).
    pub gpu_enabled: bool,
    /// The functions its labels leave on (`<prefix>/tdm-enabled=false` switches TDM off).
    pub switches: Switches,
    /// Its network position.
    pub position: NetworkPosition,
}

/// A MIG instance that exists on a card.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MigInstance {
    /// Its profile, for example `3g.40gb`.
    pub profile: String,
    /// Its first memory slice.
    pub start: u8,
}

/// A card as its node's agent reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CardInfo {
    /// Index on the node.
    pub index: u32,
    /// UUID.
    pub uuid: String,
    /// Vendor.
    pub vendor: Vendor,
    /// Product name, for example `NVIDIA H800` or `PPU-810E`.
    pub model: String,
    /// Memory in MiB.
    pub memory_mib: u64,
    /// Whether MIG mode is enabled (then the card serves MIG requests only).
    pub mig_enabled: bool,
    /// Whether the card may be offered.
    pub healthy: bool,
    /// The PCIe switch it sits under.
    pub pcie_switch: Option<String>,
    /// Its NUMA node.
    pub numa_node: Option<u32>,
    /// Its CPU socket.
    pub socket: Option<u32>,
    /// Its intra-node interconnect group.
    pub interconnect_group: Option<String>,
    /// Indexes of the cards it reaches over NVLink, once per link.
    pub nvlink_peers: Vec<u32>,
    /// MIG instances the hardware reports; they occupy their slices even without a slice.
    pub mig_instances: Vec<MigInstance>,
}

/// An RDMA NIC of a node.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NicInfo {
    /// Device name, for example `mlx5_0`.
    pub name: String,
    /// The PCIe switch it sits under.
    pub pcie_switch: Option<String>,
    /// Its NUMA node.
    pub numa_node: Option<u32>,
    /// Its CPU socket.
    pub socket: Option<u32>,
}

/// A pod to place.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodInput {
    /// The pod's UID, which keys its allocations.
    pub uid: String,
    /// Its containers that ask for cards, from the resource contract.
    pub containers: Vec<ContainerRequest>,
    /// What it requests besides cards (the pod's effective requests, kube-scheduler style).
    pub resources: Resources,
    /// Its `nodeSelector`.
    pub node_selector: BTreeMap<String, String>,
    /// Its required node affinity terms (any one must match); `None` when it has none.
    pub required_affinity: Option<Vec<SelectorTerm>>,
    /// Its tolerations.
    pub tolerations: Vec<Toleration>,
    /// Constraints the pod sets that the engine does not evaluate; a pod with any is refused.
    pub unsupported: Vec<String>,
    /// The gang the pod belongs to, if any; copied into its slices.
    pub gang: Option<String>,
}

/// How an allocation uses its card.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Share {
    /// The whole card.
    Whole,
    /// A time-division share.
    Tdm {
        /// Compute share in percent; `None` reserves no compute.
        core: Option<u8>,
        /// Memory cap in MiB; `None` reserves no memory.
        memory_mib: Option<u64>,
    },
    /// A MIG instance.
    Mig {
        /// The profile, for example `3g.40gb`.
        profile: String,
        /// Compute slices of the profile.
        slices: u8,
        /// The placement start (first memory slice).
        start: u8,
        /// Memory the container sees, in MiB: the request, or the profile's memory.
        memory_mib: u64,
    },
}

/// One allocated card of a container, from a GpuSlice.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SliceInput {
    /// The owning pod's UID.
    pub pod_uid: String,
    /// The container within the pod.
    pub container: String,
    /// Which of the container's cards this is.
    pub replica: u32,
    /// The node holding the card.
    pub node: String,
    /// The card's index on the node.
    pub card_index: u32,
    /// The card's UUID; empty when unknown, then the index alone identifies the card.
    pub card_uuid: String,
    /// How the card is used.
    pub share: Share,
}

/// How close the cards (and NICs) chosen for one container are to each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Locality {
    /// Every card in one interconnect group (PPU 810E requests of 2, 4 or 8).
    InterconnectGroup,
    /// The cards span interconnect groups because no group had enough free.
    AcrossGroups,
    /// Cards and NICs under one PCIe switch.
    PcieSwitch,
    /// Cards and NICs in one NUMA node.
    NumaNode,
    /// Cards and NICs on one CPU socket.
    Socket,
    /// Cards and NICs across sockets.
    CrossSocket,
    /// NVIDIA cards chosen for NVLink: the links among them.
    NvLink {
        /// NVLink links among the chosen cards.
        links: u32,
    },
}

/// One card given to a container.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CardPlacement {
    /// The card's index on the node.
    pub index: u32,
    /// The card's UUID.
    pub uuid: String,
    /// Which of the container's cards this is, 0 to N-1.
    pub replica: u32,
    /// How the card is used.
    pub share: Share,
}

/// What one container gets.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ContainerPlacement {
    /// The container's name.
    pub container: String,
    /// Its cards, by replica index.
    pub cards: Vec<CardPlacement>,
    /// RDMA NICs attached, by name; empty unless it asked for RDMA.
    pub nics: Vec<String>,
    /// How close its cards are, where a topology rule chose them.
    pub locality: Option<Locality>,
}

/// Where one pod goes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Decision {
    /// The pod's UID.
    pub pod_uid: String,
    /// The node.
    pub node: String,
    /// What each container that asked for cards gets, in spec order.
    pub containers: Vec<ContainerPlacement>,
    /// The pod's requests besides cards, accounted on the node once committed.
    pub resources: Resources,
    /// The pod's gang, if any.
    pub gang: Option<String>,
}

/// What a gang may span.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GangConstraint {
    /// The gang's name (the GangGroup's).
    pub name: String,
    /// The widest tier the gang may span.
    pub highest_tier: Tier,
}

impl GangConstraint {
    /// A gang that may span up to one network pod.
    pub fn new(name: impl Into<String>) -> Self {
        GangConstraint {
            name: name.into(),
            highest_tier: Tier::NetworkPod,
        }
    }
}

/// Where a whole gang goes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GangDecision {
    /// The gang's name.
    pub gang: String,
    /// The lowest tier that holds every member.
    pub tier: Tier,
    /// The group of that tier: a node, HyperNode, leaf switch or network pod name.
    pub group: String,
    /// The nodes used, sorted.
    pub nodes: Vec<String>,
    /// Each member's decision, in the order the members were given.
    pub members: Vec<Decision>,
}
