//! The engine's per-node state: cards with what is allocated on them, NICs, and the pods
//! (allocations and plain resource usage) that live on the node, plus the compact summary each
//! node keeps for indexes and fast failure explanations.

use crate::intern::{Interner, Sym};
use crate::model::{CardInfo, NicInfo, Share, TaintEffect, Vendor};
use runtimekit_contract::WholeCardName;
use runtimekit_contract::mig::{MigTable, table_for};
use std::collections::BTreeSet;
use std::sync::Arc;

pub(crate) type NodeId = u32;
pub(crate) type PodSlot = u32;

/// What is allocated on one card, derived from the slices that name it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CardUse {
    /// TDM shares.
    pub tdm: u16,
    /// Compute reserved by TDM shares, percent.
    pub core: u16,
    /// Memory reserved by TDM shares, MiB.
    pub mem: u64,
    /// Whole-card allocations (more than one only after an inconsistent restore).
    pub whole: u16,
    /// MIG instances allocated.
    pub mig: u16,
    /// Memory slices occupied by allocated MIG instances.
    pub mask: u8,
}

/// A card: what the agent reported, resolved once.
#[derive(Debug)]
pub(crate) struct Card {
    pub index: u32,
    pub uuid: Box<str>,
    pub vendor: Vendor,
    pub model: Sym,
    pub memory_mib: u64,
    pub mig_enabled: bool,
    pub healthy: bool,
    pub table: Option<&'static MigTable>,
    /// Memory slices of MIG instances the hardware reports.
    pub reported: u8,
    /// Node-local ids, numbered in name order so ties follow names.
    pub switch: Option<u8>,
    pub group: Option<u8>,
    pub numa: Option<u32>,
    pub socket: Option<u32>,
    pub nvlink: Box<[u32]>,
    /// Whether its node has time-division shares or MIG instances switched off (copied from
    /// the node's spec on every refresh).
    pub tdm_off: bool,
    pub mig_off: bool,
}

/// What switched a function off on a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SwitchedBy {
    /// The shared configuration (`features.tdm`, `features.mig`).
    Cluster,
    /// The node's own label.
    Node,
}

impl SwitchedBy {
    /// What switched a function off, given whether the cluster and the node leave it on.
    pub(crate) fn of(cluster_on: bool, node_on: bool) -> Option<SwitchedBy> {
        if !cluster_on {
            Some(SwitchedBy::Cluster)
        } else if !node_on {
            Some(SwitchedBy::Node)
        } else {
            None
        }
    }
}

/// An RDMA NIC.
#[derive(Debug)]
pub(crate) struct Nic {
    pub name: Box<str>,
    pub switch: Option<u8>,
    pub numa: Option<u32>,
    pub socket: Option<u32>,
}

/// Resources other than cards, with interned scalar names (sorted by symbol).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Amounts {
    pub cpu: u64,
    pub mem: u64,
    pub scalars: Vec<(Sym, u64)>,
}

impl Amounts {
    pub(crate) fn scalar(&self, sym: Sym) -> u64 {
        self.scalars
            .binary_search_by_key(&sym, |&(s, _)| s)
            .map_or(0, |i| self.scalars[i].1)
    }

    pub(crate) fn add(&mut self, other: &Amounts) {
        self.cpu = self.cpu.saturating_add(other.cpu);
        self.mem = self.mem.saturating_add(other.mem);
        for &(sym, v) in &other.scalars {
            match self.scalars.binary_search_by_key(&sym, |&(s, _)| s) {
                Ok(i) => self.scalars[i].1 = self.scalars[i].1.saturating_add(v),
                Err(i) => self.scalars.insert(i, (sym, v)),
            }
        }
    }
}

/// What the Node object says, interned.
#[derive(Debug)]
pub(crate) struct Spec {
    /// Sorted by key symbol.
    pub labels: Vec<(Sym, Sym)>,
    pub taints: Vec<(Sym, Sym, TaintEffect)>,
    pub allocatable: Amounts,
    pub max_pods: u64,
    pub ready: bool,
    pub unschedulable: bool,
    pub gpu_enabled: bool,
    /// Whether, and by what, time-division shares and MIG instances are switched off here.
    pub tdm_off: Option<SwitchedBy>,
    pub mig_off: Option<SwitchedBy>,
    /// Whether the node gives its whole cards through DRA, not through the extended resources.
    pub whole_cards_by_dra: bool,
}

impl Spec {
    pub(crate) fn label(&self, key: Sym) -> Option<Sym> {
        self.labels
            .binary_search_by_key(&key, |&(k, _)| k)
            .ok()
            .map(|i| self.labels[i].1)
    }
}

/// One node, known from its Node object, its agent's report, or only from allocations that
/// name it (a placeholder, so that a restart that sees GpuSlices first loses nothing).
#[derive(Debug)]
pub(crate) struct NodeState {
    pub name: Arc<str>,
    pub spec: Option<Spec>,
    pub agent: bool,
    pub cards: Vec<Card>,
    pub uses: Vec<CardUse>,
    pub nics: Vec<Nic>,
    /// Pods with slices or usage here.
    pub pods: BTreeSet<PodSlot>,
    pub requested: Amounts,
    pub pod_count: u64,
}

impl NodeState {
    pub(crate) fn new(name: Arc<str>) -> Self {
        NodeState {
            name,
            spec: None,
            agent: false,
            cards: Vec::new(),
            uses: Vec::new(),
            nics: Vec::new(),
            pods: BTreeSet::new(),
            requested: Amounts::default(),
            pod_count: 0,
        }
    }

    /// Whether nothing refers to this node any more.
    pub(crate) fn is_vacant(&self) -> bool {
        self.spec.is_none()
            && self.cards.is_empty()
            && self.nics.is_empty()
            && self.pods.is_empty()
            && !self.agent
    }

    /// Free amount of a scalar resource: allocatable less what its pods request.
    #[inline]
    pub(crate) fn scalar_free(&self, resource: Sym) -> u64 {
        match &self.spec {
            Some(spec) => spec
                .allocatable
                .scalar(resource)
                .saturating_sub(self.requested.scalar(resource)),
            None => 0,
        }
    }

    /// The position of the card a slice names: by UUID when it has one, else by index.
    pub(crate) fn card_of(&self, index: u32, uuid: &str) -> Option<usize> {
        if uuid.is_empty() {
            self.cards.iter().position(|c| c.index == index)
        } else {
            self.cards.iter().position(|c| &*c.uuid == uuid)
        }
    }
}

/// One allocated card of a pod.
#[derive(Debug)]
pub(crate) struct SliceRec {
    pub container: Box<str>,
    pub replica: u32,
    pub node: NodeId,
    pub card_index: u32,
    pub card_uuid: Box<str>,
    pub share: Share,
}

/// Everything the engine holds for one pod.
#[derive(Debug)]
pub(crate) struct PodRecord {
    pub uid: Box<str>,
    pub slices: Vec<SliceRec>,
    pub usage: Option<(NodeId, Amounts)>,
    pub gang: Option<Box<str>>,
}

impl Card {
    /// Builds a card from a report, interning its model.
    pub(crate) fn from_info(
        info: &CardInfo,
        interner: &mut Interner,
        switch: Option<u8>,
        group: Option<u8>,
    ) -> Self {
        let table = table_for(&info.model, info.memory_mib);
        let reported = info.mig_instances.iter().fold(0u8, |mask, i| {
            mask | table.map_or(u8::MAX, |t| instance_mask(t, &i.profile, i.start))
        });
        Card {
            index: info.index,
            uuid: info.uuid.as_str().into(),
            vendor: info.vendor,
            model: interner.intern(&info.model),
            memory_mib: info.memory_mib,
            mig_enabled: info.mig_enabled,
            healthy: info.healthy,
            table,
            reported,
            switch,
            group,
            numa: info.numa_node,
            socket: info.socket,
            nvlink: info.nvlink_peers.clone().into_boxed_slice(),
            tdm_off: false,
            mig_off: false,
        }
    }

    /// Free compute and memory for a new TDM share, or `None` when the card takes no shares.
    pub(crate) fn tdm_room(&self, u: &CardUse) -> Option<(u8, u64)> {
        let takes = self.healthy
            && !self.tdm_off
            && !self.mig_enabled
            && self.vendor != Vendor::Amd
            && u.whole == 0
            && u.mig == 0
            && self.reported == 0;
        takes.then(|| {
            (
                100u16.saturating_sub(u.core) as u8,
                self.memory_mib.saturating_sub(u.mem),
            )
        })
    }

    /// The table and occupied memory slices for a new MIG instance, or `None` when the card
    /// takes no MIG instances.
    pub(crate) fn mig_room(&self, u: &CardUse) -> Option<(&'static MigTable, u8)> {
        let table = self.table?;
        (self.healthy && !self.mig_off && self.mig_enabled && u.whole == 0 && u.tdm == 0)
            .then_some((table, u.mask | self.reported))
    }

    /// Whether the card may be given whole (to an NVIDIA-only request too, when asked).
    pub(crate) fn whole_capable(&self, nvidia_only: bool) -> bool {
        self.healthy && !self.mig_enabled && (!nvidia_only || self.vendor == Vendor::Nvidia)
    }

    /// Whether the card is free to be given whole now.
    pub(crate) fn whole_free(&self, u: &CardUse, nvidia_only: bool) -> bool {
        self.whole_capable(nvidia_only) && *u == CardUse::default() && self.reported == 0
    }

    /// Counts a share on the card.
    pub(crate) fn apply(&self, u: &mut CardUse, share: &Share) {
        match share {
            Share::Whole => u.whole = u.whole.saturating_add(1),
            Share::Tdm { core, memory_mib } => {
                u.tdm = u.tdm.saturating_add(1);
                u.core = u.core.saturating_add(u16::from(core.unwrap_or(0)));
                u.mem = u.mem.saturating_add(memory_mib.unwrap_or(0));
            }
            Share::Mig { profile, start, .. } => {
                u.mig = u.mig.saturating_add(1);
                u.mask |= self
                    .table
                    .map_or(u8::MAX, |t| instance_mask(t, profile, *start));
            }
        }
    }

    /// Why the card cannot take `share` now, for a commit of a stale decision.
    pub(crate) fn refusal(&self, u: &CardUse, share: &Share) -> Option<String> {
        if !self.healthy {
            return Some("the card is unhealthy".into());
        }
        match share {
            Share::Whole => (!self.whole_free(u, false)).then(|| {
                if self.mig_enabled {
                    "the card is in MIG mode".into()
                } else {
                    "the card is not free".into()
                }
            }),
            Share::Tdm { core, memory_mib } => match self.tdm_room(u) {
                None => Some("the card takes no time-division shares now".into()),
                Some((free_core, free_mem)) => {
                    if core.unwrap_or(0) > free_core {
                        Some(format!("only {free_core}% core is free"))
                    } else if memory_mib.unwrap_or(0) > free_mem {
                        Some(format!("only {free_mem} MiB memory is free"))
                    } else {
                        None
                    }
                }
            },
            Share::Mig { profile, start, .. } => match self.mig_room(u) {
                None => Some("the card takes no MIG instances now".into()),
                Some((table, occupied)) => match table.profile(profile) {
                    None => Some(format!("{} has no profile {profile}", table.model)),
                    Some(p) => (!table.legal_starts(p, occupied).contains(start))
                        .then(|| format!("{profile} cannot start at slice {start}")),
                },
            },
        }
    }
}

/// The memory slices an instance occupies; anything the table cannot place is taken to fill
/// the card, so an unknown instance never lets another one overlap it.
pub(crate) fn instance_mask(table: &MigTable, profile: &str, start: u8) -> u8 {
    let name = profile.strip_suffix("+me").unwrap_or(profile);
    match table.profile(name) {
        Some(p) if start.saturating_add(p.memory_slices) <= table.memory_slices => p.mask_at(start),
        _ => u8::MAX,
    }
}

/// Node-local ids for names, in name order.
fn local_ids<'a>(names: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    let mut ids: Vec<&str> = names.collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// Converts reported devices into cards and NICs with node-local switch and group ids.
pub(crate) fn build_devices(
    cards: &[CardInfo],
    nics: &[NicInfo],
    interner: &mut Interner,
) -> (Vec<Card>, Vec<Nic>) {
    let switches = local_ids(
        cards
            .iter()
            .filter_map(|c| c.pcie_switch.as_deref())
            .chain(nics.iter().filter_map(|n| n.pcie_switch.as_deref())),
    );
    let groups = local_ids(cards.iter().filter_map(|c| c.interconnect_group.as_deref()));
    let id = |ids: &[&str], name: Option<&str>| {
        name.and_then(|n| ids.binary_search(&n).ok())
            .and_then(|i| u8::try_from(i).ok())
    };
    let mut sorted: Vec<&CardInfo> = cards.iter().collect();
    sorted.sort_by_key(|c| c.index);
    sorted.dedup_by_key(|c| c.index);
    // Card positions are bytes; no node comes near 255 cards (a pod may ask for 64).
    sorted.truncate(usize::from(u8::MAX));
    let cards = sorted
        .into_iter()
        .map(|c| {
            Card::from_info(
                c,
                interner,
                id(&switches, c.pcie_switch.as_deref()),
                id(&groups, c.interconnect_group.as_deref()),
            )
        })
        .collect();
    let mut nics: Vec<Nic> = nics
        .iter()
        .map(|n| Nic {
            name: n.name.as_str().into(),
            switch: id(&switches, n.pcie_switch.as_deref()),
            numa: n.numa_node,
            socket: n.socket,
        })
        .collect();
    nics.sort_by(|a, b| a.name.cmp(&b.name));
    (cards, nics)
}

pub(crate) mod flag {
    pub const KNOWN: u8 = 1;
    pub const READY: u8 = 2;
    pub const CORDONED: u8 = 4;
    pub const GPU: u8 = 8;
    pub const AGENT: u8 = 16;
    pub const TAINTED: u8 = 32;
    /// Time-division shares or MIG instances switched off on the node.
    pub const TDM_OFF: u8 = 64;
    pub const MIG_OFF: u8 = 128;
    /// Known, ready, labelled for GPU pods and reporting: its cards may be offered.
    pub const ELIGIBLE: u8 = KNOWN | READY | GPU | AGENT;
}

/// Which cards a whole-card request accepts; summaries and indexes keep one entry per filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum VendorFilter {
    /// Any vendor (`aliyun.com/gpu`).
    Any,
    /// NVIDIA cards only (`nvidia.com/gpu`).
    Nvidia,
}

impl VendorFilter {
    /// Every filter, in slot order.
    pub(crate) const ALL: [VendorFilter; 2] = [VendorFilter::Any, VendorFilter::Nvidia];

    /// The filter a whole-card request names.
    #[inline]
    pub(crate) fn of(name: WholeCardName) -> VendorFilter {
        match name {
            WholeCardName::Nvidia => VendorFilter::Nvidia,
            WholeCardName::AnyVendor => VendorFilter::Any,
        }
    }

    #[inline]
    pub(crate) fn nvidia_only(self) -> bool {
        self == VendorFilter::Nvidia
    }

    /// The filter's position in per-filter arrays.
    #[inline]
    pub(crate) fn slot(self) -> usize {
        self as usize
    }
}

/// Why no card of a node takes a share, when none does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum ShareBlock {
    #[default]
    NoCards,
    Unhealthy,
    Amd,
    MigMode,
    Whole,
}

/// A node in a few bytes: what indexes are keyed by and what failure explanations read first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Summary {
    pub flags: u8,
    pub cards: u8,
    pub nics: u8,
    /// Free whole cards, per vendor filter.
    pub free: [u8; 2],
    /// Healthy cards outside MIG mode, per vendor filter.
    pub capable: [u8; 2],
    /// The most free cards in one interconnect group, per vendor filter.
    pub group_max: [u8; 2],
    /// The most free cards in one PCIe switch, NUMA node, socket with a NIC, and the node
    /// when it has a NIC, per vendor filter.
    pub rdma: [[u8; 4]; 2],
    /// Cards that take TDM shares now.
    pub tdm_cards: u8,
    pub tdm_max_core: u8,
    pub tdm_max_mem: u64,
    /// Why no card takes shares, when `tdm_cards` is 0.
    pub tdm_block: ShareBlock,
    /// Healthy cards in MIG mode.
    pub mig_cards: u8,
    /// Cards that take MIG instances now and have a free memory slice.
    pub mig_open: u8,
    /// Healthy cards.
    pub healthy: u8,
    pub cpu_free: u64,
    pub mem_free: u64,
    pub pods_free: u64,
}

impl Summary {
    pub(crate) fn has(&self, f: u8) -> bool {
        self.flags & f == f
    }
}

/// The largest number of keys that are equal.
fn max_bucket(keys: impl Iterator<Item = u64>) -> u8 {
    let mut buckets: Vec<(u64, u8)> = Vec::new();
    let mut best = 0u8;
    for key in keys {
        let n = match buckets.iter_mut().find(|(k, _)| *k == key) {
            Some((_, n)) => {
                *n = n.saturating_add(1);
                *n
            }
            None => {
                buckets.push((key, 1));
                1
            }
        };
        best = best.max(n);
    }
    best
}

fn count(n: usize) -> u8 {
    u8::try_from(n).unwrap_or(u8::MAX)
}

/// Summarises a node.
pub(crate) fn summarize(node: &NodeState) -> Summary {
    let mut s = Summary {
        cards: count(node.cards.len()),
        nics: count(node.nics.len()),
        ..Summary::default()
    };
    if let Some(spec) = &node.spec {
        s.flags |= flag::KNOWN;
        if spec.ready {
            s.flags |= flag::READY;
        }
        if spec.unschedulable {
            s.flags |= flag::CORDONED;
        }
        if spec.gpu_enabled {
            s.flags |= flag::GPU;
        }
        if spec.tdm_off.is_some() {
            s.flags |= flag::TDM_OFF;
        }
        if spec.mig_off.is_some() {
            s.flags |= flag::MIG_OFF;
        }
        if spec
            .taints
            .iter()
            .any(|t| t.2 != TaintEffect::PreferNoSchedule)
        {
            s.flags |= flag::TAINTED;
        }
        s.cpu_free = spec.allocatable.cpu.saturating_sub(node.requested.cpu);
        s.mem_free = spec.allocatable.mem.saturating_sub(node.requested.mem);
        s.pods_free = spec.max_pods.saturating_sub(node.pod_count);
    }
    if node.agent {
        s.flags |= flag::AGENT;
    }
    let mut block = ShareBlock::NoCards;
    for (card, u) in node.cards.iter().zip(&node.uses) {
        if card.healthy {
            s.healthy = s.healthy.saturating_add(1);
            if card.mig_enabled {
                s.mig_cards = s.mig_cards.saturating_add(1);
            }
        }
        if let Some((table, occupied)) = card.mig_room(u) {
            let full = u8::MAX >> (8 - table.memory_slices.min(8));
            if occupied & full != full {
                s.mig_open = s.mig_open.saturating_add(1);
            }
        }
        match card.tdm_room(u) {
            Some((core, mem)) => {
                s.tdm_cards = s.tdm_cards.saturating_add(1);
                s.tdm_max_core = s.tdm_max_core.max(core);
                s.tdm_max_mem = s.tdm_max_mem.max(mem);
            }
            None => block = block.max_with(ShareBlock::of(card)),
        }
    }
    s.tdm_block = block;
    for filter in VendorFilter::ALL {
        let (slot, nvidia_only) = (filter.slot(), filter.nvidia_only());
        let free: Vec<&Card> = node
            .cards
            .iter()
            .zip(&node.uses)
            .filter(|(c, u)| c.whole_free(u, nvidia_only))
            .map(|(c, _)| c)
            .collect();
        s.free[slot] = count(free.len());
        s.capable[slot] = count(
            node.cards
                .iter()
                .filter(|c| c.whole_capable(nvidia_only))
                .count(),
        );
        // Cards without a group form one group of their own.
        s.group_max[slot] = max_bucket(free.iter().map(|c| c.group.map_or(u64::MAX, u64::from)));
        if !node.nics.is_empty() {
            s.rdma[slot] = [
                max_bucket(free.iter().filter_map(|c| rdma_unit(node, c, 0))),
                max_bucket(free.iter().filter_map(|c| rdma_unit(node, c, 1))),
                max_bucket(free.iter().filter_map(|c| rdma_unit(node, c, 2))),
                s.free[slot],
            ];
        }
    }
    s
}

/// The unit of a card at RDMA tier 0 (PCIe switch), 1 (NUMA node) or 2 (socket), when a NIC
/// of the node shares it.
pub(crate) fn rdma_unit(node: &NodeState, card: &Card, tier: usize) -> Option<u64> {
    let unit = match tier {
        0 => card.switch.map(u64::from),
        1 => card.numa.map(u64::from),
        _ => card.socket.map(u64::from),
    }?;
    node.nics
        .iter()
        .any(|n| nic_unit(n, tier) == Some(unit))
        .then_some(unit)
}

/// The unit of a NIC at RDMA tier 0, 1 or 2.
pub(crate) fn nic_unit(nic: &Nic, tier: usize) -> Option<u64> {
    match tier {
        0 => nic.switch.map(u64::from),
        1 => nic.numa.map(u64::from),
        _ => nic.socket.map(u64::from),
    }
}

impl ShareBlock {
    /// What keeps one card from taking shares.
    pub(crate) fn of(card: &Card) -> ShareBlock {
        if !card.healthy {
            ShareBlock::Unhealthy
        } else if card.mig_enabled {
            ShareBlock::MigMode
        } else if card.vendor == Vendor::Amd {
            ShareBlock::Amd
        } else {
            ShareBlock::Whole
        }
    }

    /// The more telling of two blocks: a card given whole says more than an AMD card, which
    /// says more than a MIG card, which says more than an unhealthy one.
    pub(crate) fn max_with(self, other: ShareBlock) -> ShareBlock {
        let rank = |b: ShareBlock| match b {
            ShareBlock::NoCards => 0,
            ShareBlock::Unhealthy => 1,
            ShareBlock::Amd => 2,
            ShareBlock::MigMode => 3,
            ShareBlock::Whole => 4,
        };
        if rank(other) > rank(self) {
            other
        } else {
            self
        }
    }
}
