//! Choosing cards (and NICs) on one node for one container, and saying why none fit.
//!
//! Everything here looks at a single node, with the card usage passed in, so the same code
//! serves decisions, failure explanations and the scratch state of gang placement.

use crate::index::WholeSet;
use crate::intern::Sym;
use crate::mig_cache::{MigCache, MigScore};
use crate::model::{Locality, Scoring, Share, Vendor};
use crate::state::{Card, CardUse, NodeState, ShareBlock, nic_unit, rdma_unit};
use runtimekit_contract::CardRequest;
use runtimekit_contract::mig::MigTable;

/// Why a node's cards cannot serve a container; turned into a [`crate::CardProblem`] once per
/// failure message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CardFail {
    NoCards,
    OnlyUnhealthy,
    OnlyAmd,
    OnlyMigMode,
    AllWhole,
    TdmNoRoom,
    WholeTooFew,
    WholeBusy,
    MigNotEnabled,
    MigNoTable(Sym),
    MigProfile(&'static MigTable),
    MigNoRoom(&'static str),
}

impl CardFail {
    /// Why no card takes a share, from what blocks the most telling card.
    #[inline]
    pub(crate) fn no_share(block: ShareBlock) -> CardFail {
        match block {
            ShareBlock::NoCards => CardFail::NoCards,
            ShareBlock::Unhealthy => CardFail::OnlyUnhealthy,
            ShareBlock::Amd => CardFail::OnlyAmd,
            ShareBlock::MigMode => CardFail::OnlyMigMode,
            ShareBlock::Whole => CardFail::AllWhole,
        }
    }

    /// Why fewer than `wanted` cards are free to be given whole, of `capable` that could be.
    #[inline]
    pub(crate) fn too_few_whole(has_cards: bool, capable: usize, wanted: usize) -> CardFail {
        if !has_cards {
            CardFail::NoCards
        } else if capable < wanted {
            CardFail::WholeTooFew
        } else {
            CardFail::WholeBusy
        }
    }

    /// Why no card takes MIG instances when none is healthy and in MIG mode.
    #[inline]
    pub(crate) fn no_mig_mode(any_healthy: bool, has_cards: bool) -> CardFail {
        if any_healthy {
            CardFail::MigNotEnabled
        } else if !has_cards {
            CardFail::NoCards
        } else {
            CardFail::OnlyUnhealthy
        }
    }
}

/// How good a container's choice is, for comparing nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rank {
    /// The key of the worst card chosen: core row, memory key, card position.
    Tdm { row: u8, mem: u64, card: u8 },
    /// The score of the worst card chosen and its position.
    Mig { score: MigScore, card: u8 },
    /// The topology tier reached (0 best) and the whole-card index set that tier reads.
    Whole { tier: u8, set: WholeSet },
}

/// What one container gets on a node.
#[derive(Debug, Clone)]
pub(crate) struct Chosen {
    /// Card positions and shares, by replica.
    pub cards: Vec<(u8, Share)>,
    /// NIC positions, by name.
    pub nics: Vec<u8>,
    pub locality: Option<Locality>,
    pub rank: Rank,
}

/// Maps a value so that ascending order is best first under the scoring.
pub(crate) fn key64(scoring: Scoring, v: u64) -> u64 {
    match scoring {
        Scoring::Binpack => v,
        Scoring::Spread => u64::MAX - v,
    }
}

pub(crate) fn key8(scoring: Scoring, v: u8) -> u8 {
    match scoring {
        Scoring::Binpack => v,
        Scoring::Spread => u8::MAX - v,
    }
}

/// The TDM index row of a card with `free_core` free, rows walked in ascending order.
pub(crate) fn tdm_row(scoring: Scoring, free_core: u8) -> u8 {
    match scoring {
        Scoring::Binpack => free_core,
        Scoring::Spread => 100 - free_core.min(100),
    }
}

fn pos(i: usize) -> u8 {
    u8::try_from(i).unwrap_or(u8::MAX)
}

/// Places one container's request on a node.
pub(crate) fn place(
    scoring: Scoring,
    mig: &MigCache,
    node: &NodeState,
    uses: &[CardUse],
    request: &CardRequest,
    rdma: bool,
) -> Result<Chosen, CardFail> {
    let n = request.cards() as usize;
    match *request {
        CardRequest::Tdm {
            core, memory_mib, ..
        } => place_tdm(scoring, node, uses, n, core, memory_mib, rdma),
        CardRequest::Mig {
            slices, memory_mib, ..
        } => place_mig(mig, node, uses, n, slices, memory_mib, rdma),
        CardRequest::Whole { name, .. } => place_whole(
            node,
            uses,
            n,
            name == runtimekit_contract::WholeCardName::Nvidia,
            rdma,
        ),
    }
}

fn place_tdm(
    scoring: Scoring,
    node: &NodeState,
    uses: &[CardUse],
    n: usize,
    core: Option<u8>,
    memory_mib: Option<u64>,
    rdma: bool,
) -> Result<Chosen, CardFail> {
    let (c, m) = (core.unwrap_or(0), memory_mib.unwrap_or(0));
    let mut fits: Vec<(u8, u64, u8)> = Vec::with_capacity(node.cards.len());
    let mut any_room = false;
    for (i, (card, u)) in node.cards.iter().zip(uses).enumerate() {
        if let Some((free_core, free_mem)) = card.tdm_room(u) {
            any_room = true;
            if free_core >= c && free_mem >= m {
                fits.push((
                    tdm_row(scoring, free_core),
                    key64(scoring, free_mem),
                    pos(i),
                ));
            }
        }
    }
    if fits.len() < n || n == 0 {
        return Err(if any_room {
            CardFail::TdmNoRoom
        } else {
            CardFail::no_share(share_block(node))
        });
    }
    fits.sort_unstable();
    fits.truncate(n);
    let (row, mem, card) = fits[n - 1];
    let mut positions: Vec<u8> = fits.iter().map(|f| f.2).collect();
    positions.sort_unstable();
    let share = Share::Tdm { core, memory_mib };
    Ok(Chosen {
        nics: if rdma {
            nearest_nics(node, &positions)
        } else {
            Vec::new()
        },
        cards: positions.into_iter().map(|p| (p, share.clone())).collect(),
        locality: None,
        rank: Rank::Tdm { row, mem, card },
    })
}

/// Why no card of a node takes a share at all.
fn share_block(node: &NodeState) -> ShareBlock {
    node.cards
        .iter()
        .fold(ShareBlock::NoCards, |b, c| b.max_with(ShareBlock::of(c)))
}

fn place_mig(
    mig: &MigCache,
    node: &NodeState,
    uses: &[CardUse],
    n: usize,
    slices: u8,
    memory_mib: Option<u64>,
    rdma: bool,
) -> Result<Chosen, CardFail> {
    let mut fits = Vec::new();
    let mut profile_seen = None;
    let mut profile_error = None;
    let mut no_table = None;
    let mut any_healthy = false;
    for (i, (card, u)) in node.cards.iter().zip(uses).enumerate() {
        any_healthy |= card.healthy;
        if !(card.healthy && card.mig_enabled) {
            continue;
        }
        let Some(table) = card.table else {
            no_table = Some(card.model);
            continue;
        };
        let (at, profile) = match MigCache::pick(table, slices, memory_mib) {
            Ok(found) => found,
            Err(_) => {
                profile_error = Some(table);
                continue;
            }
        };
        profile_seen.get_or_insert(profile.name);
        let Some((_, occupied)) = card.mig_room(u) else {
            continue;
        };
        if let Some((start, score)) = mig.fit(table, at, occupied) {
            fits.push((score, pos(i), start, profile));
        }
    }
    if fits.len() < n || n == 0 {
        return Err(if let Some(profile) = profile_seen {
            CardFail::MigNoRoom(profile)
        } else if let Some(table) = profile_error {
            CardFail::MigProfile(table)
        } else if let Some(model) = no_table {
            CardFail::MigNoTable(model)
        } else {
            CardFail::no_mig_mode(any_healthy, !node.cards.is_empty())
        });
    }
    fits.sort_unstable_by_key(|f| (f.0, f.1));
    fits.truncate(n);
    let (score, card, _, _) = fits[n - 1];
    fits.sort_unstable_by_key(|f| f.1);
    let positions: Vec<u8> = fits.iter().map(|f| f.1).collect();
    Ok(Chosen {
        nics: if rdma {
            nearest_nics(node, &positions)
        } else {
            Vec::new()
        },
        cards: fits
            .into_iter()
            .map(|(_, p, start, profile)| {
                (
                    p,
                    Share::Mig {
                        profile: profile.name.into(),
                        slices,
                        start,
                        memory_mib: memory_mib.unwrap_or_else(|| profile.memory_mib()),
                    },
                )
            })
            .collect(),
        locality: None,
        rank: Rank::Mig { score, card },
    })
}

/// Counts per unit key among `cards` (positions), in key order.
fn buckets(node: &NodeState, cards: &[u8], key: impl Fn(&Card) -> Option<u64>) -> Vec<(u64, u8)> {
    let mut out: Vec<(u64, u8)> = Vec::new();
    for &p in cards {
        if let Some(k) = key(&node.cards[usize::from(p)]) {
            match out.binary_search_by_key(&k, |b| b.0) {
                Ok(i) => out[i].1 += 1,
                Err(i) => out.insert(i, (k, 1)),
            }
        }
    }
    out
}

/// The tightest unit holding `n`: fewest cards, then lowest key.
fn tightest(units: &[(u64, u8)], n: usize) -> Option<u64> {
    units
        .iter()
        .filter(|u| usize::from(u.1) >= n)
        .min_by_key(|u| (u.1, u.0))
        .map(|u| u.0)
}

/// Takes `n` of `cards` spanning as few sub-units as possible: fullest sub-unit first.
fn fewest_units(node: &NodeState, cards: &[u8], n: usize, sub: impl Fn(&Card) -> u64) -> Vec<u8> {
    let units = buckets(node, cards, |c| Some(sub(c)));
    let mut order: Vec<(u64, u8)> = units;
    order.sort_by_key(|u| (std::cmp::Reverse(u.1), u.0));
    let mut out = Vec::with_capacity(n);
    for (key, _) in order {
        out.extend(
            cards
                .iter()
                .copied()
                .filter(|&p| sub(&node.cards[usize::from(p)]) == key),
        );
        if out.len() >= n {
            break;
        }
    }
    out.truncate(n);
    out.sort_unstable();
    out
}

fn place_whole(
    node: &NodeState,
    uses: &[CardUse],
    n: usize,
    nvidia_only: bool,
    rdma: bool,
) -> Result<Chosen, CardFail> {
    let free: Vec<u8> = node
        .cards
        .iter()
        .zip(uses)
        .enumerate()
        .filter(|(_, (c, u))| c.whole_free(u, nvidia_only))
        .map(|(i, _)| pos(i))
        .collect();
    if free.len() < n || n == 0 {
        let capable = node
            .cards
            .iter()
            .filter(|c| c.whole_capable(nvidia_only))
            .count();
        return Err(CardFail::too_few_whole(!node.cards.is_empty(), capable, n));
    }
    let whole = |cards: Vec<u8>, nics, locality, tier, set| Chosen {
        cards: cards.into_iter().map(|p| (p, Share::Whole)).collect(),
        nics,
        locality,
        rank: Rank::Whole { tier, set },
    };
    if rdma {
        // GPUs and NICs as a joint set: PCIe switch, then NUMA node, then socket.
        const LOCALITY: [Locality; 3] =
            [Locality::PcieSwitch, Locality::NumaNode, Locality::Socket];
        for (tier, locality) in LOCALITY.into_iter().enumerate() {
            let units = buckets(node, &free, |c| rdma_unit(node, c, tier));
            if let Some(unit) = tightest(&units, n) {
                let pool: Vec<u8> = free
                    .iter()
                    .copied()
                    .filter(|&p| rdma_unit(node, &node.cards[usize::from(p)], tier) == Some(unit))
                    .collect();
                let cards = match tier {
                    0 => pool[..n].to_vec(),
                    1 => fewest_units(node, &pool, n, |c| c.switch.map_or(u64::MAX, u64::from)),
                    _ => fewest_units(node, &pool, n, |c| c.numa.map_or(u64::MAX, u64::from)),
                };
                let nics = nics_in_unit(node, tier, unit);
                return Ok(whole(
                    cards,
                    nics,
                    Some(locality),
                    tier as u8,
                    WholeSet::RDMA[tier],
                ));
            }
        }
        let cards = fewest_units(node, &free, n, |c| c.socket.map_or(u64::MAX, u64::from));
        let nics = nearest_nics(node, &cards);
        return Ok(whole(
            cards,
            nics,
            Some(Locality::CrossSocket),
            3,
            WholeSet::RdmaNode,
        ));
    }
    let group_key = |c: &Card| Some(c.group.map_or(u64::MAX, u64::from));
    if matches!(n, 2 | 4 | 8) {
        let groups = buckets(node, &free, group_key);
        if let Some(g) = tightest(&groups, n) {
            let pool: Vec<u8> = free
                .iter()
                .copied()
                .filter(|&p| group_key(&node.cards[usize::from(p)]) == Some(g))
                .collect();
            let (cards, nvlink) = best_set(node, &free, &pool, n);
            let locality = if g == u64::MAX {
                nvlink
            } else {
                Some(Locality::InterconnectGroup)
            };
            return Ok(whole(cards, Vec::new(), locality, 0, WholeSet::Group));
        }
        let cards = fewest_units(node, &free, n, |c| c.group.map_or(u64::MAX, u64::from));
        return Ok(whole(
            cards,
            Vec::new(),
            Some(Locality::AcrossGroups),
            1,
            WholeSet::Free,
        ));
    }
    let (cards, nvlink) = best_set(node, &free, &free, n);
    Ok(whole(cards, Vec::new(), nvlink, 0, WholeSet::Free))
}

/// NVLink links from card `a` to card `b` (each link listed once by `a`).
fn links(node: &NodeState, a: u8, b: u8) -> u32 {
    let peer = node.cards[usize::from(b)].index;
    node.cards[usize::from(a)]
        .nvlink
        .iter()
        .filter(|&&p| p == peer)
        .count() as u32
}

fn set_links(node: &NodeState, set: &[u8]) -> u32 {
    let mut total = 0;
    for (i, &a) in set.iter().enumerate() {
        for &b in &set[i + 1..] {
            total += links(node, a, b);
        }
    }
    total
}

/// Enumerating subsets beyond this many is left to a greedy choice.
const MAX_SUBSETS: u64 = 4096;

fn binomial(n: u64, k: u64) -> u64 {
    (0..k).fold(1u64, |acc, i| acc.saturating_mul(n - i) / (i + 1))
}

/// `n` cards of `pool`: for NVIDIA cards with NVLink, the set with the most links (ties to the
/// lowest positions); otherwise the tightest: cards of the interconnect group and PCIe switch
/// with the fewest free cards first, so larger free units stay whole.
fn best_set(node: &NodeState, free: &[u8], pool: &[u8], n: usize) -> (Vec<u8>, Option<Locality>) {
    let nvlink = n >= 2
        && pool
            .iter()
            .all(|&p| node.cards[usize::from(p)].vendor == Vendor::Nvidia)
        && pool
            .iter()
            .any(|&p| !node.cards[usize::from(p)].nvlink.is_empty());
    if nvlink {
        let set = if binomial(pool.len() as u64, n as u64) <= MAX_SUBSETS {
            most_linked_subset(node, pool, n)
        } else {
            greedy_linked(node, pool, n)
        };
        let total = set_links(node, &set);
        return (set, Some(Locality::NvLink { links: total }));
    }
    let groups = buckets(node, free, |c| Some(c.group.map_or(u64::MAX, u64::from)));
    let switches = buckets(node, free, |c| Some(c.switch.map_or(u64::MAX, u64::from)));
    let count = |units: &[(u64, u8)], key: u64| {
        units
            .binary_search_by_key(&key, |u| u.0)
            .map_or(0, |i| units[i].1)
    };
    let mut order: Vec<(u8, u8, u8)> = pool
        .iter()
        .map(|&p| {
            let c = &node.cards[usize::from(p)];
            (
                count(&groups, c.group.map_or(u64::MAX, u64::from)),
                count(&switches, c.switch.map_or(u64::MAX, u64::from)),
                p,
            )
        })
        .collect();
    order.sort_unstable();
    let mut set: Vec<u8> = order.into_iter().take(n).map(|o| o.2).collect();
    set.sort_unstable();
    (set, None)
}

fn most_linked_subset(node: &NodeState, pool: &[u8], n: usize) -> Vec<u8> {
    let mut best: Option<(u32, Vec<u8>)> = None;
    let mut idx: Vec<usize> = (0..n).collect();
    loop {
        let set: Vec<u8> = idx.iter().map(|&i| pool[i]).collect();
        let total = set_links(node, &set);
        // Combinations come in lexicographic order, so a strictly better one replaces.
        if best.as_ref().is_none_or(|(b, _)| total > *b) {
            best = Some((total, set));
        }
        // Next combination of n indexes out of pool.len().
        let mut i = n;
        loop {
            if i == 0 {
                return best.map(|b| b.1).unwrap_or_default();
            }
            i -= 1;
            if idx[i] < pool.len() - n + i {
                idx[i] += 1;
                for j in i + 1..n {
                    idx[j] = idx[j - 1] + 1;
                }
                break;
            }
        }
    }
}

fn greedy_linked(node: &NodeState, pool: &[u8], n: usize) -> Vec<u8> {
    let mut set: Vec<u8> = Vec::with_capacity(n);
    let mut rest: Vec<u8> = pool.to_vec();
    while set.len() < n && !rest.is_empty() {
        let gain = |p: u8| -> u32 {
            if set.is_empty() {
                rest.iter().map(|&q| links(node, p, q)).sum()
            } else {
                set.iter().map(|&q| links(node, q, p)).sum()
            }
        };
        let Some((at, _)) = rest
            .iter()
            .enumerate()
            .max_by_key(|&(i, &p)| (gain(p), std::cmp::Reverse(i)))
        else {
            break;
        };
        set.push(rest.remove(at));
    }
    set.sort_unstable();
    set
}

/// The NICs of the unit a joint set was chosen in.
fn nics_in_unit(node: &NodeState, tier: usize, unit: u64) -> Vec<u8> {
    node.nics
        .iter()
        .enumerate()
        .filter(|(_, n)| nic_unit(n, tier) == Some(unit))
        .map(|(i, _)| pos(i))
        .collect()
}

/// For each card, the NICs closest to it: same PCIe switch, else NUMA node, else socket, else
/// every NIC; the union, by name.
pub(crate) fn nearest_nics(node: &NodeState, cards: &[u8]) -> Vec<u8> {
    let mut out: Vec<u8> = Vec::new();
    for &p in cards {
        let card = &node.cards[usize::from(p)];
        let matching = |f: &dyn Fn(&crate::state::Nic) -> bool| -> Vec<u8> {
            node.nics
                .iter()
                .enumerate()
                .filter(|(_, n)| f(n))
                .map(|(i, _)| pos(i))
                .collect()
        };
        let mut near = Vec::new();
        if card.switch.is_some() {
            near = matching(&|n| n.switch == card.switch);
        }
        if near.is_empty() && card.numa.is_some() {
            near = matching(&|n| n.numa == card.numa);
        }
        if near.is_empty() && card.socket.is_some() {
            near = matching(&|n| n.socket == card.socket);
        }
        if near.is_empty() {
            near = matching(&|_| true);
        }
        out.extend(near);
    }
    out.sort_unstable();
    out.dedup();
    out
}
