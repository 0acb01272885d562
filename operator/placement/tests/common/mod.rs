//! Builders shared by the integration tests.
// Test helpers: not every test file uses every builder, and failing loudly is their job.
#![allow(dead_code, clippy::panic)]

use runtimekit_contract::{CardRequest, ContainerRequest, WholeCardName};
use runtimekit_placement::*;
use std::collections::BTreeMap;

pub const GIB: u64 = 1024;

pub fn cluster() -> Cluster {
    Cluster::new(Settings::default())
}

pub fn node(name: &str) -> NodeInfo {
    NodeInfo {
        name: name.into(),
        labels: BTreeMap::from([
            ("kubernetes.io/hostname".into(), name.into()),
            ("lj_runtimekit_enable".into(), "true".into()),
        ]),
        allocatable: Resources {
            cpu_milli: 64_000,
            memory_bytes: 512 << 30,
            scalar: BTreeMap::new(),
        },
        max_pods: 110,
        ready: true,
        gpu_enabled: true,
        ..NodeInfo::default()
    }
}

pub fn card(index: u32, vendor: Vendor, model: &str, memory_gib: u64) -> CardInfo {
    CardInfo {
        index,
        uuid: format!("{model}-{index}"),
        vendor,
        model: model.into(),
        memory_mib: memory_gib * GIB,
        mig_enabled: false,
        healthy: true,
        pcie_switch: None,
        numa_node: None,
        socket: None,
        interconnect_group: None,
        nvlink_peers: Vec::new(),
        mig_instances: Vec::new(),
    }
}

pub fn h800(index: u32) -> CardInfo {
    card(index, Vendor::Nvidia, "NVIDIA H800", 80)
}

pub fn h800_mig(index: u32) -> CardInfo {
    CardInfo {
        mig_enabled: true,
        ..h800(index)
    }
}

pub fn ppu_810e(index: u32, group: &str) -> CardInfo {
    CardInfo {
        interconnect_group: Some(group.into()),
        ..card(index, Vendor::Ppu, "PPU-810E", 96)
    }
}

pub fn m890p(index: u32, switch: &str, numa: u32, socket: u32) -> CardInfo {
    CardInfo {
        pcie_switch: Some(switch.into()),
        numa_node: Some(numa),
        socket: Some(socket),
        ..card(index, Vendor::Ppu, "PPU-M890P", 96)
    }
}

pub fn nic(name: &str, switch: &str, numa: u32, socket: u32) -> NicInfo {
    NicInfo {
        name: name.into(),
        pcie_switch: Some(switch.into()),
        numa_node: Some(numa),
        socket: Some(socket),
    }
}

/// Adds a ready, enabled, reporting node with these devices.
pub fn add(c: &mut Cluster, info: NodeInfo, cards: &[CardInfo], nics: &[NicInfo]) {
    let name = info.name.clone();
    c.upsert_node(info);
    c.set_devices(&name, cards, nics);
    c.set_agent_reporting(&name, true);
}

pub fn pod(uid: &str, cards: CardRequest) -> PodInput {
    PodInput {
        uid: uid.into(),
        containers: vec![ContainerRequest {
            container: "main".into(),
            cards,
            rdma: false,
        }],
        resources: Resources {
            cpu_milli: 1000,
            memory_bytes: 1 << 30,
            scalar: BTreeMap::new(),
        },
        ..PodInput::default()
    }
}

pub fn tdm(uid: &str, core: Option<u8>, memory_gib: Option<u64>) -> PodInput {
    pod(
        uid,
        CardRequest::Tdm {
            cards: 1,
            core,
            memory_mib: memory_gib.map(|g| g * GIB),
        },
    )
}

pub fn mig(uid: &str, slices: u8, memory_gib: Option<u64>) -> PodInput {
    pod(
        uid,
        CardRequest::Mig {
            cards: 1,
            slices,
            memory_mib: memory_gib.map(|g| g * GIB),
        },
    )
}

pub fn whole(uid: &str, cards: u32) -> PodInput {
    pod(
        uid,
        CardRequest::Whole {
            cards,
            name: WholeCardName::AnyVendor,
        },
    )
}

pub fn with_rdma(mut p: PodInput) -> PodInput {
    for c in &mut p.containers {
        c.rdma = true;
    }
    p
}

/// Decides and commits, panicking with the message on failure.
pub fn place(c: &mut Cluster, p: &PodInput) -> Decision {
    let d = c.decide(p).unwrap_or_else(|e| panic!("{}: {e}", p.uid));
    c.commit(&d).unwrap_or_else(|e| panic!("{}: {e}", p.uid));
    d
}

/// The card indexes of a decision's first container.
pub fn indexes(d: &Decision) -> Vec<u32> {
    d.containers[0].cards.iter().map(|c| c.index).collect()
}
