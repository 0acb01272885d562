//! Feature switches (`features` in the shared configuration, and node labels) against the real
//! apiserver: a switched-off function refuses new placements with a message naming the switch,
//! never touches what already runs, and comes back when switched on again.

use crate::node_agent::AgentNode;
use crate::operator::{
    Operator, bound, create_pod, event, finish, gpu_node, gpu_pod, h800_node, unschedulable,
};
use anyhow::{Result, ensure};
use kube::api::ListParams;
use runtimekit_contract::RuntimeKitConfig;
use runtimekit_crds::GangGroup;
use runtimekit_e2e::harness::Test;
use runtimekit_e2e::{TestContext, tests};
use serde_json::json;
use std::time::Duration;

pub const TESTS: &[Test] = tests![
    node_labels_switch_tdm_and_mig_off_and_on_again,
    the_shared_configuration_switches_tdm_and_gangs_off,
    a_node_label_switches_its_exporter_off_and_on_again,
];

const WAIT: Duration = Duration::from_secs(30);

/// A GPU pod held to `node`.
fn pod_on(name: &str, node: &str, limits: serde_json::Value) -> serde_json::Value {
    let mut pod = gpu_pod(name, limits);
    pod["spec"]["nodeSelector"] = json!({"kubernetes.io/hostname": node});
    pod
}

/// Whether an HTTP response's status line has `code`.
fn status_is(response: &str, code: u16) -> bool {
    response
        .lines()
        .next()
        .is_some_and(|line| line.split_whitespace().nth(1) == Some(&code.to_string()))
}

async fn node_labels_switch_tdm_and_mig_off_and_on_again(ctx: TestContext) -> Result<()> {
    let node = gpu_node(&ctx, "switch", h800_node(), vec![], &[]).await?;
    let operator = Operator::start(&ctx, "op-switch").await?;
    let tdm = json!({"aliyun.com/gpu-core": "30", "aliyun.com/gpu-memory": "4"});
    create_pod(&ctx, pod_on("before", &node, tdm.clone())).await?;
    let (_, before) = bound(&ctx, "before").await?;

    ctx.kubectl_ok(
        &[
            "label",
            "node",
            &node,
            "aliyun.com/tdm-enabled=false",
            "aliyun.com/mig-enabled=false",
        ],
        None,
    )?;
    create_pod(&ctx, pod_on("after", &node, tdm)).await?;
    create_pod(
        &ctx,
        pod_on("mig", &node, json!({"aliyun.com/gpu-slice": "3"})),
    )
    .await?;
    let why = unschedulable(&ctx, "after").await?;
    ensure!(
        why.contains(
            "1 node(s) had time-division shares switched off by the node label aliyun.com/tdm-enabled=false"
        ),
        "{why}"
    );
    let why = unschedulable(&ctx, "mig").await?;
    ensure!(
        why.contains("1 node(s) had MIG instances switched off by the node label aliyun.com/mig-enabled=false"),
        "{why}"
    );
    // Whole cards are not switched off, and the running share keeps its slice.
    create_pod(&ctx, pod_on("whole", &node, json!({"aliyun.com/gpu": "1"}))).await?;
    bound(&ctx, "whole").await?;
    let (_, still) = bound(&ctx, "before").await?;
    ensure!(
        still.len() == before.len(),
        "the running share lost its slice"
    );

    ctx.kubectl_ok(&["label", "node", &node, "aliyun.com/tdm-enabled-"], None)?;
    bound(&ctx, "after").await?;
    ensure!(
        unschedulable(&ctx, "mig")
            .await?
            .contains("MIG instances switched off"),
        "MIG is still off"
    );
    ctx.kubectl_ok(&["label", "node", &node, "aliyun.com/mig-enabled-"], None)?;
    bound(&ctx, "mig").await?;
    finish(&ctx, operator).await
}

async fn the_shared_configuration_switches_tdm_and_gangs_off(ctx: TestContext) -> Result<()> {
    let node = gpu_node(&ctx, "config-switch", h800_node(), vec![], &[]).await?;
    let mut config = RuntimeKitConfig::default();
    config.features.tdm = false;
    config.features.gangs = false;
    let operator =
        Operator::start_configured(&ctx, "op-config-switch", Operator::QUICK, Some(&config))
            .await?;
    create_pod(
        &ctx,
        pod_on("tdm", &node, json!({"aliyun.com/gpu-core": "30"})),
    )
    .await?;
    let why = unschedulable(&ctx, "tdm").await?;
    ensure!(
        why.contains("1 node(s) had time-division shares switched off for the cluster (features.tdm: false in the shared configuration)"),
        "{why}"
    );
    // Gangs off: three members of a gang of four are each placed on their own, and told so.
    for member in ["m-0", "m-1", "m-2"] {
        let mut pod = pod_on(member, &node, json!({"aliyun.com/gpu": "1"}));
        pod["metadata"]["labels"] =
            json!({"aliyun.com/min-member": "4", "aliyun.com/gang-name": "train"});
        create_pod(&ctx, pod).await?;
    }
    for member in ["m-0", "m-1", "m-2"] {
        bound(&ctx, member).await?;
    }
    event(
        &ctx,
        "involvedObject.name=m-0,reason=GangsSwitchedOff",
        "gangs are switched off",
    )
    .await?;
    let gangs = ctx.api::<GangGroup>().list(&ListParams::default()).await?;
    ensure!(
        gangs.items.is_empty(),
        "a GangGroup was made: {:?}",
        gangs.items
    );
    ctx.kubectl_ok(&["delete", "pod", "tdm", "--wait=false"], None)?;
    finish(&ctx, operator).await
}

async fn a_node_label_switches_its_exporter_off_and_on_again(ctx: TestContext) -> Result<()> {
    let agent = AgentNode::start(&ctx, "exp-switch", "h800-8").await?;
    let scrape = || runtimekit_e2e::tools::http_get(agent.metrics, "/metrics");
    ctx.wait_for("a scrape with card families", WAIT, || async {
        Ok(scrape()?.contains("DCGM_FI_DEV_GPU_TEMP").then_some(()))
    })
    .await?;
    let label = "aliyun.com/exporter-enabled";
    ctx.kubectl_ok(
        &["label", "node", &agent.name, &format!("{label}=false")],
        None,
    )?;
    let off = ctx
        .wait_for("the exporter switched off", WAIT, || async {
            let response = scrape()?;
            Ok(status_is(&response, 503).then_some(response))
        })
        .await?;
    ensure!(
        off.contains(&format!(
            "the exporter is switched off on this node: the node is labelled {label}=false"
        )) && !off.contains("DCGM_"),
        "{off}"
    );
    ctx.kubectl_ok(&["label", "node", &agent.name, &format!("{label}-")], None)?;
    ctx.wait_for("the exporter switched on again", WAIT, || async {
        let response = scrape()?;
        Ok(
            (response.starts_with("HTTP/1.0 200") && response.contains("DCGM_FI_DEV_GPU_TEMP"))
                .then_some(()),
        )
    })
    .await?;
    Ok(())
}
