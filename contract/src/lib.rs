//! The resource contract of the GPU runtime kit: what a pod may ask for, parsed and checked
//! without any I/O, plus the configuration every component shares and the MIG profile tables.
//!
//! The operator's scheduler and admission path, the node agent and the exporter all use this
//! crate, so a rule is written once and reads the same everywhere.

pub mod allocation;
pub mod config;
pub mod dra;
pub mod mig;
pub mod quantity;
pub mod request;

pub use config::{
    Features, HealthTaint, MemoryUnit, ResourceNames, RuntimeKitConfig, TopologyLabels,
};
pub use request::{
    CardRequest, ContainerRequest, ContractError, Finding, GangMembership, PodRequest, Violation,
    Warning, WholeCardName, check_gang_size, parse_pod,
};
