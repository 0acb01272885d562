//! Card health from the resource layer's WatchHealth stream: the faults active on each card, and
//! the moments a card turns unhealthy or healthy again.

use runtimekit_proto::resource::v1alpha1 as pb;
use std::collections::{BTreeMap, BTreeSet};

/// The faults active on each card, as the health stream reported them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FaultState {
    cards: BTreeMap<u32, Vec<pb::Fault>>,
    uuids: BTreeMap<u32, String>,
}

/// A card turning unhealthy or healthy again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition {
    /// The card's index.
    pub card: u32,
    /// The card's UUID.
    pub uuid: String,
    /// Whether the card is healthy now.
    pub healthy: bool,
    /// The critical faults that made it unhealthy (when it turned unhealthy), or the ones that
    /// cleared (when it turned healthy).
    pub reason: String,
}

fn same_fault(a: &pb::Fault, b: &pb::Fault) -> bool {
    a.kind == b.kind && a.xid == b.xid && a.gpu_instance_id == b.gpu_instance_id
}

/// A fault that makes the card unhealthy: critical, and about the card rather than one of its
/// MIG instances.
fn critical(fault: &pb::Fault) -> bool {
    fault.severity() == pb::Severity::Critical && fault.gpu_instance_id.is_none()
}

impl FaultState {
    /// The state a stream's first message describes.
    pub fn from_snapshot(snapshot: &pb::HealthSnapshot) -> FaultState {
        let mut state = FaultState::default();
        for device_fault in &snapshot.faults {
            if let Some(fault) = &device_fault.fault {
                state.raise(device_fault.device_index, &device_fault.device_uuid, fault);
            }
        }
        state
    }

    fn raise(&mut self, card: u32, uuid: &str, fault: &pb::Fault) {
        self.uuids.insert(card, uuid.to_owned());
        let faults = self.cards.entry(card).or_default();
        match faults.iter_mut().find(|f| same_fault(f, fault)) {
            Some(existing) => *existing = fault.clone(),
            None => faults.push(fault.clone()),
        }
    }

    /// Takes in one event of the stream.
    pub fn apply(&mut self, event: &pb::HealthEvent) {
        let Some(fault) = &event.fault else {
            return;
        };
        if event.active {
            self.raise(event.device_index, &event.device_uuid, fault);
        } else if let Some(faults) = self.cards.get_mut(&event.device_index) {
            faults.retain(|f| !same_fault(f, fault));
            if faults.is_empty() {
                self.cards.remove(&event.device_index);
            }
        }
    }

    /// The faults active on a card.
    pub fn faults(&self, card: u32) -> &[pb::Fault] {
        self.cards.get(&card).map_or(&[], Vec::as_slice)
    }

    /// Whether no critical fault is active on a card.
    pub fn healthy(&self, card: u32) -> bool {
        !self.faults(card).iter().any(critical)
    }

    /// Whether a hardware call on the card is hanging (its calls would hang too).
    pub fn hanging(&self, card: u32) -> bool {
        self.faults(card)
            .iter()
            .any(|f| f.kind() == pb::FaultKind::CallHang)
    }

    /// The reasons of the critical faults of a card, joined; `None` when it is healthy.
    pub fn reason(&self, card: u32) -> Option<String> {
        let reasons: Vec<&str> = self
            .faults(card)
            .iter()
            .filter(|f| critical(f))
            .map(|f| f.reason.as_str())
            .collect();
        (!reasons.is_empty()).then(|| reasons.join("; "))
    }

    /// The cards that turned unhealthy or healthy between `before` and `self`.
    pub fn transitions_from(&self, before: &FaultState) -> Vec<Transition> {
        let cards: BTreeSet<u32> = before
            .cards
            .keys()
            .chain(self.cards.keys())
            .copied()
            .collect();
        cards
            .into_iter()
            .filter_map(|card| {
                let (was, is) = (before.healthy(card), self.healthy(card));
                if was == is {
                    return None;
                }
                let reason = if is {
                    before.reason(card)
                } else {
                    self.reason(card)
                }
                .unwrap_or_default();
                let uuid = self
                    .uuids
                    .get(&card)
                    .or_else(|| before.uuids.get(&card))
                    .cloned()
                    .unwrap_or_default();
                Some(Transition {
                    card,
                    uuid,
                    healthy: is,
                    reason,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::fault;

    fn event(card: u32, active: bool, fault: pb::Fault) -> pb::HealthEvent {
        pb::HealthEvent {
            device_index: card,
            device_uuid: format!("GPU-{card}"),
            active,
            fault: Some(fault),
            ..Default::default()
        }
    }

    #[test]
    fn a_mig_instance_fault_leaves_the_card_healthy() {
        let mut in_instance = fault(pb::FaultKind::Xid, 94, pb::Severity::Critical);
        in_instance.gpu_instance_id = Some(2);
        let mut state = FaultState::default();
        state.apply(&event(0, true, in_instance.clone()));
        assert!(state.healthy(0));
        assert_eq!(state.faults(0).len(), 1, "it is listed");
        // The same XID on the whole card is another fault, and a critical one.
        state.apply(&event(
            0,
            true,
            fault(pb::FaultKind::Xid, 94, pb::Severity::Critical),
        ));
        assert!(!state.healthy(0));
        assert_eq!(state.faults(0).len(), 2);
        state.apply(&event(0, false, in_instance));
        assert_eq!(state.faults(0).len(), 1, "clearing one leaves the other");
    }

    #[test]
    fn critical_faults_make_a_card_unhealthy_until_they_clear() {
        let xid79 = fault(pb::FaultKind::Xid, 79, pb::Severity::Critical);
        let xid13 = fault(pb::FaultKind::Xid, 13, pb::Severity::Warning);
        let hang = fault(pb::FaultKind::CallHang, 0, pb::Severity::Critical);
        let start = FaultState::from_snapshot(&pb::HealthSnapshot {
            faults: vec![pb::DeviceFault {
                device_index: 2,
                device_uuid: "GPU-2".into(),
                fault: Some(xid13.clone()),
            }],
            sequence: 7,
        });
        assert!(start.healthy(2), "an application XID is only a warning");
        assert_eq!(start.reason(2), None);

        let mut state = start.clone();
        state.apply(&event(2, true, xid79.clone()));
        state.apply(&event(3, true, hang.clone()));
        assert!(!state.healthy(2) && !state.healthy(3));
        assert!(state.hanging(3) && !state.hanging(2));
        assert_eq!(state.reason(2).as_deref(), Some("XID 79"));
        let turned = state.transitions_from(&start);
        assert_eq!(
            turned
                .iter()
                .map(|t| (t.card, t.healthy))
                .collect::<Vec<_>>(),
            [(2, false), (3, false)]
        );

        let before = state.clone();
        state.apply(&event(2, true, xid79.clone()));
        assert!(state.transitions_from(&before).is_empty(), "a repeat");
        state.apply(&event(2, false, xid79));
        state.apply(&event(3, false, hang));
        let turned = state.transitions_from(&before);
        assert_eq!(
            turned,
            vec![
                Transition {
                    card: 2,
                    uuid: "GPU-2".into(),
                    healthy: true,
                    reason: "XID 79".into()
                },
                Transition {
                    card: 3,
                    uuid: "GPU-3".into(),
                    healthy: true,
                    reason: "CallHang".into()
                }
            ]
        );
        assert_eq!(state.faults(2), &[xid13][..], "the warning stays");
        assert!(state.faults(3).is_empty());
    }
}
