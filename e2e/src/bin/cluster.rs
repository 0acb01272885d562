//! `just up`, `just demo` and `just down`: starts a control plane (or the whole demo cluster)
//! that outlives this command, or stops the processes one started, by the PIDs it recorded.

use clap::{Parser, Subcommand};
use runtimekit_e2e::cluster::{Cluster, ClusterOptions, stop_recorded};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

#[derive(Parser, Debug)]
#[command(about = "Start or stop a local control plane for development and the demo")]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Where the cluster's PKI, data, logs and kubeconfig live.
    #[arg(long, global = true, default_value = ".cluster/dev")]
    dir: PathBuf,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Start etcd, kube-apiserver, kube-controller-manager, JobSet and kwok; the last line printed
    /// is the `export KUBECONFIG=...` to use.
    Up {
        /// Also start kube-scheduler.
        #[arg(long)]
        kube_scheduler: bool,
        /// Also start a real node (containerd and the kubelet) named NAME; needs root and
        /// e2e/scripts/install-node-packages.sh.
        #[arg(long, value_name = "NAME", num_args = 0..=1, default_missing_value = "real-node")]
        real_node: Option<String>,
    },
    /// The main job: a control plane, a real node running the operator and the node agent from
    /// config/, simulated nodes of every profile, and the usage guide's examples placed; it keeps
    /// running for `down`.
    Demo,
    /// Stop the processes `up` or `demo` started.
    Down,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let dir = match std::path::absolute(&cli.dir) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: {}: {e}", cli.dir.display());
            return ExitCode::FAILURE;
        }
    };
    if !matches!(cli.command, Command::Down) {
        // Started processes outlive this command by design, but not an interrupted start.
        let recorded = dir.clone();
        let handler = ctrlc::set_handler(move || {
            eprintln!("interrupted: stopping what was started");
            let _ = runtimekit_e2e::cluster::interrupt(&recorded);
            std::process::exit(130);
        });
        if let Err(e) = handler {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    }
    match cli.command {
        Command::Up {
            kube_scheduler,
            real_node,
        } => {
            let started = Instant::now();
            let up = async {
                let mut cluster = Cluster::start(ClusterOptions {
                    dir: dir.clone(),
                    detached: true,
                    kube_scheduler,
                    profiling: false,
                    jobs_keep_running: false,
                    node_lease_seconds: runtimekit_e2e::cluster::NODE_LEASE_SECONDS,
                })
                .await?;
                if let Some(name) = real_node {
                    let plane = started.elapsed();
                    let node = cluster.start_real_node(&name)?;
                    let processes = started.elapsed();
                    node.wait_ready(&cluster.client().await?).await?;
                    println!(
                        "real node {name} is Ready: control plane {:.1} s, node processes {:.1} s, Ready {:.1} s later",
                        plane.as_secs_f64(),
                        (processes - plane).as_secs_f64(),
                        (started.elapsed() - processes).as_secs_f64(),
                    );
                }
                anyhow::Ok(cluster)
            };
            match up.await {
                Ok(cluster) => {
                    println!("up in {:.1} s", started.elapsed().as_secs_f64());
                    println!(
                        "control plane running; logs in {}",
                        dir.join("logs").display()
                    );
                    println!("stop it with: just down");
                    println!("export KUBECONFIG={}", cluster.kubeconfig.display());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e:#}");
                    let _ = stop_recorded(&dir);
                    ExitCode::FAILURE
                }
            }
        }
        Command::Demo => match runtimekit_e2e::demo::run(&dir).await {
            Ok(demo) => {
                print!("{}", demo.closing());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        },
        Command::Down => match stop_recorded(&dir) {
            Ok(n) => {
                println!("stopped {n} processes of the cluster in {}", dir.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        },
    }
}
