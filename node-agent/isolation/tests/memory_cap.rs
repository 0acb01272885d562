//! The memory cap against the fake driver (`runtimekit-fake-cuda`, loaded as `libcuda.so.1`):
//! each test runs `runtimekit-cuda-probe` (or a C program linked with `-lcuda`) with the
//! isolation library preloaded and the environment `lj-runtime` sets, on a card of 16 GiB
//! capped at 4 GiB. Without the library the same programs get all 16 GiB, so every refusal
//! seen here is the library's.

use runtimekit_fake_nvml::{FakeNvml, World};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

const UUID: &str = "GPU-11111111-2222-3333-4444-555555555555";
const PATHS: [&str; 11] = [
    "alloc",
    "alloc-v1",
    "pitch",
    "managed",
    "async",
    "async-ptsz",
    "pool",
    "array",
    "array3d",
    "mipmapped",
    "vmm",
];
const VIAS: [&str; 3] = ["dlsym", "proc-address", "proc-address-v1"];

/// A folder with the fake driver as `libcuda.so.1` and the container's ledger folder, and a
/// fake NVML whose card 0 is the driver's device.
struct Node {
    dir: PathBuf,
    nvml: FakeNvml,
}

/// A library cargo built, beside the test binary (`target/<profile>/deps`) or one folder up.
fn built(file: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary");
    exe.ancestors()
        .skip(1)
        .take(2)
        .map(|dir| dir.join(file))
        .find(|p| p.exists())
        .expect("the library is built beside the test binary (a dev-dependency builds it)")
}

impl Node {
    fn new() -> Node {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "runtimekit-isolation-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(dir.join("ledger")).expect("folder");
        std::fs::create_dir_all(dir.join("measured")).expect("folder");
        std::os::unix::fs::symlink(
            built("libruntimekit_fake_cuda.so"),
            dir.join("libcuda.so.1"),
        )
        .expect("link");
        let mut world = World::h100(1);
        world.cards[0].uuid = UUID.into();
        world.cards[0].memory_used_mib = 10 * 1024;
        let nvml = FakeNvml::install(&world).expect("fake NVML");
        Node { dir, nvml }
    }

    /// `program` with the fake driver on the library path, and with the isolation library
    /// and the limits `memory_mib` (per card, as lj-runtime writes them) when given.
    fn command(&self, program: &Path, memory_mib: Option<&str>) -> Command {
        let mut command = Command::new(program);
        command
            .env(
                "LD_LIBRARY_PATH",
                format!("{}:{}", self.dir.display(), self.nvml.dir().display()),
            )
            .env("FAKE_CUDA_UUIDS", UUID)
            .env("FAKE_CUDA_MEMORY_MIB", "16384")
            .env_remove("LD_PRELOAD");
        if let Some(mib) = memory_mib {
            command
                .env("LD_PRELOAD", built("libruntimekit_isolation.so"))
                .env("RUNTIMEKIT_VISIBLE_DEVICES", UUID)
                .env("RUNTIMEKIT_GPU_MEMORY_LIMIT_MIB", mib)
                .env("RUNTIMEKIT_ISOLATION_DIR", self.dir.join("ledger"))
                .env("RUNTIMEKIT_MEASURED_DIR", self.dir.join("measured"));
        }
        command
    }

    /// Runs the probe with `args`, capped at 4 GiB unless `capped` is false.
    fn probe(&self, args: &[&str], capped: bool) -> Output {
        let probe = Path::new(env!("CARGO_BIN_EXE_runtimekit-cuda-probe"));
        let output = self
            .command(probe, capped.then_some("4096"))
            .args(args)
            .output()
            .expect("probe");
        assert!(
            output.status.success(),
            "probe {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        output
    }

    /// A probe holding `mib` MiB, once it says it holds them.
    fn holder(&self, mib: &str) -> Child {
        let probe = Path::new(env!("CARGO_BIN_EXE_runtimekit-cuda-probe"));
        let mut child = self
            .command(probe, Some("4096"))
            .args(["hold", "--mib", mib, "--seconds", "60"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("holder");
        let mut line = String::new();
        let stdout = child.stdout.as_mut().expect("stdout");
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).expect("read");
        assert!(line.starts_with("holding"), "the holder said {line:?}");
        child
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The result of each allocation the output lists: `ok` or `error <code>`.
fn results(output: &Output) -> Vec<String> {
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|l| l.split_once(": ").map(|(_, r)| r.to_owned()))
        .collect()
}

fn four_then_refused() -> Vec<String> {
    let mut expected = vec!["ok".to_owned(); 4];
    expected.push("error 2".into());
    expected
}

#[test]
fn every_path_reached_every_way_is_refused_exactly_past_the_cap() {
    let node = Node::new();
    for path in PATHS {
        let args = ["alloc", "--path", path, "--mib", "1024", "--count", "5"];
        let free = results(&node.probe(&args, false));
        assert_eq!(free, vec!["ok"; 5], "{path} without the library");
        for via in VIAS {
            let mut all = vec!["--via", via];
            all.extend(args);
            assert_eq!(
                results(&node.probe(&all, true)),
                four_then_refused(),
                "{path} through {via}"
            );
        }
    }
}

#[test]
fn the_cap_itself_fits_and_one_byte_more_does_not() {
    let node = Node::new();
    let at = node.probe(&["alloc", "--path", "alloc", "--mib", "4096"], true);
    assert_eq!(results(&at), ["ok"]);
    let past = node.probe(&["alloc", "--path", "alloc", "--mib", "4097"], true);
    assert_eq!(results(&past), ["error 2"]);
}

#[test]
fn memory_queries_report_the_cap_and_the_containers_own_use() {
    let node = Node::new();
    let gib = 1u64 << 30;
    let info = |capped| String::from_utf8_lossy(&node.probe(&["info"], capped).stdout).into_owned();
    assert_eq!(
        info(false).trim(),
        format!("free {0} total {0} device_total {0}", 16 * gib)
    );
    assert_eq!(
        info(true).trim(),
        format!("free {0} total {0} device_total {0}", 4 * gib)
    );
    let mut holder = node.holder("1024");
    assert_eq!(
        info(true).trim(),
        format!(
            "free {} total {} device_total {}",
            3 * gib,
            4 * gib,
            4 * gib
        )
    );
    holder.kill().expect("kill");
    holder.wait().expect("wait");
}

#[test]
fn nvml_reports_the_cap_and_the_containers_own_use() {
    let node = Node::new();
    let nvml =
        |capped| String::from_utf8_lossy(&node.probe(&["nvml-memory"], capped).stdout).into_owned();
    let mib = 1u64 << 20;
    let total = node.nvml.world().expect("world").cards[0].memory_total_mib * mib;
    let card = nvml(false);
    assert!(
        card.starts_with(&format!("total {total} used {}", 10 * 1024 * mib)),
        "{card}"
    );
    let mut holder = node.holder("1024");
    assert_eq!(
        nvml(true).trim(),
        format!(
            "total {} used {} free {}",
            4096 * mib,
            1024 * mib,
            3072 * mib
        )
    );
    holder.kill().expect("kill");
    holder.wait().expect("wait");
}

#[test]
fn the_containers_processes_share_the_cap_and_a_killed_one_leaves_it() {
    let node = Node::new();
    let mut holder = node.holder("3072");
    let alloc = |mib| results(&node.probe(&["alloc", "--path", "alloc", "--mib", mib], true));
    assert_eq!(alloc("2048"), ["error 2"], "3 GiB held elsewhere + 2 GiB");
    assert_eq!(alloc("1024"), ["ok"], "3 GiB held elsewhere + 1 GiB");
    // Killed without freeing: the driver took its memory back, so must the ledger.
    holder.kill().expect("kill");
    holder.wait().expect("wait");
    assert_eq!(alloc("4096"), ["ok"]);
}

#[test]
fn a_program_linked_with_lcuda_is_capped_too() {
    let node = Node::new();
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/direct_link.c");
    let program = node.dir.join("direct_link");
    let built = Command::new("cc")
        .arg(&source)
        .arg("-o")
        .arg(&program)
        .arg(format!("-L{}", node.dir.display()))
        .arg("-l:libcuda.so.1")
        .output()
        .expect("cc");
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let run = |capped: Option<&str>| node.command(&program, capped).output().expect("run");
    assert_eq!(results(&run(None)), vec!["ok"; 5]);
    assert_eq!(results(&run(Some("4096"))), four_then_refused());
}

#[test]
fn unreadable_limits_refuse_every_allocation_and_say_why() {
    let node = Node::new();
    let probe = Path::new(env!("CARGO_BIN_EXE_runtimekit-cuda-probe"));
    let output = node
        .command(probe, Some("4g"))
        .args(["alloc", "--path", "alloc", "--mib", "1"])
        .output()
        .expect("probe");
    assert_eq!(results(&output), ["error 2"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("limits cannot be read"), "{stderr}");
}

#[test]
fn a_card_without_a_memory_limit_is_not_capped() {
    let node = Node::new();
    let probe = Path::new(env!("CARGO_BIN_EXE_runtimekit-cuda-probe"));
    let output = node
        .command(probe, Some("0"))
        .args(["alloc", "--path", "alloc", "--mib", "1024", "--count", "5"])
        .output()
        .expect("probe");
    assert_eq!(results(&output), vec!["ok"; 5]);
}

#[test]
fn the_probe_needs_the_driver_and_says_so() {
    let output = Command::new(env!("CARGO_BIN_EXE_runtimekit-cuda-probe"))
        .args(["info"])
        .env("LD_LIBRARY_PATH", "/nonexistent")
        .env_remove("LD_PRELOAD")
        .output()
        .expect("run");
    if output.status.success() {
        // A machine with the NVIDIA driver installed.
        return;
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("cannot load libcuda.so.1"), "{stderr}");
}

/// Launches in the last second of a probe with compute cap `core` launching for `seconds`,
/// while `shares` (when given) is written into the measurements folder anew every 60 ms with the next
/// measurement number.
fn launch_rate(node: &Node, core: &str, shares: Option<&str>, seconds: f64) -> f64 {
    let probe = Path::new(env!("CARGO_BIN_EXE_runtimekit-cuda-probe"));
    let child = node
        .command(probe, Some("4096"))
        .env("RUNTIMEKIT_GPU_CORE_LIMIT", core)
        .args(["launches", "--seconds", &seconds.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .expect("probe");
    if let Some(line) = shares {
        let file = node.dir.join("measured/shares");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs_f64(seconds);
        let mut sequence = 0;
        while std::time::Instant::now() < deadline {
            sequence += 1;
            let temp = node.dir.join("measured/shares.new");
            std::fs::write(&temp, format!("{UUID} {line} {sequence}\n")).expect("write");
            std::fs::rename(&temp, &file).expect("rename");
            std::thread::sleep(std::time::Duration::from_millis(60));
        }
    }
    let output = child.wait_with_output().expect("probe");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.split_once("last_second ")
        .and_then(|(_, r)| r.trim().parse().ok())
        .expect("the probe's rate")
}

#[test]
fn launches_slow_down_when_the_measured_share_is_over_the_cap() {
    let node = Node::new();
    let free = launch_rate(&node, "30", None, 1.0);
    // Measured at the whole card with a 30 % cap: the gate closes, measurement by measurement.
    let held = launch_rate(&node, "30", Some("1.0 0.0"), 2.0);
    assert!(
        held * 20.0 < free,
        "{held} launches a second held, {free} free"
    );
    // Without a compute cap the same measurements hold nothing back.
    let uncapped = launch_rate(&node, "0", Some("1.0 0.0"), 1.0);
    assert!(uncapped * 2.0 > free, "{uncapped} uncapped, {free} free");
}
