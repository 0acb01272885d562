//! What the load tools (`bench-scheduler`, `soak`) share: a fleet of kwok GPU nodes whose
//! node agents they play (TopologyGroups and heartbeats), the operator as its own process, and
//! readings of a process's memory.

use anyhow::{Context, Result, bail};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use runtimekit_crds::{GpuSlice, TopologyGroup};
use serde_json::json;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::cluster::{Cluster, node_ready};
use crate::tools::wait_for_every;

/// How many node writes run at once while a fleet is created.
const CONCURRENCY: usize = 64;
/// How long kwok may take to make a new fleet Ready.
const READY_WITHIN: Duration = Duration::from_secs(900);

/// A fleet of kwok nodes of eight H800 cards each, named `<prefix>-0000` on.
#[derive(Debug, Clone)]
pub struct Fleet {
    /// Name prefix of the nodes.
    pub prefix: String,
    /// How many nodes.
    pub nodes: usize,
    /// Cards per node ([`CARDS`] unless a run needs another count).
    pub cards: u32,
    /// How many of each node's cards are in MIG mode (the last ones).
    pub mig_cards: u32,
    /// How often the played agents heartbeat (their `--heartbeat-interval`), recorded in each
    /// TopologyGroup as agents do.
    pub heartbeat: Duration,
}

/// Cards per fleet node, unless a fleet says otherwise.
pub const CARDS: u32 = 8;
/// The label naming the fleet a node belongs to (its prefix), for runs that keep to one.
pub const FLEET_LABEL: &str = "runtimekit.bench/fleet";

impl Fleet {
    /// The name of node `i`.
    pub fn node(&self, i: usize) -> String {
        format!("{}-{i:04}", self.prefix)
    }

    /// Creates the nodes and, as their agents would, their TopologyGroups with the cards, starts
    /// playing the agents' heartbeats, and waits until kwok has made the nodes Ready. Returns
    /// the heartbeats' task, for the caller to abort.
    pub async fn create(&self, client: &Client) -> Result<tokio::task::JoinHandle<()>> {
        let nodes: Api<Node> = Api::all(client.clone());
        let groups: Api<TopologyGroup> = Api::all(client.clone());
        let params = PatchParams::apply("load-agent").force();
        stream::iter(0..self.nodes)
            .map(|i| {
                let (nodes, groups, params) = (nodes.clone(), groups.clone(), params.clone());
                let name = self.node(i);
                let (cards, prefix) = (self.cards, self.prefix.as_str());
                let mig_from = cards.saturating_sub(self.mig_cards);
                async move {
                    let node: Node = serde_json::from_value(json!({
                        "apiVersion": "v1", "kind": "Node",
                        "metadata": {"name": name, "labels": {"lj_runtimekit_enable": "true", "type": "kwok", "kubernetes.io/hostname": name, FLEET_LABEL: prefix},
                                     "annotations": {crate::harness::KWOK_ANNOTATION: "fake"}},
                        "status": {"capacity": capacity(cards), "allocatable": capacity(cards)},
                    }))?;
                    nodes.create(&PostParams::default(), &node).await?;
                    let group = json!({"apiVersion": "runtimekit.aliyun.com/v1alpha1", "kind": "TopologyGroup", "metadata": {"name": name}, "spec": {"tier": "Node", "nodeName": name}});
                    groups.patch(&name, &params, &Patch::Apply(&group)).await?;
                    let cards: Vec<serde_json::Value> = (0..cards)
                        .map(|c| json!({"index": c, "uuid": format!("GPU-{name}-{c}"), "vendor": "Nvidia", "model": "NVIDIA H800", "memoryMib": 81920,
                                        "migCapable": true, "migEnabled": c >= mig_from, "health": "Healthy",
                                        "pcieSwitch": format!("sw{}", c / 2), "numaNode": c / 4, "socket": c / 4}))
                        .collect();
                    let status = json!({"apiVersion": "runtimekit.aliyun.com/v1alpha1", "kind": "TopologyGroup", "status": {"cards": cards, "heartbeatTime": Time(Timestamp::now()), "heartbeatIntervalSeconds": self.heartbeat.as_secs()}});
                    groups.patch_status(&name, &params, &Patch::Apply(&status)).await?;
                    Ok::<(), anyhow::Error>(())
                }
            })
            .buffer_unordered(CONCURRENCY)
            .try_collect::<Vec<()>>()
            .await?;
        // Beating from the start: the wait can outlast the groups' first heartbeat.
        let heartbeats = tokio::spawn(self.clone().heartbeats(client.clone()));
        match self.wait_ready(client).await {
            Ok(()) => Ok(heartbeats),
            Err(error) => {
                heartbeats.abort();
                Err(error)
            }
        }
    }

    /// Waits until kwok has made every node of the fleet Ready. A node turning Ready is new
    /// capacity to a scheduler, which retries its waiting pods: a load started before kwok is
    /// through would run its first minutes on part of the fleet (kwok made 380 to 950 nodes a
    /// minute Ready under load, for five minutes of a 5,000-node run).
    async fn wait_ready(&self, client: &Client) -> Result<()> {
        let nodes: Api<Node> = Api::all(client.clone());
        let prefix = format!("{}-", self.prefix);
        let what = format!("kwok to make the {} {prefix}* nodes Ready", self.nodes);
        let told = std::cell::Cell::new(Instant::now());
        // Every two seconds, from the apiserver's cache: thousands of nodes.
        wait_for_every(&what, READY_WITHIN, Duration::from_secs(2), || async {
            let listed = nodes.list(&ListParams::default().match_any()).await?;
            let ready = listed
                .items
                .iter()
                .filter(|n| n.name_any().starts_with(&prefix) && node_ready(n))
                .count();
            if told.get().elapsed() >= Duration::from_secs(10) {
                eprintln!("{ready} of {} {prefix}* nodes Ready", self.nodes);
                told.set(Instant::now());
            }
            Ok((ready >= self.nodes).then_some(()))
        })
        .await
    }

    /// Plays the agents' heartbeat at the fleet's interval, a merge patch of the one field as
    /// agents write, so their cards stay offered; runs until dropped. Each node beats on its own
    /// phase of the interval, as agents started at different times do, so the apiserver takes an
    /// even stream and not the whole fleet at once, and a beat is never later than the interval
    /// however long a round of the fleet would take.
    async fn heartbeats(self, client: Client) {
        let groups: Api<TopologyGroup> = Api::all(client);
        let params = PatchParams {
            field_manager: Some("load-heartbeat".into()),
            ..PatchParams::default()
        };
        let nodes = self.nodes.max(1);
        let period = self
            .heartbeat
            .checked_div(u32::try_from(nodes).unwrap_or(u32::MAX))
            .unwrap_or(self.heartbeat)
            .max(Duration::from_millis(1));
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        stream::unfold((tick, 0), |(mut tick, i)| async move {
            tick.tick().await;
            Some((i % nodes, (tick, i + 1)))
        })
        .map(|i| {
            let (groups, params) = (groups.clone(), params.clone());
            let name = self.node(i);
            async move {
                let status = json!({"status": {"heartbeatTime": Time(Timestamp::now())}});
                let _ = groups
                    .patch_status(&name, &params, &Patch::Merge(&status))
                    .await;
            }
        })
        .buffer_unordered(CONCURRENCY)
        .collect::<()>()
        .await;
    }
}

fn capacity(cards: u32) -> serde_json::Value {
    json!({"cpu": "128", "memory": "1Ti", "pods": "110", "nvidia.com/gpu": cards.to_string()})
}

/// Plays the node agents' part once: removes the finalizer of every released slice in `ns`, as
/// an agent does once it has torn the slice down. Returns how many slices were there.
pub async fn tear_down_released(client: &Client, ns: &str) -> Result<usize> {
    let slices: Api<GpuSlice> = Api::namespaced(client.clone(), ns);
    let all = slices.list(&ListParams::default()).await?.items;
    let released: Vec<String> = all
        .iter()
        .filter(|s| s.metadata.deletion_timestamp.is_some())
        .map(|s| s.name_any())
        .collect();
    stream::iter(released)
        .map(|name| {
            let slices = slices.clone();
            async move {
                let patch = json!({"metadata": {"finalizers": null}});
                let _ = slices
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await;
            }
        })
        .buffer_unordered(CONCURRENCY)
        .collect::<Vec<()>>()
        .await;
    Ok(all.len())
}

/// Plays the node agents' part as they do, from a watch: removes the finalizer of each slice in
/// `ns` as soon as it is released. Runs until dropped.
pub async fn tear_down_as_released(client: Client, ns: String) {
    let slices: Api<GpuSlice> = Api::namespaced(client, &ns);
    let events = watcher(slices.clone(), watcher::Config::default()).applied_objects();
    events
        .filter_map(|event| async move { event.ok() })
        .filter(|slice| {
            let released =
                slice.metadata.deletion_timestamp.is_some() && !slice.finalizers().is_empty();
            async move { released }
        })
        .map(|slice| {
            let slices = slices.clone();
            async move {
                let patch = json!({"metadata": {"finalizers": null}});
                let _ = slices
                    .patch(
                        &slice.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await;
            }
        })
        .buffer_unordered(CONCURRENCY)
        .for_each(|()| async {})
        .await;
}

/// Starts the operator binary that sits beside the running one (same build profile) as
/// `identity`, leading in namespace `default`, logging to the cluster's log directory.
pub fn start_operator(cluster: &Cluster, identity: &str) -> Result<(Child, std::net::SocketAddr)> {
    let exe = std::env::current_exe()?.with_file_name("runtimekit-operator");
    if !exe.exists() {
        bail!(
            "{} is missing; build it with `cargo build -p runtimekit-operator` (the same profile as this tool)",
            exe.display()
        );
    }
    let log = std::fs::File::create(cluster.dir.join("logs/operator.log"))?;
    let listen = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let child = Command::new(exe)
        .args([
            "run",
            "--identity",
            identity,
            "--namespace",
            "default",
            "--listen",
            &listen.to_string(),
        ])
        .env("KUBECONFIG", &cluster.kubeconfig)
        .env("RUST_LOG", "warn")
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()?;
    Ok((child, listen))
}

/// Waits until the operator `identity` holds the Lease (it starts scheduling right after).
pub async fn wait_operator_ready(client: &Client, identity: &str) -> Result<()> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if let Some(lease) = leases.get_opt("lj-runtimekit-scheduler").await?
            && lease.spec.and_then(|s| s.holder_identity).as_deref() == Some(identity)
        {
            tokio::time::sleep(Duration::from_secs(2)).await;
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bail!("the operator did not take the lease")
}

/// Applies the `lj-runtime` RuntimeClass users deploy, which the load's pods name.
pub fn install_runtime_class(cluster: &Cluster) -> Result<()> {
    apply_config(cluster, &["-f", "config/runtime/runtimeclass.yaml"])
}

/// Applies part of `config/` as users do: `kubectl apply --server-side` with `how` (`-f FILE`
/// or `-k DIR`, relative to the repository).
pub fn apply_config(cluster: &Cluster, how: &[&str; 2]) -> Result<()> {
    let path = crate::tools::repo_root().join(how[1]);
    let status = cluster
        .kubectl()
        .args(["apply", "--server-side", how[0]])
        .arg(&path)
        .stdout(std::process::Stdio::null())
        .status()?;
    if !status.success() {
        bail!("applying {} failed", path.display());
    }
    Ok(())
}

/// Creates the namespace `name`.
pub async fn namespace(client: &Client, name: &str) -> Result<()> {
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    Ok(())
}

/// A process's resident memory now (`VmRSS`) and at its peak (`VmHWM`), in MiB.
pub fn rss_mib(pid: i32) -> Result<(f64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> Result<f64> {
        let kib: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("{name} of process {pid}"))?;
        Ok(kib / 1024.0)
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}
