//! Part 4's peer: Volcano's vc-scheduler (the release `e2e/tools/volcano/version` names, built
//! from its own module), whose `deviceshare` plugin shares cards by core percent and memory and
//! whose `gang` plugin places PodGroups all or nothing. The benchmark writes for every node what
//! Volcano's device plugin would report, as it writes our agents' TopologyGroups.

use anyhow::Result;
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use runtimekit_e2e::cluster::Cluster;
use runtimekit_e2e::load::{CARDS, Fleet};
use runtimekit_e2e::tools::{self, Tools};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use crate::measure::{Processes, Run};
use crate::runs::{Operator, Pending, drain_backlog, steady};
use crate::workload::{VOLCANO_SCHEDULER as SCHEDULER, Workload};
use crate::{CONCURRENCY, OURS};

/// vc-scheduler's configuration: Volcano's usual actions and plugins, with the vGPU sharing of
/// `deviceshare` on. (`predicates` must run: it writes the pod's card assignment.)
const CONFIG: &str = r#"actions: "enqueue, allocate, backfill"
tiers:
- plugins:
  - name: priority
  - name: gang
    enablePreemptable: false
  - name: conformance
- plugins:
  - name: drf
    enablePreemptable: false
  - name: predicates
  - name: deviceshare
    arguments:
      deviceshare.VGPUEnable: true
      deviceshare.SchedulePolicy: binpack
      deviceshare.ScheduleWeight: 10
  - name: proportion
  - name: nodeorder
  - name: binpack
"#;

/// The most pods one card takes, as Volcano's device plugin reports by default.
const PODS_PER_CARD: u32 = 10;
/// Each fleet card's memory, as the fleet's TopologyGroups report it.
const CARD_MIB: u32 = 81920;

/// Installs Volcano's CRDs (PodGroup, Queue) and writes every fleet node's card report; returns
/// the folder holding vc-scheduler.
pub async fn prepare(cluster: &Cluster, client: &Client, fleet: &Fleet) -> Result<PathBuf> {
    let dir = Tools::volcano()?;
    for crd in [
        "scheduling.volcano.sh_podgroups.yaml",
        "scheduling.volcano.sh_queues.yaml",
    ] {
        let mut apply = cluster.kubectl();
        apply
            .args(["apply", "--server-side", "-f"])
            .arg(dir.join(crd));
        tools::run(apply)?;
    }
    let mut established = cluster.kubectl();
    established.args([
        "wait",
        "--for=condition=established",
        "crd/podgroups.scheduling.volcano.sh",
        "crd/queues.scheduling.volcano.sh",
    ]);
    tools::run(established)?;
    let nodes: Api<Node> = Api::all(client.clone());
    stream::iter(0..fleet.nodes)
        .map(|i| {
            let (nodes, name) = (nodes.clone(), fleet.node(i));
            async move {
                report_cards(&nodes, &name).await?;
                Ok::<(), anyhow::Error>(())
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(dir)
}

/// What Volcano's device plugin writes for a node of eight cards: the register annotation
/// (`uuid,pods,memory MiB,type,healthy` per card), a handshake far enough ahead that the
/// scheduler never withdraws the cards, and the extended resource it counts pods by.
async fn report_cards(nodes: &Api<Node>, name: &str) -> Result<()> {
    let register: String = (0..CARDS)
        .map(|c| format!("GPU-{name}-{c},{PODS_PER_CARD},{CARD_MIB},NVIDIA-H800,true:"))
        .collect();
    let annotations = json!({"metadata": {"annotations": {
        "volcano.sh/node-vgpu-register": register,
        "volcano.sh/node-vgpu-handshake": "Requesting_2099.01.01 00:00:00",
    }}});
    nodes
        .patch(name, &PatchParams::default(), &Patch::Merge(&annotations))
        .await?;
    let number = (CARDS * PODS_PER_CARD).to_string();
    let status = json!({"status": {
        "capacity": {"volcano.sh/vgpu-number": number},
        "allocatable": {"volcano.sh/vgpu-number": number},
    }});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(())
}

/// Starts vc-scheduler from `dir`, logging to the cluster's log folder. Its vGPU code builds its
/// own client from `KUBECONFIG`, so that is set as well as the flag.
pub fn start(cluster: &Cluster, dir: &Path) -> Result<Child> {
    let config = cluster.dir.join("volcano-scheduler.conf");
    std::fs::write(&config, CONFIG)?;
    let log = std::fs::File::create(cluster.dir.join("logs/vc-scheduler.log"))?;
    Ok(Command::new(dir.join("vc-scheduler"))
        .arg(format!("--kubeconfig={}", cluster.kubeconfig.display()))
        .arg(format!("--scheduler-conf={}", config.display()))
        .args([
            "--leader-elect=false",
            &format!("--scheduler-name={SCHEDULER}"),
            "--schedule-period=1s",
            // No NUMA topology CRD here; the scheduler would wait for it forever.
            "--feature-gates=ResourceTopology=false",
            "--logtostderr",
            "-v=1",
        ])
        .env("KUBECONFIG", &cluster.kubeconfig)
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()?)
}

/// Part 4's runs, ours and the peer's side by side on the same nodes.
#[derive(Debug, Default)]
pub struct Comparison {
    /// A backlog of time-division pods (a quarter of a card's core and 4 GiB each).
    pub tdm_ours: Run,
    pub tdm_peer: Run,
    /// The same pods created at a steady rate, for the latency.
    pub steady_ours: Run,
    pub steady_peer: Run,
    /// A backlog of gangs of whole cards.
    pub gangs_ours: Run,
    pub gangs_peer: Run,
}

/// Runs part 4: Volcano's backlogs and steady stream first (it is stopped between them and
/// after), then ours on the same pods in our resource names. `sharing` is the time-division
/// backlog's pods and the stream's seconds; without it only the gangs run.
pub async fn compare(
    cluster: &mut Cluster,
    client: &Client,
    fleet: &Fleet,
    operator: &mut Operator,
    processes: &mut Processes,
    sharing: Option<(usize, u64)>,
    gangs: (usize, usize),
) -> Result<Comparison> {
    let dir = prepare(cluster, client, fleet).await?;
    let (gang_count, gang_size) = gangs;
    let tdm_ours = Workload::new(
        OURS,
        json!({"aliyun.com/gpu-core": "25", "aliyun.com/gpu-memory": "4"}),
    );
    let tdm_peer = Workload::new(
        SCHEDULER,
        json!({"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-cores": "25", "volcano.sh/vgpu-memory": "4096"}),
    )
    .for_volcano();
    let gangs_ours = Workload::new(OURS, json!({"nvidia.com/gpu": "1"})).in_gangs(gang_size);
    // Whole cards as the plain extended resource: Volcano's vGPU path patches each pod through
    // a client with client-go's default 5 requests/s (built in its init(), no flag sets it).
    let gangs_peer = Workload::new(SCHEDULER, json!({"nvidia.com/gpu": "1"}))
        .for_volcano()
        .in_gangs(gang_size);
    let mut peer = Peer { dir, child: None };
    let mut comparison = Comparison::default();
    if let Some((pods, steady_seconds)) = sharing {
        comparison.tdm_peer = peer
            .backlog(
                cluster,
                client,
                processes,
                ("bench-peer-tdm", &tdm_peer, pods),
            )
            .await?;
        comparison.steady_peer = steady(
            client,
            processes,
            "bench-peer-steady",
            steady_seconds,
            &tdm_peer,
        )
        .await?;
    }
    comparison.gangs_peer = peer
        .backlog(
            cluster,
            client,
            processes,
            ("bench-peer-gangs", &gangs_peer, gang_count * gang_size),
        )
        .await?;
    peer.stop();
    if let Some((pods, steady_seconds)) = sharing {
        comparison.tdm_ours = operator
            .backlog(
                cluster,
                client,
                processes,
                ("bench-ours-tdm", &tdm_ours, pods),
            )
            .await?;
        comparison.steady_ours = steady(
            client,
            processes,
            "bench-ours-steady",
            steady_seconds,
            &tdm_ours,
        )
        .await?;
    }
    comparison.gangs_ours = operator
        .backlog(
            cluster,
            client,
            processes,
            ("bench-ours-gangs", &gangs_ours, gang_count * gang_size),
        )
        .await?;
    Ok(comparison)
}

/// vc-scheduler, stopped and started again around each of its backlogs.
struct Peer {
    dir: PathBuf,
    child: Option<Child>,
}

impl Peer {
    async fn backlog(
        &mut self,
        cluster: &mut Cluster,
        client: &Client,
        processes: &mut Processes,
        pending: Pending<'_>,
    ) -> Result<Run> {
        self.stop();
        drain_backlog(
            cluster,
            client,
            processes,
            pending,
            PROCESS,
            |cluster, running| {
                let child = start(cluster, &self.dir)?;
                let processes = running.with(PROCESS, &child)?;
                self.child = Some(child);
                Ok(processes)
            },
        )
        .await
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The peer's process name in the CPU tables.
pub const PROCESS: &str = "vc-scheduler";

/// The peer as the report names it: `volcano v1.10.0`.
pub fn name() -> String {
    let version = std::fs::read_to_string(tools::repo_root().join("e2e/tools/volcano/version"))
        .unwrap_or_default();
    format!("volcano {}", version.trim())
}
