//! A pod prepared for deciding: its strings resolved against the cluster's symbols once, and
//! the shape of its card request that tells which index can find it a node.

use crate::cluster::Cluster;
use crate::intern::Sym;
use crate::model::{PodInput, SelectorOperator, TaintEffect, Toleration, TolerationOperator};
use crate::state::{NodeId, VendorFilter};
use runtimekit_contract::{CardRequest, ContainerRequest};
use std::collections::BTreeSet;

/// The taint a cordoned node carries.
const CORDON_TAINT: &str = "node.kubernetes.io/unschedulable";

/// A toleration with its key and value resolved to symbols.
#[derive(Debug)]
pub(super) struct ResolvedToleration {
    /// `None`: every key (empty key with Exists); `Some(None)`: a key no node has.
    pub(super) key: Option<Option<Sym>>,
    /// `None`: any value (Exists); `Some(None)`: a value no node has.
    pub(super) value: Option<Option<Sym>>,
    pub(super) effect: Option<TaintEffect>,
}

/// What a node selector requirement looks at.
#[derive(Debug)]
pub(super) enum RequirementSubject {
    /// A label, by symbol; `None` when no node has that key.
    Label(Option<Sym>),
    /// The node's name (`matchFields` on `metadata.name`).
    Name,
    /// A field selectors may not use; matches nothing.
    OtherField,
}

/// A node selector requirement with its values resolved to symbols.
#[derive(Debug)]
pub(super) struct ResolvedRequirement<'p> {
    pub(super) subject: RequirementSubject,
    pub(super) operator: SelectorOperator,
    /// The values as symbols; `None` for a value no node has.
    pub(super) values: Vec<Option<Sym>>,
    /// The values as written, for node names and numeric comparisons.
    pub(super) raw_values: &'p [String],
}

/// What a pod asks of cards, in the forms the indexes answer.
#[derive(Debug, Clone, Copy)]
pub(crate) enum CardShape {
    /// No cards: every node is scored.
    NoCards,
    /// Several containers with cards, or MIG on several cards: nodes in order of free cards.
    ByNodeOrder,
    /// One container's TDM shares on `cards` cards (an absent core or memory asks for 0).
    Tdm {
        core: u8,
        memory_mib: u64,
        cards: usize,
    },
    /// One container's MIG instance on one card.
    Mig { slices: u8, memory_mib: Option<u64> },
    /// One container's whole cards.
    Whole {
        cards: usize,
        vendor: VendorFilter,
        rdma: bool,
    },
}

impl CardShape {
    /// The shape of a pod's containers that ask for cards.
    fn of(containers: &[ContainerRequest]) -> CardShape {
        let [only] = containers else {
            return if containers.is_empty() {
                CardShape::NoCards
            } else {
                CardShape::ByNodeOrder
            };
        };
        match only.cards {
            CardRequest::Tdm {
                cards,
                core,
                memory_mib,
            } => CardShape::Tdm {
                core: core.unwrap_or(0),
                memory_mib: memory_mib.unwrap_or(0),
                cards: cards as usize,
            },
            CardRequest::Mig {
                cards: 1,
                slices,
                memory_mib,
            } => CardShape::Mig { slices, memory_mib },
            CardRequest::Whole { cards, name } => CardShape::Whole {
                cards: cards as usize,
                vendor: VendorFilter::of(name),
                rdma: only.rdma,
            },
            CardRequest::Mig { .. } => CardShape::ByNodeOrder,
        }
    }
}

/// A pod with its strings resolved against the cluster's symbols.
#[derive(Debug)]
pub(crate) struct PreparedPod<'p> {
    pub pod: &'p PodInput,
    /// The nodeSelector's pairs that some node has.
    pub(super) node_selector: Option<Vec<(Sym, Sym)>>,
    /// Whether the nodeSelector names a key or value no node has, so no node matches.
    pub(super) selector_matches_nothing: bool,
    /// Required node affinity: any term, each of whose requirements all hold.
    pub(super) required_affinity: Option<Vec<Vec<ResolvedRequirement<'p>>>>,
    pub(super) tolerations: Vec<ResolvedToleration>,
    pub(super) tolerates_cordon: bool,
    pub(super) cpu_milli: u64,
    pub(super) memory_bytes: u64,
    /// Scalar resources in the pod's order; `None` for a name no node has.
    pub(super) scalars: Vec<(Option<Sym>, u64)>,
    pub wants_cards: bool,
    pub wants_rdma: bool,
    /// Whether a container asks for time-division shares, or for MIG instances.
    pub wants_tdm: bool,
    pub wants_mig: bool,
    /// Whether a container asks for whole cards.
    pub wants_whole: bool,
    pub shape: CardShape,
    /// Nodes matching the nodeSelector, by id bit, computed before scans of every node.
    pub(super) selected_nodes: Option<Vec<u64>>,
}

/// Whether a toleration lets a pod onto a cordoned node.
fn tolerates_cordon(toleration: &Toleration) -> bool {
    let key = match toleration.operator {
        TolerationOperator::Exists => toleration.key.is_empty() || toleration.key == CORDON_TAINT,
        TolerationOperator::Equal => toleration.key == CORDON_TAINT && toleration.value.is_empty(),
    };
    key && toleration
        .effect
        .is_none_or(|e| e == TaintEffect::NoSchedule)
}

impl Cluster {
    /// Resolves a pod's strings against the cluster's symbols.
    pub(crate) fn prepare<'p>(&self, pod: &'p PodInput) -> PreparedPod<'p> {
        let symbol = |text: &str| self.interner.get(text);
        let mut selector_matches_nothing = false;
        let node_selector = (!pod.node_selector.is_empty()).then(|| {
            let mut pairs = Vec::with_capacity(pod.node_selector.len());
            for (key, value) in &pod.node_selector {
                match (symbol(key), symbol(value)) {
                    (Some(key), Some(value)) => pairs.push((key, value)),
                    _ => selector_matches_nothing = true,
                }
            }
            pairs
        });
        let required_affinity = pod.required_affinity.as_ref().map(|terms| {
            terms
                .iter()
                .map(|term| {
                    let labels = term.match_expressions.iter().map(|r| (false, r));
                    let fields = term.match_fields.iter().map(|r| (true, r));
                    labels
                        .chain(fields)
                        .map(|(field, requirement)| ResolvedRequirement {
                            subject: match (field, requirement.key.as_str()) {
                                (false, key) => RequirementSubject::Label(symbol(key)),
                                (true, "metadata.name") => RequirementSubject::Name,
                                (true, _) => RequirementSubject::OtherField,
                            },
                            operator: requirement.operator,
                            values: requirement.values.iter().map(|v| symbol(v)).collect(),
                            raw_values: &requirement.values,
                        })
                        .collect()
                })
                .collect()
        });
        let tolerations = pod
            .tolerations
            .iter()
            .map(|t| ResolvedToleration {
                key: (!(t.key.is_empty() && t.operator == TolerationOperator::Exists))
                    .then(|| symbol(&t.key)),
                value: (t.operator == TolerationOperator::Equal).then(|| symbol(&t.value)),
                effect: t.effect,
            })
            .collect();
        PreparedPod {
            pod,
            node_selector,
            selector_matches_nothing,
            required_affinity,
            tolerations,
            tolerates_cordon: pod.tolerations.iter().any(tolerates_cordon),
            cpu_milli: pod.resources.cpu_milli,
            memory_bytes: pod.resources.memory_bytes,
            scalars: pod
                .resources
                .scalar
                .iter()
                .map(|(name, &amount)| (symbol(name), amount))
                .collect(),
            wants_cards: !pod.containers.is_empty(),
            wants_rdma: pod.containers.iter().any(|c| c.rdma),
            wants_tdm: pod
                .containers
                .iter()
                .any(|c| matches!(c.cards, CardRequest::Tdm { .. })),
            wants_mig: pod
                .containers
                .iter()
                .any(|c| matches!(c.cards, CardRequest::Mig { .. })),
            wants_whole: pod
                .containers
                .iter()
                .any(|c| matches!(c.cards, CardRequest::Whole { .. })),
            shape: CardShape::of(&pod.containers),
            selected_nodes: None,
        }
    }

    /// Resolves the nodeSelector into a bitmap from the label index, so a scan of every node
    /// reads one bit instead of each node's labels.
    pub(crate) fn mark_selected_nodes(&self, prep: &mut PreparedPod) {
        let Some(pairs) = &prep.node_selector else {
            return;
        };
        let mut bits = vec![0u64; self.nodes.len().div_ceil(64)];
        if !prep.selector_matches_nothing {
            let sets: Option<Vec<&BTreeSet<NodeId>>> =
                pairs.iter().map(|pair| self.labels.get(pair)).collect();
            if let Some(mut sets) = sets {
                sets.sort_by_key(|set| set.len());
                if let Some((smallest, rest)) = sets.split_first() {
                    for &id in *smallest {
                        if rest.iter().all(|set| set.contains(&id)) {
                            bits[id as usize / 64] |= 1 << (id % 64);
                        }
                    }
                }
            }
        }
        prep.selected_nodes = Some(bits);
    }
}
