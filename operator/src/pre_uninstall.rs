//! `pre-uninstall`: the chart's pre-delete hook. `helm uninstall` takes the node agents away,
//! and with them the nodes' lj-runtime handler; a pod still running under the kit's
//! RuntimeClass would keep running but lose its agent, its metrics and its cleanup. So the
//! uninstall is refused, naming those pods, until they are gone. Otherwise the node side goes
//! first: the agents' DaemonSet is deleted in the foreground, and each node's installer takes
//! its node's setup away while its ServiceAccount and RBAC (deleted by Helm right after) still
//! let it see that the DaemonSet is being deleted.

use crate::run::load_config;
use anyhow::{Context, Result, bail};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams};
use kube::{Api, Client, ResourceExt};
use std::path::Path;
use std::time::{Duration, Instant};

/// How many of the pods the refusal names before it counts the rest.
const NAMED: usize = 10;

/// The pods that hold a node's lj-runtime handler: placed on a node, under `runtime_class`, and
/// not finished. Each as `namespace/name on node`.
pub fn blocking_pods(pods: &[Pod], runtime_class: &str) -> Vec<String> {
    let mut blocking: Vec<String> = pods
        .iter()
        .filter(|pod| {
            let spec = pod.spec.as_ref();
            let finished = pod
                .status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .is_some_and(|phase| phase == "Succeeded" || phase == "Failed");
            spec.and_then(|s| s.runtime_class_name.as_deref()) == Some(runtime_class)
                && spec.and_then(|s| s.node_name.as_deref()).is_some()
                && !finished
        })
        .map(|pod| {
            let node = pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .unwrap_or_default();
            format!(
                "{}/{} on {node}",
                pod.namespace().unwrap_or_default(),
                pod.name_any()
            )
        })
        .collect();
    blocking.sort();
    blocking
}

/// What the hook prints when it refuses: the pods (the first [`NAMED`]) and the ways on for
/// the release.
pub fn refusal(blocking: &[String], runtime_class: &str, release: &Release) -> String {
    let mut text = format!(
        "refusing to uninstall the GPU runtime kit: {} pod(s) still run under RuntimeClass {runtime_class}:\n",
        blocking.len()
    );
    for pod in blocking.iter().take(NAMED) {
        text.push_str(&format!("  {pod}\n"));
    }
    if blocking.len() > NAMED {
        text.push_str(&format!("  and {} more\n", blocking.len() - NAMED));
    }
    text.push_str(&format!(
        "Delete them (or scale their workloads down) and run helm uninstall again. To keep the \
         kit instead, run `helm rollback {name} {revision} -n {namespace}` (Helm marks a release whose \
         uninstall was refused as uninstalling, and upgrades it only once it is deployed again). \
         `helm uninstall --no-hooks` removes the kit anyway: those pods keep running, and their \
         nodes keep lj-runtime until the setup is removed by hand (runtimekit-node-installer \
         uninstall) once the last of them has ended.\n",
        name = release.name,
        revision = release.revision,
        namespace = release.namespace,
    ));
    text
}

/// The node agents' DaemonSet, deleted first.
#[derive(Debug, Clone)]
pub struct NodeSide {
    /// Its namespace (the release's).
    pub namespace: String,
    /// Its name.
    pub daemonset: String,
    /// How long its pods may take to undo their nodes' setup.
    pub timeout: Duration,
    /// The Helm release being uninstalled.
    pub release: Release,
}

/// A Helm release: what the refusal tells the user to roll back to.
#[derive(Debug, Clone)]
pub struct Release {
    /// Its name.
    pub name: String,
    /// The revision the hook was rendered in: the deployed one.
    pub revision: u32,
    /// Its namespace.
    pub namespace: String,
}

/// Refuses (false) while any pod holds a node's handler; otherwise deletes the node side in
/// the foreground and waits until it is gone.
pub async fn run(config: Option<&Path>, node_side: &NodeSide) -> Result<bool> {
    let config = load_config(config)?;
    let client = Client::try_default()
        .await
        .context("connecting to the apiserver")?;
    let pods = Api::<Pod>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("listing pods")?;
    let blocking = blocking_pods(&pods.items, &config.runtime_class_name);
    if !blocking.is_empty() {
        eprint!(
            "{}",
            refusal(&blocking, &config.runtime_class_name, &node_side.release)
        );
        return Ok(false);
    }
    println!(
        "no pod runs under RuntimeClass {}: the node agents go first, each node's installer taking its setup away",
        config.runtime_class_name
    );
    let sets: Api<DaemonSet> = Api::namespaced(client, &node_side.namespace);
    let name = &node_side.daemonset;
    let deadline = Instant::now() + node_side.timeout;
    let mut deleted = false;
    while let Some(set) = sets.get_opt(name).await? {
        if !deleted && set.metadata.deletion_timestamp.is_none() {
            sets.delete(name, &DeleteParams::foreground()).await?;
            deleted = true;
        }
        if Instant::now() > deadline {
            bail!(
                "the DaemonSet {}/{name} still has pods after {:?}: see the node-installer containers' logs",
                node_side.namespace,
                node_side.timeout
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    println!(
        "the DaemonSet {}/{name} and its pods are gone",
        node_side.namespace
    );
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, class: Option<&str>, node: Option<&str>, phase: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "team"},
            "spec": {"runtimeClassName": class, "nodeName": node, "containers": []},
            "status": {"phase": phase},
        }))
        .expect("pod")
    }

    #[test]
    fn only_placed_unfinished_pods_of_the_class_block() {
        let pods = [
            pod("running", Some("lj-runtime"), Some("n1"), "Running"),
            pod("starting", Some("lj-runtime"), Some("n2"), "Pending"),
            pod("queued", Some("lj-runtime"), None, "Pending"),
            pod("done", Some("lj-runtime"), Some("n1"), "Succeeded"),
            pod("failed", Some("lj-runtime"), Some("n1"), "Failed"),
            pod("runc", None, Some("n1"), "Running"),
            pod("other", Some("kata"), Some("n1"), "Running"),
        ];
        assert_eq!(
            blocking_pods(&pods, "lj-runtime"),
            ["team/running on n1", "team/starting on n2"]
        );
        assert!(blocking_pods(&pods, "renamed").is_empty());
    }

    #[test]
    fn the_refusal_names_the_pods_and_counts_the_rest() {
        let many: Vec<String> = (0..12).map(|i| format!("team/p{i:02} on n1")).collect();
        let release = Release {
            name: "kit".into(),
            revision: 3,
            namespace: "gpu-system".into(),
        };
        let text = refusal(&many, "lj-runtime", &release);
        assert!(text.starts_with("refusing to uninstall the GPU runtime kit: 12 pod(s) still run under RuntimeClass lj-runtime"), "{text}");
        assert!(
            text.contains("  team/p09 on n1\n") && !text.contains("p10"),
            "{text}"
        );
        assert!(text.contains("and 2 more"), "{text}");
        assert!(text.contains("--no-hooks"), "{text}");
        assert!(text.contains("helm rollback kit 3 -n gpu-system"), "{text}");
    }
}
