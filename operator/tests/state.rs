//! The operator's state without an apiserver: nodes, TopologyGroups, pods and GpuSlices applied
//! as the watches deliver them, then decisions, per-pod backoff, retries when capacity frees, and
//! the rebuild of a restarted operator from GpuSlices and the pods' allocation annotations.

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use runtimekit_contract::RuntimeKitConfig;
use runtimekit_crds::{
    CardHealth, CardStatus, GpuSlice, TopologyGroup, TopologyGroupSpec, TopologyGroupStatus, Vendor,
};
use runtimekit_operator::state::{Binding, Outcome, RESTORE_GRACE, State, Unfinalize};
use runtimekit_placement::objects::slices_and_allocation;
use serde_json::json;
use std::time::{Duration, Instant};

fn node(name: &str) -> Node {
    let resources = json!({"cpu": "64", "memory": "512Gi", "pods": "110"});
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "lj_runtimekit_enable": "true"}},
        "status": {"capacity": resources, "allocatable": resources,
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }))
    .expect("node")
}

/// The node-tier TopologyGroup an agent writes for `node` with `cards` H800 cards.
fn group(node: &str, cards: u32, heartbeat: Timestamp) -> TopologyGroup {
    let spec: TopologyGroupSpec =
        serde_json::from_value(json!({"tier": "Node", "nodeName": node})).expect("spec");
    let mut group = TopologyGroup::new(node, spec);
    group.status = Some(TopologyGroupStatus {
        cards: (0..cards)
            .map(|index| CardStatus {
                index,
                uuid: format!("GPU-{node}-{index}"),
                vendor: Vendor::Nvidia,
                model: "NVIDIA H800".into(),
                memory_mib: 80 * 1024,
                mig_capable: true,
                mig_enabled: false,
                health: CardHealth::Healthy,
                health_reason: None,
                pcie_switch: Some(format!("sw{}", index / 2)),
                numa_node: Some(0),
                socket: Some(0),
                interconnect_group: None,
                nvlink_peers: vec![],
                mig_instances: vec![],
                held_by: vec![],
            })
            .collect(),
        heartbeat_time: Some(Time(heartbeat)),
        ..TopologyGroupStatus::default()
    });
    group
}

/// A pending pod of our scheduler with `limits`, created `age` seconds ago.
fn pod(name: &str, limits: serde_json::Value, age: i64) -> Pod {
    let created = Timestamp::now()
        .checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(age))
        .expect("time");
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                     "creationTimestamp": created.to_string()},
        "spec": {"schedulerName": "lj-runtimekit-scheduler", "runtimeClassName": "lj-runtime",
                 "containers": [{"name": "app", "image": "busybox",
                                 "resources": {"limits": limits}}]},
    }))
    .expect("pod")
}

fn whole() -> serde_json::Value {
    json!({"nvidia.com/gpu": "1"})
}

/// A state with one node of `cards` cards and its agent reporting, fully synced.
fn cluster(cards: u32) -> State {
    let mut state = State::new(RuntimeKitConfig::default());
    state.apply_node(&node("n1"));
    state.apply_group(&group("n1", cards, Timestamp::now()), Timestamp::now());
    state.refresh_topology();
    state.pods_synced();
    state
}

/// Decides `uid`, which must be placed (the error is the outcome it got instead).
fn bind(state: &mut State, uid: &str, now: Instant) -> Binding {
    match state.schedule(uid, now) {
        Outcome::Bind(binding) => Ok(*binding),
        other => Err(other),
    }
    .expect("the pod is placed")
}

/// A cluster of `cards` cards where pod `a`, asking for one whole card, has just been decided.
fn decided_a(cards: u32) -> (State, Instant, Binding) {
    let mut state = cluster(cards);
    let now = Instant::now();
    state.apply_pod(&pod("a", whole(), 10));
    let a = bind(&mut state, "uid-a", now);
    (state, now, a)
}

/// The pod as the apiserver has it once the Binding landed (on its node, with the allocation
/// annotation the Binding carried), and the slices the binding writes.
fn written(binding: &Binding) -> (Pod, Vec<GpuSlice>) {
    let (slices, allocation) = slices_and_allocation(&binding.pod, &binding.decision);
    let mut pod = (*binding.pod).clone();
    pod.spec.as_mut().expect("spec").node_name = Some(binding.decision.node.clone());
    pod.metadata.annotations = Some(
        [(
            binding.annotation.clone(),
            serde_json::to_string(&allocation).expect("json"),
        )]
        .into(),
    );
    (pod, slices)
}

/// A binding's writes all succeed, then the watches deliver the slices and the bound pod.
fn land(state: &mut State, binding: &Binding) -> (Pod, Vec<GpuSlice>) {
    let (pod, slices) = written(binding);
    let uid = pod.metadata.uid.clone().expect("uid");
    state.slices_created(slices.iter().map(|s| (s, true)));
    state.bound(&uid);
    for slice in &slices {
        state.apply_slice(slice);
    }
    state.apply_pod(&pod);
    (pod, slices)
}

/// A state that has just listed `pods` and `slices` after a restart, on one node of `cards`.
fn restarted(cards: u32, pods: &[&Pod], slices: &[&GpuSlice]) -> State {
    let mut state = State::new(RuntimeKitConfig::default());
    state.apply_node(&node("n1"));
    state.apply_group(&group("n1", cards, Timestamp::now()), Timestamp::now());
    state.refresh_topology();
    for pod in pods {
        state.apply_pod(pod);
    }
    state.pods_synced();
    for slice in slices {
        state.apply_slice(slice);
    }
    state.slices_relisted();
    state
}

/// The card a decision gave its first container.
fn card_of(binding: &Binding) -> u32 {
    binding.decision.containers[0].cards[0].index
}

#[test]
fn new_counts_of_the_same_reason_are_reported_at_most_once_a_minute() {
    let mut state = cluster(1);
    let now = Instant::now();
    state.apply_pod(&pod("first", whole(), 10));
    state.apply_pod(&pod("second", whole(), 5));
    bind(&mut state, "uid-first", now);
    let Outcome::Unschedulable { changed, .. } = state.schedule("uid-second", now) else {
        panic!("the only card is taken");
    };
    assert!(changed);
    // A second node, taken at once: the same reason, only its counts move.
    state.apply_node(&node("n2"));
    state.apply_group(&group("n2", 1, Timestamp::now()), Timestamp::now());
    state.refresh_topology();
    state.apply_pod(&pod("third", whole(), 1));
    bind(&mut state, "uid-third", now);
    let recount = |state: &mut State, at: Instant| match state.schedule("uid-second", at) {
        Outcome::Unschedulable { message, changed } => (message, changed),
        other => panic!("no card is free: {other:?}"),
    };
    let (message, changed) = recount(&mut state, now + Duration::from_secs(2));
    assert!(
        message.starts_with("0/2 nodes are available: 2 "),
        "{message}"
    );
    assert!(!changed, "new counts alone wait");
    let (_, changed) = recount(&mut state, now + Duration::from_secs(60));
    assert!(changed, "and are reported a minute after the last report");
    // A new reason is reported at once.
    state.apply_group(&faulted_group("n2", 1, &[0]), Timestamp::now());
    let (message, changed) = recount(&mut state, now + Duration::from_secs(61));
    assert!(changed, "{message}");
}

#[test]
fn pending_pods_are_decided_oldest_first() {
    let mut state = cluster(2);
    state.apply_pod(&pod("young", whole(), 1));
    state.apply_pod(&pod("old", whole(), 60));
    state.apply_pod(&pod("middle", whole(), 30));
    assert_eq!(
        state.ready(Instant::now(), 10),
        ["uid-old", "uid-middle", "uid-young"]
    );
    assert_eq!(state.ready(Instant::now(), 2), ["uid-old", "uid-middle"]);
}

#[test]
fn a_pod_that_does_not_fit_backs_off_and_retries_when_capacity_frees() {
    let mut state = cluster(1);
    let now = Instant::now();
    state.apply_pod(&pod("first", whole(), 10));
    state.apply_pod(&pod("second", whole(), 5));
    let first = bind(&mut state, "uid-first", now);
    let (first_pod, first_slices) = land(&mut state, &first);

    // The only card is taken: the second pod waits 2 s, then 4 s, each time with the reason
    // reported only when it changes.
    let Outcome::Unschedulable { message, changed } = state.schedule("uid-second", now) else {
        panic!("the second pod cannot fit");
    };
    assert!(changed);
    assert!(
        message.starts_with("0/1 nodes are available: 1 "),
        "{message}"
    );
    assert!(state.ready(now, 10).is_empty(), "backing off");
    assert!(
        state
            .ready(now + Duration::from_millis(1900), 10)
            .is_empty()
    );
    let retry = now + Duration::from_secs(2);
    assert_eq!(state.ready(retry, 10), ["uid-second"]);
    let Outcome::Unschedulable { changed, .. } = state.schedule("uid-second", retry) else {
        panic!("still no room");
    };
    assert!(!changed, "the same reason is not reported twice");
    assert!(
        state
            .ready(retry + Duration::from_millis(3900), 10)
            .is_empty()
    );
    assert_eq!(
        state.ready(retry + Duration::from_secs(4), 10),
        ["uid-second"]
    );

    // The first pod ends: its slice is released, and only when the slice is gone does the
    // capacity return and the waiting pod try again soon, long before its backoff ends.
    let mut ended = first_pod.clone();
    ended.status = Some(serde_json::from_value(json!({"phase": "Succeeded"})).expect("status"));
    state.apply_pod(&ended);
    let work = state.take_work();
    assert_eq!(work.release.len(), 1, "the ended pod's slice is released");
    let Outcome::Unschedulable { .. } = state.schedule("uid-second", retry) else {
        panic!("the card is still held while its slice is being released");
    };
    let slice = &first_slices[0];
    state.delete_slice(
        slice.metadata.namespace.as_deref().expect("namespace"),
        slice.metadata.name.as_deref().expect("name"),
        Instant::now(),
    );
    assert!(state.take_capacity_freed());
    let later = retry + Duration::from_millis(10);
    state.retry_soon(later);
    assert_eq!(
        state.ready(later + Duration::from_millis(200), 10),
        ["uid-second"]
    );
    let second = bind(&mut state, "uid-second", later);
    assert_eq!(second.decision.containers[0].cards[0].index, 0);
}

#[test]
fn a_restarted_operator_rebuilds_allocations_from_slices() {
    let mut before = cluster(2);
    let now = Instant::now();
    before.apply_pod(&pod("a", whole(), 10));
    let a = bind(&mut before, "uid-a", now);
    let (a_pod, a_slices) = land(&mut before, &a);

    // A new operator sees the same objects, in watch order: slices may come before pods.
    let mut after = State::new(RuntimeKitConfig::default());
    for slice in &a_slices {
        after.apply_slice(slice);
    }
    after.apply_node(&node("n1"));
    after.apply_group(&group("n1", 2, Timestamp::now()), Timestamp::now());
    after.refresh_topology();
    after.apply_pod(&a_pod);
    after.pods_synced();
    assert!(
        after.take_work().release.is_empty(),
        "a live pod's slices are not orphans"
    );
    after.apply_pod(&pod("b", whole(), 5));
    after.apply_pod(&pod("c", whole(), 1));
    let b = bind(&mut after, "uid-b", now);
    assert_ne!(
        b.decision.containers[0].cards[0].index, a.decision.containers[0].cards[0].index,
        "the card held by a's slice is not handed out again"
    );
    land(&mut after, &b);
    let Outcome::Unschedulable { .. } = after.schedule("uid-c", now) else {
        panic!("both cards are held");
    };
}

#[test]
fn slices_without_a_live_pod_are_released_after_the_first_full_list() {
    let mut before = cluster(1);
    before.apply_pod(&pod("gone", whole(), 10));
    let gone = bind(&mut before, "uid-gone", Instant::now());
    let (_, slices) = land(&mut before, &gone);

    let mut after = State::new(RuntimeKitConfig::default());
    after.apply_node(&node("n1"));
    after.apply_group(&group("n1", 1, Timestamp::now()), Timestamp::now());
    for slice in &slices {
        after.apply_slice(slice);
    }
    assert!(
        after.take_work().release.is_empty(),
        "nothing is released before the pods are listed"
    );
    after.pods_synced();
    let released = after.take_work().release;
    assert_eq!(released.len(), 1, "the orphan is released: {released:?}");
    // Seen again before the watch shows it deleting: its delete is on its way, not sent twice.
    for slice in &slices {
        after.apply_slice(slice);
    }
    assert!(after.take_work().release.is_empty());
    // A delete that failed is sent again.
    after.release_again(released.iter().cloned().collect());
    assert_eq!(after.take_work().release, released);
    // Once the watch shows it deleting, it is never deleted again.
    for slice in &slices {
        let mut deleting = slice.clone();
        deleting.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
        after.apply_slice(&deleting);
    }
    assert!(after.take_work().release.is_empty());
}

#[test]
fn a_stale_agent_has_its_cards_withheld() {
    let mut state = State::new(RuntimeKitConfig::default());
    state.apply_node(&node("n1"));
    let old = Timestamp::now()
        .checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(180))
        .expect("time");
    state.apply_group(&group("n1", 1, old), Timestamp::now());
    state.refresh_topology();
    state.pods_synced();
    state.apply_pod(&pod("p", whole(), 1));
    let Outcome::Unschedulable { message, .. } = state.schedule("uid-p", Instant::now()) else {
        panic!("the stale node's cards are not offered");
    };
    assert!(message.starts_with("0/1 nodes are available"), "{message}");
    state.apply_group(&group("n1", 1, Timestamp::now()), Timestamp::now());
    bind(&mut state, "uid-p", Instant::now() + Duration::from_secs(2));
}

#[test]
fn a_node_without_the_runtime_handler_has_its_cards_withheld() {
    let mut state = State::new(RuntimeKitConfig::default());
    state.apply_node(&node("n1"));
    let runtime = |status: &str| {
        let mut group = group("n1", 1, Timestamp::now());
        if let Some(s) = group.status.as_mut() {
            s.conditions.push(Condition {
                type_: "RuntimeReady".into(),
                status: status.into(),
                reason: "ContainerdConfigUnparsable".into(),
                message: "containerd's configuration cannot be read as TOML".into(),
                last_transition_time: Time(Timestamp::now()),
                observed_generation: None,
            });
        }
        group
    };
    state.apply_group(&runtime("False"), Timestamp::now());
    state.refresh_topology();
    state.pods_synced();
    state.apply_pod(&pod("p", whole(), 1));
    let Outcome::Unschedulable { message, .. } = state.schedule("uid-p", Instant::now()) else {
        panic!("the cards of a node without the handler are offered");
    };
    assert!(
        message.contains("1 node(s) had no node agent offering cards"),
        "{message}"
    );
    // A heartbeat does not offer them again while the condition stays False.
    state.refresh_heartbeats(Timestamp::now());
    assert!(matches!(
        state.schedule("uid-p", Instant::now() + Duration::from_secs(1)),
        Outcome::Unschedulable { .. }
    ));
    state.apply_group(&runtime("True"), Timestamp::now());
    bind(
        &mut state,
        "uid-p",
        Instant::now() + Duration::from_secs(30),
    );
}

#[test]
fn only_an_agent_that_stopped_heartbeating_is_reported_stale() {
    let mut state = State::new(RuntimeKitConfig::default());
    state.apply_node(&node("n1"));
    let now = Timestamp::now();
    let ago = |seconds: i64| {
        now.checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(seconds))
            .expect("time")
    };
    // Created by its agent, status not written yet: not reported stale.
    let mut created = group("n1", 1, now);
    created.status = None;
    state.apply_group(&created, now);
    state.refresh_topology();
    assert!(state.topology_plan(now).reporting.is_empty());
    // Reporting from then on: nothing to report either.
    state.apply_group(&group("n1", 1, now), now);
    assert!(state.topology_plan(now).reporting.is_empty());
    // Three missed beats: reported once, and again once it resumes.
    state.apply_group(&group("n1", 1, ago(100)), now);
    assert_eq!(
        state.topology_plan(now).reporting,
        vec![("n1".to_owned(), false)]
    );
    assert!(state.topology_plan(now).reporting.is_empty());
    state.apply_group(&group("n1", 1, now), now);
    assert_eq!(
        state.topology_plan(now).reporting,
        vec![("n1".to_owned(), true)]
    );
}

/// `node` with `taints` (key, value, effect).
fn tainted(name: &str, taints: &[(&str, &str, &str)]) -> Node {
    let mut node = node(name);
    let taints = taints
        .iter()
        .map(|(key, value, effect)| json!({"key": key, "value": value, "effect": effect}))
        .collect::<Vec<_>>();
    node.spec = Some(serde_json::from_value(json!({"taints": taints})).expect("spec"));
    node
}

/// `group` with the cards of `faulted` reported Unhealthy.
fn faulted_group(node: &str, cards: u32, faulted: &[u32]) -> TopologyGroup {
    let mut group = group(node, cards, Timestamp::now());
    for card in &mut group.status.as_mut().expect("status").cards {
        if faulted.contains(&card.index) {
            card.health = CardHealth::Unhealthy;
            card.health_reason = Some("XID 79: GPU has fallen off the bus".into());
        }
    }
    group
}

#[test]
fn the_health_taint_follows_faulted_cards_only_when_switched_on() {
    use runtimekit_contract::HealthTaint;
    let key = "aliyun.com/gpu-unhealthy";
    let other = ("dedicated", "infer", "PreferNoSchedule");
    let with = |setting: HealthTaint| {
        let mut config = RuntimeKitConfig::default();
        config.features.health_taint = setting;
        let mut state = State::new(config);
        state.apply_node(&tainted("n1", &[other]));
        state.apply_group(&faulted_group("n1", 8, &[3, 5]), Timestamp::now());
        state
    };

    // Off (the default): a faulted card taints nothing.
    assert_eq!(with(HealthTaint::Off).health_taint_changes(), vec![]);

    let mut state = with(HealthTaint::NoSchedule);
    assert_eq!(state.health_taint_key(), key);
    let changes = state.health_taint_changes();
    assert_eq!(changes.len(), 1, "{changes:?}");
    let taint = changes[0]
        .taint
        .clone()
        .expect("a taint while cards are faulted");
    assert_eq!(
        (changes[0].node.as_str(), taint.value.as_str()),
        ("n1", "gpu3_gpu5")
    );
    assert_eq!(taint.effect, runtimekit_placement::TaintEffect::NoSchedule);

    // Once the Node carries it, nothing more is asked; when the cards heal it goes.
    state.apply_node(&tainted("n1", &[other, (key, "gpu3_gpu5", "NoSchedule")]));
    assert_eq!(state.health_taint_changes(), vec![]);
    state.apply_group(&faulted_group("n1", 8, &[]), Timestamp::now());
    let changes = state.health_taint_changes();
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert_eq!(changes[0].taint, None);

    // A fault on another card changes the value; PreferNoSchedule is honoured as set.
    let mut state = with(HealthTaint::PreferNoSchedule);
    state.apply_node(&tainted("n1", &[(key, "gpu3", "PreferNoSchedule")]));
    let changes = state.health_taint_changes();
    assert_eq!(
        changes[0].taint.as_ref().map(|t| t.value.as_str()),
        Some("gpu3_gpu5")
    );

    // Switched off with a taint left from before: it is removed.
    let mut state = with(HealthTaint::Off);
    state.apply_node(&tainted("n1", &[other, (key, "gpu3", "NoSchedule")]));
    let changes = state.health_taint_changes();
    assert_eq!((changes.len(), changes[0].taint.clone()), (1, None));
}

#[test]
fn a_broken_request_is_reported_once_with_the_contract_message() {
    let mut state = cluster(1);
    let now = Instant::now();
    state.apply_pod(&pod("bad", json!({"aliyun.com/gpu-slice": "5"}), 1));
    let Outcome::Invalid {
        message,
        reason,
        changed,
    } = state.schedule("uid-bad", now)
    else {
        panic!("the request breaks the contract");
    };
    assert!(changed);
    assert_eq!(reason, "InvalidGpuSlice");
    assert!(
        message.contains("aliyun.com/gpu-slice must be one of 1, 2, 3, 4, 7; got 5"),
        "{message}"
    );
    assert!(
        state.ready(now + Duration::from_secs(30), 10).is_empty(),
        "a broken pod is retried rarely"
    );
    state.retry_soon(now);
    assert!(
        state.ready(now + Duration::from_secs(1), 10).is_empty(),
        "freed capacity does not help a broken pod"
    );
}

#[test]
fn a_pod_whose_binding_landed_is_not_decided_again_before_the_watch_shows_it() {
    let mut state = cluster(2);
    let now = Instant::now();
    state.apply_pod(&pod("p", whole(), 1));
    let binding = bind(&mut state, "uid-p", now);
    // The Binding was accepted; the watch has not delivered the bound pod yet.
    state.bound("uid-p");
    assert!(state.ready(now, 10).is_empty(), "not offered again");
    assert!(
        matches!(state.schedule("uid-p", now), Outcome::Skip),
        "not decided again"
    );
    land(&mut state, &binding);
    assert!(
        !state.in_flight("uid-p"),
        "done once the watch shows it bound"
    );
}

#[test]
fn a_restarted_operator_rebuilds_allocations_from_pod_annotations() {
    let mut before = cluster(2);
    let now = Instant::now();
    before.apply_pod(&pod("a", whole(), 10));
    let a = bind(&mut before, "uid-a", now);
    // The Binding landed but the operator died before its slice was written.
    let (a_pod, a_slices) = written(&a);

    let mut after = restarted(2, &[&a_pod], &[]);
    after.apply_pod(&pod("b", whole(), 5));
    after.apply_pod(&pod("c", whole(), 1));
    let b = bind(&mut after, "uid-b", now);
    assert_ne!(
        card_of(&b),
        card_of(&a),
        "the card a's annotation records is not handed out again"
    );
    land(&mut after, &b);
    assert!(
        matches!(after.schedule("uid-c", now), Outcome::Unschedulable { .. }),
        "both cards are held"
    );
    assert_eq!(
        after.restore_due(now),
        a_slices,
        "only a's slice is re-created, as the first operator would have written it"
    );
    // A failed re-creation waits before it is tried again.
    after.restored("uid-a", false, now);
    assert!(after.restore_due(now + Duration::from_secs(1)).is_empty());
    assert_eq!(after.restore_due(now + Duration::from_secs(2)), a_slices);

    // Once the re-created slice shows, nothing is missing and the card stays held.
    after.apply_slice(&a_slices[0]);
    assert!(after.restore_due(now + Duration::from_secs(60)).is_empty());
    assert!(matches!(
        after.schedule("uid-c", now + Duration::from_secs(5)),
        Outcome::Unschedulable { .. }
    ));
}

#[test]
fn slices_the_allocation_does_not_name_are_released_and_not_counted() {
    let mut before = cluster(2);
    let now = Instant::now();
    before.apply_pod(&pod("a", whole(), 10));
    let a = bind(&mut before, "uid-a", now);
    let (a_pod, a_slices) = land(&mut before, &a);
    // A slice of the same pod on the other card, left by a decision that never bound.
    let mut stray = a_slices[0].clone();
    stray.metadata.name = Some("stray".into());
    let card = stray.spec.card.as_mut().expect("card");
    card.index = 1 - card.index;
    card.uuid = format!("GPU-n1-{}", card.index);

    for slices in [vec![&stray, &a_slices[0]], vec![&a_slices[0], &stray]] {
        let mut after = restarted(2, &[&a_pod], &slices);
        let work = after.take_work();
        assert_eq!(
            work.release.into_iter().collect::<Vec<_>>(),
            [("ns".to_owned(), "stray".to_owned())]
        );
        assert!(
            after.missing_slices("uid-a").is_empty(),
            "the named slice exists"
        );
        after.apply_pod(&pod("b", whole(), 5));
        let b = bind(&mut after, "uid-b", now);
        assert_eq!(
            card_of(&b),
            1 - card_of(&a),
            "the stray's card is free to use"
        );
    }
}

#[test]
fn a_slice_deleted_under_a_running_pod_is_recreated_and_its_card_stays_held() {
    let (mut state, now, a) = decided_a(1);
    let (_, a_slices) = land(&mut state, &a);
    assert!(state.restore_due(now).is_empty());
    state.delete_slice(
        "ns",
        &a_slices[0].metadata.name.clone().expect("name"),
        Instant::now(),
    );
    assert!(
        state.restore_due(Instant::now()).is_empty(),
        "the pod may be going too"
    );
    assert_eq!(
        state.restore_due(Instant::now() + RESTORE_GRACE + Duration::from_secs(1)),
        a_slices
    );
    state.apply_pod(&pod("b", whole(), 5));
    assert!(
        matches!(state.schedule("uid-b", now), Outcome::Unschedulable { .. }),
        "the card is still a's"
    );
}

#[test]
fn writes_that_race_the_watch_are_neither_recreated_nor_handed_out() {
    let (mut state, now, a) = decided_a(2);
    let (a_pod, a_slices) = written(&a);
    // The watch shows the pod bound while its slice is still being written.
    state.apply_pod(&a_pod);
    assert!(state.in_flight("uid-a"), "its writes are still running");
    assert!(state.restore_due(now).is_empty());
    state.slices_created(a_slices.iter().map(|s| (s, true)));
    state.bound("uid-a");
    assert!(!state.in_flight("uid-a"));
    assert!(
        state.restore_due(now).is_empty(),
        "the accepted slice is not written twice"
    );
    state.apply_slice(&a_slices[0]);

    // The same race where the slice's write failed: it is re-created.
    state.apply_pod(&pod("b", whole(), 5));
    let b = bind(&mut state, "uid-b", now);
    assert_ne!(card_of(&b), card_of(&a));
    let (b_pod, b_slices) = written(&b);
    state.apply_pod(&b_pod);
    state.bound("uid-b");
    assert_eq!(state.restore_due(now), b_slices);
    state.apply_pod(&pod("c", whole(), 1));
    assert!(
        matches!(state.schedule("uid-c", now), Outcome::Unschedulable { .. }),
        "b's card is held by its annotation meanwhile"
    );
}

#[test]
fn a_failed_binding_keeps_the_cards_of_slices_it_wrote() {
    let (mut state, now, a) = decided_a(2);
    let (_, a_slices) = written(&a);
    // The slice was accepted but the Binding failed; the watch has not shown the slice yet.
    state.slices_created(a_slices.iter().map(|s| (s, true)));
    state.bind_failed("uid-a", now, "posting the Binding: timeout");
    state.apply_pod(&pod("b", whole(), 5));
    let b = bind(&mut state, "uid-b", now);
    assert_ne!(card_of(&b), card_of(&a), "a's written slice holds its card");

    // On its next try a binds to exactly the slice it wrote.
    state.apply_slice(&a_slices[0]);
    let retry = bind(&mut state, "uid-a", now + Duration::from_secs(3));
    assert_eq!(retry.decision, a.decision);
}

#[test]
fn an_ended_pod_frees_the_cards_only_its_annotation_held() {
    let (mut state, now, a) = decided_a(1);
    let (mut a_pod, _) = written(&a);
    state.bound("uid-a");
    state.apply_pod(&a_pod);
    state.take_capacity_freed();
    a_pod.status = Some(serde_json::from_value(json!({"phase": "Succeeded"})).expect("status"));
    state.apply_pod(&a_pod);
    assert!(state.take_capacity_freed());
    assert!(
        state.missing_slices("uid-a").is_empty(),
        "nothing to re-create"
    );
    state.apply_pod(&pod("b", whole(), 5));
    bind(&mut state, "uid-b", now);
}

#[test]
fn a_pod_deleted_while_its_writes_ran_holds_only_the_slices_it_wrote() {
    let (mut state, now, a) = decided_a(1);
    // The watch folds the bound and the deleted pod into one deletion while the writes run;
    // the Binding landed but the slice's write failed.
    state.delete_pod("uid-a");
    state.bound("uid-a");
    assert!(!state.in_flight("uid-a"));
    assert!(state.missing_slices("uid-a").is_empty(), "a is gone");
    state.apply_pod(&pod("b", whole(), 5));
    assert_eq!(card_of(&bind(&mut state, "uid-b", now)), card_of(&a));
}

#[test]
fn a_pod_deleted_after_its_writes_holds_only_the_slices_it_wrote() {
    let (mut state, now, a) = decided_a(2);
    let (_, a_slices) = written(&a);
    // The writes end before the watch shows the pod bound; then it is deleted.
    state.slices_created(a_slices.iter().map(|s| (s, true)));
    state.bound("uid-a");
    state.delete_pod("uid-a");
    state.apply_pod(&pod("b", whole(), 5));
    let b = bind(&mut state, "uid-b", now);
    assert_ne!(
        card_of(&b),
        card_of(&a),
        "a's slice is written though not seen yet"
    );
    state.apply_slice(&a_slices[0]);
    state.delete_slice(
        "ns",
        &a_slices[0].metadata.name.clone().expect("name"),
        Instant::now(),
    );
    state.apply_pod(&pod("c", whole(), 1));
    assert_eq!(card_of(&bind(&mut state, "uid-c", now)), card_of(&a));
}

#[test]
fn a_bound_pod_ending_before_its_slices_show_keeps_their_cards() {
    let (mut state, now, a) = decided_a(1);
    let (a_pod, a_slices) = written(&a);
    state.apply_pod(&a_pod);
    state.slices_created(a_slices.iter().map(|s| (s, true)));
    state.bound("uid-a");
    state.delete_pod("uid-a");
    state.apply_pod(&pod("b", whole(), 5));
    assert!(
        matches!(state.schedule("uid-b", now), Outcome::Unschedulable { .. }),
        "the slice a wrote holds the card until it is gone"
    );
}

#[test]
fn a_pod_deleted_after_writes_that_failed_frees_its_card() {
    let (mut state, now, a) = decided_a(1);
    let (_, a_slices) = written(&a);
    state.slices_created(a_slices.iter().map(|s| (s, false)));
    state.bound("uid-a");
    state.delete_pod("uid-a");
    state.apply_pod(&pod("b", whole(), 5));
    assert_eq!(card_of(&bind(&mut state, "uid-b", now)), card_of(&a));
}

#[test]
fn a_pod_that_ends_while_its_writes_run_frees_what_they_did_not_write() {
    let (mut state, now, a) = decided_a(1);
    let (mut a_pod, a_slices) = written(&a);
    a_pod.status = Some(serde_json::from_value(json!({"phase": "Failed"})).expect("status"));
    state.apply_pod(&a_pod);
    state.slices_created(a_slices.iter().map(|s| (s, false)));
    state.bound("uid-a");
    state.apply_pod(&pod("b", whole(), 5));
    assert_eq!(card_of(&bind(&mut state, "uid-b", now)), card_of(&a));
}

/// A gang member of gang `g` of two, asking for one whole card.
fn member(name: &str) -> Pod {
    let mut pod = pod(name, whole(), 10);
    pod.metadata.labels = Some(
        [
            ("aliyun.com/min-member".to_owned(), "2".to_owned()),
            ("aliyun.com/gang-name".to_owned(), "g".to_owned()),
        ]
        .into(),
    );
    pod
}

#[test]
fn a_gang_member_whose_binding_failed_gives_back_its_card_and_its_slices() {
    let mut state = cluster(2);
    let now = Instant::now();
    state.apply_pod(&member("m0"));
    state.apply_pod(&member("m1"));
    let gang = state
        .reserve_gang("ns", "g", runtimekit_crds::Tier::NetworkPod)
        .expect("the gang fits");
    assert_eq!(gang.members.len(), 2);
    let mut written_slices = Vec::new();
    for (pod, decision) in &gang.members {
        written_slices.extend(slices_and_allocation(pod, decision).0);
    }
    state.slices_created(written_slices.iter().map(|s| (s, true)));
    let failed = gang.members[1].1.pod_uid.clone();
    state.gang_written(
        "ns",
        "g",
        &[
            (gang.members[0].1.pod_uid.clone(), true),
            (failed.clone(), false),
        ],
    );
    assert!(
        !state.in_flight(&failed),
        "the failed member is pending again"
    );
    let work = state.take_work();
    let failed_slice = written_slices
        .iter()
        .find(|s| s.spec.pod.uid == failed)
        .expect("its slice");
    let key = (
        "ns".to_owned(),
        failed_slice.metadata.name.clone().expect("name"),
    );
    assert!(
        work.release.contains(&key) && work.unfinalize.get(&key) == Some(&Unfinalize::NeverEnacted),
        "its never-enacted slice is deleted, and unfinalized unless its agent acted: {work:?}"
    );
    assert_eq!(work.release.len(), 1, "the bound member keeps its slice");
    // Its card is free again for anyone; the bound member's is not.
    state.apply_pod(&pod("other", whole(), 1));
    let other = bind(&mut state, "uid-other", now);
    assert_eq!(
        card_of(&other),
        gang.members[1].1.containers[0].cards[0].index
    );
}

#[test]
fn cards_held_whole_by_another_scheduler_are_never_picked() {
    let mut state = cluster(2);
    let now = Instant::now();
    let mut held = group("n1", 2, Timestamp::now());
    if let Some(status) = held.status.as_mut() {
        status.cards[0].held_by = vec!["team/trainer".into()];
    }
    state.apply_group(&held, Timestamp::now());
    for (name, age) in [("a", 10), ("b", 5), ("c", 1)] {
        state.apply_pod(&pod(name, json!({"aliyun.com/gpu-core": "30"}), age));
    }
    // Shares pack onto the one card not held outside, never onto card 0.
    for uid in ["uid-a", "uid-b", "uid-c"] {
        assert_eq!(card_of(&bind(&mut state, uid, now)), 1, "{uid}");
    }
    state.apply_pod(&pod("whole", whole(), 0));
    assert!(matches!(
        state.schedule("uid-whole", now),
        Outcome::Unschedulable { .. }
    ));
    // The other scheduler's pod ends: its card is free again.
    state.apply_group(&group("n1", 2, Timestamp::now()), Timestamp::now());
    assert!(state.take_capacity_freed());
    assert_eq!(
        card_of(&bind(&mut state, "uid-whole", now + Duration::from_secs(5))),
        0
    );
}

#[test]
fn a_slice_its_agent_fails_is_reported_to_its_pod_once() {
    let (mut state, _, a) = decided_a(2);
    let (_, slices) = land(&mut state, &a);
    let _ = state.take_work();
    let mut failed = slices[0].clone();
    failed.status = Some(
        serde_json::from_value(json!({
            "phase": "Failed",
            "message": "the kubelet gave card 0 whole to team/trainer",
            "conditions": [{"type": "Ready", "status": "False", "reason": "CardHeldWhole",
                            "message": "the kubelet gave card 0 whole to team/trainer",
                            "lastTransitionTime": "2026-12-03T00:00:00Z"}],
        }))
        .expect("status"),
    );
    state.apply_slice(&failed);
    let work = state.take_work();
    let reported: Vec<_> = work.failed.values().collect();
    assert_eq!(reported.len(), 1, "{work:?}");
    assert_eq!(reported[0].reason, "CardHeldWhole");
    assert_eq!(reported[0].pod.uid, "uid-a");
    assert_eq!(reported[0].card, Some(card_of(&a)));
    // The same failure seen again (a resync, a heartbeat) is not reported again.
    state.apply_slice(&failed);
    assert!(state.take_work().failed.is_empty());
}

#[test]
fn a_slice_being_released_seen_before_its_node_keeps_its_finalizer() {
    let (mut state, _, a) = decided_a(2);
    let (pod, slices) = land(&mut state, &a);
    let mut releasing = slices[0].clone();
    releasing.metadata.finalizers = Some(vec![runtimekit_crds::SLICE_FINALIZER.into()]);
    releasing.metadata.deletion_timestamp = Some(Time(Timestamp::now()));

    // A starting operator whose slice watch delivers before its node watch.
    let mut starting = State::new(RuntimeKitConfig::default());
    starting.apply_pod(&pod);
    starting.apply_slice(&releasing);
    starting.apply_node(&node("n1"));
    starting.apply_group(&group("n1", 2, Timestamp::now()), Timestamp::now());
    starting.pods_synced();
    assert!(
        starting.take_work().unfinalize.is_empty(),
        "the agent of n1 finalizes it once the instance is gone"
    );

    // Its node really gone: nobody else will.
    let mut orphaned = State::new(RuntimeKitConfig::default());
    orphaned.apply_pod(&pod);
    orphaned.apply_slice(&releasing);
    orphaned.pods_synced();
    let work = orphaned.take_work();
    assert_eq!(
        work.unfinalize.values().collect::<Vec<_>>(),
        [&Unfinalize::NodeGone]
    );
}
