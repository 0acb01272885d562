//! Explanations: the cheap per-node causes of failure counted while nodes are tried, and the
//! public [`Unschedulable`] they become once, naming the resource and the card state.

use super::prepare::PreparedPod;
use crate::cluster::Cluster;
use crate::intern::Sym;
use crate::mig_cache::MigCache;
use crate::model::Function;
use crate::place::CardFail;
use crate::reason::{CardProblem, GangShortfall, Reason, Unschedulable};
use crate::state::SwitchedBy;
use runtimekit_contract::config::DEVICE_API_DRA;
use runtimekit_contract::config::NODE_ENABLE_LABEL;
use runtimekit_contract::{CardRequest, WholeCardName};

/// Why one node refused a pod, cheap to count; turned into a [`Reason`] once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rejection {
    NotReady,
    Cordoned,
    UntoleratedTaint {
        key: Sym,
        value: Sym,
    },
    NodeAffinity,
    NotEnabled,
    AgentNotReporting,
    /// The pod asks for whole cards and the node gives them through DRA.
    WholeCardsByDra,
    /// A function the pod needs is switched off on the node.
    SwitchedOff {
        function: Function,
        by: SwitchedBy,
    },
    InsufficientCpu,
    InsufficientMemory,
    TooManyPods,
    /// `resource`: the position in the pod's scalar resources.
    InsufficientScalar {
        resource: usize,
    },
    NoRdmaNic,
    /// `container`: the position in the pod's containers that ask for cards.
    Cards {
        container: usize,
        fail: CardFail,
    },
    /// `constraint`: the position in the pod's unsupported constraints.
    Unsupported {
        constraint: usize,
    },
}

/// Rejections and how many nodes each applied to, in the order first seen.
#[derive(Debug, Default)]
pub(crate) struct Rejections(Vec<(Rejection, usize)>);

impl Rejections {
    pub(crate) fn add(&mut self, rejection: Rejection) {
        add_count(&mut self.0, rejection, 1);
    }
}

/// Adds `n` to the count of `item`, appending it when new.
fn add_count<T: PartialEq>(counts: &mut Vec<(T, usize)>, item: T, n: usize) {
    match counts.iter_mut().find(|(seen, _)| *seen == item) {
        Some((_, count)) => *count += n,
        None => counts.push((item, n)),
    }
}

impl Cluster {
    /// Turns counted rejections into the public aggregate.
    pub(crate) fn unschedulable(
        &self,
        prep: &PreparedPod,
        rejections: Rejections,
    ) -> Unschedulable {
        self.aggregate(prep, rejections, None)
    }

    /// Turns counted rejections of a gang's first member, and why the gang as a whole does not
    /// fit, into the public aggregate.
    pub(crate) fn gang_unschedulable(
        &self,
        prep: &PreparedPod,
        rejections: Rejections,
        shortfall: GangShortfall,
    ) -> Unschedulable {
        self.aggregate(prep, rejections, Some(shortfall))
    }

    /// Refuses a pod that uses constraints the engine does not evaluate, as if every node
    /// rejected it for each of them.
    pub(crate) fn refuse_unsupported(&self, prep: &PreparedPod) -> Result<(), Unschedulable> {
        if prep.pod.unsupported.is_empty() {
            return Ok(());
        }
        let every_node = (0..prep.pod.unsupported.len())
            .map(|constraint| (Rejection::Unsupported { constraint }, self.known))
            .collect();
        Err(self.unschedulable(prep, Rejections(every_node)))
    }

    fn aggregate(
        &self,
        prep: &PreparedPod,
        rejections: Rejections,
        gang: Option<GangShortfall>,
    ) -> Unschedulable {
        // Distinct rejections can read the same (a constraint listed twice) and count as one.
        let mut merged: Vec<(Reason, usize)> = Vec::new();
        for (rejection, nodes) in rejections.0 {
            add_count(&mut merged, self.reason_for(prep, rejection), nodes);
        }
        Unschedulable::new(self.known, merged, gang)
    }

    fn reason_for(&self, prep: &PreparedPod, rejection: Rejection) -> Reason {
        let names = &self.settings.names;
        let text = |symbol: Sym| self.interner.text(symbol).to_string();
        match rejection {
            Rejection::NotReady => Reason::NotReady,
            Rejection::Cordoned => Reason::Unschedulable,
            Rejection::UntoleratedTaint { key, value } => Reason::UntoleratedTaint {
                key: text(key),
                value: text(value),
            },
            Rejection::NodeAffinity => Reason::NodeAffinity,
            Rejection::NotEnabled => Reason::NotEnabled {
                label: NODE_ENABLE_LABEL.into(),
            },
            Rejection::AgentNotReporting => Reason::AgentNotReporting,
            Rejection::WholeCardsByDra => Reason::WholeCardsByDra {
                label: format!("{}={DEVICE_API_DRA}", names.device_api_label),
            },
            Rejection::SwitchedOff { function, by } => Reason::SwitchedOff {
                function,
                switch: match (by, function) {
                    (SwitchedBy::Cluster, Function::Tdm) => "features.tdm".into(),
                    (SwitchedBy::Cluster, Function::Mig) => "features.mig".into(),
                    (SwitchedBy::Node, Function::Tdm) => names.tdm_switch_label.clone(),
                    (SwitchedBy::Node, Function::Mig) => names.mig_switch_label.clone(),
                },
                cluster: by == SwitchedBy::Cluster,
            },
            Rejection::InsufficientCpu => Reason::Insufficient {
                resource: "cpu".into(),
            },
            Rejection::InsufficientMemory => Reason::Insufficient {
                resource: "memory".into(),
            },
            Rejection::TooManyPods => Reason::TooManyPods,
            Rejection::InsufficientScalar { resource } => Reason::Insufficient {
                resource: prep
                    .pod
                    .resources
                    .scalar
                    .keys()
                    .nth(resource)
                    .cloned()
                    .unwrap_or_default(),
            },
            Rejection::Unsupported { constraint } => Reason::Unsupported {
                constraint: prep
                    .pod
                    .unsupported
                    .get(constraint)
                    .cloned()
                    .unwrap_or_default(),
                scheduler: self.settings.scheduler_name.clone(),
            },
            Rejection::NoRdmaNic => Reason::NoRdmaNic {
                resource: names.rdma.clone(),
            },
            Rejection::Cards { container, fail } => {
                let containers = &prep.pod.containers;
                let request = containers.get(container).map(|c| &c.cards);
                // A single container goes unnamed.
                let name = (containers.len() > 1)
                    .then(|| containers.get(container).map(|c| c.container.clone()))
                    .flatten();
                Reason::Cards {
                    container: name,
                    problem: self.card_problem(request, fail),
                }
            }
        }
    }

    fn card_problem(&self, request: Option<&CardRequest>, fail: CardFail) -> CardProblem {
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
