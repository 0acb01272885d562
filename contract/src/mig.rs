//! MIG profile tables and placement rules, kept in one place for every component.
//!
//! A MIG-capable card has a fixed number of memory slices (8 on A100/H100/H200/B200, 4 on A30);
//! an instance of a profile occupies `memory_slices` consecutive slices starting at one of the
//! profile's legal starts, and instances never overlap. Under these rules the compute slices of
//! the instances on a card never exceed the card's compute slices, so the memory-slice bitmap is
//! the whole state of a card.
//!
//! Profile names and sizes come from NVIDIA's public MIG user guide and the GPU operator's
//! `default-mig-parted-config`. Media-extension profiles (`+me`) are left out: a `gpu-slice`
//! request never asks for media engines. Profiles are matched by the memory their name states
//! (`1g.10gb` offers 10 GiB), which is what users read; the node agent reports the exact size
//! the hardware gives.

use thiserror::Error;

/// One MIG GPU-instance profile of one card model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigProfile {
    /// The profile name, for example `3g.40gb`.
    pub name: &'static str,
    /// Compute slices of the instance (the `gpu-slice` value that asks for it).
    pub slices: u8,
    /// Consecutive memory slices the instance occupies.
    pub memory_slices: u8,
    /// Memory the name states, in GiB.
    pub memory_gib: u32,
    /// First memory slices an instance may start at.
    pub starts: &'static [u8],
}

impl MigProfile {
    /// Memory the name states, in MiB.
    pub fn memory_mib(&self) -> u64 {
        u64::from(self.memory_gib) * 1024
    }

    /// The memory-slice bitmap of an instance of this profile at `start`.
    pub fn mask_at(&self, start: u8) -> u8 {
        let span = if self.memory_slices >= 8 {
            u8::MAX
        } else {
            (1u8 << self.memory_slices) - 1
        };
        span << start
    }
}

/// The MIG profiles of one card model.
#[derive(Debug, PartialEq, Eq)]
pub struct MigTable {
    /// The model this table is for, for example `H800-80GB`.
    pub model: &'static str,
    /// Compute slices of the whole card (7, or 4 on A30-class cards).
    pub compute_slices: u8,
    /// Memory slices of the whole card (8, or 4 on A30-class cards).
    pub memory_slices: u8,
    /// The profiles, smallest first; for a slice count, the smaller-memory profile comes first.
    pub profiles: &'static [MigProfile],
}

/// An instance already on a card, as far as placement cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Placement {
    /// Its first memory slice.
    pub start: u8,
    /// How many memory slices it occupies.
    pub memory_slices: u8,
}

impl Placement {
    /// The memory-slice bitmap of this instance.
    pub fn mask(&self) -> u8 {
        let span = if self.memory_slices >= 8 {
            u8::MAX
        } else {
            (1u8 << self.memory_slices) - 1
        };
        span << self.start
    }
}

/// Why no profile of a model serves a request.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum MigError {
    /// The model has no profile with this many compute slices.
    #[error("{model} has no {slices}-slice MIG profile (it offers {offered})")]
    NoSuchSlices {
        model: &'static str,
        slices: u8,
        offered: String,
    },
    /// Every profile with this many slices has less memory than asked.
    #[error(
        "{model}'s largest {slices}-slice MIG profile {largest} offers {largest_gib} GiB, less than the {asked_mib} MiB asked"
    )]
    NotEnoughMemory {
        model: &'static str,
        slices: u8,
        largest: &'static str,
        largest_gib: u32,
        asked_mib: u64,
    },
}

const STARTS_1: &[u8] = &[0, 1, 2, 3, 4, 5, 6];
const STARTS_1_DOUBLE: &[u8] = &[0, 2, 4, 6];
const STARTS_2: &[u8] = &[0, 2, 4];
const STARTS_3: &[u8] = &[0, 4];
const STARTS_0: &[u8] = &[0];

/// The profile set of every 7-slice card, for the memory each name states.
macro_rules! seven_slice_profiles {
    ($g1:literal, $g1d:literal, $g2:literal, $g3:literal, $g4:literal, $g7:literal) => {
        &[
            MigProfile {
                name: concat!("1g.", $g1, "gb"),
                slices: 1,
                memory_slices: 1,
                memory_gib: $g1,
                starts: STARTS_1,
            },
            MigProfile {
                name: concat!("1g.", $g1d, "gb"),
                slices: 1,
                memory_slices: 2,
                memory_gib: $g1d,
                starts: STARTS_1_DOUBLE,
            },
            MigProfile {
                name: concat!("2g.", $g2, "gb"),
                slices: 2,
                memory_slices: 2,
                memory_gib: $g2,
                starts: STARTS_2,
            },
            MigProfile {
                name: concat!("3g.", $g3, "gb"),
                slices: 3,
                memory_slices: 4,
                memory_gib: $g3,
                starts: STARTS_3,
            },
            MigProfile {
                name: concat!("4g.", $g4, "gb"),
                slices: 4,
                memory_slices: 4,
                memory_gib: $g4,
                starts: STARTS_0,
            },
            MigProfile {
                name: concat!("7g.", $g7, "gb"),
                slices: 7,
                memory_slices: 8,
                memory_gib: $g7,
                starts: STARTS_0,
            },
        ]
    };
}

/// The profile set of every 4-slice card.
macro_rules! four_slice_profiles {
    ($g1:literal, $g2:literal, $g4:literal) => {
        &[
            MigProfile {
                name: concat!("1g.", $g1, "gb"),
                slices: 1,
                memory_slices: 1,
                memory_gib: $g1,
                starts: &[0, 1, 2, 3],
            },
            MigProfile {
                name: concat!("2g.", $g2, "gb"),
                slices: 2,
                memory_slices: 2,
                memory_gib: $g2,
                starts: &[0, 2],
            },
            MigProfile {
                name: concat!("4g.", $g4, "gb"),
                slices: 4,
                memory_slices: 4,
                memory_gib: $g4,
                starts: STARTS_0,
            },
        ]
    };
}

macro_rules! seven {
    ($model:literal, $($g:literal),+) => {
        MigTable { model: $model, compute_slices: 7, memory_slices: 8, profiles: seven_slice_profiles!($($g),+) }
    };
}

macro_rules! four {
    ($model:literal, $($g:literal),+) => {
        MigTable { model: $model, compute_slices: 4, memory_slices: 4, profiles: four_slice_profiles!($($g),+) }
    };
}

/// A100-40GB and A800-40GB.
pub static A100_40GB: MigTable = seven!("A100-40GB", 5, 10, 10, 20, 20, 40);
/// A100-80GB and A800-80GB.
pub static A100_80GB: MigTable = seven!("A100-80GB", 10, 20, 20, 40, 40, 80);
/// A30-24GB.
pub static A30_24GB: MigTable = four!("A30-24GB", 6, 12, 24);
/// H100-80GB (SXM and PCIe).
pub static H100_80GB: MigTable = seven!("H100-80GB", 10, 20, 20, 40, 40, 80);
/// H800-80GB (SXM and PCIe).
pub static H800_80GB: MigTable = seven!("H800-80GB", 10, 20, 20, 40, 40, 80);
/// H100 NVL and H800 NVL, 94 GB.
pub static H100_94GB: MigTable = seven!("H100-94GB", 12, 24, 24, 47, 47, 94);
/// H100-96GB, GH200-96GB and H20.
pub static H100_96GB: MigTable = seven!("H100-96GB", 12, 24, 24, 48, 48, 96);
/// H200-141GB (SXM and NVL).
pub static H200_141GB: MigTable = seven!("H200-141GB", 18, 35, 35, 71, 71, 141);
/// B200-180GB.
pub static B200_180GB: MigTable = seven!("B200-180GB", 23, 45, 45, 90, 90, 180);
/// B300-288GB (Blackwell Ultra).
pub static B300_288GB: MigTable = seven!("B300-288GB", 34, 67, 67, 135, 135, 269);
/// RTX PRO 6000 Blackwell, 96 GB.
pub static RTX_PRO_6000: MigTable = four!("RTX-PRO-6000-96GB", 24, 48, 96);

/// Every table, for listings and tests.
pub static ALL_TABLES: [&MigTable; 11] = [
    &A100_40GB,
    &A100_80GB,
    &A30_24GB,
    &H100_80GB,
    &H800_80GB,
    &H100_94GB,
    &H100_96GB,
    &H200_141GB,
    &B200_180GB,
    &B300_288GB,
    &RTX_PRO_6000,
];

const GIB: u64 = 1024;

/// The MIG table for a card, from its product name as the driver reports it (for example
/// `NVIDIA A100-SXM4-80GB`, `NVIDIA H800`, `NVIDIA H200 NVL`) and its memory in MiB, which tells
/// apart the memory variants of one model. `None` means the model has no MIG, or no public table.
pub fn table_for(product_name: &str, memory_mib: u64) -> Option<&'static MigTable> {
    let upper = product_name.to_ascii_uppercase();
    let tokens: Vec<&str> = upper
        .split([' ', '-', '_'])
        .filter(|t| !t.is_empty())
        .collect();
    let has = |t: &str| tokens.contains(&t);
    if has("A100") || has("A800") {
        return Some(if memory_mib <= 48 * GIB {
            &A100_40GB
        } else {
            &A100_80GB
        });
    }
    if has("A30") {
        return Some(&A30_24GB);
    }
    if has("H100") || has("H800") || has("GH200") && memory_mib < 100 * GIB {
        if has("NVL") || (90 * GIB..95 * GIB).contains(&memory_mib) {
            return Some(&H100_94GB);
        }
        if memory_mib >= 95 * GIB {
            return Some(&H100_96GB);
        }
        return Some(if has("H800") { &H800_80GB } else { &H100_80GB });
    }
    if has("H20") {
        // The H20 has 96 GB; no MIG table is public for later memory variants.
        return (memory_mib < 100 * GIB).then_some(&H100_96GB);
    }
    if has("H200") || has("GH200") {
        return Some(&H200_141GB);
    }
    if has("B200") {
        return Some(&B200_180GB);
    }
    if has("B300") {
        return Some(&B300_288GB);
    }
    if has("RTX") && has("PRO") && has("6000") && has("BLACKWELL") {
        return Some(&RTX_PRO_6000);
    }
    None
}

impl MigTable {
    /// The smallest profile with `slices` compute slices whose memory covers `memory_mib`
    /// (any memory when `None`): `gpu-slice: 1` with `gpu-memory: 15` picks 1g.20gb over 1g.10gb.
    pub fn pick_profile(
        &self,
        slices: u8,
        memory_mib: Option<u64>,
    ) -> Result<&'static MigProfile, MigError> {
        let mut candidates = self
            .profiles
            .iter()
            .filter(|p| p.slices == slices)
            .peekable();
        if candidates.peek().is_none() {
            return Err(MigError::NoSuchSlices {
                model: self.model,
                slices,
                offered: self.offered(),
            });
        }
        let asked = memory_mib.unwrap_or(0);
        let mut largest = None;
        for profile in candidates {
            if profile.memory_mib() >= asked {
                return Ok(profile);
            }
            largest = Some(profile);
        }
        let largest = largest.unwrap_or(&self.profiles[0]);
        Err(MigError::NotEnoughMemory {
            model: self.model,
            slices,
            largest: largest.name,
            largest_gib: largest.memory_gib,
            asked_mib: asked,
        })
    }

    /// The profile called `name`, if this model has it.
    pub fn profile(&self, name: &str) -> Option<&'static MigProfile> {
        self.profiles.iter().find(|p| p.name == name)
    }

    /// The memory-slice bitmap of the instances on a card.
    pub fn occupied(existing: &[Placement]) -> u8 {
        existing.iter().fold(0, |mask, p| mask | p.mask())
    }

    /// The starts where `profile` can be placed on a card whose occupied memory slices are
    /// `occupied`, in increasing order.
    pub fn legal_starts(&self, profile: &MigProfile, occupied: u8) -> Vec<u8> {
        profile
            .starts
            .iter()
            .copied()
            .filter(|&start| start + profile.memory_slices <= self.memory_slices)
            .filter(|&start| profile.mask_at(start) & occupied == 0)
            .collect()
    }

    /// The legal start for `profile` that keeps the largest profiles placeable afterwards, or
    /// `None` when it does not fit. Ties go to the highest start, which leaves the low slices,
    /// where the large profiles must start, free.
    pub fn preferred_start(&self, profile: &MigProfile, occupied: u8) -> Option<u8> {
        self.legal_starts(profile, occupied)
            .into_iter()
            .max_by_key(|&start| (self.headroom(occupied | profile.mask_at(start)), start))
    }

    /// How much room a card with `occupied` memory slices keeps, as a key that compares the
    /// largest profiles first: for each profile from the largest down, how many more instances
    /// of it alone would still fit.
    pub fn headroom(&self, occupied: u8) -> [u8; 8] {
        let mut key = [0u8; 8];
        let mut profiles: Vec<&MigProfile> = self.profiles.iter().collect();
        profiles.sort_by_key(|p| std::cmp::Reverse((p.memory_slices, p.slices)));
        for (slot, profile) in key.iter_mut().zip(profiles) {
            let mut mask = occupied;
            while let Some(&start) = self.legal_starts(profile, mask).first() {
                mask |= profile.mask_at(start);
                *slot += 1;
            }
        }
        key
    }

    fn offered(&self) -> String {
        self.profiles
            .iter()
            .map(|p| p.name)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place(table: &MigTable, name: &str, start: u8, occupied: u8) -> u8 {
        let profile = table.profile(name).expect("profile exists");
        assert!(
            table.legal_starts(profile, occupied).contains(&start),
            "{name}@{start} on {occupied:08b}"
        );
        occupied | profile.mask_at(start)
    }

    #[test]
    fn spec_profile_names() {
        let names = |t: &MigTable| t.profiles.iter().map(|p| p.name).collect::<Vec<_>>();
        assert_eq!(
            names(&A100_40GB),
            [
                "1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"
            ]
        );
        for t in [&A100_80GB, &H100_80GB, &H800_80GB] {
            assert_eq!(
                names(t),
                [
                    "1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"
                ]
            );
        }
        assert_eq!(
            names(&H200_141GB),
            [
                "1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"
            ]
        );
        assert_eq!(names(&A30_24GB), ["1g.6gb", "2g.12gb", "4g.24gb"]);
    }

    #[test]
    fn spec_geometry_starts_and_maxima() {
        for table in ALL_TABLES.iter().filter(|t| t.compute_slices == 7) {
            let starts = |i: usize| table.profiles[i].starts;
            assert_eq!(starts(0), [0, 1, 2, 3, 4, 5, 6]);
            assert_eq!(starts(1), [0, 2, 4, 6]);
            assert_eq!(starts(2), [0, 2, 4]);
            assert_eq!(starts(3), [0, 4]);
            assert_eq!(starts(4), [0]);
            assert_eq!(starts(5), [0]);
            // The maximum count of each profile alone on an empty card: 7, 4, 3, 2, 1, 1.
            let alone: Vec<u8> = table
                .profiles
                .iter()
                .map(|p| {
                    let mut mask = 0;
                    let mut n = 0;
                    while let Some(&s) = table.legal_starts(p, mask).first() {
                        mask |= p.mask_at(s);
                        n += 1;
                    }
                    n
                })
                .collect();
            assert_eq!(alone, [7, 4, 3, 2, 1, 1], "{}", table.model);
        }
    }

    #[test]
    fn model_lookup_by_product_name_and_memory() {
        let lookup = |name, gib: u64| table_for(name, gib * 1024).map(|t| t.model);
        assert_eq!(lookup("NVIDIA A100-SXM4-40GB", 40), Some("A100-40GB"));
        assert_eq!(lookup("NVIDIA A100-SXM4-80GB", 80), Some("A100-80GB"));
        assert_eq!(lookup("NVIDIA A800 80GB PCIe", 80), Some("A100-80GB"));
        assert_eq!(lookup("NVIDIA A30", 24), Some("A30-24GB"));
        assert_eq!(lookup("NVIDIA H100 80GB HBM3", 80), Some("H100-80GB"));
        assert_eq!(lookup("NVIDIA H800", 80), Some("H800-80GB"));
        assert_eq!(lookup("NVIDIA H100 NVL", 94), Some("H100-94GB"));
        assert_eq!(lookup("NVIDIA H20", 96), Some("H100-96GB"));
        assert_eq!(lookup("NVIDIA H200", 141), Some("H200-141GB"));
        assert_eq!(lookup("NVIDIA H200 NVL", 141), Some("H200-141GB"));
        assert_eq!(lookup("NVIDIA B200", 180), Some("B200-180GB"));
        assert_eq!(lookup("NVIDIA GeForce RTX 4090", 24), None);
        assert_eq!(lookup("NVIDIA L40S", 48), None);
        assert_eq!(lookup("PPU-810E", 96), None);
    }

    #[test]
    fn pick_smallest_profile_whose_memory_suffices() {
        let pick = |t: &MigTable, s, gib: Option<u64>| {
            t.pick_profile(s, gib.map(|g| g * 1024)).map(|p| p.name)
        };
        assert_eq!(pick(&H800_80GB, 3, Some(4)), Ok("3g.40gb"));
        assert_eq!(pick(&A100_40GB, 3, Some(4)), Ok("3g.20gb"));
        assert_eq!(pick(&H100_80GB, 1, Some(10)), Ok("1g.10gb"));
        assert_eq!(pick(&H100_80GB, 1, Some(15)), Ok("1g.20gb"));
        assert_eq!(pick(&H100_80GB, 1, None), Ok("1g.10gb"));
        assert_eq!(pick(&H200_141GB, 7, None), Ok("7g.141gb"));
        assert_eq!(
            pick(&H100_80GB, 2, Some(30)),
            Err(MigError::NotEnoughMemory {
                model: "H100-80GB",
                slices: 2,
                largest: "2g.20gb",
                largest_gib: 20,
                asked_mib: 30 * 1024
            })
        );
        let err = H100_80GB
            .pick_profile(2, Some(30 * 1024))
            .expect_err("too much memory");
        assert_eq!(
            err.to_string(),
            "H100-80GB's largest 2-slice MIG profile 2g.20gb offers 20 GiB, less than the 30720 MiB asked"
        );
        let err = A30_24GB.pick_profile(3, None).expect_err("A30 has no 3g");
        assert_eq!(
            err.to_string(),
            "A30-24GB has no 3-slice MIG profile (it offers 1g.6gb, 2g.12gb, 4g.24gb)"
        );
    }

    #[test]
    fn documented_layouts_are_legal() {
        let t = &H100_80GB;
        let mut m = place(t, "4g.40gb", 0, 0);
        m = place(t, "3g.40gb", 4, m);
        assert_eq!(m, 0xFF);
        let mut m = place(t, "3g.40gb", 4, 0);
        m = place(t, "2g.20gb", 0, m);
        m = place(t, "1g.10gb", 2, m);
        place(t, "1g.10gb", 3, m);
        let mut m = place(t, "2g.20gb", 0, 0);
        m = place(t, "2g.20gb", 2, m);
        m = place(t, "2g.20gb", 4, m);
        place(t, "1g.10gb", 6, m);
    }

    #[test]
    fn a_4g_cannot_start_at_slot_4() {
        let t = &H800_80GB;
        let g4 = t.profile("4g.40gb").expect("4g");
        assert_eq!(t.legal_starts(g4, 0), [0]);
        let occupied = place(t, "1g.10gb", 0, 0);
        assert!(t.legal_starts(g4, occupied).is_empty());
    }

    #[test]
    fn preferred_start_keeps_large_profiles_possible() {
        let t = &H800_80GB;
        let g1 = t.profile("1g.10gb").expect("1g");
        let g3 = t.profile("3g.40gb").expect("3g");
        let g4 = t.profile("4g.40gb").expect("4g");
        // A first 1g goes high, so a 4g (which must start at 0) still fits.
        let start = t.preferred_start(g1, 0).expect("fits");
        assert!(start >= 4, "1g placed at {start}");
        let occupied = g1.mask_at(start);
        assert_eq!(t.legal_starts(g4, occupied), [0]);
        // A 3g goes to 4, keeping 0-3 for a 4g.
        assert_eq!(t.preferred_start(g3, 0), Some(4));
        // A full card has no start.
        assert_eq!(t.preferred_start(g1, 0xFF), None);
    }
}
