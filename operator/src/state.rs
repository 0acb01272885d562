//! The operator's view of the cluster, kept from watch events without I/O: it feeds the placement
//! engine incrementally and tells the scheduler and controllers what needs doing.

use crate::topology::{self, AppliedGroup, DERIVED_LABEL, Position, Tree};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use runtimekit_contract::{ContractError, PodRequest, RuntimeKitConfig, parse_pod};
use runtimekit_crds::{GangGroup, GpuSlice, SLICE_FINALIZER, Tier, TopologyGroup};
use runtimekit_placement::{self as placement, Cluster, Settings};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

/// How long a node agent may go without a heartbeat before its cards are withheld.
/// Agents heartbeat every 30 s by default, so this is three missed beats.
pub const AGENT_STALE_AFTER: Duration = Duration::from_secs(90);

/// What is known about one pod.
#[derive(Debug, Clone)]
pub struct PodRecord {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
    /// The node it is bound to.
    pub node: Option<String>,
    /// Whether it ended (Succeeded, Failed) or is being deleted.
    pub ended: bool,
    /// Whether it runs.
    pub running: bool,
    /// Whether it completed successfully.
    pub succeeded: bool,
    /// Whether it is being deleted or failed.
    pub failed_or_deleted: bool,
    /// When it was created.
    pub created: Option<Timestamp>,
    /// The gang it belongs to (pods of our scheduler only).
    pub gang: Option<runtimekit_contract::GangMembership>,
    /// For pods of our scheduler that are not bound yet: the pod (pruned) and its parsed request.
    pub pending: Option<Pending>,
    /// For bound pods of our scheduler that have not ended: what their allocation annotation
    /// records.
    pub recorded: Option<Arc<Recorded>>,
}

/// What a bound pod's allocation annotation records. It is the truth about the pod's cards: a
/// restarted operator accounts them from it before its first decision, re-creates GpuSlices
/// missing from it, and releases slices of the pod it does not name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// The decision it records.
    pub decision: placement::Decision,
    /// The GpuSlice of each card, in the order of [`placement::Decision::slice_inputs`].
    pub slices: Vec<String>,
}

impl Recorded {
    /// Each card's slice name and the engine's record of the card.
    fn cards(&self) -> impl Iterator<Item = (&String, placement::SliceInput)> {
        self.slices.iter().zip(self.decision.slice_inputs())
    }
}

/// A pod waiting for this scheduler.
#[derive(Debug, Clone)]
pub struct Pending {
    /// The pod, without the fields scheduling never reads.
    pub pod: Arc<Pod>,
    /// The pod's request, or every contract rule it breaks.
    pub request: Result<PodRequest, ContractError>,
}

/// What is known about one GpuSlice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceRecord {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The owning pod's UID.
    pub pod_uid: String,
    /// The container.
    pub container: String,
    /// Which of the container's cards.
    pub replica: u32,
    /// The node.
    pub node: Option<String>,
    /// Whether deletion has begun.
    pub deleting: bool,
    /// Whether the node agent's finalizer is still on it.
    pub finalized: bool,
    /// The allocation it records, as the engine reads it.
    pub input: Option<placement::SliceInput>,
    /// The RDMA NICs it records for its container.
    pub nics: Vec<String>,
}

/// Work the controllers must do, found while applying events.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Work {
    /// Slices to delete: their pod ended or is gone (namespace, name).
    pub release: BTreeSet<(String, String)>,
    /// Slices whose finalizer the operator removes itself, because no agent will: their node is
    /// gone, or their pod was never bound so nothing was enacted (namespace, name).
    pub unfinalize: BTreeSet<(String, String)>,
}

/// The operator's state.
#[derive(Debug)]
pub struct State {
    /// The placement engine.
    pub engine: Cluster,
    /// The shared configuration.
    pub config: RuntimeKitConfig,
    names: runtimekit_contract::ResourceNames,
    pods: HashMap<String, PodRecord>,
    slices: HashMap<(String, String), SliceRecord>,
    slices_by_pod: HashMap<String, BTreeSet<(String, String)>>,
    nodes: BTreeMap<String, placement::NodeInfo>,
    node_groups: BTreeMap<String, NodeGroup>,
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
    derived_groups: BTreeMap<String, runtimekit_crds::TopologyGroupStatus>,
    /// Member pods of each gang, by (namespace, gang name).
    gang_pods: BTreeMap<(String, String), BTreeSet<String>>,
    /// Decided pods whose writes are running or that the watch does not show bound yet, by
    /// UID, with whether the writes are done.
    in_flight: HashMap<String, bool>,
    /// GpuSlices the apiserver accepted that the watch does not show yet, with the card each
    /// holds: they count as there, so they are neither re-created nor handed out again.
    created_unseen: HashMap<(String, String), Option<placement::SliceInput>>,
    /// Bound pods whose allocation may name GpuSlices that do not exist, by UID, with when to
    /// look (`None`: now) and how many re-creations failed in a row.
    restore: HashMap<String, (Option<std::time::Instant>, u32)>,
    /// Whether capacity may have been freed or added since the scheduler last looked.
    capacity_freed: bool,
    /// Retry bookkeeping of pods that did not fit, by UID.
    attempts: HashMap<String, Attempts>,
}

/// A node-tier TopologyGroup, as far as the state needs it.
#[derive(Debug, Clone)]
struct NodeGroup {
    node: String,
    heartbeat: Option<Timestamp>,
    parent: Option<String>,
    capacity: runtimekit_crds::TopologyCapacity,
    stale_reported: bool,
    /// A hash of the cards and NICs last given to the engine.
    devices: u64,
}

/// What the TopologyGroup controller must write.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TopologyPlan {
    /// Derived groups to create or update: (name, tier, parent).
    pub derived: Vec<(String, Tier, Option<String>)>,
    /// Derived groups no node names any more.
    pub obsolete: Vec<String>,
    /// Node-tier groups whose parent must change: (group, parent).
    pub parents: Vec<(String, Option<String>)>,
    /// Higher-tier groups' status: (name, member nodes, aggregate capacity).
    pub status: Vec<(String, Vec<String>, runtimekit_crds::TopologyCapacity)>,
    /// Node-tier groups whose agent's reporting changed: (group, reporting).
    pub reporting: Vec<(String, bool)>,
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
        }
    }

    /// Whether capacity may have been freed or added since the last call (a slice or pod gone,
    /// a node changed, an agent reporting again), so pods that did not fit should try again.
    pub fn take_capacity_freed(&mut self) -> bool {
        std::mem::take(&mut self.capacity_freed)
    }

    /// Takes the controller work found so far.
    pub fn take_work(&mut self) -> Work {
        std::mem::take(&mut self.work)
    }

    /// The pods waiting to be placed, oldest first (kept in order, so no pass sorts them).
    pub fn pending(&self) -> impl Iterator<Item = &PodRecord> {
        self.pending
            .iter()
            .filter_map(|(_, uid)| self.pods.get(uid))
    }

    /// How many pods wait to be placed.
    pub fn pending_count(&self) -> usize {
        self.pending.len()
    }

    /// One pod, by UID.
    pub fn pod(&self, uid: &str) -> Option<&PodRecord> {
        self.pods.get(uid)
    }

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

    /// The GangGroup of (namespace, name), if it exists.
    pub fn gang(&self, namespace: &str, name: &str) -> Option<&Arc<GangGroup>> {
        self.gangs.get(&(namespace.to_owned(), name.to_owned()))
    }

    /// Every GangGroup.
    pub fn gangs(&self) -> impl Iterator<Item = &Arc<GangGroup>> {
        self.gangs.values()
    }

    /// The topology tree derived from node labels and applied groups.
    pub fn tree(&self) -> &Tree {
        &self.tree
    }

    /// Applies a pod as the API has it now.
    pub fn apply_pod(&mut self, pod: &Pod) {
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        let spec = pod.spec.as_ref();
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        let ended = pod.metadata.deletion_timestamp.is_some()
            || matches!(phase, Some("Succeeded" | "Failed"));
        let node = spec
            .and_then(|s| s.node_name.clone())
            .filter(|n| !n.is_empty());
        let ours = spec.and_then(|s| s.scheduler_name.as_deref())
            == Some(self.config.scheduler_name.as_str());
        let request = ours.then(|| parse_pod(pod, &self.config));
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
        let newly_ended = ended && was.is_none_or(|p| !p.ended);
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
            self.pending.remove(&queue_key);
            // Bound (the binding landed) or ended: once its writes are done too, no decision
            // for it is in flight any more.
            if ended || self.in_flight.get(&uid) == Some(&true) {
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
            ended,
            running: phase == Some("Running"),
            succeeded: phase == Some("Succeeded"),
            failed_or_deleted: pod.metadata.deletion_timestamp.is_some() || phase == Some("Failed"),
            created: pod.metadata.creation_timestamp.as_ref().map(|t| t.0),
            gang: gang.clone(),
            pending,
            recorded,
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
    }

    /// Reads a bound pod's allocation annotation; one that cannot be read is logged and ignored
    /// (the pod's GpuSlices, if any, still account its cards).
    fn read_recorded(
        &self,
        pod: &Pod,
        uid: &str,
        node: &str,
        gang: Option<&runtimekit_contract::GangMembership>,
    ) -> Option<Arc<Recorded>> {
        let key = runtimekit_contract::allocation::annotation(&self.config.resource_prefix);
        let text = pod.annotations().get(&key)?;
        let read = serde_json::from_str::<runtimekit_contract::allocation::Allocation>(text)
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
                        slices: crate::scheduler::slice_names(&allocation),
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

    /// Keeps a bound pod's cards as its allocation records them: each card is accounted (the
    /// annotation wins over a slice that disagrees with it), slices of the pod it does not name
    /// are released, and named slices that do not exist are queued to be re-created, unless the
    /// pod's own writes are still running.
    fn settle_recorded(&mut self, uid: &str) {
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
            self.restore.entry(uid.to_owned()).or_insert((None, 0));
        }
    }

    /// From now on `uid`'s cards are held by the slices it wrote alone (those the watch shows and
    /// those written but not shown yet), until they are released: for a pod that ended, is gone,
    /// lost its allocation annotation, or whose binding failed. While its writes still run this
    /// waits; they call it again when they end.
    fn hold_only_written_slices(&mut self, uid: &str) {
        self.restore.remove(uid);
        if self.in_flight.get(uid) == Some(&false) {
            return;
        }
        if self.engine.release(uid) {
            self.capacity_freed = true;
        }
        self.keep_written_slices(uid);
    }

    /// Whether `uid`'s pod is gone or has ended.
    fn finished(&self, uid: &str) -> bool {
        self.pods.get(uid).is_none_or(|p| p.ended)
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
    pub fn restore_due(&mut self, now: std::time::Instant) -> Vec<GpuSlice> {
        let due: Vec<String> = self
            .restore
            .iter()
            .filter(|(_, (next, _))| next.is_none_or(|t| t <= now))
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
    pub fn restored(&mut self, uid: &str, created: bool, now: std::time::Instant) {
        if created {
            self.restore.remove(uid);
            return;
        }
        let entry = self.restore.entry(uid.to_owned()).or_insert((None, 0));
        entry.1 += 1;
        let delay = Duration::from_secs(1)
            .saturating_mul(1 << entry.1.min(6))
            .min(MAX_BACKOFF);
        entry.0 = Some(now + delay);
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
        crate::scheduler::slice_objects(
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

    /// The gangs that have member pods, by (namespace, name).
    pub fn gangs_with_members(&self) -> Vec<(String, String)> {
        self.gang_pods
            .iter()
            .filter(|(_, m)| !m.is_empty())
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// The member pods of a gang that count: running, pending or completed successfully (a
    /// failed or deleted member is being replaced by its controller).
    pub fn gang_members(&self, namespace: &str, name: &str) -> Vec<&PodRecord> {
        let key = (namespace.to_owned(), name.to_owned());
        self.gang_pods
            .get(&key)
            .into_iter()
            .flatten()
            .filter_map(|uid| self.pods.get(uid))
            .filter(|p| !p.failed_or_deleted)
            .collect()
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
        self.attempts.remove(uid);
        self.in_flight.remove(uid);
        self.remove_pod_usage(uid);
        self.release_slices_of(uid, bound);
    }

    /// Stops accounting a pod's requests besides cards; what it held is free for waiting pods.
    fn remove_pod_usage(&mut self, uid: &str) {
        if self.engine.remove_pod_usage(uid) {
            self.capacity_freed = true;
        }
    }

    /// UIDs of every known pod (to find the ones a re-list no longer shows).
    pub fn pod_uids(&self) -> Vec<String> {
        self.pods.keys().cloned().collect()
    }

    /// Marks the slices of an ended pod for release; if the pod was never bound, nothing was
    /// enacted and the operator removes their finalizer too.
    fn release_slices_of(&mut self, pod_uid: &str, bound: bool) {
        for key in self.slices_by_pod.get(pod_uid).into_iter().flatten() {
            let Some(slice) = self.slices.get(key) else {
                continue;
            };
            if !slice.deleting {
                self.work.release.insert(key.clone());
            }
            if !bound && slice.finalized {
                self.work.unfinalize.insert(key.clone());
            }
        }
    }

    /// Applies a GpuSlice. Its capacity stays taken until the object is gone, so an instance still
    /// being destroyed is never handed out again.
    pub fn apply_slice(&mut self, slice: &GpuSlice) {
        let key = (slice.namespace().unwrap_or_default(), slice.name_any());
        let record = SliceRecord {
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
        };
        let mut record = record;
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
        let pod_alive = self.pods.get(&record.pod_uid).is_some_and(|p| !p.ended);
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
            self.work.unfinalize.insert(key.clone());
        }
        self.slices_by_pod
            .entry(record.pod_uid.clone())
            .or_default()
            .insert(key.clone());
        self.created_unseen.remove(&key);
        let pod_uid = record.pod_uid.clone();
        self.slices.insert(key, record);
        if recorded.is_some() {
            self.settle_recorded(&pod_uid);
        }
    }

    /// Forgets a GpuSlice that is gone; only now does its capacity return.
    pub fn delete_slice(&mut self, namespace: &str, name: &str) {
        let key = (namespace.to_owned(), name.to_owned());
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
        if !queued && let Some(entry) = self.restore.get_mut(&record.pod_uid) {
            entry.0 = Some(std::time::Instant::now() + RESTORE_GRACE);
        }
    }
}

impl State {
    /// Marks the first list of pods complete: slices whose pod is unknown are orphans now.
    pub fn pods_synced(&mut self) {
        self.synced_pods = true;
        let orphans: Vec<(String, String)> = self
            .slices
            .iter()
            .filter(|(_, s)| !s.deleting && self.pods.get(&s.pod_uid).is_none_or(|p| p.ended))
            .map(|(k, _)| k.clone())
            .collect();
        self.work.release.extend(orphans);
    }

    /// Keys of every known slice.
    pub fn slice_keys(&self) -> Vec<(String, String)> {
        self.slices.keys().cloned().collect()
    }

    /// Applies a node.
    pub fn apply_node(&mut self, node: &Node) {
        let mut info =
            match placement::NodeInfo::from_node(node, &self.names, &self.config.topology_labels) {
                Ok(info) => info,
                Err(error) => {
                    tracing::warn!(%error, "node cannot be read; it is not offered");
                    return;
                }
            };
        let name = info.name.clone();
        info.position =
            network_position(&self.tree.positions.get(&name).cloned().unwrap_or_default());
        let labels_changed = self
            .nodes
            .get(&name)
            .is_none_or(|old| old.labels != info.labels);
        if labels_changed {
            self.tree_dirty = true;
        }
        if self.nodes.get(&name) != Some(&info) {
            self.capacity_freed = true;
            self.engine.upsert_node(info.clone());
        }
        self.nodes.insert(name, info);
    }

    /// Forgets a deleted node; slices on it can no longer be released by its agent.
    pub fn delete_node(&mut self, name: &str) {
        self.nodes.remove(name);
        self.engine.remove_node(name);
        self.tree_dirty = true;
        let stranded: Vec<(String, String)> = self
            .slices
            .iter()
            .filter(|(_, s)| s.deleting && s.finalized && s.node.as_deref() == Some(name))
            .map(|(k, _)| k.clone())
            .collect();
        self.work.unfinalize.extend(stranded);
    }

    /// Names of every known node.
    pub fn node_names(&self) -> Vec<String> {
        self.nodes.keys().cloned().collect()
    }

    /// Applies a TopologyGroup: a node-tier group carries the node's cards, NICs and heartbeat;
    /// an administrator's higher-tier group places its members.
    pub fn apply_group(&mut self, group: &TopologyGroup, now: Timestamp) {
        let name = group.name_any();
        if group.spec.tier == Tier::Node {
            let Some(node) = group.spec.node_name.clone() else {
                return;
            };
            let status = group.status.clone().unwrap_or_default();
            let cards: Vec<placement::CardInfo> = status
                .cards
                .iter()
                .map(placement::CardInfo::from_status)
                .collect();
            let nics: Vec<placement::NicInfo> = status
                .nics
                .iter()
                .map(placement::NicInfo::from_status)
                .collect();
            // Heartbeats rewrite the status every few seconds; the devices rarely change.
            let devices = devices_hash(&status.cards, &status.nics);
            if self
                .node_groups
                .get(&name)
                .is_none_or(|g| g.devices != devices)
            {
                self.engine.set_devices(&node, &cards, &nics);
            }
            let heartbeat = status.heartbeat_time.map(|t| t.0);
            let reporting = fresh(heartbeat, now);
            let was_reporting = self
                .node_groups
                .get(&name)
                .is_some_and(|g| fresh(g.heartbeat, now));
            if reporting && !was_reporting {
                self.capacity_freed = true;
            }
            self.engine.set_agent_reporting(&node, reporting);
            let stale_reported = self
                .node_groups
                .get(&name)
                .is_some_and(|g| g.stale_reported);
            let capacity = status.capacity.clone().unwrap_or_default();
            self.node_groups.insert(
                name,
                NodeGroup {
                    node,
                    heartbeat,
                    parent: group.spec.parent.clone(),
                    capacity,
                    stale_reported,
                    devices,
                },
            );
            return;
        }
        let derived = group
            .labels()
            .get(DERIVED_LABEL)
            .is_some_and(|v| v == "true");
        if derived {
            self.derived_groups
                .insert(name, group.status.clone().unwrap_or_default());
            return;
        }
        let applied = AppliedGroup {
            name: name.clone(),
            tier: group.spec.tier,
            parent: group.spec.parent.clone(),
            members: group.spec.members.clone().unwrap_or_default(),
        };
        if self.applied_groups.get(&name) != Some(&applied) {
            self.applied_groups.insert(name, applied);
            self.tree_dirty = true;
        }
    }

    /// Forgets a deleted TopologyGroup.
    pub fn delete_group(&mut self, name: &str) {
        self.derived_groups.remove(name);
        if let Some(group) = self.node_groups.remove(name) {
            self.engine.set_devices(&group.node, &[], &[]);
            self.engine.set_agent_reporting(&group.node, false);
        }
        if self.applied_groups.remove(name).is_some() {
            self.tree_dirty = true;
        }
    }

    /// Names of every known TopologyGroup.
    pub fn group_names(&self) -> Vec<String> {
        self.node_groups
            .keys()
            .chain(self.applied_groups.keys())
            .chain(self.derived_groups.keys())
            .cloned()
            .collect()
    }

    /// What the TopologyGroup controller must write to make the API match the tree, the
    /// aggregate capacities and the agents' reporting.
    pub fn topology_plan(&mut self, now: Timestamp) -> TopologyPlan {
        let mut plan = TopologyPlan::default();
        for group in self.tree.derived.values() {
            plan.derived
                .push((group.name.clone(), group.tier, group.parent.clone()));
        }
        plan.obsolete = self
            .derived_groups
            .keys()
            .filter(|n| !self.tree.derived.contains_key(*n))
            .cloned()
            .collect();
        let mut members: BTreeMap<String, (Vec<String>, runtimekit_crds::TopologyCapacity)> =
            BTreeMap::new();
        for (name, group) in &mut self.node_groups {
            let position = self
                .tree
                .positions
                .get(&group.node)
                .cloned()
                .unwrap_or_default();
            let parent = position
                .hyper_node
                .clone()
                .or(position.leaf_switch.clone())
                .or(position.network_pod.clone());
            if group.parent != parent {
                plan.parents.push((name.clone(), parent));
            }
            let reporting = fresh(group.heartbeat, now);
            if group.stale_reported == reporting {
                group.stale_reported = !reporting;
                plan.reporting.push((name.clone(), reporting));
            }
            for tier_group in [
                &position.hyper_node,
                &position.leaf_switch,
                &position.network_pod,
            ]
            .into_iter()
            .flatten()
            {
                let entry = members.entry(tier_group.clone()).or_default();
                entry.0.push(group.node.clone());
                let c = &group.capacity;
                entry.1.nodes += 1;
                entry.1.cards += c.cards;
                entry.1.healthy_cards += c.healthy_cards;
                entry.1.free_cards += c.free_cards;
                entry.1.mig_cards += c.mig_cards;
            }
        }
        let higher: BTreeSet<&String> = self
            .tree
            .derived
            .keys()
            .chain(self.applied_groups.keys())
            .collect();
        for name in higher {
            let (nodes, capacity) = members.remove(name).unwrap_or_default();
            let current = self.derived_groups.get(name.as_str());
            if current.is_none_or(|s| s.nodes != nodes || s.capacity.as_ref() != Some(&capacity)) {
                plan.status.push((name.clone(), nodes, capacity));
            }
        }
        plan
    }

    /// Withholds the cards of nodes whose agent stopped reporting, and offers them again when it
    /// resumes. Returns the node groups that are stale now.
    pub fn refresh_heartbeats(&mut self, now: Timestamp) -> Vec<String> {
        let mut stale = Vec::new();
        for (name, group) in &self.node_groups {
            let reporting = fresh(group.heartbeat, now);
            self.engine.set_agent_reporting(&group.node, reporting);
            if !reporting {
                stale.push(name.clone());
            }
        }
        stale
    }

    /// Recomputes the topology tree if node labels or applied groups changed, and moves the
    /// nodes whose position changed.
    pub fn refresh_topology(&mut self) -> bool {
        if !self.tree_dirty {
            return false;
        }
        self.tree_dirty = false;
        let applied: Vec<AppliedGroup> = self.applied_groups.values().cloned().collect();
        let tree = topology::build(
            self.nodes
                .iter()
                .map(|(n, info)| (n.as_str(), &info.labels)),
            &applied,
            &self.config.topology_labels,
        );
        for (name, info) in &mut self.nodes {
            let position = network_position(&tree.positions.get(name).cloned().unwrap_or_default());
            if info.position != position {
                info.position = position;
                self.engine.upsert_node(info.clone());
            }
        }
        self.tree = tree;
        true
    }

    /// Applies a GangGroup.
    pub fn apply_gang(&mut self, gang: &GangGroup) {
        let key = (gang.namespace().unwrap_or_default(), gang.name_any());
        self.gangs.insert(key, Arc::new(gang.clone()));
    }

    /// Forgets a deleted GangGroup.
    pub fn delete_gang(&mut self, namespace: &str, name: &str) {
        self.gangs.remove(&(namespace.to_owned(), name.to_owned()));
    }

    /// Keys of every known GangGroup.
    pub fn gang_keys(&self) -> Vec<(String, String)> {
        self.gangs.keys().cloned().collect()
    }
}

fn devices_hash(cards: &[runtimekit_crds::CardStatus], nics: &[runtimekit_crds::NicStatus]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    serde_json::to_string(&(cards, nics))
        .unwrap_or_default()
        .hash(&mut hasher);
    hasher.finish()
}

fn fresh(heartbeat: Option<Timestamp>, now: Timestamp) -> bool {
    let stale_after = i64::try_from(AGENT_STALE_AFTER.as_secs()).unwrap_or(i64::MAX);
    heartbeat.is_some_and(|t| now.as_second().saturating_sub(t.as_second()) <= stale_after)
}

/// The network pod of nodes that name none: without topology labels the whole cluster is one
/// domain, so gangs can still span nodes.
pub const IMPLICIT_NETWORK_POD: &str = "cluster";

fn network_position(position: &Position) -> placement::NetworkPosition {
    placement::NetworkPosition {
        hyper_node: position.hyper_node.clone(),
        leaf_switch: position.leaf_switch.clone(),
        network_pod: Some(
            position
                .network_pod
                .clone()
                .unwrap_or_else(|| IMPLICIT_NETWORK_POD.into()),
        ),
    }
}

/// A copy of a pending pod with what scheduling never reads removed (managed fields, container
/// commands, env, volumes, probes, status), to keep the cache small.
fn prune(pod: &Pod) -> Pod {
    let mut pod = pod.clone();
    pod.metadata.managed_fields = None;
    pod.status = None;
    if let Some(spec) = pod.spec.as_mut() {
        spec.volumes = None;
        for container in spec
            .containers
            .iter_mut()
            .chain(spec.init_containers.iter_mut().flatten())
        {
            container.command = None;
            container.args = None;
            container.env = None;
            container.env_from = None;
            container.volume_mounts = None;
            container.liveness_probe = None;
            container.readiness_probe = None;
            container.startup_probe = None;
            container.lifecycle = None;
        }
    }
    pod
}

/// What the scheduler should do with one pending pod.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// Bind it as decided (the engine has taken the capacity).
    Bind(Box<Binding>),
    /// It does not fit; report why if the message changed.
    Unschedulable {
        /// The aggregated reason.
        message: String,
        /// Whether it differs from the last report for this pod.
        changed: bool,
    },
    /// It breaks the resource contract; report once.
    Invalid {
        /// Every broken rule.
        message: String,
        /// A stable reason.
        reason: &'static str,
        /// Whether it was not reported yet.
        changed: bool,
    },
    /// Nothing to do (gone, bound, in flight, or a gang member the gang controller places).
    Skip,
}

/// A decided pod and what it takes to bind it.
#[derive(Debug, Clone)]
pub struct Binding {
    /// The pod, as cached.
    pub pod: Arc<Pod>,
    /// Where it goes.
    pub decision: placement::Decision,
    /// Warnings the contract raised, to report once.
    pub warnings: Vec<runtimekit_contract::Warning>,
    /// The annotation the allocation goes into.
    pub annotation: String,
}

/// Retry bookkeeping of one pod.
#[derive(Debug, Clone)]
struct Attempts {
    count: u32,
    next: std::time::Instant,
    reported: Option<String>,
    /// The pod breaks the contract: only replacing it helps, so freed capacity does not hurry it.
    broken: bool,
}

/// How long a slice deleted under a live bound pod waits before it is re-created.
pub const RESTORE_GRACE: Duration = Duration::from_secs(5);

/// The longest a pod waits between attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

impl State {
    /// Pending pods (not in flight, not gang members) whose backoff has passed, oldest first.
    pub fn ready(&self, now: std::time::Instant, limit: usize) -> Vec<String> {
        self.pending()
            .filter(|p| !self.in_flight.contains_key(&p.uid))
            .filter(|p| {
                !p.pending
                    .as_ref()
                    .is_some_and(|pending| pending.request.as_ref().is_ok_and(|r| r.gang.is_some()))
            })
            .filter(|p| self.attempts.get(&p.uid).is_none_or(|a| a.next <= now))
            .take(limit)
            .map(|p| p.uid.clone())
            .collect()
    }

    /// When the earliest backed-off pod becomes ready again.
    pub fn next_retry(&self) -> Option<std::time::Instant> {
        self.attempts
            .iter()
            .filter(|(uid, _)| self.pods.get(*uid).is_some_and(|p| p.pending.is_some()))
            .map(|(_, a)| a.next)
            .min()
    }

    /// Lets every backed-off pod try again soon: capacity was freed or a node appeared.
    pub fn retry_soon(&mut self, now: std::time::Instant) {
        for attempts in self.attempts.values_mut().filter(|a| !a.broken) {
            attempts.next = attempts.next.min(now + Duration::from_millis(200));
        }
    }

    fn back_off(&mut self, uid: &str, now: std::time::Instant, message: &str) -> bool {
        let attempts = self.attempts.entry(uid.to_owned()).or_insert(Attempts {
            count: 0,
            next: now,
            reported: None,
            broken: false,
        });
        attempts.count += 1;
        let delay = Duration::from_secs(1)
            .saturating_mul(1 << attempts.count.min(6))
            .min(MAX_BACKOFF);
        attempts.next = now + delay;
        let changed = attempts.reported.as_deref() != Some(message);
        attempts.reported = Some(message.to_owned());
        changed
    }

    /// Backs off a pod that breaks the contract: it only changes by being replaced, so it is
    /// retried rarely and never hurried by freed capacity.
    fn back_off_broken(&mut self, uid: &str, now: std::time::Instant, message: &str) -> bool {
        let changed = self.back_off(uid, now, message);
        if let Some(attempts) = self.attempts.get_mut(uid) {
            attempts.next = now + MAX_BACKOFF;
            attempts.broken = true;
        }
        changed
    }

    /// Decides one pending pod. A decided pod's capacity is taken at once (assumed) so the next
    /// decision sees it, and the pod is in flight until the watch shows it bound (or gone), or
    /// until [`State::bind_failed`].
    pub fn schedule(&mut self, uid: &str, now: std::time::Instant) -> Outcome {
        let Some(record) = self.pods.get(uid) else {
            return Outcome::Skip;
        };
        let Some(pending) = record.pending.clone() else {
            return Outcome::Skip;
        };
        if self.in_flight.contains_key(uid) {
            return Outcome::Skip;
        }
        let request = match &pending.request {
            Ok(request) if request.gang.is_some() => return Outcome::Skip,
            Ok(request) => request.clone(),
            Err(error) => {
                let message = error.to_string();
                let changed = self.back_off_broken(uid, now, &message);
                return Outcome::Invalid {
                    message,
                    reason: error.reason(),
                    changed,
                };
            }
        };
        let input = match placement::PodInput::from_pod(&pending.pod, &request, &self.names) {
            Ok(input) => input,
            Err(error) => {
                let message = error.to_string();
                let changed = self.back_off_broken(uid, now, &message);
                return Outcome::Invalid {
                    message,
                    reason: "InvalidPod",
                    changed,
                };
            }
        };
        // Slices of a pod that is not bound are left by an interrupted binding. A complete set
        // means its Binding may have been posted already: bind to exactly those slices (posting
        // it again is harmless). An incomplete set means it was not (the Binding comes after the
        // last slice), so they are removed, finalizer included, and the pod decided afresh.
        let leftovers: Vec<SliceRecord> = self.slices_of(uid).into_iter().cloned().collect();
        if leftovers.iter().any(|s| s.deleting) {
            // Still holding the cards of slices being removed: wait until they are gone.
            return Outcome::Skip;
        }
        if !leftovers.is_empty() {
            let wanted: u32 = request.containers.iter().map(|c| c.cards.cards()).sum();
            if let Some(decision) =
                resumed_decision(&input, &leftovers).filter(|_| leftovers.len() == wanted as usize)
            {
                self.in_flight.insert(uid.to_owned(), false);
                let annotation =
                    runtimekit_contract::allocation::annotation(&self.config.resource_prefix);
                return Outcome::Bind(Box::new(Binding {
                    pod: pending.pod,
                    decision,
                    warnings: Vec::new(),
                    annotation,
                }));
            }
            for slice in leftovers {
                let key = (slice.namespace, slice.name);
                self.work.release.insert(key.clone());
                self.work.unfinalize.insert(key);
            }
            return Outcome::Skip;
        }
        match self.engine.decide(&input) {
            Ok(decision) => match self.engine.commit(&decision) {
                Ok(()) => {
                    self.in_flight.insert(uid.to_owned(), false);
                    let annotation =
                        runtimekit_contract::allocation::annotation(&self.config.resource_prefix);
                    Outcome::Bind(Box::new(Binding {
                        pod: pending.pod,
                        decision,
                        warnings: request.warnings,
                        annotation,
                    }))
                }
                Err(error) => {
                    let message = error.to_string();
                    let changed = self.back_off(uid, now, &message);
                    Outcome::Unschedulable { message, changed }
                }
            },
            Err(unschedulable) => {
                let message = unschedulable.to_string();
                let changed = self.back_off(uid, now, &message);
                Outcome::Unschedulable { message, changed }
            }
        }
    }

    /// The binding of `uid` was accepted and its writes are done. The pod stays in flight until
    /// the watch shows it bound, so it is never decided a second time in between.
    pub fn bound(&mut self, uid: &str) {
        self.attempts.remove(uid);
        if self.finished(uid) {
            // The pod ended or was deleted while its writes ran.
            self.in_flight.remove(uid);
            self.hold_only_written_slices(uid);
        } else if self.pods.get(uid).is_some_and(|p| p.pending.is_none()) {
            self.in_flight.remove(uid);
            // Slices whose writes failed are re-created from the allocation.
            self.settle_recorded(uid);
        } else if let Some(done) = self.in_flight.get_mut(uid) {
            *done = true;
        }
    }

    /// Whether the writes of any decision are still running.
    pub fn writes_running(&self) -> bool {
        self.in_flight.values().any(|done| !done)
    }

    /// Whether a decision for `uid` is being written or waits for the watch to show it bound.
    pub fn in_flight(&self, uid: &str) -> bool {
        self.in_flight.contains_key(uid)
    }

    /// The binding of `uid` failed: its capacity returns and it retries after a backoff.
    pub fn bind_failed(&mut self, uid: &str, now: std::time::Instant, message: &str) -> bool {
        self.in_flight.remove(uid);
        if self.finished(uid) {
            self.hold_only_written_slices(uid);
            return false;
        }
        if self.pods.get(uid).is_some_and(|p| p.node.is_some()) {
            // The pod is bound all the same (an earlier try landed): what it records counts.
            self.settle_recorded(uid);
            return false;
        }
        self.hold_only_written_slices(uid);
        self.back_off(uid, now, message)
    }

    /// Slices a pod's attempts did write hold their cards until they are gone, whether or not
    /// the watch shows them yet.
    fn keep_written_slices(&mut self, uid: &str) {
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
}

/// A gang's members as decided, ready to be written.
#[derive(Debug, Clone)]
pub struct GangBinding {
    /// Each member's pod and decision.
    pub members: Vec<(Arc<Pod>, placement::Decision)>,
    /// Where the gang went.
    pub placement: runtimekit_crds::GangPlacement,
    /// The annotation the allocations go into.
    pub annotation: String,
}

impl State {
    /// The engine's key of a gang.
    pub fn gang_key(namespace: &str, name: &str) -> String {
        format!("{namespace}/{name}")
    }

    /// Decides and reserves a gang's pending members in one decision, all or nothing. On
    /// success the members are in flight until bound or rolled back.
    pub fn reserve_gang(
        &mut self,
        namespace: &str,
        name: &str,
        highest_tier: Tier,
    ) -> Result<GangBinding, String> {
        let names = self.names.clone();
        let mut members = Vec::new();
        let mut inputs = Vec::new();
        for record in self.gang_members(namespace, name) {
            let Some(pending) = record
                .pending
                .as_ref()
                .filter(|_| !self.in_flight(&record.uid))
            else {
                continue;
            };
            let request = pending
                .request
                .as_ref()
                .map_err(|e| format!("member {}: {e}", record.name))?;
            let input = placement::PodInput::from_pod(&pending.pod, request, &names)
                .map_err(|e| format!("member {}: {e}", record.name))?;
            members.push(Arc::clone(&pending.pod));
            inputs.push(input);
        }
        let mut constraint = placement::GangConstraint::new(State::gang_key(namespace, name));
        constraint.highest_tier = highest_tier;
        let decision = self
            .engine
            .decide_gang(&inputs, &constraint)
            .map_err(|u| u.to_string())?;
        self.engine
            .reserve_gang(&decision)
            .map_err(|e| e.to_string())?;
        let placement = decision.placement();
        let mut bound = Vec::new();
        for pod in members {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            if let Some(d) = decision.members.iter().find(|d| d.pod_uid == uid) {
                self.in_flight.insert(uid, false);
                bound.push((pod, d.clone()));
            }
        }
        let annotation = runtimekit_contract::allocation::annotation(&self.config.resource_prefix);
        Ok(GangBinding {
            members: bound,
            placement,
            annotation,
        })
    }

    /// Every member of a reserved gang is bound: the reservation becomes ordinary allocations.
    pub fn gang_bound(&mut self, namespace: &str, name: &str, uids: &[String]) {
        self.engine.confirm_gang(&State::gang_key(namespace, name));
        for uid in uids {
            self.bound(uid);
        }
    }

    /// Rolls a gang's reservation back.
    pub fn gang_rolled_back(&mut self, namespace: &str, name: &str, uids: &[String]) {
        self.engine.release_gang(&State::gang_key(namespace, name));
        for uid in uids {
            self.in_flight.remove(uid);
            self.keep_written_slices(uid);
        }
    }
}

/// The decision an interrupted binding had made, rebuilt from the slices it wrote.
fn resumed_decision(
    input: &placement::PodInput,
    slices: &[SliceRecord],
) -> Option<placement::Decision> {
    let node = slices.first()?.input.as_ref()?.node.clone();
    let mut containers: Vec<placement::ContainerPlacement> = Vec::new();
    for slice in slices {
        let card = slice.input.as_ref().filter(|i| i.node == node)?;
        let placement_card = placement::CardPlacement {
            index: card.card_index,
            uuid: card.card_uuid.clone(),
            replica: card.replica,
            share: card.share.clone(),
        };
        match containers
            .iter_mut()
            .find(|c| c.container == card.container)
        {
            Some(c) => c.cards.push(placement_card),
            None => containers.push(placement::ContainerPlacement {
                container: card.container.clone(),
                cards: vec![placement_card],
                nics: Vec::new(),
                locality: None,
            }),
        }
        if !slice.nics.is_empty()
            && let Some(c) = containers
                .iter_mut()
                .find(|c| c.container == card.container)
        {
            c.nics = slice.nics.clone();
        }
    }
    for c in &mut containers {
        c.cards.sort_by_key(|card| card.replica);
    }
    Some(placement::Decision {
        pod_uid: input.uid.clone(),
        node,
        containers,
        resources: input.resources.clone(),
        gang: input.gang.clone(),
    })
}
