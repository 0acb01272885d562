//! One table-driven case for every rule of the resource contract (SPEC section 3), valid and
//! invalid, each checked against its exact message.

#![allow(clippy::panic)] // helpers fail the calling test by panicking

use k8s_openapi::api::core::v1::Pod;
use runtimekit_contract::{
    CardRequest, MemoryUnit, RuntimeKitConfig, Warning, WholeCardName, parse_pod,
};
use serde_json::{Value, json};

/// A pod of our scheduler and RuntimeClass with one container `app` whose limits are `limits`;
/// `patch` is merged into the pod (for labels, requests, other containers, spec fields).
fn pod(limits: Value, patch: Value) -> Pod {
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {
            "schedulerName": "lj-runtimekit-scheduler",
            "runtimeClassName": "lj-runtime",
            "containers": [{"name": "app", "image": "img", "resources": {"limits": limits}}]
        }
    });
    if !patch.is_null() {
        merge(&mut pod, patch);
    }
    serde_json::from_value(pod).expect("test pod is a Pod")
}

fn merge(target: &mut Value, patch: Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                merge(t.entry(k).or_insert(Value::Null), v);
            }
        }
        (t, p) => *t = p,
    }
}

fn ok(limits: Value, patch: Value) -> Vec<CardRequest> {
    match parse_pod(&pod(limits.clone(), patch), &RuntimeKitConfig::default()) {
        Ok(r) => r.containers.into_iter().map(|c| c.cards).collect(),
        Err(e) => panic!("{limits} was refused: {e}"),
    }
}

fn err_with(config: &RuntimeKitConfig, limits: Value, patch: Value) -> String {
    match parse_pod(&pod(limits.clone(), patch), config) {
        Ok(r) => panic!("{limits} was accepted as {r:?}"),
        Err(e) => e.to_string(),
    }
}

fn err(limits: Value, patch: Value) -> String {
    err_with(&RuntimeKitConfig::default(), limits, patch)
}

const NONE: Value = Value::Null;

fn tdm(cards: u32, core: Option<u8>, memory_mib: Option<u64>) -> CardRequest {
    CardRequest::Tdm {
        cards,
        core,
        memory_mib,
    }
}

#[test]
fn gpu_core_is_1_to_100_and_absent_means_no_cap() {
    assert_eq!(
        ok(json!({"aliyun.com/gpu-core": "1"}), NONE),
        [tdm(1, Some(1), None)]
    );
    assert_eq!(
        ok(json!({"aliyun.com/gpu-core": "100"}), NONE),
        [tdm(1, Some(100), None)]
    );
    assert_eq!(
        ok(json!({"aliyun.com/gpu-memory": "8"}), NONE),
        [tdm(1, None, Some(8192))]
    );
    assert_eq!(
        err(json!({"aliyun.com/gpu-core": "101"}), NONE),
        r#"container "app": aliyun.com/gpu-core must be between 1 and 100 (percent of one card); got 101"#
    );
    assert_eq!(
        err(json!({"aliyun.com/gpu-core": "-5"}), NONE),
        r#"container "app": aliyun.com/gpu-core must not be negative; got -5"#
    );
}

#[test]
fn gpu_core_zero_means_no_cap_with_a_warning() {
    let request = parse_pod(
        &pod(
            json!({"aliyun.com/gpu-core": "0", "aliyun.com/gpu-memory": "4"}),
            NONE,
        ),
        &RuntimeKitConfig::default(),
    )
    .expect("core 0 is allowed");
    assert_eq!(request.containers[0].cards, tdm(1, None, Some(4096)));
    assert_eq!(
        request.warnings,
        [Warning::CoreZero {
            container: "app".into(),
            resource: "aliyun.com/gpu-core".into()
        }]
    );
    assert_eq!(
        request.warnings[0].to_string(),
        r#"container "app": aliyun.com/gpu-core: 0 means no compute cap, but GPU programs may hang with it; leave aliyun.com/gpu-core out instead"#
    );
}

#[test]
fn values_must_be_whole_numbers() {
    assert_eq!(
        err(json!({"aliyun.com/gpu-core": "50.5"}), NONE),
        r#"container "app": aliyun.com/gpu-core must be a whole number; got "50.5""#
    );
    assert_eq!(
        err(json!({"aliyun.com/gpu-memory": "500m"}), NONE),
        r#"container "app": aliyun.com/gpu-memory must be a whole number; got "500m""#
    );
    // Any quantity notation of a whole number is accepted.
    assert_eq!(
        ok(json!({"aliyun.com/gpu-core": "5e1"}), NONE),
        [tdm(1, Some(50), None)]
    );
}

#[test]
fn gpu_memory_in_gib_must_be_positive() {
    assert_eq!(
        ok(json!({"aliyun.com/gpu-memory": "1"}), NONE),
        [tdm(1, None, Some(1024))]
    );
    assert_eq!(
        err(json!({"aliyun.com/gpu-memory": "0"}), NONE),
        r#"container "app": aliyun.com/gpu-memory must be a positive number of GiB; got 0"#
    );
    assert_eq!(
        err(json!({"aliyun.com/gpu-memory": "99999999"}), NONE),
        r#"container "app": aliyun.com/gpu-memory of 99999999 GiB is larger than any card"#
    );
}

#[test]
fn gpu_memory_in_mib_mode_is_a_multiple_of_128() {
    let mib = RuntimeKitConfig {
        memory_unit: MemoryUnit::MiB,
        ..Default::default()
    };
    let request =
        parse_pod(&pod(json!({"aliyun.com/gpu-memory": "384"}), NONE), &mib).expect("384 MiB");
    assert_eq!(request.containers[0].cards, tdm(1, None, Some(384)));
    for bad in ["100", "0", "129"] {
        assert_eq!(
            err_with(&mib, json!({"aliyun.com/gpu-memory": bad}), NONE),
            format!(
                r#"container "app": aliyun.com/gpu-memory must be a positive multiple of 128 (MiB); got {bad}"#
            )
        );
    }
}

#[test]
fn gpu_slice_is_1_2_3_4_or_7() {
    for slices in [1u8, 2, 3, 4, 7] {
        assert_eq!(
            ok(json!({"aliyun.com/gpu-slice": slices.to_string()}), NONE),
            [CardRequest::Mig {
                cards: 1,
                slices,
                memory_mib: None
            }]
        );
    }
    for bad in ["0", "5", "6", "8"] {
        assert_eq!(
            err(json!({"aliyun.com/gpu-slice": bad}), NONE),
            format!(
                r#"container "app": aliyun.com/gpu-slice must be one of 1, 2, 3, 4, 7; got {bad}"#
            )
        );
    }
}

#[test]
fn gpu_slice_with_memory_keeps_the_memory() {
    assert_eq!(
        ok(
            json!({"aliyun.com/gpu-slice": "1", "aliyun.com/gpu-memory": "15"}),
            NONE
        ),
        [CardRequest::Mig {
            cards: 1,
            slices: 1,
            memory_mib: Some(15 * 1024)
        }]
    );
}

#[test]
fn gpu_slice_and_gpu_core_are_exclusive() {
    assert_eq!(
        err(
            json!({"aliyun.com/gpu-slice": "3", "aliyun.com/gpu-core": "50"}),
            NONE
        ),
        r#"container "app": aliyun.com/gpu-slice (MIG) and aliyun.com/gpu-core (time-division) cannot be combined; a card is in one mode"#
    );
}

#[test]
fn whole_cards_take_no_fractions() {
    assert_eq!(
        ok(json!({"aliyun.com/gpu": "8"}), NONE),
        [CardRequest::Whole {
            cards: 8,
            name: WholeCardName::AnyVendor
        }]
    );
    assert_eq!(
        ok(json!({"nvidia.com/gpu": "2"}), NONE),
        [CardRequest::Whole {
            cards: 2,
            name: WholeCardName::Nvidia
        }]
    );
    assert_eq!(
        err(
            json!({"nvidia.com/gpu": "1", "aliyun.com/gpu-core": "50"}),
            NONE
        ),
        r#"container "app": nvidia.com/gpu asks for whole cards, which take no aliyun.com/gpu-core; remove aliyun.com/gpu-core"#
    );
    assert_eq!(
        err(
            json!({"aliyun.com/gpu": "1", "aliyun.com/gpu-memory": "4"}),
            NONE
        ),
        r#"container "app": aliyun.com/gpu asks for whole cards, which take no aliyun.com/gpu-memory; remove aliyun.com/gpu-memory"#
    );
    assert_eq!(
        err(
            json!({"aliyun.com/gpu": "1", "aliyun.com/gpu-slice": "1"}),
            NONE
        ),
        r#"container "app": aliyun.com/gpu asks for whole cards, which take no aliyun.com/gpu-slice; remove aliyun.com/gpu-slice"#
    );
}

#[test]
fn whole_card_counts_are_at_least_one() {
    assert_eq!(
        err(json!({"aliyun.com/gpu": "0"}), NONE),
        r#"container "app": aliyun.com/gpu must be between 1 and 64; got 0"#
    );
    assert_eq!(
        err(json!({"nvidia.com/gpu": "65"}), NONE),
        r#"container "app": nvidia.com/gpu must be between 1 and 64; got 65"#
    );
}

#[test]
fn one_whole_card_name_per_container() {
    assert_eq!(
        err(json!({"aliyun.com/gpu": "1", "nvidia.com/gpu": "1"}), NONE),
        r#"container "app": aliyun.com/gpu and nvidia.com/gpu both ask for whole cards; use one of them"#
    );
}

#[test]
fn rdma_is_a_switch_of_0_or_1() {
    let request = parse_pod(
        &pod(
            json!({"aliyun.com/gpu": "4", "aliyun.com/rdma": "1"}),
            json!({"spec": {"hostNetwork": true}}),
        ),
        &RuntimeKitConfig::default(),
    )
    .expect("rdma 1");
    assert!(request.containers[0].rdma);
    let request = parse_pod(
        &pod(json!({"aliyun.com/gpu": "4", "aliyun.com/rdma": "0"}), NONE),
        &RuntimeKitConfig::default(),
    )
    .expect("rdma 0");
    assert!(!request.containers[0].rdma);
    assert_eq!(
        err(json!({"aliyun.com/gpu": "4", "aliyun.com/rdma": "2"}), NONE),
        r#"container "app": aliyun.com/rdma must be 0 or 1 (it is a switch, not a NIC count); got 2"#
    );
    assert_eq!(
        err(json!({"aliyun.com/rdma": "1"}), NONE),
        r#"container "app": aliyun.com/rdma attaches the RDMA NICs nearest the container's cards, but the container asks for no cards"#
    );
}

#[test]
fn rdma_without_host_network_warns() {
    let request = parse_pod(
        &pod(json!({"aliyun.com/gpu": "1", "aliyun.com/rdma": "1"}), NONE),
        &RuntimeKitConfig::default(),
    )
    .expect("allowed");
    assert_eq!(
        request.warnings,
        [Warning::RdmaWithoutHostNetwork {
            container: "app".into(),
            resource: "aliyun.com/rdma".into()
        }]
    );
    assert_eq!(
        request.warnings[0].to_string(),
        r#"container "app": aliyun.com/rdma: 1 needs hostNetwork: true for RDMA traffic"#
    );
}

#[test]
fn requests_may_be_omitted_but_must_equal_limits() {
    let same = json!({"spec": {"containers": [{"name": "app", "image": "img", "resources": {
        "limits": {"aliyun.com/gpu-core": "50"}, "requests": {"aliyun.com/gpu-core": "50"}}}]}});
    assert_eq!(ok(NONE, same), [tdm(1, Some(50), None)]);
    let different = json!({"spec": {"containers": [{"name": "app", "image": "img", "resources": {
        "limits": {"aliyun.com/gpu-core": "50"}, "requests": {"aliyun.com/gpu-core": "30"}}}]}});
    assert_eq!(
        err(NONE, different),
        r#"container "app": aliyun.com/gpu-core request 30 must equal its limit 50"#
    );
    let request_only = json!({"spec": {"containers": [{"name": "app", "image": "img", "resources": {
        "requests": {"aliyun.com/gpu-core": "30"}}}]}});
    assert_eq!(
        err(NONE, request_only),
        r#"container "app": aliyun.com/gpu-core is in requests but not in limits; declare it in limits"#
    );
}

#[test]
fn replica_asks_for_n_cards_of_one_configuration() {
    let two = json!({"metadata": {"labels": {"replica": "2"}}});
    assert_eq!(
        ok(
            json!({"aliyun.com/gpu-core": "50", "aliyun.com/gpu-memory": "4"}),
            two.clone()
        ),
        [tdm(2, Some(50), Some(4096))]
    );
    assert_eq!(
        ok(json!({"aliyun.com/gpu-slice": "2"}), two.clone()),
        [CardRequest::Mig {
            cards: 2,
            slices: 2,
            memory_mib: None
        }]
    );
    for bad in ["0", "two", "-1", "65", ""] {
        assert_eq!(
            err(
                json!({"aliyun.com/gpu-core": "50"}),
                json!({"metadata": {"labels": {"replica": bad}}})
            ),
            format!(r#"label replica must be a whole number between 1 and 64; got {bad:?}"#)
        );
    }
    assert_eq!(
        err(json!({"aliyun.com/gpu": "1"}), two.clone()),
        r#"label replica asks for 2 cards of one time-division or MIG configuration, but container "app" asks for whole cards; set aliyun.com/gpu: 2 instead"#
    );
    assert_eq!(
        err(json!({}), two),
        "label replica asks for 2 cards, but no container asks for aliyun.com/gpu-core, aliyun.com/gpu-memory or aliyun.com/gpu-slice"
    );
}

#[test]
fn unknown_gpu_resources_under_the_prefix_are_reported() {
    assert_eq!(
        err(json!({"aliyun.com/gpu-mem": "4"}), NONE),
        r#"container "app": aliyun.com/gpu-mem is not a resource of this project; known: aliyun.com/gpu-core, aliyun.com/gpu-memory, aliyun.com/gpu-slice, aliyun.com/gpu, aliyun.com/rdma, nvidia.com/gpu"#
    );
    // Other projects' resources under the prefix, and other vendors' names, are left alone.
    assert_eq!(
        ok(
            json!({"aliyun.com/eni": "1", "example.com/fpga": "1", "cpu": "2"}),
            NONE
        ),
        []
    );
}

#[test]
fn min_member_needs_a_group_and_a_positive_size() {
    let jobset = |min: &str| json!({"metadata": {"labels": {"aliyun.com/min-member": min, "jobset.sigs.k8s.io/jobset-name": "train"}}});
    let request = parse_pod(
        &pod(json!({"aliyun.com/gpu": "1"}), jobset("7")),
        &RuntimeKitConfig::default(),
    )
    .expect("gang member");
    let gang = request.gang.expect("gang");
    assert_eq!(
        (gang.name.as_str(), gang.min_member, gang.job_set.as_deref()),
        ("train", 7, Some("train"))
    );

    let explicit = json!({"metadata": {"labels": {"aliyun.com/min-member": "3", "aliyun.com/gang-name": "g1"}}});
    let request = parse_pod(
        &pod(json!({"aliyun.com/gpu": "1"}), explicit),
        &RuntimeKitConfig::default(),
    )
    .expect("gang member");
    assert_eq!(
        request.gang.map(|g| (g.name, g.job_set)),
        Some(("g1".to_owned(), None))
    );

    for bad in ["0", "x", "-2"] {
        assert_eq!(
            err(json!({"aliyun.com/gpu": "1"}), jobset(bad)),
            format!(
                r#"label aliyun.com/min-member must be a whole number of at least 1; got {bad:?}"#
            )
        );
    }
    assert_eq!(
        err(
            json!({"aliyun.com/gpu": "1"}),
            json!({"metadata": {"labels": {"aliyun.com/min-member": "2"}}})
        ),
        "label aliyun.com/min-member needs a group: the pod has neither the JobSet label jobset.sigs.k8s.io/jobset-name nor a aliyun.com/gang-name label"
    );
}

#[test]
fn with_gangs_switched_off_a_member_is_placed_on_its_own_and_told_so() {
    let config = RuntimeKitConfig {
        features: runtimekit_contract::Features {
            gangs: false,
            ..Default::default()
        },
        ..Default::default()
    };
    let member = json!({"metadata": {"labels": {"aliyun.com/min-member": "7", "jobset.sigs.k8s.io/jobset-name": "train"}}});
    let request = parse_pod(&pod(json!({"aliyun.com/gpu": "1"}), member), &config)
        .expect("still a valid pod");
    assert_eq!(request.gang, None);
    assert_eq!(
        request.warnings,
        [Warning::GangsSwitchedOff {
            gang: "train".into()
        }]
    );
    assert_eq!(
        request.warnings[0].to_string(),
        r#"gang "train": gangs are switched off in the shared configuration (features.gangs: false), so this pod is placed on its own, not all or nothing with the rest"#
    );
    // The labels are still checked.
    assert_eq!(
        err_with(
            &config,
            json!({"aliyun.com/gpu": "1"}),
            json!({"metadata": {"labels": {"aliyun.com/min-member": "0", "aliyun.com/gang-name": "g"}}})
        ),
        r#"label aliyun.com/min-member must be a whole number of at least 1; got "0""#
    );
}

#[test]
fn our_gpu_pods_need_our_runtime_class() {
    assert_eq!(
        err(
            json!({"nvidia.com/gpu": "1"}),
            json!({"spec": {"runtimeClassName": null}})
        ),
        "pods that ask for cards need runtimeClassName: lj-runtime so the devices are injected; got none"
    );
    assert_eq!(
        err(
            json!({"nvidia.com/gpu": "1"}),
            json!({"spec": {"runtimeClassName": "runc"}})
        ),
        r#"pods that ask for cards need runtimeClassName: lj-runtime so the devices are injected; got "runc""#
    );
}

#[test]
fn other_schedulers_keep_whole_cards_but_cannot_share() {
    let default_scheduler = json!({"spec": {"schedulerName": null, "runtimeClassName": null}});
    let request = parse_pod(
        &pod(json!({"nvidia.com/gpu": "1"}), default_scheduler.clone()),
        &RuntimeKitConfig::default(),
    )
    .expect("whole cards are the default scheduler's business");
    assert!(!request.ours);
    assert_eq!(
        err(
            json!({"aliyun.com/gpu-core": "50"}),
            default_scheduler.clone()
        ),
        r#"aliyun.com/gpu-core needs schedulerName: lj-runtimekit-scheduler; the scheduler "default-scheduler" cannot share cards"#
    );
    assert_eq!(
        err(json!({"aliyun.com/gpu-slice": "1"}), default_scheduler),
        r#"aliyun.com/gpu-slice needs schedulerName: lj-runtimekit-scheduler; the scheduler "default-scheduler" cannot share cards"#
    );
}

#[test]
fn init_containers_get_no_cards() {
    let init = json!({"spec": {"initContainers": [{"name": "setup", "image": "img", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}});
    assert_eq!(
        err(json!({"nvidia.com/gpu": "1"}), init),
        r#"init container "setup" asks for nvidia.com/gpu; cards are given to regular containers only"#
    );
}

#[test]
fn every_container_is_its_own_request() {
    let two = json!({"spec": {"containers": [
        {"name": "a", "image": "img", "resources": {"limits": {"aliyun.com/gpu-core": "30"}}},
        {"name": "sidecar", "image": "img"},
        {"name": "b", "image": "img", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
    ]}});
    let request = parse_pod(&pod(NONE, two), &RuntimeKitConfig::default()).expect("valid");
    let names: Vec<_> = request
        .containers
        .iter()
        .map(|c| c.container.as_str())
        .collect();
    assert_eq!(names, ["a", "b"]);
}

#[test]
fn all_violations_are_reported_together() {
    let e = err(
        json!({"aliyun.com/gpu-slice": "5", "aliyun.com/rdma": "3"}),
        json!({"spec": {"runtimeClassName": null}}),
    );
    assert_eq!(
        e,
        r#"container "app": aliyun.com/gpu-slice must be one of 1, 2, 3, 4, 7; got 5; container "app": aliyun.com/rdma must be 0 or 1 (it is a switch, not a NIC count); got 3"#
    );
}

#[test]
fn the_prefix_renames_every_resource() {
    let config = RuntimeKitConfig {
        resource_prefix: "example.org".into(),
        ..Default::default()
    };
    let request = parse_pod(
        &pod(
            json!({"example.org/gpu-core": "20", "aliyun.com/gpu-core": "90"}),
            NONE,
        ),
        &config,
    )
    .expect("valid");
    assert_eq!(
        request.containers[0].cards,
        tdm(1, Some(20), None),
        "aliyun.com is just another vendor now"
    );
    assert_eq!(
        err_with(&config, json!({"example.org/gpu-slice": "5"}), NONE),
        r#"container "app": example.org/gpu-slice must be one of 1, 2, 3, 4, 7; got 5"#
    );
}

#[test]
fn violations_have_stable_reasons() {
    let e = parse_pod(
        &pod(json!({"aliyun.com/gpu-slice": "5"}), NONE),
        &RuntimeKitConfig::default(),
    )
    .expect_err("invalid");
    assert_eq!(e.reason(), "InvalidGpuSlice");
}

#[test]
fn min_member_must_equal_the_jobs_parallelism() {
    use runtimekit_contract::{GangMembership, check_gang_size};
    let names = RuntimeKitConfig::default().names();
    let gang = GangMembership {
        name: "train".into(),
        job_set: Some("train".into()),
        min_member: 7,
    };
    assert_eq!(
        check_gang_size(&names, &gang, r#"replicated job "worker""#, 7),
        Ok(())
    );
    assert_eq!(
        check_gang_size(&names, &gang, r#"replicated job "worker""#, 6).map_err(|v| v.to_string()),
        Err(r#"label aliyun.com/min-member is 7 but replicated job "worker" runs 6 pods with it at once; they must be equal"#.to_owned())
    );
}
