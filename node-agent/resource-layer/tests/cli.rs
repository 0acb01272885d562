//! The binary: a clear error without NVML, the read-only probe, the profile list, and serving
//! until SIGTERM.

mod common;

use common::TempDir;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_runtimekit-resource-layer");

#[test]
fn nvml_missing_is_said_plainly_and_exits_non_zero() {
    let out = Command::new(BIN)
        .args([
            "probe",
            "--backend",
            "nvml",
            "--nvml-lib",
            "/nonexistent/libnvidia-ml.so.1",
            "--health-wait-ms",
            "0",
        ])
        .output()
        .expect("run");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("error: NVML library not found: /nonexistent/libnvidia-ml.so.1"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn probe_prints_a_simulated_node() {
    let out = Command::new(BIN)
        .args([
            "probe",
            "--backend",
            "simulated",
            "--profile",
            "ppu-m890p-8",
            "--node-name",
            "cli-node",
            "--health-wait-ms",
            "0",
        ])
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    for want in [
        "node cli-node, 8 card(s), profile ppu-m890p-8",
        "card 7: VENDOR_PPU PPU-M890P",
        "RDMA NIC mlx5_3",
        "metrics card 0:",
        "health: no active faults",
    ] {
        assert!(stdout.contains(want), "{want:?} missing:\n{stdout}");
    }
}

#[test]
fn profiles_lists_the_shipped_profiles() {
    let out = Command::new(BIN).arg("profiles").output().expect("run");
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    for name in [
        "h800-8",
        "a100-40gb-8",
        "ppu-810e-8",
        "ppu-m890p-8",
        "mi300x-8",
    ] {
        assert!(stdout.contains(&format!("{name}: ")), "{name}:\n{stdout}");
    }
}

#[test]
fn a_simulated_profile_is_required() {
    let out = Command::new(BIN)
        .args(["probe", "--backend", "simulated"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--profile"));
}

#[test]
fn serve_listens_until_sigterm_and_removes_its_socket() {
    let dir = TempDir::new("cli-serve");
    let socket = dir.path().join("run/rl.sock");
    let mut child = Command::new(BIN)
        .args([
            "serve",
            "--backend",
            "simulated",
            "--profile",
            "h800-8",
            "--socket",
        ])
        .arg(&socket)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        if Instant::now() > deadline || child.try_wait().expect("wait").is_some() {
            let _ = child.kill();
            panic!("the server did not start listening");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the server did not stop on SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
    assert!(!socket.exists(), "the socket is removed");
}

/// Runs the binary on the NVML backend over the fake NVML `fake`.
fn on_fake(fake: &runtimekit_fake_nvml::FakeNvml, args: &[&str]) -> std::process::Output {
    let library = fake.library().display().to_string();
    let mut all = vec![args[0], "--backend", "nvml", "--nvml-lib", library.as_str()];
    all.extend(&args[1..]);
    Command::new(BIN).args(&all).output().expect("run")
}

#[test]
fn probe_facts_give_one_line_per_figure() {
    use runtimekit_fake_nvml::World;
    let mut world = World::h100(2);
    world.cards[1].readings.gpu_temp_c = 61;
    world.cards[1].processes = vec![runtimekit_fake_nvml::world::Process {
        pid: 4242,
        used_mib: Some(1_024),
        ..Default::default()
    }];
    let fake = runtimekit_fake_nvml::FakeNvml::install(&world).expect("install");
    let out = on_fake(&fake, &["probe", "--health-wait-ms", "0", "--facts"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for expected in [
        "driver\t550.90.07",
        "card\t1\tuuid\tGPU-fa4e0000-0000-4000-8000-000000000001",
        "card\t1\tname\tNVIDIA H100 80GB HBM3",
        "card\t1\tmemory_total_mib\t81559",
        "card\t1\tgpu_temp_c\t61",
        "card\t1\tnvlink_active_links\t18",
        "card\t1\tprocess\t4242\t1024\t",
        "path\t0\t1\tPIX\t",
    ] {
        assert!(stdout.contains(expected), "{expected:?} in\n{stdout}");
    }
}

#[test]
fn mig_roundtrip_creates_and_destroys_one_instance() {
    use runtimekit_fake_nvml::World;
    use runtimekit_fake_nvml::world::Card;
    let mut world = World::h100(1);
    world.cards[0] = Card::h100(0).mig_on();
    let fake = runtimekit_fake_nvml::FakeNvml::install(&world).expect("install");
    let out = on_fake(
        &fake,
        &[
            "mig-roundtrip",
            "--card",
            "0",
            "--mig-profile",
            "1g.10gb",
            "--start",
            "3",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("created: GPU instance"), "{stdout}");
    assert!(
        stdout.contains("listed: yes") && stdout.contains("destroyed: yes"),
        "{stdout}"
    );
    let card = &fake.world().expect("world").cards[0];
    assert!(
        card.mig.as_ref().expect("mig").instances.is_empty(),
        "nothing left behind"
    );
    // A card without MIG mode says so and exits non-zero.
    let fake = runtimekit_fake_nvml::FakeNvml::install(&World::h100(1)).expect("install");
    let out = on_fake(
        &fake,
        &["mig-roundtrip", "--card", "0", "--mig-profile", "1g.10gb"],
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("MIG mode"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
