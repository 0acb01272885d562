//! The one backoff every retry of the operator uses: the wait doubles with each failure in a row,
//! from a first wait up to a ceiling.

use std::time::Duration;

/// An exponential backoff: `first` after one failure, doubling per failure, at most `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The wait after the first failure.
    pub first: Duration,
    /// The longest wait.
    pub max: Duration,
}

impl Backoff {
    /// The wait after `failures` failures in a row (0 and 1 both give `first`).
    pub fn after(&self, failures: u32) -> Duration {
        // Past 2^6 the ceiling applies for every setting used here; the cap keeps the shift sane.
        let doublings = failures.saturating_sub(1).min(6);
        self.first.saturating_mul(1 << doublings).min(self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::Backoff;
    use std::time::Duration;

    #[test]
    fn doubles_from_the_first_wait_up_to_the_ceiling() {
        let backoff = Backoff {
            first: Duration::from_secs(2),
            max: Duration::from_secs(60),
        };
        let waits: Vec<u64> = (1..=8).map(|n| backoff.after(n).as_secs()).collect();
        assert_eq!(waits, [2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(backoff.after(0), Duration::from_secs(2));
        assert_eq!(backoff.after(u32::MAX), Duration::from_secs(60));
    }
}
