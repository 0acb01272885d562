//! Topology: where each card sits (PCIe switch, NUMA node and socket from sysfs, CPU
//! affinity, NVLink links with their far end), the PCIe level between every two cards
//! (NVML's common ancestor: PIX/PXB/PHB/NODE/SYS), their peer links and interconnect groups.

use super::Shared;
use super::convert::{link_remote, path_level};
use super::raw;
use crate::topology::{CardLinks, apply_peer_links, cpulist_from_mask, link_groups, parse_cpulist};
use nvml_wrapper::Device;
use nvml_wrapper_sys::bindings::NVML_NVLINK_MAX_LINKS;
use runtimekit_proto::resource::v1alpha1 as pb;

impl Shared {
    /// Where a card sits; its interconnect group is set once every card is known.
    pub(super) fn topology(&self, dev: &Device<'_>, bus_id: &str) -> pb::Topology {
        let place = self.sysfs.pci_place(bus_id);
        // NVML's ideal CPU affinity of the card, else the CPUs of its NUMA node.
        let cpu_affinity = dev
            .cpu_affinity(16)
            .ok()
            .map(|words| cpulist_from_mask(&words))
            .filter(|list| !list.is_empty())
            .or_else(|| place.numa_node.and_then(|n| self.sysfs.numa_cpulist(n)))
            .unwrap_or_default();
        let socket = place.socket.or_else(|| {
            let first = parse_cpulist(&cpu_affinity)?.first().copied()?;
            self.sysfs.socket_of_cpu(first)
        });
        pb::Topology {
            pcie_switch: place.pcie_switch.unwrap_or_default(),
            numa_node: place.numa_node,
            socket,
            interconnect_group: String::new(),
            cpu_affinity,
            links: self.links(dev),
        }
    }

    /// The NVLink links of a card, each with its far end (and the peer card, if it is one).
    fn links(&self, dev: &Device<'_>) -> Vec<pb::Link> {
        let mut out = Vec::new();
        for l in 0..NVML_NVLINK_MAX_LINKS {
            let link = dev.link_wrapper_for(l);
            let Ok(active) = link.is_active() else {
                continue;
            };
            let remote_bus = if active {
                link.remote_pci_info().map(|p| p.bus_id).unwrap_or_default()
            } else {
                String::new()
            };
            let remote = raw::nvlink_remote_type(&self.nvml, dev, l)
                .map(link_remote)
                .unwrap_or(pb::LinkRemote::Unspecified);
            let mut wire = pb::Link {
                link: l,
                active,
                remote_device_index: (remote == pb::LinkRemote::Device)
                    .then(|| self.index_of_bus(&remote_bus))
                    .flatten(),
                remote_pci_bus_id: remote_bus,
                ..Default::default()
            };
            wire.set_kind(pb::LinkKind::Nvlink);
            wire.set_remote(remote);
            out.push(wire);
        }
        out
    }

    /// The paths between every two cards that answer (PCIe level and peer links); sets each
    /// card's interconnect group (its NVLink island).
    pub(super) fn paths_and_groups(&self, devices: &mut [pb::Device]) -> Vec<pb::DevicePath> {
        let answering: Vec<&pb::Device> = devices
            .iter()
            .filter(|d| d.state() == pb::DeviceState::Ok)
            .collect();
        let mut paths = Vec::new();
        for (i, a) in answering.iter().enumerate() {
            for b in &answering[i + 1..] {
                let level = self.watch.call(a.index, &a.uuid, || {
                    let da = self.nvml.device_by_index(a.index).ok()?;
                    let db = self.nvml.device_by_index(b.index).ok()?;
                    self.nvml.topology_common_ancestor(&da, &db).ok()
                });
                let mut path = pb::DevicePath {
                    a: a.index,
                    b: b.index,
                    ..Default::default()
                };
                path.set_pcie(level.map_or(pb::PathLevel::Unspecified, path_level));
                paths.push(path);
            }
        }
        let card_links: Vec<CardLinks> = answering
            .iter()
            .map(|d| CardLinks {
                index: d.index,
                links: d
                    .topology
                    .as_ref()
                    .map(|t| t.links.clone())
                    .unwrap_or_default(),
            })
            .collect();
        apply_peer_links(&mut paths, &card_links);
        let indexes: Vec<u32> = answering.iter().map(|d| d.index).collect();
        let groups = link_groups(&indexes, &paths, "nvlink");
        for device in devices {
            if let (Some(group), Some(topology)) =
                (groups.get(&device.index), device.topology.as_mut())
            {
                topology.interconnect_group = group.clone();
            }
        }
        paths
    }
}
