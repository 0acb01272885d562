//! GpuSlices as the watch delivers them: each slice holds its card until the object is gone.

use super::{
    Feed, Now, RESTORE_GRACE, SliceFailure, SliceRecord, State, Unfinalize, namespaced_key,
    split_key,
};
use kube::ResourceExt;
use runtimekit_crds::{CONDITION_READY, GpuSlice, SLICE_FINALIZER, SlicePhase};
use runtimekit_placement as placement;
use std::time::Instant;

impl Feed for GpuSlice {
    const KIND: &'static str = "GpuSlice";
    fn key(&self) -> String {
        namespaced_key(&self.namespace().unwrap_or_default(), &self.name_any())
    }
    fn apply(&self, state: &mut State, _now: Now) {
        state.apply_slice(self);
    }
    fn remove(key: &str, state: &mut State, now: Now) {
        let (namespace, name) = split_key(key);
        state.delete_slice(namespace, name, now.monotonic);
    }
    fn known(state: &State) -> Vec<String> {
        state
            .slice_keys()
            .into_iter()
            .map(|(namespace, name)| namespaced_key(&namespace, &name))
            .collect()
    }
    fn relisted(state: &mut State) {
        state.slices_relisted();
    }
}

impl State {
    /// The slices of a pod.
    pub fn slices_of(&self, pod_uid: &str) -> Vec<&SliceRecord> {
        self.slices_by_pod
            .get(pod_uid)
            .into_iter()
            .flatten()
            .filter_map(|key| self.slices.get(key))
            .collect()
    }

    /// Every slice.
    pub fn slices(&self) -> impl Iterator<Item = &SliceRecord> {
        self.slices.values()
    }

    /// Applies a GpuSlice. Its capacity stays taken until the object is gone, so an instance still
    /// being destroyed is never handed out again.
    pub fn apply_slice(&mut self, slice: &GpuSlice) {
        let key = (slice.namespace().unwrap_or_default(), slice.name_any());
        let mut record = SliceRecord {
            namespace: key.0.clone(),
            name: key.1.clone(),
            pod_uid: slice.spec.pod.uid.clone(),
            container: slice.spec.pod.container.clone(),
            replica: slice.spec.replica_index,
            node: slice.spec.node_name.clone(),
            deleting: slice.metadata.deletion_timestamp.is_some(),
            finalized: slice.finalizers().iter().any(|f| f == SLICE_FINALIZER),
            input: None,
            nics: slice.spec.nics.clone(),
            failed: false,
            mode: slice.spec.mode,
            phase: slice.status.as_ref().and_then(|s| s.phase),
            profile: slice.spec.mig_profile.clone(),
        };
        // A bound pod's allocation decides its cards: a slice that disagrees with it is released
        // (by `settle_recorded`) rather than counted.
        let recorded = self
            .pods
            .get(&record.pod_uid)
            .and_then(|p| p.recorded.clone());
        match placement::SliceInput::from_gpu_slice(slice) {
            Ok(Some(input)) => {
                let agrees = recorded.as_ref().is_none_or(|r| {
                    r.cards()
                        .any(|(name, card)| *name == record.name && card == input)
                });
                if agrees {
                    self.engine.upsert_slice(input.clone());
                }
                record.input = Some(input);
            }
            Ok(None) => {}
            Err(error) => {
                tracing::warn!(%error, "GpuSlice cannot be read; its capacity is not accounted")
            }
        }
        let pod_alive = self
            .pods
            .get(&record.pod_uid)
            .is_some_and(|p| !p.life.ended());
        if !record.deleting && !pod_alive && self.synced_pods {
            self.work.release.insert(key.clone());
        }
        if record.deleting
            && record.finalized
            && record
                .node
                .as_ref()
                .is_some_and(|n| !self.nodes.contains_key(n))
        {
            self.work
                .unfinalize
                .insert(key.clone(), Unfinalize::NodeGone);
        }
        let failure = failure_of(slice);
        record.failed = failure.is_some();
        let failed_before = self.slices.get(&key).is_some_and(|s| s.failed);
        if let Some((reason, message)) = failure
            && !failed_before
            && !record.deleting
            && pod_alive
        {
            self.work.failed.insert(
                key.clone(),
                SliceFailure {
                    pod: slice.spec.pod.clone(),
                    card: slice.spec.card.as_ref().map(|c| c.index),
                    reason,
                    message,
                },
            );
        }
        self.slices_by_pod
            .entry(record.pod_uid.clone())
            .or_default()
            .insert(key.clone());
        self.created_unseen.remove(&key);
        // What was handed out shows now; a later need is new work.
        if record.deleting {
            self.releasing.remove(&key);
        }
        let pod_uid = record.pod_uid.clone();
        self.slices.insert(key, record);
        if recorded.is_some() {
            self.settle_recorded(&pod_uid);
        }
    }

    /// Forgets a GpuSlice that is gone; only now does its capacity return.
    pub fn delete_slice(&mut self, namespace: &str, name: &str, now: Instant) {
        let key = (namespace.to_owned(), name.to_owned());
        self.releasing.remove(&key);
        let Some(record) = self.slices.remove(&key) else {
            return;
        };
        self.capacity_freed = true;
        self.engine
            .remove_slice(&record.pod_uid, &record.container, record.replica);
        if let Some(keys) = self.slices_by_pod.get_mut(&record.pod_uid) {
            keys.remove(&key);
            if keys.is_empty() {
                self.slices_by_pod.remove(&record.pod_uid);
            }
        }
        self.created_unseen.remove(&key);
        // A live bound pod keeps what its allocation records; a named slice that went away is
        // re-created, after a grace period in which the pod usually turns out to be going too
        // (a namespace being deleted takes the slices first).
        let queued = self.restore.contains_key(&record.pod_uid);
        self.settle_recorded(&record.pod_uid);
        if !queued && let Some(restore) = self.restore.get_mut(&record.pod_uid) {
            restore.not_before = Some(now + RESTORE_GRACE);
        }
    }

    /// Slices whose delete failed: deleted again with the next work.
    pub fn release_again(&mut self, keys: Vec<(String, String)>) {
        for key in &keys {
            self.releasing.remove(key);
        }
        self.work.release.extend(keys);
    }

    /// Keys of every known slice.
    pub fn slice_keys(&self) -> Vec<(String, String)> {
        self.slices.keys().cloned().collect()
    }
}

/// The agent's reason and message when it reports `slice` Failed.
fn failure_of(slice: &GpuSlice) -> Option<(String, String)> {
    let status = slice.status.as_ref()?;
    if status.phase != Some(SlicePhase::Failed) {
        return None;
    }
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == CONDITION_READY);
    let reason = ready.map_or("Failed", |c| c.reason.as_str()).to_owned();
    let message = status
        .message
        .clone()
        .or_else(|| ready.map(|c| c.message.clone()))
        .unwrap_or_default();
    Some((reason, message))
}
