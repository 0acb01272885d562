//! The operator and the node agent deployed from `config/` onto the real node, as a user deploys
//! them: the images built here and imported, and a kustomize overlay that sets only what this
//! local cluster needs.

use super::Cluster;
use super::real_node::{METRICS_PORT, PROFILE, RealNode};
use crate::tools::{repo_root, run};
use anyhow::{Context, Result};
use serde_json::{Value, json};
use std::path::PathBuf;

impl Cluster {
    /// Deploys the operator and the node agent from `config/` as a user deploys them, on the
    /// real node: builds and imports their images, stops the node's own resource layer and agent
    /// processes for good (the DaemonSet's take their place) and applies the node's overlay
    /// ([`RealNode::write_overlay`]). The pods start a moment later.
    pub fn deploy_config(&mut self, node: &RealNode) -> Result<()> {
        let references = node.import_images(&["operator", "node-agent"])?;
        let version = references
            .first()
            .and_then(|r| r.rsplit(':').next())
            .context("build-images.sh printed no image")?
            .to_owned();
        for component in ["node-agent", "resource-layer"] {
            if self.pid(component).is_some() {
                self.stop_component(component)?;
            }
        }
        let port = self
            .server
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .context("the apiserver's URL has no port")?;
        let overlay = node.write_overlay(port, &version)?;
        let mut apply = self.kubectl();
        apply
            .args([
                "apply",
                "--server-side",
                "--force-conflicts",
                "-n",
                "runtimekit-system",
                "-k",
            ])
            .arg(&overlay);
        run(apply)?;
        Ok(())
    }
}

/// The projected ServiceAccount token a pod gets from the ServiceAccount admission plugin, which
/// this control plane runs without (tests create pods in namespaces the moment they exist).
const TOKEN_VOLUME: &str = r#"{"name": "kube-api-access", "projected": {"sources": [
  {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
  {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
  {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}}]}}"#;
const TOKEN_MOUNT: &str = r#"{"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}"#;

impl RealNode {
    /// Writes the local overlay of `config/` for this node and returns its folder: it sets only
    /// what this local cluster needs, namely the images built here (never pulled), host
    /// networking with the apiserver on 127.0.0.1:`apiserver_port` (no kube-proxy), the node
    /// (no kube-scheduler runs), the projected token (no ServiceAccount admission), one
    /// operator replica, and the node's own folders for the resource layer (simulated, with
    /// stand-in device files) and the kubelet's pod resources.
    pub fn write_overlay(&self, apiserver_port: u16, version: &str) -> Result<PathBuf> {
        let overlay = self.dir.join("overlay");
        std::fs::create_dir_all(&overlay)?;
        let config = repo_root().join("config");
        let up = overlay.components().count() - 1;
        let relative: PathBuf = std::iter::repeat_n("..", up)
            .collect::<PathBuf>()
            .join(config.strip_prefix("/").unwrap_or(&config));
        let gpu = self
            .layer_socket
            .parent()
            .unwrap_or(&self.dir)
            .display()
            .to_string();
        let pod_resources = self.dir.join("kubelet/pod-resources").display().to_string();
        let env = [
            json!({"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"}),
            json!({"name": "KUBERNETES_SERVICE_PORT", "value": apiserver_port.to_string()}),
        ];
        let token_volume: Value = serde_json::from_str(TOKEN_VOLUME)?;
        let token_mount: Value = serde_json::from_str(TOKEN_MOUNT)?;
        // What both pods need on this cluster; `container` is the one that talks to the apiserver.
        let common = |container: usize| {
            let spec = "/spec/template/spec";
            let mut ops = vec![
                ("add", format!("{spec}/nodeName"), json!(self.name)),
                ("add", format!("{spec}/hostNetwork"), json!(true)),
                ("add", format!("{spec}/volumes/-"), token_volume.clone()),
                (
                    "add",
                    format!("{spec}/containers/{container}/volumeMounts/-"),
                    token_mount.clone(),
                ),
            ];
            for var in &env {
                ops.push((
                    "add",
                    format!("{spec}/containers/{container}/env/-"),
                    var.clone(),
                ));
            }
            ops
        };
        let never = |container: usize| {
            (
                "add",
                format!("/spec/template/spec/containers/{container}/imagePullPolicy"),
                json!("Never"),
            )
        };
        let mut operator = common(0);
        operator.push(("replace", "/spec/replicas".into(), json!(1)));
        operator.push(never(0));
        // Indexes are config/node-agent/daemonset.yaml's: volumes pod-resources (1),
        // resource-layer-socket (2) and state (3); containers resource-layer (0) and node-agent (1).
        let mut agent = common(1);
        agent.extend([
            never(0),
            never(1),
            (
                "replace",
                "/spec/template/spec/volumes/1/hostPath/path".into(),
                json!(pod_resources),
            ),
            (
                "replace",
                "/spec/template/spec/volumes/2/hostPath/path".into(),
                json!(gpu),
            ),
            (
                "replace",
                "/spec/template/spec/volumes/3/hostPath/path".into(),
                json!(format!("{gpu}/deployed")),
            ),
            (
                "replace",
                "/spec/template/spec/containers/0/args".into(),
                json!([
                    "serve",
                    "--backend=simulated",
                    format!("--profile={PROFILE}"),
                    format!("--socket={gpu}/resource-layer.sock"),
                    "--state-file=/var/lib/runtimekit/resource-layer/state.json",
                    format!("--device-dir={gpu}/devices"),
                ]),
            ),
            (
                "replace",
                "/spec/template/spec/containers/0/volumeMounts/0/mountPath".into(),
                json!(gpu),
            ),
            (
                "replace",
                "/spec/template/spec/containers/1/args/1".into(),
                json!(format!("--resource-layer-socket={gpu}/resource-layer.sock")),
            ),
            // Host networking here: the exporter listens on loopback only.
            (
                "add",
                "/spec/template/spec/containers/1/args/-".into(),
                json!(format!("--metrics-address=127.0.0.1:{METRICS_PORT}")),
            ),
            (
                "replace",
                "/spec/template/spec/containers/1/volumeMounts/2/mountPath".into(),
                json!(gpu),
            ),
        ]);
        // Each operation as one line of JSON, which is YAML too.
        let lines = |ops: Vec<(&str, String, Value)>| -> String {
            ops.into_iter()
                .map(|(op, path, value)| {
                    format!(
                        "      - {}\n",
                        json!({"op": op, "path": path, "value": value})
                    )
                })
                .collect()
        };
        let (operator, agent) = (lines(operator), lines(agent));
        let image = |name: &str, local: &str| {
            format!(
                "  - name: {name}\n    newName: docker.io/local/{local}\n    newTag: {version}\n"
            )
        };
        let text = format!(
            "# Written by the e2e harness: config/ as a user deploys it, with only what this local\n# cluster needs (see RealNode::write_overlay).\napiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {config}\nimages:\n{op_image}{agent_image}patches:\n  - target: {{kind: Deployment, name: runtimekit-operator}}\n    patch: |\n{operator}  - target: {{kind: DaemonSet, name: runtimekit-node-agent}}\n    patch: |\n{agent}",
            config = relative.display(),
            op_image = image("lj-runtimekit/operator", "runtimekit-operator"),
            agent_image = image("lj-runtimekit/node-agent", "runtimekit-node-agent"),
        );
        std::fs::write(overlay.join("kustomization.yaml"), text)?;
        Ok(overlay)
    }
}
