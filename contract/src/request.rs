//! A pod's GPU request, parsed from its spec and checked against every rule of the contract.

use crate::config::{
    JOBSET_NAME_LABEL, MemoryUnit, NVIDIA_GPU, REPLICA_LABEL, ResourceNames, RuntimeKitConfig,
};
use crate::quantity::{QuantityError, parse_whole};
use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use std::collections::BTreeMap;
use std::fmt;
use thiserror::Error;

/// Which name a whole-card request used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WholeCardName {
    /// `aliyun.com/gpu`: any vendor.
    AnyVendor,
    /// `nvidia.com/gpu`: NVIDIA cards only.
    Nvidia,
}

/// What one container asks for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum CardRequest {
    /// Whole cards.
    Whole {
        /// How many cards.
        cards: u32,
        /// Which resource name asked for them.
        name: WholeCardName,
    },
    /// A time-division share of each of `cards` cards.
    Tdm {
        /// How many cards, each with the same share (pod label `replica`, default 1).
        cards: u32,
        /// Compute share of each card in percent, 1-100; `None` means no compute cap.
        core: Option<u8>,
        /// Memory of each card in MiB; `None` means no memory cap.
        memory_mib: Option<u64>,
    },
    /// A MIG instance on each of `cards` cards.
    Mig {
        /// How many cards, each with the same instance (pod label `replica`, default 1).
        cards: u32,
        /// Compute slices of each instance: 1, 2, 3, 4 or 7.
        slices: u8,
        /// Memory each instance must offer, in MiB; the container sees at most this much.
        memory_mib: Option<u64>,
    },
}

impl CardRequest {
    /// How many cards the request spans.
    pub fn cards(&self) -> u32 {
        match *self {
            CardRequest::Whole { cards, .. }
            | CardRequest::Tdm { cards, .. }
            | CardRequest::Mig { cards, .. } => cards,
        }
    }
}

impl fmt::Display for CardRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cards = |n: u32| {
            if n == 1 {
                "1 card".to_owned()
            } else {
                format!("{n} cards")
            }
        };
        let memory = |m: Option<u64>| m.map_or_else(|| "all memory".to_owned(), format_mib);
        match *self {
            CardRequest::Whole { cards: n, name } => {
                let name = if name == WholeCardName::Nvidia {
                    "NVIDIA "
                } else {
                    ""
                };
                write!(f, "{} whole {name}card{}", n, if n == 1 { "" } else { "s" })
            }
            CardRequest::Tdm {
                cards: n,
                core,
                memory_mib,
            } => {
                let core =
                    core.map_or_else(|| "uncapped core".to_owned(), |c| format!("{c}% core"));
                write!(
                    f,
                    "time-division share of {}: {core}, {} each",
                    cards(n),
                    memory(memory_mib)
                )
            }
            CardRequest::Mig {
                cards: n,
                slices,
                memory_mib,
            } => {
                let memory = memory_mib.map_or_else(
                    || "the profile's memory".to_owned(),
                    |m| format!("at least {}", format_mib(m)),
                );
                write!(
                    f,
                    "MIG instance of {slices} slices with {memory} on {} each",
                    cards(n)
                )
            }
        }
    }
}

/// MiB as GiB when whole, else MiB.
fn format_mib(mib: u64) -> String {
    if mib.is_multiple_of(1024) {
        format!("{} GiB", mib / 1024)
    } else {
        format!("{mib} MiB")
    }
}

/// The GPU request of one container.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ContainerRequest {
    /// The container's name.
    pub container: String,
    /// What it asks for.
    pub cards: CardRequest,
    /// Whether the RDMA NICs nearest the allocated cards are attached (`aliyun.com/rdma: 1`).
    pub rdma: bool,
}

/// The gang a pod belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GangMembership {
    /// The group's name: the JobSet's name, or the explicit gang-name label.
    pub name: String,
    /// The JobSet the pod comes from, if any.
    pub job_set: Option<String>,
    /// How many pods must be placed together.
    pub min_member: u32,
}

/// Everything a pod asks of this project.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRequest {
    /// Whether the pod names this project's scheduler.
    pub ours: bool,
    /// The containers that ask for cards, in spec order.
    pub containers: Vec<ContainerRequest>,
    /// The gang the pod belongs to, if any.
    pub gang: Option<GangMembership>,
    /// Whether the pod uses the host's network (needed for RDMA).
    pub host_network: bool,
    /// Things that are allowed but probably not what the user meant.
    pub warnings: Vec<Warning>,
}

impl PodRequest {
    /// Whether any container asks for cards.
    pub fn wants_cards(&self) -> bool {
        !self.containers.is_empty()
    }
}

/// A rule of the contract that a pod breaks, with the message the user sees.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Violation {
    /// A GPU resource value is not a whole number.
    #[error("{resource} must be a whole number; got {value:?}")]
    NotWhole { resource: String, value: String },
    /// A GPU resource value is negative.
    #[error("{resource} must not be negative; got {value}")]
    Negative { resource: String, value: i64 },
    /// gpu-core is above 100.
    #[error("{resource} must be between 1 and 100 (percent of one card); got {value}")]
    CoreOutOfRange { resource: String, value: i64 },
    /// gpu-memory is zero in GiB mode.
    #[error("{resource} must be a positive number of GiB; got {value}")]
    MemoryNotPositive { resource: String, value: i64 },
    /// gpu-memory is not a positive multiple of 128 in MiB mode.
    #[error("{resource} must be a positive multiple of 128 (MiB); got {value}")]
    MemoryNotMultiple { resource: String, value: i64 },
    /// gpu-memory is larger than any card could hold.
    #[error("{resource} of {value} {unit} is larger than any card")]
    MemoryTooLarge {
        resource: String,
        value: i64,
        unit: MemoryUnit,
    },
    /// gpu-slice is not a MIG slice count.
    #[error("{resource} must be one of 1, 2, 3, 4, 7; got {value}")]
    SliceInvalid { resource: String, value: i64 },
    /// A whole-card count is zero or too large.
    #[error("{resource} must be between 1 and {max}; got {value}")]
    CardCountInvalid {
        resource: String,
        value: i64,
        max: u32,
    },
    /// rdma is neither 0 nor 1.
    #[error("{resource} must be 0 or 1 (it is a switch, not a NIC count); got {value}")]
    RdmaInvalid { resource: String, value: i64 },
    /// Both whole-card names are used in one container.
    #[error("{first} and {second} both ask for whole cards; use one of them")]
    TwoWholeCardNames { first: String, second: String },
    /// A whole-card request also carries a fractional resource.
    #[error("{whole} asks for whole cards, which take no {fractional}; remove {fractional}")]
    WholeWithFraction { whole: String, fractional: String },
    /// gpu-slice and gpu-core are both set.
    #[error("{slice} (MIG) and {core} (time-division) cannot be combined; a card is in one mode")]
    SliceWithCore { slice: String, core: String },
    /// A GPU resource is in requests but not in limits.
    #[error("{resource} is in requests but not in limits; declare it in limits")]
    RequestWithoutLimit { resource: String },
    /// A GPU resource's request differs from its limit.
    #[error("{resource} request {request} must equal its limit {limit}")]
    RequestNotLimit {
        resource: String,
        request: String,
        limit: String,
    },
    /// A resource under the prefix that this project does not define.
    #[error("{resource} is not a resource of this project; known: {known}")]
    UnknownResource { resource: String, known: String },
    /// rdma without any card.
    #[error(
        "{resource} attaches the RDMA NICs nearest the container's cards, but the container asks for no cards"
    )]
    RdmaWithoutCards { resource: String },
    /// The replica label is not a positive whole number.
    #[error("label {label} must be a whole number between 1 and {max}; got {value:?}")]
    ReplicaInvalid {
        label: String,
        value: String,
        max: u32,
    },
    /// The replica label on a pod whose cards are whole.
    #[error(
        "label {label} asks for {replica} cards of one time-division or MIG configuration, but container {container:?} asks for whole cards; set {whole}: {replica} instead"
    )]
    ReplicaWithWholeCards {
        label: String,
        replica: u32,
        container: String,
        whole: String,
    },
    /// The replica label on a pod that asks for no shares.
    #[error(
        "label {label} asks for {replica} cards, but no container asks for {core}, {memory} or {slice}"
    )]
    ReplicaWithoutShares {
        label: String,
        replica: u32,
        core: String,
        memory: String,
        slice: String,
    },
    /// The min-member label is not a positive whole number.
    #[error("label {label} must be a whole number of at least 1; got {value:?}")]
    MinMemberInvalid { label: String, value: String },
    /// The min-member label without a group to belong to.
    #[error(
        "label {label} needs a group: the pod has neither the JobSet label {JOBSET_NAME_LABEL} nor a {gang_label} label"
    )]
    GangWithoutGroup { label: String, gang_label: String },
    /// A shared-card request left to another scheduler.
    #[error("{resource} needs schedulerName: {expected}; the scheduler {got:?} cannot share cards")]
    SharesNeedOurScheduler {
        resource: String,
        expected: String,
        got: String,
    },
    /// A GPU pod of our scheduler without our RuntimeClass.
    #[error(
        "pods that ask for cards need runtimeClassName: {expected} so the devices are injected; got {got}"
    )]
    WrongRuntimeClass { expected: String, got: String },
    /// A JobSet gang whose min-member differs from its parallelism.
    #[error(
        "label {label} is {min_member} but {runner} runs {parallelism} pods with it at once; they must be equal"
    )]
    MinMemberNotParallelism {
        label: String,
        min_member: u32,
        /// What runs the pods, as `JobSet "name"` or `replicated job "name"`.
        runner: String,
        parallelism: i32,
    },
    /// An init container asks for cards.
    #[error(
        "init container {container:?} asks for {resource}; cards are given to regular containers only"
    )]
    InitContainerCards { container: String, resource: String },
}

impl Violation {
    /// A stable PascalCase reason for Events, conditions and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Violation::NotWhole { .. } | Violation::Negative { .. } => "InvalidQuantity",
            Violation::CoreOutOfRange { .. } => "InvalidGpuCore",
            Violation::MemoryNotPositive { .. }
            | Violation::MemoryNotMultiple { .. }
            | Violation::MemoryTooLarge { .. } => "InvalidGpuMemory",
            Violation::SliceInvalid { .. } => "InvalidGpuSlice",
            Violation::CardCountInvalid { .. } => "InvalidCardCount",
            Violation::RdmaInvalid { .. } | Violation::RdmaWithoutCards { .. } => "InvalidRdma",
            Violation::TwoWholeCardNames { .. }
            | Violation::WholeWithFraction { .. }
            | Violation::SliceWithCore { .. } => "ConflictingResources",
            Violation::RequestWithoutLimit { .. } | Violation::RequestNotLimit { .. } => {
                "RequestNotLimit"
            }
            Violation::UnknownResource { .. } => "UnknownResource",
            Violation::ReplicaInvalid { .. }
            | Violation::ReplicaWithWholeCards { .. }
            | Violation::ReplicaWithoutShares { .. } => "InvalidReplica",
            Violation::MinMemberInvalid { .. }
            | Violation::GangWithoutGroup { .. }
            | Violation::MinMemberNotParallelism { .. } => "InvalidGang",
            Violation::SharesNeedOurScheduler { .. } => "WrongScheduler",
            Violation::WrongRuntimeClass { .. } => "WrongRuntimeClass",
            Violation::InitContainerCards { .. } => "InitContainerCards",
        }
    }
}

/// A violation and the container it was found in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The container, or `None` for pod-level rules.
    pub container: Option<String>,
    /// What is wrong.
    pub violation: Violation,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.container {
            Some(c) => write!(f, "container {c:?}: {}", self.violation),
            None => write!(f, "{}", self.violation),
        }
    }
}

/// Every rule a pod breaks.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub struct ContractError {
    /// What is wrong, in the order found.
    pub findings: Vec<Finding>,
}

impl fmt::Display for ContractError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let messages: Vec<String> = self.findings.iter().map(Finding::to_string).collect();
        f.write_str(&messages.join("; "))
    }
}

impl ContractError {
    /// The reason of the first finding, for Events and conditions.
    pub fn reason(&self) -> &'static str {
        self.findings
            .first()
            .map_or("InvalidRequest", |f| f.violation.reason())
    }
}

/// Something allowed that is probably a mistake.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Warning {
    /// `gpu-core: 0` means no cap, but GPU programs hang with it on the original product.
    CoreZero { container: String, resource: String },
    /// RDMA asked for without the host network.
    RdmaWithoutHostNetwork { container: String, resource: String },
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Warning::CoreZero {
                container,
                resource,
            } => write!(
                f,
                "container {container:?}: {resource}: 0 means no compute cap, but GPU programs may hang with it; leave {resource} out instead"
            ),
            Warning::RdmaWithoutHostNetwork {
                container,
                resource,
            } => write!(
                f,
                "container {container:?}: {resource}: 1 needs hostNetwork: true for RDMA traffic"
            ),
        }
    }
}

impl Warning {
    /// A stable PascalCase reason for Events.
    pub fn reason(&self) -> &'static str {
        match self {
            Warning::CoreZero { .. } => "GpuCoreZero",
            Warning::RdmaWithoutHostNetwork { .. } => "RdmaWithoutHostNetwork",
        }
    }
}

/// The most cards one container or the replica label may ask for.
pub const MAX_CARDS: u32 = 64;
/// The most memory one card may be asked for: 16 TiB, far above any card.
const MAX_MEMORY_MIB: u64 = 16 << 20;

/// Parses and checks a pod's GPU request against the contract, returning every rule it breaks.
pub fn parse_pod(pod: &Pod, config: &RuntimeKitConfig) -> Result<PodRequest, ContractError> {
    let names = config.names();
    let mut parser = Parser {
        config,
        names: &names,
        findings: Vec::new(),
        warnings: Vec::new(),
    };
    let spec = pod.spec.as_ref();
    let labels = pod.metadata.labels.as_ref();
    let label = |key: &str| labels.and_then(|l| l.get(key)).map(String::as_str);

    let scheduler = spec
        .and_then(|s| s.scheduler_name.as_deref())
        .unwrap_or("default-scheduler");
    let ours = scheduler == config.scheduler_name;
    let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
    let replica = label(REPLICA_LABEL).and_then(|v| parser.replica(v));

    for init in spec
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or_default()
    {
        if let Some(resource) = parser.first_gpu_resource(init) {
            parser.pod_finding(Violation::InitContainerCards {
                container: init.name.clone(),
                resource,
            });
        }
    }

    let mut containers = Vec::new();
    for container in spec.map(|s| s.containers.as_slice()).unwrap_or_default() {
        if let Some(request) = parser.container(container, replica.unwrap_or(1), host_network) {
            containers.push(request);
        }
    }

    if let Some(replica) = replica.filter(|&r| r > 1) {
        match containers
            .iter()
            .find(|c| matches!(c.cards, CardRequest::Whole { .. }))
        {
            Some(whole) => parser.pod_finding(Violation::ReplicaWithWholeCards {
                label: REPLICA_LABEL.into(),
                replica,
                container: whole.container.clone(),
                whole: names.gpu.clone(),
            }),
            None if containers.is_empty() => parser.pod_finding(Violation::ReplicaWithoutShares {
                label: REPLICA_LABEL.into(),
                replica,
                core: names.gpu_core.clone(),
                memory: names.gpu_memory.clone(),
                slice: names.gpu_slice.clone(),
            }),
            None => {}
        }
    }

    if !containers.is_empty() {
        if ours {
            let got = spec.and_then(|s| s.runtime_class_name.as_deref());
            if got != Some(config.runtime_class_name.as_str()) {
                parser.pod_finding(Violation::WrongRuntimeClass {
                    expected: config.runtime_class_name.clone(),
                    got: got.map_or_else(|| "none".into(), |g| format!("{g:?}")),
                });
            }
        } else if let Some(shared) = containers
            .iter()
            .find(|c| !matches!(c.cards, CardRequest::Whole { .. }))
        {
            let resource = match shared.cards {
                CardRequest::Mig { .. } => names.gpu_slice.clone(),
                _ => names.gpu_core.clone(),
            };
            parser.pod_finding(Violation::SharesNeedOurScheduler {
                resource,
                expected: config.scheduler_name.clone(),
                got: scheduler.into(),
            });
        }
    }

    let gang = label(&names.min_member_label).and_then(|value| {
        parser.gang(
            value,
            label(JOBSET_NAME_LABEL),
            label(&names.gang_name_label),
        )
    });

    if parser.findings.is_empty() {
        Ok(PodRequest {
            ours,
            containers,
            gang,
            host_network,
            warnings: parser.warnings,
        })
    } else {
        Err(ContractError {
            findings: parser.findings,
        })
    }
}

struct Parser<'a> {
    config: &'a RuntimeKitConfig,
    names: &'a ResourceNames,
    findings: Vec<Finding>,
    warnings: Vec<Warning>,
}

/// The whole-number GPU resources of one container, before the rules between them.
#[derive(Default)]
struct Values {
    core: Option<i64>,
    memory: Option<i64>,
    slice: Option<i64>,
    any_vendor: Option<i64>,
    nvidia: Option<i64>,
    rdma: Option<i64>,
}

impl Parser<'_> {
    fn pod_finding(&mut self, violation: Violation) {
        self.findings.push(Finding {
            container: None,
            violation,
        });
    }

    fn finding(&mut self, container: &str, violation: Violation) {
        self.findings.push(Finding {
            container: Some(container.into()),
            violation,
        });
    }

    /// The first GPU resource a container mentions in limits or requests.
    fn first_gpu_resource(&self, container: &Container) -> Option<String> {
        let resources = container.resources.as_ref()?;
        [resources.limits.as_ref(), resources.requests.as_ref()]
            .into_iter()
            .flatten()
            .flat_map(BTreeMap::keys)
            .find(|name| self.names.is_gpu_resource(name))
            .cloned()
    }

    fn container(
        &mut self,
        container: &Container,
        replica: u32,
        host_network: bool,
    ) -> Option<ContainerRequest> {
        let name = container.name.as_str();
        let empty = BTreeMap::new();
        let resources = container.resources.as_ref();
        let limits = resources.and_then(|r| r.limits.as_ref()).unwrap_or(&empty);
        let requests = resources
            .and_then(|r| r.requests.as_ref())
            .unwrap_or(&empty);
        let before = self.findings.len();
        let names = self.names;

        for (resource, request) in requests.iter().filter(|(r, _)| names.is_gpu_resource(r)) {
            match limits.get(resource) {
                None => self.finding(
                    name,
                    Violation::RequestWithoutLimit {
                        resource: resource.clone(),
                    },
                ),
                Some(limit) if !same_quantity(limit, request) => self.finding(
                    name,
                    Violation::RequestNotLimit {
                        resource: resource.clone(),
                        request: request.0.clone(),
                        limit: limit.0.clone(),
                    },
                ),
                Some(_) => {}
            }
        }

        let mut values = Values::default();
        for (resource, quantity) in limits.iter().filter(|(r, _)| names.is_gpu_resource(r)) {
            let slot = match resource.as_str() {
                r if r == names.gpu_core => &mut values.core,
                r if r == names.gpu_memory => &mut values.memory,
                r if r == names.gpu_slice => &mut values.slice,
                r if r == names.gpu => &mut values.any_vendor,
                r if r == names.rdma => &mut values.rdma,
                NVIDIA_GPU => &mut values.nvidia,
                unknown => {
                    let known = names.own_resources().join(", ");
                    self.finding(
                        name,
                        Violation::UnknownResource {
                            resource: unknown.into(),
                            known: format!("{known}, {NVIDIA_GPU}"),
                        },
                    );
                    continue;
                }
            };
            match parse_whole(&quantity.0) {
                Ok(v) if v < 0 => self.finding(
                    name,
                    Violation::Negative {
                        resource: resource.clone(),
                        value: v,
                    },
                ),
                Ok(v) => *slot = Some(v),
                Err(
                    QuantityError::Malformed | QuantityError::Fractional | QuantityError::TooLarge,
                ) => self.finding(
                    name,
                    Violation::NotWhole {
                        resource: resource.clone(),
                        value: quantity.0.clone(),
                    },
                ),
            }
        }

        let request = self.combine(name, &values, replica);
        let rdma = self.rdma(name, values.rdma, request.is_some());
        if rdma && !host_network {
            self.warnings.push(Warning::RdmaWithoutHostNetwork {
                container: name.into(),
                resource: self.names.rdma.clone(),
            });
        }
        if self.findings.len() > before {
            return None;
        }
        request.map(|cards| ContainerRequest {
            container: name.into(),
            cards,
            rdma,
        })
    }

    /// Applies the rules between one container's values and builds its request.
    fn combine(&mut self, container: &str, v: &Values, replica: u32) -> Option<CardRequest> {
        let names = self.names;
        if let (Some(_), Some(_)) = (v.any_vendor, v.nvidia) {
            self.finding(
                container,
                Violation::TwoWholeCardNames {
                    first: names.gpu.clone(),
                    second: NVIDIA_GPU.into(),
                },
            );
            return None;
        }
        let whole = v
            .any_vendor
            .map(|n| (n, WholeCardName::AnyVendor, names.gpu.clone()))
            .or(v
                .nvidia
                .map(|n| (n, WholeCardName::Nvidia, NVIDIA_GPU.to_owned())));

        if let Some((count, kind, resource)) = whole {
            let mut ok = true;
            for (value, fractional) in [
                (v.core, &names.gpu_core),
                (v.memory, &names.gpu_memory),
                (v.slice, &names.gpu_slice),
            ] {
                if value.is_some() {
                    self.finding(
                        container,
                        Violation::WholeWithFraction {
                            whole: resource.clone(),
                            fractional: fractional.clone(),
                        },
                    );
                    ok = false;
                }
            }
            if !(1..=i64::from(MAX_CARDS)).contains(&count) {
                self.finding(
                    container,
                    Violation::CardCountInvalid {
                        resource,
                        value: count,
                        max: MAX_CARDS,
                    },
                );
                ok = false;
            }
            // The count is in range here, so the conversion cannot fail.
            return ok.then(|| CardRequest::Whole {
                cards: u32::try_from(count).unwrap_or(MAX_CARDS),
                name: kind,
            });
        }

        if v.slice.is_some() && v.core.is_some() {
            self.finding(
                container,
                Violation::SliceWithCore {
                    slice: names.gpu_slice.clone(),
                    core: names.gpu_core.clone(),
                },
            );
            return None;
        }
        let memory_mib = v.memory.and_then(|m| self.memory(container, m));
        if let Some(slices) = v.slice {
            if ![1, 2, 3, 4, 7].contains(&slices) {
                self.finding(
                    container,
                    Violation::SliceInvalid {
                        resource: names.gpu_slice.clone(),
                        value: slices,
                    },
                );
                return None;
            }
            return Some(CardRequest::Mig {
                cards: replica,
                slices: slices as u8,
                memory_mib,
            });
        }
        if v.core.is_none() && v.memory.is_none() {
            return None;
        }
        let core = match v.core {
            Some(0) => {
                self.warnings.push(Warning::CoreZero {
                    container: container.into(),
                    resource: names.gpu_core.clone(),
                });
                None
            }
            Some(c @ 1..=100) => Some(c as u8),
            Some(c) => {
                self.finding(
                    container,
                    Violation::CoreOutOfRange {
                        resource: names.gpu_core.clone(),
                        value: c,
                    },
                );
                None
            }
            None => None,
        };
        Some(CardRequest::Tdm {
            cards: replica,
            core,
            memory_mib,
        })
    }

    /// Converts a gpu-memory value in the configured unit to MiB.
    fn memory(&mut self, container: &str, value: i64) -> Option<u64> {
        let resource = self.names.gpu_memory.clone();
        let unit = self.config.memory_unit;
        let value_u = u64::try_from(value).unwrap_or(0);
        if value_u == 0 {
            let violation = match unit {
                MemoryUnit::GiB => Violation::MemoryNotPositive { resource, value },
                MemoryUnit::MiB => Violation::MemoryNotMultiple { resource, value },
            };
            self.finding(container, violation);
            return None;
        }
        if unit == MemoryUnit::MiB && value_u % MemoryUnit::MIB_STEP != 0 {
            self.finding(container, Violation::MemoryNotMultiple { resource, value });
            return None;
        }
        match value_u
            .checked_mul(unit.mib())
            .filter(|&mib| mib <= MAX_MEMORY_MIB)
        {
            Some(mib) => Some(mib),
            None => {
                self.finding(
                    container,
                    Violation::MemoryTooLarge {
                        resource,
                        value,
                        unit,
                    },
                );
                None
            }
        }
    }

    fn rdma(&mut self, container: &str, value: Option<i64>, has_cards: bool) -> bool {
        let resource = self.names.rdma.clone();
        match value {
            None | Some(0) => false,
            Some(1) if has_cards => true,
            Some(1) => {
                self.finding(container, Violation::RdmaWithoutCards { resource });
                false
            }
            Some(value) => {
                self.finding(container, Violation::RdmaInvalid { resource, value });
                false
            }
        }
    }

    fn replica(&mut self, value: &str) -> Option<u32> {
        match value.trim().parse::<u32>() {
            Ok(n @ 1..=MAX_CARDS) => Some(n),
            _ => {
                self.pod_finding(Violation::ReplicaInvalid {
                    label: REPLICA_LABEL.into(),
                    value: value.into(),
                    max: MAX_CARDS,
                });
                None
            }
        }
    }

    fn gang(
        &mut self,
        min_member: &str,
        job_set: Option<&str>,
        gang_name: Option<&str>,
    ) -> Option<GangMembership> {
        let label = self.names.min_member_label.clone();
        let min_member = match min_member.trim().parse::<u32>() {
            Ok(n) if n >= 1 => n,
            _ => {
                self.pod_finding(Violation::MinMemberInvalid {
                    label,
                    value: min_member.into(),
                });
                return None;
            }
        };
        let job_set = job_set.filter(|j| !j.is_empty());
        match gang_name.filter(|g| !g.is_empty()).or(job_set) {
            Some(name) => Some(GangMembership {
                name: name.into(),
                job_set: job_set.map(Into::into),
                min_member,
            }),
            None => {
                self.pod_finding(Violation::GangWithoutGroup {
                    label,
                    gang_label: self.names.gang_name_label.clone(),
                });
                None
            }
        }
    }
}

/// Checks a JobSet gang's size: `aliyun.com/min-member` must equal the number of pods with the
/// label that `runner` (`JobSet "name"` or `replicated job "name"`) runs at once, or the gang
/// could never be complete (or would start partially).
pub fn check_gang_size(
    names: &ResourceNames,
    gang: &GangMembership,
    runner: &str,
    parallelism: i32,
) -> Result<(), Violation> {
    if i64::from(gang.min_member) == i64::from(parallelism) {
        return Ok(());
    }
    Err(Violation::MinMemberNotParallelism {
        label: names.min_member_label.clone(),
        min_member: gang.min_member,
        runner: runner.into(),
        parallelism,
    })
}

/// Whether two quantities have the same value (`1` and `1000m` do); unparsable ones must match
/// as text.
fn same_quantity(a: &Quantity, b: &Quantity) -> bool {
    match (parse_whole(&a.0), parse_whole(&b.0)) {
        (Ok(x), Ok(y)) => x == y,
        _ => a.0.trim() == b.0.trim(),
    }
}
