//! The NVML backend: NVIDIA cards through nvml-wrapper, with `libnvidia-ml.so.1` loaded at run
//! time (the binary has no link-time dependency on it and says plainly when it is missing).
//!
//! One file per concern, each adding methods to the backend's `Shared` state:
//!
//! - Discovery (`devices`): index, UUID, name, memory, PCI, serial, MIG mode (current and
//!   pending).
//! - MIG (`mig`): profiles from the contract's table of the model, with the sizes, profile IDs
//!   and placements the driver reports; GPU instances created at a placement with their full
//!   compute instance, listed and destroyed through raw calls (`raw`). MIG mode is never
//!   changed.
//! - Keys (`keys`): the hardware does not know instance keys, so the backend keeps them (and
//!   TDM shares) in its state file. A GPU instance no key owns is listed unkeyed and can be
//!   adopted by creating it again with the same profile and start.
//! - Topology (`topology`): common ancestor (PIX/PXB/PHB/NODE/SYS), PCIe switch, NUMA node and
//!   socket from sysfs, CPU affinity, NVLink links with their far end; RDMA NICs from sysfs.
//! - Health (`health`): XID and double-bit ECC events from an event set, and a poll of
//!   volatile DBE counts, remapped rows, pending page retirement, lost cards and memory held by
//!   dead processes. NVML reports an XID, not its end: an XID fault clears after a quiet
//!   window on a card that answers.
//! - Metrics (`metrics`): the DCGM field set from NVML calls (interfaces notes, section 1.2),
//!   DCP ratios from GPM where the card has it (Hopper and newer).
//!
//! `convert` maps NVML's types and errors to the wire's; `raw` holds the calls nvml-wrapper
//! lacks or gets wrong.

mod convert;
mod devices;
mod health;
mod keys;
mod metrics;
mod mig;
mod raw;
mod topology;

use crate::backend::{Backend, DestroyTarget, check_device};
use crate::device_nodes::DeviceNodes;
use crate::error::LayerError;
use crate::faults;
use crate::health::HealthHub;
use crate::instances::{CreateRequest, InstanceRecord};
use crate::store::Store;
use crate::sysfs::{Sysfs, sysfs_bus_id};
use crate::util::{self, Clock};
use crate::watch::CallWatch;
use convert::{call_error, init_error};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use runtimekit_proto::resource::v1alpha1 as pb;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
    /// NVLink errors (CRC, replay, recovery, all links) between two polls that make a burst.
    pub nvlink_error_burst: u64,
    /// How long after its last occurrence an XID fault clears, once the card answers: NVML
    /// reports an XID, not its end, so a quiet window stands for "the condition cleared".
    pub xid_clear_after: Duration,
    /// How long loading and initialising NVML may take before the backend gives up (the
    /// driver can hang in `nvmlInit` when a card is in a bad state).
    pub init_timeout: Duration,
    /// Check that processes holding card memory still exist; done only in the host PID
    /// namespace, where the driver's PIDs can be looked up.
    pub check_process_liveness: bool,
    /// This process's PID-namespace link (`/proc/self/ns/pid`).
    pub pid_namespace: PathBuf,
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
            xid_clear_after: Duration::from_secs(300),
            nvlink_error_burst: 100,
            init_timeout: Duration::from_secs(60),
            check_process_liveness: true,
            pid_namespace: PathBuf::from("/proc/self/ns/pid"),
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
        for (_, card) in std::mem::take(&mut *util::lock(&self.shared.gpm)) {
            if let Some((buffer, _)) = card.previous {
                raw::gpm_free(&self.shared.nvml, buffer);
            }
        }
    }
}

/// A card as discovery found it, so a lost card keeps its identity.
#[derive(Debug, Clone, Default)]
struct KnownCard {
    uuid: String,
    bus_id: String,
    /// The card's device minor (`/dev/nvidia<minor>`); its index when NVML does not say.
    minor: Option<u32>,
}

/// The backend's state, shared with its health thread; each submodule adds the methods of
/// its concern.
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
    device_nodes: DeviceNodes,
    /// Keyed instances: TDM shares, and the keys of MIG instances.
    ledger: Mutex<Vec<InstanceRecord>>,
    /// Serialises creation and destruction on each card (a hung call holds up its card only).
    changes: Vec<Mutex<()>>,
    /// The last XID of each card, for the metrics.
    last_xid: Mutex<BTreeMap<u32, u32>>,
    /// Each card's NVLink watch: links seen active, and the error total at the last poll.
    nvlink: Mutex<BTreeMap<u32, health::NvlinkWatch>>,
    /// When each (card, XID) was last reported, to clear it after a quiet window.
    xid_seen: Mutex<BTreeMap<(u32, u32), std::time::Instant>>,
    /// Per-process utilisation samples read so far, per card: every reader sees them, not only
    /// the first to ask NVML for the newest.
    util: Mutex<BTreeMap<u32, metrics::UtilSamples>>,
    /// Each GPM card's last sample and ratios.
    gpm: Mutex<BTreeMap<u32, metrics::GpmCard>>,
    /// Why processes' liveness is not checked, when it is not.
    liveness_unavailable: Option<String>,
    /// PIDs found dead on the previous health poll, per card.
    dead_seen: Mutex<BTreeMap<u32, BTreeSet<u32>>>,
    /// Wakes each card's health poll.
    wakers: Mutex<Vec<std::sync::mpsc::Sender<()>>>,
    /// Set when the backend is dropped; ends the health threads.
    stop: AtomicBool,
}

impl NvmlBackend {
    /// Loads NVML and discovers the cards. Fails with [`LayerError::NvmlNotFound`] when the
    /// library is missing and [`LayerError::DriverNotLoaded`] without the kernel driver.
    /// Changes nothing on the cards.
    pub fn new(options: NvmlOptions) -> Result<Self, LayerError> {
        let nvml = init_within(options.lib_path.clone(), options.init_timeout)?;
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
                    minor: dev.minor_number().ok(),
                },
                Err(_) => KnownCard::default(),
            })
            .collect::<Vec<KnownCard>>();
        let minors = (0..count)
            .map(|i| known[i as usize].minor.unwrap_or(i))
            .collect();
        let device_nodes = DeviceNodes::host(&options.sysfs_root, minors);
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
        let liveness_unavailable = if options.check_process_liveness {
            crate::sysfs::pids_not_comparable(&options.pid_namespace)
        } else {
            Some("turned off (--no-process-liveness)".into())
        };
        if let Some(why) = &liveness_unavailable {
            tracing::warn!("memory held by dead processes is not watched: {why}");
        }
        let shared = Arc::new(Shared {
            liveness_unavailable,
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
            device_nodes,
            ledger: Mutex::new(ledger),
            changes: (0..count).map(|_| Mutex::new(())).collect(),
            last_xid: Mutex::new(BTreeMap::new()),
            xid_seen: Mutex::new(BTreeMap::new()),
            nvlink: Mutex::new(BTreeMap::new()),
            util: Mutex::new(BTreeMap::new()),
            gpm: Mutex::new(BTreeMap::new()),
            dead_seen: Mutex::new(BTreeMap::new()),
            wakers: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
        });
        shared.poll_health();
        shared.start_health();
        tracing::info!(cards = count, "NVML backend ready");
        Ok(Self { shared })
    }
}

/// Loads and initialises NVML on a thread of its own, giving up after `timeout` (the thread
/// is left behind: a hung `nvmlInit` cannot be cancelled).
fn init_within(lib_path: Option<PathBuf>, timeout: Duration) -> Result<Nvml, LayerError> {
    let (done, result) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("rl-nvml-init".into())
        .spawn(move || {
            let nvml = match &lib_path {
                Some(path) => Nvml::builder().lib_path(path.as_os_str()).init(),
                None => Nvml::init(),
            };
            let _ = done.send(nvml);
        })
        .map_err(|e| LayerError::Nvml {
            call: "nvmlInit_v2",
            index: None,
            message: format!("cannot start a thread to load NVML: {e}"),
        })?;
    match result.recv_timeout(timeout) {
        Ok(nvml) => nvml.map_err(init_error),
        Err(_) => Err(LayerError::Nvml {
            call: "nvmlInit_v2",
            index: None,
            message: format!(
                "NVML did not initialise within {} s; the driver may be hung",
                timeout.as_secs_f64()
            ),
        }),
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
                self.mark_lost(index);
                Err(LayerError::DeviceLost { index, uuid })
            }
            Err(e) => Err(call_error("nvmlDeviceGetHandleByIndex_v2", index, &uuid, e)),
        }
    }

    /// The change lock of card `index` (checked to exist by the caller).
    fn card_changes(&self, index: u32) -> Option<std::sync::MutexGuard<'_, ()>> {
        self.changes.get(index as usize).map(util::lock)
    }

    /// Passes `result` on, marking its card lost when a call answered GPU_IS_LOST.
    fn lost_on_error<T>(&self, result: Result<T, LayerError>) -> Result<T, LayerError> {
        if let Err(LayerError::DeviceLost { index, .. }) = &result {
            self.mark_lost(*index);
        }
        result
    }

    /// Raises GPU_LOST on a card: any call that answered GPU_IS_LOST says so.
    fn mark_lost(&self, index: u32) {
        self.hub
            .raise(index, &self.uuid_of(index), faults::gpu_lost());
    }

    /// The keyed instances the ledger remembers on the card with this UUID.
    fn remembered(&self, uuid: &str) -> Vec<InstanceRecord> {
        util::lock(&self.ledger)
            .iter()
            .filter(|r| r.device_uuid == uuid)
            .cloned()
            .collect()
    }

    /// Checks that the card exists and, when the caller names one, has the UUID it expects.
    fn check_device(&self, index: u32, uuid: Option<&str>) -> Result<(), LayerError> {
        check_device(index, self.count, uuid, || self.uuid_of(index))
    }
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
            process_liveness_unavailable: s.liveness_unavailable.clone().unwrap_or_default(),
            ..Default::default()
        };
        info.set_backend(pb::BackendKind::Nvml);
        info
    }

    fn list_devices(&self, devices: &[u32]) -> Result<pb::ListDevicesResponse, LayerError> {
        self.shared.list_devices(devices)
    }

    fn create_instance(
        &self,
        request: CreateRequest,
    ) -> Result<pb::CreateInstanceResponse, LayerError> {
        let s = &self.shared;
        let index = request.device_index;
        let uuid = s.uuid_of(index);
        s.lost_on_error(s.watch.call(index, &uuid, || s.create(request)))
    }

    fn destroy_instance(
        &self,
        target: DestroyTarget,
    ) -> Result<pb::DestroyInstanceResponse, LayerError> {
        self.shared.lost_on_error(self.shared.destroy(target))
    }

    fn list_instances(&self, devices: &[u32]) -> Result<pb::ListInstancesResponse, LayerError> {
        self.shared.list_instances(devices)
    }

    fn device_metrics(
        &self,
        devices: &[u32],
        include_processes: bool,
    ) -> Result<pb::GetDeviceMetricsResponse, LayerError> {
        self.shared.device_metrics(devices, include_processes)
    }

    fn process_metrics(&self) -> Result<pb::GetDeviceMetricsResponse, LayerError> {
        self.shared.process_metrics()
    }

    fn instance_metrics(
        &self,
        keys: &[String],
    ) -> Result<pb::GetInstanceMetricsResponse, LayerError> {
        self.shared.instance_metrics(keys)
    }

    fn health(&self) -> &HealthHub {
        &self.shared.hub
    }

    fn device_nodes(&self) -> Option<&DeviceNodes> {
        Some(&self.shared.device_nodes)
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
        assert_eq!(err.reason().as_str(), "NvmlNotFound");
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
                matches!(err.reason().as_str(), "NvmlNotFound" | "DriverNotLoaded"),
                "{err}"
            ),
        }
    }
}
