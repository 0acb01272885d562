//! The isolation library on the real node: a time-division container gets the library, its
//! limits and its ledger folder from `lj-runtime`, and runs a probe against the fake CUDA
//! driver; its memory cap holds on every way in, and its compute cap closes its launch gate
//! once the node's compute meter measures it over its share.

use crate::operator::with_operator;
use crate::real_node::{import_images, wait_phase};
use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::PostParams;
use runtimekit_e2e::harness::Test;
use runtimekit_e2e::real_node::RealNode;
use runtimekit_e2e::{TestContext, tests};
use runtimekit_proto::resource::v1alpha1 as pb;
use serde_json::json;
use std::time::Duration;

pub const TESTS: &[Test] = tests![
    real_node_tdm_container_is_held_to_its_memory_cap,
    real_node_tdm_container_is_held_to_its_compute_cap,
];

const WAIT: Duration = Duration::from_secs(60);

/// The usage guide's time-division request at gpu-core 30 and gpu-memory 4 (GiB), running a CUDA
/// program (the project's probe, against the fake driver its image ships as libcuda.so.1) on
/// the real node: lj-runtime gave the container the isolation library through its
/// `/etc/ld.so.preload` (the pod sets no LD_PRELOAD), so four 1 GiB blocks fit and the fifth is
/// refused with the driver's out-of-memory error, reached by dlsym and by cuGetProcAddress.
async fn real_node_tdm_container_is_held_to_its_memory_cap(ctx: TestContext) -> Result<()> {
    let node = ctx.real_node().await?;
    let references = import_images(&node, &["cuda-test"]).await?;
    let image = references.first().context("the cuda-test image")?.clone();
    with_operator(ctx, |ctx| async move {
        let alloc = |via: &str| {
            json!({"name": format!("by-{via}"), "image": image, "imagePullPolicy": "Never",
                "args": ["--via", via, "alloc", "--path", "alloc", "--mib", "1024", "--count", "5"],
                "resources": {"limits": {"aliyun.com/gpu-core": "30", "aliyun.com/gpu-memory": "4"}}})
        };
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "capped"},
            "spec": {"schedulerName": "lj-runtimekit-scheduler", "runtimeClassName": "lj-runtime",
                "restartPolicy": "Never", "automountServiceAccountToken": false,
                "terminationGracePeriodSeconds": 1,
                "nodeSelector": {"kubernetes.io/hostname": node.name},
                "containers": [alloc("dlsym"), alloc("proc-address")]}});
        let object: Pod = serde_json::from_value(pod)?;
        ctx.api::<Pod>()
            .create(&PostParams::default(), &object)
            .await?;
        wait_phase(&ctx, "capped", "Succeeded").await?;
        for container in ["by-dlsym", "by-proc-address"] {
            let log = ctx.kubectl_ok(&["logs", "capped", "-c", container], None)?;
            ensure!(
                probe_results(&log) == ["ok", "ok", "ok", "ok", "error 2"],
                "{container}: four 1 GiB blocks under a 4 GiB cap, then out of memory:\n{log}"
            );
        }
        Ok(())
    })
    .await
}

/// The result of each of the probe's steps, in order (`ok`, `error 2`), from its log.
pub(crate) fn probe_results(log: &str) -> Vec<&str> {
    log.lines()
        .filter_map(|l| l.split_once(": ").map(|(_, r)| r))
        .collect()
}

/// The host PID of the probe in pod `uid` whose command line holds `marker`, once it runs.
fn probe_pid(uid: &str, marker: &str) -> Option<u32> {
    let systemd_uid = uid.replace('-', "_");
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let cgroup = std::fs::read_to_string(entry.path().join("cgroup")).ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            ((cgroup.contains(uid) || cgroup.contains(&systemd_uid))
                && cmdline.contains("runtimekit-cuda-probe")
                && cmdline.contains(marker))
            .then_some(pid)
        })
}

/// The index of the card process `pid` was given (`NVIDIA_VISIBLE_DEVICES` in its
/// environment), on the real node's resource layer.
async fn card_of(node: &RealNode, pid: u32) -> Result<u32> {
    let environ = std::fs::read(format!("/proc/{pid}/environ"))?;
    let uuid = String::from_utf8_lossy(&environ)
        .split('\0')
        .find_map(|v| v.strip_prefix("NVIDIA_VISIBLE_DEVICES=").map(str::to_owned))
        .context("the probe has no NVIDIA_VISIBLE_DEVICES")?;
    let mut client = runtimekit_resource_layer::resource_client(&node.layer_socket).await?;
    let devices = client
        .list_devices(pb::ListDevicesRequest::default())
        .await?
        .into_inner()
        .devices;
    devices
        .iter()
        .find(|d| d.uuid == uuid)
        .map(|d| d.index)
        .with_context(|| format!("no card {uuid} on the node"))
}

/// A TDM container with `gpu-core: 30` launching kernels as fast as it can (on the fake
/// driver) is slowed once the node's compute meter measures its process taking the whole card:
/// the simulated card reports the container's real host PID at 100 %, the resource layer's
/// meter finds the process's container by the ledger it maps and writes the share into the
/// folder lj-runtime gave the container, and the library's launch gate closes. A second
/// container of the same pod, measured idle, is not slowed.
async fn real_node_tdm_container_is_held_to_its_compute_cap(ctx: TestContext) -> Result<()> {
    let node = ctx.real_node().await?;
    let references = import_images(&node, &["cuda-test"]).await?;
    let image = references.first().context("the cuda-test image")?.clone();
    with_operator(ctx, |ctx| async move {
        let launcher = |name: &str, blocks: &str| {
            json!({"name": name, "image": image, "imagePullPolicy": "Never",
                "args": ["launches", "--blocks", blocks, "--seconds", "20"],
                "resources": {"limits": {"aliyun.com/gpu-core": "30", "aliyun.com/gpu-memory": "4"}}})
        };
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "metered"},
            "spec": {"schedulerName": "lj-runtimekit-scheduler", "runtimeClassName": "lj-runtime",
                "restartPolicy": "Never", "automountServiceAccountToken": false,
                "terminationGracePeriodSeconds": 1,
                "nodeSelector": {"kubernetes.io/hostname": node.name},
                "containers": [launcher("busy", "100"), launcher("idle", "101")]}});
        let object: Pod = serde_json::from_value(pod)?;
        ctx.api::<Pod>()
            .create(&PostParams::default(), &object)
            .await?;
        let running = wait_phase(&ctx, "metered", "Running").await?;
        let uid = running.uid().context("the pod's UID")?;
        at_full_load(&ctx, &node, &uid, "--blocks 100", async {
            wait_phase(&ctx, "metered", "Succeeded").await
        })
        .await?;
        held_to_its_share(
            launch_rates(&ctx, "metered", "busy")?,
            launch_rates(&ctx, "metered", "idle")?,
        )
    })
    .await
}

/// Runs `until` while the node's compute meter measures the probe in pod `uid` whose command
/// line holds `marker` taking its whole card (the simulated card reports the probe's real host
/// PID at 100 %); the load is taken off again whatever `until` returned.
pub(crate) async fn at_full_load<T>(
    ctx: &TestContext,
    node: &RealNode,
    uid: &str,
    marker: &str,
    until: impl Future<Output = Result<T>>,
) -> Result<T> {
    let pid = ctx
        .wait_for("the busy probe's process", WAIT, || async {
            Ok(probe_pid(uid, marker))
        })
        .await?;
    let card = card_of(node, pid).await?;
    let mut faults = runtimekit_resource_layer::fault_client(&node.layer_socket).await?;
    let load = |sm_util_percent| pb::SetProcessLoadRequest {
        device_index: card,
        pid,
        sm_util_percent,
    };
    faults.set_process_load(load(100)).await?;
    let outcome = until.await;
    faults.set_process_load(load(0)).await?;
    outcome
}

/// A launching probe's mean launches a second and its last second's, from its log.
pub(crate) fn launch_rates(ctx: &TestContext, pod: &str, container: &str) -> Result<(f64, f64)> {
    let log = ctx.kubectl_ok(&["logs", pod, "-c", container], None)?;
    let field = |name: &str| -> Option<f64> {
        log.split_once(&format!("{name} "))?
            .1
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    field("launches_per_s")
        .zip(field("last_second"))
        .with_context(|| format!("{pod}/{container}'s rates in {log:?}"))
}

/// A busy probe measured at the whole card under a 30 % cap was slowed; an idle one was not.
/// Each is (mean launches a second, last second's).
pub(crate) fn held_to_its_share(busy: (f64, f64), idle: (f64, f64)) -> Result<()> {
    let ((busy_mean, busy_last), (idle_mean, idle_last)) = (busy, idle);
    eprintln!(
        "launches a second: busy {busy_mean} (last {busy_last}), idle {idle_mean} (last {idle_last})"
    );
    // Unheld, the last second is the mean; the gate cuts the rate by about a quarter a
    // second once the first measurement has corrected it to 30 % of what was launched.
    ensure!(
        busy_last * 5.0 < busy_mean,
        "measured at the whole card under a 30 % cap, the busy container's last second ({busy_last} launches) must be a small part of its mean ({busy_mean} a second)"
    );
    ensure!(
        idle_last * 2.0 > idle_mean,
        "measured idle, the other container is not slowed: last second {idle_last}, mean {idle_mean}"
    );
    Ok(())
}
