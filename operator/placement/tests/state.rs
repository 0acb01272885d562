//! Incremental state: restarts rebuilt from GpuSlices, allocations that arrive before their
//! node or card, node removal, stale decisions, health and agent changes.

mod common;

use common::*;
use runtimekit_placement::*;

fn slice(uid: &str, node: &str, index: u32, uuid: &str, share: Share) -> SliceInput {
    SliceInput {
        pod_uid: uid.into(),
        container: "main".into(),
        replica: 0,
        node: node.into(),
        card_index: index,
        card_uuid: uuid.into(),
        share,
    }
}

#[test]
fn restart_rebuilds_from_slices_seen_before_their_nodes() {
    let mut c = cluster();
    // GpuSlices arrive first, as a restarted operator's watches may deliver them.
    c.upsert_slice(slice("a", "n1", 0, "NVIDIA H800-0", Share::Whole));
    c.upsert_slice(slice(
        "b",
        "n1",
        1,
        "NVIDIA H800-1",
        Share::Tdm {
            core: Some(70),
            memory_mib: None,
        },
    ));
    assert_eq!(c.node_count(), 0);
    assert!(c.decide(&whole("new", 1)).is_err());
    add(&mut c, node("n1"), &[h800(0), h800(1), h800(2)], &[]);
    let views = c.cards("n1").expect("node");
    assert_eq!((views[0].whole, views[1].core_used), (1, 70));
    // Nothing is given twice.
    assert_eq!(indexes(&place(&mut c, &whole("w", 1))), [2]);
    assert!(c.decide(&whole("x", 1)).is_err());
    assert!(c.decide(&tdm("t", Some(40), None)).is_err());
    assert_eq!(indexes(&place(&mut c, &tdm("t", Some(30), None))), [1]);
}

#[test]
fn slices_for_unknown_cards_wait_for_them() {
    let mut c = cluster();
    add(&mut c, node("n1"), &[h800(0)], &[]);
    c.upsert_slice(slice("late", "n1", 1, "NVIDIA H800-1", Share::Whole));
    assert_eq!(c.cards("n1").expect("node")[0].whole, 0);
    c.set_devices("n1", &[h800(0), h800(1)], &[]);
    let views = c.cards("n1").expect("node");
    assert_eq!((views[0].whole, views[1].whole), (0, 1));
    // A slice naming a replaced card (same index, other UUID) does not hold the new card.
    let mut swapped = h800(1);
    swapped.uuid = "GPU-new".into();
    c.set_devices("n1", &[h800(0), swapped], &[]);
    assert_eq!(c.cards("n1").expect("node")[1].whole, 0);
}

#[test]
fn removing_a_node_keeps_its_allocations_for_its_return() {
    let mut c = cluster();
    add(&mut c, node("n1"), &[h800(0), h800(1)], &[]);
    place(&mut c, &whole("w", 1));
    assert!(c.remove_node("n1"));
    assert_eq!(c.node_count(), 0);
    assert!(!c.remove_node("n1"), "already removed");
    add(&mut c, node("n1"), &[h800(0), h800(1)], &[]);
    assert_eq!(c.cards("n1").expect("node")[0].whole, 1);
    assert_eq!(indexes(&place(&mut c, &whole("x", 1))), [1]);
    c.release("w");
    c.release("x");
    assert!(c.remove_node("n1"));
    assert!(
        c.cards("n1").is_none(),
        "a node nothing refers to is forgotten"
    );
    assert!(c.is_idle());
}

#[test]
fn a_slice_can_move_and_be_removed_alone() {
    let mut c = cluster();
    add(&mut c, node("n1"), &[h800(0), h800(1)], &[]);
    c.upsert_slice(slice("p", "n1", 0, "", Share::Whole));
    c.upsert_slice(slice("p", "n1", 1, "", Share::Whole));
    let views = c.cards("n1").expect("node");
    assert_eq!(
        (views[0].whole, views[1].whole),
        (0, 1),
        "same key replaces"
    );
    assert!(c.remove_slice("p", "main", 0));
    assert!(!c.remove_slice("p", "main", 0));
    assert!(c.is_idle());
}

#[test]
fn stale_and_repeated_commits_are_refused() {
    let mut c = cluster();
    add(&mut c, node("n1"), &[h800(0)], &[]);
    let d = c.decide(&tdm("a", Some(60), None)).expect("fits");
    let e = c.decide(&tdm("b", Some(60), None)).expect("fits");
    c.commit(&d).expect("first");
    assert_eq!(c.commit(&d), Err(CommitError::AlreadyPlaced("a".into())));
    assert_eq!(
        c.commit(&e),
        Err(CommitError::CardRefused {
            node: "n1".into(),
            index: 0,
            why: "only 40% core is free".into()
        })
    );
    let mut elsewhere = e.clone();
    elsewhere.node = "gone".into();
    assert_eq!(
        c.commit(&elsewhere),
        Err(CommitError::UnknownNode("gone".into()))
    );
}

#[test]
fn health_and_agent_changes_take_effect_at_once() {
    let mut c = cluster();
    add(&mut c, node("n1"), &[h800(0), h800(1)], &[]);
    place(&mut c, &whole("w", 1));
    let mut sick = h800(1);
    sick.healthy = false;
    c.set_devices("n1", &[h800(0), sick], &[]);
    assert_eq!(c.cards("n1").expect("node")[0].whole, 1, "allocations stay");
    assert!(c.decide(&whole("x", 1)).is_err());
    c.set_devices("n1", &[h800(0), h800(1)], &[]);
    assert!(c.decide(&whole("x", 1)).is_ok());
    c.set_agent_reporting("n1", false);
    assert!(c.decide(&whole("x", 1)).is_err());
}

#[test]
fn pod_usage_moves_with_its_pod_and_counts_once() {
    let mut c = cluster();
    add(&mut c, node("a"), &[h800(0)], &[]);
    add(&mut c, node("b"), &[h800(0)], &[]);
    let big = Resources {
        cpu_milli: 60_000,
        ..Resources::default()
    };
    c.upsert_pod_usage("x", "a", &big);
    c.upsert_pod_usage("x", "a", &big);
    let mut p = whole("p", 1);
    p.resources.cpu_milli = 8_000;
    assert_eq!(c.decide(&p).expect("fits").node, "b");
    c.upsert_pod_usage("x", "b", &big);
    assert_eq!(c.decide(&p).expect("fits").node, "a");
    // A committed pod's usage is the same record its bound Pod later reports.
    let d = place(&mut c, &p);
    c.upsert_pod_usage("p", &d.node, &p.resources);
    assert_eq!(c.pod_count(), 2);
    c.release("p");
    c.release("x");
    assert!(c.is_idle());
}
