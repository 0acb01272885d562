//! What the operator's tasks share: the state behind one lock, a wake-up for the scheduler and
//! controllers, and which kinds have been listed completely.

use crate::metrics::Metrics;
use crate::state::{Feed, State};
use k8s_openapi::api::core::v1::{Node, Pod, ResourceQuota};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use runtimekit_crds::{GangGroup, GpuSlice, TopologyGroup};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::watch;

/// The kinds that must be listed before the operator acts.
pub const WATCHED: [&str; 7] = [
    Pod::KIND,
    Node::KIND,
    GpuSlice::KIND,
    TopologyGroup::KIND,
    GangGroup::KIND,
    ResourceQuota::KIND,
    PodDisruptionBudget::KIND,
];

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

    /// Records that `kind` has been listed completely, and wakes every task, those waiting in
    /// [`Shared::wait_synced`] included.
    pub fn mark_synced(&self, kind: &'static str) {
        {
            let mut synced = self
                .synced
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            synced.insert(kind);
            if WATCHED.iter().all(|k| synced.contains(k)) {
                self.metrics.set_ready();
            }
        }
        self.wake();
    }

    /// Completes once every watched kind has been listed. The subscription is taken before the
    /// first look, and [`Shared::mark_synced`] wakes it, so no list is missed.
    pub async fn wait_synced(&self) {
        let mut changes = self.subscribe();
        while !self.all_synced() {
            if changes.changed().await.is_err() {
                // `self` owns the sender, so it cannot be dropped while this borrows it.
                std::future::pending::<()>().await;
            }
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
