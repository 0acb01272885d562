//! Simulated GPU nodes for the demo: kwok Nodes with a network position, each with a node agent
//! process simulating one of the shipped profiles, and one test kubelet process playing their
//! kubelets' device manager (kwok runs their pods' lifecycle but has no device plugins). They
//! are started by PID with the rest of the cluster and stopped with it.

use super::node_side::{AGENT_GROUP, agent_dra_args, agent_user, wait_for_socket};
use super::{Cluster, KWOK_ANNOTATION};
use crate::workspace_binary::workspace_binary;
use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Node;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The link, in the cluster's folder, to the simulated nodes' folder ([`short_root`]).
const SIMULATED_DIR: &str = "simulated";

/// One simulated node to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimulatedNode {
    /// The Node's name.
    pub name: String,
    /// The resource layer's profile it simulates (`node-agent/resource-layer/profiles`).
    pub profile: String,
    /// Its labels beyond kwok's defaults: the GPU-node label, its network position.
    pub labels: BTreeMap<String, String>,
}

/// A kwok-managed Node object (or, when `hung`, one that reports Ready but that no kubelet or
/// kwok ever acts for) with 64 CPUs, 512 GiB and 110 pods unless `capacity` says otherwise.
pub fn kwok_node_object(
    name: &str,
    labels: &BTreeMap<String, String>,
    capacity: &BTreeMap<String, String>,
    taints: &[serde_json::Value],
    hung: bool,
) -> Result<Node> {
    let mut labels = labels.clone();
    labels
        .entry("kubernetes.io/hostname".into())
        .or_insert_with(|| name.into());
    labels.entry("type".into()).or_insert_with(|| "kwok".into());
    let mut full: BTreeMap<String, String> = [("cpu", "64"), ("memory", "512Gi"), ("pods", "110")]
        .into_iter()
        .map(|(k, v)| (k.into(), v.into()))
        .collect();
    full.extend(capacity.clone());
    // A node may be created with its status; a hung node's Ready condition is never renewed,
    // and no node-lifecycle controller runs here to notice.
    let (annotations, conditions) = if hung {
        (
            serde_json::json!({}),
            serde_json::json!([{"type": "Ready", "status": "True", "reason": "KubeletReady"}]),
        )
    } else {
        (
            serde_json::json!({KWOK_ANNOTATION: "fake"}),
            serde_json::json!([]),
        )
    };
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {"taints": taints},
        "status": {"capacity": full, "allocatable": full, "conditions": conditions},
    }))?)
}

impl Cluster {
    /// Creates each node's kwok Node, starts one test kubelet process for all of them and a node
    /// agent process per node (its resource layer simulated in-process). Returns once they run;
    /// each agent reports its node's TopologyGroup a moment later.
    pub async fn start_simulated_nodes(&mut self, nodes: &[SimulatedNode]) -> Result<()> {
        self.install_node_config()?;
        let api: kube::Api<Node> = kube::Api::all(self.client().await?);
        let empty = BTreeMap::new();
        for node in nodes {
            let object = kwok_node_object(&node.name, &node.labels, &empty, &[], false)?;
            api.create(&Default::default(), &object)
                .await
                .with_context(|| format!("creating node {}", node.name))?;
        }
        let root = short_root(&self.dir)?;
        let kubelet_root = |node: &SimulatedNode| root.join(&node.name).join("kubelet");
        let mut kubelet_args = vec![format!("--kubeconfig={}", self.kubeconfig.display())];
        kubelet_args.extend(
            nodes
                .iter()
                .map(|n| format!("--node={}={}", n.name, kubelet_root(n).display())),
        );
        let kubelet = workspace_binary("runtimekit-test-kubelet", "runtimekit-test-kubelet")?;
        self.spawn("simulated-kubelets", &kubelet, &kubelet_args)?;
        let agent = workspace_binary("runtimekit-node-agent", "runtimekit-node-agent")?;
        for node in nodes {
            let dir = root.join(&node.name);
            let kubelet = kubelet_root(node);
            wait_for_socket(&kubelet.join("device-plugins/kubelet.sock"))?;
            let identity = self.pki.client(&agent_user(&node.name), &[AGENT_GROUP])?;
            let kubeconfig = dir.join("agent.kubeconfig");
            std::fs::write(
                &kubeconfig,
                self.pki.kubeconfig(&self.server, "node-agent", &identity),
            )?;
            let mut args = vec![
                format!("--node-name={}", node.name),
                format!("--kubeconfig={}", kubeconfig.display()),
                format!("--simulate={}", node.profile),
                format!("--state-dir={}", dir.join("agent").display()),
                format!("--kubelet-dir={}", kubelet.join("device-plugins").display()),
                format!(
                    "--pod-resources-socket={}",
                    kubelet.join("pod-resources/kubelet.sock").display()
                ),
                "--metrics-address=127.0.0.1:0".into(),
            ];
            args.extend(agent_dra_args(
                &kubelet,
                &dir.join("cdi"),
                &dir.join("lj-runtime.json"),
            ));
            self.spawn(&format!("node-agent-{}", node.name), &agent, &args)?;
        }
        Ok(())
    }
}

/// A folder of its own for the simulated nodes' state and sockets, short whatever the cluster's
/// folder (a unix socket's path has at most 107 bytes, and a device plugin's is
/// `<kubelet>/device-plugins/runtimekit-aliyun-com-gpu-memory.sock`): under the system's
/// temporary folder, named after the cluster's folder, made anew, and linked from it as
/// `simulated` so that [`remove_simulated`] finds it.
fn short_root(dir: &Path) -> Result<PathBuf> {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    dir.hash(&mut hasher);
    let root = std::env::temp_dir().join(format!("rk-sim-{:08x}", hasher.finish() & 0xffff_ffff));
    if root.exists() {
        std::fs::remove_dir_all(&root).with_context(|| format!("clearing {}", root.display()))?;
    }
    // Only root may look inside (the agents' kubeconfigs hold their keys); made anew, so a
    // folder someone else made in between is refused rather than used.
    std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
        .create(&root)
        .with_context(|| format!("creating {}", root.display()))?;
    let link = dir.join(SIMULATED_DIR);
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&root, &link)
        .with_context(|| format!("linking {}", link.display()))?;
    Ok(root)
}

/// Removes the simulated nodes' folder of the cluster in `dir`, once their processes stopped.
pub fn remove_simulated(dir: &Path) {
    if let Ok(root) = std::fs::read_link(dir.join(SIMULATED_DIR)) {
        let _ = std::fs::remove_dir_all(root);
    }
}
