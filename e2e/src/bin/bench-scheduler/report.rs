//! The tables `just bench-scheduler` prints, one per part, and its closing JSON line.

use crate::dra::Dra;
use crate::measure::{Processes, Run, cpu_of, median};
use crate::objects::ObjectCost;
use crate::peer::{self, Comparison};
use crate::scale::{GangTime, Scale};
use crate::{CONCURRENCY, STEADY_RATE};
use runtimekit_e2e::load::CARDS;
use serde_json::json;

/// Everything one benchmark run measured.
pub struct Results<'a> {
    pub nodes: usize,
    pub pods: usize,
    pub processes: &'a Processes,
    /// One drain per pair, in pair order.
    pub backlog_kube: Vec<Run>,
    pub backlog_ours: Vec<Run>,
    /// Part 2's floor: the apiserver's CPU per create of one more object.
    pub objects: Vec<ObjectCost>,
    pub kube: Run,
    pub ours: Run,
    pub tdm: Run,
    pub steady: Vec<Run>,
    pub ceiling: Run,
    pub ours_rss: f64,
    pub kube_rss: f64,
    pub comparison: Comparison,
    pub scale: Scale,
    pub dra: Dra,
}

/// The apiserver's CPU milliseconds per pod of a run.
fn apiserver_ms_per_pod(run: &Run) -> f64 {
    cpu_of(&run.cpu, "kube-apiserver") * 1000.0 / run.pods.max(1) as f64
}

/// A process's CPU milliseconds per pod of a run.
fn ms_per_pod(run: &Run, process: &str) -> f64 {
    cpu_of(&run.cpu, process) * 1000.0 / run.pods.max(1) as f64
}

pub fn print(results: &Results) {
    let Results {
        nodes,
        pods,
        processes,
        backlog_kube,
        backlog_ours,
        objects,
        kube,
        ours,
        tdm,
        steady,
        ceiling,
        ours_rss,
        kube_rss,
        comparison,
        scale,
        dra,
    } = results;
    println!(
        "\nscheduler benchmark: {nodes} kwok nodes x {CARDS} cards, {pods} pods per run, 2 cores shared with the control plane\n"
    );
    print_backlog(*pods, backlog_kube, backlog_ours);
    print_objects(objects, backlog_kube);
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
    ] {
        println!(
            "| {name} | {} | {:.0} | {:.0} | {:.0} | {:.0} |",
            run.pods, run.pods_per_sec, run.created_per_sec, run.p50_ms, run.p99_ms
        );
    }
    for (i, run) in steady.iter().enumerate() {
        println!(
            "| ours, steady {STEADY_RATE}/s, run {} | {} | {:.0} | {:.0} | {:.0} | {:.0} |",
            i + 1,
            run.pods,
            run.pods_per_sec,
            run.created_per_sec,
            run.p50_ms,
            run.p99_ms
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
    let drains = backlog_kube
        .iter()
        .enumerate()
        .map(|(i, run)| (format!("kube-scheduler backlog, pair {}", i + 1), run))
        .chain(
            backlog_ours
                .iter()
                .enumerate()
                .map(|(i, run)| (format!("ours backlog, pair {}", i + 1), run)),
        );
    let bursts = [
        ("kube-scheduler burst", kube),
        ("ours burst", ours),
        ("ours TDM burst", tdm),
    ];
    let all = bursts
        .into_iter()
        .map(|(n, r)| (n.to_owned(), r))
        .chain(drains);
    for (name, run) in all {
        let cells: Vec<String> = names
            .iter()
            .map(|n| format!("{:.1}", cpu_of(&run.cpu, n)))
            .collect();
        println!("| {name} | {} |", cells.join(" | "));
    }
    println!(
        "\n| process | peak RSS MiB |\n| --- | --- |\n| ours | {ours_rss:.1} |\n| kube-scheduler | {kube_rss:.1} |\n"
    );
    print_peer(comparison);
    print_scale(scale);
    crate::dra::print(dra);
    let peer_name = peer::name();
    let steady_p99 = steady.iter().map(|r| r.p99_ms).fold(0.0, f64::max);
    let gang_512 = scale
        .gangs
        .iter()
        .find(|(size, _)| *size == 512)
        .and_then(|(_, times)| times.first().copied().flatten())
        .map(|t| t.bound);
    let pairs = Pair::all(backlog_kube, backlog_ours);
    let mut report = json!({
        "backlog_ours_pods_per_sec": round(median(backlog_ours.iter().map(|r| r.pods_per_sec))),
        "backlog_kube_scheduler_pods_per_sec": round(median(backlog_kube.iter().map(|r| r.pods_per_sec))),
        "backlog_ratio": round2(median(pairs.iter().map(|p| p.pods_per_sec))),
        "apiserver_cpu_ms_per_pod_ours": round2(settled_median(backlog_ours)),
        "apiserver_cpu_ms_per_pod_kube_scheduler": round2(settled_median(backlog_kube)),
        "apiserver_ratio": round2(median(pairs.iter().map(|p| p.apiserver))),
        "apiserver_cpu_ms_per_pod_at_last_bind_ours": round2(median(backlog_ours.iter().map(apiserver_ms_per_pod))),
        "apiserver_cpu_ms_per_pod_at_last_bind_kube_scheduler": round2(median(backlog_kube.iter().map(apiserver_ms_per_pod))),
        "apiserver_ratio_at_last_bind": round2(median(pairs.iter().map(|p| p.apiserver_at_last_bind))),
        "apiserver_cpu_ms_per_create": objects.iter().map(|o| (o.key.to_owned(), json!(round2(o.ms_per_create)))).collect::<serde_json::Map<_, _>>(),
        "backlog_pairs": pairs.iter().map(|p| json!({"ratio": round2(p.pods_per_sec), "apiserver_ratio": round2(p.apiserver), "apiserver_ratio_at_last_bind": round2(p.apiserver_at_last_bind)})).collect::<Vec<_>>(),
        "p99_create_to_bound_ms": round(steady_p99),
        "p99_create_to_bound_ms_runs": steady.iter().map(|r| round(r.p99_ms)).collect::<Vec<_>>(),
        "ours_rss_mib": round2(*ours_rss),
        "kube_scheduler_rss_mib": round2(*kube_rss),
        "nodes": scale.nodes.max(*nodes),
        "gang_512_bound_s": gang_512.map(round2),
        "peer_name": peer_name,
        "peer_tdm_pods_per_sec": round(comparison.tdm_peer.pods_per_sec),
        "ours_tdm_pods_per_sec": round(comparison.tdm_ours.pods_per_sec),
        "scale_pods_bound": scale.bound,
        "scale_pods_created": scale.created,
        "scale_jobsets": scale.gangs.iter().map(|(_, t)| t.len()).sum::<usize>(),
        "scale_jobsets_bound": scale.gangs.iter().map(|(_, t)| t.iter().flatten().count()).sum::<usize>(),
        "peer_gangs_pods_per_sec": round(comparison.gangs_peer.pods_per_sec),
        "ours_gangs_pods_per_sec": round(comparison.gangs_ours.pods_per_sec),
        "burst_ours_pods_per_sec": round(ours.pods_per_sec),
        "burst_kube_scheduler_pods_per_sec": round(kube.pods_per_sec),
        "burst_ours_tdm_pods_per_sec": round(tdm.pods_per_sec),
        "binding_ceiling_pods_per_sec": round(ceiling.pods_per_sec),
    });
    if let (Some(report), serde_json::Value::Object(dra)) =
        (report.as_object_mut(), crate::dra::json(dra))
    {
        report.extend(dra);
    }
    println!("{report}");
}

/// A backlog's apiserver CPU milliseconds per pod until it settled; NaN for a run that is not
/// a backlog, so a ratio with it reads NaN rather than a number.
fn settled(run: &Run) -> f64 {
    run.apiserver_settled_ms.unwrap_or(f64::NAN)
}

/// The median of the backlogs' apiserver CPU milliseconds per pod until settled.
fn settled_median(runs: &[Run]) -> f64 {
    median(runs.iter().filter_map(|r| r.apiserver_settled_ms))
}

/// Ours against kube-scheduler in one pair of backlog drains.
struct Pair {
    /// Bound pods per second, ours over kube-scheduler's.
    pods_per_sec: f64,
    /// Apiserver CPU per bound pod until settled, ours over kube-scheduler's.
    apiserver: f64,
    /// The same, counted only until each side's last binding.
    apiserver_at_last_bind: f64,
}

impl Pair {
    /// The pairs both schedulers drained.
    fn all(kube: &[Run], ours: &[Run]) -> Vec<Pair> {
        kube.iter()
            .zip(ours)
            .map(|(kube, ours)| Pair {
                pods_per_sec: ours.pods_per_sec / kube.pods_per_sec,
                apiserver: settled(ours) / settled(kube),
                apiserver_at_last_bind: apiserver_ms_per_pod(ours) / apiserver_ms_per_pod(kube),
            })
            .collect()
    }
}

/// Part 1's table: each pair of drains, the medians, and the ratios pair by pair.
fn print_backlog(pods: usize, kube: &[Run], ours: &[Run]) {
    println!(
        "Backlog drain: {pods} whole-card pods created while no scheduler ran, then the scheduler started; timed from its start until every pod was bound. The drains run in pairs, which scheduler goes first alternating; the figures are the medians. The apiserver's CPU is counted until the run settled (every pod Running, every Scheduled Event written) and, as before, until the last binding.\n"
    );
    println!(
        "| pair | scheduler | bound pods/s | scheduler CPU s | kube-apiserver CPU s | apiserver CPU ms per pod until settled | apiserver CPU ms per pod, at the last bind |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    let sides = [
        ("kube-scheduler", kube, "kube-scheduler"),
        ("ours", ours, "runtimekit-operator"),
    ];
    for (pair, i) in (1..).zip(0..kube.len().max(ours.len())) {
        for (name, runs, process) in sides {
            if let Some(run) = runs.get(i) {
                println!(
                    "| {pair} | {name} | {:.0} | {:.1} | {:.1} | {:.2} | {:.2} |",
                    run.pods_per_sec,
                    cpu_of(&run.cpu, process),
                    cpu_of(&run.cpu, "kube-apiserver"),
                    settled(run),
                    apiserver_ms_per_pod(run)
                );
            }
        }
    }
    for (name, runs, process) in sides {
        println!(
            "| median | {name} | {:.0} | {:.1} | {:.1} | {:.2} | {:.2} |",
            median(runs.iter().map(|r| r.pods_per_sec)),
            median(runs.iter().map(|r| cpu_of(&r.cpu, process))),
            median(runs.iter().map(|r| cpu_of(&r.cpu, "kube-apiserver"))),
            settled_median(runs),
            median(runs.iter().map(apiserver_ms_per_pod))
        );
    }
    let pairs = Pair::all(kube, ours);
    let listed = |of: fn(&Pair) -> f64| {
        let each: Vec<String> = pairs.iter().map(|p| format!("{:.2}x", of(p))).collect();
        format!(
            "{:.2}x (pairs: {})",
            median(pairs.iter().map(of)),
            each.join(", ")
        )
    };
    println!(
        "\nOurs against kube-scheduler, median of the pairs: bound pods/s {}; apiserver CPU per pod until settled {}; until the last bind {}.",
        listed(|p| p.pods_per_sec),
        listed(|p| p.apiserver),
        listed(|p| p.apiserver_at_last_bind)
    );
}

/// Part 2's floor: each kind's create against kube-scheduler's whole cost per pod, and what a
/// ratio of 1.1 would leave for everything ours adds.
fn print_objects(objects: &[ObjectCost], kube: &[Run]) {
    if objects.is_empty() {
        return;
    }
    let base = settled_median(kube);
    println!(
        "\nWhat one object more per pod costs this apiserver: each kind created {} times into its own namespace with one JSON watch open on it (as an informer holds), the apiserver's CPU counted until the watch had seen the last. kube-scheduler's backlog costs the apiserver {base:.2} ms per pod until settled (median above): a ratio of 1.1 leaves {:.2} ms per pod for all that ours adds.\n",
        objects[0].creates,
        base * 0.1
    );
    println!("| object | apiserver CPU ms per create | against kube-scheduler's ms per pod |");
    println!("| --- | --- | --- |");
    for object in objects {
        println!(
            "| {} | {:.2} | {:+.0} % |",
            object.kind,
            object.ms_per_create,
            object.ms_per_create / base * 100.0
        );
    }
}

/// Part 4's table: ours and the peer on the same pods.
fn print_peer(c: &Comparison) {
    println!(
        "\nGPU-sharing peer: {}, on the same nodes (its device plugin's node reports written by the benchmark). Backlogs are timed from the scheduler's start until every pod is bound; the steady stream is {STEADY_RATE} pods/s.\n",
        peer::name()
    );
    println!(
        "| run | scheduler | bound pods/s | p50 ms | p99 ms | scheduler CPU ms per pod | apiserver CPU ms per pod | apiserver CPU ms per pod, backlog until settled |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    for (name, run, process) in [
        (
            "TDM backlog (core 25 %, 4 GiB)",
            &c.tdm_ours,
            "runtimekit-operator",
        ),
        ("TDM backlog (core 25 %, 4 GiB)", &c.tdm_peer, peer::PROCESS),
        ("TDM steady", &c.steady_ours, "runtimekit-operator"),
        ("TDM steady", &c.steady_peer, peer::PROCESS),
        (
            "gangs of whole cards, backlog",
            &c.gangs_ours,
            "runtimekit-operator",
        ),
        (
            "gangs of whole cards, backlog",
            &c.gangs_peer,
            peer::PROCESS,
        ),
    ] {
        let who = if process == peer::PROCESS {
            "peer"
        } else {
            "ours"
        };
        println!(
            "| {name} | {who} | {:.0} | {:.0} | {:.0} | {:.2} | {:.2} | {} |",
            run.pods_per_sec,
            run.p50_ms,
            run.p99_ms,
            ms_per_pod(run, process),
            apiserver_ms_per_pod(run),
            run.apiserver_settled_ms
                .map_or_else(|| "-".to_owned(), |ms| format!("{ms:.2}"))
        );
    }
}

/// Part 3's table: the fill of the grown fleet and the JobSet gangs by size.
fn print_scale(s: &Scale) {
    println!(
        "\nScale: {} nodes x {CARDS} cards; the mixed stream (40 % TDM, 20 % MIG, 30 % one whole card, 10 % several) created until it asked for 90 % of the cards.\n",
        s.nodes
    );
    println!("| pods created | pods bound | cards' worth bound | bound pods/s |");
    println!("| --- | --- | --- | --- |");
    println!(
        "| {} | {} | {:.1} % | {:.0} |",
        s.created,
        s.bound,
        s.filled * 100.0,
        s.pods_per_sec
    );
    println!(
        "\nJobSet gangs, all created at once on the filled fleet: seconds from a JobSet's creation until all its members were bound, and until the Job controller had created them all (no scheduler binds a gang before).\n"
    );
    println!(
        "| members | JobSets | all bound | median s | slowest s | median s, all created | median s, last created to all bound |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for (size, times) in &s.gangs {
        let done: Vec<GangTime> = times.iter().flatten().copied().collect();
        let median = |of: &dyn Fn(&GangTime) -> f64| median(done.iter().map(of));
        let slowest = done.iter().map(|t| t.bound).fold(f64::NAN, f64::max);
        println!(
            "| {size} | {} | {} | {:.1} | {slowest:.1} | {:.1} | {:.1} |",
            times.len(),
            done.len(),
            median(&|t| t.bound),
            median(&|t| t.created),
            median(&|t| t.bound - t.created),
        );
    }
}

fn round(x: f64) -> f64 {
    x.round()
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}
