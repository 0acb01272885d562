//! Placing a pod on one candidate node and scoring the result, and the scan that keeps the best
//! node among candidates.

use super::explain::Why;
use super::prepare::{Fast, Prepared};
use crate::cluster::Cluster;
use crate::mig_cache::MigScore;
use crate::place::{self, Chosen, Rank, key8, key64};
use crate::state::{CardUse, NodeId, VendorFilter, flag};
use runtimekit_contract::CardRequest;
use std::sync::Arc;

/// How one pod compares on a node; only scores of one pod are ever compared.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Score {
    major: u8,
    mem: u64,
    mig: MigScore,
    node: u8,
    name: Arc<str>,
    id: NodeId,
    card: u8,
}

impl Cluster {
    /// Places a pod on one node with the given card usage.
    pub(crate) fn place_pod(
        &self,
        prep: &Prepared,
        id: NodeId,
        uses: &[CardUse],
    ) -> Result<(Score, Vec<Chosen>), Why> {
        let node = &self.nodes[id as usize];
        let s = &self.summaries[id as usize];
        let scoring = self.settings.scoring;
        let mut score = Score {
            major: 0,
            mem: 0,
            mig: MigScore {
                free: 0,
                room: [0; 8],
            },
            node: key8(scoring, s.free[VendorFilter::Any.slot()]),
            name: node.name.clone(),
            id,
            card: 0,
        };
        if !prep.gpu {
            score.node = 0;
            score.mem = key64(scoring, s.cpu_free.saturating_sub(prep.cpu));
            return Ok((score, Vec::new()));
        }
        if prep.rdma && node.nics.is_empty() {
            return Err(Why::NoRdmaNic);
        }
        let containers = &prep.pod.containers;
        if let ([only], false) = (containers.as_slice(), matches!(prep.fast, Fast::Nodes)) {
            let chosen = place::place(scoring, &self.mig, node, uses, &only.cards, only.rdma)
                .map_err(|f| Why::Card(0, f))?;
            match chosen.rank {
                Rank::Tdm { row, mem, card } => {
                    score.major = row;
                    score.mem = mem;
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
                    score.major = tier;
                    score.node = key8(scoring, set.value(s, vendor));
                }
            }
            return Ok((score, vec![chosen]));
        }
        let mut scratch = uses.to_vec();
        let mut out = Vec::with_capacity(containers.len());
        for (i, c) in containers.iter().enumerate() {
            let chosen = place::place(scoring, &self.mig, node, &scratch, &c.cards, c.rdma)
                .map_err(|f| Why::Card(i, f))?;
            for (p, share) in &chosen.cards {
                let p = usize::from(*p);
                node.cards[p].apply(&mut scratch[p], share);
            }
            out.push(chosen);
        }
        Ok((score, out))
    }

    /// The best node among `ids`, reporting why each other node failed.
    pub(crate) fn scan(
        &self,
        prep: &Prepared,
        ids: impl Iterator<Item = NodeId>,
        why: &mut impl FnMut(Why),
    ) -> Option<NodeId> {
        let mut best: Option<Score> = None;
        for id in ids {
            if !self.filter(prep, id, why) {
                continue;
            }
            if let Some(w) = self.quick_fail(prep, &self.summaries[id as usize]) {
                why(w);
                continue;
            }
            let uses = &self.nodes[id as usize].uses;
            match self.place_pod(prep, id, uses) {
                Ok((score, _)) => {
                    if best.as_ref().is_none_or(|b| score < *b) {
                        best = Some(score);
                    }
                }
                Err(w) => why(w),
            }
        }
        best.map(|b| b.id)
    }

    /// The ids of every known node.
    pub(crate) fn known_ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.summaries
            .iter()
            .enumerate()
            .filter(|(_, s)| s.has(flag::KNOWN))
            .map(|(i, _)| i as NodeId)
    }
}
