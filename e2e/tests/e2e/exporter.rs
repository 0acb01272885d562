//! Two node agents' exporters and the operator scraped by a real Prometheus: the queries of the
//! dcgm-exporter dashboard (unchanged) and of this project's dashboard return series; each card
//! is one series under its own node; a TDM pod's memory and its limit are one query each and
//! come only from the node it runs on; the usage guide's alert
//! `DCGM_FI_HEALTH_WATCH_OVERALL == 0` fires for an injected fault and clears with it; the
//! operator's ledger shows the slice and the node's cards.

use crate::node_agent::AgentNode;
use crate::operator::{Operator, event, finish};
use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::PostParams;
use runtimekit_crds::GpuSlice;
use runtimekit_e2e::harness::Test;
use runtimekit_e2e::prometheus::{Prometheus, promtool_findings};
use runtimekit_e2e::{TestContext, tests};
use runtimekit_proto::resource::v1alpha1 as pb;
use serde_json::json;
use std::time::Duration;

pub const TESTS: &[Test] = tests![exporter_feeds_prometheus_the_dashboard_and_the_health_alert];

const WAIT: Duration = Duration::from_secs(60);

/// The usage guide's alert, as a Prometheus rule.
const RULES: &str = r#"groups:
  - name: lj-runtimekit
    rules:
      - alert: GpuUnhealthy
        expr: DCGM_FI_HEALTH_WATCH_OVERALL == 0
"#;

/// Every query of a Grafana dashboard in the repository, with its variables set to "All" as
/// Grafana does.
fn dashboard_queries(file: &str) -> Result<Vec<String>> {
    let path = runtimekit_e2e::tools::repo_root().join(file);
    let dashboard: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    let mut queries = Vec::new();
    let mut panels: Vec<&serde_json::Value> = dashboard["panels"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    while let Some(panel) = panels.pop() {
        panels.extend(panel["panels"].as_array().into_iter().flatten());
        for target in panel["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = target["expr"].as_str() {
                let mut query = expr.to_owned();
                for variable in ["$instance", "$gpu", "$node"] {
                    query = query.replace(variable, ".*");
                }
                queries.push(query);
            }
        }
    }
    ensure!(!queries.is_empty(), "no queries in {}", path.display());
    Ok(queries)
}

async fn exporter_feeds_prometheus_the_dashboard_and_the_health_alert(
    ctx: TestContext,
) -> Result<()> {
    let nodes = [
        AgentNode::start(&ctx, "exp", "h800-8").await?,
        AgentNode::start(&ctx, "exp2", "a100-40gb-8").await?,
    ];
    let operator = Operator::start(&ctx, "op-exp").await?;
    let prometheus = Prometheus::start(
        &ctx,
        &[
            ("lj-runtimekit-exporter", nodes[0].metrics),
            ("lj-runtimekit-exporter", nodes[1].metrics),
            ("lj-runtimekit-operator", operator.listen),
        ],
        RULES,
    )
    .await?;
    let outcome = scraped(&ctx, &nodes, operator.listen, &prometheus).await;
    let finished = finish(&ctx, operator).await;
    outcome?;
    finished
}

/// The checks against the running agent, operator and Prometheus.
async fn scraped(
    ctx: &TestContext,
    nodes: &[AgentNode],
    operator: std::net::SocketAddr,
    prometheus: &Prometheus,
) -> Result<()> {
    // The usage guide's TDM pod, placed on one of the agents' nodes.
    let pod: Pod = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "tdm"},
            "spec": {"schedulerName": "lj-runtimekit-scheduler", "runtimeClassName": "lj-runtime",
                "containers": [{"name": "app", "image": "busybox", "resources": {"limits":
                    {"aliyun.com/gpu-core": "50", "aliyun.com/gpu-memory": "4"}}}]}}))?;
    ctx.api::<Pod>()
        .create(&PostParams::default(), &pod)
        .await?;

    // A real scrape of each agent and of the operator passes `promtool check metrics`. Lints are
    // allowed only on the DCGM families, whose names and camel-case labels (`modelName`,
    // `UUID`...) are fixed by what dcgm-exporter's dashboards query; our own families get none.
    let endpoints = nodes.iter().map(|n| n.metrics).chain([operator]);
    for endpoint in endpoints {
        let response = runtimekit_e2e::tools::http_get(endpoint, "/metrics")?;
        let text = runtimekit_e2e::tools::http_body(&response);
        ensure!(
            text.contains("# TYPE"),
            "a scrape of {endpoint}: {response}"
        );
        for finding in promtool_findings(text)? {
            // OpenMetrics gives a counter's HELP to its family name, without `_total`, which
            // promtool (reading the classic format) reports as missing.
            let counter_help = finding
                .strip_suffix(" no help text")
                .and_then(|name| name.strip_suffix("_total"))
                .is_some_and(|family| text.contains(&format!("# HELP {family} ")));
            ensure!(
                finding.starts_with("DCGM_") || counter_help,
                "promtool on {endpoint}: {finding}"
            );
        }
    }

    let mut queries = dashboard_queries("e2e/tests/compat/dcgm-exporter-dashboard.json")?;
    queries.extend(dashboard_queries(
        "config/grafana/runtimekit-dashboard.json",
    )?);
    for query in queries {
        ctx.wait_for(&format!("series for {query}"), WAIT, || async {
            Ok((!prometheus.query(&query)?.is_empty()).then_some(()))
        })
        .await?;
    }
    let used = r#"DCGM_FI_CONTAINER_FB_USED{pod="tdm", container_name="app"}"#;
    let share = r#"DCGM_FI_CONTAINER_FB_USED{pod="tdm"} / DCGM_FI_CONTAINER_FB_LIMIT{pod="tdm"}"#;
    let limit = ctx
        .wait_for("the TDM pod's memory and limit", WAIT, || async {
            let used = prometheus.query(used)?;
            let share = prometheus.query(share)?;
            let limit = prometheus.query(r#"DCGM_FI_CONTAINER_FB_LIMIT{pod="tdm"}"#)?;
            Ok((used.len() == 1 && share.len() == 1)
                .then(|| limit.first().map(|s| s["value"][1].clone()))
                .flatten())
        })
        .await?;
    ensure!(limit == json!("4096"), "the pod's limit: {limit}");

    // `kubectl gpu pods --prometheus` puts the pod's use beside its slice.
    let plugin = runtimekit_e2e::workspace_binary::workspace_binary(
        "runtimekit-kubectl-gpu",
        "kubectl-gpu",
    )?;
    let kubeconfig = ctx.kubeconfig_for("plugin-exporter", &["system:masters"])?;
    let output = std::process::Command::new(plugin)
        .env("KUBECONFIG", &kubeconfig)
        .args(["pods", "-n", &ctx.namespace, "--prometheus"])
        .arg(format!("http://{}", prometheus.address()))
        .output()?;
    let table = String::from_utf8_lossy(&output.stdout);
    let header = table.lines().next().unwrap_or_default();
    let row = table
        .lines()
        .find(|l| l.contains(" tdm "))
        .unwrap_or_default();
    ensure!(
        output.status.success()
            && header.ends_with("SM USED   MEM USED")
            && row.ends_with("Mi")
            && !row.ends_with("-"),
        "kubectl gpu pods --prometheus: {table}{}",
        String::from_utf8_lossy(&output.stderr)
    );

    // Each agent's cards under its own node, and the pod's series only from the node it is on.
    let per_node = prometheus.query("count by (NodeName) (DCGM_FI_DEV_GPU_TEMP)")?;
    let mut counted: Vec<(String, String)> = per_node
        .iter()
        .map(|s| {
            (
                s["metric"]["NodeName"].to_string(),
                s["value"][1].to_string(),
            )
        })
        .collect();
    counted.sort();
    let mut expected: Vec<(String, String)> = nodes
        .iter()
        .map(|n| (json!(n.name).to_string(), json!("8").to_string()))
        .collect();
    expected.sort();
    ensure!(counted == expected, "cards per node: {per_node:?}");
    let slice = ctx
        .api::<GpuSlice>()
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .find(|s| s.spec.pod.name == "tdm")
        .context("the TDM pod's slice")?;
    let host = slice.spec.node_name.clone().context("the slice's node")?;
    let from = prometheus.query(r#"DCGM_FI_CONTAINER_FB_USED{pod="tdm"}"#)?;
    ensure!(
        from.len() == 1 && from[0]["metric"]["NodeName"] == json!(host),
        "the pod's memory comes from {host} alone: {from:?}"
    );
    let node = nodes
        .iter()
        .find(|n| n.name == host)
        .context("the pod's node is an agent's")?;

    // The usage guide's alert fires for a fault on the TDM pod's card and clears with it;
    // the pod is told, and left running.
    let card = slice.spec.card.context("the TDM slice's card")?.index;
    let overall_zero = "DCGM_FI_HEALTH_WATCH_OVERALL == 0";
    ensure!(
        prometheus.query(overall_zero)?.is_empty(),
        "healthy at first"
    );
    node.fault(card, pb::FaultKind::EccDbe, 0).await?;
    let firing = ctx
        .wait_for("GpuUnhealthy to fire", WAIT, || async {
            let firing = prometheus.firing()?;
            Ok(firing
                .into_iter()
                .find(|a| a["labels"]["alertname"] == "GpuUnhealthy"))
        })
        .await?;
    ensure!(
        firing["labels"]["gpu"] == json!(card.to_string())
            && firing["labels"]["NodeName"] != json!(null),
        "the alert names the card and node: {firing}"
    );
    let told = event(ctx, "involvedObject.name=tdm", "GpuUnhealthy").await?;
    ensure!(
        told.contains("Warning") && told.contains(&format!("card {card} ")),
        "{told}"
    );
    ensure!(
        ctx.api::<Pod>().get_opt("tdm").await?.is_some(),
        "the pod is left to its owner"
    );
    node.clear(card).await?;
    ctx.wait_for("GpuUnhealthy to clear", WAIT, || async {
        let firing = prometheus.firing()?;
        Ok((!firing
            .iter()
            .any(|a| a["labels"]["alertname"] == "GpuUnhealthy"))
        .then_some(()))
    })
    .await
    .context("the alert after the fault cleared")?;

    // The operator's ledger, from the custom resources it watches.
    let slices = prometheus.query(r#"runtimekit_operator_gpuslices{mode="TDM"}"#)?;
    ensure!(!slices.is_empty(), "the TDM slice in the ledger");
    let cards = prometheus.query(&format!(
            r#"runtimekit_operator_topologygroup_cards{{topologygroup="{}", tier="Node", state="total"}}"#,
            node.name
        ))?;
    ensure!(
        cards.first().map(|s| s["value"][1].clone()) == Some(json!("8")),
        "the node's eight cards in the ledger: {cards:?}"
    );
    Ok(())
}
