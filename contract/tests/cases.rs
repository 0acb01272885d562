//! The shared cases of `cases.yaml`, each run through `parse_pod`: a valid case is accepted with
//! exactly its warnings, an invalid one refused with exactly its findings, in order. The same
//! cases run through the admission policy (`config/operator/contract-policy.yaml`) on a real
//! apiserver in the end-to-end suite (`e2e/tests/e2e/contract_policy.rs`), so the two agree.

use k8s_openapi::api::core::v1::Pod;
use runtimekit_contract::{MemoryUnit, RuntimeKitConfig, parse_pod};
use serde::Deserialize;
use serde_yaml::Value;
use std::collections::BTreeSet;

/// One case of `cases.yaml` (its header describes the fields).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Case {
    name: String,
    pod: Value,
    #[serde(default)]
    valid: bool,
    #[serde(default)]
    violations: Vec<String>,
    #[serde(default)]
    warnings: Vec<String>,
    apiserver: Option<String>,
    #[serde(default)]
    outside_policy: bool,
    memory_unit: Option<MemoryUnit>,
    seed: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Cases {
    cases: Vec<Case>,
}

/// Rules no pod alone decides, so no case can show them.
const NOT_DECIDABLE_FROM_THE_POD: &[&str] = &["MinMemberNotParallelism"];

/// Rules the apiserver's own validation refuses before any admission policy sees the pod.
const REFUSED_BY_THE_APISERVER: &[&str] = &[
    "NotWhole",
    "Negative",
    "RequestNotLimit",
    "RequestWithoutLimit",
];

fn cases() -> Vec<Case> {
    let text = std::fs::read_to_string(format!("{}/tests/cases.yaml", env!("CARGO_MANIFEST_DIR")))
        .expect("cases.yaml");
    serde_yaml::from_str::<Cases>(&text)
        .expect("cases.yaml is a list of cases")
        .cases
}

/// A pod's YAML completed with the Pod's apiVersion and kind.
fn complete(pod: &Value) -> Value {
    let mut pod = pod.clone();
    pod["apiVersion"] = "v1".into();
    pod["kind"] = "Pod".into();
    pod
}

fn config(case: &Case) -> RuntimeKitConfig {
    RuntimeKitConfig {
        memory_unit: case.memory_unit.unwrap_or_default(),
        ..Default::default()
    }
}

/// The Violation variant's name, from its Debug form.
fn variant(violation: &runtimekit_contract::Violation) -> String {
    format!("{violation:?}")
        .split([' ', '{', '('])
        .next()
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn every_case_is_what_the_contract_says() {
    let mut failures = Vec::new();
    for case in cases() {
        let pod: Pod = match serde_yaml::from_value(complete(&case.pod)) {
            Ok(p) => p,
            Err(e) => {
                failures.push(format!("{}: not a Pod: {e}", case.name));
                continue;
            }
        };
        match parse_pod(&pod, &config(&case)) {
            Ok(request) => {
                let warnings: Vec<String> =
                    request.warnings.iter().map(|w| w.to_string()).collect();
                if !case.valid {
                    failures.push(format!(
                        "{}: accepted, but the case expects {:?}",
                        case.name, case.violations
                    ));
                } else if warnings != case.warnings {
                    failures.push(format!(
                        "{}: warnings {warnings:?}, the case expects {:?}",
                        case.name, case.warnings
                    ));
                }
            }
            Err(e) => {
                let findings: Vec<String> = e.findings.iter().map(|f| f.to_string()).collect();
                if findings != case.violations {
                    failures.push(format!(
                        "{}: refused with {findings:?}, the case expects {}",
                        case.name,
                        if case.valid {
                            "it to be valid".to_owned()
                        } else {
                            format!("{:?}", case.violations)
                        }
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn cases_are_well_formed() {
    let cases = cases();
    let mut names = BTreeSet::new();
    for case in &cases {
        assert!(names.insert(case.name.as_str()), "{}: twice", case.name);
        assert!(
            case.name.len() <= 63
                && case
                    .name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !case.name.starts_with('-')
                && !case.name.ends_with('-'),
            "{}: the e2e test names the pod after the case",
            case.name
        );
        assert!(
            case.valid == case.violations.is_empty(),
            "{}: either valid or violations",
            case.name
        );
        assert!(
            case.warnings.is_empty() || case.valid,
            "{}: warnings are checked on valid pods only",
            case.name
        );
        assert!(
            !(case.apiserver.is_some() || case.outside_policy) || !case.valid,
            "{}: apiserver and outsidePolicy describe refused pods",
            case.name
        );
        assert!(
            case.pod
                .get("metadata")
                .and_then(|m| m.get("namespace"))
                .is_none(),
            "{}: the e2e test puts the pod in its namespace",
            case.name
        );
    }
    assert!(cases.iter().any(|c| c.memory_unit == Some(MemoryUnit::MiB)));
}

/// Whether `big` has everything `small` has: every key of a mapping (recursively), the same
/// number of list items, equal scalars.
fn contains(big: &Value, small: &Value) -> bool {
    match (big, small) {
        (Value::Mapping(b), Value::Mapping(s)) => s
            .iter()
            .all(|(k, v)| b.get(k).is_some_and(|bv| contains(bv, v))),
        (Value::Sequence(b), Value::Sequence(s)) => {
            b.len() == s.len() && b.iter().zip(s).all(|(bv, sv)| contains(bv, sv))
        }
        (b, s) => b == s,
    }
}

#[test]
fn every_seed_is_a_case_unchanged() {
    let cases = cases();
    let dir = format!("{}/tests/seeds", env!("CARGO_MANIFEST_DIR"));
    let mut seeds: Vec<String> = std::fs::read_dir(&dir)
        .expect("seeds")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    seeds.sort();
    assert!(!seeds.is_empty());
    for seed in seeds {
        let text = std::fs::read_to_string(format!("{dir}/{seed}")).expect("seed");
        let value: Value = serde_yaml::from_str(&text).expect("seed is YAML");
        let pod = match value.get("kind").and_then(Value::as_str) {
            Some("JobSet") => {
                value["spec"]["replicatedJobs"][0]["template"]["spec"]["template"].clone()
            }
            _ => value,
        };
        let case = cases
            .iter()
            .find(|c| c.seed.as_deref() == Some(seed.as_str()))
            .unwrap_or_else(|| unreachable!("no case for the seed {seed}"));
        assert!(case.valid, "{}: the guide's examples are valid", case.name);
        assert!(
            contains(&complete(&case.pod), &complete(&pod)),
            "{}: the pod differs from the seed {seed}",
            case.name
        );
    }
}

#[test]
fn every_rule_decidable_from_the_pod_has_a_case() {
    // The rules are the variants of `Violation`, read from its source so a new rule fails here
    // until it has a case.
    let source = std::fs::read_to_string(format!(
        "{}/src/request/violation.rs",
        env!("CARGO_MANIFEST_DIR")
    ))
    .expect("violation.rs");
    let body = source
        .split("pub enum Violation {")
        .nth(1)
        .and_then(|rest| rest.split("\n}\n").next())
        .expect("the Violation enum");
    let rules: BTreeSet<String> = body
        .lines()
        .filter_map(|line| line.strip_prefix("    "))
        .filter(|line| line.starts_with(|c: char| c.is_ascii_uppercase()))
        .filter_map(|line| line.split([' ', '{', ',']).next())
        .map(str::to_owned)
        .collect();
    assert!(rules.len() > 20, "{rules:?}");

    let mut shown = BTreeSet::new();
    let mut shown_to_the_policy = BTreeSet::new();
    for case in cases().iter().filter(|c| !c.valid) {
        let pod: Pod = serde_yaml::from_value(complete(&case.pod)).expect("a Pod");
        let error = parse_pod(&pod, &config(case)).expect_err("an invalid case");
        for finding in &error.findings {
            let rule = variant(&finding.violation);
            if case.apiserver.is_none() && !case.outside_policy {
                shown_to_the_policy.insert(rule.clone());
            }
            shown.insert(rule);
        }
    }
    let missing: Vec<&String> = rules
        .iter()
        .filter(|r| !shown.contains(*r) && !NOT_DECIDABLE_FROM_THE_POD.contains(&r.as_str()))
        .collect();
    assert!(missing.is_empty(), "rules without a case: {missing:?}");
    let missing: Vec<&String> = rules
        .iter()
        .filter(|r| {
            !shown_to_the_policy.contains(*r)
                && !NOT_DECIDABLE_FROM_THE_POD.contains(&r.as_str())
                && !REFUSED_BY_THE_APISERVER.contains(&r.as_str())
        })
        .collect();
    assert!(
        missing.is_empty(),
        "rules without a case the policy decides: {missing:?}"
    );
    for rule in REFUSED_BY_THE_APISERVER {
        assert!(rules.contains(*rule), "{rule} is no longer a rule");
    }
}
