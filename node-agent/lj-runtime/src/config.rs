//! lj-runtime's settings: a JSON file at `$LJ_RUNTIME_CONFIG`, else
//! `/etc/runtimekit/lj-runtime.json`; every field has a default, and a missing file means all
//! defaults.

use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where the settings are read from when `LJ_RUNTIME_CONFIG` is not set.
pub const DEFAULT_PATH: &str = "/etc/runtimekit/lj-runtime.json";

/// lj-runtime's settings.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct RuntimeConfig {
    /// The runc binary every command is handed to.
    pub runc: PathBuf,
    /// The resource-name prefix (the allocation annotation is `<prefix>/allocation`).
    pub resource_prefix: String,
    /// The node's name; when set, an allocation made for another node is refused.
    pub node_name: String,
    /// The resource layer's socket.
    pub resource_layer_socket: PathBuf,
    /// How long a create waits for a MIG instance the node agent is still making, in seconds.
    pub instance_wait_seconds: u64,
    /// The enforcement library given to containers of time-division slices.
    pub isolation_library: PathBuf,
    /// Where each such container's folder (its memory ledger and preload list) is kept.
    pub isolation_state_dir: PathBuf,
    /// What a time-division container alone on its card may use: `Enforce` (its share, the
    /// default) or `YieldIdle` (the whole card while no neighbour works).
    pub core_policy: CorePolicy,
}

/// The compute cap of a time-division container alone on its card.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum CorePolicy {
    /// Its share, always.
    #[default]
    Enforce,
    /// The whole card while no one else uses it.
    YieldIdle,
}

impl CorePolicy {
    /// The value of `RUNTIMEKIT_GPU_CORE_POLICY` the isolation library reads.
    pub fn variable(self) -> &'static str {
        match self {
            CorePolicy::Enforce => "enforce",
            CorePolicy::YieldIdle => "yield-idle",
        }
    }
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            runc: PathBuf::from("runc"),
            resource_prefix: "aliyun.com".into(),
            node_name: String::new(),
            resource_layer_socket: PathBuf::from("/run/runtimekit/resource-layer.sock"),
            instance_wait_seconds: 60,
            isolation_library: PathBuf::from(
                "/usr/local/lib/runtimekit/libruntimekit_isolation.so",
            ),
            isolation_state_dir: PathBuf::from("/run/runtimekit/isolation"),
            core_policy: CorePolicy::Enforce,
        }
    }
}

impl RuntimeConfig {
    /// Reads the settings from `path`; a missing file gives the defaults.
    pub fn load(path: &Path) -> Result<RuntimeConfig, String> {
        match std::fs::read_to_string(path) {
            Ok(text) => serde_json::from_str(&text)
                .map_err(|e| format!("lj-runtime settings {}: {e}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(RuntimeConfig::default()),
            Err(e) => Err(format!(
                "reading lj-runtime settings {}: {e}",
                path.display()
            )),
        }
    }

    /// How long a create waits for a MIG instance.
    pub fn instance_wait(&self) -> Duration {
        Duration::from_secs(self.instance_wait_seconds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_default_and_unknown_ones_are_refused() {
        let config: RuntimeConfig = serde_json::from_str(
            r#"{"nodeName": "n1", "instanceWaitSeconds": 5, "corePolicy": "YieldIdle"}"#,
        )
        .expect("json");
        assert_eq!(config.core_policy.variable(), "yield-idle");
        assert_eq!(config.node_name, "n1");
        assert_eq!(config.instance_wait(), Duration::from_secs(5));
        assert_eq!(config.resource_prefix, "aliyun.com");
        assert!(serde_json::from_str::<RuntimeConfig>(r#"{"nodename": "n1"}"#).is_err());
        assert_eq!(
            RuntimeConfig::load(Path::new("/nonexistent/lj-runtime.json")),
            Ok(RuntimeConfig::default())
        );
    }
}
