//! `lj-runtime`: the OCI runtime behind RuntimeClass `lj-runtime`. containerd's runc shim calls
//! it with runc's command line; on `create` it reads the allocation annotation that containerd
//! passed into the container's OCI spec, injects the allocated cards' (or MIG instances')
//! device files, the RDMA NICs' devices, the visible-device environment and the limits, and
//! then, for every command, execs runc with the arguments it was given.
//!
//! A container holding a time-division share is also given the isolation library, preloaded,
//! and a ledger folder of its own (`runtimekit_injection::isolation`).
//!
//! `args` finds the command, the bundle and the container ID in runc's command line, `config` is
//! the runtime's own settings, `hardware` asks the node's resource layer about its device
//! files, and `inject` the rewrite of the spec itself, without I/O.

pub mod args;
pub mod config;
pub mod hardware;
pub mod inject;
