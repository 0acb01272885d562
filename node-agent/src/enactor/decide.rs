//! What to do with each GpuSlice of the node, decided without I/O from the slice and what the
//! resource layer reports; and which instances no slice claims any more.
//!
//! A slice on this node is its pod's placement (the scheduler writes a pod's slices with its
//! Binding, a gang member's too), and is enacted as soon as it is seen: Bound, then Creating
//! while the instance is made (or found, after a restart), then Ready. Before any hardware is
//! touched the status shows Bound, so the operator can tell a slice the agent never acted on. A
//! deleted slice is Releasing until its instance is destroyed; then the finalizer goes.

use crate::model::{NodeState, SliceInfo, mig_enabled};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use runtimekit_crds::{
    CONDITION_READY, GpuSliceStatus, MigInstanceRef, SliceMode, SlicePhase, set_condition,
};
use runtimekit_proto::resource::v1alpha1 as pb;
use runtimekit_resource_layer::Reason;
use std::collections::BTreeSet;

/// What to do with one slice.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Nothing now.
    Leave,
    /// Create (or find) the instance, showing Bound first when `bind_first`, then Creating,
    /// then Ready or Failed.
    Create {
        /// The status does not show Bound or Creating yet.
        bind_first: bool,
        /// The instance to create.
        spec: pb::InstanceSpec,
    },
    /// The slice is enacted: show Ready (with the MIG instance of `instance`).
    Ready {
        /// The status does not show Bound yet (a Whole slice seen for the first time).
        bind_first: bool,
        /// The slice's instance (TDM and MIG slices).
        instance: Option<pb::Instance>,
    },
    /// The slice cannot be enacted.
    Fail {
        /// Stable PascalCase reason.
        reason: &'static str,
        /// What is wrong.
        message: String,
    },
    /// The slice is deleted: show Releasing, destroy its instance (`destroy`), then remove the
    /// finalizer.
    Release {
        /// Whether there is an instance to destroy (TDM and MIG slices).
        destroy: bool,
    },
}

/// Decides what to do with `slice`, given whether it carries the finalizer and what the agent
/// knows of the node.
pub fn decide(slice: &SliceInfo, has_finalizer: bool, state: &NodeState) -> Decision {
    if slice.deleting {
        return if has_finalizer {
            Decision::Release {
                destroy: slice.partitions(),
            }
        } else {
            Decision::Leave
        };
    }
    let bind_first = matches!(slice.phase, None | Some(SlicePhase::Reserved));
    match slice.phase {
        Some(SlicePhase::Failed | SlicePhase::Releasing) => return Decision::Leave,
        None | Some(SlicePhase::Reserved | SlicePhase::Bound | SlicePhase::Creating) => {}
        Some(SlicePhase::Ready) => {}
    }
    let Some(inventory) = &state.inventory else {
        return Decision::Leave;
    };
    let Some(device) = inventory.devices.get(&slice.card) else {
        return Decision::Fail {
            reason: "NoSuchCard",
            message: format!(
                "card {} is not on this node ({} cards)",
                slice.card,
                inventory.devices.len()
            ),
        };
    };
    if !slice.card_uuid.is_empty() && device.uuid != slice.card_uuid {
        return Decision::Fail {
            reason: "CardUuidMismatch",
            message: format!(
                "card {} is {}, not {}",
                slice.card, device.uuid, slice.card_uuid
            ),
        };
    }
    if let Some(holders) = state.held_whole.get(&slice.card) {
        let foreign: Vec<&str> = holders
            .iter()
            .filter(|h| h.pod != format!("{}/{}", slice.pod_namespace, slice.pod_name))
            .map(|h| h.pod.as_str())
            .collect();
        if !foreign.is_empty() && slice.partitions() {
            return Decision::Fail {
                reason: "CardHeldWhole",
                message: format!(
                    "the kubelet gave card {} whole to {}",
                    slice.card,
                    foreign.join(", ")
                ),
            };
        }
    }
    // A Ready slice was first: the DRA plugin refuses its card, so a claim never displaces it.
    let claims = state.claims_holding(slice.card);
    if !claims.is_empty() && slice.phase != Some(SlicePhase::Ready) {
        return Decision::Fail {
            reason: "CardHeldByClaim",
            message: format!(
                "card {} is prepared for ResourceClaims ({}); a card serves one allocator at a time",
                slice.card,
                claims.join(", ")
            ),
        };
    }
    let key = slice.key();
    let instance = inventory.instances().find(|i| i.key == key).cloned();
    match slice.mode {
        SliceMode::Whole => {
            if mig_enabled(device) {
                return Decision::Fail {
                    reason: "MigModeEnabled",
                    message: format!(
                        "card {} is in MIG mode and serves only gpu-slice requests",
                        slice.card
                    ),
                };
            }
            let others: Vec<String> = state
                .slices_on(slice.card)
                .filter(|s| s.partitions() && !s.deleting)
                .map(SliceInfo::key)
                .chain(
                    device
                        .instances
                        .iter()
                        .map(|i| i.key.clone())
                        .filter(|k| !k.is_empty()),
                )
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            if !others.is_empty() {
                return Decision::Fail {
                    reason: "CardHoldsSlices",
                    message: format!(
                        "card {} cannot be given whole: it holds {}",
                        slice.card,
                        others.join(", ")
                    ),
                };
            }
            if slice.phase == Some(SlicePhase::Ready) {
                return Decision::Leave;
            }
            Decision::Ready {
                bind_first,
                instance: None,
            }
        }
        SliceMode::Tdm | SliceMode::Mig => {
            if slice.phase == Some(SlicePhase::Ready)
                && let Some(instance) = instance
            {
                return Decision::Ready {
                    bind_first: false,
                    instance: Some(instance),
                };
            }
            match instance_spec(slice, device) {
                Ok(spec) => Decision::Create { bind_first, spec },
                Err(message) => Decision::Fail {
                    reason: "InvalidSlice",
                    message,
                },
            }
        }
    }
}

/// The resource-layer instance that enacts a TDM or MIG slice.
pub fn instance_spec(slice: &SliceInfo, device: &pb::Device) -> Result<pb::InstanceSpec, String> {
    let kind = match slice.mode {
        SliceMode::Tdm => pb::instance_spec::Kind::Tdm(pb::TdmSpec {
            core_percent: slice.core.unwrap_or(0),
            memory_mib: slice.memory_mib.unwrap_or(0),
        }),
        SliceMode::Mig => {
            let (Some(profile), Some(start)) = (&slice.mig_profile, slice.mig_start) else {
                return Err("a MIG slice needs migProfile and migPlacementStart".into());
            };
            pb::instance_spec::Kind::Mig(pb::MigSpec {
                profile: profile.clone(),
                placement_start: start,
            })
        }
        SliceMode::Whole => return Err("a Whole slice has no instance".into()),
    };
    Ok(pb::InstanceSpec {
        device_index: slice.card,
        device_uuid: device.uuid.clone(),
        kind: Some(kind),
    })
}

/// The MIG instance reference of an instance, for the slice's status.
pub fn mig_ref(instance: &pb::Instance) -> Option<MigInstanceRef> {
    instance.mig.as_ref().map(|m| MigInstanceRef {
        gpu_instance_id: m.gpu_instance_id,
        compute_instance_id: m.compute_instance_id,
        device_uuid: m.device_uuid.clone(),
    })
}

/// Whether a resource-layer error reason is permanent for this slice (retrying cannot help).
/// A reason this version does not know is retried: the resource layer may be newer.
pub fn permanent(reason: &str) -> bool {
    reason.parse().is_ok_and(Reason::is_permanent)
}

/// An instance no slice claims.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Orphan {
    /// A keyed instance whose slice is gone.
    Key(String),
    /// An unkeyed MIG instance that no slice asks for.
    Mig {
        /// The card.
        card: u32,
        /// Its GPU-instance ID.
        gpu_instance_id: u32,
    },
}

/// The instances no slice of the node claims: keyed ones of the agent's own form
/// (`<namespace>/<name>`) whose slice is gone, and MIG instances without a key that no slice
/// without an instance would adopt (same card, profile and start). Only meaningful when the
/// slices are a complete listing.
pub fn orphans<'a>(
    instances: impl IntoIterator<Item = &'a pb::Instance>,
    slices: &[SliceInfo],
) -> Vec<Orphan> {
    let instances: Vec<&pb::Instance> = instances.into_iter().collect();
    let keys: BTreeSet<String> = slices.iter().map(SliceInfo::key).collect();
    let held: BTreeSet<&str> = instances.iter().map(|i| i.key.as_str()).collect();
    let mut claims: Vec<(u32, &str, u32)> = slices
        .iter()
        .filter(|s| s.mode == SliceMode::Mig && !s.deleting && !held.contains(s.key().as_str()))
        .filter_map(|s| Some((s.card, s.mig_profile.as_deref()?, s.mig_start?)))
        .collect();
    let mut orphans = Vec::new();
    for instance in instances {
        if !instance.key.is_empty() {
            if instance.key.contains('/') && !keys.contains(&instance.key) {
                orphans.push(Orphan::Key(instance.key.clone()));
            }
            continue;
        }
        let (Some(spec), Some(mig)) = (&instance.spec, &instance.mig) else {
            continue;
        };
        let Some(pb::instance_spec::Kind::Mig(m)) = &spec.kind else {
            continue;
        };
        let claim = (spec.device_index, m.profile.as_str(), m.placement_start);
        match claims.iter().position(|c| *c == claim) {
            Some(i) => {
                claims.remove(i);
            }
            None => orphans.push(Orphan::Mig {
                card: spec.device_index,
                gpu_instance_id: mig.gpu_instance_id,
            }),
        }
    }
    orphans
}

/// The reason the Ready condition gives for a phase that is not Failed.
fn phase_reason(phase: SlicePhase) -> &'static str {
    match phase {
        SlicePhase::Reserved => "Reserved",
        SlicePhase::Bound => "PodBound",
        SlicePhase::Creating => "Creating",
        SlicePhase::Ready => "Enacted",
        SlicePhase::Releasing => "Releasing",
        SlicePhase::Failed => "Failed",
    }
}

/// The status the agent writes for a slice, keeping the transition time of `previous`'s Ready
/// condition when its status does not change. `reason` overrides the condition's reason
/// (errors).
pub fn slice_status(
    previous: Option<&GpuSliceStatus>,
    phase: SlicePhase,
    message: String,
    mig_instance: Option<MigInstanceRef>,
    reason: Option<&str>,
    generation: Option<i64>,
    now: Time,
) -> GpuSliceStatus {
    let mut conditions = previous.map(|p| p.conditions.clone()).unwrap_or_default();
    conditions.retain(|c| c.type_ == CONDITION_READY);
    set_condition(
        &mut conditions,
        Condition {
            type_: CONDITION_READY.into(),
            status: if phase == SlicePhase::Ready {
                "True"
            } else {
                "False"
            }
            .into(),
            reason: reason.unwrap_or(phase_reason(phase)).into(),
            message: message.clone(),
            last_transition_time: now,
            observed_generation: generation,
        },
    );
    GpuSliceStatus {
        phase: Some(phase),
        mig_instance,
        message: Some(message),
        observed_generation: generation,
        conditions,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{at, four_cards, slice};
    use crate::model::WholeHolder;

    fn mig_slice(name: &str, start: u32, phase: Option<SlicePhase>) -> SliceInfo {
        let mut s = slice(name, 3, SliceMode::Mig, SlicePhase::Bound);
        s.mig_start = Some(start);
        s.phase = phase;
        s
    }

    #[test]
    fn a_slice_is_its_pods_placement_from_the_start() {
        // The scheduler writes a pod's slices with its Binding, a gang member's too: a slice
        // just written is enacted, and shows Bound first.
        let state = four_cards();
        match decide(&mig_slice("m", 0, None), true, &state) {
            Decision::Create { bind_first, spec } => {
                assert!(bind_first);
                assert_eq!(spec.device_index, 3);
                assert_eq!(spec.device_uuid, "GPU-3");
                assert_eq!(
                    spec.kind,
                    Some(pb::instance_spec::Kind::Mig(pb::MigSpec {
                        profile: "3g.40gb".into(),
                        placement_start: 0
                    }))
                );
            }
            other => panic!("{other:?}"),
        }
        // A slice an earlier operator marked Reserved is enacted the same way; one the
        // operator showed Bound already is not shown Bound again.
        let reserved = mig_slice("r", 0, Some(SlicePhase::Reserved));
        assert!(matches!(
            decide(&reserved, true, &state),
            Decision::Create {
                bind_first: true,
                ..
            }
        ));
        let bound = mig_slice("b", 0, Some(SlicePhase::Bound));
        assert!(matches!(
            decide(&bound, true, &state),
            Decision::Create {
                bind_first: false,
                ..
            }
        ));
    }

    #[test]
    fn ready_slices_with_their_instance_are_adopted_as_they_are() {
        // After a restart: the instance under the slice's key is still there (ns/a at 4).
        let state = four_cards();
        let ready = mig_slice("a", 4, Some(SlicePhase::Ready));
        match decide(&ready, true, &state) {
            Decision::Ready {
                bind_first: false,
                instance: Some(instance),
            } => {
                assert_eq!(instance.key, "ns/a");
                assert_eq!(mig_ref(&instance).map(|m| m.gpu_instance_id), Some(2));
            }
            other => panic!("{other:?}"),
        }
        // Ready, but the instance is gone (the resource layer lost its state): make it again.
        let lost = mig_slice("b", 0, Some(SlicePhase::Ready));
        assert!(matches!(
            decide(&lost, true, &state),
            Decision::Create {
                bind_first: false,
                ..
            }
        ));
        // A crash between Creating and Ready: create again, which finds the keyed instance.
        let creating = mig_slice("a", 4, Some(SlicePhase::Creating));
        assert!(matches!(
            decide(&creating, true, &state),
            Decision::Create {
                bind_first: false,
                ..
            }
        ));
    }

    #[test]
    fn deleted_slices_are_released_once() {
        let state = four_cards();
        let mut s = slice("t", 0, SliceMode::Tdm, SlicePhase::Ready);
        s.deleting = true;
        assert_eq!(
            decide(&s, true, &state),
            Decision::Release { destroy: true }
        );
        assert_eq!(decide(&s, false, &state), Decision::Leave);
        let mut w = slice("w", 1, SliceMode::Whole, SlicePhase::Ready);
        w.deleting = true;
        assert_eq!(
            decide(&w, true, &state),
            Decision::Release { destroy: false }
        );
    }

    #[test]
    fn whole_slices_need_a_card_without_slices() {
        let mut state = four_cards();
        let whole = slice("w", 1, SliceMode::Whole, SlicePhase::Bound);
        assert_eq!(
            decide(&whole, true, &state),
            Decision::Ready {
                bind_first: false,
                instance: None
            }
        );
        state.slices = vec![
            slice("t", 1, SliceMode::Tdm, SlicePhase::Ready),
            whole.clone(),
        ];
        match decide(&whole, true, &state) {
            Decision::Fail { reason, message } => {
                assert_eq!(reason, "CardHoldsSlices");
                assert!(message.contains("ns/t"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        let on_mig = slice("m", 3, SliceMode::Whole, SlicePhase::Bound);
        assert!(matches!(
            decide(&on_mig, true, &state),
            Decision::Fail {
                reason: "MigModeEnabled",
                ..
            }
        ));
    }

    #[test]
    fn wrong_cards_and_cards_held_whole_fail() {
        let mut state = four_cards();
        let mut s = slice("t", 0, SliceMode::Tdm, SlicePhase::Bound);
        s.card_uuid = "GPU-other".into();
        assert!(matches!(
            decide(&s, true, &state),
            Decision::Fail {
                reason: "CardUuidMismatch",
                ..
            }
        ));
        s.card = 9;
        assert!(matches!(
            decide(&s, true, &state),
            Decision::Fail {
                reason: "NoSuchCard",
                ..
            }
        ));
        let t = slice("t", 0, SliceMode::Tdm, SlicePhase::Bound);
        state.held_whole.insert(
            0,
            vec![WholeHolder {
                resource: "nvidia.com/gpu".into(),
                pod: "other/p".into(),
            }],
        );
        assert!(matches!(
            decide(&t, true, &state),
            Decision::Fail {
                reason: "CardHeldWhole",
                ..
            }
        ));
        assert!(!permanent("CallHang") && permanent("IllegalPlacement"));
    }

    #[test]
    fn a_card_prepared_for_a_claim_takes_no_slice() {
        let mut state = four_cards();
        let prepared = |mode| crate::model::PreparedDevice {
            claim: "team/train".into(),
            claim_uid: "u1".into(),
            request: "gpu".into(),
            device: "gpu-1".into(),
            card: Some(1),
            mode,
            instance_key: None,
            core: None,
            memory_mib: None,
            pods: Vec::new(),
        };
        // Given for monitoring only, the card stays the kit's.
        state.prepared.push(prepared(None));
        let bound = slice("t", 1, SliceMode::Tdm, SlicePhase::Bound);
        assert!(!matches!(
            decide(&bound, true, &state),
            Decision::Fail { .. }
        ));
        state.prepared.push(prepared(Some(SliceMode::Whole)));
        match decide(&bound, true, &state) {
            Decision::Fail { reason, message } => {
                assert_eq!(reason, "CardHeldByClaim");
                assert!(message.contains("team/train"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        // A slice Ready before the claim came is left running.
        let ready = slice("t", 1, SliceMode::Tdm, SlicePhase::Ready);
        assert!(!matches!(
            decide(&ready, true, &state),
            Decision::Fail { .. }
        ));
        let device = &state.inventory.as_ref().expect("inventory").devices[&1];
        assert!(
            state
                .whole_card_blockers(device)
                .iter()
                .any(|b| b.contains("ResourceClaims (team/train)"))
        );
    }

    #[test]
    fn orphans_are_instances_no_slice_claims() {
        let state = four_cards();
        let inventory = state.inventory.as_ref().expect("inventory");
        // ns/a exists at 3g@4 and an unkeyed 1g.10gb at 0 exists.
        let none: Vec<SliceInfo> = Vec::new();
        assert_eq!(
            orphans(inventory.instances(), &none),
            [
                Orphan::Key("ns/a".into()),
                Orphan::Mig {
                    card: 3,
                    gpu_instance_id: 9
                }
            ]
        );
        // A slice asking for 1g.10gb at 0 on card 3 adopts the unkeyed one; ns/a is claimed.
        let mut adopter = mig_slice("c", 0, Some(SlicePhase::Bound));
        adopter.mig_profile = Some("1g.10gb".into());
        let claimed = vec![mig_slice("a", 4, Some(SlicePhase::Ready)), adopter.clone()];
        assert!(orphans(inventory.instances(), &claimed).is_empty());
        // A deleted slice keeps its keyed instance (it is released through the slice), but
        // does not claim an unkeyed one.
        let mut deleted = adopter;
        deleted.deleting = true;
        let slices = vec![mig_slice("a", 4, Some(SlicePhase::Ready)), deleted];
        assert_eq!(
            orphans(inventory.instances(), &slices),
            [Orphan::Mig {
                card: 3,
                gpu_instance_id: 9
            }]
        );
    }

    #[test]
    fn status_keeps_transition_times_and_reports_errors() {
        let bound = slice_status(
            None,
            SlicePhase::Bound,
            "pod bound".into(),
            None,
            None,
            Some(1),
            at(10),
        );
        let creating = slice_status(
            Some(&bound),
            SlicePhase::Creating,
            "creating".into(),
            None,
            None,
            Some(1),
            at(20),
        );
        assert_eq!(creating.conditions[0].status, "False");
        assert_eq!(creating.conditions[0].reason, "Creating");
        assert_eq!(creating.conditions[0].last_transition_time, at(10));
        let ready = slice_status(
            Some(&creating),
            SlicePhase::Ready,
            "ready".into(),
            None,
            None,
            Some(1),
            at(30),
        );
        assert_eq!(ready.conditions[0].status, "True");
        assert_eq!(ready.conditions[0].last_transition_time, at(30));
        let again = slice_status(
            Some(&ready),
            SlicePhase::Ready,
            "ready".into(),
            None,
            None,
            Some(1),
            at(40),
        );
        assert_eq!(again, ready, "an unchanged status is the same status");
        let failed = slice_status(
            Some(&ready),
            SlicePhase::Failed,
            "bad start".into(),
            None,
            Some("IllegalPlacement"),
            Some(1),
            at(50),
        );
        assert_eq!(failed.conditions[0].reason, "IllegalPlacement");
    }
}
