//! `helm upgrade` from the previous release, as a user upgrades: the previous release's chart
//! and images (built from its commit) installed on the real node, with kwok nodes beside it;
//! pods of every kind running; the CRDs applied and the chart upgraded while pods keep coming.
//! Nothing that runs restarts or loses what it holds, and the new release places every kind.

use crate::real_node::{
    SHOW, Seen, bare_node, containerd_pid, example, helm_uninstall, instance_keys, wait_phase,
};
use anyhow::{Context, Result, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{DeleteParams, ListParams, PostParams};
use runtimekit_crds::{GangGroup, GangPhase, GpuSlice, TopologyGroup};
use runtimekit_e2e::cluster::deploy::{RELEASE_NAMESPACE, wait_kit_running};
use runtimekit_e2e::cluster::previous::{PREVIOUS_VERSION, previous_release};
use runtimekit_e2e::cluster::simulated::SimulatedNode;
use runtimekit_e2e::harness::Test;
use runtimekit_e2e::real_node::{ENABLE_LABEL, RealNode};
use runtimekit_e2e::tools::repo_root;
use runtimekit_e2e::{TestContext, tests};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

pub const TESTS: &[Test] = tests![real_node_helm_upgrade_from_the_previous_release_keeps_what_runs];

const WAIT: Duration = Duration::from_secs(90);

/// How long the kit's pods may take to be replaced.
const KIT_WAIT: Duration = Duration::from_secs(240);

/// The label of the kwok nodes the gangs go to.
const FLEET_LABEL: &str = "upgrade-fleet";

/// What a running pod is: its UID, and each container's ID and restarts.
fn identity(pod: &Pod) -> (String, Vec<(String, i32)>) {
    let containers = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .map(|c| {
            c.iter()
                .map(|c| (c.container_id.clone().unwrap_or_default(), c.restart_count))
                .collect()
        })
        .unwrap_or_default();
    (pod.uid().unwrap_or_default(), containers)
}

/// A whole-card pod for the kwok nodes, in gang `gang` of `min_member` when given.
fn kwok_pod(name: &str, gang: Option<(&str, u32)>) -> Result<Pod> {
    let mut labels = serde_json::Map::new();
    if let Some((gang, min_member)) = gang {
        labels.insert("aliyun.com/gang-name".into(), json!(gang));
        labels.insert(
            "aliyun.com/min-member".into(),
            json!(min_member.to_string()),
        );
    }
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
        "spec": {
            "schedulerName": "lj-runtimekit-scheduler", "runtimeClassName": "lj-runtime",
            "nodeSelector": {FLEET_LABEL: "true"},
            "containers": [{"name": "app", "image": "busybox",
                "resources": {"limits": {"aliyun.com/gpu": "1"}}}],
        },
    }))?)
}

/// The usage guide's whole-card, TDM and MIG examples on the real node, named `<prefix>-...`.
async fn real_node_pods(ctx: &TestContext, node: &RealNode, prefix: &str) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for (seed, kind) in [
        ("3.1-whole-card.yaml", "whole"),
        ("3.2-tdm.yaml", "tdm"),
        ("3.3-mig.yaml", "mig"),
    ] {
        let name = format!("{prefix}-{kind}");
        let pod = example(seed, &name, &node.name, &format!("{SHOW}; sleep 3600"))?;
        ctx.api::<Pod>()
            .create(&PostParams::default(), &serde_json::from_value(pod)?)
            .await?;
        names.push(name);
    }
    for name in &names {
        wait_phase(ctx, name, "Running").await?;
    }
    Ok(names)
}

/// A gang of four whole cards on the kwok nodes, Running.
async fn running_gang(ctx: &TestContext, gang: &str) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for i in 0..4 {
        let name = format!("{gang}-{i}");
        ctx.api::<Pod>()
            .create(&PostParams::default(), &kwok_pod(&name, Some((gang, 4)))?)
            .await?;
        names.push(name);
    }
    ctx.wait_for(&format!("gang {gang} Running"), WAIT, || async {
        let group = ctx.api::<GangGroup>().get_opt(gang).await?;
        Ok(group
            .and_then(|g| g.status)
            .filter(|s| s.phase == Some(GangPhase::Running))
            .map(|_| ()))
    })
    .await?;
    Ok(names)
}

/// The slices of the test's namespace, by name: UID and MIG device.
async fn slices(ctx: &TestContext) -> Result<BTreeMap<String, (String, Option<String>)>> {
    Ok(ctx
        .api::<GpuSlice>()
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|s| {
            let mig = s
                .status
                .as_ref()
                .and_then(|st| st.mig_instance.as_ref())
                .map(|m| m.device_uuid.clone());
            (s.name_any(), (s.uid().unwrap_or_default(), mig))
        })
        .collect())
}

/// The MIG devices the real node's TopologyGroup reports.
async fn reported_instances(ctx: &TestContext, node: &str) -> Result<BTreeSet<String>> {
    let group = ctx.cluster_api::<TopologyGroup>().get(node).await?;
    Ok(group
        .status
        .iter()
        .flat_map(|s| &s.cards)
        .flat_map(|c| &c.mig_instances)
        .filter_map(|i| i.device_uuid.clone())
        .collect())
}

/// The scheduler Lease's holder.
async fn leader(ctx: &TestContext) -> Result<String> {
    let lease = kube::Api::<Lease>::namespaced(ctx.client.clone(), RELEASE_NAMESPACE)
        .get("lj-runtimekit-scheduler")
        .await?;
    lease
        .spec
        .and_then(|s| s.holder_identity)
        .context("the Lease has no holder")
}

async fn real_node_helm_upgrade_from_the_previous_release_keeps_what_runs(
    ctx: TestContext,
) -> Result<()> {
    let node = ctx.real_node().await?;
    bare_node(&ctx, &node).await?;
    let previous = tokio::task::spawn_blocking(previous_release).await??;
    for (reference, tar) in &previous.images {
        node.import(reference, tar)?;
    }
    let fleet: Vec<SimulatedNode> = (0..3)
        .map(|i| SimulatedNode {
            name: format!("upgrade-kwok-{i}"),
            profile: "h800-8".into(),
            labels: [(ENABLE_LABEL, "true"), (FLEET_LABEL, "true")]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        })
        .collect();
    ctx.start_simulated_nodes(&fleet)?;
    ctx.install_chart(&node, &previous.chart(), PREVIOUS_VERSION, &[])?;
    wait_kit_running(&ctx.client, Some(PREVIOUS_VERSION), KIT_WAIT).await?;

    // What runs under the previous release.
    let mut running = real_node_pods(&ctx, &node, "old").await?;
    running.extend(running_gang(&ctx, "old-gang").await?);
    let mut before = BTreeMap::new();
    for name in &running {
        before.insert(name.clone(), identity(&ctx.api::<Pod>().get(name).await?));
    }
    let slices_before = slices(&ctx).await?;
    let instances_before = instance_keys(&node).await?;
    let reported_before = reported_instances(&ctx, &node.name).await?;
    // The resource layer holds one instance per share (the TDM pod's and the MIG pod's); the
    // cards show the one MIG instance.
    ensure!(
        instances_before.len() == 2 && reported_before.len() == 1,
        "one share each for the TDM and the MIG pod: {instances_before:?}, {reported_before:?}"
    );
    let leader_before = leader(&ctx).await?;
    let lj_runtime = node.dir.join("bin/lj-runtime");
    let containerd = || containerd_pid(&node.containerd_socket);
    let containerd_before = containerd()?;

    // While the upgrade runs: the gang is watched, and a whole-card pod is created every few
    // seconds, through the operator's hand-over.
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (ctx, stop) = (ctx.clone(), stop.clone());
        tokio::spawn(async move {
            let mut phases = BTreeSet::new();
            let mut created = Vec::new();
            let mut tick = 0u32;
            while !stop.load(Ordering::Relaxed) {
                if let Ok(Some(gang)) = ctx.api::<GangGroup>().get_opt("old-gang").await {
                    phases.insert(format!("{:?}", gang.status.and_then(|s| s.phase)));
                }
                if tick.is_multiple_of(10) && created.len() < 6 {
                    let name = format!("during-{}", created.len());
                    if let Ok(pod) = kwok_pod(&name, None)
                        && ctx
                            .api::<Pod>()
                            .create(&PostParams::default(), &pod)
                            .await
                            .is_ok()
                    {
                        created.push(name);
                    }
                }
                tick += 1;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            (phases, created)
        })
    };
    // The user guide's upgrade: the CRDs first (Helm never upgrades them), then the chart.
    let crds = repo_root().join("config/helm/runtimekit/crds");
    ctx.kubectl_ok(
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            crds.to_str().context("path")?,
        ],
        None,
    )?;
    ctx.deploy_chart(&node, &[])?;
    let version = env!("CARGO_PKG_VERSION");
    wait_kit_running(&ctx.client, Some(version), KIT_WAIT).await?;
    stop.store(true, Ordering::Relaxed);
    let (phases, during) = watcher.await?;

    // Nothing that ran restarted, lost its slice or instance, or got another.
    for (name, was) in &before {
        let pod = ctx.api::<Pod>().get(name).await?;
        ensure!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                && &identity(&pod) == was,
            "{name} did not run on through the upgrade: was {was:?}, is {:?}",
            identity(&pod)
        );
    }
    ensure!(
        !phases.is_empty() && phases.iter().all(|p| p == "Some(Running)"),
        "the gang left Running during the upgrade (or was never seen): {phases:?}"
    );
    // The old pods' slices (pods created meanwhile have their own): the same, and no more.
    let old_slices: BTreeMap<_, _> = slices(&ctx)
        .await?
        .into_iter()
        .filter(|(name, _)| name.starts_with("old-"))
        .collect();
    ensure!(
        old_slices == slices_before,
        "the slices changed: {slices_before:?} before, {old_slices:?} after"
    );
    ensure!(
        instance_keys(&node).await? == instances_before
            && reported_instances(&ctx, &node.name).await? == reported_before,
        "the MIG instances changed: {instances_before:?}"
    );
    // The operator handed over: the new pod holds the Lease, and every pod created meanwhile
    // was placed.
    let leader_after = leader(&ctx).await?;
    let holder = kube::Api::<Pod>::namespaced(ctx.client.clone(), RELEASE_NAMESPACE)
        .get_opt(&leader_after)
        .await?;
    ensure!(
        leader_after != leader_before && holder.is_some(),
        "the Lease: {leader_before} before, {leader_after} after"
    );
    ensure!(!during.is_empty(), "no pod was created during the upgrade");
    for name in &during {
        wait_phase(&ctx, name, "Running").await?;
    }
    // The installer of the new release replaced lj-runtime and left containerd running.
    let said = std::process::Command::new(&lj_runtime)
        .arg("--version")
        .output()?;
    let said = String::from_utf8_lossy(&said.stdout).into_owned();
    ensure!(
        said.contains(&format!("lj-runtime version {version}")),
        "lj-runtime is not the new release's: {said}"
    );
    ensure!(
        containerd()? == containerd_before,
        "the upgrade restarted containerd"
    );

    // The new release places every kind: whole card, TDM, MIG and a gang.
    real_node_pods(&ctx, &node, "new").await?;
    let log = ctx.kubectl_ok(&["logs", "new-tdm"], None)?;
    ensure!(
        Seen::read(&log).var("RUNTIMEKIT_GPU_CORE_LIMIT").is_some(),
        "the new TDM pod's report:\n{log}"
    );
    ensure!(
        instance_keys(&node).await?.len() == 4,
        "a share each for the new TDM and MIG pods"
    );
    ctx.wait_for("the second MIG instance reported", WAIT, || async {
        Ok((reported_instances(&ctx, &node.name).await?.len() == 2).then_some(()))
    })
    .await?;
    running_gang(&ctx, "new-gang").await?;

    // Then the kit goes: every pod first (the uninstall refuses while they run), the release,
    // and the node's setup with it.
    ctx.api::<Pod>()
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await?;
    ctx.wait_for("the test's pods gone", WAIT, || async {
        let left = ctx.api::<Pod>().list(&ListParams::default()).await?.items;
        Ok(left.is_empty().then_some(()))
    })
    .await?;
    let uninstalled = helm_uninstall(&ctx)?;
    ensure!(uninstalled.0, "helm uninstall failed:\n{}", uninstalled.1);
    ensure!(
        !lj_runtime.exists(),
        "helm uninstall left lj-runtime on the node"
    );
    Ok(())
}
