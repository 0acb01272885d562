//! `kubectl-gpu`: the `kubectl gpu` plugin. Lists what it needs with the caller's kubeconfig
//! (so it sees only what the caller may read) and prints what the library's pure functions make
//! of it.

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use runtimekit_contract::config::{DEFAULT_SCHEDULER_NAME, JOBSET_NAME_LABEL};
use runtimekit_crds::{GangGroup, GpuSlice, TopologyGroup};
use runtimekit_kubectl_gpu::cards::{self, CardRow};
use runtimekit_kubectl_gpu::explain::{Facts, explain};
use runtimekit_kubectl_gpu::slices::{self, SliceRow};
use runtimekit_kubectl_gpu::table::{list, or_dash, render};
use serde::Serialize;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "kubectl-gpu",
    version,
    about = "The cluster's GPU cards, the slices pods hold, and why a pod is where it is"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// The kubeconfig file (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long, global = true)]
    kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use.
    #[arg(long, global = true)]
    context: Option<String>,
    /// The namespace (default: the context's).
    #[arg(short = 'n', long, global = true)]
    namespace: Option<String>,
    /// Output: a table (default), `wide`, `json` or `yaml`.
    #[arg(short = 'o', long, global = true, value_enum)]
    output: Option<Output>,
    /// The scheduler name pods of this project set.
    #[arg(long, global = true, default_value = DEFAULT_SCHEDULER_NAME)]
    scheduler_name: String,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Each node's cards: mode, free compute and memory, MIG instances and free placements,
    /// health and network position.
    Nodes,
    /// The slices each pod holds.
    Pods {
        /// Every namespace.
        #[arg(short = 'A', long)]
        all_namespaces: bool,
    },
    /// Why a pod is where it is, or why it is Pending, in plain words.
    Explain {
        /// The pod.
        pod: String,
    },
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Output {
    Wide,
    Json,
    Yaml,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<String> {
    let options = KubeConfigOptions {
        context: cli.context.clone(),
        ..KubeConfigOptions::default()
    };
    let config = match &cli.kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .with_context(|| format!("reading {}", path.display()))?;
            Config::from_custom_kubeconfig(kubeconfig, &options).await?
        }
        None => Config::from_kubeconfig(&options).await?,
    };
    let namespace = cli
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    let client = Client::try_from(config)?;
    match cli.command {
        Command::Nodes => {
            let rows = cards::rows(&groups(&client).await?, &all_slices(&client).await?);
            show(cli.output, &rows, nodes_table)
        }
        Command::Pods { all_namespaces } => {
            let slices = if all_namespaces {
                all_slices(&client).await?
            } else {
                let api: Api<GpuSlice> = Api::namespaced(client.clone(), &namespace);
                api.list(&ListParams::default()).await?.items
            };
            show(cli.output, &slices::rows(&slices), pods_table)
        }
        Command::Explain { pod } => {
            let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
            let pod = pods
                .get(&pod)
                .await
                .with_context(|| format!("pod {namespace}/{pod}"))?;
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            let slices: Vec<GpuSlice> = Api::<GpuSlice>::namespaced(client.clone(), &namespace)
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .filter(|s| s.spec.pod.uid == uid)
                .collect();
            let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
            let node_cards: Vec<CardRow> = match &node {
                Some(node) => cards::rows(&groups(&client).await?, &all_slices(&client).await?)
                    .into_iter()
                    .filter(|c| &c.node == node)
                    .collect(),
                None => Vec::new(),
            };
            let gang = match gang_of(&pod) {
                Some(name) => {
                    Api::<GangGroup>::namespaced(client.clone(), &namespace)
                        .get_opt(&name)
                        .await?
                }
                None => None,
            };
            let explanation = explain(&Facts {
                pod: &pod,
                scheduler: &cli.scheduler_name,
                slices: &slices::rows(&slices),
                node_cards: &node_cards,
                gang: gang.as_ref(),
            });
            match cli.output {
                Some(Output::Json) => Ok(serde_json::to_string_pretty(&explanation)? + "\n"),
                Some(Output::Yaml) => Ok(serde_yaml::to_string(&explanation)?),
                _ => Ok(explanation.lines.join("\n") + "\n"),
            }
        }
    }
}

/// The gang a pod names: its gang-name label, else its JobSet's.
fn gang_of(pod: &Pod) -> Option<String> {
    let labels = pod.metadata.labels.as_ref()?;
    labels
        .iter()
        .find(|(k, _)| k.ends_with("/gang-name"))
        .map(|(_, v)| v.clone())
        .or_else(|| labels.get(JOBSET_NAME_LABEL).cloned())
}

async fn groups(client: &Client) -> Result<Vec<TopologyGroup>> {
    Ok(Api::<TopologyGroup>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("listing TopologyGroups")?
        .items)
}

async fn all_slices(client: &Client) -> Result<Vec<GpuSlice>> {
    Ok(Api::<GpuSlice>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("listing GpuSlices")?
        .items)
}

/// Rows as JSON or YAML (a list), or as the table `table` makes (wide or not).
fn show<T: Serialize>(
    output: Option<Output>,
    rows: &[T],
    table: fn(&[T], bool) -> String,
) -> Result<String> {
    match output {
        Some(Output::Json) => Ok(serde_json::to_string_pretty(rows)? + "\n"),
        Some(Output::Yaml) => Ok(serde_yaml::to_string(rows)?),
        Some(Output::Wide) => Ok(table(rows, true)),
        None => Ok(table(rows, false)),
    }
}

fn nodes_table(rows: &[CardRow], wide: bool) -> String {
    let mut headers = vec![
        "NODE",
        "CARD",
        "MODEL",
        "MODE",
        "CORE FREE",
        "MEM FREE",
        "MIG",
        "MIG FREE",
        "HEALTH",
        "POSITION",
    ];
    if wide {
        headers.extend(["UUID", "NUMA", "PCIE SWITCH", "GROUP", "PODS"]);
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut cells = vec![
                r.node.clone(),
                r.index.to_string(),
                r.model.clone(),
                r.mode.clone(),
                r.core_free.map_or_else(|| "-".into(), |c| format!("{c}%")),
                r.memory_free_mib
                    .map_or_else(|| "-".into(), |m| format!("{}Gi", m / 1024)),
                list(&r.mig_instances),
                list(&r.mig_free),
                if r.healthy {
                    "Healthy".into()
                } else {
                    format!("Unhealthy: {}", r.health_reason.as_deref().unwrap_or("-"))
                },
                r.position.clone(),
            ];
            if wide {
                cells.extend([
                    r.uuid.clone(),
                    or_dash(r.numa_node),
                    or_dash(r.pcie_switch.as_ref()),
                    or_dash(r.interconnect_group.as_ref()),
                    list(&r.pods),
                ]);
            }
            cells
        })
        .collect();
    render(&headers, &cells)
}

fn pods_table(rows: &[SliceRow], wide: bool) -> String {
    let mut headers = vec![
        "NAMESPACE",
        "POD",
        "CONTAINER",
        "NODE",
        "CARD",
        "MODE",
        "SHARE",
        "PHASE",
        "GANG",
    ];
    if wide {
        headers.extend(["UUID", "NICS", "SLICE"]);
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut cells = vec![
                r.namespace.clone(),
                r.pod.clone(),
                r.container.clone(),
                r.node.clone(),
                or_dash(r.card),
                r.mode.clone(),
                r.share.clone(),
                r.phase.clone(),
                or_dash(r.gang.as_ref()),
            ];
            if wide {
                cells.extend([
                    or_dash(r.card_uuid.as_ref()),
                    list(&r.nics),
                    r.slice.clone(),
                ]);
            }
            cells
        })
        .collect();
    render(&headers, &cells)
}
