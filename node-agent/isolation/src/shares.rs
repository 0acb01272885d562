//! The measured shares of SM time the compute gates steer by: a file `shares` in the
//! container's ledger folder, written by whoever measures them (the node agent, which sees host
//! PIDs), replaced whole on each measurement. One line per card:
//! `<card UUID> <the container's share> <everyone else's share> <measurement number>`, shares
//! in 0..=1; a card's line counts once per measurement number.

/// The file's name in the ledger folder.
pub const FILE: &str = "shares";

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

#[cfg(test)]
mod tests {
    use super::*;

    /// The file's text for `shares`, as its writer puts it.
    pub fn render(shares: &[Share]) -> String {
        shares
            .iter()
            .map(|s| format!("{} {:.4} {:.4} {}\n", s.uuid, s.mine, s.others, s.sequence))
            .collect()
    }

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
