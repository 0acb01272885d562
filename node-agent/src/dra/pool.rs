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

use crate::model::{NodeState, instance_key, mig_enabled, numa_node, tdm_capable};
use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Counter, CounterSet, Device,
    DeviceAttribute, DeviceCapacity, DeviceCounterConsumption, ResourcePool, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use runtimekit_contract::RuntimeKitConfig;
use runtimekit_contract::config::{MemoryUnit, SWITCHED_OFF};
use runtimekit_contract::dra::{
    ATTR_COMPUTE_SLICES, ATTR_HEALTHY, ATTR_HYPER_NODE, ATTR_INDEX, ATTR_INTERCONNECT_GROUP,
    ATTR_LEAF_SWITCH, ATTR_MEMORY_SLICES, ATTR_MIG_CAPABLE, ATTR_NAME, ATTR_NETWORK_POD,
    ATTR_NUMA_NODE, ATTR_PCIE_SWITCH, ATTR_PLACEMENT_START, ATTR_PRODUCT_NAME, ATTR_PROFILE,
    ATTR_SOCKET, ATTR_TYPE, ATTR_UUID, ATTR_VENDOR, CAPACITY_CORE, CAPACITY_MEMORY, CARD_COUNTER,
    COMPUTE_COUNTER, DeviceKind, STANDARD_NUMA_NODE, STANDARD_PCI_BUS_ID, counter_set,
    memory_slice_counter, mig_device, nic_device, share_device, unhealthy_taint, whole_device,
};
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
mod tests;
