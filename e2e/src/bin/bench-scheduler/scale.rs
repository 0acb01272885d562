//! Part 3: the fleet grown to thousands of nodes of eight cards, filled with the engine
//! benchmark's mixed stream and then gangs made by the real JobSet controller to 90 %: the time from each
//! JobSet's creation until all its pods are bound, by gang size.

use anyhow::Result;
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use kube::{Client, ResourceExt};
use runtimekit_crds::{GangGroup, GangPhase};
use runtimekit_e2e::load::{CARDS, Fleet, namespace};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::measure::{Processes, cpu_since, watch_bound, watch_created};
use crate::workload::Workload;
use crate::{CONCURRENCY, OURS};

/// What part 3 measured.
#[derive(Debug, Default)]
pub struct Scale {
    /// Nodes in the cluster.
    pub nodes: usize,
    /// Pods of the mixed stream created, and bound once the scheduler settled.
    pub created: usize,
    pub bound: usize,
    /// Whole cards' worth the bound pods asked for, as a share of all cards.
    pub filled: f64,
    /// Bound pods of the mixed stream per second, from the first creation to the last binding.
    pub pods_per_sec: f64,
    /// Per gang size: how many JobSets, and for each how long its members took (None: not all
    /// were bound in time).
    pub gangs: Vec<(usize, Vec<Option<GangTime>>)>,
    /// CPU seconds each process used over the part.
    pub cpu: Vec<(String, f64)>,
}

/// Seconds from a JobSet's creation until all its members were bound, and the part of it the
/// Job controller took to create them all, which no scheduler can bind before.
#[derive(Debug, Clone, Copy)]
pub struct GangTime {
    pub bound: f64,
    pub created: f64,
}

/// The share of the grown fleet's cards in MIG mode. MIG cards serve only `gpu-slice`, which
/// the mixed stream asks for about 5 % of its cards with; more would idle (two of each added
/// node's eight left a fifth of 3,000 nodes idle and too few whole cards for the gangs), fewer
/// would leave MIG pods unplaced.
const MIG_SHARE: f64 = 0.08;

/// How many of each added node's cards are in MIG mode, so that about [`MIG_SHARE`] of the
/// grown fleet's cards are (the first nodes have none).
pub fn mig_cards_per_added_node(all_nodes: usize, added: usize) -> u32 {
    let wanted = (MIG_SHARE * (all_nodes * CARDS as usize) as f64).ceil() as usize;
    u32::try_from(wanted.div_ceil(added.max(1)))
        .unwrap_or(CARDS)
        .min(CARDS)
}

/// The gangs part 3 makes, as (JobSets, members each).
pub const GANGS: [(usize, usize); 3] = [(20, 8), (4, 64), (1, 512)];
/// The same in the smoke form.
pub const SMOKE_GANGS: [(usize, usize); 2] = [(2, 4), (1, 8)];

/// Grows the cluster by `extra` (nodes named `scale-*`, with MIG cards), fills it to 90 %
/// and then runs the gangs.
pub async fn run(
    client: &Client,
    processes: &Processes,
    base_nodes: usize,
    extra: Fleet,
    gangs: &[(usize, usize)],
) -> Result<Scale> {
    let nodes = base_nodes + extra.nodes;
    eprintln!("scale: adding {} nodes, {nodes} in all", extra.nodes);
    let heartbeats = extra.create(client).await?;
    let cpu_before = processes.cpu();
    // The mixed stream stops short of 90 % by the gangs' cards, which bring the fleet to it.
    let gang_cards: usize = gangs.iter().map(|(count, size)| count * size).sum();
    let mut scale = fill(client, nodes, gang_cards).await?;
    eprintln!(
        "scale: {} of {} pods bound, {:.1} % of the cards, {:.0} pods/s",
        scale.bound,
        scale.created,
        scale.filled * 100.0,
        scale.pods_per_sec
    );
    scale.gangs = run_gangs(client, gangs).await?;
    for (size, times) in &scale.gangs {
        eprintln!("scale: gangs of {size}: {times:?}");
    }
    scale.cpu = cpu_since(&cpu_before, &processes.cpu());
    heartbeats.abort();
    Ok(scale)
}

/// The mixed stream until the requests reach 90 % of all cards, then the wait until the
/// scheduler has bound what fits.
async fn fill(client: &Client, nodes: usize, gang_cards: usize) -> Result<Scale> {
    let ns = "bench-scale";
    namespace(client, ns).await?;
    let total = (nodes * CARDS as usize) as f64;
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut pods = Vec::new();
    let mut asked = 0.0;
    while asked < 0.9 * total - gang_cards as f64 {
        let (limits, cards) = mixed(&mut rng);
        asked += cards;
        pods.push((Workload::new(OURS, limits).pod("m", pods.len())?, cards));
    }
    eprintln!("scale: {} pods of the mixed stream", pods.len());
    let (bound, watch) = watch_bound(client, ns);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let started = Instant::now();
    stream::iter(&pods)
        .map(|(pod, _)| {
            let api = api.clone();
            async move {
                api.create(&PostParams::default(), pod).await?;
                Ok::<(), anyhow::Error>(())
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    // Settled: no pod bound for ten seconds (the rest do not fit) or every pod bound.
    let mut last = (0, Instant::now());
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let n = bound.lock().map(|b| b.len()).unwrap_or(0);
        if n != last.0 {
            last = (n, Instant::now());
        }
        if n == pods.len() || last.1.elapsed() > Duration::from_secs(10) {
            break;
        }
    }
    watch.abort();
    let bound = bound.lock().map(|b| b.clone()).unwrap_or_default();
    let end = bound.values().max().copied().unwrap_or(started);
    let filled: f64 = pods
        .iter()
        .filter(|(pod, _)| bound.contains_key(&pod.name_any()))
        .map(|(_, cards)| cards)
        .sum();
    Ok(Scale {
        nodes,
        created: pods.len(),
        bound: bound.len(),
        filled: filled / total,
        pods_per_sec: bound.len() as f64 / end.duration_since(started).as_secs_f64().max(1e-3),
        ..Scale::default()
    })
}

/// One pod of the engine benchmark's mixed stream (40 % TDM, 20 % MIG, 30 % one whole card,
/// 10 % several cards), as limits, and the whole cards' worth it asks for.
fn mixed(rng: &mut Rng) -> (Value, f64) {
    let r = rng.below(100);
    if r < 40 {
        let core = [10, 20, 25, 30, 50][rng.below(5)];
        let memory = [4, 8, 16][rng.below(3)];
        let limits = json!({"aliyun.com/gpu-core": core.to_string(), "aliyun.com/gpu-memory": memory.to_string()});
        (
            limits,
            (f64::from(core) / 100.0).max(f64::from(memory) / 80.0),
        )
    } else if r < 60 {
        let slices = [1, 1, 2, 3][rng.below(4)];
        let limits = json!({"aliyun.com/gpu-slice": slices.to_string()});
        (limits, f64::from(slices) / 7.0)
    } else if r < 90 {
        (json!({"nvidia.com/gpu": "1"}), 1.0)
    } else {
        let cards = [2, 4, 8][rng.below(3)];
        (
            json!({"aliyun.com/gpu": cards.to_string()}),
            f64::from(cards),
        )
    }
}

/// Creates every gang's JobSet at once and times each until all its members are created and
/// bound.
async fn run_gangs(
    client: &Client,
    gangs: &[(usize, usize)],
) -> Result<Vec<(usize, Vec<Option<GangTime>>)>> {
    let ns = "bench-gangs";
    namespace(client, ns).await?;
    let (bound, watch) = watch_bound(client, ns);
    let (made, made_watch) = watch_created(client, ns);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &jobset());
    let mut created = Vec::new();
    for &(count, size) in gangs {
        for j in 0..count {
            let name = format!("gang{size}-{j:02}");
            api.create(&PostParams::default(), &gang(&name, size)?)
                .await?;
            created.push((name, size, Instant::now()));
        }
    }
    let total: usize = gangs.iter().map(|(c, s)| c * s).sum();
    eprintln!("scale: {} JobSets, {total} members", created.len());
    let deadline = Instant::now() + Duration::from_secs(300);
    while bound.lock().map(|b| b.len()).unwrap_or(0) < total && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    watch.abort();
    made_watch.abort();
    let bound = bound.lock().map(|b| b.clone()).unwrap_or_default();
    let made = made.lock().map(|m| m.clone()).unwrap_or_default();
    // Why a gang is not bound, in its GangGroup's words.
    let groups: Api<GangGroup> = Api::namespaced(client.clone(), ns);
    for group in groups.list(&Default::default()).await?.items {
        let status = group.status.unwrap_or_default();
        if !matches!(status.phase, Some(GangPhase::Bound | GangPhase::Running)) {
            eprintln!(
                "scale: {} is {:?}: {}",
                group.metadata.name.unwrap_or_default(),
                status.phase,
                status.message.unwrap_or_default()
            );
        }
    }
    Ok(gangs
        .iter()
        .map(|&(_, size)| {
            let times = created
                .iter()
                .filter(|(_, s, _)| *s == size)
                .map(|(name, _, at)| {
                    let prefix = format!("{name}-");
                    // Seconds until the last of the gang's members was seen in `times`.
                    let last = |times: &HashMap<String, Instant>| {
                        let members: Vec<&Instant> = times
                            .iter()
                            .filter(|(pod, _)| pod.starts_with(&prefix))
                            .map(|(_, t)| t)
                            .collect();
                        (members.len() == size).then(|| {
                            members
                                .into_iter()
                                .max()
                                .map_or(0.0, |t| t.duration_since(*at).as_secs_f64())
                        })
                    };
                    Some(GangTime {
                        bound: last(&bound)?,
                        created: last(&made)?,
                    })
                })
                .collect();
            (size, times)
        })
        .collect())
}

/// A JobSet of one indexed Job of `size` workers, one whole card each, gang-scheduled by ours.
fn gang(name: &str, size: usize) -> Result<DynamicObject> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": name},
        "spec": {"replicatedJobs": [{"name": "worker", "template": {"spec": {
            "completionMode": "Indexed", "parallelism": size, "completions": size, "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {"aliyun.com/min-member": size.to_string()}},
                "spec": {"schedulerName": OURS, "runtimeClassName": "lj-runtime", "restartPolicy": "Never",
                         "containers": [{"name": "trainer", "image": "busybox",
                                         "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}}}]}
    }))?)
}

fn jobset() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("jobset.x-k8s.io", "v1alpha2", "JobSet"),
        "jobsets",
    )
}

/// A small deterministic generator (xorshift), so every run draws the same stream.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}
