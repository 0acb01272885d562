//! Index lookups: finding the best node for the shapes with an index behind them, reading a
//! few entries of the cluster's ordered indexes instead of scanning every node; a scan of the
//! few nodes a narrow nodeSelector picks; and a scan of every node for pods without cards.

use super::prepare::{CardShape, PreparedPod};
use crate::cluster::Cluster;
use crate::index::{CardKey, NodeKey, TdmKey, WholeSet};
use crate::mig_cache::{MigCache, MigScore};
use crate::model::Scoring;
use crate::state::{NodeId, VendorFilter};
use std::collections::{BTreeMap, BTreeSet};

impl Cluster {
    /// The best node for a pod, or `None` when no node takes it.
    pub(super) fn find_node(&self, prep: &mut PreparedPod) -> Option<NodeId> {
        if let Some(ids) = self.selector_candidates(prep) {
            return self.scan(prep, ids.into_iter(), &mut |_| {});
        }
        match prep.shape {
            CardShape::Tdm {
                core,
                memory_mib,
                cards: 1,
            } => self.lookup_tdm(prep, core, memory_mib),
            CardShape::Tdm {
                core,
                memory_mib,
                cards,
            } => self.lookup_tdm_replicas(prep, core, memory_mib, cards),
            CardShape::Mig { slices, memory_mib } => self.lookup_mig(prep, slices, memory_mib),
            CardShape::Whole {
                cards,
                vendor,
                rdma,
            } => self.lookup_whole(prep, cards, vendor, rdma),
            CardShape::ByNodeOrder => self.lookup_by_node_order(prep),
            CardShape::NoCards => {
                self.mark_selected_nodes(prep);
                self.scan(prep, self.known_node_ids(), &mut |_| {})
            }
        }
    }

    /// Nodes to scan instead of the indexes, when the nodeSelector picks only a few.
    fn selector_candidates(&self, prep: &PreparedPod) -> Option<Vec<NodeId>> {
        if prep.selector_matches_nothing {
            return Some(Vec::new());
        }
        let pairs = prep.node_selector.as_ref()?;
        let smallest = pairs
            .iter()
            .map(|pair| self.labels.get(pair))
            .min_by_key(|set| set.map_or(0, BTreeSet::len))?;
        match smallest {
            // No node has that label: nothing to scan.
            None => Some(Vec::new()),
            // An eighth of the cluster or more is cheaper through the indexes.
            Some(set) => (set.len() * 8 < self.known).then(|| set.iter().copied().collect()),
        }
    }

    /// The memory keys, in index order, of cards with at least `memory_mib` free.
    fn tdm_memory_bounds(&self, memory_mib: u64) -> (u64, u64) {
        match self.settings.scoring {
            Scoring::Binpack => (memory_mib, u64::MAX),
            Scoring::Spread => (0, u64::MAX - memory_mib),
        }
    }

    /// The non-empty TDM rows, best first, of cards with at least `core` free.
    fn tdm_rows(&self, core: u8) -> impl Iterator<Item = usize> + '_ {
        let rows: Box<dyn Iterator<Item = u8>> = match self.settings.scoring {
            Scoring::Binpack => Box::new(core.min(101)..=100),
            Scoring::Spread => Box::new(0..=100u8.saturating_sub(core)),
        };
        rows.map(usize::from)
            .filter(|&row| self.indexes.tdm_nonempty & (1u128 << row) != 0)
    }

    /// The cards of one TDM row with at least `memory_mib` free, best first.
    fn tdm_entries(&self, row: usize, memory_mib: u64) -> impl Iterator<Item = &TdmKey> {
        let (lo, hi) = self.tdm_memory_bounds(memory_mib);
        let from = TdmKey {
            mem: lo,
            node: 0,
            name: self.empty.clone(),
            id: 0,
            card: 0,
        };
        self.indexes.tdm[row]
            .range(from..)
            .take_while(move |key| key.mem <= hi)
    }

    /// One card's TDM share: the node of the first card in the index that fits.
    fn lookup_tdm(&self, prep: &PreparedPod, core: u8, memory_mib: u64) -> Option<NodeId> {
        for row in self.tdm_rows(core) {
            for key in self.tdm_entries(row, memory_mib) {
                if self.is_candidate(prep, key.id) {
                    return Some(key.id);
                }
            }
        }
        None
    }

    /// Several cards of one node: the node whose n-th best card comes first in the index.
    fn lookup_tdm_replicas(
        &self,
        prep: &PreparedPod,
        core: u8,
        memory_mib: u64,
        cards: usize,
    ) -> Option<NodeId> {
        // Per node: `None` when it is no candidate, else the fitting cards seen so far.
        let mut seen: BTreeMap<NodeId, Option<usize>> = BTreeMap::new();
        for row in self.tdm_rows(core) {
            for key in self.tdm_entries(row, memory_mib) {
                let fitting = seen
                    .entry(key.id)
                    .or_insert_with(|| self.is_candidate(prep, key.id).then_some(0));
                if let Some(fitting) = fitting {
                    *fitting += 1;
                    if *fitting >= cards {
                        return Some(key.id);
                    }
                }
            }
        }
        None
    }

    /// One MIG instance: per model's table, the occupancies best first down to the first score
    /// with a candidate card; the best of those over every table.
    fn lookup_mig(
        &self,
        prep: &PreparedPod,
        slices: u8,
        memory_mib: Option<u64>,
    ) -> Option<NodeId> {
        let mut best: Option<(MigScore, &CardKey)> = None;
        for cache in self.mig.tables() {
            let Some(groups) = self.indexes.mig.get(cache.table.model) else {
                continue;
            };
            let Ok((profile, _)) = MigCache::pick(cache.table, slices, memory_mib) else {
                continue;
            };
            let mut found_at = None;
            for &(score, occupied) in &cache.profiles[profile].order {
                if found_at.is_some_and(|found| found != score)
                    || best.as_ref().is_some_and(|(b, _)| score > *b)
                {
                    break;
                }
                if !groups.has(occupied) {
                    continue;
                }
                if let Some(key) = groups.groups[usize::from(occupied)]
                    .iter()
                    .find(|key| self.is_candidate(prep, key.id))
                {
                    found_at = Some(score);
                    if best.as_ref().is_none_or(|b| (score, key) < (b.0, b.1)) {
                        best = Some((score, key));
                    }
                }
            }
        }
        best.map(|(_, key)| key.id)
    }

    /// Shapes scored by node alone: the first node in order that fits is the best.
    fn lookup_by_node_order(&self, prep: &PreparedPod) -> Option<NodeId> {
        self.indexes
            .nodes
            .iter()
            .find(|key| {
                self.is_candidate(prep, key.id)
                    && self.summary_admits(prep, &self.summaries[key.id as usize])
                    && self
                        .place_pod(prep, key.id, &self.nodes[key.id as usize].uses)
                        .is_ok()
            })
            .map(|key| key.id)
    }

    /// Whole cards: the first node with enough free cards in the best set that has one.
    fn lookup_whole(
        &self,
        prep: &PreparedPod,
        cards: usize,
        vendor: VendorFilter,
        rdma: bool,
    ) -> Option<NodeId> {
        let sets: &[WholeSet] = if rdma {
            &WholeSet::RDMA
        } else if matches!(cards, 2 | 4 | 8) {
            &[WholeSet::Group, WholeSet::Free]
        } else {
            &[WholeSet::Free]
        };
        let cards = u8::try_from(cards).unwrap_or(u8::MAX);
        let (lo, hi) = match self.settings.scoring {
            Scoring::Binpack => (cards, u8::MAX),
            Scoring::Spread => (0, u8::MAX - cards),
        };
        for &set in sets {
            let from = NodeKey {
                value: lo,
                name: self.empty.clone(),
                id: 0,
            };
            let found = self.indexes.whole[vendor.slot()][set.slot()]
                .range(from..)
                .take_while(|key| key.value <= hi)
                .find(|key| self.is_candidate(prep, key.id));
            if let Some(key) = found {
                return Some(key.id);
            }
        }
        None
    }
}
