//! The binary's answers to bad flags and a missing resource layer: a clear error and a non-zero
//! exit, never a panic.

use std::process::{Command, Output};

fn agent(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_runtimekit-node-agent"))
        .args(args)
        .env_remove("NODE_NAME")
        .env_remove("KUBECONFIG")
        .env_remove("RUNTIMEKIT_RESOURCE_SOCKET")
        .env_remove("RUNTIMEKIT_CONFIG")
        .output()
        .expect("the binary runs")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn assert_clean_failure(output: &Output, code: i32, expected: &str) {
    let text = stderr(output);
    assert_eq!(output.status.code(), Some(code), "{text}");
    assert!(text.contains(expected), "expected {expected:?} in:\n{text}");
    assert!(!text.contains("panicked"), "{text}");
}

#[test]
fn flags_are_checked() {
    assert_clean_failure(&agent(&[]), 2, "--node-name <NODE_NAME>");
    assert_clean_failure(
        &agent(&["--node-name", "n1", "--heartbeat-interval", "soon"]),
        2,
        "is not a duration",
    );
    assert_clean_failure(
        &agent(&["--node-name", "N_1"]),
        1,
        "error: --node-name \"N_1\" is not a node name",
    );
}

#[test]
fn a_missing_resource_layer_is_a_clear_error() {
    assert_clean_failure(
        &agent(&[
            "--node-name",
            "n1",
            "--resource-layer-socket",
            "/nonexistent/resource-layer.sock",
            "--resource-layer-wait",
            "300ms",
        ]),
        1,
        "error: no resource layer at /nonexistent/resource-layer.sock: the socket does not exist",
    );
    let dir = std::env::temp_dir().join(format!("na-cli-{}", std::process::id()));
    let state_dir = dir.to_string_lossy().into_owned();
    assert_clean_failure(
        &agent(&[
            "--node-name",
            "n1",
            "--simulate",
            "no-such-profile",
            "--state-dir",
            &state_dir,
        ]),
        1,
        "error: cannot start the simulated resource layer",
    );
    // The simulated layer starts; then the missing kubeconfig is the error.
    assert_clean_failure(
        &agent(&[
            "--node-name",
            "n1",
            "--simulate",
            "h800-8",
            "--state-dir",
            &state_dir,
            "--kubeconfig",
            "/nonexistent/kubeconfig",
        ]),
        1,
        "error: cannot build the Kubernetes client: reading /nonexistent/kubeconfig",
    );
    let _ = std::fs::remove_dir_all(&dir);
}
