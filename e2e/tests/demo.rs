//! `./just demo` as a newcomer runs it (the same binary and code path, in a folder of its own):
//! it must bring up the whole product, place every example of the usage guide and say so, leave
//! a cluster that `kubectl gpu` answers about, start again when run a second time, and stop
//! with `down`, which leaves nothing running. Needs what the e2e suite needs (root, the node packages), and runs after it
//! (cargo runs test binaries one at a time), since one machine holds one real node.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const CLUSTER: &str = env!("CARGO_BIN_EXE_runtimekit-cluster");

fn cluster(dir: &Path, command: &str) -> Output {
    Command::new(CLUSTER)
        .args([command, "--dir"])
        .arg(dir)
        .current_dir(runtimekit_e2e::tools::repo_root())
        .output()
        .expect("runtimekit-cluster runs")
}

/// Stops the demo cluster when the test ends, passed or not.
struct Down(PathBuf);

impl Drop for Down {
    fn drop(&mut self) {
        let _ = runtimekit_e2e::cluster::stop_recorded(&self.0);
    }
}

/// Runs `kubectl ARGS` as the demo's closing words say to: its bin folder first on PATH (so
/// `kubectl gpu` is found as a plugin), its kubeconfig.
fn kubectl(dir: &Path, args: &[&str]) -> String {
    let bin = dir.join("bin");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let output = Command::new(bin.join("kubectl"))
        .env("PATH", path)
        .env("KUBECONFIG", dir.join("kubeconfig"))
        .args(args)
        .current_dir(runtimekit_e2e::tools::repo_root())
        .output()
        .expect("kubectl runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "kubectl {args:?}: {}{stdout}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// The seconds the demo says it took until every example was placed.
fn ready_after(stdout: &str) -> Option<f64> {
    stdout
        .split("is ready (")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|s| s.parse().ok())
}

fn run_demo(dir: &Path) -> String {
    let output = cluster(dir, "demo");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "the demo failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

#[test]
fn the_demo_runs_the_whole_product_and_leaves_a_cluster_to_use() {
    // A short folder: the real node's unix sockets live under it (107 bytes at most), and CI's
    // checkout may be deep.
    let dir = std::env::temp_dir().join("runtimekit-demo-test");
    let _down = Down(dir.clone());
    let first = run_demo(&dir);

    // Every example applied and explained; the time-division pods on the real node, where the
    // container showed what it was given; the exporter's lines; the closing words.
    let seeds = runtimekit_e2e::tools::repo_root().join("contract/tests/seeds");
    let examples = runtimekit_e2e::demo::examples::read(&seeds).unwrap();
    for example in &examples {
        assert!(
            first.contains(&format!("{} created", example.name)),
            "{}:\n{first}",
            example.name
        );
        assert!(
            first.contains(&format!("# {}", example.file)),
            "{}:\n{first}",
            example.file
        );
    }
    for expected in [
        "Pod default/tdm-demo runs on node real-node, under networkpod-pod-a/leafswitch-leaf-a1/hypernode-hn-a1",
        "a time-division share (50% 4Gi)",
        "the MIG instance 3g.20gb",
        "Its RDMA NICs, the nearest to its cards",
        // The PPU examples, with the vendor selector, show the picks section 4.1 is about.
        "Pod default/ppu-810e-demo runs on node ppu810e-",
        ") are all of interconnect group ppu-group-",
        "Pod default/ppu-m890p-rdma-demo runs on node ppu890p-",
        "every card shares its switch with a NIC",
        "It is a member of gang gang-nccl-test (7 of 7 bound",
        "RUNTIMEKIT_GPU_CORE_LIMIT=50",
        "RUNTIMEKIT_GPU_MEMORY_LIMIT_MIB=4096",
        "preloaded: /usr/local/lib/runtimekit/libruntimekit_isolation.so",
        "DCGM_FI_CONTAINER_FB_LIMIT{",
        "DCGM_FI_HEALTH_WATCH_OVERALL{",
        "gpuslice.runtimekit.aliyun.com/tdm-demo-",
        "ganggroup.runtimekit.aliyun.com/gang-nccl-test",
        "topologygroup.runtimekit.aliyun.com/networkpod-pod-b",
        &format!("export KUBECONFIG={}", dir.join("kubeconfig").display()),
        "kubectl gpu nodes",
        "kubectl gpu explain gang-nccl-test-worker-0-",
        "kubectl gpu fit -f contract/tests/seeds/3.3-mig.yaml",
        "Stop it with: ./just down",
    ] {
        assert!(first.contains(expected), "{expected} in:\n{first}");
    }
    // kubectl's listings print no empty cell as a template's placeholder.
    assert!(!first.contains("<no value>"), "{first}");

    // The README's quick start shows what the demo prints: its steps and closing words.
    let readme =
        std::fs::read_to_string(runtimekit_e2e::tools::repo_root().join("README.md")).unwrap();
    let closing = [
        "Use it from this shell:",
        "Three commands worth trying next:",
        "Stop it with: ./just down",
    ];
    let step =
        |l: &str| l.starts_with('[') && l.split_once("] ").is_some_and(|(n, _)| n.contains('/'));
    let shown: Vec<&str> = readme
        .lines()
        .filter(|l| step(l) || closing.contains(l))
        // A step's time differs run to run.
        .map(|l| {
            l.rsplit_once(" (")
                .filter(|_| step(l))
                .map_or(l, |(title, _)| title)
        })
        .collect();
    assert!(
        shown.len() >= 11,
        "the README shows the demo's steps and closing: {shown:?}"
    );
    for line in shown {
        assert!(first.contains(line), "the README's {line:?} in:\n{first}");
    }

    // The closing words' commands work against the cluster left running.
    let nodes = kubectl(&dir, &["gpu", "nodes"]);
    for model in [
        "NVIDIA H800",
        "NVIDIA A100-SXM4-40GB",
        "AMD Instinct MI300X",
        "PPU-810E",
        "PPU-M890P",
    ] {
        assert!(nodes.contains(model), "{model} in:\n{nodes}");
    }
    assert!(
        nodes.contains("networkpod-pod-b/leafswitch-leaf-b2/hypernode-hn-b2"),
        "{nodes}"
    );
    let pods = kubectl(&dir, &["gpu", "pods", "-A"]);
    for example in examples.iter().filter(|e| e.kind == "Pod") {
        assert!(pods.contains(&example.name), "{} in:\n{pods}", example.name);
    }
    // kwok keeps the gang's Job pods running here: every member holds its card.
    let members = pods
        .lines()
        .filter(|l| l.contains("gang-nccl-test-worker-"))
        .count();
    assert_eq!(members, 7, "{pods}");
    let member = first
        .split("kubectl gpu explain ")
        .last()
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap()
        .to_owned();
    let explained = kubectl(&dir, &["gpu", "explain", &member]);
    assert!(
        explained.contains("member of gang gang-nccl-test"),
        "{explained}"
    );
    let fit = kubectl(
        &dir,
        &["gpu", "fit", "-f", "contract/tests/seeds/3.3-mig.yaml"],
    );
    assert!(
        fit.contains("would land on node") && fit.contains("Nothing was created"),
        "{fit}"
    );
    // The per-node TDM switch the demo used while placing is off again.
    let labels = kubectl(
        &dir,
        &[
            "get",
            "nodes",
            "-L",
            "aliyun.com/tdm-enabled",
            "--no-headers",
        ],
    );
    assert!(!labels.contains("false"), "{labels}");

    // A second run, with everything built, starts the cluster afresh.
    let second = run_demo(&dir);
    let (Some(first), Some(second)) = (ready_after(&first), ready_after(&second)) else {
        unreachable!("the demo says when it was ready:\n{first}\n{second}");
    };
    println!(
        "the demo: {first:.0} s, then {second:.0} s on a second run (until every example was placed)"
    );

    // `down` stops every process the demo recorded and removes the simulated nodes' folder.
    let recorded = std::fs::read_to_string(dir.join("pids")).unwrap();
    let simulated = std::fs::read_link(dir.join("simulated")).unwrap();
    let down = cluster(&dir, "down");
    assert!(down.status.success(), "{down:?}");
    assert!(!dir.join("pids").exists(), "down leaves no PID file");
    assert!(!simulated.exists(), "{} is left", simulated.display());
    for line in recorded.lines() {
        let pid = line.split(' ').nth(1).unwrap();
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
        let program = line.splitn(3, ' ').nth(2).unwrap();
        assert!(
            exe.is_none_or(|e| !e.to_string_lossy().starts_with(program)),
            "{line} still runs after down"
        );
    }
}
