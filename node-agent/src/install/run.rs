//! The installer in the node agent's DaemonSet: keeps the node set up (checked again every
//! interval, so a configuration management tool that rewrote containerd's file is repaired),
//! tells the agent beside it through the status file, and on SIGTERM tells an uninstall from
//! a restart. A rolling update, an eviction or a drain keeps everything (the next pod finds it
//! in place and restarts nothing); the DaemonSet deleted (or being deleted), or the node no
//! longer selected by it, takes the setup away.

use super::status::InstallStatus;
use super::{InstallError, Installer};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// The DaemonSet the installer runs in.
#[derive(Clone)]
pub struct Owner {
    /// The agent's client.
    pub client: kube::Client,
    /// The DaemonSet's namespace.
    pub namespace: String,
    /// Its name.
    pub daemonset: String,
}

/// Keeps the node set up until SIGTERM.
pub struct Keeper {
    /// This node.
    pub node: String,
    /// What to install.
    pub installer: Installer,
    /// Where the agent reads the outcome.
    pub status_file: PathBuf,
    /// How often the setup is checked again.
    pub recheck: Duration,
    /// The DaemonSet, looked at on SIGTERM.
    pub owner: Owner,
}

/// The status an install's outcome gives.
pub fn outcome_status(
    outcome: &Result<super::Installed, InstallError>,
    handler: &str,
) -> InstallStatus {
    match outcome {
        Ok(installed) => InstallStatus {
            ready: true,
            reason: "Installed".into(),
            message: format!(
                "containerd {} runs the {handler} handler with the installed lj-runtime",
                installed.runtime.version
            ),
        },
        Err(error) => InstallStatus {
            ready: false,
            reason: error.reason().into(),
            message: error.to_string(),
        },
    }
}

impl std::fmt::Debug for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Owner")
            .field("namespace", &self.namespace)
            .field("daemonset", &self.daemonset)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Keeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keeper")
            .field("node", &self.node)
            .field("status_file", &self.status_file)
            .finish_non_exhaustive()
    }
}

/// Whether a node with `labels` is one a DaemonSet with `selector` runs on.
pub fn selected(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

impl Keeper {
    /// Installs, checks every interval, and decides at SIGTERM.
    pub async fn run(self) {
        let mut written: Option<InstallStatus> = None;
        loop {
            let outcome = self.installer.install().await;
            match &outcome {
                Ok(installed) if !installed.written.is_empty() || installed.restarted => {
                    tracing::info!(
                        containerd = %installed.runtime.version,
                        written = ?installed.written,
                        restarted = installed.restarted,
                        "the node is set up"
                    );
                }
                Ok(_) => {}
                Err(error) => {
                    tracing::error!(reason = error.reason(), %error, "the node is not set up; its cards are not offered");
                }
            }
            let status = outcome_status(&outcome, &self.installer.handler.name);
            if written.as_ref() != Some(&status) {
                match status.write(&self.status_file) {
                    Ok(()) => written = Some(status),
                    Err(error) => tracing::error!(%error, "cannot tell the node agent"),
                }
            }
            tokio::select! {
                () = crate::process::signal() => break,
                () = tokio::time::sleep(self.recheck) => {}
            }
        }
        match self.leaving().await {
            Ok(Some(why)) => {
                tracing::info!(%why, "taking the node's setup away");
                match self.installer.uninstall().await {
                    Ok(removed) => tracing::info!(?removed, "the node's setup is taken away"),
                    Err(error) => {
                        tracing::warn!(reason = error.reason(), %error, "the node's setup stays")
                    }
                }
            }
            Ok(None) => tracing::info!("stopping; the node stays set up for the next installer"),
            Err(error) => {
                tracing::warn!(%error, "cannot tell an uninstall from a restart; the node stays set up");
            }
        }
    }

    /// Why the node leaves the kit, or `None` when this is only a restart.
    async fn leaving(&self) -> Result<Option<String>, kube::Error> {
        let sets: Api<DaemonSet> =
            Api::namespaced(self.owner.client.clone(), &self.owner.namespace);
        let Some(set) = sets.get_opt(&self.owner.daemonset).await? else {
            return Ok(Some(format!(
                "the DaemonSet {}/{} is gone",
                self.owner.namespace, self.owner.daemonset
            )));
        };
        if set.metadata.deletion_timestamp.is_some() {
            return Ok(Some(format!(
                "the DaemonSet {}/{} is being deleted",
                self.owner.namespace, self.owner.daemonset
            )));
        }
        let selector = set
            .spec
            .template
            .spec
            .and_then(|s| s.node_selector)
            .unwrap_or_default();
        let nodes: Api<Node> = Api::all(self.owner.client.clone());
        let Some(node) = nodes.get_opt(&self.node).await? else {
            return Ok(Some(format!("the node {} is gone", self.node)));
        };
        let labels = node.metadata.labels.unwrap_or_default();
        Ok((!selected(&selector, &labels))
            .then(|| format!("the DaemonSet no longer selects node {}", self.node)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_is_selected_when_it_has_every_selector_label() {
        let map = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect()
        };
        let selector = map(&[("lj_runtimekit_enable", "true")]);
        assert!(selected(
            &selector,
            &map(&[("lj_runtimekit_enable", "true"), ("zone", "a")])
        ));
        assert!(!selected(
            &selector,
            &map(&[("lj_runtimekit_enable", "false")])
        ));
        assert!(!selected(&selector, &map(&[])));
        assert!(selected(&map(&[]), &map(&[])));
    }

    #[test]
    fn outcomes_give_a_reason_and_a_message() {
        let failed = outcome_status(
            &Err(InstallError::Runtime(
                "cannot reach the container runtime".into(),
            )),
            "lj-runtime",
        );
        assert!(!failed.ready);
        assert_eq!(failed.reason, "ContainerdUnreachable");
        assert_eq!(failed.message, "cannot reach the container runtime");
        let in_use = InstallError::InUse {
            handler: "lj-runtime".into(),
            pods: vec!["team-a/train".into()],
        };
        assert!(
            in_use
                .to_string()
                .contains("pods still run under the lj-runtime handler (team-a/train)")
        );
    }
}
