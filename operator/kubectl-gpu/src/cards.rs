//! Each node's cards as the ledger has them: what its agent reports (TopologyGroups) and what is
//! allocated on it (GpuSlices).

use runtimekit_contract::mig::{MigTable, Placement, table_for};
use runtimekit_crds::{
    CardHealth, CardStatus, GpuSlice, SliceMode, Tier, TopologyGroup, parse_slice_memory,
};
use serde::Serialize;
use std::collections::BTreeMap;

/// One card of one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CardRow {
    pub node: String,
    pub index: u32,
    pub uuid: String,
    pub model: String,
    /// `Free`, `TDM`, `Whole`, `MIG`, or `Held` (given whole by the kubelet to another
    /// scheduler's pod).
    pub mode: String,
    /// Compute left for time-division shares, percent (cards that take them).
    pub core_free: Option<u32>,
    /// Memory left for time-division shares, MiB (cards that take them).
    pub memory_free_mib: Option<u64>,
    /// MIG instances, `profile@start`, reported or allocated.
    pub mig_instances: Vec<String>,
    /// How many more instances of each profile fit, `profile x count`.
    pub mig_free: Vec<String>,
    pub healthy: bool,
    pub health_reason: Option<String>,
    /// Pods on the card: `namespace/name`.
    pub pods: Vec<String>,
    /// The node's network position, widest tier first: `network pod / leaf switch / HyperNode`.
    pub position: String,
    pub numa_node: Option<u32>,
    pub pcie_switch: Option<String>,
    pub interconnect_group: Option<String>,
}

/// The cards of every node group in `groups`, with what `slices` allocate on them, by node and
/// card index.
pub fn rows(groups: &[TopologyGroup], slices: &[GpuSlice]) -> Vec<CardRow> {
    let by_name: BTreeMap<String, &TopologyGroup> = groups
        .iter()
        .filter_map(|g| Some((g.metadata.name.clone()?, g)))
        .collect();
    let mut rows = Vec::new();
    for group in groups.iter().filter(|g| g.spec.tier == Tier::Node) {
        let Some(node) = group.spec.node_name.clone() else {
            continue;
        };
        let position = position(group, &by_name);
        let cards = group.status.as_ref().map(|s| s.cards.as_slice());
        for card in cards.unwrap_or_default() {
            let on_card: Vec<&GpuSlice> = slices
                .iter()
                .filter(|s| s.spec.node_name.as_deref() == Some(node.as_str()))
                .filter(|s| s.spec.card.as_ref().is_some_and(|c| c.uuid == card.uuid))
                .collect();
            rows.push(row(&node, card, &on_card, &position));
        }
    }
    rows.sort_by(|a, b| (&a.node, a.index).cmp(&(&b.node, b.index)));
    rows
}

fn row(node: &str, card: &CardStatus, slices: &[&GpuSlice], position: &str) -> CardRow {
    let tdm: Vec<&&GpuSlice> = slices
        .iter()
        .filter(|s| s.spec.mode == SliceMode::Tdm)
        .collect();
    let whole = slices.iter().any(|s| s.spec.mode == SliceMode::Whole);
    let mode = if card.mig_enabled {
        "MIG"
    } else if whole {
        "Whole"
    } else if !tdm.is_empty() {
        "TDM"
    } else if !card.held_by.is_empty() {
        "Held"
    } else {
        "Free"
    };
    let takes_shares = !card.mig_enabled && !whole && card.held_by.is_empty();
    let core_used: u32 = tdm.iter().filter_map(|s| s.spec.core).sum();
    let memory_used: u64 = tdm
        .iter()
        .filter_map(|s| s.spec.memory.as_deref().and_then(parse_slice_memory))
        .sum();
    let (mig_instances, mig_free) = if card.mig_enabled {
        mig(card, slices)
    } else {
        (Vec::new(), Vec::new())
    };
    let mut pods: Vec<String> = slices
        .iter()
        .map(|s| format!("{}/{}", s.spec.pod.namespace, s.spec.pod.name))
        .chain(card.held_by.iter().cloned())
        .collect();
    pods.dedup();
    CardRow {
        node: node.into(),
        index: card.index,
        uuid: card.uuid.clone(),
        model: card.model.clone(),
        mode: mode.into(),
        core_free: takes_shares.then(|| 100u32.saturating_sub(core_used)),
        memory_free_mib: takes_shares.then(|| card.memory_mib.saturating_sub(memory_used)),
        mig_instances,
        mig_free,
        healthy: card.health == CardHealth::Healthy,
        health_reason: card.health_reason.clone(),
        pods,
        position: position.into(),
        numa_node: card.numa_node,
        pcie_switch: card.pcie_switch.clone(),
        interconnect_group: card.interconnect_group.clone(),
    }
}

/// A MIG card's instances (reported by the hardware, or allocated and not yet reported) and how
/// many more of each profile fit.
fn mig(card: &CardStatus, slices: &[&GpuSlice]) -> (Vec<String>, Vec<String>) {
    let mut instances: Vec<(String, u32)> = card
        .mig_instances
        .iter()
        .map(|i| (i.profile.clone(), i.placement_start))
        .collect();
    for slice in slices {
        if let (Some(profile), Some(start)) =
            (&slice.spec.mig_profile, slice.spec.mig_placement_start)
            && !instances.iter().any(|(p, s)| p == profile && *s == start)
        {
            instances.push((profile.clone(), start));
        }
    }
    instances.sort_by_key(|(_, start)| *start);
    let shown = instances.iter().map(|(p, s)| format!("{p}@{s}")).collect();
    let Some(table) = table_for(&card.model, card.memory_mib) else {
        return (shown, Vec::new());
    };
    (shown, free_profiles(table, &instances))
}

/// For each profile of `table`, how many more instances of it alone fit beside `instances`.
fn free_profiles(table: &MigTable, instances: &[(String, u32)]) -> Vec<String> {
    let placements: Vec<Placement> = instances
        .iter()
        .filter_map(|(name, start)| {
            Some(Placement {
                start: u8::try_from(*start).ok()?,
                memory_slices: table.profile(name)?.memory_slices,
            })
        })
        .collect();
    let occupied = MigTable::occupied(&placements);
    table
        .profiles
        .iter()
        .filter_map(|profile| {
            let mut mask = occupied;
            let mut count = 0;
            while let Some(&start) = table.legal_starts(profile, mask).first() {
                mask |= profile.mask_at(start);
                count += 1;
            }
            (count > 0).then(|| format!("{} x{count}", profile.name))
        })
        .collect()
}

/// The network position of `node` among `rows`, when it has one.
pub fn position_of<'a>(rows: &'a [CardRow], node: &str) -> Option<&'a str> {
    rows.iter()
        .find(|c| c.node == node)
        .map(|c| c.position.as_str())
        .filter(|p| *p != "-")
}

/// A node group's ancestors, widest first (`np-1/leaf-3/hn-7`), or `-` when it has none.
fn position(group: &TopologyGroup, by_name: &BTreeMap<String, &TopologyGroup>) -> String {
    let mut chain = Vec::new();
    let mut parent = group.spec.parent.clone();
    while let Some(name) = parent {
        if chain.contains(&name) || chain.len() > Tier::ALL.len() {
            break;
        }
        parent = by_name.get(&name).and_then(|g| g.spec.parent.clone());
        chain.push(name);
    }
    if chain.is_empty() {
        return "-".into();
    }
    chain.reverse();
    chain.join("/")
}

#[cfg(test)]
mod tests {
    use super::*;
    use runtimekit_crds::{
        CardRef, GpuSliceSpec, MigInstanceStatus, PodRef, TopologyGroupSpec, TopologyGroupStatus,
        Vendor,
    };

    fn card(index: u32, mig: bool) -> CardStatus {
        CardStatus {
            index,
            uuid: format!("GPU-{index}"),
            vendor: Vendor::Nvidia,
            model: "NVIDIA H800".into(),
            memory_mib: 81_920,
            mig_capable: true,
            mig_enabled: mig,
            health: CardHealth::Healthy,
            health_reason: None,
            pcie_switch: None,
            numa_node: Some(0),
            socket: None,
            interconnect_group: None,
            nvlink_peers: Vec::new(),
            mig_instances: Vec::new(),
            held_by: Vec::new(),
        }
    }

    fn group(
        name: &str,
        tier: Tier,
        parent: Option<&str>,
        cards: Vec<CardStatus>,
    ) -> TopologyGroup {
        let mut group = TopologyGroup::new(
            name,
            TopologyGroupSpec {
                tier,
                node_name: (tier == Tier::Node).then(|| name.to_owned()),
                parent: parent.map(Into::into),
                members: None,
            },
        );
        group.status = Some(TopologyGroupStatus {
            cards,
            ..TopologyGroupStatus::default()
        });
        group
    }

    fn slice(pod: &str, card: u32, mode: SliceMode) -> GpuSlice {
        GpuSlice::new(
            &format!("{pod}-{card}"),
            GpuSliceSpec {
                node_name: Some("n1".into()),
                card: Some(CardRef {
                    index: card,
                    uuid: format!("GPU-{card}"),
                }),
                mode,
                core: None,
                memory: None,
                slices: None,
                mig_profile: None,
                mig_placement_start: None,
                pod: PodRef {
                    namespace: "ml".into(),
                    name: pod.into(),
                    uid: format!("uid-{pod}"),
                    container: "app".into(),
                },
                replica_index: 0,
                gang: None,
                nics: Vec::new(),
            },
        )
    }

    #[test]
    fn each_card_shows_its_mode_its_room_and_its_pods() {
        let mut held = card(3, false);
        held.held_by = vec!["other/web".into()];
        let mut mig_card = card(6, true);
        mig_card.mig_instances = vec![MigInstanceStatus {
            profile: "3g.40gb".into(),
            placement_start: 4,
            gpu_instance_id: 2,
            device_uuid: None,
        }];
        let groups = [
            group("np-1", Tier::NetworkPod, None, vec![]),
            group("leaf-1", Tier::LeafSwitch, Some("np-1"), vec![]),
            group(
                "n1",
                Tier::Node,
                Some("leaf-1"),
                vec![
                    card(0, false),
                    card(1, false),
                    card(2, false),
                    held,
                    mig_card,
                ],
            ),
        ];
        let mut tdm_a = slice("a", 0, SliceMode::Tdm);
        tdm_a.spec.core = Some(30);
        tdm_a.spec.memory = Some("4Gi".into());
        let mut tdm_b = slice("b", 0, SliceMode::Tdm);
        tdm_b.spec.core = Some(50);
        let mut mig_b = slice("c", 6, SliceMode::Mig);
        mig_b.spec.mig_profile = Some("1g.10gb".into());
        mig_b.spec.mig_placement_start = Some(0);
        let slices = [tdm_a, tdm_b, slice("w", 1, SliceMode::Whole), mig_b];
        let rows = rows(&groups, &slices);
        let by = |i: u32| rows.iter().find(|r| r.index == i).expect("row");
        assert_eq!(rows.len(), 5);
        assert_eq!(
            (by(0).mode.as_str(), by(0).core_free, by(0).memory_free_mib),
            ("TDM", Some(20), Some(77_824))
        );
        assert_eq!(by(0).pods, ["ml/a", "ml/b"]);
        assert_eq!((by(1).mode.as_str(), by(1).core_free), ("Whole", None));
        assert_eq!((by(2).mode.as_str(), by(2).core_free), ("Free", Some(100)));
        assert_eq!(
            (by(3).mode.as_str(), by(3).pods.clone()),
            ("Held", vec!["other/web".to_owned()])
        );
        assert_eq!(by(6).mig_instances, ["1g.10gb@0", "3g.40gb@4"]);
        // Slices 0 and 4-7 are taken: 1g fits in 1, 2 and 3; 2g at 2; nothing larger.
        assert_eq!(by(6).mig_free, ["1g.10gb x3", "1g.20gb x1", "2g.20gb x1"]);
        assert!(rows.iter().all(|r| r.position == "np-1/leaf-1"));
    }
}
