//! The container's limits, from the environment `lj-runtime` sets (see its `inject` module):
//! one entry per visible card, in the same order in every variable.

use crate::throttle::Policy;
use std::path::PathBuf;

/// The caps of one card the container sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CardLimit {
    /// The card's (or MIG instance's) UUID, `GPU-…` or `MIG-…`.
    pub uuid: String,
    /// The memory cap in bytes; `None`: no cap (a whole card, a MIG instance, or `0`).
    pub memory: Option<u64>,
    /// The compute cap in percent of SM time, 1 to 99; `None`: no cap (`0`, `100` or absent).
    pub core: Option<u32>,
}

/// Everything the library enforces.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Limits {
    /// The visible cards, in order.
    pub cards: Vec<CardLimit>,
    /// The folder of the ledger the container's processes share; `None`: this process keeps
    /// its own.
    pub ledger_dir: Option<PathBuf>,
    /// The read-only folder of the container's measured shares; `None`: no measurements.
    pub measured_dir: Option<PathBuf>,
    /// What a container alone on its card may use of it.
    pub policy: Policy,
}

/// The variables read.
pub const VISIBLE: &str = "RUNTIMEKIT_VISIBLE_DEVICES";
/// Memory caps in MiB per card, `0` for none.
pub const MEMORY: &str = "RUNTIMEKIT_GPU_MEMORY_LIMIT_MIB";
/// Compute caps in percent per card, `0` for none.
pub const CORE: &str = "RUNTIMEKIT_GPU_CORE_LIMIT";
/// `enforce` (the default) or `yield-idle`: the compute cap of a container alone on its card.
pub const POLICY: &str = "RUNTIMEKIT_GPU_CORE_POLICY";
/// The ledger's folder.
pub const LEDGER_DIR: &str = "RUNTIMEKIT_ISOLATION_DIR";
/// The measured shares' folder.
pub const MEASURED_DIR: &str = "RUNTIMEKIT_MEASURED_DIR";

impl Limits {
    /// Reads the limits through `var`. No visible cards means nothing to enforce; a list that
    /// cannot be read is an error (the library then refuses every allocation rather than
    /// letting a capped container run uncapped).
    pub fn read(var: impl Fn(&str) -> Option<String>) -> Result<Limits, String> {
        let list = |name: &str| -> Vec<String> {
            var(name)
                .map(|v| {
                    v.split(',')
                        .map(|s| s.trim().to_owned())
                        .filter(|s| !s.is_empty())
                        .collect()
                })
                .unwrap_or_default()
        };
        let uuids = list(VISIBLE);
        let memory = list(MEMORY);
        let core = list(CORE);
        for (name, values) in [(MEMORY, &memory), (CORE, &core)] {
            if !values.is_empty() && values.len() != uuids.len() {
                return Err(format!(
                    "{name} names {} cards and {VISIBLE} {}",
                    values.len(),
                    uuids.len()
                ));
            }
        }
        let number = |name: &str, value: &str| {
            value
                .parse::<u64>()
                .map_err(|_| format!("{name}: {value:?} is not a number"))
        };
        let cards = uuids
            .into_iter()
            .enumerate()
            .map(|(i, uuid)| {
                let memory = match memory.get(i).map(|m| number(MEMORY, m)).transpose()? {
                    None | Some(0) => None,
                    Some(mib) => Some(
                        mib.checked_mul(1 << 20)
                            .ok_or_else(|| format!("{MEMORY}: {mib} MiB is too large"))?,
                    ),
                };
                let core = match core.get(i).map(|c| number(CORE, c)).transpose()? {
                    None | Some(0 | 100) => None,
                    Some(percent) if percent < 100 => Some(percent as u32),
                    Some(percent) => return Err(format!("{CORE}: {percent} is over 100")),
                };
                Ok(CardLimit { uuid, memory, core })
            })
            .collect::<Result<_, String>>()?;
        let policy = match var(POLICY).as_deref() {
            None | Some("" | "enforce") => Policy::Enforce,
            Some("yield-idle") => Policy::YieldIdle,
            Some(other) => {
                return Err(format!(
                    "{POLICY}: {other:?} is neither enforce nor yield-idle"
                ));
            }
        };
        Ok(Limits {
            cards,
            ledger_dir: var(LEDGER_DIR).filter(|d| !d.is_empty()).map(PathBuf::from),
            measured_dir: var(MEASURED_DIR)
                .filter(|d| !d.is_empty())
                .map(PathBuf::from),
            policy,
        })
    }

    /// The position of the card whose UUID is `uuid` (compared without the `GPU-`/`MIG-`
    /// prefix and case), if the container was given it.
    pub fn card(&self, uuid: &str) -> Option<usize> {
        let bare = |u: &str| {
            u.strip_prefix("GPU-")
                .or_else(|| u.strip_prefix("MIG-"))
                .unwrap_or(u)
                .to_ascii_lowercase()
        };
        let wanted = bare(uuid);
        self.cards.iter().position(|c| bare(&c.uuid) == wanted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn read(vars: &[(&str, &str)]) -> Result<Limits, String> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Limits::read(|name| vars.get(name).cloned())
    }

    #[test]
    fn caps_follow_the_card_order_and_zero_means_none() {
        let limits = read(&[
            (VISIBLE, "GPU-aa,GPU-bb"),
            (MEMORY, "4096,0"),
            (CORE, "30,100"),
            (POLICY, "yield-idle"),
            (LEDGER_DIR, "/run/runtimekit/isolation"),
        ])
        .expect("limits");
        assert_eq!(
            (limits.cards[0].core, limits.cards[1].core),
            (Some(30), None)
        );
        assert_eq!(limits.policy, Policy::YieldIdle);
        assert_eq!(limits.cards[0].memory, Some(4 << 30));
        assert_eq!(limits.cards[1].memory, None);
        assert_eq!(limits.card("gpu-BB"), None);
        assert_eq!(limits.card("GPU-BB"), Some(1));
        assert_eq!(limits.card("MIG-aa"), Some(0));
        assert_eq!(
            limits.ledger_dir.as_deref(),
            Some(std::path::Path::new("/run/runtimekit/isolation"))
        );
    }

    #[test]
    fn nothing_set_is_nothing_to_enforce_and_garbage_is_an_error() {
        assert_eq!(read(&[]), Ok(Limits::default()));
        assert!(read(&[(VISIBLE, "GPU-aa"), (MEMORY, "4g")]).is_err());
        assert!(read(&[(VISIBLE, "GPU-aa"), (MEMORY, "1,2")]).is_err());
        assert!(read(&[(VISIBLE, "GPU-aa"), (MEMORY, &u64::MAX.to_string())]).is_err());
        assert!(read(&[(VISIBLE, "GPU-aa"), (CORE, "101")]).is_err());
        assert!(read(&[(VISIBLE, "GPU-aa"), (POLICY, "lenient")]).is_err());
    }
}
