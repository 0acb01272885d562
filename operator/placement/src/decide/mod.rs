//! Single-pod decisions. [`Cluster::decide`] resolves the pod ([`prepare`]), finds a node
//! through the indexes or a scan ([`lookup`]) among nodes that pass the [`predicates`], each
//! placed and scored ([`score`]), and when none fits counts why each node refused ([`explain`]).

mod explain;
mod lookup;
mod predicates;
mod prepare;
mod score;

pub(crate) use explain::{Rejection, Rejections};
pub(crate) use prepare::{CardShape, PreparedPod};

use crate::cluster::Cluster;
use crate::model::{CardPlacement, ContainerPlacement, Decision, PodInput};
use crate::place::Chosen;
use crate::reason::Unschedulable;
use crate::state::NodeId;

impl Cluster {
    /// Decides where one pod goes, without changing anything.
    pub fn decide(&self, pod: &PodInput) -> Result<Decision, Unschedulable> {
        let mut prep = self.prepare(pod);
        self.refuse_unsupported(&prep)?;
        let id = match self.find_node(&mut prep) {
            Some(id) => id,
            None => {
                // No node fits: every node is scanned to say why each refused.
                self.mark_selected_nodes(&mut prep);
                let mut rejections = Rejections::default();
                let found = self.scan(&prep, self.known_node_ids(), &mut |rejection| {
                    rejections.add(rejection)
                });
                debug_assert!(found.is_none(), "an index missed a node that fits");
                match found {
                    Some(id) => id,
                    None => return Err(self.unschedulable(&prep, rejections)),
                }
            }
        };
        let uses = &self.nodes[id as usize].uses;
        match self.place_pod(&prep, id, uses) {
            Ok((_, chosen)) => Ok(self.decision(pod, id, &chosen)),
            Err(rejection) => {
                let mut rejections = Rejections::default();
                rejections.add(rejection);
                Err(self.unschedulable(&prep, rejections))
            }
        }
    }

    /// What the pod would be given on node `id` as it is now, if it passes every predicate
    /// there; for preemption's what-ifs.
    pub(crate) fn place_on(&self, prep: &PreparedPod, id: NodeId) -> Option<Vec<Chosen>> {
        let summary = &self.summaries[id as usize];
        if !self.passes_predicates(prep, id, &mut |_| {})
            || self.summary_rejection(prep, summary).is_some()
        {
            return None;
        }
        let (_, chosen) = self
            .place_pod(prep, id, &self.nodes[id as usize].uses)
            .ok()?;
        Some(chosen)
    }

    /// The reference decision: every node placed and scored, no index used.
    #[cfg(test)]
    pub(crate) fn decide_by_scan(&self, pod: &PodInput) -> Option<Decision> {
        let mut prep = self.prepare(pod);
        self.mark_selected_nodes(&mut prep);
        let id = self.scan(&prep, self.known_node_ids(), &mut |_| {})?;
        let (_, chosen) = self
            .place_pod(&prep, id, &self.nodes[id as usize].uses)
            .ok()?;
        Some(self.decision(pod, id, &chosen))
    }

    /// Builds the public decision from what was chosen on a node.
    pub(crate) fn decision(&self, pod: &PodInput, id: NodeId, chosen: &[Chosen]) -> Decision {
        let node = &self.nodes[id as usize];
        let containers = pod
            .containers
            .iter()
            .zip(chosen)
            .map(|(container, chosen)| ContainerPlacement {
                container: container.container.clone(),
                cards: chosen
                    .cards
                    .iter()
                    .enumerate()
                    .map(|(replica, (position, share))| {
                        let card = &node.cards[usize::from(*position)];
                        CardPlacement {
                            index: card.index,
                            uuid: card.uuid.to_string(),
                            replica: replica as u32,
                            share: share.clone(),
                        }
                    })
                    .collect(),
                nics: chosen
                    .nics
                    .iter()
                    .map(|&nic| node.nics[usize::from(nic)].name.to_string())
                    .collect(),
                locality: chosen.locality,
            })
            .collect();
        Decision {
            pod_uid: pod.uid.clone(),
            node: node.name.to_string(),
            containers,
            resources: pod.resources.clone(),
            gang: pod.gang.clone(),
        }
    }
}
