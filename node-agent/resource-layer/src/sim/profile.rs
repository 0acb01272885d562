//! Hardware profiles of the simulated backend: YAML files under `profiles/`, embedded in the
//! binary, or loaded from any path. A profile names card models, the cards (PCI address,
//! PCIe switch, NUMA node, MIG mode, MIG instances present at first start), peer-link fabrics
//! and RDMA NICs. Loading checks everything, including the MIG instances against the
//! contract's MIG tables.

use crate::error::LayerError;
use crate::instances::{InstanceRecord, MigIds, ShareSpec, check_mig_placement};
use crate::topology::{CardLinks, apply_peer_links};
use crate::util::derived_uuid;
use runtimekit_contract::mig::{MigTable, table_for};
use runtimekit_proto::resource::v1alpha1 as pb;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

/// The MIG device UUID of a simulated GPU instance.
pub(super) fn mig_uuid(card_uuid: &str, gpu_instance_id: u32, created_ms: u64) -> String {
    format!(
        "MIG-{}",
        derived_uuid(&[
            card_uuid.as_bytes(),
            &gpu_instance_id.to_le_bytes(),
            &created_ms.to_le_bytes()
        ])
    )
}

/// The profiles shipped with the binary: (name, YAML).
pub const SHIPPED: [(&str, &str); 5] = [
    ("h800-8", include_str!("../../profiles/h800-8.yaml")),
    (
        "a100-40gb-8",
        include_str!("../../profiles/a100-40gb-8.yaml"),
    ),
    ("ppu-810e-8", include_str!("../../profiles/ppu-810e-8.yaml")),
    (
        "ppu-m890p-8",
        include_str!("../../profiles/ppu-m890p-8.yaml"),
    ),
    ("mi300x-8", include_str!("../../profiles/mi300x-8.yaml")),
];

/// A profile file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProfileFile {
    name: String,
    description: String,
    driver_version: String,
    numa_nodes: Vec<NumaFile>,
    models: BTreeMap<String, ModelSpec>,
    cards: Vec<CardFile>,
    #[serde(default)]
    fabrics: Vec<FabricFile>,
    #[serde(default)]
    nics: Vec<NicFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NumaFile {
    socket: u32,
    cpus: String,
}

/// The vendor of a model, as a profile writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VendorName {
    Nvidia,
    Ppu,
    Amd,
}

impl From<VendorName> for pb::Vendor {
    fn from(v: VendorName) -> Self {
        match v {
            VendorName::Nvidia => Self::Nvidia,
            VendorName::Ppu => Self::Ppu,
            VendorName::Amd => Self::Amd,
        }
    }
}

/// A card model and how it behaves in the simulation.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    pub vendor: VendorName,
    /// Product name as the driver reports it.
    pub product_name: String,
    pub memory_mib: u64,
    /// Memory the driver keeps for itself (reported as FB reserved).
    #[serde(default)]
    pub reserved_mib: u64,
    #[serde(default)]
    pub pci_device_id: u32,
    pub idle_power_w: f64,
    pub max_power_w: f64,
    pub idle_sm_clock_mhz: u32,
    pub max_sm_clock_mhz: u32,
    pub mem_clock_mhz: u32,
    /// Peak PCIe throughput per direction, GB/s.
    pub pcie_gb_per_s: f64,
    /// Peak throughput of one peer link per direction, GB/s.
    #[serde(default)]
    pub link_gb_per_s: f64,
    /// The model supports MIG (it must then have a table in runtimekit-contract).
    #[serde(default)]
    pub mig: bool,
    /// The model reports DCP ratios through NVML GPM (Hopper and newer).
    #[serde(default)]
    pub gpm: bool,
    /// The model remaps rows on memory errors (NVIDIA Ampere and newer).
    #[serde(default)]
    pub row_remapping: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CardFile {
    model: String,
    pci_bus_id: String,
    #[serde(default)]
    pcie_switch: String,
    numa_node: u32,
    #[serde(default)]
    mig_enabled: bool,
    /// MIG instances on the card at first start, with no key (as if made by hand).
    #[serde(default)]
    instances: Vec<MigFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MigFile {
    profile: String,
    start: u8,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum LinkKindName {
    Nvlink,
    Icn,
    Xgmi,
}

impl From<LinkKindName> for pb::LinkKind {
    fn from(k: LinkKindName) -> Self {
        match k {
            LinkKindName::Nvlink => Self::Nvlink,
            LinkKindName::Icn => Self::Icn,
            LinkKindName::Xgmi => Self::Xgmi,
        }
    }
}

/// A set of cards joined by peer links: through switches (`links_per_card` links from each
/// card to the switch fabric), or as a full mesh (`links_per_pair` direct links between every
/// two cards).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FabricFile {
    name: String,
    kind: LinkKindName,
    cards: Vec<u32>,
    #[serde(default)]
    links_per_card: u32,
    #[serde(default)]
    links_per_pair: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NicFile {
    name: String,
    pci_bus_id: String,
    #[serde(default)]
    pcie_switch: String,
    numa_node: u32,
    #[serde(default)]
    netdev: String,
    #[serde(default)]
    link_layer: String,
}

/// One simulated card, resolved.
#[derive(Debug, Clone)]
pub struct CardSpec {
    pub index: u32,
    pub model: ModelSpec,
    /// The MIG table, when the model has MIG.
    pub table: Option<&'static MigTable>,
    pub pci_bus_id: String,
    pub mig_enabled: bool,
    /// Topology without instances (same every call).
    pub topology: pb::Topology,
    /// MIG instances at first start: (profile, start).
    pub initial_instances: Vec<(String, u8)>,
}

impl CardSpec {
    /// Active peer links of the card.
    pub fn link_count(&self) -> u32 {
        u32::try_from(self.topology.links.iter().filter(|l| l.active).count()).unwrap_or(0)
    }
}

/// A loaded, checked profile.
#[derive(Debug, Clone)]
pub struct SimProfile {
    pub name: String,
    pub description: String,
    pub driver_version: String,
    pub cards: Vec<CardSpec>,
    pub nics: Vec<pb::Nic>,
    /// Every pair of cards, a < b.
    pub paths: Vec<pb::DevicePath>,
}

impl SimProfile {
    /// A shipped profile by name, or a YAML file by path.
    pub fn load(name_or_path: &str) -> Result<Self, LayerError> {
        if let Some((_, yaml)) = SHIPPED.iter().find(|(n, _)| *n == name_or_path) {
            return Self::from_yaml(yaml);
        }
        let path = Path::new(name_or_path);
        if path.is_file() {
            let yaml = std::fs::read_to_string(path)
                .map_err(|e| LayerError::Profile(format!("{}: {e}", path.display())))?;
            return Self::from_yaml(&yaml)
                .map_err(|e| LayerError::Profile(format!("{}: {e}", path.display())));
        }
        Err(LayerError::Profile(format!(
            "no shipped profile is called {name_or_path} and no such file exists (shipped: {})",
            shipped_names().join(", ")
        )))
    }

    /// A profile from YAML text.
    pub fn from_yaml(yaml: &str) -> Result<Self, LayerError> {
        let file: ProfileFile =
            serde_yaml::from_str(yaml).map_err(|e| LayerError::Profile(e.to_string()))?;
        resolve(file)
    }

    /// The MIG instances at first start, as records (unkeyed) for the given card UUIDs.
    pub fn initial_records(&self, uuids: &[String], now_ms: u64) -> Vec<InstanceRecord> {
        let mut records = Vec::new();
        for card in &self.cards {
            let Some(uuid) = uuids.get(card.index as usize) else {
                continue;
            };
            for (n, (profile, start)) in card.initial_instances.iter().enumerate() {
                let gpu_instance_id = u32::try_from(n).unwrap_or(0) + 1;
                records.push(InstanceRecord {
                    key: None,
                    device_index: card.index,
                    device_uuid: uuid.clone(),
                    spec: ShareSpec::Mig {
                        profile: profile.clone(),
                        start: *start,
                    },
                    mig: Some(MigIds {
                        gpu_instance_id,
                        compute_instance_id: 0,
                        device_uuid: mig_uuid(uuid, gpu_instance_id, now_ms),
                        no_compute_instance: false,
                    }),
                    created_unix_ms: now_ms,
                });
            }
        }
        records
    }
}

/// The names of the shipped profiles.
pub fn shipped_names() -> Vec<&'static str> {
    SHIPPED.iter().map(|(n, _)| *n).collect()
}

fn bad(msg: impl Into<String>) -> LayerError {
    LayerError::Profile(msg.into())
}

fn resolve(file: ProfileFile) -> Result<SimProfile, LayerError> {
    if file.name.trim().is_empty() {
        return Err(bad("name is empty"));
    }
    if file.cards.is_empty() {
        return Err(bad("no cards"));
    }
    if file.numa_nodes.is_empty() {
        return Err(bad("no NUMA nodes"));
    }
    let numa = |node: u32, what: &str| {
        file.numa_nodes
            .get(node as usize)
            .ok_or_else(|| bad(format!("{what}: NUMA node {node} is not listed")))
    };
    for node in &file.numa_nodes {
        if crate::topology::parse_cpulist(&node.cpus).is_none() {
            return Err(bad(format!("NUMA cpus {:?} is not a cpulist", node.cpus)));
        }
    }
    let count = u32::try_from(file.cards.len()).map_err(|_| bad("too many cards"))?;

    // Peer links per card, from the fabrics.
    let mut links: Vec<Vec<pb::Link>> = vec![Vec::new(); file.cards.len()];
    let mut groups: Vec<String> = vec![String::new(); file.cards.len()];
    for fabric in &file.fabrics {
        let switched = fabric.links_per_card > 0;
        if switched == (fabric.links_per_pair > 0) {
            return Err(bad(format!(
                "fabric {}: give exactly one of links_per_card (through a switch) and links_per_pair (mesh)",
                fabric.name
            )));
        }
        for &card in &fabric.cards {
            if card >= count {
                return Err(bad(format!("fabric {}: no card {card}", fabric.name)));
            }
        }
        for &card in &fabric.cards {
            let i = card as usize;
            if groups[i].is_empty() {
                groups[i] = fabric.name.clone();
            }
            let mut add = |remote: pb::LinkRemote, peer: Option<u32>, bus: String| {
                let mut link = pb::Link {
                    link: u32::try_from(links[i].len()).unwrap_or(0),
                    active: true,
                    remote_device_index: peer,
                    remote_pci_bus_id: bus,
                    ..Default::default()
                };
                link.set_kind(fabric.kind.into());
                link.set_remote(remote);
                links[i].push(link);
            };
            if switched {
                for _ in 0..fabric.links_per_card {
                    add(pb::LinkRemote::Switch, None, String::new());
                }
            } else {
                for &peer in fabric.cards.iter().filter(|&&p| p != card) {
                    let bus = file.cards[peer as usize].pci_bus_id.clone();
                    for _ in 0..fabric.links_per_pair {
                        add(pb::LinkRemote::Device, Some(peer), bus.clone());
                    }
                }
            }
        }
    }

    let mut cards = Vec::with_capacity(file.cards.len());
    for (i, card) in file.cards.iter().enumerate() {
        let index = u32::try_from(i).map_err(|_| bad("too many cards"))?;
        let what = format!("card {index}");
        let model = file
            .models
            .get(&card.model)
            .ok_or_else(|| bad(format!("{what}: no model {}", card.model)))?
            .clone();
        let node = numa(card.numa_node, &what)?;
        let table = if model.mig {
            if model.vendor != VendorName::Nvidia {
                return Err(bad(format!(
                    "model {}: only NVIDIA cards have MIG",
                    card.model
                )));
            }
            Some(
                table_for(&model.product_name, model.memory_mib).ok_or_else(|| {
                    bad(format!(
                        "model {}: runtimekit-contract has no MIG table for {} with {} MiB",
                        card.model, model.product_name, model.memory_mib
                    ))
                })?,
            )
        } else {
            None
        };
        if card.mig_enabled && table.is_none() {
            return Err(bad(format!(
                "{what}: MIG enabled, but {} has no MIG",
                card.model
            )));
        }
        if !card.instances.is_empty() && !card.mig_enabled {
            return Err(bad(format!(
                "{what}: MIG instances listed, but MIG is not enabled"
            )));
        }
        let mut initial: Vec<InstanceRecord> = Vec::new();
        if let Some(table) = table {
            for mig in &card.instances {
                let others: Vec<&InstanceRecord> = initial.iter().collect();
                check_mig_placement(table, index, &mig.profile, mig.start, &others)
                    .map_err(|e| bad(format!("{what}: {e}")))?;
                initial.push(InstanceRecord {
                    key: None,
                    device_index: index,
                    device_uuid: String::new(),
                    spec: ShareSpec::Mig {
                        profile: mig.profile.clone(),
                        start: mig.start,
                    },
                    mig: None,
                    created_unix_ms: 0,
                });
            }
        }
        cards.push(CardSpec {
            index,
            table,
            pci_bus_id: card.pci_bus_id.clone(),
            mig_enabled: card.mig_enabled,
            topology: pb::Topology {
                pcie_switch: card.pcie_switch.clone(),
                numa_node: Some(card.numa_node),
                socket: Some(node.socket),
                interconnect_group: groups[i].clone(),
                cpu_affinity: node.cpus.clone(),
                links: links[i].clone(),
            },
            initial_instances: card
                .instances
                .iter()
                .map(|m| (m.profile.clone(), m.start))
                .collect(),
            model,
        });
    }

    let mut nics = Vec::with_capacity(file.nics.len());
    for nic in &file.nics {
        let node = numa(nic.numa_node, &format!("NIC {}", nic.name))?;
        nics.push(pb::Nic {
            name: nic.name.clone(),
            pci_bus_id: nic.pci_bus_id.clone(),
            pcie_switch: nic.pcie_switch.clone(),
            numa_node: Some(nic.numa_node),
            socket: Some(node.socket),
            netdev: nic.netdev.clone(),
            link_layer: nic.link_layer.clone(),
            device_nodes: Vec::new(),
        });
    }

    let mut paths = Vec::new();
    for a in &cards {
        for b in cards.iter().filter(|b| b.index > a.index) {
            let (ta, tb) = (&a.topology, &b.topology);
            let level = if !ta.pcie_switch.is_empty() && ta.pcie_switch == tb.pcie_switch {
                pb::PathLevel::Pix
            } else if ta.numa_node == tb.numa_node {
                pb::PathLevel::Node
            } else {
                pb::PathLevel::Sys
            };
            let mut path = pb::DevicePath {
                a: a.index,
                b: b.index,
                ..Default::default()
            };
            path.set_pcie(level);
            paths.push(path);
        }
    }
    let card_links: Vec<CardLinks> = cards
        .iter()
        .map(|c| CardLinks {
            index: c.index,
            links: c.topology.links.clone(),
        })
        .collect();
    apply_peer_links(&mut paths, &card_links);

    Ok(SimProfile {
        name: file.name,
        description: file.description.trim().to_string(),
        driver_version: file.driver_version,
        cards,
        nics,
        paths,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shipped(name: &str) -> SimProfile {
        SimProfile::load(name).expect("shipped profile loads")
    }

    fn switches(p: &SimProfile) -> Vec<&str> {
        let mut s: Vec<&str> = p
            .cards
            .iter()
            .map(|c| c.topology.pcie_switch.as_str())
            .collect();
        s.sort_unstable();
        s.dedup();
        s
    }

    #[test]
    fn every_shipped_profile_loads_and_is_named_after_itself() {
        for (name, _) in SHIPPED {
            let p = shipped(name);
            assert_eq!(p.name, name);
            assert_eq!(p.cards.len(), 8, "{name}");
            assert!(!p.description.is_empty());
            assert_eq!(p.paths.len(), 28, "{name}: one path per pair");
        }
    }

    #[test]
    fn h800_has_nvswitch_four_nics_on_four_switches_two_numa_two_sockets() {
        let p = shipped("h800-8");
        assert!(
            p.cards
                .iter()
                .all(|c| c.model.product_name == "NVIDIA H800")
        );
        assert!(
            p.cards
                .iter()
                .all(|c| c.table.map(|t| t.model) == Some("H800-80GB"))
        );
        // NVSwitch: every card has 8 switch links and every pair 8 links through it.
        for card in &p.cards {
            assert_eq!(card.link_count(), 8);
            assert!(
                card.topology
                    .links
                    .iter()
                    .all(|l| l.remote() == pb::LinkRemote::Switch)
            );
            assert_eq!(card.topology.interconnect_group, "nvswitch");
        }
        assert!(p.paths.iter().all(|x| x.links == 8 && x.via_switch));
        assert_eq!(p.nics.len(), 4);
        let mut nic_switches: Vec<&str> = p.nics.iter().map(|n| n.pcie_switch.as_str()).collect();
        nic_switches.sort_unstable();
        assert_eq!(nic_switches, switches(&p));
        assert_eq!(switches(&p).len(), 4);
        let numa: std::collections::BTreeSet<_> =
            p.cards.iter().map(|c| c.topology.numa_node).collect();
        let sockets: std::collections::BTreeSet<_> =
            p.cards.iter().map(|c| c.topology.socket).collect();
        assert_eq!(numa.len(), 2);
        assert_eq!(sockets.len(), 2);
        // Some cards are in MIG mode, the others are not.
        let mig = p.cards.iter().filter(|c| c.mig_enabled).count();
        assert!(mig > 0 && mig < 8, "{mig}");
    }

    #[test]
    fn a100_40gb_uses_the_40gb_table() {
        let p = shipped("a100-40gb-8");
        assert!(
            p.cards
                .iter()
                .all(|c| c.table.map(|t| t.model) == Some("A100-40GB"))
        );
        assert!(p.cards.iter().any(|c| c.mig_enabled));
    }

    #[test]
    fn ppu_810e_has_two_groups_of_four() {
        let p = shipped("ppu-810e-8");
        let groups: Vec<&str> = p
            .cards
            .iter()
            .map(|c| c.topology.interconnect_group.as_str())
            .collect();
        assert_eq!(&groups[..4], ["ppu-group-0"; 4]);
        assert_eq!(&groups[4..], ["ppu-group-1"; 4]);
        assert!(p.cards.iter().all(|c| c.model.vendor == VendorName::Ppu));
        assert!(p.cards.iter().all(|c| c.table.is_none()));
        // Cards of one group are linked, cards of different groups are not.
        for path in &p.paths {
            let same = (path.a < 4) == (path.b < 4);
            assert_eq!(path.links > 0, same, "{path:?}");
        }
    }

    #[test]
    fn ppu_m890p_has_eight_cards_on_four_switches_with_nics() {
        let p = shipped("ppu-m890p-8");
        assert_eq!(switches(&p).len(), 4);
        for switch in switches(&p) {
            assert!(
                p.nics.iter().any(|n| n.pcie_switch == switch),
                "no NIC under {switch}"
            );
        }
        let pix = p
            .paths
            .iter()
            .filter(|x| x.pcie() == pb::PathLevel::Pix)
            .count();
        assert_eq!(pix, 4, "two cards per switch");
        assert!(p.paths.iter().any(|x| x.pcie() == pb::PathLevel::Sys));
    }

    #[test]
    fn mi300x_is_amd_with_an_xgmi_mesh() {
        let p = shipped("mi300x-8");
        assert!(p.cards.iter().all(|c| c.model.vendor == VendorName::Amd));
        assert!(
            p.paths
                .iter()
                .all(|x| x.links == 1 && x.link_kind() == pb::LinkKind::Xgmi && !x.via_switch)
        );
    }

    const MINIMAL: &str = r#"
name: test
description: one card
driver_version: "1"
numa_nodes: [{socket: 0, cpus: "0-7"}]
models:
  l40s: {vendor: nvidia, product_name: NVIDIA L40S, memory_mib: 46068, idle_power_w: 30,
         max_power_w: 350, idle_sm_clock_mhz: 210, max_sm_clock_mhz: 2520, mem_clock_mhz: 9001,
         pcie_gb_per_s: 32}
cards:
  - {model: l40s, pci_bus_id: "00000000:01:00.0", numa_node: 0}
"#;

    #[test]
    fn bad_profiles_are_refused_with_the_reason() {
        assert!(SimProfile::from_yaml(MINIMAL).is_ok());
        let cases = [
            (
                MINIMAL.replace("numa_node: 0}", "numa_node: 1}"),
                "NUMA node 1",
            ),
            (
                MINIMAL.replace("numa_node: 0}", "numa_node: 0, mig_enabled: true}"),
                "has no MIG",
            ),
            (
                MINIMAL.replace("pcie_gb_per_s: 32}", "pcie_gb_per_s: 32, mig: true}"),
                "no MIG table for NVIDIA L40S",
            ),
            (MINIMAL.replace("model: l40s,", "model: x,"), "no model x"),
            (MINIMAL.replace("driver_version", "driver"), "unknown field"),
        ];
        for (yaml, want) in cases {
            let err = SimProfile::from_yaml(&yaml).expect_err(want);
            assert!(err.to_string().contains(want), "{err} lacks {want}");
        }
        let err = SimProfile::load("no-such-profile").expect_err("unknown");
        assert!(err.to_string().contains("shipped: h800-8"), "{err}");
    }

    #[test]
    fn initial_mig_instances_are_checked() {
        let a30 = r#"
name: a30
description: A30 with instances
driver_version: "1"
numa_nodes: [{socket: 0, cpus: "0-7"}]
models:
  a30: {vendor: nvidia, product_name: NVIDIA A30, memory_mib: 24576, idle_power_w: 30,
        max_power_w: 165, idle_sm_clock_mhz: 210, max_sm_clock_mhz: 1440, mem_clock_mhz: 1215,
        pcie_gb_per_s: 32, mig: true}
cards:
  - {model: a30, pci_bus_id: "00000000:01:00.0", numa_node: 0, mig_enabled: true,
     instances: [{profile: 2g.12gb, start: 0}, {profile: 1g.6gb, start: 3}]}
"#;
        let p = SimProfile::from_yaml(a30).expect("valid");
        assert_eq!(p.cards[0].table.map(|t| t.model), Some("A30-24GB"));
        assert_eq!(p.cards[0].initial_instances.len(), 2);
        let overlapping = a30.replace("start: 3}", "start: 1}");
        let err = SimProfile::from_yaml(&overlapping).expect_err("overlap");
        assert!(err.to_string().contains("overlaps"), "{err}");
    }

    #[test]
    fn profiles_load_from_a_path() {
        let dir = crate::util::testdir::TestDir::new("profile");
        let path = dir.path().join("one.yaml");
        std::fs::write(&path, MINIMAL).expect("write");
        let p = SimProfile::load(path.to_str().expect("utf-8")).expect("loads");
        assert_eq!(p.name, "test");
        std::fs::write(&path, "name: [").expect("write");
        let err = SimProfile::load(path.to_str().expect("utf-8")).expect_err("bad yaml");
        assert!(err.to_string().contains("one.yaml"), "{err}");
    }
}
