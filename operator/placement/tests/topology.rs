//! Intra-node topology: PPU 810E interconnect groups, M890P GPU and NIC joint sets, NVIDIA
//! NVLink.

mod common;

use common::*;
use runtimekit_placement::*;

/// An 810E node: eight cards in two interconnect groups of four.
fn ppu_810e_node() -> Vec<CardInfo> {
    (0..8)
        .map(|i| ppu_810e(i, if i < 4 { "group-a" } else { "group-b" }))
        .collect()
}

#[test]
fn seed_810e_four_cards_come_from_one_group() {
    let mut c = cluster();
    add(&mut c, node("ppu"), &ppu_810e_node(), &[]);
    // One card of group A is busy: four cards fit only in group B.
    place(&mut c, &tdm("busy", Some(10), None));
    let busy = c.cards("ppu").expect("node");
    let used: Vec<u32> = busy
        .iter()
        .filter(|v| v.tdm_shares > 0)
        .map(|v| v.index)
        .collect();
    assert_eq!(used.len(), 1);
    let d = place(&mut c, &whole("train", 4));
    let cards = indexes(&d);
    let group_of = |i: u32| i / 4;
    assert!(
        cards.iter().all(|&i| group_of(i) == group_of(cards[0])),
        "{cards:?} spans groups"
    );
    assert_ne!(group_of(cards[0]), group_of(used[0]));
    assert_eq!(d.containers[0].locality, Some(Locality::InterconnectGroup));
}

#[test]
fn seed_810e_two_cards_take_the_tightest_group_and_eight_span_both() {
    let mut c = cluster();
    add(&mut c, node("ppu"), &ppu_810e_node(), &[]);
    place(&mut c, &whole("one", 1));
    // Group A has three free, group B four: a pair goes to A, keeping B whole.
    let pair = place(&mut c, &whole("pair", 2));
    assert!(
        indexes(&pair).iter().all(|&i| i < 4),
        "{:?}",
        indexes(&pair)
    );
    let four = place(&mut c, &whole("four", 4));
    assert_eq!(indexes(&four), [4, 5, 6, 7]);
    c.release("one");
    c.release("pair");
    c.release("four");
    let eight = place(&mut c, &whole("eight", 8));
    assert_eq!(indexes(&eight), [0, 1, 2, 3, 4, 5, 6, 7]);
    assert_eq!(eight.containers[0].locality, Some(Locality::AcrossGroups));
}

fn busy(c: &mut Cluster, node: &str, cards: &[u32]) {
    for &i in cards {
        c.upsert_slice(SliceInput {
            pod_uid: format!("busy-{node}-{i}"),
            container: "main".into(),
            replica: 0,
            node: node.into(),
            card_index: i,
            card_uuid: String::new(),
            share: Share::Whole,
        });
    }
}

#[test]
fn seed_810e_single_cards_pack_into_one_group() {
    let mut c = cluster();
    add(&mut c, node("ppu"), &ppu_810e_node(), &[]);
    let mut used: Vec<u32> = (0..3)
        .flat_map(|i| indexes(&place(&mut c, &whole(&format!("one-{i}"), 1))))
        .collect();
    used.sort();
    assert!(used.iter().all(|&i| i / 4 == used[0] / 4), "{used:?}");
    let d = place(&mut c, &whole("four", 4));
    assert_eq!(d.containers[0].locality, Some(Locality::InterconnectGroup));
}

#[test]
fn seed_810e_falls_back_across_groups_only_when_no_group_holds_the_request() {
    let mut c = cluster();
    add(&mut c, node("ppu"), &ppu_810e_node(), &[]);
    // Three free in group A, two in group B: no group holds four.
    busy(&mut c, "ppu", &[0, 4, 5]);
    let d = place(&mut c, &whole("four", 4));
    assert_eq!(d.containers[0].locality, Some(Locality::AcrossGroups));
    assert_eq!(
        indexes(&d),
        [1, 2, 3, 6],
        "the fuller group first, spanning two groups"
    );
}

#[test]
fn seed_810e_prefers_a_node_that_keeps_four_cards_in_one_group() {
    let mut c = cluster();
    add(&mut c, node("fuller"), &ppu_810e_node(), &[]);
    add(&mut c, node("emptier"), &ppu_810e_node(), &[]);
    // "fuller": cards 0, 1, 4, 5 busy, so two free per group.
    busy(&mut c, "fuller", &[0, 1, 4, 5]);
    let d = place(&mut c, &whole("train", 4));
    assert_eq!(d.node, "emptier");
    assert_eq!(d.containers[0].locality, Some(Locality::InterconnectGroup));
    // A pair still packs onto the fuller node, whose groups each hold two.
    let pair = place(&mut c, &whole("pair", 2));
    assert_eq!(pair.node, "fuller");
}

/// An M890P node: four PCIe switches of two GPUs and one NIC; switches 0-1 in NUMA node and
/// socket 0, switches 2-3 in NUMA node and socket 1.
fn m890p_node() -> (Vec<CardInfo>, Vec<NicInfo>) {
    let cards = (0..8)
        .map(|i| m890p(i, &format!("sw{}", i / 2), i / 4, i / 4))
        .collect();
    let nics = (0..4)
        .map(|s| nic(&format!("mlx5_{s}"), &format!("sw{s}"), s / 2, s / 2))
        .collect();
    (cards, nics)
}

#[test]
fn seed_m890p_four_cards_and_rdma_share_a_numa_node_with_their_nics() {
    let mut c = cluster();
    let (cards, nics) = m890p_node();
    add(&mut c, node("m890p"), &cards, &nics);
    let d = place(&mut c, &with_rdma(whole("train", 4)));
    let placed = &d.containers[0];
    assert_eq!(placed.locality, Some(Locality::NumaNode));
    let cards = indexes(&d);
    assert!(cards.iter().all(|&i| i / 4 == cards[0] / 4), "{cards:?}");
    let numa = cards[0] / 4;
    let want: Vec<String> = (0..2).map(|s| format!("mlx5_{}", numa * 2 + s)).collect();
    assert_eq!(placed.nics, want);
}

#[test]
fn seed_m890p_pairs_share_one_pcie_switch_and_its_nic() {
    let mut c = cluster();
    let (cards, nics) = m890p_node();
    add(&mut c, node("m890p"), &cards, &nics);
    place(&mut c, &with_rdma(whole("one", 1)));
    let d = place(&mut c, &with_rdma(whole("pair", 2)));
    let placed = &d.containers[0];
    assert_eq!(placed.locality, Some(Locality::PcieSwitch));
    let cards = indexes(&d);
    assert_eq!(cards[0] / 2, cards[1] / 2, "{cards:?}");
    assert_eq!(placed.nics, [format!("mlx5_{}", cards[0] / 2)]);
}

#[test]
fn seed_m890p_switches_holding_four_gpus_keep_the_set_on_one_switch() {
    let mut c = cluster();
    let cards: Vec<CardInfo> = (0..8)
        .map(|i| m890p(i, &format!("sw{}", i / 4), i / 4, i / 4))
        .collect();
    let nics = vec![nic("mlx5_0", "sw0", 0, 0), nic("mlx5_1", "sw1", 1, 1)];
    add(&mut c, node("m890p"), &cards, &nics);
    let d = place(&mut c, &with_rdma(whole("train", 4)));
    assert_eq!(d.containers[0].locality, Some(Locality::PcieSwitch));
    let cards = indexes(&d);
    assert!(cards == [0, 1, 2, 3] || cards == [4, 5, 6, 7], "{cards:?}");
}

#[test]
fn seed_m890p_falls_back_to_socket_then_cross_socket() {
    let mut c = cluster();
    // Two NUMA nodes per socket: switch s in NUMA node s, socket s / 2.
    let cards: Vec<CardInfo> = (0..8)
        .map(|i| m890p(i, &format!("sw{}", i / 2), i / 2, i / 4))
        .collect();
    let nics: Vec<NicInfo> = (0..4)
        .map(|s| nic(&format!("mlx5_{s}"), &format!("sw{s}"), s, s / 2))
        .collect();
    add(&mut c, node("m890p"), &cards, &nics);
    let d = place(&mut c, &with_rdma(whole("four", 4)));
    assert_eq!(d.containers[0].locality, Some(Locality::Socket));
    let d = place(&mut c, &with_rdma(whole("three", 3)));
    assert_eq!(d.containers[0].locality, Some(Locality::Socket));
    c.release("four");
    c.release("three");
    // No socket holds six: the set crosses sockets, with the NICs nearest its cards.
    let d = place(&mut c, &with_rdma(whole("six", 6)));
    assert_eq!(d.containers[0].locality, Some(Locality::CrossSocket));
    assert_eq!(indexes(&d), [0, 1, 2, 3, 4, 5]);
    assert_eq!(d.containers[0].nics, ["mlx5_0", "mlx5_1", "mlx5_2"]);
}

#[test]
fn rdma_needs_a_nic_on_the_node() {
    let mut c = cluster();
    let (cards, _) = m890p_node();
    add(&mut c, node("no-nic"), &cards, &[]);
    let e = c.decide(&with_rdma(whole("train", 4))).expect_err("no NIC");
    assert_eq!(
        e.to_string(),
        "0/1 nodes are available: 1 node(s) had no RDMA NIC for aliyun.com/rdma."
    );
    assert!(c.decide(&whole("train", 4)).is_ok());
}

#[test]
fn shares_with_rdma_get_the_nic_nearest_their_card() {
    let mut c = cluster();
    let (cards, nics) = m890p_node();
    add(&mut c, node("m890p"), &cards, &nics);
    let d = place(&mut c, &with_rdma(tdm("share", Some(20), Some(8))));
    let card = indexes(&d)[0];
    assert_eq!(d.containers[0].nics, [format!("mlx5_{}", card / 2)]);
}

/// A DGX-1-like hybrid cube mesh: two quads fully linked inside (two links between some
/// pairs), one link between matching cards of the two quads.
fn cube_mesh() -> Vec<CardInfo> {
    let mut links: Vec<Vec<u32>> = vec![Vec::new(); 8];
    let mut link = |a: u32, b: u32, n: usize| {
        for _ in 0..n {
            links[a as usize].push(b);
            links[b as usize].push(a);
        }
    };
    for quad in [0u32, 4] {
        link(quad, quad + 1, 2);
        link(quad, quad + 2, 1);
        link(quad, quad + 3, 1);
        link(quad + 1, quad + 2, 1);
        link(quad + 1, quad + 3, 1);
        link(quad + 2, quad + 3, 2);
    }
    for i in 0..4 {
        link(i, i + 4, 1);
    }
    (0..8)
        .map(|i| CardInfo {
            nvlink_peers: links[i as usize].clone(),
            ..h800(i)
        })
        .collect()
}

#[test]
fn nvidia_multi_card_requests_take_the_best_linked_set() {
    let mut c = cluster();
    add(&mut c, node("dgx"), &cube_mesh(), &[]);
    // Card 1 busy: the best four are the intact quad.
    busy(&mut c, "dgx", &[1]);
    let d = place(&mut c, &whole("four", 4));
    assert_eq!(indexes(&d), [4, 5, 6, 7]);
    assert_eq!(
        d.containers[0].locality,
        Some(Locality::NvLink { links: 8 })
    );
    // Of the rest (0, 2, 3), the pair with two links.
    let d = place(&mut c, &whole("pair", 2));
    assert_eq!(indexes(&d), [2, 3]);
    assert_eq!(
        d.containers[0].locality,
        Some(Locality::NvLink { links: 2 })
    );
}
