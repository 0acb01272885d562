//! Which kind of request one container's values make, by the rules between them: whole cards
//! (under one name, with no share resource), a MIG instance (without gpu-core) or a
//! time-division share; and gpu-memory converted from the configured unit to MiB.

use super::container::Values;
use super::parser::Parser;
use super::{CardRequest, MAX_CARDS, Violation, Warning, WholeCardName};
use crate::config::{MemoryUnit, NVIDIA_GPU};

/// The most memory one card may be asked for: 16 TiB, far above any card.
const MAX_MEMORY_MIB: u64 = 16 << 20;

impl Parser<'_> {
    /// Applies the rules between one container's values and builds its request.
    pub(super) fn card_request(
        &mut self,
        container: &str,
        v: &Values,
        replica: u32,
    ) -> Option<CardRequest> {
        let names = self.names;
        if let (Some(_), Some(_)) = (v.any_vendor, v.nvidia) {
            self.finding(
                container,
                Violation::TwoWholeCardNames {
                    first: names.gpu.clone(),
                    second: NVIDIA_GPU.into(),
                },
            );
            return None;
        }
        let whole = v
            .any_vendor
            .map(|n| (n, WholeCardName::AnyVendor, names.gpu.clone()))
            .or(v
                .nvidia
                .map(|n| (n, WholeCardName::Nvidia, NVIDIA_GPU.to_owned())));

        if let Some((count, kind, resource)) = whole {
            let mut ok = true;
            for (value, fractional) in [
                (v.core, &names.gpu_core),
                (v.memory, &names.gpu_memory),
                (v.slice, &names.gpu_slice),
            ] {
                if value.is_some() {
                    self.finding(
                        container,
                        Violation::WholeWithFraction {
                            whole: resource.clone(),
                            fractional: fractional.clone(),
                        },
                    );
                    ok = false;
                }
            }
            if !(1..=i64::from(MAX_CARDS)).contains(&count) {
                self.finding(
                    container,
                    Violation::CardCountInvalid {
                        resource,
                        value: count,
                        max: MAX_CARDS,
                    },
                );
                ok = false;
            }
            // The count is in range here, so the conversion cannot fail.
            return ok.then(|| CardRequest::Whole {
                cards: u32::try_from(count).unwrap_or(MAX_CARDS),
                name: kind,
            });
        }

        if v.slice.is_some() && v.core.is_some() {
            self.finding(
                container,
                Violation::SliceWithCore {
                    slice: names.gpu_slice.clone(),
                    core: names.gpu_core.clone(),
                },
            );
            return None;
        }
        let memory_mib = v.memory.and_then(|m| self.memory(container, m));
        if let Some(slices) = v.slice {
            if ![1, 2, 3, 4, 7].contains(&slices) {
                self.finding(
                    container,
                    Violation::SliceInvalid {
                        resource: names.gpu_slice.clone(),
                        value: slices,
                    },
                );
                return None;
            }
            return Some(CardRequest::Mig {
                cards: replica,
                slices: slices as u8,
                memory_mib,
            });
        }
        if v.core.is_none() && v.memory.is_none() {
            return None;
        }
        let core = match v.core {
            Some(0) => {
                self.warnings.push(Warning::CoreZero {
                    container: container.into(),
                    resource: names.gpu_core.clone(),
                });
                None
            }
            Some(c @ 1..=100) => Some(c as u8),
            Some(c) => {
                self.finding(
                    container,
                    Violation::CoreOutOfRange {
                        resource: names.gpu_core.clone(),
                        value: c,
                    },
                );
                None
            }
            None => None,
        };
        Some(CardRequest::Tdm {
            cards: replica,
            core,
            memory_mib,
        })
    }

    /// Converts a gpu-memory value in the configured unit to MiB.
    fn memory(&mut self, container: &str, value: i64) -> Option<u64> {
        let resource = self.names.gpu_memory.clone();
        let unit = self.config.memory_unit;
        let value_u = u64::try_from(value).unwrap_or(0);
        if value_u == 0 {
            let violation = match unit {
                MemoryUnit::GiB => Violation::MemoryNotPositive { resource, value },
                MemoryUnit::MiB => Violation::MemoryNotMultiple { resource, value },
            };
            self.finding(container, violation);
            return None;
        }
        if unit == MemoryUnit::MiB && value_u % MemoryUnit::MIB_STEP != 0 {
            self.finding(container, Violation::MemoryNotMultiple { resource, value });
            return None;
        }
        match value_u
            .checked_mul(unit.mib())
            .filter(|&mib| mib <= MAX_MEMORY_MIB)
        {
            Some(mib) => Some(mib),
            None => {
                self.finding(
                    container,
                    Violation::MemoryTooLarge {
                        resource,
                        value,
                        unit,
                    },
                );
                None
            }
        }
    }
}
