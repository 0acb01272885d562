//! Simulated readings: smooth, time-varying and deterministic given the seed, the card, its
//! instances and the time. Every instance runs one simulated workload process whose compute
//! and memory follow slow sine waves within the instance's caps; the card's utilisation is the
//! sum of its instances' (plus a little idle noise), and power, temperature, clocks and PCIe
//! traffic follow utilisation. Counters (energy, NVLink bytes) integrate the waves.
//! `readings` turns them into the metrics the backend answers with.

use super::profile::CardSpec;
use crate::util::{splitmix, stable_hash};
use std::f64::consts::TAU;

/// A slow sine wave: `base + amp sin(2 pi t / period + phase)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Wave {
    pub base: f64,
    pub amp: f64,
    pub period_s: f64,
    pub phase: f64,
}

impl Wave {
    /// A wave drawn from a seed: base in `[lo, hi]`, amplitude `amp_frac` of the base, period
    /// 2-10 minutes.
    pub fn from_seed(seed: u64, lo: f64, hi: f64, amp_frac: f64) -> Self {
        let u = |n: u64| (splitmix(seed ^ n) >> 11) as f64 / (1u64 << 53) as f64;
        let base = lo + (hi - lo) * u(1);
        Self {
            base,
            amp: base * amp_frac,
            period_s: 120.0 + 480.0 * u(2),
            phase: TAU * u(3),
        }
    }

    /// The value at `t_s` seconds.
    pub fn at(&self, t_s: f64) -> f64 {
        self.base + self.amp * (TAU * t_s / self.period_s + self.phase).sin()
    }

    /// The exact integral over `[t0, t1]` seconds.
    pub fn integral(&self, t0: f64, t1: f64) -> f64 {
        let w = TAU / self.period_s;
        self.base * (t1 - t0)
            - self.amp / w * ((w * t1 + self.phase).cos() - (w * t0 + self.phase).cos())
    }
}

/// Noise in `[-1, 1]`, constant over one second.
pub fn noise(seed: u64, t_ms: u64) -> f64 {
    let h = splitmix(seed ^ (t_ms / 1000).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    (h >> 11) as f64 / (1u64 << 52) as f64 - 1.0
}

/// One simulated workload: the process of one instance.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    pub pid: u32,
    pub key: Option<String>,
    pub gpu_instance_id: Option<u32>,
    /// Busy percent of what the instance may use.
    pub busy: Wave,
    /// Fraction of the memory limit held.
    pub memory: Wave,
    /// Memory the workload may hold, MiB.
    pub memory_limit_mib: u64,
    /// Fraction of the card's compute the instance may use.
    pub card_share: f64,
    seed: u64,
}

impl Workload {
    /// The workload of an instance.
    pub fn new(
        seed: u64,
        identity: &str,
        key: Option<String>,
        gpu_instance_id: Option<u32>,
        memory_limit_mib: u64,
        card_share: f64,
    ) -> Self {
        let seed = stable_hash(&[&seed.to_le_bytes(), identity.as_bytes()]);
        Self {
            pid: 10_000 + u32::try_from(seed % 3_000_000).unwrap_or(0),
            key,
            gpu_instance_id,
            busy: Wave::from_seed(seed, 45.0, 85.0, 0.3),
            memory: Wave::from_seed(seed ^ 0xabcd, 0.4, 0.75, 0.25),
            memory_limit_mib,
            card_share,
            seed,
        }
    }

    /// Busy percent of the instance's share at `t_ms`, 0-100.
    pub fn busy_percent(&self, t_ms: u64) -> f64 {
        (self.busy.at(t_ms as f64 / 1000.0) + 3.0 * noise(self.seed, t_ms)).clamp(0.0, 100.0)
    }

    /// Memory held at `t_ms`, MiB.
    pub fn memory_mib(&self, t_ms: u64) -> u64 {
        let f = (self.memory.at(t_ms as f64 / 1000.0) + 0.02 * noise(self.seed ^ 1, t_ms))
            .clamp(0.05, 0.98);
        (self.memory_limit_mib as f64 * f) as u64
    }

    /// Percent of the whole card's SM time at `t_ms`.
    pub fn card_percent(&self, t_ms: u64) -> f64 {
        self.busy_percent(t_ms) * self.card_share
    }
}

/// The idle activity of a card (driver, monitoring): 0.5-2 percent.
fn idle_wave(card_seed: u64) -> Wave {
    Wave::from_seed(card_seed ^ 0x1d1e, 0.5, 2.0, 0.5)
}

/// Card utilisation percent at `t_ms`, 0-100.
pub fn card_util(card_seed: u64, workloads: &[Workload], t_ms: u64) -> f64 {
    let t = t_ms as f64 / 1000.0;
    let busy: f64 = workloads.iter().map(|w| w.card_percent(t_ms)).sum();
    (busy + idle_wave(card_seed).at(t) + 0.3 * noise(card_seed, t_ms)).clamp(0.0, 100.0)
}

/// The integral of card utilisation (percent-seconds) over `[t0_ms, t1_ms]`, without noise.
pub fn card_util_integral(card_seed: u64, workloads: &[Workload], t0_ms: u64, t1_ms: u64) -> f64 {
    let (t0, t1) = (t0_ms as f64 / 1000.0, t1_ms as f64 / 1000.0);
    let busy: f64 = workloads
        .iter()
        .map(|w| w.busy.integral(t0, t1) * w.card_share)
        .sum();
    (busy + idle_wave(card_seed).integral(t0, t1)).max(0.0)
}

/// Counters that integrate over time; advanced on every read and before every change of the
/// card's instances, so they never decrease.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Counters {
    pub last_ms: u64,
    pub elapsed_s: f64,
    pub util_integral: f64,
}

impl Counters {
    /// Starts the counters at boot.
    pub fn at(boot_ms: u64) -> Self {
        Self {
            last_ms: boot_ms,
            ..Self::default()
        }
    }

    /// Integrates up to `t_ms` with the workloads that ran since the last call.
    pub fn advance(&mut self, card_seed: u64, workloads: &[Workload], t_ms: u64) {
        if t_ms <= self.last_ms {
            return;
        }
        self.util_integral += card_util_integral(card_seed, workloads, self.last_ms, t_ms);
        self.elapsed_s += (t_ms - self.last_ms) as f64 / 1000.0;
        self.last_ms = t_ms;
    }

    /// Energy since boot, mJ.
    pub fn energy_mj(&self, card: &CardSpec) -> u64 {
        let m = &card.model;
        let joules = m.idle_power_w * self.elapsed_s
            + (m.max_power_w - m.idle_power_w) * self.util_integral / 100.0;
        (joules * 1000.0) as u64
    }

    /// Peer-link data bytes sent since boot (received is the same scaled by 0.9).
    pub fn link_bytes(&self, card: &CardSpec) -> u64 {
        let per_s = card.model.link_gb_per_s * 1e9 * f64::from(card.link_count());
        // Collective traffic uses about a third of the links' capacity when the card is busy.
        (per_s * 0.33 * self.util_integral / 100.0) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wave_integral_matches_numeric_sum() {
        let w = Wave::from_seed(7, 40.0, 80.0, 0.3);
        let exact = w.integral(100.0, 400.0);
        let steps = 30_000;
        let dt = 300.0 / f64::from(steps);
        let numeric: f64 = (0..steps)
            .map(|i| w.at(100.0 + (f64::from(i) + 0.5) * dt) * dt)
            .sum();
        assert!(
            (exact - numeric).abs() < 1e-3 * numeric,
            "{exact} vs {numeric}"
        );
    }

    #[test]
    fn waves_stay_in_range_and_vary() {
        let w = Workload::new(1, "GPU-0/a", Some("a".into()), None, 10_240, 0.5);
        let mut seen = Vec::new();
        for t in (0..1_200_000u64).step_by(10_000) {
            let busy = w.busy_percent(t);
            assert!((0.0..=100.0).contains(&busy));
            let mem = w.memory_mib(t);
            assert!(mem <= 10_240 * 98 / 100 + 1, "{mem}");
            assert!(w.card_percent(t) <= 50.0);
            seen.push(mem);
        }
        seen.sort_unstable();
        seen.dedup();
        assert!(seen.len() > 20, "memory varies over time");
    }

    #[test]
    fn noise_is_deterministic_and_bounded() {
        for t in (0..100_000).step_by(333) {
            let n = noise(42, t);
            assert!((-1.0..=1.0).contains(&n));
            assert_eq!(n, noise(42, t));
        }
        assert_ne!(noise(42, 5_000), noise(43, 5_000));
    }

    #[test]
    fn counters_never_decrease() {
        let w = vec![Workload::new(1, "x", None, None, 1_000, 1.0)];
        let mut c = Counters::at(0);
        let mut last = 0.0;
        for t in (0..600_000).step_by(7_000) {
            c.advance(9, &w, t);
            assert!(c.util_integral >= last);
            last = c.util_integral;
        }
        let before = c.clone();
        c.advance(9, &w, 1_000);
        assert_eq!(c, before, "time going back changes nothing");
    }
}
