//! DRA on the real node: once the node is labelled `aliyun.com/device-api=dra` and its agent
//! started again, the real kubelet registers the kit's DRA plugin, kube-scheduler allocates
//! claims from the node's ResourceSlices, and the plugin prepares them: a whole card's and a
//! time-division share's containers get their device files, variables and (for the share) the
//! isolation library through CDI, as containerd applies it. Deleting the pods unprepares the
//! claims (their CDI specs and checkpoint records go). The node goes back to the device plugin
//! at the end.

use crate::dra::{
    DEVICE_API_LABEL, allocated_claim, apply_device_classes, claim_pod, claim_template, devices_of,
    slices_of,
};
use crate::real_node::wait_phase;
use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, PostParams};
use runtimekit_crds::TopologyGroup;
use runtimekit_e2e::harness::Test;
use runtimekit_e2e::{TestContext, tests};
use serde_json::json;
use std::time::Duration;

pub const TESTS: &[Test] = tests![real_node_dra_claims_get_their_devices_through_cdi];

const WAIT: Duration = Duration::from_secs(90);
const DRIVER: &str = "gpu.runtimekit.aliyun.com";

/// Moves the real node to DRA (`dra`) or back, restarting its agent.
fn move_node(ctx: &TestContext, node: &str, dra: bool) -> Result<()> {
    let label = if dra {
        format!("{DEVICE_API_LABEL}=dra")
    } else {
        format!("{DEVICE_API_LABEL}-")
    };
    ctx.kubectl_ok(&["label", "node", node, &label, "--overwrite"], None)?;
    ctx.restart_real_node_agent()
}

async fn real_node_dra_claims_get_their_devices_through_cdi(ctx: TestContext) -> Result<()> {
    let node = ctx.real_node().await?;
    apply_device_classes(&ctx)?;
    move_node(&ctx, &node.name, true)?;
    let outcome = claims_on_the_real_node(&ctx, &node.name, &node.dir).await;
    move_node(&ctx, &node.name, false)?;
    outcome
}

async fn claims_on_the_real_node(
    ctx: &TestContext,
    node: &str,
    dir: &std::path::Path,
) -> Result<()> {
    ctx.wait_for("the real node's ResourceSlices", WAIT, || async {
        Ok((!slices_of(ctx, node).await?.is_empty()).then_some(()))
    })
    .await?;
    // A pod the kubelet admits before the plugin registered waits for the kubelet's next
    // resync (a minute): wait for the registration, which the agent logs, as the kubelet
    // answers it.
    let log = dir
        .parent()
        .context("the cluster's folder")?
        .join("logs/node-agent.log");
    ctx.wait_for("the kubelet to register the DRA plugin", WAIT, || async {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        Ok(text
            .contains("the kubelet registered the DRA plugin")
            .then_some(()))
    })
    .await?;
    let cards = ctx
        .cluster_api::<TopologyGroup>()
        .get(node)
        .await?
        .status
        .unwrap_or_default()
        .cards;
    let script = "env | grep -E '^(NVIDIA_VISIBLE_DEVICES|RUNTIMEKIT_)' | sort; ls /dev; cat /etc/ld.so.preload 2>/dev/null; echo printed; exec sleep 3600";
    claim_template(ctx, "whole", DRIVER, 1, None).await?;
    claim_template(
        ctx,
        "share",
        &format!("share.{DRIVER}"),
        1,
        Some(json!({"core": "30", "memory": "4Gi"})),
    )
    .await?;
    let pods = ctx.api::<Pod>();
    let mut prepared = Vec::new();
    for (name, template) in [("dra-whole", "whole"), ("dra-share", "share")] {
        pods.create(
            &PostParams::default(),
            &claim_pod(name, node, template, script)?,
        )
        .await?;
        let claim = allocated_claim(ctx, name, Some("gpu")).await?;
        let device = devices_of(&claim)
            .first()
            .map(|(_, d)| d.clone())
            .context("a device")?;
        let index: usize = device
            .trim_start_matches("gpu-")
            .trim_end_matches("-share")
            .parse()?;
        let uuid = &cards.get(index).context("the card")?.uuid;
        // Running, so its claim stays prepared while it is looked at.
        wait_phase(ctx, name, "Running").await?;
        let log = ctx
            .wait_for(&format!("{name}'s output"), WAIT, || async {
                let log = ctx.kubectl_ok(&["logs", name], None)?;
                Ok(log.contains("printed").then_some(log))
            })
            .await?;
        ensure!(
            log.contains(&format!("NVIDIA_VISIBLE_DEVICES={uuid}"))
                && log.contains(&format!("nvidia{index}"))
                && log.contains("nvidiactl"),
            "{name} sees card {index} ({uuid}) and nothing else decides it:\n{log}"
        );
        if template == "share" {
            ensure!(
                log.contains("RUNTIMEKIT_GPU_CORE_LIMIT=30")
                    && log.contains("RUNTIMEKIT_GPU_MEMORY_LIMIT_MIB=4096")
                    && log.contains("RUNTIMEKIT_SLICE_MODES=TDM")
                    && log.contains("libruntimekit_isolation.so"),
                "the share is held to its caps by the isolation library:\n{log}"
            );
        } else {
            ensure!(
                log.contains("RUNTIMEKIT_SLICE_MODES=Whole")
                    && !log.contains("libruntimekit_isolation.so"),
                "a whole card is not enforced:\n{log}"
            );
        }
        let uid = claim.metadata.uid.clone().unwrap_or_default();
        ensure!(
            dir.join("cdi")
                .join(format!("{DRIVER}-{uid}.json"))
                .exists(),
            "the claim's CDI spec is written"
        );
        prepared.push(uid);
    }
    for name in ["dra-whole", "dra-share"] {
        pods.delete(name, &DeleteParams::default().grace_period(0))
            .await?;
    }
    ctx.wait_for("the claims unprepared", WAIT, || async {
        let left = prepared
            .iter()
            .filter(|uid| {
                dir.join("cdi")
                    .join(format!("{DRIVER}-{uid}.json"))
                    .exists()
            })
            .count();
        Ok((left == 0).then_some(()))
    })
    .await?;
    Ok(())
}
