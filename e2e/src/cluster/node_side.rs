//! What every node the harness starts shares, real or simulated: the identity its node agent
//! authenticates as, and the wait for a socket its processes serve.

use anyhow::{Result, bail};
use std::path::Path;
use std::time::{Duration, Instant};

/// The group every node agent's certificate names (config/node-agent/rbac.yaml binds it).
pub const AGENT_GROUP: &str = "runtimekit:node-agents";
/// How long a node's process may take to serve its socket.
const SOCKET_TIMEOUT: Duration = Duration::from_secs(120);

/// The user a node's agent authenticates as (config/node-agent/admission-policy.yaml reads the
/// node's name from it).
pub fn agent_user(node: &str) -> String {
    format!("runtimekit:node-agent:{node}")
}

/// The node agent's DRA arguments for a node whose kubelet keeps its files under
/// `kubelet_root`: the kubelet's registration and plugin folders, the container runtime's CDI
/// folder `cdi`, and the lj-runtime settings `lj_runtime` the DRA shares follow.
pub fn agent_dra_args(kubelet_root: &Path, cdi: &Path, lj_runtime: &Path) -> Vec<String> {
    vec![
        format!(
            "--kubelet-registry-dir={}",
            kubelet_root.join("plugins_registry").display()
        ),
        format!(
            "--kubelet-plugins-dir={}",
            kubelet_root.join("plugins").display()
        ),
        format!("--cdi-dir={}", cdi.display()),
        format!("--lj-runtime-config={}", lj_runtime.display()),
    ]
}

/// Waits until a unix socket accepts connections.
pub(crate) fn wait_for_socket(socket: &Path) -> Result<()> {
    let deadline = Instant::now() + SOCKET_TIMEOUT;
    while std::os::unix::net::UnixStream::connect(socket).is_err() {
        if Instant::now() > deadline {
            bail!(
                "nothing answered on {} within {SOCKET_TIMEOUT:?}",
                socket.display()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}
