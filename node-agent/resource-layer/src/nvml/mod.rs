//! The NVML backend: NVIDIA cards through nvml-wrapper, with `libnvidia-ml.so.1` loaded at run
//! time (the binary has no link-time dependency on it and says plainly when it is missing).
//!
//! - Discovery: index, UUID, name, memory, PCI, serial, MIG mode (current and pending).
//! - MIG: profiles from the contract's table of the model, with the sizes, profile IDs and
//!   placements the driver reports; GPU instances created at a placement with their full
//!   compute instance, listed and destroyed through raw calls (`raw`). MIG mode is never
//!   changed.
//! - Keys: the hardware does not know instance keys, so the backend keeps them (and TDM
//!   shares) in its state file. A GPU instance no key owns is listed unkeyed and can be
//!   adopted by creating it again with the same profile and start.
//! - Topology: common ancestor (PIX/PXB/PHB/NODE/SYS), PCIe switch, NUMA node and socket from
//!   sysfs, CPU affinity, NVLink links with their far end; RDMA NICs from sysfs.
//! - Health: XID and double-bit ECC events from an event set, and a poll of volatile DBE
//!   counts, remapped rows, pending page retirement, lost cards and memory held by dead
//!   processes. XID faults stay until the resource layer restarts, as in the NVIDIA device
//!   plugin: NVML reports the error, not its end.
//! - Metrics: the DCGM field set from NVML calls (interfaces notes, section 1.2), DCP ratios
//!   from GPM where the card has it (Hopper and newer).

mod convert;
mod raw;

use crate::backend::{Backend, DestroyTarget, select_devices};
use crate::error::LayerError;
use crate::faults;
use crate::health::HealthHub;
use crate::instances::{
    CreateRequest, InstanceRecord, MigIds, Resolution, ShareSpec, check_mig_placement, max_alone,
    resolve,
};
use crate::store::Store;
use crate::sysfs::{Sysfs, sysfs_bus_id};
use crate::topology::{CardLinks, apply_peer_links, cpulist_from_mask, link_groups};
use crate::util::{Clock, lock};
use crate::watch::CallWatch;
use convert::{
    call_error, ci_profile_index, fallback_profile_name, gi_profile_index, init_error, link_remote,
    mib, no_room, path_level, sample_u64,
};
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{
    Clock as NvClock, EccCounter, MemoryError, PcieUtilCounter, PerformancePolicy, RetirementCause,
    TemperatureSensor,
};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::event::EventSet;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::sys_exports::field_id;
use nvml_wrapper::{Device, GpmSample, Nvml};
use nvml_wrapper_sys::bindings::NVML_NVLINK_MAX_LINKS;
use runtimekit_contract::mig::{MigProfile, MigTable, table_for};
use runtimekit_proto::resource::v1alpha1 as pb;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How the NVML backend runs.
#[derive(Debug, Clone)]
pub struct NvmlOptions {
    /// The NVML library to load; `None` loads `libnvidia-ml.so.1` from the library path.
    pub lib_path: Option<PathBuf>,
    pub node_name: String,
    /// Where instance keys and TDM shares are kept; `None` keeps them in memory only.
    pub state_file: Option<PathBuf>,
    /// The sysfs root (`/sys`).
    pub sysfs_root: PathBuf,
    /// How long a call on a card runs before the card gets a CALL_HANG fault.
    pub hang_threshold: Duration,
    /// How often ECC, remapped rows, lost cards and dead processes are polled.
    pub poll_interval: Duration,
    /// Check that processes holding card memory still exist (needs the host PID namespace).
    pub check_process_liveness: bool,
}

impl Default for NvmlOptions {
    fn default() -> Self {
        Self {
            lib_path: None,
            node_name: String::new(),
            state_file: None,
            sysfs_root: PathBuf::from("/sys"),
            hang_threshold: Duration::from_secs(5),
            poll_interval: Duration::from_secs(10),
            check_process_liveness: true,
        }
    }
}

/// NVIDIA cards through NVML.
#[derive(Debug)]
pub struct NvmlBackend {
    shared: Arc<Shared>,
}

impl Drop for NvmlBackend {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
    }
}

#[derive(Debug, Clone, Default)]
struct KnownCard {
    uuid: String,
    bus_id: String,
}

#[derive(Debug)]
struct Shared {
    nvml: Nvml,
    options: NvmlOptions,
    clock: Clock,
    hub: Arc<HealthHub>,
    watch: CallWatch,
    sysfs: Sysfs,
    store: Option<Store>,
    count: u32,
    driver_version: String,
    known: Vec<KnownCard>,
    /// Keyed instances: TDM shares, and the keys of MIG instances.
    ledger: Mutex<Vec<InstanceRecord>>,
    /// Serialises creation and destruction.
    changes: Mutex<()>,
    last_xid: Mutex<BTreeMap<u32, u32>>,
    util_seen: Mutex<BTreeMap<u32, u64>>,
    dead_seen: Mutex<BTreeMap<u32, BTreeSet<u32>>>,
    stop: AtomicBool,
}

/// A GPU-instance profile of a card as the driver reports it.
#[derive(Debug, Clone)]
struct HwProfile {
    /// The contract's profile, when the model has a table.
    table: Option<&'static MigProfile>,
    /// `ProfileInfo.id`.
    id: u32,
    slices: u32,
    instance_count: u32,
    memory_mb: u64,
    multiprocessors: u32,
    placements: Vec<raw::GiPlacement>,
    hw_name: String,
}

impl HwProfile {
    fn name(&self) -> String {
        match self.table {
            Some(p) => p.name.to_string(),
            None if !self.hw_name.is_empty() => self.hw_name.clone(),
            None => fallback_profile_name(self.slices, self.memory_mb),
        }
    }
}

/// `NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1` and `_2_SLICE_REV1`: the `+me` profiles.
const MEDIA_PROFILE_INDEXES: [u32; 2] = [
    nvml_wrapper_sys::bindings::NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1,
    nvml_wrapper_sys::bindings::NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1,
];

/// The (compute slices, memory slices) of the profiles probed on a model without a table.
const PROBED_PROFILES: [(u8, u8); 6] = [(1, 1), (1, 2), (2, 2), (3, 4), (4, 4), (7, 8)];

/// Dead-process bookkeeping: a process is reported dead only when two polls in a row found
/// it holding memory with no process behind it (one that just exited may still be listed).
/// Returns the confirmed (PID, MiB) and the PIDs to remember for the next poll.
fn dead_verdict(
    previous: &BTreeSet<u32>,
    dead_now: &[(u32, u64)],
) -> (Vec<(u32, u64)>, BTreeSet<u32>) {
    let confirmed = dead_now
        .iter()
        .copied()
        .filter(|(pid, _)| previous.contains(pid))
        .collect();
    (confirmed, dead_now.iter().map(|(pid, _)| *pid).collect())
}

impl NvmlBackend {
    /// Loads NVML and discovers the cards. Fails with [`LayerError::NvmlNotFound`] when the
    /// library is missing and [`LayerError::DriverNotLoaded`] without the kernel driver.
    /// Changes nothing on the cards.
    pub fn new(options: NvmlOptions) -> Result<Self, LayerError> {
        let nvml = match &options.lib_path {
            Some(path) => Nvml::builder().lib_path(path.as_os_str()).init(),
            None => Nvml::init(),
        }
        .map_err(init_error)?;
        let count = nvml.device_count().map_err(|e| LayerError::Nvml {
            call: "nvmlDeviceGetCount_v2",
            index: None,
            message: e.to_string(),
        })?;
        let driver_version = nvml.sys_driver_version().unwrap_or_default();
        let known = (0..count)
            .map(|i| match nvml.device_by_index(i) {
                Ok(dev) => KnownCard {
                    uuid: dev.uuid().unwrap_or_default(),
                    bus_id: dev.pci_info().map(|p| p.bus_id).unwrap_or_default(),
                },
                Err(_) => KnownCard::default(),
            })
            .collect();
        let clock = Clock::System;
        let hub = Arc::new(HealthHub::new(clock.clone()));
        let watch = CallWatch::new(hub.clone(), options.hang_threshold);
        let store = options.state_file.clone().map(Store::new);
        let ledger = match &store {
            Some(store) => store
                .load("nvml", &options.node_name)?
                .map(|s| s.instances)
                .unwrap_or_default(),
            None => Vec::new(),
        };
        let shared = Arc::new(Shared {
            sysfs: Sysfs::new(options.sysfs_root.clone()),
            nvml,
            options,
            clock,
            hub,
            watch,
            store,
            count,
            driver_version,
            known,
            ledger: Mutex::new(ledger),
            changes: Mutex::new(()),
            last_xid: Mutex::new(BTreeMap::new()),
            util_seen: Mutex::new(BTreeMap::new()),
            dead_seen: Mutex::new(BTreeMap::new()),
            stop: AtomicBool::new(false),
        });
        shared.poll_health();
        let events = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("rl-nvml-health".into())
            .spawn(move || events.health_loop());
        if let Err(error) = spawned {
            tracing::error!(%error, "cannot start the NVML health thread; faults are not watched");
        }
        tracing::info!(cards = count, "NVML backend ready");
        Ok(Self { shared })
    }
}

impl Shared {
    fn uuid_of(&self, index: u32) -> String {
        self.known
            .get(index as usize)
            .map(|k| k.uuid.clone())
            .unwrap_or_default()
    }

    fn index_of_uuid(&self, uuid: &str) -> Option<u32> {
        self.known
            .iter()
            .position(|k| k.uuid == uuid)
            .and_then(|i| u32::try_from(i).ok())
    }

    fn index_of_bus(&self, bus_id: &str) -> Option<u32> {
        let want = sysfs_bus_id(bus_id);
        self.known
            .iter()
            .position(|k| !k.bus_id.is_empty() && sysfs_bus_id(&k.bus_id) == want)
            .and_then(|i| u32::try_from(i).ok())
    }

    /// The handle of a card; a lost card raises GPU_LOST.
    fn dev(&self, index: u32) -> Result<Device<'_>, LayerError> {
        let uuid = self.uuid_of(index);
        match self.nvml.device_by_index(index) {
            Ok(dev) => Ok(dev),
            Err(NvmlError::GpuLost) => {
                self.hub.raise(index, &uuid, faults::gpu_lost());
                Err(LayerError::DeviceLost { index, uuid })
            }
            Err(e) => Err(call_error("nvmlDeviceGetHandleByIndex_v2", index, &uuid, e)),
        }
    }

    fn check_device(&self, index: u32, uuid: Option<&str>) -> Result<(), LayerError> {
        if index >= self.count {
            return Err(LayerError::NoSuchDevice {
                index,
                count: self.count,
            });
        }
        let actual = self.uuid_of(index);
        if let Some(expected) = uuid
            && expected != actual
        {
            return Err(LayerError::UuidMismatch {
                index,
                expected: expected.to_string(),
                actual,
            });
        }
        Ok(())
    }

    fn persist(&self, ledger: &[InstanceRecord]) -> Result<(), LayerError> {
        match &self.store {
            Some(store) => store.save("nvml", &self.options.node_name, ledger),
            None => Ok(()),
        }
    }

    fn table_of(dev: &Device<'_>) -> Option<&'static MigTable> {
        let name = dev.name().ok()?;
        let memory = dev.memory_info().ok().map(|m| mib(m.total))?;
        table_for(&name, memory)
    }

    /// MIG mode (current, pending); `None` when the card has no MIG.
    fn mig_mode(dev: &Device<'_>) -> Option<(bool, bool)> {
        dev.mig_mode()
            .ok()
            .map(|m| (m.current == 1, m.pending == 1))
    }

    /// The GPU-instance profiles of a card.
    fn hw_profiles(&self, dev: &Device<'_>, table: Option<&'static MigTable>) -> Vec<HwProfile> {
        let mut candidates: Vec<(Option<&'static MigProfile>, u32)> = match table {
            Some(t) => t
                .profiles
                .iter()
                .filter_map(|p| Some((Some(p), gi_profile_index(p.slices, p.memory_slices)?)))
                .collect(),
            None => PROBED_PROFILES
                .iter()
                .filter_map(|&(slices, memory_slices)| {
                    Some((None, gi_profile_index(slices, memory_slices)?))
                })
                .collect(),
        };
        // Media-extension profiles are never created here, but instances of them made by
        // hand occupy slices and must be listed.
        candidates.extend(MEDIA_PROFILE_INDEXES.iter().map(|&i| (None, i)));
        candidates
            .into_iter()
            .filter_map(|(table, index)| {
                let info = dev.profile_info(index).ok()?;
                Some(HwProfile {
                    table,
                    id: info.id,
                    slices: info.slice_count,
                    instance_count: info.instance_count,
                    memory_mb: info.memory_size_mb,
                    multiprocessors: info.multiprocessor_count,
                    placements: raw::possible_placements(&self.nvml, dev, info.id)
                        .unwrap_or_default(),
                    hw_name: raw::gi_profile_name(&self.nvml, dev, index).unwrap_or_default(),
                })
            })
            .collect()
    }

    /// The profiles on the wire: the table's, with what the driver reports.
    fn profile_infos(
        table: Option<&'static MigTable>,
        hw: &[HwProfile],
    ) -> Vec<pb::MigProfileInfo> {
        match table {
            Some(t) => t
                .profiles
                .iter()
                .map(|p| {
                    let h = hw
                        .iter()
                        .find(|h| h.table.is_some_and(|x| x.name == p.name));
                    pb::MigProfileInfo {
                        name: p.name.to_string(),
                        slices: u32::from(p.slices),
                        memory_slices: u32::from(p.memory_slices),
                        memory_mib: h.map_or(p.memory_mib(), |h| h.memory_mb),
                        starts: match h {
                            Some(h) if !h.placements.is_empty() => {
                                h.placements.iter().map(|pl| pl.start).collect()
                            }
                            _ => p.starts.iter().map(|s| u32::from(*s)).collect(),
                        },
                        max_instances: h.map_or_else(|| max_alone(t, p), |h| h.instance_count),
                        nvml_profile_id: h.map_or(0, |h| h.id),
                        multiprocessors: h.map_or(0, |h| h.multiprocessors),
                        hardware_name: h
                            .map(|h| h.hw_name.clone())
                            .filter(|n| !n.is_empty() && n != p.name)
                            .unwrap_or_default(),
                    }
                })
                .collect(),
            None => hw
                .iter()
                .map(|h| pb::MigProfileInfo {
                    name: h.name(),
                    slices: h.slices,
                    memory_slices: h.placements.first().map_or(0, |p| p.size),
                    memory_mib: h.memory_mb,
                    starts: h.placements.iter().map(|p| p.start).collect(),
                    max_instances: h.instance_count,
                    nvml_profile_id: h.id,
                    multiprocessors: h.multiprocessors,
                    hardware_name: h.hw_name.clone(),
                })
                .collect(),
        }
    }

    /// MIG device UUIDs by GPU-instance ID.
    fn mig_uuids(&self, dev: &Device<'_>) -> BTreeMap<u32, String> {
        let max = dev.mig_device_count().unwrap_or(0);
        (0..max)
            .filter_map(|i| {
                let mig = dev.mig_device_by_index(i).ok()?;
                Some((
                    raw::gpu_instance_id(&self.nvml, &mig).ok()?,
                    mig.uuid().ok()?,
                ))
            })
            .collect()
    }

    /// The GPU instances on a card, unkeyed.
    fn hw_instances(
        &self,
        dev: &Device<'_>,
        index: u32,
        uuid: &str,
        hw: &[HwProfile],
    ) -> Result<Vec<InstanceRecord>, LayerError> {
        let uuids = self.mig_uuids(dev);
        let now = self.clock.now_ms();
        let mut out = Vec::new();
        for profile in hw {
            let gis = raw::gpu_instances(&self.nvml, dev, profile.id, profile.instance_count)
                .map_err(|e| call_error("nvmlDeviceGetGpuInstances", index, uuid, e))?;
            for gi in gis {
                let ci = raw::compute_instance_ids(&self.nvml, dev, gi.id)
                    .ok()
                    .and_then(|ids| ids.first().copied())
                    .unwrap_or(0);
                out.push(InstanceRecord {
                    key: None,
                    device_index: index,
                    device_uuid: uuid.to_string(),
                    spec: ShareSpec::Mig {
                        profile: profile.name(),
                        start: u8::try_from(gi.placement.start).unwrap_or(u8::MAX),
                    },
                    mig: Some(MigIds {
                        gpu_instance_id: gi.id,
                        compute_instance_id: ci,
                        device_uuid: uuids.get(&gi.id).cloned().unwrap_or_default(),
                    }),
                    created_unix_ms: now,
                });
            }
        }
        out.sort_by_key(|r| r.mig.as_ref().map(|m| m.gpu_instance_id));
        Ok(out)
    }

    /// The instances of a card: TDM shares from the ledger, GPU instances from the hardware
    /// with their keys from the ledger. Keys of GPU instances that are gone are forgotten.
    fn instances_on(
        &self,
        dev: &Device<'_>,
        index: u32,
        uuid: &str,
    ) -> Result<(Vec<InstanceRecord>, Vec<pb::MigProfileInfo>), LayerError> {
        let table = Self::table_of(dev);
        let mig_enabled = Self::mig_mode(dev).is_some_and(|(current, _)| current);
        let (hw, profiles) = if mig_enabled {
            let profiles = self.hw_profiles(dev, table);
            (
                self.hw_instances(dev, index, uuid, &profiles)?,
                Self::profile_infos(table, &profiles),
            )
        } else {
            (Vec::new(), Vec::new())
        };
        let same = |h: &InstanceRecord, r: &InstanceRecord| {
            r.device_uuid == h.device_uuid
                && r.spec == h.spec
                && r.mig.as_ref().map(|m| m.gpu_instance_id)
                    == h.mig.as_ref().map(|m| m.gpu_instance_id)
        };
        let mut ledger = lock(&self.ledger);
        let before = ledger.len();
        ledger.retain(|r| {
            r.device_uuid != uuid
                || matches!(r.spec, ShareSpec::Tdm { .. })
                || !mig_enabled
                || hw.iter().any(|h| same(h, r))
        });
        if ledger.len() != before {
            tracing::warn!(
                card = index,
                "forgetting keys of MIG instances that are gone"
            );
            if let Err(error) = self.persist(&ledger) {
                tracing::error!(%error, "cannot save the state file");
            }
        }
        let mut out: Vec<InstanceRecord> = ledger
            .iter()
            .filter(|r| r.device_uuid == uuid && matches!(r.spec, ShareSpec::Tdm { .. }))
            .cloned()
            .collect();
        for h in hw {
            match ledger.iter().find(|r| same(&h, r)) {
                Some(keyed) => {
                    let mut keyed = keyed.clone();
                    keyed.device_index = index;
                    keyed.mig = h.mig.clone();
                    out.push(keyed);
                }
                None => out.push(h),
            }
        }
        Ok((out, profiles))
    }

    fn links(&self, dev: &Device<'_>) -> Vec<pb::Link> {
        let mut out = Vec::new();
        for l in 0..NVML_NVLINK_MAX_LINKS {
            let link = dev.link_wrapper_for(l);
            let Ok(active) = link.is_active() else {
                continue;
            };
            let remote_bus = if active {
                link.remote_pci_info().map(|p| p.bus_id).unwrap_or_default()
            } else {
                String::new()
            };
            let remote = raw::nvlink_remote_type(&self.nvml, dev, l)
                .map(link_remote)
                .unwrap_or(pb::LinkRemote::Unspecified);
            let mut wire = pb::Link {
                link: l,
                active,
                remote_device_index: (remote == pb::LinkRemote::Device)
                    .then(|| self.index_of_bus(&remote_bus))
                    .flatten(),
                remote_pci_bus_id: remote_bus,
                ..Default::default()
            };
            wire.set_kind(pb::LinkKind::Nvlink);
            wire.set_remote(remote);
            out.push(wire);
        }
        out
    }

    fn device_proto(&self, index: u32) -> Result<pb::Device, LayerError> {
        let dev = self.dev(index)?;
        let uuid = dev
            .uuid()
            .map_err(|e| call_error("nvmlDeviceGetUUID", index, &self.uuid_of(index), e))?;
        let e = |call| {
            let uuid = uuid.clone();
            move |err| call_error(call, index, &uuid, err)
        };
        let name = dev.name().map_err(e("nvmlDeviceGetName"))?;
        let memory = dev.memory_info().map_err(e("nvmlDeviceGetMemoryInfo_v2"))?;
        let pci = dev.pci_info().map_err(e("nvmlDeviceGetPciInfo_v3"))?;
        let table = table_for(&name, mib(memory.total));
        let mode = Self::mig_mode(&dev);
        let (instances, mut profiles) = self.instances_on(&dev, index, &uuid)?;
        if profiles.is_empty() && mode.is_some() {
            profiles = Self::profile_infos(table, &self.hw_profiles(&dev, table));
        }
        let mig = match mode {
            Some((current, pending)) => pb::MigState {
                capable: true,
                enabled: current,
                pending_enabled: pending,
                table: table.map(|t| t.model.to_string()).unwrap_or_default(),
                compute_slices: table.map_or(0, |t| u32::from(t.compute_slices)),
                memory_slices: table.map_or(0, |t| u32::from(t.memory_slices)),
                profiles: profiles.clone(),
            },
            None => pb::MigState::default(),
        };
        let place = self.sysfs.pci_place(&pci.bus_id);
        // NVML's ideal CPU affinity of the card, else the CPUs of its NUMA node.
        let cpu_affinity = dev
            .cpu_affinity(16)
            .ok()
            .map(|words| cpulist_from_mask(&words))
            .filter(|list| !list.is_empty())
            .or_else(|| place.numa_node.and_then(|n| self.sysfs.numa_cpulist(n)))
            .unwrap_or_default();
        let socket = place.socket.or_else(|| {
            let first = crate::topology::parse_cpulist(&cpu_affinity)?
                .first()
                .copied()?;
            self.sysfs.socket_of_cpu(first)
        });
        let mut device = pb::Device {
            index,
            uuid: uuid.clone(),
            model: name,
            memory_mib: mib(memory.total),
            pci_bus_id: pci.bus_id,
            pci_device_id: pci.pci_device_id,
            serial: dev.serial().unwrap_or_default(),
            healthy: self.hub.healthy(index),
            faults: self.hub.faults_of(index),
            mig: Some(mig),
            topology: Some(pb::Topology {
                pcie_switch: place.pcie_switch.unwrap_or_default(),
                numa_node: place.numa_node,
                socket,
                interconnect_group: String::new(),
                cpu_affinity,
                links: self.links(&dev),
            }),
            instances: instances
                .iter()
                .map(|r| record_proto(r, &profiles))
                .collect(),
            ..Default::default()
        };
        device.set_vendor(pb::Vendor::Nvidia);
        device.set_state(pb::DeviceState::Ok);
        Ok(device)
    }

    fn lost_device(&self, index: u32) -> pb::Device {
        let mut device = pb::Device {
            index,
            uuid: self.uuid_of(index),
            healthy: false,
            faults: self.hub.faults_of(index),
            ..Default::default()
        };
        device.set_vendor(pb::Vendor::Nvidia);
        device.set_state(pb::DeviceState::Lost);
        device
    }

    fn processes(&self, dev: &Device<'_>, index: u32, uuid: &str) -> Vec<pb::ProcessMetrics> {
        let mut list = dev.running_compute_processes().unwrap_or_default();
        for p in dev.running_graphics_processes().unwrap_or_default() {
            if !list.iter().any(|q| q.pid == p.pid) {
                list.push(p);
            }
        }
        let samples = {
            let mut seen = lock(&self.util_seen);
            let samples = dev
                .process_utilization_stats(seen.get(&index).copied())
                .unwrap_or_default();
            if let Some(last) = samples.iter().map(|s| s.timestamp).max() {
                seen.insert(index, last);
            }
            samples
        };
        let mut util: BTreeMap<u32, (u64, u32)> = BTreeMap::new();
        for s in samples {
            let entry = util.entry(s.pid).or_insert((0, 0));
            if s.timestamp >= entry.0 {
                *entry = (s.timestamp, s.sm_util);
            }
        }
        let keys: BTreeMap<u32, String> = lock(&self.ledger)
            .iter()
            .filter(|r| r.device_uuid == uuid)
            .filter_map(|r| Some((r.mig.as_ref()?.gpu_instance_id, r.key.clone()?)))
            .collect();
        list.into_iter()
            .map(|p| pb::ProcessMetrics {
                pid: p.pid,
                name: self.nvml.sys_process_name(p.pid, 64).unwrap_or_default(),
                used_memory_mib: match p.used_gpu_memory {
                    UsedGpuMemory::Used(bytes) => Some(mib(bytes)),
                    UsedGpuMemory::Unavailable => None,
                },
                sm_util_percent: util.get(&p.pid).map(|(_, u)| *u),
                gpu_instance_id: p.gpu_instance_id,
                compute_instance_id: p.compute_instance_id,
                alive: self
                    .options
                    .check_process_liveness
                    .then(|| Sysfs::process_alive(p.pid)),
                instance_key: p
                    .gpu_instance_id
                    .and_then(|gi| keys.get(&gi).cloned())
                    .unwrap_or_default(),
            })
            .collect()
    }

    fn metrics(
        &self,
        dev: &Device<'_>,
        index: u32,
        include_processes: bool,
        gpm: Option<[Option<f64>; 5]>,
    ) -> pb::DeviceMetrics {
        let uuid = self.uuid_of(index);
        let memory = dev.memory_info().ok();
        let fields = [
            field_id::NVML_FI_DEV_MEMORY_TEMP,
            field_id::NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
            field_id::NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
            field_id::NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
            field_id::NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
            field_id::NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
            field_id::NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL,
        ];
        let ids: Vec<FieldId> = fields.iter().map(|&f| FieldId(f)).collect();
        let values: Vec<Option<u64>> = match dev.field_values_for(&ids) {
            Ok(samples) => samples
                .into_iter()
                .map(|s| {
                    s.ok()
                        .and_then(|s| s.value.ok())
                        .as_ref()
                        .and_then(sample_u64)
                })
                .collect(),
            Err(_) => vec![None; fields.len()],
        };
        let field = |i: usize| values.get(i).copied().flatten();
        let utilization = dev.utilization_rates().ok();
        let rows = raw::remapped_rows(&self.nvml, dev).ok();
        let ecc = |e: MemoryError, c: EccCounter| dev.total_ecc_errors(e, c).ok();
        let gpm = gpm.unwrap_or_default();
        pb::DeviceMetrics {
            device_index: index,
            device_uuid: uuid.clone(),
            timestamp_unix_ms: self.clock.now_ms(),
            sm_clock_mhz: dev.clock_info(NvClock::SM).ok(),
            mem_clock_mhz: dev.clock_info(NvClock::Memory).ok(),
            gpu_temp_c: dev.temperature(TemperatureSensor::Gpu).ok(),
            memory_temp_c: field(0).and_then(|v| u32::try_from(v).ok()),
            power_usage_w: dev.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
            total_energy_mj: dev.total_energy_consumption().ok(),
            gpu_util_percent: utilization.as_ref().map(|u| u.gpu),
            mem_copy_util_percent: utilization.as_ref().map(|u| u.memory),
            enc_util_percent: dev.encoder_utilization().ok().map(|u| u.utilization),
            dec_util_percent: dev.decoder_utilization().ok().map(|u| u.utilization),
            fb_used_mib: memory.as_ref().map(|m| mib(m.used)),
            fb_free_mib: memory.as_ref().map(|m| mib(m.free)),
            fb_reserved_mib: memory.as_ref().map(|m| mib(m.reserved)),
            // NVML reports KB/s.
            pcie_tx_bytes_per_s: dev
                .pcie_throughput(PcieUtilCounter::Send)
                .ok()
                .map(|kb| u64::from(kb) * 1024),
            pcie_rx_bytes_per_s: dev
                .pcie_throughput(PcieUtilCounter::Receive)
                .ok()
                .map(|kb| u64::from(kb) * 1024),
            pcie_replay_count: dev.pcie_replay_counter().ok().map(u64::from),
            // The throughput fields count KiB.
            nvlink_tx_bytes: field(1).map(|kib| kib.saturating_mul(1024)),
            nvlink_rx_bytes: field(2).map(|kib| kib.saturating_mul(1024)),
            ecc_sbe_volatile: ecc(MemoryError::Corrected, EccCounter::Volatile),
            ecc_dbe_volatile: ecc(MemoryError::Uncorrected, EccCounter::Volatile),
            ecc_sbe_aggregate: ecc(MemoryError::Corrected, EccCounter::Aggregate),
            ecc_dbe_aggregate: ecc(MemoryError::Uncorrected, EccCounter::Aggregate),
            retired_pages_sbe: dev
                .retired_pages(RetirementCause::MultipleSingleBitEccErrors)
                .ok()
                .map(|p| p.len() as u64),
            retired_pages_dbe: dev
                .retired_pages(RetirementCause::DoubleBitEccError)
                .ok()
                .map(|p| p.len() as u64),
            retired_pages_pending: dev.are_pages_pending_retired().ok(),
            remapped_rows_correctable: rows.map(|r| u64::from(r.correctable)),
            remapped_rows_uncorrectable: rows.map(|r| u64::from(r.uncorrectable)),
            row_remap_pending: rows.map(|r| r.pending),
            row_remap_failure: rows.map(|r| r.failure),
            xid_last: lock(&self.last_xid).get(&index).map(|x| u64::from(*x)),
            nvlink_crc_flit_errors: field(3),
            nvlink_crc_data_errors: field(4),
            nvlink_replay_errors: field(5),
            nvlink_recovery_errors: field(6),
            power_violation_ns: dev
                .violation_status(PerformancePolicy::Power)
                .ok()
                .map(|v| v.violation_time),
            thermal_violation_ns: dev
                .violation_status(PerformancePolicy::Thermal)
                .ok()
                .map(|v| v.violation_time),
            gr_engine_active: gpm[0],
            sm_active: gpm[1],
            sm_occupancy: gpm[2],
            pipe_tensor_active: gpm[3],
            dram_active: gpm[4],
            processes: if include_processes {
                self.processes(dev, index, &uuid)
            } else {
                Vec::new()
            },
        }
    }

    /// The health poll of one card.
    fn poll_card(&self, index: u32) {
        let uuid = self.uuid_of(index);
        let dev = match self.nvml.device_by_index(index) {
            Ok(dev) => dev,
            Err(NvmlError::GpuLost) => {
                self.hub.raise(index, &uuid, faults::gpu_lost());
                return;
            }
            Err(error) => {
                tracing::debug!(card = index, %error, "cannot poll the card");
                return;
            }
        };
        self.hub.clear(index, Some(pb::FaultKind::GpuLost), None);
        self.watch.call(index, &uuid, || {
            match dev.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile) {
                Ok(0) => {
                    self.hub.clear(index, Some(pb::FaultKind::EccDbe), None);
                }
                Ok(n) => {
                    self.hub.raise(index, &uuid, faults::ecc_dbe(n));
                }
                Err(_) => {}
            }
            if let Ok(rows) = raw::remapped_rows(&self.nvml, &dev) {
                if rows.failure {
                    self.hub.raise(index, &uuid, faults::row_remap_failure());
                } else {
                    self.hub
                        .clear(index, Some(pb::FaultKind::RowRemapFailure), None);
                }
                if rows.pending {
                    self.hub.raise(
                        index,
                        &uuid,
                        faults::row_remap_pending(u64::from(rows.uncorrectable)),
                    );
                } else {
                    self.hub
                        .clear(index, Some(pb::FaultKind::RowRemapPending), None);
                }
            }
            match dev.are_pages_pending_retired() {
                Ok(true) => {
                    self.hub
                        .raise(index, &uuid, faults::retired_pages_pending());
                }
                Ok(false) => {
                    self.hub
                        .clear(index, Some(pb::FaultKind::RetiredPagesPending), None);
                }
                Err(_) => {}
            }
            if self.options.check_process_liveness {
                let dead_now: Vec<(u32, u64)> = dev
                    .running_compute_processes()
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|p| !Sysfs::process_alive(p.pid))
                    .filter_map(|p| match p.used_gpu_memory {
                        UsedGpuMemory::Used(bytes) if bytes > 0 => Some((p.pid, mib(bytes))),
                        _ => None,
                    })
                    .collect();
                let confirmed = {
                    let mut seen = lock(&self.dead_seen);
                    let previous = seen.remove(&index).unwrap_or_default();
                    let (confirmed, next) = dead_verdict(&previous, &dead_now);
                    seen.insert(index, next);
                    confirmed
                };
                match confirmed.first() {
                    Some(&(pid, _)) => {
                        let total = confirmed.iter().map(|(_, m)| m).sum();
                        self.hub
                            .raise(index, &uuid, faults::dead_process_memory(pid, total));
                    }
                    None => {
                        self.hub
                            .clear(index, Some(pb::FaultKind::DeadProcessMemory), None);
                    }
                }
            }
        });
    }

    fn poll_health(&self) {
        for index in 0..self.count {
            self.poll_card(index);
        }
    }

    /// An event set with XID and DBE events of every card that supports them.
    fn event_set(&self) -> Option<EventSet<'_>> {
        let wanted = EventTypes::CRITICAL_XID_ERROR | EventTypes::DOUBLE_BIT_ECC_ERROR;
        let mut set = self.nvml.create_event_set().ok()?;
        let mut registered: Vec<(u32, EventTypes)> = Vec::new();
        for index in 0..self.count {
            let Ok(dev) = self.nvml.device_by_index(index) else {
                continue;
            };
            let events = wanted & dev.supported_event_types().unwrap_or(EventTypes::empty());
            if events.is_empty() {
                continue;
            }
            match dev.register_events(events, set) {
                Ok(s) => {
                    set = s;
                    registered.push((index, events));
                }
                Err(error) => {
                    tracing::warn!(card = index, %error, "cannot watch the card's XID events");
                    // A failed registration frees the set: start over without this card.
                    set = self.nvml.create_event_set().ok()?;
                    for &(i, ev) in &registered {
                        if let Ok(d) = self.nvml.device_by_index(i) {
                            set = d.register_events(ev, set).ok()?;
                        }
                    }
                }
            }
        }
        Some(set)
    }

    fn health_loop(self: Arc<Self>) {
        let set = self.event_set();
        if set.is_none() {
            tracing::warn!("no NVML event set: XIDs are not watched, the rest is polled");
        }
        let mut next_poll = Instant::now() + self.options.poll_interval;
        while !self.stop.load(Ordering::SeqCst) {
            match &set {
                Some(set) => match set.wait(500) {
                    Ok(event) => self.on_event(&event.device, event.event_type, event.event_data),
                    Err(NvmlError::Timeout) => {}
                    Err(error) => {
                        tracing::debug!(%error, "waiting for NVML events failed");
                        std::thread::sleep(Duration::from_millis(500));
                    }
                },
                None => std::thread::sleep(Duration::from_millis(500)),
            }
            if Instant::now() >= next_poll {
                self.poll_health();
                next_poll = Instant::now() + self.options.poll_interval;
            }
        }
    }

    fn on_event(&self, device: &Device<'_>, kind: EventTypes, xid: Option<XidError>) {
        let Some(index) = device.uuid().ok().and_then(|u| self.index_of_uuid(&u)) else {
            return;
        };
        let uuid = self.uuid_of(index);
        if kind.contains(EventTypes::CRITICAL_XID_ERROR) {
            let code = match xid {
                Some(XidError::Value(v)) => u32::try_from(v).unwrap_or(u32::MAX),
                _ => 0,
            };
            lock(&self.last_xid).insert(index, code);
            self.hub.raise(index, &uuid, faults::xid(code));
        }
        if kind.contains(EventTypes::DOUBLE_BIT_ECC_ERROR) {
            self.poll_card(index);
        }
    }

    /// GPM ratios (graphics, SM active, SM occupancy, tensor, DRAM) for the cards that have
    /// GPM, from two samples 100 ms apart.
    fn gpm_sample<'a>(&'a self, index: u32, dev: &Device<'a>) -> Option<GpmSample<'a>> {
        self.watch
            .call(index, &self.uuid_of(index), || dev.gpm_sample())
            .ok()
    }

    fn gpm_ratios<'a>(&'a self, cards: &[u32]) -> BTreeMap<u32, [Option<f64>; 5]> {
        let metrics = [
            GpmMetricId::GraphicsUtil,
            GpmMetricId::SmUtil,
            GpmMetricId::SmOccupancy,
            GpmMetricId::AnyTensorUtil,
            GpmMetricId::DramBwUtil,
        ];
        let devices: Vec<(u32, Device<'a>)> = cards
            .iter()
            .filter_map(|&i| Some((i, self.nvml.device_by_index(i).ok()?)))
            .filter(|(_, d)| d.gpm_support().unwrap_or(false))
            .collect();
        let sample = |i: u32, d: &Device<'a>| self.gpm_sample(i, d);
        let first: Vec<_> = devices
            .iter()
            .filter_map(|(i, d)| Some((*i, d, sample(*i, d)?)))
            .collect();
        if first.is_empty() {
            return BTreeMap::new();
        }
        std::thread::sleep(Duration::from_millis(100));
        first
            .into_iter()
            .filter_map(|(i, d, s1)| {
                let s2 = sample(i, d)?;
                let values =
                    nvml_wrapper::gpm::gpm_metrics_get(&self.nvml, &s1, &s2, &metrics).ok()?;
                let mut out = [None; 5];
                for (slot, v) in out.iter_mut().zip(values) {
                    *slot = v.ok().map(|m| (m.value / 100.0).clamp(0.0, 1.0));
                }
                Some((i, out))
            })
            .collect()
    }

    fn device_error(&self, index: u32, error: &LayerError) -> pb::DeviceError {
        pb::DeviceError {
            device_index: index,
            device_uuid: self.uuid_of(index),
            reason: error.reason().to_string(),
            message: error.to_string(),
        }
    }

    fn create(&self, request: CreateRequest) -> Result<pb::CreateInstanceResponse, LayerError> {
        let index = request.device_index;
        self.check_device(index, request.device_uuid.as_deref())?;
        let _changes = lock(&self.changes);
        let uuid = self.uuid_of(index);
        let dev = self.dev(index)?;
        let (on_card, profiles) = self.instances_on(&dev, index, &uuid)?;
        // Every keyed instance, plus the unkeyed ones of this card.
        let mut all: Vec<InstanceRecord> = lock(&self.ledger).clone();
        all.extend(on_card.iter().filter(|r| r.key.is_none()).cloned());
        match resolve(&all, &request, &uuid)? {
            Resolution::Existing(i) => {
                let existing = on_card
                    .iter()
                    .find(|r| r.key == all[i].key)
                    .unwrap_or(&all[i]);
                Ok(pb::CreateInstanceResponse {
                    instance: Some(record_proto(existing, &profiles)),
                    created: false,
                    adopted: false,
                })
            }
            Resolution::Adopt(i) => {
                let mut record = all[i].clone();
                record.key = Some(request.key.clone());
                self.remember(record.clone())?;
                tracing::info!(key = %request.key, card = index, "adopted an unkeyed MIG instance");
                Ok(pb::CreateInstanceResponse {
                    instance: Some(record_proto(&record, &profiles)),
                    created: false,
                    adopted: true,
                })
            }
            Resolution::New => {
                let record = match &request.spec {
                    ShareSpec::Tdm { memory_mib, .. } => {
                        if Self::mig_mode(&dev).is_some_and(|(current, _)| current) {
                            return Err(LayerError::MigModeEnabled { index });
                        }
                        let total = dev.memory_info().map(|m| mib(m.total)).unwrap_or(u64::MAX);
                        if *memory_mib > total {
                            return Err(LayerError::InvalidArgument(format!(
                                "memory cap {memory_mib} MiB is more than card {index}'s {total} MiB"
                            )));
                        }
                        InstanceRecord {
                            key: Some(request.key.clone()),
                            device_index: index,
                            device_uuid: uuid.clone(),
                            spec: request.spec.clone(),
                            mig: None,
                            created_unix_ms: self.clock.now_ms(),
                        }
                    }
                    ShareSpec::Mig { profile, start } => self.create_mig(
                        &dev,
                        index,
                        &uuid,
                        &request.key,
                        profile,
                        *start,
                        &on_card,
                    )?,
                };
                let profiles = if record.mig.is_some() && profiles.is_empty() {
                    let table = Self::table_of(&dev);
                    Self::profile_infos(table, &self.hw_profiles(&dev, table))
                } else {
                    profiles
                };
                if let Err(error) = self.remember(record.clone()) {
                    if let Some(ids) = &record.mig {
                        // Without the key the instance would be an orphan: undo it.
                        let _ = raw::destroy_gpu_instance(&self.nvml, &dev, ids.gpu_instance_id);
                    }
                    return Err(error);
                }
                tracing::info!(key = %request.key, card = index, "created an instance");
                Ok(pb::CreateInstanceResponse {
                    instance: Some(record_proto(&record, &profiles)),
                    created: true,
                    adopted: false,
                })
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn create_mig(
        &self,
        dev: &Device<'_>,
        index: u32,
        uuid: &str,
        key: &str,
        profile_name: &str,
        start: u8,
        on_card: &[InstanceRecord],
    ) -> Result<InstanceRecord, LayerError> {
        let name = dev
            .name()
            .map_err(|e| call_error("nvmlDeviceGetName", index, uuid, e))?;
        let Some((current, _)) = Self::mig_mode(dev) else {
            return Err(LayerError::MigUnsupported { index, model: name });
        };
        let Some(table) = Self::table_of(dev) else {
            return Err(LayerError::MigUnsupported { index, model: name });
        };
        if !current {
            return Err(LayerError::MigModeDisabled { index, model: name });
        }
        let others: Vec<&InstanceRecord> = on_card
            .iter()
            .filter(|r| matches!(r.spec, ShareSpec::Mig { .. }))
            .collect();
        let profile = check_mig_placement(table, index, profile_name, start, &others)?;
        let gi_index =
            gi_profile_index(profile.slices, profile.memory_slices).ok_or_else(|| {
                LayerError::Unsupported(format!("no NVML profile for {}", profile.name))
            })?;
        let info = dev
            .profile_info(gi_index)
            .map_err(|e| call_error("nvmlDeviceGetGpuInstanceProfileInfo", index, uuid, e))?;
        let placement = raw::GiPlacement {
            start: u32::from(start),
            size: u32::from(profile.memory_slices),
        };
        // The driver's own placement list must agree with the table.
        if let Ok(possible) = raw::possible_placements(&self.nvml, dev, info.id)
            && !possible.is_empty()
            && !possible.contains(&placement)
        {
            return Err(LayerError::IllegalPlacement {
                table: table.model.to_string(),
                profile: profile.name.to_string(),
                start: u32::from(start),
                legal: possible
                    .iter()
                    .map(|p| p.start.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        let gi = raw::create_gpu_instance(&self.nvml, dev, info.id, placement).map_err(|e| {
            if no_room(&e) {
                LayerError::Overlap {
                    index,
                    profile: profile.name.to_string(),
                    start: u32::from(start),
                    other: "an instance the driver reports there".into(),
                }
            } else {
                call_error("nvmlDeviceCreateGpuInstanceWithPlacement", index, uuid, e)
            }
        })?;
        let ci_index = ci_profile_index(profile.slices).ok_or_else(|| {
            LayerError::Unsupported(format!("no compute-instance profile for {}", profile.name))
        })?;
        let ci = match raw::create_compute_instance(&self.nvml, dev, gi.id, ci_index) {
            Ok(ci) => ci,
            Err(e) => {
                let _ = raw::destroy_gpu_instance(&self.nvml, dev, gi.id);
                return Err(call_error(
                    "nvmlGpuInstanceCreateComputeInstance",
                    index,
                    uuid,
                    e,
                ));
            }
        };
        tracing::info!(
            key,
            card = index,
            gpu_instance = gi.id,
            "created a MIG instance"
        );
        Ok(InstanceRecord {
            key: Some(key.to_string()),
            device_index: index,
            device_uuid: uuid.to_string(),
            spec: ShareSpec::Mig {
                profile: profile.name.to_string(),
                start,
            },
            mig: Some(MigIds {
                gpu_instance_id: gi.id,
                compute_instance_id: ci,
                device_uuid: self.mig_uuids(dev).remove(&gi.id).unwrap_or_default(),
            }),
            created_unix_ms: self.clock.now_ms(),
        })
    }

    /// Adds a keyed record to the ledger and saves it; a failed save undoes the addition.
    fn remember(&self, record: InstanceRecord) -> Result<(), LayerError> {
        let mut ledger = lock(&self.ledger);
        ledger.push(record);
        if let Err(error) = self.persist(&ledger) {
            ledger.pop();
            return Err(error);
        }
        Ok(())
    }

    fn forget(&self, pred: impl Fn(&InstanceRecord) -> bool) -> Result<(), LayerError> {
        let mut ledger = lock(&self.ledger);
        let before = ledger.clone();
        ledger.retain(|r| !pred(r));
        if ledger.len() != before.len()
            && let Err(error) = self.persist(&ledger)
        {
            *ledger = before;
            return Err(error);
        }
        Ok(())
    }

    fn destroy(&self, target: DestroyTarget) -> Result<pb::DestroyInstanceResponse, LayerError> {
        let _changes = lock(&self.changes);
        let (index, gi, record) = match &target {
            DestroyTarget::Key(key) => {
                let found = lock(&self.ledger)
                    .iter()
                    .find(|r| r.key.as_deref() == Some(key.as_str()))
                    .cloned();
                let Some(record) = found else {
                    return Ok(pb::DestroyInstanceResponse {
                        existed: false,
                        instance: None,
                    });
                };
                let index = self
                    .index_of_uuid(&record.device_uuid)
                    .unwrap_or(record.device_index);
                (
                    index,
                    record.mig.as_ref().map(|m| m.gpu_instance_id),
                    Some(record),
                )
            }
            DestroyTarget::Mig {
                device_index,
                gpu_instance_id,
            } => {
                self.check_device(*device_index, None)?;
                (*device_index, Some(*gpu_instance_id), None)
            }
        };
        let uuid = self.uuid_of(index);
        let mut destroyed = record.clone();
        if let Some(gi) = gi {
            let dev = self.dev(index)?;
            if destroyed.is_none() {
                let (on_card, _) = self.instances_on(&dev, index, &uuid)?;
                destroyed = on_card
                    .into_iter()
                    .find(|r| r.mig.as_ref().map(|m| m.gpu_instance_id) == Some(gi));
            }
            let existed = raw::destroy_gpu_instance(&self.nvml, &dev, gi).map_err(|e| match e {
                NvmlError::InUse => LayerError::InUse {
                    what: format!("GPU instance {gi} on card {index}"),
                },
                e => call_error("nvmlGpuInstanceDestroy", index, &uuid, e),
            })?;
            if !existed && record.is_none() {
                return Ok(pb::DestroyInstanceResponse {
                    existed: false,
                    instance: None,
                });
            }
        }
        self.forget(|r| {
            r.device_uuid == uuid
                && match (&record, gi) {
                    (Some(rec), _) => r.key == rec.key,
                    (None, Some(gi)) => r.mig.as_ref().map(|m| m.gpu_instance_id) == Some(gi),
                    (None, None) => false,
                }
        })?;
        tracing::info!(card = index, "destroyed an instance");
        Ok(pb::DestroyInstanceResponse {
            existed: true,
            instance: destroyed.map(|r| record_proto(&r, &[])),
        })
    }
}

fn record_proto(record: &InstanceRecord, profiles: &[pb::MigProfileInfo]) -> pb::Instance {
    let profile = match &record.spec {
        ShareSpec::Mig { profile, .. } => profiles.iter().find(|p| &p.name == profile),
        ShareSpec::Tdm { .. } => None,
    };
    record.to_proto(profile)
}

impl Backend for NvmlBackend {
    fn info(&self) -> pb::GetInfoResponse {
        let s = &self.shared;
        let mut info = pb::GetInfoResponse {
            version: env!("CARGO_PKG_VERSION").into(),
            driver_version: s.driver_version.clone(),
            profile: String::new(),
            node_name: s.options.node_name.clone(),
            device_count: s.count,
            fault_injection: false,
            ..Default::default()
        };
        info.set_backend(pb::BackendKind::Nvml);
        info
    }

    fn list_devices(&self, devices: &[u32]) -> Result<pb::ListDevicesResponse, LayerError> {
        let s = &self.shared;
        let selected = select_devices(devices, s.count)?;
        let mut out = Vec::new();
        for &index in &selected {
            match s
                .watch
                .call(index, &s.uuid_of(index), || s.device_proto(index))
            {
                Ok(device) => out.push(device),
                Err(LayerError::DeviceLost { .. }) => out.push(s.lost_device(index)),
                Err(e) => return Err(e),
            }
        }
        let answering: Vec<&pb::Device> = out
            .iter()
            .filter(|d| d.state() == pb::DeviceState::Ok)
            .collect();
        let mut paths = Vec::new();
        for (i, a) in answering.iter().enumerate() {
            for b in &answering[i + 1..] {
                let level = s.watch.call(a.index, &a.uuid, || {
                    let da = s.nvml.device_by_index(a.index).ok()?;
                    let db = s.nvml.device_by_index(b.index).ok()?;
                    s.nvml.topology_common_ancestor(&da, &db).ok()
                });
                let mut path = pb::DevicePath {
                    a: a.index,
                    b: b.index,
                    ..Default::default()
                };
                path.set_pcie(level.map_or(pb::PathLevel::Unspecified, path_level));
                paths.push(path);
            }
        }
        let card_links: Vec<CardLinks> = answering
            .iter()
            .map(|d| CardLinks {
                index: d.index,
                links: d
                    .topology
                    .as_ref()
                    .map(|t| t.links.clone())
                    .unwrap_or_default(),
            })
            .collect();
        apply_peer_links(&mut paths, &card_links);
        let indexes: Vec<u32> = answering.iter().map(|d| d.index).collect();
        let groups = link_groups(&indexes, &paths, "nvlink");
        for device in &mut out {
            if let (Some(group), Some(topology)) =
                (groups.get(&device.index), device.topology.as_mut())
            {
                topology.interconnect_group = group.clone();
            }
        }
        Ok(pb::ListDevicesResponse {
            devices: out,
            nics: s.sysfs.rdma_nics(),
            paths,
        })
    }

    fn create_instance(
        &self,
        request: CreateRequest,
    ) -> Result<pb::CreateInstanceResponse, LayerError> {
        let s = &self.shared;
        let index = request.device_index;
        let uuid = s.uuid_of(index);
        s.watch.call(index, &uuid, || s.create(request))
    }

    fn destroy_instance(
        &self,
        target: DestroyTarget,
    ) -> Result<pb::DestroyInstanceResponse, LayerError> {
        self.shared.destroy(target)
    }

    fn list_instances(&self, devices: &[u32]) -> Result<Vec<pb::Instance>, LayerError> {
        let s = &self.shared;
        let selected = select_devices(devices, s.count)?;
        let mut out = Vec::new();
        for index in selected {
            let uuid = s.uuid_of(index);
            let listed = s.watch.call(index, &uuid, || {
                let dev = s.dev(index)?;
                s.instances_on(&dev, index, &uuid)
            });
            match listed {
                Ok((records, profiles)) => {
                    out.extend(records.iter().map(|r| record_proto(r, &profiles)));
                }
                Err(LayerError::DeviceLost { .. }) => out.extend(
                    lock(&s.ledger)
                        .iter()
                        .filter(|r| r.device_uuid == uuid)
                        .map(|r| record_proto(r, &[])),
                ),
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    fn device_metrics(
        &self,
        devices: &[u32],
        include_processes: bool,
    ) -> Result<pb::GetDeviceMetricsResponse, LayerError> {
        let s = &self.shared;
        let selected = select_devices(devices, s.count)?;
        let mut gpm = s.gpm_ratios(&selected);
        let mut response = pb::GetDeviceMetricsResponse::default();
        for index in selected {
            let uuid = s.uuid_of(index);
            let read = s.watch.call(index, &uuid, || {
                let dev = s.dev(index)?;
                Ok(s.metrics(&dev, index, include_processes, gpm.remove(&index)))
            });
            match read {
                Ok(metrics) => response.devices.push(metrics),
                Err(error) => response.errors.push(s.device_error(index, &error)),
            }
        }
        Ok(response)
    }

    fn instance_metrics(
        &self,
        keys: &[String],
    ) -> Result<pb::GetInstanceMetricsResponse, LayerError> {
        let s = &self.shared;
        let records: Vec<InstanceRecord> = lock(&s.ledger)
            .iter()
            .filter(|r| {
                r.key
                    .as_ref()
                    .is_some_and(|k| keys.is_empty() || keys.contains(k))
            })
            .cloned()
            .collect();
        let now = s.clock.now_ms();
        let mut response = pb::GetInstanceMetricsResponse::default();
        let mut cards: Vec<u32> = records
            .iter()
            .map(|r| s.index_of_uuid(&r.device_uuid).unwrap_or(r.device_index))
            .collect();
        cards.sort_unstable();
        cards.dedup();
        for index in cards {
            let uuid = s.uuid_of(index);
            let read = s.watch.call(
                index,
                &uuid,
                || -> Result<Vec<pb::InstanceMetrics>, LayerError> {
                    let dev = s.dev(index)?;
                    let processes = s.processes(&dev, index, &uuid);
                    Ok(records
                        .iter()
                        .filter(|r| r.device_uuid == uuid)
                        .map(|r| {
                            let mut m = pb::InstanceMetrics {
                                key: r.key.clone().unwrap_or_default(),
                                device_index: index,
                                device_uuid: uuid.clone(),
                                timestamp_unix_ms: now,
                                ..Default::default()
                            };
                            match (&r.spec, &r.mig) {
                                (
                                    ShareSpec::Tdm {
                                        core_percent,
                                        memory_mib,
                                    },
                                    _,
                                ) => {
                                    m.set_kind(pb::InstanceKind::Tdm);
                                    m.core_limit_percent = *core_percent;
                                    m.memory_limit_mib = *memory_mib;
                                }
                                (ShareSpec::Mig { profile, .. }, Some(ids)) => {
                                    m.set_kind(pb::InstanceKind::Mig);
                                    m.profile = profile.clone();
                                    m.gpu_instance_id = Some(ids.gpu_instance_id);
                                    let mig_memory = s
                                        .nvml
                                        .device_by_uuid(ids.device_uuid.as_str())
                                        .and_then(|d| d.memory_info())
                                        .ok();
                                    m.memory_limit_mib =
                                        mig_memory.as_ref().map_or(0, |x| mib(x.total));
                                    m.memory_used_mib = mig_memory.as_ref().map(|x| mib(x.used));
                                    m.processes = processes
                                        .iter()
                                        .filter(|p| p.gpu_instance_id == Some(ids.gpu_instance_id))
                                        .cloned()
                                        .collect();
                                    let utils: Vec<u32> = m
                                        .processes
                                        .iter()
                                        .filter_map(|p| p.sm_util_percent)
                                        .collect();
                                    m.sm_util_percent = (!utils.is_empty())
                                        .then(|| utils.iter().sum::<u32>().min(100));
                                }
                                (ShareSpec::Mig { profile, .. }, None) => {
                                    m.set_kind(pb::InstanceKind::Mig);
                                    m.profile = profile.clone();
                                }
                            }
                            m
                        })
                        .collect())
                },
            );
            match read {
                Ok(metrics) => response.instances.extend(metrics),
                Err(error) => response.errors.push(s.device_error(index, &error)),
            }
        }
        Ok(response)
    }

    fn health(&self) -> &HealthHub {
        &self.shared.hub
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_a_clear_not_found_error() {
        let options = NvmlOptions {
            lib_path: Some(PathBuf::from("/nonexistent/libnvidia-ml.so.1")),
            ..NvmlOptions::default()
        };
        let err = NvmlBackend::new(options).expect_err("no such library");
        assert_eq!(err.reason(), "NvmlNotFound");
        let text = err.to_string();
        assert!(text.starts_with("NVML library not found: "), "{text}");
        assert!(text.contains("/nonexistent/libnvidia-ml.so.1"), "{text}");
    }

    #[test]
    fn the_default_library_loads_or_fails_clearly() {
        // Passes on a GPU machine (NVML loads) and on one without (a clear error); fails on
        // any other outcome, for example a panic or an unexplained error.
        match NvmlBackend::new(NvmlOptions::default()) {
            Ok(backend) => assert_eq!(backend.info().backend(), pb::BackendKind::Nvml),
            Err(err) => assert!(
                matches!(err.reason(), "NvmlNotFound" | "DriverNotLoaded"),
                "{err}"
            ),
        }
    }

    #[test]
    fn dead_processes_need_two_polls() {
        let (confirmed, next) = dead_verdict(&BTreeSet::new(), &[(42, 100)]);
        assert!(confirmed.is_empty());
        assert_eq!(next, BTreeSet::from([42]));
        let (confirmed, next) = dead_verdict(&next, &[(42, 100), (43, 5)]);
        assert_eq!(confirmed, [(42, 100)]);
        assert_eq!(next, BTreeSet::from([42, 43]));
        let (confirmed, next) = dead_verdict(&next, &[]);
        assert!(confirmed.is_empty());
        assert!(next.is_empty());
    }

    #[test]
    fn hardware_profiles_are_named_from_the_table_or_the_driver() {
        let table = table_for("NVIDIA H100 80GB HBM3", 81_559 * 1024 / 1024).expect("table");
        let p = table.profile("3g.40gb").expect("3g");
        let hw = HwProfile {
            table: Some(p),
            id: 9,
            slices: 3,
            instance_count: 2,
            memory_mb: 40_448,
            multiprocessors: 60,
            placements: vec![
                raw::GiPlacement { start: 0, size: 4 },
                raw::GiPlacement { start: 4, size: 4 },
            ],
            hw_name: "3g.40gb".into(),
        };
        assert_eq!(hw.name(), "3g.40gb");
        let infos = Shared::profile_infos(Some(table), std::slice::from_ref(&hw));
        let info = infos.iter().find(|i| i.name == "3g.40gb").expect("listed");
        assert_eq!(info.memory_mib, 40_448);
        assert_eq!(info.starts, [0, 4]);
        assert_eq!(info.nvml_profile_id, 9);
        assert_eq!(info.multiprocessors, 60);
        assert!(info.hardware_name.is_empty(), "same name as the table");
        // Profiles the driver did not report keep the table's figures.
        let g1 = infos.iter().find(|i| i.name == "1g.10gb").expect("listed");
        assert_eq!(g1.memory_mib, 10_240);
        assert_eq!(g1.max_instances, 7);
        // Without a table, the driver's name or one built from slices and memory.
        let bare = HwProfile {
            table: None,
            hw_name: String::new(),
            ..hw
        };
        assert_eq!(bare.name(), "3g.40gb");
        let listed = Shared::profile_infos(None, &[bare]);
        assert_eq!(listed[0].memory_slices, 4);
    }
}
