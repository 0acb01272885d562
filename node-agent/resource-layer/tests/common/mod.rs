//! Helpers shared by the integration tests.
#![allow(dead_code)]

use runtimekit_resource_layer::instances::{CreateRequest, ShareSpec};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// A temporary directory removed on drop.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "rl-it-{name}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create temp dir");
        Self(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A one-card A30 profile in MIG mode with two unkeyed instances, the 4-slice geometry.
pub const A30: &str = r#"
name: a30-1
description: one A30 in MIG mode with two instances made by hand
driver_version: "535.161.08"
numa_nodes: [{socket: 0, cpus: "0-15"}]
models:
  a30: {vendor: nvidia, product_name: NVIDIA A30, memory_mib: 24576, reserved_mib: 300,
        idle_power_w: 30, max_power_w: 165, idle_sm_clock_mhz: 210, max_sm_clock_mhz: 1440,
        mem_clock_mhz: 1215, pcie_gb_per_s: 32, mig: true, row_remapping: true}
cards:
  - {model: a30, pci_bus_id: "00000000:01:00.0", numa_node: 0, mig_enabled: true,
     instances: [{profile: 1g.6gb, start: 0}, {profile: 1g.6gb, start: 1}]}
"#;

/// A request for a MIG instance of `profile` at `start` on `card`, keyed `key`.
pub fn mig(key: &str, card: u32, profile: &str, start: u8) -> CreateRequest {
    CreateRequest {
        key: key.into(),
        device_index: card,
        device_uuid: None,
        spec: ShareSpec::Mig {
            profile: profile.into(),
            start,
        },
    }
}
