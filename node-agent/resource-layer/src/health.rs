//! The active faults of every card and the stream of their changes.
//!
//! Backends raise and clear faults here; the hub emits an event only on a change (raising a
//! fault that is active, or clearing one that is not, emits nothing). A subscriber gets the
//! active faults and a receiver in one step, so it neither misses nor doubles an event.

use crate::faults::NewFault;
use crate::util::{Clock, lock};
use runtimekit_proto::resource::v1alpha1::{
    DeviceFault, Fault, FaultKind, HealthEvent, HealthSnapshot, Severity,
};
use std::collections::BTreeMap;
use std::sync::Mutex;
use tokio::sync::broadcast;

/// Events a slow subscriber may fall behind before its stream is ended.
const CHANNEL_CAPACITY: usize = 1024;

/// One fault of one card: card, kind, XID code (0 for other kinds), MIG GPU instance
/// (`u32::MAX` for the whole card).
type FaultId = (u32, i32, u32, u32);

/// Every fault of card `device`.
fn of_card(device: u32) -> std::ops::RangeInclusive<FaultId> {
    (device, i32::MIN, 0, 0)..=(device, i32::MAX, u32::MAX, u32::MAX)
}

/// The active faults and their change stream.
#[derive(Debug)]
pub struct HealthHub {
    clock: Clock,
    state: Mutex<HubState>,
    events: broadcast::Sender<HealthEvent>,
}

#[derive(Debug, Default)]
struct HubState {
    sequence: u64,
    active: BTreeMap<FaultId, DeviceFault>,
}

impl HubState {
    fn healthy(&self, device: u32) -> bool {
        !self.active.range(of_card(device)).any(|(_, f)| {
            f.fault
                .as_ref()
                .is_some_and(|f| f.severity() == Severity::Critical && f.gpu_instance_id.is_none())
        })
    }
}

impl HealthHub {
    /// A hub with no faults.
    pub fn new(clock: Clock) -> Self {
        let (events, _) = broadcast::channel(CHANNEL_CAPACITY);
        Self {
            clock,
            state: Mutex::new(HubState::default()),
            events,
        }
    }

    /// Raises a fault on a card; returns whether it is new (and an event was sent).
    pub fn raise(&self, device: u32, uuid: &str, fault: NewFault) -> bool {
        let id = (
            device,
            fault.kind as i32,
            fault.xid,
            fault.instance.map_or(u32::MAX, |(gi, _)| gi),
        );
        let mut state = lock(&self.state);
        if state.active.contains_key(&id) {
            return false;
        }
        let now = self.clock.now_ms();
        let fault = fault.at(now);
        state.active.insert(
            id,
            DeviceFault {
                device_index: device,
                device_uuid: uuid.to_string(),
                fault: Some(fault.clone()),
            },
        );
        self.emit(&mut state, device, uuid, true, fault, now);
        true
    }

    /// Raises a fault whose reason says the card's condition now (which links are down, which
    /// compute mode): an active fault of the same kind with another reason or severity is
    /// cleared first, so the fault shows the current one. Returns whether an event was sent.
    pub fn raise_current(&self, device: u32, uuid: &str, fault: NewFault) -> bool {
        let current = self.faults_of(device).iter().any(|f| {
            f.kind() == fault.kind && f.reason == fault.reason && f.severity() == fault.severity
        });
        if current {
            return false;
        }
        self.clear(device, Some(fault.kind), None);
        self.raise(device, uuid, fault)
    }

    /// Clears the faults of a card that match: every kind when `kind` is `None`, every XID
    /// code when `xid` is `None`. Returns how many were cleared.
    pub fn clear(&self, device: u32, kind: Option<FaultKind>, xid: Option<u32>) -> usize {
        let mut state = lock(&self.state);
        let ids: Vec<FaultId> = state
            .active
            .keys()
            .filter(|(d, k, x, _)| {
                *d == device
                    && kind.is_none_or(|kind| kind as i32 == *k)
                    && xid.is_none_or(|xid| xid == *x)
            })
            .copied()
            .collect();
        let now = self.clock.now_ms();
        for id in &ids {
            if let Some(DeviceFault {
                device_uuid,
                fault: Some(fault),
                ..
            }) = state.active.remove(id)
            {
                self.emit(&mut state, device, &device_uuid, false, fault, now);
            }
        }
        ids.len()
    }

    fn emit(
        &self,
        state: &mut HubState,
        device: u32,
        uuid: &str,
        active: bool,
        fault: Fault,
        now: u64,
    ) {
        state.sequence += 1;
        tracing::info!(
            device,
            active,
            kind = ?fault.kind(),
            reason = %fault.reason,
            "health event"
        );
        // Sending fails only when nobody listens, which is fine.
        let _ = self.events.send(HealthEvent {
            sequence: state.sequence,
            device_index: device,
            device_uuid: uuid.to_string(),
            active,
            fault: Some(fault),
            time_unix_ms: now,
            device_healthy: state.healthy(device),
        });
    }

    /// The active faults of a card.
    pub fn faults_of(&self, device: u32) -> Vec<Fault> {
        lock(&self.state)
            .active
            .range(of_card(device))
            .filter_map(|(_, f)| f.fault.clone())
            .collect()
    }

    /// Whether a card has no critical fault.
    pub fn healthy(&self, device: u32) -> bool {
        lock(&self.state).healthy(device)
    }

    /// Whether this fault is active.
    pub fn is_active(&self, device: u32, kind: FaultKind, xid: u32) -> bool {
        lock(&self.state)
            .active
            .range(of_card(device))
            .any(|((_, k, x, _), _)| *k == kind as i32 && *x == xid)
    }

    /// Every active fault now, with the sequence of the last event, and a receiver of the
    /// events that follow.
    pub fn subscribe(&self) -> (HealthSnapshot, broadcast::Receiver<HealthEvent>) {
        let state = lock(&self.state);
        let receiver = self.events.subscribe();
        let snapshot = HealthSnapshot {
            faults: state.active.values().cloned().collect(),
            sequence: state.sequence,
        };
        (snapshot, receiver)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::faults;

    #[test]
    fn a_current_fault_replaces_one_that_says_otherwise() {
        let hub = HealthHub::new(Clock::manual(1_000));
        assert!(hub.raise_current(1, "GPU-1", faults::nvlink_down(&[3])));
        assert!(
            !hub.raise_current(1, "GPU-1", faults::nvlink_down(&[3])),
            "unchanged"
        );
        assert!(hub.raise_current(1, "GPU-1", faults::nvlink_down(&[3, 7])));
        let faults = hub.faults_of(1);
        assert_eq!(faults.len(), 1);
        assert!(faults[0].reason.contains("3, 7"), "{}", faults[0].reason);
        // A severity change is a change too.
        assert!(hub.raise_current(1, "GPU-1", faults::compute_mode("Prohibited", true)));
        assert!(!hub.healthy(1));
        assert!(hub.raise_current(1, "GPU-1", faults::compute_mode("Prohibited", false)));
        assert_eq!(
            hub.faults_of(1).len(),
            2,
            "one NVLink, one compute-mode fault"
        );
    }

    #[test]
    fn raise_and_clear_emit_once_per_change() {
        let hub = HealthHub::new(Clock::manual(1_000));
        let (snapshot, mut rx) = hub.subscribe();
        assert!(snapshot.faults.is_empty());
        assert!(hub.raise(2, "GPU-2", faults::xid(79)));
        assert!(!hub.raise(2, "GPU-2", faults::xid(79)), "already active");
        assert!(!hub.healthy(2));
        assert!(hub.healthy(1));
        let event = rx.try_recv().expect("raise event");
        assert!(event.active);
        assert_eq!(event.sequence, 1);
        assert_eq!(event.device_uuid, "GPU-2");
        assert!(!event.device_healthy);
        assert!(rx.try_recv().is_err(), "the second raise sent nothing");

        assert_eq!(hub.clear(2, Some(FaultKind::Xid), Some(48)), 0);
        assert_eq!(hub.clear(2, Some(FaultKind::Xid), None), 1);
        let event = rx.try_recv().expect("clear event");
        assert!(!event.active);
        assert!(event.device_healthy);
        assert_eq!(event.sequence, 2);
        assert!(hub.healthy(2));
    }

    #[test]
    fn warnings_keep_the_card_healthy() {
        let hub = HealthHub::new(Clock::System);
        hub.raise(0, "GPU-0", faults::xid(13));
        assert!(hub.healthy(0));
        assert_eq!(hub.faults_of(0).len(), 1);
        hub.raise(0, "GPU-0", faults::ecc_dbe(1));
        assert!(!hub.healthy(0));
        assert_eq!(hub.clear(0, None, None), 2);
        assert!(hub.faults_of(0).is_empty());
    }

    #[test]
    fn snapshot_lists_active_faults_and_sequence() {
        let hub = HealthHub::new(Clock::System);
        hub.raise(0, "GPU-0", faults::gpu_lost());
        hub.raise(1, "GPU-1", faults::xid(48));
        hub.raise(1, "GPU-1", faults::xid(94));
        hub.clear(1, Some(FaultKind::Xid), Some(48));
        let (snapshot, _rx) = hub.subscribe();
        assert_eq!(snapshot.sequence, 4);
        let listed: Vec<(u32, u32)> = snapshot
            .faults
            .iter()
            .map(|f| (f.device_index, f.fault.as_ref().map_or(0, |f| f.xid)))
            .collect();
        assert_eq!(listed, [(0, 0), (1, 94)]);
        assert!(hub.is_active(1, FaultKind::Xid, 94));
        assert!(!hub.is_active(1, FaultKind::Xid, 48));
    }
}
