//! `kubectl-gpu`: the `kubectl gpu` plugin. Lists what it needs with the caller's kubeconfig
//! (so it sees only what the caller may read) and prints what the library's pure functions make
//! of it.

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, ResourceQuota};
use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use runtimekit_contract::config::{DEFAULT_SCHEDULER_NAME, JOBSET_NAME_LABEL};
use runtimekit_contract::{RuntimeKitConfig, parse_pod};
use runtimekit_crds::{GangGroup, GpuSlice, TopologyGroup};
use runtimekit_kubectl_gpu::cards::{self, CardRow};
use runtimekit_kubectl_gpu::claims::{self, ClaimEntry};
use runtimekit_kubectl_gpu::explain::{Facts, explain};
use runtimekit_kubectl_gpu::fit::{self, Fit};
use runtimekit_kubectl_gpu::quota::{self, QuotaRow};
use runtimekit_kubectl_gpu::slices::{self, SliceRow};
use runtimekit_kubectl_gpu::table::{list, or_dash, render};
use runtimekit_kubectl_gpu::usage;
use runtimekit_placement::PodInput;
use runtimekit_placement::snapshot::{Listed, cluster_from};
use serde::Serialize;
use std::path::{Path, PathBuf};
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
    /// The shared configuration's resource prefix: DRA claims of the driver
    /// `gpu.runtimekit.<prefix>` are shown beside the slices.
    #[arg(long, global = true, default_value = "aliyun.com")]
    resource_prefix: String,
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
        /// A Prometheus that scrapes the node agents' exporters (`http://host:port`, for
        /// example through `kubectl port-forward`): each slice's use now is shown beside it.
        #[arg(long)]
        prometheus: Option<String>,
    },
    /// Each namespace's quotas on the card resources: what its pods hold, every replica
    /// counted as the scheduler counts them, against the limit and the ResourceQuota's own count.
    Quota {
        /// Every namespace.
        #[arg(short = 'A', long)]
        all_namespaces: bool,
    },
    /// Why a pod is where it is, or why it is Pending, in plain words.
    Explain {
        /// The pod.
        pod: String,
    },
    /// Where a pod would land now and why, or why nowhere, without creating it.
    Fit {
        /// The pod's manifest (YAML or JSON; `-` for stdin).
        #[arg(short = 'f', long)]
        filename: PathBuf,
        /// The ConfigMap holding the shared configuration (`namespace/name`), read when the
        /// caller may; the defaults otherwise.
        #[arg(long, default_value = "runtimekit-system/runtimekit-config")]
        config_map: String,
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
    let driver = runtimekit_contract::dra::driver_name(&cli.resource_prefix);
    match cli.command {
        Command::Nodes => {
            let rows = node_cards(&client, &groups(&client).await?, &driver).await?;
            show(cli.output, &rows, nodes_table)
        }
        Command::Pods {
            all_namespaces,
            prometheus,
        } => {
            let slices = if all_namespaces {
                all_slices(&client).await?
            } else {
                let api: Api<GpuSlice> = Api::namespaced(client.clone(), &namespace);
                api.list(&ListParams::default()).await?.items
            };
            let scope = (!all_namespaces).then_some(namespace.as_str());
            let entries = claim_entries(&client, scope, &groups(&client).await?, &driver).await?;
            let mut rows = slices::rows(&slices);
            rows.extend(claims::rows(&entries));
            rows.sort_by(|a, b| {
                (&a.namespace, &a.pod, &a.container).cmp(&(&b.namespace, &b.pod, &b.container))
            });
            if let Some(prometheus) = &prometheus {
                let sm = usage::samples(&query(prometheus, usage::SM_UTIL).await?)
                    .map_err(|e| anyhow::anyhow!("{prometheus}: {e}"))?;
                let memory = usage::samples(&query(prometheus, usage::FB_USED).await?)
                    .map_err(|e| anyhow::anyhow!("{prometheus}: {e}"))?;
                usage::attach(&mut rows, &sm, &memory);
            }
            let table = if prometheus.is_some() {
                pods_table_with_usage
            } else {
                pods_table
            };
            show(cli.output, &rows, table)
        }
        Command::Quota { all_namespaces } => {
            let (quotas, pods): (Api<ResourceQuota>, Api<Pod>) = if all_namespaces {
                (Api::all(client.clone()), Api::all(client.clone()))
            } else {
                (
                    Api::namespaced(client.clone(), &namespace),
                    Api::namespaced(client.clone(), &namespace),
                )
            };
            let quotas = quotas
                .list(&ListParams::default())
                .await
                .context("listing ResourceQuotas")?
                .items;
            let pods = pods
                .list(&ListParams::default())
                .await
                .context("listing Pods")?
                .items;
            let config = RuntimeKitConfig {
                resource_prefix: cli.resource_prefix.clone(),
                scheduler_name: cli.scheduler_name.clone(),
                ..RuntimeKitConfig::default()
            };
            let rows = quota::rows(&quotas, &pods, &config);
            if rows.is_empty() && cli.output.is_none() {
                let scope = if all_namespaces {
                    "any namespace".to_owned()
                } else {
                    format!("namespace {namespace}")
                };
                return Ok(format!(
                    "No ResourceQuota limits card resources in {scope}.\n"
                ));
            }
            show(cli.output, &rows, quota_table)
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
            // One listing of the groups serves the claims, the node's cards and its NICs.
            let groups = groups(&client).await?;
            let entries: Vec<ClaimEntry> =
                claim_entries(&client, Some(&namespace), &groups, &driver)
                    .await?
                    .into_iter()
                    .filter(|e| e.slice.spec.pod.uid == uid)
                    .collect();
            let mut held = slices::rows(&slices);
            held.extend(claims::rows(&entries));
            let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
            let node_cards: Vec<CardRow> = match &node {
                Some(node) => node_cards(&client, &groups, &driver)
                    .await?
                    .into_iter()
                    .filter(|c| &c.node == node)
                    .collect(),
                None => Vec::new(),
            };
            let node_nics = node
                .as_ref()
                .and_then(|node| {
                    groups
                        .iter()
                        .find(|g| g.spec.node_name.as_ref() == Some(node))
                })
                .and_then(|g| g.status.as_ref())
                .map(|s| s.nics.clone())
                .unwrap_or_default();
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
                slices: &held,
                node_cards: &node_cards,
                node_nics: &node_nics,
                gang: gang.as_ref(),
            });
            sentences(cli.output, &explanation, &explanation.lines)
        }
        Command::Fit {
            filename,
            config_map,
        } => {
            let fit = fit_pod(&client, &filename, &config_map, &namespace).await?;
            sentences(cli.output, &fit, &fit.lines)
        }
    }
}

/// Prometheus' answer to the instant query of the metric family `family`.
async fn query(prometheus: &str, family: &str) -> Result<String> {
    let url = format!(
        "{}/api/v1/query?query={family}",
        prometheus.trim_end_matches('/')
    );
    let uri: http::Uri = url
        .parse()
        .with_context(|| format!("--prometheus {prometheus:?} is not a URL"))?;
    anyhow::ensure!(
        uri.scheme_str() == Some("http"),
        "--prometheus {prometheus:?}: only http:// is read (port-forward to reach a TLS one)"
    );
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<bytes::Bytes>>();
    let response = tokio::time::timeout(std::time::Duration::from_secs(10), client.get(uri))
        .await
        .with_context(|| format!("{prometheus} did not answer within 10 s"))?
        .with_context(|| format!("asking {prometheus}"))?;
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .with_context(|| format!("reading {prometheus}'s answer"))?
        .to_bytes();
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// An answer as JSON or YAML, or as its sentences.
fn sentences<T: Serialize>(output: Option<Output>, answer: &T, lines: &[String]) -> Result<String> {
    match output {
        Some(Output::Json) => Ok(serde_json::to_string_pretty(answer)? + "\n"),
        Some(Output::Yaml) => Ok(serde_yaml::to_string(answer)?),
        _ => Ok(lines.join("\n") + "\n"),
    }
}

/// The shared configuration from `config_map` (`namespace/name`), or the defaults when the
/// caller may not read it or it is not there.
async fn shared_config(client: &Client, config_map: &str) -> Result<RuntimeKitConfig> {
    let (namespace, name) = config_map
        .split_once('/')
        .with_context(|| format!("--config-map {config_map:?} is not namespace/name"))?;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let Ok(Some(map)) = api.get_opt(name).await else {
        eprintln!("note: {config_map} cannot be read; using the default configuration");
        return Ok(RuntimeKitConfig::default());
    };
    let text = map
        .data
        .and_then(|d| d.get("config.yaml").cloned())
        .unwrap_or_default();
    serde_yaml::from_str(&text).with_context(|| format!("{config_map}: config.yaml"))
}

/// Places the pod of `filename` on the cluster as listed now, creating nothing.
async fn fit_pod(
    client: &Client,
    filename: &Path,
    config_map: &str,
    namespace: &str,
) -> Result<Fit> {
    let text = if filename == Path::new("-") {
        std::io::read_to_string(std::io::stdin())?
    } else {
        std::fs::read_to_string(filename).with_context(|| format!("{}", filename.display()))?
    };
    let mut pod: Pod = serde_yaml::from_str(&text).context("the manifest is not a Pod")?;
    let namespace = pod
        .metadata
        .namespace
        .get_or_insert_with(|| namespace.to_owned())
        .clone();
    pod.metadata
        .uid
        .get_or_insert_with(|| "kubectl-gpu-fit".to_owned());
    // A manifest may be a bare pod spec (the usage guide gives two so): it is named by its file.
    let name = pod
        .metadata
        .name
        .clone()
        .or_else(|| pod.metadata.generate_name.clone())
        .unwrap_or_else(|| format!("(unnamed, from {})", filename.display()));
    let config = shared_config(client, config_map).await?;
    let request = parse_pod(&pod, &config)
        .map_err(|e| anyhow::anyhow!("the pod breaks the resource contract: {e}"))?;
    let input = PodInput::from_pod(&pod, &request, &config.names())?;
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("listing Nodes")?
        .items;
    let pods = Api::<Pod>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("listing Pods")?
        .items;
    let groups = groups(client).await?;
    let slices = all_slices(client).await?;
    let listed = Listed {
        nodes: &nodes,
        groups: &groups,
        slices: &slices,
        pods: &pods,
    };
    let (cluster, skipped) = cluster_from(&config, listed, Timestamp::now());
    for line in skipped {
        eprintln!("note: left out: {line}");
    }
    let decided = cluster.decide(&input).map_err(|e| e.to_string());
    Ok(fit::answer(
        &namespace,
        &name,
        decided.as_ref().map_err(Clone::clone),
        &cards::rows(&groups, &slices),
        request.gang.as_ref().map(|g| g.name.as_str()),
    ))
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

/// Every node's cards, with what GpuSlices and the kit's DRA claims hold on them.
async fn node_cards(
    client: &Client,
    groups: &[TopologyGroup],
    driver: &str,
) -> Result<Vec<CardRow>> {
    let entries = claim_entries(client, None, groups, driver).await?;
    let mut slices = all_slices(client).await?;
    slices.extend(entries.iter().map(|e| e.slice.clone()));
    Ok(cards::rows(
        &claims::without_shown_holders(groups, &entries),
        &slices,
    ))
}

/// What the kit's DRA claims hold, in `namespace` or everywhere. A caller who may not list
/// ResourceClaims (or a cluster without DRA) gets the slices alone, and is told so.
async fn claim_entries(
    client: &Client,
    namespace: Option<&str>,
    groups: &[TopologyGroup],
    driver: &str,
) -> Result<Vec<ClaimEntry>> {
    let (claims_api, pods_api): (Api<ResourceClaim>, Api<Pod>) = match namespace {
        Some(namespace) => (
            Api::namespaced(client.clone(), namespace),
            Api::namespaced(client.clone(), namespace),
        ),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    let claims = match claims_api.list(&ListParams::default()).await {
        Ok(list) => list.items,
        Err(error) => {
            eprintln!("kubectl gpu: DRA claims not shown: listing ResourceClaims: {error}");
            return Ok(Vec::new());
        }
    };
    if claims.is_empty() {
        return Ok(Vec::new());
    }
    let pods = pods_api
        .list(&ListParams::default())
        .await
        .context("listing Pods")?
        .items;
    Ok(claims::entries(&claims, &pods, groups, driver))
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

fn quota_table(rows: &[QuotaRow], _wide: bool) -> String {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.namespace.clone(),
                r.quota.clone(),
                r.resource.clone(),
                r.held.to_string(),
                r.hard.to_string(),
                or_dash(r.quota_counts),
            ]
        })
        .collect();
    render(
        &[
            "NAMESPACE",
            "QUOTA",
            "RESOURCE",
            "HELD",
            "HARD",
            "QUOTA COUNTS",
        ],
        &cells,
    )
}

/// [`pods_table`] with each slice's use now.
fn pods_table_with_usage(rows: &[SliceRow], wide: bool) -> String {
    let used = |value: Option<f64>, unit: &str| {
        value.map_or_else(|| "-".into(), |v| format!("{v:.0}{unit}"))
    };
    let mut table = pods_cells(rows, wide);
    table.0.extend(["SM USED", "MEM USED"]);
    for (cells, row) in table.1.iter_mut().zip(rows) {
        cells.push(used(row.sm_used_percent, "%"));
        cells.push(used(row.memory_used_mib, "Mi"));
    }
    render(&table.0, &table.1)
}

fn pods_table(rows: &[SliceRow], wide: bool) -> String {
    let (headers, cells) = pods_cells(rows, wide);
    render(&headers, &cells)
}

/// The headers and cells of the pods table.
fn pods_cells(rows: &[SliceRow], wide: bool) -> (Vec<&'static str>, Vec<Vec<String>>) {
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
    (headers, cells)
}
