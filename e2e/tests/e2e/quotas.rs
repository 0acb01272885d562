//! Namespace quotas on the card resources against the real apiserver's ResourceQuota admission
//! and controller: the scheduler counts every replica of a pod, says which quota a pod would
//! exceed, places it once room is freed, and `kubectl gpu quota` shows the two counts side by
//! side. The apiserver's own check keeps refusing what it counts as over.

use crate::operator::{
    AgentTeardown, bound, create_pod, gpu_node, gpu_pod, h800_node, unschedulable, with_operator,
};
use crate::plugin::plugin;
use anyhow::{Result, ensure};
use k8s_openapi::api::core::v1::{Pod, ResourceQuota};
use kube::api::{DeleteParams, PostParams};
use runtimekit_e2e::harness::Test;
use runtimekit_e2e::workspace_binary::workspace_binary;
use runtimekit_e2e::{TestContext, tests};
use serde_json::json;
use std::time::Duration;

pub const TESTS: &[Test] = tests![a_quota_counts_every_replica];

fn half_card(name: &str, replicas: Option<&str>) -> serde_json::Value {
    let mut pod = gpu_pod(name, json!({"aliyun.com/gpu-core": "50"}));
    if let Some(replicas) = replicas {
        pod["metadata"]["labels"] = json!({"replica": replicas});
    }
    pod
}

async fn a_quota_counts_every_replica(ctx: TestContext) -> Result<()> {
    let binary = workspace_binary("runtimekit-kubectl-gpu", "kubectl-gpu")?;
    let kubeconfig = ctx.kubeconfig_for("quota-admin", &["system:masters"])?;
    with_operator(ctx, |ctx| async move {
        gpu_node(&ctx, "quota", h800_node(), vec![], &[]).await?;
        let _teardown = AgentTeardown::start(&ctx);
        let quota: ResourceQuota = serde_json::from_value(json!({
            "metadata": {"name": "gpu"},
            "spec": {"hard": {"requests.aliyun.com/gpu-core": "100"}}}))?;
        ctx.api::<ResourceQuota>()
            .create(&PostParams::default(), &quota)
            .await?;
        // The apiserver's admission checks against the limits the quota controller has copied
        // into the status.
        ctx.wait_for("the quota controller to take the quota up", Duration::from_secs(30), || async {
            let quota = ctx.api::<ResourceQuota>().get("gpu").await?;
            Ok(quota.status.and_then(|s| s.hard).filter(|h| !h.is_empty()).map(|_| ()))
        })
        .await?;
        // The apiserver counts 50 for this pod; it holds half of two cards.
        create_pod(&ctx, half_card("two-halves", Some("2"))).await?;
        let (_, slices) = bound(&ctx, "two-halves").await?;
        ensure!(slices.len() == 2, "one slice per replica: {slices:?}");
        // The apiserver admits a second half (50 + 50 of 100); the scheduler counts 150.
        create_pod(&ctx, half_card("one-half", None)).await?;
        let message = unschedulable(&ctx, "one-half").await?;
        let namespace = &ctx.namespace;
        ensure!(
            message
                == format!(
                    "namespace {namespace} would hold 150 of its 100 aliyun.com/gpu-core (ResourceQuota gpu, each replica counted)"
                ),
            "{message}"
        );
        // The quota's own admission still refuses what it counts as over.
        let over = create_pod(&ctx, half_card("over", None)).await;
        ensure!(
            over.as_ref()
                .is_err_and(|e| e.to_string().contains("exceeded quota")),
            "the apiserver admitted a third pod: {over:?}"
        );
        // `kubectl gpu quota` shows both counts.
        let table = plugin(&binary, &kubeconfig, &["quota", "-n", namespace])?;
        let row = table
            .lines()
            .find(|l| l.contains("aliyun.com/gpu-core"))
            .unwrap_or_default();
        let cells: Vec<&str> = row.split_whitespace().collect();
        ensure!(
            cells == [namespace.as_str(), "gpu", "aliyun.com/gpu-core", "100", "100", "100"],
            "kubectl gpu quota:\n{table}"
        );
        // Once the replica pod goes, the waiting half fits.
        ctx.api::<Pod>()
            .delete("two-halves", &DeleteParams::default().grace_period(0))
            .await?;
        bound(&ctx, "one-half").await?;
        Ok(())
    })
    .await
}
