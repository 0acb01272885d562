//! The kit installed with its Helm chart (config/helm/runtimekit) onto the real node, as a user
//! installs it: the images built here and imported, `helm upgrade --install` with values a
//! user sets, and a post-renderer (a Helm plugin running a kustomize overlay) that adds only
//! what this local cluster needs.

use super::Cluster;
use super::real_node::{LJ_RUNTIME_SETTINGS, METRICS_PORT, PROFILE, RealNode};
use crate::tools::{Tools, repo_root, run, wait_for};
use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The release's name and namespace, as the user guide installs it.
pub const RELEASE: &str = "runtimekit";
pub const RELEASE_NAMESPACE: &str = "runtimekit-system";

/// Whether `pod` is Ready.
pub fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Waits until the release's operator and node-agent pods are there and all Ready (those being
/// deleted aside), every container of them on an image of `version` when one is given.
pub async fn wait_kit_running(
    client: &Client,
    version: Option<&str>,
    timeout: std::time::Duration,
) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), RELEASE_NAMESPACE);
    let tag = version.map(|v| format!(":{v}"));
    let what = match version {
        Some(v) => format!("the kit's pods of {v} Ready"),
        None => "the kit's pods Ready".to_owned(),
    };
    wait_for(&what, timeout, || async {
        let listed = pods.list(&ListParams::default()).await?.items;
        let current: Vec<&Pod> = listed
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        let running = |prefix: &str| {
            let mine: Vec<&&Pod> = current
                .iter()
                .filter(|p| p.name_any().starts_with(prefix))
                .collect();
            !mine.is_empty()
                && mine.iter().all(|p| {
                    let images = p.spec.iter().flat_map(|s| &s.containers);
                    pod_ready(p)
                        && images
                            .filter_map(|c| c.image.as_deref())
                            .all(|i| tag.as_deref().is_none_or(|t| i.ends_with(t)))
                })
        };
        Ok((running("runtimekit-operator-") && running("runtimekit-node-agent-")).then_some(()))
    })
    .await
}

/// The Helm plugin that post-renders every release of this cluster for the real node.
const POST_RENDERER: &str = "runtimekit-e2e-node";

impl Cluster {
    /// Installs the kit with its chart as a user does, on the real node, or upgrades the
    /// release when it is installed: builds and imports this checkout's images and installs
    /// its chart ([`Cluster::install_chart`]).
    pub fn deploy_chart(&mut self, node: &RealNode, settings: &[&str]) -> Result<()> {
        let references = node.import_images(&["operator", "node-agent"])?;
        let version = references
            .first()
            .and_then(|r| r.rsplit(':').next())
            .context("build-images.sh printed no image")?
            .to_owned();
        self.install_chart(
            node,
            &repo_root().join("config/helm/runtimekit"),
            &version,
            settings,
        )
    }

    /// `helm upgrade --install` of `chart` with the images of `version` (imported on the real
    /// node), one operator replica and `settings` (`--set` values such as
    /// `config.memoryUnit=MiB`), post-rendered by the node's overlay
    /// ([`RealNode::write_overlay`]). It stops the node's own resource layer and agent processes
    /// for good (the DaemonSet's take their place). Resources the cluster's start applied from
    /// config/ are taken over (`--take-ownership`, as a user moving from `kubectl apply -k`
    /// does). The pods start a moment later.
    pub fn install_chart(
        &mut self,
        node: &RealNode,
        chart: &Path,
        version: &str,
        settings: &[&str],
    ) -> Result<()> {
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
        let overlay = node.write_overlay(port)?;
        self.install_post_renderer(&overlay)?;
        let mut install = self.helm()?;
        install
            .args(["upgrade", "--install", RELEASE])
            .arg(chart)
            .args(["--namespace", RELEASE_NAMESPACE, "--create-namespace"])
            .args(["--take-ownership", "--post-renderer", POST_RENDERER])
            // kustomize writes the policies' folded CEL with other line breaks than config/'s
            // files the cluster's start applied: the same expressions, but other values to
            // server-side apply.
            .arg("--force-conflicts");
        let images = [
            ("operator", "runtimekit-operator"),
            ("nodeAgent", "runtimekit-node-agent"),
        ];
        let mut values = vec!["operator.replicas=1".to_owned()];
        for (key, local) in images {
            values.push(format!("images.{key}.repository=docker.io/local/{local}"));
            values.push(format!("images.{key}.tag={version}"));
            values.push(format!("images.{key}.pullPolicy=Never"));
        }
        values.extend(settings.iter().map(|s| (*s).to_owned()));
        for value in values {
            install.arg("--set").arg(value);
        }
        run(install)?;
        Ok(())
    }

    /// `helm` for this cluster: its kubeconfig, and Helm's configuration, cache, data and
    /// plugins in the cluster's folder (nothing of the user's own Helm is read or written).
    pub fn helm(&self) -> Result<Command> {
        let mut command = Command::new(Tools::helm()?);
        let home = self.dir.join("helm");
        command
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_DATA_HOME", home.join("data"))
            .env("HELM_PLUGINS", home.join("plugins"));
        Ok(command)
    }

    /// Writes the post-renderer plugin into Helm's plugin folder (a plugin is a folder there):
    /// it writes what Helm rendered into `overlay` and prints `kubectl kustomize` of it.
    fn install_post_renderer(&self, overlay: &Path) -> Result<()> {
        let plugin = self.dir.join("helm/plugins").join(POST_RENDERER);
        std::fs::create_dir_all(&plugin)?;
        std::fs::write(
            plugin.join("plugin.yaml"),
            format!(
                "apiVersion: v1\ntype: postrenderer/v1\nname: {POST_RENDERER}\nversion: 0.1.0\nruntime: subprocess\nruntimeConfig:\n  platformCommand:\n    - command: ${{HELM_PLUGIN_DIR}}/render.sh\n"
            ),
        )?;
        let script = plugin.join("render.sh");
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\n# What Helm rendered, through the real node's overlay.\nset -e\ncat > '{chart}'\nexec '{kubectl}' kustomize '{overlay}'\n",
                chart = overlay.join("chart.yaml").display(),
                kubectl = self.tools.kubectl().display(),
                overlay = overlay.display(),
            ),
        )?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))?;
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
    /// Writes the post-renderer's overlay for this node and returns its folder: the chart's
    /// objects as Helm rendered them (`chart.yaml`, written by the plugin) with only what this
    /// local cluster needs: host networking with the apiserver on 127.0.0.1:`apiserver_port`
    /// (no kube-proxy), the node (no kube-scheduler runs), the projected token (no
    /// ServiceAccount admission), and the node's own folders for the resource layer (simulated,
    /// with stand-in device files), the kubelet's pod resources and the installer's host paths.
    pub fn write_overlay(&self, apiserver_port: u16) -> Result<PathBuf> {
        let overlay = self.dir.join("overlay");
        std::fs::create_dir_all(&overlay)?;
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
        let mut operator = common(0);
        // Host networking gives every operator pod the node's port 8080, which the kubelet
        // refuses to a second pod while the first still terminates: an update stops the old
        // pod, waits until it is gone, then starts the next.
        operator.push((
            "add",
            "/spec/strategy".to_owned(),
            json!({"type": "Recreate"}),
        ));
        // helm uninstall's check runs as a pod too (its container has no variables of its own).
        let mut check = vec![(
            "add",
            "/spec/template/spec/containers/0/env".to_owned(),
            json!([]),
        )];
        check.extend(common(0));
        // Indexes are config/node-agent/daemonset.yaml's: volumes pod-resources (1),
        // resource-layer-socket (2) and state (3); containers resource-layer (0), node-agent (1)
        // and node-installer (2).
        let mut agent = common(1);
        // The installer reads its DaemonSet when it stops: it talks to the apiserver too.
        agent.push((
            "add",
            "/spec/template/spec/containers/2/volumeMounts/-".into(),
            token_mount.clone(),
        ));
        for var in &env {
            agent.push((
                "add",
                "/spec/template/spec/containers/2/env/-".into(),
                var.clone(),
            ));
        }
        let mut installer = vec![
            "--config=/etc/runtimekit/config.yaml".to_owned(),
            format!(
                "--lj-runtime-settings=/host{}",
                self.dir.join(LJ_RUNTIME_SETTINGS).display()
            ),
        ];
        installer.extend(self.installer_args(Path::new("/host")));
        installer.extend([
            "--containerd-restart=signal".to_owned(),
            "run".to_owned(),
            "--status-file=/run/runtimekit-installer/status.json".to_owned(),
        ]);
        agent.extend([
            (
                "replace",
                "/spec/template/spec/containers/2/args".into(),
                json!(installer),
            ),
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
        let (operator, agent, check) = (lines(operator), lines(agent), lines(check));
        let text = format!(
            "# Written by the e2e harness: the chart as Helm rendered it, with only what this local\n# cluster needs (see RealNode::write_overlay).\napiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - chart.yaml\npatches:\n  - target: {{kind: Deployment, name: runtimekit-operator}}\n    patch: |\n{operator}  - target: {{kind: DaemonSet, name: runtimekit-node-agent}}\n    patch: |\n{agent}  - target: {{kind: Job, name: runtimekit-pre-uninstall}}\n    patch: |\n{check}",
        );
        std::fs::write(overlay.join("kustomization.yaml"), text)?;
        Ok(overlay)
    }
}
