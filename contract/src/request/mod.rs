//! A pod's GPU request, parsed from its spec and checked against every rule of the contract.
//!
//! What a pod may ask for is in `types`; [`parse_pod`] (in `pod`) reads it container by
//! container (`container`, then `card_kind` for the rules between one container's values) and
//! checks the pod-level rules, the gang labels among them (`gang`). Every broken rule is a
//! [`Violation`] (`violation`); what is allowed but probably a mistake is a [`Warning`]
//! (`warning`). One parse collects both in a `parser::Parser`.

mod card_kind;
mod container;
mod gang;
mod parser;
mod pod;
mod types;
mod violation;
mod warning;

pub use gang::check_gang_size;
pub use pod::parse_pod;
pub use types::{CardRequest, ContainerRequest, GangMembership, PodRequest, WholeCardName};
pub use violation::{ContractError, Finding, Violation};
pub use warning::Warning;

/// The most cards one container or the replica label may ask for.
pub const MAX_CARDS: u32 = 64;
