//! What the node offers through DRA, without I/O: its pool of ResourceSlices, from what the agent
//! knows of its cards, their use and the node's labels.
//!
//! Every card gets a counter set of its own (`gpu-<index>`). A card not in MIG mode offers a
//! whole device (`gpu-<index>`) and, where it can hold time-division shares, a share device
//! (`gpu-<index>-share`) that allows many allocations and consumes the capacities `core` and
//! `memory`. Both consume the card's one `card` counter, and a device that allows many
//! allocations consumes its counters once, at its first share: so once a claim holds the card
//! whole no share can be allocated, and once a share is allocated the card is not given whole.
//! A card in MIG mode offers one device per profile and placement start
//! (`gpu-<index>-mig-<profile>-<start>`), each consuming the memory slices it covers and its
//! compute slices, so two overlapping instances can never both be allocated. NICs are devices
//! many claims share, as `aliyun.com/rdma` is.
//!
//! What the kit's own ledger holds (GpuSlices, cards the kubelet gave whole through the device
//! plugin, instances the agent did not make for a claim) is taken out: such a card's whole
//! device is not offered, its share device offers only what the slices leave, and MIG placements
//! overlapping its instances are not offered. What claims hold is not taken out: the allocator
//! counts claims itself. A faulted card is tainted `NoSchedule` where the release keeps device
//! taints, else not offered, and comes back when it heals.

use super::names::{
    ATTR_COMPUTE_SLICES, ATTR_HEALTHY, ATTR_HYPER_NODE, ATTR_INDEX, ATTR_INTERCONNECT_GROUP,
    ATTR_LEAF_SWITCH, ATTR_MEMORY_SLICES, ATTR_MIG_CAPABLE, ATTR_NAME, ATTR_NETWORK_POD,
    ATTR_NUMA_NODE, ATTR_PCIE_SWITCH, ATTR_PLACEMENT_START, ATTR_PRODUCT_NAME, ATTR_PROFILE,
    ATTR_SOCKET, ATTR_TYPE, ATTR_UUID, ATTR_VENDOR, CAPACITY_CORE, CAPACITY_MEMORY, CARD_COUNTER,
    COMPUTE_COUNTER, DeviceKind, STANDARD_NUMA_NODE, STANDARD_PCI_BUS_ID, counter_set,
    memory_slice_counter, mig_device, nic_device, share_device, unhealthy_taint, whole_device,
};
use crate::model::{NodeState, instance_key, mig_enabled, numa_node, tdm_capable};
use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Counter, CounterSet, Device,
    DeviceAttribute, DeviceCapacity, DeviceCounterConsumption, ResourcePool, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use runtimekit_contract::RuntimeKitConfig;
use runtimekit_contract::config::{MemoryUnit, SWITCHED_OFF};
use runtimekit_crds::SliceMode;
use runtimekit_proto::resource::v1alpha1 as pb;
use std::collections::{BTreeMap, BTreeSet};

/// The most devices a slice holds when they consume counters (the API's limit).
pub const DEVICES_PER_SLICE: usize = 64;
/// The most counter sets a slice holds (the API's limit).
pub const COUNTER_SETS_PER_SLICE: usize = 8;

/// What the pool is built from.
#[derive(Debug, Clone, Copy)]
pub struct PoolInput<'a> {
    /// This node (the pool's name).
    pub node: &'a str,
    /// The driver name.
    pub driver: &'a str,
    /// The shared configuration (memory unit, cluster-wide switches).
    pub config: &'a RuntimeKitConfig,
    /// What the agent knows.
    pub state: &'a NodeState,
    /// The node's labels: its network position and its own switches.
    pub labels: &'a BTreeMap<String, String>,
    /// Whether the cluster keeps device taints (1.36 and later); without them a faulted card
    /// is withdrawn instead.
    pub taints: bool,
}

/// The pool's slices, in order: the counter sets first, then the devices. Their `pool` carries
/// the node's name, generation 0 and the slice count; the publisher sets the generation.
pub fn slices(input: &PoolInput<'_>) -> Vec<ResourceSliceSpec> {
    let Some(inventory) = &input.state.inventory else {
        return Vec::new();
    };
    let counter_sets: Vec<CounterSet> = inventory.devices.values().map(card_counters).collect();
    let mut devices: Vec<Device> = Vec::new();
    for device in inventory.devices.values() {
        devices.extend(card_devices(input, device));
    }
    let position = position(input);
    for nic in &inventory.nics {
        devices.push(nic_entry(nic, &position));
    }
    let count = counter_sets.len().div_ceil(COUNTER_SETS_PER_SLICE)
        + devices.len().div_ceil(DEVICES_PER_SLICE);
    let spec =
        |counters: Option<Vec<CounterSet>>, devices: Option<Vec<Device>>| ResourceSliceSpec {
            driver: input.driver.to_owned(),
            node_name: Some(input.node.to_owned()),
            pool: ResourcePool {
                name: input.node.to_owned(),
                generation: 0,
                resource_slice_count: i64::try_from(count).unwrap_or(i64::MAX),
            },
            shared_counters: counters,
            devices,
            ..ResourceSliceSpec::default()
        };
    counter_sets
        .chunks(COUNTER_SETS_PER_SLICE)
        .map(|chunk| spec(Some(chunk.to_vec()), None))
        .chain(
            devices
                .chunks(DEVICES_PER_SLICE)
                .map(|chunk| spec(None, Some(chunk.to_vec()))),
        )
        .collect()
}

/// The card's counters: one `card` counter, and for a card in MIG mode its memory slices and
/// compute slices.
fn card_counters(device: &pb::Device) -> CounterSet {
    let mut counters = BTreeMap::from([(CARD_COUNTER.to_owned(), counter(1))]);
    if let Some(mig) = device.mig.as_ref().filter(|m| m.enabled) {
        for slice in 0..mig.memory_slices {
            counters.insert(memory_slice_counter(slice), counter(1));
        }
        counters.insert(
            COMPUTE_COUNTER.to_owned(),
            counter(u64::from(mig.compute_slices)),
        );
    }
    CounterSet {
        name: counter_set(device.index),
        counters,
    }
}

fn counter(value: u64) -> Counter {
    Counter {
        value: Quantity(value.to_string()),
    }
}

/// A node's network position, from its labels.
fn position(input: &PoolInput<'_>) -> BTreeMap<String, DeviceAttribute> {
    let labels = &input.config.topology_labels;
    [
        (ATTR_HYPER_NODE, &labels.hyper_node),
        (ATTR_LEAF_SWITCH, &labels.leaf_switch),
        (ATTR_NETWORK_POD, &labels.network_pod),
    ]
    .into_iter()
    .filter_map(|(attribute, label)| {
        let value = input.labels.get(label)?;
        Some((attribute.to_owned(), string(value)))
    })
    .collect()
}

/// Whether the cluster and the node's label both leave a function on.
fn switched_on(input: &PoolInput<'_>, cluster: bool, label: &str) -> bool {
    cluster && input.labels.get(label).map(String::as_str) != Some(SWITCHED_OFF)
}

/// What the kit's own ledger holds on a card, outside any claim.
#[derive(Debug, Default)]
struct Held {
    /// Given whole: by a GpuSlice, or by the kubelet through the device plugin.
    whole: bool,
    /// Compute percent the card's time-division slices hold.
    core: u64,
    /// Memory in MiB they hold.
    memory_mib: u64,
    /// The card's memory slices taken by instances no claim made.
    memory_slices: BTreeSet<u32>,
}

fn held(state: &NodeState, device: &pb::Device) -> Held {
    let mut held = Held {
        whole: state.held_whole.contains_key(&device.index),
        ..Held::default()
    };
    for slice in state.slices_on(device.index) {
        match slice.mode {
            SliceMode::Whole => held.whole = true,
            SliceMode::Tdm => {
                held.core += u64::from(slice.core.unwrap_or(0));
                held.memory_mib += slice.memory_mib.unwrap_or(0);
            }
            SliceMode::Mig => {}
        }
    }
    let claimed: BTreeSet<&str> = state.prepared_instance_keys().collect();
    let slice_keys: BTreeSet<String> = state
        .slices_on(device.index)
        .map(|s| instance_key(&s.namespace, &s.name))
        .collect();
    for instance in &device.instances {
        if claimed.contains(instance.key.as_str()) {
            continue;
        }
        match instance.spec.as_ref().and_then(|s| s.kind.as_ref()) {
            Some(pb::instance_spec::Kind::Mig(spec)) => {
                // The instance's own count, else its profile's on this card.
                let size = instance
                    .mig
                    .as_ref()
                    .map(|m| m.memory_slices)
                    .filter(|n| *n > 0)
                    .or_else(|| {
                        let profiles = &device.mig.as_ref()?.profiles;
                        Some(
                            profiles
                                .iter()
                                .find(|p| p.name == spec.profile)?
                                .memory_slices,
                        )
                    })
                    .unwrap_or(1);
                held.memory_slices
                    .extend(spec.placement_start..spec.placement_start + size);
            }
            // A share the agent made for a slice is counted from the slice above.
            Some(pb::instance_spec::Kind::Tdm(tdm)) if !slice_keys.contains(&instance.key) => {
                held.core += u64::from(tdm.core_percent);
                held.memory_mib += tdm.memory_mib;
            }
            _ => {}
        }
    }
    held
}

/// The devices of one card, as its mode, use and health allow.
fn card_devices(input: &PoolInput<'_>, device: &pb::Device) -> Vec<Device> {
    let state = input.state;
    let healthy = state.healthy(device);
    if device.state() == pb::DeviceState::Lost || (!healthy && !input.taints) {
        return Vec::new();
    }
    let names = input.config.names();
    let held = held(state, device);
    let attributes = card_attributes(input, device, healthy);
    let taints = (!healthy).then(|| vec![unhealthy_taint(input.driver)]);
    let consumes = |counters: BTreeMap<String, Counter>| {
        Some(vec![DeviceCounterConsumption {
            counter_set: counter_set(device.index),
            counters,
            compatibility_groups: None,
        }])
    };
    let card_counter = || BTreeMap::from([(CARD_COUNTER.to_owned(), counter(1))]);
    let mut devices = Vec::new();
    if mig_enabled(device) {
        if !switched_on(input, input.config.features.mig, &names.mig_switch_label) {
            return devices;
        }
        let Some(mig) = &device.mig else {
            return devices;
        };
        for profile in mig.profiles.iter().filter(|p| !p.name.contains('+')) {
            for &start in &profile.starts {
                let covered: Vec<u32> = (start..start + profile.memory_slices).collect();
                if covered.iter().any(|s| held.memory_slices.contains(s)) {
                    continue;
                }
                let mut counters: BTreeMap<String, Counter> = covered
                    .iter()
                    .map(|&s| (memory_slice_counter(s), counter(1)))
                    .collect();
                counters.insert(
                    COMPUTE_COUNTER.to_owned(),
                    counter(u64::from(profile.slices)),
                );
                let mut attributes = attributes.clone();
                attributes.insert(ATTR_TYPE.into(), string(DeviceKind::Mig.attribute()));
                attributes.insert(ATTR_PROFILE.into(), string(&profile.name));
                attributes.insert(ATTR_PLACEMENT_START.into(), int(start));
                attributes.insert(ATTR_COMPUTE_SLICES.into(), int(profile.slices));
                attributes.insert(ATTR_MEMORY_SLICES.into(), int(profile.memory_slices));
                devices.push(Device {
                    name: mig_device(device.index, &profile.name, start),
                    attributes: Some(attributes),
                    capacity: Some(BTreeMap::from([(
                        CAPACITY_MEMORY.to_owned(),
                        fixed(mib(profile.memory_mib)),
                    )])),
                    consumes_counters: consumes(counters),
                    taints: taints.clone(),
                    ..Device::default()
                });
            }
        }
        return devices;
    }
    let sliced = state.slices_on(device.index).next().is_some()
        || device
            .instances
            .iter()
            .any(|i| !state.prepared_instance_keys().any(|k| k == i.key));
    if !held.whole && !sliced {
        let mut attributes = attributes.clone();
        attributes.insert(ATTR_TYPE.into(), string(DeviceKind::Whole.attribute()));
        devices.push(Device {
            name: whole_device(device.index),
            attributes: Some(attributes),
            capacity: Some(BTreeMap::from([(
                CAPACITY_MEMORY.to_owned(),
                fixed(mib(device.memory_mib)),
            )])),
            consumes_counters: consumes(card_counter()),
            taints: taints.clone(),
            ..Device::default()
        });
    }
    if tdm_capable(device)
        && !held.whole
        && switched_on(input, input.config.features.tdm, &names.tdm_switch_label)
    {
        let mut attributes = attributes;
        attributes.insert(ATTR_TYPE.into(), string(DeviceKind::Share.attribute()));
        let core = 100u64.saturating_sub(held.core);
        let memory = device.memory_mib.saturating_sub(held.memory_mib);
        let step = match input.config.memory_unit {
            MemoryUnit::GiB => "1Gi".to_owned(),
            MemoryUnit::MiB => format!("{}Mi", MemoryUnit::MIB_STEP),
        };
        devices.push(Device {
            name: share_device(device.index),
            allow_multiple_allocations: Some(true),
            attributes: Some(attributes),
            capacity: Some(BTreeMap::from([
                (
                    CAPACITY_CORE.to_owned(),
                    consumable(Quantity(core.to_string()), "1"),
                ),
                (CAPACITY_MEMORY.to_owned(), consumable(mib(memory), &step)),
            ])),
            consumes_counters: consumes(card_counter()),
            taints,
            ..Device::default()
        });
    }
    devices
}

/// What every device of a card says about it.
fn card_attributes(
    input: &PoolInput<'_>,
    device: &pb::Device,
    healthy: bool,
) -> BTreeMap<String, DeviceAttribute> {
    let mut attributes = position(input);
    let topology = device.topology.clone().unwrap_or_default();
    attributes.insert(ATTR_UUID.into(), string(&device.uuid));
    attributes.insert(ATTR_INDEX.into(), int(device.index));
    attributes.insert(ATTR_VENDOR.into(), string(vendor(device.vendor())));
    attributes.insert(ATTR_PRODUCT_NAME.into(), string(&device.model));
    attributes.insert(
        ATTR_MIG_CAPABLE.into(),
        boolean(device.mig.as_ref().is_some_and(|m| m.capable)),
    );
    attributes.insert(ATTR_HEALTHY.into(), boolean(healthy));
    if !topology.pcie_switch.is_empty() {
        attributes.insert(ATTR_PCIE_SWITCH.into(), string(&topology.pcie_switch));
    }
    if let Some(numa) = numa_node(device) {
        attributes.insert(ATTR_NUMA_NODE.into(), int(numa));
        attributes.insert(STANDARD_NUMA_NODE.into(), int(numa));
    }
    if let Some(socket) = topology.socket {
        attributes.insert(ATTR_SOCKET.into(), int(socket));
    }
    if !topology.interconnect_group.is_empty() {
        attributes.insert(
            ATTR_INTERCONNECT_GROUP.into(),
            string(&topology.interconnect_group),
        );
    }
    if let Some(bus) = pci_bus_id(&device.pci_bus_id) {
        attributes.insert(STANDARD_PCI_BUS_ID.into(), string(&bus));
    }
    attributes
}

/// A NIC: shared by any number of claims.
fn nic_entry(nic: &pb::Nic, position: &BTreeMap<String, DeviceAttribute>) -> Device {
    let mut attributes = position.clone();
    attributes.insert(ATTR_TYPE.into(), string(DeviceKind::Rdma.attribute()));
    attributes.insert(ATTR_NAME.into(), string(&nic.name));
    if !nic.pcie_switch.is_empty() {
        attributes.insert(ATTR_PCIE_SWITCH.into(), string(&nic.pcie_switch));
    }
    if let Some(numa) = nic.numa_node {
        attributes.insert(ATTR_NUMA_NODE.into(), int(numa));
        attributes.insert(STANDARD_NUMA_NODE.into(), int(numa));
    }
    if let Some(socket) = nic.socket {
        attributes.insert(ATTR_SOCKET.into(), int(socket));
    }
    if let Some(bus) = pci_bus_id(&nic.pci_bus_id) {
        attributes.insert(STANDARD_PCI_BUS_ID.into(), string(&bus));
    }
    Device {
        name: nic_device(&nic.name),
        allow_multiple_allocations: Some(true),
        attributes: Some(attributes),
        ..Device::default()
    }
}

/// A PCI address in the standard attribute's form (`0000:1b:00.0`, lower case): NVML writes
/// the domain with eight digits. `None` when it is not an address.
pub fn pci_bus_id(address: &str) -> Option<String> {
    let (domain, rest) = address.split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let (device, function) = rest.split_once('.')?;
    let hex = |s: &str, digits: usize| {
        (s.len() == digits && s.chars().all(|c| c.is_ascii_hexdigit()))
            .then(|| u32::from_str_radix(s, 16).ok())
            .flatten()
    };
    let domain = hex(domain, domain.len()).filter(|d| *d <= 0xffff && !domain.is_empty())?;
    let (bus, device, function) = (hex(bus, 2)?, hex(device, 2)?, hex(function, 1)?);
    (device < 32 && function < 8)
        .then(|| format!("{domain:04x}:{bus:02x}:{device:02x}.{function:x}"))
}

fn vendor(vendor: pb::Vendor) -> &'static str {
    match vendor {
        pb::Vendor::Nvidia => "nvidia",
        pb::Vendor::Amd => "amd",
        pb::Vendor::Ppu => "ppu",
        _ => "unknown",
    }
}

fn string(value: &str) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(value.to_owned()),
        ..DeviceAttribute::default()
    }
}

fn int(value: u32) -> DeviceAttribute {
    DeviceAttribute {
        int: Some(i64::from(value)),
        ..DeviceAttribute::default()
    }
}

fn boolean(value: bool) -> DeviceAttribute {
    DeviceAttribute {
        bool: Some(value),
        ..DeviceAttribute::default()
    }
}

fn mib(value: u64) -> Quantity {
    Quantity(format!("{value}Mi"))
}

/// A capacity a device gives whole.
fn fixed(value: Quantity) -> DeviceCapacity {
    DeviceCapacity {
        value,
        request_policy: None,
    }
}

/// A capacity claims consume in `step`s, none of it unless they ask: a share without `core`
/// has no compute cap and reserves none, as `gpu-core` left out does.
fn consumable(value: Quantity, step: &str) -> DeviceCapacity {
    DeviceCapacity {
        value,
        request_policy: Some(CapacityRequestPolicy {
            default: Some(Quantity("0".into())),
            valid_range: Some(CapacityRequestPolicyRange {
                min: Quantity("0".into()),
                max: None,
                step: Some(Quantity(step.into())),
            }),
            valid_values: None,
        }),
    }
}

#[cfg(test)]
mod tests {
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
}
