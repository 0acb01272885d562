//! The node agent as a DRA driver (`resource.k8s.io/v1`): it publishes the node's cards and NICs
//! as ResourceSlices under the driver `gpu.runtimekit.<prefix>`, one pool per node, so
//! kube-scheduler (or any allocator) can hand them out to ResourceClaims. The names it
//! publishes under are the contract's (`runtimekit_contract::dra`).
//!
//! - [`mode`]: whether the node's whole cards are given by DRA or by the device plugin;
//! - [`pool`]: what the node offers, from what the agent knows (pure);
//! - [`publisher`]: keeps the pool's ResourceSlices equal to it;
//! - [`claims`]: what an allocated claim asks of the node, checked against what it holds (pure);
//! - [`config`]: the opaque configuration a claim gives the driver (pure);
//! - [`cdi`]: the CDI specs that give a prepared claim's containers their devices;
//! - [`checkpoint`]: the record of prepared claims that outlives the agent;
//! - [`plugin`]: the kubelet plugin that prepares and unprepares claims;
//! - [`authority`]: the relay that lets the kubelet's registration requests reach it.

pub mod authority;
pub mod cdi;
pub mod checkpoint;
pub mod claims;
pub mod config;
pub mod mode;
pub mod plugin;
pub mod pool;
pub mod publisher;
