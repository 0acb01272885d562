//! The rules of the contract a pod can break, each with the message the user sees and a stable
//! reason, and the error that carries every rule one pod breaks.

use crate::config::{JOBSET_NAME_LABEL, MemoryUnit};
use std::fmt;
use thiserror::Error;

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
