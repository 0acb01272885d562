//! What the node advertises to the kubelet (SPEC section 6), computed from what the agent knows.
//!
//! Every resource goes through the kubelet device plugin, so the kubelet reports capacity as
//! the devices listed and allocatable as the healthy ones, and counts an unhealthy card out of
//! allocatable only:
//!
//! | resource | devices |
//! | --- | --- |
//! | `<prefix>/gpu` | one per card not in MIG mode, any vendor; ID = card UUID |
//! | `nvidia.com/gpu` | one per NVIDIA card not in MIG mode; ID = card UUID |
//! | `<prefix>/gpu-core` | 100 per TDM card (NVIDIA or PPU, not in MIG mode); `GPU-<uuid>::<k>` |
//! | `<prefix>/gpu-memory` (GiB mode) | one per whole GiB of each TDM card; `GPU-<uuid>::<k>` |
//! | `<prefix>/gpu-slice` | one per compute slice (7) of each card in MIG mode; `GPU-<uuid>::<k>` |
//! | `<prefix>/rdma` | 128 shares per RDMA NIC; `<nic>::<k>` |
//!
//! The `::<k>` replica IDs are NVIDIA's time-slicing convention, which dcgm-exporter and other
//! pod-resources consumers already strip to find the card. In MiB mode `gpu-memory` would need
//! one device per MiB, so it is a node-level extended resource instead: the agent writes it into
//! the Node's status, counting the healthy TDM and MIG cards in 128 MiB steps (the kubelet copies
//! capacity into allocatable for such resources, so an unhealthy card leaves both).
//!
//! A whole-card device is Unhealthy while its card holds slices or instances, so the kubelet
//! never gives a card that holds slices to a whole-card pod, whoever scheduled it.

use crate::model::{NodeState, mig_enabled, numa_node, tdm_capable};
use runtimekit_contract::config::NVIDIA_GPU;
use runtimekit_contract::{MemoryUnit, RuntimeKitConfig};
use runtimekit_proto::deviceplugin::v1beta1 as dp;
use runtimekit_proto::resource::v1alpha1 as pb;
use std::collections::BTreeMap;

/// Compute-share devices per TDM card: one per percent.
pub const CORE_PER_CARD: u32 = 100;
/// RDMA shares per NIC: `rdma` is a switch, so this only bounds how many containers on the node
/// may turn it on at once (more than the default 110 pods per node).
pub const RDMA_SHARES_PER_NIC: u32 = 128;
/// Compute slices of a MIG card whose resource layer does not say.
const DEFAULT_COMPUTE_SLICES: u32 = 7;

/// What the devices of one resource stand for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Whole cards; NVIDIA cards only when `nvidia_only`.
    Whole {
        /// Only NVIDIA cards (`nvidia.com/gpu`).
        nvidia_only: bool,
    },
    /// Percent of compute of TDM cards.
    Core,
    /// GiB of memory of TDM and MIG cards (MIG pods state gpu-memory too).
    Memory,
    /// Compute slices of MIG cards.
    Slice,
    /// Shares of the node's RDMA NICs.
    Rdma,
}

impl Kind {
    /// Whether the devices are cards given whole.
    pub fn whole(self) -> bool {
        matches!(self, Kind::Whole { .. })
    }
}

/// One resource the device plugin advertises.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Advertised {
    /// The resource name, for example `aliyun.com/gpu-core`.
    pub name: String,
    /// What its devices stand for.
    pub kind: Kind,
}

impl Advertised {
    /// The file name of its plugin socket in the kubelet's device-plugin folder.
    pub fn socket_name(&self) -> String {
        format!("runtimekit-{}.sock", self.name.replace(['/', '.'], "-"))
    }
}

/// The resources the device plugin advertises under `config`.
pub fn advertised(config: &RuntimeKitConfig) -> Vec<Advertised> {
    let names = config.names();
    let mut resources = vec![Advertised {
        name: names.gpu.clone(),
        kind: Kind::Whole { nvidia_only: false },
    }];
    if names.gpu != NVIDIA_GPU {
        resources.push(Advertised {
            name: NVIDIA_GPU.into(),
            kind: Kind::Whole { nvidia_only: true },
        });
    }
    resources.push(Advertised {
        name: names.gpu_core,
        kind: Kind::Core,
    });
    if config.memory_unit == MemoryUnit::GiB {
        resources.push(Advertised {
            name: names.gpu_memory,
            kind: Kind::Memory,
        });
    }
    resources.push(Advertised {
        name: names.gpu_slice,
        kind: Kind::Slice,
    });
    resources.push(Advertised {
        name: names.rdma,
        kind: Kind::Rdma,
    });
    resources
}

/// The ID of replica `k` of a card (or NIC): `<id>::<k>`.
pub fn replica_id(id: &str, k: u32) -> String {
    format!("{id}::{k}")
}

/// The card UUID (or NIC name) a device ID of `kind` stands for.
pub fn base_id(kind: Kind, id: &str) -> &str {
    match kind {
        Kind::Whole { .. } => id,
        _ => id.rsplit_once("::").map_or(id, |(base, _)| base),
    }
}

fn health(healthy: bool) -> String {
    if healthy {
        dp::HEALTHY.into()
    } else {
        dp::UNHEALTHY.into()
    }
}

fn topology(numa: Option<u32>) -> Option<dp::TopologyInfo> {
    numa.map(|n| dp::TopologyInfo {
        nodes: vec![dp::NumaNode { id: i64::from(n) }],
    })
}

/// The cards whose devices `kind` lists.
pub fn cards_of(kind: Kind, state: &NodeState) -> Vec<&pb::Device> {
    let Some(inventory) = &state.inventory else {
        return Vec::new();
    };
    inventory
        .devices
        .values()
        .filter(|d| match kind {
            Kind::Whole { nvidia_only } => {
                !mig_enabled(d) && (!nvidia_only || d.vendor() == pb::Vendor::Nvidia)
            }
            Kind::Core => tdm_capable(d),
            // MIG pods state gpu-memory too (the profile must offer it), and the kubelet admits
            // a pod only if node allocatable covers every request, so MIG cards count as well.
            Kind::Memory => tdm_capable(d) || mig_enabled(d),
            Kind::Slice => mig_enabled(d),
            Kind::Rdma => false,
        })
        .collect()
}

/// How many replicas of a card `kind` lists.
pub fn replicas(kind: Kind, device: &pb::Device) -> u32 {
    match kind {
        Kind::Whole { .. } => 1,
        Kind::Core => CORE_PER_CARD,
        Kind::Memory => u32::try_from(device.memory_mib / 1024).unwrap_or(u32::MAX),
        Kind::Slice => match device.mig.as_ref().map_or(0, |m| m.compute_slices) {
            0 => DEFAULT_COMPUTE_SLICES,
            n => n,
        },
        Kind::Rdma => 0,
    }
}

/// Whether a card may be given whole through `resource`: no blocker, and not given whole
/// through another whole-card resource already.
pub fn whole_card_available(state: &NodeState, device: &pb::Device, resource: &str) -> bool {
    state.whole_card_blockers(device).is_empty()
        && !state
            .held_whole
            .get(&device.index)
            .is_some_and(|holders| holders.iter().any(|h| h.resource != resource))
}

/// The devices of one resource, as ListAndWatch sends them.
pub fn devices(resource: &Advertised, state: &NodeState) -> Vec<dp::Device> {
    if resource.kind == Kind::Rdma {
        let nics = state.inventory.iter().flat_map(|i| i.nics.iter());
        return nics
            .flat_map(|nic| {
                (0..RDMA_SHARES_PER_NIC).map(move |k| dp::Device {
                    id: replica_id(&nic.name, k),
                    health: health(true),
                    topology: topology(nic.numa_node),
                })
            })
            .collect();
    }
    let mut devices = Vec::new();
    for card in cards_of(resource.kind, state) {
        let healthy = if resource.kind.whole() {
            whole_card_available(state, card, &resource.name)
        } else {
            state.healthy(card)
        };
        if resource.kind.whole() {
            devices.push(dp::Device {
                id: card.uuid.clone(),
                health: health(healthy),
                topology: topology(numa_node(card)),
            });
            continue;
        }
        for k in 0..replicas(resource.kind, card) {
            devices.push(dp::Device {
                id: replica_id(&card.uuid, k),
                health: health(healthy),
                topology: topology(numa_node(card)),
            });
        }
    }
    devices
}

/// The node-level extended resources the agent writes into the Node's status (capacity equals
/// allocatable): `gpu-memory` in MiB mode, the healthy TDM and MIG cards' memory in 128 MiB steps.
pub fn node_level(config: &RuntimeKitConfig, state: &NodeState) -> BTreeMap<String, u64> {
    let mut resources = BTreeMap::new();
    if config.memory_unit == MemoryUnit::MiB {
        let mib: u64 = cards_of(Kind::Memory, state)
            .into_iter()
            .filter(|d| state.healthy(d))
            .map(|d| d.memory_mib / MemoryUnit::MIB_STEP * MemoryUnit::MIB_STEP)
            .sum();
        resources.insert(config.names().gpu_memory, mib);
    }
    resources
}

/// Capacity and allocatable of every resource, as `kubectl describe node` will show them once
/// the kubelet has taken in the device lists (capacity: devices; allocatable: healthy ones).
pub fn summary(config: &RuntimeKitConfig, state: &NodeState) -> BTreeMap<String, (u64, u64)> {
    let mut summary: BTreeMap<String, (u64, u64)> = advertised(config)
        .iter()
        .map(|r| {
            let devices = devices(r, state);
            let healthy = devices.iter().filter(|d| d.health == dp::HEALTHY).count();
            (r.name.clone(), (devices.len() as u64, healthy as u64))
        })
        .collect();
    for (name, value) in node_level(config, state) {
        summary.insert(name, (value, value));
    }
    summary
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{fault, slice};
    use crate::model::{Inventory, WholeHolder};
    use runtimekit_crds::{SliceMode, SlicePhase};

    fn card(index: u32, vendor: pb::Vendor, memory_mib: u64, mig: bool) -> pb::Device {
        pb::Device {
            index,
            uuid: format!("GPU-{index}"),
            vendor: vendor.into(),
            memory_mib,
            state: pb::DeviceState::Ok.into(),
            healthy: true,
            mig: Some(pb::MigState {
                capable: mig,
                enabled: mig,
                compute_slices: if mig { 7 } else { 0 },
                ..Default::default()
            }),
            topology: Some(pb::Topology {
                numa_node: Some(index % 2),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// Two TDM H800s (79.6 GiB each), one H800 in MIG mode, one AMD card, two NICs.
    fn node() -> NodeState {
        let mut inventory = Inventory::default();
        inventory.merge(
            pb::ListDevicesResponse {
                control_nodes: Vec::new(),
                device_root: String::new(),
                errors: Vec::new(),
                devices: vec![
                    card(0, pb::Vendor::Nvidia, 81559, false),
                    card(1, pb::Vendor::Nvidia, 81559, false),
                    card(2, pb::Vendor::Nvidia, 81559, true),
                    card(3, pb::Vendor::Amd, 196608, false),
                ],
                nics: vec![
                    pb::Nic {
                        name: "mlx5_0".into(),
                        numa_node: Some(0),
                        ..Default::default()
                    },
                    pb::Nic {
                        name: "mlx5_1".into(),
                        ..Default::default()
                    },
                ],
                paths: vec![],
            },
            &[],
        );
        NodeState {
            inventory: Some(inventory),
            ..NodeState::default()
        }
    }

    fn expect(rows: &[(&str, u64, u64)]) -> BTreeMap<String, (u64, u64)> {
        rows.iter()
            .map(|(n, c, a)| ((*n).to_owned(), (*c, *a)))
            .collect()
    }

    #[test]
    fn every_resource_of_spec_section_6_in_gib_mode() {
        let summary = summary(&RuntimeKitConfig::default(), &node());
        assert_eq!(
            summary,
            expect(&[
                ("aliyun.com/gpu", 3, 3),
                ("nvidia.com/gpu", 2, 2),
                ("aliyun.com/gpu-core", 200, 200),
                // Two TDM cards and the MIG card, 79 GiB each.
                ("aliyun.com/gpu-memory", 237, 237),
                ("aliyun.com/gpu-slice", 7, 7),
                ("aliyun.com/rdma", 256, 256),
            ])
        );
    }

    #[test]
    fn mib_mode_and_a_custom_prefix_rename_everything_without_a_device_per_mib() {
        let config = RuntimeKitConfig {
            resource_prefix: "example.org".into(),
            memory_unit: MemoryUnit::MiB,
            ..RuntimeKitConfig::default()
        };
        let state = node();
        let names: Vec<String> = advertised(&config).into_iter().map(|r| r.name).collect();
        assert_eq!(
            names,
            [
                "example.org/gpu",
                "nvidia.com/gpu",
                "example.org/gpu-core",
                "example.org/gpu-slice",
                "example.org/rdma"
            ],
            "no device-plugin resource for memory in MiB mode"
        );
        // 81559 MiB is 637 steps of 128 MiB (81536 MiB) per TDM or MIG card.
        assert_eq!(
            node_level(&config, &state),
            BTreeMap::from([("example.org/gpu-memory".to_owned(), 3 * 81536)])
        );
        let summary = summary(&config, &state);
        assert_eq!(summary["example.org/gpu-memory"], (244608, 244608));
        assert_eq!(summary["example.org/gpu-core"], (200, 200));
        assert!(
            node_level(&RuntimeKitConfig::default(), &state).is_empty(),
            "GiB mode writes nothing into the Node"
        );
    }

    #[test]
    fn unhealthy_cards_leave_allocatable() {
        let mut state = node();
        state.faults.apply(&pb::HealthEvent {
            device_index: 0,
            device_uuid: "GPU-0".into(),
            active: true,
            fault: Some(fault(pb::FaultKind::EccDbe, 0, pb::Severity::Critical)),
            ..Default::default()
        });
        state.faults.apply(&pb::HealthEvent {
            device_index: 2,
            device_uuid: "GPU-2".into(),
            active: true,
            fault: Some(fault(pb::FaultKind::GpuLost, 0, pb::Severity::Critical)),
            ..Default::default()
        });
        let summary = summary(&RuntimeKitConfig::default(), &state);
        assert_eq!(summary["aliyun.com/gpu"], (3, 2));
        assert_eq!(summary["nvidia.com/gpu"], (2, 1));
        assert_eq!(summary["aliyun.com/gpu-core"], (200, 100));
        assert_eq!(summary["aliyun.com/gpu-memory"], (237, 79));
        assert_eq!(summary["aliyun.com/gpu-slice"], (7, 0));
        let mib = RuntimeKitConfig {
            memory_unit: MemoryUnit::MiB,
            ..RuntimeKitConfig::default()
        };
        assert_eq!(
            node_level(&mib, &state)["aliyun.com/gpu-memory"],
            81536,
            "node-level memory counts the healthy card only"
        );
    }

    #[test]
    fn cards_holding_slices_are_not_offered_whole() {
        let mut state = node();
        state.slices = vec![
            slice("share", 0, SliceMode::Tdm, SlicePhase::Reserved),
            slice("whole", 1, SliceMode::Whole, SlicePhase::Ready),
        ];
        let whole = &advertised(&RuntimeKitConfig::default())[0];
        let health: Vec<(String, String)> = devices(whole, &state)
            .into_iter()
            .map(|d| (d.id, d.health))
            .collect();
        assert_eq!(
            health,
            [
                ("GPU-0".to_owned(), "Unhealthy".to_owned()),
                // A Whole slice is its pod's own card: the kubelet must be able to give it.
                ("GPU-1".to_owned(), "Healthy".to_owned()),
                ("GPU-3".to_owned(), "Healthy".to_owned()),
            ]
        );
        // The compute shares of the sliced card stay offered.
        let core = &advertised(&RuntimeKitConfig::default())[2];
        assert!(
            devices(core, &state)
                .iter()
                .all(|d| d.health == dp::HEALTHY)
        );
    }

    #[test]
    fn a_card_given_whole_under_one_name_is_not_offered_under_the_other() {
        let mut state = node();
        state.held_whole.insert(
            1,
            vec![WholeHolder {
                resource: "nvidia.com/gpu".into(),
                pod: "ns/p".into(),
            }],
        );
        let resources = advertised(&RuntimeKitConfig::default());
        let healthy = |r: &Advertised| -> Vec<String> {
            devices(r, &state)
                .into_iter()
                .filter(|d| d.health == dp::HEALTHY)
                .map(|d| d.id)
                .collect()
        };
        assert_eq!(healthy(&resources[0]), ["GPU-0", "GPU-3"]);
        assert_eq!(healthy(&resources[1]), ["GPU-0", "GPU-1"]);
    }

    #[test]
    fn device_ids_follow_the_replica_convention_with_numa_nodes() {
        let state = node();
        let resources = advertised(&RuntimeKitConfig::default());
        let core = devices(&resources[2], &state);
        assert_eq!(core[0].id, "GPU-0::0");
        assert_eq!(core[199].id, "GPU-1::99");
        assert_eq!(core[150].topology, topology(Some(1)));
        assert_eq!(base_id(Kind::Core, &core[150].id), "GPU-1");
        assert_eq!(base_id(Kind::Whole { nvidia_only: true }, "GPU-1"), "GPU-1");
        let slices = devices(&resources[4], &state);
        assert_eq!(slices.last().map(|d| d.id.as_str()), Some("GPU-2::6"));
        let rdma = devices(&resources[5], &state);
        assert_eq!(rdma[0].id, "mlx5_0::0");
        assert_eq!(rdma[0].topology, topology(Some(0)));
        assert_eq!(rdma[200].topology, None, "NIC without a known NUMA node");
        assert!(core.iter().chain(&slices).all(|d| d.id.len() <= 63));
    }

    #[test]
    fn socket_names_are_distinct_per_resource() {
        let names: Vec<String> = advertised(&RuntimeKitConfig::default())
            .iter()
            .map(Advertised::socket_name)
            .collect();
        assert_eq!(names[0], "runtimekit-aliyun-com-gpu.sock");
        assert_eq!(names[1], "runtimekit-nvidia-com-gpu.sock");
        let unique: std::collections::BTreeSet<&String> = names.iter().collect();
        assert_eq!(unique.len(), names.len());
        let nvidia_prefix = RuntimeKitConfig {
            resource_prefix: "nvidia.com".into(),
            ..RuntimeKitConfig::default()
        };
        assert_eq!(
            advertised(&nvidia_prefix)
                .iter()
                .filter(|r| r.name == "nvidia.com/gpu")
                .count(),
            1,
            "the prefix nvidia.com does not advertise nvidia.com/gpu twice"
        );
    }
}
