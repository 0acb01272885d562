//! `just soak`: the operator under steady churn on a real control plane with kwok GPU nodes
//! whose agents the soak plays (TopologyGroups, heartbeats, and removing the finalizers of
//! released slices). Every second it creates `--rate` pods of every request kind (whole cards,
//! two-card pods, time-division shares, MIG instances, and a gang of four now and then), and
//! deletes the pods older than `--lifetime`. Every minute it checks the invariants; at the end
//! it deletes everything and checks that the operator holds nothing again. Prints a line per
//! minute, then a table and, as its last line, one JSON object. Exits non-zero on a violation.

use anyhow::{Context, Result, bail, ensure};
use clap::Parser;
use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};
use runtimekit_crds::{GpuSlice, SliceMode};
use runtimekit_e2e::cluster::{Cluster, ClusterOptions};
use runtimekit_e2e::load::{
    CARDS, Fleet, install_runtime_class, namespace, rss_mib, start_operator, tear_down_as_released,
    tear_down_released, wait_operator_ready,
};
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

const NAMESPACE: &str = "soak";
const OURS: &str = "lj-runtimekit-scheduler";
/// Pod creations in flight at once.
const CONCURRENCY: usize = 32;

/// Churn the operator at a steady rate and check it stays correct and bounded.
#[derive(Parser, Debug)]
struct Args {
    /// Pods created per second.
    #[arg(long, default_value_t = 50)]
    rate: usize,
    /// How long the churn runs, in minutes.
    #[arg(long, default_value_t = 30.0)]
    minutes: f64,
    /// How many kwok nodes of eight H800 cards (the last two in MIG mode).
    #[arg(long, default_value_t = 1000)]
    nodes: usize,
    /// Seconds a pod lives before the soak deletes it.
    #[arg(long, default_value_t = 30)]
    lifetime: u64,
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let dir = std::env::temp_dir().join(format!("runtimekit-soak-{}", std::process::id()));
    eprintln!("starting the control plane in {}", dir.display());
    let cluster = Cluster::start(ClusterOptions {
        dir: dir.clone(),
        detached: false,
        kube_scheduler: false,
        profiling: false,
        jobs_keep_running: false,
        node_lease_seconds: runtimekit_e2e::cluster::NODE_LEASE_SECONDS,
    })
    .await?;
    let result = soak(&cluster, &args).await;
    drop(cluster);
    if result.is_ok() {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        eprintln!(
            "the control plane's logs are kept in {}/logs",
            dir.display()
        );
    }
    result
}

/// The kinds of request the churn cycles through, as container limits.
fn kinds() -> Vec<(&'static str, serde_json::Value)> {
    vec![
        ("whole", json!({"nvidia.com/gpu": "1"})),
        ("pair", json!({"nvidia.com/gpu": "2"})),
        (
            "share",
            json!({"aliyun.com/gpu-core": "30", "aliyun.com/gpu-memory": "8"}),
        ),
        (
            "mig",
            json!({"aliyun.com/gpu-slice": "3", "aliyun.com/gpu-memory": "8"}),
        ),
    ]
}

fn pod(name: &str, limits: &serde_json::Value, gang: Option<&str>) -> Result<Pod> {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"schedulerName": OURS, "runtimeClassName": "lj-runtime", "terminationGracePeriodSeconds": 0,
                 "containers": [{"name": "app", "image": "busybox", "resources": {"limits": limits}}]}
    });
    if let Some(gang) = gang {
        pod["metadata"]["labels"] =
            json!({"aliyun.com/min-member": "4", "aliyun.com/gang-name": gang});
    }
    Ok(serde_json::from_value(pod)?)
}

/// One minute's reading.
#[derive(Debug, Clone, serde::Serialize)]
struct Reading {
    minute: f64,
    created: usize,
    deleted: usize,
    bound: usize,
    pending: usize,
    slices: usize,
    operator_rss_mib: f64,
}

async fn soak(cluster: &Cluster, args: &Args) -> Result<()> {
    let client = cluster.client().await?;
    install_runtime_class(cluster)?;
    eprintln!("creating {} nodes", args.nodes);
    let fleet = Fleet {
        prefix: "soak".into(),
        nodes: args.nodes,
        cards: CARDS,
        mig_cards: 2,
        heartbeat: Duration::from_secs(30),
    };
    let heartbeats = fleet.create(&client).await?;
    let (mut operator, listen) = start_operator(cluster, "soak")?;
    let operator_pid = i32::try_from(operator.id())?;
    let outcome = async {
        wait_operator_ready(&client, "soak").await?;
        namespace(&client, NAMESPACE).await?;
        let start_rss = rss_mib(operator_pid)?.0;
        let start_holding = holding_pods(listen)?;
        eprintln!(
            "churning {} pods/s for {} min, pods living {} s; operator RSS {start_rss:.1} MiB",
            args.rate, args.minutes, args.lifetime
        );
        let readings = churn(&client, args, operator_pid).await?;
        let end_rss = rss_mib(operator_pid)?;
        drain(&client).await?;
        let holding = wait_holding(listen, start_holding).await?;
        report(args, start_rss, end_rss, &readings, start_holding, holding);
        ensure!(
            holding == start_holding,
            "the operator still holds capacity for {holding} pods after every pod is gone (it held {start_holding} before the churn)"
        );
        anyhow::Ok(())
    }
    .await;
    heartbeats.abort();
    let alive = operator.try_wait()?.is_none();
    let _ = operator.kill();
    let _ = operator.wait();
    outcome?;
    ensure!(alive, "the operator exited during the soak");
    Ok(())
}

/// Creates and deletes pods at the steady rate for the run's length, each part in a task of its
/// own so a slow write never slows the rate: a creator (one batch per second), a deleter (each
/// pod `lifetime` after its creation) and the agents' part (tearing released slices down).
/// Checks the invariants every minute and returns the readings.
async fn churn(client: &Client, args: &Args, operator_pid: i32) -> Result<Vec<Reading>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let started = Instant::now();
    let end = started + Duration::from_secs_f64(args.minutes * 60.0);
    let counts = Arc::new(Counts::default());
    let (created_tx, created_rx) = mpsc::unbounded_channel::<(Instant, String)>();
    let creator = tokio::spawn(create(
        pods.clone(),
        args.rate,
        end,
        Arc::clone(&counts),
        created_tx,
    ));
    let deleter = tokio::spawn(delete(
        pods,
        Duration::from_secs(args.lifetime),
        Arc::clone(&counts),
        created_rx,
    ));
    let agents = tokio::spawn(tear_down_as_released(client.clone(), NAMESPACE.into()));
    let mut readings = Vec::new();
    let mut next = started;
    let outcome = async {
        loop {
            next += Duration::from_secs(60);
            let last = next >= end;
            tokio::time::sleep_until((if last { end } else { next }).into()).await;
            ensure!(!creator.is_finished() || last, "the pod creator stopped: {:?}", counts);
            let reading = check(client, started, &counts, operator_pid).await?;
            eprintln!(
                "minute {:>5.1}: created {} deleted {} bound {} pending {} slices {} operator RSS {:.1} MiB",
                reading.minute,
                reading.created,
                reading.deleted,
                reading.bound,
                reading.pending,
                reading.slices,
                reading.operator_rss_mib
            );
            readings.push(reading);
            if last {
                return anyhow::Ok(());
            }
        }
    }
    .await;
    let created = creator.await?;
    deleter.abort();
    agents.abort();
    outcome?;
    created?;
    Ok(readings)
}

/// What the churn did so far.
#[derive(Debug, Default)]
struct Counts {
    created: AtomicUsize,
    deleted: AtomicUsize,
    failed_creates: AtomicUsize,
}

/// Creates `rate` pods every second until `end`, cycling through the kinds, with a gang of four
/// every ten seconds; sends each created pod to the deleter.
async fn create(
    pods: Api<Pod>,
    rate: usize,
    end: Instant,
    counts: Arc<Counts>,
    created: mpsc::UnboundedSender<(Instant, String)>,
) -> Result<()> {
    let kinds = kinds();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut serial, mut second) = (0usize, 0u64);
    let mut in_flight = JoinSet::new();
    while Instant::now() < end {
        tick.tick().await;
        second += 1;
        let mut batch: Vec<(String, Pod)> = Vec::new();
        for _ in 0..rate {
            let (kind, limits) = &kinds[serial % kinds.len()];
            let name = format!("{kind}-{serial}");
            batch.push((name.clone(), pod(&name, limits, None)?));
            serial += 1;
        }
        if second.is_multiple_of(10) {
            let gang = format!("gang-{second}");
            for member in 0..4 {
                let name = format!("{gang}-{member}");
                batch.push((name.clone(), pod(&name, &kinds[0].1, Some(&gang))?));
            }
        }
        // A second's batch runs on its own, so a slow second never delays the next.
        let (pods, counts, created) = (pods.clone(), Arc::clone(&counts), created.clone());
        in_flight.spawn(async move {
            stream::iter(batch)
                .map(|(name, pod)| {
                    let pods = pods.clone();
                    async move { (pods.create(&PostParams::default(), &pod).await, name) }
                })
                .buffer_unordered(CONCURRENCY)
                .for_each(|(result, name)| {
                    match result {
                        Ok(_) => {
                            counts.created.fetch_add(1, Ordering::Relaxed);
                            let _ = created.send((Instant::now(), name));
                        }
                        Err(error) => {
                            counts.failed_creates.fetch_add(1, Ordering::Relaxed);
                            eprintln!("creating {name} failed: {error}");
                        }
                    }
                    async {}
                })
                .await;
        });
        while in_flight.try_join_next().is_some() {}
    }
    while in_flight.join_next().await.is_some() {}
    let failed = counts.failed_creates.load(Ordering::Relaxed);
    ensure!(failed == 0, "{failed} pod creations failed");
    Ok(())
}

/// Deletes each pod `lifetime` after its creation.
async fn delete(
    pods: Api<Pod>,
    lifetime: Duration,
    counts: Arc<Counts>,
    created: mpsc::UnboundedReceiver<(Instant, String)>,
) {
    tokio_stream::wrappers::UnboundedReceiverStream::new(created)
        .map(|(at, name)| {
            let (pods, counts) = (pods.clone(), Arc::clone(&counts));
            async move {
                tokio::time::sleep_until((at + lifetime).into()).await;
                let _ = pods
                    .delete(&name, &DeleteParams::default().grace_period(0))
                    .await;
                counts.deleted.fetch_add(1, Ordering::Relaxed);
            }
        })
        .buffer_unordered(100_000)
        .for_each(|()| async {})
        .await;
}

/// Checks the invariants that hold at every instant of the churn: no card over-committed (a
/// card given whole holds nothing else, time-division shares sum to at most 100 %, MIG instances
/// to at most 7 compute slices), and no card given twice for one container's replica.
async fn check(
    client: &Client,
    started: Instant,
    counts: &Counts,
    operator_pid: i32,
) -> Result<Reading> {
    let slices: Api<GpuSlice> = Api::namespaced(client.clone(), NAMESPACE);
    let list = slices.list(&ListParams::default()).await?.items;
    let mut cards: BTreeMap<(String, u32), Vec<&GpuSlice>> = BTreeMap::new();
    let mut replicas: BTreeMap<(String, String, u32), usize> = BTreeMap::new();
    for slice in &list {
        let (Some(node), Some(card)) = (&slice.spec.node_name, &slice.spec.card) else {
            continue;
        };
        cards
            .entry((node.clone(), card.index))
            .or_default()
            .push(slice);
        *replicas
            .entry((
                slice.spec.pod.uid.clone(),
                slice.spec.pod.container.clone(),
                slice.spec.replica_index,
            ))
            .or_default() += 1;
    }
    for ((node, card), on) in &cards {
        let whole = on
            .iter()
            .filter(|s| s.spec.mode == SliceMode::Whole)
            .count();
        let core: u32 = on.iter().filter_map(|s| s.spec.core).sum();
        let mig: u32 = on.iter().filter_map(|s| s.spec.slices).sum();
        let names = || on.iter().map(|s| s.name_any()).collect::<Vec<_>>();
        if whole > 0 && on.len() > 1 {
            bail!(
                "card {card} of {node} is given whole and shared: {:?}",
                names()
            );
        }
        ensure!(
            core <= 100,
            "card {card} of {node} shares {core} %: {:?}",
            names()
        );
        ensure!(
            mig <= 7,
            "card {card} of {node} holds {mig} MIG slices: {:?}",
            names()
        );
    }
    if let Some(((uid, container, replica), n)) = replicas.iter().find(|(_, n)| **n > 1) {
        bail!("pod {uid} container {container} replica {replica} holds {n} slices");
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let all = pods.list(&ListParams::default()).await?.items;
    let bound = all
        .iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some())
        .count();
    Ok(Reading {
        minute: started.elapsed().as_secs_f64() / 60.0,
        created: counts.created.load(Ordering::Relaxed),
        deleted: counts.deleted.load(Ordering::Relaxed),
        bound,
        pending: all.len() - bound,
        slices: list.len(),
        operator_rss_mib: rss_mib(operator_pid)?.0,
    })
}

/// Deletes every pod and tears every released slice down, until none is left.
async fn drain(client: &Client) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let left = pods.list(&ListParams::default()).await?.items;
        stream::iter(left.iter().map(|p| p.name_any()))
            .map(|name| {
                let pods = pods.clone();
                async move {
                    let _ = pods
                        .delete(&name, &DeleteParams::default().grace_period(0))
                        .await;
                }
            })
            .buffer_unordered(CONCURRENCY)
            .collect::<Vec<()>>()
            .await;
        let slices = tear_down_released(client, NAMESPACE).await?;
        if left.is_empty() && slices == 0 {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "{} pods and {slices} slices still there 5 minutes after the churn",
            left.len()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The operator's count of pods it holds capacity for.
fn holding_pods(listen: std::net::SocketAddr) -> Result<i64> {
    let body = runtimekit_e2e::tools::http_get(listen, "/metrics")?;
    body.lines()
        .find_map(|l| l.strip_prefix("runtimekit_operator_holding_pods "))
        .and_then(|v| v.trim().parse().ok())
        .context("runtimekit_operator_holding_pods is not served")
}

/// Waits (up to a minute: the operator sees the last deletions through its watches) until the
/// operator holds what it held before the churn; returns what it holds then.
async fn wait_holding(listen: std::net::SocketAddr, before: i64) -> Result<i64> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let holding = holding_pods(listen)?;
        if holding == before || Instant::now() > deadline {
            return Ok(holding);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn report(
    args: &Args,
    start_rss: f64,
    end_rss: (f64, f64),
    readings: &[Reading],
    start_holding: i64,
    end_holding: i64,
) {
    let last = readings.last();
    let created = last.map_or(0, |r| r.created);
    println!(
        "\nsoak: {} kwok nodes x 8 cards, {} pods/s for {} min, pods living {} s\n",
        args.nodes, args.rate, args.minutes, args.lifetime
    );
    println!("| minute | created | deleted | bound | pending | slices | operator RSS (MiB) |");
    println!("|---|---|---|---|---|---|---|");
    for r in readings {
        println!(
            "| {:.1} | {} | {} | {} | {} | {} | {:.1} |",
            r.minute, r.created, r.deleted, r.bound, r.pending, r.slices, r.operator_rss_mib
        );
    }
    println!(
        "\noperator RSS: {start_rss:.1} MiB at the start, {:.1} MiB at the end (peak {:.1}); pods the engine holds: {start_holding} before, {end_holding} after",
        end_rss.0, end_rss.1
    );
    println!(
        "{}",
        json!({
            "nodes": args.nodes, "rate": args.rate, "minutes": args.minutes, "lifetime_s": args.lifetime,
            "created": created, "start_rss_mib": start_rss, "end_rss_mib": end_rss.0, "peak_rss_mib": end_rss.1,
            "holding_before": start_holding, "holding_after": end_holding, "readings": readings,
        })
    );
}
