//! A pod prepared for deciding: its strings resolved against the cluster's symbols once, and
//! the shape of its card request that tells which index can find it a node.

use crate::cluster::Cluster;
use crate::intern::Sym;
use crate::model::{PodInput, SelectorOperator, TaintEffect, TolerationOperator};
use crate::state::{NodeId, VendorFilter};
use runtimekit_contract::CardRequest;
use std::collections::BTreeSet;

/// A resolved toleration.
#[derive(Debug)]
pub(super) struct Tol {
    /// `None`: every key (empty key with Exists); `Some(None)`: a key no node has.
    pub(super) key: Option<Option<Sym>>,
    /// `None`: any value (Exists); `Some(None)`: a value no node has.
    pub(super) value: Option<Option<Sym>>,
    pub(super) effect: Option<TaintEffect>,
}

/// What a node selector requirement looks at.
#[derive(Debug)]
pub(super) enum Subject {
    /// A label, by symbol; `None` when no node has that key.
    Label(Option<Sym>),
    /// The node's name (`matchFields` on `metadata.name`).
    Name,
    /// A field selectors may not use; matches nothing.
    OtherField,
}

/// A resolved node selector requirement.
#[derive(Debug)]
pub(super) struct Req<'p> {
    pub(super) subject: Subject,
    pub(super) op: SelectorOperator,
    pub(super) values: Vec<Option<Sym>>,
    pub(super) raw: &'p [String],
}

/// The shapes with an index behind them.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Fast {
    /// No cards: every node is scored.
    None,
    /// Several containers with cards, or MIG on several cards: nodes in order of free cards.
    Nodes,
    Tdm {
        core: u8,
        mem: u64,
        cards: usize,
    },
    Mig {
        slices: u8,
        mem: Option<u64>,
    },
    Whole {
        cards: usize,
        vendor: VendorFilter,
        rdma: bool,
    },
}

/// A pod with its strings resolved against the cluster's symbols.
#[derive(Debug)]
pub(crate) struct Prepared<'p> {
    pub pod: &'p PodInput,
    pub(super) selector: Option<Vec<(Sym, Sym)>>,
    pub(super) selector_impossible: bool,
    pub(super) affinity: Option<Vec<Vec<Req<'p>>>>,
    pub(super) tolerations: Vec<Tol>,
    pub(super) tolerates_cordon: bool,
    pub(super) cpu: u64,
    pub(super) mem: u64,
    pub(super) scalars: Vec<(Option<Sym>, u64)>,
    pub gpu: bool,
    pub rdma: bool,
    pub fast: Fast,
    /// Nodes matching the nodeSelector, by id bit, computed before scans of every node.
    pub(super) selected: Option<Vec<u64>>,
}

impl Cluster {
    /// Resolves a pod's strings against the cluster's symbols.
    pub(crate) fn prepare<'p>(&self, pod: &'p PodInput) -> Prepared<'p> {
        let get = |s: &str| self.interner.get(s);
        let mut selector_impossible = false;
        let selector = (!pod.node_selector.is_empty()).then(|| {
            let mut pairs = Vec::with_capacity(pod.node_selector.len());
            for (k, v) in &pod.node_selector {
                match (get(k), get(v)) {
                    (Some(k), Some(v)) => pairs.push((k, v)),
                    _ => selector_impossible = true,
                }
            }
            pairs
        });
        let affinity = pod.required_affinity.as_ref().map(|terms| {
            terms
                .iter()
                .map(|t| {
                    let exprs = t.match_expressions.iter().map(|r| (false, r));
                    let fields = t.match_fields.iter().map(|r| (true, r));
                    exprs
                        .chain(fields)
                        .map(|(field, r)| Req {
                            subject: match (field, r.key.as_str()) {
                                (false, key) => Subject::Label(get(key)),
                                (true, "metadata.name") => Subject::Name,
                                (true, _) => Subject::OtherField,
                            },
                            op: r.operator,
                            values: r.values.iter().map(|v| get(v)).collect(),
                            raw: &r.values,
                        })
                        .collect()
                })
                .collect()
        });
        let tolerations = pod
            .tolerations
            .iter()
            .map(|t| Tol {
                key: (!(t.key.is_empty() && t.operator == TolerationOperator::Exists))
                    .then(|| get(&t.key)),
                value: (t.operator == TolerationOperator::Equal).then(|| get(&t.value)),
                effect: t.effect,
            })
            .collect();
        let tolerates_cordon = pod.tolerations.iter().any(|t| {
            let key = match t.operator {
                TolerationOperator::Exists => {
                    t.key.is_empty() || t.key == "node.kubernetes.io/unschedulable"
                }
                TolerationOperator::Equal => {
                    t.key == "node.kubernetes.io/unschedulable" && t.value.is_empty()
                }
            };
            key && t.effect.is_none_or(|e| e == TaintEffect::NoSchedule)
        });
        let fast = match pod.containers.as_slice() {
            [only] => match only.cards {
                CardRequest::Tdm {
                    cards,
                    core,
                    memory_mib,
                } => Fast::Tdm {
                    core: core.unwrap_or(0),
                    mem: memory_mib.unwrap_or(0),
                    cards: cards as usize,
                },
                CardRequest::Mig {
                    cards: 1,
                    slices,
                    memory_mib,
                } => Fast::Mig {
                    slices,
                    mem: memory_mib,
                },
                CardRequest::Whole { cards, name } => Fast::Whole {
                    cards: cards as usize,
                    vendor: VendorFilter::of(name),
                    rdma: only.rdma,
                },
                CardRequest::Mig { .. } => Fast::Nodes,
            },
            [] => Fast::None,
            _ => Fast::Nodes,
        };
        Prepared {
            pod,
            selector,
            selector_impossible,
            affinity,
            tolerations,
            tolerates_cordon,
            cpu: pod.resources.cpu_milli,
            mem: pod.resources.memory_bytes,
            scalars: pod
                .resources
                .scalar
                .iter()
                .map(|(k, &v)| (get(k), v))
                .collect(),
            gpu: !pod.containers.is_empty(),
            rdma: pod.containers.iter().any(|c| c.rdma),
            fast,
            selected: None,
        }
    }

    /// Resolves the nodeSelector into a bitmap from the label index, so a scan of every node
    /// reads one bit instead of each node's labels.
    pub(crate) fn select(&self, prep: &mut Prepared) {
        let Some(pairs) = &prep.selector else {
            return;
        };
        let mut bits = vec![0u64; self.nodes.len().div_ceil(64)];
        if !prep.selector_impossible {
            let sets: Option<Vec<&BTreeSet<NodeId>>> =
                pairs.iter().map(|p| self.labels.get(p)).collect();
            if let Some(mut sets) = sets {
                sets.sort_by_key(|s| s.len());
                if let Some((first, rest)) = sets.split_first() {
                    for &id in *first {
                        if rest.iter().all(|s| s.contains(&id)) {
                            bits[id as usize / 64] |= 1 << (id % 64);
                        }
                    }
                }
            }
        }
        prep.selected = Some(bits);
    }
}
