//! The files of a time-division container's isolation folders, which three programs share.
//! `lj-runtime` makes two folders under `<isolationStateDir>/<container ID>` on the host:
//!
//! - `ledger`, bound read-write (`RUNTIMEKIT_ISOLATION_DIR` in the container): the memory
//!   ledger every process of the container maps;
//! - `measured`, bound read-only (`RUNTIMEKIT_MEASURED_DIR`): the measured shares of SM time,
//!   written by the resource layer's compute meter, which sees host PIDs. Read-only because the
//!   container must not be able to write its own measurement, and because the meter, running
//!   as root on the host, must never write into a folder the container controls (a symlink
//!   planted there would aim its write at any host file).
//!
//! The shares file is replaced whole on each measurement, one line per card:
//! `<card UUID> <the container's share> <everyone else's share> <measurement number>`, shares
//! in 0..=1; a card's line counts once per measurement number.

/// The ledger folder's name under the container's own folder on the host.
pub const LEDGER_FOLDER: &str = "ledger";
/// The memory ledger's file in the ledger folder (mapped by every process of the container).
pub const LEDGER: &str = "ledger";
/// The measurements folder's name under the container's own folder on the host.
pub const MEASURED_FOLDER: &str = "measured";
/// The measured shares' file in the measurements folder.
pub const SHARES: &str = "shares";

/// One card's measurement.
#[derive(Debug, Clone, PartialEq)]
pub struct Share {
    /// The card.
    pub uuid: String,
    /// The container's share of its SM time.
    pub mine: f64,
    /// Everyone else's.
    pub others: f64,
    /// Which measurement this is.
    pub sequence: u64,
}

/// The well-formed lines of a shares file; others are skipped.
pub fn parse(text: &str) -> Vec<Share> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let uuid = words.next()?.to_owned();
            let share = |w: Option<&str>| {
                w?.parse::<f64>()
                    .ok()
                    .filter(|s| s.is_finite() && (0.0..=1.0).contains(s))
            };
            let mine = share(words.next())?;
            let others = share(words.next())?;
            let sequence = words.next()?.parse().ok()?;
            words.next().is_none().then_some(Share {
                uuid,
                mine,
                others,
                sequence,
            })
        })
        .collect()
}

/// The file's text for `shares`.
pub fn render(shares: &[Share]) -> String {
    shares
        .iter()
        .map(|s| format!("{} {:.4} {:.4} {}\n", s.uuid, s.mine, s.others, s.sequence))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_read_back_and_garbage_is_skipped() {
        let shares = vec![Share {
            uuid: "GPU-a".into(),
            mine: 0.3,
            others: 0.25,
            sequence: 7,
        }];
        assert_eq!(parse(&render(&shares)), shares);
        let text = "GPU-a 0.5 0.1 1\nGPU-b 1.5 0 2\nGPU-c 0.1 nan 3\nGPU-d 0.1 0.1\nGPU-e 0.1 0.1 4 extra\n";
        let read = parse(text);
        assert_eq!(read.len(), 1, "{read:?}");
        assert_eq!(read[0].uuid, "GPU-a");
    }
}
