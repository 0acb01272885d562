//! The cards a bound pod holds: its allocation annotation is the truth, the slices it wrote hold
//! their cards until they are gone, and named slices that are missing are re-created.

use super::{InFlight, RETRY_BACKOFF, Restore, State, Unfinalize};
use kube::ResourceExt;
use runtimekit_crds::GpuSlice;
use runtimekit_placement as placement;
use runtimekit_placement::objects::slice_objects;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long a slice deleted under a live bound pod waits before it is re-created.
pub const RESTORE_GRACE: Duration = Duration::from_secs(5);

impl State {
    /// Keeps a bound pod's cards as its allocation records them: each card is accounted (the
    /// annotation wins over a slice that disagrees with it), slices of the pod it does not name
    /// are released, and named slices that do not exist are queued to be re-created, unless the
    /// pod's own writes are still running.
    pub(super) fn settle_recorded(&mut self, uid: &str) {
        let Some(record) = self.pods.get(uid) else {
            return;
        };
        let Some(recorded) = record.recorded.clone() else {
            return;
        };
        let namespace = record.namespace.clone();
        let named: HashMap<&String, placement::SliceInput> = recorded.cards().collect();
        for key in self.slices_by_pod.get(uid).into_iter().flatten() {
            if let Some(slice) = self.slices.get(key)
                && !slice.deleting
                && named.get(&key.1) != slice.input.as_ref()
            {
                self.work.release.insert(key.clone());
            }
        }
        let mut missing = false;
        for (name, input) in named {
            let key = (namespace.clone(), name.clone());
            missing |= !self.slices.contains_key(&key) && !self.created_unseen.contains_key(&key);
            self.engine.upsert_slice(input);
        }
        if missing && !self.in_flight.contains_key(uid) {
            self.restore.entry(uid.to_owned()).or_insert(Restore {
                not_before: None,
                failures: 0,
            });
        }
    }

    /// From now on `uid`'s cards are held by the slices it wrote alone (those the watch shows and
    /// those written but not shown yet), until they are released: for a pod that ended, is gone,
    /// lost its allocation annotation, or whose binding failed. While its writes still run this
    /// waits; they call it again when they end.
    pub(super) fn hold_only_written_slices(&mut self, uid: &str) {
        self.restore.remove(uid);
        if self.in_flight.get(uid) == Some(&InFlight::Writing) {
            return;
        }
        if self.engine.release(uid) {
            self.capacity_freed = true;
        }
        self.keep_written_slices(uid);
    }

    /// A decided pod that was not bound gives back everything its attempt took: its capacity,
    /// and the slices written for it (never enacted, so their finalizer goes too). Unlike a
    /// single pod, whose next try may reuse its slices, a gang member stays pending until the
    /// whole gang is placed again, and at full capacity its slices would keep the gang out.
    pub(super) fn release_unbound(&mut self, uid: &str) {
        self.end_flight(uid);
        if self.pods.get(uid).is_some_and(|p| p.node.is_some()) {
            // Bound all the same (an earlier try landed): what it records counts.
            self.settle_recorded(uid);
            return;
        }
        if self.engine.release(uid) {
            self.capacity_freed = true;
        }
        self.release_slices_of(uid, false);
        let unseen: Vec<(String, String)> = self
            .created_unseen
            .iter()
            .filter(|(_, input)| input.as_ref().is_some_and(|i| i.pod_uid == uid))
            .map(|(key, _)| key.clone())
            .collect();
        for key in unseen {
            self.work.release.insert(key.clone());
            self.work
                .unfinalize
                .entry(key)
                .or_insert(Unfinalize::NeverEnacted);
        }
    }

    /// Slices a pod's attempts did write hold their cards until they are gone, whether or not
    /// the watch shows them yet.
    pub(super) fn keep_written_slices(&mut self, uid: &str) {
        let written: Vec<placement::SliceInput> = self
            .slices_of(uid)
            .into_iter()
            .filter_map(|s| s.input.clone())
            .chain(
                self.created_unseen
                    .values()
                    .flatten()
                    .filter(|i| i.pod_uid == uid)
                    .cloned(),
            )
            .collect();
        for input in written {
            self.engine.upsert_slice(input);
        }
    }

    /// GpuSlices written, each with whether the apiserver accepted it: until the watch shows the
    /// accepted ones they count as there.
    pub fn slices_created<'a>(&mut self, written: impl IntoIterator<Item = (&'a GpuSlice, bool)>) {
        for (slice, _) in written.into_iter().filter(|(_, accepted)| *accepted) {
            let key = (slice.namespace().unwrap_or_default(), slice.name_any());
            if !self.slices.contains_key(&key) {
                let input = placement::SliceInput::from_gpu_slice(slice).ok().flatten();
                self.created_unseen.insert(key, input);
            }
        }
    }

    /// The GpuSlices to re-create now: those that bound pods' allocations name and that do not
    /// exist, for pods not waiting after a failed re-creation.
    pub fn restore_due(&mut self, now: Instant) -> Vec<GpuSlice> {
        let due: Vec<String> = self
            .restore
            .iter()
            .filter(|(_, restore)| restore.not_before.is_none_or(|t| t <= now))
            .map(|(uid, _)| uid.clone())
            .collect();
        let mut slices = Vec::new();
        for uid in due {
            let missing = self.missing_slices(&uid);
            if missing.is_empty() {
                self.restore.remove(&uid);
            }
            slices.extend(missing);
        }
        slices
    }

    /// The re-creation of a pod's slices went as `created` says: a failure is tried again after
    /// a backoff (2 s doubling to 60 s), so a namespace being deleted or an apiserver refusing
    /// is not hammered.
    pub fn restored(&mut self, uid: &str, created: bool, now: Instant) {
        if created {
            self.restore.remove(uid);
            return;
        }
        let restore = self.restore.entry(uid.to_owned()).or_insert(Restore {
            not_before: None,
            failures: 0,
        });
        restore.failures += 1;
        restore.not_before = Some(now + RETRY_BACKOFF.after(restore.failures));
    }

    /// The GpuSlices a bound pod's allocation names that do not exist, to create.
    pub fn missing_slices(&self, uid: &str) -> Vec<GpuSlice> {
        let Some(record) = self
            .pods
            .get(uid)
            .filter(|_| !self.in_flight.contains_key(uid))
        else {
            return Vec::new();
        };
        let Some(recorded) = &record.recorded else {
            return Vec::new();
        };
        slice_objects(
            &record.namespace,
            &record.name,
            uid,
            &recorded.decision,
            &recorded.slices,
        )
        .into_iter()
        .filter(|slice| {
            let key = (record.namespace.clone(), slice.name_any());
            !self.slices.contains_key(&key) && !self.created_unseen.contains_key(&key)
        })
        .collect()
    }

    /// The GpuSlices were listed again: the list shows every slice that exists, so none is
    /// awaited any more, and every bound pod's slices are checked against its allocation.
    pub fn slices_relisted(&mut self) {
        self.created_unseen.clear();
        let recorded: Vec<String> = self
            .pods
            .values()
            .filter(|p| p.recorded.is_some())
            .map(|p| p.uid.clone())
            .collect();
        for uid in recorded {
            self.settle_recorded(&uid);
        }
    }
}
