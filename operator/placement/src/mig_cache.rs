//! Per-table answers of the MIG rules, computed once per model the cluster has: for every
//! profile and every occupancy of a card's eight memory slices, the start
//! `MigTable::preferred_start` chooses and how good the card is afterwards. Placement then
//! costs a lookup instead of a search, and the candidate occupancies can be walked best first.

use crate::model::Scoring;
use runtimekit_contract::mig::{MigError, MigProfile, MigTable};
use std::collections::BTreeMap;

/// How good a card is for a new instance; smaller is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct MigScore {
    /// Free memory slices left: fewest first under binpack, most first under spread.
    pub free: u8,
    /// `MigTable::headroom` after placement, inverted so more room sorts first.
    pub room: [u8; 8],
}

#[derive(Debug)]
pub(crate) struct ProfileCache {
    /// By occupancy: the start and the score, or `None` when the profile does not fit.
    pub fit: Vec<Option<(u8, MigScore)>>,
    /// Occupancies where the profile fits, best score first.
    pub order: Vec<(MigScore, u8)>,
}

#[derive(Debug)]
pub(crate) struct TableCache {
    pub table: &'static MigTable,
    /// Per profile, in table order.
    pub profiles: Vec<ProfileCache>,
}

#[derive(Debug)]
pub(crate) struct MigCache {
    scoring: Scoring,
    tables: BTreeMap<&'static str, TableCache>,
}

impl MigCache {
    pub(crate) fn new(scoring: Scoring) -> Self {
        MigCache {
            scoring,
            tables: BTreeMap::new(),
        }
    }

    /// Computes the answers for a table the first time a card of it appears.
    pub(crate) fn ensure(&mut self, table: &'static MigTable) {
        if self.tables.contains_key(table.model) {
            return;
        }
        let full = if table.memory_slices >= 8 {
            u8::MAX
        } else {
            (1u8 << table.memory_slices) - 1
        };
        let profiles = table
            .profiles
            .iter()
            .map(|profile| {
                let fit: Vec<Option<(u8, MigScore)>> = (0..=u8::MAX)
                    .map(|occupied| {
                        let start = table.preferred_start(profile, occupied)?;
                        let after = occupied | profile.mask_at(start);
                        let free = (!after & full).count_ones() as u8;
                        let mut room = table.headroom(after);
                        for r in &mut room {
                            *r = u8::MAX - *r;
                        }
                        let free = match self.scoring {
                            Scoring::Binpack => free,
                            Scoring::Spread => u8::MAX - free,
                        };
                        Some((start, MigScore { free, room }))
                    })
                    .collect();
                let mut order: Vec<(MigScore, u8)> = fit
                    .iter()
                    .zip(0..=u8::MAX)
                    .filter_map(|(f, occupied)| f.map(|(_, score)| (score, occupied)))
                    .collect();
                order.sort_unstable();
                ProfileCache { fit, order }
            })
            .collect();
        self.tables
            .insert(table.model, TableCache { table, profiles });
    }

    /// The tables known, by model name.
    pub(crate) fn tables(&self) -> impl Iterator<Item = &TableCache> {
        self.tables.values()
    }

    /// The profile a request gets on `table`, with its position in the table.
    pub(crate) fn pick(
        table: &'static MigTable,
        slices: u8,
        memory_mib: Option<u64>,
    ) -> Result<(usize, &'static MigProfile), MigError> {
        let profile = table.pick_profile(slices, memory_mib)?;
        let at = table
            .profiles
            .iter()
            .position(|p| std::ptr::eq(p, profile))
            .unwrap_or(0);
        Ok((at, profile))
    }

    /// The start and score of profile `at` of `table` on a card with `occupied` slices.
    pub(crate) fn fit(
        &self,
        table: &'static MigTable,
        at: usize,
        occupied: u8,
    ) -> Option<(u8, MigScore)> {
        self.tables
            .get(table.model)?
            .profiles
            .get(at)?
            .fit
            .get(usize::from(occupied))
            .copied()
            .flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use runtimekit_contract::mig::H800_80GB;

    #[test]
    fn answers_match_the_table_rules() {
        let mut cache = MigCache::new(Scoring::Binpack);
        cache.ensure(&H800_80GB);
        for (at, profile) in H800_80GB.profiles.iter().enumerate() {
            for occupied in 0..=u8::MAX {
                let want = H800_80GB.preferred_start(profile, occupied);
                let got = cache.fit(&H800_80GB, at, occupied).map(|(s, _)| s);
                assert_eq!(got, want, "{} on {occupied:08b}", profile.name);
            }
        }
    }

    #[test]
    fn binpack_prefers_fuller_cards_and_spread_emptier() {
        let one_g = 0;
        let mut pack = MigCache::new(Scoring::Binpack);
        pack.ensure(&H800_80GB);
        let mut spread = MigCache::new(Scoring::Spread);
        spread.ensure(&H800_80GB);
        let score = |c: &MigCache, occ| c.fit(&H800_80GB, one_g, occ).map(|(_, s)| s);
        // A card with a 3g at 4 against an empty card.
        assert!(score(&pack, 0xF0) < score(&pack, 0));
        assert!(score(&spread, 0) < score(&spread, 0xF0));
    }
}
