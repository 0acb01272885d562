//! The real node: containerd, runc, CNI, the `lj-runtime` handler and the kubelet on this
//! machine, with the kit's resource layer (simulated cards whose device files are stand-ins)
//! and node agent, registered in the shared control plane. Pods run as real containers; those
//! the operator places get exactly their allocation injected by lj-runtime.
//!
//! The node stays for the rest of the run once started, so these tests run last: no other
//! test sees its cards.

use crate::node_agent::shows_every_resource;
use crate::operator::with_operator;
use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{DeleteParams, PostParams};
use runtimekit_contract::allocation::Allocation;
use runtimekit_crds::{GpuSlice, TopologyGroup};
use runtimekit_e2e::cluster::deploy::{RELEASE, RELEASE_NAMESPACE};
use runtimekit_e2e::harness::Test;
use runtimekit_e2e::real_node::{ENABLE_LABEL, METRICS_PORT, RealNode};
use runtimekit_e2e::{TestContext, tests};
use runtimekit_proto::resource::v1alpha1 as pb;
use serde_json::json;
use std::collections::BTreeSet;
use std::time::Duration;

pub const TESTS: &[Test] = tests![
    real_node_runs_containers,
    real_node_usage_guide_pods_see_exactly_their_allocation,
    real_node_default_scheduler_whole_card_never_gets_a_sliced_card,
    real_node_lj_runtime_fails_a_pod_without_an_allocation,
    real_node_kubelet_restart_leaves_running_pods_and_serves_new_ones,
    real_node_deleted_mig_pod_gives_back_its_instance,
    real_node_runs_the_product_images,
    // It swaps the node's cards for PPU M890P ones.
    real_node_ppu_m890p_four_cards_with_rdma,
    // Last but the upgrade: it replaces the node's resource layer and agent processes with the
    // chart's pods.
    real_node_runs_the_kit_installed_with_its_chart,
];

const WAIT: Duration = Duration::from_secs(60);

/// A busybox pod on the real node, running `script`.
fn busybox_pod(name: &str, node: &str, script: &str) -> Result<Pod> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "nodeName": node, "restartPolicy": "Never", "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": "docker.io/local/busybox:1",
                "imagePullPolicy": "Never", "command": ["/bin/sh", "-c", script]}],
        },
    }))?)
}

/// Waits until pod `name` is in `phase`.
pub(crate) async fn wait_phase(ctx: &TestContext, name: &str, phase: &str) -> Result<Pod> {
    let pods = ctx.api::<Pod>();
    ctx.wait_for(&format!("pod {name} {phase}"), WAIT, || async {
        let pod = pods.get(name).await?;
        let now = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        Ok((now == Some(phase)).then_some(pod))
    })
    .await
}

async fn real_node_runs_containers(ctx: TestContext) -> Result<()> {
    let node = ctx.real_node().await?;
    let object = ctx.cluster_api::<Node>().get(&node.name).await?;
    ensure!(
        object
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(ENABLE_LABEL))
            .map(String::as_str)
            == Some("true"),
        "labelled for the kit: {:?}",
        object.metadata.labels
    );
    let info = object
        .status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .context("nodeInfo")?;
    ensure!(
        info.container_runtime_version.starts_with("containerd://"),
        "{}",
        info.container_runtime_version
    );
    let server = ctx.kubectl_ok(&["version", "-o", "json"], None)?;
    ensure!(
        server.contains(&format!("\"gitVersion\": \"{}\"", info.kubelet_version)),
        "the kubelet {} is at the control plane's version:\n{server}",
        info.kubelet_version
    );

    let pods = ctx.api::<Pod>();
    pods.create(
        &PostParams::default(),
        &busybox_pod(
            "hello",
            &node.name,
            "echo hello from $(hostname); cat /proc/1/cmdline",
        )?,
    )
    .await?;
    wait_phase(&ctx, "hello", "Succeeded").await?;
    let logs = ctx.kubectl_ok(&["logs", "hello"], None)?;
    ensure!(logs.starts_with("hello from hello"), "{logs}");

    pods.create(
        &PostParams::default(),
        &busybox_pod("sleeper", &node.name, "exec sleep 3600")?,
    )
    .await?;
    let running = wait_phase(&ctx, "sleeper", "Running").await?;
    let ip = running.status.and_then(|s| s.pod_ip).unwrap_or_default();
    ensure!(
        ip.starts_with("10.244."),
        "a pod address from the node's CNI network: {ip}"
    );
    let exec = ctx.kubectl_ok(
        &[
            "exec",
            "-n",
            &ctx.namespace,
            "sleeper",
            "--",
            "sh",
            "-c",
            "echo $((6 * 7))",
        ],
        None,
    )?;
    ensure!(exec.trim() == "42", "{exec}");
    pods.delete("sleeper", &DeleteParams::default()).await?;
    ctx.wait_for("the sleeper to be gone", WAIT, || async {
        Ok(pods.get_opt("sleeper").await?.is_none().then_some(()))
    })
    .await?;
    Ok(())
}

/// What a container of the kit prints about itself: its card device files, MIG capability
/// files, RDMA files and the kit's variables.
pub(crate) const SHOW: &str = "echo \"DEV $(cd /dev && ls -d nvidia[0-9]* 2>/dev/null | tr '\\n' ' ')\"; \
    echo \"CAPS $(ls /dev/nvidia-caps 2>/dev/null | tr '\\n' ' ')\"; \
    echo \"IB $(ls /dev/infiniband 2>/dev/null | tr '\\n' ' ')\"; \
    env | grep -E '^(NVIDIA|RUNTIMEKIT)_' | sort";

/// A usage-guide example as a pod that runs `script` on the real node: the image placeholder
/// replaced by the locally built busybox, and nothing else of the example changed.
pub(crate) fn example(
    seed: &str,
    name: &str,
    node: &str,
    script: &str,
) -> Result<serde_json::Value> {
    let path = runtimekit_e2e::tools::repo_root()
        .join("contract/tests/seeds")
        .join(seed);
    let text = std::fs::read_to_string(&path)?
        .replace("<your-image>", "docker.io/local/busybox:1")
        .replace("<your-training-image>", "docker.io/local/busybox:1");
    let mut pod: serde_json::Value = serde_yaml::from_str(&text)?;
    pod["metadata"]["name"] = json!(name);
    let spec = &mut pod["spec"];
    spec["restartPolicy"] = json!("Never");
    spec["automountServiceAccountToken"] = json!(false);
    spec["terminationGracePeriodSeconds"] = json!(1);
    spec["nodeSelector"] = json!({"kubernetes.io/hostname": node});
    for container in spec["containers"].as_array_mut().into_iter().flatten() {
        container["imagePullPolicy"] = json!("Never");
        container["command"] = json!(["/bin/sh", "-c", script]);
    }
    Ok(pod)
}

/// What a container showed, read from its log.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    pub(crate) cards: BTreeSet<String>,
    pub(crate) caps: usize,
    pub(crate) ib: BTreeSet<String>,
    pub(crate) env: Vec<(String, String)>,
}

impl Seen {
    pub(crate) fn read(log: &str) -> Seen {
        let words = |rest: &str| rest.split_whitespace().map(str::to_owned).collect();
        let mut seen = Seen::default();
        for line in log.lines() {
            if let Some(rest) = line.strip_prefix("DEV") {
                seen.cards = words(rest);
            } else if let Some(rest) = line.strip_prefix("CAPS") {
                seen.caps = rest.split_whitespace().count();
            } else if let Some(rest) = line.strip_prefix("IB") {
                seen.ib = words(rest);
            } else if let Some((k, v)) = line.split_once('=') {
                seen.env.push((k.to_owned(), v.to_owned()));
            }
        }
        seen
    }

    pub(crate) fn var(&self, name: &str) -> Option<&str> {
        self.env
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Creates `pod` in the test's namespace; returns its name.
async fn create(ctx: &TestContext, pod: serde_json::Value) -> Result<String> {
    let object: Pod = serde_json::from_value(pod)?;
    let created = ctx
        .api::<Pod>()
        .create(&PostParams::default(), &object)
        .await?;
    Ok(created.name_any())
}

/// Creates `pod`, waits until it succeeded and returns it with what its container showed.
pub(crate) async fn run(ctx: &TestContext, pod: serde_json::Value) -> Result<(Pod, Seen)> {
    let name = create(ctx, pod).await?;
    let done = wait_phase(ctx, &name, "Succeeded").await?;
    let log = ctx.kubectl_ok(&["logs", &name], None)?;
    Ok((done, Seen::read(&log)))
}

/// Creates `pod` (a long-running one), waits until it runs and has printed its report, and
/// returns it with its log.
pub(crate) async fn start(ctx: &TestContext, pod: serde_json::Value) -> Result<(Pod, String)> {
    let name = create(ctx, pod).await?;
    let running = wait_phase(ctx, &name, "Running").await?;
    let log = ctx
        .wait_for(&format!("{name}'s report"), WAIT, || async {
            let log = ctx.kubectl_ok(&["logs", &name], None)?;
            Ok(log.contains("RUNTIMEKIT_").then_some(log))
        })
        .await?;
    Ok((running, log))
}

/// Takes away what the installer run on the host put on the node, once no pod runs under
/// lj-runtime any more: the node as it was before the kit.
pub(crate) async fn bare_node(ctx: &TestContext, node: &RealNode) -> Result<()> {
    ctx.wait_for(
        "the node without the kit",
        Duration::from_secs(180),
        || async {
            let output = node.installer_command("uninstall")?.output()?;
            Ok(output.status.success().then_some(()))
        },
    )
    .await
}

/// The PID of the process serving containerd's `socket` (another after a restart).
pub(crate) fn containerd_pid(socket: &std::path::Path) -> Result<i32> {
    runtimekit_node_agent::install::restart::socket_owner(std::path::Path::new("/proc"), socket)
        .map_err(anyhow::Error::msg)
}

/// The allocation the scheduler gave a pod, from its annotation.
fn allocation(pod: &Pod) -> Result<Allocation> {
    let text = pod
        .annotations()
        .get("aliyun.com/allocation")
        .context("the pod has no allocation annotation")?;
    Ok(serde_json::from_str(text)?)
}

/// Checks that `seen` is exactly what `pod`'s allocation gives its one container.
fn exactly(slices: &[GpuSlice], pod: &Pod, seen: &Seen) -> Result<()> {
    let allocation = allocation(pod)?;
    let part = allocation
        .containers
        .first()
        .context("no container allocated")?;
    let cards: BTreeSet<String> = part
        .cards
        .iter()
        .map(|c| format!("nvidia{}", c.index))
        .collect();
    ensure!(
        seen.cards == cards,
        "{}: card files {:?}, allocation {cards:?}",
        pod.name_any(),
        seen.cards
    );
    let mut visible = Vec::new();
    for card in &part.cards {
        if card.mode == "MIG" {
            let slice = slices
                .iter()
                .find(|s| s.name_any() == card.slice)
                .context("the MIG card's slice")?;
            let mig = slice
                .status
                .as_ref()
                .and_then(|s| s.mig_instance.as_ref())
                .context("the slice's MIG instance")?;
            visible.push(mig.device_uuid.clone());
        } else {
            visible.push(card.uuid.clone());
        }
    }
    ensure!(
        seen.var("NVIDIA_VISIBLE_DEVICES") == Some(visible.join(",").as_str()),
        "{}: {:?} against {visible:?}",
        pod.name_any(),
        seen.env
    );
    let migs = part.cards.iter().filter(|c| c.mode == "MIG").count();
    ensure!(
        seen.caps == 2 * migs,
        "two capability files per MIG card: {seen:?}"
    );
    let list = |f: &dyn Fn(&runtimekit_contract::allocation::AllocatedCard) -> u64| {
        part.cards
            .iter()
            .map(|c| f(c).to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    ensure!(
        seen.var("RUNTIMEKIT_GPU_CORE_LIMIT")
            == Some(list(&|c| c.core.map_or(0, u64::from)).as_str()),
        "{seen:?}"
    );
    ensure!(
        seen.var("RUNTIMEKIT_GPU_MEMORY_LIMIT_MIB")
            == Some(list(&|c| c.memory_mib.unwrap_or(0)).as_str()),
        "{seen:?}"
    );
    ensure!(
        (seen.ib.is_empty()) == part.nics.is_empty(),
        "RDMA files only with NICs: {seen:?}, {:?}",
        part.nics
    );
    Ok(())
}

async fn slices_now(ctx: &TestContext) -> Result<Vec<GpuSlice>> {
    Ok(ctx.api::<GpuSlice>().list(&Default::default()).await?.items)
}

async fn real_node_usage_guide_pods_see_exactly_their_allocation(ctx: TestContext) -> Result<()> {
    let node = ctx.real_node().await?;
    with_operator(ctx, |ctx| async move {
        for (seed, name) in [
            ("3.1-whole-card.yaml", "whole"),
            ("3.2-tdm.yaml", "tdm"),
            ("3.3-mig.yaml", "mig"),
            ("3.4-multi-card.yaml", "replicas"),
        ] {
            // Ended pods release their slices, so read them while the pod runs: the MIG
            // instance's UUID is in its slice.
            let script = format!("{SHOW}; sleep 2");
            let pod = example(seed, name, &node.name, &script)?;
            let object: Pod = serde_json::from_value(pod)?;
            ctx.api::<Pod>()
                .create(&PostParams::default(), &object)
                .await?;
            let running = wait_phase(&ctx, name, "Running").await?;
            let slices = slices_now(&ctx).await?;
            wait_phase(&ctx, name, "Succeeded").await?;
            let log = ctx.kubectl_ok(&["logs", name], None)?;
            exactly(&slices, &running, &Seen::read(&log))
                .with_context(|| format!("{seed}:\n{log}"))?;
        }
        Ok(())
    })
    .await
}

/// The usage guide's PPU M890P example (4 cards + RDMA, host network) on the real node with its
/// cards swapped for eight M890P on four PCIe switches, one NIC each: the container sees four
/// cards under two switches and exactly those switches' NICs.
async fn real_node_ppu_m890p_four_cards_with_rdma(ctx: TestContext) -> Result<()> {
    const M890P: &str = "ppu-m890p-8";
    let node = ctx.real_node().await?;
    ctx.switch_real_node_profile(&node, M890P)?;
    let uuids: BTreeSet<String> = ctx
        .wait_for("the node's cards to be M890P", WAIT, || async {
            let group = ctx.cluster_api::<TopologyGroup>().get(&node.name).await?;
            let status = group.status.unwrap_or_default();
            let swapped = status.cards.len() == 8
                && status.cards.iter().all(|c| c.model == "PPU-M890P")
                && status.nics.len() == 4;
            Ok(swapped.then(|| status.cards.into_iter().map(|c| c.uuid).collect()))
        })
        .await?;
    ctx.wait_for("the kubelet to offer the M890P cards", WAIT, || async {
        let offered = allocatable_ids(&node, "aliyun.com/gpu").await.ok();
        Ok(offered.filter(|ids| *ids == uuids).map(|_| ()))
    })
    .await?;
    with_operator(ctx, |ctx| async move {
        let rdma = example("4.1-ppu-m890p-rdma.yaml", "rdma", &node.name, SHOW)?;
        ensure!(rdma["spec"]["hostNetwork"] == json!(true), "{rdma}");
        let (pod, seen) = run(&ctx, rdma).await?;
        exactly(&[], &pod, &seen)?;
        let part = &allocation(&pod)?.containers[0];
        // Cards 2k and 2k+1 and NIC mlx5_k share PCIe switch k.
        let switches: BTreeSet<u32> = part.cards.iter().map(|c| c.index / 2).collect();
        ensure!(
            part.cards.len() == 4 && switches.len() == 2,
            "four cards under two PCIe switches: {part:?}"
        );
        let nics: Vec<String> = switches.iter().map(|k| format!("mlx5_{k}")).collect();
        ensure!(part.nics == nics, "the switches' NICs: {part:?}");
        ensure!(
            seen.ib.contains("rdma_cm")
                && seen.ib.iter().filter(|f| f.starts_with("uverbs")).count() == nics.len(),
            "{seen:?} for {nics:?}"
        );
        ensure!(
            seen.var("RUNTIMEKIT_RDMA_DEVICES") == Some(nics.join(",").as_str()),
            "{seen:?}"
        );
        Ok(())
    })
    .await
}

async fn real_node_default_scheduler_whole_card_never_gets_a_sliced_card(
    ctx: TestContext,
) -> Result<()> {
    let node = ctx.real_node().await?;
    with_operator(ctx, |ctx| async move {
        // A share of our scheduler holds a card while the other pod is admitted.
        let share = example("3.2-tdm.yaml", "share", &node.name, "sleep 3600")?;
        let object: Pod = serde_json::from_value(share)?;
        ctx.api::<Pod>().create(&PostParams::default(), &object).await?;
        let running = wait_phase(&ctx, "share", "Running").await?;
        let held = allocation(&running)?.containers[0].cards[0].index;
        for i in 0..3 {
            let name = format!("plain-{i}");
            let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                "spec": {"nodeName": node.name, "restartPolicy": "Never", "automountServiceAccountToken": false,
                    "containers": [{"name": "main", "image": "docker.io/local/busybox:1", "imagePullPolicy": "Never",
                        "command": ["/bin/sh", "-c", SHOW],
                        "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}});
            let (_, seen) = run(&ctx, pod).await?;
            ensure!(seen.cards.len() == 1, "one card through the device plugin: {seen:?}");
            ensure!(
                !seen.cards.contains(&format!("nvidia{held}")),
                "never the card holding the share ({held}): {seen:?}"
            );
            ensure!(seen.var("NVIDIA_VISIBLE_DEVICES").is_some_and(|v| v.starts_with("GPU-")), "{seen:?}");
        }
        ctx.api::<Pod>().delete("share", &DeleteParams::default()).await?;
        Ok(())
    })
    .await
}

async fn real_node_lj_runtime_fails_a_pod_without_an_allocation(ctx: TestContext) -> Result<()> {
    let node = ctx.real_node().await?;
    let mut pod = busybox_pod("unplaced", &node.name, "echo should not run")?;
    if let Some(spec) = pod.spec.as_mut() {
        spec.runtime_class_name = Some("lj-runtime".into());
    }
    ctx.api::<Pod>()
        .create(&PostParams::default(), &pod)
        .await?;
    let message = ctx
        .wait_for("the container to fail", WAIT, || async {
            let pod = ctx.api::<Pod>().get("unplaced").await?;
            let waiting = pod
                .status
                .and_then(|s| s.container_statuses)
                .into_iter()
                .flatten()
                .find_map(|c| {
                    let state = c.state?;
                    state
                        .terminated
                        .and_then(|t| t.message)
                        .or(state.waiting.and_then(|w| w.message))
                });
            Ok(waiting.filter(|m| m.contains("lj-runtime")))
        })
        .await?;
    ensure!(
        message.contains("pod") && message.contains("has no aliyun.com/allocation annotation"),
        "{message}"
    );
    let described = ctx.kubectl_ok(&["describe", "pod", "unplaced"], None)?;
    ensure!(
        described.contains("lj-runtimekit-scheduler"),
        "the fix is named: {described}"
    );
    Ok(())
}

async fn real_node_kubelet_restart_leaves_running_pods_and_serves_new_ones(
    ctx: TestContext,
) -> Result<()> {
    let node = ctx.real_node().await?;
    with_operator(ctx, |ctx| async move {
        let share = example("3.2-tdm.yaml", "steady", &node.name, "sleep 3600")?;
        let object: Pod = serde_json::from_value(share)?;
        ctx.api::<Pod>()
            .create(&PostParams::default(), &object)
            .await?;
        let before = wait_phase(&ctx, "steady", "Running").await?;
        let id = |pod: &Pod| {
            pod.status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|c| c.first())
                .and_then(|c| c.container_id.clone())
        };
        ctx.restart_real_kubelet(&node).await?;
        // The node agent registers its device plugins with the new kubelet.
        ctx.wait_for("the device plugins to register again", WAIT, || async {
            Ok(allocatable_cards(&node).await.ok().filter(|n| *n > 0))
        })
        .await?;
        let after = ctx.api::<Pod>().get("steady").await?;
        ensure!(
            id(&after).is_some() && id(&after) == id(&before),
            "the running container is the same one"
        );
        let restarts = after
            .status
            .and_then(|s| s.container_statuses)
            .and_then(|c| c.first().map(|c| c.restart_count));
        ensure!(restarts == Some(0), "not restarted: {restarts:?}");
        let (pod, seen) = run(
            &ctx,
            example("3.1-whole-card.yaml", "after", &node.name, SHOW)?,
        )
        .await?;
        exactly(&[], &pod, &seen)?;
        ctx.api::<Pod>()
            .delete("steady", &DeleteParams::default())
            .await?;
        Ok(())
    })
    .await
}

async fn real_node_deleted_mig_pod_gives_back_its_instance(ctx: TestContext) -> Result<()> {
    let node = ctx.real_node().await?;
    with_operator(ctx, |ctx| async move {
        let mig = example("3.3-mig.yaml", "mig-held", &node.name, "sleep 3600")?;
        let object: Pod = serde_json::from_value(mig)?;
        ctx.api::<Pod>()
            .create(&PostParams::default(), &object)
            .await?;
        let running = wait_phase(&ctx, "mig-held", "Running").await?;
        let slice = allocation(&running)?.containers[0].cards[0].slice.clone();
        let key = format!("{}/{slice}", ctx.namespace);
        ensure!(
            instance_keys(&node).await?.contains(&key),
            "the instance exists while the pod runs"
        );
        ctx.api::<Pod>()
            .delete("mig-held", &DeleteParams::default())
            .await?;
        ctx.wait_for("the slice and its instance to go", WAIT, || async {
            let slice_gone = ctx.api::<GpuSlice>().get_opt(&slice).await?.is_none();
            let instance_gone = !instance_keys(&node).await?.contains(&key);
            Ok((slice_gone && instance_gone).then_some(()))
        })
        .await?;
        Ok(())
    })
    .await
}

/// How many NVIDIA cards the real kubelet can give now (its registered device plugins' devices).
async fn allocatable_cards(node: &RealNode) -> Result<usize> {
    Ok(allocatable_ids(node, "nvidia.com/gpu").await?.len())
}

/// The device IDs the kubelet offers for `resource`, from its pod-resources API.
async fn allocatable_ids(node: &RealNode, resource: &str) -> Result<BTreeSet<String>> {
    use runtimekit_proto::podresources::v1 as pr;
    let socket = node.dir.join("kubelet/pod-resources/kubelet.sock");
    let channel = runtimekit_resource_layer::connect(&socket).await?;
    let mut client = pr::pod_resources_lister_client::PodResourcesListerClient::new(channel);
    let answer = client
        .get_allocatable_resources(pr::AllocatableResourcesRequest::default())
        .await?
        .into_inner();
    Ok(answer
        .devices
        .into_iter()
        .filter(|d| d.resource_name == resource)
        .flat_map(|d| d.device_ids)
        .collect())
}

/// The keys of the instances the real node's resource layer holds.
pub(crate) async fn instance_keys(node: &RealNode) -> Result<BTreeSet<String>> {
    let mut client = runtimekit_resource_layer::resource_client(&node.layer_socket).await?;
    let instances = client
        .list_instances(pb::ListInstancesRequest::default())
        .await?
        .into_inner()
        .instances;
    Ok(instances.into_iter().map(|i| i.key).collect())
}

/// Builds `images` with the project's script and imports them into the node's containerd;
/// returns their references.
pub(crate) async fn import_images(node: &RealNode, images: &[&str]) -> Result<Vec<String>> {
    let node = node.clone();
    let images: Vec<String> = images.iter().map(|i| (*i).to_owned()).collect();
    tokio::task::spawn_blocking(move || {
        let names: Vec<&str> = images.iter().map(String::as_str).collect();
        node.import_images(&names)
    })
    .await?
}

/// The operator's and the node agent's images, built by the project's script from release
/// binaries and imported into the node's containerd, run their binaries: the operator's as the
/// non-root user on an empty base, the resource layer's with the glibc its image ships.
async fn real_node_runs_the_product_images(ctx: TestContext) -> Result<()> {
    let node = ctx.real_node().await?;
    let references = import_images(&node, &["operator", "node-agent"]).await?;
    let image = |name: &str| {
        references
            .iter()
            .find(|r| r.contains(name))
            .cloned()
            .with_context(|| format!("no {name} image"))
    };
    for (pod, reference, command) in [
        (
            "operator-image",
            image("runtimekit-operator")?,
            vec!["runtimekit-operator", "--version"],
        ),
        (
            "layer-image",
            image("runtimekit-node-agent")?,
            vec!["runtimekit-resource-layer", "profiles"],
        ),
        (
            "agent-image",
            image("runtimekit-node-agent")?,
            vec!["runtimekit-node-agent", "--help"],
        ),
    ] {
        let object: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod},
            "spec": {"nodeName": node.name, "restartPolicy": "Never", "automountServiceAccountToken": false,
                "containers": [{"name": "main", "image": reference, "imagePullPolicy": "Never", "command": command}]},
        }))?;
        ctx.api::<Pod>()
            .create(&PostParams::default(), &object)
            .await?;
        wait_phase(&ctx, pod, "Succeeded").await?;
    }
    let version = ctx.kubectl_ok(&["logs", "operator-image"], None)?;
    ensure!(version.starts_with("runtimekit-operator "), "{version}");
    let profiles = ctx.kubectl_ok(&["logs", "layer-image"], None)?;
    ensure!(
        profiles.contains(runtimekit_e2e::real_node::PROFILE),
        "{profiles}"
    );
    // The operator's image runs as the non-root user its manifest expects.
    let config = node
        .ctr()
        .args(["images", "export", "-"])
        .arg(image("runtimekit-operator")?)
        .output()?;
    ensure!(config.status.success(), "exporting the operator's image");
    ensure!(
        String::from_utf8_lossy(&config.stdout).contains("\"User\":\"65532:65532\""),
        "the operator's image config names user 65532"
    );
    Ok(())
}

/// The kit installed with `helm install`, as a user installs it: the operator Deployment and the
/// node-agent DaemonSet run as pods on the real node (from the images built here), the
/// DaemonSet's installer sets the bare node up, the agent in its pod serves the kubelet every
/// resource, and the usage guide's TDM pod is placed by the installed operator and sees its
/// allocation. A replaced agent pod restarts nothing; `helm uninstall` is refused while the pod
/// runs; `helm upgrade` to MiB mode places a MiB share; `helm uninstall` then leaves the node as
/// it was, and the CRDs.
async fn real_node_runs_the_kit_installed_with_its_chart(ctx: TestContext) -> Result<()> {
    let node = ctx.real_node().await?;
    // The node as it was before the kit: what the installer put on it run on the host is taken
    // away (once the earlier tests' pods under lj-runtime have gone), and the DaemonSet's
    // installer must set it up again.
    bare_node(&ctx, &node).await?;
    let lj_runtime = node.dir.join("bin/lj-runtime");
    ensure!(!lj_runtime.exists(), "lj-runtime is left on the node");
    let containerd = || containerd_pid(&node.containerd_socket);
    let bare = containerd()?;
    ctx.deploy_chart(&node, &[])?;
    let system = || kube::Api::<Pod>::namespaced(ctx.client.clone(), "runtimekit-system");
    let ready = runtimekit_e2e::cluster::deploy::pod_ready;
    runtimekit_e2e::cluster::deploy::wait_kit_running(&ctx.client, None, Duration::from_secs(120))
        .await
        .map_err(|e| {
            let shown = ctx
                .kubectl(&["describe", "pods", "-n", "runtimekit-system"], None)
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            e.context(shown)
        })?;
    ctx.wait_for("the deployed agent's device plugins", WAIT, || async {
        Ok(allocatable_cards(&node).await.ok().filter(|n| *n > 0))
    })
    .await?;
    shows_every_resource(&ctx, &node.name)?;
    ensure!(
        lj_runtime.exists(),
        "the DaemonSet's installer put no lj-runtime on the node"
    );
    let installed = containerd()?;
    ensure!(
        installed != bare,
        "containerd was not restarted to read the handler"
    );
    let condition = runtime_ready(&ctx, &node.name).await?;
    ensure!(
        condition.0 == "True" && condition.1 == "Installed",
        "RuntimeReady: {condition:?}"
    );
    // The deployed operator runs as the non-root user of its manifest.
    let operator = std::fs::read_dir("/proc")?
        .filter_map(Result::ok)
        .find(|e| {
            std::fs::read(e.path().join("cmdline"))
                .is_ok_and(|c| c.starts_with(b"/usr/local/bin/runtimekit-operator\0run\0"))
        })
        .context("the deployed operator's process")?;
    let status = std::fs::read_to_string(operator.path().join("status"))?;
    ensure!(
        status
            .lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("65532")),
        "the operator runs as 65532"
    );
    let pod = example(
        "3.2-tdm.yaml",
        "deployed-tdm",
        &node.name,
        &format!("{SHOW}; sleep 600"),
    )?;
    let (running, log) = start(&ctx, pod).await?;
    exactly(&[], &running, &Seen::read(&log)).with_context(|| log.clone())?;
    // The deployed agent's exporter: the cards under DCGM's names, their health, and the TDM
    // pod's own series with its limits.
    let card = running
        .annotations()
        .get("aliyun.com/allocation")
        .and_then(|a| serde_json::from_str::<Allocation>(a).ok())
        .and_then(|a| a.containers.first().and_then(|c| c.cards.first().cloned()))
        .context("the pod's card")?;
    let scrape = ctx
        .wait_for("the exporter to show the pod", WAIT, || async {
            let address = std::net::SocketAddr::from(([127, 0, 0, 1], METRICS_PORT));
            let text = runtimekit_e2e::tools::http_get(address, "/metrics").unwrap_or_default();
            Ok(text.contains("pod=\"deployed-tdm\"").then_some(text))
        })
        .await?;
    let gpu = format!("gpu=\"{}\"", card.index);
    for expected in [
        "DCGM_FI_DEV_GPU_TEMP{",
        "DCGM_FI_DEV_FB_USED{",
        "DCGM_FI_HEALTH_WATCH_OVERALL{",
        "DCGM_EXP_GPU_HEALTH_STATUS{",
    ] {
        ensure!(scrape.contains(expected), "{expected} in\n{scrape}");
    }
    let series = |family: &str| {
        scrape
            .lines()
            .find(|l| {
                l.starts_with(family) && l.contains("pod=\"deployed-tdm\"") && l.contains(&gpu)
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
    };
    ensure!(
        series("DCGM_FI_CONTAINER_FB_LIMIT") == Some(4096.0)
            && series("DCGM_FI_CONTAINER_CORE_LIMIT") == Some(50.0),
        "the pod's limits as series:\n{scrape}"
    );
    // The agent's pod replaced (as a rolling update does): the next installer finds the node set
    // up and restarts nothing, and the running pod is left alone.
    let agent_pod = system()
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .find(|p| p.name_any().starts_with("runtimekit-node-agent-"))
        .context("the agent's pod")?
        .name_any();
    system()
        .delete(&agent_pod, &DeleteParams::default())
        .await?;
    ctx.wait_for(
        "the agent's next pod Ready",
        Duration::from_secs(120),
        || async {
            let pods = system().list(&Default::default()).await?.items;
            Ok(pods
                .iter()
                .any(|p| {
                    p.name_any().starts_with("runtimekit-node-agent-")
                        && p.name_any() != agent_pod
                        && ready(p)
                })
                .then_some(()))
        },
    )
    .await?;
    ensure!(
        containerd()? == installed,
        "the replaced agent's installer restarted containerd"
    );
    ensure!(
        lj_runtime.exists(),
        "the replaced pod's installer took lj-runtime away"
    );
    let still = ctx.api::<Pod>().get("deployed-tdm").await?;
    let restarts: i32 = still
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .map(|c| c.iter().map(|c| c.restart_count).sum())
        .unwrap_or_default();
    ensure!(
        still.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") && restarts == 0,
        "the TDM pod did not run on: {:?}",
        still.status
    );
    // helm uninstall is refused while the pod runs under lj-runtime, naming it; nothing goes.
    let refused = helm_uninstall(&ctx)?;
    ensure!(
        !refused.0,
        "helm uninstall went ahead under a running pod:\n{}",
        refused.1
    );
    let named = format!("{}/deployed-tdm on {}", ctx.namespace, node.name);
    ensure!(
        refused
            .1
            .contains("refusing to uninstall the GPU runtime kit")
            && refused.1.contains(&named),
        "the refusal names the pod:\n{}",
        refused.1
    );
    let agents = system().list(&Default::default()).await?.items;
    ensure!(
        agents
            .iter()
            .any(|p| p.name_any().starts_with("runtimekit-node-agent-") && ready(p))
            && lj_runtime.exists(),
        "the refused uninstall took something away"
    );
    // Helm marks the refused release as uninstalling: the rollback the refusal names makes it
    // deployed again, changing nothing.
    let mut rollback = ctx.helm()?;
    rollback.args(["rollback", RELEASE, "1", "--namespace", RELEASE_NAMESPACE]);
    runtimekit_e2e::tools::run(rollback)?;
    delete_and_wait(&ctx, "deployed-tdm").await?;

    // MiB mode by helm upgrade: the shared configuration changes, the operator's and agent's
    // pods are replaced (they read it at start), and a share of 17 x 128 MiB is given exactly.
    let before: Vec<String> = system()
        .list(&Default::default())
        .await?
        .items
        .iter()
        .map(|p| p.name_any())
        .collect();
    ctx.deploy_chart(&node, &["config.memoryUnit=MiB"])?;
    ctx.wait_for(
        "the operator and node agent replaced for MiB mode",
        Duration::from_secs(180),
        || async {
            let pods = system().list(&Default::default()).await?.items;
            let fresh = |prefix: &str| {
                pods.iter().any(|p| {
                    p.name_any().starts_with(prefix) && !before.contains(&p.name_any()) && ready(p)
                }) && !pods
                    .iter()
                    .any(|p| p.name_any().starts_with(prefix) && before.contains(&p.name_any()))
            };
            Ok((fresh("runtimekit-operator-") && fresh("runtimekit-node-agent-")).then_some(()))
        },
    )
    .await?;
    ensure!(
        containerd()? == installed,
        "the upgrade's installer restarted containerd"
    );
    // The kubelet keeps the GiB agent's gpu-memory device plugin for its stop grace period (five
    // minutes), and refuses a pod asking for gpu-memory until it has dropped it: MiB mode counts
    // gpu-memory as a node-level resource instead.
    // (The kubelet's device-plugin folder is fixed, whatever its root.)
    let checkpoint =
        std::path::Path::new("/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint");
    let switched = std::time::Instant::now();
    ctx.wait_for(
        "the kubelet to drop the GiB gpu-memory devices",
        Duration::from_secs(400),
        || async {
            let text = std::fs::read_to_string(checkpoint)?;
            let state: serde_json::Value = serde_json::from_str(&text)?;
            Ok(state["Data"]["RegisteredDevices"]
                .get("aliyun.com/gpu-memory")
                .is_none()
                .then_some(()))
        },
    )
    .await?;
    eprintln!(
        "the kubelet dropped the GiB gpu-memory devices {:.0} s after the MiB upgrade",
        switched.elapsed().as_secs_f64()
    );
    let mut pod = example(
        "3.2-tdm.yaml",
        "mib-tdm",
        &node.name,
        &format!("{SHOW}; sleep 600"),
    )?;
    pod["spec"]["containers"][0]["resources"]["limits"]["aliyun.com/gpu-memory"] = json!("2176");
    let (running, log) = start(&ctx, pod).await?;
    let seen = Seen::read(&log);
    exactly(&[], &running, &seen).with_context(|| log.clone())?;
    ensure!(
        seen.var("RUNTIMEKIT_GPU_MEMORY_LIMIT_MIB") == Some("2176"),
        "2176 MiB in MiB mode:\n{log}"
    );
    delete_and_wait(&ctx, "mib-tdm").await?;

    // helm uninstall with nothing running: the node agents go first and their installers take
    // the node's setup away (containerd restarted without the handler); the CRDs stay.
    let uninstalled = helm_uninstall(&ctx)?;
    ensure!(uninstalled.0, "helm uninstall failed:\n{}", uninstalled.1);
    ensure!(
        !lj_runtime.exists(),
        "helm uninstall left lj-runtime on the node"
    );
    ensure!(
        !node.dir.join("containerd/conf.d/lj-runtime.toml").exists(),
        "helm uninstall left containerd's drop-in"
    );
    ensure!(
        containerd()? != installed,
        "containerd was not restarted without the handler"
    );
    // The release's objects are deleted; their pods go a moment later.
    ctx.wait_for("the kit's pods gone", WAIT, || async {
        Ok(system()
            .list(&Default::default())
            .await?
            .items
            .is_empty()
            .then_some(()))
    })
    .await?;
    let crds = kube::Api::<
        k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    >::all(ctx.client.clone());
    ensure!(
        crds.get_opt("gpuslices.runtimekit.aliyun.com")
            .await?
            .is_some(),
        "helm uninstall deleted the CRDs"
    );
    Ok(())
}

/// `helm uninstall` of the kit's release: whether it succeeded, and what it printed.
pub(crate) fn helm_uninstall(ctx: &TestContext) -> Result<(bool, String)> {
    let output = ctx
        .helm()?
        .args([
            "uninstall",
            RELEASE,
            "--namespace",
            RELEASE_NAMESPACE,
            "--wait",
        ])
        .output()?;
    Ok((
        output.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    ))
}

/// Deletes pod `name` and waits until it is gone.
async fn delete_and_wait(ctx: &TestContext, name: &str) -> Result<()> {
    ctx.api::<Pod>()
        .delete(name, &DeleteParams::default())
        .await?;
    ctx.wait_for("the pod gone", WAIT, || async {
        Ok(ctx
            .api::<Pod>()
            .get_opt(name)
            .await?
            .is_none()
            .then_some(()))
    })
    .await
}

/// The status and reason of the node's RuntimeReady condition, once its agent reports one.
async fn runtime_ready(ctx: &TestContext, node: &str) -> Result<(String, String)> {
    ctx.wait_for("the RuntimeReady condition", WAIT, || async {
        let group = ctx.cluster_api::<TopologyGroup>().get(node).await?;
        Ok(group
            .status
            .iter()
            .flat_map(|s| &s.conditions)
            .find(|c| c.type_ == runtimekit_crds::CONDITION_RUNTIME_READY && c.status == "True")
            .map(|c| (c.status.clone(), c.reason.clone())))
    })
    .await
}
