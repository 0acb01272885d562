//! The cluster state: nodes, devices, allocations and the indexes over them, updated
//! incrementally; and applying decisions to it.

use crate::index::{CardEntry, Entries, Indexes, WholeSet};
use crate::intern::{Interner, Sym};
use crate::mig_cache::MigCache;
use crate::model::{CardInfo, Decision, NicInfo, NodeInfo, Resources, Settings, SliceInput};
use crate::place::{key8, key64, tdm_row};
use crate::state::{
    Amounts, CardUse, NodeId, NodeState, PodRecord, PodSlot, SliceRec, Spec, Summary, SwitchedBy,
    VendorFilter, build_devices, flag, summarize,
};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

/// Why a decision or reservation could not be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommitError {
    /// The decision names a node the engine does not know.
    #[error("node {0} is not known")]
    UnknownNode(String),
    /// The pod already holds allocations.
    #[error("pod {0} already holds allocations")]
    AlreadyPlaced(String),
    /// The decision names a card the node does not have.
    #[error("node {node} has no card {index} with UUID {uuid}")]
    UnknownCard {
        /// The node.
        node: String,
        /// The card's index.
        index: u32,
        /// The card's UUID.
        uuid: String,
    },
    /// The card changed since the decision and cannot take its share.
    #[error("card {index} of node {node} cannot take the allocation: {why}")]
    CardRefused {
        /// The node.
        node: String,
        /// The card's index.
        index: u32,
        /// Why.
        why: String,
    },
    /// The gang already holds a reservation.
    #[error("gang {0} already holds a reservation")]
    GangReserved(String),
}

/// A node's position in the topology tree, one part per tier from the widest. A tier's label
/// counts only when every wider tier is labelled too; an unlabelled tier makes the node a group
/// of its own there.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Part {
    Named(Arc<str>),
    Solo,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct TopoKey {
    pub parts: [Part; 3],
    pub name: Arc<str>,
    pub id: NodeId,
}

/// The placement engine's view of the cluster: nodes, cards, NICs, allocations and gang
/// reservations, kept up to date incrementally, and the decisions made from it.
#[derive(Debug)]
pub struct Cluster {
    pub(crate) settings: Settings,
    pub(crate) interner: Interner,
    /// A slab: vacant slots hold an empty node and are reused.
    pub(crate) nodes: Vec<NodeState>,
    pub(crate) summaries: Vec<Summary>,
    pub(crate) entries: Vec<Entries>,
    pub(crate) topo_keys: Vec<Option<TopoKey>>,
    free_nodes: Vec<NodeId>,
    pub(crate) by_name: BTreeMap<Arc<str>, NodeId>,
    pub(crate) known: usize,
    pub(crate) pods: Vec<PodRecord>,
    free_pods: Vec<PodSlot>,
    // Looked up only, never iterated.
    pub(crate) pod_ids: HashMap<Box<str>, PodSlot>,
    pub(crate) gangs: BTreeMap<Box<str>, Vec<Box<str>>>,
    pub(crate) indexes: Indexes,
    pub(crate) labels: BTreeMap<(Sym, Sym), BTreeSet<NodeId>>,
    pub(crate) topo: BTreeSet<TopoKey>,
    pub(crate) mig: MigCache,
    pub(crate) empty: Arc<str>,
}

/// What a card holds now, for inspection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CardView {
    /// Index on the node.
    pub index: u32,
    /// UUID.
    pub uuid: String,
    /// TDM shares.
    pub tdm_shares: u32,
    /// Compute reserved by TDM shares, percent.
    pub core_used: u32,
    /// Memory reserved by TDM shares, MiB.
    pub memory_used_mib: u64,
    /// Memory of the card, MiB.
    pub memory_mib: u64,
    /// Whole-card allocations.
    pub whole: u32,
    /// MIG instances allocated, as (profile, start), sorted.
    pub mig: Vec<(String, u8)>,
}

impl Cluster {
    /// An empty cluster.
    pub fn new(settings: Settings) -> Self {
        let scoring = settings.scoring;
        Cluster {
            settings,
            interner: Interner::default(),
            nodes: Vec::new(),
            summaries: Vec::new(),
            entries: Vec::new(),
            topo_keys: Vec::new(),
            free_nodes: Vec::new(),
            by_name: BTreeMap::new(),
            known: 0,
            pods: Vec::new(),
            free_pods: Vec::new(),
            pod_ids: HashMap::new(),
            gangs: BTreeMap::new(),
            indexes: Indexes::new(),
            labels: BTreeMap::new(),
            topo: BTreeSet::new(),
            mig: MigCache::new(scoring),
            empty: Arc::from(""),
        }
    }

    /// The settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Nodes known from their Node object.
    pub fn node_count(&self) -> usize {
        self.known
    }

    /// Pods holding allocations or resource usage.
    pub fn pod_count(&self) -> usize {
        self.pod_ids.len()
    }

    /// Whether the engine holds no allocation, usage or reservation.
    pub fn is_idle(&self) -> bool {
        self.pod_ids.is_empty() && self.gangs.is_empty()
    }

    /// Gang reservations held.
    pub fn gang_count(&self) -> usize {
        self.gangs.len()
    }

    pub(crate) fn node_id(&self, name: &str) -> Option<NodeId> {
        self.by_name.get(name).copied()
    }

    fn node_or_placeholder(&mut self, name: &str) -> NodeId {
        if let Some(id) = self.node_id(name) {
            return id;
        }
        let name: Arc<str> = Arc::from(name);
        let state = NodeState::new(name.clone());
        let id = match self.free_nodes.pop() {
            Some(id) => {
                self.nodes[id as usize] = state;
                self.summaries[id as usize] = Summary::default();
                self.entries[id as usize] = Entries::default();
                self.topo_keys[id as usize] = None;
                id
            }
            None => {
                self.nodes.push(state);
                self.summaries.push(Summary::default());
                self.entries.push(Entries::default());
                self.topo_keys.push(None);
                (self.nodes.len() - 1) as NodeId
            }
        };
        self.by_name.insert(name, id);
        id
    }

    /// Adds a node or replaces what its Node object says; its cards and allocations stay.
    pub fn upsert_node(&mut self, info: NodeInfo) {
        let id = self.node_or_placeholder(&info.name);
        self.drop_spec(id);
        let mut labels: Vec<(Sym, Sym)> = info
            .labels
            .iter()
            .map(|(k, v)| (self.interner.intern(k), self.interner.intern(v)))
            .collect();
        labels.sort_unstable();
        for &pair in &labels {
            self.labels.entry(pair).or_default().insert(id);
        }
        let taints = info
            .taints
            .iter()
            .map(|t| {
                (
                    self.interner.intern(&t.key),
                    self.interner.intern(&t.value),
                    t.effect,
                )
            })
            .collect();
        let allocatable = self.amounts(&info.allocatable);
        let key = self.topo_key(id, &info);
        self.topo.insert(key.clone());
        self.topo_keys[id as usize] = Some(key);
        self.nodes[id as usize].spec = Some(Spec {
            labels,
            taints,
            allocatable,
            max_pods: info.max_pods,
            ready: info.ready,
            unschedulable: info.unschedulable,
            gpu_enabled: info.gpu_enabled,
            tdm_off: SwitchedBy::of(self.settings.switches.tdm, info.switches.tdm),
            mig_off: SwitchedBy::of(self.settings.switches.mig, info.switches.mig),
            whole_cards_by_dra: !info.switches.whole_cards,
        });
        self.known += 1;
        self.refresh(id);
    }

    fn topo_key(&self, id: NodeId, info: &NodeInfo) -> TopoKey {
        let p = &info.position;
        let mut parts = [Part::Solo, Part::Solo, Part::Solo];
        if let Some(np) = &p.network_pod {
            parts[0] = Part::Named(Arc::from(np.as_str()));
            if let Some(leaf) = &p.leaf_switch {
                parts[1] = Part::Named(Arc::from(leaf.as_str()));
                if let Some(hyper) = &p.hyper_node {
                    parts[2] = Part::Named(Arc::from(hyper.as_str()));
                }
            }
        }
        TopoKey {
            parts,
            name: self.nodes[id as usize].name.clone(),
            id,
        }
    }

    /// Forgets a node's Node object, releasing its symbols and index entries.
    fn drop_spec(&mut self, id: NodeId) {
        let Some(spec) = self.nodes[id as usize].spec.take() else {
            return;
        };
        self.known -= 1;
        for &(k, v) in &spec.labels {
            if let Some(set) = self.labels.get_mut(&(k, v)) {
                set.remove(&id);
                if set.is_empty() {
                    self.labels.remove(&(k, v));
                }
            }
            self.interner.release(k);
            self.interner.release(v);
        }
        for &(k, v, _) in &spec.taints {
            self.interner.release(k);
            self.interner.release(v);
        }
        for &(s, _) in &spec.allocatable.scalars {
            self.interner.release(s);
        }
        if let Some(key) = self.topo_keys[id as usize].take() {
            self.topo.remove(&key);
        }
    }

    /// Removes a node: its Node object and its devices. Allocations that name it are kept, so
    /// they apply again if it comes back. Returns whether the node was known.
    pub fn remove_node(&mut self, name: &str) -> bool {
        let Some(id) = self.node_id(name) else {
            return false;
        };
        let had = self.nodes[id as usize].spec.is_some();
        self.drop_spec(id);
        self.clear_devices(id);
        self.nodes[id as usize].agent = false;
        self.refresh(id);
        had
    }

    fn clear_devices(&mut self, id: NodeId) {
        let node = &mut self.nodes[id as usize];
        for card in node.cards.drain(..) {
            self.interner.release(card.model);
        }
        node.nics.clear();
    }

    /// Sets the cards and NICs a node's agent reports.
    pub fn set_devices(&mut self, node: &str, cards: &[CardInfo], nics: &[NicInfo]) {
        let id = self.node_or_placeholder(node);
        self.clear_devices(id);
        let (cards, nics) = build_devices(cards, nics, &mut self.interner);
        for table in cards.iter().filter_map(|c| c.table) {
            self.mig.ensure(table);
        }
        let state = &mut self.nodes[id as usize];
        state.cards = cards;
        state.nics = nics;
        self.refresh(id);
    }

    /// Sets whether a node's agent is reporting; a stale agent's cards are not offered.
    pub fn set_agent_reporting(&mut self, node: &str, reporting: bool) {
        let id = self.node_or_placeholder(node);
        self.nodes[id as usize].agent = reporting;
        self.refresh(id);
    }

    fn pod_slot(&mut self, uid: &str) -> PodSlot {
        if let Some(&slot) = self.pod_ids.get(uid) {
            return slot;
        }
        let record = PodRecord {
            uid: uid.into(),
            slices: Vec::new(),
            usage: None,
            gang: None,
        };
        let slot = match self.free_pods.pop() {
            Some(slot) => {
                self.pods[slot as usize] = record;
                slot
            }
            None => {
                self.pods.push(record);
                (self.pods.len() - 1) as PodSlot
            }
        };
        self.pod_ids.insert(uid.into(), slot);
        slot
    }

    /// Unlinks a pod from the nodes it no longer uses and frees it when it holds nothing.
    fn settle_pod(&mut self, slot: PodSlot, touched: &[NodeId]) {
        let record = &self.pods[slot as usize];
        for &id in touched {
            let uses = record.slices.iter().any(|s| s.node == id)
                || record.usage.as_ref().is_some_and(|(n, _)| *n == id);
            if !uses {
                self.nodes[id as usize].pods.remove(&slot);
            }
        }
        if record.slices.is_empty() && record.usage.is_none() {
            let record = std::mem::replace(
                &mut self.pods[slot as usize],
                PodRecord {
                    uid: "".into(),
                    slices: Vec::new(),
                    usage: None,
                    gang: None,
                },
            );
            self.pod_ids.remove(&record.uid);
            self.free_pods.push(slot);
            if let Some(gang) = record.gang
                && let Some(members) = self.gangs.get_mut(&gang)
            {
                members.retain(|m| *m != record.uid);
                if members.is_empty() {
                    self.gangs.remove(&gang);
                }
            }
        }
        let mut touched = touched.to_vec();
        touched.sort_unstable();
        touched.dedup();
        for id in touched {
            self.refresh(id);
        }
    }

    /// Adds or replaces one allocated card (a GpuSlice). Slices on nodes or cards the engine
    /// does not know yet are kept and count once those appear.
    pub fn upsert_slice(&mut self, slice: SliceInput) {
        let id = self.node_or_placeholder(&slice.node);
        let slot = self.pod_slot(&slice.pod_uid);
        let record = &mut self.pods[slot as usize];
        let mut touched = vec![id];
        if let Some(i) = record
            .slices
            .iter()
            .position(|s| *s.container == *slice.container && s.replica == slice.replica)
        {
            touched.push(record.slices.remove(i).node);
        }
        record.slices.push(SliceRec {
            container: slice.container.into(),
            replica: slice.replica,
            node: id,
            card_index: slice.card_index,
            card_uuid: slice.card_uuid.into(),
            share: slice.share,
        });
        self.nodes[id as usize].pods.insert(slot);
        self.settle_pod(slot, &touched);
    }

    /// Removes one allocated card. Returns whether it was held.
    pub fn remove_slice(&mut self, pod_uid: &str, container: &str, replica: u32) -> bool {
        let Some(&slot) = self.pod_ids.get(pod_uid) else {
            return false;
        };
        let record = &mut self.pods[slot as usize];
        let Some(i) = record
            .slices
            .iter()
            .position(|s| *s.container == *container && s.replica == replica)
        else {
            return false;
        };
        let node = record.slices.remove(i).node;
        self.settle_pod(slot, &[node]);
        true
    }

    fn amounts(&mut self, r: &Resources) -> Amounts {
        let mut scalars: Vec<(Sym, u64)> = r
            .scalar
            .iter()
            .map(|(k, &v)| (self.interner.intern(k), v))
            .collect();
        scalars.sort_unstable();
        Amounts {
            cpu: r.cpu_milli,
            mem: r.memory_bytes,
            scalars,
        }
    }

    fn release_amounts(&mut self, a: &Amounts) {
        for &(s, _) in &a.scalars {
            self.interner.release(s);
        }
    }

    /// Records what a pod bound to `node` requests besides cards (any pod, of any scheduler).
    pub fn upsert_pod_usage(&mut self, pod_uid: &str, node: &str, resources: &Resources) {
        let id = self.node_or_placeholder(node);
        let slot = self.pod_slot(pod_uid);
        let amounts = self.amounts(resources);
        let old = self.pods[slot as usize].usage.replace((id, amounts));
        let mut touched = vec![id];
        if let Some((n, a)) = old {
            self.release_amounts(&a);
            touched.push(n);
        }
        self.nodes[id as usize].pods.insert(slot);
        self.settle_pod(slot, &touched);
    }

    /// Forgets a pod's resource usage. Returns whether it was held.
    pub fn remove_pod_usage(&mut self, pod_uid: &str) -> bool {
        let Some(&slot) = self.pod_ids.get(pod_uid) else {
            return false;
        };
        let Some((n, a)) = self.pods[slot as usize].usage.take() else {
            return false;
        };
        self.release_amounts(&a);
        self.settle_pod(slot, &[n]);
        true
    }

    /// Releases everything a pod holds: its slices, its usage and its place in a gang
    /// reservation. Returns whether it held anything.
    pub fn release(&mut self, pod_uid: &str) -> bool {
        let Some(&slot) = self.pod_ids.get(pod_uid) else {
            return false;
        };
        let record = &mut self.pods[slot as usize];
        let mut touched: Vec<NodeId> = record.slices.drain(..).map(|s| s.node).collect();
        if let Some((n, a)) = record.usage.take() {
            touched.push(n);
            self.release_amounts(&a);
        }
        self.settle_pod(slot, &touched);
        true
    }

    /// What every card of a node holds, by index.
    pub fn cards(&self, node: &str) -> Option<Vec<CardView>> {
        let id = self.node_id(node)?;
        let node = &self.nodes[id as usize];
        let mut views: Vec<CardView> = node
            .cards
            .iter()
            .zip(&node.uses)
            .map(|(c, u)| CardView {
                index: c.index,
                uuid: c.uuid.to_string(),
                tdm_shares: u32::from(u.tdm),
                core_used: u32::from(u.core),
                memory_used_mib: u.mem,
                memory_mib: c.memory_mib,
                whole: u32::from(u.whole),
                mig: Vec::new(),
            })
            .collect();
        for &slot in &node.pods {
            for s in &self.pods[slot as usize].slices {
                if let crate::model::Share::Mig { profile, start, .. } = &s.share
                    && s.node == id
                    && let Some(p) = node.card_of(s.card_index, &s.card_uuid)
                {
                    views[p].mig.push((profile.clone(), *start));
                }
            }
        }
        for v in &mut views {
            v.mig.sort();
        }
        Some(views)
    }

    /// Recomputes a node's card usage, summary and index entries from what it holds.
    pub(crate) fn refresh(&mut self, id: NodeId) {
        self.recount(id);
        if self.nodes[id as usize].is_vacant() {
            let name = self.nodes[id as usize].name.clone();
            self.by_name.remove(&name);
            self.nodes[id as usize] = NodeState::new(self.empty.clone());
            self.free_nodes.push(id);
        }
    }

    /// Recounts what a node's pods hold and updates its summary and index entries; the node
    /// is kept even if nothing refers to it any more (a what-if puts its pods back).
    pub(crate) fn recount(&mut self, id: NodeId) {
        let node = &mut self.nodes[id as usize];
        let (tdm_off, mig_off) = node.spec.as_ref().map_or((false, false), |s| {
            (s.tdm_off.is_some(), s.mig_off.is_some())
        });
        for card in &mut node.cards {
            card.tdm_off = tdm_off;
            card.mig_off = mig_off;
        }
        let mut uses = vec![CardUse::default(); node.cards.len()];
        let mut requested = Amounts::default();
        let mut pod_count = 0;
        for &slot in &node.pods {
            let record = &self.pods[slot as usize];
            for s in record.slices.iter().filter(|s| s.node == id) {
                if let Some(p) = node.card_of(s.card_index, &s.card_uuid) {
                    node.cards[p].apply(&mut uses[p], &s.share);
                }
            }
            if let Some((n, a)) = &record.usage
                && *n == id
            {
                requested.add(a);
                pod_count += 1;
            }
        }
        node.uses = uses;
        node.requested = requested;
        node.pod_count = pod_count;
        let summary = summarize(node);
        self.summaries[id as usize] = summary;
        let entries = self.entries_for(id, &summary);
        let name = self.nodes[id as usize].name.clone();
        self.indexes
            .update(id, &name, &self.entries[id as usize], &entries);
        self.entries[id as usize] = entries;
    }

    fn entries_for(&self, id: NodeId, s: &Summary) -> Entries {
        let scoring = self.settings.scoring;
        let node = &self.nodes[id as usize];
        let mut entries = Entries {
            node: key8(scoring, s.free[VendorFilter::Any.slot()]),
            cards: vec![CardEntry::None; node.cards.len()],
            ..Entries::default()
        };
        if !s.has(flag::ELIGIBLE) {
            return entries;
        }
        entries.eligible = true;
        for (entry, (card, u)) in entries
            .cards
            .iter_mut()
            .zip(node.cards.iter().zip(&node.uses))
        {
            if let Some((core, mem)) = card.tdm_room(u) {
                *entry = CardEntry::Tdm {
                    row: tdm_row(scoring, core),
                    mem: key64(scoring, mem),
                };
            } else if let Some((table, occupied)) = card.mig_room(u) {
                *entry = CardEntry::Mig {
                    model: table.model,
                    occupied,
                };
            }
        }
        for filter in VendorFilter::ALL {
            for set in WholeSet::ALL {
                let value = set.value(s, filter);
                entries.whole[filter.slot()][set.slot()] =
                    (value > 0).then(|| key8(scoring, value));
            }
        }
        entries
    }

    /// Checks a decision against the current state (and `scratch`, the usage of decisions
    /// already checked in the same batch), counting its shares into `scratch`.
    pub(crate) fn check(
        &self,
        d: &Decision,
        scratch: &mut BTreeMap<NodeId, Vec<CardUse>>,
    ) -> Result<NodeId, CommitError> {
        let id = self
            .node_id(&d.node)
            .filter(|&id| self.summaries[id as usize].has(flag::KNOWN))
            .ok_or_else(|| CommitError::UnknownNode(d.node.clone()))?;
        if let Some(&slot) = self.pod_ids.get(d.pod_uid.as_str()) {
            let record = &self.pods[slot as usize];
            if !record.slices.is_empty() || record.usage.is_some() {
                return Err(CommitError::AlreadyPlaced(d.pod_uid.clone()));
            }
        }
        let node = &self.nodes[id as usize];
        let uses = scratch.entry(id).or_insert_with(|| node.uses.clone());
        for card in d.containers.iter().flat_map(|c| &c.cards) {
            let Some(p) = node.card_of(card.index, &card.uuid) else {
                return Err(CommitError::UnknownCard {
                    node: d.node.clone(),
                    index: card.index,
                    uuid: card.uuid.clone(),
                });
            };
            if let Some(why) = node.cards[p].refusal(&uses[p], &card.share) {
                return Err(CommitError::CardRefused {
                    node: d.node.clone(),
                    index: card.index,
                    why,
                });
            }
            node.cards[p].apply(&mut uses[p], &card.share);
        }
        Ok(id)
    }

    /// Records a checked decision.
    pub(crate) fn apply(&mut self, d: &Decision, id: NodeId) {
        let slot = self.pod_slot(&d.pod_uid);
        let amounts = self.amounts(&d.resources);
        let record = &mut self.pods[slot as usize];
        record.usage = Some((id, amounts));
        record.gang = d.gang.as_deref().map(Box::from);
        for c in &d.containers {
            for card in &c.cards {
                record.slices.push(SliceRec {
                    container: c.container.as_str().into(),
                    replica: card.replica,
                    node: id,
                    card_index: card.index,
                    card_uuid: card.uuid.as_str().into(),
                    share: card.share.clone(),
                });
            }
        }
        self.nodes[id as usize].pods.insert(slot);
        self.refresh(id);
    }

    /// Holds the room a preemptor waits for while its victims terminate: `decision` (made with
    /// the victims taken out) is applied without the check, as they still hold its cards, which
    /// therefore count twice until they are gone, so nothing else is placed there meanwhile.
    /// Released with [`Cluster::release`]; a node the engine does not know holds nothing.
    pub fn nominate(&mut self, decision: &Decision) {
        self.release(&decision.pod_uid);
        if let Some(id) = self.node_id(&decision.node) {
            self.apply(decision, id);
        }
    }

    /// Applies a decision (kube-scheduler's "assume"): its cards and resources are held until
    /// [`Cluster::release`]. The decision is checked again, so a stale one never over-commits.
    pub fn commit(&mut self, decision: &Decision) -> Result<(), CommitError> {
        let id = self.check(decision, &mut BTreeMap::new())?;
        self.apply(decision, id);
        Ok(())
    }
}
