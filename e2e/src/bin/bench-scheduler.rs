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

use anyhow::{Context, Result, bail};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use runtimekit_e2e::cluster::{Cluster, ClusterOptions};
use runtimekit_e2e::load::{
    CARDS, Fleet, install_runtime_class, namespace, rss_mib, start_operator, tear_down_released,
    wait_operator_ready,
};
use serde_json::json;
use std::collections::HashMap;
use std::process::Child;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Writes in flight at once in the bursts and the Binding ceiling.
const CONCURRENCY: usize = 64;
const STEADY_RATE: u64 = 100;

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
const OURS: &str = "lj-runtimekit-scheduler";

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
        let started = Instant::now();
        cluster.start_again(stopped)?;
        processes = Processes::of(cluster, &operator)?;
        pending.drain(&client, started, &before, &processes).await?
    } else {
        Run::default()
    };
    let backlog_ours = if wanted("backlog-ours") {
        stop_gracefully(&mut operator)?;
        let pending = Backlog::create(&client, "bench-backlog-ours", OURS, pods).await?;
        let before = processes.cpu_without("runtimekit-operator");
        let started = Instant::now();
        (operator, operator_listen) = start_operator(cluster, "bench")?;
        processes = Processes::of(cluster, &operator)?;
        pending.drain(&client, started, &before, &processes).await?
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

/// One measured run.
#[derive(Debug, Default)]
struct Run {
    pods: usize,
    pods_per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    /// Pods created per second by the load generator.
    created_per_sec: f64,
    /// CPU seconds each process used during the run.
    cpu: Vec<(String, f64)>,
}

/// The processes whose CPU time a run reports.
struct Processes(Vec<(String, i32)>);

impl Processes {
    fn of(cluster: &Cluster, operator: &Child) -> Result<Processes> {
        let mut list: Vec<(String, i32)> = [
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kwok",
            "jobset",
        ]
        .into_iter()
        .filter_map(|name| cluster.pid(name).map(|pid| (name.to_owned(), pid)))
        .collect();
        list.push(("runtimekit-operator".into(), i32::try_from(operator.id())?));
        list.push(("load generator".into(), i32::try_from(std::process::id())?));
        Ok(Processes(list))
    }

    /// [`Processes::cpu`] without the process `name`, which is about to be started again.
    fn cpu_without(&self, name: &str) -> Vec<(String, f64)> {
        let mut cpu = self.cpu();
        cpu.retain(|(n, _)| n != name);
        cpu
    }

    /// CPU seconds (user and system) each process used so far.
    fn cpu(&self) -> Vec<(String, f64)> {
        self.0
            .iter()
            .map(|(name, pid)| {
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                let fields: Vec<&str> = stat
                    .rsplit_once(") ")
                    .map(|(_, rest)| rest.split(' ').collect())
                    .unwrap_or_default();
                let ticks = |i: usize| {
                    fields
                        .get(i)
                        .and_then(|v| v.parse::<f64>().ok())
                        .unwrap_or(0.0)
                };
                // utime and stime are fields 14 and 15 of stat, 11 and 12 after the command name.
                (name.clone(), (ticks(11) + ticks(12)) / 100.0)
            })
            .collect()
    }
}

/// CPU seconds each process used between two readings; a process missing from `before` (started
/// since) counts from zero.
fn cpu_since(before: &[(String, f64)], after: &[(String, f64)]) -> Vec<(String, f64)> {
    after
        .iter()
        .map(|(name, a)| {
            let b = before
                .iter()
                .find(|(n, _)| n == name)
                .map_or(0.0, |(_, b)| *b);
            (name.clone(), a - b)
        })
        .collect()
}

/// The CPU seconds of one process in a run's readings.
fn cpu_of(cpu: &[(String, f64)], name: &str) -> f64 {
    cpu.iter().find(|(n, _)| n == name).map_or(0.0, |(_, s)| *s)
}

/// Stops the operator with SIGTERM (it gives up its Lease on the way out) and waits for it.
fn stop_gracefully(operator: &mut Child) -> Result<()> {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(operator.id())?);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)?;
    operator.wait()?;
    Ok(())
}

/// Part 1 of the benchmark: pods created while no scheduler runs, waiting for one.
struct Backlog {
    ns: String,
    count: usize,
    created: HashMap<String, Instant>,
    bound: Arc<Mutex<HashMap<String, Instant>>>,
    watch: tokio::task::JoinHandle<()>,
}

impl Backlog {
    /// Creates `count` whole-card pods for `scheduler`, which must not be running.
    async fn create(client: &Client, ns: &str, scheduler: &str, count: usize) -> Result<Backlog> {
        eprintln!("{ns}: {count} pending pods for {scheduler}, then {scheduler} started");
        namespace(client, ns).await?;
        let api: Api<Pod> = Api::namespaced(client.clone(), ns);
        let created = create_pods(&api, scheduler, &json!({"nvidia.com/gpu": "1"}), count).await?;
        let (bound, watch) = watch_bound(client, ns);
        // The watch's first list, before the scheduler starts.
        tokio::time::sleep(Duration::from_secs(1)).await;
        Ok(Backlog {
            ns: ns.to_owned(),
            count,
            created,
            bound,
            watch,
        })
    }

    /// Waits until every pod is bound, timing from `started` (when the scheduler was started);
    /// CPU from `before` to `processes`' readings now.
    async fn drain(
        self,
        client: &Client,
        started: Instant,
        before: &[(String, f64)],
        processes: &Processes,
    ) -> Result<Run> {
        let end = wait_all_bound(&self.bound, self.count, Duration::from_secs(900)).await?;
        let cpu = cpu_since(before, &processes.cpu());
        self.watch.abort();
        let bound = self.bound.lock().map(|b| b.clone()).unwrap_or_default();
        let mut run = measure(self.count, started, end, &self.created, &bound);
        run.cpu = cpu;
        eprintln!("{}: {:.0} pods/s", self.ns, run.pods_per_sec);
        cleanup(client, &self.ns).await?;
        Ok(run)
    }
}

/// The operator's own view of its work: the sums and counts of its latency histograms.
fn operator_metrics(listen: std::net::SocketAddr) -> Vec<String> {
    let body = runtimekit_e2e::tools::http_get(listen, "/metrics").unwrap_or_default();
    body.lines()
        .filter(|l| {
            (l.contains("_sum") || l.contains("_count") || l.contains("attempts_total"))
                && !l.starts_with('#')
        })
        .map(str::to_owned)
        .collect()
}

fn pod(name: &str, scheduler: &str, limits: &serde_json::Value) -> Result<Pod> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"schedulerName": scheduler, "runtimeClassName": "lj-runtime", "terminationGracePeriodSeconds": 0,
                 "containers": [{"name": "app", "image": "busybox", "resources": {"limits": limits}}]}
    }))?)
}

/// Records when each pod of a namespace was first seen bound.
fn watch_bound(
    client: &Client,
    ns: &str,
) -> (
    Arc<Mutex<HashMap<String, Instant>>>,
    tokio::task::JoinHandle<()>,
) {
    let bound = Arc::new(Mutex::new(HashMap::new()));
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let seen = Arc::clone(&bound);
    let task = tokio::spawn(async move {
        let mut events = watcher(api, watcher::Config::default()).boxed();
        while let Ok(Some(event)) = events.try_next().await {
            if let watcher::Event::Apply(pod) | watcher::Event::InitApply(pod) = event
                && pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.node_name.as_ref())
                    .is_some()
                && let Ok(mut seen) = seen.lock()
            {
                seen.entry(pod.name_any()).or_insert_with(Instant::now);
            }
        }
    });
    (bound, task)
}

/// Creates `count` pods as fast as the apiserver takes them and measures until all are bound.
async fn burst(
    cluster: &Cluster,
    client: &Client,
    processes: &Processes,
    ns: &str,
    scheduler: &str,
    limits: &serde_json::Value,
    count: usize,
) -> Result<Run> {
    eprintln!("{ns}: {count} pods for {scheduler}");
    namespace(client, ns).await?;
    let (bound, watch) = watch_bound(client, ns);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let cpu_before = processes.cpu();
    let profile = profile_apiserver(cluster, ns)?;
    let start = Instant::now();
    let created = create_pods(&api, scheduler, limits, count).await?;
    let created_in = start.elapsed();
    let end = wait_all_bound(&bound, count, Duration::from_secs(600)).await?;
    watch.abort();
    let bound = bound.lock().map(|b| b.clone()).unwrap_or_default();
    let mut run = measure(count, start, end, &created, &bound);
    run.created_per_sec = count as f64 / created_in.as_secs_f64();
    run.cpu = cpu_since(&cpu_before, &processes.cpu());
    eprintln!(
        "{ns}: {:.0} pods/s, p99 {:.0} ms",
        run.pods_per_sec, run.p99_ms
    );
    if let Some((mut kubectl, path)) = profile {
        kubectl.wait()?;
        eprintln!("{ns}: apiserver CPU profile in {}", path.display());
    }
    cleanup(client, ns).await?;
    Ok(run)
}

/// Creates `count` pods for `scheduler` with [`CONCURRENCY`] requests in flight; returns when
/// each was created.
async fn create_pods(
    api: &Api<Pod>,
    scheduler: &str,
    limits: &serde_json::Value,
    count: usize,
) -> Result<HashMap<String, Instant>> {
    let created = Arc::new(Mutex::new(HashMap::new()));
    stream::iter(0..count)
        .map(|i| {
            let (api, created) = (api.clone(), Arc::clone(&created));
            async move {
                let name = format!("p-{i:05}");
                api.create(&PostParams::default(), &pod(&name, scheduler, limits)?)
                    .await?;
                if let Ok(mut c) = created.lock() {
                    c.insert(name, Instant::now());
                }
                Ok::<(), anyhow::Error>(())
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(created.lock().map(|c| c.clone()).unwrap_or_default())
}

/// With BENCH_PROFILE set, records a CPU profile of the apiserver over the first
/// `BENCH_PROFILE` seconds of a run (read it with `go tool pprof -top`).
fn profile_apiserver(cluster: &Cluster, ns: &str) -> Result<Option<(Child, std::path::PathBuf)>> {
    let Ok(seconds) = std::env::var("BENCH_PROFILE") else {
        return Ok(None);
    };
    let path = cluster.dir.join(format!("apiserver-{ns}.pprof"));
    let kubectl = cluster
        .kubectl()
        .args(["get", "--raw"])
        .arg(format!("/debug/pprof/profile?seconds={seconds}"))
        .stdout(std::fs::File::create(&path)?)
        .spawn()?;
    Ok(Some((kubectl, path)))
}

async fn wait_all_bound(
    bound: &Arc<Mutex<HashMap<String, Instant>>>,
    count: usize,
    timeout: Duration,
) -> Result<Instant> {
    let deadline = Instant::now() + timeout;
    loop {
        let (n, last) = bound
            .lock()
            .map(|b| (b.len(), b.values().max().copied()))
            .unwrap_or((0, None));
        if n >= count {
            return last.context("no pod bound");
        }
        if Instant::now() > deadline {
            bail!("only {n} of {count} pods were bound in {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn measure(
    count: usize,
    start: Instant,
    end: Instant,
    created: &HashMap<String, Instant>,
    bound: &HashMap<String, Instant>,
) -> Run {
    let mut latencies: Vec<f64> = created
        .iter()
        .filter_map(|(name, c)| {
            bound
                .get(name)
                .map(|b| b.saturating_duration_since(*c).as_secs_f64() * 1000.0)
        })
        .collect();
    latencies.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        latencies
            .get(((latencies.len() as f64 - 1.0) * p).round() as usize)
            .copied()
            .unwrap_or(0.0)
    };
    Run {
        pods: count,
        pods_per_sec: count as f64 / end.duration_since(start).as_secs_f64(),
        p50_ms: pct(0.5),
        p99_ms: pct(0.99),
        ..Run::default()
    }
}

/// A steady stream of pods for ours, for the latency at a moderate rate.
async fn steady(client: &Client, processes: &Processes, ns: &str, seconds: u64) -> Result<Run> {
    let count = (STEADY_RATE * seconds) as usize;
    eprintln!("{ns}: {count} pods at {STEADY_RATE}/s");
    namespace(client, ns).await?;
    let (bound, watch) = watch_bound(client, ns);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let created = Arc::new(Mutex::new(HashMap::new()));
    let cpu_before = processes.cpu();
    let start = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / STEADY_RATE));
    let mut tasks = Vec::with_capacity(count);
    for i in 0..count {
        tick.tick().await;
        let (api, created) = (api.clone(), Arc::clone(&created));
        tasks.push(tokio::spawn(async move {
            let name = format!("s-{i:05}");
            let issued = Instant::now();
            api.create(
                &PostParams::default(),
                &pod(&name, OURS, &json!({"nvidia.com/gpu": "1"}))?,
            )
            .await?;
            if let Ok(mut c) = created.lock() {
                c.insert(name, issued);
            }
            Ok::<(), anyhow::Error>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let end = wait_all_bound(&bound, count, Duration::from_secs(120)).await?;
    watch.abort();
    let created = created.lock().map(|c| c.clone()).unwrap_or_default();
    let bound = bound.lock().map(|b| b.clone()).unwrap_or_default();
    let mut run = measure(count, start, end, &created, &bound);
    run.created_per_sec = STEADY_RATE as f64;
    run.cpu = cpu_since(&cpu_before, &processes.cpu());
    cleanup(client, ns).await?;
    Ok(run)
}

/// Bindings posted in a tight loop for pods no scheduler handles: what this apiserver can take.
async fn binding_ceiling(client: &Client, ns: &str, count: usize, nodes: usize) -> Result<Run> {
    eprintln!("{ns}: {count} Bindings in a tight loop");
    namespace(client, ns).await?;
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    stream::iter(0..count)
        .map(|i| {
            let api = api.clone();
            async move {
                api.create(
                    &PostParams::default(),
                    &pod(&format!("b-{i:05}"), "none", &json!({}))?,
                )
                .await
                .map(|_| ())
                .map_err(anyhow::Error::from)
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    let start = Instant::now();
    stream::iter(0..count)
        .map(|i| {
            let api = api.clone();
            async move {
                let name = format!("b-{i:05}");
                let node = format!("bench-{:04}", i % nodes);
                let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name}, "target": {"kind": "Node", "name": node}});
                let posted: serde_json::Value = api.create_subresource("binding", &name, &PostParams::default(), &binding).await?;
                drop(posted);
                Ok::<(), anyhow::Error>(())
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    let run = Run {
        pods: count,
        pods_per_sec: count as f64 / start.elapsed().as_secs_f64(),
        ..Run::default()
    };
    cleanup(client, ns).await?;
    Ok(run)
}

/// Deletes a run's namespace and plays the node agents' part: removes the finalizers of the
/// released slices, so the cards are free for the next run.
async fn cleanup(client: &Client, ns: &str) -> Result<()> {
    Api::<Namespace>::all(client.clone())
        .delete(ns, &DeleteParams::background())
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let remaining_slices = tear_down_released(client, ns).await?;
        let left = pods
            .list(&ListParams::default().limit(1))
            .await?
            .items
            .len()
            + remaining_slices;
        let gone = Api::<Namespace>::all(client.clone())
            .get_opt(ns)
            .await?
            .is_none();
        if gone || (left == 0 && Instant::now() > deadline) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("namespace {ns} was not removed in time");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn peak_rss(pid: i32) -> Result<f64> {
    Ok(rss_mib(pid)?.1)
}
