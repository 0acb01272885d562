//! `just bench-exporter`: the exporter on a node of 8 cards with 32 TDM slices each (256
//! containers, one process each): how long a scrape takes, what the collector costs at its
//! 10 s interval, and the process's memory. Prints a table, then one JSON line with
//! `scrape_p99_ms`, `collector_cpu_percent` and `rss_mib`.
//!
//! The simulated resource layer serves in the same process (on its own runtime), so the CPU
//! and memory figures include it: an upper bound of the agent's share.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use runtimekit_crds::SliceMode;
use runtimekit_node_agent::exporter::collect::Collector;
use runtimekit_node_agent::exporter::{Exporter, Snapshot, serve};
use runtimekit_node_agent::model::{Inventory, NodeState, SliceInfo};
use runtimekit_proto::resource::v1alpha1::resource_layer_client::ResourceLayerClient;
use runtimekit_resource_layer::instances::{CreateRequest, ShareSpec};
use runtimekit_resource_layer::{Backend, ServeOptions, SimOptions, SimulatedBackend};
use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CARDS: u32 = 8;
const SLICES_PER_CARD: u32 = 32;
const SAMPLES: u32 = 200;
const SCRAPES: usize = 2_000;
const INTERVAL: Duration = Duration::from_secs(10);

/// This process's CPU time (user and system), from `/proc/self/stat`.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    ticks as f64 / 100.0
}

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: f64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap();
    kib / 1024.0
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index]
}

fn main() {
    let dir = std::env::temp_dir().join(format!("bench-exporter-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // h800-8 with every card out of MIG mode, so each takes TDM slices.
    let shipped = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("resource-layer/profiles/h800-8.yaml"),
    )
    .unwrap();
    let profile = dir.join("h800-8-tdm.yaml");
    std::fs::write(&profile, shipped.replace(", mig_enabled: true", "")).unwrap();
    let backend = SimulatedBackend::from_profile(
        profile.to_str().unwrap(),
        SimOptions {
            node_name: "bench".into(),
            ..SimOptions::default()
        },
    )
    .unwrap();
    let mut slices = Vec::new();
    for card in 0..CARDS {
        for k in 0..SLICES_PER_CARD {
            let name = format!("s-{card}-{k}");
            backend
                .create_instance(CreateRequest {
                    key: format!("bench/{name}"),
                    device_index: card,
                    device_uuid: None,
                    spec: ShareSpec::Tdm {
                        core_percent: 3,
                        memory_mib: 2_048,
                    },
                })
                .unwrap();
            slices.push(SliceInfo {
                namespace: "bench".into(),
                name: name.clone(),
                card,
                card_uuid: String::new(),
                mode: SliceMode::Tdm,
                core: Some(3),
                memory_mib: Some(2_048),
                slices: None,
                mig_profile: None,
                mig_start: None,
                pod_uid: format!("0000{card:04x}-0000-4000-8000-{k:012x}"),
                pod_namespace: "bench".into(),
                pod_name: format!("pod-{name}"),
                container: "app".into(),
                phase: None,
                deleting: false,
                created: None,
            });
        }
    }
    // Each process's cgroup names its slice's pod.
    let proc_root = dir.join("proc");
    let metrics = backend.device_metrics(&[], true).unwrap();
    for process in metrics.devices.iter().flat_map(|m| &m.processes) {
        let Some(slice) = slices
            .iter()
            .find(|s| format!("{}/{}", s.namespace, s.name) == process.instance_key)
        else {
            continue;
        };
        let pid_dir = proc_root.join(process.pid.to_string());
        std::fs::create_dir_all(&pid_dir).unwrap();
        std::fs::write(
            pid_dir.join("cgroup"),
            format!("0::/kubepods/besteffort/pod{}/c0ffee\n", slice.pod_uid),
        )
        .unwrap();
    }
    let mut inventory = Inventory::default();
    inventory.merge(backend.list_devices(&[]).unwrap(), &[]);
    let state = NodeState {
        inventory: Some(inventory),
        slices,
        ..NodeState::default()
    };

    // The resource layer on a runtime of its own; the agent's side on another.
    let server_runtime = tokio::runtime::Runtime::new().unwrap();
    let socket = dir.join("layer.sock");
    let backend: Arc<dyn Backend> = Arc::new(backend);
    let _server = server_runtime
        .block_on(runtimekit_resource_layer::serve(
            backend,
            &socket,
            ServeOptions::default(),
        ))
        .unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let _inside = runtime.enter();
    let (_state_tx, state_rx) = tokio::sync::watch::channel(state);
    let snapshot = Arc::new(Snapshot::default());
    let mut collector = Collector {
        node: "bench".into(),
        driver_version: "550.90.07".into(),
        layer: ResourceLayerClient::new(runtimekit_resource_layer::connect_lazy(&socket)),
        state: state_rx,
        snapshot: snapshot.clone(),
        interval: INTERVAL,
        proc_root,
    };
    runtime.block_on(collector.sample());
    let cpu_before = cpu_seconds();
    let started = Instant::now();
    for _ in 0..SAMPLES {
        runtime.block_on(collector.sample());
    }
    let sample_wall = started.elapsed().as_secs_f64() / f64::from(SAMPLES);
    let sample_cpu = (cpu_seconds() - cpu_before) / f64::from(SAMPLES);
    let collector_cpu_percent = sample_cpu / INTERVAL.as_secs_f64() * 100.0;

    let exporter = Arc::new(Exporter::new(snapshot));
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let address = listener.local_addr().unwrap();
    runtime.spawn(serve(listener, exporter));
    let mut latencies = Vec::with_capacity(SCRAPES);
    let mut size = 0;
    let mut series = 0;
    for _ in 0..SCRAPES {
        let start = Instant::now();
        let mut stream = std::net::TcpStream::connect(address).unwrap();
        write!(stream, "GET /metrics HTTP/1.0\r\nHost: {address}\r\n\r\n").unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        latencies.push(start.elapsed().as_secs_f64() * 1000.0);
        size = response.len();
        series = response
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty() && l.contains('{'))
            .count();
    }
    latencies.sort_by(f64::total_cmp);
    let (p50, p99) = (percentile(&latencies, 0.5), percentile(&latencies, 0.99));
    let rss = rss_mib();

    println!(
        "exporter: {CARDS} cards x {SLICES_PER_CARD} TDM slices ({} containers), {series} series, {} KiB per scrape",
        CARDS * SLICES_PER_CARD,
        size / 1024
    );
    println!("| figure | value | target |");
    println!("| --- | --- | --- |");
    println!("| scrape p50 | {p50:.2} ms | |");
    println!("| scrape p99 | {p99:.2} ms | at most 5 ms |");
    println!("| one sample (wall) | {:.2} ms | |", sample_wall * 1000.0);
    println!(
        "| one sample (CPU, with the in-process resource layer) | {:.2} ms | |",
        sample_cpu * 1000.0
    );
    println!(
        "| collector CPU at a 10 s interval | {collector_cpu_percent:.3} % of one core | at most 1 % |"
    );
    println!(
        "| process RSS (with the in-process resource layer) | {rss:.1} MiB | well under dcgm-exporter's ~150 MiB |"
    );
    println!(
        "{}",
        serde_json::json!({
            "scrape_p99_ms": (p99 * 100.0).round() / 100.0,
            "scrape_p50_ms": (p50 * 100.0).round() / 100.0,
            "collector_cpu_percent": (collector_cpu_percent * 1000.0).round() / 1000.0,
            "sample_wall_ms": (sample_wall * 100_000.0).round() / 100.0,
            "rss_mib": (rss * 10.0).round() / 10.0,
            "series": series,
            "containers": CARDS * SLICES_PER_CARD,
        })
    );
    drop(server_runtime);
    let _ = std::fs::remove_dir_all(&dir);
}
