//! The agent's side of the installer's status file ([`crate::install::status`]): followed into
//! the agent's state, so the agent offers the node's cards only once it says the handler is
//! live, and reports it in the TopologyGroup's `RuntimeReady` condition
//! ([`runtimekit_crds::CONDITION_RUNTIME_READY`]).

use crate::install::status::InstallStatus;
use crate::model::NodeState;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::sync::watch;

/// The status while the installer has written none.
fn waiting(path: &Path) -> InstallStatus {
    InstallStatus {
        ready: false,
        reason: "WaitingForInstaller".into(),
        message: format!(
            "the node installer has not reported yet (the agent reads {})",
            path.display()
        ),
    }
}

/// Reads the installer's status at `path` every `interval` into the agent's state.
pub async fn follow(path: PathBuf, state: watch::Sender<NodeState>, interval: Duration) {
    loop {
        let status = InstallStatus::read(&path).unwrap_or_else(|| waiting(&path));
        state.send_if_modified(|s| {
            if s.install.as_ref() == Some(&status) {
                return false;
            }
            if status.ready {
                tracing::info!(message = %status.message, "the node installer reports the node set up");
            } else {
                tracing::warn!(reason = %status.reason, message = %status.message, "the node is not set up; its cards are not offered");
            }
            s.install = Some(status.clone());
            true
        });
        tokio::time::sleep(interval).await;
    }
}

/// Waits until the installer has said the node is set up.
pub async fn ready(mut state: watch::Receiver<NodeState>) {
    let _ = state
        .wait_for(|s| s.install.as_ref().is_some_and(|i| i.ready))
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_agent_waits_for_the_installer_s_ready() {
        let dir = std::env::temp_dir().join(format!("rk-install-follow-{}", std::process::id()));
        let path = dir.join("status.json");
        let (state, state_rx) = watch::channel(NodeState::default());
        let follower = tokio::spawn(follow(path.clone(), state, Duration::from_millis(10)));
        let mut seen = state_rx.clone();
        let first = seen
            .wait_for(|s| s.install.is_some())
            .await
            .unwrap()
            .install
            .clone()
            .unwrap();
        assert_eq!(first.reason, "WaitingForInstaller");
        let waiting = tokio::spawn(ready(state_rx.clone()));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "ready before the installer said so");
        InstallStatus {
            ready: true,
            reason: "Installed".into(),
            message: "set up".into(),
        }
        .write(&path)
        .unwrap();
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("ready once the installer says so")
            .unwrap();
        follower.abort();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
