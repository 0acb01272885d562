//! The operator: the lj-runtimekit-scheduler and the GpuSlice, GangGroup and TopologyGroup
//! controllers. `main.rs` only parses the command line.

pub mod backoff;
pub mod check;
pub mod gangs;
pub mod jobset;
pub mod leader;
pub mod metrics;
pub mod pre_uninstall;
pub mod run;
pub mod scheduler;
pub mod shared;
pub mod slices;
pub mod state;
pub mod topology;
pub mod topology_sync;
pub mod watch;
pub mod writes;
