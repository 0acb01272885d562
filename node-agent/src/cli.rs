//! The command line of `runtimekit-node-agent`.

use crate::agent::{DraPaths, Options};
use crate::layer::Source;
use clap::{Parser, ValueEnum};
use runtimekit_contract::RuntimeKitConfig;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The node agent of the GPU runtime kit: reports the node's cards in its TopologyGroup,
/// enacts the GpuSlices bound to the node, watches card health, and serves the kubelet device
/// plugin. It reaches the hardware only through the resource layer's socket.
#[derive(Parser, Debug, Clone)]
#[command(name = "runtimekit-node-agent", version)]
pub struct Cli {
    /// This node's name.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,

    /// A kubeconfig file; without one, the in-cluster configuration (the pod's
    /// ServiceAccount token).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// The shared configuration (a RuntimeKitConfig YAML, the `config.yaml` of the
    /// `runtimekit-config` ConfigMap); the defaults when absent.
    #[arg(long, env = "RUNTIMEKIT_CONFIG")]
    pub config: Option<PathBuf>,

    /// The resource layer's unix socket.
    #[arg(
        long,
        env = "RUNTIMEKIT_RESOURCE_SOCKET",
        default_value = "/run/runtimekit/resource-layer.sock"
    )]
    pub resource_layer_socket: PathBuf,

    /// How long to wait at start for the resource layer's socket to appear (for example 30s).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub resource_layer_wait: Duration,

    /// Instead of --resource-layer-socket, start a simulated resource layer with this hardware
    /// profile (a shipped name such as h800-8, or a profile file) on a socket under --state-dir,
    /// keeping its instances in a state file there across restarts.
    #[arg(long, value_name = "PROFILE")]
    pub simulate: Option<String>,

    /// Where the agent keeps its files.
    #[arg(long, default_value = "/var/lib/runtimekit/node-agent")]
    pub state_dir: PathBuf,

    /// The kubelet's device-plugin folder (holding kubelet.sock).
    #[arg(long, default_value = "/var/lib/kubelet/device-plugins")]
    pub kubelet_dir: PathBuf,

    /// The kubelet's pod-resources socket, read to know which cards it gave whole to pods.
    #[arg(long, default_value = "/var/lib/kubelet/pod-resources/kubelet.sock")]
    pub pod_resources_socket: PathBuf,

    /// How often the TopologyGroup's heartbeat is written, in whole seconds from 1s to 1h (for
    /// example 30s). The status records it, and the operator withholds the node's cards after
    /// three intervals without a heartbeat.
    #[arg(long, default_value = "30s", value_parser = parse_heartbeat_interval)]
    pub heartbeat_interval: Duration,

    /// How often the cards are listed and every slice is looked at without a change.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub resync_interval: Duration,

    /// Do not serve the kubelet device plugin.
    #[arg(long)]
    pub no_device_plugin: bool,

    /// Where the exporter serves `/metrics` (host:port), or `off`.
    #[arg(long, default_value = "0.0.0.0:9501")]
    pub metrics_address: String,

    /// How often the exporter samples the node (a scrape serves the last sample).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub metrics_interval: Duration,

    /// Where processes' cgroups are read, to tell each card process's pod (the host's `/proc`:
    /// the agent runs in the host PID namespace).
    #[arg(long, default_value = "/proc")]
    pub proc_root: PathBuf,

    /// The kubelet's plugin-registration folder, where the DRA driver registers (on a node
    /// labelled `<prefix>/device-api=dra`).
    #[arg(long, default_value = "/var/lib/kubelet/plugins_registry")]
    pub kubelet_registry_dir: PathBuf,

    /// The kubelet's plugins folder; the DRA driver's socket goes in `<driver>/dra.sock` under it.
    #[arg(long, default_value = "/var/lib/kubelet/plugins")]
    pub kubelet_plugins_dir: PathBuf,

    /// The container runtime's CDI folder, where the DRA driver writes prepared claims' specs
    /// (containerd's `cdi_spec_dirs`).
    #[arg(long, default_value = "/var/run/cdi")]
    pub cdi_dir: PathBuf,

    /// lj-runtime's settings file: claims' time-division shares get its isolation library,
    /// state folder and core policy.
    #[arg(long, env = "LJ_RUNTIME_CONFIG", default_value = runtimekit_lj_runtime::config::DEFAULT_PATH)]
    pub lj_runtime_config: PathBuf,

    /// The node installer's status file (its `run --status-file`): the node's cards are
    /// offered only once it says containerd runs the lj-runtime handler, and the TopologyGroup's
    /// RuntimeReady condition says what it said. Without it the node is taken as set up by
    /// hand.
    #[arg(long)]
    pub runtime_status: Option<PathBuf>,

    /// How log lines are written.
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: LogFormat,
}

/// How log lines are written.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// A DNS subdomain, as node names are.
pub(crate) fn valid_node_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

impl Cli {
    /// The agent's options, with the configuration file read and every value checked.
    pub fn options(&self) -> Result<Options, String> {
        if !valid_node_name(&self.node_name) {
            return Err(format!(
                "--node-name {:?} is not a node name (a lowercase DNS subdomain)",
                self.node_name
            ));
        }
        let config = read_config(self.config.as_deref())?;
        let exporter_on = config.features.exporter;
        let layer = match &self.simulate {
            Some(profile) => Source::Simulate {
                profile: profile.clone(),
                state_dir: self.state_dir.clone(),
                node_name: self.node_name.clone(),
            },
            None => Source::Socket(self.resource_layer_socket.clone()),
        };
        Ok(Options {
            node_name: self.node_name.clone(),
            kubeconfig: self.kubeconfig.clone(),
            config,
            layer,
            layer_wait: self.resource_layer_wait,
            kubelet_dir: self.kubelet_dir.clone(),
            pod_resources_socket: self.pod_resources_socket.clone(),
            heartbeat: self.heartbeat_interval,
            resync: self.resync_interval,
            device_plugin: !self.no_device_plugin,
            metrics: match self.metrics_address.as_str() {
                "off" => None,
                // Switched off for the whole cluster: nothing listens.
                _ if !exporter_on => None,
                address => Some(address.parse().map_err(|_| {
                    format!("--metrics-address {address:?} is not host:port (or off)")
                })?),
            },
            metrics_interval: self.metrics_interval,
            proc_root: self.proc_root.clone(),
            runtime_status: self.runtime_status.clone(),
            dra: DraPaths {
                registry_dir: self.kubelet_registry_dir.clone(),
                plugins_dir: self.kubelet_plugins_dir.clone(),
                cdi_dir: self.cdi_dir.clone(),
                checkpoint: self.state_dir.join("dra").join("checkpoint.json"),
                lj_runtime_config: self.lj_runtime_config.clone(),
            },
        })
    }
}

/// The shared configuration at `path` (`--config`), checked; the defaults without one.
pub(crate) fn read_config(path: Option<&Path>) -> Result<RuntimeKitConfig, String> {
    let Some(path) = path else {
        return Ok(RuntimeKitConfig::default());
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read --config {}: {e}", path.display()))?;
    let config: RuntimeKitConfig = serde_yaml::from_str(&text)
        .map_err(|e| format!("--config {} is not a RuntimeKitConfig: {e}", path.display()))?;
    config
        .validate()
        .map_err(|e| format!("--config {}: {e}", path.display()))?;
    Ok(config)
}

/// Parses a duration such as `15s`, `500ms`, `2m` or `1h` (a bare number is seconds).
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let value: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a duration such as 15s, 500ms or 2m"))?;
    let duration = match unit {
        "" | "s" => Duration::from_secs(value),
        "ms" => Duration::from_millis(value),
        "m" => Duration::from_secs(value.saturating_mul(60)),
        "h" => Duration::from_secs(value.saturating_mul(3600)),
        _ => return Err(format!("{text:?} has an unknown unit (use ms, s, m or h)")),
    };
    if duration.is_zero() {
        return Err(format!("{text:?} must be longer than zero"));
    }
    Ok(duration)
}

/// A heartbeat interval, as the TopologyGroup's status can record it: whole seconds, 1 s to 1 h.
fn parse_heartbeat_interval(text: &str) -> Result<Duration, String> {
    let interval = parse_duration(text)?;
    if interval.subsec_nanos() != 0 || !(1..=3600).contains(&interval.as_secs()) {
        return Err(format!(
            "{text:?} must be whole seconds from 1s to 1h (the TopologyGroup records it in seconds)"
        ));
    }
    Ok(interval)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("runtimekit-node-agent").chain(args.iter().copied()))
    }

    #[test]
    fn simulate_replaces_the_socket() {
        let cli = parse(&[
            "--node-name",
            "n1",
            "--simulate",
            "h800-8",
            "--state-dir",
            "/tmp/x",
        ])
        .expect("parses");
        let options = cli.options().expect("valid");
        assert_eq!(
            options.layer,
            Source::Simulate {
                profile: "h800-8".into(),
                state_dir: "/tmp/x".into(),
                node_name: "n1".into()
            }
        );
        assert_eq!(options.heartbeat, Duration::from_secs(30));
        assert!(options.device_plugin);
    }

    #[test]
    fn bad_values_are_refused_with_a_message() {
        let cli = parse(&["--node-name", "Node_1"]).expect("parses");
        assert!(
            cli.options()
                .expect_err("invalid")
                .contains("not a node name")
        );
        let error = parse(&["--node-name", "n1", "--heartbeat-interval", "soon"])
            .expect_err("bad duration");
        assert!(error.to_string().contains("is not a duration"), "{error}");
        for interval in ["500ms", "1500ms", "2h"] {
            let error = parse(&["--node-name", "n1", "--heartbeat-interval", interval])
                .expect_err("out of range");
            assert!(
                error
                    .to_string()
                    .contains("must be whole seconds from 1s to 1h"),
                "{error}"
            );
        }
        let cli =
            parse(&["--node-name", "n1", "--config", "/nonexistent/config.yaml"]).expect("parses");
        assert!(
            cli.options()
                .expect_err("missing")
                .contains("cannot read --config")
        );
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("15s"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_duration("15"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("5d").is_err());
    }
}
