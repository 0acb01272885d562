//! Why a pod or gang does not fit, per node, aggregated the way kube-scheduler does.

use crate::model::{Function, Tier};
use std::fmt;

/// Why one node cannot take a pod.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reason {
    /// The node's Ready condition is not True.
    NotReady,
    /// The node is cordoned and the pod does not tolerate that.
    Unschedulable,
    /// A NoSchedule or NoExecute taint the pod does not tolerate.
    UntoleratedTaint {
        /// The taint's key.
        key: String,
        /// The taint's value.
        value: String,
    },
    /// The node does not match the pod's nodeSelector or required node affinity.
    NodeAffinity,
    /// A resource other than cards does not fit.
    Insufficient {
        /// The resource, for example `cpu`.
        resource: String,
    },
    /// The node runs as many pods as it may.
    TooManyPods,
    /// The node is not labelled for GPU pods.
    NotEnabled {
        /// The label that enables it.
        label: String,
    },
    /// The node's agent does not offer its cards: it is not reporting, or containerd does not
    /// run the lj-runtime handler yet.
    AgentNotReporting,
    /// The pod asks for whole cards and the node gives them through DRA.
    WholeCardsByDra {
        /// The node label that says so.
        label: String,
    },
    /// A function the pod needs is switched off, for the cluster or on the node.
    SwitchedOff {
        /// The function.
        function: Function,
        /// The switch: the configuration setting or the node label.
        switch: String,
        /// Whether the switch is the cluster's setting (else the node's label).
        cluster: bool,
    },
    /// The pod asks for RDMA and the node has no RDMA NIC.
    NoRdmaNic {
        /// The RDMA resource name.
        resource: String,
    },
    /// The node's cards cannot serve a container's request.
    Cards {
        /// The container, named when the pod has several that ask for cards.
        container: Option<String>,
        /// What blocked it.
        problem: CardProblem,
    },
    /// The pod uses a constraint the engine does not evaluate.
    Unsupported {
        /// The constraint.
        constraint: String,
        /// The scheduler's name.
        scheduler: String,
    },
}

/// What about a node's cards blocked a request.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CardProblem {
    /// The node reports no cards.
    NoCards,
    /// Every card that could serve the request is unhealthy.
    OnlyUnhealthy,
    /// Only AMD cards, which serve whole-card requests only.
    OnlyAmd {
        /// The share resource asked for.
        resource: String,
    },
    /// Only cards in MIG mode, which serve MIG requests only.
    OnlyMigMode {
        /// The share resource asked for.
        resource: String,
        /// The MIG resource name.
        slice: String,
    },
    /// Every card that could take a share is given whole or holds MIG instances.
    AllGivenWhole {
        /// The share resource asked for.
        resource: String,
    },
    /// No card (or fewer than asked) has this much compute and memory free.
    TdmNoRoom {
        /// Cards asked for.
        cards: u32,
        /// Compute asked for, in percent.
        core: Option<u8>,
        /// The compute resource name.
        core_resource: String,
        /// Memory asked for, in MiB.
        memory_mib: Option<u64>,
        /// The memory resource name.
        memory_resource: String,
    },
    /// Fewer healthy cards outside MIG mode (of the vendor asked) than asked for.
    WholeTooFew {
        /// Cards asked for.
        cards: u32,
        /// The whole-card resource name.
        resource: String,
        /// Whether only NVIDIA cards qualify.
        nvidia_only: bool,
    },
    /// Enough such cards, but fewer unallocated ones: the others hold shares or are given whole.
    WholeBusy {
        /// Cards asked for.
        cards: u32,
        /// The whole-card resource name.
        resource: String,
    },
    /// No card has MIG mode enabled.
    MigNotEnabled {
        /// The MIG resource name.
        resource: String,
    },
    /// MIG is enabled on a model the engine has no profile table for.
    MigNoTable {
        /// The card's model.
        model: String,
    },
    /// The model's MIG profiles cannot serve the request.
    MigProfile {
        /// Why, from the profile table.
        message: String,
    },
    /// No MIG card (or fewer than asked) has a legal start free for the profile.
    MigNoRoom {
        /// Cards asked for.
        cards: u32,
        /// The profile that would be created.
        profile: String,
        /// The MIG resource name.
        resource: String,
        /// Slices asked for.
        slices: u8,
    },
}

/// A reason and on how many nodes it blocked the pod.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ReasonCount {
    /// The reason.
    pub reason: Reason,
    /// Nodes it applied to.
    pub nodes: usize,
}

/// The most members one group of the widest allowed tier could hold.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GroupCapacity {
    /// The group's name.
    pub group: String,
    /// Members it could hold.
    pub members: usize,
}

/// Why a gang as a whole does not fit.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GangShortfall {
    /// The gang's name.
    pub gang: String,
    /// Its members.
    pub members: usize,
    /// The widest tier it may span.
    pub highest_tier: Tier,
    /// The group of that tier that holds the most members, if any holds one.
    pub largest: Option<GroupCapacity>,
}

/// A pod or gang that fits nowhere, with the reason for every node.
#[derive(Debug, Clone, PartialEq, Eq, Hash, thiserror::Error)]
pub struct Unschedulable {
    /// Nodes considered.
    pub nodes: usize,
    /// Reasons, most frequent first; a node may count under several (every resource short).
    pub reasons: Vec<ReasonCount>,
    /// For a gang, why no group holds it.
    pub gang: Option<GangShortfall>,
}

impl Unschedulable {
    /// Builds the aggregate from (reason, count) pairs, sorting most frequent first and
    /// equal counts by their text.
    pub(crate) fn new(
        nodes: usize,
        reasons: Vec<(Reason, usize)>,
        gang: Option<GangShortfall>,
    ) -> Self {
        let mut keyed: Vec<(String, ReasonCount)> = reasons
            .into_iter()
            .map(|(reason, n)| (reason.to_string(), ReasonCount { reason, nodes: n }))
            .collect();
        keyed.sort_by(|a, b| b.1.nodes.cmp(&a.1.nodes).then_with(|| a.0.cmp(&b.0)));
        Unschedulable {
            nodes,
            reasons: keyed.into_iter().map(|(_, r)| r).collect(),
            gang,
        }
    }

    /// The count of one reason, 0 when it did not occur.
    pub fn count(&self, reason: &Reason) -> usize {
        self.reasons
            .iter()
            .find(|r| &r.reason == reason)
            .map_or(0, |r| r.nodes)
    }
}

impl fmt::Display for Unschedulable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0/{} nodes are available", self.nodes)?;
        let mut sep = ": ";
        if let Some(gang) = &self.gang {
            write!(
                f,
                " for all {} members of gang {}: no {} holds them all",
                gang.members, gang.gang, gang.highest_tier
            )?;
            if let Some(largest) = &gang.largest {
                write!(
                    f,
                    " (the most any holds is {}, in {})",
                    largest.members, largest.group
                )?;
            }
            sep = "; ";
        }
        for (i, r) in self.reasons.iter().enumerate() {
            f.write_str(if i == 0 { sep } else { ", " })?;
            write!(f, "{} {}", r.nodes, r.reason)?;
        }
        f.write_str(".")
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::NotReady => f.write_str("node(s) were not ready"),
            Reason::Unschedulable => f.write_str("node(s) were unschedulable"),
            Reason::UntoleratedTaint { key, value } => {
                write!(f, "node(s) had untolerated taint {{{key}: {value}}}")
            }
            Reason::NodeAffinity => {
                f.write_str("node(s) didn't match Pod's node affinity/selector")
            }
            Reason::Insufficient { resource } => write!(f, "Insufficient {resource}"),
            Reason::TooManyPods => f.write_str("Too many pods"),
            Reason::NotEnabled { label } => write!(f, "node(s) were not labelled {label}=true"),
            Reason::AgentNotReporting => f.write_str("node(s) had no node agent offering cards"),
            Reason::WholeCardsByDra { label } => write!(
                f,
                "node(s) gave whole cards through DRA ({label}): ask for them with a ResourceClaim under the default scheduler"
            ),
            Reason::SwitchedOff {
                function,
                switch,
                cluster,
            } => {
                let function = match function {
                    Function::Tdm => "time-division shares",
                    Function::Mig => "MIG instances",
                };
                if *cluster {
                    write!(
                        f,
                        "node(s) had {function} switched off for the cluster ({switch}: false in the shared configuration)"
                    )
                } else {
                    write!(
                        f,
                        "node(s) had {function} switched off by the node label {switch}=false"
                    )
                }
            }
            Reason::NoRdmaNic { resource } => write!(f, "node(s) had no RDMA NIC for {resource}"),
            Reason::Cards { container, problem } => {
                write!(f, "node(s) had {problem}")?;
                if let Some(c) = container {
                    write!(f, " (container {c:?})")?;
                }
                Ok(())
            }
            Reason::Unsupported {
                constraint,
                scheduler,
            } => write!(
                f,
                "pod uses {constraint}, which {scheduler} does not support"
            ),
        }
    }
}

/// "no card" for one, "fewer than N cards" for more.
fn how_many(f: &mut fmt::Formatter<'_>, cards: u32, what: &str) -> fmt::Result {
    if cards <= 1 {
        write!(f, "no {what}")
    } else {
        write!(f, "fewer than {cards} {what}s")
    }
}

impl fmt::Display for CardProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CardProblem::NoCards => f.write_str("no cards reported"),
            CardProblem::OnlyUnhealthy => f.write_str("only unhealthy cards"),
            CardProblem::OnlyAmd { resource } => write!(
                f,
                "only AMD cards, which serve whole-card requests only, not {resource}"
            ),
            CardProblem::OnlyMigMode { resource, slice } => write!(
                f,
                "only cards in MIG mode, which serve {slice} only, not {resource}"
            ),
            CardProblem::AllGivenWhole { resource } => write!(
                f,
                "every card given whole or holding MIG instances, so none takes {resource}"
            ),
            CardProblem::TdmNoRoom {
                cards,
                core,
                core_resource,
                memory_mib,
                memory_resource,
            } => {
                how_many(f, *cards, "card")?;
                f.write_str(" with ")?;
                if let Some(core) = core {
                    write!(f, "{core}% {core_resource}")?;
                    if memory_mib.is_some() {
                        f.write_str(" and ")?;
                    }
                }
                if let Some(mib) = memory_mib {
                    write!(f, "{} {memory_resource}", format_mib(*mib))?;
                }
                f.write_str(" free")
            }
            CardProblem::WholeTooFew {
                cards,
                resource,
                nvidia_only,
            } => {
                let vendor = if *nvidia_only { "NVIDIA " } else { "" };
                how_many(f, *cards, &format!("healthy {vendor}card"))?;
                write!(f, " outside MIG mode for {resource}")
            }
            CardProblem::WholeBusy { cards, resource } => {
                how_many(f, *cards, "unallocated card")?;
                write!(f, " for {resource}")
            }
            CardProblem::MigNotEnabled { resource } => {
                write!(f, "MIG not enabled on any card for {resource}")
            }
            CardProblem::MigNoTable { model } => write!(
                f,
                "MIG-enabled {model} cards, a model without a MIG profile table"
            ),
            CardProblem::MigProfile { message } => write!(f, "MIG cards where {message}"),
            CardProblem::MigNoRoom {
                cards,
                profile,
                resource,
                slices,
            } => {
                how_many(f, *cards, "MIG card")?;
                write!(
                    f,
                    " with room for a {profile} instance ({resource}: {slices})"
                )
            }
        }
    }
}

/// MiB as GiB when whole, else MiB.
pub(crate) fn format_mib(mib: u64) -> String {
    if mib.is_multiple_of(1024) {
        format!("{} GiB", mib / 1024)
    } else {
        format!("{mib} MiB")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tdm(core: Option<u8>, memory_mib: Option<u64>, cards: u32) -> Reason {
        Reason::Cards {
            container: None,
            problem: CardProblem::TdmNoRoom {
                cards,
                core,
                core_resource: "aliyun.com/gpu-core".into(),
                memory_mib,
                memory_resource: "aliyun.com/gpu-memory".into(),
            },
        }
    }

    #[test]
    fn aggregate_reads_like_kube_scheduler() {
        let mig = Reason::Cards {
            container: None,
            problem: CardProblem::MigNotEnabled {
                resource: "aliyun.com/gpu-slice".into(),
            },
        };
        let u = Unschedulable::new(
            120,
            vec![(mig.clone(), 40), (tdm(Some(50), None, 1), 80)],
            None,
        );
        assert_eq!(
            u.to_string(),
            "0/120 nodes are available: 80 node(s) had no card with 50% aliyun.com/gpu-core free, \
             40 node(s) had MIG not enabled on any card for aliyun.com/gpu-slice."
        );
        assert_eq!(u.count(&mig), 40);
        assert_eq!(u.count(&Reason::NotReady), 0);
    }

    #[test]
    fn equal_counts_sort_by_text_and_taints_print_like_kube() {
        let u = Unschedulable::new(
            3,
            vec![
                (Reason::TooManyPods, 1),
                (
                    Reason::UntoleratedTaint {
                        key: "dedicated".into(),
                        value: "infer".into(),
                    },
                    1,
                ),
                (
                    Reason::Insufficient {
                        resource: "cpu".into(),
                    },
                    1,
                ),
            ],
            None,
        );
        assert_eq!(
            u.to_string(),
            "0/3 nodes are available: 1 Insufficient cpu, 1 Too many pods, \
             1 node(s) had untolerated taint {dedicated: infer}."
        );
    }

    #[test]
    fn share_and_whole_texts_name_resource_and_state() {
        assert_eq!(
            tdm(Some(30), Some(8 * 1024), 2).to_string(),
            "node(s) had fewer than 2 cards with 30% aliyun.com/gpu-core and 8 GiB aliyun.com/gpu-memory free"
        );
        assert_eq!(
            tdm(None, Some(640), 1).to_string(),
            "node(s) had no card with 640 MiB aliyun.com/gpu-memory free"
        );
        let busy = Reason::Cards {
            container: Some("train".into()),
            problem: CardProblem::WholeBusy {
                cards: 4,
                resource: "aliyun.com/gpu".into(),
            },
        };
        assert_eq!(
            busy.to_string(),
            "node(s) had fewer than 4 unallocated cards for aliyun.com/gpu (container \"train\")"
        );
    }

    #[test]
    fn gang_shortfall_names_tier_and_largest_group() {
        let u = Unschedulable::new(
            10,
            vec![(Reason::NotReady, 2)],
            Some(GangShortfall {
                gang: "g".into(),
                members: 7,
                highest_tier: Tier::NetworkPod,
                largest: Some(GroupCapacity {
                    group: "np-a".into(),
                    members: 5,
                }),
            }),
        );
        assert_eq!(
            u.to_string(),
            "0/10 nodes are available for all 7 members of gang g: no network pod holds them all \
             (the most any holds is 5, in np-a); 2 node(s) were not ready."
        );
    }
}
