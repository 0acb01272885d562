//! Indexes over eligible nodes and cards, ordered best first for the scoring, so that a
//! decision reads a few entries instead of scanning the cluster:
//!
//! - TDM: one ordered set per free-compute value (0-100) of cards that take shares, keyed by
//!   free memory, then the node's free whole cards, then node name and card;
//! - MIG: per model table, one set per occupancy of the eight memory slices;
//! - whole cards: per vendor filter, nodes keyed by free cards, by the most free cards in one
//!   interconnect group, and by the most free cards in one PCIe switch, NUMA node or socket
//!   with a NIC (RDMA joint sets).
//!
//! Every key ends with the node's name, so ties always break by name, whatever the order in
//! which the cluster was built. Updates touch only the entries of the node that changed.

use crate::state::{NodeId, Summary, VendorFilter};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// A card that takes TDM shares, within its free-compute row.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct TdmKey {
    pub mem: u64,
    pub node: u8,
    pub name: Arc<str>,
    pub id: NodeId,
    pub card: u8,
}

/// A card that takes MIG instances, within its occupancy group.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct CardKey {
    pub node: u8,
    pub name: Arc<str>,
    pub id: NodeId,
    pub card: u8,
}

/// A node within a whole-card set.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct NodeKey {
    pub value: u8,
    pub name: Arc<str>,
    pub id: NodeId,
}

/// Where one card is indexed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CardEntry {
    None,
    Tdm { row: u8, mem: u64 },
    Mig { model: &'static str, occupied: u8 },
}

/// The whole-card sets, each kept once per vendor filter, named by what a node is keyed by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WholeSet {
    /// Free whole cards.
    Free,
    /// The most free cards in one interconnect group.
    Group,
    /// RDMA joint sets: the most free cards in one PCIe switch, NUMA node or socket with a
    /// NIC, and on the node when it has a NIC (tiers 0 to 3).
    RdmaSwitch,
    RdmaNuma,
    RdmaSocket,
    RdmaNode,
}

impl WholeSet {
    /// Every set, in slot order.
    pub(crate) const ALL: [WholeSet; 6] = [
        WholeSet::Free,
        WholeSet::Group,
        WholeSet::RdmaSwitch,
        WholeSet::RdmaNuma,
        WholeSet::RdmaSocket,
        WholeSet::RdmaNode,
    ];
    /// The RDMA sets by tier, best first.
    pub(crate) const RDMA: [WholeSet; 4] = [
        WholeSet::RdmaSwitch,
        WholeSet::RdmaNuma,
        WholeSet::RdmaSocket,
        WholeSet::RdmaNode,
    ];
    /// Number of sets per vendor filter.
    pub(crate) const COUNT: usize = WholeSet::ALL.len();

    /// The set's position in per-set arrays.
    #[inline]
    pub(crate) fn slot(self) -> usize {
        self as usize
    }

    /// The value a node is indexed under in this set.
    #[inline]
    pub(crate) fn value(self, summary: &Summary, filter: VendorFilter) -> u8 {
        let slot = filter.slot();
        match self {
            WholeSet::Free => summary.free[slot],
            WholeSet::Group => summary.group_max[slot],
            WholeSet::RdmaSwitch => summary.rdma[slot][0],
            WholeSet::RdmaNuma => summary.rdma[slot][1],
            WholeSet::RdmaSocket => summary.rdma[slot][2],
            WholeSet::RdmaNode => summary.rdma[slot][3],
        }
    }
}

/// Where one node and its cards are indexed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entries {
    /// The node's free whole cards, as a key; the node is indexed under it when eligible.
    pub node: u8,
    pub eligible: bool,
    pub cards: Vec<CardEntry>,
    pub whole: [[Option<u8>; WholeSet::COUNT]; 2],
}

impl Default for Entries {
    fn default() -> Self {
        Entries {
            node: 0,
            eligible: false,
            cards: Vec::new(),
            whole: [[None; WholeSet::COUNT]; 2],
        }
    }
}

#[derive(Debug)]
pub(crate) struct MigGroups {
    pub groups: Vec<BTreeSet<CardKey>>,
    pub nonempty: [u64; 4],
}

impl MigGroups {
    fn new() -> Self {
        MigGroups {
            groups: (0..=u8::MAX).map(|_| BTreeSet::new()).collect(),
            nonempty: [0; 4],
        }
    }

    pub(crate) fn has(&self, occupied: u8) -> bool {
        self.nonempty[usize::from(occupied >> 6)] & (1 << (occupied & 63)) != 0
    }

    fn mark(&mut self, occupied: u8) {
        let bit = 1u64 << (occupied & 63);
        let word = &mut self.nonempty[usize::from(occupied >> 6)];
        if self.groups[usize::from(occupied)].is_empty() {
            *word &= !bit;
        } else {
            *word |= bit;
        }
    }
}

#[derive(Debug)]
pub(crate) struct Indexes {
    pub tdm: Vec<BTreeSet<TdmKey>>,
    pub tdm_nonempty: u128,
    pub mig: BTreeMap<&'static str, MigGroups>,
    pub whole: [Vec<BTreeSet<NodeKey>>; 2],
    /// Every eligible node by free whole cards, for shapes scored by node alone.
    pub nodes: BTreeSet<NodeKey>,
}

impl Indexes {
    pub(crate) fn new() -> Self {
        Indexes {
            tdm: (0..=100).map(|_| BTreeSet::new()).collect(),
            tdm_nonempty: 0,
            mig: BTreeMap::new(),
            whole: [
                (0..WholeSet::COUNT).map(|_| BTreeSet::new()).collect(),
                (0..WholeSet::COUNT).map(|_| BTreeSet::new()).collect(),
            ],
            nodes: BTreeSet::new(),
        }
    }

    /// Moves a node's entries from `old` to `new`, touching only what changed.
    pub(crate) fn update(&mut self, id: NodeId, name: &Arc<str>, old: &Entries, new: &Entries) {
        let rekey = old.node != new.node;
        if rekey || old.eligible != new.eligible {
            let key = |value| NodeKey {
                value,
                name: name.clone(),
                id,
            };
            if old.eligible {
                self.nodes.remove(&key(old.node));
            }
            if new.eligible {
                self.nodes.insert(key(new.node));
            }
        }
        let cards = old.cards.len().max(new.cards.len());
        for card in 0..cards {
            let before = old.cards.get(card).copied().unwrap_or(CardEntry::None);
            let after = new.cards.get(card).copied().unwrap_or(CardEntry::None);
            if before == after && !rekey {
                continue;
            }
            let card = u8::try_from(card).unwrap_or(u8::MAX);
            self.card_entry(id, name, old.node, card, before, false);
            self.card_entry(id, name, new.node, card, after, true);
        }
        for filter in 0..VendorFilter::ALL.len() {
            for set in 0..WholeSet::COUNT {
                let (before, after) = (old.whole[filter][set], new.whole[filter][set]);
                if before == after {
                    continue;
                }
                let target = &mut self.whole[filter][set];
                if let Some(value) = before {
                    target.remove(&NodeKey {
                        value,
                        name: name.clone(),
                        id,
                    });
                }
                if let Some(value) = after {
                    target.insert(NodeKey {
                        value,
                        name: name.clone(),
                        id,
                    });
                }
            }
        }
    }

    fn card_entry(
        &mut self,
        id: NodeId,
        name: &Arc<str>,
        node: u8,
        card: u8,
        entry: CardEntry,
        insert: bool,
    ) {
        match entry {
            CardEntry::None => {}
            CardEntry::Tdm { row, mem } => {
                let set = &mut self.tdm[usize::from(row)];
                let key = TdmKey {
                    mem,
                    node,
                    name: name.clone(),
                    id,
                    card,
                };
                if insert {
                    set.insert(key);
                } else {
                    set.remove(&key);
                }
                let bit = 1u128 << row;
                if set.is_empty() {
                    self.tdm_nonempty &= !bit;
                } else {
                    self.tdm_nonempty |= bit;
                }
            }
            CardEntry::Mig { model, occupied } => {
                let groups = self.mig.entry(model).or_insert_with(MigGroups::new);
                let key = CardKey {
                    node,
                    name: name.clone(),
                    id,
                    card,
                };
                let set = &mut groups.groups[usize::from(occupied)];
                if insert {
                    set.insert(key);
                } else {
                    set.remove(&key);
                }
                groups.mark(occupied);
            }
        }
    }

    /// Whether nothing is indexed.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.tdm.iter().all(BTreeSet::is_empty)
            && self
                .mig
                .values()
                .all(|g| g.groups.iter().all(BTreeSet::is_empty))
            && self.whole.iter().flatten().all(BTreeSet::is_empty)
            && self.nodes.is_empty()
    }
}
