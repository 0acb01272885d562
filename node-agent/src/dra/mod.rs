//! The node agent as a DRA driver (`resource.k8s.io/v1`): it publishes the node's cards and NICs
//! as ResourceSlices under the driver `gpu.runtimekit.<prefix>`, one pool per node, so
//! kube-scheduler (or any allocator) can hand them out to ResourceClaims.
//!
//! - [`names`]: the driver's, devices', counters', attributes' and capacities' names;
//! - [`pool`]: what the node offers, from what the agent knows (pure);
//! - [`publisher`]: keeps the pool's ResourceSlices equal to it;
//! - [`claims`]: what an allocated claim asks of the node, checked against what it holds (pure).

pub mod claims;
pub mod names;
pub mod pool;
pub mod publisher;
