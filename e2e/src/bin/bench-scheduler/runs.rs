//! The runs of parts 1 and 2: the backlog drain, the bursts, the steady stream and the
//! Binding ceiling.

use crate::measure::{
    Processes, Profile, Run, cleanup, cpu_of, cpu_since, create_pods, finish_profile, measure, pod,
    profile_apiserver, wait_all_bound, watch_bound,
};
use crate::{CONCURRENCY, OURS, STEADY_RATE};
use anyhow::Result;
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, ListParams, PostParams};
use runtimekit_e2e::cluster::Cluster;
use runtimekit_e2e::load::namespace;
use serde_json::json;
use std::collections::HashMap;
use std::process::Child;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Stops the operator with SIGTERM (it gives up its Lease on the way out) and waits for it.
pub fn stop_gracefully(operator: &mut Child) -> Result<()> {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(operator.id())?);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)?;
    operator.wait()?;
    Ok(())
}

/// Part 1 of the benchmark: pods created while no scheduler runs, waiting for one.
pub struct Backlog {
    ns: String,
    count: usize,
    created: HashMap<String, Instant>,
    bound: Arc<Mutex<HashMap<String, Instant>>>,
    watch: tokio::task::JoinHandle<()>,
}

impl Backlog {
    /// Creates `count` whole-card pods for `scheduler`, which must not be running.
    pub async fn create(
        client: &Client,
        ns: &str,
        scheduler: &str,
        count: usize,
    ) -> Result<Backlog> {
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
    pub async fn drain(
        self,
        client: &Client,
        started: Instant,
        before: &[(String, f64)],
        processes: &Processes,
        profile: Option<Profile>,
    ) -> Result<Run> {
        let end = wait_all_bound(&self.bound, self.count, Duration::from_secs(900)).await?;
        let cpu = cpu_since(before, &processes.cpu());
        finish_profile(&self.ns, profile)?;
        self.watch.abort();
        let (events, settled) = scheduled_events_settle(client, &self.ns).await?;
        let trailing = cpu_since(before, &processes.cpu());
        eprintln!(
            "{}: {events} Scheduled events; apiserver CPU {:.1} s at the last bind, {:.1} s once they settled ({settled:?} later)",
            self.ns,
            cpu_of(&cpu, "kube-apiserver"),
            cpu_of(&trailing, "kube-apiserver")
        );
        let bound = self.bound.lock().map(|b| b.clone()).unwrap_or_default();
        let mut run = measure(self.count, started, end, &self.created, &bound);
        run.cpu = cpu;
        eprintln!("{}: {:.0} pods/s", self.ns, run.pods_per_sec);
        cleanup(client, &self.ns).await?;
        Ok(run)
    }
}

/// Waits until the count of `Scheduled` Events in `ns` stops growing; returns it and the wait.
pub async fn scheduled_events_settle(client: &Client, ns: &str) -> Result<(usize, Duration)> {
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
    finish_profile(ns, profile)?;
    cleanup(client, ns).await?;
    Ok(run)
}

/// A steady stream of pods for ours, for the latency at a moderate rate.
pub async fn steady(client: &Client, processes: &Processes, ns: &str, seconds: u64) -> Result<Run> {
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
