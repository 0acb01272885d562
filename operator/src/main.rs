//! The operator binary: `run` (the scheduler and controllers), `check` (manifests against
//! the resource contract, offline) and `pre-uninstall` (the chart's pre-delete hook).

use clap::{Parser, Subcommand};
use runtimekit_operator::leader::Timing;
use runtimekit_operator::run::{RunOptions, run};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(version, about = "GPU runtime kit operator")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the scheduler and the controllers (only the Lease holder acts).
    Run {
        /// The shared configuration (resource prefix, memory unit, topology labels) as YAML.
        #[arg(long, env = "RUNTIMEKIT_CONFIG")]
        config: Option<PathBuf>,
        /// Where /metrics, /healthz and /readyz are served.
        #[arg(long, default_value = "0.0.0.0:8080")]
        listen: SocketAddr,
        /// This replica's identity in the Lease.
        #[arg(long, env = "POD_NAME")]
        identity: String,
        /// The namespace of the Lease.
        #[arg(long, env = "POD_NAMESPACE", default_value = "runtimekit-system")]
        namespace: String,
        /// The name of the Lease.
        #[arg(long, default_value = "lj-runtimekit-scheduler")]
        lease: String,
        /// How long the Lease lasts without renewal, in seconds.
        #[arg(long, default_value_t = 10)]
        lease_duration: u64,
        /// Log as JSON instead of text.
        #[arg(long)]
        json_logs: bool,
    },
    /// Check Pod, JobSet and workload manifests against the resource contract and print what
    /// each container asks for; exits 1 when any manifest breaks a rule.
    Check {
        /// YAML files (several documents per file are fine); directories are read for *.yaml.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// The shared configuration (resource prefix, memory unit) as YAML; defaults apply without it.
        #[arg(long, env = "RUNTIMEKIT_CONFIG")]
        config: Option<PathBuf>,
    },
    /// The chart's pre-delete hook: exit 1, naming them, while pods run under the kit's
    /// RuntimeClass; otherwise delete the node agents' DaemonSet in the foreground and wait
    /// until its pods (whose installers take each node's setup away) are gone.
    PreUninstall {
        /// The shared configuration (the RuntimeClass's name) as YAML.
        #[arg(long, env = "RUNTIMEKIT_CONFIG")]
        config: Option<PathBuf>,
        /// The namespace of the node agents' DaemonSet.
        #[arg(long, env = "POD_NAMESPACE", default_value = "runtimekit-system")]
        namespace: String,
        /// The node agents' DaemonSet.
        #[arg(long, default_value = "runtimekit-node-agent")]
        daemonset: String,
        /// How long its pods may take to go, in seconds.
        #[arg(long, default_value_t = 240)]
        timeout: u64,
        /// The Helm release being uninstalled (named in the refusal).
        #[arg(long, default_value = "runtimekit")]
        release: String,
        /// Its revision the hook was rendered in (the one to roll back to).
        #[arg(long, default_value_t = 1)]
        revision: u32,
    },
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Check { paths, config } => {
            runtimekit_operator::check::run(&paths, config.as_deref())
        }
        Command::PreUninstall {
            config,
            namespace,
            daemonset,
            timeout,
            release,
            revision,
        } => {
            let node_side = runtimekit_operator::pre_uninstall::NodeSide {
                daemonset,
                timeout: Duration::from_secs(timeout),
                release: runtimekit_operator::pre_uninstall::Release {
                    name: release,
                    revision,
                    namespace: namespace.clone(),
                },
                namespace,
            };
            let checked = tokio::runtime::Runtime::new()
                .map_err(anyhow::Error::from)
                .and_then(|runtime| {
                    runtime.block_on(runtimekit_operator::pre_uninstall::run(
                        config.as_deref(),
                        &node_side,
                    ))
                });
            match checked {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => ExitCode::FAILURE,
                Err(e) => {
                    eprintln!("error: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Run {
            config,
            listen,
            identity,
            namespace,
            lease,
            lease_duration,
            json_logs,
        } => {
            init_logs(json_logs);
            let lease_duration = Duration::from_secs(lease_duration.max(2));
            let timing = Timing {
                lease_duration,
                renew_deadline: lease_duration * 7 / 10,
                retry_period: lease_duration / 5,
            };
            let options = RunOptions {
                config,
                listen,
                identity,
                namespace,
                lease,
                timing,
            };
            let runtime = match tokio::runtime::Runtime::new() {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match runtime.block_on(run(options)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("{e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

fn init_logs(json: bool) {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}
