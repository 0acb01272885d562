//! The simulated backend: cards from a hardware profile, with the real MIG rules, plausible
//! time-varying metrics, per-process memory, and faults injected on request.
//!
//! - MIG mode per card comes from the profile and never changes. MIG instances follow
//!   `runtimekit_contract::mig` (profile of the model's table, legal start, no overlap).
//! - TDM shares are records of a compute percentage and a memory cap. The resource layer does
//!   not add up the shares of a card: the scheduler is the one accountant of capacity (see the
//!   crate README); it only refuses what the hardware cannot do (a share on a MIG card or an
//!   AMD card, a cap above the card's memory).
//! - UUIDs derive from the profile, the node name and the card index, so many simulated nodes
//!   in one process have distinct cards and a restart keeps them.
//! - With a state file, instances survive a restart of the backend, like MIG instances survive
//!   a restart of the agent on real hardware.
//! - Faults: XID, volatile DBE ECC, card lost, hanging calls, memory held by a dead process.

pub mod metrics;
pub mod profile;

use crate::backend::{Backend, DestroyTarget, FaultInjector, select_devices};
use crate::error::LayerError;
use crate::faults;
use crate::health::HealthHub;
use crate::instances::{
    CreateRequest, InstanceRecord, MigIds, Resolution, ShareSpec, check_mig_placement, resolve,
    table_profiles,
};
use crate::store::Store;
use crate::util::{Clock, derived_uuid, lock, stable_hash};
use crate::watch::CallWatch;
use metrics::{Counters, Workload, card_util, noise};
use profile::{CardSpec, VendorName};
use runtimekit_proto::resource::v1alpha1 as pb;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

pub use profile::{SimProfile, shipped_names};

/// How a simulated backend runs.
#[derive(Debug, Clone)]
pub struct SimOptions {
    /// The node this backend stands for; card UUIDs derive from it.
    pub node_name: String,
    /// Seed of the simulated readings.
    pub seed: u64,
    /// Where the time comes from.
    pub clock: Clock,
    /// Where instances are kept across restarts; `None` keeps them in memory only.
    pub state_file: Option<PathBuf>,
    /// How long a blocked call runs before the card gets a CALL_HANG fault.
    pub hang_threshold: Duration,
    /// How long a hanging call blocks before it fails by itself (NVML's own timeout).
    pub hang_limit: Duration,
}

impl Default for SimOptions {
    fn default() -> Self {
        Self {
            node_name: "sim-node".into(),
            seed: 0,
            clock: Clock::System,
            state_file: None,
            hang_threshold: Duration::from_secs(5),
            hang_limit: Duration::from_secs(600),
        }
    }
}

/// Cards from a hardware profile.
#[derive(Debug)]
pub struct SimulatedBackend {
    profile: SimProfile,
    options: SimOptions,
    uuids: Vec<String>,
    hub: Arc<HealthHub>,
    watch: CallWatch,
    state: Mutex<SimState>,
    unhang: Condvar,
    store: Option<Store>,
}

#[derive(Debug)]
struct SimState {
    cards: Vec<CardState>,
    instances: Vec<InstanceRecord>,
}

#[derive(Debug)]
struct CardState {
    xids: BTreeSet<u32>,
    last_xid: Option<u32>,
    dbe_volatile: u64,
    dbe_aggregate: u64,
    lost: bool,
    hang: bool,
    dead: Vec<(u32, u64)>,
    counters: Counters,
}

/// The MIG device UUID of a simulated GPU instance.
pub(crate) fn mig_uuid(card_uuid: &str, gpu_instance_id: u32, created_ms: u64) -> String {
    format!(
        "MIG-{}",
        derived_uuid(&[
            card_uuid.as_bytes(),
            &gpu_instance_id.to_le_bytes(),
            &created_ms.to_le_bytes()
        ])
    )
}

/// Memory a MIG profile really offers: a little under what its name states (1g.10gb offers
/// 9984 MiB on an H100), in 128 MiB steps.
fn hardware_mig_memory(named_mib: u64) -> u64 {
    named_mib * 39 / 40 / 128 * 128
}

impl SimulatedBackend {
    /// A backend for a loaded profile.
    pub fn new(profile: SimProfile, options: SimOptions) -> Result<Self, LayerError> {
        let uuids: Vec<String> = profile
            .cards
            .iter()
            .map(|c| {
                format!(
                    "GPU-{}",
                    derived_uuid(&[
                        profile.name.as_bytes(),
                        options.node_name.as_bytes(),
                        &c.index.to_le_bytes()
                    ])
                )
            })
            .collect();
        let hub = Arc::new(HealthHub::new(options.clock.clone()));
        let watch = CallWatch::new(hub.clone(), options.hang_threshold);
        let now = options.clock.now_ms();
        let store = options.state_file.clone().map(Store::new);
        let backend_name = format!("simulated:{}", profile.name);
        let loaded = match &store {
            Some(store) => store.load(&backend_name, &options.node_name)?,
            None => None,
        };
        let fresh = loaded.is_none();
        let candidates = match loaded {
            Some(state) => state.instances,
            None => profile.initial_records(&uuids, now),
        };
        let cards = profile
            .cards
            .iter()
            .map(|_| CardState {
                xids: BTreeSet::new(),
                last_xid: None,
                dbe_volatile: 0,
                dbe_aggregate: 0,
                lost: false,
                hang: false,
                dead: Vec::new(),
                counters: Counters::at(now),
            })
            .collect();
        let backend = Self {
            profile,
            options,
            uuids,
            hub,
            watch,
            state: Mutex::new(SimState {
                cards,
                instances: Vec::new(),
            }),
            unhang: Condvar::new(),
            store,
        };
        {
            let mut state = lock(&backend.state);
            for record in candidates {
                match backend.check_loaded(&state.instances, &record) {
                    Ok(()) => state.instances.push(record),
                    Err(error) => tracing::warn!(
                        instance = %record.describe(),
                        %error,
                        "dropping an instance of the state file that no longer fits the profile"
                    ),
                }
            }
            if fresh {
                backend.persist(&state)?;
            }
        }
        Ok(backend)
    }

    /// A backend for a shipped profile or a profile file.
    pub fn from_profile(name_or_path: &str, options: SimOptions) -> Result<Self, LayerError> {
        Self::new(SimProfile::load(name_or_path)?, options)
    }

    /// The profile of this backend.
    pub fn profile(&self) -> &SimProfile {
        &self.profile
    }

    /// The UUID of a card.
    pub fn uuid(&self, index: u32) -> Option<&str> {
        self.uuids.get(index as usize).map(String::as_str)
    }

    fn count(&self) -> u32 {
        u32::try_from(self.profile.cards.len()).unwrap_or(u32::MAX)
    }

    fn card(&self, index: u32) -> &CardSpec {
        &self.profile.cards[index as usize]
    }

    fn backend_name(&self) -> String {
        format!("simulated:{}", self.profile.name)
    }

    fn persist(&self, state: &SimState) -> Result<(), LayerError> {
        match &self.store {
            Some(store) => store.save(
                &self.backend_name(),
                &self.options.node_name,
                &state.instances,
            ),
            None => Ok(()),
        }
    }

    fn check_loaded(
        &self,
        existing: &[InstanceRecord],
        record: &InstanceRecord,
    ) -> Result<(), LayerError> {
        let index = record.device_index;
        if self.uuid(index) != Some(record.device_uuid.as_str()) {
            return Err(LayerError::InvalidArgument(format!(
                "no card {index} with UUID {}",
                record.device_uuid
            )));
        }
        let others: Vec<&InstanceRecord> = existing
            .iter()
            .filter(|r| r.device_index == index)
            .collect();
        self.check_spec(index, &record.spec, &others).map(|_| ())
    }

    /// Checks a spec against the card and the instances on it; returns the MIG profile.
    fn check_spec(
        &self,
        index: u32,
        spec: &ShareSpec,
        others: &[&InstanceRecord],
    ) -> Result<Option<pb::MigProfileInfo>, LayerError> {
        let card = self.card(index);
        match spec {
            ShareSpec::Tdm { memory_mib, .. } => {
                if card.model.vendor == VendorName::Amd {
                    return Err(LayerError::SharingUnsupported {
                        index,
                        model: card.model.product_name.clone(),
                    });
                }
                if card.mig_enabled {
                    return Err(LayerError::MigModeEnabled { index });
                }
                if *memory_mib > card.model.memory_mib {
                    return Err(LayerError::InvalidArgument(format!(
                        "memory cap {memory_mib} MiB is more than card {index}'s {} MiB",
                        card.model.memory_mib
                    )));
                }
                Ok(None)
            }
            ShareSpec::Mig { profile, start } => {
                let Some(table) = card.table else {
                    return Err(LayerError::MigUnsupported {
                        index,
                        model: card.model.product_name.clone(),
                    });
                };
                if !card.mig_enabled {
                    return Err(LayerError::MigModeDisabled {
                        index,
                        model: card.model.product_name.clone(),
                    });
                }
                let profile = check_mig_placement(table, index, profile, *start, others)?;
                Ok(self
                    .mig_profiles(card)
                    .into_iter()
                    .find(|p| p.name == profile.name))
            }
        }
    }

    /// The MIG profiles of a card as the simulated hardware reports them.
    fn mig_profiles(&self, card: &CardSpec) -> Vec<pb::MigProfileInfo> {
        let Some(table) = card.table else {
            return Vec::new();
        };
        table_profiles(table)
            .into_iter()
            .map(|mut p| {
                p.memory_mib = hardware_mig_memory(p.memory_mib);
                p
            })
            .collect()
    }

    /// Locks the state once no card of `cards` hangs; a hanging card blocks the call (under a
    /// hang watch) until the fault is cleared or the hang limit passes.
    fn enter(&self, cards: &[u32]) -> Result<MutexGuard<'_, SimState>, LayerError> {
        let mut state = lock(&self.state);
        for &card in cards {
            if !state.cards[card as usize].hang {
                continue;
            }
            let _call = self.watch.enter(card, &self.uuids[card as usize]);
            let deadline = Instant::now() + self.options.hang_limit;
            while state.cards[card as usize].hang {
                let now = Instant::now();
                if now >= deadline {
                    return Err(LayerError::Hang {
                        index: card,
                        waited: self.options.hang_limit,
                    });
                }
                state = self
                    .unhang
                    .wait_timeout(state, deadline - now)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
        }
        Ok(state)
    }

    fn check_device(&self, index: u32, uuid: Option<&str>) -> Result<(), LayerError> {
        let count = self.count();
        if index >= count {
            return Err(LayerError::NoSuchDevice { index, count });
        }
        if let Some(expected) = uuid
            && expected != self.uuids[index as usize]
        {
            return Err(LayerError::UuidMismatch {
                index,
                expected: expected.to_string(),
                actual: self.uuids[index as usize].clone(),
            });
        }
        Ok(())
    }

    fn lost_error(&self, index: u32) -> LayerError {
        LayerError::DeviceLost {
            index,
            uuid: self.uuids[index as usize].clone(),
        }
    }

    fn device_error(&self, index: u32, error: &LayerError) -> pb::DeviceError {
        pb::DeviceError {
            device_index: index,
            device_uuid: self.uuids[index as usize].clone(),
            reason: error.reason().to_string(),
            message: error.to_string(),
        }
    }

    fn card_seed(&self, index: u32) -> u64 {
        stable_hash(&[
            &self.options.seed.to_le_bytes(),
            self.uuids[index as usize].as_bytes(),
        ])
    }

    fn workload(&self, record: &InstanceRecord) -> Workload {
        let card = self.card(record.device_index);
        let identity = format!(
            "{}/{}/{}",
            record.device_uuid,
            record.created_unix_ms,
            record.key.as_deref().unwrap_or("-")
        );
        let usable = card
            .model
            .memory_mib
            .saturating_sub(card.model.reserved_mib);
        match &record.spec {
            ShareSpec::Tdm {
                core_percent,
                memory_mib,
            } => Workload::new(
                self.options.seed,
                &identity,
                record.key.clone(),
                None,
                if *memory_mib == 0 {
                    usable / 4
                } else {
                    (*memory_mib).min(usable)
                },
                if *core_percent == 0 {
                    1.0
                } else {
                    f64::from(*core_percent) / 100.0
                },
            ),
            ShareSpec::Mig { profile, .. } => {
                let table = card.table;
                let named = table.and_then(|t| t.profile(profile));
                Workload::new(
                    self.options.seed,
                    &identity,
                    record.key.clone(),
                    record.mig.as_ref().map(|m| m.gpu_instance_id),
                    named.map_or(0, |p| hardware_mig_memory(p.memory_mib())),
                    match (named, table) {
                        (Some(p), Some(t)) => f64::from(p.slices) / f64::from(t.compute_slices),
                        _ => 0.0,
                    },
                )
            }
        }
    }

    fn workloads(&self, state: &SimState, index: u32) -> Vec<Workload> {
        state
            .instances
            .iter()
            .filter(|r| r.device_index == index)
            .map(|r| self.workload(r))
            .collect()
    }

    /// Brings a card's counters up to now with its current instances (before they change).
    fn advance(&self, state: &mut SimState, index: u32, now: u64) {
        let workloads = self.workloads(state, index);
        state.cards[index as usize]
            .counters
            .advance(self.card_seed(index), &workloads, now);
    }

    fn device(&self, state: &SimState, index: u32) -> pb::Device {
        let card = self.card(index);
        let uuid = self.uuids[index as usize].clone();
        let faults = self.hub.faults_of(index);
        if state.cards[index as usize].lost {
            let mut device = pb::Device {
                index,
                uuid,
                healthy: false,
                faults,
                ..Default::default()
            };
            device.set_state(pb::DeviceState::Lost);
            device.set_vendor(card.model.vendor.into());
            return device;
        }
        let profiles = self.mig_profiles(card);
        let instances = state
            .instances
            .iter()
            .filter(|r| r.device_index == index)
            .map(|r| self.record_proto(r, &profiles))
            .collect();
        let mig = match card.table {
            Some(table) => pb::MigState {
                capable: true,
                enabled: card.mig_enabled,
                pending_enabled: card.mig_enabled,
                table: table.model.to_string(),
                compute_slices: u32::from(table.compute_slices),
                memory_slices: u32::from(table.memory_slices),
                profiles,
            },
            None => pb::MigState::default(),
        };
        let mut device = pb::Device {
            index,
            uuid,
            model: card.model.product_name.clone(),
            memory_mib: card.model.memory_mib,
            pci_bus_id: card.pci_bus_id.clone(),
            pci_device_id: card.model.pci_device_id,
            serial: format!("1{:012}", self.card_seed(index) % 1_000_000_000_000),
            healthy: self.hub.healthy(index),
            faults,
            mig: Some(mig),
            topology: Some(card.topology.clone()),
            instances,
            ..Default::default()
        };
        device.set_vendor(card.model.vendor.into());
        device.set_state(pb::DeviceState::Ok);
        device
    }

    fn record_proto(
        &self,
        record: &InstanceRecord,
        profiles: &[pb::MigProfileInfo],
    ) -> pb::Instance {
        let profile = match &record.spec {
            ShareSpec::Mig { profile, .. } => profiles.iter().find(|p| &p.name == profile),
            ShareSpec::Tdm { .. } => None,
        };
        record.to_proto(profile)
    }

    fn instance_proto(&self, record: &InstanceRecord) -> pb::Instance {
        let profiles = self.mig_profiles(self.card(record.device_index));
        self.record_proto(record, &profiles)
    }

    fn process(workload: &Workload, t_ms: u64) -> pb::ProcessMetrics {
        pb::ProcessMetrics {
            pid: workload.pid,
            name: "python3".into(),
            used_memory_mib: Some(workload.memory_mib(t_ms)),
            sm_util_percent: Some(workload.card_percent(t_ms).round() as u32),
            gpu_instance_id: workload.gpu_instance_id,
            compute_instance_id: workload.gpu_instance_id.map(|_| 0),
            alive: Some(true),
            instance_key: workload.key.clone().unwrap_or_default(),
        }
    }

    fn metrics(
        &self,
        state: &mut SimState,
        index: u32,
        include_processes: bool,
        now: u64,
    ) -> pb::DeviceMetrics {
        self.advance(state, index, now);
        let card = self.card(index);
        let model = &card.model;
        let seed = self.card_seed(index);
        let workloads = self.workloads(state, index);
        let cs = &state.cards[index as usize];
        let util = card_util(seed, &workloads, now);
        let n = |salt: u64| noise(seed ^ salt, now);
        let nvidia = model.vendor == VendorName::Nvidia;
        let dead_mib: u64 = cs.dead.iter().map(|(_, mib)| mib).sum();
        let usable = model.memory_mib.saturating_sub(model.reserved_mib);
        let used =
            (workloads.iter().map(|w| w.memory_mib(now)).sum::<u64>() + dead_mib).min(usable);
        let temp = (30.0 + 0.45 * util + n(1)).clamp(25.0, 90.0);
        let mem_copy = (util * 0.55 + 2.0 * n(2)).clamp(0.0, 100.0);
        let power = model.idle_power_w
            + (model.max_power_w - model.idle_power_w) * util / 100.0
            + 2.0 * n(3);
        let sm_clock = if util > 2.0 {
            model.max_sm_clock_mhz - if temp > 80.0 { 90 } else { 0 }
        } else {
            model.idle_sm_clock_mhz
        };
        let pcie_rx =
            (model.pcie_gb_per_s * 1e9 * 0.2 * util / 100.0 * (1.0 + 0.1 * n(4))).max(0.0);
        let links = card.link_count() > 0;
        let ratio = |f: f64| (f / 100.0).clamp(0.0, 1.0);
        let link_bytes = cs.counters.link_bytes(card);
        let mut processes = Vec::new();
        if include_processes {
            processes.extend(workloads.iter().map(|w| Self::process(w, now)));
            processes.extend(cs.dead.iter().map(|&(pid, mib)| pb::ProcessMetrics {
                pid,
                used_memory_mib: Some(mib),
                sm_util_percent: Some(0),
                alive: Some(false),
                ..Default::default()
            }));
        }
        pb::DeviceMetrics {
            device_index: index,
            device_uuid: self.uuids[index as usize].clone(),
            timestamp_unix_ms: now,
            sm_clock_mhz: Some(sm_clock),
            mem_clock_mhz: Some(model.mem_clock_mhz),
            gpu_temp_c: Some(temp.round() as u32),
            memory_temp_c: Some((temp + 6.0).round() as u32),
            power_usage_w: Some((power.max(0.0) * 1000.0).round() / 1000.0),
            total_energy_mj: Some(cs.counters.energy_mj(card)),
            gpu_util_percent: Some(util.round() as u32),
            mem_copy_util_percent: Some(mem_copy.round() as u32),
            enc_util_percent: Some(0),
            dec_util_percent: Some(0),
            fb_used_mib: Some(used),
            fb_free_mib: Some(usable - used),
            fb_reserved_mib: Some(model.reserved_mib),
            pcie_tx_bytes_per_s: Some((pcie_rx * 0.6) as u64),
            pcie_rx_bytes_per_s: Some(pcie_rx as u64),
            pcie_replay_count: Some(seed % 3),
            nvlink_tx_bytes: links.then_some(link_bytes),
            nvlink_rx_bytes: links.then_some(link_bytes / 10 * 9),
            ecc_sbe_volatile: Some(0),
            ecc_dbe_volatile: Some(cs.dbe_volatile),
            ecc_sbe_aggregate: Some(seed % 4),
            ecc_dbe_aggregate: Some(cs.dbe_aggregate),
            retired_pages_sbe: (nvidia && !model.row_remapping).then_some(0),
            retired_pages_dbe: (nvidia && !model.row_remapping).then_some(0),
            retired_pages_pending: (nvidia && !model.row_remapping).then_some(false),
            remapped_rows_correctable: model.row_remapping.then_some(seed % 2),
            remapped_rows_uncorrectable: model.row_remapping.then_some(0),
            row_remap_pending: model.row_remapping.then_some(false),
            row_remap_failure: model.row_remapping.then_some(false),
            xid_last: cs.last_xid.map(u64::from),
            nvlink_crc_flit_errors: (links && nvidia).then_some(0),
            nvlink_crc_data_errors: (links && nvidia).then_some(0),
            nvlink_replay_errors: (links && nvidia).then_some(0),
            nvlink_recovery_errors: (links && nvidia).then_some(0),
            power_violation_ns: None,
            thermal_violation_ns: None,
            gr_engine_active: model.gpm.then(|| ratio(util)),
            sm_active: model.gpm.then(|| ratio(util * 0.92)),
            sm_occupancy: model.gpm.then(|| ratio(util * 0.4)),
            pipe_tensor_active: model.gpm.then(|| ratio(util * 0.55)),
            dram_active: model.gpm.then(|| ratio(mem_copy)),
            processes,
        }
    }

    fn lowest_free_gi(state: &SimState, index: u32) -> u32 {
        let used: BTreeSet<u32> = state
            .instances
            .iter()
            .filter(|r| r.device_index == index)
            .filter_map(|r| r.mig.as_ref().map(|m| m.gpu_instance_id))
            .collect();
        (1..).find(|id| !used.contains(id)).unwrap_or(1)
    }

    /// Changes the instances of a card and saves them; a failed save undoes the change.
    fn change(
        &self,
        state: &mut SimState,
        index: u32,
        change: impl FnOnce(&mut Vec<InstanceRecord>),
    ) -> Result<(), LayerError> {
        self.advance(state, index, self.options.clock.now_ms());
        let before = state.instances.clone();
        change(&mut state.instances);
        if let Err(error) = self.persist(state) {
            state.instances = before;
            return Err(error);
        }
        Ok(())
    }
}

impl Backend for SimulatedBackend {
    fn info(&self) -> pb::GetInfoResponse {
        let mut info = pb::GetInfoResponse {
            version: env!("CARGO_PKG_VERSION").into(),
            driver_version: self.profile.driver_version.clone(),
            profile: self.profile.name.clone(),
            node_name: self.options.node_name.clone(),
            device_count: self.count(),
            fault_injection: true,
            ..Default::default()
        };
        info.set_backend(pb::BackendKind::Simulated);
        info
    }

    fn list_devices(&self, devices: &[u32]) -> Result<pb::ListDevicesResponse, LayerError> {
        let selected = select_devices(devices, self.count())?;
        let state = self.enter(&selected)?;
        let answering: Vec<u32> = selected
            .iter()
            .copied()
            .filter(|&i| !state.cards[i as usize].lost)
            .collect();
        Ok(pb::ListDevicesResponse {
            devices: selected.iter().map(|&i| self.device(&state, i)).collect(),
            nics: self.profile.nics.clone(),
            paths: self
                .profile
                .paths
                .iter()
                .filter(|p| answering.contains(&p.a) && answering.contains(&p.b))
                .cloned()
                .collect(),
        })
    }

    fn create_instance(
        &self,
        request: CreateRequest,
    ) -> Result<pb::CreateInstanceResponse, LayerError> {
        let index = request.device_index;
        self.check_device(index, request.device_uuid.as_deref())?;
        let mut state = self.enter(&[index])?;
        if state.cards[index as usize].lost {
            return Err(self.lost_error(index));
        }
        let uuid = self.uuids[index as usize].clone();
        match resolve(&state.instances, &request, &uuid)? {
            Resolution::Existing(i) => Ok(pb::CreateInstanceResponse {
                instance: Some(self.instance_proto(&state.instances[i])),
                created: false,
                adopted: false,
            }),
            Resolution::Adopt(i) => {
                let key = request.key.clone();
                self.change(&mut state, index, |instances| instances[i].key = Some(key))?;
                tracing::info!(key = %request.key, card = index, "adopted an unkeyed MIG instance");
                Ok(pb::CreateInstanceResponse {
                    instance: Some(self.instance_proto(&state.instances[i])),
                    created: false,
                    adopted: true,
                })
            }
            Resolution::New => {
                let others: Vec<&InstanceRecord> = state
                    .instances
                    .iter()
                    .filter(|r| r.device_index == index)
                    .collect();
                self.check_spec(index, &request.spec, &others)?;
                let now = self.options.clock.now_ms();
                let mig = matches!(request.spec, ShareSpec::Mig { .. }).then(|| {
                    let gpu_instance_id = Self::lowest_free_gi(&state, index);
                    MigIds {
                        gpu_instance_id,
                        compute_instance_id: 0,
                        device_uuid: mig_uuid(&uuid, gpu_instance_id, now),
                    }
                });
                let record = InstanceRecord {
                    key: Some(request.key.clone()),
                    device_index: index,
                    device_uuid: uuid,
                    spec: request.spec,
                    mig,
                    created_unix_ms: now,
                };
                let instance = self.instance_proto(&record);
                self.change(&mut state, index, |instances| instances.push(record))?;
                tracing::info!(key = %request.key, card = index, "created an instance");
                Ok(pb::CreateInstanceResponse {
                    instance: Some(instance),
                    created: true,
                    adopted: false,
                })
            }
        }
    }

    fn destroy_instance(
        &self,
        target: DestroyTarget,
    ) -> Result<pb::DestroyInstanceResponse, LayerError> {
        let found = {
            let state = lock(&self.state);
            state
                .instances
                .iter()
                .find(|r| match &target {
                    DestroyTarget::Key(key) => r.key.as_deref() == Some(key.as_str()),
                    DestroyTarget::Mig {
                        device_index,
                        gpu_instance_id,
                    } => {
                        r.device_index == *device_index
                            && r.mig.as_ref().map(|m| m.gpu_instance_id) == Some(*gpu_instance_id)
                    }
                })
                .cloned()
        };
        if let DestroyTarget::Mig { device_index, .. } = &target {
            self.check_device(*device_index, None)?;
        }
        let Some(record) = found else {
            return Ok(pb::DestroyInstanceResponse {
                existed: false,
                instance: None,
            });
        };
        let index = record.device_index;
        let mut state = self.enter(&[index])?;
        if record.mig.is_some() && state.cards[index as usize].lost {
            return Err(self.lost_error(index));
        }
        let Some(position) = state.instances.iter().position(|r| *r == record) else {
            // Destroyed by a concurrent call meanwhile.
            return Ok(pb::DestroyInstanceResponse {
                existed: false,
                instance: None,
            });
        };
        self.change(&mut state, index, |instances| {
            instances.remove(position);
        })?;
        tracing::info!(instance = %record.describe(), card = index, "destroyed an instance");
        Ok(pb::DestroyInstanceResponse {
            existed: true,
            instance: Some(self.instance_proto(&record)),
        })
    }

    fn list_instances(&self, devices: &[u32]) -> Result<Vec<pb::Instance>, LayerError> {
        let selected = select_devices(devices, self.count())?;
        let state = self.enter(&selected)?;
        Ok(state
            .instances
            .iter()
            .filter(|r| selected.contains(&r.device_index))
            .map(|r| self.instance_proto(r))
            .collect())
    }

    fn device_metrics(
        &self,
        devices: &[u32],
        include_processes: bool,
    ) -> Result<pb::GetDeviceMetricsResponse, LayerError> {
        let selected = select_devices(devices, self.count())?;
        let mut state = self.enter(&selected)?;
        let now = self.options.clock.now_ms();
        let mut response = pb::GetDeviceMetricsResponse::default();
        for index in selected {
            if state.cards[index as usize].lost {
                response
                    .errors
                    .push(self.device_error(index, &self.lost_error(index)));
            } else {
                response
                    .devices
                    .push(self.metrics(&mut state, index, include_processes, now));
            }
        }
        Ok(response)
    }

    fn instance_metrics(
        &self,
        keys: &[String],
    ) -> Result<pb::GetInstanceMetricsResponse, LayerError> {
        let cards: Vec<u32> = {
            let state = lock(&self.state);
            let mut cards: Vec<u32> = state
                .instances
                .iter()
                .filter(|r| {
                    r.key
                        .as_ref()
                        .is_some_and(|k| keys.is_empty() || keys.contains(k))
                })
                .map(|r| r.device_index)
                .collect();
            cards.sort_unstable();
            cards.dedup();
            cards
        };
        let state = self.enter(&cards)?;
        let now = self.options.clock.now_ms();
        let mut response = pb::GetInstanceMetricsResponse::default();
        for index in cards {
            if state.cards[index as usize].lost {
                response
                    .errors
                    .push(self.device_error(index, &self.lost_error(index)));
                continue;
            }
            for record in state.instances.iter().filter(|r| {
                r.device_index == index
                    && r.key
                        .as_ref()
                        .is_some_and(|k| keys.is_empty() || keys.contains(k))
            }) {
                let workload = self.workload(record);
                let (kind, core, limit, profile) = match &record.spec {
                    ShareSpec::Tdm {
                        core_percent,
                        memory_mib,
                    } => (
                        pb::InstanceKind::Tdm,
                        *core_percent,
                        *memory_mib,
                        String::new(),
                    ),
                    ShareSpec::Mig { profile, .. } => (
                        pb::InstanceKind::Mig,
                        0,
                        workload.memory_limit_mib,
                        profile.clone(),
                    ),
                };
                let util = match kind {
                    pb::InstanceKind::Mig => workload.busy_percent(now),
                    _ => workload.card_percent(now),
                };
                let mut metrics = pb::InstanceMetrics {
                    key: record.key.clone().unwrap_or_default(),
                    device_index: index,
                    device_uuid: record.device_uuid.clone(),
                    timestamp_unix_ms: now,
                    sm_util_percent: Some(util.round() as u32),
                    memory_used_mib: Some(workload.memory_mib(now)),
                    memory_limit_mib: limit,
                    core_limit_percent: core,
                    gpu_instance_id: record.mig.as_ref().map(|m| m.gpu_instance_id),
                    profile,
                    processes: vec![Self::process(&workload, now)],
                    ..Default::default()
                };
                metrics.set_kind(kind);
                response.instances.push(metrics);
            }
        }
        Ok(response)
    }

    fn health(&self) -> &HealthHub {
        &self.hub
    }

    fn faults(&self) -> Option<&dyn FaultInjector> {
        Some(self)
    }
}

impl FaultInjector for SimulatedBackend {
    fn inject(&self, request: &pb::InjectFaultRequest) -> Result<pb::DeviceFault, LayerError> {
        let index = request.device_index;
        self.check_device(index, None)?;
        let uuid = self.uuids[index as usize].clone();
        let now = self.options.clock.now_ms();
        // Not `enter`: injecting and clearing must work while the card hangs.
        let mut state = lock(&self.state);
        let fault = match request.kind() {
            pb::FaultKind::Xid => {
                if request.xid == 0 {
                    return Err(LayerError::InvalidArgument(
                        "an XID fault needs its code".into(),
                    ));
                }
                let card = &mut state.cards[index as usize];
                card.xids.insert(request.xid);
                card.last_xid = Some(request.xid);
                faults::xid(request.xid)
            }
            pb::FaultKind::EccDbe => {
                let count = u64::from(request.count.max(1));
                let card = &mut state.cards[index as usize];
                card.dbe_volatile += count;
                card.dbe_aggregate += count;
                faults::ecc_dbe(card.dbe_volatile)
            }
            pb::FaultKind::GpuLost => {
                state.cards[index as usize].lost = true;
                faults::gpu_lost()
            }
            pb::FaultKind::CallHang => {
                state.cards[index as usize].hang = true;
                let mut hang = faults::call_hang(0);
                hang.reason =
                    "calls on the card block until the fault is cleared (injected)".into();
                return Ok(pb::DeviceFault {
                    device_index: index,
                    device_uuid: uuid,
                    fault: Some(hang.at(now)),
                });
            }
            pb::FaultKind::DeadProcessMemory => {
                let memory_mib = if request.memory_mib == 0 {
                    1024
                } else {
                    request.memory_mib
                };
                let card = &mut state.cards[index as usize];
                let pid = if request.pid == 0 {
                    20_000
                        + u32::try_from(
                            stable_hash(&[uuid.as_bytes(), &card.dead.len().to_le_bytes()])
                                % 900_000,
                        )
                        .unwrap_or(0)
                } else {
                    request.pid
                };
                card.dead.push((pid, memory_mib));
                faults::dead_process_memory(pid, memory_mib)
            }
            other => {
                return Err(LayerError::InvalidArgument(format!(
                    "fault kind {} cannot be injected; use XID, ECC_DBE, GPU_LOST, CALL_HANG or DEAD_PROCESS_MEMORY",
                    other.as_str_name()
                )));
            }
        };
        drop(state);
        self.hub.raise(index, &uuid, fault.clone());
        Ok(pb::DeviceFault {
            device_index: index,
            device_uuid: uuid,
            fault: Some(fault.at(now)),
        })
    }

    fn clear(
        &self,
        device: u32,
        kind: Option<pb::FaultKind>,
        xid: Option<u32>,
    ) -> Result<u32, LayerError> {
        self.check_device(device, None)?;
        let wants = |k: pb::FaultKind| kind.is_none_or(|want| want == k);
        let mut cleared = 0u32;
        let mut hub_clears: Vec<(pb::FaultKind, Option<u32>)> = Vec::new();
        {
            let mut state = lock(&self.state);
            let card = &mut state.cards[device as usize];
            if wants(pb::FaultKind::Xid) {
                let codes: Vec<u32> = card
                    .xids
                    .iter()
                    .copied()
                    .filter(|c| xid.is_none_or(|x| x == *c))
                    .collect();
                for code in codes {
                    card.xids.remove(&code);
                    hub_clears.push((pb::FaultKind::Xid, Some(code)));
                    cleared += 1;
                }
            }
            if wants(pb::FaultKind::EccDbe) && card.dbe_volatile > 0 {
                card.dbe_volatile = 0;
                hub_clears.push((pb::FaultKind::EccDbe, None));
                cleared += 1;
            }
            if wants(pb::FaultKind::GpuLost) && card.lost {
                card.lost = false;
                hub_clears.push((pb::FaultKind::GpuLost, None));
                cleared += 1;
            }
            if wants(pb::FaultKind::CallHang) && card.hang {
                // The hang watch clears CALL_HANG when the blocked calls return.
                card.hang = false;
                cleared += 1;
            }
            if wants(pb::FaultKind::DeadProcessMemory) && !card.dead.is_empty() {
                cleared += u32::try_from(card.dead.len()).unwrap_or(u32::MAX);
                card.dead.clear();
                hub_clears.push((pb::FaultKind::DeadProcessMemory, None));
            }
        }
        self.unhang.notify_all();
        for (kind, xid) in hub_clears {
            self.hub.clear(device, Some(kind), xid);
        }
        Ok(cleared)
    }

    fn list(&self) -> Vec<pb::DeviceFault> {
        let state = lock(&self.state);
        let now = self.options.clock.now_ms();
        let mut out = Vec::new();
        for (i, card) in state.cards.iter().enumerate() {
            let index = u32::try_from(i).unwrap_or(u32::MAX);
            let mut push = |fault: faults::NewFault| {
                let since = self
                    .hub
                    .faults_of(index)
                    .into_iter()
                    .find(|f| f.kind == fault.kind as i32 && f.xid == fault.xid)
                    .map_or(now, |f| f.since_unix_ms);
                out.push(pb::DeviceFault {
                    device_index: index,
                    device_uuid: self.uuids[i].clone(),
                    fault: Some(fault.at(since)),
                });
            };
            for &code in &card.xids {
                push(faults::xid(code));
            }
            if card.dbe_volatile > 0 {
                push(faults::ecc_dbe(card.dbe_volatile));
            }
            if card.lost {
                push(faults::gpu_lost());
            }
            if card.hang {
                let mut hang = faults::call_hang(0);
                hang.reason =
                    "calls on the card block until the fault is cleared (injected)".into();
                push(hang);
            }
            for &(pid, mib) in &card.dead {
                push(faults::dead_process_memory(pid, mib));
            }
        }
        out
    }
}
