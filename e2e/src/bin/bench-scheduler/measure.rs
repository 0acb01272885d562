//! What every run measures with: pods made and watched until bound, latencies, and each
//! process's CPU and memory.

use crate::CONCURRENCY;
use crate::workload::Workload;
use anyhow::{Context, Result, bail};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use runtimekit_e2e::cluster::Cluster;
use runtimekit_e2e::load::{rss_mib, tear_down_released};
use std::collections::HashMap;
use std::process::Child;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One measured run.
#[derive(Debug, Default)]
pub struct Run {
    pub pods: usize,
    pub pods_per_sec: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Pods created per second by the load generator.
    pub created_per_sec: f64,
    /// CPU seconds each process used during the run.
    pub cpu: Vec<(String, f64)>,
    /// Backlogs only (`None` for other runs): the apiserver's CPU milliseconds per pod from the
    /// scheduler's start until the run settled (every pod Running, every `Scheduled` Event
    /// written). kwok marks bound pods Running at its own pace, about 280 a second, so a fast
    /// drain leaves most of that work, and its Events, after its last binding: a window that
    /// ends there charges a faster scheduler less of the work its bindings cause. Both
    /// schedulers' windows are about as long (kwok paces both), so they carry about the same
    /// background.
    pub apiserver_settled_ms: Option<f64>,
    /// Backlogs only: the apiserver requests per pod from before the pods were created until
    /// the run settled, of every kind made at least once per two pods, without the played
    /// agents' heartbeats (background, not the pods' cost).
    pub requests_per_pod: Option<f64>,
}

/// The processes whose CPU time a run reports.
#[derive(Clone)]
pub struct Processes(pub Vec<(String, i32)>);

impl Processes {
    pub fn of(cluster: &Cluster, operator: &Child) -> Result<Processes> {
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

    /// The same processes with `name` now the process `child` (started again).
    pub fn with(&self, name: &str, child: &Child) -> Result<Processes> {
        let mut list = self.0.clone();
        list.retain(|(n, _)| n != name);
        list.push((name.to_owned(), i32::try_from(child.id())?));
        Ok(Processes(list))
    }

    /// [`Processes::cpu`] without the process `name`, which is about to be started again.
    pub fn cpu_without(&self, name: &str) -> Vec<(String, f64)> {
        let mut cpu = self.cpu();
        cpu.retain(|(n, _)| n != name);
        cpu
    }

    /// CPU seconds (user and system) each process used so far.
    pub fn cpu(&self) -> Vec<(String, f64)> {
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
pub fn cpu_since(before: &[(String, f64)], after: &[(String, f64)]) -> Vec<(String, f64)> {
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
pub fn cpu_of(cpu: &[(String, f64)], name: &str) -> f64 {
    cpu.iter().find(|(n, _)| n == name).map_or(0.0, |(_, s)| *s)
}

/// The operator's own view of its work: the sums and counts of its latency histograms.
pub fn operator_metrics(listen: std::net::SocketAddr) -> Vec<String> {
    let body = runtimekit_e2e::tools::http_get(listen, "/metrics").unwrap_or_default();
    body.lines()
        .filter(|l| {
            (l.contains("_sum") || l.contains("_count") || l.contains("attempts_total"))
                && !l.starts_with('#')
        })
        .map(str::to_owned)
        .collect()
}

/// When each pod of a namespace was first seen as a watch wants it, by name, and the watch.
pub type Watched = (
    Arc<Mutex<HashMap<String, Instant>>>,
    tokio::task::JoinHandle<()>,
);

/// Records when each pod of a namespace was first seen bound.
pub fn watch_bound(client: &Client, ns: &str) -> Watched {
    watch_pods(client, ns, |pod| {
        pod.spec
            .as_ref()
            .and_then(|s| s.node_name.as_ref())
            .is_some()
    })
}

/// Records when each pod of a namespace was first seen Running (kwok marks bound pods so).
pub fn watch_running(client: &Client, ns: &str) -> Watched {
    watch_pods(client, ns, |pod| {
        pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
    })
}

/// Records when each pod of a namespace was first seen at all (made by a controller).
pub fn watch_created(client: &Client, ns: &str) -> Watched {
    watch_pods(client, ns, |_| true)
}

/// Records when each pod of a namespace was first seen matching `wanted`.
fn watch_pods(client: &Client, ns: &str, wanted: fn(&Pod) -> bool) -> Watched {
    let found = Arc::new(Mutex::new(HashMap::new()));
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let seen = Arc::clone(&found);
    let task = tokio::spawn(async move {
        let mut events = watcher(api, watcher::Config::default()).boxed();
        while let Ok(Some(event)) = events.try_next().await {
            if let watcher::Event::Apply(pod) | watcher::Event::InitApply(pod) = event
                && wanted(&pod)
                && let Ok(mut seen) = seen.lock()
            {
                seen.entry(pod.name_any()).or_insert_with(Instant::now);
            }
        }
    });
    (found, task)
}

/// Creates `count` pods of `workload` (and their groups first) with [`CONCURRENCY`] requests
/// in flight; returns when each was created.
pub async fn create_pods(
    client: &Client,
    ns: &str,
    workload: &Workload,
    count: usize,
) -> Result<HashMap<String, Instant>> {
    workload.create_groups(client, ns, count).await?;
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let created = Arc::new(Mutex::new(HashMap::new()));
    stream::iter(0..count)
        .map(|i| {
            let (api, created) = (api.clone(), Arc::clone(&created));
            async move {
                let pod = workload.pod("p", i)?;
                let name = pod.name_any();
                api.create(&PostParams::default(), &pod).await?;
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
pub fn profile_apiserver(cluster: &Cluster, ns: &str) -> Result<Option<Profile>> {
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

/// A CPU profile being recorded: the kubectl fetching it and the file it writes.
pub type Profile = (Child, std::path::PathBuf);

pub fn finish_profile(ns: &str, profile: Option<Profile>) -> Result<()> {
    if let Some((mut kubectl, path)) = profile {
        kubectl.wait()?;
        eprintln!("{ns}: apiserver CPU profile in {}", path.display());
    }
    Ok(())
}

/// Waits until a watch of [`watch_pods`] has seen `count` pods (bound, or Running); returns
/// when it saw the last.
pub async fn wait_all_seen(
    seen: &Arc<Mutex<HashMap<String, Instant>>>,
    count: usize,
    timeout: Duration,
) -> Result<Instant> {
    let deadline = Instant::now() + timeout;
    loop {
        let (n, last) = seen
            .lock()
            .map(|b| (b.len(), b.values().max().copied()))
            .unwrap_or((0, None));
        if n >= count {
            return last.context("no pod seen");
        }
        if Instant::now() > deadline {
            bail!("only {n} of {count} pods were seen in {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn measure(
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

/// Deletes a run's namespace and plays the node agents' part: removes the finalizers of the
/// released slices, so the cards are free for the next run.
pub async fn cleanup(client: &Client, ns: &str) -> Result<()> {
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

pub fn peak_rss(pid: i32) -> Result<f64> {
    Ok(rss_mib(pid)?.1)
}

/// The apiserver's request counts so far, by verb and resource (`POST pods/binding`).
pub fn apiserver_requests(cluster: &Cluster) -> Result<HashMap<String, f64>> {
    let output = cluster
        .kubectl()
        .args(["get", "--raw", "/metrics"])
        .output()?;
    let mut counts = HashMap::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split(',')
                .find_map(|l| l.strip_prefix(&format!("{name}=\"")))
                .map(|v| v.trim_end_matches('"').to_owned())
                .unwrap_or_default()
        };
        let (resource, sub) = (label("resource"), label("subresource"));
        let key = format!(
            "{} {resource}{}{sub}",
            label("verb"),
            if sub.is_empty() { "" } else { "/" }
        );
        *counts.entry(key).or_insert(0.0) += value.parse::<f64>().unwrap_or(0.0);
    }
    Ok(counts)
}

/// The requests made between two readings, most first, those of at least `least`.
pub fn requests_since(
    before: &HashMap<String, f64>,
    after: &HashMap<String, f64>,
    least: f64,
) -> Vec<(String, f64)> {
    let mut made: Vec<(String, f64)> = after
        .iter()
        .map(|(k, a)| (k.clone(), a - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, n)| *n >= least)
        .collect();
    made.sort_by(|a, b| b.1.total_cmp(&a.1));
    made
}

/// The median of `values`; NaN when there are none.
pub fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut values: Vec<f64> = values.collect();
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}
