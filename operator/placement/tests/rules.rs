//! One test per placement rule: the standard predicates, card modes, vendors, MIG, TDM, whole
//! cards, scoring, and the failure messages.

mod common;

use common::*;
use runtimekit_contract::{CardRequest, ContainerRequest, WholeCardName};
use runtimekit_placement::*;

fn one_node(cards: &[CardInfo]) -> Cluster {
    let mut c = cluster();
    add(&mut c, node("n1"), cards, &[]);
    c
}

fn message(c: &Cluster, p: &PodInput) -> String {
    c.decide(p).expect_err("should not fit").to_string()
}

// ---- standard predicates ----

#[test]
fn not_ready_nodes_are_skipped() {
    let mut c = cluster();
    add(
        &mut c,
        NodeInfo {
            ready: false,
            ..node("n1")
        },
        &[h800(0)],
        &[],
    );
    assert_eq!(
        message(&c, &whole("p", 1)),
        "0/1 nodes are available: 1 node(s) were not ready."
    );
}

#[test]
fn cordoned_nodes_take_only_pods_tolerating_it() {
    let mut c = cluster();
    add(
        &mut c,
        NodeInfo {
            unschedulable: true,
            ..node("n1")
        },
        &[h800(0)],
        &[],
    );
    assert_eq!(
        message(&c, &whole("p", 1)),
        "0/1 nodes are available: 1 node(s) were unschedulable."
    );
    let mut p = whole("p", 1);
    p.tolerations.push(Toleration {
        key: "node.kubernetes.io/unschedulable".into(),
        operator: TolerationOperator::Exists,
        effect: Some(TaintEffect::NoSchedule),
        ..Toleration::default()
    });
    assert_eq!(c.decide(&p).expect("tolerated").node, "n1");
}

fn tainted(effect: TaintEffect) -> Cluster {
    let mut c = cluster();
    let info = NodeInfo {
        taints: vec![Taint {
            key: "dedicated".into(),
            value: "infer".into(),
            effect,
        }],
        ..node("n1")
    };
    add(&mut c, info, &[h800(0)], &[]);
    c
}

#[test]
fn untolerated_taints_block_with_kube_scheduler_message() {
    for effect in [TaintEffect::NoSchedule, TaintEffect::NoExecute] {
        assert_eq!(
            message(&tainted(effect), &whole("p", 1)),
            "0/1 nodes are available: 1 node(s) had untolerated taint {dedicated: infer}."
        );
    }
    assert!(
        tainted(TaintEffect::PreferNoSchedule)
            .decide(&whole("p", 1))
            .is_ok()
    );
}

#[test]
fn tolerations_match_by_operator_key_value_and_effect() {
    let c = tainted(TaintEffect::NoSchedule);
    let with = |t: Toleration| {
        let mut p = whole("p", 1);
        p.tolerations.push(t);
        c.decide(&p).is_ok()
    };
    let equal = |key: &str, value: &str, effect| Toleration {
        key: key.into(),
        value: value.into(),
        operator: TolerationOperator::Equal,
        effect,
    };
    assert!(with(equal("dedicated", "infer", None)));
    assert!(with(equal(
        "dedicated",
        "infer",
        Some(TaintEffect::NoSchedule)
    )));
    assert!(!with(equal(
        "dedicated",
        "infer",
        Some(TaintEffect::NoExecute)
    )));
    assert!(!with(equal("dedicated", "train", None)));
    assert!(!with(equal("other", "infer", None)));
    let exists = |key: &str| Toleration {
        key: key.into(),
        operator: TolerationOperator::Exists,
        ..Toleration::default()
    };
    assert!(with(exists("dedicated")));
    assert!(
        with(exists("")),
        "an empty key with Exists tolerates everything"
    );
    assert!(!with(exists("other")));
}

#[test]
fn node_selector_must_match_every_label() {
    let mut c = cluster();
    let mut info = node("n1");
    info.labels
        .insert("accelerator/vendor".into(), "ppu".into());
    add(&mut c, info, &[ppu_810e(0, "g0")], &[]);
    let mut p = whole("p", 1);
    p.node_selector
        .insert("accelerator/vendor".into(), "ppu".into());
    assert!(c.decide(&p).is_ok());
    p.node_selector.insert("zone".into(), "a".into());
    assert_eq!(
        message(&c, &p),
        "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector."
    );
}

fn affinity_cluster() -> Cluster {
    let mut c = cluster();
    for (name, gen_) in [("a", "3"), ("b", "5")] {
        let mut info = node(name);
        info.labels.insert("gpu-gen".into(), gen_.into());
        add(&mut c, info, &[h800(0)], &[]);
    }
    let mut info = node("c");
    info.labels.insert("special".into(), "yes".into());
    add(&mut c, info, &[h800(0)], &[]);
    c
}

/// The nodes a pod with these affinity terms may go to, each tried alone.
fn matching(c: &Cluster, terms: Vec<SelectorTerm>) -> Vec<String> {
    ["a", "b", "c"]
        .into_iter()
        .filter(|name| {
            let mut p = whole("p", 1);
            p.required_affinity = Some(terms.clone());
            p.node_selector
                .insert("kubernetes.io/hostname".into(), (*name).into());
            c.decide(&p).is_ok()
        })
        .map(String::from)
        .collect()
}

fn expr(key: &str, operator: SelectorOperator, values: &[&str]) -> SelectorTerm {
    SelectorTerm {
        match_expressions: vec![SelectorRequirement {
            key: key.into(),
            operator,
            values: values.iter().map(|v| v.to_string()).collect(),
        }],
        match_fields: Vec::new(),
    }
}

#[test]
fn required_node_affinity_supports_every_operator() {
    use SelectorOperator::*;
    let c = affinity_cluster();
    assert_eq!(matching(&c, vec![expr("gpu-gen", In, &["3", "9"])]), ["a"]);
    assert_eq!(
        matching(&c, vec![expr("gpu-gen", NotIn, &["3"])]),
        ["b", "c"]
    );
    assert_eq!(matching(&c, vec![expr("gpu-gen", Exists, &[])]), ["a", "b"]);
    assert_eq!(
        matching(&c, vec![expr("gpu-gen", DoesNotExist, &[])]),
        ["c"]
    );
    assert_eq!(matching(&c, vec![expr("gpu-gen", Gt, &["4"])]), ["b"]);
    assert_eq!(matching(&c, vec![expr("gpu-gen", Lt, &["4"])]), ["a"]);
    assert_eq!(
        matching(&c, vec![expr("gpu-gen", Gt, &["x"])]),
        Vec::<String>::new()
    );
    // Terms are ORed.
    assert_eq!(
        matching(
            &c,
            vec![expr("gpu-gen", In, &["5"]), expr("special", Exists, &[])]
        ),
        ["b", "c"]
    );
    // A term's requirements are ANDed.
    let mut both = expr("gpu-gen", Exists, &[]);
    both.match_expressions
        .push(expr("gpu-gen", NotIn, &["5"]).match_expressions.remove(0));
    assert_eq!(matching(&c, vec![both]), ["a"]);
    // Fields: metadata.name.
    let by_name = SelectorTerm {
        match_expressions: Vec::new(),
        match_fields: vec![SelectorRequirement {
            key: "metadata.name".into(),
            operator: In,
            values: vec!["c".into()],
        }],
    };
    assert_eq!(matching(&c, vec![by_name]), ["c"]);
    // An empty term matches nothing.
    let mut p = whole("p", 1);
    p.required_affinity = Some(vec![SelectorTerm::default()]);
    assert_eq!(
        message(&c, &p),
        "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."
    );
}

#[test]
fn resources_must_fit_beside_pods_already_bound() {
    let mut c = one_node(&[h800(0), h800(1)]);
    let mut p = whole("p", 1);
    p.resources.cpu_milli = 70_000;
    p.resources.memory_bytes = 600 << 30;
    assert_eq!(
        message(&c, &p),
        "0/1 nodes are available: 1 Insufficient cpu, 1 Insufficient memory."
    );
    // A pod of another scheduler uses 60 of the 64 cores.
    c.upsert_pod_usage(
        "other",
        "n1",
        &Resources {
            cpu_milli: 60_000,
            ..Resources::default()
        },
    );
    let mut p = whole("p", 1);
    p.resources.cpu_milli = 5_000;
    assert_eq!(
        message(&c, &p),
        "0/1 nodes are available: 1 Insufficient cpu."
    );
    p.resources.cpu_milli = 4_000;
    assert!(c.decide(&p).is_ok());
    assert!(c.remove_pod_usage("other"));
    p.resources.cpu_milli = 60_000;
    assert!(c.decide(&p).is_ok());
}

#[test]
fn pod_count_and_extended_resources_fit() {
    let mut c = cluster();
    let mut info = node("n1");
    info.max_pods = 1;
    info.allocatable.scalar.insert("example.com/fpga".into(), 1);
    add(&mut c, info, &[h800(0), h800(1)], &[]);
    let mut p = whole("p", 1);
    p.resources.scalar.insert("example.com/fpga".into(), 2);
    p.resources.scalar.insert("example.com/none".into(), 1);
    let e = c.decide(&p).expect_err("does not fit");
    assert_eq!(
        e.to_string(),
        "0/1 nodes are available: 1 Insufficient example.com/fpga, 1 Insufficient example.com/none."
    );
    place(&mut c, &whole("first", 1));
    assert_eq!(
        message(&c, &whole("second", 1)),
        "0/1 nodes are available: 1 Too many pods."
    );
}

#[test]
fn gpu_pods_need_an_enabled_node_with_a_reporting_agent() {
    let mut c = cluster();
    add(
        &mut c,
        NodeInfo {
            gpu_enabled: false,
            ..node("cpu")
        },
        &[],
        &[],
    );
    add(&mut c, node("stale"), &[h800(0)], &[]);
    c.set_agent_reporting("stale", false);
    assert_eq!(
        message(&c, &whole("p", 1)),
        "0/2 nodes are available: 1 node(s) had no node agent offering cards, \
         1 node(s) were not labelled lj_runtimekit_enable=true."
    );
    // A pod without cards may go anywhere.
    let plain = PodInput {
        containers: Vec::new(),
        ..whole("plain", 1)
    };
    let d = c.decide(&plain).expect("fits");
    assert!(d.containers.is_empty());
    c.set_agent_reporting("stale", true);
    assert_eq!(c.decide(&whole("p", 1)).expect("fits").node, "stale");
}

#[test]
fn unsupported_constraints_are_refused_not_ignored() {
    let c = one_node(&[h800(0)]);
    let mut p = whole("p", 1);
    p.unsupported.push("required pod anti-affinity".into());
    let e = c.decide(&p).expect_err("refused");
    assert_eq!(
        e.to_string(),
        "0/1 nodes are available: 1 pod uses required pod anti-affinity, which \
         lj-runtimekit-scheduler does not support."
    );
}

// ---- card modes and vendors ----

#[test]
fn tdm_shares_never_overcommit_core_or_memory() {
    let mut c = one_node(&[h800(0)]);
    place(&mut c, &tdm("a", Some(60), Some(40)));
    assert_eq!(
        message(&c, &tdm("b", Some(50), None)),
        "0/1 nodes are available: 1 node(s) had no card with 50% aliyun.com/gpu-core free."
    );
    assert_eq!(
        message(&c, &tdm("b", Some(40), Some(50))),
        "0/1 nodes are available: 1 node(s) had no card with 40% aliyun.com/gpu-core and \
         50 GiB aliyun.com/gpu-memory free."
    );
    let d = place(&mut c, &tdm("b", Some(40), Some(40)));
    assert_eq!(
        d.containers[0].cards[0].share,
        Share::Tdm {
            core: Some(40),
            memory_mib: Some(40 * GIB)
        }
    );
    let view = &c.cards("n1").expect("node")[0];
    assert_eq!((view.core_used, view.memory_used_mib), (100, 80 * GIB));
}

#[test]
fn a_share_without_core_reserves_no_compute() {
    let mut c = one_node(&[h800(0)]);
    place(&mut c, &tdm("full", Some(100), Some(8)));
    let d = place(&mut c, &tdm("memory-only", None, Some(8)));
    assert_eq!(indexes(&d), [0]);
    assert_eq!(c.cards("n1").expect("node")[0].core_used, 100);
}

#[test]
fn whole_cards_and_shares_exclude_each_other() {
    let mut c = one_node(&[h800(0)]);
    place(&mut c, &tdm("share", Some(10), None));
    assert_eq!(
        message(&c, &whole("w", 1)),
        "0/1 nodes are available: 1 node(s) had no unallocated card for aliyun.com/gpu."
    );
    c.release("share");
    place(&mut c, &whole("w", 1));
    assert_eq!(
        message(&c, &tdm("share", Some(10), None)),
        "0/1 nodes are available: 1 node(s) had every card given whole or holding MIG \
         instances, so none takes aliyun.com/gpu-core."
    );
}

#[test]
fn mig_cards_serve_only_mig_and_other_cards_no_mig() {
    let c = one_node(&[h800_mig(0)]);
    assert_eq!(
        message(&c, &tdm("t", Some(10), None)),
        "0/1 nodes are available: 1 node(s) had only cards in MIG mode, which serve \
         aliyun.com/gpu-slice only, not aliyun.com/gpu-core."
    );
    assert_eq!(
        message(&c, &whole("w", 1)),
        "0/1 nodes are available: 1 node(s) had no healthy card outside MIG mode for aliyun.com/gpu."
    );
    let c = one_node(&[h800(0)]);
    assert_eq!(
        message(&c, &mig("m", 1, None)),
        "0/1 nodes are available: 1 node(s) had MIG not enabled on any card for aliyun.com/gpu-slice."
    );
}

#[test]
fn mig_picks_the_smallest_profile_with_enough_memory_and_a_legal_start() {
    let mut c = one_node(&[h800_mig(0)]);
    let d = place(&mut c, &mig("a", 1, Some(15)));
    let Share::Mig {
        profile,
        start,
        memory_mib,
        ..
    } = &d.containers[0].cards[0].share
    else {
        panic!("not MIG: {d:?}");
    };
    assert_eq!(profile, "1g.20gb");
    assert_eq!(
        *memory_mib,
        15 * GIB,
        "the container sees what it asked for"
    );
    assert!(
        *start >= 4,
        "a small instance starts high, keeping slot 0 for a 4g"
    );
    let d = place(&mut c, &mig("b", 4, None));
    assert_eq!(
        d.containers[0].cards[0].share,
        Share::Mig {
            profile: "4g.40gb".into(),
            slices: 4,
            start: 0,
            memory_mib: 40 * GIB
        }
    );
}

#[test]
fn mig_instances_never_overlap_and_a_full_card_says_so() {
    let mut c = one_node(&[h800_mig(0)]);
    for i in 0..7 {
        place(&mut c, &mig(&format!("m{i}"), 1, None));
    }
    let starts: Vec<u8> = c.cards("n1").expect("node")[0]
        .mig
        .iter()
        .map(|(_, s)| *s)
        .collect();
    let mut sorted = starts.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted, [0, 1, 2, 3, 4, 5, 6]);
    assert_eq!(
        message(&c, &mig("m7", 1, None)),
        "0/1 nodes are available: 1 node(s) had no MIG card with room for a 1g.10gb instance \
         (aliyun.com/gpu-slice: 1)."
    );
}

#[test]
fn reported_hardware_instances_occupy_their_slices() {
    let mut card = h800_mig(0);
    card.mig_instances.push(MigInstance {
        profile: "4g.40gb".into(),
        start: 0,
    });
    let mut c = one_node(&[card]);
    assert!(c.decide(&mig("m", 4, None)).is_err());
    let d = place(&mut c, &mig("m", 3, None));
    assert!(matches!(
        d.containers[0].cards[0].share,
        Share::Mig { start: 4, .. }
    ));
}

#[test]
fn mig_on_a_model_without_table_or_profile_fails_clearly() {
    let mut l40s = card(0, Vendor::Nvidia, "NVIDIA L40S", 48);
    l40s.mig_enabled = true;
    let c = one_node(&[l40s]);
    assert_eq!(
        message(&c, &mig("m", 1, None)),
        "0/1 nodes are available: 1 node(s) had MIG-enabled NVIDIA L40S cards, a model without \
         a MIG profile table."
    );
    let mut a30 = card(0, Vendor::Nvidia, "NVIDIA A30", 24);
    a30.mig_enabled = true;
    let c = one_node(&[a30]);
    assert_eq!(
        message(&c, &mig("m", 3, None)),
        "0/1 nodes are available: 1 node(s) had MIG cards where A30-24GB has no 3-slice MIG \
         profile (it offers 1g.6gb, 2g.12gb, 4g.24gb)."
    );
}

#[test]
fn amd_cards_serve_whole_requests_only_and_nvidia_name_wants_nvidia() {
    let mut c = one_node(&[card(0, Vendor::Amd, "AMD Instinct MI300X", 192)]);
    assert_eq!(
        message(&c, &tdm("t", Some(10), None)),
        "0/1 nodes are available: 1 node(s) had only AMD cards, which serve whole-card requests \
         only, not aliyun.com/gpu-core."
    );
    let nvidia = pod(
        "n",
        CardRequest::Whole {
            cards: 1,
            name: WholeCardName::Nvidia,
        },
    );
    assert_eq!(
        message(&c, &nvidia),
        "0/1 nodes are available: 1 node(s) had no healthy NVIDIA card outside MIG mode for \
         nvidia.com/gpu."
    );
    assert_eq!(indexes(&place(&mut c, &whole("w", 1))), [0]);
    add(&mut c, node("n2"), &[h800(0)], &[]);
    assert_eq!(place(&mut c, &nvidia).node, "n2");
}

#[test]
fn unhealthy_cards_are_never_offered() {
    let mut sick = h800(0);
    sick.healthy = false;
    let c = one_node(&[sick.clone()]);
    assert_eq!(
        message(&c, &tdm("t", Some(10), None)),
        "0/1 nodes are available: 1 node(s) had only unhealthy cards."
    );
    let mut c = one_node(&[sick, h800(1)]);
    assert_eq!(indexes(&place(&mut c, &whole("w", 1))), [1]);
    assert!(c.decide(&whole("x", 1)).is_err());
}

#[test]
fn replica_takes_distinct_cards_with_one_share_each() {
    let mut c = one_node(&[h800(0), h800(1), h800(2)]);
    let p = pod(
        "r",
        CardRequest::Tdm {
            cards: 3,
            core: Some(50),
            memory_mib: Some(10 * GIB),
        },
    );
    let d = place(&mut c, &p);
    assert_eq!(indexes(&d), [0, 1, 2]);
    let replicas: Vec<u32> = d.containers[0].cards.iter().map(|c| c.replica).collect();
    assert_eq!(replicas, [0, 1, 2]);
    place(&mut c, &tdm("small", Some(40), None));
    assert_eq!(
        message(
            &c,
            &PodInput {
                uid: "r2".into(),
                ..p
            }
        ),
        "0/1 nodes are available: 1 node(s) had fewer than 3 cards with 50% aliyun.com/gpu-core \
         and 10 GiB aliyun.com/gpu-memory free."
    );
}

#[test]
fn containers_of_a_pod_share_the_node_and_each_gets_its_cards() {
    let mut c = cluster();
    add(&mut c, node("small"), &[h800(0)], &[]);
    add(&mut c, node("big"), &[h800(0), h800(1), h800(2)], &[]);
    let p = PodInput {
        containers: vec![
            ContainerRequest {
                container: "a".into(),
                cards: CardRequest::Whole {
                    cards: 2,
                    name: WholeCardName::AnyVendor,
                },
                rdma: false,
            },
            ContainerRequest {
                container: "b".into(),
                cards: CardRequest::Whole {
                    cards: 1,
                    name: WholeCardName::AnyVendor,
                },
                rdma: false,
            },
        ],
        ..whole("multi", 1)
    };
    let d = place(&mut c, &p);
    assert_eq!(d.node, "big");
    let mut all: Vec<u32> = d
        .containers
        .iter()
        .flat_map(|c| c.cards.iter().map(|k| k.index))
        .collect();
    all.sort();
    assert_eq!(all, [0, 1, 2]);
    assert_eq!(d.containers[1].container, "b");
    let e = c
        .decide(&PodInput {
            uid: "again".into(),
            ..p
        })
        .expect_err("full");
    assert_eq!(
        e.to_string(),
        "0/2 nodes are available: 1 node(s) had fewer than 2 healthy cards outside MIG mode for \
         aliyun.com/gpu (container \"a\"), 1 node(s) had fewer than 2 unallocated cards for \
         aliyun.com/gpu (container \"a\")."
    );
}

// ---- scoring ----

#[test]
fn binpack_fills_used_cards_and_nodes_first() {
    let mut c = cluster();
    add(&mut c, node("a"), &[h800(0), h800(1)], &[]);
    add(&mut c, node("b"), &[h800(0), h800(1)], &[]);
    let first = place(&mut c, &tdm("t1", Some(20), Some(8)));
    let second = place(&mut c, &tdm("t2", Some(20), Some(8)));
    assert_eq!(
        (second.node.as_str(), indexes(&second)),
        (first.node.as_str(), indexes(&first))
    );
    // A whole card goes to the node with the fewest free cards, keeping a whole node free.
    let w = place(&mut c, &whole("w", 1));
    assert_eq!(w.node, first.node);
    assert_ne!(indexes(&w), indexes(&first));
}

#[test]
fn spread_prefers_empty_cards_and_nodes() {
    let mut c = Cluster::new(Settings::default().with_scoring(Scoring::Spread));
    add(&mut c, node("a"), &[h800(0), h800(1)], &[]);
    add(&mut c, node("b"), &[h800(0), h800(1)], &[]);
    let first = place(&mut c, &tdm("t1", Some(20), Some(8)));
    let second = place(&mut c, &tdm("t2", Some(20), Some(8)));
    assert_ne!(second.node, first.node, "spread moves to the emptiest node");
    let third = place(&mut c, &tdm("t3", Some(20), Some(8)));
    assert_eq!(third.node, "a");
    assert_ne!(indexes(&third), indexes(&first), "then to an empty card");
    // Whole cards go to the node with the most free cards.
    add(&mut c, node("c"), &[h800(0), h800(1), h800(2)], &[]);
    assert_eq!(place(&mut c, &whole("w", 1)).node, "c");
    let mut m = Cluster::new(Settings::default().with_scoring(Scoring::Spread));
    add(&mut m, node("a"), &[h800_mig(0), h800_mig(1)], &[]);
    let x = place(&mut m, &mig("x", 1, None));
    let y = place(&mut m, &mig("y", 1, None));
    assert_ne!(indexes(&x), indexes(&y));
}

#[test]
fn ties_break_by_node_name_whatever_the_insertion_order() {
    let names = ["node-c", "node-a", "node-b"];
    let build = |order: &[&str]| {
        let mut c = cluster();
        for n in order {
            add(&mut c, node(n), &[h800(0), h800(1)], &[]);
        }
        c
    };
    let forward = build(&names);
    let mut reversed_names = names;
    reversed_names.reverse();
    let reversed = build(&reversed_names);
    for p in [tdm("t", Some(10), None), whole("w", 2), whole("x", 1)] {
        let a = forward.decide(&p).expect("fits");
        let b = reversed.decide(&p).expect("fits");
        assert_eq!(a, b);
        assert_eq!(a.node, "node-a");
        assert_eq!(
            forward.decide(&p).expect("fits"),
            a,
            "same state, same decision"
        );
    }
}

// ---- failure messages ----

#[test]
fn failures_aggregate_per_reason_across_nodes() {
    let mut c = cluster();
    for i in 0..3 {
        add(&mut c, node(&format!("tdm-{i}")), &[h800(0)], &[]);
    }
    add(&mut c, node("mig"), &[h800_mig(0)], &[]);
    add(
        &mut c,
        NodeInfo {
            ready: false,
            ..node("down")
        },
        &[h800(0)],
        &[],
    );
    for i in 0..3 {
        place(&mut c, &tdm(&format!("busy-{i}"), Some(60), None));
    }
    let e = c.decide(&tdm("p", Some(50), None)).expect_err("no room");
    assert_eq!(
        e.to_string(),
        "0/5 nodes are available: 3 node(s) had no card with 50% aliyun.com/gpu-core free, \
         1 node(s) had only cards in MIG mode, which serve aliyun.com/gpu-slice only, not \
         aliyun.com/gpu-core, 1 node(s) were not ready."
    );
    assert_eq!(e.nodes, 5);
    assert_eq!(e.count(&Reason::NotReady), 1);
    assert_eq!(
        e.reasons.iter().map(|r| r.nodes).sum::<usize>(),
        5,
        "one reason per node here"
    );
}

#[test]
fn resource_names_follow_the_configured_prefix() {
    let config = runtimekit_contract::RuntimeKitConfig {
        resource_prefix: "example.org".into(),
        ..Default::default()
    };
    let mut c = Cluster::new(Settings::new(&config));
    add(&mut c, node("n1"), &[h800(0)], &[]);
    place(&mut c, &whole("w", 1));
    assert_eq!(
        message(&c, &tdm("t", Some(10), Some(1))),
        "0/1 nodes are available: 1 node(s) had every card given whole or holding MIG instances, \
         so none takes example.org/gpu-core."
    );
}

// ---- feature switches ----

/// A node whose label switches `function` (`tdm` or `mig`) off.
fn switched_off(name: &str, function: &str) -> NodeInfo {
    let mut info = node(name);
    info.labels
        .insert(format!("aliyun.com/{function}-enabled"), "false".into());
    info.switches = Switches {
        tdm: function != "tdm",
        mig: function != "mig",
        whole_cards: true,
    };
    info
}

#[test]
fn a_node_giving_whole_cards_through_dra_gets_no_whole_card_pod_of_ours() {
    let mut c = cluster();
    let mut dra = node("n1");
    dra.labels
        .insert("aliyun.com/device-api".into(), "dra".into());
    dra.switches = Switches::from_labels(
        &dra.labels,
        &runtimekit_contract::RuntimeKitConfig::default().names(),
    );
    add(&mut c, dra, &[h800(0)], &[]);
    assert_eq!(
        message(&c, &whole("w", 1)),
        "0/1 nodes are available: 1 node(s) gave whole cards through DRA (aliyun.com/device-api=dra): ask for them with a ResourceClaim under the default scheduler."
    );
    // Its shares are still ours to place.
    assert_eq!(place(&mut c, &tdm("p", Some(30), Some(4))).node, "n1");
    add(&mut c, node("n2"), &[h800(0)], &[]);
    assert_eq!(place(&mut c, &whole("w", 1)).node, "n2");
}

#[test]
fn a_node_label_switches_time_division_shares_off_on_that_node_only() {
    let mut c = cluster();
    add(&mut c, switched_off("n1", "tdm"), &[h800(0)], &[]);
    assert_eq!(
        message(&c, &tdm("p", Some(30), Some(4))),
        "0/1 nodes are available: 1 node(s) had time-division shares switched off by the node label aliyun.com/tdm-enabled=false."
    );
    // Whole cards and MIG are not affected.
    assert_eq!(c.decide(&whole("w", 1)).expect("whole card").node, "n1");
    add(&mut c, node("n2"), &[h800(0)], &[]);
    assert_eq!(place(&mut c, &tdm("p", Some(30), Some(4))).node, "n2");
}

#[test]
fn a_node_label_switches_mig_off_on_that_node_only() {
    let mut c = cluster();
    add(&mut c, switched_off("n1", "mig"), &[h800_mig(0)], &[]);
    assert_eq!(
        message(&c, &mig("p", 3, None)),
        "0/1 nodes are available: 1 node(s) had MIG instances switched off by the node label aliyun.com/mig-enabled=false."
    );
    add(&mut c, node("n2"), &[h800_mig(0)], &[]);
    assert_eq!(place(&mut c, &mig("p", 3, None)).node, "n2");
}

#[test]
fn the_shared_configuration_switches_a_function_off_everywhere() {
    let config = runtimekit_contract::RuntimeKitConfig {
        features: runtimekit_contract::Features {
            tdm: false,
            mig: false,
            ..Default::default()
        },
        ..Default::default()
    };
    let mut c = Cluster::new(Settings::new(&config));
    add(&mut c, node("n1"), &[h800(0)], &[]);
    add(&mut c, node("n2"), &[h800_mig(0)], &[]);
    assert_eq!(
        message(&c, &tdm("p", Some(30), None)),
        "0/2 nodes are available: 2 node(s) had time-division shares switched off for the cluster (features.tdm: false in the shared configuration)."
    );
    assert_eq!(
        message(&c, &mig("m", 3, None)),
        "0/2 nodes are available: 2 node(s) had MIG instances switched off for the cluster (features.mig: false in the shared configuration)."
    );
    assert_eq!(place(&mut c, &whole("w", 1)).node, "n1");
}

#[test]
fn switching_off_keeps_what_runs_and_switching_on_again_offers_the_room() {
    let mut c = cluster();
    add(&mut c, node("n1"), &[h800(0)], &[]);
    let first = place(&mut c, &tdm("a", Some(60), Some(10)));
    c.upsert_node(switched_off("n1", "tdm"));
    // The running share keeps its card: its room is still taken when the node switches back.
    assert!(c.decide(&tdm("b", Some(30), None)).is_err());
    assert!(c.decide(&whole("w", 1)).is_err(), "the card holds a share");
    c.upsert_node(node("n1"));
    assert!(
        c.decide(&tdm("c", Some(50), None)).is_err(),
        "only 40 % is left"
    );
    let second = place(&mut c, &tdm("d", Some(40), None));
    assert_eq!(indexes(&second), indexes(&first));
}
