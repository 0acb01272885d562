//! Gangs: one decision for every member, in the lowest network tier that holds them all,
//! never across network pods; reservations held until confirmed or rolled back.

mod common;

use common::*;
use runtimekit_contract::{CardRequest, WholeCardName};
use runtimekit_placement::*;

/// Two network pods; each has two leaf switches of two HyperNodes of two nodes with four
/// cards and one NIC. Node names: `<np>-<leaf>-<hn>-<n>`, e.g. `a-1-1-1`.
fn fabric() -> Cluster {
    let mut c = cluster();
    for np in ["a", "b"] {
        for leaf in 1..=2 {
            for hn in 1..=2 {
                for n in 1..=2 {
                    let name = format!("{np}-{leaf}-{hn}-{n}");
                    let mut info = node(&name);
                    info.position = NetworkPosition {
                        network_pod: Some(format!("np-{np}")),
                        leaf_switch: Some(format!("leaf-{np}{leaf}")),
                        hyper_node: Some(format!("hn-{np}{leaf}{hn}")),
                    };
                    let cards: Vec<CardInfo> = (0..4)
                        .map(|i| m890p(i, &format!("sw{}", i / 2), 0, 0))
                        .collect();
                    add(&mut c, info, &cards, &[nic("mlx5_0", "sw0", 0, 0)]);
                }
            }
        }
    }
    c
}

/// The seed: JobSet `gang-nccl-test`, seven workers with one card and RDMA each.
fn seed_members() -> Vec<PodInput> {
    (0..7)
        .map(|i| PodInput {
            gang: Some("gang-nccl-test".into()),
            ..with_rdma(whole(&format!("worker-{i}"), 1))
        })
        .collect()
}

fn fill(c: &mut Cluster, node: &str, cards: u32) {
    for i in 0..cards {
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
fn seed_gang_of_seven_lands_in_one_hypernode() {
    let c = fabric();
    let d = c
        .decide_gang(&seed_members(), &GangConstraint::new("gang-nccl-test"))
        .expect("fits");
    assert_eq!((d.tier, d.group.as_str()), (Tier::HyperNode, "hn-a11"));
    assert_eq!(d.nodes, ["a-1-1-1", "a-1-1-2"]);
    assert_eq!(d.members.len(), 7);
    for (i, m) in d.members.iter().enumerate() {
        assert_eq!(m.pod_uid, format!("worker-{i}"));
        assert_eq!(m.gang.as_deref(), Some("gang-nccl-test"));
        assert_eq!(m.containers[0].nics, ["mlx5_0"]);
    }
    let placement = d.placement();
    assert_eq!(placement.tier, Tier::HyperNode);
}

#[test]
fn seed_gang_moves_up_a_tier_only_when_it_must() {
    let mut c = fabric();
    // No HyperNode keeps seven free cards: those of leaf a1 keep five each, those of the
    // other leaves four, so leaf a2 (eight) holds the gang most tightly.
    fill(&mut c, "a-1-1-1", 3);
    fill(&mut c, "a-1-2-1", 3);
    for hn in ["a-2-1", "a-2-2", "b-1-1", "b-1-2", "b-2-1", "b-2-2"] {
        fill(&mut c, &format!("{hn}-1"), 4);
    }
    let d = c
        .decide_gang(&seed_members(), &GangConstraint::new("g"))
        .expect("fits");
    assert_eq!((d.tier, d.group.as_str()), (Tier::LeafSwitch, "leaf-a2"));
    assert_eq!(d.nodes, ["a-2-1-2", "a-2-2-2"]);
    // With leaf a2 down to six, the next tightest leaf wins, ties by name.
    fill(&mut c, "a-2-2-2", 2);
    let d = c
        .decide_gang(&seed_members(), &GangConstraint::new("g"))
        .expect("fits");
    assert_eq!((d.tier, d.group.as_str()), (Tier::LeafSwitch, "leaf-b1"));
    assert_eq!(d.nodes, ["b-1-1-2", "b-1-2-2"]);
    // Node by node, no card twice.
    let mut cards: Vec<(String, u32)> = d
        .members
        .iter()
        .map(|m| (m.node.clone(), m.containers[0].cards[0].index))
        .collect();
    cards.sort();
    cards.dedup();
    assert_eq!(cards.len(), 7);
}

#[test]
fn a_gang_that_fits_one_node_stays_on_it() {
    let c = fabric();
    let members: Vec<PodInput> = (0..3).map(|i| whole(&format!("m{i}"), 1)).collect();
    let d = c
        .decide_gang(&members, &GangConstraint::new("small"))
        .expect("fits");
    assert_eq!((d.tier, d.group.as_str()), (Tier::Node, "a-1-1-1"));
    assert_eq!(d.nodes, ["a-1-1-1"]);
}

#[test]
fn a_gang_never_spans_network_pods() {
    let mut c = fabric();
    // Six free cards left in each network pod: twelve in all, but seven fit in neither.
    for np in ["a", "b"] {
        for leaf in 1..=2 {
            for hn in 1..=2 {
                for n in 1..=2 {
                    let name = format!("{np}-{leaf}-{hn}-{n}");
                    let keep = if leaf == 1 && hn == 1 { 3 } else { 0 };
                    fill(&mut c, &name, 4 - keep);
                }
            }
        }
    }
    let e = c
        .decide_gang(&seed_members(), &GangConstraint::new("gang-nccl-test"))
        .expect_err("does not fit");
    assert_eq!(
        e.to_string(),
        "0/16 nodes are available for all 7 members of gang gang-nccl-test: no network pod holds \
         them all (the most any holds is 6, in np-a); 12 node(s) had no unallocated card for \
         aliyun.com/gpu."
    );
    let shortfall = e.gang.expect("gang shortfall");
    assert_eq!(shortfall.highest_tier, Tier::NetworkPod);
    assert_eq!(shortfall.largest.map(|l| l.members), Some(6));
}

#[test]
fn the_highest_tier_bounds_the_gang() {
    let c = fabric();
    let members: Vec<PodInput> = (0..9).map(|i| whole(&format!("m{i}"), 1)).collect();
    let tight = GangConstraint {
        name: "g".into(),
        highest_tier: Tier::HyperNode,
    };
    let e = c
        .decide_gang(&members, &tight)
        .expect_err("a HyperNode holds eight");
    assert!(
        e.to_string()
            .contains("no HyperNode holds them all (the most any holds is 8, in hn-a11)"),
        "{e}"
    );
    let d = c
        .decide_gang(&members, &GangConstraint::new("g"))
        .expect("a leaf holds 16");
    assert_eq!(d.tier, Tier::LeafSwitch);
}

#[test]
fn mixed_members_are_placed_together() {
    let c = fabric();
    let mut members: Vec<PodInput> = (0..3).map(|i| whole(&format!("w{i}"), 1)).collect();
    members.push(pod(
        "leader",
        CardRequest::Whole {
            cards: 4,
            name: WholeCardName::AnyVendor,
        },
    ));
    let d = c
        .decide_gang(&members, &GangConstraint::new("mixed"))
        .expect("fits");
    assert_eq!(d.tier, Tier::HyperNode);
    assert_eq!(d.members[3].containers[0].cards.len(), 4);
    let mut used: Vec<(String, u32)> = d
        .members
        .iter()
        .flat_map(|m| {
            m.containers[0]
                .cards
                .iter()
                .map(move |k| (m.node.clone(), k.index))
        })
        .collect();
    used.sort();
    used.dedup();
    assert_eq!(used.len(), 7, "no card is given twice");
}

#[test]
fn reservations_hold_capacity_until_released_or_confirmed() {
    let mut c = fabric();
    let constraint = GangConstraint::new("gang-nccl-test");
    let d = c.decide_gang(&seed_members(), &constraint).expect("fits");
    c.reserve_gang(&d).expect("reserved");
    assert_eq!(c.gang_count(), 1);
    assert_eq!(
        c.reserve_gang(&d),
        Err(CommitError::GangReserved("gang-nccl-test".into()))
    );
    // Others cannot take the reserved cards: the same gang now lands elsewhere.
    let again: Vec<PodInput> = seed_members()
        .into_iter()
        .map(|p| PodInput {
            uid: format!("{}-b", p.uid),
            ..p
        })
        .collect();
    let other = c
        .decide_gang(&again, &GangConstraint::new("other"))
        .expect("fits");
    assert_eq!(other.group, "hn-a12");
    // Rollback returns everything.
    assert_eq!(c.release_gang("gang-nccl-test"), 7);
    assert!(c.is_idle());
    let back = c
        .decide_gang(&again, &GangConstraint::new("other"))
        .expect("fits");
    assert_eq!(back.group, "hn-a11");
    // Confirmation ends the reservation but keeps the allocations.
    c.reserve_gang(&d).expect("reserved");
    assert!(c.confirm_gang("gang-nccl-test"));
    assert_eq!(c.gang_count(), 0);
    assert_eq!(c.release_gang("gang-nccl-test"), 0);
    assert_eq!(c.pod_count(), 7);
    for m in &d.members {
        assert!(c.release(&m.pod_uid));
    }
    assert!(c.is_idle());
}

#[test]
fn a_stale_reservation_is_refused_whole() {
    let mut c = fabric();
    let d = c
        .decide_gang(&seed_members(), &GangConstraint::new("g"))
        .expect("fits");
    // A card of the last member's node is taken in the meantime.
    let last = d.members.last().expect("members");
    c.upsert_slice(SliceInput {
        pod_uid: "intruder".into(),
        container: "main".into(),
        replica: 0,
        node: last.node.clone(),
        card_index: last.containers[0].cards[0].index,
        card_uuid: String::new(),
        share: Share::Whole,
    });
    let e = c.reserve_gang(&d).expect_err("stale");
    assert!(matches!(e, CommitError::CardRefused { .. }), "{e}");
    assert_eq!(c.pod_count(), 1, "no member was reserved");
    assert_eq!(c.gang_count(), 0);
}

#[test]
fn an_empty_gang_is_trivially_placed() {
    let c = fabric();
    let d = c
        .decide_gang(&[], &GangConstraint::new("none"))
        .expect("nothing to place");
    assert!(d.members.is_empty() && d.nodes.is_empty());
}
