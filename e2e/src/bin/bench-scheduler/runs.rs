//! The runs of parts 1 and 2: the backlog drain, the bursts, the steady stream and the
//! Binding ceiling.

use crate::measure::{
    Processes, Profile, Run, apiserver_requests, cleanup, cpu_of, cpu_since, create_pods,
    finish_profile, measure, profile_apiserver, requests_since, wait_all_seen, watch_bound,
    watch_running,
};
use crate::workload::Workload;
use crate::{CONCURRENCY, STEADY_RATE};
use anyhow::Result;
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};
use runtimekit_e2e::cluster::Cluster;
use runtimekit_e2e::load::{namespace, start_operator};
use serde_json::json;
use std::collections::HashMap;
use std::process::Child;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Our operator, run as its own process and restarted around each backlog of ours.
pub struct Operator {
    pub child: Child,
    pub listen: std::net::SocketAddr,
}

impl Operator {
    pub fn start(cluster: &Cluster) -> Result<Operator> {
        let (child, listen) = start_operator(cluster, "bench")?;
        Ok(Operator { child, listen })
    }

    /// A backlog drain of `pending` for ours: the operator is stopped while the pods are
    /// created, then started again and timed until all are bound.
    pub async fn backlog(
        &mut self,
        cluster: &mut Cluster,
        client: &Client,
        processes: &mut Processes,
        pending: Pending<'_>,
    ) -> Result<Run> {
        stop_gracefully(&mut self.child)?;
        drain_backlog(
            cluster,
            client,
            processes,
            pending,
            "runtimekit-operator",
            |cluster, _| {
                *self = Operator::start(cluster)?;
                Processes::of(cluster, &self.child)
            },
        )
        .await
    }
}

/// The request of the played agents' heartbeats, left out of a run's requests per pod.
const HEARTBEAT_REQUEST: &str = "PATCH topologygroups/status";

/// A backlog's pods: the namespace, what each pod is, and how many.
pub type Pending<'a> = (&'a str, &'a Workload, usize);

/// A backlog drain of `pending` for kube-scheduler, stopped through the cluster while the pods
/// are created, then started again with the same flags.
pub async fn kube_backlog(
    cluster: &mut Cluster,
    client: &Client,
    processes: &mut Processes,
    operator: &Child,
    pending: Pending<'_>,
) -> Result<Run> {
    let stopped = cluster.stop_component("kube-scheduler")?;
    drain_backlog(
        cluster,
        client,
        processes,
        pending,
        "kube-scheduler",
        |cluster, _| {
            cluster.start_again(stopped)?;
            Processes::of(cluster, operator)
        },
    )
    .await
}

/// A backlog drain: the `pending` pods, created while the scheduler (the process `process`) is
/// stopped; then `start` starts it and says which processes to read from then on, and the
/// drain is timed until every pod is bound.
pub async fn drain_backlog(
    cluster: &mut Cluster,
    client: &Client,
    processes: &mut Processes,
    (ns, workload, count): Pending<'_>,
    process: &str,
    start: impl FnOnce(&mut Cluster, &Processes) -> Result<Processes>,
) -> Result<Run> {
    let pending = Backlog::create(cluster, client, ns, workload, count).await?;
    let before = processes.cpu_without(process);
    let profile = profile_apiserver(cluster, ns)?;
    let started = Instant::now();
    *processes = start(cluster, processes)?;
    pending
        .drain(cluster, client, started, &before, processes, profile)
        .await
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
    requests: HashMap<String, f64>,
    ns: String,
    count: usize,
    created: HashMap<String, Instant>,
    bound: Arc<Mutex<HashMap<String, Instant>>>,
    watch: tokio::task::JoinHandle<()>,
}

impl Backlog {
    /// Creates `count` pods of `workload`, whose scheduler must not be running.
    async fn create(
        cluster: &Cluster,
        client: &Client,
        ns: &str,
        workload: &Workload,
        count: usize,
    ) -> Result<Backlog> {
        let scheduler = &workload.scheduler;
        eprintln!("{ns}: {count} pending pods for {scheduler}, then {scheduler} started");
        namespace(client, ns).await?;
        // Counted from before the pods: their creates, and what controllers make for them (a
        // DRA pod's claim), belong to what each pod costs.
        let requests = apiserver_requests(cluster)?;
        let created = create_pods(client, ns, workload, count).await?;
        let (bound, watch) = watch_bound(client, ns);
        // The watch's first list, before the scheduler starts.
        tokio::time::sleep(Duration::from_secs(1)).await;
        Ok(Backlog {
            requests,
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
        cluster: &Cluster,
        client: &Client,
        started: Instant,
        before: &[(String, f64)],
        processes: &Processes,
        profile: Option<Profile>,
    ) -> Result<Run> {
        let end = wait_all_seen(&self.bound, self.count, Duration::from_secs(900)).await?;
        let cpu = cpu_since(before, &processes.cpu());
        finish_profile(&self.ns, profile)?;
        self.watch.abort();
        // Watched from now, not during the drain, where it would load the apiserver: its first
        // list counts the pods already Running.
        let (running, running_watch) = watch_running(client, &self.ns);
        wait_all_seen(&running, self.count, Duration::from_secs(600)).await?;
        running_watch.abort();
        let (events, _) = scheduled_events_settle(client, &self.ns).await?;
        let trailing = cpu_since(before, &processes.cpu());
        let settled = started.elapsed();
        let settled_cpu = cpu_of(&trailing, "kube-apiserver");
        eprintln!(
            "{}: {events} Scheduled events, every pod Running; apiserver CPU {:.1} s at the last bind, {settled_cpu:.1} s once settled {:.1} s after the start",
            self.ns,
            cpu_of(&cpu, "kube-apiserver"),
            settled.as_secs_f64(),
        );
        let requests = apiserver_requests(cluster)?;
        // The requests behind each bound pod (and the background's, when as many).
        let least = (self.count / 2).max(1) as f64;
        let per_pod = requests_since(&self.requests, &requests, least);
        for (request, n) in &per_pod {
            eprintln!(
                "{}: {request}: {n:.0} ({:.2} per pod)",
                self.ns,
                n / self.count as f64
            );
        }
        // The played agents' heartbeats run whatever the scheduler does: a drain of half a
        // minute counts more of them than one per two pods.
        let requests_per_pod = per_pod
            .iter()
            .filter(|(request, _)| request != HEARTBEAT_REQUEST)
            .map(|(_, n)| n)
            .sum::<f64>()
            / self.count as f64;
        let bound = self.bound.lock().map(|b| b.clone()).unwrap_or_default();
        // Latency from the scheduler's start: the pods could not be bound before it.
        let waiting: HashMap<String, Instant> = self
            .created
            .keys()
            .map(|name| (name.clone(), started))
            .collect();
        let mut run = measure(self.count, started, end, &waiting, &bound);
        run.cpu = cpu;
        let settled_ms = settled_cpu * 1000.0 / self.count as f64;
        run.apiserver_settled_ms = Some(settled_ms);
        run.requests_per_pod = Some(requests_per_pod);
        eprintln!(
            "{}: {:.0} pods/s, p99 {:.0} ms from the start, apiserver CPU {:.2} ms per pod at the last bind, {:.2} until settled",
            self.ns,
            run.pods_per_sec,
            run.p99_ms,
            cpu_of(&run.cpu, "kube-apiserver") * 1000.0 / self.count as f64,
            settled_ms
        );
        cleanup(client, &self.ns).await?;
        Ok(run)
    }
}

/// Waits until the count of `Scheduled` Events in `ns` stops growing; returns it and the wait.
async fn scheduled_events_settle(client: &Client, ns: &str) -> Result<(usize, Duration)> {
    let api: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), ns);
    let started = Instant::now();
    let mut last = usize::MAX;
    loop {
        let count = api
            .list_metadata(&ListParams::default().fields("reason=Scheduled"))
            .await?
            .items
            .len();
        if count == last || started.elapsed() > Duration::from_secs(120) {
            return Ok((count, started.elapsed()));
        }
        last = count;
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
}

/// Creates `count` pods as fast as the apiserver takes them and measures until all are bound.
pub async fn burst(
    cluster: &Cluster,
    client: &Client,
    processes: &Processes,
    ns: &str,
    workload: &Workload,
    count: usize,
) -> Result<Run> {
    eprintln!("{ns}: {count} pods for {}", workload.scheduler);
    namespace(client, ns).await?;
    let (bound, watch) = watch_bound(client, ns);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let cpu_before = processes.cpu();
    let profile = profile_apiserver(cluster, ns)?;
    let start = Instant::now();
    let created = create_pods(client, ns, workload, count).await?;
    let created_in = start.elapsed();
    let end = wait_all_seen(&bound, count, Duration::from_secs(600)).await?;
    watch.abort();
    let bound = bound.lock().map(|b| b.clone()).unwrap_or_default();
    let mut run = measure(count, start, end, &created, &bound);
    run.created_per_sec = count as f64 / created_in.as_secs_f64();
    run.cpu = cpu_since(&cpu_before, &processes.cpu());
    eprintln!(
        "{ns}: {:.0} pods/s, p99 {:.0} ms",
        run.pods_per_sec, run.p99_ms
    );
    finish_profile(ns, profile)?;
    cleanup(client, ns).await?;
    Ok(run)
}

/// A steady stream of pods, for the latency at a moderate rate. Their groups, if any, are made
/// first, as a controller would have.
pub async fn steady(
    client: &Client,
    processes: &Processes,
    ns: &str,
    seconds: u64,
    workload: &Workload,
) -> Result<Run> {
    let count = (STEADY_RATE * seconds) as usize;
    eprintln!(
        "{ns}: {count} pods at {STEADY_RATE}/s for {}",
        workload.scheduler
    );
    namespace(client, ns).await?;
    workload.create_groups(client, ns, count).await?;
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
        let pod = workload.pod("s", i)?;
        tasks.push(tokio::spawn(async move {
            let name = pod.name_any();
            let issued = Instant::now();
            api.create(&PostParams::default(), &pod).await?;
            if let Ok(mut c) = created.lock() {
                c.insert(name, issued);
            }
            Ok::<(), anyhow::Error>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let end = wait_all_seen(&bound, count, Duration::from_secs(600)).await?;
    watch.abort();
    let created = created.lock().map(|c| c.clone()).unwrap_or_default();
    let bound = bound.lock().map(|b| b.clone()).unwrap_or_default();
    let mut run = measure(count, start, end, &created, &bound);
    run.created_per_sec = STEADY_RATE as f64;
    run.cpu = cpu_since(&cpu_before, &processes.cpu());
    eprintln!(
        "{ns}: {:.0} pods/s, p50 {:.0} ms, p99 {:.0} ms",
        run.pods_per_sec, run.p50_ms, run.p99_ms
    );
    cleanup(client, ns).await?;
    Ok(run)
}

/// Bindings posted in a tight loop for pods no scheduler handles: what this apiserver can take.
pub async fn binding_ceiling(client: &Client, ns: &str, count: usize, nodes: usize) -> Result<Run> {
    eprintln!("{ns}: {count} Bindings in a tight loop");
    namespace(client, ns).await?;
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    stream::iter(0..count)
        .map(|i| {
            let api = api.clone();
            async move {
                api.create(
                    &PostParams::default(),
                    &Workload::new("none", json!({})).pod("b", i)?,
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
