//! Single-pod decisions. [`Cluster::decide`] prepares the pod ([`prepare`]), finds a node
//! through the indexes ([`lookup`]) or a scan of candidates ([`score`]) that pass the
//! [`predicates`], and on failure counts why each node refused it ([`explain`]).

mod explain;
mod lookup;
mod predicates;
mod prepare;
mod score;

pub(crate) use explain::{Tally, Why};
pub(crate) use prepare::{Fast, Prepared};

use crate::cluster::Cluster;
use crate::model::{CardPlacement, ContainerPlacement, Decision, PodInput};
use crate::place::Chosen;
use crate::reason::Unschedulable;
use crate::state::NodeId;

impl Cluster {
    /// Decides where one pod goes, without changing anything.
    pub fn decide(&self, pod: &PodInput) -> Result<Decision, Unschedulable> {
        let mut prep = self.prepare(pod);
        if !pod.unsupported.is_empty() {
            let tally = (0..pod.unsupported.len())
                .map(|i| (Why::Unsupported(i), self.known))
                .collect();
            return Err(self.unschedulable(&prep, Tally(tally)));
        }
        let found = match self.narrowed(&prep) {
            Some(ids) => self.scan(&prep, ids.into_iter(), &mut |_| {}),
            None => match prep.fast {
                Fast::Tdm {
                    core,
                    mem,
                    cards: 1,
                } => self.fast_tdm(&prep, core, mem),
                Fast::Tdm { core, mem, cards } => self.fast_tdm_replica(&prep, core, mem, cards),
                Fast::Mig { slices, mem } => self.fast_mig(&prep, slices, mem),
                Fast::Whole {
                    cards,
                    vendor,
                    rdma,
                } => self.fast_whole(&prep, cards, vendor, rdma),
                Fast::Nodes => self.fast_nodes(&prep),
                Fast::None => {
                    self.select(&mut prep);
                    self.scan(&prep, self.known_ids(), &mut |_| {})
                }
            },
        };
        let id = match found {
            Some(id) => id,
            None => {
                self.select(&mut prep);
                let mut tally = Tally::default();
                let found = self.scan(&prep, self.known_ids(), &mut |w| tally.add(w));
                debug_assert!(found.is_none(), "an index missed a node that fits");
                match found {
                    Some(id) => id,
                    None => return Err(self.unschedulable(&prep, tally)),
                }
            }
        };
        let uses = &self.nodes[id as usize].uses;
        match self.place_pod(&prep, id, uses) {
            Ok((_, chosen)) => Ok(self.decision(pod, id, &chosen)),
            Err(why) => {
                let mut tally = Tally::default();
                tally.add(why);
                Err(self.unschedulable(&prep, tally))
            }
        }
    }

    /// The reference decision: every node placed and scored, no index used.
    #[cfg(test)]
    pub(crate) fn decide_by_scan(&self, pod: &PodInput) -> Option<Decision> {
        let mut prep = self.prepare(pod);
        self.select(&mut prep);
        let id = self.scan(&prep, self.known_ids(), &mut |_| {})?;
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
            .map(|(c, ch)| ContainerPlacement {
                container: c.container.clone(),
                cards: ch
                    .cards
                    .iter()
                    .enumerate()
                    .map(|(replica, (p, share))| {
                        let card = &node.cards[usize::from(*p)];
                        CardPlacement {
                            index: card.index,
                            uuid: card.uuid.to_string(),
                            replica: replica as u32,
                            share: share.clone(),
                        }
                    })
                    .collect(),
                nics: ch
                    .nics
                    .iter()
                    .map(|&n| node.nics[usize::from(n)].name.to_string())
                    .collect(),
                locality: ch.locality,
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
