//! Preemption: the victims a pod of higher priority gets, for every kind of request, and the
//! rules that hold for any cluster (never a victim of equal or higher priority, never part of a
//! gang, never more victims than needed, and the pod really fits once they are gone).

mod common;

use common::*;
use proptest::prelude::*;
use runtimekit_placement::*;
use std::collections::BTreeMap;

fn candidate(uid: &str, priority: i32) -> Candidate {
    Candidate {
        uid: uid.into(),
        priority,
        gang: None,
        budgets: Vec::new(),
    }
}

fn in_gang(uid: &str, priority: i32, gang: &str) -> Candidate {
    Candidate {
        gang: Some(gang.into()),
        ..candidate(uid, priority)
    }
}

/// The cluster with the victims' allocations released and the decision committed: it must be
/// accepted as is.
fn enact(c: &mut Cluster, preemption: &Preemption) {
    for victim in &preemption.victims {
        assert!(c.release(victim), "victim {victim} held nothing");
    }
    let committed = c.commit(&preemption.decision);
    assert_eq!(committed, Ok(()), "the preemptor does not fit after all");
}

#[test]
fn a_share_frees_only_what_it_needs_on_one_card() {
    let mut c = cluster();
    add(&mut c, node("n1"), &[h800(0), h800(1)], &[]);
    // Two cards full of 25 % development shares, of rising priority.
    let mut all = Vec::new();
    for i in 0..8 {
        let uid = format!("dev-{i}");
        place(&mut c, &tdm(&uid, Some(25), Some(4)));
        all.push(candidate(&uid, i));
    }
    let prod = tdm("prod", Some(50), Some(8));
    assert!(c.decide(&prod).is_err(), "the cards are full");
    let p = c.preempt(&prod, 100, &all, &[]).expect("room can be made");
    // The two shares of the lowest priority, on one card, not a whole card's four.
    assert_eq!(
        p.victims,
        vec!["dev-0".to_owned(), "dev-1".to_owned()],
        "{p:?}"
    );
    assert_eq!(p.budget_violations, 0);
    enact(&mut c, &p);
}

#[test]
fn lowest_priority_goes_first_and_equal_priority_never() {
    let mut c = cluster();
    add(&mut c, node("n1"), &[h800(0)], &[]);
    place(&mut c, &tdm("low", Some(50), None));
    place(&mut c, &tdm("mid", Some(50), None));
    let want = tdm("new", Some(50), None);
    let p = c
        .preempt(&want, 10, &[candidate("low", 1), candidate("mid", 5)], &[])
        .expect("one goes");
    assert_eq!(p.victims, vec!["low".to_owned()]);
    // Nobody of equal or higher priority is ever a victim.
    assert!(
        c.preempt(&want, 1, &[candidate("low", 1), candidate("mid", 5)], &[])
            .is_none()
    );
}

#[test]
fn mig_frees_the_instances_overlapping_one_placement() {
    let mut c = cluster();
    add(&mut c, node("n1"), &[h800_mig(0)], &[]);
    // Seven 1g instances fill the card.
    let mut all = Vec::new();
    for i in 0..7 {
        let uid = format!("small-{i}");
        place(&mut c, &mig(&uid, 1, None));
        all.push(candidate(&uid, 0));
    }
    let big = mig("big", 3, None);
    assert!(c.decide(&big).is_err());
    let p = c.preempt(&big, 10, &all, &[]).expect("room for a 3g");
    // A 3g instance covers four memory slices at start 0 or 4: four 1g instances overlap it,
    // or three at start 4.
    assert!(p.victims.len() <= 4 && !p.victims.is_empty(), "{p:?}");
    enact(&mut c, &p);
}

#[test]
fn whole_cards_free_a_set_the_topology_rules_pick() {
    let mut c = cluster();
    let cards: Vec<CardInfo> = (0..4)
        .map(|i| ppu_810e(i, if i < 2 { "g0" } else { "g1" }))
        .collect();
    add(&mut c, node("ppu"), &cards, &[]);
    let mut all = Vec::new();
    for i in 0..4 {
        let uid = format!("one-{i}");
        place(&mut c, &whole(&uid, 1));
        all.push(candidate(&uid, 0));
    }
    let two = whole("two", 2);
    let p = c.preempt(&two, 10, &all, &[]).expect("two cards");
    assert_eq!(p.victims.len(), 2);
    // The freed pair is one interconnect group.
    let taken: Vec<u32> = p.decision.containers[0]
        .cards
        .iter()
        .map(|c| c.index)
        .collect();
    assert!(taken == [0, 1] || taken == [2, 3], "{taken:?}");
    enact(&mut c, &p);
}

#[test]
fn a_running_gang_goes_whole_or_not_at_all() {
    let mut c = cluster();
    add(&mut c, node("n1"), &[h800(0)], &[]);
    add(&mut c, node("n2"), &[h800(0)], &[]);
    place(&mut c, &whole("gang-a", 1));
    place(&mut c, &whole("gang-b", 1));
    let want = whole("new", 1);
    let gang = [in_gang("gang-a", 0, "g"), in_gang("gang-b", 0, "g")];
    let p = c.preempt(&want, 10, &gang, &[]).expect("the gang can go");
    assert_eq!(p.victims, vec!["gang-a".to_owned(), "gang-b".to_owned()]);
    // One member of higher priority protects the whole gang.
    let mixed = [in_gang("gang-a", 0, "g"), in_gang("gang-b", 50, "g")];
    assert!(c.preempt(&want, 10, &mixed, &[]).is_none());
    // At equal priority, one pod is evicted rather than a gang of two.
    let mut c = cluster();
    for n in ["n1", "n2", "n3"] {
        add(&mut c, node(n), &[h800(0)], &[]);
    }
    for uid in ["gang-a", "gang-b", "solo"] {
        place(&mut c, &whole(uid, 1));
    }
    let all = [
        in_gang("gang-a", 0, "g"),
        in_gang("gang-b", 0, "g"),
        candidate("solo", 0),
    ];
    let p = c.preempt(&want, 10, &all, &[]).expect("room");
    assert_eq!(p.victims, vec!["solo".to_owned()]);
}

#[test]
fn budgets_are_kept_where_another_choice_exists() {
    let mut c = cluster();
    add(&mut c, node("a"), &[h800(0)], &[]);
    add(&mut c, node("b"), &[h800(0)], &[]);
    place(&mut c, &whole("guarded", 1));
    place(&mut c, &whole("free", 1));
    let mut guarded = candidate("guarded", 0);
    guarded.budgets = vec![0];
    // "guarded" has the lower priority but its budget allows no disruption.
    let p = c
        .preempt(
            &whole("new", 1),
            10,
            &[guarded.clone(), candidate("free", 5)],
            &[0],
        )
        .expect("room");
    assert_eq!(p.victims, vec!["free".to_owned()]);
    assert_eq!(p.budget_violations, 0);
    // With no other choice the budget is broken, and the count says so.
    let p = c
        .preempt(&whole("new", 1), 10, &[guarded], &[0])
        .expect("no other choice");
    assert_eq!(
        (p.victims.as_slice(), p.budget_violations),
        (["guarded".to_owned()].as_slice(), 1)
    );
}

#[test]
fn nothing_is_evicted_where_the_pod_cannot_fit_anyway() {
    let mut c = cluster();
    add(&mut c, node("n1"), &[h800(0)], &[]);
    place(&mut c, &whole("low", 1));
    // Two cards on a one-card node: evicting does not help.
    assert!(
        c.preempt(&whole("big", 2), 10, &[candidate("low", 0)], &[])
            .is_none()
    );
    // A MIG request on a card not in MIG mode: no victim makes it fit.
    assert!(
        c.preempt(&mig("m", 1, None), 10, &[candidate("low", 0)], &[])
            .is_none()
    );
    // The state is exactly as it was.
    assert_eq!(c.cards("n1").expect("node")[0].whole, 1);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// On a random cluster of shares and whole cards of random priorities, a preemption's
    /// victims all have a lower priority than the preemptor, no gang is split, the preemptor
    /// fits once they are gone, no victim could be spared (putting back any one of them makes
    /// the preemptor not fit on that node), and the cluster is left unchanged.
    #[test]
    fn victims_are_lower_few_whole_gangs_and_enough(
        nodes in 1usize..4,
        pods in proptest::collection::vec((0u8..3, 1u8..=100, 0i32..20, proptest::option::of(0u8..3)), 1..24),
        want in (0u8..3, 1u8..=100),
        priority in 0i32..25,
    ) {
        let mut c = cluster();
        for n in 0..nodes {
            add(&mut c, node(&format!("n{n}")), &[h800(0), h800(1)], &[]);
        }
        let input = |uid: &str, kind: u8, core: u8| match kind {
            0 => tdm(uid, Some(core), None),
            1 => tdm(uid, Some(core), Some(u64::from(core / 4 + 1))),
            _ => whole(uid, 1),
        };
        let mut candidates = Vec::new();
        let mut decisions = BTreeMap::new();
        for (i, (kind, core, prio, gang)) in pods.iter().enumerate() {
            let uid = format!("p{i}");
            let mut p = input(&uid, *kind, *core);
            p.gang = gang.map(|g| format!("g{g}"));
            if let Ok(d) = c.decide(&p) {
                c.commit(&d).expect("commit");
                decisions.insert(uid.clone(), d);
                candidates.push(Candidate {
                    uid,
                    priority: *prio,
                    gang: gang.map(|g| format!("g{g}")),
                    budgets: Vec::new(),
                });
            }
        }
        let before: Vec<_> = (0..nodes).map(|n| c.cards(&format!("n{n}"))).collect();
        let preemptor = input("new", want.0, want.1);
        let Some(p) = c.preempt(&preemptor, priority, &candidates, &[]) else {
            return Ok(());
        };
        let after: Vec<_> = (0..nodes).map(|n| c.cards(&format!("n{n}"))).collect();
        prop_assert_eq!(&before, &after, "a what-if changed the cluster");
        let of: BTreeMap<&str, &Candidate> = candidates.iter().map(|c| (c.uid.as_str(), c)).collect();
        for v in &p.victims {
            prop_assert!(of[v.as_str()].priority < priority, "victim {} is not lower", v);
            if let Some(g) = &of[v.as_str()].gang {
                for m in candidates.iter().filter(|m| m.gang.as_ref() == Some(g)) {
                    prop_assert!(p.victims.contains(&m.uid), "gang {} split: {:?}", g, p.victims);
                }
            }
        }
        // Minimal: sparing any one unit (a pod, or a whole gang) leaves no room on the node.
        for v in &p.victims {
            let unit: Vec<&String> = match &of[v.as_str()].gang {
                Some(g) => p.victims.iter().filter(|u| of[u.as_str()].gang.as_ref() == Some(g)).collect(),
                None => vec![v],
            };
            let mut trial = cluster();
            for n in 0..nodes {
                add(&mut trial, node(&format!("n{n}")), &[h800(0), h800(1)], &[]);
            }
            for (uid, d) in &decisions {
                if p.victims.contains(uid) && !unit.contains(&uid) {
                    continue;
                }
                trial.commit(d).expect("replay");
            }
            let mut on_node = preemptor.clone();
            on_node.node_selector = BTreeMap::from([("kubernetes.io/hostname".to_owned(), p.node.clone())]);
            prop_assert!(trial.decide(&on_node).is_err(), "victim {} could be spared: {:?}", v, p.victims);
        }
        enact(&mut c, &p);
    }
}
