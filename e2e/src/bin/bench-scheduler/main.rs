//! `just bench-scheduler`: scheduling throughput and latency of lj-runtimekit-scheduler against
//! upstream kube-scheduler, in the same run, on a real control plane with 1,000 kwok nodes of 8
//! cards. Prints a table and, as its last line, one JSON object.
//!
//! Runs: a backlog drain (5,000 whole-card pods created while no scheduler runs, then the
//! scheduler started and timed until all are bound, with each process's CPU: kube-scheduler,
//! then ours); 5,000 whole-card pods (`nvidia.com/gpu: 1`) created as fast as the apiserver
//! takes them, for kube-scheduler and then for ours; the same with time-division shares (ours only);
//! a steady 100 pods/s for the p99 create-to-bound latency; and the raw Binding ceiling of this
//! apiserver. Both schedulers are unthrottled on the client side (kube-scheduler's QPS is raised
//! to 5,000, ours has no limiter). Memory is each process's peak RSS. `BENCH_SMOKE` runs the
//! same code at a few hundred pods on 50 nodes, as CI does so the benchmark cannot rot.

use anyhow::{Context, Result};
use runtimekit_e2e::cluster::{Cluster, ClusterOptions};
use runtimekit_e2e::load::{
    CARDS, Fleet, install_runtime_class, start_operator, wait_operator_ready,
};
use serde_json::json;
use std::time::Instant;

mod measure;
mod runs;

use measure::{Processes, Run, cpu_of, operator_metrics, peak_rss, profile_apiserver};
use runs::{Backlog, binding_ceiling, burst, steady, stop_gracefully};

/// Writes in flight at once in the bursts and the Binding ceiling.
pub const CONCURRENCY: usize = 64;
pub const STEADY_RATE: u64 = 100;

/// How big the runs are: the full benchmark, or with `BENCH_SMOKE` set the smoke form CI runs
/// so the benchmark cannot rot (same code, a few hundred pods).
#[derive(Debug, Clone, Copy)]
struct Sizes {
    nodes: usize,
    pods: usize,
    steady_seconds: u64,
    bindings: usize,
}

impl Sizes {
    fn from_env() -> Sizes {
        if std::env::var_os("BENCH_SMOKE").is_some() {
            Sizes {
                nodes: 50,
                pods: 200,
                steady_seconds: 3,
                bindings: 200,
            }
        } else {
            Sizes {
                nodes: 1000,
                pods: 5000,
                steady_seconds: 20,
                bindings: 3000,
            }
        }
    }
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
        jobs_keep_running: false,
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
        mig_cards: 0,
    };
    fleet.create(&client).await?;
    let heartbeats = tokio::spawn(fleet.heartbeat(client.clone()));
    let (mut operator, mut operator_listen) = start_operator(cluster, "bench")?;
    wait_operator_ready(&client, "bench").await?;
    let mut processes = Processes::of(cluster, &operator)?;

    // BENCH_RUNS (for example `ours,steady`) picks runs; all run by default.
    let runs = std::env::var("BENCH_RUNS")
        .unwrap_or_else(|_| "backlog-kube,backlog-ours,kube,ours,tdm,steady,binding".into());
    let wanted = |run: &str| runs.split(',').any(|r| r == run);
    let tdm_limits = json!({"aliyun.com/gpu-core": "25", "aliyun.com/gpu-memory": "4"});
    // Every run cleans up after itself, so the next one starts on free cards.
    let whole = json!({"nvidia.com/gpu": "1"});
    let backlog_kube = if wanted("backlog-kube") {
        let stopped = cluster.stop_component("kube-scheduler")?;
        let pending =
            Backlog::create(&client, "bench-backlog-kube", "default-scheduler", pods).await?;
        let before = processes.cpu_without("kube-scheduler");
        let profile = profile_apiserver(cluster, "bench-backlog-kube")?;
        let started = Instant::now();
        cluster.start_again(stopped)?;
        processes = Processes::of(cluster, &operator)?;
        pending
            .drain(&client, started, &before, &processes, profile)
            .await?
    } else {
        Run::default()
    };
    let backlog_ours = if wanted("backlog-ours") {
        stop_gracefully(&mut operator)?;
        let pending = Backlog::create(&client, "bench-backlog-ours", OURS, pods).await?;
        let before = processes.cpu_without("runtimekit-operator");
        let profile = profile_apiserver(cluster, "bench-backlog-ours")?;
        let started = Instant::now();
        (operator, operator_listen) = start_operator(cluster, "bench")?;
        processes = Processes::of(cluster, &operator)?;
        pending
            .drain(&client, started, &before, &processes, profile)
            .await?
    } else {
        Run::default()
    };
    let kube = if wanted("kube") {
        burst(
            cluster,
            &client,
            &processes,
            "bench-kube",
            "default-scheduler",
            &whole,
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
            OURS,
            &whole,
            pods,
        )
        .await?
    } else {
        Run::default()
    };
    let tdm = if wanted("tdm") {
        burst(
            cluster,
            &client,
            &processes,
            "bench-tdm",
            OURS,
            &tdm_limits,
            pods,
        )
        .await?
    } else {
        Run::default()
    };
    let steady = if wanted("steady") {
        steady(&client, &processes, "bench-steady", sizes.steady_seconds).await?
    } else {
        Run::default()
    };
    let ceiling = if wanted("binding") {
        binding_ceiling(&client, "bench-binding", sizes.bindings, nodes).await?
    } else {
        Run::default()
    };

    let ours_rss = peak_rss(i32::try_from(operator.id())?)?;
    let kube_rss = peak_rss(
        cluster
            .pid("kube-scheduler")
            .context("kube-scheduler pid")?,
    )?;
    heartbeats.abort();
    for line in operator_metrics(operator_listen) {
        eprintln!("operator metric: {line}");
    }
    let _ = operator.kill();
    let _ = operator.wait();

    println!(
        "\nscheduler benchmark: {nodes} kwok nodes x {CARDS} cards, {pods} pods per run, 2 cores shared with the control plane\n"
    );
    let apiserver_ms_per_pod =
        |run: &Run| cpu_of(&run.cpu, "kube-apiserver") * 1000.0 / run.pods.max(1) as f64;
    println!(
        "Backlog drain: {pods} whole-card pods created while no scheduler ran, then the scheduler started; timed from its start until every pod was bound.\n"
    );
    println!(
        "| scheduler | bound pods/s | scheduler CPU s | kube-apiserver CPU s | apiserver CPU ms per bound pod |"
    );
    println!("| --- | --- | --- | --- | --- |");
    for (name, run, process) in [
        ("kube-scheduler", &backlog_kube, "kube-scheduler"),
        ("ours", &backlog_ours, "runtimekit-operator"),
    ] {
        println!(
            "| {name} | {:.0} | {:.1} | {:.1} | {:.2} |",
            run.pods_per_sec,
            cpu_of(&run.cpu, process),
            cpu_of(&run.cpu, "kube-apiserver"),
            apiserver_ms_per_pod(run)
        );
    }
    println!(
        "\nBursts: pods created as fast as the apiserver takes them, the scheduler running.\n"
    );
    println!(
        "| run | pods | bound pods/s | created pods/s | p50 create-to-bound ms | p99 create-to-bound ms |"
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    for (name, run) in [
        ("kube-scheduler, nvidia.com/gpu: 1", &kube),
        ("ours, nvidia.com/gpu: 1", &ours),
        ("ours, gpu-core 25 + gpu-memory 4", &tdm),
        (&*format!("ours, steady {STEADY_RATE}/s"), &steady),
    ] {
        println!(
            "| {name} | {} | {:.0} | {:.0} | {:.0} | {:.0} |",
            run.pods, run.pods_per_sec, run.created_per_sec, run.p50_ms, run.p99_ms
        );
    }
    println!(
        "| Binding ceiling (tight loop, {CONCURRENCY} in flight) | {} | {:.0} | | | |",
        ceiling.pods, ceiling.pods_per_sec
    );
    println!("\nCPU seconds each process used during a run:\n");
    let names: Vec<&str> = processes.0.iter().map(|(n, _)| n.as_str()).collect();
    println!("| run | {} |", names.join(" | "));
    println!("|{}", " --- |".repeat(names.len() + 1));
    for (name, run) in [
        ("kube-scheduler burst", &kube),
        ("ours burst", &ours),
        ("ours TDM burst", &tdm),
        ("ours steady", &steady),
        ("kube-scheduler backlog", &backlog_kube),
        ("ours backlog", &backlog_ours),
    ] {
        let cells: Vec<String> = run.cpu.iter().map(|(_, s)| format!("{s:.1}")).collect();
        println!("| {name} | {} |", cells.join(" | "));
    }
    println!(
        "\n| process | peak RSS MiB |\n| --- | --- |\n| ours | {ours_rss:.1} |\n| kube-scheduler | {kube_rss:.1} |\n"
    );
    // Parts of the benchmark not built yet report null (docs/benchmarks.md says which).
    let report = json!({
        "backlog_ours_pods_per_sec": round(backlog_ours.pods_per_sec),
        "backlog_kube_scheduler_pods_per_sec": round(backlog_kube.pods_per_sec),
        "backlog_ratio": round2(backlog_ours.pods_per_sec / backlog_kube.pods_per_sec),
        "apiserver_cpu_ms_per_pod_ours": round2(apiserver_ms_per_pod(&backlog_ours)),
        "apiserver_cpu_ms_per_pod_kube_scheduler": round2(apiserver_ms_per_pod(&backlog_kube)),
        "p99_create_to_bound_ms": round(steady.p99_ms),
        "ours_rss_mib": round2(ours_rss),
        "kube_scheduler_rss_mib": round2(kube_rss),
        "nodes": nodes,
        "gang_512_bound_s": null,
        "peer_name": null,
        "peer_tdm_pods_per_sec": null,
        "ours_tdm_pods_per_sec": round(tdm.pods_per_sec),
        "burst_ours_pods_per_sec": round(ours.pods_per_sec),
        "burst_kube_scheduler_pods_per_sec": round(kube.pods_per_sec),
        "binding_ceiling_pods_per_sec": round(ceiling.pods_per_sec),
    });
    println!("{report}");
    Ok(())
}

fn round(x: f64) -> f64 {
    x.round()
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}
