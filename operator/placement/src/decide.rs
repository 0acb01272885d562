//! Single-pod decisions: predicates, card placement on each candidate node, the indexes that
//! find the best node without a scan, and failure explanations.

use crate::cluster::Cluster;
use crate::index::{NodeKey, TdmKey, WholeSet};
use crate::intern::Sym;
use crate::mig_cache::{MigCache, MigScore};
use crate::model::{
    CardPlacement, ContainerPlacement, Decision, PodInput, Scoring, SelectorOperator, TaintEffect,
    TolerationOperator,
};
use crate::place::{self, CardFail, Chosen, Rank, key8, key64};
use crate::reason::{CardProblem, Reason, Unschedulable};
use crate::state::{CardUse, NodeId, NodeState, Spec, Summary, VendorFilter, flag};
use runtimekit_contract::config::NODE_ENABLE_LABEL;
use runtimekit_contract::{CardRequest, WholeCardName};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// A resolved toleration.
#[derive(Debug)]
struct Tol {
    /// `None`: every key (empty key with Exists); `Some(None)`: a key no node has.
    key: Option<Option<Sym>>,
    /// `None`: any value (Exists); `Some(None)`: a value no node has.
    value: Option<Option<Sym>>,
    effect: Option<TaintEffect>,
}

/// What a node selector requirement looks at.
#[derive(Debug)]
enum Subject {
    /// A label, by symbol; `None` when no node has that key.
    Label(Option<Sym>),
    /// The node's name (`matchFields` on `metadata.name`).
    Name,
    /// A field selectors may not use; matches nothing.
    OtherField,
}

/// A resolved node selector requirement.
#[derive(Debug)]
struct Req<'p> {
    subject: Subject,
    op: SelectorOperator,
    values: Vec<Option<Sym>>,
    raw: &'p [String],
}

/// The shapes with an index behind them.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Fast {
    /// No cards: every node is scored.
    None,
    /// Several containers with cards, or MIG on several cards: nodes in order of free cards.
    Nodes,
    Tdm {
        core: u8,
        mem: u64,
        cards: usize,
    },
    Mig {
        slices: u8,
        mem: Option<u64>,
    },
    Whole {
        cards: usize,
        vendor: VendorFilter,
        rdma: bool,
    },
}

/// A pod with its strings resolved against the cluster's symbols.
#[derive(Debug)]
pub(crate) struct Prepared<'p> {
    pub pod: &'p PodInput,
    selector: Option<Vec<(Sym, Sym)>>,
    selector_impossible: bool,
    affinity: Option<Vec<Vec<Req<'p>>>>,
    tolerations: Vec<Tol>,
    tolerates_cordon: bool,
    cpu: u64,
    mem: u64,
    scalars: Vec<(Option<Sym>, u64)>,
    pub gpu: bool,
    pub rdma: bool,
    pub fast: Fast,
    /// Nodes matching the nodeSelector, by id bit, computed before scans of every node.
    selected: Option<Vec<u64>>,
}

/// One node-level cause of failure, cheap to count; turned into a [`Reason`] once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Why {
    NotReady,
    Unschedulable,
    Taint(Sym, Sym),
    Affinity,
    NotEnabled,
    Agent,
    Cpu,
    Memory,
    Pods,
    Scalar(usize),
    NoRdmaNic,
    Card(usize, CardFail),
    Unsupported(usize),
}

/// Failure causes and how many nodes each applied to.
#[derive(Debug, Default)]
pub(crate) struct Tally(pub Vec<(Why, usize)>);

impl Tally {
    pub(crate) fn add(&mut self, why: Why) {
        match self.0.iter_mut().find(|(w, _)| *w == why) {
            Some((_, n)) => *n += 1,
            None => self.0.push((why, 1)),
        }
    }
}

/// How one pod compares on a node; only scores of one pod are ever compared.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Score {
    major: u8,
    mem: u64,
    mig: MigScore,
    node: u8,
    name: Arc<str>,
    id: NodeId,
    card: u8,
}

impl Cluster {
    /// Resolves a pod's strings against the cluster's symbols.
    pub(crate) fn prepare<'p>(&self, pod: &'p PodInput) -> Prepared<'p> {
        let get = |s: &str| self.interner.get(s);
        let mut selector_impossible = false;
        let selector = (!pod.node_selector.is_empty()).then(|| {
            let mut pairs = Vec::with_capacity(pod.node_selector.len());
            for (k, v) in &pod.node_selector {
                match (get(k), get(v)) {
                    (Some(k), Some(v)) => pairs.push((k, v)),
                    _ => selector_impossible = true,
                }
            }
            pairs
        });
        let affinity = pod.required_affinity.as_ref().map(|terms| {
            terms
                .iter()
                .map(|t| {
                    let exprs = t.match_expressions.iter().map(|r| (false, r));
                    let fields = t.match_fields.iter().map(|r| (true, r));
                    exprs
                        .chain(fields)
                        .map(|(field, r)| Req {
                            subject: match (field, r.key.as_str()) {
                                (false, key) => Subject::Label(get(key)),
                                (true, "metadata.name") => Subject::Name,
                                (true, _) => Subject::OtherField,
                            },
                            op: r.operator,
                            values: r.values.iter().map(|v| get(v)).collect(),
                            raw: &r.values,
                        })
                        .collect()
                })
                .collect()
        });
        let tolerations = pod
            .tolerations
            .iter()
            .map(|t| Tol {
                key: (!(t.key.is_empty() && t.operator == TolerationOperator::Exists))
                    .then(|| get(&t.key)),
                value: (t.operator == TolerationOperator::Equal).then(|| get(&t.value)),
                effect: t.effect,
            })
            .collect();
        let tolerates_cordon = pod.tolerations.iter().any(|t| {
            let key = match t.operator {
                TolerationOperator::Exists => {
                    t.key.is_empty() || t.key == "node.kubernetes.io/unschedulable"
                }
                TolerationOperator::Equal => {
                    t.key == "node.kubernetes.io/unschedulable" && t.value.is_empty()
                }
            };
            key && t.effect.is_none_or(|e| e == TaintEffect::NoSchedule)
        });
        let fast = match pod.containers.as_slice() {
            [only] => match only.cards {
                CardRequest::Tdm {
                    cards,
                    core,
                    memory_mib,
                } => Fast::Tdm {
                    core: core.unwrap_or(0),
                    mem: memory_mib.unwrap_or(0),
                    cards: cards as usize,
                },
                CardRequest::Mig {
                    cards: 1,
                    slices,
                    memory_mib,
                } => Fast::Mig {
                    slices,
                    mem: memory_mib,
                },
                CardRequest::Whole { cards, name } => Fast::Whole {
                    cards: cards as usize,
                    vendor: VendorFilter::of(name),
                    rdma: only.rdma,
                },
                CardRequest::Mig { .. } => Fast::Nodes,
            },
            [] => Fast::None,
            _ => Fast::Nodes,
        };
        Prepared {
            pod,
            selector,
            selector_impossible,
            affinity,
            tolerations,
            tolerates_cordon,
            cpu: pod.resources.cpu_milli,
            mem: pod.resources.memory_bytes,
            scalars: pod
                .resources
                .scalar
                .iter()
                .map(|(k, &v)| (get(k), v))
                .collect(),
            gpu: !pod.containers.is_empty(),
            rdma: pod.containers.iter().any(|c| c.rdma),
            fast,
            selected: None,
        }
    }

    /// Resolves the nodeSelector into a bitmap from the label index, so a scan of every node
    /// reads one bit instead of each node's labels.
    pub(crate) fn select(&self, prep: &mut Prepared) {
        let Some(pairs) = &prep.selector else {
            return;
        };
        let mut bits = vec![0u64; self.nodes.len().div_ceil(64)];
        if !prep.selector_impossible {
            let sets: Option<Vec<&BTreeSet<NodeId>>> =
                pairs.iter().map(|p| self.labels.get(p)).collect();
            if let Some(mut sets) = sets {
                sets.sort_by_key(|s| s.len());
                if let Some((first, rest)) = sets.split_first() {
                    for &id in *first {
                        if rest.iter().all(|s| s.contains(&id)) {
                            bits[id as usize / 64] |= 1 << (id % 64);
                        }
                    }
                }
            }
        }
        prep.selected = Some(bits);
    }

    /// The standard predicates, kube-scheduler's order: readiness, cordon, taints, selector and
    /// affinity, then this project's node gates, then resource fit. Reports each failure.
    pub(crate) fn filter(&self, prep: &Prepared, id: NodeId, why: &mut impl FnMut(Why)) -> bool {
        let s = &self.summaries[id as usize];
        if !s.has(flag::KNOWN) {
            return false;
        }
        if !s.has(flag::READY) {
            why(Why::NotReady);
            return false;
        }
        if s.has(flag::CORDONED) && !prep.tolerates_cordon {
            why(Why::Unschedulable);
            return false;
        }
        // The node itself is read only for what its summary cannot answer.
        let node = &self.nodes[id as usize];
        if s.has(flag::TAINTED)
            && let Some(spec) = &node.spec
            && let Some(&(k, v, _)) = spec.taints.iter().find(|(k, v, e)| {
                *e != TaintEffect::PreferNoSchedule
                    && !prep.tolerations.iter().any(|t| tolerates(t, *k, *v, *e))
            })
        {
            why(Why::Taint(k, v));
            return false;
        }
        if !self.matches(prep, id, node) {
            why(Why::Affinity);
            return false;
        }
        if prep.gpu {
            if !s.has(flag::GPU) {
                why(Why::NotEnabled);
                return false;
            }
            if !s.has(flag::AGENT) {
                why(Why::Agent);
                return false;
            }
        }
        let mut fits = true;
        if prep.cpu > s.cpu_free {
            why(Why::Cpu);
            fits = false;
        }
        if prep.mem > s.mem_free {
            why(Why::Memory);
            fits = false;
        }
        if s.pods_free == 0 {
            why(Why::Pods);
            fits = false;
        }
        for (i, &(sym, want)) in prep.scalars.iter().enumerate() {
            let free = match (sym, &node.spec) {
                (Some(sym), Some(spec)) => spec
                    .allocatable
                    .scalar(sym)
                    .saturating_sub(node.requested.scalar(sym)),
                _ => 0,
            };
            if want > free {
                why(Why::Scalar(i));
                fits = false;
            }
        }
        fits
    }

    fn matches(&self, prep: &Prepared, id: NodeId, node: &NodeState) -> bool {
        if prep.selector_impossible {
            return false;
        }
        if let Some(bits) = &prep.selected {
            let id = id as usize;
            if bits.get(id / 64).is_none_or(|w| w & (1 << (id % 64)) == 0) {
                return false;
            }
        } else if let Some(pairs) = &prep.selector {
            let Some(spec) = &node.spec else {
                return false;
            };
            if !pairs.iter().all(|&(k, v)| spec.label(k) == Some(v)) {
                return false;
            }
        }
        let Some(terms) = &prep.affinity else {
            return true;
        };
        let Some(spec) = &node.spec else {
            return false;
        };
        terms
            .iter()
            .any(|term| !term.is_empty() && term.iter().all(|r| self.requirement(r, node, spec)))
    }

    fn requirement(&self, r: &Req, node: &NodeState, spec: &Spec) -> bool {
        let key = match r.subject {
            Subject::Label(key) => key,
            Subject::Name => {
                let named = r.raw.iter().any(|v| **v == *node.name);
                return match r.op {
                    SelectorOperator::In => named,
                    SelectorOperator::NotIn => !named,
                    _ => false,
                };
            }
            Subject::OtherField => return false,
        };
        let value = key.and_then(|k| spec.label(k));
        match r.op {
            SelectorOperator::In => value.is_some_and(|v| r.values.contains(&Some(v))),
            SelectorOperator::NotIn => value.is_none_or(|v| !r.values.contains(&Some(v))),
            SelectorOperator::Exists => value.is_some(),
            SelectorOperator::DoesNotExist => value.is_none(),
            SelectorOperator::Gt | SelectorOperator::Lt => {
                let (Some(v), [bound]) = (value, r.raw) else {
                    return false;
                };
                let (Ok(v), Ok(bound)) =
                    (self.interner.text(v).parse::<i64>(), bound.parse::<i64>())
                else {
                    return false;
                };
                if r.op == SelectorOperator::Gt {
                    v > bound
                } else {
                    v < bound
                }
            }
        }
    }

    /// Free amount of a scalar resource on a node.
    pub(crate) fn scalar_free(&self, id: NodeId, name: &str) -> u64 {
        let node = &self.nodes[id as usize];
        match (self.interner.get(name), &node.spec) {
            (Some(sym), Some(spec)) => spec
                .allocatable
                .scalar(sym)
                .saturating_sub(node.requested.scalar(sym)),
            _ => 0,
        }
    }

    fn passes(&self, prep: &Prepared, id: NodeId) -> bool {
        self.filter(prep, id, &mut |_| {}) && (!prep.rdma || self.summaries[id as usize].nics > 0)
    }

    /// Places a pod on one node with the given card usage.
    pub(crate) fn place_pod(
        &self,
        prep: &Prepared,
        id: NodeId,
        uses: &[CardUse],
    ) -> Result<(Score, Vec<Chosen>), Why> {
        let node = &self.nodes[id as usize];
        let s = &self.summaries[id as usize];
        let scoring = self.settings.scoring;
        let mut score = Score {
            major: 0,
            mem: 0,
            mig: MigScore {
                free: 0,
                room: [0; 8],
            },
            node: key8(scoring, s.free[VendorFilter::Any.slot()]),
            name: node.name.clone(),
            id,
            card: 0,
        };
        if !prep.gpu {
            score.node = 0;
            score.mem = key64(scoring, s.cpu_free.saturating_sub(prep.cpu));
            return Ok((score, Vec::new()));
        }
        if prep.rdma && node.nics.is_empty() {
            return Err(Why::NoRdmaNic);
        }
        let containers = &prep.pod.containers;
        if let ([only], false) = (containers.as_slice(), matches!(prep.fast, Fast::Nodes)) {
            let chosen = place::place(scoring, &self.mig, node, uses, &only.cards, only.rdma)
                .map_err(|f| Why::Card(0, f))?;
            match chosen.rank {
                Rank::Tdm { row, mem, card } => {
                    score.major = row;
                    score.mem = mem;
                    score.card = card;
                }
                Rank::Mig { score: mig, card } => {
                    score.mig = mig;
                    score.card = card;
                }
                Rank::Whole { tier, set } => {
                    let vendor = match only.cards {
                        CardRequest::Whole { name, .. } => VendorFilter::of(name),
                        _ => VendorFilter::Any,
                    };
                    score.major = tier;
                    score.node = key8(scoring, set.value(s, vendor));
                }
            }
            return Ok((score, vec![chosen]));
        }
        let mut scratch = uses.to_vec();
        let mut out = Vec::with_capacity(containers.len());
        for (i, c) in containers.iter().enumerate() {
            let chosen = place::place(scoring, &self.mig, node, &scratch, &c.cards, c.rdma)
                .map_err(|f| Why::Card(i, f))?;
            for (p, share) in &chosen.cards {
                let p = usize::from(*p);
                node.cards[p].apply(&mut scratch[p], share);
            }
            out.push(chosen);
        }
        Ok((score, out))
    }

    /// A failure known from the summary alone, for the shapes with an index.
    fn quick_fail(&self, prep: &Prepared, s: &Summary) -> Option<Why> {
        let card = |f| Some(Why::Card(0, f));
        if prep.rdma && s.nics == 0 {
            return Some(Why::NoRdmaNic);
        }
        match prep.fast {
            Fast::Whole { cards, vendor, .. } if usize::from(s.free[vendor.slot()]) < cards => {
                let capable = usize::from(s.capable[vendor.slot()]);
                card(CardFail::too_few_whole(s.cards > 0, capable, cards))
            }
            Fast::Tdm { .. } if s.tdm_cards == 0 => card(CardFail::no_share(s.tdm_block)),
            Fast::Tdm { core, mem, cards }
                if usize::from(s.tdm_cards) < cards
                    || s.tdm_max_core < core
                    || s.tdm_max_mem < mem =>
            {
                card(CardFail::TdmNoRoom)
            }
            Fast::Mig { .. } if s.mig_cards == 0 => {
                card(CardFail::no_mig_mode(s.healthy > 0, s.cards > 0))
            }
            _ => None,
        }
    }

    /// The best node among `ids`, reporting why each other node failed.
    pub(crate) fn scan(
        &self,
        prep: &Prepared,
        ids: impl Iterator<Item = NodeId>,
        why: &mut impl FnMut(Why),
    ) -> Option<NodeId> {
        let mut best: Option<Score> = None;
        for id in ids {
            if !self.filter(prep, id, why) {
                continue;
            }
            if let Some(w) = self.quick_fail(prep, &self.summaries[id as usize]) {
                why(w);
                continue;
            }
            let uses = &self.nodes[id as usize].uses;
            match self.place_pod(prep, id, uses) {
                Ok((score, _)) => {
                    if best.as_ref().is_none_or(|b| score < *b) {
                        best = Some(score);
                    }
                }
                Err(w) => why(w),
            }
        }
        best.map(|b| b.id)
    }

    /// The ids of every known node.
    pub(crate) fn known_ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.summaries
            .iter()
            .enumerate()
            .filter(|(_, s)| s.has(flag::KNOWN))
            .map(|(i, _)| i as NodeId)
    }

    /// Nodes to scan instead of the indexes, when the nodeSelector picks only a few.
    fn narrowed(&self, prep: &Prepared) -> Option<Vec<NodeId>> {
        if prep.selector_impossible {
            return Some(Vec::new());
        }
        let pairs = prep.selector.as_ref()?;
        let smallest = pairs
            .iter()
            .map(|p| self.labels.get(p))
            .min_by_key(|set| set.map_or(0, BTreeSet::len))?;
        match smallest {
            // No node has that label: nothing to scan.
            None => Some(Vec::new()),
            Some(set) => (set.len() * 8 < self.known).then(|| set.iter().copied().collect()),
        }
    }

    /// Decides where one pod goes, without changing anything.
    pub fn decide(&self, pod: &PodInput) -> Result<Decision, Unschedulable> {
        let mut prep = self.prepare(pod);
        if !pod.unsupported.is_empty() {
            let tally = (0..pod.unsupported.len())
                .map(|i| (Why::Unsupported(i), self.known))
                .collect();
            return Err(self.unschedulable(&prep, Tally(tally)));
        }
        let found = match self.narrowed(&prep) {
            Some(ids) => self.scan(&prep, ids.into_iter(), &mut |_| {}),
            None => match prep.fast {
                Fast::Tdm {
                    core,
                    mem,
                    cards: 1,
                } => self.fast_tdm(&prep, core, mem),
                Fast::Tdm { core, mem, cards } => self.fast_tdm_replica(&prep, core, mem, cards),
                Fast::Mig { slices, mem } => self.fast_mig(&prep, slices, mem),
                Fast::Whole {
                    cards,
                    vendor,
                    rdma,
                } => self.fast_whole(&prep, cards, vendor, rdma),
                Fast::Nodes => self.fast_nodes(&prep),
                Fast::None => {
                    self.select(&mut prep);
                    self.scan(&prep, self.known_ids(), &mut |_| {})
                }
            },
        };
        let id = match found {
            Some(id) => id,
            None => {
                self.select(&mut prep);
                let mut tally = Tally::default();
                let found = self.scan(&prep, self.known_ids(), &mut |w| tally.add(w));
                debug_assert!(found.is_none(), "an index missed a node that fits");
                match found {
                    Some(id) => id,
                    None => return Err(self.unschedulable(&prep, tally)),
                }
            }
        };
        let uses = &self.nodes[id as usize].uses;
        match self.place_pod(&prep, id, uses) {
            Ok((_, chosen)) => Ok(self.decision(pod, id, &chosen)),
            Err(why) => {
                let mut tally = Tally::default();
                tally.add(why);
                Err(self.unschedulable(&prep, tally))
            }
        }
    }

    /// The reference decision: every node placed and scored, no index used.
    #[cfg(test)]
    pub(crate) fn decide_by_scan(&self, pod: &PodInput) -> Option<Decision> {
        let mut prep = self.prepare(pod);
        self.select(&mut prep);
        let id = self.scan(&prep, self.known_ids(), &mut |_| {})?;
        let (_, chosen) = self
            .place_pod(&prep, id, &self.nodes[id as usize].uses)
            .ok()?;
        Some(self.decision(pod, id, &chosen))
    }

    fn tdm_bounds(&self, mem: u64) -> (u64, u64) {
        match self.settings.scoring {
            Scoring::Binpack => (mem, u64::MAX),
            Scoring::Spread => (0, u64::MAX - mem),
        }
    }

    fn tdm_rows(&self, core: u8) -> impl Iterator<Item = usize> + '_ {
        let rows: Box<dyn Iterator<Item = u8>> = match self.settings.scoring {
            Scoring::Binpack => Box::new(core.min(101)..=100),
            Scoring::Spread => Box::new(0..=100u8.saturating_sub(core)),
        };
        rows.map(usize::from)
            .filter(|&r| self.indexes.tdm_nonempty & (1u128 << r) != 0)
    }

    fn tdm_entries(&self, row: usize, mem: u64) -> impl Iterator<Item = &TdmKey> {
        let (lo, hi) = self.tdm_bounds(mem);
        let from = TdmKey {
            mem: lo,
            node: 0,
            name: self.empty.clone(),
            id: 0,
            card: 0,
        };
        self.indexes.tdm[row]
            .range(from..)
            .take_while(move |k| k.mem <= hi)
    }

    fn fast_tdm(&self, prep: &Prepared, core: u8, mem: u64) -> Option<NodeId> {
        for row in self.tdm_rows(core) {
            for key in self.tdm_entries(row, mem) {
                if self.passes(prep, key.id) {
                    return Some(key.id);
                }
            }
        }
        None
    }

    /// Several cards of one node: the node whose n-th best card comes first in the index.
    fn fast_tdm_replica(&self, prep: &Prepared, core: u8, mem: u64, n: usize) -> Option<NodeId> {
        let mut seen: BTreeMap<NodeId, Option<usize>> = BTreeMap::new();
        for row in self.tdm_rows(core) {
            for key in self.tdm_entries(row, mem) {
                let count = seen
                    .entry(key.id)
                    .or_insert_with(|| self.passes(prep, key.id).then_some(0));
                if let Some(c) = count {
                    *c += 1;
                    if *c >= n {
                        return Some(key.id);
                    }
                }
            }
        }
        None
    }

    fn fast_mig(&self, prep: &Prepared, slices: u8, mem: Option<u64>) -> Option<NodeId> {
        let mut best: Option<(MigScore, &crate::index::CardKey)> = None;
        for cache in self.mig.tables() {
            let Some(groups) = self.indexes.mig.get(cache.table.model) else {
                continue;
            };
            let Ok((at, _)) = MigCache::pick(cache.table, slices, mem) else {
                continue;
            };
            let mut level = None;
            for &(score, occupied) in &cache.profiles[at].order {
                if level.is_some_and(|l| l != score)
                    || best.as_ref().is_some_and(|(b, _)| score > *b)
                {
                    break;
                }
                if !groups.has(occupied) {
                    continue;
                }
                if let Some(key) = groups.groups[usize::from(occupied)]
                    .iter()
                    .find(|k| self.passes(prep, k.id))
                {
                    level = Some(score);
                    if best.as_ref().is_none_or(|b| (score, key) < (b.0, b.1)) {
                        best = Some((score, key));
                    }
                }
            }
        }
        best.map(|(_, k)| k.id)
    }

    /// Shapes scored by node alone: the first node in order that fits is the best.
    fn fast_nodes(&self, prep: &Prepared) -> Option<NodeId> {
        self.indexes
            .nodes
            .iter()
            .find(|k| {
                self.passes(prep, k.id)
                    && self.summary_admits(prep, &self.summaries[k.id as usize])
                    && self
                        .place_pod(prep, k.id, &self.nodes[k.id as usize].uses)
                        .is_ok()
            })
            .map(|k| k.id)
    }

    /// Whether a node's summary lets every container fit on its own, a cheap necessary
    /// condition before placing them together.
    fn summary_admits(&self, prep: &Prepared, s: &Summary) -> bool {
        prep.pod.containers.iter().all(|c| {
            let n = c.cards.cards() as usize;
            match c.cards {
                CardRequest::Whole { name, .. } => {
                    usize::from(s.free[VendorFilter::of(name).slot()]) >= n
                }
                CardRequest::Tdm {
                    core, memory_mib, ..
                } => {
                    usize::from(s.tdm_cards) >= n
                        && s.tdm_max_core >= core.unwrap_or(0)
                        && s.tdm_max_mem >= memory_mib.unwrap_or(0)
                }
                CardRequest::Mig { .. } => usize::from(s.mig_open) >= n,
            }
        })
    }

    fn fast_whole(
        &self,
        prep: &Prepared,
        n: usize,
        vendor: VendorFilter,
        rdma: bool,
    ) -> Option<NodeId> {
        let sets: &[WholeSet] = if rdma {
            &WholeSet::RDMA
        } else if matches!(n, 2 | 4 | 8) {
            &[WholeSet::Group, WholeSet::Free]
        } else {
            &[WholeSet::Free]
        };
        let n = u8::try_from(n).unwrap_or(u8::MAX);
        let (lo, hi) = match self.settings.scoring {
            Scoring::Binpack => (n, u8::MAX),
            Scoring::Spread => (0, u8::MAX - n),
        };
        for &set in sets {
            let from = NodeKey {
                value: lo,
                name: self.empty.clone(),
                id: 0,
            };
            let found = self.indexes.whole[vendor.slot()][set.slot()]
                .range(from..)
                .take_while(|k| k.value <= hi)
                .find(|k| self.passes(prep, k.id));
            if let Some(k) = found {
                return Some(k.id);
            }
        }
        None
    }

    /// Builds the public decision from what was chosen on a node.
    pub(crate) fn decision(&self, pod: &PodInput, id: NodeId, chosen: &[Chosen]) -> Decision {
        let node = &self.nodes[id as usize];
        let containers = pod
            .containers
            .iter()
            .zip(chosen)
            .map(|(c, ch)| ContainerPlacement {
                container: c.container.clone(),
                cards: ch
                    .cards
                    .iter()
                    .enumerate()
                    .map(|(replica, (p, share))| {
                        let card = &node.cards[usize::from(*p)];
                        CardPlacement {
                            index: card.index,
                            uuid: card.uuid.to_string(),
                            replica: replica as u32,
                            share: share.clone(),
                        }
                    })
                    .collect(),
                nics: ch
                    .nics
                    .iter()
                    .map(|&n| node.nics[usize::from(n)].name.to_string())
                    .collect(),
                locality: ch.locality,
            })
            .collect();
        Decision {
            pod_uid: pod.uid.clone(),
            node: node.name.to_string(),
            containers,
            resources: pod.resources.clone(),
            gang: pod.gang.clone(),
        }
    }

    /// Turns counted causes into the public aggregate.
    pub(crate) fn unschedulable(&self, prep: &Prepared, tally: Tally) -> Unschedulable {
        self.unschedulable_with(prep, tally, None)
    }

    pub(crate) fn unschedulable_with(
        &self,
        prep: &Prepared,
        tally: Tally,
        gang: Option<crate::reason::GangShortfall>,
    ) -> Unschedulable {
        let mut merged: Vec<(Reason, usize)> = Vec::new();
        for (why, n) in tally.0 {
            let reason = self.reason(prep, why);
            match merged.iter_mut().find(|(r, _)| *r == reason) {
                Some((_, m)) => *m += n,
                None => merged.push((reason, n)),
            }
        }
        Unschedulable::new(self.known, merged, gang)
    }

    fn reason(&self, prep: &Prepared, why: Why) -> Reason {
        let names = &self.settings.names;
        let text = |s: Sym| self.interner.text(s).to_string();
        match why {
            Why::NotReady => Reason::NotReady,
            Why::Unschedulable => Reason::Unschedulable,
            Why::Taint(k, v) => Reason::UntoleratedTaint {
                key: text(k),
                value: text(v),
            },
            Why::Affinity => Reason::NodeAffinity,
            Why::NotEnabled => Reason::NotEnabled {
                label: NODE_ENABLE_LABEL.into(),
            },
            Why::Agent => Reason::AgentNotReporting,
            Why::Cpu => Reason::Insufficient {
                resource: "cpu".into(),
            },
            Why::Memory => Reason::Insufficient {
                resource: "memory".into(),
            },
            Why::Pods => Reason::TooManyPods,
            Why::Scalar(i) => Reason::Insufficient {
                resource: prep
                    .pod
                    .resources
                    .scalar
                    .keys()
                    .nth(i)
                    .cloned()
                    .unwrap_or_default(),
            },
            Why::Unsupported(i) => Reason::Unsupported {
                constraint: prep.pod.unsupported.get(i).cloned().unwrap_or_default(),
                scheduler: self.settings.scheduler_name.clone(),
            },
            Why::NoRdmaNic => Reason::NoRdmaNic {
                resource: names.rdma.clone(),
            },
            Why::Card(i, fail) => {
                let containers = &prep.pod.containers;
                let request = containers.get(i).map(|c| &c.cards);
                let container = (containers.len() > 1)
                    .then(|| containers.get(i).map(|c| c.container.clone()))
                    .flatten();
                Reason::Cards {
                    container,
                    problem: self.problem(request, fail),
                }
            }
        }
    }

    fn problem(&self, request: Option<&CardRequest>, fail: CardFail) -> CardProblem {
        let names = &self.settings.names;
        let share_resource = match request {
            Some(CardRequest::Tdm { core: None, .. }) => names.gpu_memory.clone(),
            Some(CardRequest::Mig { .. }) => names.gpu_slice.clone(),
            _ => names.gpu_core.clone(),
        };
        let cards = request.map_or(1, CardRequest::cards);
        let whole = |nvidia: bool| {
            if nvidia {
                runtimekit_contract::config::NVIDIA_GPU.to_owned()
            } else {
                names.gpu.clone()
            }
        };
        let nvidia = matches!(
            request,
            Some(CardRequest::Whole {
                name: WholeCardName::Nvidia,
                ..
            })
        );
        match fail {
            CardFail::NoCards => CardProblem::NoCards,
            CardFail::OnlyUnhealthy => CardProblem::OnlyUnhealthy,
            CardFail::OnlyAmd => CardProblem::OnlyAmd {
                resource: share_resource,
            },
            CardFail::OnlyMigMode => CardProblem::OnlyMigMode {
                resource: share_resource,
                slice: names.gpu_slice.clone(),
            },
            CardFail::AllWhole => CardProblem::AllGivenWhole {
                resource: share_resource,
            },
            CardFail::TdmNoRoom => {
                let (core, memory_mib) = match request {
                    Some(&CardRequest::Tdm {
                        core, memory_mib, ..
                    }) => (core, memory_mib),
                    _ => (None, None),
                };
                CardProblem::TdmNoRoom {
                    cards,
                    core,
                    core_resource: names.gpu_core.clone(),
                    memory_mib,
                    memory_resource: names.gpu_memory.clone(),
                }
            }
            CardFail::WholeTooFew => CardProblem::WholeTooFew {
                cards,
                resource: whole(nvidia),
                nvidia_only: nvidia,
            },
            CardFail::WholeBusy => CardProblem::WholeBusy {
                cards,
                resource: whole(nvidia),
            },
            CardFail::MigNotEnabled => CardProblem::MigNotEnabled {
                resource: names.gpu_slice.clone(),
            },
            CardFail::MigNoTable(model) => CardProblem::MigNoTable {
                model: self.interner.text(model).to_string(),
            },
            CardFail::MigProfile(table) => {
                let (slices, memory) = match request {
                    Some(&CardRequest::Mig {
                        slices, memory_mib, ..
                    }) => (slices, memory_mib),
                    _ => (0, None),
                };
                CardProblem::MigProfile {
                    message: MigCache::pick(table, slices, memory)
                        .err()
                        .map(|e| e.to_string())
                        .unwrap_or_default(),
                }
            }
            CardFail::MigNoRoom(profile) => CardProblem::MigNoRoom {
                cards,
                profile: profile.into(),
                resource: names.gpu_slice.clone(),
                slices: match request {
                    Some(&CardRequest::Mig { slices, .. }) => slices,
                    _ => 0,
                },
            },
        }
    }
}

fn tolerates(t: &Tol, key: Sym, value: Sym, effect: TaintEffect) -> bool {
    t.effect.is_none_or(|e| e == effect)
        && t.key.is_none_or(|k| k == Some(key))
        && t.value.is_none_or(|v| v == Some(value))
}
