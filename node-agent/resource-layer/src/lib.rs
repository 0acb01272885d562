//! The resource layer: the only part of the node agent that touches hardware, behind the
//! versioned gRPC API of `runtimekit-proto` (`runtimekit.resource.v1alpha1`), served on a unix
//! socket.
//!
//! - [`backend::Backend`] is the one internal trait; [`sim::SimulatedBackend`] (hardware
//!   profiles, the real MIG rules, time-varying metrics, fault injection) and
//!   [`nvml::NvmlBackend`] (NVIDIA cards through NVML, loaded at run time) implement it.
//! - [`server::serve`] serves a backend on a socket inside the caller's tokio runtime and
//!   returns a handle, so tests and the node agent can embed many servers in one process.
//! - [`client::connect`] and friends connect to a socket.
//! - [`reason::Reason`] is the stable reason an error carries on the wire; callers parse it
//!   from [`reason_of`] and ask [`Reason::is_permanent`].
//! - [`meter`] measures isolated containers' shares of SM time for their launch gates.
//! - [`probe::report`] is the read-only report the `probe` command prints.

pub mod backend;
pub mod client;
pub mod device_nodes;
pub mod error;
pub mod facts;
pub mod faults;
pub mod health;
pub mod instances;
pub mod meter;
pub mod nvml;
pub mod probe;
pub mod reason;
pub mod server;
pub mod sim;
pub mod store;
pub mod sysfs;
pub mod topology;
pub mod util;
pub mod watch;

pub use backend::{Backend, DestroyTarget, FaultInjector};
pub use client::{connect, connect_lazy, fault_client, resource_client};
pub use error::{LayerError, reason_of};
pub use nvml::{NvmlBackend, NvmlOptions};
pub use reason::{Reason, UnknownReason};
pub use server::{ServeError, ServeOptions, ServerHandle, listen_private, serve};
pub use sim::{SimOptions, SimProfile, SimulatedBackend};
pub use util::Clock;
