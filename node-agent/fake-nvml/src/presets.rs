//! Worlds as real machines show them: H100 80GB cards as `nvidia-smi` reports them (names,
//! memory, PCI IDs, MIG profiles with their IDs, sizes and placements from `nvidia-smi mig
//! -lgip`/`-lgipp`), eight to an HGX board, every card linked to the others through NVSwitch.

use crate::world::{Card, CiProfile, GiProfile, Link, Mig, Readings, World};

/// The PCI buses of an HGX H100 board's eight cards.
const HGX_BUSES: [u8; 8] = [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb];
/// NVLink links per H100.
const H100_LINKS: usize = 18;
/// Driver 550's numbers of GPU- and compute-instance profile indexes
/// (`NVML_GPU_INSTANCE_PROFILE_COUNT`, `NVML_COMPUTE_INSTANCE_PROFILE_COUNT`).
const PROFILE_COUNT: u32 = 17;
const COMPUTE_PROFILE_COUNT: u32 = 8;

/// Compute-instance profiles of a GPU instance of `slices` slices: one per smaller or equal
/// standard size (indexes are `NVML_COMPUTE_INSTANCE_PROFILE_*`).
fn compute_profiles(slices: u32) -> Vec<CiProfile> {
    [(0, 1), (1, 2), (2, 3), (3, 4), (4, 7)]
        .into_iter()
        .filter(|&(_, s)| s <= slices)
        .map(|(index, s)| CiProfile {
            index,
            id: index,
            slices: s,
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
fn profile(
    index: u32,
    id: u32,
    name: &str,
    slices: u32,
    memory_slices: u32,
    instance_count: u32,
    memory_mb: u64,
    multiprocessors: u32,
    starts: &[u32],
) -> GiProfile {
    GiProfile {
        index,
        id,
        name: name.into(),
        slices,
        memory_slices,
        instance_count,
        memory_mb,
        multiprocessors,
        starts: starts.to_vec(),
        compute_profiles: compute_profiles(slices),
    }
}

/// H100 80GB's GPU-instance profiles (driver 550).
fn h100_profiles() -> Vec<GiProfile> {
    vec![
        profile(0, 19, "1g.10gb", 1, 1, 7, 9_856, 16, &[0, 1, 2, 3, 4, 5, 6]),
        profile(
            7,
            20,
            "1g.10gb+me",
            1,
            1,
            1,
            9_856,
            16,
            &[0, 1, 2, 3, 4, 5, 6],
        ),
        profile(9, 15, "1g.20gb", 1, 2, 4, 20_096, 26, &[0, 2, 4, 6]),
        profile(1, 14, "2g.20gb", 2, 2, 3, 20_096, 32, &[0, 2, 4]),
        profile(2, 9, "3g.40gb", 3, 4, 2, 40_320, 60, &[0, 4]),
        profile(3, 5, "4g.40gb", 4, 4, 1, 40_320, 64, &[0]),
        profile(4, 0, "7g.80gb", 7, 8, 1, 80_512, 132, &[0]),
    ]
}

impl Card {
    /// Card `index` of an HGX H100 80GB board, MIG off, idle.
    pub fn h100(index: u32) -> Card {
        let bus = HGX_BUSES[index as usize % HGX_BUSES.len()];
        let links = (0..H100_LINKS)
            .map(|_| Link {
                active: true,
                remote_bus_id: "00000000:00:00.0".into(),
                remote_type: 2,
                ..Link::default()
            })
            .collect();
        Card {
            uuid: format!("GPU-fa4e0000-0000-4000-8000-{index:012x}"),
            name: "NVIDIA H100 80GB HBM3".into(),
            serial: format!("165322300{index:04}"),
            pci_bus_id: format!("00000000:{bus:02X}:00.0"),
            pci_device_id: 0x2330_10de,
            minor: index,
            pcie_switch: index / 2,
            numa_node: index / 4,
            memory_total_mib: 81_559,
            memory_used_mib: 0,
            memory_reserved_mib: 529,
            lost: false,
            mig: Some(Mig {
                current: false,
                pending: false,
                profiles: h100_profiles(),
                profile_count: PROFILE_COUNT,
                compute_profile_count: COMPUTE_PROFILE_COUNT,
                instances: Vec::new(),
            }),
            links,
            processes: Vec::new(),
            readings: Readings {
                gpu_temp_c: 31,
                memory_temp_c: 40,
                power_mw: 70_000,
                energy_mj: 1_000_000,
                sm_clock_mhz: 345,
                mem_clock_mhz: 2_619,
                ..Readings::default()
            },
            compute_mode: 0,
            gpm: true,
            gpm_samples: 0,
            supported_events: crate::XID_EVENT | crate::DBE_EVENT,
            cpu_affinity: vec![0xffff_ffff],
        }
    }

    /// The card with MIG mode on.
    pub fn mig_on(mut self) -> Card {
        if let Some(mig) = self.mig.as_mut() {
            mig.current = true;
            mig.pending = true;
        }
        self
    }
}

impl World {
    /// `cards` H100 80GB cards of one HGX board, MIG off.
    pub fn h100(cards: u32) -> World {
        World {
            driver_version: "550.90.07".into(),
            cards: (0..cards).map(Card::h100).collect(),
            sample_period_ms: 1_000,
            ..World::default()
        }
    }
}
