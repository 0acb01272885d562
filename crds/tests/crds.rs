//! The committed CRD YAML matches the Rust types, and every CEL rule in the schemas rejects what
//! it should (checked client-side here; the e2e suite checks the same against a real apiserver).

use kube::core::cel::validate_cel as validate;
use kube::core::cel::validate_cel_update;
use runtimekit_crds::{GangGroup, GpuSlice, TopologyGroup, parse_slice_memory};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

#[test]
fn committed_yaml_is_up_to_date() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    for crd in runtimekit_crds::all() {
        let file = runtimekit_crds::file_name(&crd);
        let committed = std::fs::read_to_string(dir.join(&file)).unwrap_or_default();
        let generated = runtimekit_crds::render(&crd).expect("CRD renders");
        assert!(
            committed == generated,
            "crds/{file} is stale: run `cargo run -p runtimekit-crds --bin crdgen` and commit the result"
        );
    }
}

#[test]
fn crds_have_status_short_names_and_columns() {
    for crd in runtimekit_crds::all() {
        let version = &crd.spec.versions[0];
        assert_eq!(version.name, "v1alpha1");
        assert!(
            version
                .subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some(),
            "{} has a status subresource",
            crd.spec.names.kind
        );
        assert!(
            crd.spec
                .names
                .short_names
                .as_ref()
                .is_some_and(|s| !s.is_empty())
        );
        assert!(
            version
                .additional_printer_columns
                .as_ref()
                .is_some_and(|c| c.len() >= 6)
        );
    }
    let columns: Vec<String> = runtimekit_crds::all()[0].spec.versions[0]
        .additional_printer_columns
        .iter()
        .flatten()
        .map(|c| c.name.to_uppercase())
        .collect();
    assert_eq!(
        columns,
        [
            "NODE", "CARD", "MODE", "CORE", "MEMORY", "PROFILE", "POD", "PHASE", "AGE"
        ]
    );
}

fn object<T: DeserializeOwned>(kind: &str, spec: Value) -> T {
    serde_json::from_value(json!({
        "apiVersion": "runtimekit.aliyun.com/v1alpha1",
        "kind": kind,
        "metadata": {"name": "x", "namespace": "default"},
        "spec": spec,
    }))
    .expect("valid shape")
}

/// The messages of the rules `obj` breaks on creation.
fn broken<T: kube::CustomResourceExt + Serialize>(obj: &T) -> Vec<String> {
    validate(obj)
        .err()
        .map(|e| e.into_vec().into_iter().map(|e| e.message).collect())
        .unwrap_or_default()
}

fn slice(spec: Value) -> GpuSlice {
    let mut base = json!({
        "nodeName": "n1",
        "card": {"index": 0, "uuid": "GPU-0"},
        "pod": {"namespace": "default", "name": "p", "uid": "u", "container": "app"},
    });
    for (k, v) in spec.as_object().expect("object") {
        base[k] = v.clone();
    }
    object("GpuSlice", base)
}

#[test]
fn valid_slices_pass() {
    for spec in [
        json!({"mode": "Whole"}),
        json!({"mode": "TDM", "core": 50, "memory": "4Gi"}),
        json!({"mode": "TDM", "memory": "512Mi"}),
        json!({"mode": "MIG", "slices": 3, "migProfile": "3g.40gb", "migPlacementStart": 4, "memory": "4Gi"}),
        json!({"mode": "MIG", "slices": 1, "migProfile": "1g.10gb", "migPlacementStart": 6}),
        json!({"mode": "MIG", "slices": 7, "migProfile": "7g.141gb", "migPlacementStart": 0}),
    ] {
        assert_eq!(broken(&slice(spec.clone())), Vec::<String>::new(), "{spec}");
    }
}

#[test]
fn slice_rules_break() {
    for (spec, message) in [
        (
            json!({"mode": "TDM", "core": 0}),
            "core must be between 1 and 100 (percent of one card)",
        ),
        (
            json!({"mode": "TDM", "core": 101}),
            "core must be between 1 and 100 (percent of one card)",
        ),
        (
            json!({"mode": "TDM", "memory": "4G"}),
            "memory must be a positive whole number of Mi or Gi, such as 4Gi or 512Mi",
        ),
        (
            json!({"mode": "TDM", "memory": "0Gi"}),
            "memory must be a positive whole number of Mi or Gi, such as 4Gi or 512Mi",
        ),
        (
            json!({"mode": "MIG", "slices": 5, "migProfile": "5g.50gb", "migPlacementStart": 0}),
            "slices must be one of 1, 2, 3, 4, 7",
        ),
        (
            json!({"mode": "MIG", "slices": 3, "migProfile": "3g.40gb", "migPlacementStart": 2}),
            "migPlacementStart is not a legal start for this slice count (1: 0-6, 2: 0/2/4, 3: 0/4, 4 and 7: 0)",
        ),
        (
            json!({"mode": "MIG", "slices": 4, "migProfile": "4g.40gb", "migPlacementStart": 4}),
            "migPlacementStart is not a legal start for this slice count (1: 0-6, 2: 0/2/4, 3: 0/4, 4 and 7: 0)",
        ),
        (
            json!({"mode": "MIG", "slices": 1, "migProfile": "1g.10gb", "migPlacementStart": 9}),
            "migPlacementStart must be between 0 and 7",
        ),
        (
            json!({"mode": "MIG", "slices": 1, "migProfile": "big", "migPlacementStart": 0}),
            "migProfile must look like 3g.40gb",
        ),
        (
            json!({"mode": "MIG", "slices": 3, "migProfile": "1g.10gb", "migPlacementStart": 0}),
            "migProfile must have as many compute slices as slices (3 slices: a 3g profile)",
        ),
        (
            json!({"mode": "MIG", "slices": 3}),
            "a MIG slice needs slices, migProfile and migPlacementStart, and carries no core",
        ),
        (
            json!({"mode": "MIG", "slices": 3, "migProfile": "3g.40gb", "migPlacementStart": 0, "core": 50}),
            "a MIG slice needs slices, migProfile and migPlacementStart, and carries no core",
        ),
        (
            json!({"mode": "TDM", "core": 50, "slices": 1}),
            "a TDM slice carries no slices, migProfile or migPlacementStart",
        ),
        (
            json!({"mode": "Whole", "core": 50}),
            "a Whole slice takes the whole card: it carries no core, slices, migProfile or migPlacementStart",
        ),
    ] {
        let messages = broken(&slice(spec.clone()));
        assert!(
            messages.iter().any(|m| m == message),
            "{spec}: expected {message:?}, got {messages:?}"
        );
    }
}

#[test]
fn slice_node_and_card_are_immutable_once_set() {
    let old = slice(json!({"mode": "Whole"}));
    let mut moved = old.clone();
    moved.spec.node_name = Some("n2".into());
    let errors = validate_cel_update(&moved, &old).expect_err("node changed");
    assert!(
        errors
            .into_vec()
            .iter()
            .any(|e| e.message == "spec.nodeName is immutable once set")
    );

    let mut other_card = old.clone();
    other_card.spec.card.as_mut().expect("card").index = 3;
    let errors = validate_cel_update(&other_card, &old).expect_err("card changed");
    assert!(
        errors
            .into_vec()
            .iter()
            .any(|e| e.message == "spec.card is immutable once set")
    );

    // Setting them for the first time is allowed.
    let mut unset = old.clone();
    unset.spec.node_name = None;
    unset.spec.card = None;
    assert!(validate_cel_update(&old, &unset).is_ok());
}

fn group(spec: Value) -> TopologyGroup {
    object("TopologyGroup", spec)
}

#[test]
fn topology_tier_rules_break() {
    assert!(
        broken(&group(
            json!({"tier": "Node", "nodeName": "n1", "parent": "hn-1"})
        ))
        .is_empty()
    );
    assert!(
        broken(&group(
            json!({"tier": "HyperNode", "members": ["n1", "n2"], "parent": "leaf-1"})
        ))
        .is_empty()
    );
    assert!(broken(&group(json!({"tier": "NetworkPod"}))).is_empty());
    for (spec, message) in [
        (
            json!({"tier": "Node"}),
            "nodeName is required for tier Node and not allowed for higher tiers",
        ),
        (
            json!({"tier": "LeafSwitch", "nodeName": "n1"}),
            "nodeName is required for tier Node and not allowed for higher tiers",
        ),
        (
            json!({"tier": "Node", "nodeName": "n1", "members": ["n2"]}),
            "a Node group has no members; higher tiers list theirs",
        ),
        (
            json!({"tier": "NetworkPod", "parent": "dc"}),
            "NetworkPod is the widest tier and has no parent",
        ),
    ] {
        let messages = broken(&group(spec.clone()));
        assert!(
            messages.iter().any(|m| m == message),
            "{spec}: expected {message:?}, got {messages:?}"
        );
    }
}

#[test]
fn heartbeat_interval_rule_breaks() {
    let with_interval = |seconds: i64| -> TopologyGroup {
        let mut group = group(json!({"tier": "Node", "nodeName": "n1"}));
        group.status = Some(
            serde_json::from_value(json!({"heartbeatIntervalSeconds": seconds}))
                .expect("valid shape"),
        );
        group
    };
    assert!(broken(&with_interval(1)).is_empty());
    assert!(broken(&with_interval(3600)).is_empty());
    for seconds in [0, 3601] {
        assert_eq!(
            broken(&with_interval(seconds)),
            vec!["heartbeatIntervalSeconds must be between 1 and 3600".to_owned()],
            "{seconds} s"
        );
    }
}

#[test]
fn topology_tier_and_node_are_immutable() {
    let old = group(json!({"tier": "Node", "nodeName": "n1"}));
    let mut renamed = old.clone();
    renamed.spec.node_name = Some("n2".into());
    assert!(
        validate_cel_update(&renamed, &old)
            .expect_err("node changed")
            .into_vec()
            .iter()
            .any(|e| e.message == "spec.nodeName is immutable once set")
    );
    let old = group(json!({"tier": "HyperNode"}));
    let retiered = group(json!({"tier": "LeafSwitch"}));
    assert!(
        validate_cel_update(&retiered, &old)
            .expect_err("tier changed")
            .into_vec()
            .iter()
            .any(|e| e.message == "tier is immutable")
    );
}

#[test]
fn gang_rules_break_and_defaults_apply() {
    let gang: GangGroup = object("GangGroup", json!({"minMember": 7}));
    assert_eq!(gang.spec.timeout_seconds, 180);
    assert_eq!(gang.spec.highest_tier, runtimekit_crds::Tier::NetworkPod);
    assert!(broken(&gang).is_empty());
    for (spec, message) in [
        (json!({"minMember": 0}), "minMember must be at least 1"),
        (
            json!({"minMember": 2, "timeoutSeconds": 0}),
            "timeoutSeconds must be between 1 and 86400",
        ),
        (
            json!({"minMember": 2, "timeoutSeconds": 100000}),
            "timeoutSeconds must be between 1 and 86400",
        ),
    ] {
        let messages = broken(&object::<GangGroup>("GangGroup", spec.clone()));
        assert!(
            messages.iter().any(|m| m == message),
            "{spec}: expected {message:?}, got {messages:?}"
        );
    }
}

#[test]
fn slice_memory_parses_to_mib() {
    assert_eq!(parse_slice_memory("4Gi"), Some(4096));
    assert_eq!(parse_slice_memory("512Mi"), Some(512));
    assert_eq!(parse_slice_memory("4G"), None);
    assert_eq!(parse_slice_memory("Gi"), None);
    assert_eq!(parse_slice_memory("-1Mi"), None);
    assert_eq!(parse_slice_memory(&format!("{}Gi", u64::MAX)), None);
}
