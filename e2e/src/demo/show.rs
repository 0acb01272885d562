//! What the demo prints once the examples are placed: the GPU ledger, where each pod landed and
//! why (through `kubectl gpu explain`), what the time-division pod's container sees, and a few
//! lines of the real node's exporter.

use super::examples::Example;
use super::{pods_of, wait};
use crate::cluster::Cluster;
use crate::cluster::real_node::{METRICS_PORT, RealNode};
use crate::tools::run;
use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client, ResourceExt};
use std::path::Path;
use std::process::Command;

/// The time-division example whose container the demo shows.
const TDM_POD: &str = "tdm-demo";

/// Indents every line of `text` by four spaces.
fn indented(text: &str) -> String {
    text.lines().map(|l| format!("    {l}\n")).collect()
}

/// `kubectl get gpuslices,ganggroups,topologygroups -A`.
pub(super) fn ledger(cluster: &Cluster) -> Result<()> {
    let mut command = cluster.kubectl();
    command.args(["get", "gpuslices,ganggroups,topologygroups", "-A"]);
    println!("  $ kubectl get gpuslices,ganggroups,topologygroups -A");
    print!("{}", indented(&run(command)?));
    Ok(())
}

/// `kubectl gpu explain` for each example's pod (a JobSet's first member, then where the others
/// went).
pub(super) async fn placements(
    client: &Client,
    bin: &Path,
    kubeconfig: &Path,
    examples: &[Example],
) -> Result<()> {
    for example in examples {
        let mut pods = pods_of(client, example).await?;
        pods.sort_by_key(ResourceExt::name_any);
        let Some(first) = pods.first() else { continue };
        let name = first.name_any();
        println!("  $ kubectl gpu explain {name}      # {}", example.file);
        let mut command = Command::new(bin.join("kubectl-gpu"));
        command
            .env("KUBECONFIG", kubeconfig)
            .args(["explain", &name]);
        print!("{}", indented(&run(command)?));
        if pods.len() > 1 {
            let others: Vec<String> = pods[1..]
                .iter()
                .map(|p| {
                    let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
                    format!("{} on {}", p.name_any(), node.unwrap_or_else(|| "-".into()))
                })
                .collect();
            println!("    The other members: {}.", others.join(", "));
        }
    }
    Ok(())
}

/// What the time-division pod's container printed (the demo image prints the card device files,
/// RDMA devices, preloaded library and GPU variables it was given).
pub(super) async fn container(cluster: &Cluster, node: &RealNode, client: &Client) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod = pods.get(TDM_POD).await?;
    let on = pod.spec.as_ref().and_then(|s| s.node_name.clone());
    if on.as_deref() != Some(node.name.as_str()) {
        bail!(
            "{TDM_POD} landed on {}, not on the real node {}, so no container of it runs",
            on.unwrap_or_default(),
            node.name
        );
    }
    let log = wait("the time-division container's report", || async {
        let mut command = cluster.kubectl();
        command.args(["logs", "-n", "default", TDM_POD]);
        let log = run(command)?;
        Ok(log.contains("RUNTIMEKIT_").then_some(log))
    })
    .await?;
    println!(
        "  $ kubectl logs {TDM_POD}      # the demo image prints what its container was given"
    );
    print!("{}", indented(&log));
    Ok(())
}

/// One scrape of the real node's exporter.
async fn metrics() -> Result<String> {
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], METRICS_PORT));
    Ok(tokio::task::spawn_blocking(move || crate::tools::http_get(address, "/metrics")).await??)
}

/// Waits until the real node's deployed exporter serves its cards.
pub(super) async fn wait_exporter() -> Result<()> {
    wait("the deployed node agent's exporter to serve", || async {
        Ok(metrics()
            .await?
            .contains("DCGM_FI_DEV_GPU_TEMP{")
            .then_some(()))
    })
    .await
}

/// A few lines of the real node's exporter: the time-division pod's series and one card's.
pub(super) async fn scrape() -> Result<()> {
    let text = wait("the exporter to show the time-division pod", || async {
        let text = metrics().await?;
        Ok(text.contains(&format!("pod=\"{TDM_POD}\"")).then_some(text))
    })
    .await?;
    let body = crate::tools::http_body(&text);
    let pod_lines: Vec<&str> = body
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains(&format!("pod=\"{TDM_POD}\"")))
        .take(4)
        .collect();
    let card = pod_lines
        .first()
        .and_then(|l| l.split("gpu=\"").nth(1))
        .and_then(|rest| rest.split('"').next())
        .context("the pod's series name no card")?;
    let card_lines = body.lines().filter(|l| {
        (l.starts_with("DCGM_FI_DEV_GPU_UTIL{")
            || l.starts_with("DCGM_FI_DEV_FB_USED{")
            || l.starts_with("DCGM_FI_HEALTH_WATCH_OVERALL{"))
            && l.contains(&format!("gpu=\"{card}\","))
    });
    println!(
        "  $ curl -s 127.0.0.1:{METRICS_PORT}/metrics      # {TDM_POD}'s series, then its card's"
    );
    for line in pod_lines.into_iter().chain(card_lines) {
        println!("    {line}");
    }
    Ok(())
}
