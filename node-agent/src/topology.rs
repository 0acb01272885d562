//! The node's TopologyGroup status, computed from what the agent knows (no I/O): cards with
//! their topology, MIG state and health, RDMA NICs, and capacity.

use crate::model::{NodeState, PreparedDevice, mig_enabled, numa_node};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use runtimekit_contract::dra::CLAIM_HOLDER;
use runtimekit_crds::{
    CONDITION_READY, CONDITION_RUNTIME_READY, CardHealth, CardStatus, MigInstanceStatus, NicStatus,
    TopologyCapacity, TopologyGroupStatus, Vendor, set_condition,
};
use runtimekit_proto::resource::v1alpha1 as pb;
use std::collections::BTreeSet;
use std::time::Duration;

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_owned())
}

/// The CRD's vendor for the resource layer's; a card of unknown vendor is reported as NVIDIA
/// only if the resource layer says nothing, which it does only for lost cards it never saw.
pub fn vendor(vendor: pb::Vendor) -> Vendor {
    match vendor {
        pb::Vendor::Ppu => Vendor::Ppu,
        pb::Vendor::Amd => Vendor::Amd,
        pb::Vendor::Nvidia | pb::Vendor::Unspecified => Vendor::Nvidia,
    }
}

/// The cards a card reaches over NVLink, once per link, from the pairwise paths.
pub fn nvlink_peers(card: u32, paths: &[pb::DevicePath]) -> Vec<u32> {
    let mut peers = Vec::new();
    for path in paths {
        if path.link_kind() != pb::LinkKind::Nvlink || path.links == 0 {
            continue;
        }
        let peer = if path.a == card {
            path.b
        } else if path.b == card {
            path.a
        } else {
            continue;
        };
        peers.extend(std::iter::repeat_n(peer, path.links as usize));
    }
    peers.sort_unstable();
    peers
}

/// The MIG instances on a card.
pub fn mig_instances(device: &pb::Device) -> Vec<MigInstanceStatus> {
    let mut instances: Vec<MigInstanceStatus> = device
        .instances
        .iter()
        .filter(|i| i.kind() == pb::InstanceKind::Mig)
        .filter_map(|i| {
            let spec = match i.spec.as_ref()?.kind.as_ref()? {
                pb::instance_spec::Kind::Mig(m) => m,
                pb::instance_spec::Kind::Tdm(_) => return None,
            };
            let mig = i.mig.as_ref()?;
            Some(MigInstanceStatus {
                profile: spec.profile.clone(),
                placement_start: spec.placement_start,
                gpu_instance_id: mig.gpu_instance_id,
                device_uuid: non_empty(&mig.device_uuid),
            })
        })
        .collect();
    instances.sort_by_key(|i| (i.placement_start, i.gpu_instance_id));
    instances
}

/// One card's status.
pub fn card_status(state: &NodeState, device: &pb::Device, paths: &[pb::DevicePath]) -> CardStatus {
    let healthy = state.healthy(device);
    let topology = device.topology.clone().unwrap_or_default();
    let health_reason = (!healthy).then(|| {
        state.faults.reason(device.index).unwrap_or_else(|| {
            if device.state() == pb::DeviceState::Lost {
                "the card is lost (fallen off the bus or inaccessible)".into()
            } else if device.state() == pb::DeviceState::Partial {
                "the resource layer could not read the card".into()
            } else {
                "reported unhealthy by the resource layer".into()
            }
        })
    });
    CardStatus {
        index: device.index,
        uuid: device.uuid.clone(),
        vendor: vendor(device.vendor()),
        model: device.model.clone(),
        memory_mib: device.memory_mib,
        mig_capable: device.mig.as_ref().is_some_and(|m| m.capable),
        mig_enabled: mig_enabled(device),
        health: if healthy {
            CardHealth::Healthy
        } else {
            CardHealth::Unhealthy
        },
        health_reason,
        pcie_switch: non_empty(&topology.pcie_switch),
        numa_node: numa_node(device),
        socket: topology.socket,
        interconnect_group: non_empty(&topology.interconnect_group),
        nvlink_peers: nvlink_peers(device.index, paths),
        mig_instances: mig_instances(device),
        held_by: held_outside(state, device.index),
    }
}

/// What holds card `index` outside the kit's ledger, so the runtimekit scheduler never picks
/// it: pods of another scheduler the kubelet gave it whole (no GpuSlice places them there), and
/// ResourceClaims prepared on it (`resourceclaim/<namespace>/<name>`).
pub fn held_outside(state: &NodeState, index: u32) -> Vec<String> {
    let claims = state
        .claims_holding(index)
        .into_iter()
        .map(|claim| format!("{CLAIM_HOLDER}{claim}"));
    let Some(holders) = state.held_whole.get(&index) else {
        return claims.collect();
    };
    let mut pods: Vec<String> = holders
        .iter()
        .filter(|h| {
            !state
                .slices
                .iter()
                .any(|s| s.card == index && format!("{}/{}", s.pod_namespace, s.pod_name) == h.pod)
        })
        .map(|h| h.pod.clone())
        .collect();
    pods.sort();
    pods.dedup();
    pods.extend(claims);
    pods
}

/// One NIC's status.
pub fn nic_status(nic: &pb::Nic) -> NicStatus {
    NicStatus {
        name: nic.name.clone(),
        pcie_switch: non_empty(&nic.pcie_switch),
        numa_node: nic.numa_node,
        socket: nic.socket,
    }
}

/// The cards that are not free: something is enacted on them (an instance exists, or a slice is
/// being created, ready or released), the kubelet gave them whole to a pod, or a claim holds them.
pub fn busy_cards(state: &NodeState) -> BTreeSet<u32> {
    let mut busy: BTreeSet<u32> = state
        .slices
        .iter()
        .filter(|s| s.enacted())
        .map(|s| s.card)
        .collect();
    if let Some(inventory) = &state.inventory {
        busy.extend(
            inventory
                .devices
                .values()
                .filter(|d| !d.instances.is_empty())
                .map(|d| d.index),
        );
    }
    busy.extend(state.held_whole.keys().copied());
    busy.extend(state.prepared.iter().filter_map(PreparedDevice::holds_card));
    busy
}

/// The capacity of a node's cards.
pub fn capacity(cards: &[CardStatus], busy: &BTreeSet<u32>) -> TopologyCapacity {
    let healthy = || cards.iter().filter(|c| c.health == CardHealth::Healthy);
    let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    TopologyCapacity {
        nodes: 1,
        cards: count(cards.len()),
        healthy_cards: count(healthy().count()),
        free_cards: count(healthy().filter(|c| !busy.contains(&c.index)).count()),
        mig_cards: count(healthy().filter(|c| c.mig_enabled).count()),
    }
}

/// The Ready condition: whether the agent has the resource layer's answer.
pub fn ready_condition(state: &NodeState, now: Time) -> Condition {
    let (status, reason, message) = match &state.inventory {
        Some(inventory) => (
            "True",
            "Reporting",
            format!(
                "the node agent reports {} cards and {} RDMA NICs",
                inventory.devices.len(),
                inventory.nics.len()
            ),
        ),
        None => (
            "False",
            "ResourceLayerUnavailable",
            "the node agent has no answer from the resource layer yet".to_owned(),
        ),
    };
    Condition {
        type_: CONDITION_READY.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        last_transition_time: now,
        observed_generation: None,
    }
}

/// The RuntimeReady condition: what the node installer last said, while the agent runs with one.
pub fn runtime_condition(state: &NodeState, now: Time) -> Option<Condition> {
    let install = state.install.as_ref()?;
    Some(Condition {
        type_: CONDITION_RUNTIME_READY.into(),
        status: if install.ready { "True" } else { "False" }.into(),
        reason: install.reason.clone(),
        message: install.message.clone(),
        last_transition_time: now,
        observed_generation: None,
    })
}

/// The status the agent reports for its node, beating now at the interval it runs with, keeping
/// the transition times of `previous`.
pub fn status(
    state: &NodeState,
    previous: Option<&TopologyGroupStatus>,
    (heartbeat, interval): (Time, Duration),
    generation: Option<i64>,
) -> TopologyGroupStatus {
    let (cards, nics) = match &state.inventory {
        Some(inventory) => (
            inventory
                .devices
                .values()
                .map(|d| card_status(state, d, &inventory.paths))
                .collect::<Vec<_>>(),
            inventory.nics.iter().map(nic_status).collect(),
        ),
        None => (
            previous.map(|p| p.cards.clone()).unwrap_or_default(),
            previous.map(|p| p.nics.clone()).unwrap_or_default(),
        ),
    };
    let mut conditions = previous.map(|p| p.conditions.clone()).unwrap_or_default();
    let mut ready = ready_condition(state, heartbeat.clone());
    ready.observed_generation = generation;
    set_condition(&mut conditions, ready);
    let runtime = runtime_condition(state, heartbeat.clone()).map(|mut c| {
        c.observed_generation = generation;
        c
    });
    let installed = runtime.is_some();
    if let Some(runtime) = runtime {
        set_condition(&mut conditions, runtime);
    }
    conditions.retain(|c| {
        c.type_ == CONDITION_READY || (installed && c.type_ == CONDITION_RUNTIME_READY)
    });
    TopologyGroupStatus {
        capacity: Some(capacity(&cards, &busy_cards(state))),
        cards,
        nics,
        nodes: Vec::new(),
        heartbeat_time: Some(heartbeat),
        // The operator allows three intervals without a beat before it withholds the cards.
        heartbeat_interval_seconds: Some(u32::try_from(interval.as_secs()).unwrap_or(u32::MAX)),
        observed_generation: generation,
        conditions,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{at, fault, four_cards, slice};
    use crate::health::FaultState;
    use runtimekit_crds::{SliceMode, SlicePhase};

    /// The agent's default heartbeat interval.
    const EVERY: Duration = Duration::from_secs(30);

    #[test]
    fn cards_held_whole_by_pods_without_a_slice_there_are_held_outside() {
        let mut state = four_cards();
        let holder = |pod: &str| crate::model::WholeHolder {
            resource: "nvidia.com/gpu".into(),
            pod: pod.into(),
        };
        // Card 1: a pod of another scheduler. Card 2: the runtimekit scheduler's own whole-card
        // pod, whose slice places it there.
        state.held_whole.insert(1, vec![holder("team/other")]);
        state.held_whole.insert(2, vec![holder("ns/pod-mine")]);
        state
            .slices
            .push(slice("mine", 2, SliceMode::Whole, SlicePhase::Ready));
        let status = status(&state, None, (at(10), EVERY), Some(1));
        let held: Vec<(u32, Vec<String>)> = status
            .cards
            .iter()
            .map(|c| (c.index, c.held_by.clone()))
            .collect();
        assert_eq!(
            held,
            [
                (0, vec![]),
                (1, vec!["team/other".to_owned()]),
                (2, vec![]),
                (3, vec![])
            ]
        );
    }

    #[test]
    fn cards_map_with_topology_links_and_instances() {
        let state = four_cards();
        let status = status(&state, None, (at(10), EVERY), Some(1));
        assert_eq!(status.cards.len(), 4);
        let card0 = &status.cards[0];
        assert_eq!(card0.uuid, "GPU-0");
        assert_eq!(card0.vendor, Vendor::Nvidia);
        assert_eq!(card0.memory_mib, 81559);
        assert!(card0.mig_capable && !card0.mig_enabled);
        assert_eq!(card0.health, CardHealth::Healthy);
        assert_eq!(card0.pcie_switch.as_deref(), Some("pex0"));
        assert_eq!((card0.numa_node, card0.socket), (Some(0), Some(0)));
        assert_eq!(card0.interconnect_group.as_deref(), Some("nvswitch"));
        // A peer once per link: 8 links to cards 1 and 2, 2 to card 3.
        let mut expected = vec![1; 8];
        expected.extend([2; 8]);
        expected.extend([3; 2]);
        assert_eq!(card0.nvlink_peers, expected);
        let card3 = &status.cards[3];
        assert!(card3.mig_enabled);
        assert_eq!(
            card3
                .mig_instances
                .iter()
                .map(|i| (i.profile.as_str(), i.placement_start, i.gpu_instance_id))
                .collect::<Vec<_>>(),
            [("1g.10gb", 0, 9), ("3g.40gb", 4, 2)]
        );
        assert_eq!(status.nics[0].name, "mlx5_0");
        assert_eq!(status.nics[0].pcie_switch.as_deref(), Some("pex0"));
        assert_eq!(status.heartbeat_time, Some(at(10)));
        assert_eq!(status.heartbeat_interval_seconds, Some(30));
        assert_eq!(status.conditions[0].status, "True");
        assert_eq!(status.conditions[0].observed_generation, Some(1));
    }

    #[test]
    fn capacity_counts_health_mig_and_free_cards() {
        let mut state = four_cards();
        state.slices = vec![
            slice("tdm", 0, SliceMode::Tdm, SlicePhase::Ready),
            // Marked Reserved by an earlier operator and not enacted yet: the card is free.
            slice("gang", 1, SliceMode::Tdm, SlicePhase::Reserved),
        ];
        let mut faults = FaultState::default();
        faults.apply(&pb::HealthEvent {
            device_index: 2,
            device_uuid: "GPU-2".into(),
            active: true,
            fault: Some(fault(pb::FaultKind::Xid, 79, pb::Severity::Critical)),
            ..Default::default()
        });
        state.faults = faults;
        let status = status(&state, None, (at(10), EVERY), None);
        assert_eq!(status.cards[2].health, CardHealth::Unhealthy);
        assert_eq!(status.cards[2].health_reason.as_deref(), Some("XID 79"));
        assert_eq!(
            status.capacity,
            Some(TopologyCapacity {
                nodes: 1,
                cards: 4,
                healthy_cards: 3,
                // card 0 holds a share, card 2 is unhealthy, card 3 holds MIG instances.
                free_cards: 1,
                mig_cards: 1,
            })
        );
    }

    #[test]
    fn transition_times_move_only_on_transitions() {
        let state = four_cards();
        let first = status(&state, None, (at(10), EVERY), None);
        let second = status(&state, Some(&first), (at(20), EVERY), None);
        assert_eq!(second.conditions[0].last_transition_time, at(10));
        let down = status(&NodeState::default(), Some(&second), (at(30), EVERY), None);
        assert_eq!(down.conditions[0].status, "False");
        assert_eq!(down.conditions[0].last_transition_time, at(30));
        assert_eq!(down.cards, first.cards, "the last known cards stay");
    }

    #[test]
    fn the_installer_s_word_is_the_runtime_ready_condition() {
        use crate::install::status::InstallStatus;
        let mut state = four_cards();
        let without = status(&state, None, (at(10), EVERY), None);
        assert!(
            without
                .conditions
                .iter()
                .all(|c| c.type_ != CONDITION_RUNTIME_READY),
            "an agent without an installer reports no RuntimeReady"
        );
        state.install = Some(InstallStatus {
            ready: false,
            reason: "ContainerdConfigUnparsable".into(),
            message: "containerd's configuration cannot be read as TOML".into(),
        });
        let failing = status(&state, Some(&without), (at(20), EVERY), Some(3));
        let runtime = failing
            .conditions
            .iter()
            .find(|c| c.type_ == CONDITION_RUNTIME_READY)
            .expect("RuntimeReady");
        assert_eq!(
            (runtime.status.as_str(), runtime.reason.as_str()),
            ("False", "ContainerdConfigUnparsable")
        );
        assert_eq!(runtime.observed_generation, Some(3));
        state.install = None;
        let gone = status(&state, Some(&failing), (at(30), EVERY), None);
        assert_eq!(gone.conditions.len(), 1, "{:?}", gone.conditions);
    }
}
