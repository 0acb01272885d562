//! Explanations: the cheap per-node causes of failure counted while nodes are tried, and the
//! public [`Unschedulable`] they become once, naming the resource and the card state.

use super::prepare::Prepared;
use crate::cluster::Cluster;
use crate::intern::Sym;
use crate::mig_cache::MigCache;
use crate::place::CardFail;
use crate::reason::{CardProblem, GangShortfall, Reason, Unschedulable};
use runtimekit_contract::config::NODE_ENABLE_LABEL;
use runtimekit_contract::{CardRequest, WholeCardName};

/// One node-level cause of failure, cheap to count; turned into a [`Reason`] once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Why {
    NotReady,
    Unschedulable,
    Taint(Sym, Sym),
    Affinity,
    NotEnabled,
    Agent,
    Cpu,
    Memory,
    Pods,
    Scalar(usize),
    NoRdmaNic,
    Card(usize, CardFail),
    Unsupported(usize),
}

/// Failure causes and how many nodes each applied to.
#[derive(Debug, Default)]
pub(crate) struct Tally(pub Vec<(Why, usize)>);

impl Tally {
    pub(crate) fn add(&mut self, why: Why) {
        match self.0.iter_mut().find(|(w, _)| *w == why) {
            Some((_, n)) => *n += 1,
            None => self.0.push((why, 1)),
        }
    }
}

impl Cluster {
    /// Turns counted causes into the public aggregate.
    pub(crate) fn unschedulable(&self, prep: &Prepared, tally: Tally) -> Unschedulable {
        self.unschedulable_with(prep, tally, None)
    }

    pub(crate) fn unschedulable_with(
        &self,
        prep: &Prepared,
        tally: Tally,
        gang: Option<GangShortfall>,
    ) -> Unschedulable {
        let mut merged: Vec<(Reason, usize)> = Vec::new();
        for (why, n) in tally.0 {
            let reason = self.reason(prep, why);
            match merged.iter_mut().find(|(r, _)| *r == reason) {
                Some((_, m)) => *m += n,
                None => merged.push((reason, n)),
            }
        }
        Unschedulable::new(self.known, merged, gang)
    }

    fn reason(&self, prep: &Prepared, why: Why) -> Reason {
        let names = &self.settings.names;
        let text = |s: Sym| self.interner.text(s).to_string();
        match why {
            Why::NotReady => Reason::NotReady,
            Why::Unschedulable => Reason::Unschedulable,
            Why::Taint(k, v) => Reason::UntoleratedTaint {
                key: text(k),
                value: text(v),
            },
            Why::Affinity => Reason::NodeAffinity,
            Why::NotEnabled => Reason::NotEnabled {
                label: NODE_ENABLE_LABEL.into(),
            },
            Why::Agent => Reason::AgentNotReporting,
            Why::Cpu => Reason::Insufficient {
                resource: "cpu".into(),
            },
            Why::Memory => Reason::Insufficient {
                resource: "memory".into(),
            },
            Why::Pods => Reason::TooManyPods,
            Why::Scalar(i) => Reason::Insufficient {
                resource: prep
                    .pod
                    .resources
                    .scalar
                    .keys()
                    .nth(i)
                    .cloned()
                    .unwrap_or_default(),
            },
            Why::Unsupported(i) => Reason::Unsupported {
                constraint: prep.pod.unsupported.get(i).cloned().unwrap_or_default(),
                scheduler: self.settings.scheduler_name.clone(),
            },
            Why::NoRdmaNic => Reason::NoRdmaNic {
                resource: names.rdma.clone(),
            },
            Why::Card(i, fail) => {
                let containers = &prep.pod.containers;
                let request = containers.get(i).map(|c| &c.cards);
                let container = (containers.len() > 1)
                    .then(|| containers.get(i).map(|c| c.container.clone()))
                    .flatten();
                Reason::Cards {
                    container,
                    problem: self.problem(request, fail),
                }
            }
        }
    }

    fn problem(&self, request: Option<&CardRequest>, fail: CardFail) -> CardProblem {
        let names = &self.settings.names;
        let share_resource = match request {
            Some(CardRequest::Tdm { core: None, .. }) => names.gpu_memory.clone(),
            Some(CardRequest::Mig { .. }) => names.gpu_slice.clone(),
            _ => names.gpu_core.clone(),
        };
        let cards = request.map_or(1, CardRequest::cards);
        let whole = |nvidia: bool| {
            if nvidia {
                runtimekit_contract::config::NVIDIA_GPU.to_owned()
            } else {
                names.gpu.clone()
            }
        };
        let nvidia = matches!(
            request,
            Some(CardRequest::Whole {
                name: WholeCardName::Nvidia,
                ..
            })
        );
        match fail {
            CardFail::NoCards => CardProblem::NoCards,
            CardFail::OnlyUnhealthy => CardProblem::OnlyUnhealthy,
            CardFail::OnlyAmd => CardProblem::OnlyAmd {
                resource: share_resource,
            },
            CardFail::OnlyMigMode => CardProblem::OnlyMigMode {
                resource: share_resource,
                slice: names.gpu_slice.clone(),
            },
            CardFail::AllWhole => CardProblem::AllGivenWhole {
                resource: share_resource,
            },
            CardFail::TdmNoRoom => {
                let (core, memory_mib) = match request {
                    Some(&CardRequest::Tdm {
                        core, memory_mib, ..
                    }) => (core, memory_mib),
                    _ => (None, None),
                };
                CardProblem::TdmNoRoom {
                    cards,
                    core,
                    core_resource: names.gpu_core.clone(),
                    memory_mib,
                    memory_resource: names.gpu_memory.clone(),
                }
            }
            CardFail::WholeTooFew => CardProblem::WholeTooFew {
                cards,
                resource: whole(nvidia),
                nvidia_only: nvidia,
            },
            CardFail::WholeBusy => CardProblem::WholeBusy {
                cards,
                resource: whole(nvidia),
            },
            CardFail::MigNotEnabled => CardProblem::MigNotEnabled {
                resource: names.gpu_slice.clone(),
            },
            CardFail::MigNoTable(model) => CardProblem::MigNoTable {
                model: self.interner.text(model).to_string(),
            },
            CardFail::MigProfile(table) => {
                let (slices, memory) = match request {
                    Some(&CardRequest::Mig {
                        slices, memory_mib, ..
                    }) => (slices, memory_mib),
                    _ => (0, None),
                };
                CardProblem::MigProfile {
                    message: MigCache::pick(table, slices, memory)
                        .err()
                        .map(|e| e.to_string())
                        .unwrap_or_default(),
                }
            }
            CardFail::MigNoRoom(profile) => CardProblem::MigNoRoom {
                cards,
                profile: profile.into(),
                resource: names.gpu_slice.clone(),
                slices: match request {
                    Some(&CardRequest::Mig { slices, .. }) => slices,
                    _ => 0,
                },
            },
        }
    }
}
