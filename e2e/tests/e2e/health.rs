//! The optional health taint (`features.healthTaint`) against the real apiserver: off by default,
//! set on the Node of a faulted card with the configured effect, cleared when the card heals or
//! the switch is turned off, never touching another taint; and the operator's Node writes, tried
//! as an attacker would, refused beyond that one taint (`config/operator/admission-policy.yaml`).

use crate::operator::{
    OPERATOR_USER, Operator, bound, finish, gpu_pod, h800_node, install_operator_access,
    report_devices, reporting_node, unschedulable,
};
use anyhow::{Result, ensure};
use k8s_openapi::api::core::v1::Node;
use runtimekit_contract::{HealthTaint, RuntimeKitConfig};
use runtimekit_crds::{CardHealth, CardStatus};
use runtimekit_e2e::harness::Test;
use runtimekit_e2e::{FakeNode, TestContext, tests};
use serde_json::json;
use std::time::Duration;

pub const TESTS: &[Test] = tests![
    the_health_taint_follows_card_faults,
    the_operator_writes_only_the_health_taint_to_nodes,
];

const KEY: &str = "aliyun.com/gpu-unhealthy";
const WAIT: Duration = Duration::from_secs(30);

/// Eight H800 cards, those of `faulted` reported Unhealthy by the agent.
fn cards(faulted: &[u32]) -> Vec<CardStatus> {
    let mut cards = h800_node();
    for card in &mut cards {
        if faulted.contains(&card.index) {
            card.health = CardHealth::Unhealthy;
            card.health_reason = Some("XID 79: GPU has fallen off the bus".into());
        }
    }
    cards
}

/// The node's taints as `key=value:effect`.
async fn taints(ctx: &TestContext, node: &str) -> Result<Vec<String>> {
    let node = ctx.cluster_api::<Node>().get(node).await?;
    Ok(node
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .into_iter()
        .map(|t| format!("{}={}:{}", t.key, t.value.unwrap_or_default(), t.effect))
        .collect())
}

/// Waits until the node's taints are exactly `expected`.
async fn taints_become(ctx: &TestContext, node: &str, expected: &[&str]) -> Result<()> {
    ctx.wait_for(&format!("node taints {expected:?}"), WAIT, || async {
        let now = taints(ctx, node).await?;
        Ok((now == expected).then_some(()))
    })
    .await
}

fn tainting(effect: HealthTaint) -> RuntimeKitConfig {
    let mut config = RuntimeKitConfig::default();
    config.features.health_taint = effect;
    config
}

async fn the_health_taint_follows_card_faults(ctx: TestContext) -> Result<()> {
    let other = "dedicated=infer:PreferNoSchedule";
    let node = FakeNode::new("h800").taint("dedicated", "infer", "PreferNoSchedule");
    let node = reporting_node(&ctx, node, cards(&[3]), vec![]).await?;

    // Off by default: the operator has seen the fault (the pod lands beside the faulted card)
    // and the Node keeps only its own taint.
    let operator = Operator::start(&ctx, "op-default").await?;
    operator.wait_ready(&ctx).await?;
    ctx.kubectl_ok(
        &["create", "-f", "-"],
        Some(&gpu_pod("first", json!({"nvidia.com/gpu": "1"})).to_string()),
    )?;
    bound(&ctx, "first").await?;
    ensure!(
        taints(&ctx, &node).await? == [other],
        "{:?}",
        taints(&ctx, &node).await?
    );
    operator.stop().await?;

    // Switched on: the faulted card's node is tainted, and untainted once the card heals.
    let operator = Operator::start_configured(
        &ctx,
        "op-taint",
        Operator::QUICK,
        Some(&tainting(HealthTaint::NoSchedule)),
    )
    .await?;
    let tainted = format!("{KEY}=gpu3:NoSchedule");
    taints_become(&ctx, &node, &[other, &tainted]).await?;
    report_devices(&ctx, &node, cards(&[]), vec![]).await?;
    taints_become(&ctx, &node, &[other]).await?;
    report_devices(&ctx, &node, cards(&[3, 5]), vec![]).await?;
    taints_become(
        &ctx,
        &node,
        &[other, &format!("{KEY}=gpu3_gpu5:NoSchedule")],
    )
    .await?;
    // A pod that does not tolerate it stays off the node; one that does lands on a healthy card.
    ctx.kubectl_ok(
        &["create", "-f", "-"],
        Some(&gpu_pod("refused", json!({"nvidia.com/gpu": "1"})).to_string()),
    )?;
    let mut tolerant = gpu_pod("tolerant", json!({"nvidia.com/gpu": "1"}));
    tolerant["spec"]["tolerations"] = json!([{"key": KEY, "operator": "Exists"}]);
    ctx.kubectl_ok(&["create", "-f", "-"], Some(&tolerant.to_string()))?;
    bound(&ctx, "tolerant").await?;
    let why = unschedulable(&ctx, "refused").await?;
    ensure!(
        why.contains(&format!("untolerated taint {{{KEY}: gpu3_gpu5}}")),
        "{why}"
    );
    ctx.kubectl_ok(&["delete", "pod", "refused", "--wait=false"], None)?;
    operator.stop().await?;

    // Switched off again: the taint a former setting left is removed, the other one stays.
    let operator = Operator::start(&ctx, "op-off").await?;
    taints_become(&ctx, &node, &[other]).await?;
    finish(&ctx, operator).await
}

/// Runs a server-side dry-run patch of `node` as the operator; the apiserver's error, or `None`
/// when the patch was allowed.
fn patch_as_operator(
    ctx: &TestContext,
    node: &str,
    patch: &serde_json::Value,
) -> Result<Option<String>> {
    let output = ctx.kubectl(
        &[
            "--as",
            OPERATOR_USER,
            "patch",
            "node",
            node,
            "--type=merge",
            "--dry-run=server",
            "-p",
            &patch.to_string(),
        ],
        None,
    )?;
    Ok((!output.status.success()).then(|| String::from_utf8_lossy(&output.stderr).into_owned()))
}

async fn the_operator_writes_only_the_health_taint_to_nodes(ctx: TestContext) -> Result<()> {
    let node = FakeNode::new("guarded").taint("dedicated", "infer", "NoSchedule");
    let node = ctx.fake_node(node).await?;
    let node = kube::ResourceExt::name_any(&node);
    install_operator_access(&ctx)?;
    let dedicated = json!({"key": "dedicated", "value": "infer", "effect": "NoSchedule"});
    let health = |effect: &str| json!({"key": KEY, "value": "gpu0", "effect": effect});
    // The policies load a moment after being applied: wait for the first refusal.
    let refused = ctx
        .wait_for("the policy to refuse a label change", WAIT, || async {
            patch_as_operator(
                &ctx,
                &node,
                &json!({"metadata": {"labels": {"stolen": "yes"}}}),
            )
        })
        .await?;
    ensure!(
        refused.contains("may change only the taint aliyun.com/gpu-unhealthy"),
        "{refused}"
    );
    let attempts = [
        (
            "drop another taint",
            json!({"spec": {"taints": [health("NoSchedule")]}}),
            "may change only the taint",
        ),
        (
            "cordon",
            json!({"spec": {"unschedulable": true}}),
            "may change only the taint",
        ),
        (
            "evict",
            json!({"spec": {"taints": [dedicated, health("NoExecute")]}}),
            "never evicts",
        ),
    ];
    for (what, patch, expected) in attempts {
        let error = patch_as_operator(&ctx, &node, &patch)?;
        ensure!(
            error.as_deref().is_some_and(|e| e.contains(expected)),
            "{what}: {error:?}"
        );
    }
    for effect in ["NoSchedule", "PreferNoSchedule"] {
        let patch = json!({"spec": {"taints": [dedicated, health(effect)]}});
        let error = patch_as_operator(&ctx, &node, &patch)?;
        ensure!(
            error.is_none(),
            "the health taint with {effect} was refused: {error:?}"
        );
    }
    Ok(())
}
