//! `runtimekit-resource-layer`: serves the resource-layer API on a unix socket, or prints a
//! read-only probe of the cards.

use clap::{Args, Parser, Subcommand, ValueEnum};
use runtimekit_resource_layer::meter::MeterOptions;
use runtimekit_resource_layer::{
    Backend, NvmlBackend, NvmlOptions, ServeOptions, SimOptions, SimulatedBackend, probe, serve,
    sim::shipped_names,
};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(name = "runtimekit-resource-layer", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve the resource-layer gRPC API on a unix socket.
    Serve {
        #[command(flatten)]
        backend: BackendArgs,
        /// The unix socket to listen on.
        #[arg(
            long,
            env = "RUNTIMEKIT_RESOURCE_SOCKET",
            default_value = "/run/runtimekit/resource-layer.sock"
        )]
        socket: PathBuf,
        /// The longest a call may run when the caller sets no deadline, in milliseconds.
        #[arg(long, default_value_t = 30_000)]
        call_timeout_ms: u64,
        #[command(flatten)]
        meter: MeterArgs,
    },
    /// Print what the backend sees (cards, topology, MIG mode and instances, metrics, health)
    /// and exit. Read-only: changes no MIG mode and no instance.
    Probe {
        #[command(flatten)]
        backend: BackendArgs,
        /// Skip metrics.
        #[arg(long)]
        no_metrics: bool,
        /// How long to watch for health events before reporting, in milliseconds.
        #[arg(long, default_value_t = 2_000)]
        health_wait_ms: u64,
        /// Print one tab-separated line per figure instead of the report (for scripts).
        #[arg(long)]
        facts: bool,
    },
    /// Create one MIG instance and destroy it again, printing each step: a check of the MIG
    /// calls on a machine whose owner allows it. Changes no MIG mode.
    MigRoundtrip {
        #[command(flatten)]
        backend: BackendArgs,
        /// The card (in MIG mode).
        #[arg(long)]
        card: u32,
        /// The MIG profile, for example `1g.10gb`.
        #[arg(long)]
        mig_profile: String,
        /// The placement start.
        #[arg(long, default_value_t = 0)]
        start: u8,
    },
    /// List the hardware profiles shipped with the simulated backend.
    Profiles,
}

/// The compute meter, which feeds isolated containers' launch gates their measured shares.
#[derive(Args, Debug)]
struct MeterArgs {
    /// lj-runtime's `isolationStateDir` (one folder per time-division container), where the
    /// measured shares of SM time are written; the meter reads nothing while it is empty.
    #[arg(long, default_value = "/run/runtimekit/isolation")]
    isolation_state_dir: PathBuf,
    /// How often the shares are measured, in milliseconds.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(100..=60_000))]
    meter_interval_ms: u64,
    /// Where processes' maps are read, to tell each card process's container (the host's
    /// `/proc`: the resource layer runs in the host PID namespace).
    #[arg(long, default_value = "/proc")]
    proc_root: PathBuf,
    /// Do not run the compute meter (time-division compute caps then go unenforced).
    #[arg(long)]
    no_compute_meter: bool,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum BackendKind {
    /// Cards from a hardware profile (tests, demo).
    Simulated,
    /// NVIDIA cards through NVML.
    Nvml,
}

#[derive(Args, Debug)]
struct BackendArgs {
    /// Which backend.
    #[arg(long, value_enum)]
    backend: BackendKind,
    /// Simulated: a shipped profile name or a profile YAML file.
    #[arg(long, required_if_eq("backend", "simulated"))]
    profile: Option<String>,
    /// The node name (simulated card UUIDs derive from it).
    #[arg(long, env = "NODE_NAME", default_value = "")]
    node_name: String,
    /// Simulated: seed of the readings.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Where instance keys and shares are kept across restarts.
    #[arg(long)]
    state_file: Option<PathBuf>,
    /// How long a hardware call runs before its card gets a CALL_HANG fault, in milliseconds.
    #[arg(long, default_value_t = 5_000)]
    hang_threshold_ms: u64,
    /// Simulated: make stand-in device files for the cards, MIG instances and NICs in this
    /// folder (character devices no driver answers), so a runtime can inject them.
    #[arg(long)]
    device_dir: Option<PathBuf>,
    /// NVML: the library to load instead of libnvidia-ml.so.1 from the library path.
    #[arg(long)]
    nvml_lib: Option<PathBuf>,
    /// NVML: the sysfs root.
    #[arg(long, default_value = "/sys")]
    sysfs: PathBuf,
    /// NVML: do not check that processes holding card memory still exist (it is checked only
    /// in the host PID namespace anyway).
    #[arg(long)]
    no_process_liveness: bool,
    /// NVML: NVLink errors (CRC, replay, recovery, all links) between two health polls that
    /// raise an NVLINK_ERRORS warning.
    #[arg(long, default_value_t = 100)]
    nvlink_error_burst: u64,
    /// NVML: how long after its last occurrence an XID fault clears, in seconds (the card must
    /// answer its poll too).
    #[arg(long, default_value_t = 300)]
    xid_clear_after_s: u64,
    /// NVML: how long loading and initialising NVML may take, in seconds, before the resource
    /// layer gives up with an error (the driver can hang there).
    #[arg(long, default_value_t = 60)]
    nvml_init_timeout_s: u64,
}

impl BackendArgs {
    fn open(&self) -> Result<Arc<dyn Backend>, runtimekit_resource_layer::LayerError> {
        let hang_threshold = Duration::from_millis(self.hang_threshold_ms);
        Ok(match self.backend {
            BackendKind::Simulated => {
                let profile = self.profile.as_deref().unwrap_or_default();
                Arc::new(SimulatedBackend::from_profile(
                    profile,
                    SimOptions {
                        node_name: if self.node_name.is_empty() {
                            SimOptions::default().node_name
                        } else {
                            self.node_name.clone()
                        },
                        seed: self.seed,
                        state_file: self.state_file.clone(),
                        hang_threshold,
                        device_dir: self.device_dir.clone(),
                        ..SimOptions::default()
                    },
                )?)
            }
            BackendKind::Nvml => Arc::new(NvmlBackend::new(NvmlOptions {
                lib_path: self.nvml_lib.clone(),
                node_name: self.node_name.clone(),
                state_file: self.state_file.clone(),
                sysfs_root: self.sysfs.clone(),
                hang_threshold,
                check_process_liveness: !self.no_process_liveness,
                init_timeout: Duration::from_secs(self.nvml_init_timeout_s),
                xid_clear_after: Duration::from_secs(self.xid_clear_after_s),
                nvlink_error_burst: self.nvlink_error_burst,
                ..NvmlOptions::default()
            })?),
        })
    }
}

async fn run(cli: Cli) -> Result<(), String> {
    match cli.command {
        Command::Profiles => {
            for name in shipped_names() {
                let profile =
                    runtimekit_resource_layer::SimProfile::load(name).map_err(|e| e.to_string())?;
                println!("{name}: {}", profile.description);
            }
            Ok(())
        }
        Command::Probe {
            backend,
            no_metrics,
            health_wait_ms,
            facts,
        } => {
            let backend = backend.open().map_err(|e| e.to_string())?;
            tokio::time::sleep(Duration::from_millis(health_wait_ms)).await;
            let text = tokio::task::spawn_blocking(move || {
                if facts {
                    runtimekit_resource_layer::facts::facts(backend.as_ref())
                } else {
                    probe::report(backend.as_ref(), !no_metrics)
                }
            })
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
            print!("{text}");
            Ok(())
        }
        Command::MigRoundtrip {
            backend,
            card,
            mig_profile: profile,
            start,
        } => {
            let backend = backend.open().map_err(|e| e.to_string())?;
            tokio::task::spawn_blocking(move || {
                mig_roundtrip(backend.as_ref(), card, profile, start)
            })
            .await
            .map_err(|e| e.to_string())?
        }
        Command::Serve {
            backend,
            socket,
            call_timeout_ms,
            meter,
        } => {
            let backend = backend.open().map_err(|e| e.to_string())?;
            let _meter = if meter.no_compute_meter {
                None
            } else {
                let options = MeterOptions {
                    state_dir: meter.isolation_state_dir,
                    proc_root: meter.proc_root,
                    interval: Duration::from_millis(meter.meter_interval_ms),
                };
                Some(
                    runtimekit_resource_layer::meter::spawn(backend.clone(), options)
                        .map_err(|e| format!("cannot start the compute meter: {e}"))?,
                )
            };
            let handle = serve(
                backend,
                &socket,
                ServeOptions {
                    call_timeout: Duration::from_millis(call_timeout_ms),
                },
            )
            .await
            .map_err(|e| e.to_string())?;
            let mut terminate =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .map_err(|e| format!("cannot watch SIGTERM: {e}"))?;
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = terminate.recv() => {}
            }
            tracing::info!("stopping");
            handle.shutdown().await.map_err(|e| e.to_string())
        }
    }
}

/// Creates a MIG instance, lists it and destroys it, printing each step.
fn mig_roundtrip(
    backend: &dyn Backend,
    card: u32,
    profile: String,
    start: u8,
) -> Result<(), String> {
    use runtimekit_resource_layer::instances::{CreateRequest, ShareSpec};
    const KEY: &str = "gpu-check-roundtrip";
    let created = backend
        .create_instance(CreateRequest {
            key: KEY.into(),
            device_index: card,
            device_uuid: None,
            spec: ShareSpec::Mig { profile, start },
        })
        .map_err(|e| format!("create: {e}"))?;
    let ids = created.instance.and_then(|i| i.mig).unwrap_or_default();
    println!(
        "created: GPU instance {}, compute instance {}, {}",
        ids.gpu_instance_id, ids.compute_instance_id, ids.device_uuid
    );
    let listed = backend
        .list_instances(&[card])
        .map_err(|e| format!("list: {e}"))?;
    let found = listed.instances.iter().any(|i| i.key == KEY);
    println!("listed: {}", if found { "yes" } else { "NO" });
    let destroyed = backend
        .destroy_instance(runtimekit_resource_layer::DestroyTarget::Key(KEY.into()))
        .map_err(|e| format!("destroy: {e}"))?;
    println!(
        "destroyed: {}",
        if destroyed.existed { "yes" } else { "NO" }
    );
    if found && destroyed.existed {
        Ok(())
    } else {
        Err("the round trip did not find or destroy its instance".into())
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
