//! DRA on the real node: once the node is labelled `aliyun.com/device-api=dra` and its agent
//! started again, the real kubelet registers the kit's DRA plugin, kube-scheduler allocates
//! claims from the node's ResourceSlices, and the plugin prepares them through CDI, as
//! containerd applies it: whole cards, time-division shares held to their caps by the isolation
//! library against the fake CUDA driver, MIG instances made for the pod's life, and a card
//! with the NIC under its PCIe switch. Claims stay prepared across agent and kubelet restarts;
//! a card is never given twice nor while faulted; bad claims say why and leave nothing made.
//! Each test moves the node back to the device plugin at its end.

use crate::dra::{
    DEVICE_API_LABEL, allocated_claim, apply_device_classes, claim_pod, claim_template, devices_of,
    slices_of, string_attribute, template, usable,
};
use crate::real_node::{SHOW, Seen, import_images, instance_keys, wait_phase};
use crate::real_node_isolation::{at_full_load, held_to_its_share, launch_rates, probe_results};
use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::ResourceExt;
use kube::api::{DeleteParams, ListParams, PostParams};
use runtimekit_contract::dra::{ATTR_PCIE_SWITCH, ATTR_UUID};
use runtimekit_e2e::harness::Test;
use runtimekit_e2e::real_node::{ISOLATION_DIR, PROFILE, RealNode};
use runtimekit_e2e::{TestContext, tests};
use runtimekit_proto::resource::v1alpha1 as pb;
use serde_json::json;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

pub const TESTS: &[Test] = tests![
    real_node_dra_claims_get_their_devices_through_cdi,
    real_node_dra_share_is_held_to_its_compute_cap,
    real_node_dra_mig_claim_outlives_agent_and_kubelet_restarts,
    real_node_dra_cards_are_never_given_twice_nor_while_faulted,
    real_node_dra_bad_claims_say_why_and_prepare_nothing,
    // It swaps the node's cards for PPU M890P ones, and back.
    real_node_dra_card_and_nic_under_one_pcie_switch,
];

const WAIT: Duration = Duration::from_secs(90);
const DRIVER: &str = "gpu.runtimekit.aliyun.com";
/// What the agent logs when the kubelet answers its registration.
const REGISTERED: &str = "the kubelet registered the DRA plugin";
/// What a long-running container prints first.
const SHOW_AND_STAY: &str = "echo printed; exec sleep 3600";

/// How many times the agent's log says the kubelet registered its plugin.
fn registrations(node: &RealNode) -> Result<usize> {
    let log = node
        .dir
        .parent()
        .context("the cluster's folder")?
        .join("logs/node-agent.log");
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    Ok(text.matches(REGISTERED).count())
}

/// Waits until the kubelet registered the plugin more than `before` times. A pod the kubelet
/// admits before the plugin registered waits for the kubelet's next resync (a minute).
async fn registered_after(ctx: &TestContext, node: &RealNode, before: usize) -> Result<()> {
    ctx.wait_for("the kubelet to register the DRA plugin", WAIT, || async {
        Ok((registrations(node)? > before).then_some(()))
    })
    .await
}

/// Moves the real node to DRA (`dra`) or back, restarting its agent; on DRA, waits until its
/// slices are published and the kubelet registered the plugin.
async fn move_node(ctx: &TestContext, node: &RealNode, dra: bool) -> Result<()> {
    let label = if dra {
        format!("{DEVICE_API_LABEL}=dra")
    } else {
        format!("{DEVICE_API_LABEL}-")
    };
    let before = registrations(node)?;
    ctx.kubectl_ok(&["label", "node", &node.name, &label, "--overwrite"], None)?;
    ctx.restart_real_node_agent()?;
    if dra {
        ctx.wait_for("the real node's ResourceSlices", WAIT, || async {
            Ok((!slices_of(ctx, &node.name).await?.is_empty()).then_some(()))
        })
        .await?;
        registered_after(ctx, node, before).await?;
    }
    Ok(())
}

/// Runs `test` with the real node on DRA and the DeviceClasses applied, then moves the node
/// back to the device plugin, also when the test failed.
async fn on_dra_node<F, Fut>(ctx: TestContext, test: F) -> Result<()>
where
    F: FnOnce(TestContext, RealNode) -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let node = ctx.real_node().await?;
    apply_device_classes(&ctx)?;
    move_node(&ctx, &node, true).await?;
    let outcome = test(ctx.clone(), node.clone()).await;
    let back = move_node(&ctx, &node, false).await;
    outcome?;
    back
}

/// The card a device name is on (`gpu-3`, `gpu-3-share`, `gpu-6-mig-1g10gb-0`).
fn card_of(device: &str) -> Option<u32> {
    device.strip_prefix("gpu-")?.split('-').next()?.parse().ok()
}

/// The one device a claim was given.
fn only_device(claim: &ResourceClaim) -> Result<String> {
    let devices = devices_of(claim);
    ensure!(devices.len() == 1, "one device: {devices:?}");
    Ok(devices[0].1.clone())
}

/// Waits until the pod's container printed `printed`; what it showed.
async fn shown(ctx: &TestContext, pod: &str) -> Result<Seen> {
    let log = ctx
        .wait_for(&format!("{pod}'s output"), WAIT, || async {
            let log = ctx.kubectl_ok(&["logs", pod], None)?;
            Ok(log.contains("printed").then_some(log))
        })
        .await?;
    Ok(Seen::read(&log))
}

/// Where the node agent serves `/metrics` now (it listens on a free port, and logs it).
fn metrics_address(node: &RealNode) -> Option<std::net::SocketAddr> {
    let log = node.dir.parent()?.join("logs/node-agent.log");
    let text = std::fs::read_to_string(log).ok()?;
    let line = text
        .lines()
        .rev()
        .find(|l| l.contains("serving /metrics"))?;
    let at = line.rfind("127.0.0.1:")?;
    let address: String = line[at..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':')
        .collect();
    address.parse().ok()
}

/// Waits until the agent's exporter shows the share claim's limits on series labelled with
/// the pod and container using it.
async fn exported_with_its_pod(ctx: &TestContext, node: &RealNode, pod: &str) -> Result<()> {
    let labels = format!("pod=\"{pod}\"");
    let container = "container_name=\"main\"";
    ctx.wait_for(
        &format!("the exporter to label {pod}'s claim"),
        WAIT,
        || async {
            let Some(address) = metrics_address(node) else {
                return Ok(None);
            };
            let text = runtimekit_e2e::tools::http_get(address, "/metrics").unwrap_or_default();
            let value = |family: &str| {
                text.lines()
                    .find(|l| l.starts_with(family) && l.contains(&labels) && l.contains(container))
                    .and_then(|l| l.rsplit(' ').next())
                    .and_then(|v| v.parse::<f64>().ok())
            };
            let shown = value("DCGM_FI_CONTAINER_FB_LIMIT") == Some(4096.0)
                && value("DCGM_FI_CONTAINER_CORE_LIMIT") == Some(50.0);
            Ok(shown.then_some(()))
        },
    )
    .await
}

/// The CDI spec the plugin writes for a claim.
fn cdi_spec(node: &RealNode, uid: &str) -> PathBuf {
    node.dir.join("cdi").join(format!("{DRIVER}-{uid}.json"))
}

/// What the node holds for a claim: its CDI spec, isolation folders, instances and checkpoint
/// record, each named; empty when nothing is.
async fn made_for(node: &RealNode, uid: &str) -> Result<Vec<String>> {
    let mut made = Vec::new();
    if cdi_spec(node, uid).exists() {
        made.push("its CDI spec".to_owned());
    }
    // The folder is made with the first share's.
    let isolation = std::fs::read_dir(node.dir.join(ISOLATION_DIR)).into_iter();
    for entry in isolation.flatten().flatten() {
        if entry.file_name().to_string_lossy().contains(uid) {
            made.push(format!("isolation folder {:?}", entry.file_name()));
        }
    }
    for key in instance_keys(node).await? {
        if key.starts_with(&format!("dra:{uid}:")) {
            made.push(format!("instance {key}"));
        }
    }
    let checkpoint = node
        .dir
        .join("gpu")
        .join(PROFILE)
        .join("agent/dra/checkpoint.json");
    if std::fs::read_to_string(checkpoint)
        .unwrap_or_default()
        .contains(uid)
    {
        made.push("a checkpoint record".to_owned());
    }
    Ok(made)
}

/// The claim of a pod's `gpu` entry, allocated or not, once the controller made it.
async fn claim_of(ctx: &TestContext, pod: &str) -> Result<ResourceClaim> {
    ctx.wait_for(&format!("{pod}'s claim"), WAIT, || async {
        let object = ctx.api::<Pod>().get(pod).await?;
        let name = object
            .status
            .and_then(|s| s.resource_claim_statuses)
            .into_iter()
            .flatten()
            .find(|c| c.name == "gpu")
            .and_then(|c| c.resource_claim_name);
        match name {
            Some(name) => Ok(Some(ctx.api::<ResourceClaim>().get(&name).await?)),
            None => Ok(None),
        }
    })
    .await
}

/// Why a pod is not running: its scheduling condition's message and its Events.
async fn why(ctx: &TestContext, pod: &str) -> Result<String> {
    let object = ctx.api::<Pod>().get(pod).await?;
    let scheduling = object
        .status
        .and_then(|s| s.conditions)
        .into_iter()
        .flatten()
        .filter(|c| c.type_ == "PodScheduled" && c.status == "False")
        .filter_map(|c| c.message)
        .collect::<Vec<_>>()
        .join("; ");
    let events = ctx.kubectl_ok(
        &[
            "get",
            "events",
            "--field-selector",
            &format!("involvedObject.name={pod}"),
            "-o",
            "jsonpath={range .items[*]}{.reason}: {.message}{\"\\n\"}{end}",
        ],
        None,
    )?;
    Ok(format!("{scheduling}\n{events}"))
}

/// Waits until the reason a pod does not run says `text`.
async fn says(ctx: &TestContext, pod: &str, text: &str) -> Result<String> {
    ctx.wait_for(&format!("{pod} to say {text:?}"), WAIT, || async {
        let why = why(ctx, pod).await?;
        Ok(why.contains(text).then_some(why))
    })
    .await
}

/// The running container of a pod and its restart count.
fn container(pod: &Pod) -> (Option<String>, Option<i32>) {
    let status = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first());
    (
        status.and_then(|c| c.container_id.clone()),
        status.map(|c| c.restart_count),
    )
}

async fn create(ctx: &TestContext, pod: &Pod) -> Result<()> {
    ctx.api::<Pod>().create(&PostParams::default(), pod).await?;
    Ok(())
}

async fn delete_pods(ctx: &TestContext, names: &[String]) -> Result<()> {
    for name in names {
        ctx.api::<Pod>()
            .delete(name, &DeleteParams::default().grace_period(0))
            .await?;
    }
    Ok(())
}

/// Waits until nothing is left on the node for any of `uids`.
async fn unprepared(ctx: &TestContext, node: &RealNode, uids: &[String]) -> Result<()> {
    ctx.wait_for("the claims unprepared", WAIT, || async {
        for uid in uids {
            if !made_for(node, uid).await?.is_empty() {
                return Ok(None);
            }
        }
        Ok(Some(()))
    })
    .await
}

/// A whole card's and a time-division share's containers get their device files, variables and
/// (for the share) the isolation library through CDI; a share of 50 % and 4 GiB running the
/// project's CUDA probe against the fake driver gets four 1 GiB blocks and then out of memory.
async fn real_node_dra_claims_get_their_devices_through_cdi(ctx: TestContext) -> Result<()> {
    let node = ctx.real_node().await?;
    let references = import_images(&node, &["cuda-test"]).await?;
    let probe = references.first().context("the cuda-test image")?.clone();
    on_dra_node(ctx, |ctx, node| async move {
        let script = format!(
            "env | grep -E '^(NVIDIA_VISIBLE_DEVICES|RUNTIMEKIT_)' | sort; ls /dev; cat /etc/ld.so.preload 2>/dev/null; {SHOW_AND_STAY}"
        );
        claim_template(&ctx, "whole", DRIVER, 1, None)?;
        let share = json!({"core": "50", "memory": "4Gi"});
        claim_template(&ctx, "share", &format!("share.{DRIVER}"), 1, Some(share))?;
        let mut prepared = Vec::new();
        for (name, template) in [("dra-whole", "whole"), ("dra-share", "share")] {
            create(&ctx, &claim_pod(name, &node.name, template, &script)?).await?;
            let claim = allocated_claim(&ctx, name, Some("gpu")).await?;
            let device = only_device(&claim)?;
            let index = card_of(&device).context("a card")?;
            // The UUID the allocation was made from: the agent's report of another profile
            // can lag a test that switched the node back.
            let slices = slices_of(&ctx, &node.name).await?;
            let uuid = string_attribute(&slices, &device, ATTR_UUID).context("the card's UUID")?;
            // Running, so its claim stays prepared while it is looked at.
            wait_phase(&ctx, name, "Running").await?;
            let log = ctx
                .wait_for(&format!("{name}'s output"), WAIT, || async {
                    let log = ctx.kubectl_ok(&["logs", name], None)?;
                    Ok(log.contains("printed").then_some(log))
                })
                .await?;
            ensure!(
                log.contains(&format!("NVIDIA_VISIBLE_DEVICES={uuid}"))
                    && log.contains(&format!("nvidia{index}"))
                    && log.contains("nvidiactl"),
                "{name} sees card {index} ({uuid}) and nothing else decides it:\n{log}"
            );
            if template == "share" {
                exported_with_its_pod(&ctx, &node, name).await?;
                ensure!(
                    log.contains("RUNTIMEKIT_GPU_CORE_LIMIT=50")
                        && log.contains("RUNTIMEKIT_GPU_MEMORY_LIMIT_MIB=4096")
                        && log.contains("RUNTIMEKIT_SLICE_MODES=TDM")
                        && log.contains("RUNTIMEKIT_GPU_CORE_POLICY=enforce")
                        && log.contains("libruntimekit_isolation.so"),
                    "the share is held to its caps by the isolation library:\n{log}"
                );
            } else {
                ensure!(
                    log.contains("RUNTIMEKIT_SLICE_MODES=Whole")
                        && !log.contains("libruntimekit_isolation.so"),
                    "a whole card is not enforced:\n{log}"
                );
            }
            let uid = claim.uid().unwrap_or_default();
            ensure!(cdi_spec(&node, &uid).exists(), "the claim's CDI spec is written");
            prepared.push(uid);
        }
        // The fake CUDA driver under the isolation library, as the isolation tests run it.
        let mut capped = claim_pod("dra-capped", &node.name, "share", "")?;
        let container = &mut capped.spec.as_mut().context("a spec")?.containers[0];
        container.image = Some(probe);
        container.command = None;
        container.args = Some(
            ["--via", "dlsym", "alloc", "--path", "alloc", "--mib", "1024", "--count", "5"]
                .map(String::from)
                .to_vec(),
        );
        create(&ctx, &capped).await?;
        let claim = allocated_claim(&ctx, "dra-capped", Some("gpu")).await?;
        prepared.push(claim.uid().unwrap_or_default());
        wait_phase(&ctx, "dra-capped", "Succeeded").await?;
        let log = ctx.kubectl_ok(&["logs", "dra-capped"], None)?;
        ensure!(
            probe_results(&log) == ["ok", "ok", "ok", "ok", "error 2"],
            "four 1 GiB blocks under the claim's 4 GiB, then out of memory:\n{log}"
        );
        delete_pods(&ctx, &["dra-whole".into(), "dra-share".into(), "dra-capped".into()]).await?;
        unprepared(&ctx, &node, &prepared).await
    })
    .await
}

/// A share claimed at 30 % of a card holds its container to it as the extended-resource
/// share does: the probe launching as fast as it can is slowed once the node's compute meter
/// measures it taking the whole card (the meter finds the container by the ledger in the
/// isolation folder the claim's CDI spec mounted), and a second container with its own claim,
/// measured idle, is not.
async fn real_node_dra_share_is_held_to_its_compute_cap(ctx: TestContext) -> Result<()> {
    let node = ctx.real_node().await?;
    let references = import_images(&node, &["cuda-test"]).await?;
    let probe = references.first().context("the cuda-test image")?.clone();
    on_dra_node(ctx, |ctx, node| async move {
        let share = json!({"core": "30", "memory": "4Gi"});
        claim_template(&ctx, "share30", &format!("share.{DRIVER}"), 1, Some(share))?;
        let launcher = |name: &str, blocks: &str| {
            json!({"name": name, "image": probe, "imagePullPolicy": "Never",
                "args": ["launches", "--blocks", blocks, "--seconds", "20"],
                "resources": {"claims": [{"name": name}]}})
        };
        let claim = |name: &str| json!({"name": name, "resourceClaimTemplateName": "share30"});
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "dra-metered"},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": node.name},
                "restartPolicy": "Never", "automountServiceAccountToken": false,
                "terminationGracePeriodSeconds": 1,
                "resourceClaims": [claim("busy"), claim("idle")],
                "containers": [launcher("busy", "100"), launcher("idle", "101")]}}))?;
        create(&ctx, &pod).await?;
        let running = wait_phase(&ctx, "dra-metered", "Running").await?;
        let uid = running.uid().context("the pod's UID")?;
        at_full_load(&ctx, &node, &uid, "--blocks 100", async {
            wait_phase(&ctx, "dra-metered", "Succeeded").await
        })
        .await?;
        held_to_its_share(
            launch_rates(&ctx, "dra-metered", "busy")?,
            launch_rates(&ctx, "dra-metered", "idle")?,
        )?;
        delete_pods(&ctx, &["dra-metered".into()]).await
    })
    .await
}

/// A MIG claim's instance exists while its pod runs. The agent and then the kubelet restart
/// with it and a whole card prepared: the running containers are the same ones, not
/// restarted, the instance is the same (adopted from the checkpoint), a new claim is served,
/// and deleting the pods destroys the instance and removes the specs.
async fn real_node_dra_mig_claim_outlives_agent_and_kubelet_restarts(
    ctx: TestContext,
) -> Result<()> {
    on_dra_node(ctx, |ctx, node| async move {
        let profile = format!("device.attributes[\"{DRIVER}\"].profile == \"1g.10gb\"");
        template(
            &ctx,
            "mig",
            json!({"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": format!("mig.{DRIVER}"),
                "selectors": [{"cel": {"expression": profile}}]}}]}),
        )?;
        claim_template(&ctx, "whole", DRIVER, 1, None)?;
        let script = format!("{SHOW}; {SHOW_AND_STAY}");
        create(&ctx, &claim_pod("dra-mig", &node.name, "mig", &script)?).await?;
        create(&ctx, &claim_pod("dra-held", &node.name, "whole", &script)?).await?;
        let mig = allocated_claim(&ctx, "dra-mig", Some("gpu")).await?;
        let held = allocated_claim(&ctx, "dra-held", Some("gpu")).await?;
        let device = only_device(&mig)?;
        ensure!(
            device.contains("-mig-1g10gb-"),
            "a 1g.10gb placement: {device}"
        );
        let uid = mig.uid().unwrap_or_default();
        let key = format!("dra:{uid}:gpu:{device}");
        let mut before = Vec::new();
        for name in ["dra-mig", "dra-held"] {
            before.push(container(&wait_phase(&ctx, name, "Running").await?));
        }
        let seen = shown(&ctx, "dra-mig").await?;
        ensure!(
            seen.var("NVIDIA_VISIBLE_DEVICES")
                .is_some_and(|v| v.starts_with("MIG-"))
                && seen.caps > 0,
            "the MIG instance's device and capability files: {seen:?}"
        );
        ensure!(
            instance_keys(&node).await?.contains(&key),
            "the instance {key} exists while the pod runs"
        );

        let count = registrations(&node)?;
        ctx.restart_real_node_agent()?;
        registered_after(&ctx, &node, count).await?;
        let count = registrations(&node)?;
        ctx.restart_real_kubelet(&node).await?;
        registered_after(&ctx, &node, count).await?;
        for (name, was) in ["dra-mig", "dra-held"].into_iter().zip(&before) {
            let now = container(&ctx.api::<Pod>().get(name).await?);
            ensure!(
                now.0.is_some() && now == *was,
                "{name} is the same running container, not restarted: {was:?} then {now:?}"
            );
        }
        ensure!(
            instance_keys(&node).await?.contains(&key),
            "the instance {key} is still there after the restarts"
        );
        create(&ctx, &claim_pod("dra-after", &node.name, "whole", &script)?).await?;
        let after = allocated_claim(&ctx, "dra-after", Some("gpu")).await?;
        wait_phase(&ctx, "dra-after", "Running").await?;
        ensure!(
            only_device(&after)? != only_device(&held)?,
            "a new claim gets another card"
        );
        let uids: Vec<String> = [&mig, &held, &after]
            .iter()
            .map(|c| c.uid().unwrap_or_default())
            .collect();
        delete_pods(
            &ctx,
            &["dra-mig".into(), "dra-held".into(), "dra-after".into()],
        )
        .await?;
        unprepared(&ctx, &node, &uids).await?;
        ensure!(
            !instance_keys(&node).await?.contains(&key),
            "the adopted instance is destroyed with its claim"
        );
        Ok(())
    })
    .await
}

/// How long a pod of a burst may take to start: in a burst the kubelet can fetch a claim
/// before the apiserver's node authorizer has linked it to the bound pod, and its next try
/// comes with its resync, a minute later.
const BURST_START: Duration = Duration::from_secs(180);

/// Waits until the pod runs, for up to `within`.
async fn running_within(ctx: &TestContext, name: &str, within: Duration) -> Result<()> {
    ctx.wait_for(&format!("pod {name} Running"), within, || async {
        let pod = ctx.api::<Pod>().get(name).await?;
        let phase = pod.status.and_then(|s| s.phase);
        Ok((phase.as_deref() == Some("Running")).then_some(()))
    })
    .await
}

/// The node's whole cards offered now (published and not tainted).
fn offered_wholes(slices: &[ResourceSlice]) -> Vec<String> {
    slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .map(|d| d.name.clone())
        .filter(|d| {
            d.strip_prefix("gpu-")
                .is_some_and(|i| i.parse::<u32>().is_ok())
        })
        .filter(|d| usable(slices, d))
        .collect()
}

/// The pods of `names` bound to a node.
async fn bound(ctx: &TestContext, names: &[String]) -> Result<BTreeSet<String>> {
    let pods = ctx.api::<Pod>().list(&ListParams::default()).await?.items;
    Ok(pods
        .into_iter()
        .filter(|p| names.contains(&p.name_any()))
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some())
        .map(|p| p.name_any())
        .collect())
}

/// A faulted card leaves the pool; a burst of 50 whole-card claims on the node then gets every
/// other card once, each container seeing exactly its own, and the rest stay Pending with the
/// scheduler's reason; the healed card comes back and goes to one of them.
async fn real_node_dra_cards_are_never_given_twice_nor_while_faulted(
    ctx: TestContext,
) -> Result<()> {
    on_dra_node(ctx, |ctx, node| async move {
        let wholes = offered_wholes(&slices_of(&ctx, &node.name).await?);
        ensure!(wholes.len() >= 2, "cards to give: {wholes:?}");
        let faulted = wholes.last().context("a card")?.clone();
        let index = card_of(&faulted).context("its index")?;
        let mut faults = runtimekit_resource_layer::fault_client(&node.layer_socket).await?;
        faults
            .inject_fault(pb::InjectFaultRequest {
                device_index: index,
                kind: pb::FaultKind::Xid.into(),
                xid: 79,
                ..Default::default()
            })
            .await?;
        ctx.wait_for("the faulted card out of the pool", WAIT, || async {
            Ok((!usable(&slices_of(&ctx, &node.name).await?, &faulted)).then_some(()))
        })
        .await?;

        claim_template(&ctx, "one", DRIVER, 1, None)?;
        let script = format!("{SHOW}; {SHOW_AND_STAY}");
        let names: Vec<String> = (0..50).map(|i| format!("burst-{i}")).collect();
        for name in &names {
            create(&ctx, &claim_pod(name, &node.name, "one", &script)?).await?;
        }
        let first = wholes.len() - 1;
        let placed = ctx
            .wait_for("every card but the faulted one given", WAIT, || async {
                let placed = bound(&ctx, &names).await?;
                Ok((placed.len() >= first).then_some(placed))
            })
            .await?;
        let waiting = names
            .iter()
            .find(|n| !placed.contains(*n))
            .context("a pod left")?;
        let reason = says(&ctx, waiting, "cannot allocate all claims").await?;
        let mut given = BTreeSet::new();
        for name in &placed {
            let device = only_device(&allocated_claim(&ctx, name, Some("gpu")).await?)?;
            ensure!(device != faulted, "{name} got the faulted card");
            ensure!(given.insert(device.clone()), "{device} given twice");
            running_within(&ctx, name, BURST_START).await?;
            let seen = shown(&ctx, name).await?;
            let card = format!("nvidia{}", card_of(&device).context("a card")?);
            ensure!(
                seen.cards == BTreeSet::from([card.clone()]),
                "{name} sees {card} only: {seen:?}"
            );
        }
        ensure!(
            bound(&ctx, &names).await?.len() == first,
            "only {first} of 50 placed; the others wait: {reason}"
        );

        faults
            .clear_fault(pb::ClearFaultRequest {
                device_index: index,
                ..Default::default()
            })
            .await?;
        let healed = ctx
            .wait_for("the healed card given to a waiting pod", WAIT, || async {
                let now = bound(&ctx, &names).await?;
                Ok((now.len() > first).then_some(now))
            })
            .await?;
        ensure!(healed.len() == first + 1, "one more pod: {healed:?}");
        let late = healed.difference(&placed).next().context("the new one")?;
        let device = only_device(&allocated_claim(&ctx, late, Some("gpu")).await?)?;
        ensure!(device == faulted, "{late} got the healed card: {device}");

        let mut uids = Vec::new();
        for name in &healed {
            uids.push(claim_of(&ctx, name).await?.uid().unwrap_or_default());
        }
        delete_pods(&ctx, &names).await?;
        unprepared(&ctx, &node, &uids).await
    })
    .await
}

/// Claims a user gets wrong: shares beyond a card's range are refused at admission; more memory
/// than any card has, an unknown DeviceClass and a selector on an attribute no device has keep
/// the pod Pending with the scheduler's reason; configuration the driver cannot read fails the
/// prepare with the driver's message and leaves nothing on the node, while a good one is
/// applied.
async fn real_node_dra_bad_claims_say_why_and_prepare_nothing(ctx: TestContext) -> Result<()> {
    on_dra_node(ctx, |ctx, node| async move {
        let share = |capacity: serde_json::Value| {
            json!({"deviceClassName": format!("share.{DRIVER}"), "capacity": {"requests": capacity}})
        };
        for (name, devices, expected) in [
            (
                "over",
                json!({"requests": [{"name": "gpu", "exactly": share(json!({"core": "150"}))}]}),
                "request gpu: capacity core is a whole percent of one card, 1 to 100; got 150",
            ),
            (
                "half",
                json!({"requests": [{"name": "gpu", "firstAvailable": [
                    {"name": "big", "deviceClassName": DRIVER},
                    {"name": "half", "deviceClassName": format!("share.{DRIVER}"),
                        "capacity": {"requests": {"core": "0.5", "memory": "0"}}}]}]}),
                "request gpu/half: capacity core is a whole percent of one card, 1 to 100; got 500m; request gpu/half: capacity memory must be a positive quantity",
            ),
        ] {
            let object = json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": name, "namespace": ctx.namespace},
                "spec": {"spec": {"devices": devices}},
            });
            // The policy applied with the DeviceClasses takes a moment to be in force.
            let refused = ctx
                .wait_for(&format!("{name} refused"), WAIT, || async {
                    let output = ctx.kubectl(&["create", "-f", "-"], Some(&object.to_string()))?;
                    if output.status.success() {
                        ctx.kubectl_ok(&["delete", "resourceclaimtemplate", name], None)?;
                        return Ok(None);
                    }
                    Ok(Some(String::from_utf8_lossy(&output.stderr).into_owned()))
                })
                .await?;
            ensure!(
                refused.contains(expected),
                "{name} is refused saying {expected:?}: {refused}"
            );
        }

        let selector = format!("device.attributes[\"{DRIVER}\"].colour == \"red\"");
        let config = |policy: &str| {
            json!([{"requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": {
                "apiVersion": format!("{DRIVER}/v1alpha1"), "kind": "ShareConfig",
                "corePolicy": policy}}}])
        };
        let small = share(json!({"core": "10", "memory": "1Gi"}));
        for (name, devices) in [
            (
                "toobig",
                json!({"requests": [{"name": "gpu", "exactly": share(json!({"core": "10", "memory": "200Gi"}))}]}),
            ),
            (
                "noclass",
                json!({"requests": [{"name": "gpu", "exactly": {"deviceClassName": format!("nosuch.{DRIVER}")}}]}),
            ),
            (
                "noattr",
                json!({"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER,
                    "selectors": [{"cel": {"expression": selector}}]}}]}),
            ),
            (
                "badconfig",
                json!({"requests": [{"name": "gpu", "exactly": small}], "config": config("Sometimes")}),
            ),
            (
                "yield",
                json!({"requests": [{"name": "gpu", "exactly": small}], "config": config("YieldIdle")}),
            ),
        ] {
            template(&ctx, name, devices)?;
            let script = format!("{SHOW}; {SHOW_AND_STAY}");
            create(&ctx, &claim_pod(&format!("dra-{name}"), &node.name, name, &script)?).await?;
        }
        says(&ctx, "dra-toobig", "cannot allocate all claims").await?;
        says(&ctx, "dra-noclass", &format!("nosuch.{DRIVER}")).await?;
        says(&ctx, "dra-noattr", "colour").await?;
        let badconfig = says(&ctx, "dra-badconfig", "unknown variant `Sometimes`").await?;
        ensure!(
            badconfig.contains("ShareConfig"),
            "the driver says what it reads: {badconfig}"
        );
        wait_phase(&ctx, "dra-yield", "Running").await?;
        let seen = shown(&ctx, "dra-yield").await?;
        ensure!(
            seen.var("RUNTIMEKIT_GPU_CORE_POLICY") == Some("yield-idle"),
            "the claim's core policy: {seen:?}"
        );
        let mut uids = Vec::new();
        for name in ["dra-toobig", "dra-noclass", "dra-noattr", "dra-badconfig"] {
            let pod = ctx.api::<Pod>().get(name).await?;
            let phase = pod.status.and_then(|s| s.phase).unwrap_or_default();
            ensure!(phase == "Pending", "{name} does not run: {phase}");
            let uid = claim_of(&ctx, name).await?.uid().unwrap_or_default();
            let made = made_for(&node, &uid).await?;
            ensure!(made.is_empty(), "nothing is made for {name}: {made:?}");
            uids.push(uid);
        }
        uids.push(claim_of(&ctx, "dra-yield").await?.uid().unwrap_or_default());
        let names: Vec<String> = ["toobig", "noclass", "noattr", "badconfig", "yield"]
            .map(|n| format!("dra-{n}"))
            .to_vec();
        delete_pods(&ctx, &names).await?;
        unprepared(&ctx, &node, &uids).await
    })
    .await
}

/// The spec's GPU+RDMA rule as a claim, on the node simulating eight PPU M890P on four PCIe
/// switches with one NIC each: a card and a NIC constrained to the same `pcieSwitch` get a
/// pair under one switch, and the container sees that card and that NIC's files.
async fn real_node_dra_card_and_nic_under_one_pcie_switch(ctx: TestContext) -> Result<()> {
    const M890P: &str = "ppu-m890p-8";
    on_dra_node(ctx, |ctx, node| async move {
        let count = registrations(&node)?;
        ctx.switch_real_node_profile(&node, M890P)?;
        let outcome = pair_on_m890p(&ctx, &node, count).await;
        let count = registrations(&node)?;
        ctx.switch_real_node_profile(&node, PROFILE)?;
        registered_after(&ctx, &node, count).await?;
        outcome
    })
    .await
}

async fn pair_on_m890p(ctx: &TestContext, node: &RealNode, count: usize) -> Result<()> {
    let slices = ctx
        .wait_for("the M890P cards and NICs published", WAIT, || async {
            let slices = slices_of(ctx, &node.name).await?;
            let names: Vec<String> = slices
                .iter()
                .flat_map(|s| s.spec.devices.iter().flatten())
                .map(|d| d.name.clone())
                .collect();
            let ppu = offered_wholes(&slices).len() == 8
                && names.iter().filter(|n| n.starts_with("nic-")).count() == 4
                && serde_json::to_string(&slices)?.contains("PPU-M890P");
            Ok(ppu.then_some(slices))
        })
        .await?;
    registered_after(ctx, node, count).await?;
    template(
        ctx,
        "pair",
        json!({
            "requests": [
                {"name": "card", "exactly": {"deviceClassName": DRIVER}},
                {"name": "nic", "exactly": {"deviceClassName": format!("rdma.{DRIVER}")}},
            ],
            "constraints": [{"requests": ["card", "nic"],
                "matchAttribute": format!("{DRIVER}/pcieSwitch")}],
        }),
    )?;
    let mut pod = claim_pod(
        "dra-pair",
        &node.name,
        "pair",
        &format!("{SHOW}; {SHOW_AND_STAY}"),
    )?;
    pod.spec.as_mut().context("a spec")?.host_network = Some(true);
    create(ctx, &pod).await?;
    let claim = allocated_claim(ctx, "dra-pair", Some("gpu")).await?;
    let devices: Vec<String> = devices_of(&claim).into_iter().map(|(_, d)| d).collect();
    let card = devices
        .iter()
        .find(|d| d.starts_with("gpu-"))
        .context("a card")?;
    let nic = devices
        .iter()
        .find(|d| d.starts_with("nic-"))
        .context("a NIC")?;
    let switch = |device: &str| string_attribute(&slices, device, ATTR_PCIE_SWITCH);
    ensure!(
        devices.len() == 2 && switch(card).is_some() && switch(card) == switch(nic),
        "a card and a NIC under one PCIe switch: {devices:?}"
    );
    // Cards 2k and 2k+1 and NIC mlx5_k share switch k.
    let index = card_of(card).context("the card's index")?;
    let name = format!("mlx5_{}", index / 2);
    ensure!(
        *nic == format!("nic-{}", name.replace('_', "-")),
        "{nic} is {name}"
    );
    wait_phase(ctx, "dra-pair", "Running").await?;
    let seen = shown(ctx, "dra-pair").await?;
    let uuid = string_attribute(&slices, card, ATTR_UUID).context("the card's UUID")?;
    ensure!(
        seen.var("RUNTIMEKIT_VISIBLE_DEVICES") == Some(uuid.as_str())
            && seen.var("RUNTIMEKIT_RDMA_DEVICES") == Some(name.as_str())
            && seen.ib.contains("rdma_cm")
            && seen.ib.iter().filter(|f| f.starts_with("uverbs")).count() == 1,
        "the container sees card {index} and {name}: {seen:?}"
    );
    let uid = claim.uid().unwrap_or_default();
    delete_pods(ctx, &["dra-pair".into()]).await?;
    ctx.wait_for("the pair's claim unprepared", WAIT, || async {
        Ok((!cdi_spec(node, &uid).exists()).then_some(()))
    })
    .await
}
