//! The operator's view of the cluster, kept from watch events without I/O: it feeds the placement
//! engine incrementally and tells the scheduler and controllers what needs doing.
//!
//! Each watched kind feeds the state through one small [`Feed`] impl that lives beside the part
//! of the state it feeds: pods (`pods`), GpuSlices (`slices`), nodes (`nodes`), TopologyGroups
//! (`groups`, with the health taint they call for in `health`), GangGroups (`gangs`) and
//! ResourceQuotas (`quotas`, what each namespace holds against them); PodDisruptionBudgets and
//! the pods nominated to the room their victims leave are in `preemption`. The pending queue and its backoff are in `queue`, and the
//! cards a bound pod holds through its allocation annotation are in `allocations`. Nothing here
//! reads the clock: every method that needs the time is given it.

mod allocations;
mod gangs;
mod groups;
mod health;
mod ledger;
mod nodes;
mod pods;
mod preemption;
mod queue;
mod quotas;
mod records;
mod slices;

pub use allocations::RESTORE_GRACE;
pub use gangs::{GangBinding, GangError};
pub use groups::TopologyPlan;
pub use health::TaintChange;
pub use ledger::{GangLine, GroupLine, Ledger};
pub use nodes::IMPLICIT_NETWORK_POD;
pub use preemption::{Eviction, Victim};
pub use queue::{Binding, Outcome};
pub use records::{Life, Pending, PodRecord, Recorded, SliceRecord};

use crate::backoff::Backoff;
use crate::topology::{AppliedGroup, Tree};
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use runtimekit_contract::{ResourceNames, RuntimeKitConfig};
use runtimekit_crds::{GangGroup, TopologyGroupStatus};
use runtimekit_placement::{self as placement, Cluster, Settings};
use serde::de::DeserializeOwned;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The backoff of a pod that did not fit and of a failed slice re-creation: 2 s doubling to 60 s.
const RETRY_BACKOFF: Backoff = Backoff {
    first: Duration::from_secs(2),
    max: Duration::from_secs(60),
};

/// The time an event is applied at: monotonic for the state's own timers (backoffs, grace
/// periods), wall-clock for comparing with times the API records (heartbeats).
#[derive(Debug, Clone, Copy)]
pub struct Now {
    /// For the state's own timers.
    pub monotonic: Instant,
    /// For times written in API objects.
    pub wall: Timestamp,
}

impl Now {
    /// The current time; called by the tasks that drive the state, never inside it.
    pub fn current() -> Now {
        Now {
            monotonic: Instant::now(),
            wall: Timestamp::now(),
        }
    }
}

/// How one watched kind feeds the state. The watch loop keys objects by [`Feed::key`] so a
/// re-list can remove the ones that vanished meanwhile.
pub trait Feed: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static {
    /// The kind's name, for logs and the first-sync report.
    const KIND: &'static str;
    /// The key the state knows the object by.
    fn key(&self) -> String;
    /// Applies the object as the API has it now.
    fn apply(&self, state: &mut State, now: Now);
    /// Removes the object of `key`, which is gone.
    fn remove(key: &str, state: &mut State, now: Now);
    /// Every key the state knows for this kind.
    fn known(state: &State) -> Vec<String>;
    /// Called once, after the first complete list has been applied.
    fn synced(_state: &mut State) {}
    /// Called after every complete list (the first and each re-list).
    fn relisted(_state: &mut State) {}
}

/// The key of a namespaced object: in [`Feed::key`], and the engine's key of a gang.
fn namespaced_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// The namespace and name in a key made by [`namespaced_key`].
fn split_key(key: &str) -> (&str, &str) {
    key.split_once('/').unwrap_or(("", key))
}

/// Work the controllers must do, found while applying events.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Work {
    /// Slices to delete: their pod ended or is gone (namespace, name).
    pub release: BTreeSet<(String, String)>,
    /// Slices whose finalizer the operator removes itself, and why (namespace, name).
    pub unfinalize: BTreeMap<(String, String), Unfinalize>,
    /// Slices whose node agent just reported them Failed, to tell their pods (namespace, name).
    pub failed: BTreeMap<(String, String), SliceFailure>,
}

/// Why the operator removes a slice's finalizer itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unfinalize {
    /// Its node is gone, so no agent will: always.
    NodeGone,
    /// Its pod was never bound: only while the slice shows that no agent acted on it (no phase,
    /// or Reserved), checked against the object at the moment of the write; otherwise its agent
    /// releases what it enacted and removes the finalizer itself.
    NeverEnacted,
}

/// A slice its node agent could not enact, as its pod is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceFailure {
    /// The pod the slice is for.
    pub pod: runtimekit_crds::PodRef,
    /// The card it names.
    pub card: Option<u32>,
    /// The agent's reason, for example `CardHeldWhole`.
    pub reason: String,
    /// The agent's message.
    pub message: String,
}

/// Where a decided pod's writes stand. A pod stays in flight from its decision until the watch
/// shows it bound (or gone), so it is never decided twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InFlight {
    /// Its GpuSlices and Binding are being written.
    Writing,
    /// The writes are done; the watch does not show the pod bound yet.
    Written,
}

/// A bound pod whose allocation may name GpuSlices that do not exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Restore {
    /// When to look next; `None`: now.
    not_before: Option<Instant>,
    /// How many re-creations failed in a row.
    failures: u32,
}

/// The operator's state.
#[derive(Debug)]
pub struct State {
    /// The placement engine.
    pub engine: Cluster,
    /// The shared configuration.
    pub config: RuntimeKitConfig,
    names: ResourceNames,
    pods: HashMap<String, PodRecord>,
    slices: HashMap<(String, String), SliceRecord>,
    slices_by_pod: HashMap<String, BTreeSet<(String, String)>>,
    nodes: BTreeMap<String, placement::NodeInfo>,
    node_groups: BTreeMap<String, groups::NodeGroup>,
    applied_groups: BTreeMap<String, AppliedGroup>,
    gangs: BTreeMap<(String, String), Arc<GangGroup>>,
    tree: Tree,
    tree_dirty: bool,
    work: Work,
    /// Pods of our scheduler waiting to be placed, by UID.
    pending: BTreeSet<(Option<Timestamp>, String)>,
    /// Whether the first list of pods is complete (before it, a slice without a known pod is
    /// not an orphan yet).
    synced_pods: bool,
    /// Derived higher-tier groups in the API, with their status.
    derived_groups: BTreeMap<String, TopologyGroupStatus>,
    /// Member pods of each gang, by (namespace, gang name).
    gang_pods: BTreeMap<(String, String), BTreeSet<String>>,
    /// Decided pods whose writes are running or that the watch does not show bound yet, by UID.
    in_flight: HashMap<String, InFlight>,
    /// GpuSlices the apiserver accepted that the watch does not show yet, with the card each
    /// holds: they count as there, so they are neither re-created nor handed out again.
    created_unseen: HashMap<(String, String), Option<placement::SliceInput>>,
    /// Slices whose delete was handed out as work and that the watch does not show deleting
    /// yet: every event of their pod until then would otherwise delete them again.
    releasing: BTreeSet<(String, String)>,
    /// Bound pods whose allocation may name GpuSlices that do not exist, by UID.
    restore: HashMap<String, Restore>,
    /// Whether capacity may have been freed or added since the scheduler last looked.
    capacity_freed: bool,
    /// Retry bookkeeping of pods that did not fit, by UID.
    attempts: HashMap<String, queue::Attempts>,
    /// What each namespace's pods hold against its quotas, replicas counted.
    quotas: placement::quota::Quotas,
    /// PodDisruptionBudgets, by (namespace, name).
    budgets: BTreeMap<(String, String), preemption::Budget>,
    /// Preemptors waiting for their victims to terminate, by UID.
    nominations: HashMap<String, preemption::Nomination>,
}

impl State {
    /// An empty state for `config`.
    pub fn new(config: RuntimeKitConfig) -> State {
        State {
            engine: Cluster::new(Settings::new(&config)),
            names: config.names(),
            config,
            pods: HashMap::new(),
            slices: HashMap::new(),
            slices_by_pod: HashMap::new(),
            nodes: BTreeMap::new(),
            tree_dirty: false,
            synced_pods: false,
            in_flight: HashMap::new(),
            created_unseen: HashMap::new(),
            releasing: BTreeSet::new(),
            restore: HashMap::new(),
            capacity_freed: false,
            gang_pods: BTreeMap::new(),
            derived_groups: BTreeMap::new(),
            attempts: HashMap::new(),
            node_groups: BTreeMap::new(),
            applied_groups: BTreeMap::new(),
            gangs: BTreeMap::new(),
            tree: Tree::default(),
            work: Work::default(),
            pending: BTreeSet::new(),
            quotas: placement::quota::Quotas::default(),
            budgets: BTreeMap::new(),
            nominations: HashMap::new(),
        }
    }

    /// Whether capacity may have been freed or added since the last call (a slice or pod gone,
    /// a node changed, an agent reporting again), so pods that did not fit should try again.
    pub fn take_capacity_freed(&mut self) -> bool {
        std::mem::take(&mut self.capacity_freed)
    }

    /// Takes the controller work found so far.
    pub fn take_work(&mut self) -> Work {
        hand_out(&mut self.work.release, &mut self.releasing);
        std::mem::take(&mut self.work)
    }

    /// One pod, by UID.
    pub fn pod(&self, uid: &str) -> Option<&PodRecord> {
        self.pods.get(uid)
    }

    /// The topology tree derived from node labels and applied groups.
    pub fn tree(&self) -> &Tree {
        &self.tree
    }

    /// The annotation a Binding's allocation goes into.
    fn allocation_annotation(&self) -> String {
        runtimekit_contract::allocation::annotation(&self.config.resource_prefix)
    }
}

/// Keeps of `work` only what is not handed out already, and records it as handed out.
fn hand_out(work: &mut BTreeSet<(String, String)>, handed_out: &mut BTreeSet<(String, String)>) {
    work.retain(|key| handed_out.insert(key.clone()));
}
