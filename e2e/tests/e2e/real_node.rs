//! The real node: containerd, runc, CNI and the kubelet on this machine, registered in the
//! shared control plane. Pods run as real containers, and `kubectl logs` and `exec` reach them.

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, PostParams};
use runtimekit_e2e::harness::Test;
use runtimekit_e2e::real_node::ENABLE_LABEL;
use runtimekit_e2e::{TestContext, tests};
use serde_json::json;
use std::time::Duration;

pub const TESTS: &[Test] = tests![real_node_runs_containers];

const WAIT: Duration = Duration::from_secs(60);

/// A busybox pod on the real node, running `script`.
pub(crate) fn busybox_pod(name: &str, node: &str, script: &str) -> Result<Pod> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "nodeName": node, "restartPolicy": "Never", "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": "docker.io/local/busybox:1",
                "imagePullPolicy": "Never", "command": ["/bin/sh", "-c", script]}],
        },
    }))?)
}

/// Waits until pod `name` is in `phase`.
pub(crate) async fn wait_phase(ctx: &TestContext, name: &str, phase: &str) -> Result<Pod> {
    let pods = ctx.api::<Pod>();
    ctx.wait_for(&format!("pod {name} {phase}"), WAIT, || async {
        let pod = pods.get(name).await?;
        let now = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        Ok((now == Some(phase)).then_some(pod))
    })
    .await
}

async fn real_node_runs_containers(ctx: TestContext) -> Result<()> {
    let node = ctx.real_node().await?;
    let object = ctx.cluster_api::<Node>().get(&node.name).await?;
    ensure!(
        object
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(ENABLE_LABEL))
            .map(String::as_str)
            == Some("true"),
        "labelled for the kit: {:?}",
        object.metadata.labels
    );
    let info = object
        .status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .context("nodeInfo")?;
    ensure!(
        info.container_runtime_version.starts_with("containerd://"),
        "{}",
        info.container_runtime_version
    );
    let server = ctx.kubectl_ok(&["version", "-o", "json"], None)?;
    ensure!(
        server.contains(&format!("\"gitVersion\": \"{}\"", info.kubelet_version)),
        "the kubelet {} is at the control plane's version:\n{server}",
        info.kubelet_version
    );

    let pods = ctx.api::<Pod>();
    pods.create(
        &PostParams::default(),
        &busybox_pod(
            "hello",
            &node.name,
            "echo hello from $(hostname); cat /proc/1/cmdline",
        )?,
    )
    .await?;
    wait_phase(&ctx, "hello", "Succeeded").await?;
    let logs = ctx.kubectl_ok(&["logs", "hello"], None)?;
    ensure!(logs.starts_with("hello from hello"), "{logs}");

    pods.create(
        &PostParams::default(),
        &busybox_pod("sleeper", &node.name, "exec sleep 3600")?,
    )
    .await?;
    let running = wait_phase(&ctx, "sleeper", "Running").await?;
    let ip = running.status.and_then(|s| s.pod_ip).unwrap_or_default();
    ensure!(
        ip.starts_with("10.244."),
        "a pod address from the node's CNI network: {ip}"
    );
    let exec = ctx.kubectl_ok(
        &[
            "exec",
            "-n",
            &ctx.namespace,
            "sleeper",
            "--",
            "sh",
            "-c",
            "echo $((6 * 7))",
        ],
        None,
    )?;
    ensure!(exec.trim() == "42", "{exec}");
    pods.delete("sleeper", &DeleteParams::default()).await?;
    ctx.wait_for("the sleeper to be gone", WAIT, || async {
        Ok(pods.get_opt("sleeper").await?.is_none().then_some(()))
    })
    .await?;
    Ok(())
}
