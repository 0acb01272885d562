//! Placing a pod on one candidate node and scoring the result, and the scan that keeps the best
//! node among candidates.

use super::explain::Rejection;
use super::prepare::{CardShape, PreparedPod};
use crate::cluster::Cluster;
use crate::mig_cache::MigScore;
use crate::place::{self, Chosen, Rank, key8, key64};
use crate::state::{CardUse, NodeId, VendorFilter, flag};
use runtimekit_contract::CardRequest;
use std::sync::Arc;

/// How one pod compares on a node, smaller first; only scores of one pod are ever compared.
/// The fields compare in order.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Score {
    /// The TDM core row of the worst card chosen, or the whole-card topology tier.
    row_or_tier: u8,
    /// The TDM memory key of the worst card chosen, or for a pod without cards the CPU left.
    room: u64,
    /// The MIG score of the worst card chosen.
    mig: MigScore,
    /// The node's key: free whole cards, or the value of the whole-card set it was chosen in.
    node: u8,
    name: Arc<str>,
    id: NodeId,
    /// The position of the worst card chosen.
    card: u8,
}

impl Cluster {
    /// Places a pod on one node with the given card usage.
    pub(crate) fn place_pod(
        &self,
        prep: &PreparedPod,
        id: NodeId,
        uses: &[CardUse],
    ) -> Result<(Score, Vec<Chosen>), Rejection> {
        let node = &self.nodes[id as usize];
        let summary = &self.summaries[id as usize];
        let scoring = self.settings.scoring;
        let mut score = Score {
            row_or_tier: 0,
            room: 0,
            mig: MigScore {
                free: 0,
                room: [0; 8],
            },
            node: key8(scoring, summary.free[VendorFilter::Any.slot()]),
            name: node.name.clone(),
            id,
            card: 0,
        };
        if !prep.wants_cards {
            score.node = 0;
            score.room = key64(scoring, summary.cpu_free.saturating_sub(prep.cpu_milli));
            return Ok((score, Vec::new()));
        }
        if prep.wants_rdma && node.nics.is_empty() {
            return Err(Rejection::NoRdmaNic);
        }
        let containers = &prep.pod.containers;
        let by_node_order = matches!(prep.shape, CardShape::ByNodeOrder);
        if let ([only], false) = (containers.as_slice(), by_node_order) {
            let chosen = place::place(scoring, &self.mig, node, uses, &only.cards, only.rdma)
                .map_err(|fail| Rejection::Cards { container: 0, fail })?;
            match chosen.rank {
                Rank::Tdm { row, mem, card } => {
                    score.row_or_tier = row;
                    score.room = mem;
                    score.card = card;
                }
                Rank::Mig { score: mig, card } => {
                    score.mig = mig;
                    score.card = card;
                }
                Rank::Whole { tier, set } => {
                    let vendor = match only.cards {
                        CardRequest::Whole { name, .. } => VendorFilter::of(name),
                        _ => VendorFilter::Any,
                    };
                    score.row_or_tier = tier;
                    score.node = key8(scoring, set.value(summary, vendor));
                }
            }
            return Ok((score, vec![chosen]));
        }
        // Containers go in order, each seeing what the previous ones took.
        let mut scratch = uses.to_vec();
        let mut placed = Vec::with_capacity(containers.len());
        for (position, container) in containers.iter().enumerate() {
            let chosen = place::place(
                scoring,
                &self.mig,
                node,
                &scratch,
                &container.cards,
                container.rdma,
            )
            .map_err(|fail| Rejection::Cards {
                container: position,
                fail,
            })?;
            for (card, share) in &chosen.cards {
                let card = usize::from(*card);
                node.cards[card].apply(&mut scratch[card], share);
            }
            placed.push(chosen);
        }
        Ok((score, placed))
    }

    /// The best node among `ids`, reporting why each other node failed.
    pub(crate) fn scan(
        &self,
        prep: &PreparedPod,
        ids: impl Iterator<Item = NodeId>,
        reject: &mut impl FnMut(Rejection),
    ) -> Option<NodeId> {
        let mut best: Option<Score> = None;
        for id in ids {
            if !self.passes_predicates(prep, id, reject) {
                continue;
            }
            if let Some(rejection) = self.summary_rejection(prep, &self.summaries[id as usize]) {
                reject(rejection);
                continue;
            }
            let uses = &self.nodes[id as usize].uses;
            match self.place_pod(prep, id, uses) {
                Ok((score, _)) => {
                    if best.as_ref().is_none_or(|b| score < *b) {
                        best = Some(score);
                    }
                }
                Err(rejection) => reject(rejection),
            }
        }
        best.map(|b| b.id)
    }

    /// The ids of every known node.
    pub(crate) fn known_node_ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.summaries
            .iter()
            .enumerate()
            .filter(|(_, summary)| summary.has(flag::KNOWN))
            .map(|(id, _)| id as NodeId)
    }
}
