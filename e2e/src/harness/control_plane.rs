//! What a test does with the shared control plane: restart its kube-apiserver or etcd, connect as
//! another user (a client certificate from the cluster's PKI, or a bearer token), and use the
//! run's real node.

use super::context::TestContext;
use crate::cluster::Cluster;
use crate::cluster::real_node::RealNode;
use anyhow::{Context, Result};
use kube::Client;
use std::path::PathBuf;
use std::time::Duration;
use tokio::sync::OnceCell;

pub use crate::cluster::real_node::REAL_NODE;

/// The run's real node, started by the first test that asks for it.
static STARTED: OnceCell<RealNode> = OnceCell::const_new();

impl TestContext {
    /// Runs `f` on the running control plane.
    fn with_cluster<T>(&self, f: impl FnOnce(&mut Cluster) -> Result<T>) -> Result<T> {
        let mut cluster = self
            .cluster
            .lock()
            .map_err(|_| anyhow::anyhow!("cluster poisoned"))?;
        f(cluster.as_mut().context("the control plane is stopped")?)
    }

    /// Stops the kube-apiserver for `down_for`, starts it again and waits until it is ready.
    pub async fn restart_apiserver(&self, down_for: Duration) -> Result<()> {
        self.restart("kube-apiserver", down_for).await
    }

    /// Stops etcd for `down_for` (the apiserver stays up and fails its requests), starts it again
    /// on the same data and waits until the apiserver is ready on it.
    pub async fn restart_etcd(&self, down_for: Duration) -> Result<()> {
        self.restart("etcd", down_for).await
    }

    async fn restart(&self, component: &str, down_for: Duration) -> Result<()> {
        let stopped = self.with_cluster(|cluster| cluster.stop_component(component))?;
        tokio::time::sleep(down_for).await;
        self.with_cluster(|cluster| cluster.start_again(stopped))?;
        self.wait_for(
            "the kube-apiserver to be ready again",
            Duration::from_secs(60),
            || async {
                let ready = self
                    .client
                    .request_text(http::Request::get("/readyz").body(Vec::new())?)
                    .await;
                Ok(ready.ok().filter(|body| body.contains("ok")).map(|_| ()))
            },
        )
        .await
    }

    /// A kubeconfig file for `user` in `groups`, with a client certificate from the cluster's
    /// PKI (the apiserver reads the user from the CN and the groups from O).
    pub fn kubeconfig_for(&self, user: &str, groups: &[&str]) -> Result<PathBuf> {
        let text = self.with_cluster(|cluster| {
            let identity = cluster.pki.client(user, groups)?;
            Ok(cluster.pki.kubeconfig(&cluster.server, user, &identity))
        })?;
        let file: String = user
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let path = self.scratch_dir()?.join(format!("kubeconfig-{file}"));
        std::fs::write(&path, text)?;
        Ok(path)
    }

    /// The run's real node (containerd and the kubelet on this machine), started and waited for
    /// until Ready by the first test that asks; it runs until the run ends.
    pub async fn real_node(&self) -> Result<RealNode> {
        let node = STARTED
            .get_or_try_init(|| async {
                let node = tokio::task::block_in_place(|| {
                    self.with_cluster(|cluster| cluster.start_real_node(REAL_NODE))
                })?;
                node.wait_ready(&self.client).await?;
                anyhow::Ok(node)
            })
            .await?;
        Ok(node.clone())
    }

    /// Stops the real node's kubelet and starts it again (its containers keep running), then
    /// waits until it answers its health check.
    pub async fn restart_real_kubelet(&self, node: &RealNode) -> Result<()> {
        let stopped = self.with_cluster(|cluster| cluster.stop_component("kubelet"))?;
        self.with_cluster(|cluster| cluster.start_again(stopped))?;
        self.wait_for(
            "the kubelet to be healthy again",
            Duration::from_secs(60),
            || async { Ok(node.kubelet_healthy().then_some(())) },
        )
        .await
    }

    /// Restarts the real node's resource layer and node agent simulating `profile` (see
    /// [`Cluster::switch_real_node_profile`]).
    pub fn switch_real_node_profile(&self, node: &RealNode, profile: &str) -> Result<()> {
        self.with_cluster(|cluster| cluster.switch_real_node_profile(node, profile))
    }

    /// Stops the real node's agent (or reaps it, when it stopped itself on a change of the
    /// node's device-API label) and starts it again.
    pub fn restart_real_node_agent(&self) -> Result<()> {
        self.with_cluster(|cluster| {
            let stopped = cluster.stop_component("node-agent")?;
            cluster.start_again(stopped)
        })
    }

    /// Installs the kit's chart on the real node, or upgrades it with `settings`
    /// ([`Cluster::deploy_chart`]).
    pub fn deploy_chart(&self, node: &RealNode, settings: &[&str]) -> Result<()> {
        tokio::task::block_in_place(|| {
            self.with_cluster(|cluster| cluster.deploy_chart(node, settings))
        })
    }

    /// Installs or upgrades to `chart` with the images of `version`
    /// ([`Cluster::install_chart`]).
    pub fn install_chart(
        &self,
        node: &RealNode,
        chart: &std::path::Path,
        version: &str,
        settings: &[&str],
    ) -> Result<()> {
        tokio::task::block_in_place(|| {
            self.with_cluster(|cluster| cluster.install_chart(node, chart, version, settings))
        })
    }

    /// Starts kwok nodes with simulated cards, each with its node agent process
    /// ([`Cluster::start_simulated_nodes`]).
    pub fn start_simulated_nodes(
        &self,
        nodes: &[crate::cluster::simulated::SimulatedNode],
    ) -> Result<()> {
        tokio::task::block_in_place(|| {
            let handle = tokio::runtime::Handle::current();
            self.with_cluster(|cluster| handle.block_on(cluster.start_simulated_nodes(nodes)))
        })
    }

    /// `helm` for the cluster ([`Cluster::helm`]).
    pub fn helm(&self) -> Result<std::process::Command> {
        self.with_cluster(|cluster| cluster.helm())
    }

    /// A client that authenticates as `user` in `groups` with a client certificate.
    pub async fn client_for(&self, user: &str, groups: &[&str]) -> Result<Client> {
        let path = self.kubeconfig_for(user, groups)?;
        client_from(kube::config::Kubeconfig::read_from(path)?).await
    }

    /// A client that authenticates with a bearer token (a ServiceAccount token).
    pub async fn client_with_token(&self, token: &str) -> Result<Client> {
        use base64::Engine;
        let (server, ca) =
            self.with_cluster(|cluster| Ok((cluster.server.clone(), cluster.pki.ca_pem.clone())))?;
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\nusers:\n- name: u\n  user:\n    token: {token}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n",
            ca = base64::engine::general_purpose::STANDARD.encode(ca),
        );
        client_from(serde_yaml::from_str(&text)?).await
    }
}

/// A client configured by `kubeconfig`.
async fn client_from(kubeconfig: kube::config::Kubeconfig) -> Result<Client> {
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;
    Ok(Client::try_from(config)?)
}
