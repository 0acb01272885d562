//! Pods as the watch delivers them: the queue of pending pods, the usage of bound ones, their
//! allocation annotations and gang membership, and the release of an ended pod's slices.

use super::records::prune;
use super::{Feed, InFlight, Life, Now, Pending, PodRecord, Recorded, State, Unfinalize};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use runtimekit_contract::GangMembership;
use runtimekit_contract::allocation::Allocation;
use runtimekit_contract::parse_pod;
use runtimekit_placement as placement;
use runtimekit_placement::objects::slice_names;
use std::sync::Arc;

impl Feed for Pod {
    const KIND: &'static str = "Pod";
    fn key(&self) -> String {
        self.metadata.uid.clone().unwrap_or_default()
    }
    fn apply(&self, state: &mut State, _now: Now) {
        state.apply_pod(self);
    }
    fn remove(key: &str, state: &mut State, _now: Now) {
        state.delete_pod(key);
    }
    fn known(state: &State) -> Vec<String> {
        state.pod_uids()
    }
    fn synced(state: &mut State) {
        state.pods_synced();
    }
}

impl State {
    /// Applies a pod as the API has it now.
    pub fn apply_pod(&mut self, pod: &Pod) {
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        let spec = pod.spec.as_ref();
        let life = Life::of(pod);
        let ended = life.ended();
        let node = spec
            .and_then(|s| s.node_name.clone())
            .filter(|n| !n.is_empty());
        let ours = spec.and_then(|s| s.scheduler_name.as_deref())
            == Some(self.config.scheduler_name.as_str());
        let request = ours.then(|| parse_pod(pod, &self.config));
        let holding = if ended {
            None
        } else {
            let parsed = request.as_ref().and_then(|r| r.as_ref().ok());
            placement::quota::Holding::of(pod, parsed, &self.names).map(Arc::new)
        };
        let gang = request
            .as_ref()
            .and_then(|r| r.as_ref().ok())
            .and_then(|r| r.gang.clone());
        let recorded = match (&node, ended, ours) {
            (Some(node), false, true) => self.read_recorded(pod, &uid, node, gang.as_ref()),
            _ => None,
        };
        let pending = request
            .filter(|_| node.is_none() && !ended)
            .map(|request| Pending {
                request,
                pod: Arc::new(prune(pod)),
            });
        let was = self.pods.get(&uid);
        let newly_ended = ended && was.is_none_or(|p| !p.life.ended());
        if newly_ended || (recorded.is_none() && was.is_some_and(|p| p.recorded.is_some())) {
            self.hold_only_written_slices(&uid);
        }
        match (&node, ended) {
            (Some(node), false) => match placement::Resources::from_pod(pod, &self.names) {
                Ok(resources) => self.engine.upsert_pod_usage(&uid, node, &resources),
                Err(error) => tracing::warn!(%error, "pod requests cannot be read; not accounted"),
            },
            _ => self.remove_pod_usage(&uid),
        }
        let queue_key = (
            pod.metadata.creation_timestamp.as_ref().map(|t| t.0),
            uid.clone(),
        );
        if pending.is_some() {
            self.pending.insert(queue_key);
        } else {
            // Bound or ended: the room held for it, if it was nominated, is its own or free.
            self.drop_nomination(&uid);
            self.pending.remove(&queue_key);
            // Bound (the binding landed) or ended: once its writes are done too, no decision
            // for it is in flight any more.
            if ended || self.in_flight.get(&uid) == Some(&InFlight::Written) {
                self.in_flight.remove(&uid);
            }
        }
        if ended {
            self.release_slices_of(&uid, node.is_some());
        }
        let record = PodRecord {
            namespace: pod.namespace().unwrap_or_default(),
            name: pod.name_any(),
            uid: uid.clone(),
            node,
            life,
            created: pod.metadata.creation_timestamp.as_ref().map(|t| t.0),
            gang: gang.clone(),
            pending,
            recorded,
            holding,
            priority: spec.and_then(|s| s.priority).unwrap_or(0),
            preempts: spec.and_then(|s| s.preemption_policy.as_deref()) != Some("Never"),
            labels: Arc::new(pod.labels().clone()),
        };
        if let Some(old) = self
            .pods
            .get(&uid)
            .and_then(|p| p.gang.as_ref())
            .filter(|g| Some(*g) != gang.as_ref())
        {
            let key = (record.namespace.clone(), old.name.clone());
            if let Some(members) = self.gang_pods.get_mut(&key) {
                members.remove(&uid);
            }
        }
        if let Some(gang) = &gang {
            self.gang_pods
                .entry((record.namespace.clone(), gang.name.clone()))
                .or_default()
                .insert(uid.clone());
        }
        let recorded = record.recorded.clone();
        let old = self.pods.insert(uid.clone(), record);
        if recorded.is_some() && recorded != old.and_then(|p| p.recorded) {
            self.settle_recorded(&uid);
        }
        self.sync_holding(&uid);
    }

    /// Reads a bound pod's allocation annotation; one that cannot be read is logged and ignored
    /// (the pod's GpuSlices, if any, still account its cards).
    pub(super) fn read_recorded(
        &self,
        pod: &Pod,
        uid: &str,
        node: &str,
        gang: Option<&GangMembership>,
    ) -> Option<Arc<Recorded>> {
        let text = pod.annotations().get(&self.allocation_annotation())?;
        let read = serde_json::from_str::<Allocation>(text)
            .map_err(|e| e.to_string())
            .and_then(|allocation| {
                if allocation.node != node {
                    return Err(format!(
                        "it names node {:?} but the pod is bound to {node:?}",
                        allocation.node
                    ));
                }
                let gang = gang.map(|g| g.name.clone());
                placement::Decision::from_allocation(uid, gang, &allocation)
                    .map(|decision| Recorded {
                        decision,
                        slices: slice_names(&allocation),
                    })
                    .map_err(|e| e.to_string())
            });
        match read {
            Ok(recorded) => Some(Arc::new(recorded)),
            Err(error) => {
                tracing::warn!(pod = %pod.name_any(), %error, "the allocation annotation cannot be read; ignored");
                None
            }
        }
    }

    /// Forgets a deleted pod; its slices are released.
    pub fn delete_pod(&mut self, uid: &str) {
        let removed = self.pods.remove(uid);
        if let Some(gang) = removed.as_ref().and_then(|p| {
            p.gang
                .as_ref()
                .map(|g| (p.namespace.clone(), g.name.clone()))
        }) && let Some(members) = self.gang_pods.get_mut(&gang)
        {
            members.remove(uid);
        }
        let bound = removed.as_ref().is_none_or(|p| p.node.is_some());
        if let Some(record) = &removed {
            self.pending.remove(&(record.created, uid.to_owned()));
        }
        self.hold_only_written_slices(uid);
        self.drop_nomination(uid);
        self.attempts.remove(uid);
        self.in_flight.remove(uid);
        self.sync_holding(uid);
        self.remove_pod_usage(uid);
        self.release_slices_of(uid, bound);
    }

    /// Stops accounting a pod's requests besides cards; what it held is free for waiting pods.
    pub(super) fn remove_pod_usage(&mut self, uid: &str) {
        if self.engine.remove_pod_usage(uid) {
            self.capacity_freed = true;
        }
    }

    /// UIDs of every known pod (to find the ones a re-list no longer shows).
    pub fn pod_uids(&self) -> Vec<String> {
        self.pods.keys().cloned().collect()
    }

    /// Marks the first list of pods complete: slices whose pod is unknown are orphans now.
    pub fn pods_synced(&mut self) {
        self.synced_pods = true;
        let orphans: Vec<(String, String)> = self
            .slices
            .iter()
            .filter(|(_, s)| {
                !s.deleting && self.pods.get(&s.pod_uid).is_none_or(|p| p.life.ended())
            })
            .map(|(k, _)| k.clone())
            .collect();
        self.work.release.extend(orphans);
    }

    /// Marks the slices of an ended pod for release; if the pod was never bound, nothing was
    /// enacted and the operator removes their finalizer too.
    pub(super) fn release_slices_of(&mut self, pod_uid: &str, bound: bool) {
        for key in self.slices_by_pod.get(pod_uid).into_iter().flatten() {
            let Some(slice) = self.slices.get(key) else {
                continue;
            };
            if !slice.deleting {
                self.work.release.insert(key.clone());
            }
            if !bound && slice.finalized {
                self.work
                    .unfinalize
                    .entry(key.clone())
                    .or_insert(Unfinalize::NeverEnacted);
            }
        }
    }

    /// Whether `uid`'s pod is gone or has ended.
    pub(super) fn finished(&self, uid: &str) -> bool {
        self.pods.get(uid).is_none_or(|p| p.life.ended())
    }
}
