use super::*;
use proptest::prelude::*;
use runtimekit_contract::{RuntimeKitConfig, parse_pod};
use serde_json::{Value, json};
use std::sync::Arc;

fn names() -> ResourceNames {
    RuntimeKitConfig::default().names()
}

fn pod(labels: Value, limits: Value, extra: Value) -> Pod {
    let mut spec = json!({"schedulerName": "lj-runtimekit-scheduler", "runtimeClassName": "lj-runtime",
        "containers": [{"name": "app", "resources": {"limits": limits}}]});
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "team-a", "uid": "u", "labels": labels},
        "spec": spec}))
    .expect("pod")
}

/// What `pod` holds when our scheduler places it.
fn held(pod: &Pod) -> Holding {
    let request = parse_pod(pod, &RuntimeKitConfig::default()).expect("contract");
    Holding::of(pod, Some(&request), &names()).expect("holds cards")
}

fn quota(hard: Value, spec: Value) -> Quota {
    let mut spec_value = json!({"hard": hard});
    if let (Some(s), Some(extra)) = (spec_value.as_object_mut(), spec.as_object()) {
        s.extend(extra.clone());
    }
    let rq: ResourceQuota = serde_json::from_value(json!({
        "metadata": {"name": "gpu", "namespace": "team-a"}, "spec": spec_value}))
    .expect("quota");
    Quota::from_resource_quota(&rq, &names()).expect("limits cards")
}

#[test]
fn replicas_multiply_shares_and_whole_cards_count_once() {
    let share = pod(
        json!({"replica": "2"}),
        json!({"aliyun.com/gpu-core": "50", "aliyun.com/gpu-memory": "8"}),
        json!({}),
    );
    let h = held(&share);
    assert_eq!(h.amounts["aliyun.com/gpu-core"], 100);
    assert_eq!(h.amounts["aliyun.com/gpu-memory"], 16);
    let whole = pod(json!({}), json!({"aliyun.com/gpu": "4"}), json!({}));
    assert_eq!(held(&whole).amounts["aliyun.com/gpu"], 4);
    // Another scheduler's pod holds what it requests: it does not know our replica label.
    assert_eq!(
        Holding::of(&share, None, &names()).expect("holds").amounts["aliyun.com/gpu-core"],
        50
    );
    // A pod asking for no cards holds nothing here.
    assert!(
        Holding::of(
            &pod(json!({}), json!({"cpu": "1"}), json!({})),
            None,
            &names()
        )
        .is_none()
    );
}

#[test]
fn the_third_half_card_of_a_one_card_quota_is_refused() {
    let mut quotas = Quotas::default();
    quotas.upsert_quota(
        "team-a",
        quota(json!({"requests.aliyun.com/gpu-core": "100"}), json!({})),
    );
    let half = held(&pod(
        json!({}),
        json!({"aliyun.com/gpu-core": "50"}),
        json!({}),
    ));
    quotas.check("team-a", [&half]).expect("first fits");
    quotas.hold("a", "team-a", Arc::new(half.clone()));
    quotas.check("team-a", [&half]).expect("second fits");
    quotas.hold("b", "team-a", Arc::new(half.clone()));
    let refused = quotas.check("team-a", [&half]).expect_err("third is over");
    assert_eq!(
        refused.to_string(),
        "namespace team-a would hold 150 of its 100 aliyun.com/gpu-core (ResourceQuota gpu, each replica counted)"
    );
    // Other namespaces are not limited by it.
    quotas.check("team-b", [&half]).expect("no quota there");
    // A released pod frees its part.
    assert!(quotas.release("a"));
    quotas.check("team-a", [&half]).expect("room again");
}

#[test]
fn a_replica_pod_counts_every_card_against_the_quota() {
    let mut quotas = Quotas::default();
    quotas.upsert_quota(
        "team-a",
        quota(json!({"requests.aliyun.com/gpu-core": "100"}), json!({})),
    );
    let two = held(&pod(
        json!({"replica": "2"}),
        json!({"aliyun.com/gpu-core": "50"}),
        json!({}),
    ));
    quotas.hold("a", "team-a", Arc::new(two));
    let half = held(&pod(
        json!({}),
        json!({"aliyun.com/gpu-core": "50"}),
        json!({}),
    ));
    let refused = quotas
        .check("team-a", [&half])
        .expect_err("the replica pod holds 100");
    assert_eq!((refused.would, refused.hard), (150, 100));
    // A gang is checked as one: two halves together do not fit beside one.
    let mut gang = Quotas::default();
    gang.upsert_quota(
        "team-a",
        quota(json!({"requests.aliyun.com/gpu-core": "100"}), json!({})),
    );
    gang.hold("a", "team-a", Arc::new(half.clone()));
    assert!(gang.check("team-a", [&half, &half]).is_err());
    gang.check("team-a", [&half]).expect("one more fits");
}

#[test]
fn a_quota_added_later_counts_what_is_held_already() {
    let mut quotas = Quotas::default();
    let whole = held(&pod(json!({}), json!({"nvidia.com/gpu": "2"}), json!({})));
    quotas.hold("a", "team-a", Arc::new(whole.clone()));
    quotas.upsert_quota(
        "team-a",
        quota(json!({"requests.nvidia.com/gpu": "3"}), json!({})),
    );
    assert_eq!(quotas.usage()[0].held, 2);
    assert!(quotas.check("team-a", [&whole]).is_err());
    // Lowered below what is held: pods that add nothing of it still pass.
    quotas.upsert_quota(
        "team-a",
        quota(
            json!({"requests.nvidia.com/gpu": "1", "requests.aliyun.com/gpu-core": "100"}),
            json!({}),
        ),
    );
    let share = held(&pod(
        json!({}),
        json!({"aliyun.com/gpu-core": "10"}),
        json!({}),
    ));
    quotas
        .check("team-a", [&share])
        .expect("adds no nvidia.com/gpu");
    quotas.remove_quota("team-a", "gpu");
    quotas.check("team-a", [&whole]).expect("no quota left");
    assert!(quotas.quota_keys().is_empty());
}

#[test]
fn scopes_pick_the_pods_a_quota_counts() {
    let scoped = quota(
        json!({"requests.aliyun.com/gpu-core": "50"}),
        json!({"scopeSelector": {"matchExpressions": [
            {"scopeName": "PriorityClass", "operator": "In", "values": ["prod"]}]}}),
    );
    let mut quotas = Quotas::default();
    quotas.upsert_quota("team-a", scoped);
    let dev = held(&pod(
        json!({}),
        json!({"aliyun.com/gpu-core": "80"}),
        json!({}),
    ));
    quotas.check("team-a", [&dev]).expect("not of class prod");
    let prod = held(&pod(
        json!({}),
        json!({"aliyun.com/gpu-core": "80"}),
        json!({"priorityClassName": "prod"}),
    ));
    assert!(quotas.check("team-a", [&prod]).is_err());
    // Terminating, BestEffort and their opposites.
    let facts = ScopeFacts {
        priority_class: String::new(),
        terminating: true,
        best_effort: true,
    };
    assert!(Scope::Terminating.matches(&facts) && !Scope::NotTerminating.matches(&facts));
    assert!(Scope::BestEffort.matches(&facts) && !Scope::NotBestEffort.matches(&facts));
    let with_cpu = pod(
        json!({}),
        json!({"cpu": "1", "aliyun.com/gpu": "1"}),
        json!({"activeDeadlineSeconds": 60}),
    );
    let facts = ScopeFacts::of(&with_cpu);
    assert!(facts.terminating && !facts.best_effort);
}

#[test]
fn quotas_on_other_resources_or_unknown_scopes_count_nothing_here() {
    let rq = |spec: Value| -> ResourceQuota {
        serde_json::from_value(json!({"metadata": {"name": "q"}, "spec": spec})).expect("quota")
    };
    assert!(
        Quota::from_resource_quota(&rq(json!({"hard": {"requests.cpu": "10"}})), &names())
            .is_none()
    );
    // Extended resources are limited only in the requests. form.
    assert!(
        Quota::from_resource_quota(&rq(json!({"hard": {"aliyun.com/gpu": "1"}})), &names())
            .is_none()
    );
    assert!(
        Quota::from_resource_quota(
            &rq(json!({"hard": {"requests.aliyun.com/gpu": "1"}, "scopes": ["SomethingNew"]})),
            &names()
        )
        .is_none()
    );
}

proptest! {
    /// Whatever order pods are held and released in, each quota's use is the sum of what the
    /// pods still held hold, and a check refuses exactly when that sum plus the new pod's share
    /// exceeds the limit.
    #[test]
    fn use_is_the_sum_of_what_is_held(
        ops in proptest::collection::vec((0usize..6, proptest::option::of(1i64..80)), 1..40),
        adding in 1i64..80,
        hard in 1i64..300,
    ) {
        let mut quotas = Quotas::default();
        quotas.upsert_quota("ns", quota(json!({"requests.aliyun.com/gpu-core": hard.to_string()}), json!({})));
        let share = |core: i64| Holding {
            amounts: BTreeMap::from([("aliyun.com/gpu-core".to_owned(), core)]),
            facts: ScopeFacts::default(),
        };
        let mut model: BTreeMap<usize, i64> = BTreeMap::new();
        for (pod, core) in ops {
            let uid = format!("u{pod}");
            match core {
                Some(core) => { quotas.hold(&uid, "ns", Arc::new(share(core))); model.insert(pod, core); }
                None => { quotas.release(&uid); model.remove(&pod); }
            }
        }
        let sum: i64 = model.values().sum();
        prop_assert_eq!(quotas.usage()[0].held, sum);
        let fits = quotas.check("ns", [&share(adding)]).is_ok();
        prop_assert_eq!(fits, sum + adding <= hard);
        // Re-reading the same quota (a status write, a watch re-list) changes nothing.
        let same = quota(json!({"requests.aliyun.com/gpu-core": hard.to_string()}), json!({}));
        prop_assert!(!quotas.upsert_quota("ns", same), "an unchanged quota reads as changed");
        prop_assert_eq!(quotas.usage()[0].held, sum);
        // A changed limit recomputes the use from what is held.
        let raised = quota(json!({"requests.aliyun.com/gpu-core": (hard + 1).to_string()}), json!({}));
        prop_assert!(quotas.upsert_quota("ns", raised), "a raised limit reads as unchanged");
        prop_assert_eq!(quotas.usage()[0].held, sum);
    }
}
