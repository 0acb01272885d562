//! Predicates: whether a node may take a pod at all (readiness, cordon, taints, selector and
//! affinity, this project's gates, resource fit), and what a node's summary alone says about
//! its cards.

use super::explain::Why;
use super::prepare::{Fast, Prepared, Req, Subject, Tol};
use crate::cluster::Cluster;
use crate::intern::Sym;
use crate::model::{SelectorOperator, TaintEffect};
use crate::place::CardFail;
use crate::state::{NodeId, NodeState, Spec, Summary, VendorFilter, flag};
use runtimekit_contract::CardRequest;

impl Cluster {
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

    pub(super) fn passes(&self, prep: &Prepared, id: NodeId) -> bool {
        self.filter(prep, id, &mut |_| {}) && (!prep.rdma || self.summaries[id as usize].nics > 0)
    }

    /// A failure known from the summary alone, for the shapes with an index.
    pub(super) fn quick_fail(&self, prep: &Prepared, s: &Summary) -> Option<Why> {
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

    /// Whether a node's summary lets every container fit on its own, a cheap necessary
    /// condition before placing them together.
    pub(super) fn summary_admits(&self, prep: &Prepared, s: &Summary) -> bool {
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
}

fn tolerates(t: &Tol, key: Sym, value: Sym, effect: TaintEffect) -> bool {
    t.effect.is_none_or(|e| e == effect)
        && t.key.is_none_or(|k| k == Some(key))
        && t.value.is_none_or(|v| v == Some(value))
}
