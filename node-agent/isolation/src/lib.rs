//! `libruntimekit_isolation.so`: the enforcement library `lj-runtime` preloads into the
//! containers of time-division slices. It stands in front of the CUDA driver and NVML
//! (`hooks`) and holds each card the container was given to its memory cap: every allocation
//! path reserves its bytes in a ledger all the container's processes share (`ledger`, mapped by
//! `shared`) before the driver is asked, and memory queries report the cap and the container's
//! own use. The limits come from the environment `lj-runtime` sets (`limits`).
//!
//! What it cannot intercept, and what a slice is and is not guaranteed, is in
//! `docs/isolation.md`.
#![allow(unsafe_code)]

// The hooks export the driver's names: a unit-test binary must not define them for itself, so
// the hooks and what only they use are left out of it (the integration tests run them).
#[cfg(not(test))]
mod hooks;
pub mod ledger;
pub mod limits;
#[cfg(not(test))]
mod real;
#[cfg(not(test))]
mod shared;
#[cfg(not(test))]
mod state;
pub mod throttle;
