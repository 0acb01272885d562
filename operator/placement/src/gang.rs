//! Gangs: every member placed in one decision, in the lowest network tier that holds them all,
//! never across network pods; and the reservations that hold their capacity until binding.
//!
//! Nodes are kept in topology order (network pod, leaf switch, HyperNode, name), so every group
//! of every tier is a contiguous run and its capacity a difference of prefix sums.

use crate::cluster::{Cluster, CommitError, Part};
use crate::decide::{CardShape, PreparedPod, Rejection, Rejections};
use crate::mig_cache::MigCache;
use crate::model::{Decision, GangConstraint, GangDecision, PodInput, Tier};
use crate::reason::{GangShortfall, GroupCapacity, Unschedulable};
use crate::state::{CardUse, NodeId, Summary};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// A contiguous run of nodes (positions in topology order) forming one group of one tier.
#[derive(Debug, Clone)]
struct Group {
    start: usize,
    end: usize,
    name: Arc<str>,
}

/// Card and resource usage of a node while members are placed on it.
#[derive(Debug)]
struct Scratch {
    uses: Vec<CardUse>,
    cpu: u64,
    mem: u64,
    pods: u64,
    scalars: BTreeMap<String, u64>,
}

/// Whether two members ask for the same thing, so one capacity count serves both.
fn same_shape(a: &PodInput, b: &PodInput) -> bool {
    a.containers == b.containers
        && a.resources == b.resources
        && a.node_selector == b.node_selector
        && a.required_affinity == b.required_affinity
        && a.tolerations == b.tolerations
}

fn tier_level(tier: Tier) -> usize {
    match tier {
        Tier::Node => 0,
        Tier::HyperNode => 1,
        Tier::LeafSwitch => 2,
        Tier::NetworkPod => 3,
    }
}

impl Cluster {
    /// How many members of one shape fit on a node now, up to `limit`; reports why when none.
    fn capacity(
        &self,
        prep: &PreparedPod,
        id: NodeId,
        limit: usize,
        reject: &mut impl FnMut(Rejection),
    ) -> usize {
        if !self.passes_predicates(prep, id, reject) {
            return 0;
        }
        let s = &self.summaries[id as usize];
        let node = &self.nodes[id as usize];
        let per = |free: u64, want: u64| {
            free.checked_div(want)
                .map_or(limit, |n| usize::try_from(n).unwrap_or(usize::MAX))
        };
        let r = &prep.pod.resources;
        let mut cap = limit
            .min(per(s.cpu_free, r.cpu_milli))
            .min(per(s.mem_free, r.memory_bytes))
            .min(usize::try_from(s.pods_free).unwrap_or(usize::MAX));
        for (name, &want) in &r.scalar {
            cap = cap.min(per(self.scalar_free(id, name), want));
        }
        if prep.wants_cards {
            cap = cap.min(self.card_capacity(prep, id, s, cap));
        }
        if cap == 0
            && let Err(rejection) = self.place_pod(prep, id, &node.uses)
        {
            reject(rejection);
        }
        cap
    }

    /// How many members fit on a node's cards, up to `limit`.
    fn card_capacity(&self, prep: &PreparedPod, id: NodeId, s: &Summary, limit: usize) -> usize {
        let node = &self.nodes[id as usize];
        if prep.wants_rdma && node.nics.is_empty() {
            return 0;
        }
        match prep.shape {
            CardShape::Whole { cards, vendor, .. } if cards > 0 => {
                usize::from(s.free[vendor.slot()]) / cards
            }
            CardShape::Tdm {
                core,
                memory_mib,
                cards: 1,
            } => {
                let mut total = 0usize;
                for (card, card_use) in node.cards.iter().zip(&node.uses) {
                    if let Some((free_core, free_memory)) = card.tdm_room(card_use) {
                        let by_core = free_core.checked_div(core).map_or(limit, usize::from);
                        let by_mem = free_memory
                            .checked_div(memory_mib)
                            .map_or(limit, |n| usize::try_from(n).unwrap_or(usize::MAX));
                        total = total.saturating_add(by_core.min(by_mem));
                        if total >= limit {
                            return limit;
                        }
                    }
                }
                total
            }
            CardShape::Mig { slices, memory_mib } => {
                let mut total = 0usize;
                for (card, card_use) in node.cards.iter().zip(&node.uses) {
                    let Some((table, mut occupied)) = card.mig_room(card_use) else {
                        continue;
                    };
                    let Ok((at, profile)) = MigCache::pick(table, slices, memory_mib) else {
                        continue;
                    };
                    while total < limit
                        && let Some((start, _)) = self.mig.fit(table, at, occupied)
                    {
                        occupied |= profile.mask_at(start);
                        total += 1;
                    }
                }
                total
            }
            _ => {
                let mut uses = node.uses.clone();
                let mut total = 0;
                while total < limit {
                    let Ok((_, chosen)) = self.place_pod(prep, id, &uses) else {
                        break;
                    };
                    for c in &chosen {
                        for (p, share) in &c.cards {
                            let p = usize::from(*p);
                            node.cards[p].apply(&mut uses[p], share);
                        }
                    }
                    total += 1;
                }
                total
            }
        }
    }

    /// Whether one more member's resources fit on a node beside those already placed.
    fn resources_fit(&self, prep: &PreparedPod, id: NodeId, scratch: &Scratch) -> bool {
        let s = &self.summaries[id as usize];
        let r = &prep.pod.resources;
        r.cpu_milli.saturating_add(scratch.cpu) <= s.cpu_free
            && r.memory_bytes.saturating_add(scratch.mem) <= s.mem_free
            && scratch.pods < s.pods_free
            && r.scalar.iter().all(|(name, &want)| {
                let used = scratch.scalars.get(name).copied().unwrap_or(0);
                want.saturating_add(used) <= self.scalar_free(id, name)
            })
    }

    /// The groups of each tier over the nodes in topology order (tier 0: one per node).
    fn groups(&self, keys: &[&crate::cluster::TopoKey]) -> [Vec<Group>; 4] {
        let mut tiers: [Vec<Group>; 4] = Default::default();
        tiers[0] = keys
            .iter()
            .enumerate()
            .map(|(i, k)| Group {
                start: i,
                end: i + 1,
                name: k.name.clone(),
            })
            .collect();
        for (tier, groups) in tiers.iter_mut().enumerate().skip(1) {
            // Tier 3 is the network pod, part 0; tier 1 the HyperNode, part 2.
            let level = 3 - tier;
            let mut i = 0;
            while i < keys.len() {
                let head = &keys[i].parts[..=level];
                let mut end = i + 1;
                let name = match &head[level] {
                    Part::Named(name) => {
                        while end < keys.len() && keys[end].parts[..=level] == *head {
                            end += 1;
                        }
                        name.clone()
                    }
                    Part::Solo => keys[i].name.clone(),
                };
                groups.push(Group {
                    start: i,
                    end,
                    name,
                });
                i = end;
            }
        }
        tiers
    }

    /// Decides where every member of a gang goes, all or nothing, without changing anything.
    ///
    /// Members that ask for the same thing are counted together. The lowest tier (node,
    /// HyperNode, leaf switch, network pod, up to `constraint.highest_tier`) with a group that
    /// holds every member wins; among such groups the one with the least spare capacity, then
    /// the first by name. Inside the group, members fill the sub-group that holds the rest
    /// most tightly, else the largest sub-group first, down to nodes, so the gang spans as few
    /// switches and nodes as it can. An empty gang is trivially placed at node tier.
    pub fn decide_gang(
        &self,
        members: &[PodInput],
        constraint: &GangConstraint,
    ) -> Result<GangDecision, Unschedulable> {
        let mut preps: Vec<PreparedPod> = members.iter().map(|m| self.prepare(m)).collect();
        let mut shapes: Vec<usize> = Vec::new();
        let mut shape_of: Vec<usize> = Vec::with_capacity(members.len());
        let mut demand: Vec<usize> = Vec::new();
        for (i, m) in members.iter().enumerate() {
            match shapes.iter().position(|&r| same_shape(&members[r], m)) {
                Some(j) => {
                    shape_of.push(j);
                    demand[j] += 1;
                }
                None => {
                    shape_of.push(shapes.len());
                    shapes.push(i);
                    demand.push(1);
                }
            }
        }
        let Some(&first) = shapes.first() else {
            return Ok(GangDecision {
                gang: constraint.name.clone(),
                tier: Tier::Node,
                group: String::new(),
                nodes: Vec::new(),
                members: Vec::new(),
            });
        };
        for prep in &preps {
            self.refuse_unsupported(prep)?;
        }
        for &rep in &shapes {
            self.mark_selected_nodes(&mut preps[rep]);
        }
        let keys: Vec<&crate::cluster::TopoKey> = self.topo.iter().collect();
        let order: Vec<NodeId> = keys.iter().map(|k| k.id).collect();
        let mut rejections = Rejections::default();
        let caps: Vec<Vec<usize>> = shapes
            .iter()
            .enumerate()
            .map(|(j, &rep)| {
                order
                    .iter()
                    .map(|&id| {
                        if j == 0 {
                            self.capacity(&preps[rep], id, demand[j], &mut |rejection| {
                                rejections.add(rejection)
                            })
                        } else {
                            self.capacity(&preps[rep], id, demand[j], &mut |_| {})
                        }
                    })
                    .collect()
            })
            .collect();
        let prefix: Vec<Vec<usize>> = caps
            .iter()
            .map(|c| {
                let mut p = Vec::with_capacity(c.len() + 1);
                p.push(0);
                for &v in c {
                    p.push(p[p.len() - 1] + v);
                }
                p
            })
            .collect();
        let held = |j: usize, g: &Group| prefix[j][g.end] - prefix[j][g.start];
        let groups = self.groups(&keys);
        let highest = tier_level(constraint.highest_tier);
        for (level, tier) in Tier::ALL.iter().enumerate().take(highest + 1) {
            let mut candidates: Vec<&Group> = groups[level]
                .iter()
                .filter(|g| (0..shapes.len()).all(|j| held(j, g) >= demand[j]))
                .collect();
            candidates.sort_by(|a, b| {
                let total = |g: &Group| (0..shapes.len()).map(|j| held(j, g)).sum::<usize>();
                total(a)
                    .cmp(&total(b))
                    .then_with(|| a.name.cmp(&b.name))
                    .then_with(|| a.start.cmp(&b.start))
            });
            for group in candidates {
                let mut positions = Vec::new();
                self.fill_order(level, group, demand[0], &groups, &prefix[0], &mut positions);
                let mut included = vec![false; group.end - group.start];
                for &p in &positions {
                    included[p - group.start] = true;
                }
                positions.extend(
                    (group.start..group.end)
                        .filter(|&p| !included[p - group.start] && caps.iter().any(|c| c[p] > 0)),
                );
                if let Some(decisions) =
                    self.assign(members, &preps, &shape_of, &caps, &order, &positions)
                {
                    let nodes: BTreeSet<String> =
                        decisions.iter().map(|d| d.node.clone()).collect();
                    return Ok(GangDecision {
                        gang: constraint.name.clone(),
                        tier: *tier,
                        group: group.name.to_string(),
                        nodes: nodes.into_iter().collect(),
                        members: decisions,
                    });
                }
            }
        }
        let largest = groups[highest]
            .iter()
            .map(|g| (held(0, g), g))
            .filter(|(h, _)| *h > 0)
            .max_by(|a, b| a.0.cmp(&b.0).then_with(|| b.1.name.cmp(&a.1.name)))
            .map(|(h, g)| GroupCapacity {
                group: g.name.to_string(),
                members: h,
            });
        Err(self.gang_unschedulable(
            &preps[first],
            rejections,
            GangShortfall {
                gang: constraint.name.clone(),
                members: members.len(),
                highest_tier: constraint.highest_tier,
                largest,
            },
        ))
    }

    /// Node positions of a group in fill order for `need` members.
    fn fill_order(
        &self,
        level: usize,
        group: &Group,
        need: usize,
        groups: &[Vec<Group>; 4],
        prefix: &[usize],
        out: &mut Vec<usize>,
    ) {
        if level == 0 {
            out.push(group.start);
            return;
        }
        let held = |g: &Group| prefix[g.end] - prefix[g.start];
        let below = &groups[level - 1];
        let first = below.partition_point(|g| g.start < group.start);
        let children: Vec<&Group> = below[first..]
            .iter()
            .take_while(|g| g.start < group.end)
            .filter(|g| held(g) > 0)
            .collect();
        let mut used = vec![false; children.len()];
        let mut remaining = need;
        while remaining > 0 {
            let open = || children.iter().enumerate().filter(|(i, _)| !used[*i]);
            let tight = open().filter(|(_, g)| held(g) >= remaining).min_by(|a, b| {
                held(a.1)
                    .cmp(&held(b.1))
                    .then_with(|| a.1.name.cmp(&b.1.name))
            });
            if let Some((_, g)) = tight {
                self.fill_order(level - 1, g, remaining, groups, prefix, out);
                return;
            }
            let Some((i, g)) = open().max_by(|a, b| {
                held(a.1)
                    .cmp(&held(b.1))
                    .then_with(|| b.1.name.cmp(&a.1.name))
            }) else {
                return;
            };
            used[i] = true;
            remaining -= held(g);
            self.fill_order(level - 1, g, held(g), groups, prefix, out);
        }
    }

    /// Places members in order on the given node positions, first fit per shape.
    fn assign(
        &self,
        members: &[PodInput],
        preps: &[PreparedPod],
        shape_of: &[usize],
        caps: &[Vec<usize>],
        order: &[NodeId],
        positions: &[usize],
    ) -> Option<Vec<Decision>> {
        let mut scratch: BTreeMap<NodeId, Scratch> = BTreeMap::new();
        let mut cursor = vec![0usize; caps.len()];
        let mut out = Vec::with_capacity(members.len());
        for (i, member) in members.iter().enumerate() {
            let j = shape_of[i];
            let prep = &preps[i];
            loop {
                let &p = positions.get(cursor[j])?;
                if caps[j][p] == 0 {
                    cursor[j] += 1;
                    continue;
                }
                let id = order[p];
                let sc = scratch
                    .entry(id)
                    .or_insert_with(|| Scratch::new(self.nodes[id as usize].uses.clone()));
                let placed = if self.resources_fit(prep, id, sc) {
                    self.place_pod(prep, id, &sc.uses).ok()
                } else {
                    None
                };
                let Some((_, chosen)) = placed else {
                    cursor[j] += 1;
                    continue;
                };
                let node = &self.nodes[id as usize];
                for c in &chosen {
                    for (p, share) in &c.cards {
                        let p = usize::from(*p);
                        node.cards[p].apply(&mut sc.uses[p], share);
                    }
                }
                sc.cpu = sc.cpu.saturating_add(member.resources.cpu_milli);
                sc.mem = sc.mem.saturating_add(member.resources.memory_bytes);
                sc.pods += 1;
                for (name, &v) in &member.resources.scalar {
                    *sc.scalars.entry(name.clone()).or_insert(0) += v;
                }
                out.push(self.decision(member, id, &chosen));
                break;
            }
        }
        Some(out)
    }

    /// Holds a gang's capacity: every member is committed, or none is. The reservation lasts
    /// until [`Cluster::confirm_gang`] (binding done) or [`Cluster::release_gang`] (rollback).
    pub fn reserve_gang(&mut self, decision: &GangDecision) -> Result<(), CommitError> {
        if self.gangs.contains_key(decision.gang.as_str()) {
            return Err(CommitError::GangReserved(decision.gang.clone()));
        }
        let mut scratch = BTreeMap::new();
        let mut ids = Vec::with_capacity(decision.members.len());
        let mut uids = BTreeSet::new();
        for d in &decision.members {
            if !uids.insert(d.pod_uid.as_str()) {
                return Err(CommitError::AlreadyPlaced(d.pod_uid.clone()));
            }
            ids.push(self.check(d, &mut scratch)?);
        }
        for (d, id) in decision.members.iter().zip(ids) {
            let d = Decision {
                gang: Some(decision.gang.clone()),
                ..d.clone()
            };
            self.apply(&d, id);
        }
        self.gangs.insert(
            decision.gang.as_str().into(),
            decision
                .members
                .iter()
                .map(|d| d.pod_uid.as_str().into())
                .collect(),
        );
        Ok(())
    }

    /// Ends a gang's reservation once every member is bound; the members keep their
    /// allocations as ordinary pods. Returns whether the gang held a reservation.
    pub fn confirm_gang(&mut self, gang: &str) -> bool {
        self.gangs.remove(gang).is_some()
    }

    /// Rolls a gang back: releases every member's allocations. Returns how many members held
    /// any.
    pub fn release_gang(&mut self, gang: &str) -> usize {
        let Some(members) = self.gangs.remove(gang) else {
            return 0;
        };
        members.iter().filter(|uid| self.release(uid)).count()
    }
}

impl Scratch {
    fn new(uses: Vec<CardUse>) -> Self {
        Scratch {
            uses,
            cpu: 0,
            mem: 0,
            pods: 0,
            scalars: BTreeMap::new(),
        }
    }
}
