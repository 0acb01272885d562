//! A scriptable `libnvidia-ml.so.1` test double: it exports the NVML symbols the kit calls,
//! with the structures of NVML's own header (through nvml-wrapper-sys), and answers from a
//! [`World`] kept as JSON in `fake-nvml.json` beside the library. Tests copy the library into
//! a folder of their own with [`FakeNvml::install`] (each copy is loaded once per process, so
//! tests running side by side do not share a world), point the NVML backend at it, and script
//! it by editing the world: cards lost, MIG instances, links, processes, events, and errors or
//! hangs per call.
//!
//! What the fake models, and how, is listed in `README.md` beside this crate.
#![allow(unsafe_code)]

mod api;
mod handles;
mod harness;
mod presets;
mod state;
pub mod world;

pub use harness::FakeNvml;
pub use state::WORLD_FILE;
pub use world::World;

/// NVML's event type bit of XID errors.
pub const XID_EVENT: u64 = nvml_wrapper_sys::bindings::nvmlEventTypeXidCriticalError as u64;
/// NVML's event type bit of double-bit ECC errors.
pub const DBE_EVENT: u64 = nvml_wrapper_sys::bindings::nvmlEventTypeDoubleBitEccError as u64;
