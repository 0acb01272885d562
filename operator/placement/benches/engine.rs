//! Placement engine benchmark: single-pod decisions while a cluster fills up, gang decisions,
//! and the engine's memory per card. Single-threaded. Prints a table, then one JSON line.
//!
//! Run with `cargo bench -p runtimekit-placement --bench engine`.

// Counting allocations needs a GlobalAlloc, which is an unsafe trait; the impl only forwards
// to the system allocator.
#![allow(unsafe_code)]

use runtimekit_contract::{CardRequest, ContainerRequest, WholeCardName};
use runtimekit_placement::{
    CardInfo, Cluster, Decision, GangConstraint, NetworkPosition, NicInfo, NodeInfo, PodInput,
    Resources, Settings, Share, Switches, Taint, TaintEffect, Vendor,
};
use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::{BTreeMap, HashMap};
use std::hint::black_box;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::{Duration, Instant};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

/// splitmix64: a fixed stream, so every run sees the same pods.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }
}

const CARDS_PER_NODE: u32 = 8;
const GIB: u64 = 1024;

fn node_name(i: usize) -> String {
    format!("node-{i:05}")
}

fn node_info(i: usize) -> NodeInfo {
    let name = node_name(i);
    let kind = i % 3;
    let vendor_label = if kind == 0 { "nvidia" } else { "ppu" };
    let hyper = i / 8;
    let leaf = hyper / 4;
    let np = leaf / 40;
    let labels = BTreeMap::from([
        ("kubernetes.io/hostname".to_owned(), name.clone()),
        ("kubernetes.io/arch".to_owned(), "amd64".to_owned()),
        ("lj_runtimekit_enable".to_owned(), "true".to_owned()),
        ("accelerator/vendor".to_owned(), vendor_label.to_owned()),
        (
            "node.kubernetes.io/instance-type".to_owned(),
            ["gn8-h800", "gn8-810e", "gn8-m890p"][kind].to_owned(),
        ),
        (
            "runtimekit.aliyun.com/hypernode".to_owned(),
            format!("hn-{hyper}"),
        ),
        (
            "runtimekit.aliyun.com/leaf-switch".to_owned(),
            format!("leaf-{leaf}"),
        ),
        (
            "runtimekit.aliyun.com/network-pod".to_owned(),
            format!("np-{np}"),
        ),
    ]);
    let taints = if i % 50 == 7 {
        vec![Taint {
            key: "dedicated".into(),
            value: "infer".into(),
            effect: TaintEffect::NoSchedule,
        }]
    } else {
        Vec::new()
    };
    NodeInfo {
        name,
        labels,
        taints,
        allocatable: Resources {
            cpu_milli: 192_000,
            memory_bytes: 2 << 40,
            scalar: BTreeMap::new(),
        },
        max_pods: 250,
        ready: true,
        unschedulable: false,
        gpu_enabled: true,
        switches: Switches::default(),
        position: NetworkPosition {
            hyper_node: Some(format!("hn-{hyper}")),
            leaf_switch: Some(format!("leaf-{leaf}")),
            network_pod: Some(format!("np-{np}")),
        },
    }
}

fn devices(i: usize) -> (Vec<CardInfo>, Vec<NicInfo>) {
    let kind = i % 3;
    let cards = (0..CARDS_PER_NODE)
        .map(|c| {
            let (vendor, model, mem) = match kind {
                0 => (Vendor::Nvidia, "NVIDIA H800", 80),
                1 => (Vendor::Ppu, "PPU-810E", 96),
                _ => (Vendor::Ppu, "PPU-M890P", 96),
            };
            CardInfo {
                index: c,
                uuid: format!("GPU-{i:05}-{c}"),
                vendor,
                model: model.into(),
                memory_mib: mem * GIB,
                mig_enabled: kind == 0 && c >= 6,
                healthy: true,
                pcie_switch: Some(format!("sw{}", c / 2)),
                numa_node: Some(c / 4),
                socket: Some(c / 4),
                interconnect_group: (kind == 1).then(|| format!("g{}", c / 4)),
                nvlink_peers: if kind == 0 {
                    (0..CARDS_PER_NODE).filter(|&p| p != c).collect()
                } else {
                    Vec::new()
                },
                mig_instances: Vec::new(),
            }
        })
        .collect();
    let nics = (0..4)
        .map(|n| NicInfo {
            name: format!("mlx5_{n}"),
            pcie_switch: Some(format!("sw{n}")),
            numa_node: Some(n / 2),
            socket: Some(n / 2),
        })
        .collect();
    (cards, nics)
}

/// Node `i`: a third NVIDIA H800 (two cards in MIG mode, NVLink mesh), a third PPU 810E (two
/// interconnect groups of four), a third PPU M890P (four PCIe switches of two cards); every
/// node has four RDMA NICs, one per PCIe switch. Eight nodes per HyperNode, four HyperNodes
/// per leaf switch, forty leaf switches per network pod. One node in fifty is tainted.
fn build(cluster: &mut Cluster, nodes: usize) {
    for i in 0..nodes {
        cluster.upsert_node(node_info(i));
        let (cards, nics) = devices(i);
        cluster.set_devices(&node_name(i), &cards, &nics);
        cluster.set_agent_reporting(&node_name(i), true);
    }
}

fn pod(uid: u64, cards: CardRequest, rdma: bool) -> PodInput {
    PodInput {
        uid: format!("pod-{uid:08}"),
        containers: vec![ContainerRequest {
            container: "main".into(),
            cards,
            rdma,
        }],
        resources: Resources {
            cpu_milli: 2000,
            memory_bytes: 8 << 30,
            scalar: BTreeMap::new(),
        },
        ..PodInput::default()
    }
}

/// The mixed stream: 40 % TDM, 20 % MIG, 30 % one whole card, 10 % several cards.
fn next_pod(rng: &mut Rng, uid: u64) -> PodInput {
    let r = rng.below(100);
    let whole = |n, name| CardRequest::Whole { cards: n, name };
    let mut p = if r < 40 {
        let memory_only = rng.below(10) == 0;
        pod(
            uid,
            CardRequest::Tdm {
                cards: 1,
                core: (!memory_only).then(|| rng.pick(&[10, 20, 25, 30, 50])),
                memory_mib: Some(rng.pick(&[4, 8, 16]) * GIB),
            },
            false,
        )
    } else if r < 60 {
        pod(
            uid,
            CardRequest::Mig {
                cards: 1,
                slices: rng.pick(&[1, 1, 2, 3]),
                memory_mib: None,
            },
            false,
        )
    } else if r < 90 {
        let name = if rng.below(5) == 0 {
            WholeCardName::Nvidia
        } else {
            WholeCardName::AnyVendor
        };
        pod(uid, whole(1, name), rng.below(10) == 0)
    } else {
        match rng.below(20) {
            0..=6 => pod(uid, whole(2, WholeCardName::AnyVendor), false),
            7..=12 => pod(uid, whole(4, WholeCardName::AnyVendor), false),
            13..=14 => pod(uid, whole(8, WholeCardName::AnyVendor), false),
            15..=16 => pod(uid, whole(4, WholeCardName::AnyVendor), true),
            _ => pod(
                uid,
                CardRequest::Tdm {
                    cards: 2,
                    core: Some(rng.pick(&[25, 50])),
                    memory_mib: Some(16 * GIB),
                },
                false,
            ),
        }
    };
    if rng.below(10) == 0 {
        p.node_selector
            .insert("accelerator/vendor".into(), "ppu".into());
    }
    p
}

/// How full the cluster's cards are, tracked from committed decisions: a whole card counts
/// 1, a TDM card the larger of its core and memory fractions, a MIG card its memory slices.
#[derive(Default)]
struct Fill {
    cards: HashMap<(String, u32), (u32, u64, u32, bool)>,
    used: f64,
    total: f64,
}

impl Fill {
    fn add(&mut self, d: &Decision) {
        for c in &d.containers {
            for card in &c.cards {
                let e = self.cards.entry((d.node.clone(), card.index)).or_default();
                let before = Self::fraction(e);
                match &card.share {
                    Share::Whole => e.3 = true,
                    Share::Tdm { core, memory_mib } => {
                        e.0 += u32::from(core.unwrap_or(0));
                        e.1 += memory_mib.unwrap_or(0);
                    }
                    Share::Mig { profile, .. } => {
                        e.2 += match profile.as_str().split('g').next() {
                            Some("1") => 1,
                            Some("2") => 2,
                            Some("3" | "4") => 4,
                            _ => 8,
                        };
                    }
                }
                self.used += Self::fraction(e) - before;
            }
        }
    }

    fn fraction(e: &(u32, u64, u32, bool)) -> f64 {
        if e.3 {
            return 1.0;
        }
        let tdm = (f64::from(e.0) / 100.0).max(e.1 as f64 / (80.0 * GIB as f64));
        tdm.max(f64::from(e.2) / 8.0).min(1.0)
    }

    fn level(&self) -> f64 {
        self.used / self.total
    }
}

/// The kind of request, for the per-kind breakdown.
fn kind(p: &PodInput) -> &'static str {
    let c = &p.containers[0];
    let selected = !p.node_selector.is_empty();
    match (&c.cards, c.rdma, selected) {
        (_, _, true) => "with nodeSelector",
        (CardRequest::Tdm { cards: 1, .. }, _, _) => "TDM",
        (CardRequest::Tdm { .. }, _, _) => "TDM replica 2",
        (CardRequest::Mig { .. }, _, _) => "MIG",
        (CardRequest::Whole { cards: 1, .. }, false, _) => "1 whole card",
        (CardRequest::Whole { cards: 1, .. }, true, _) => "1 whole card + RDMA",
        (CardRequest::Whole { .. }, false, _) => "2-8 whole cards",
        (CardRequest::Whole { .. }, true, _) => "4 whole cards + RDMA",
    }
}

struct FillResult {
    kinds: BTreeMap<&'static str, (u64, u64, Duration)>,
    /// Per kind of update on the full cluster: how many, total time.
    updates: BTreeMap<&'static str, (u64, Duration)>,
    deciles: Vec<(u64, u64, Duration)>,
    reached: f64,
    bytes_built: isize,
    bytes_full: isize,
    pods: usize,
}

fn fill(nodes: usize) -> Result<FillResult, String> {
    let base = live();
    let mut cluster = Cluster::new(Settings::default());
    build(&mut cluster, nodes);
    let bytes_built = live() - base;
    let mut rng = Rng(0x5EED ^ nodes as u64);
    let mut fill = Fill {
        total: (nodes * CARDS_PER_NODE as usize) as f64,
        ..Fill::default()
    };
    // Per decile: decisions, failures, time spent deciding and committing.
    let mut deciles = vec![(0u64, 0u64, Duration::ZERO); 9];
    let mut kinds: BTreeMap<&'static str, (u64, u64, Duration)> = BTreeMap::new();
    let mut uid = 0u64;
    let mut failures_in_a_row = 0;
    while fill.level() < 0.9 && failures_in_a_row < 50_000 {
        let decile = ((fill.level() * 10.0) as usize).min(8);
        let p = next_pod(&mut rng, uid);
        uid += 1;
        let start = Instant::now();
        let result = cluster.decide(&p);
        let committed = result.as_ref().ok().map(|d| cluster.commit(d));
        let took = start.elapsed();
        let slot = &mut deciles[decile];
        slot.0 += 1;
        slot.2 += took;
        let by_kind = kinds.entry(kind(&p)).or_default();
        by_kind.0 += 1;
        by_kind.2 += took;
        match (result, committed) {
            (Ok(d), Some(Ok(()))) => {
                fill.add(&d);
                failures_in_a_row = 0;
            }
            (Err(e), _) => {
                black_box(e.to_string());
                slot.1 += 1;
                by_kind.1 += 1;
                failures_in_a_row += 1;
            }
            (Ok(d), _) => return Err(format!("a fresh decision failed to commit: {d:?}")),
        }
    }
    let updates = updates(&mut cluster, nodes, &mut rng);
    let pods = cluster.pod_count();
    // What dropping the engine frees is what it held, the bench's own bookkeeping aside.
    let before_drop = live();
    drop(cluster);
    let bytes_full = before_drop - live();
    Ok(FillResult {
        kinds,
        updates,
        deciles,
        reached: fill.level(),
        bytes_built,
        bytes_full,
        pods,
    })
}

/// Times the incremental updates on a full cluster: each touches one node or one pod, so its
/// cost must not grow with the cluster.
fn updates(
    cluster: &mut Cluster,
    nodes: usize,
    rng: &mut Rng,
) -> BTreeMap<&'static str, (u64, Duration)> {
    const ROUNDS: u64 = 2000;
    let mut out: BTreeMap<&'static str, (u64, Duration)> = BTreeMap::new();
    let mut time = |name, f: &mut dyn FnMut()| {
        let start = Instant::now();
        f();
        let e = out.entry(name).or_default();
        e.0 += 1;
        e.1 += start.elapsed();
    };
    // Shapes without an index behind them: every node is scored.
    let two_containers = PodInput {
        containers: vec![
            ContainerRequest {
                container: "a".into(),
                cards: CardRequest::Tdm {
                    cards: 1,
                    core: Some(10),
                    memory_mib: Some(4 * GIB),
                },
                rdma: false,
            },
            ContainerRequest {
                container: "b".into(),
                cards: CardRequest::Tdm {
                    cards: 1,
                    core: Some(10),
                    memory_mib: Some(4 * GIB),
                },
                rdma: false,
            },
        ],
        ..pod(
            u64::MAX,
            CardRequest::Whole {
                cards: 1,
                name: WholeCardName::AnyVendor,
            },
            false,
        )
    };
    let mig_pair = pod(
        u64::MAX - 1,
        CardRequest::Mig {
            cards: 2,
            slices: 1,
            memory_mib: None,
        },
        false,
    );
    for _ in 0..ROUNDS / 10 {
        time("decide, 2 GPU containers", &mut || {
            black_box(cluster.decide(&two_containers).is_ok());
        });
        time("decide, MIG on 2 cards", &mut || {
            black_box(cluster.decide(&mig_pair).is_ok());
        });
    }
    for round in 0..ROUNDS {
        let i = rng.below(nodes as u64) as usize;
        let name = node_name(i);
        let mut info = node_info(i);
        info.labels.insert("bench/round".into(), round.to_string());
        time("upsert_node (label change)", &mut || {
            cluster.upsert_node(info.clone())
        });
        let (cards, nics) = devices(i);
        time("set_devices (agent report)", &mut || {
            cluster.set_devices(&name, &cards, &nics)
        });
        let usage = Resources {
            cpu_milli: 500,
            ..Resources::default()
        };
        let uid = format!("other-{round}");
        time("upsert_pod_usage", &mut || {
            cluster.upsert_pod_usage(&uid, &name, &usage)
        });
        time("release", &mut || {
            cluster.release(&uid);
        });
        time("remove_node + re-add", &mut || {
            cluster.remove_node(&name);
            cluster.upsert_node(info.clone());
            cluster.set_devices(&name, &cards, &nics);
            cluster.set_agent_reporting(&name, true);
        });
    }
    out
}

/// Runs the fill `RUNS` times. The stream is fixed, so every run makes the same decisions and
/// only noise from other work on the machine differs: per decile, kind and update the fastest
/// run is kept (the engine's own cost), and per decile the median run too.
fn fill_runs(nodes: usize) -> Result<(FillResult, Vec<Duration>), String> {
    let mut runs = (0..RUNS)
        .map(|_| fill(nodes))
        .collect::<Result<Vec<_>, _>>()?;
    let best = |times: Vec<Duration>| times.into_iter().min().unwrap_or_default();
    let median = |mut times: Vec<Duration>| {
        times.sort();
        times[times.len() / 2]
    };
    let decile_times = |i: usize| runs.iter().map(|r| r.deciles[i].2).collect::<Vec<_>>();
    let medians = (0..runs[0].deciles.len())
        .map(|i| median(decile_times(i)))
        .collect();
    let deciles = (0..runs[0].deciles.len())
        .map(|i| {
            let (n, failed, _) = runs[0].deciles[i];
            (n, failed, best(decile_times(i)))
        })
        .collect();
    let kinds = runs[0]
        .kinds
        .iter()
        .map(|(&k, &(n, failed, _))| {
            (
                k,
                (n, failed, best(runs.iter().map(|r| r.kinds[k].2).collect())),
            )
        })
        .collect();
    let updates = runs[0]
        .updates
        .iter()
        .map(|(&k, &(n, _))| (k, (n, best(runs.iter().map(|r| r.updates[k].1).collect()))))
        .collect();
    let mut first = runs.swap_remove(0);
    first.deciles = deciles;
    first.kinds = kinds;
    first.updates = updates;
    Ok((first, medians))
}

const RUNS: usize = 5;

fn gang_member(gang: usize, i: usize) -> PodInput {
    PodInput {
        gang: Some(format!("gang-{gang}")),
        ..pod(
            (gang * 100_000 + i) as u64,
            CardRequest::Whole {
                cards: 1,
                name: WholeCardName::AnyVendor,
            },
            true,
        )
    }
}

type GangRow = (usize, String, usize, Duration, Duration);

fn gangs(nodes: usize) -> Result<Vec<GangRow>, String> {
    let mut cluster = Cluster::new(Settings::default());
    build(&mut cluster, nodes);
    // Background load: a third of the cards busy, spread over the cluster.
    let mut rng = Rng(7);
    let mut uid = 9_000_000u64;
    while uid < 9_000_000 + (nodes as u64 * CARDS_PER_NODE as u64) / 3 {
        let p = pod(
            uid,
            CardRequest::Whole {
                cards: 1,
                name: WholeCardName::AnyVendor,
            },
            false,
        );
        uid += 1;
        let mut p = p;
        p.node_selector.insert(
            "kubernetes.io/hostname".into(),
            format!("node-{:05}", rng.below(nodes as u64)),
        );
        if let Ok(d) = cluster.decide(&p) {
            let _ = cluster.commit(&d);
        }
    }
    let mut out = Vec::new();
    for (g, size) in [8usize, 128, 1024].into_iter().enumerate() {
        let members: Vec<PodInput> = (0..size).map(|i| gang_member(g, i)).collect();
        let constraint = GangConstraint::new(format!("gang-{g}"));
        let mut times = Vec::new();
        let mut decision = None;
        for _ in 0..5 {
            let start = Instant::now();
            let d = cluster.decide_gang(&members, &constraint);
            times.push(start.elapsed());
            decision = Some(d);
        }
        times.sort();
        let decision = decision
            .ok_or("no run")?
            .map_err(|e| format!("gang of {size} did not fit: {e}"))?;
        let start = Instant::now();
        cluster
            .reserve_gang(&decision)
            .map_err(|e| format!("reserve: {e}"))?;
        let reserve = start.elapsed();
        out.push((
            size,
            format!("{:?} {}", decision.tier, decision.group),
            decision.nodes.len(),
            times[times.len() / 2],
            reserve,
        ));
        cluster.release_gang(&constraint.name);
    }
    Ok(out)
}

fn main() -> Result<(), String> {
    let (small, small_medians) = fill_runs(500)?;
    let (large, large_medians) = fill_runs(5000)?;
    let gang = gangs(5000)?;

    println!("placement engine benchmark (one thread; fastest of {RUNS} runs, median in brackets)");
    println!();
    let mut slowest = Vec::new();
    for (nodes, r, medians) in [
        (500, &small, &small_medians),
        (5000, &large, &large_medians),
    ] {
        println!(
            "fill of {nodes} nodes x {CARDS_PER_NODE} cards, mixed stream (40% TDM, 20% MIG, 30% one whole card, 10% several cards)"
        );
        println!(
            "{:>8} {:>10} {:>10} {:>14} {:>12} {:>12}",
            "fill", "decisions", "failures", "decisions/s", "us/decision", "(median)"
        );
        let mut min = f64::MAX;
        let mut min_median = f64::MAX;
        for (i, (&(n, failed, t), median)) in r.deciles.iter().zip(medians).enumerate() {
            if n == 0 {
                continue;
            }
            let rate = n as f64 / t.as_secs_f64();
            let median_rate = n as f64 / median.as_secs_f64();
            min = min.min(rate);
            min_median = min_median.min(median_rate);
            println!(
                "{:>7}% {:>10} {:>10} {:>14.0} {:>12.2} {:>12}",
                format!("{}-{}", i * 10, i * 10 + 10),
                n,
                failed,
                rate,
                t.as_secs_f64() * 1e6 / n as f64,
                format!("({median_rate:.0})")
            );
        }
        println!(
            "reached {:.1}% full with {} pods; slowest decile {:.0} decisions/s ({:.0} median)",
            r.reached * 100.0,
            r.pods,
            min,
            min_median
        );
        println!(
            "{:>22} {:>10} {:>10} {:>12}",
            "request", "decisions", "failures", "us/decision"
        );
        for (k, &(n, failed, t)) in &r.kinds {
            println!(
                "{:>22} {:>10} {:>10} {:>12.2}",
                k,
                n,
                failed,
                t.as_secs_f64() * 1e6 / n as f64
            );
        }
        println!("{:>28} {:>10}", "on the full cluster", "us/call");
        for (k, &(n, t)) in &r.updates {
            println!("{:>28} {:>10.2}", k, t.as_secs_f64() * 1e6 / n as f64);
        }
        println!(
            "engine memory: {:.0} bytes/card built, {:.0} bytes/card at the end of the fill",
            r.bytes_built as f64 / (nodes as f64 * f64::from(CARDS_PER_NODE)),
            r.bytes_full as f64 / (nodes as f64 * f64::from(CARDS_PER_NODE)),
        );
        println!();
        slowest.push(min);
    }
    println!(
        "gangs on 5000 nodes in four tiers, one whole card + RDMA per member, a third of cards busy"
    );
    println!(
        "{:>8} {:>24} {:>7} {:>14} {:>12}",
        "members", "placed in", "nodes", "decide ms", "reserve ms"
    );
    for (size, placed, nodes, decide, reserve) in &gang {
        println!(
            "{:>8} {:>24} {:>7} {:>14.2} {:>12.2}",
            size,
            placed,
            nodes,
            decide.as_secs_f64() * 1e3,
            reserve.as_secs_f64() * 1e3
        );
    }
    let gang_1024 = gang
        .iter()
        .find(|g| g.0 == 1024)
        .map_or(f64::NAN, |g| g.3.as_secs_f64() * 1e3);
    let bytes_per_card = large.bytes_full as f64 / (5000.0 * f64::from(CARDS_PER_NODE));
    println!();
    println!(
        "{{\"decisions_per_sec_500\": {:.0}, \"decisions_per_sec_5000\": {:.0}, \"gang_1024_ms\": {:.2}, \"bytes_per_card\": {:.0}}}",
        slowest[0], slowest[1], gang_1024, bytes_per_card
    );
    Ok(())
}
