//! What the operator's tasks share: the state behind one lock, a wake-up for the scheduler and
//! controllers, and which kinds have been listed completely.

use crate::metrics::Metrics;
use crate::state::State;
use crate::watch::Mirrored;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use runtimekit_crds::{GangGroup, GpuSlice, TopologyGroup};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::watch;

/// The kinds that must be listed before the operator acts.
pub const WATCHED: [&str; 5] = ["Pod", "Node", "GpuSlice", "TopologyGroup", "GangGroup"];

/// State and signals shared by the watchers, the scheduler and the controllers.
#[derive(Debug)]
pub struct Shared {
    state: Mutex<State>,
    changes: watch::Sender<u64>,
    synced: Mutex<BTreeSet<&'static str>>,
    /// The operator's metrics.
    pub metrics: Arc<Metrics>,
}

impl Shared {
    /// Shares `state`.
    pub fn new(state: State, metrics: Arc<Metrics>) -> Shared {
        Shared {
            state: Mutex::new(state),
            changes: watch::Sender::new(0),
            synced: Mutex::default(),
            metrics,
        }
    }

    /// Locks the state. A panic while holding the lock would leave the engine half-updated, so
    /// a poisoned lock is taken over as is rather than propagated.
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Wakes the scheduler and controllers: something changed.
    pub fn wake(&self) {
        self.changes
            .send_modify(|generation| *generation = generation.wrapping_add(1));
    }

    /// A subscription to [`Shared::wake`]: each task holds its own, so none misses a change
    /// while it is busy.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Records that `kind` has been listed completely.
    pub fn mark_synced(&self, kind: &'static str) {
        let mut synced = self
            .synced
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        synced.insert(kind);
        if WATCHED.iter().all(|k| synced.contains(k)) {
            self.metrics.set_ready();
        }
    }

    /// Whether every watched kind has been listed completely.
    pub fn all_synced(&self) -> bool {
        let synced = self
            .synced
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        WATCHED.iter().all(|k| synced.contains(k))
    }
}

fn namespaced_key<K: ResourceExt>(object: &K) -> String {
    format!(
        "{}/{}",
        object.namespace().unwrap_or_default(),
        object.name_any()
    )
}

fn split_key(key: &str) -> (&str, &str) {
    key.split_once('/').unwrap_or(("", key))
}

impl Mirrored for Pod {
    const KIND: &'static str = "Pod";
    fn key(&self) -> String {
        self.metadata.uid.clone().unwrap_or_default()
    }
    fn apply(&self, shared: &Shared) {
        shared.lock().apply_pod(self);
    }
    fn remove(key: &str, shared: &Shared) {
        shared.lock().delete_pod(key);
    }
    fn known(shared: &Shared) -> Vec<String> {
        shared.lock().pod_uids()
    }
    fn synced(shared: &Shared) {
        shared.lock().pods_synced();
    }
}

impl Mirrored for Node {
    const KIND: &'static str = "Node";
    fn key(&self) -> String {
        self.name_any()
    }
    fn apply(&self, shared: &Shared) {
        shared.lock().apply_node(self);
    }
    fn remove(key: &str, shared: &Shared) {
        shared.lock().delete_node(key);
    }
    fn known(shared: &Shared) -> Vec<String> {
        shared.lock().node_names()
    }
}

impl Mirrored for GpuSlice {
    const KIND: &'static str = "GpuSlice";
    fn key(&self) -> String {
        namespaced_key(self)
    }
    fn apply(&self, shared: &Shared) {
        shared.lock().apply_slice(self);
    }
    fn remove(key: &str, shared: &Shared) {
        let (namespace, name) = split_key(key);
        shared.lock().delete_slice(namespace, name);
    }
    fn relisted(shared: &Shared) {
        shared.lock().slices_relisted();
    }
    fn known(shared: &Shared) -> Vec<String> {
        shared
            .lock()
            .slice_keys()
            .into_iter()
            .map(|(ns, name)| format!("{ns}/{name}"))
            .collect()
    }
}

impl Mirrored for TopologyGroup {
    const KIND: &'static str = "TopologyGroup";
    fn key(&self) -> String {
        self.name_any()
    }
    fn apply(&self, shared: &Shared) {
        shared.lock().apply_group(self, Timestamp::now());
    }
    fn remove(key: &str, shared: &Shared) {
        shared.lock().delete_group(key);
    }
    fn known(shared: &Shared) -> Vec<String> {
        shared.lock().group_names()
    }
}

impl Mirrored for GangGroup {
    const KIND: &'static str = "GangGroup";
    fn key(&self) -> String {
        namespaced_key(self)
    }
    fn apply(&self, shared: &Shared) {
        shared.lock().apply_gang(self);
    }
    fn remove(key: &str, shared: &Shared) {
        let (namespace, name) = split_key(key);
        shared.lock().delete_gang(namespace, name);
    }
    fn known(shared: &Shared) -> Vec<String> {
        shared
            .lock()
            .gang_keys()
            .into_iter()
            .map(|(ns, name)| format!("{ns}/{name}"))
            .collect()
    }
}
