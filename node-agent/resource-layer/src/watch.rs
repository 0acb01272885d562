//! Hang detection: every hardware call on a card runs under a guard; a watchdog thread raises a
//! CALL_HANG fault on the card when a call has been running longer than the threshold, and the
//! fault clears when the last such call returns. The caller itself is not blocked forever: the
//! gRPC layer answers DEADLINE_EXCEEDED at the caller's deadline (see `server`).

use crate::faults;
use crate::health::HealthHub;
use crate::util::lock;
use runtimekit_proto::resource::v1alpha1::FaultKind;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// Watches hardware calls for hangs.
#[derive(Debug, Clone)]
pub struct CallWatch {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    threshold: Duration,
    hub: Arc<HealthHub>,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    next_id: u64,
    /// In-flight calls: id -> (card, UUID, start).
    calls: BTreeMap<u64, (u32, String, Instant)>,
    /// Cards with a CALL_HANG fault raised by this watch.
    hung: BTreeSet<u32>,
}

/// An in-flight call; dropping it ends the call.
#[derive(Debug)]
pub struct CallGuard {
    inner: Arc<Inner>,
    id: u64,
}

impl CallWatch {
    /// A watch that raises CALL_HANG on `hub` for calls longer than `threshold`, with its
    /// watchdog thread (which ends when the last clone of the watch is dropped).
    pub fn new(hub: Arc<HealthHub>, threshold: Duration) -> Self {
        let inner = Arc::new(Inner {
            threshold,
            hub,
            state: Mutex::new(State::default()),
        });
        let weak = Arc::downgrade(&inner);
        let tick = (threshold / 4).clamp(Duration::from_millis(5), Duration::from_secs(1));
        let spawned = std::thread::Builder::new()
            .name("rl-call-watch".into())
            .spawn(move || watchdog(&weak, tick));
        if let Err(error) = spawned {
            tracing::error!(%error, "cannot start the hang watchdog; hangs will not be reported");
        }
        Self { inner }
    }

    /// Starts a call on a card.
    pub fn enter(&self, device: u32, uuid: &str) -> CallGuard {
        let mut state = lock(&self.inner.state);
        state.next_id += 1;
        let id = state.next_id;
        state
            .calls
            .insert(id, (device, uuid.to_string(), Instant::now()));
        CallGuard {
            inner: self.inner.clone(),
            id,
        }
    }

    /// Runs a call on a card under a guard.
    pub fn call<T>(&self, device: u32, uuid: &str, f: impl FnOnce() -> T) -> T {
        let _guard = self.enter(device, uuid);
        f()
    }
}

impl Inner {
    /// Raises CALL_HANG for cards with a call older than the threshold.
    fn check(&self) {
        let now = Instant::now();
        let mut raise = Vec::new();
        {
            let mut state = lock(&self.state);
            let mut seen = BTreeSet::new();
            let overdue: Vec<(u32, String, Duration)> = state
                .calls
                .values()
                .filter(|(_, _, start)| now.duration_since(*start) >= self.threshold)
                .map(|(d, u, start)| (*d, u.clone(), now.duration_since(*start)))
                .collect();
            for (device, uuid, waited) in overdue {
                if seen.insert(device) && state.hung.insert(device) {
                    raise.push((device, uuid, waited));
                }
            }
        }
        for (device, uuid, waited) in raise {
            let waited_ms = u64::try_from(waited.as_millis()).unwrap_or(u64::MAX);
            self.hub.raise(device, &uuid, faults::call_hang(waited_ms));
        }
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        let now = Instant::now();
        let clear = {
            let mut state = lock(&self.inner.state);
            let Some((device, _, _)) = state.calls.remove(&self.id) else {
                return;
            };
            let still_overdue = state.calls.values().any(|(d, _, start)| {
                *d == device && now.duration_since(*start) >= self.inner.threshold
            });
            (!still_overdue && state.hung.remove(&device)).then_some(device)
        };
        if let Some(device) = clear {
            self.inner
                .hub
                .clear(device, Some(FaultKind::CallHang), None);
        }
    }
}

fn watchdog(weak: &Weak<Inner>, tick: Duration) {
    loop {
        std::thread::sleep(tick);
        let Some(inner) = weak.upgrade() else {
            return;
        };
        inner.check();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::Clock;

    #[test]
    fn a_long_call_raises_and_its_return_clears() {
        let hub = Arc::new(HealthHub::new(Clock::System));
        let watch = CallWatch::new(hub.clone(), Duration::from_millis(40));
        let (_, mut rx) = hub.subscribe();
        // A short call raises nothing.
        watch.call(1, "GPU-1", || ());
        let guard = watch.enter(3, "GPU-3");
        let deadline = Instant::now() + Duration::from_secs(5);
        while !hub.is_active(3, FaultKind::CallHang, 0) {
            assert!(Instant::now() < deadline, "hang was not detected");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(!hub.healthy(3));
        assert!(hub.healthy(1));
        drop(guard);
        assert!(!hub.is_active(3, FaultKind::CallHang, 0));
        let raised = rx.try_recv().expect("raised");
        assert!(raised.active);
        assert_eq!(raised.device_index, 3);
        let cleared = rx.try_recv().expect("cleared");
        assert!(!cleared.active);
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn the_fault_stays_while_another_call_still_hangs() {
        let hub = Arc::new(HealthHub::new(Clock::System));
        let watch = CallWatch::new(hub.clone(), Duration::from_millis(20));
        let first = watch.enter(0, "GPU-0");
        let second = watch.enter(0, "GPU-0");
        let deadline = Instant::now() + Duration::from_secs(5);
        while !hub.is_active(0, FaultKind::CallHang, 0) {
            assert!(Instant::now() < deadline, "hang was not detected");
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(first);
        assert!(hub.is_active(0, FaultKind::CallHang, 0));
        drop(second);
        assert!(!hub.is_active(0, FaultKind::CallHang, 0));
    }
}
