//! Predicates: whether a node may take a pod at all (readiness, cordon, taints, selector and
//! affinity, this project's gates, resource fit), and what a node's summary alone says about
//! its cards.

use super::explain::Rejection;
use super::prepare::{
    CardShape, PreparedPod, RequirementSubject, ResolvedRequirement, ResolvedToleration,
};
use crate::cluster::Cluster;
use crate::intern::Sym;
use crate::model::{Function, SelectorOperator, TaintEffect};
use crate::place::CardFail;
use crate::state::{NodeId, NodeState, Spec, Summary, SwitchedBy, VendorFilter, flag};
use runtimekit_contract::CardRequest;

impl Cluster {
    /// The standard predicates, kube-scheduler's order: readiness, cordon, taints, selector and
    /// affinity, then this project's node gates, then resource fit. Reports each failure.
    pub(crate) fn passes_predicates(
        &self,
        prep: &PreparedPod,
        id: NodeId,
        reject: &mut impl FnMut(Rejection),
    ) -> bool {
        let summary = &self.summaries[id as usize];
        if !summary.has(flag::KNOWN) {
            return false;
        }
        if !summary.has(flag::READY) {
            reject(Rejection::NotReady);
            return false;
        }
        if summary.has(flag::CORDONED) && !prep.tolerates_cordon {
            reject(Rejection::Cordoned);
            return false;
        }
        // The node itself is read only for what its summary cannot answer.
        let node = &self.nodes[id as usize];
        if summary.has(flag::TAINTED)
            && let Some(spec) = &node.spec
            && let Some(&(key, value, _)) = spec.taints.iter().find(|&&(key, value, effect)| {
                effect != TaintEffect::PreferNoSchedule
                    && !prep
                        .tolerations
                        .iter()
                        .any(|t| tolerates(t, key, value, effect))
            })
        {
            reject(Rejection::UntoleratedTaint { key, value });
            return false;
        }
        if !self.matches_selector_and_affinity(prep, id, node) {
            reject(Rejection::NodeAffinity);
            return false;
        }
        if prep.wants_cards {
            if !summary.has(flag::GPU) {
                reject(Rejection::NotEnabled);
                return false;
            }
            if !summary.has(flag::AGENT) {
                reject(Rejection::AgentNotReporting);
                return false;
            }
            let switched_off = |wanted: bool, bit: u8, of: fn(&Spec) -> Option<SwitchedBy>| {
                (wanted && summary.has(bit))
                    .then(|| node.spec.as_ref().and_then(of))
                    .flatten()
            };
            let off = switched_off(prep.wants_tdm, flag::TDM_OFF, |s| s.tdm_off)
                .map(|by| (Function::Tdm, by))
                .or_else(|| {
                    switched_off(prep.wants_mig, flag::MIG_OFF, |s| s.mig_off)
                        .map(|by| (Function::Mig, by))
                });
            if let Some((function, by)) = off {
                reject(Rejection::SwitchedOff { function, by });
                return false;
            }
            if prep.wants_whole && node.spec.as_ref().is_some_and(|s| s.whole_cards_by_dra) {
                reject(Rejection::WholeCardsByDra);
                return false;
            }
        }
        // Every resource that does not fit is reported, as kube-scheduler does.
        let mut fits = true;
        if prep.cpu_milli > summary.cpu_free {
            reject(Rejection::InsufficientCpu);
            fits = false;
        }
        if prep.memory_bytes > summary.mem_free {
            reject(Rejection::InsufficientMemory);
            fits = false;
        }
        if summary.pods_free == 0 {
            reject(Rejection::TooManyPods);
            fits = false;
        }
        for (resource, &(symbol, want)) in prep.scalars.iter().enumerate() {
            let free = symbol.map_or(0, |symbol| node.scalar_free(symbol));
            if want > free {
                reject(Rejection::InsufficientScalar { resource });
                fits = false;
            }
        }
        fits
    }

    fn matches_selector_and_affinity(
        &self,
        prep: &PreparedPod,
        id: NodeId,
        node: &NodeState,
    ) -> bool {
        if prep.selector_matches_nothing {
            return false;
        }
        if let Some(bits) = &prep.selected_nodes {
            let id = id as usize;
            if bits
                .get(id / 64)
                .is_none_or(|word| word & (1 << (id % 64)) == 0)
            {
                return false;
            }
        } else if let Some(pairs) = &prep.node_selector {
            let Some(spec) = &node.spec else {
                return false;
            };
            if !pairs
                .iter()
                .all(|&(key, value)| spec.label(key) == Some(value))
            {
                return false;
            }
        }
        let Some(terms) = &prep.required_affinity else {
            return true;
        };
        let Some(spec) = &node.spec else {
            return false;
        };
        terms.iter().any(|term| {
            !term.is_empty()
                && term
                    .iter()
                    .all(|requirement| self.requirement_holds(requirement, node, spec))
        })
    }

    fn requirement_holds(
        &self,
        requirement: &ResolvedRequirement,
        node: &NodeState,
        spec: &Spec,
    ) -> bool {
        let key = match requirement.subject {
            RequirementSubject::Label(key) => key,
            RequirementSubject::Name => {
                let named = requirement.raw_values.iter().any(|v| **v == *node.name);
                return match requirement.operator {
                    SelectorOperator::In => named,
                    SelectorOperator::NotIn => !named,
                    _ => false,
                };
            }
            RequirementSubject::OtherField => return false,
        };
        let value = key.and_then(|key| spec.label(key));
        let listed = |value: Sym| requirement.values.contains(&Some(value));
        match requirement.operator {
            SelectorOperator::In => value.is_some_and(listed),
            SelectorOperator::NotIn => value.is_none_or(|value| !listed(value)),
            SelectorOperator::Exists => value.is_some(),
            SelectorOperator::DoesNotExist => value.is_none(),
            SelectorOperator::Gt | SelectorOperator::Lt => {
                let (Some(value), [bound]) = (value, requirement.raw_values) else {
                    return false;
                };
                let (Ok(value), Ok(bound)) = (
                    self.interner.text(value).parse::<i64>(),
                    bound.parse::<i64>(),
                ) else {
                    return false;
                };
                if requirement.operator == SelectorOperator::Gt {
                    value > bound
                } else {
                    value < bound
                }
            }
        }
    }

    /// Free amount of a scalar resource on a node.
    pub(crate) fn scalar_free(&self, id: NodeId, name: &str) -> u64 {
        self.interner
            .get(name)
            .map_or(0, |symbol| self.nodes[id as usize].scalar_free(symbol))
    }

    /// Whether a node found in an index passes the predicates and has a NIC when asked for.
    pub(super) fn is_candidate(&self, prep: &PreparedPod, id: NodeId) -> bool {
        self.passes_predicates(prep, id, &mut |_| {})
            && (!prep.wants_rdma || self.summaries[id as usize].nics > 0)
    }

    /// A failure known from the summary alone, for the shapes with an index.
    pub(super) fn summary_rejection(
        &self,
        prep: &PreparedPod,
        summary: &Summary,
    ) -> Option<Rejection> {
        let cards = |fail| Some(Rejection::Cards { container: 0, fail });
        if prep.wants_rdma && summary.nics == 0 {
            return Some(Rejection::NoRdmaNic);
        }
        match prep.shape {
            CardShape::Whole {
                cards: wanted,
                vendor,
                ..
            } if usize::from(summary.free[vendor.slot()]) < wanted => {
                let capable = usize::from(summary.capable[vendor.slot()]);
                cards(CardFail::too_few_whole(summary.cards > 0, capable, wanted))
            }
            CardShape::Tdm { .. } if summary.tdm_cards == 0 => {
                cards(CardFail::no_share(summary.tdm_block))
            }
            CardShape::Tdm {
                core,
                memory_mib,
                cards: wanted,
            } if usize::from(summary.tdm_cards) < wanted
                || summary.tdm_max_core < core
                || summary.tdm_max_mem < memory_mib =>
            {
                cards(CardFail::TdmNoRoom)
            }
            CardShape::Mig { .. } if summary.mig_cards == 0 => cards(CardFail::no_mig_mode(
                summary.healthy > 0,
                summary.cards > 0,
            )),
            _ => None,
        }
    }

    /// Whether a node's summary lets every container fit on its own, a cheap necessary
    /// condition before placing them together.
    pub(super) fn summary_admits(&self, prep: &PreparedPod, summary: &Summary) -> bool {
        prep.pod.containers.iter().all(|container| {
            let wanted = container.cards.cards() as usize;
            match container.cards {
                CardRequest::Whole { name, .. } => {
                    usize::from(summary.free[VendorFilter::of(name).slot()]) >= wanted
                }
                CardRequest::Tdm {
                    core, memory_mib, ..
                } => {
                    usize::from(summary.tdm_cards) >= wanted
                        && summary.tdm_max_core >= core.unwrap_or(0)
                        && summary.tdm_max_mem >= memory_mib.unwrap_or(0)
                }
                CardRequest::Mig { .. } => usize::from(summary.mig_open) >= wanted,
            }
        })
    }
}

fn tolerates(toleration: &ResolvedToleration, key: Sym, value: Sym, effect: TaintEffect) -> bool {
    toleration.effect.is_none_or(|e| e == effect)
        && toleration.key.is_none_or(|k| k == Some(key))
        && toleration.value.is_none_or(|v| v == Some(value))
}
