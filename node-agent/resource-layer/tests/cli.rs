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
