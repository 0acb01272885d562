//! Preemption: which lower-priority pods to evict so that a pod that fits nowhere fits on one
//! node, with kube-scheduler's rules.
//!
//! For each node, every unit of lower priority that holds something there is taken out in a
//! what-if (the engine's own accounting, recounted for the touched nodes only, then put back);
//! a node where the pod still does not fit is no candidate. On a candidate, units are given back
//! one by one, those whose eviction would break a PodDisruptionBudget first, then the highest
//! priority first, keeping each one whose return still lets the pod fit: what stays out is the
//! victim set. The candidate chosen has the fewest victims that break a budget, then the lowest
//! highest victim priority, the lowest sum of victim priorities, the fewest victims, then the
//! node name. A unit is one pod, or every member of a running gang: a gang is evicted whole or
//! not at all, and only when every member has a lower priority than the preemptor.
//!
//! Because victims are taken out of the same accounting that places pods, the room they leave
//! is exactly what the pod's request needs: a time-division share frees shares on one card, a
//! MIG request the instances overlapping one placement, whole cards a set the topology rules
//! pick.

use crate::cluster::Cluster;
use crate::decide::PreparedPod;
use crate::model::{Decision, PodInput};
use crate::state::{Amounts, NodeId, PodSlot, SliceRec};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// At least this many candidate nodes are compared before one is chosen (kube-scheduler's
/// `minCandidateNodesAbsolute`), or a tenth of the nodes where that is more.
const MIN_CANDIDATES: usize = 100;

/// A running pod that may be evicted, as the caller knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// Its UID, as the engine keys its allocations.
    pub uid: String,
    /// Its priority (`spec.priority`).
    pub priority: i32,
    /// The gang it belongs to: the members of one gang are evicted together or not at all.
    pub gang: Option<String>,
    /// The PodDisruptionBudgets that select it, as positions in the `budgets` given to
    /// [`Cluster::preempt`].
    pub budgets: Vec<usize>,
}

/// The pods to evict for a pod, and where it then goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preemption {
    /// The node the pod is nominated to.
    pub node: String,
    /// The victims' UIDs, sorted.
    pub victims: Vec<String>,
    /// How many victims' evictions break a PodDisruptionBudget.
    pub budget_violations: usize,
    /// Where the pod goes once the victims are gone.
    pub decision: Decision,
}

/// One or more pods evicted together.
#[derive(Debug)]
struct Unit {
    members: Vec<PodSlot>,
    /// The highest member priority.
    priority: i32,
    /// The sum of member priorities.
    priority_sum: i64,
    budgets: Vec<usize>,
}

/// What a what-if took out of one pod, to put back.
struct Lifted {
    slot: PodSlot,
    slices: Vec<SliceRec>,
    usage: Option<(NodeId, Amounts)>,
}

/// How good a candidate node is: lower is better.
type Rank = (usize, i32, i64, usize, String);

impl Cluster {
    /// The pods to evict so that `pod` of `priority` fits, chosen among `candidates` (running
    /// pods the caller may evict; only those of lower priority are considered), and where it
    /// then goes; `None` when no eviction makes it fit. `budgets` holds each
    /// PodDisruptionBudget's disruptions allowed now. Changes nothing.
    pub fn preempt(
        &mut self,
        pod: &PodInput,
        priority: i32,
        candidates: &[Candidate],
        budgets: &[i32],
    ) -> Option<Preemption> {
        let mut prep = self.prepare(pod);
        self.refuse_unsupported(&prep).ok()?;
        self.mark_selected_nodes(&mut prep);
        let units = self.units(priority, candidates);
        // In name order, so the candidates compared do not depend on how the state was built.
        let mut by_node: BTreeMap<Arc<str>, (NodeId, BTreeSet<usize>)> = BTreeMap::new();
        for (position, unit) in units.iter().enumerate() {
            for id in self.nodes_of(&unit.members) {
                let name = self.nodes[id as usize].name.clone();
                by_node
                    .entry(name)
                    .or_insert((id, BTreeSet::new()))
                    .1
                    .insert(position);
            }
        }
        let wanted = MIN_CANDIDATES.max(self.node_count() / 10);
        let mut best: Option<(Rank, NodeId, Vec<usize>, usize)> = None;
        let mut found = 0;
        for (name, (id, on_node)) in by_node {
            if found >= wanted {
                break;
            }
            let all: Vec<usize> = on_node.into_iter().collect();
            if !self.fits_without(&prep, id, &units, &all) {
                continue;
            }
            found += 1;
            let (victims, violations) = self.reprieve(&prep, id, &units, all, budgets);
            let rank: Rank = (
                violations,
                victims
                    .iter()
                    .map(|&u| units[u].priority)
                    .max()
                    .unwrap_or(i32::MIN),
                victims.iter().map(|&u| units[u].priority_sum).sum(),
                victims.iter().map(|&u| units[u].members.len()).sum(),
                name.to_string(),
            );
            if best.as_ref().is_none_or(|(b, ..)| rank < *b) {
                best = Some((rank, id, victims, violations));
            }
        }
        let (_, id, victims, budget_violations) = best?;
        let lifted = self.lift(&units, &victims);
        let chosen = self.place_on(&prep, id);
        let decision = chosen.map(|chosen| self.decision(pod, id, &chosen));
        self.put_back(lifted);
        let mut uids: Vec<String> = victims
            .iter()
            .flat_map(|&u| &units[u].members)
            .map(|&slot| self.pods[slot as usize].uid.to_string())
            .collect();
        uids.sort();
        Some(Preemption {
            node: self.nodes[id as usize].name.to_string(),
            victims: uids,
            budget_violations,
            decision: decision?,
        })
    }

    /// The candidates of lower priority than `priority` that hold something, grouped into the
    /// units that are evicted together; a gang with any member of equal or higher priority is
    /// left out whole.
    fn units(&self, priority: i32, candidates: &[Candidate]) -> Vec<Unit> {
        let mut gangs: BTreeMap<&str, Vec<&Candidate>> = BTreeMap::new();
        let mut singles = Vec::new();
        for candidate in candidates {
            match &candidate.gang {
                Some(gang) => gangs.entry(gang).or_default().push(candidate),
                None => singles.push(vec![candidate]),
            }
        }
        singles
            .into_iter()
            .chain(gangs.into_values())
            .filter(|members| members.iter().all(|m| m.priority < priority))
            .filter_map(|members| {
                let slots: Vec<PodSlot> = members
                    .iter()
                    .filter_map(|m| self.pod_ids.get(m.uid.as_str()).copied())
                    .filter(|&slot| {
                        let record = &self.pods[slot as usize];
                        !record.slices.is_empty() || record.usage.is_some()
                    })
                    .collect();
                (!slots.is_empty()).then(|| Unit {
                    members: slots,
                    priority: members.iter().map(|m| m.priority).max().unwrap_or(i32::MIN),
                    priority_sum: members.iter().map(|m| i64::from(m.priority)).sum(),
                    budgets: members
                        .iter()
                        .flat_map(|m| m.budgets.iter().copied())
                        .collect(),
                })
            })
            .collect()
    }

    /// The nodes where the pods of `slots` hold something.
    fn nodes_of(&self, slots: &[PodSlot]) -> BTreeSet<NodeId> {
        slots
            .iter()
            .flat_map(|&slot| {
                let record = &self.pods[slot as usize];
                record
                    .slices
                    .iter()
                    .map(|s| s.node)
                    .chain(record.usage.as_ref().map(|(n, _)| *n))
            })
            .collect()
    }

    /// Whether the pod fits on `id` once the units `out` are gone.
    fn fits_without(
        &mut self,
        prep: &PreparedPod,
        id: NodeId,
        units: &[Unit],
        out: &[usize],
    ) -> bool {
        let lifted = self.lift(units, out);
        let fits = self.place_on(prep, id).is_some();
        self.put_back(lifted);
        fits
    }

    /// Gives units back to the node while the pod still fits without the rest: the victims
    /// that stay, and how many of their pods' evictions break a budget.
    fn reprieve(
        &mut self,
        prep: &PreparedPod,
        id: NodeId,
        units: &[Unit],
        mut out: Vec<usize>,
        budgets: &[i32],
    ) -> (Vec<usize>, usize) {
        out.sort_by_key(|&u| (std::cmp::Reverse(units[u].priority), u));
        // kube-scheduler's count: walking the victims from the highest priority, each pod a
        // budget selects uses one of its allowed disruptions; past zero it breaks the budget.
        let mut allowed = budgets.to_vec();
        let breaks: BTreeSet<usize> = out
            .iter()
            .copied()
            .filter(|&u| {
                let mut breaks = false;
                for &b in &units[u].budgets {
                    if let Some(left) = allowed.get_mut(b) {
                        *left -= 1;
                        breaks |= *left < 0;
                    }
                }
                breaks
            })
            .collect();
        let order: Vec<usize> = out
            .iter()
            .copied()
            .filter(|u| breaks.contains(u))
            .chain(out.iter().copied().filter(|u| !breaks.contains(u)))
            .collect();
        for unit in order {
            let without: Vec<usize> = out.iter().copied().filter(|&u| u != unit).collect();
            if self.fits_without(prep, id, units, &without) {
                out = without;
            }
        }
        let violations = out
            .iter()
            .filter(|u| breaks.contains(u))
            .map(|&u| units[u].members.len())
            .sum();
        (out, violations)
    }

    /// Takes what the pods of `out` hold out of the accounting of every node they touch.
    fn lift(&mut self, units: &[Unit], out: &[usize]) -> Vec<Lifted> {
        let mut lifted = Vec::new();
        let mut touched = BTreeSet::new();
        for &slot in out.iter().flat_map(|&u| &units[u].members) {
            let record = &mut self.pods[slot as usize];
            let slices = std::mem::take(&mut record.slices);
            let usage = record.usage.take();
            touched.extend(slices.iter().map(|s| s.node));
            touched.extend(usage.as_ref().map(|(n, _)| *n));
            lifted.push(Lifted {
                slot,
                slices,
                usage,
            });
        }
        for id in touched {
            self.recount(id);
        }
        lifted
    }

    /// Puts back what [`Cluster::lift`] took.
    fn put_back(&mut self, lifted: Vec<Lifted>) {
        let mut touched = BTreeSet::new();
        for Lifted {
            slot,
            slices,
            usage,
        } in lifted
        {
            touched.extend(slices.iter().map(|s| s.node));
            touched.extend(usage.as_ref().map(|(n, _)| *n));
            let record = &mut self.pods[slot as usize];
            record.slices = slices;
            record.usage = usage;
        }
        for id in touched {
            self.recount(id);
        }
    }
}
