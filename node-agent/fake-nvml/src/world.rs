//! The fake's world: the cards, their MIG instances, links, processes and readings, the events
//! waiting to be delivered and the faults scripted per call. It is kept as JSON in a file
//! beside the library; the library rereads it when it changes and writes it back when a call
//! changes it (MIG instances created or destroyed, events delivered), so a test scripts the
//! fake by editing the file ([`crate::FakeNvml::edit`]).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Everything the fake NVML knows.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct World {
    pub driver_version: String,
    pub cards: Vec<Card>,
    /// Errors and hangs scripted per call.
    pub faults: Vec<CallFault>,
    /// Events waiting for `nvmlEventSetWait_v2`, oldest first.
    pub events: Vec<Event>,
    /// Process names by PID (`nvmlSystemGetProcessName`).
    pub process_names: BTreeMap<u32, String>,
    /// How often the driver samples per-process utilisation, in milliseconds: a sample is
    /// taken at every multiple of it, and a process idle at that moment has none.
    pub sample_period_ms: u64,
    /// The time of the driver's newest sample, in µs since the epoch, held still; the newest
    /// multiple of the period before now when absent.
    pub sample_at_us: Option<u64>,
}

/// One card.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Card {
    pub uuid: String,
    pub name: String,
    pub serial: String,
    /// NVML's form: `00000000:17:00.0`.
    pub pci_bus_id: String,
    pub pci_device_id: u32,
    pub minor: u32,
    /// The PCIe switch and NUMA node the card hangs off (for the common-ancestor level).
    pub pcie_switch: u32,
    pub numa_node: u32,
    pub memory_total_mib: u64,
    pub memory_used_mib: u64,
    pub memory_reserved_mib: u64,
    /// Every call on the card answers GPU_IS_LOST.
    pub lost: bool,
    /// `None`: the card has no MIG (NOT_SUPPORTED).
    pub mig: Option<Mig>,
    pub links: Vec<Link>,
    pub processes: Vec<Process>,
    pub readings: Readings,
    /// NVML's compute mode: 0 default, 2 prohibited, 3 exclusive process.
    pub compute_mode: u32,
    /// GPM (Hopper and newer).
    pub gpm: bool,
    /// GPM samples taken of the card so far.
    pub gpm_samples: u64,
    /// The event types the card supports (NVML's bit mask).
    pub supported_events: u64,
    /// NVML's CPU-affinity mask words.
    pub cpu_affinity: Vec<u64>,
}

/// MIG state and instances of a card.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Mig {
    pub current: bool,
    pub pending: bool,
    /// GPU-instance profiles; an index not listed below `profile_count` is NOT_SUPPORTED.
    pub profiles: Vec<GiProfile>,
    /// Profile indexes at or past this answer INVALID_ARGUMENT (the driver's profile count).
    pub profile_count: u32,
    /// Compute-instance profile indexes at or past this answer INVALID_ARGUMENT.
    pub compute_profile_count: u32,
    pub instances: Vec<GpuInstance>,
}

/// A GPU-instance profile as the driver reports it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GiProfile {
    /// The `NVML_GPU_INSTANCE_PROFILE_*` index callers ask with.
    pub index: u32,
    /// `nvmlGpuInstanceProfileInfo_t.id`, which placements and creation use.
    pub id: u32,
    pub name: String,
    pub slices: u32,
    pub memory_slices: u32,
    pub instance_count: u32,
    pub memory_mb: u64,
    pub multiprocessors: u32,
    /// Legal placement starts.
    pub starts: Vec<u32>,
    /// Compute-instance profiles inside a GPU instance of this profile.
    pub compute_profiles: Vec<CiProfile>,
}

/// A compute-instance profile.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CiProfile {
    /// The `NVML_COMPUTE_INSTANCE_PROFILE_*` index.
    pub index: u32,
    pub id: u32,
    pub slices: u32,
}

/// A GPU instance.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GpuInstance {
    pub id: u32,
    /// Its profile's `id`.
    pub profile_id: u32,
    pub start: u32,
    pub size: u32,
    /// The MIG device's UUID (`MIG-...`), present once it has a compute instance.
    pub uuid: String,
    pub memory_used_mib: u64,
    pub compute_instances: Vec<ComputeInstance>,
}

/// A compute instance.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ComputeInstance {
    pub id: u32,
    pub profile_id: u32,
}

/// An NVLink link and its counters.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Link {
    pub active: bool,
    pub remote_bus_id: String,
    /// `nvmlIntNvLinkDeviceType_t`: 0 GPU, 1 IBM NPU, 2 switch, 255 unknown.
    pub remote_type: u32,
    pub tx_kib: u64,
    pub rx_kib: u64,
    pub crc_flit_errors: u64,
    pub crc_data_errors: u64,
    pub replay_errors: u64,
    pub recovery_errors: u64,
}

/// A process holding the card.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Process {
    pub pid: u32,
    /// `None`: NVML cannot say (no permission to read other users' processes).
    pub used_mib: Option<u64>,
    pub gpu_instance_id: Option<u32>,
    pub compute_instance_id: Option<u32>,
    /// SM utilisation at each sample; 0 means idle (no sample, as the driver does).
    pub sm_util: u32,
    pub mem_util: u32,
    /// A graphics process rather than a compute one.
    pub graphics: bool,
}

/// What the card's sensors and counters read.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Readings {
    pub gpu_temp_c: u32,
    pub memory_temp_c: u32,
    pub power_mw: u32,
    pub energy_mj: u64,
    pub sm_clock_mhz: u32,
    pub mem_clock_mhz: u32,
    pub gpu_util: u32,
    pub mem_util: u32,
    pub pcie_tx_kb_per_s: u32,
    pub pcie_rx_kb_per_s: u32,
    pub pcie_replays: u32,
    pub ecc_sbe_volatile: u64,
    pub ecc_dbe_volatile: u64,
    pub ecc_sbe_aggregate: u64,
    pub ecc_dbe_aggregate: u64,
    pub retired_pages_pending: bool,
    pub remapped_correctable: u32,
    pub remapped_uncorrectable: u32,
    pub remap_pending: bool,
    pub remap_failure: bool,
    pub retired_pages_sbe: u32,
    pub retired_pages_dbe: u32,
    pub power_violation_ns: u64,
    pub thermal_violation_ns: u64,
    /// GPM activity ratios in percent: graphics, SM, SM occupancy, tensor, DRAM.
    pub gpm_percent: [f64; 5],
}

/// A call made to fail or hang.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CallFault {
    /// The NVML symbol, for example `nvmlDeviceGetUUID`.
    pub call: String,
    /// Only calls on this card (by index); any card when absent.
    pub card: Option<u32>,
    /// NVML's name of the error without `NVML_ERROR_`, for example `NO_PERMISSION`; the call
    /// goes on normally after a hang when absent.
    pub error: Option<String>,
    /// How long the call blocks first, in milliseconds.
    pub hang_ms: u64,
    /// How many more calls it affects; every one when absent.
    pub times: Option<u32>,
}

/// An event for `nvmlEventSetWait_v2`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Event {
    pub card: u32,
    /// NVML's event type bit, for example [`crate::XID_EVENT`].
    pub kind: u64,
    /// The XID, for XID events.
    pub data: u64,
    /// The GPU and compute instance the driver names (`u32::MAX`: none).
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
}

impl Event {
    /// An XID on a card, outside any MIG instance.
    pub fn xid(card: u32, xid: u64) -> Event {
        Event {
            card,
            kind: crate::XID_EVENT,
            data: xid,
            gpu_instance_id: u32::MAX,
            compute_instance_id: u32::MAX,
        }
    }
}

impl CallFault {
    /// `call` on `card` (any when `None`) answers `error` from now on.
    pub fn error(call: &str, card: Option<u32>, error: &str) -> CallFault {
        CallFault {
            call: call.into(),
            card,
            error: Some(error.into()),
            ..CallFault::default()
        }
    }

    /// `call` on `card` blocks for `ms` milliseconds, then goes on.
    pub fn hang(call: &str, card: Option<u32>, ms: u64) -> CallFault {
        CallFault {
            call: call.into(),
            card,
            hang_ms: ms,
            ..CallFault::default()
        }
    }
}
