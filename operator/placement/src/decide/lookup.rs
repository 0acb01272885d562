//! Index lookups: finding the best node for the shapes with an index behind them, reading a
//! few entries of the cluster's ordered indexes instead of scanning every node; and the nodes a
//! narrow nodeSelector picks, to scan instead.

use super::prepare::Prepared;
use crate::cluster::Cluster;
use crate::index::{CardKey, NodeKey, TdmKey, WholeSet};
use crate::mig_cache::{MigCache, MigScore};
use crate::model::Scoring;
use crate::state::{NodeId, VendorFilter};
use std::collections::{BTreeMap, BTreeSet};

impl Cluster {
    /// Nodes to scan instead of the indexes, when the nodeSelector picks only a few.
    pub(super) fn narrowed(&self, prep: &Prepared) -> Option<Vec<NodeId>> {
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

    pub(super) fn fast_tdm(&self, prep: &Prepared, core: u8, mem: u64) -> Option<NodeId> {
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
    pub(super) fn fast_tdm_replica(
        &self,
        prep: &Prepared,
        core: u8,
        mem: u64,
        n: usize,
    ) -> Option<NodeId> {
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

    pub(super) fn fast_mig(&self, prep: &Prepared, slices: u8, mem: Option<u64>) -> Option<NodeId> {
        let mut best: Option<(MigScore, &CardKey)> = None;
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
    pub(super) fn fast_nodes(&self, prep: &Prepared) -> Option<NodeId> {
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

    pub(super) fn fast_whole(
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
}
