//! The node agent of the GPU runtime kit, one per GPU node:
//!
//! - [`reporter`]: creates the node's TopologyGroup (tier Node) and keeps its status true
//!   (cards, NICs, topology, MIG state, health, capacity, heartbeat), writes Events on the Node
//!   when a card turns unhealthy or healthy, and the node-level resources of MiB mode;
//! - [`enactor`]: enacts the GpuSlices bound to the node through the resource layer (MIG
//!   instances at the chosen start, TDM quotas), adopts what exists after a restart, destroys
//!   the instances of ended pods and then removes the finalizer;
//! - [`deviceplugin`]: the kubelet device plugin (v1beta1) for every resource of SPEC section 6;
//! - [`layer`]: the resource layer, the agent's only way to the hardware, and its health stream.
//!
//! Decisions are pure functions tested without I/O: [`topology`] (TopologyGroup status),
//! [`resources`] (what is advertised), [`enactor::decide`] (what to do with each slice),
//! [`deviceplugin::allocation`] (which devices to suggest and give). The test kubelet its tests
//! run against is the `runtimekit-test-kubelet` crate, a dev-dependency only.

pub mod agent;
pub mod cli;
pub mod deviceplugin;
pub mod dra;
pub mod enactor;
pub mod exporter;
#[cfg(test)]
mod fixtures;
pub mod health;
pub mod host_files;
pub mod install;
pub mod layer;
pub mod model;
pub mod node_watch;
pub mod podresources;
pub mod process;
pub mod reporter;
pub mod resources;
pub mod runtime_status;
pub mod task;
pub mod topology;
