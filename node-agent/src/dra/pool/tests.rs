//! Tests of the parent module.

use super::*;
use crate::fixtures::{fault, four_cards, slice};
use crate::model::{PreparedDevice, WholeHolder};
use runtimekit_crds::SlicePhase;

const DRIVER: &str = "gpu.runtimekit.aliyun.com";

fn profile(name: &str, slices: u32, memory_slices: u32, starts: &[u32]) -> pb::MigProfileInfo {
    pb::MigProfileInfo {
        name: name.into(),
        slices,
        memory_slices,
        memory_mib: u64::from(memory_slices) * 10240,
        starts: starts.to_vec(),
        ..Default::default()
    }
}

/// The shared four-card node, its MIG card (3) with three profiles and a media one.
fn node() -> NodeState {
    let mut state = four_cards();
    let inventory = state.inventory.as_mut().expect("inventory");
    let mig = inventory
        .devices
        .get_mut(&3)
        .and_then(|d| d.mig.as_mut())
        .expect("mig");
    mig.profiles = vec![
        profile("1g.10gb", 1, 1, &[0, 1, 2, 3, 4, 5, 6]),
        profile("1g.10gb+me", 1, 1, &[0, 1, 2, 3, 4, 5, 6]),
        profile("3g.40gb", 3, 4, &[0, 4]),
        profile("7g.80gb", 7, 8, &[0]),
    ];
    state
}

fn publish(state: &NodeState, labels: &[(&str, &str)], taints: bool) -> Vec<ResourceSliceSpec> {
    let labels: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    slices(&PoolInput {
        node: "n1",
        driver: DRIVER,
        config: &RuntimeKitConfig::default(),
        state,
        labels: &labels,
        taints,
    })
}

fn devices(slices: &[ResourceSliceSpec]) -> Vec<Device> {
    slices
        .iter()
        .flat_map(|s| s.devices.clone().unwrap_or_default())
        .collect()
}

fn names(slices: &[ResourceSliceSpec]) -> Vec<String> {
    devices(slices).into_iter().map(|d| d.name).collect()
}

fn find(slices: &[ResourceSliceSpec], name: &str) -> Device {
    devices(slices)
        .into_iter()
        .find(|d| d.name == name)
        .unwrap_or_else(|| panic!("no device {name}"))
}

fn capacity(device: &Device, name: &str) -> String {
    device
        .capacity
        .as_ref()
        .and_then(|c| c.get(name))
        .map(|c| c.value.0.clone())
        .unwrap_or_default()
}

fn attribute(device: &Device, name: &str) -> DeviceAttribute {
    device
        .attributes
        .as_ref()
        .and_then(|a| a.get(name))
        .cloned()
        .unwrap_or_default()
}

#[test]
fn every_card_has_one_mode_at_a_time_through_one_counter() {
    let pool = publish(&node(), &[], true);
    assert_eq!(
        names(&pool),
        [
            "gpu-0",
            "gpu-0-share",
            "gpu-1",
            "gpu-1-share",
            "gpu-2",
            "gpu-2-share",
            // Card 3's 3g.40gb at 4 and an unclaimed 1g at 0 are not the pool's to offer:
            // what overlaps them is left out, and media profiles are never offered.
            "gpu-3-mig-1g10gb-1",
            "gpu-3-mig-1g10gb-2",
            "gpu-3-mig-1g10gb-3",
            "nic-mlx5-0",
        ]
    );
    let whole = find(&pool, "gpu-0");
    let share = find(&pool, "gpu-0-share");
    for device in [&whole, &share] {
        let consumed = device.consumes_counters.clone().unwrap_or_default();
        assert_eq!(consumed.len(), 1);
        assert_eq!(consumed[0].counter_set, "gpu-0");
        assert_eq!(consumed[0].counters[CARD_COUNTER].value.0, "1");
    }
    assert_eq!(whole.allow_multiple_allocations, None);
    assert_eq!(share.allow_multiple_allocations, Some(true));
    let sets: Vec<CounterSet> = pool
        .iter()
        .flat_map(|s| s.shared_counters.clone().unwrap_or_default())
        .collect();
    assert_eq!(sets.len(), 4);
    assert_eq!(
        sets[0].counters[CARD_COUNTER].value.0, "1",
        "so whole and share exclude each other"
    );
    assert_eq!(
        sets[3].counters.len(),
        1 + 8 + 1,
        "card, eight memory slices, compute slices"
    );
    let core = &share.capacity.as_ref().expect("capacity")[CAPACITY_CORE];
    assert_eq!(core.value.0, "100");
    let policy = core.request_policy.as_ref().expect("policy");
    assert_eq!(policy.default.as_ref().map(|q| q.0.as_str()), Some("0"));
    assert_eq!(
        policy
            .valid_range
            .as_ref()
            .and_then(|r| r.step.as_ref())
            .map(|q| q.0.as_str()),
        Some("1")
    );
    assert_eq!(capacity(&share, CAPACITY_MEMORY), "81559Mi");
    assert_eq!(attribute(&whole, ATTR_TYPE).string.as_deref(), Some("gpu"));
    assert_eq!(
        attribute(&share, ATTR_TYPE).string.as_deref(),
        Some("share")
    );
    assert_eq!(
        attribute(&whole, ATTR_PCIE_SWITCH).string.as_deref(),
        Some("pex0")
    );
    assert_eq!(
        attribute(&whole, ATTR_UUID).string.as_deref(),
        Some("GPU-0")
    );
    let nic = find(&pool, "nic-mlx5-0");
    assert_eq!(
        attribute(&nic, ATTR_PCIE_SWITCH).string.as_deref(),
        Some("pex0"),
        "a card and its NIC match on the switch"
    );
    assert_eq!(nic.allow_multiple_allocations, Some(true));
}

#[test]
fn a_mig_placement_consumes_the_memory_slices_it_covers() {
    let mut state = node();
    let card = state
        .inventory
        .as_mut()
        .and_then(|i| i.devices.get_mut(&3))
        .expect("card 3");
    card.instances.clear();
    let pool = publish(&state, &[], true);
    let three = find(&pool, "gpu-3-mig-3g40gb-4");
    let counters = &three.consumes_counters.as_ref().expect("counters")[0].counters;
    let slices: Vec<&String> = counters
        .keys()
        .filter(|k| k.starts_with("memory-slice-"))
        .collect();
    assert_eq!(
        slices,
        [
            "memory-slice-4",
            "memory-slice-5",
            "memory-slice-6",
            "memory-slice-7"
        ]
    );
    assert_eq!(counters[COMPUTE_COUNTER].value.0, "3");
    assert_eq!(
        attribute(&three, ATTR_PROFILE).string.as_deref(),
        Some("3g.40gb")
    );
    assert_eq!(attribute(&three, ATTR_PLACEMENT_START).int, Some(4));
    assert_eq!(capacity(&three, CAPACITY_MEMORY), "40960Mi");
    assert_eq!(
        devices(&pool)
            .iter()
            .filter(|d| d.name.starts_with("gpu-3-"))
            .count(),
        7 + 2 + 1
    );
}

#[test]
fn what_the_kits_ledger_holds_is_taken_out() {
    let mut state = node();
    state.slices = vec![
        slice("t", 1, SliceMode::Tdm, SlicePhase::Ready),
        slice("w", 2, SliceMode::Whole, SlicePhase::Ready),
    ];
    state.held_whole.insert(
        0,
        vec![WholeHolder {
            resource: "nvidia.com/gpu".into(),
            pod: "team/other".into(),
        }],
    );
    let pool = publish(&state, &[], true);
    let cards: Vec<String> = names(&pool)
        .into_iter()
        .filter(|n| !n.starts_with("gpu-3-"))
        .collect();
    assert_eq!(
        cards,
        ["gpu-1-share", "nic-mlx5-0"],
        "card 0 is held by the device plugin, card 2 by a slice"
    );
    let share = find(&pool, "gpu-1-share");
    assert_eq!(
        capacity(&share, CAPACITY_CORE),
        "50",
        "what the slice leaves"
    );
    assert_eq!(
        capacity(&share, CAPACITY_MEMORY),
        format!("{}Mi", 81559 - 4096)
    );
}

#[test]
fn a_claims_own_instance_stays_offered_for_the_allocator_to_count() {
    let mut state = node();
    let card = state
        .inventory
        .as_mut()
        .and_then(|i| i.devices.get_mut(&3))
        .expect("card 3");
    card.instances.retain(|i| i.key == "ns/a");
    card.instances[0].key = "dra:uid-1:mig:gpu-3-mig-3g40gb-4".into();
    state.prepared = vec![PreparedDevice {
        claim: "ns/c".into(),
        claim_uid: "uid-1".into(),
        request: "mig".into(),
        device: "gpu-3-mig-3g40gb-4".into(),
        card: Some(3),
        mode: Some(SliceMode::Mig),
        instance_key: Some("dra:uid-1:mig:gpu-3-mig-3g40gb-4".into()),
        core: None,
        memory_mib: None,
        pods: Vec::new(),
    }];
    let pool = publish(&state, &[], true);
    assert!(names(&pool).contains(&"gpu-3-mig-3g40gb-4".to_owned()));
    assert!(
        names(&pool).contains(&"gpu-3-mig-7g80gb-0".to_owned()),
        "its overlap is the counters' to refuse"
    );
}

#[test]
fn a_faulted_card_is_tainted_or_withdrawn_and_comes_back() {
    let mut state = node();
    state.faults.apply(&pb::HealthEvent {
        device_index: 1,
        device_uuid: "GPU-1".into(),
        active: true,
        fault: Some(fault(pb::FaultKind::Xid, 79, pb::Severity::Critical)),
        ..Default::default()
    });
    let tainted = publish(&state, &[], true);
    let whole = find(&tainted, "gpu-1");
    assert_eq!(
        whole.taints.as_ref().map(|t| t[0].key.as_str()),
        Some("gpu.runtimekit.aliyun.com/unhealthy")
    );
    assert_eq!(
        whole.taints.as_ref().map(|t| t[0].effect.as_str()),
        Some("NoSchedule")
    );
    assert_eq!(attribute(&whole, ATTR_HEALTHY).bool, Some(false));
    assert_eq!(find(&tainted, "gpu-0").taints, None);
    let withdrawn = publish(&state, &[], false);
    assert!(!names(&withdrawn).iter().any(|n| n.starts_with("gpu-1")));
    state.faults = Default::default();
    assert!(names(&publish(&state, &[], false)).contains(&"gpu-1".to_owned()));
}

#[test]
fn the_nodes_labels_give_its_position_and_switch_functions_off() {
    let state = node();
    let pool = publish(
        &state,
        &[
            ("runtimekit.aliyun.com/hypernode", "hn-1"),
            ("runtimekit.aliyun.com/leaf-switch", "leaf-1"),
            ("runtimekit.aliyun.com/network-pod", "pod-a"),
            ("aliyun.com/tdm-enabled", "false"),
            ("aliyun.com/mig-enabled", "false"),
        ],
        true,
    );
    assert_eq!(names(&pool), ["gpu-0", "gpu-1", "gpu-2", "nic-mlx5-0"]);
    for device in devices(&pool) {
        assert_eq!(
            attribute(&device, ATTR_HYPER_NODE).string.as_deref(),
            Some("hn-1")
        );
        assert_eq!(
            attribute(&device, ATTR_LEAF_SWITCH).string.as_deref(),
            Some("leaf-1")
        );
        assert_eq!(
            attribute(&device, ATTR_NETWORK_POD).string.as_deref(),
            Some("pod-a")
        );
    }
}

#[test]
fn a_large_node_spreads_over_slices_within_the_apis_limits() {
    let mut state = node();
    let inventory = state.inventory.as_mut().expect("inventory");
    let template = inventory.devices[&3].clone();
    for index in 4..16 {
        let mut card = template.clone();
        card.index = index;
        card.uuid = format!("GPU-{index}");
        card.instances.clear();
        inventory.devices.insert(index, card);
    }
    let pool = publish(&state, &[], true);
    let count = i64::try_from(pool.len()).expect("count");
    assert!(pool.len() >= 4, "{} slices", pool.len());
    for slice in &pool {
        assert_eq!(slice.pool.resource_slice_count, count);
        assert_eq!(slice.pool.name, "n1");
        assert_eq!(slice.node_name.as_deref(), Some("n1"));
        assert!(
            slice.devices.is_none() || slice.shared_counters.is_none(),
            "never both in one slice"
        );
        assert!(
            slice
                .devices
                .as_ref()
                .is_none_or(|d| d.len() <= DEVICES_PER_SLICE)
        );
        assert!(
            slice
                .shared_counters
                .as_ref()
                .is_none_or(|c| c.len() <= COUNTER_SETS_PER_SLICE)
        );
        for device in slice.devices.iter().flatten() {
            assert!(device.name.len() <= 63);
            let described = device.attributes.as_ref().map_or(0, BTreeMap::len)
                + device.capacity.as_ref().map_or(0, BTreeMap::len);
            assert!(described <= 32, "{} says {described} things", device.name);
        }
    }
}

#[test]
fn pci_addresses_take_the_standard_form() {
    assert_eq!(
        pci_bus_id("00000000:1B:00.0").as_deref(),
        Some("0000:1b:00.0")
    );
    assert_eq!(pci_bus_id("0000:4d:00.1").as_deref(), Some("0000:4d:00.1"));
    for bad in [
        "",
        "1b:00.0",
        "00010000:1b:00.0",
        "0000:1b:40.0",
        "0000:1b:00.8",
        "0000:zz:00.0",
    ] {
        assert_eq!(pci_bus_id(bad), None, "{bad}");
    }
}
