//! The node agent on the real control plane: one agent process per kwok node (the built
//! `runtimekit-node-agent` binary, with a simulated resource layer and a node-scoped client
//! certificate), and beside each a test kubelet that speaks the device-plugin protocol and writes
//! the Node's capacity as a kubelet would. The tests play the operator's part (pods bound with
//! `spec.nodeName`, the GpuSlices it would create), except the last, which runs the operator.

use anyhow::{Context, Result, bail, ensure};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use runtimekit_crds::{
    CardHealth, GpuSlice, MigInstanceRef, SLICE_FINALIZER, SlicePhase, TopologyGroup,
};
use runtimekit_e2e::cluster::node_side::{AGENT_GROUP, agent_dra_args, agent_user};
use runtimekit_e2e::harness::{Test, TestProcess, workspace_binary};
use runtimekit_e2e::{FakeNode, TestContext, tests};
use runtimekit_proto::resource::v1alpha1 as pb;
use runtimekit_test_kubelet::TestKubelet;
use serde_json::json;
use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;
use tokio::sync::OnceCell;

pub const TESTS: &[Test] = tests![
    node_agent_reports_its_node,
    node_agent_mig_instance_follows_its_pod,
    node_agent_restart_adopts_instances,
    node_agent_card_fault_and_recovery,
    node_agent_never_gives_a_sliced_card_whole,
    node_agent_writes_only_its_own_node,
    node_agent_enacts_what_the_operator_decides,
    cards_held_by_another_scheduler_are_never_picked,
    resource_layer_restarted_under_a_running_agent,
    agent_killed_between_instance_and_status_write,
    whole_card_pods_get_the_cards_their_slices_name,
    operator_starting_while_a_mig_slice_is_released,
];

const WAIT: Duration = Duration::from_secs(30);

/// Installs the agents' RBAC and admission policies once per run, from the files users apply.
async fn install_agent_access(ctx: &TestContext) -> Result<()> {
    static INSTALLED: OnceCell<()> = OnceCell::const_new();
    INSTALLED
        .get_or_try_init(|| async {
            let dir = runtimekit_e2e::tools::repo_root().join("config/node-agent");
            ctx.kubectl_ok(
                &["apply", "--server-side", "-f", "-"],
                Some(r#"{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "runtimekit-system"}}"#),
            )?;
            for file in ["rbac.yaml", "admission-policy.yaml"] {
                let path = dir.join(file);
                ctx.kubectl_ok(
                    &[
                        "apply",
                        "--server-side",
                        "--force-conflicts",
                        "-n",
                        "runtimekit-system",
                        "-f",
                        &path.to_string_lossy(),
                    ],
                    None,
                )?;
            }
            Ok::<(), anyhow::Error>(())
        })
        .await?;
    Ok(())
}

/// A kwok node with its agent and test kubelet.
pub(crate) struct AgentNode {
    pub(crate) name: String,
    dir: PathBuf,
    /// Where its exporter serves `/metrics`.
    pub(crate) metrics: std::net::SocketAddr,
    args: Vec<String>,
    agent: TestProcess,
    kubelet: TestKubelet,
    /// The resource layer as a process of its own, and its arguments; `None` when the agent
    /// serves a simulated one in-process.
    layer: Option<(TestProcess, Vec<String>)>,
}

/// Where an agent's resource layer runs.
#[derive(Debug, Clone, Copy)]
enum Layer<'a> {
    /// In the agent's process, simulating a profile.
    InProcess(&'a str),
    /// A process of its own, simulating a profile.
    Simulated(&'a str),
    /// A process of its own on the NVML backend, over this (fake) library.
    Nvml(&'a std::path::Path),
}

impl AgentNode {
    /// Creates a kwok node and starts its test kubelet and agent (simulating `profile`);
    /// returns once the agent reports the node's TopologyGroup.
    pub(crate) async fn start(ctx: &TestContext, short: &str, profile: &str) -> Result<AgentNode> {
        Self::start_with(ctx, short, profile, None).await
    }

    /// [`AgentNode::start`], with the shared configuration `config` (YAML) given to the agent.
    async fn start_with(
        ctx: &TestContext,
        short: &str,
        profile: &str,
        config: Option<&str>,
    ) -> Result<AgentNode> {
        Self::start_inner(ctx, short, Layer::InProcess(profile), config, &[]).await
    }

    /// [`AgentNode::start`] on a node labelled `label=dra`, the node's device-API label: its
    /// cards are published as ResourceSlices and its whole cards leave the device plugin.
    pub(crate) async fn start_dra(
        ctx: &TestContext,
        short: &str,
        profile: &str,
        label: &str,
    ) -> Result<AgentNode> {
        Self::start_inner(
            ctx,
            short,
            Layer::InProcess(profile),
            None,
            &[(label, "dra")],
        )
        .await
    }

    /// [`AgentNode::start`], with the resource layer as a process of its own
    /// (`runtimekit-resource-layer serve`, simulating `profile`, its instances in a state file)
    /// that the agent reaches through its socket.
    async fn start_with_layer(ctx: &TestContext, short: &str, profile: &str) -> Result<AgentNode> {
        Self::start_inner(ctx, short, Layer::Simulated(profile), None, &[]).await
    }

    /// [`AgentNode::start`], with the resource layer as a process of its own on the NVML
    /// backend, over the fake NVML library `nvml`.
    pub(crate) async fn start_on_nvml(
        ctx: &TestContext,
        short: &str,
        nvml: &std::path::Path,
    ) -> Result<AgentNode> {
        Self::start_inner(ctx, short, Layer::Nvml(nvml), None, &[]).await
    }

    async fn start_inner(
        ctx: &TestContext,
        short: &str,
        layer: Layer<'_>,
        config: Option<&str>,
        labels: &[(&str, &str)],
    ) -> Result<AgentNode> {
        install_agent_access(ctx).await?;
        let node = labels.iter().fold(
            FakeNode::new(short).label("lj_runtimekit_enable", "true"),
            |node, (key, value)| node.label(key, value),
        );
        let node = ctx.fake_node(node).await?;
        let name = node.name_any();
        let nodes = ctx.cluster_api::<Node>();
        ctx.wait_for("the kwok node to be Ready", WAIT, || async {
            let node = nodes.get(&name).await?;
            let ready = node
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            Ok(ready.then_some(()))
        })
        .await?;
        let dir = ctx.scratch_dir()?.join(short);
        let mut kubelet = TestKubelet::start(&dir.join("kubelet")).await?;
        kubelet.sync_node(ctx.client.clone(), &name);
        kubelet.admit_pods(ctx.client.clone(), &name);
        let kubeconfig = ctx.kubeconfig_for(&agent_user(&name), &[AGENT_GROUP])?;
        let state = dir.join("state");
        // The socket is where the agent's in-process layer would serve, so `layer_socket`
        // holds either way.
        let socket = state.join("resource-layer.sock");
        let backend = match layer {
            Layer::InProcess(_) => None,
            Layer::Simulated(profile) => Some(vec![
                "--backend=simulated".to_owned(),
                format!("--profile={profile}"),
                format!(
                    "--state-file={}",
                    state.join(format!("simulated-{profile}.json")).display()
                ),
            ]),
            Layer::Nvml(library) => Some(vec![
                "--backend=nvml".to_owned(),
                format!("--nvml-lib={}", library.display()),
                format!("--state-file={}", state.join("nvml.json").display()),
            ]),
        };
        let (layer, source) = match (backend, layer) {
            (Some(backend), _) => {
                let mut layer_args = vec!["serve".to_owned()];
                layer_args.extend(backend);
                layer_args.push(format!("--node-name={name}"));
                layer_args.push(format!("--socket={}", socket.display()));
                let process = spawn_layer(ctx, short, &layer_args, &socket).await?;
                (
                    Some((process, layer_args)),
                    format!("--resource-layer-socket={}", socket.display()),
                )
            }
            (None, Layer::InProcess(profile) | Layer::Simulated(profile)) => {
                (None, format!("--simulate={profile}"))
            }
            (None, Layer::Nvml(_)) => bail!("the NVML backend runs as a process of its own"),
        };
        let metrics =
            std::net::SocketAddr::from(([127, 0, 0, 1], runtimekit_e2e::tools::free_port()?));
        let mut args = vec![
            format!("--node-name={name}"),
            format!("--kubeconfig={}", kubeconfig.display()),
            source,
            format!("--state-dir={}", state.display()),
            format!("--kubelet-dir={}", kubelet.device_plugin_dir().display()),
            format!(
                "--pod-resources-socket={}",
                kubelet.pod_resources_socket().display()
            ),
            "--heartbeat-interval=2s".into(),
            "--resync-interval=2s".into(),
            format!("--metrics-address={metrics}"),
            "--metrics-interval=1s".into(),
        ];
        args.extend(agent_dra_args(
            &dir.join("kubelet"),
            &dir.join("cdi"),
            &dir.join("lj-runtime.json"),
        ));
        if let Some(config) = config {
            let path = dir.join("config.yaml");
            std::fs::create_dir_all(&dir)?;
            std::fs::write(&path, config)?;
            args.push(format!("--config={}", path.display()));
        }
        let agent = spawn_agent(ctx, short, &args)?;
        let node = AgentNode {
            name,
            dir,
            metrics,
            args,
            agent,
            kubelet,
            layer,
        };
        node.wait_group(ctx, "the agent's first report", |g| {
            let ready = g.status.as_ref().is_some_and(|s| {
                !s.cards.is_empty() && s.conditions.iter().any(|c| c.status == "True")
            });
            ready.then_some(())
        })
        .await?;
        Ok(node)
    }

    /// The resource layer's socket (the agent's in-process one, or the layer process's).
    fn layer_socket(&self) -> PathBuf {
        self.dir.join("state").join("resource-layer.sock")
    }

    async fn group(&self, ctx: &TestContext) -> Result<TopologyGroup> {
        Ok(ctx.cluster_api::<TopologyGroup>().get(&self.name).await?)
    }

    pub(crate) async fn wait_group<T>(
        &self,
        ctx: &TestContext,
        what: &str,
        mut check: impl FnMut(&TopologyGroup) -> Option<T>,
    ) -> Result<T> {
        let groups = ctx.cluster_api::<TopologyGroup>();
        let deadline = std::time::Instant::now() + WAIT;
        let mut last = None;
        loop {
            match groups.get_opt(&self.name).await {
                Ok(Some(group)) => {
                    if let Some(value) = check(&group) {
                        return Ok(value);
                    }
                    last = group.status;
                }
                Ok(None) => {}
                Err(error) => last_error(&error),
            }
            if std::time::Instant::now() > deadline {
                bail!(
                    "timed out after {WAIT:?} waiting for {what}; the TopologyGroup's status: {last:?}"
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The allocatable count of `resource` in the Node's status.
    async fn allocatable(&self, ctx: &TestContext, resource: &str) -> Result<Option<String>> {
        let node = ctx.cluster_api::<Node>().get(&self.name).await?;
        Ok(node
            .status
            .and_then(|s| s.allocatable)
            .and_then(|a| a.get(resource).map(|q| q.0.clone())))
    }

    pub(crate) async fn wait_allocatable(
        &self,
        ctx: &TestContext,
        resource: &str,
        want: &str,
    ) -> Result<()> {
        ctx.wait_for(
            &format!("{resource} allocatable {want} on {}", self.name),
            WAIT,
            || async {
                Ok((self.allocatable(ctx, resource).await?.as_deref() == Some(want)).then_some(()))
            },
        )
        .await
    }

    /// The instances the resource layer holds now.
    async fn instances(&self) -> Result<Vec<pb::Instance>> {
        let mut client = runtimekit_resource_layer::resource_client(self.layer_socket()).await?;
        Ok(client
            .list_instances(pb::ListInstancesRequest::default())
            .await?
            .into_inner()
            .instances)
    }

    pub(crate) async fn fault(&self, card: u32, kind: pb::FaultKind, xid: u32) -> Result<()> {
        let mut client = runtimekit_resource_layer::fault_client(self.layer_socket()).await?;
        client
            .inject_fault(pb::InjectFaultRequest {
                device_index: card,
                kind: kind.into(),
                xid,
                ..Default::default()
            })
            .await?;
        Ok(())
    }

    pub(crate) async fn clear(&self, card: u32) -> Result<()> {
        let mut client = runtimekit_resource_layer::fault_client(self.layer_socket()).await?;
        client
            .clear_fault(pb::ClearFaultRequest {
                device_index: card,
                ..Default::default()
            })
            .await?;
        Ok(())
    }

    /// The card UUIDs, from the agent's report.
    pub(crate) async fn uuids(&self, ctx: &TestContext) -> Result<Vec<String>> {
        card_uuids(ctx, &self.name).await
    }
}

/// The UUIDs of a node's cards by index, from its agent's TopologyGroup.
pub(crate) async fn card_uuids(ctx: &TestContext, node: &str) -> Result<Vec<String>> {
    let group = ctx.cluster_api::<TopologyGroup>().get(node).await?;
    Ok(group
        .status
        .unwrap_or_default()
        .cards
        .into_iter()
        .map(|c| c.uuid)
        .collect())
}

fn last_error(error: &kube::Error) {
    eprintln!("reading the TopologyGroup: {error}");
}

/// Starts `runtimekit-resource-layer` with `args` and waits until it answers on `socket`.
async fn spawn_layer(
    ctx: &TestContext,
    short: &str,
    args: &[String],
    socket: &std::path::Path,
) -> Result<TestProcess> {
    let binary = workspace_binary("runtimekit-resource-layer", "runtimekit-resource-layer")?;
    let process = ctx.spawn(
        &format!("layer-{short}"),
        &binary,
        args,
        &[("RUST_LOG", "info,runtimekit_resource_layer=debug")],
    )?;
    ctx.wait_for("the resource layer to answer", WAIT, || async {
        ensure!(process.running(), "the resource layer exited");
        let mut client = runtimekit_resource_layer::resource_client(socket).await?;
        client.get_info(pb::GetInfoRequest {}).await?;
        Ok(Some(()))
    })
    .await?;
    Ok(process)
}

fn spawn_agent(ctx: &TestContext, short: &str, args: &[String]) -> Result<TestProcess> {
    let binary = workspace_binary("runtimekit-node-agent", "runtimekit-node-agent")?;
    ctx.spawn(
        &format!("agent-{short}"),
        &binary,
        args,
        &[("RUST_LOG", "info,runtimekit_node_agent=debug")],
    )
}

/// A pod of `limits` in the test's namespace, bound to `node` when given (as a scheduler
/// would), left pending otherwise.
async fn pod(
    ctx: &TestContext,
    name: &str,
    node: Option<&str>,
    limits: serde_json::Value,
) -> Result<Pod> {
    let mut spec = json!({"schedulerName": "none", "containers": [
        {"name": "app", "image": "busybox", "resources": {"limits": limits}}]});
    if let Some(node) = node {
        spec["nodeName"] = json!(node);
    }
    let pod: Pod = serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}),
    )?;
    Ok(ctx
        .api::<Pod>()
        .create(&PostParams::default(), &pod)
        .await?)
}

/// Binds a pending pod as a scheduler does.
async fn bind(ctx: &TestContext, name: &str, node: &str) -> Result<()> {
    let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
        "target": {"kind": "Node", "name": node}});
    let _: serde_json::Value = ctx
        .api::<Pod>()
        .create_subresource("binding", name, &PostParams::default(), &binding)
        .await?;
    Ok(())
}

/// The GpuSlice the operator would create for one card of `pod`.
async fn slice(
    ctx: &TestContext,
    pod: &Pod,
    node: &str,
    card: (u32, &str),
    spec: serde_json::Value,
) -> Result<GpuSlice> {
    let pod_name = pod.name_any();
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let mut full = json!({
        "nodeName": node,
        "card": {"index": card.0, "uuid": card.1},
        "pod": {"namespace": ctx.namespace, "name": pod_name, "uid": uid, "container": "app"},
        "replicaIndex": 0,
    });
    for (k, v) in spec.as_object().into_iter().flatten() {
        full[k] = v.clone();
    }
    let object: GpuSlice = serde_json::from_value(json!({
        "apiVersion": "runtimekit.aliyun.com/v1alpha1", "kind": "GpuSlice",
        "metadata": {
            "name": format!("{pod_name}-{}", &uid[..8.min(uid.len())]),
            "finalizers": [SLICE_FINALIZER],
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod_name, "uid": uid}],
        },
        "spec": full,
    }))?;
    Ok(ctx
        .api::<GpuSlice>()
        .create(&PostParams::default(), &object)
        .await?)
}

async fn wait_phase(ctx: &TestContext, name: &str, phase: SlicePhase) -> Result<GpuSlice> {
    let slices = ctx.api::<GpuSlice>();
    ctx.wait_for(&format!("slice {name} {phase:?}"), WAIT, || async {
        let slice = slices.get(name).await?;
        Ok((slice.status.as_ref().and_then(|s| s.phase) == Some(phase)).then_some(slice))
    })
    .await
}

async fn wait_gone(ctx: &TestContext, name: &str) -> Result<()> {
    let slices = ctx.api::<GpuSlice>();
    ctx.wait_for(&format!("slice {name} to be released"), WAIT, || async {
        Ok(slices.get_opt(name).await?.is_none().then_some(()))
    })
    .await
}

async fn delete_pod(ctx: &TestContext, name: &str) -> Result<()> {
    ctx.api::<Pod>()
        .delete(name, &DeleteParams::default().grace_period(0))
        .await?;
    Ok(())
}

/// Deletes every pod of the test and waits until the agents have released every slice (so the
/// namespace can go).
async fn release_all(ctx: &TestContext) -> Result<()> {
    for pod in ctx.api::<Pod>().list(&ListParams::default()).await?.items {
        delete_pod(ctx, &pod.name_any()).await?;
    }
    let slices = ctx.api::<GpuSlice>();
    ctx.wait_for("every slice to be released", WAIT, || async {
        Ok(slices
            .list(&ListParams::default())
            .await?
            .items
            .is_empty()
            .then_some(()))
    })
    .await
}

/// The phases a slice shows, in order, collected from a watch until `until` is seen.
fn record_phases(
    ctx: &TestContext,
    name: &str,
    until: SlicePhase,
) -> tokio::task::JoinHandle<Vec<SlicePhase>> {
    let slices = ctx.api::<GpuSlice>();
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    tokio::spawn(async move {
        let mut seen: Vec<SlicePhase> = Vec::new();
        let mut events = Box::pin(watcher(slices, config));
        while let Some(event) = events.next().await {
            let Ok(watcher::Event::Apply(slice) | watcher::Event::InitApply(slice)) = event else {
                continue;
            };
            if let Some(phase) = slice.status.and_then(|s| s.phase)
                && seen.last() != Some(&phase)
            {
                seen.push(phase);
                if phase == until {
                    break;
                }
            }
        }
        seen
    })
}

async fn node_agent_reports_its_node(ctx: TestContext) -> Result<()> {
    let h800 = AgentNode::start(&ctx, "h800", "h800-8").await?;
    // This agent counts memory in MiB: no device per MiB, a node-level resource instead.
    let a100 = AgentNode::start_with(
        &ctx,
        "a100",
        "a100-40gb-8",
        Some("resourcePrefix: aliyun.com\nmemoryUnit: MiB\n"),
    )
    .await?;

    let group = h800.group(&ctx).await?;
    ensure!(
        group.spec.tier == runtimekit_crds::Tier::Node
            && group.spec.node_name.as_deref() == Some(h800.name.as_str()),
        "spec: {:?}",
        group.spec
    );
    let status = group.status.context("status")?;
    ensure!(
        status.cards.len() == 8 && status.nics.len() == 4,
        "{status:?}"
    );
    let card0 = &status.cards[0];
    ensure!(
        card0.model == "NVIDIA H800"
            && card0.memory_mib == 81559
            && card0.uuid.starts_with("GPU-")
            && card0.health == CardHealth::Healthy
            && card0.pcie_switch.as_deref() == Some("pex0")
            && card0.numa_node == Some(0)
            && card0.socket == Some(0)
            && card0.interconnect_group.is_some()
            && card0.mig_capable
            && !card0.mig_enabled,
        "card 0: {card0:?}"
    );
    // NVSwitch: 8 links to each of the 7 other cards, a peer once per link.
    ensure!(
        card0.nvlink_peers.len() == 56
            && card0.nvlink_peers.iter().filter(|p| **p == 7).count() == 8,
        "peers: {:?}",
        card0.nvlink_peers
    );
    ensure!(status.cards[6].mig_enabled && status.cards[7].mig_enabled);
    let capacity = status.capacity.clone().context("capacity")?;
    ensure!(
        (
            capacity.nodes,
            capacity.cards,
            capacity.healthy_cards,
            capacity.free_cards,
            capacity.mig_cards
        ) == (1, 8, 8, 8, 2),
        "{capacity:?}"
    );
    let a100_status = a100.group(&ctx).await?.status.context("status")?;
    ensure!(
        a100_status.capacity.as_ref().map(|c| c.mig_cards) == Some(4)
            && a100_status.cards[0].model.contains("A100"),
        "{a100_status:?}"
    );

    // The heartbeat moves on (every 2 s here).
    let first = status.heartbeat_time.clone().context("heartbeat")?;
    h800.wait_group(&ctx, "a newer heartbeat", |g| {
        let beat = g.status.as_ref()?.heartbeat_time.clone()?;
        (beat.0 > first.0).then_some(())
    })
    .await?;

    // kubectl describe node shows every resource of SPEC section 6, from the device plugin.
    for (resource, count) in [
        ("aliyun.com/gpu", "6"),
        ("nvidia.com/gpu", "6"),
        ("aliyun.com/gpu-core", "600"),
        ("aliyun.com/gpu-memory", "632"),
        ("aliyun.com/gpu-slice", "14"),
        ("aliyun.com/rdma", "512"),
    ] {
        h800.wait_allocatable(&ctx, resource, count).await?;
    }
    a100.wait_allocatable(&ctx, "aliyun.com/gpu-slice", "28")
        .await?;
    // Four TDM and four MIG cards of 40960 MiB, written by the agent into the Node's status.
    a100.wait_allocatable(&ctx, "aliyun.com/gpu-memory", "327680")
        .await?;
    let a100_node = ctx.cluster_api::<Node>().get(&a100.name).await?;
    let a100_capacity = a100_node
        .status
        .and_then(|s| s.capacity)
        .unwrap_or_default();
    ensure!(
        a100_capacity
            .get("aliyun.com/gpu-memory")
            .map(|q| q.0.as_str())
            == Some("327680")
            && a100_capacity
                .get("aliyun.com/gpu-core")
                .map(|q| q.0.as_str())
                == Some("400"),
        "{a100_capacity:?}"
    );
    ensure!(
        a100.kubelet
            .view()
            .plugins
            .keys()
            .all(|r| r != "aliyun.com/gpu-memory"),
        "no memory device plugin in MiB mode"
    );
    shows_every_resource(&ctx, &h800.name)
}

/// Checks that `kubectl describe node` shows every resource of the spec in the node's capacity
/// and allocatable.
pub(crate) fn shows_every_resource(ctx: &TestContext, node: &str) -> Result<()> {
    let described = ctx.kubectl_ok(&["describe", "node", node], None)?;
    for resource in [
        "aliyun.com/gpu:",
        "nvidia.com/gpu:",
        "aliyun.com/gpu-core:",
        "aliyun.com/gpu-memory:",
        "aliyun.com/gpu-slice:",
        "aliyun.com/rdma:",
    ] {
        ensure!(
            described.matches(resource).count() >= 2,
            "{resource} in capacity and allocatable:\n{described}"
        );
    }
    Ok(())
}

async fn node_agent_mig_instance_follows_its_pod(ctx: TestContext) -> Result<()> {
    let node = AgentNode::start(&ctx, "mig", "h800-8").await?;
    let uuids = node.uuids(&ctx).await?;
    // A gang member: the operator writes its slice with its Binding, as it does any pod's,
    // and the agent enacts it at once, showing Bound itself before Creating and Ready.
    let pending = pod(&ctx, "mig-pod", None, json!({"aliyun.com/gpu-slice": "3"})).await?;
    let uid = pending.metadata.uid.clone().unwrap_or_default();
    let phases = record_phases(&ctx, &format!("mig-pod-{}", &uid[..8]), SlicePhase::Ready);
    // The watch lists before the slice exists, so it sees every phase.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let created = slice(
        &ctx,
        &pending,
        &node.name,
        (7, &uuids[7]),
        json!({"mode": "MIG", "slices": 3, "migProfile": "3g.40gb", "migPlacementStart": 4, "memory": "40Gi", "gang": "g"}),
    )
    .await?;
    let name = created.name_any();
    bind(&ctx, "mig-pod", &node.name).await?;
    let ready = wait_phase(&ctx, &name, SlicePhase::Ready).await?;
    let seen = tokio::time::timeout(WAIT, phases).await??;
    ensure!(
        seen == [SlicePhase::Bound, SlicePhase::Creating, SlicePhase::Ready],
        "each step shows: {seen:?}"
    );
    let status = ready.status.context("status")?;
    let MigInstanceRef {
        gpu_instance_id,
        device_uuid,
        ..
    } = status.mig_instance.context("migInstance")?;
    ensure!(device_uuid.starts_with("MIG-"), "{device_uuid}");
    ensure!(
        status
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True"),
        "{:?}",
        status.conditions
    );
    node.wait_group(&ctx, "the instance in the TopologyGroup", |g| {
        let card = g.status.as_ref()?.cards.get(7)?;
        card.mig_instances
            .iter()
            .any(|i| {
                i.profile == "3g.40gb"
                    && i.placement_start == 4
                    && i.gpu_instance_id == gpu_instance_id
            })
            .then_some(())
    })
    .await?;
    let instances = node.instances().await?;
    ensure!(
        instances.len() == 1 && instances[0].key == format!("{}/{name}", ctx.namespace),
        "{instances:?}"
    );
    // The kubelet admitted the pod with compute slices of the chosen card (card 7, where the
    // lowest free slices would be card 6's).
    let admitted = node
        .kubelet
        .wait_until(WAIT, |view| {
            view.admissions
                .get(&uid)
                .cloned()
                .map(|r| (r, view.devices_of(&uid, "aliyun.com/gpu-slice")))
        })
        .await
        .map_err(anyhow::Error::msg)?;
    ensure!(admitted.0.is_ok(), "admission: {:?}", admitted.0);
    ensure!(
        admitted.1.len() == 3
            && admitted
                .1
                .iter()
                .all(|d| d.starts_with(&format!("{}::", uuids[7]))),
        "the kubelet's slices are the pod's card's: {:?}",
        admitted.1
    );

    // The pod ends: the garbage collector deletes the slice, the agent destroys the instance
    // and releases the finalizer.
    delete_pod(&ctx, "mig-pod").await?;
    wait_gone(&ctx, &name).await?;
    ensure!(
        node.instances().await?.is_empty(),
        "the instance is destroyed"
    );
    node.wait_group(&ctx, "no instance in the TopologyGroup", |g| {
        g.status
            .as_ref()?
            .cards
            .get(6)?
            .mig_instances
            .is_empty()
            .then_some(())
    })
    .await?;
    Ok(())
}

async fn node_agent_restart_adopts_instances(ctx: TestContext) -> Result<()> {
    let mut node = AgentNode::start(&ctx, "restart", "h800-8").await?;
    let uuids = node.uuids(&ctx).await?;
    let mig_pod = pod(
        &ctx,
        "mig",
        Some(&node.name),
        json!({"aliyun.com/gpu-slice": "1"}),
    )
    .await?;
    let mig = slice(
        &ctx,
        &mig_pod,
        &node.name,
        (7, &uuids[7]),
        json!({"mode": "MIG", "slices": 1, "migProfile": "1g.10gb", "migPlacementStart": 2}),
    )
    .await?
    .name_any();
    let tdm_pod = pod(
        &ctx,
        "tdm",
        Some(&node.name),
        json!({"aliyun.com/gpu-core": "50", "aliyun.com/gpu-memory": "8"}),
    )
    .await?;
    let tdm = slice(
        &ctx,
        &tdm_pod,
        &node.name,
        (0, &uuids[0]),
        json!({"mode": "TDM", "core": 50, "memory": "8Gi"}),
    )
    .await?
    .name_any();
    let mig_ready = wait_phase(&ctx, &mig, SlicePhase::Ready).await?;
    wait_phase(&ctx, &tdm, SlicePhase::Ready).await?;

    // An instance no slice claims (left by a slice whose finalizer someone removed) is
    // destroyed.
    let mut layer = runtimekit_resource_layer::resource_client(node.layer_socket()).await?;
    layer
        .create_instance(pb::CreateInstanceRequest {
            key: format!("{}/ghost", ctx.namespace),
            spec: Some(pb::InstanceSpec {
                device_index: 1,
                device_uuid: String::new(),
                kind: Some(pb::instance_spec::Kind::Tdm(pb::TdmSpec {
                    core_percent: 10,
                    memory_mib: 1024,
                })),
            }),
        })
        .await?;
    ctx.wait_for("the orphan to be destroyed", WAIT, || async {
        let keys: Vec<String> = node.instances().await?.into_iter().map(|i| i.key).collect();
        Ok((!keys.iter().any(|k| k.ends_with("/ghost"))).then_some(keys))
    })
    .await?;

    // The agent crashes; meanwhile the TDM pod ends (its slice waits on the finalizer).
    node.agent.kill();
    delete_pod(&ctx, "tdm").await?;
    ctx.wait_for("the TDM slice to be deleting", WAIT, || async {
        let s = ctx.api::<GpuSlice>().get_opt(&tdm).await?;
        Ok(s.filter(|s| s.metadata.deletion_timestamp.is_some())
            .map(|_| ()))
    })
    .await?;
    node.agent = spawn_agent(&ctx, "restart", &node.args)?;

    // The new agent releases the TDM slice, keeps the MIG slice as it was, and leaves
    // exactly the MIG instance.
    wait_gone(&ctx, &tdm).await?;
    let keys = ctx
        .wait_for("only the MIG instance left", WAIT, || async {
            let keys: Vec<String> = node.instances().await?.into_iter().map(|i| i.key).collect();
            Ok((keys.len() == 1).then_some(keys))
        })
        .await?;
    ensure!(keys == [format!("{}/{mig}", ctx.namespace)], "{keys:?}");
    node.wait_group(&ctx, "the TopologyGroup after the restart", |g| {
        let status = g.status.as_ref()?;
        let card7 = status.cards.get(7)?;
        let fresh = status.conditions.iter().any(|c| c.status == "True");
        (fresh && card7.mig_instances.len() == 1 && card7.mig_instances[0].placement_start == 2)
            .then_some(())
    })
    .await?;
    // Give the new agent a few passes; the adopted slice's object is not rewritten.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = ctx.api::<GpuSlice>().get(&mig).await?;
    ensure!(
        after.metadata.resource_version == mig_ready.metadata.resource_version,
        "the adopted slice was rewritten: {:?} -> {:?}",
        mig_ready.status,
        after.status
    );
    ensure!(node.agent.running(), "the new agent runs");
    release_all(&ctx).await?;
    ensure!(node.instances().await?.is_empty(), "nothing leaks");
    Ok(())
}

async fn node_agent_card_fault_and_recovery(ctx: TestContext) -> Result<()> {
    let node = AgentNode::start(&ctx, "faulty", "h800-8").await?;
    node.wait_allocatable(&ctx, "aliyun.com/gpu", "6").await?;
    node.fault(0, pb::FaultKind::Xid, 79).await?;
    node.fault(6, pb::FaultKind::CallHang, 0).await?;
    node.wait_group(&ctx, "cards 0 and 6 unhealthy", |g| {
        let status = g.status.as_ref()?;
        let (c0, c6) = (status.cards.first()?, status.cards.get(6)?);
        (c0.health == CardHealth::Unhealthy
            && c0
                .health_reason
                .as_deref()
                .is_some_and(|r| r.contains("XID 79"))
            && c6.health == CardHealth::Unhealthy
            && status.capacity.as_ref()?.healthy_cards == 6)
            .then_some(())
    })
    .await?;
    // Unschedulable: out of allocatable (capacity stays).
    node.wait_allocatable(&ctx, "aliyun.com/gpu", "5").await?;
    node.wait_allocatable(&ctx, "nvidia.com/gpu", "5").await?;
    node.wait_allocatable(&ctx, "aliyun.com/gpu-core", "500")
        .await?;
    node.wait_allocatable(&ctx, "aliyun.com/gpu-slice", "7")
        .await?;
    let capacity = ctx
        .cluster_api::<Node>()
        .get(&node.name)
        .await?
        .status
        .and_then(|s| s.capacity)
        .unwrap_or_default();
    ensure!(
        capacity.get("aliyun.com/gpu").map(|q| q.0.as_str()) == Some("6"),
        "capacity keeps the card: {capacity:?}"
    );
    let events = ctx
        .wait_for("a Warning event on the Node", WAIT, || async {
            let text = ctx.kubectl_ok(
                &[
                    "get",
                    "events",
                    "-A",
                    "--field-selector",
                    &format!("involvedObject.name={}", node.name),
                    "-o",
                    "wide",
                ],
                None,
            )?;
            Ok((text.contains("GpuUnhealthy") && text.contains("XID 79")).then_some(text))
        })
        .await?;
    ensure!(events.contains("Warning"), "{events}");

    node.clear(0).await?;
    node.clear(6).await?;
    node.wait_group(&ctx, "every card healthy again", |g| {
        let status = g.status.as_ref()?;
        (status
            .cards
            .iter()
            .all(|c| c.health == CardHealth::Healthy && c.health_reason.is_none())
            && status.capacity.as_ref()?.healthy_cards == 8)
            .then_some(())
    })
    .await?;
    node.wait_allocatable(&ctx, "aliyun.com/gpu", "6").await?;
    node.wait_allocatable(&ctx, "aliyun.com/gpu-slice", "14")
        .await?;
    ctx.wait_for("a GpuHealthy event", WAIT, || async {
        let text = ctx.kubectl_ok(
            &[
                "get",
                "events",
                "-A",
                "--field-selector",
                &format!("involvedObject.name={}", node.name),
            ],
            None,
        )?;
        Ok(text.contains("GpuHealthy").then_some(()))
    })
    .await
}

async fn node_agent_never_gives_a_sliced_card_whole(ctx: TestContext) -> Result<()> {
    let node = AgentNode::start(&ctx, "shared", "h800-8").await?;
    let uuids = node.uuids(&ctx).await?;
    // A share on card 0, enacted.
    let share = pod(
        &ctx,
        "share",
        Some(&node.name),
        json!({"aliyun.com/gpu-core": "30"}),
    )
    .await?;
    let share_slice = slice(
        &ctx,
        &share,
        &node.name,
        (0, &uuids[0]),
        json!({"mode": "TDM", "core": 30}),
    )
    .await?
    .name_any();
    wait_phase(&ctx, &share_slice, SlicePhase::Ready).await?;
    node.wait_allocatable(&ctx, "nvidia.com/gpu", "5").await?;
    // Pods of another scheduler asking for whole cards: six do not fit, five never get card 0.
    let six = pod(
        &ctx,
        "six",
        Some(&node.name),
        json!({"nvidia.com/gpu": "6"}),
    )
    .await?;
    let five = pod(
        &ctx,
        "five",
        Some(&node.name),
        json!({"nvidia.com/gpu": "5"}),
    )
    .await?;
    let (six_uid, five_uid) = (
        six.metadata.uid.unwrap_or_default(),
        five.metadata.uid.unwrap_or_default(),
    );
    let (six_outcome, five_outcome, cards) = node
        .kubelet
        .wait_until(WAIT, |view| {
            Some((
                view.admissions.get(&six_uid)?.clone(),
                view.admissions.get(&five_uid)?.clone(),
                view.devices_of(&five_uid, "nvidia.com/gpu"),
            ))
        })
        .await
        .map_err(anyhow::Error::msg)?;
    ensure!(
        six_outcome
            .as_ref()
            .is_err_and(|e| e.contains("UnexpectedAdmissionError")),
        "six cards: {six_outcome:?}"
    );
    ensure!(five_outcome.is_ok(), "five cards: {five_outcome:?}");
    ensure!(
        cards.len() == 5 && !cards.contains(&uuids[0]),
        "card 0 holds a slice: {cards:?}"
    );
    // The card given whole is not free for the scheduler any more.
    node.wait_group(&ctx, "no free card left", |g| {
        (g.status.as_ref()?.capacity.as_ref()?.free_cards == 2).then_some(())
    })
    .await?;
    release_all(&ctx).await
}

/// Expects a write to be refused with 403 and the policy's message.
fn forbidden<T: std::fmt::Debug>(outcome: kube::Result<T>, message: &str) -> Result<()> {
    match outcome {
        Err(kube::Error::Api(e)) if e.code == 403 && e.message.contains(message) => Ok(()),
        other => bail!("expected 403 with {message:?}, got {other:?}"),
    }
}

async fn node_agent_writes_only_its_own_node(ctx: TestContext) -> Result<()> {
    install_agent_access(&ctx).await?;
    let a = ctx
        .fake_node(FakeNode::new("a").label("lj_runtimekit_enable", "true"))
        .await?
        .name_any();
    let b = ctx
        .fake_node(FakeNode::new("b").label("lj_runtimekit_enable", "true"))
        .await?
        .name_any();
    let agent_a = ctx.client_for(&agent_user(&a), &[AGENT_GROUP]).await?;
    // An agent reads no pods: not the cluster's, not even its own node's.
    let pods_a = kube::Api::<Pod>::all(agent_a.clone());
    let own = format!("spec.nodeName={a}");
    for params in [ListParams::default(), ListParams::default().fields(&own)] {
        let listed = pods_a.list(&params).await;
        ensure!(
            matches!(listed, Err(kube::Error::Api(ref e)) if e.code == 403),
            "listing pods ({:?}) must be forbidden: {listed:?}",
            params.field_selector
        );
    }
    let apply = PatchParams::apply("runtimekit-node-agent-topology").force();
    let group = |node: &str| {
        json!({"apiVersion": "runtimekit.aliyun.com/v1alpha1", "kind": "TopologyGroup",
        "metadata": {"name": node}, "spec": {"tier": "Node", "nodeName": node}})
    };
    let status = json!({"apiVersion": "runtimekit.aliyun.com/v1alpha1", "kind": "TopologyGroup",
        "status": {"capacity": {"nodes": 1, "cards": 0, "healthyCards": 0, "freeCards": 0}}});
    // Node B's group, as its agent would have made it.
    ctx.cluster_api::<TopologyGroup>()
        .patch(&b, &apply, &Patch::Apply(group(&b)))
        .await?;
    let groups_a = kube::Api::<TopologyGroup>::all(agent_a.clone());
    // The policy is enforced a moment after it is created: wait until it is.
    ctx.wait_for("the admission policy to be enforced", WAIT, || async {
        let outcome = groups_a
            .patch_status(&b, &apply, &Patch::Apply(&status))
            .await;
        Ok(matches!(outcome, Err(kube::Error::Api(ref e)) if e.code == 403).then_some(()))
    })
    .await?;
    let message = "a node agent may write only the TopologyGroup of its own node";
    forbidden(
        groups_a
            .patch_status(&b, &apply, &Patch::Apply(&status))
            .await,
        message,
    )?;
    forbidden(
        groups_a.patch(&b, &apply, &Patch::Apply(group(&b))).await,
        message,
    )?;
    let other = format!("{}-elsewhere", ctx.namespace);
    forbidden(
        groups_a
            .patch(&other, &apply, &Patch::Apply(group(&other)))
            .await,
        message,
    )?;
    // Its own: created and written.
    groups_a.patch(&a, &apply, &Patch::Apply(group(&a))).await?;
    groups_a
        .patch_status(&a, &apply, &Patch::Apply(&status))
        .await?;

    // GpuSlices: only those on its node, and never their spec.
    let owner = pod(&ctx, "owner", None, json!({})).await?;
    let slice_b = slice(&ctx, &owner, &b, (0, "GPU-b"), json!({"mode": "Whole"}))
        .await?
        .name_any();
    let on_a = pod(&ctx, "owner-a", None, json!({})).await?;
    let slice_a = slice(&ctx, &on_a, &a, (0, "GPU-a"), json!({"mode": "Whole"}))
        .await?
        .name_any();
    let slices_a = kube::Api::<GpuSlice>::namespaced(agent_a.clone(), &ctx.namespace);
    let slice_status = json!({"apiVersion": "runtimekit.aliyun.com/v1alpha1", "kind": "GpuSlice", "status": {"phase": "Ready"}});
    let manager = PatchParams::apply("runtimekit-node-agent").force();
    forbidden(
        slices_a
            .patch_status(&slice_b, &manager, &Patch::Apply(&slice_status))
            .await,
        "a node agent may write only the GpuSlices of its own node",
    )?;
    forbidden(
        slices_a
            .patch(
                &slice_b,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": []}})),
            )
            .await,
        "a node agent may write only the GpuSlices of its own node",
    )?;
    slices_a
        .patch_status(&slice_a, &manager, &Patch::Apply(&slice_status))
        .await?;
    forbidden(
        slices_a
            .patch(
                &slice_a,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicaIndex": 3}})),
            )
            .await,
        "not its spec",
    )?;
    slices_a
        .patch(
            &slice_a,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": []}})),
        )
        .await?;

    // Nodes: its own status, not another's.
    let nodes_a = kube::Api::<Node>::all(agent_a.clone());
    let node_status = |node: &str| {
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node},
        "status": {"capacity": {"example.org/probe": "1"}}})
    };
    let node_manager = PatchParams::apply("runtimekit-node-agent-resources").force();
    forbidden(
        nodes_a
            .patch_status(&b, &node_manager, &Patch::Apply(node_status(&b)))
            .await,
        "a node agent may write only its own Node",
    )?;
    nodes_a
        .patch_status(&a, &node_manager, &Patch::Apply(node_status(&a)))
        .await?;
    // RBAC gives agents nothing else: no deleting groups, no creating slices.
    forbidden(
        groups_a.delete(&b, &DeleteParams::default()).await,
        "forbidden",
    )?;

    // The DaemonSet's identity: the ServiceAccount token bound to a pod on node A names node A.
    let pods = kube::Api::<Pod>::namespaced(ctx.client.clone(), "runtimekit-system");
    let agent_pod: Pod = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("{}-agent", ctx.namespace)},
        "spec": {"nodeName": a, "serviceAccountName": "runtimekit-node-agent", "automountServiceAccountToken": false,
                 "containers": [{"name": "agent", "image": "runtimekit-node-agent"}]}}))?;
    let agent_pod = pods.create(&PostParams::default(), &agent_pod).await?;
    let request = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {
        "expirationSeconds": 3600,
        "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": agent_pod.name_any(), "uid": agent_pod.metadata.uid}}});
    let accounts = kube::Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(
        ctx.client.clone(),
        "runtimekit-system",
    );
    let token: k8s_openapi::api::authentication::v1::TokenRequest = accounts
        .create_subresource(
            "token",
            "runtimekit-node-agent",
            &PostParams::default(),
            &request,
        )
        .await?;
    let token = token.status.and_then(|s| s.token).context("token")?;
    let daemon = ctx.client_with_token(&token).await?;
    let groups_sa = kube::Api::<TopologyGroup>::all(daemon);
    groups_sa
        .patch_status(&a, &apply, &Patch::Apply(&status))
        .await?;
    forbidden(
        groups_sa
            .patch_status(&b, &apply, &Patch::Apply(&status))
            .await,
        message,
    )?;
    pods.delete(
        &agent_pod.name_any(),
        &DeleteParams::default().grace_period(0),
    )
    .await?;
    // No agent runs for node B: take its slice's finalizer off as the operator would.
    ctx.api::<GpuSlice>()
        .patch(
            &slice_b,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": []}})),
        )
        .await?;
    Ok(())
}

async fn node_agent_enacts_what_the_operator_decides(ctx: TestContext) -> Result<()> {
    let node = AgentNode::start(&ctx, "op", "h800-8").await?;
    // The operator as deployed: its own runtime and client, with the deployment's RBAC.
    let operator = crate::operator::Operator::start(&ctx, "op-agents").await?;
    let outcome = async {
        let mig: Pod = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "mig-demo"}, "spec": {
            "schedulerName": "lj-runtimekit-scheduler", "runtimeClassName": "lj-runtime",
            "containers": [{"name": "app", "image": "busybox", "resources": {"limits": {"aliyun.com/gpu-slice": "3", "aliyun.com/gpu-memory": "4"}}}]}}))?;
        ctx.api::<Pod>().create(&PostParams::default(), &mig).await?;
        let slice = ctx
            .wait_for("the operator's slice to be Ready", Duration::from_secs(60), || async {
                let slices = ctx.api::<GpuSlice>().list(&ListParams::default()).await?.items;
                Ok(slices.into_iter().find(|s| {
                    s.spec.pod.name == "mig-demo"
                        && s.status.as_ref().and_then(|st| st.phase) == Some(SlicePhase::Ready)
                }))
            })
            .await?;
        let start = slice.spec.mig_placement_start.context("start")?;
        ensure!(matches!(start, 0 | 4), "a legal 3g start: {start}");
        let gi = slice.status.as_ref().and_then(|s| s.mig_instance.as_ref()).context("instance")?.gpu_instance_id;
        let card = slice.spec.card.as_ref().context("card")?.index;
        node.wait_group(&ctx, "the instance reported", |g| {
            g.status.as_ref()?.cards.get(card as usize)?.mig_instances.iter()
                .any(|i| i.gpu_instance_id == gi && i.placement_start == start)
                .then_some(())
        })
        .await?;
        delete_pod(&ctx, "mig-demo").await?;
        wait_gone(&ctx, &slice.name_any()).await?;
        ensure!(node.instances().await?.is_empty(), "destroyed with the pod");
        Ok(())
    }
    .await;
    let stopped = tokio::time::timeout(Duration::from_secs(20), operator.stop()).await;
    if let Err(error) = outcome {
        // An operator that ended early is the likelier story; say how it ended.
        bail!("{error:#} (the operator: {stopped:?})");
    }
    stopped.context("the operator did not stop")??;
    Ok(())
}

/// Both schedulers on one node: a pod of the default scheduler holds seven cards whole through
/// the kubelet; the operator, told by the agent, never picks them, and a slice that lands on one
/// anyway (a decision made before the agent reported) tells its pod what happened and what to do.
async fn cards_held_by_another_scheduler_are_never_picked(ctx: TestContext) -> Result<()> {
    let node = AgentNode::start(&ctx, "mixed", "h800-8").await?;
    let uuids = node.uuids(&ctx).await?;
    let operator = crate::operator::Operator::start(&ctx, "op-mixed").await?;
    let outcome = async {
        let outside = pod(
            &ctx,
            "outside",
            Some(&node.name),
            json!({"nvidia.com/gpu": "5"}),
        )
        .await?;
        let outside_uid = outside.metadata.uid.clone().unwrap_or_default();
        let held = node
            .kubelet
            .wait_until(WAIT, |view| {
                view.admissions.get(&outside_uid)?.as_ref().ok()?;
                Some(view.devices_of(&outside_uid, "nvidia.com/gpu"))
            })
            .await
            .map_err(anyhow::Error::msg)?;
        ensure!(held.len() == 5, "five cards given whole: {held:?}");
        // Of the six cards outside MIG mode, one is left.
        let group = node.group(&ctx).await?;
        let cards = group.status.unwrap_or_default().cards;
        let free = cards
            .iter()
            .find(|c| !c.mig_enabled && !held.contains(&c.uuid))
            .context("one card left outside MIG mode")?
            .index;
        let held_card = cards
            .iter()
            .find(|c| held.contains(&c.uuid))
            .context("a held card")?
            .index;
        node.wait_group(&ctx, "five cards reported held outside", |g| {
            let cards = &g.status.as_ref()?.cards;
            let reported = cards
                .iter()
                .filter(|c| c.held_by == [format!("{}/outside", ctx.namespace)])
                .count();
            (reported == 5).then_some(())
        })
        .await?;

        // The runtimekit scheduler's shares all go to the one card not held.
        for name in ["share-0", "share-1"] {
            crate::operator::create_pod(
                &ctx,
                crate::operator::gpu_pod(name, json!({"aliyun.com/gpu-core": "30"})),
            )
            .await?;
        }
        let slices = ctx.api::<GpuSlice>();
        let cards = ctx
            .wait_for("both shares enacted", Duration::from_secs(60), || async {
                let list = slices.list(&ListParams::default()).await?.items;
                let ready: Vec<u32> = list
                    .iter()
                    .filter(|s| {
                        s.status.as_ref().and_then(|st| st.phase) == Some(SlicePhase::Ready)
                    })
                    .filter_map(|s| s.spec.card.as_ref().map(|c| c.index))
                    .collect();
                Ok((ready.len() == 2).then_some(ready))
            })
            .await?;
        ensure!(
            cards == [free, free],
            "shares on card {free} only: {cards:?}"
        );
        // A whole card fits nowhere now (the two cards left are in MIG mode).
        crate::operator::create_pod(
            &ctx,
            crate::operator::gpu_pod("whole", json!({"nvidia.com/gpu": "1"})),
        )
        .await?;
        crate::operator::event(&ctx, "reason=FailedScheduling", "0/1 nodes are available").await?;

        // A slice on a held card fails, and its pod hears why and what to do.
        let mut raced = crate::operator::gpu_pod("raced", json!({"aliyun.com/gpu-core": "30"}));
        raced["spec"]["nodeName"] = json!(node.name);
        let raced = crate::operator::create_pod(&ctx, raced).await?;
        let raced_slice = slice(
            &ctx,
            &raced,
            &node.name,
            (held_card, &uuids[held_card as usize]),
            json!({"mode": "TDM", "core": 30}),
        )
        .await?
        .name_any();
        wait_phase(&ctx, &raced_slice, SlicePhase::Failed).await?;
        let pods = ctx.api::<Pod>();
        let condition = ctx
            .wait_for("the pod's GpuSlicesReady condition", WAIT, || async {
                let pod = pods.get("raced").await?;
                let conditions = pod.status.and_then(|s| s.conditions).unwrap_or_default();
                Ok(conditions
                    .into_iter()
                    .find(|c| c.type_ == "GpuSlicesReady" && c.status == "False"))
            })
            .await?;
        let message = condition.message.unwrap_or_default();
        ensure!(
            condition.reason.as_deref() == Some("CardHeldWhole")
                && message.contains(&format!("(card {held_card}) cannot be enacted"))
                && message.contains("outside")
                && message.contains("Delete the pod"),
            "{message}"
        );
        crate::operator::event(
            &ctx,
            "reason=CardHeldWhole,involvedObject.name=raced",
            "Delete the pod",
        )
        .await?;
        Ok(())
    }
    .await;
    let released = release_all(&ctx).await;
    let stopped = tokio::time::timeout(Duration::from_secs(20), operator.stop()).await;
    outcome?;
    released?;
    stopped.context("the operator did not stop")??;
    Ok(())
}

/// The pods that fill one h800-8 node exactly, named with `prefix`: three whole cards, six 50 %
/// shares (three cards), and on the two MIG cards pods of 7, 4 and 3 compute slices (the 3 last).
fn full_node_pods(prefix: &str) -> Vec<serde_json::Value> {
    use crate::operator::gpu_pod;
    let mut pods = Vec::new();
    let whole_cards = 3;
    for w in 0..whole_cards {
        pods.push(gpu_pod(
            &format!("{prefix}-whole-{w}"),
            json!({"nvidia.com/gpu": "1"}),
        ));
    }
    for t in 0..2 * (6 - whole_cards) {
        pods.push(gpu_pod(
            &format!("{prefix}-share-{t}"),
            json!({"aliyun.com/gpu-core": "50", "aliyun.com/gpu-memory": "8"}),
        ));
    }
    for slices in [7, 4, 3] {
        pods.push(gpu_pod(
            &format!("{prefix}-mig-{slices}"),
            json!({"aliyun.com/gpu-slice": slices.to_string(), "aliyun.com/gpu-memory": "8"}),
        ));
    }
    pods
}

/// The test's pods (with their nodes) and slices (with their cards and phases), for messages.
async fn seen(ctx: &TestContext) -> String {
    let pods = match ctx.api::<Pod>().list(&ListParams::default()).await {
        Ok(list) => list
            .items
            .iter()
            .map(|p| {
                let node = p.spec.as_ref().and_then(|s| s.node_name.as_deref());
                format!("{}@{}", p.name_any(), node.unwrap_or("(pending)"))
            })
            .collect::<Vec<_>>()
            .join(" "),
        Err(error) => format!("(cannot list pods: {error})"),
    };
    let slices = match ctx.api::<GpuSlice>().list(&ListParams::default()).await {
        Ok(list) => list
            .items
            .iter()
            .map(|s| {
                let status = s.status.as_ref();
                format!(
                    "{}[pod {} card {:?} {:?}{}: {}]",
                    s.name_any(),
                    s.spec.pod.name,
                    s.spec.card.as_ref().map(|c| c.index),
                    status.and_then(|st| st.phase),
                    if s.metadata.deletion_timestamp.is_some() {
                        " deleting"
                    } else {
                        ""
                    },
                    status
                        .and_then(|st| st.conditions.first())
                        .map(|c| c.message.as_str())
                        .unwrap_or_default(),
                )
            })
            .collect::<Vec<_>>()
            .join("\n  "),
        Err(error) => format!("(cannot list slices: {error})"),
    };
    format!("pods: {pods}\nslices:\n  {slices}")
}

/// `outcome`, with what the test's pods and slices look like added to an error.
async fn showing_seen<T>(ctx: &TestContext, outcome: Result<T>) -> Result<T> {
    match outcome {
        Ok(value) => Ok(value),
        Err(error) => bail!("{error:#}\n{}", seen(ctx).await),
    }
}

/// Waits until `count` pods are bound, each with one slice, every slice Ready; returns the
/// slices.
async fn all_ready(ctx: &TestContext, count: usize, what: &str) -> Result<Vec<GpuSlice>> {
    let timeout = Duration::from_secs(90);
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let bound = crate::operator::bound_count(ctx).await?;
        let slices = ctx
            .api::<GpuSlice>()
            .list(&ListParams::default())
            .await?
            .items;
        let ready = slices
            .iter()
            .filter(|s| s.status.as_ref().and_then(|st| st.phase) == Some(SlicePhase::Ready))
            .count();
        if bound == count && slices.len() == count && ready == count {
            return Ok(slices);
        }
        if std::time::Instant::now() > deadline {
            bail!(
                "timed out after {timeout:?} waiting for {what} ({count} pods bound, each slice Ready; {bound} bound, {} slices, {ready} Ready)\n{}",
                slices.len(),
                seen(ctx).await
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Creates `pods` (for the operator to place) one at a time, each once the one before is bound,
/// enacted and admitted by the kubelet, and returns every slice. (Pods created in a burst race
/// the kubelet's admission against the agent's view of their slices: the agent's device plugin
/// can then steer a whole-card pod to a card the operator gave to shares.)
async fn fill(
    ctx: &TestContext,
    node: &AgentNode,
    pods: &[serde_json::Value],
    what: &str,
) -> Result<Vec<GpuSlice>> {
    let existing = ctx
        .api::<GpuSlice>()
        .list(&ListParams::default())
        .await?
        .items
        .len();
    for (done, pod) in pods.iter().enumerate() {
        let created = crate::operator::create_pod(ctx, pod.clone()).await?;
        let name = created.name_any();
        let uid = created.metadata.uid.clone().unwrap_or_default();
        let slices = all_ready(ctx, existing + done + 1, &format!("{what}: pod {name}")).await?;
        let slice = slices
            .iter()
            .find(|s| s.spec.pod.uid == uid)
            .with_context(|| format!("the slice of pod {name}"))?;
        let admitted = node
            .kubelet
            .wait_until(WAIT, |view| view.admissions.get(&uid).cloned())
            .await
            .map_err(|e| anyhow::anyhow!("the kubelet's admission of pod {name}: {e}"))?;
        ensure!(
            admitted.is_ok(),
            "the kubelet admits pod {name}: {admitted:?}"
        );
        if slice.spec.mode == runtimekit_crds::SliceMode::Whole {
            let given = node.kubelet.view().devices_of(&uid, "nvidia.com/gpu");
            let card = slice.spec.card.as_ref().map(|c| c.uuid.clone());
            ensure!(
                given.len() == 1 && Some(&given[0]) == card.as_ref(),
                "the kubelet gives pod {name} the card its slice names ({card:?}): {given:?}"
            );
        }
    }
    all_ready(ctx, existing + pods.len(), what).await
}

/// The resource layer's instances, ordered by key, checked to be exactly one per MIG or TDM
/// slice of `slices` (whole cards have none).
async fn instances_of(
    ctx: &TestContext,
    node: &AgentNode,
    slices: &[GpuSlice],
) -> Result<Vec<pb::Instance>> {
    let mut instances = node.instances().await?;
    instances.sort_by(|a, b| a.key.cmp(&b.key));
    let keys: Vec<&str> = instances.iter().map(|i| i.key.as_str()).collect();
    let mut wanted: Vec<String> = slices
        .iter()
        .filter(|s| s.spec.mode != runtimekit_crds::SliceMode::Whole)
        .map(|s| format!("{}/{}", ctx.namespace, s.name_any()))
        .collect();
    wanted.sort();
    ensure!(
        keys == wanted,
        "one instance per MIG and TDM slice: the layer holds {keys:?}, the slices are {wanted:?}"
    );
    Ok(instances)
}

/// Deletes every pod; waits until every slice is released and every instance destroyed.
async fn empty_node(ctx: &TestContext, node: &AgentNode) -> Result<()> {
    showing_seen(ctx, release_all(ctx).await).await?;
    let left = ctx
        .wait_for("every instance destroyed", WAIT, || async {
            let left = node.instances().await?;
            Ok(left.is_empty().then_some(()))
        })
        .await;
    if let Err(error) = left {
        let keys: Vec<String> = node.instances().await?.into_iter().map(|i| i.key).collect();
        bail!("{error:#}; the layer still holds {keys:?}");
    }
    Ok(())
}

/// Fills the node again from nothing, which works only if every card came back, then empties
/// it.
async fn refill(ctx: &TestContext, node: &AgentNode) -> Result<()> {
    let pods = full_node_pods("again");
    let slices = fill(ctx, node, &pods, "the node filled again: no card leaked").await?;
    instances_of(ctx, node, &slices).await?;
    empty_node(ctx, node).await
}

/// Runs `test` with an operator, and stops the operator whatever happens.
async fn with_operator<F, Fut>(ctx: &TestContext, identity: &str, test: F) -> Result<()>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let operator = crate::operator::Operator::start(ctx, identity).await?;
    let outcome = test().await;
    let stopped = tokio::time::timeout(Duration::from_secs(20), operator.stop()).await;
    if let Err(error) = outcome {
        bail!("{error:#} (the operator: {stopped:?})");
    }
    stopped.context("the operator did not stop")??;
    Ok(())
}

/// Whether each slice's object is as it was (same resourceVersion, Ready).
fn unchanged(before: &[GpuSlice], after: &[GpuSlice]) -> Result<()> {
    let versions = |slices: &[GpuSlice]| {
        let mut v: Vec<(String, Option<String>, Option<SlicePhase>)> = slices
            .iter()
            .map(|s| {
                (
                    s.name_any(),
                    s.metadata.resource_version.clone(),
                    s.status.as_ref().and_then(|st| st.phase),
                )
            })
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    };
    let (before, after) = (versions(before), versions(after));
    ensure!(
        before == after,
        "slices rewritten (name, resourceVersion, phase):\nbefore {before:?}\nafter  {after:?}"
    );
    Ok(())
}

/// The resource layer dies and comes back on the same socket and state file while the node is
/// full: the agent keeps every slice as it was, and the layer every instance; the node then
/// empties and fills again.
async fn resource_layer_restarted_under_a_running_agent(ctx: TestContext) -> Result<()> {
    let mut node = AgentNode::start_with_layer(&ctx, "relayer", "h800-8").await?;
    with_operator(&ctx, "op-relayer", || async {
        let pods = full_node_pods("first");
        let slices = fill(&ctx, &node, &pods, "the node full, every slice Ready").await?;
        let before = instances_of(&ctx, &node, &slices).await?;

        let (layer, layer_args) = node.layer.take().context("the layer process")?;
        layer.kill();
        ensure!(!layer.running(), "the resource layer is killed");
        tokio::time::sleep(Duration::from_secs(4)).await;
        ensure!(
            node.agent.running(),
            "the agent outlives its resource layer"
        );
        let during = ctx
            .api::<GpuSlice>()
            .list(&ListParams::default())
            .await?
            .items;
        unchanged(&slices, &during).context("while the resource layer is away")?;
        let log = std::fs::read_to_string(node.agent.log())?;
        ensure!(
            log.contains("listing the cards failed"),
            "the agent noticed its resource layer gone (log {})",
            node.agent.log().display()
        );
        let restarted = spawn_layer(&ctx, "relayer", &layer_args, &node.layer_socket()).await?;
        node.layer = Some((restarted, layer_args));
        let beat = node
            .group(&ctx)
            .await?
            .status
            .and_then(|s| s.heartbeat_time)
            .context("a heartbeat")?;
        node.wait_group(&ctx, "the TopologyGroup Ready with a newer heartbeat", |g| {
            let status = g.status.as_ref()?;
            let ready = status
                .conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            let newer = status.heartbeat_time.as_ref()?.0 > beat.0;
            let migs: usize = status.cards.iter().map(|c| c.mig_instances.len()).sum();
            (ready && newer && status.cards.len() == 8 && migs == 3).then_some(())
        })
        .await?;
        // A few passes of the agent (every 2 s) against the new layer.
        tokio::time::sleep(Duration::from_secs(6)).await;
        let after = ctx
            .api::<GpuSlice>()
            .list(&ListParams::default())
            .await?
            .items;
        unchanged(&slices, &after).context("after the resource layer came back")?;
        let now = instances_of(&ctx, &node, &slices).await?;
        ensure!(
            now == before,
            "the layer's instances survive its restart as they were:\nbefore {before:?}\nafter  {now:?}"
        );
        ensure!(node.agent.running(), "the agent still runs");

        // Every pod goes: every slice released, every instance destroyed by the agent through
        // the new layer; then the node fills again.
        empty_node(&ctx, &node).await?;
        refill(&ctx, &node).await
    })
    .await
}

/// What the temporary admission policy says when it refuses a write.
const HELD_BACK: &str = "e2e: the node agent's Ready write is held back";

/// A policy (and its binding) that refuses the node agents' status writes that make the slices of
/// pod `pod` in the test's namespace Ready, and every such write made as a dry run there (the
/// probe of whether the policy is loaded).
fn hold_ready_policy(ctx: &TestContext, pod: &str) -> String {
    let name = format!("{}-hold-ready", ctx.namespace);
    let expression = format!(
        "!(has(object.status) && has(object.status.phase) && object.status.phase == 'Ready' && \
         object.metadata.namespace == '{ns}' && (request.dryRun || object.spec.pod.name == '{pod}'))",
        ns = ctx.namespace
    );
    let policy = json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
    "metadata": {"name": name},
    "spec": {
        "failurePolicy": "Fail",
        "matchConstraints": {"resourceRules": [{"apiGroups": ["runtimekit.aliyun.com"],
            "apiVersions": ["*"], "operations": ["UPDATE"], "resources": ["gpuslices/status"]}]},
        "matchConditions": [{"name": "node-agent",
            "expression": format!("'{AGENT_GROUP}' in request.userInfo.groups")}],
        "validations": [{"expression": expression, "message": HELD_BACK, "reason": "Forbidden"}],
    }});
    let binding = json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"]}});
    format!("{policy}\n{binding}\n")
}

fn delete_hold_ready_policy(ctx: &TestContext) -> Result<()> {
    let name = format!("{}-hold-ready", ctx.namespace);
    ctx.kubectl_ok(
        &[
            "delete",
            "--ignore-not-found",
            "--wait=false",
            &format!("validatingadmissionpolicybinding/{name}"),
            &format!("validatingadmissionpolicy/{name}"),
        ],
        None,
    )?;
    Ok(())
}

/// Whether the node agent's Ready writes are refused now: a dry-run write, as the agent, that
/// would make `slice` Ready.
async fn ready_writes_held(ctx: &TestContext, node: &AgentNode, slice: &str) -> Result<bool> {
    let agent = ctx
        .client_for(&agent_user(&node.name), &[AGENT_GROUP])
        .await?;
    let slices = kube::Api::<GpuSlice>::namespaced(agent, &ctx.namespace);
    let status = json!({"apiVersion": "runtimekit.aliyun.com/v1alpha1", "kind": "GpuSlice",
        "status": {"phase": "Ready"}});
    let outcome = slices
        .patch_status(
            slice,
            &PatchParams::apply("e2e-probe").force().dry_run(),
            &Patch::Apply(&status),
        )
        .await;
    match outcome {
        Ok(_) => Ok(false),
        Err(kube::Error::Api(e)) if e.code == 403 && e.message.contains(HELD_BACK) => Ok(true),
        Err(error) => Err(error.into()),
    }
}

/// (Named short: the node's name, the test's namespace and `-w`, is a label value of at most 63
/// characters.)
///
/// The agent makes a slice's instance but cannot record it (an admission policy refuses the
/// Ready write), and is killed in that window; the agent started again finds the instance by
/// its key and makes the slice Ready with it, creating nothing twice.
async fn agent_killed_between_instance_and_status_write(ctx: TestContext) -> Result<()> {
    let mut node = AgentNode::start(&ctx, "w", "h800-8").await?;
    let outcome = with_operator(&ctx, "op-window", || async {
        let mut pods = full_node_pods("first");
        // The 3-slice MIG pod comes last, once the rest is Ready and the policy holds.
        let late = pods.pop().context("a pod")?;
        let late_name = late["metadata"]["name"]
            .as_str()
            .context("a name")?
            .to_owned();
        let slices = fill(&ctx, &node, &pods, "the node full but for one MIG pod").await?;
        let probe = slices.first().context("a slice")?.name_any();
        ctx.kubectl_ok(
            &["apply", "-f", "-"],
            Some(&hold_ready_policy(&ctx, &late_name)),
        )?;
        ctx.wait_for("the policy to hold Ready writes back", WAIT, || async {
            Ok(ready_writes_held(&ctx, &node, &probe).await?.then_some(()))
        })
        .await?;

        crate::operator::create_pod(&ctx, late).await?;
        let key = |s: &GpuSlice| format!("{}/{}", ctx.namespace, s.name_any());
        let held = ctx
            .wait_for(
                "the late slice Creating and its instance made",
                WAIT,
                || async {
                    let list = ctx
                        .api::<GpuSlice>()
                        .list(&ListParams::default())
                        .await?
                        .items;
                    let Some(slice) = list.into_iter().find(|s| s.spec.pod.name == late_name)
                    else {
                        return Ok(None);
                    };
                    let creating = slice.status.as_ref().and_then(|s| s.phase)
                        == Some(SlicePhase::Creating);
                    let instance = node
                        .instances()
                        .await?
                        .into_iter()
                        .find(|i| i.key == key(&slice));
                    Ok(instance.filter(|_| creating).map(|i| (slice, i)))
                },
            )
            .await;
        let (held, instance) = showing_seen(&ctx, held).await?;
        // The agent tried to record it and was refused (and keeps retrying, finding the same
        // instance each time).
        ctx.wait_for("the agent refused its Ready write", WAIT, || async {
            let log = std::fs::read_to_string(node.agent.log())?;
            Ok(log.contains(HELD_BACK).then_some(()))
        })
        .await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let mut all = slices.clone();
        all.push(held.clone());
        let before = instances_of(&ctx, &node, &all).await?;
        ensure!(
            before.iter().filter(|i| i.key == key(&held)).count() == 1
                && before.contains(&instance),
            "one instance for the late slice, as first made: {instance:?} in {before:?}"
        );
        ensure!(
            ctx.api::<GpuSlice>()
                .get(&held.name_any())
                .await?
                .status
                .and_then(|s| s.phase)
                == Some(SlicePhase::Creating),
            "the late slice is still Creating before the kill"
        );

        node.agent.kill();
        delete_hold_ready_policy(&ctx)?;
        ctx.wait_for("the agent's Ready writes allowed again", WAIT, || async {
            Ok((!ready_writes_held(&ctx, &node, &probe).await?).then_some(()))
        })
        .await?;
        node.agent = spawn_agent(&ctx, "w", &node.args)?;

        let ready = wait_phase(&ctx, &held.name_any(), SlicePhase::Ready).await;
        let ready = showing_seen(&ctx, ready).await?;
        let all = all_ready(&ctx, pods.len() + 1, "the node full, every slice Ready").await?;
        let after = instances_of(&ctx, &node, &all).await?;
        ensure!(
            after == before,
            "the instance adopted, nothing made twice or leaked:\nbefore {before:?}\nafter  {after:?}"
        );
        // The new agent found the instance by its key; it did not create one.
        let log = std::fs::read_to_string(node.agent.log())?;
        let late_key = key(&held);
        let said = |text: &str| {
            log.lines()
                .any(|l| l.contains(text) && l.contains(late_key.as_str()))
        };
        ensure!(
            said("found the instance made earlier") && !said("created the instance"),
            "the restarted agent adopts the instance of {late_key} (log {})",
            node.agent.log().display()
        );
        let recorded = ready
            .status
            .as_ref()
            .and_then(|s| s.mig_instance.as_ref())
            .context("the Ready slice names its MIG instance")?;
        let made = instance.mig.as_ref().context("a MIG instance")?;
        ensure!(
            recorded.gpu_instance_id == made.gpu_instance_id
                && recorded.device_uuid == made.device_uuid,
            "the slice records the instance made before the kill: {recorded:?} vs {made:?}"
        );

        empty_node(&ctx, &node).await?;
        refill(&ctx, &node).await
    })
    .await;
    // The policy must not outlive the test, whatever happened.
    let deleted = delete_hold_ready_policy(&ctx);
    outcome?;
    deleted
}

/// A node filled to 100 % with pods of every kind, whole cards included, one pod at a time: the
/// kubelet gives each whole-card pod the card its slice names, so no card is held twice.
async fn whole_card_pods_get_the_cards_their_slices_name(ctx: TestContext) -> Result<()> {
    let node = AgentNode::start(&ctx, "whole", "h800-8").await?;
    with_operator(&ctx, "op-whole", || async {
        let pods = full_node_pods("first");
        let slices = fill(&ctx, &node, &pods, "the node full, every slice Ready").await?;
        instances_of(&ctx, &node, &slices).await?;
        empty_node(&ctx, &node).await?;
        let pods = full_node_pods("again");
        fill(&ctx, &node, &pods, "the node filled again").await?;
        empty_node(&ctx, &node).await
    })
    .await
}

/// The node full; the operator and the agent both down while a MIG pod ends, so its slice waits,
/// released, on the agent's finalizer; then the operator starts. It must leave the finalizer to
/// the node's agent (the node exists, and the instance is still on the card); the agent, back,
/// destroys the instance and lets the slice go, and the node fills again.
async fn operator_starting_while_a_mig_slice_is_released(ctx: TestContext) -> Result<()> {
    // The resource layer in its own process, so the instance outlives the agent.
    let mut node = AgentNode::start_with_layer(&ctx, "releasing", "h800-8").await?;
    let pods = full_node_pods("first");
    let operator = crate::operator::Operator::start(&ctx, "op-first").await?;
    let filled = fill(&ctx, &node, &pods, "the node full, every slice Ready").await;
    let stopped = operator.stop().await;
    let slices = filled?;
    stopped?;
    let mig = slices
        .iter()
        .find(|s| s.spec.mode == runtimekit_crds::SliceMode::Mig)
        .context("a MIG slice")?
        .clone();
    let mig_name = mig.name_any();
    let key = format!("{}/{mig_name}", ctx.namespace);
    node.agent.kill();
    delete_pod(&ctx, &mig.spec.pod.name).await?;
    ctx.wait_for("the MIG slice released", WAIT, || async {
        let slice = ctx.api::<GpuSlice>().get_opt(&mig_name).await?;
        Ok(slice
            .filter(|s| s.metadata.deletion_timestamp.is_some())
            .map(|_| ()))
    })
    .await?;
    with_operator(&ctx, "op-second", || async {
        // Well past the operator's first sync and its slice pass.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let slice = ctx.api::<GpuSlice>().get(&mig_name).await?;
        ensure!(
            slice.finalizers().iter().any(|f| f == SLICE_FINALIZER),
            "the operator stripped the finalizer of a slice whose node and instance exist"
        );
        ensure!(
            node.instances().await?.iter().any(|i| i.key == key),
            "the instance is still on its card"
        );
        node.agent = spawn_agent(&ctx, "releasing", &node.args)?;
        wait_gone(&ctx, &mig_name).await?;
        ensure!(
            !node.instances().await?.iter().any(|i| i.key == key),
            "the agent destroyed the instance before letting the slice go"
        );
        empty_node(&ctx, &node).await?;
        fill(
            &ctx,
            &node,
            &full_node_pods("again"),
            "the node filled again",
        )
        .await?;
        empty_node(&ctx, &node).await
    })
    .await
}
