//! `just bench-scheduler` in its smoke form (`BENCH_SMOKE`: 50 nodes grown to 80, a few hundred
//! pods per run, the Volcano peer, small JobSet gangs, DRA claims on 10 nodes), so the benchmark's code keeps working
//! between the runs that measure: every run completes, every table is printed and the last line
//! is the JSON object with every key the benchmark promises. No figure is judged
//! here; figures are read from the full run (`docs/benchmarks.md`).

use runtimekit_e2e::workspace_binary::workspace_binary;
use std::process::Command;

const KEYS: [&str; 17] = [
    "backlog_ours_pods_per_sec",
    "backlog_kube_scheduler_pods_per_sec",
    "backlog_ratio",
    "apiserver_cpu_ms_per_pod_ours",
    "apiserver_cpu_ms_per_pod_kube_scheduler",
    "p99_create_to_bound_ms",
    "ours_rss_mib",
    "kube_scheduler_rss_mib",
    "nodes",
    "gang_512_bound_s",
    "peer_name",
    "peer_tdm_pods_per_sec",
    "ours_tdm_pods_per_sec",
    "dra_kube_scheduler_pods_per_sec",
    "dra_ours_pods_per_sec",
    "dra_kube_scheduler_requests_per_pod",
    "dra_ours_requests_per_pod",
];

#[test]
fn the_scheduler_benchmark_runs_in_its_smoke_form() {
    // The benchmark starts the operator from beside itself.
    workspace_binary("runtimekit-operator", "runtimekit-operator").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_bench-scheduler"))
        .env("BENCH_SMOKE", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_str(stdout.lines().last().unwrap_or_default()).unwrap();
    for key in KEYS {
        assert!(report.get(key).is_some(), "{key} in {report}");
    }
    // Part 3 grows the 50 nodes of the other parts to 80.
    assert_eq!(report["nodes"], 80);
    assert_eq!(report["peer_name"], "volcano v1.10.0");
    assert_eq!(
        report["p99_create_to_bound_ms_runs"]
            .as_array()
            .map(Vec::len),
        Some(3),
        "{report}"
    );
    // The smoke form drains one pair of backlogs (the full benchmark three).
    assert_eq!(
        report["backlog_pairs"].as_array().map(Vec::len),
        Some(1),
        "{report}"
    );
    // The smoke fleet, filled to 90 %, places nearly all of the mixed stream (a pod of eight
    // cards that arrives late may find no free node) and every gang.
    let count = |key: &str| report[key].as_f64().unwrap_or(0.0);
    assert!(
        count("scale_pods_bound") >= 0.95 * count("scale_pods_created"),
        "{report}"
    );
    assert_eq!(report["scale_jobsets_bound"], report["scale_jobsets"]);
    for measured in [
        "backlog_ours_pods_per_sec",
        "backlog_kube_scheduler_pods_per_sec",
        "apiserver_cpu_ms_per_pod_ours",
        "apiserver_ratio",
        "ours_tdm_pods_per_sec",
        "peer_tdm_pods_per_sec",
        "ours_gangs_pods_per_sec",
        "peer_gangs_pods_per_sec",
        "scale_pods_bound",
        "scale_jobsets_bound",
        "dra_kube_scheduler_pods_per_sec",
        "dra_ours_pods_per_sec",
        "dra_kube_scheduler_requests_per_pod",
        "dra_ours_requests_per_pod",
    ] {
        assert!(
            report[measured].as_f64().is_some_and(|v| v > 0.0),
            "{measured} in {report}"
        );
    }
    // Part 2's floor prices each kind of object, none for free.
    for kind in ["gpuslice", "minimal_custom_resource", "configmap"] {
        assert!(
            report["apiserver_cpu_ms_per_create"][kind]
                .as_f64()
                .is_some_and(|v| v > 0.0),
            "{kind} in {report}"
        );
    }
    for table in [
        "Backlog drain",
        "What one object more per pod costs",
        "GPU-sharing peer",
        "Scale:",
        "JobSet gangs",
        "DRA:",
    ] {
        assert!(stdout.contains(table), "{table} in {stdout}");
    }
}
