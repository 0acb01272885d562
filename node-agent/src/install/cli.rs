//! The command line of `runtimekit-node-installer`.

use super::containerd::Handler;
use super::restart::Restart;
use super::run::{Keeper, Owner};
use super::{ContainerdPaths, HostFile, Installer, lj_runtime_settings};
use crate::cli::{parse_duration, read_config, valid_node_name};
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::time::Duration;

/// Sets a GPU node up for the GPU runtime kit: copies `lj-runtime` and the isolation library
/// onto the host, writes lj-runtime's settings, adds the `lj-runtime` handler to containerd's
/// configuration and restarts containerd only when that changed (its running containers keep
/// running). `run` does it in the node agent's DaemonSet and undoes it when the DaemonSet is
/// deleted or the node leaves it; `install` and `uninstall` do it once. Paths are the host's.
#[derive(Parser, Debug, Clone)]
#[command(name = "runtimekit-node-installer", version)]
pub struct Cli {
    /// This node's name (lj-runtime refuses allocations made for another node).
    #[arg(long, env = "NODE_NAME", global = true)]
    pub node_name: Option<String>,

    /// The shared configuration (a RuntimeKitConfig YAML): its resource prefix names the
    /// annotations containerd passes to lj-runtime. The defaults when absent.
    #[arg(long, env = "RUNTIMEKIT_CONFIG", global = true)]
    pub config: Option<PathBuf>,

    /// Where the host's `/` is mounted in this container (`/` when run on the host).
    #[arg(long, default_value = "/", global = true)]
    pub host_root: PathBuf,

    /// The host's `/proc` (the installer runs in the host's PID namespace to find containerd).
    #[arg(long, default_value = "/proc", global = true)]
    pub proc_root: PathBuf,

    /// containerd's main configuration.
    #[arg(long, default_value = "/etc/containerd/config.toml", global = true)]
    pub containerd_config: PathBuf,

    /// The drop-in the handler goes into on containerd 2.x (imported by the main configuration).
    #[arg(
        long,
        default_value = "/etc/containerd/conf.d/lj-runtime.toml",
        global = true
    )]
    pub containerd_drop_in: PathBuf,

    /// containerd's CRI socket.
    #[arg(long, default_value = "/run/containerd/containerd.sock", global = true)]
    pub containerd_socket: PathBuf,

    /// How containerd is restarted when its configuration changed: `signal` stops it with
    /// SIGTERM for its supervisor to start again (containerd's systemd unit restarts it
    /// always); `none` leaves that to the administrator.
    #[arg(long, value_enum, default_value = "signal", global = true)]
    pub containerd_restart: Restart,

    /// How long containerd may take to come back with the handler after a restart.
    #[arg(long, default_value = "120s", value_parser = parse_duration, global = true)]
    pub restart_timeout: Duration,

    /// The handler's name (the RuntimeClass's `handler`).
    #[arg(long, default_value = "lj-runtime", global = true)]
    pub handler: String,

    /// Where `lj-runtime` goes on the host (the handler's `BinaryName`).
    #[arg(long, default_value = "/usr/local/bin/lj-runtime", global = true)]
    pub lj_runtime: PathBuf,

    /// Where lj-runtime's settings go on the host (where lj-runtime reads them: the default,
    /// or `$LJ_RUNTIME_CONFIG` in containerd's environment).
    #[arg(long, default_value = runtimekit_lj_runtime::config::DEFAULT_PATH, global = true)]
    pub lj_runtime_config: PathBuf,

    /// The administrator's lj-runtime settings (a JSON object: runc, corePolicy,
    /// isolationLibrary, ...); the node's name and the resource prefix are added. Defaults
    /// when absent. The isolation library goes where its `isolationLibrary` says.
    #[arg(long, global = true)]
    pub lj_runtime_settings: Option<PathBuf>,

    /// `lj-runtime` in this image.
    #[arg(long, default_value = "/usr/local/bin/lj-runtime", global = true)]
    pub lj_runtime_source: PathBuf,

    /// The isolation library in this image.
    #[arg(
        long,
        default_value = "/usr/local/lib/runtimekit/libruntimekit_isolation.so",
        global = true
    )]
    pub isolation_library_source: PathBuf,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// What the installer does.
#[derive(Subcommand, Debug, Clone)]
pub enum Command {
    /// Sets the node up once and exits.
    Install,
    /// Takes everything away once (refused while pods run under the handler) and exits.
    Uninstall,
    /// Keeps the node set up, writing the outcome where the node agent reads it, until
    /// SIGTERM; then undoes it if the DaemonSet is gone or no longer selects the node.
    Run {
        /// Where the outcome is written for the node agent (its `--runtime-status`).
        #[arg(long, default_value = "/run/runtimekit-installer/status.json")]
        status_file: PathBuf,
        /// How often the node's setup is checked again (and repaired).
        #[arg(long, default_value = "60s", value_parser = parse_duration)]
        recheck_interval: Duration,
        /// A kubeconfig; the in-cluster configuration without one.
        #[arg(long, env = "KUBECONFIG")]
        kubeconfig: Option<PathBuf>,
        /// The DaemonSet this runs in, looked at on SIGTERM.
        #[arg(long, default_value = "runtimekit-node-agent")]
        daemonset: String,
        /// Its namespace.
        #[arg(long, env = "POD_NAMESPACE", default_value = "runtimekit-system")]
        namespace: String,
    },
}

impl Cli {
    /// The installer these options describe, with the settings read and checked.
    pub fn installer(&self) -> Result<Installer, String> {
        let node = self
            .node_name
            .clone()
            .ok_or("--node-name (or NODE_NAME) is required")?;
        if !valid_node_name(&node) {
            return Err(format!(
                "--node-name {node:?} is not a node name (a lowercase DNS subdomain)"
            ));
        }
        let config = read_config(self.config.as_deref())?;
        let base = match &self.lj_runtime_settings {
            Some(path) => std::fs::read_to_string(path).map_err(|e| {
                format!("cannot read --lj-runtime-settings {}: {e}", path.display())
            })?,
            None => String::new(),
        };
        let (settings, runtime) = lj_runtime_settings(&base, &node, &config.resource_prefix)?;
        for (flag, path) in [
            ("--containerd-config", &self.containerd_config),
            ("--containerd-drop-in", &self.containerd_drop_in),
            ("--containerd-socket", &self.containerd_socket),
            ("--lj-runtime", &self.lj_runtime),
            ("--lj-runtime-config", &self.lj_runtime_config),
            (
                "isolationLibrary of --lj-runtime-settings",
                &runtime.isolation_library,
            ),
        ] {
            if !path.is_absolute() {
                return Err(format!("{flag} {} is not an absolute path", path.display()));
            }
        }
        Ok(Installer {
            root: self.host_root.clone(),
            proc_root: self.proc_root.clone(),
            containerd: ContainerdPaths {
                config: self.containerd_config.clone(),
                drop_in: self.containerd_drop_in.clone(),
                socket: self.containerd_socket.clone(),
            },
            restart: self.containerd_restart,
            handler: Handler {
                name: self.handler.clone(),
                binary: self.lj_runtime.clone(),
                pod_annotations: vec![format!("{}/*", config.resource_prefix)],
            },
            files: vec![
                HostFile {
                    source: self.lj_runtime_source.clone(),
                    destination: self.lj_runtime.clone(),
                    mode: 0o755,
                },
                HostFile {
                    source: self.isolation_library_source.clone(),
                    destination: runtime.isolation_library,
                    mode: 0o644,
                },
            ],
            settings: (self.lj_runtime_config.clone(), settings),
            live_timeout: self.restart_timeout,
        })
    }

    /// Runs the command; what it did, or why not.
    pub async fn execute(self) -> Result<(), String> {
        let installer = self.installer()?;
        match self.command {
            Command::Install => {
                let installed = installer.install().await.map_err(|e| e.to_string())?;
                tracing::info!(
                    containerd = %installed.runtime.version,
                    written = ?installed.written,
                    restarted = installed.restarted,
                    "the node is set up"
                );
                Ok(())
            }
            Command::Uninstall => {
                let removed = installer.uninstall().await.map_err(|e| e.to_string())?;
                tracing::info!(?removed, "the node's setup is taken away");
                Ok(())
            }
            Command::Run {
                status_file,
                recheck_interval,
                kubeconfig,
                daemonset,
                namespace,
            } => {
                let client = crate::process::client(kubeconfig.as_deref()).await?;
                Keeper {
                    node: self.node_name.unwrap_or_default(),
                    installer,
                    status_file,
                    recheck: recheck_interval,
                    owner: Owner {
                        client,
                        namespace,
                        daemonset,
                    },
                }
                .run()
                .await;
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn parse(args: &[&str]) -> Cli {
        Cli::try_parse_from(
            std::iter::once("runtimekit-node-installer").chain(args.iter().copied()),
        )
        .expect("parses")
    }

    #[test]
    fn the_defaults_are_a_standard_node() {
        let installer = parse(&["--node-name", "gpu-1", "install"])
            .installer()
            .expect("valid");
        assert_eq!(installer.handler.name, "lj-runtime");
        assert_eq!(installer.handler.pod_annotations, ["aliyun.com/*"]);
        assert_eq!(
            installer.files[1].destination,
            Path::new("/usr/local/lib/runtimekit/libruntimekit_isolation.so")
        );
        assert_eq!(installer.restart, Restart::Signal);
        assert!(installer.settings.1.contains("\"nodeName\": \"gpu-1\""));
    }

    #[test]
    fn bad_options_are_refused_with_a_message() {
        let missing = parse(&["install"]).installer().unwrap_err();
        assert!(missing.contains("--node-name"), "{missing}");
        let relative = parse(&["--node-name", "gpu-1", "--lj-runtime", "bin/lj", "install"])
            .installer()
            .unwrap_err();
        assert!(
            relative.contains("--lj-runtime bin/lj is not an absolute path"),
            "{relative}"
        );
        let unreadable = parse(&[
            "--node-name",
            "gpu-1",
            "--lj-runtime-settings",
            "/nonexistent/settings.json",
            "uninstall",
        ])
        .installer()
        .unwrap_err();
        assert!(
            unreadable.contains("cannot read --lj-runtime-settings"),
            "{unreadable}"
        );
    }
}
