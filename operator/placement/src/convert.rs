//! Pure conversions from Kubernetes objects and this project's custom resources into the
//! engine's model, and from decisions back into GpuSlice specs. The operator calls these on
//! what its watches deliver; none of them does I/O.

use crate::model::{
    CardInfo, CardPlacement, ContainerPlacement, Decision, GangConstraint, GangDecision,
    MigInstance, NetworkPosition, NicInfo, NodeInfo, PodInput, Resources, SelectorOperator,
    SelectorRequirement, SelectorTerm, Share, SliceInput, Switches, Taint, TaintEffect, Toleration,
    TolerationOperator,
};
use crate::quantity::ceil_scaled;
use k8s_openapi::api::core::v1::{Container, Node, NodeSelectorRequirement, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use runtimekit_contract::allocation::{AllocatedCard, Allocation, ContainerAllocation};
use runtimekit_contract::config::NODE_ENABLE_LABEL;
use runtimekit_contract::{PodRequest, ResourceNames, TopologyLabels};
use runtimekit_crds as crds;
use std::collections::BTreeMap;

/// Why an object cannot be converted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConvertError {
    /// A field the engine needs is missing.
    #[error("{object} has no {field}")]
    Missing {
        /// The object.
        object: String,
        /// The field.
        field: &'static str,
    },
    /// A quantity cannot be read.
    #[error("{object}: {resource} quantity {value:?} is not a non-negative number")]
    Quantity {
        /// The object.
        object: String,
        /// The resource.
        resource: String,
        /// The text.
        value: String,
    },
    /// A value is not one the engine knows.
    #[error("{object}: {field} {value:?} is not valid")]
    Invalid {
        /// The object.
        object: String,
        /// The field.
        field: &'static str,
        /// The value.
        value: String,
    },
}

fn quantity(object: &str, resource: &str, q: &Quantity, scale: i32) -> Result<u64, ConvertError> {
    ceil_scaled(&q.0, scale).ok_or_else(|| ConvertError::Quantity {
        object: object.into(),
        resource: resource.into(),
        value: q.0.clone(),
    })
}

/// Splits a resource list into CPU, memory and scalars, leaving out the GPU resources the
/// engine accounts per card and `pods`.
fn resources(
    object: &str,
    list: &BTreeMap<String, Quantity>,
    names: &ResourceNames,
) -> Result<Resources, ConvertError> {
    let mut r = Resources::default();
    for (name, q) in list {
        match name.as_str() {
            "cpu" => r.cpu_milli = quantity(object, name, q, 3)?,
            "memory" => r.memory_bytes = quantity(object, name, q, 0)?,
            "pods" => {}
            other if names.is_gpu_resource(other) => {}
            other => {
                r.scalar.insert(other.into(), quantity(object, name, q, 0)?);
            }
        }
    }
    Ok(r)
}

fn taint_effect(object: &str, effect: &str) -> Result<TaintEffect, ConvertError> {
    match effect {
        "NoSchedule" => Ok(TaintEffect::NoSchedule),
        "PreferNoSchedule" => Ok(TaintEffect::PreferNoSchedule),
        "NoExecute" => Ok(TaintEffect::NoExecute),
        other => Err(ConvertError::Invalid {
            object: object.into(),
            field: "taint effect",
            value: other.into(),
        }),
    }
}

impl NodeInfo {
    /// The engine's view of a Node object.
    pub fn from_node(
        node: &Node,
        names: &ResourceNames,
        keys: &TopologyLabels,
    ) -> Result<NodeInfo, ConvertError> {
        let name = node.metadata.name.clone().ok_or(ConvertError::Missing {
            object: "node".into(),
            field: "metadata.name",
        })?;
        let labels = node.metadata.labels.clone().unwrap_or_default();
        let spec = node.spec.as_ref();
        let status = node.status.as_ref();
        let taints = spec
            .and_then(|s| s.taints.as_deref())
            .unwrap_or_default()
            .iter()
            .map(|t| {
                Ok(Taint {
                    key: t.key.clone(),
                    value: t.value.clone().unwrap_or_default(),
                    effect: taint_effect(&name, &t.effect)?,
                })
            })
            .collect::<Result<_, ConvertError>>()?;
        let empty = BTreeMap::new();
        let allocatable = status
            .and_then(|s| s.allocatable.as_ref())
            .unwrap_or(&empty);
        let max_pods = match allocatable.get("pods") {
            Some(q) => quantity(&name, "pods", q, 0)?,
            None => 0,
        };
        let ready = status
            .and_then(|s| s.conditions.as_deref())
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        let label = |key: &str| labels.get(key).cloned();
        Ok(NodeInfo {
            allocatable: resources(&name, allocatable, names)?,
            max_pods,
            ready,
            unschedulable: spec.and_then(|s| s.unschedulable).unwrap_or(false),
            gpu_enabled: labels.get(NODE_ENABLE_LABEL).is_some_and(|v| v == "true"),
            switches: Switches::from_labels(&labels, names),
            position: NetworkPosition {
                hyper_node: label(&keys.hyper_node),
                leaf_switch: label(&keys.leaf_switch),
                network_pod: label(&keys.network_pod),
            },
            taints,
            labels,
            name,
        })
    }
}

fn operator(object: &str, op: &str) -> Result<SelectorOperator, ConvertError> {
    Ok(match op {
        "In" => SelectorOperator::In,
        "NotIn" => SelectorOperator::NotIn,
        "Exists" => SelectorOperator::Exists,
        "DoesNotExist" => SelectorOperator::DoesNotExist,
        "Gt" => SelectorOperator::Gt,
        "Lt" => SelectorOperator::Lt,
        other => {
            return Err(ConvertError::Invalid {
                object: object.into(),
                field: "node selector operator",
                value: other.into(),
            });
        }
    })
}

fn requirements(
    object: &str,
    list: Option<&Vec<NodeSelectorRequirement>>,
) -> Result<Vec<SelectorRequirement>, ConvertError> {
    list.map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|r| {
            Ok(SelectorRequirement {
                key: r.key.clone(),
                operator: operator(object, &r.operator)?,
                values: r.values.clone().unwrap_or_default(),
            })
        })
        .collect()
}

/// A container's requests, falling back to its limits as the apiserver defaults them.
fn container_requests(
    object: &str,
    c: &Container,
    names: &ResourceNames,
) -> Result<Resources, ConvertError> {
    let mut list = BTreeMap::new();
    if let Some(r) = &c.resources {
        for (k, v) in r.limits.iter().flatten() {
            list.insert(k.clone(), v.clone());
        }
        for (k, v) in r.requests.iter().flatten() {
            list.insert(k.clone(), v.clone());
        }
    }
    resources(object, &list, names)
}

fn add(a: &mut Resources, b: &Resources) {
    a.cpu_milli = a.cpu_milli.saturating_add(b.cpu_milli);
    a.memory_bytes = a.memory_bytes.saturating_add(b.memory_bytes);
    for (k, v) in &b.scalar {
        let e = a.scalar.entry(k.clone()).or_insert(0);
        *e = e.saturating_add(*v);
    }
}

fn max(a: &mut Resources, b: &Resources) {
    a.cpu_milli = a.cpu_milli.max(b.cpu_milli);
    a.memory_bytes = a.memory_bytes.max(b.memory_bytes);
    for (k, v) in &b.scalar {
        let e = a.scalar.entry(k.clone()).or_insert(0);
        *e = (*e).max(*v);
    }
}

/// A pod's effective requests as kube-scheduler computes them: the larger of the regular
/// containers (plus sidecars) and each init container (plus the sidecars started before it),
/// plus the pod overhead; GPU resources are left to the card accounting.
fn effective_requests(
    object: &str,
    spec: &k8s_openapi::api::core::v1::PodSpec,
    names: &ResourceNames,
) -> Result<Resources, ConvertError> {
    let mut total = Resources::default();
    for c in &spec.containers {
        add(&mut total, &container_requests(object, c, names)?);
    }
    let mut sidecars = Resources::default();
    let mut init_peak = Resources::default();
    for c in spec.init_containers.iter().flatten() {
        let r = container_requests(object, c, names)?;
        if c.restart_policy.as_deref() == Some("Always") {
            add(&mut sidecars, &r);
            max(&mut init_peak, &sidecars);
        } else {
            let mut with = sidecars.clone();
            add(&mut with, &r);
            max(&mut init_peak, &with);
        }
    }
    add(&mut total, &sidecars);
    max(&mut total, &init_peak);
    if let Some(pod_level) = spec.resources.as_ref().and_then(|r| r.requests.as_ref()) {
        let r = resources(object, pod_level, names)?;
        if pod_level.contains_key("cpu") {
            total.cpu_milli = r.cpu_milli;
        }
        if pod_level.contains_key("memory") {
            total.memory_bytes = r.memory_bytes;
        }
    }
    if let Some(overhead) = &spec.overhead {
        add(&mut total, &resources(object, overhead, names)?);
    }
    Ok(total)
}

fn pod_object(pod: &Pod) -> String {
    format!(
        "pod {}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

impl Resources {
    /// What a bound pod of any scheduler requests besides cards, for
    /// [`crate::Cluster::upsert_pod_usage`].
    pub fn from_pod(pod: &Pod, names: &ResourceNames) -> Result<Resources, ConvertError> {
        let object = pod_object(pod);
        let spec = pod.spec.as_ref().ok_or(ConvertError::Missing {
            object: object.clone(),
            field: "spec",
        })?;
        effective_requests(&object, spec, names)
    }
}

impl PodInput {
    /// The engine's view of a pod, given its request as the resource contract parsed it.
    /// Requests are as [`Resources::from_pod`] computes them; constraints the engine does not
    /// evaluate are listed in `unsupported`.
    pub fn from_pod(
        pod: &Pod,
        request: &PodRequest,
        names: &ResourceNames,
    ) -> Result<PodInput, ConvertError> {
        let object = pod_object(pod);
        let uid = pod.metadata.uid.clone().ok_or(ConvertError::Missing {
            object: object.clone(),
            field: "metadata.uid",
        })?;
        let spec = pod.spec.as_ref().ok_or(ConvertError::Missing {
            object: object.clone(),
            field: "spec",
        })?;
        let resources = effective_requests(&object, spec, names)?;
        let affinity = spec.affinity.as_ref();
        let required_affinity = affinity
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|n| {
                n.required_during_scheduling_ignored_during_execution
                    .as_ref()
            })
            .map(|sel| {
                sel.node_selector_terms
                    .iter()
                    .map(|t| {
                        Ok(SelectorTerm {
                            match_expressions: requirements(&object, t.match_expressions.as_ref())?,
                            match_fields: requirements(&object, t.match_fields.as_ref())?,
                        })
                    })
                    .collect::<Result<Vec<_>, ConvertError>>()
            })
            .transpose()?;
        let tolerations = spec
            .tolerations
            .iter()
            .flatten()
            .map(|t| {
                Ok(Toleration {
                    key: t.key.clone().unwrap_or_default(),
                    operator: match t.operator.as_deref() {
                        None | Some("Equal") => TolerationOperator::Equal,
                        Some("Exists") => TolerationOperator::Exists,
                        Some(other) => {
                            return Err(ConvertError::Invalid {
                                object: object.clone(),
                                field: "toleration operator",
                                value: other.into(),
                            });
                        }
                    },
                    value: t.value.clone().unwrap_or_default(),
                    effect: t
                        .effect
                        .as_deref()
                        .filter(|e| !e.is_empty())
                        .map(|e| taint_effect(&object, e))
                        .transpose()?,
                })
            })
            .collect::<Result<_, ConvertError>>()?;
        let mut unsupported = Vec::new();
        if affinity
            .and_then(|a| a.pod_affinity.as_ref())
            .is_some_and(|p| {
                p.required_during_scheduling_ignored_during_execution
                    .is_some()
            })
        {
            unsupported.push("required pod affinity".to_owned());
        }
        if affinity
            .and_then(|a| a.pod_anti_affinity.as_ref())
            .is_some_and(|p| {
                p.required_during_scheduling_ignored_during_execution
                    .is_some()
            })
        {
            unsupported.push("required pod anti-affinity".to_owned());
        }
        if spec
            .topology_spread_constraints
            .iter()
            .flatten()
            .any(|t| t.when_unsatisfiable == "DoNotSchedule")
        {
            unsupported.push("topology spread constraints".to_owned());
        }
        if spec
            .containers
            .iter()
            .flat_map(|c| c.ports.iter().flatten())
            .any(|p| p.host_port.is_some_and(|h| h > 0))
        {
            unsupported.push("host ports".to_owned());
        }
        if spec.resource_claims.as_ref().is_some_and(|c| !c.is_empty()) {
            unsupported.push("resource claims".to_owned());
        }
        Ok(PodInput {
            uid,
            containers: request.containers.clone(),
            resources,
            node_selector: spec.node_selector.clone().unwrap_or_default(),
            required_affinity,
            tolerations,
            unsupported,
            gang: request.gang.as_ref().map(|g| g.name.clone()),
        })
    }
}

impl CardInfo {
    /// A card as its agent reports it in a TopologyGroup.
    pub fn from_status(card: &crds::CardStatus) -> CardInfo {
        CardInfo {
            index: card.index,
            uuid: card.uuid.clone(),
            vendor: card.vendor,
            model: card.model.clone(),
            memory_mib: card.memory_mib,
            mig_enabled: card.mig_enabled,
            healthy: card.health == crds::CardHealth::Healthy,
            pcie_switch: card.pcie_switch.clone(),
            numa_node: card.numa_node,
            socket: card.socket,
            interconnect_group: card.interconnect_group.clone(),
            nvlink_peers: card.nvlink_peers.clone(),
            mig_instances: card
                .mig_instances
                .iter()
                .map(|i| MigInstance {
                    profile: i.profile.clone(),
                    start: u8::try_from(i.placement_start).unwrap_or(u8::MAX),
                })
                .collect(),
        }
    }
}

impl NicInfo {
    /// A NIC as its agent reports it in a TopologyGroup.
    pub fn from_status(nic: &crds::NicStatus) -> NicInfo {
        NicInfo {
            name: nic.name.clone(),
            pcie_switch: nic.pcie_switch.clone(),
            numa_node: nic.numa_node,
            socket: nic.socket,
        }
    }
}

/// What a node-tier TopologyGroup reports, ready for [`crate::Cluster::set_devices`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeDevices {
    /// The node.
    pub node: String,
    /// Its cards.
    pub cards: Vec<CardInfo>,
    /// Its RDMA NICs.
    pub nics: Vec<NicInfo>,
    /// Whether the group's Ready condition is True (the agent reports and the data is fresh);
    /// the operator also ages the heartbeat before calling
    /// [`crate::Cluster::set_agent_reporting`].
    pub ready: bool,
}

impl NodeDevices {
    /// The devices of a node-tier TopologyGroup; `None` for higher tiers.
    pub fn from_topology_group(group: &crds::TopologyGroup) -> Option<NodeDevices> {
        if group.spec.tier != crds::Tier::Node {
            return None;
        }
        let node = group.spec.node_name.clone()?;
        let status = group.status.clone().unwrap_or_default();
        Some(NodeDevices {
            node,
            cards: status.cards.iter().map(CardInfo::from_status).collect(),
            nics: status.nics.iter().map(NicInfo::from_status).collect(),
            ready: status
                .conditions
                .iter()
                .any(|c| c.type_ == crds::CONDITION_READY && c.status == "True"),
        })
    }
}

/// `4Gi` or `512Mi` to MiB.
fn parse_memory(object: &str, text: &str) -> Result<u64, ConvertError> {
    runtimekit_crds::parse_slice_memory(text).ok_or_else(|| ConvertError::Invalid {
        object: object.into(),
        field: "memory",
        value: text.into(),
    })
}

/// The modes an allocation annotation names.
const MODE_WHOLE: &str = "Whole";
const MODE_TDM: &str = "TDM";
const MODE_MIG: &str = "MIG";

/// MiB as `<n>Gi` when whole, else `<n>Mi`.
fn format_memory(mib: u64) -> String {
    if mib.is_multiple_of(1024) {
        format!("{}Gi", mib / 1024)
    } else {
        format!("{mib}Mi")
    }
}

/// The memory a profile name states (`3g.40gb`), in MiB.
fn profile_memory(profile: &str) -> Option<u64> {
    let gb = profile.split_once('.')?.1;
    let gb = gb.strip_suffix("+me").unwrap_or(gb).strip_suffix("gb")?;
    gb.parse::<u64>().ok().map(|g| g * 1024)
}

impl SliceInput {
    /// The allocation a GpuSlice records; `None` while it names no node or card yet.
    pub fn from_gpu_slice(slice: &crds::GpuSlice) -> Result<Option<SliceInput>, ConvertError> {
        let object = format!(
            "gpuslice {}/{}",
            slice.metadata.namespace.as_deref().unwrap_or_default(),
            slice.metadata.name.as_deref().unwrap_or_default()
        );
        let spec = &slice.spec;
        let (Some(node), Some(card)) = (&spec.node_name, &spec.card) else {
            return Ok(None);
        };
        let memory = spec
            .memory
            .as_deref()
            .map(|m| parse_memory(&object, m))
            .transpose()?;
        let missing = |field| ConvertError::Missing {
            object: object.clone(),
            field,
        };
        let share = match spec.mode {
            crds::SliceMode::Whole => Share::Whole,
            crds::SliceMode::Tdm => Share::Tdm {
                core: spec
                    .core
                    .map(|c| {
                        u8::try_from(c).ok().filter(|c| *c <= 100).ok_or_else(|| {
                            ConvertError::Invalid {
                                object: object.clone(),
                                field: "core",
                                value: c.to_string(),
                            }
                        })
                    })
                    .transpose()?,
                memory_mib: memory,
            },
            crds::SliceMode::Mig => {
                let profile = spec
                    .mig_profile
                    .clone()
                    .ok_or_else(|| missing("migProfile"))?;
                let small = |field, v: Option<u32>| {
                    v.and_then(|v| u8::try_from(v).ok())
                        .ok_or_else(|| missing(field))
                };
                Share::Mig {
                    slices: small("slices", spec.slices)?,
                    start: small("migPlacementStart", spec.mig_placement_start)?,
                    memory_mib: memory.or_else(|| profile_memory(&profile)).unwrap_or(0),
                    profile,
                }
            }
        };
        Ok(Some(SliceInput {
            pod_uid: spec.pod.uid.clone(),
            container: spec.pod.container.clone(),
            replica: spec.replica_index,
            node: node.clone(),
            card_index: card.index,
            card_uuid: card.uuid.clone(),
            share,
        }))
    }
}

impl Decision {
    /// The allocation annotation of this decision; `slice_name(container, replica)` names the
    /// GpuSlice of each card.
    pub fn allocation(&self, slice_name: impl Fn(&str, u32) -> String) -> Allocation {
        let containers = self
            .containers
            .iter()
            .map(|c| ContainerAllocation {
                name: c.container.clone(),
                cards: c
                    .cards
                    .iter()
                    .map(|card| {
                        let mut allocated = AllocatedCard {
                            index: card.index,
                            uuid: card.uuid.clone(),
                            slice: slice_name(&c.container, card.replica),
                            ..AllocatedCard::default()
                        };
                        match &card.share {
                            Share::Whole => allocated.mode = MODE_WHOLE.into(),
                            Share::Tdm { core, memory_mib } => {
                                allocated.mode = MODE_TDM.into();
                                allocated.core = *core;
                                allocated.memory_mib = *memory_mib;
                            }
                            Share::Mig {
                                profile,
                                slices,
                                start,
                                memory_mib,
                            } => {
                                allocated.mode = MODE_MIG.into();
                                allocated.memory_mib = Some(*memory_mib);
                                allocated.profile = Some(profile.clone());
                                allocated.slices = Some(*slices);
                                allocated.start = Some(*start);
                            }
                        }
                        allocated
                    })
                    .collect(),
                nics: c.nics.clone(),
            })
            .collect();
        Allocation {
            node: self.node.clone(),
            containers,
        }
    }

    /// The decision a bound pod's allocation annotation records, so a restarted scheduler can
    /// account its cards and re-create missing GpuSlices. Cards are listed by replica index; the
    /// pod's other requests are accounted from the pod itself, so `resources` stays empty.
    pub fn from_allocation(
        pod_uid: &str,
        gang: Option<String>,
        allocation: &Allocation,
    ) -> Result<Decision, ConvertError> {
        let object = format!("the allocation of pod {pod_uid}");
        let invalid = |field, value: String| ConvertError::Invalid {
            object: object.clone(),
            field,
            value,
        };
        let missing = |field| ConvertError::Missing {
            object: object.clone(),
            field,
        };
        let mut containers = Vec::with_capacity(allocation.containers.len());
        for c in &allocation.containers {
            let mut cards = Vec::with_capacity(c.cards.len());
            for (replica, card) in c.cards.iter().enumerate() {
                let share = match card.mode.as_str() {
                    MODE_WHOLE => Share::Whole,
                    MODE_TDM => match card.core {
                        Some(core) if core > 100 => return Err(invalid("core", core.to_string())),
                        core => Share::Tdm {
                            core,
                            memory_mib: card.memory_mib,
                        },
                    },
                    MODE_MIG => {
                        let profile = card.profile.clone().ok_or_else(|| missing("profile"))?;
                        Share::Mig {
                            slices: card.slices.ok_or_else(|| missing("slices"))?,
                            start: card.start.ok_or_else(|| missing("start"))?,
                            memory_mib: card
                                .memory_mib
                                .or_else(|| profile_memory(&profile))
                                .unwrap_or(0),
                            profile,
                        }
                    }
                    other => return Err(invalid("mode", other.to_owned())),
                };
                cards.push(CardPlacement {
                    index: card.index,
                    uuid: card.uuid.clone(),
                    replica: u32::try_from(replica).unwrap_or(u32::MAX),
                    share,
                });
            }
            containers.push(ContainerPlacement {
                container: c.name.clone(),
                cards,
                nics: c.nics.clone(),
                locality: None,
            });
        }
        Ok(Decision {
            pod_uid: pod_uid.to_owned(),
            node: allocation.node.clone(),
            containers,
            resources: Resources::default(),
            gang,
        })
    }

    /// The engine's record of each allocated card, in the order of [`Decision::gpu_slices`].
    pub fn slice_inputs(&self) -> Vec<SliceInput> {
        self.containers
            .iter()
            .flat_map(|c| {
                c.cards.iter().map(|card| SliceInput {
                    pod_uid: self.pod_uid.clone(),
                    container: c.container.clone(),
                    replica: card.replica,
                    node: self.node.clone(),
                    card_index: card.index,
                    card_uuid: card.uuid.clone(),
                    share: card.share.clone(),
                })
            })
            .collect()
    }

    /// One GpuSlice spec per allocated card, for the pod `namespace/name`.
    pub fn gpu_slices(&self, namespace: &str, name: &str) -> Vec<crds::GpuSliceSpec> {
        self.containers
            .iter()
            .flat_map(|c: &ContainerPlacement| c.cards.iter().map(move |card| (c, card)))
            .map(|(c, card)| {
                let (mode, core, memory, slices, profile, start) = match &card.share {
                    Share::Whole => (crds::SliceMode::Whole, None, None, None, None, None),
                    Share::Tdm { core, memory_mib } => (
                        crds::SliceMode::Tdm,
                        core.map(u32::from),
                        memory_mib.map(format_memory),
                        None,
                        None,
                        None,
                    ),
                    Share::Mig {
                        profile,
                        slices,
                        start,
                        memory_mib,
                    } => (
                        crds::SliceMode::Mig,
                        None,
                        Some(format_memory(*memory_mib)),
                        Some(u32::from(*slices)),
                        Some(profile.clone()),
                        Some(u32::from(*start)),
                    ),
                };
                crds::GpuSliceSpec {
                    node_name: Some(self.node.clone()),
                    card: Some(crds::CardRef {
                        index: card.index,
                        uuid: card.uuid.clone(),
                    }),
                    mode,
                    core,
                    memory,
                    slices,
                    mig_profile: profile,
                    mig_placement_start: start,
                    pod: crds::PodRef {
                        namespace: namespace.into(),
                        name: name.into(),
                        uid: self.pod_uid.clone(),
                        container: c.container.clone(),
                    },
                    replica_index: card.replica,
                    gang: self.gang.clone(),
                    nics: if card.replica == 0 {
                        c.nics.clone()
                    } else {
                        Vec::new()
                    },
                }
            })
            .collect()
    }
}

impl GangConstraint {
    /// The constraint a GangGroup declares.
    pub fn from_gang_group(group: &crds::GangGroup) -> Result<GangConstraint, ConvertError> {
        Ok(GangConstraint {
            name: group.metadata.name.clone().ok_or(ConvertError::Missing {
                object: "ganggroup".into(),
                field: "metadata.name",
            })?,
            highest_tier: group.spec.highest_tier,
        })
    }
}

impl GangDecision {
    /// The placement to write into the GangGroup's status.
    pub fn placement(&self) -> crds::GangPlacement {
        crds::GangPlacement {
            tier: self.tier,
            group: self.group.clone(),
            nodes: self.nodes.clone(),
        }
    }
}
