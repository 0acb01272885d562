//! Where a pod's whole cards and NICs sit inside their node: the interconnect groups the cards
//! belong to (a PPU 810E's groups of four) and the PCIe switches that pair cards with RDMA NICs
//! (a PPU M890P's card+NIC sets), in the words `kubectl gpu explain` prints. Pure.

use crate::cards::CardRow;
use crate::slices::SliceRow;
use runtimekit_crds::NicStatus;
use std::collections::BTreeMap;

/// The sentences on the node-internal topology of what `slices` hold, given the node's `cards`
/// and `nics`: nothing for a pod of one card and no NIC, where there is nothing to pick.
pub fn layout_words(slices: &[SliceRow], cards: &[CardRow], nics: &[NicStatus]) -> Vec<String> {
    let mut held: Vec<&CardRow> = slices
        .iter()
        .filter(|s| s.mode == "Whole")
        .filter_map(|s| cards.iter().find(|c| Some(c.index) == s.card))
        .collect();
    held.sort_by_key(|c| c.index);
    held.dedup_by_key(|c| c.index);
    let mut held_nics: Vec<&str> = slices
        .iter()
        .flat_map(|s| s.nics.iter().map(String::as_str))
        .collect();
    held_nics.sort_unstable();
    held_nics.dedup();
    let mut words = Vec::new();
    if held.len() > 1 {
        words.extend(group_words(&held));
    }
    if !held_nics.is_empty() {
        words.push(switch_words(&held, &held_nics, nics));
    }
    words
}

/// The interconnect groups of the held cards, where the node reports any.
fn group_words(held: &[&CardRow]) -> Option<String> {
    let mut groups: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    for card in held {
        groups
            .entry(card.interconnect_group.as_deref()?)
            .or_default()
            .push(card.index);
    }
    Some(match groups.len() {
        1 => {
            let (group, _) = groups.first_key_value()?;
            format!(
                "Its {} cards ({}) are all of interconnect group {group}: the fastest links between them the node has.",
                held.len(),
                list(held.iter().map(|c| c.index))
            )
        }
        _ => format!(
            "Its cards span interconnect groups {}: no one group had room for all of them.",
            groups
                .iter()
                .map(|(group, indexes)| format!("{group} (cards {})", list(indexes.iter())))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    })
}

/// The held cards and NICs by PCIe switch (unknown switches shown as `-`).
fn switch_words(held: &[&CardRow], held_nics: &[&str], nics: &[NicStatus]) -> String {
    let mut switches: BTreeMap<String, (Vec<u32>, Vec<&str>)> = BTreeMap::new();
    for card in held {
        let switch = card.pcie_switch.clone().unwrap_or_else(|| "-".into());
        switches.entry(switch).or_default().0.push(card.index);
    }
    for name in held_nics {
        let switch = nics
            .iter()
            .find(|n| n.name == *name)
            .and_then(|n| n.pcie_switch.clone())
            .unwrap_or_else(|| "-".into());
        switches.entry(switch).or_default().1.push(name);
    }
    let sets: Vec<String> = switches
        .iter()
        .map(|(switch, (cards, nics))| {
            let mut parts = Vec::new();
            if !cards.is_empty() {
                parts.push(format!("cards {}", list(cards.iter())));
            }
            if !nics.is_empty() {
                parts.push(format!("NIC {}", nics.join(", ")));
            }
            format!("{switch} ({})", parts.join(" + "))
        })
        .collect();
    let paired = switches
        .values()
        .all(|(cards, nics)| !cards.is_empty() && !nics.is_empty());
    format!(
        "By PCIe switch: {}; {}.",
        sets.join(", "),
        if paired {
            "every card shares its switch with a NIC"
        } else {
            "not every card shares a switch with a NIC (the pick fell back to NUMA node or socket)"
        }
    )
}

fn list(items: impl Iterator<Item = impl ToString>) -> String {
    items.map(|i| i.to_string()).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn card(index: u32, group: Option<&str>, switch: &str) -> CardRow {
        CardRow {
            node: "n1".into(),
            index,
            uuid: format!("GPU-{index}"),
            model: "PPU".into(),
            mode: "Whole".into(),
            core_free: None,
            memory_free_mib: None,
            mig_instances: Vec::new(),
            mig_free: Vec::new(),
            healthy: true,
            health_reason: None,
            pods: Vec::new(),
            position: String::new(),
            numa_node: None,
            pcie_switch: Some(switch.into()),
            interconnect_group: group.map(Into::into),
        }
    }

    fn whole(card: u32, nics: &[&str]) -> SliceRow {
        let mut row = crate::slices::tests::row("train", card);
        row.mode = "Whole".into();
        row.nics = nics.iter().map(|n| (*n).to_owned()).collect();
        row
    }

    fn nic(name: &str, switch: &str) -> NicStatus {
        NicStatus {
            name: name.into(),
            pcie_switch: Some(switch.into()),
            numa_node: None,
            socket: None,
        }
    }

    #[test]
    fn cards_of_one_interconnect_group_are_said_to_be_so() {
        let cards: Vec<CardRow> = (0..8)
            .map(|i| card(i, Some(if i < 4 { "g0" } else { "g1" }), "sw0"))
            .collect();
        let slices: Vec<SliceRow> = (4..8).map(|i| whole(i, &[])).collect();
        assert_eq!(
            layout_words(&slices, &cards, &[]),
            [
                "Its 4 cards (4, 5, 6, 7) are all of interconnect group g1: the fastest links between them the node has."
            ]
        );
        let split = [whole(3, &[]), whole(4, &[])];
        assert_eq!(
            layout_words(&split, &cards, &[]),
            [
                "Its cards span interconnect groups g0 (cards 3), g1 (cards 4): no one group had room for all of them."
            ]
        );
    }

    #[test]
    fn cards_and_nics_are_shown_by_pcie_switch() {
        let cards = [
            card(0, None, "sw0"),
            card(1, None, "sw0"),
            card(2, None, "sw1"),
        ];
        let nics = [
            nic("mlx5_0", "sw0"),
            nic("mlx5_1", "sw1"),
            nic("mlx5_3", "sw3"),
        ];
        let paired = [whole(0, &["mlx5_0"]), whole(1, &["mlx5_0"])];
        assert_eq!(
            layout_words(&paired, &cards, &nics),
            [
                "By PCIe switch: sw0 (cards 0, 1 + NIC mlx5_0); every card shares its switch with a NIC."
            ]
        );
        let apart = [whole(2, &["mlx5_3"])];
        assert_eq!(
            layout_words(&apart, &cards, &nics),
            [
                "By PCIe switch: sw1 (cards 2), sw3 (NIC mlx5_3); not every card shares a switch with a NIC (the pick fell back to NUMA node or socket)."
            ]
        );
    }

    #[test]
    fn one_card_without_nics_needs_no_words() {
        let cards = [card(0, Some("g0"), "sw0")];
        assert!(layout_words(&[whole(0, &[])], &cards, &[]).is_empty());
        // Time-division shares pick no set.
        let mut share = whole(0, &[]);
        share.mode = "TDM".into();
        assert!(layout_words(&[share.clone(), share], &cards, &[]).is_empty());
    }
}
