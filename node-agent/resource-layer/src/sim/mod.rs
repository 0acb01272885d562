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
//!
//! This file holds the options, start-up (profile, UUIDs, state file), the gate every call
//! passes (a hanging card blocks it) and the `Backend` impl; the rest is one file per concern:
//! `profile` (hardware profiles), `devices` (discovery), `instances` (MIG instances, TDM
//! shares, the state file), `readings` (device and instance metrics) over `metrics` (the
//! workload model), and `injection` (faults).

mod devices;
mod injection;
mod instances;
pub mod metrics;
pub mod profile;
mod readings;

use crate::backend::{Backend, DestroyTarget, FaultInjector, check_device};
use crate::device_nodes::DeviceNodes;
use crate::error::LayerError;
use crate::health::HealthHub;
use crate::instances::{CreateRequest, InstanceRecord};
use crate::store::Store;
use crate::util::{Clock, derived_uuid, lock, stable_hash};
use crate::watch::CallWatch;
use metrics::Counters;
use profile::CardSpec;
use runtimekit_proto::resource::v1alpha1 as pb;
use std::collections::{BTreeMap, BTreeSet};
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
    /// Where stand-in device files for the cards, instances and NICs are made (character
    /// devices no driver answers, so a runtime can inject them); `None` makes none.
    pub device_dir: Option<PathBuf>,
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
            device_dir: None,
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
    device_nodes: Option<DeviceNodes>,
}

/// What the simulated hardware holds, under one lock.
#[derive(Debug)]
struct SimState {
    cards: Vec<CardState>,
    instances: Vec<InstanceRecord>,
}

/// A card's injected faults and integrating counters.
#[derive(Debug)]
struct CardState {
    xids: BTreeSet<u32>,
    last_xid: Option<u32>,
    dbe_volatile: u64,
    dbe_aggregate: u64,
    lost: bool,
    hang: bool,
    /// Processes gone while holding memory: (PID, MiB).
    dead: Vec<(u32, u64)>,
    /// Processes set to keep the card busy: PID -> percent of SM time.
    loads: BTreeMap<u32, u32>,
    counters: Counters,
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
                loads: BTreeMap::new(),
                counters: Counters::at(now),
            })
            .collect();
        let device_nodes = options.device_dir.as_ref().and_then(|dir| {
            let count = u32::try_from(profile.cards.len()).unwrap_or(u32::MAX);
            let nodes = DeviceNodes::stand_ins(dir, count);
            let nics: Vec<String> = profile.nics.iter().map(|n| n.name.clone()).collect();
            match nodes.make_stand_ins(&nics) {
                Ok(()) => Some(nodes),
                Err(error) => {
                    tracing::warn!(dir = %dir.display(), %error, "cannot make stand-in device files (mknod needs root); none are reported");
                    None
                }
            }
        });
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
            device_nodes,
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
                backend.persist(&state.instances)?;
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

    /// The seed of a card's readings and serial number.
    fn card_seed(&self, index: u32) -> u64 {
        stable_hash(&[
            &self.options.seed.to_le_bytes(),
            self.uuids[index as usize].as_bytes(),
        ])
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

    /// Checks that the card exists and, when the caller names one, has the UUID it expects.
    fn check_device(&self, index: u32, uuid: Option<&str>) -> Result<(), LayerError> {
        check_device(index, self.count(), uuid, || {
            self.uuids[index as usize].clone()
        })
    }

    /// The error of a call on a lost card.
    fn lost_error(&self, index: u32) -> LayerError {
        LayerError::DeviceLost {
            index,
            uuid: self.uuids[index as usize].clone(),
        }
    }

    /// A lost card's entry in the `errors` of a metrics answer.
    fn lost_entry(&self, index: u32) -> pb::DeviceError {
        self.lost_error(index)
            .on_device(index, self.uuids[index as usize].clone())
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
        self.list_cards(devices)
    }

    fn create_instance(
        &self,
        request: CreateRequest,
    ) -> Result<pb::CreateInstanceResponse, LayerError> {
        self.create(request)
    }

    fn destroy_instance(
        &self,
        target: DestroyTarget,
    ) -> Result<pb::DestroyInstanceResponse, LayerError> {
        self.destroy(target)
    }

    fn list_instances(&self, devices: &[u32]) -> Result<pb::ListInstancesResponse, LayerError> {
        Ok(pb::ListInstancesResponse {
            instances: self.instances_of(devices)?,
            errors: Vec::new(),
        })
    }

    fn device_metrics(
        &self,
        devices: &[u32],
        include_processes: bool,
    ) -> Result<pb::GetDeviceMetricsResponse, LayerError> {
        self.read_cards(devices, include_processes)
    }

    fn instance_metrics(
        &self,
        keys: &[String],
    ) -> Result<pb::GetInstanceMetricsResponse, LayerError> {
        self.read_instances(keys)
    }

    fn health(&self) -> &HealthHub {
        &self.hub
    }

    fn device_nodes(&self) -> Option<&DeviceNodes> {
        self.device_nodes.as_ref()
    }

    fn faults(&self) -> Option<&dyn FaultInjector> {
        Some(self)
    }
}
