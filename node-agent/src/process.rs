//! What the agent's and the installer's processes share: their apiserver client and their
//! stop signal.

use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};
use std::path::Path;

/// A client from `kubeconfig`, or the in-cluster configuration without one.
pub async fn client(kubeconfig: Option<&Path>) -> Result<Client, String> {
    let config = match kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path)
                .map_err(|e| format!("reading {}: {e}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .map_err(|e| format!("{}: {e}", path.display()))?
        }
        None => kube::Config::incluster()
            .map_err(|e| format!("no --kubeconfig and not running in a cluster ({e})"))?,
    };
    Client::try_from(config).map_err(|e| e.to_string())
}

/// Resolves on SIGTERM or SIGINT.
pub async fn signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
