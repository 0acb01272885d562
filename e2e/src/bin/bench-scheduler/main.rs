//! `just bench-scheduler`: scheduling throughput and latency of lj-runtimekit-scheduler against
//! upstream kube-scheduler, in the same run, on a real control plane with 1,000 kwok nodes of 8
//! cards. Prints a table and, as its last line, one JSON object.
//!
//! Runs: backlog drains (5,000 whole-card pods created while no scheduler runs, then the
//! scheduler started and timed until all are bound, with each process's CPU), in pairs of
//! kube-scheduler and ours, the medians reported; part 2's floor, one more object per pod (a
//! GpuSlice, the smallest custom resource, a ConfigMap) priced on this apiserver; 5,000
//! whole-card pods (`nvidia.com/gpu: 1`) created as fast as the apiserver takes them, for
//! kube-scheduler and then for ours; the same with time-division shares (ours only); a steady
//! 100 pods/s for the p99 create-to-bound latency; the raw Binding ceiling of this apiserver;
//! and part `dra`, kube-scheduler allocating whole-card ResourceClaims on 100 nodes against
//! ours placing the same pods by extended resource (`dra.rs`). Both schedulers are unthrottled
//! on the client side (kube-scheduler's QPS is raised to 5,000, ours has no limiter). Memory is each process's peak RSS. `BENCH_SMOKE` runs the
//! same code at a few hundred pods on 50 nodes, as CI does so the benchmark cannot rot.

use anyhow::{Context, Result};
use runtimekit_e2e::cluster::{Cluster, ClusterOptions};
use runtimekit_e2e::load::{CARDS, Fleet, install_runtime_class, wait_operator_ready};
use serde_json::json;

mod dra;
mod measure;
mod objects;
mod peer;
mod report;
mod runs;
mod scale;
mod workload;

use measure::{Processes, Run, operator_metrics, peak_rss};
use runs::{Operator, binding_ceiling, burst, kube_backlog, steady};
use workload::Workload;

/// Writes in flight at once in the bursts and the Binding ceiling.
pub const CONCURRENCY: usize = 64;
pub const STEADY_RATE: u64 = 100;
/// How often the fleet's agents heartbeat: once a minute (`--heartbeat-interval=60s`; the
/// operator withholds a node's cards after three intervals without one), to keep 5,000 nodes
/// light.
pub const HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(60);

/// How big the runs are: the full benchmark, or with `BENCH_SMOKE` set the smoke form CI runs
/// so the benchmark cannot rot (same code, a few hundred pods).
#[derive(Debug, Clone, Copy)]
struct Sizes {
    nodes: usize,
    pods: usize,
    /// Backlog drains of each scheduler, taken in pairs.
    backlog_pairs: usize,
    steady_seconds: u64,
    bindings: usize,
    /// Part 4: the time-division backlog, the seconds of its steady stream, and the gangs
    /// (gangs, members each), ours and the peer's. Smaller than part 1's: the peer binds
    /// time-division pods at about 5 a second (docs/benchmarks.md says why).
    peer_pods: usize,
    peer_steady_seconds: u64,
    peer_gangs: (usize, usize),
    /// Part 3: the nodes the cluster grows to, and its JobSet gangs.
    scale_nodes: usize,
    gangs: &'static [(usize, usize)],
    /// Part `dra`: nodes, pods per drain, and pairs of drains.
    dra: dra::DraSizes,
}

impl Sizes {
    fn from_env() -> Sizes {
        if std::env::var_os("BENCH_SMOKE").is_some() {
            Sizes {
                nodes: 50,
                pods: 200,
                backlog_pairs: 1,
                steady_seconds: 3,
                bindings: 200,
                peer_pods: 50,
                peer_steady_seconds: 1,
                peer_gangs: (4, 4),
                scale_nodes: 80,
                gangs: &scale::SMOKE_GANGS,
                dra: dra::DraSizes {
                    nodes: 10,
                    pods: 100,
                    pairs: 1,
                },
            }
        } else {
            Sizes {
                nodes: 1000,
                pods: 5000,
                // BENCH_BACKLOG_PAIRS sets another count; each pair takes about 7 minutes.
                backlog_pairs: env_number("BENCH_BACKLOG_PAIRS").unwrap_or(3).max(1),
                steady_seconds: 20,
                bindings: 3000,
                peer_pods: 500,
                peer_steady_seconds: 5,
                // 100 gangs of 8 by default (BENCH_PEER_GANGS sets the count): 20 drained in
                // about a second, less than one of Volcano's cycles, and start-up decided it.
                peer_gangs: (env_number("BENCH_PEER_GANGS").unwrap_or(100), 8),
                // BENCH_SCALE_NODES sets another size (docs/benchmarks.md has 3,000 to 5,000).
                scale_nodes: env_number("BENCH_SCALE_NODES").unwrap_or(5000),
                gangs: &scale::GANGS,
                // 1,000 whole-card pods on the 100 DRA nodes of 10 cards; BENCH_DRA_PAIRS sets
                // the pairs (a pair takes about a minute).
                dra: dra::DraSizes {
                    nodes: 100,
                    pods: 1000,
                    pairs: env_number("BENCH_DRA_PAIRS").unwrap_or(3).max(1),
                },
            }
        }
    }
}
/// The number in the environment variable `name`, if it holds one.
fn env_number(name: &str) -> Option<usize> {
    std::env::var(name).ok().and_then(|n| n.parse().ok())
}

/// Our scheduler's name.
pub const OURS: &str = "lj-runtimekit-scheduler";

#[tokio::main]
async fn main() -> Result<()> {
    let dir = std::env::temp_dir().join(format!("runtimekit-bench-{}", std::process::id()));
    eprintln!("starting the control plane in {}", dir.display());
    let mut cluster = Cluster::start(ClusterOptions {
        dir: dir.clone(),
        detached: false,
        kube_scheduler: true,
        profiling: std::env::var_os("BENCH_PROFILE").is_some(),
        // Gang members keep running while the other members are timed.
        jobs_keep_running: true,
        // kwok renews a lease at a quarter of its length, and the fleet's leases, made within
        // seconds of each other, all at once: 600 s leases put a burst of a renewal per node
        // into whichever drain ran every 150 s. An hour's lease makes it one per 15 minutes
        // (nothing here marks a node NotReady).
        node_lease_seconds: 3600,
    })
    .await?;
    let result = bench(&mut cluster, Sizes::from_env()).await;
    drop(cluster);
    // Profiles are kept for reading; otherwise a good run leaves nothing behind.
    if result.is_ok() && std::env::var_os("BENCH_PROFILE").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}

async fn bench(cluster: &mut Cluster, sizes: Sizes) -> Result<()> {
    let Sizes { nodes, pods, .. } = sizes;
    let client = cluster.client().await?;
    install_runtime_class(cluster)?;
    eprintln!("creating {nodes} nodes of {CARDS} cards");
    let fleet = Fleet {
        prefix: "bench".into(),
        nodes,
        cards: CARDS,
        mig_cards: 0,
        heartbeat: HEARTBEAT,
    };
    let heartbeats = fleet.create(&client).await?;
    let mut operator = Operator::start(cluster)?;
    wait_operator_ready(&client, "bench").await?;
    let mut processes = Processes::of(cluster, &operator.child)?;

    // BENCH_RUNS (for example `backlog-ours,steady`) picks runs; all but `peer-gangs` (a part
    // of `peer`) run by default.
    let runs = std::env::var("BENCH_RUNS").unwrap_or_else(|_| {
        "backlog-kube,backlog-ours,objects,kube,ours,tdm,steady,binding,dra,peer,scale".into()
    });
    let wanted = |run: &str| runs.split(',').any(|r| r == run);
    // Every run cleans up after itself, so the next one starts on free cards.
    let ours_whole = Workload::new(OURS, json!({"nvidia.com/gpu": "1"}));
    let kube_whole = Workload::new("default-scheduler", json!({"nvidia.com/gpu": "1"}));
    let ours_tdm = Workload::new(
        OURS,
        json!({"aliyun.com/gpu-core": "25", "aliyun.com/gpu-memory": "4"}),
    );
    // Part 1 and 2's figures are read over pairs of drains, the median reported: one drain of
    // each moved the apiserver ratio by a tenth from run to run. Which scheduler goes first
    // alternates, so a background that drifts over the run favours neither.
    let (mut backlog_kube, mut backlog_ours) = (Vec::new(), Vec::new());
    for pair in 1..=sizes.backlog_pairs {
        let kube_first = pair % 2 == 1;
        for kube_turn in [kube_first, !kube_first] {
            if kube_turn && wanted("backlog-kube") {
                let ns = format!("bench-backlog-kube-{pair}");
                let pending = (ns.as_str(), &kube_whole, pods);
                let run = kube_backlog(cluster, &client, &mut processes, &operator.child, pending)
                    .await?;
                backlog_kube.push(run);
            } else if !kube_turn && wanted("backlog-ours") {
                let ns = format!("bench-backlog-ours-{pair}");
                let pending = (ns.as_str(), &ours_whole, pods);
                let run = operator
                    .backlog(cluster, &client, &mut processes, pending)
                    .await?;
                backlog_ours.push(run);
            }
        }
    }
    let objects = if wanted("objects") {
        objects::costs(&client, &processes, pods).await?
    } else {
        Vec::new()
    };
    let kube = if wanted("kube") {
        burst(
            cluster,
            &client,
            &processes,
            "bench-kube",
            &kube_whole,
            pods,
        )
        .await?
    } else {
        Run::default()
    };
    let ours = if wanted("ours") {
        burst(
            cluster,
            &client,
            &processes,
            "bench-ours",
            &ours_whole,
            pods,
        )
        .await?
    } else {
        Run::default()
    };
    let tdm = if wanted("tdm") {
        burst(cluster, &client, &processes, "bench-tdm", &ours_tdm, pods).await?
    } else {
        Run::default()
    };
    // The steady p99 must hold run after run: three runs, each reported.
    let mut steady_runs = Vec::new();
    if wanted("steady") {
        for i in 1..=3 {
            let ns = format!("bench-steady-{i}");
            let run = steady(&client, &processes, &ns, sizes.steady_seconds, &ours_whole).await?;
            steady_runs.push(run);
        }
    }
    let ceiling = if wanted("binding") {
        binding_ceiling(&client, "bench-binding", sizes.bindings, nodes).await?
    } else {
        Run::default()
    };

    let dra = if wanted("dra") {
        dra::compare(cluster, &client, &mut operator, &mut processes, sizes.dra).await?
    } else {
        dra::Dra::default()
    };
    let ours_rss = peak_rss(i32::try_from(operator.child.id())?)?;
    let kube_rss = peak_rss(
        cluster
            .pid("kube-scheduler")
            .context("kube-scheduler pid")?,
    )?;
    // `peer-gangs` runs only part 4's gangs, which take seconds where sharing takes minutes.
    let comparison = if wanted("peer") || wanted("peer-gangs") {
        let sharing = wanted("peer").then_some((sizes.peer_pods, sizes.peer_steady_seconds));
        peer::compare(
            cluster,
            &client,
            &fleet,
            &mut operator,
            &mut processes,
            sharing,
            sizes.peer_gangs,
        )
        .await?
    } else {
        peer::Comparison::default()
    };
    let scale = if wanted("scale") {
        let added = sizes.scale_nodes.saturating_sub(nodes);
        let extra = Fleet {
            prefix: "scale".into(),
            nodes: added,
            cards: CARDS,
            mig_cards: scale::mig_cards_per_added_node(sizes.scale_nodes, added),
            heartbeat: HEARTBEAT,
        };
        scale::run(&client, &processes, nodes, extra, sizes.gangs).await?
    } else {
        scale::Scale::default()
    };
    heartbeats.abort();
    for line in operator_metrics(operator.listen) {
        eprintln!("operator metric: {line}");
    }
    let _ = operator.child.kill();
    let _ = operator.child.wait();
    report::print(&report::Results {
        nodes,
        pods,
        processes: &processes,
        backlog_kube,
        backlog_ours,
        objects,
        kube,
        ours,
        tdm,
        steady: steady_runs,
        ceiling,
        ours_rss,
        kube_rss,
        comparison,
        scale,
        dra,
    });
    Ok(())
}
