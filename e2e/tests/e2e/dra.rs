//! DRA: a node labelled `aliyun.com/device-api=dra` publishes its cards as ResourceSlices, and
//! the real kube-scheduler allocates them to ResourceClaims (whole cards, time-division
//! shares) and to unchanged pods asking for `nvidia.com/gpu` through the DeviceClasses of
//! `config/dra`; the node's whole cards leave the device plugin; a faulted card is tainted (or
//! withdrawn before 1.36); the slices go with the node.

use crate::node_agent::AgentNode;
use crate::plugin::plugin;
use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{DeleteParams, ListParams, PostParams};
use runtimekit_e2e::harness::Test;
use runtimekit_e2e::workspace_binary::workspace_binary;
use runtimekit_e2e::{TestContext, tests};
use runtimekit_proto::resource::v1alpha1 as pb;
use serde_json::json;
use std::collections::BTreeSet;
use std::time::Duration;

pub const TESTS: &[Test] = tests![dra_node_publishes_its_cards_for_kube_scheduler];

const WAIT: Duration = Duration::from_secs(60);
const DRIVER: &str = "gpu.runtimekit.aliyun.com";
pub(crate) const DEVICE_API_LABEL: &str = "aliyun.com/device-api";

/// Applies `config/dra` as a user does.
pub(crate) fn apply_device_classes(ctx: &TestContext) -> Result<()> {
    let dir = runtimekit_e2e::tools::repo_root().join("config/dra");
    ctx.kubectl_ok(
        &["apply", "--server-side", "-k", &dir.display().to_string()],
        None,
    )?;
    Ok(())
}

/// The node's ResourceSlices of the kit's driver.
pub(crate) async fn slices_of(ctx: &TestContext, node: &str) -> Result<Vec<ResourceSlice>> {
    let fields = format!("spec.nodeName={node},spec.driver={DRIVER}");
    Ok(ctx
        .cluster_api::<ResourceSlice>()
        .list(&ListParams::default().fields(&fields))
        .await?
        .items)
}

/// Every device name the node's slices publish.
fn device_names(slices: &[ResourceSlice]) -> BTreeSet<String> {
    slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .map(|d| d.name.clone())
        .collect()
}

/// A ResourceClaimTemplate of one request of `class`, with `count` devices and, for shares,
/// the capacity each asks.
pub(crate) fn claim_template(
    ctx: &TestContext,
    name: &str,
    class: &str,
    count: u32,
    capacity: Option<serde_json::Value>,
) -> Result<()> {
    let mut exactly = json!({"deviceClassName": class, "count": count});
    if let Some(capacity) = capacity {
        exactly["capacity"] = json!({"requests": capacity});
    }
    template(
        ctx,
        name,
        json!({"requests": [{"name": "gpu", "exactly": exactly}]}),
    )
}

/// A ResourceClaimTemplate whose claims ask for `devices` (a `DeviceClaim`).
pub(crate) fn template(ctx: &TestContext, name: &str, devices: serde_json::Value) -> Result<()> {
    let template = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": ctx.namespace},
        "spec": {"spec": {"devices": devices}},
    });
    ctx.kubectl_ok(
        &["apply", "--server-side", "-f", "-"],
        Some(&template.to_string()),
    )?;
    Ok(())
}

/// A pod of the default scheduler on `node`, with a claim from `template`, running `script`
/// (`image` and `command` matter on a real node only).
pub(crate) fn claim_pod(name: &str, node: &str, template: &str, script: &str) -> Result<Pod> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "restartPolicy": "Never", "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
            "containers": [{"name": "main", "image": "docker.io/local/busybox:1",
                "imagePullPolicy": "Never", "command": ["/bin/sh", "-c", script],
                "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }))?)
}

/// Waits until the pod is bound and its claim allocated: the claim the pod names `claim`, or
/// with `None` the one kube-scheduler made for its extended resources; returns the claim.
pub(crate) async fn allocated_claim(
    ctx: &TestContext,
    pod: &str,
    claim: Option<&str>,
) -> Result<ResourceClaim> {
    let pods = ctx.api::<Pod>();
    let claims = ctx.api::<ResourceClaim>();
    let what = claim.unwrap_or("of its extended resources");
    ctx.wait_for(
        &format!("pod {pod} bound with claim {what} allocated"),
        WAIT,
        || async {
            let object = pods.get(pod).await?;
            if object
                .spec
                .as_ref()
                .and_then(|s| s.node_name.as_ref())
                .is_none()
            {
                return Ok(None);
            }
            let status = object.status.unwrap_or_default();
            let name = match claim {
                Some(claim) => status
                    .resource_claim_statuses
                    .unwrap_or_default()
                    .into_iter()
                    .find(|c| c.name == claim)
                    .and_then(|c| c.resource_claim_name),
                None => status
                    .extended_resource_claim_status
                    .map(|s| s.resource_claim_name),
            };
            let Some(name) = name else {
                return Ok(None);
            };
            let object = claims.get(&name).await?;
            let allocated = object
                .status
                .as_ref()
                .is_some_and(|s| s.allocation.is_some());
            Ok(allocated.then_some(object))
        },
    )
    .await
}

/// Whether the slices offer `device` to new claims: published, and not tainted by the driver
/// (a faulted card is tainted from 1.36, withdrawn before).
pub(crate) fn usable(slices: &[ResourceSlice], device: &str) -> bool {
    slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .find(|d| d.name == device)
        .is_some_and(|d| {
            !d.taints
                .as_ref()
                .is_some_and(|t| t.iter().any(|t| t.key == format!("{DRIVER}/unhealthy")))
        })
}

/// A string attribute of a device the slices publish (`uuid`, `pcieSwitch`).
pub(crate) fn string_attribute(
    slices: &[ResourceSlice],
    device: &str,
    attribute: &str,
) -> Option<String> {
    slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .find(|d| d.name == device)
        .and_then(|d| d.attributes.as_ref()?.get(attribute)?.string.clone())
}

/// The devices a claim was given from the kit's driver.
pub(crate) fn devices_of(claim: &ResourceClaim) -> Vec<(String, String)> {
    runtimekit_contract::dra::allocated(claim, DRIVER)
        .map(|r| (r.pool.clone(), r.device.clone()))
        .collect()
}

async fn dra_node_publishes_its_cards_for_kube_scheduler(ctx: TestContext) -> Result<()> {
    apply_device_classes(&ctx)?;
    let node = AgentNode::start_dra(&ctx, "dra", "h800-8", DEVICE_API_LABEL).await?;
    let uuids = node.uuids(&ctx).await?;
    let slices = ctx
        .wait_for("the node's ResourceSlices", WAIT, || async {
            let slices = slices_of(&ctx, &node.name).await?;
            let count = slices
                .first()
                .map_or(0, |s| s.spec.pool.resource_slice_count);
            Ok((!slices.is_empty() && count as usize == slices.len()).then_some(slices))
        })
        .await?;
    let names = device_names(&slices);
    for index in 0..uuids.len() {
        let mig = names
            .iter()
            .any(|n| n.starts_with(&format!("gpu-{index}-mig-")));
        let whole = names.contains(&format!("gpu-{index}"))
            && names.contains(&format!("gpu-{index}-share"));
        ensure!(
            mig != whole,
            "card {index} is offered whole and shared, or (in MIG mode) as placements: {names:?}"
        );
    }
    ensure!(
        names.iter().any(|n| n.contains("-mig-")) && names.iter().any(|n| n.starts_with("nic-")),
        "MIG placements and NICs are devices too: {names:?}"
    );
    let generations: BTreeSet<i64> = slices.iter().map(|s| s.spec.pool.generation).collect();
    ensure!(generations.len() == 1, "one generation: {generations:?}");
    let card0 = slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .find(|d| d.name == "gpu-0")
        .context("gpu-0")?;
    let attribute = |name: &str| {
        card0
            .attributes
            .as_ref()
            .and_then(|a| a.get(name))
            .map(|v| serde_json::to_value(v).unwrap_or_default())
    };
    ensure!(
        attribute("uuid") == Some(json!({"string": uuids[0]})),
        "gpu-0 names its card: {:?}",
        card0.attributes
    );
    for name in [
        "productName",
        "vendor",
        "migCapable",
        "healthy",
        "pcieSwitch",
        "numaNode",
    ] {
        ensure!(
            attribute(name).is_some(),
            "gpu-0 has {name}: {:?}",
            card0.attributes
        );
    }
    // Whole cards left the device plugin; shares and MIG stay there.
    ctx.wait_for("whole cards out of the node's capacity", WAIT, || async {
        let object = ctx.cluster_api::<Node>().get(&node.name).await?;
        let capacity = object.status.and_then(|s| s.capacity).unwrap_or_default();
        let whole =
            capacity.contains_key("nvidia.com/gpu") || capacity.contains_key("aliyun.com/gpu");
        Ok((!whole && capacity.contains_key("aliyun.com/gpu-core")).then_some(()))
    })
    .await?;

    // Two whole cards for a claim from a template.
    claim_template(&ctx, "whole", DRIVER, 2, None)?;
    ctx.api::<Pod>()
        .create(
            &PostParams::default(),
            &claim_pod("whole", &node.name, "whole", "true")?,
        )
        .await?;
    let whole = allocated_claim(&ctx, "whole", Some("gpu")).await?;
    let given = devices_of(&whole);
    ensure!(
        given.len() == 2
            && given.iter().all(|(pool, device)| *pool == node.name
                && device.starts_with("gpu-")
                && !device.contains("-share")),
        "two whole cards of the node's pool: {given:?}"
    );
    // Two shares of 60% cannot share one card.
    claim_template(
        &ctx,
        "share",
        &format!("share.{DRIVER}"),
        1,
        Some(json!({"core": "60", "memory": "8Gi"})),
    )?;
    let mut shared = Vec::new();
    for name in ["share-a", "share-b"] {
        ctx.api::<Pod>()
            .create(
                &PostParams::default(),
                &claim_pod(name, &node.name, "share", "true")?,
            )
            .await?;
        let claim = allocated_claim(&ctx, name, Some("gpu")).await?;
        shared.extend(devices_of(&claim));
    }
    let share_cards: BTreeSet<&str> = shared.iter().map(|(_, d)| d.as_str()).collect();
    ensure!(
        share_cards.len() == 2 && share_cards.iter().all(|d| d.ends_with("-share")),
        "60% + 60% go to two cards: {shared:?}"
    );
    let held: BTreeSet<String> = given.iter().map(|(_, d)| d.clone()).collect();
    ensure!(
        share_cards
            .iter()
            .all(|d| !held.contains(d.trim_end_matches("-share"))),
        "a card given whole is not shared too: {given:?} {shared:?}"
    );
    // An unchanged pod asking nvidia.com/gpu gets a card through the extended resource.
    let unchanged: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "unchanged"},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": node.name},
            "containers": [{"name": "main", "image": "busybox",
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }))?;
    ctx.api::<Pod>()
        .create(&PostParams::default(), &unchanged)
        .await?;
    let extended = allocated_claim(&ctx, "unchanged", None).await?;
    let card = devices_of(&extended);
    ensure!(
        card.len() == 1
            && card[0].1.starts_with("gpu-")
            && !card[0].1.contains("-share")
            && !held.contains(&card[0].1),
        "nvidia.com/gpu: 1 is a free whole card of the DRA node: {card:?} (held {given:?})"
    );

    // `kubectl gpu` shows what the claims hold beside the ledger's slices.
    let binary = workspace_binary("runtimekit-kubectl-gpu", "kubectl-gpu")?;
    let kubeconfig = ctx.kubeconfig_for("plugin-admin", &["system:masters"])?;
    let namespace = format!("--namespace={}", ctx.namespace);
    let rows: serde_json::Value = serde_json::from_str(&plugin(
        &binary,
        &kubeconfig,
        &["pods", &namespace, "-o", "json"],
    )?)?;
    let shown: BTreeSet<(String, String, String)> = rows
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            let text = |k: &str| r[k].as_str().unwrap_or_default().to_owned();
            (text("pod"), text("mode"), text("phase"))
        })
        .collect();
    for (pod, mode) in [
        ("whole", "Whole"),
        ("share-a", "TDM"),
        ("unchanged", "Whole"),
    ] {
        ensure!(
            shown.contains(&(pod.into(), mode.into(), "Claimed".into())),
            "kubectl gpu pods shows {pod}'s claim: {rows}"
        );
    }
    let nodes = plugin(&binary, &kubeconfig, &["nodes", "-o", "json"])?;
    ensure!(
        nodes.contains(&format!("{}/whole", ctx.namespace)),
        "kubectl gpu nodes names the pod holding a claimed card: {nodes}"
    );

    // A faulted card is tainted (1.36 and later) or withdrawn (1.35), and comes back healed.
    let free = (0..uuids.len())
        .map(|i| format!("gpu-{i}"))
        .find(|d| {
            !held.contains(d)
                && *d != card[0].1
                && !share_cards.contains(format!("{d}-share").as_str())
        })
        .context("a free card")?;
    let index: u32 = free[4..].parse()?;
    node.fault(index, pb::FaultKind::Xid, 79).await?;
    let offered = |slices: &[ResourceSlice]| {
        slices
            .iter()
            .flat_map(|s| s.spec.devices.iter().flatten())
            .find(|d| d.name == free)
            .map(|d| {
                d.taints
                    .as_ref()
                    .is_some_and(|t| t.iter().any(|t| t.key == format!("{DRIVER}/unhealthy")))
            })
    };
    // Device taints are on by default from 1.36; before, the card must leave the pool.
    let version = ctx.client.apiserver_version().await?;
    let taints = version.minor.trim_end_matches('+').parse::<u32>()? >= 36;
    let (faulted, expected) = if taints {
        ("the faulted card tainted", Some(true))
    } else {
        ("the faulted card withdrawn", None)
    };
    ctx.wait_for(faulted, WAIT, || async {
        let slices = slices_of(&ctx, &node.name).await?;
        Ok((offered(&slices) == expected).then_some(()))
    })
    .await?;
    node.clear(index).await?;
    ctx.wait_for("the healed card offered again", WAIT, || async {
        let slices = slices_of(&ctx, &node.name).await?;
        Ok((offered(&slices) == Some(false)).then_some(()))
    })
    .await?;

    // The slices go with the node.
    for pod in ["whole", "share-a", "share-b", "unchanged"] {
        ctx.api::<Pod>()
            .delete(pod, &DeleteParams::default().grace_period(0))
            .await?;
    }
    ctx.cluster_api::<Node>()
        .delete(&node.name, &DeleteParams::default())
        .await?;
    ctx.wait_for("the node's slices collected", WAIT, || async {
        Ok(slices_of(&ctx, &node.name).await?.is_empty().then_some(()))
    })
    .await?;
    Ok(())
}
