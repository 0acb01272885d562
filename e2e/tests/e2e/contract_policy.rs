//! The resource contract as admission policies (`config/operator/contract-policy.yaml`), tried
//! with every case of `contract/tests/cases.yaml`, the cases `contract/tests/cases.rs` runs
//! through the Rust contract: each pod is created with a server-side dry run, and a valid one
//! must be admitted with exactly its warnings, an invalid one refused with exactly the
//! contract's message.
//!
//! The policies are applied as the file has them, except that their bindings match only this
//! test's namespaces (other tests create pods that break the contract on purpose), and that a
//! copy of the contract policy with `memoryUnit` set to `'MiB'` is bound to a second namespace
//! for the cases of MiB mode. Everything is deleted again when the test ends.

use anyhow::{Context, Result, bail, ensure};
use runtimekit_e2e::harness::Test;
use runtimekit_e2e::{TestContext, tests};
use serde::Deserialize;
use serde_json::{Value, json};
use std::time::Duration;

pub const TESTS: &[Test] = tests![contract_policy_agrees_with_the_contract];

/// The policy that refuses what the contract refuses, and its binding.
const POLICY: &str = "runtimekit-resource-contract";
/// The policy that warns about what the contract warns about, and its binding.
const WARNINGS: &str = "runtimekit-resource-contract-warnings";
/// The copy of [`POLICY`] in MiB mode this test makes.
const POLICY_MIB: &str = "runtimekit-resource-contract-mib";
/// A RuntimeClass that is not ours, which a case names.
const OTHER_RUNTIME_CLASS: &str = "runc";

/// One case of `contract/tests/cases.yaml` (its header describes the fields).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
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
    memory_unit: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Cases {
    cases: Vec<Case>,
}

fn cases() -> Result<Vec<Case>> {
    let path = runtimekit_e2e::tools::repo_root().join("contract/tests/cases.yaml");
    let text = std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
    Ok(serde_yaml::from_str::<Cases>(&text)?.cases)
}

/// The objects of `config/operator/contract-policy.yaml`, the bindings matching only
/// `namespace`, plus the MiB copy of the contract policy bound to `mib_namespace`.
fn policies(namespace: &str, mib_namespace: &str) -> Result<Vec<Value>> {
    let path = runtimekit_e2e::tools::repo_root().join("config/operator/contract-policy.yaml");
    let text = std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
    let only = |ns: &str| json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}});
    let mut objects = Vec::new();
    for document in serde_yaml::Deserializer::from_str(&text) {
        let yaml = serde_yaml::Value::deserialize(document)?;
        let mut object = serde_json::to_value(yaml)?;
        match object["kind"].as_str() {
            Some("ValidatingAdmissionPolicyBinding") => {
                object["spec"]["matchResources"] = only(namespace);
            }
            Some("ValidatingAdmissionPolicy") if object["metadata"]["name"] == POLICY => {
                let mut mib = object.clone();
                mib["metadata"]["name"] = POLICY_MIB.into();
                let unit = mib["spec"]["variables"]
                    .as_array_mut()
                    .and_then(|v| v.iter_mut().find(|v| v["name"] == "memoryUnit"))
                    .context("the policy has a memoryUnit variable")?;
                ensure!(
                    unit["expression"] == "'GiB'",
                    "the policy's memoryUnit is GiB: {unit}"
                );
                unit["expression"] = "'MiB'".into();
                objects.push(mib);
                objects.push(json!({
                    "apiVersion": "admissionregistration.k8s.io/v1",
                    "kind": "ValidatingAdmissionPolicyBinding",
                    "metadata": {"name": POLICY_MIB},
                    "spec": {"policyName": POLICY_MIB, "validationActions": ["Deny"],
                        "matchResources": only(mib_namespace)}
                }));
            }
            _ => {}
        }
        objects.push(object);
    }
    let names: Vec<&str> = objects
        .iter()
        .filter_map(|o| o["metadata"]["name"].as_str())
        .collect();
    for name in [POLICY, WARNINGS] {
        ensure!(
            names.iter().filter(|n| **n == name).count() == 2,
            "the file has the policy and the binding {name}: {names:?}"
        );
    }
    Ok(objects)
}

/// The case's pod, named after the case.
fn pod(case: &Case) -> Value {
    let mut pod = case.pod.clone();
    pod["apiVersion"] = "v1".into();
    pod["kind"] = "Pod".into();
    pod["metadata"]["name"] = case.name.as_str().into();
    pod
}

/// Creates `pod` in `namespace` with a server-side dry run: whether it was admitted, and
/// kubectl's error output.
fn dry_run(ctx: &TestContext, namespace: &str, pod: &Value) -> Result<(bool, String)> {
    let output = ctx.kubectl(
        &[
            "create",
            "--dry-run=server",
            &format!("--namespace={namespace}"),
            "-f",
            "-",
        ],
        Some(&pod.to_string()),
    )?;
    Ok((
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    ))
}

/// What the apiserver says when `policy` refuses a pod with `message`.
fn denial(policy: &str, message: &str) -> String {
    format!(
        "ValidatingAdmissionPolicy '{policy}' with binding '{policy}' denied request: {message}"
    )
}

/// Waits until `policy` refuses `pod` in `namespace` (policies load a moment after being
/// applied).
async fn enforced(ctx: &TestContext, namespace: &str, policy: &str, pod: Value) -> Result<()> {
    ctx.wait_for(
        &format!("{policy} to be enforced in {namespace}"),
        Duration::from_secs(30),
        || async {
            let (admitted, stderr) = dry_run(ctx, namespace, &pod)?;
            Ok((!admitted && stderr.contains(&denial(policy, ""))).then_some(()))
        },
    )
    .await
}

/// What is wrong with the apiserver's answer to `case`, if anything.
fn check(case: &Case, admitted: bool, stderr: &str) -> Option<String> {
    let policy = if case.memory_unit.as_deref() == Some("MiB") {
        POLICY_MIB
    } else {
        POLICY
    };
    if case.valid || case.outside_policy {
        if !admitted {
            return Some(format!("refused: {stderr}"));
        }
        let expected = if case.warnings.is_empty() {
            None
        } else {
            Some(format!(
                "Warning: Validation failed for ValidatingAdmissionPolicy '{WARNINGS}' with binding '{WARNINGS}': {}",
                case.warnings.join("; ")
            ))
        };
        let warnings: Vec<&str> = stderr
            .lines()
            .filter(|l| l.starts_with("Warning:"))
            .collect();
        return match expected {
            Some(w) if warnings != [w.as_str()] => {
                Some(format!("admitted with {warnings:?}, expected [{w:?}]"))
            }
            None if !warnings.is_empty() => Some(format!("admitted with unexpected {warnings:?}")),
            _ => None,
        };
    }
    if admitted {
        return Some(format!(
            "admitted, but the contract refuses it with {:?}",
            case.violations
        ));
    }
    if let Some(apiserver) = &case.apiserver {
        if !stderr.contains(apiserver.as_str()) || stderr.contains("ValidatingAdmissionPolicy") {
            return Some(format!(
                "the apiserver's validation should refuse it with {apiserver:?}: {stderr}"
            ));
        }
        return None;
    }
    let expected = denial(policy, &case.violations.join("; "));
    if !stderr.trim_end().ends_with(&expected) {
        return Some(format!("refused with {stderr:?}, expected {expected:?}"));
    }
    None
}

async fn contract_policy_agrees_with_the_contract(ctx: TestContext) -> Result<()> {
    let mib_namespace = format!("{}-mib", ctx.namespace);
    let result = run_cases(&ctx, &mib_namespace).await;
    // Cluster-wide objects are not cleaned up with the test's namespace.
    let names = format!(
        "validatingadmissionpolicy/{POLICY},validatingadmissionpolicy/{WARNINGS},\
         validatingadmissionpolicy/{POLICY_MIB},validatingadmissionpolicybinding/{POLICY},\
         validatingadmissionpolicybinding/{WARNINGS},validatingadmissionpolicybinding/{POLICY_MIB},\
         runtimeclass/{OTHER_RUNTIME_CLASS},namespace/{mib_namespace}"
    );
    let mut args = vec!["delete", "--ignore-not-found", "--wait=false"];
    args.extend(names.split(','));
    let cleanup = ctx.kubectl_ok(&args, None);
    result?;
    cleanup?;
    Ok(())
}

async fn run_cases(ctx: &TestContext, mib_namespace: &str) -> Result<()> {
    // Pods name the lj-runtime RuntimeClass, which admission requires to exist; a case names
    // another one.
    let runtime_class = runtimekit_e2e::tools::repo_root().join("config/runtime/runtimeclass.yaml");
    ctx.kubectl_ok(&["apply", "-f", &runtime_class.to_string_lossy()], None)?;
    let other = json!({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
        "metadata": {"name": OTHER_RUNTIME_CLASS}, "handler": OTHER_RUNTIME_CLASS});
    ctx.kubectl_ok(&["apply", "-f", "-"], Some(&other.to_string()))?;
    let namespace =
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": mib_namespace}});
    ctx.kubectl_ok(&["apply", "-f", "-"], Some(&namespace.to_string()))?;

    let list = json!({"apiVersion": "v1", "kind": "List",
        "items": policies(&ctx.namespace, mib_namespace)?});
    ctx.kubectl_ok(&["apply", "-f", "-"], Some(&list.to_string()))?;

    let probe = |limits: Value| {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe"},
            "spec": {"schedulerName": "lj-runtimekit-scheduler", "runtimeClassName": "lj-runtime",
                "containers": [{"name": "app", "image": "img", "resources": {"limits": limits}}]}})
    };
    enforced(
        ctx,
        &ctx.namespace,
        POLICY,
        probe(json!({"aliyun.com/gpu-core": "101"})),
    )
    .await?;
    enforced(
        ctx,
        mib_namespace,
        POLICY_MIB,
        probe(json!({"aliyun.com/gpu-memory": "100"})),
    )
    .await?;
    let warned = probe(json!({"aliyun.com/gpu-core": "0"}));
    ctx.wait_for(
        "the warnings policy to be enforced",
        Duration::from_secs(30),
        || async {
            let (admitted, stderr) = dry_run(ctx, &ctx.namespace, &warned)?;
            Ok((admitted && stderr.contains(WARNINGS)).then_some(()))
        },
    )
    .await?;

    let cases = cases()?;
    ensure!(cases.len() > 50, "{} cases", cases.len());
    let mut failures = Vec::new();
    for case in &cases {
        let namespace = match case.memory_unit.as_deref() {
            None | Some("GiB") => ctx.namespace.as_str(),
            Some("MiB") => mib_namespace,
            Some(other) => bail!("{}: memoryUnit {other}", case.name),
        };
        let (admitted, stderr) = dry_run(ctx, namespace, &pod(case))?;
        if let Some(failure) = check(case, admitted, &stderr) {
            failures.push(format!("{}: {failure}", case.name));
        }
    }
    ensure!(
        failures.is_empty(),
        "{} of {} cases disagree with the contract:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    eprintln!("all {} cases agree with the contract", cases.len());
    Ok(())
}
