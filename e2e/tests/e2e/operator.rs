//! The operator against the real control plane: every seed scenario of the usage guide, gangs
//! through the real JobSet controller, failures with their reasons, and restarts. No node agent
//! runs here, so each test writes the node-tier TopologyGroup status an agent would. After every
//! test the invariants are checked: no card over-committed, every bound GPU pod holds exactly its
//! slices, no slice without a live pod.

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use runtimekit_contract::allocation::Allocation;
use runtimekit_contract::{RuntimeKitConfig, parse_pod};
use runtimekit_crds::{
    CardHealth, CardStatus, GpuSlice, NicStatus, SliceMode, TopologyGroup, Vendor,
    parse_slice_memory,
};
use runtimekit_e2e::harness::Test;
use runtimekit_e2e::{FakeNode, TestContext, tests};
use runtimekit_operator::leader::Timing;
use runtimekit_operator::run::{RunOptions, run_with};
use serde_json::json;
use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;
use tokio::sync::oneshot;

pub const TESTS: &[Test] = tests![
    whole_card,
    tdm_half_a_card_and_4_gib,
    mig_3_slices_and_4_gib,
    two_cards_of_one_configuration,
    ppu_810e_four_cards_in_one_group,
    ppu_m890p_four_cards_with_rdma,
    contract_violations_are_reported,
    stale_agent_cards_are_withheld,
    metrics_and_readiness_are_served,
    restart_recreates_slices_from_allocations,
    standby_takes_over_when_the_leader_dies,
];

/// An operator running inside the test process, on a runtime of its own so that killing it
/// ends every task it started, as a crash of its process would.
pub(crate) struct Operator {
    shutdown: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<()>>,
    /// Taken when the operator is stopped or killed; a runtime may not be dropped in async code.
    runtime: Option<tokio::runtime::Runtime>,
    /// Where it serves `/metrics`.
    pub(crate) listen: std::net::SocketAddr,
}

impl Drop for Operator {
    /// A test that fails early leaves its operator behind: end it as a crash would.
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// The namespace the operator runs in (its Leases live there).
const OPERATOR_NAMESPACE: &str = "runtimekit-system";

/// The operator's ServiceAccount, as the apiserver names it.
pub(crate) const OPERATOR_USER: &str =
    "system:serviceaccount:runtimekit-system:runtimekit-operator";

/// Installs what users deploy for the operator's access: its namespace, RBAC and admission
/// policies. The operator runs as its ServiceAccount with exactly these, so a missing permission
/// or a write a policy refuses fails here as it would in a cluster.
pub(crate) fn install_operator_access(ctx: &TestContext) -> Result<()> {
    let namespace =
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OPERATOR_NAMESPACE}});
    ctx.kubectl_ok(&["apply", "-f", "-"], Some(&namespace.to_string()))?;
    for file in ["rbac.yaml", "admission-policy.yaml"] {
        let path = runtimekit_e2e::tools::repo_root()
            .join("config/operator")
            .join(file);
        ctx.kubectl_ok(
            &[
                "apply",
                "--namespace",
                OPERATOR_NAMESPACE,
                "-f",
                &path.to_string_lossy(),
            ],
            None,
        )?;
    }
    Ok(())
}

/// A client that is the operator's ServiceAccount.
async fn operator_client(ctx: &TestContext) -> Result<kube::Client> {
    ctx.client_for(
        OPERATOR_USER,
        &[
            "system:serviceaccounts",
            &format!("system:serviceaccounts:{OPERATOR_NAMESPACE}"),
            "system:authenticated",
        ],
    )
    .await
}

impl Operator {
    /// Starts an operator with short Lease timings, so tests do not wait for takeovers.
    pub(crate) async fn start(ctx: &TestContext, identity: &str) -> Result<Operator> {
        Operator::start_with(ctx, identity, Operator::QUICK).await
    }

    /// Lease timings short enough that tests do not wait for takeovers.
    pub(crate) const QUICK: Timing = Timing {
        lease_duration: Duration::from_secs(4),
        renew_deadline: Duration::from_secs(3),
        retry_period: Duration::from_millis(500),
    };

    pub(crate) async fn start_with(
        ctx: &TestContext,
        identity: &str,
        timing: Timing,
    ) -> Result<Operator> {
        Operator::start_configured(ctx, identity, timing, None).await
    }

    /// Starts an operator reading the shared configuration `config` (the defaults when `None`)
    /// from a file, as a deployed one reads its ConfigMap.
    pub(crate) async fn start_configured(
        ctx: &TestContext,
        identity: &str,
        timing: Timing,
        config: Option<&RuntimeKitConfig>,
    ) -> Result<Operator> {
        let config = match config {
            Some(config) => {
                let path = ctx.scratch_dir()?.join(format!("{identity}-config.yaml"));
                std::fs::write(&path, serde_yaml::to_string(config)?)?;
                Some(path)
            }
            None => None,
        };
        // Pods name the lj-runtime RuntimeClass, which admission requires to exist.
        let runtime_class =
            runtimekit_e2e::tools::repo_root().join("config/runtime/runtimeclass.yaml");
        ctx.kubectl_ok(&["apply", "-f", &runtime_class.to_string_lossy()], None)?;
        install_operator_access(ctx)?;
        let client = operator_client(ctx).await?;
        // Bound here and handed over, so no other process can take the port in between.
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let listen = listener.local_addr()?;
        let options = RunOptions {
            config,
            listen,
            identity: identity.into(),
            namespace: OPERATOR_NAMESPACE.into(),
            // One Lease per test, so a test's operators never see another test's.
            lease: ctx.namespace.clone(),
            timing,
        };
        let (tx, rx) = oneshot::channel();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(identity)
            .enable_all()
            .build()?;
        let listener = {
            let _runtime = runtime.enter();
            tokio::net::TcpListener::from_std(listener)?
        };
        let task = runtime.spawn(run_with(client, options, listener, async move {
            let _ = rx.await;
        }));
        Ok(Operator {
            shutdown: Some(tx),
            task,
            runtime: Some(runtime),
            listen,
        })
    }

    /// Waits until `/readyz` answers 200: the first full list of every kind is applied.
    pub(crate) async fn wait_ready(&self, ctx: &TestContext) -> Result<()> {
        ctx.wait_for("/readyz to answer 200", Duration::from_secs(20), || async {
            Ok(self
                .get("/readyz")
                .ok()
                .filter(|r| r.starts_with("HTTP/1.0 200"))
                .map(|_| ()))
        })
        .await
    }

    /// GETs one of the operator's HTTP endpoints.
    fn get(&self, path: &str) -> Result<String> {
        Ok(runtimekit_e2e::tools::http_get(self.listen, path)?)
    }

    /// Whether the operator ended on its own (an error, a lost Lease).
    pub(crate) fn has_ended(&self) -> bool {
        self.task.is_finished()
    }

    /// Stops it as a crash would: no lease release, every write in flight dropped.
    pub(crate) fn kill(self) {
        drop(self);
    }

    pub(crate) async fn stop(mut self) -> Result<()> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        (&mut self.task).await.context("operator task")?
    }
}

/// An NVIDIA card of `model` as an agent would report it.
pub(crate) fn nvidia(
    index: u32,
    model: &str,
    memory_gib: u64,
    mig: bool,
    switch: u32,
) -> CardStatus {
    CardStatus {
        index,
        uuid: format!("GPU-{model}-{index}"),
        vendor: Vendor::Nvidia,
        model: format!("NVIDIA {model}"),
        memory_mib: memory_gib * 1024,
        mig_capable: true,
        mig_enabled: mig,
        health: CardHealth::Healthy,
        health_reason: None,
        pcie_switch: Some(format!("sw{switch}")),
        numa_node: Some(switch / 2),
        socket: Some(switch / 2),
        interconnect_group: None,
        nvlink_peers: (0..8).filter(|p| *p != index).collect(),
        mig_instances: vec![],
        held_by: vec![],
    }
}

pub(crate) fn ppu(index: u32, model: &str, group: Option<&str>, switch: u32) -> CardStatus {
    CardStatus {
        vendor: Vendor::Ppu,
        model: model.into(),
        memory_mib: 96 * 1024,
        mig_capable: false,
        interconnect_group: group.map(Into::into),
        nvlink_peers: vec![],
        uuid: format!("PPU-{model}-{index}"),
        ..nvidia(index, model, 96, false, switch)
    }
}

pub(crate) fn nic(switch: u32) -> NicStatus {
    NicStatus {
        name: format!("mlx5_{switch}"),
        pcie_switch: Some(format!("sw{switch}")),
        numa_node: Some(switch / 2),
        socket: Some(switch / 2),
    }
}

/// A kwok GPU node with the TopologyGroup status its agent would write; returns its name.
pub(crate) async fn gpu_node(
    ctx: &TestContext,
    name: &str,
    cards: Vec<CardStatus>,
    nics: Vec<NicStatus>,
    labels: &[(&str, &str)],
) -> Result<String> {
    let mut node = FakeNode::new(name);
    for (k, v) in labels {
        node = node.label(k, v);
    }
    reporting_node(ctx, node, cards, nics).await
}

/// Creates `node` for GPU pods with the TopologyGroup status its agent would write; returns its
/// name.
pub(crate) async fn reporting_node(
    ctx: &TestContext,
    node: FakeNode,
    cards: Vec<CardStatus>,
    nics: Vec<NicStatus>,
) -> Result<String> {
    let node = ctx
        .fake_node(node.label("lj_runtimekit_enable", "true"))
        .await?;
    let node_name = node.name_any();
    let groups = ctx.cluster_api::<TopologyGroup>();
    let params = PatchParams::apply("e2e-agent").force();
    // Owned by its Node, as the agent creates it.
    let owner =
        json!({"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node.metadata.uid});
    let group = json!({"apiVersion": "runtimekit.aliyun.com/v1alpha1", "kind": "TopologyGroup",
        "metadata": {"name": node_name, "ownerReferences": [owner]},
        "spec": {"tier": "Node", "nodeName": node_name}});
    groups
        .patch(&node_name, &params, &Patch::Apply(&group))
        .await?;
    report_devices(ctx, &node_name, cards, nics).await?;
    Ok(node_name)
}

/// Writes the TopologyGroup status the agent of `node` reports with `cards` and `nics`, and a
/// fresh heartbeat.
pub(crate) async fn report_devices(
    ctx: &TestContext,
    node: &str,
    cards: Vec<CardStatus>,
    nics: Vec<NicStatus>,
) -> Result<()> {
    let count = u32::try_from(cards.len())?;
    let healthy = u32::try_from(
        cards
            .iter()
            .filter(|c| c.health == CardHealth::Healthy)
            .count(),
    )?;
    let status = json!({"apiVersion": "runtimekit.aliyun.com/v1alpha1", "kind": "TopologyGroup", "status": {
        "cards": cards, "nics": nics, "heartbeatTime": Time(Timestamp::now()),
        "capacity": {"nodes": 1, "cards": count, "healthyCards": healthy, "freeCards": healthy, "migCards": 0}}});
    ctx.cluster_api::<TopologyGroup>()
        .patch_status(
            node,
            &PatchParams::apply("e2e-agent").force(),
            &Patch::Apply(&status),
        )
        .await?;
    Ok(())
}

/// Eight H800 cards, none in MIG mode.
fn h800_whole_cards() -> Vec<CardStatus> {
    (0..8)
        .map(|c| nvidia(c, "H800", 80, false, c / 2))
        .collect()
}

pub(crate) fn h800_node() -> Vec<CardStatus> {
    (0..8)
        .map(|i| nvidia(i, "H800", 80, i >= 6, i / 2))
        .collect()
}

/// Creates a pod from JSON in the test's namespace.
pub(crate) async fn create_pod(ctx: &TestContext, pod: serde_json::Value) -> Result<Pod> {
    let pod: Pod = serde_json::from_value(pod)?;
    Ok(ctx
        .api::<Pod>()
        .create(&PostParams::default(), &pod)
        .await?)
}

pub(crate) fn gpu_pod(name: &str, limits: serde_json::Value) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "schedulerName": "lj-runtimekit-scheduler", "runtimeClassName": "lj-runtime",
        "containers": [{"name": "app", "image": "busybox", "resources": {"limits": limits}}]}})
}

/// Waits until the pod is bound and every slice its allocation names exists (the scheduler
/// writes the Binding and the slices at once), and returns it with its slices.
pub(crate) async fn bound(ctx: &TestContext, name: &str) -> Result<(Pod, Vec<GpuSlice>)> {
    let pods = ctx.api::<Pod>();
    ctx.wait_for(
        &format!("pod {name} to be bound with its slices"),
        Duration::from_secs(30),
        || async {
            let pod = pods.get(name).await?;
            if pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.as_ref())
                .is_none()
            {
                return Ok(None);
            }
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            let slices: Vec<GpuSlice> = slices(ctx)
                .await?
                .into_iter()
                .filter(|s| s.spec.pod.uid == uid)
                .collect();
            let cards = allocation(&pod).map_or(0, |a| {
                a.containers.iter().map(|c| c.cards.len()).sum::<usize>()
            });
            Ok((slices.len() >= cards).then_some((pod, slices)))
        },
    )
    .await
}

fn allocation(pod: &Pod) -> Result<Allocation> {
    let text = pod
        .annotations()
        .get("aliyun.com/allocation")
        .context("no allocation annotation")?;
    Ok(serde_json::from_str(text)?)
}

pub(crate) async fn with_operator<F, Fut>(ctx: TestContext, test: F) -> Result<()>
where
    F: FnOnce(TestContext) -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let operator = Operator::start(&ctx, "op-0").await?;
    let result = test(ctx.clone()).await;
    let finished = finish(&ctx, operator).await;
    result?;
    finished
}

/// Waits for the invariants to hold while the operator runs (it repairs what it finds, such as a
/// bound pod's missing slice), stops it, checks them again and deletes the test's
/// TopologyGroups.
pub(crate) async fn finish(ctx: &TestContext, operator: Operator) -> Result<()> {
    settled(ctx).await?;
    operator.stop().await?;
    invariants(ctx).await?;
    delete_groups(ctx).await
}

/// Waits up to 30 s for the invariants to hold; the last violation if they never do.
pub(crate) async fn settled(ctx: &TestContext) -> Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        match invariants(ctx).await {
            Ok(()) => return Ok(()),
            Err(e) if std::time::Instant::now() > deadline => {
                return Err(e.context("the invariants did not hold within 30 s"));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// How many of the test's pods are bound.
pub(crate) async fn bound_count(ctx: &TestContext) -> Result<usize> {
    let list = ctx.api::<Pod>().list(&ListParams::default()).await?;
    Ok(list
        .items
        .iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some())
        .count())
}

/// Waits for an Event matching the field selector whose line contains `text` (the operator
/// and the agents publish Events in the background); returns the Events listed.
pub(crate) async fn event(ctx: &TestContext, selector: &str, text: &str) -> Result<String> {
    ctx.wait_for(
        &format!("an event ({selector}) saying {text:?}"),
        Duration::from_secs(20),
        || async {
            let events = ctx.kubectl_ok(&["get", "events", "--field-selector", selector], None)?;
            Ok(events.contains(text).then_some(events))
        },
    )
    .await
}

/// The message of the pod's `PodScheduled=False` condition, once it has one.
pub(crate) async fn unschedulable(ctx: &TestContext, name: &str) -> Result<String> {
    ctx.wait_for(
        &format!("pod {name} reported unschedulable"),
        Duration::from_secs(30),
        || async {
            let pod = ctx.api::<Pod>().get(name).await?;
            let conditions = pod.status.and_then(|s| s.conditions).unwrap_or_default();
            Ok(conditions
                .into_iter()
                .find(|c| c.type_ == "PodScheduled" && c.status == "False")
                .and_then(|c| c.message))
        },
    )
    .await
}

/// Plays the node agents' part for the test's namespace while it lives: every released slice's
/// finalizer is removed, so the cards of a deleted pod come free as they do on a real node.
pub(crate) struct AgentTeardown(tokio::task::JoinHandle<()>);

impl AgentTeardown {
    pub(crate) fn start(ctx: &TestContext) -> AgentTeardown {
        AgentTeardown(tokio::spawn(runtimekit_e2e::load::tear_down_as_released(
            ctx.client.clone(),
            ctx.namespace.clone(),
        )))
    }
}

impl Drop for AgentTeardown {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The GpuSlices in the test's namespace.
pub(crate) async fn slices(ctx: &TestContext) -> Result<Vec<GpuSlice>> {
    Ok(ctx
        .api::<GpuSlice>()
        .list(&ListParams::default())
        .await?
        .items)
}

/// Deletes the TopologyGroups a test created (they are cluster-scoped, named after its nodes).
async fn delete_groups(ctx: &TestContext) -> Result<()> {
    let groups = ctx.cluster_api::<TopologyGroup>();
    // Node names may shorten the namespace, never its `e2e-<n>-` start.
    let prefix = ctx.node_name("");
    let start = prefix
        .match_indices('-')
        .nth(1)
        .map_or(prefix.as_str(), |(i, _)| &prefix[..=i]);
    for group in groups.list(&ListParams::default()).await?.items {
        if group.name_any().starts_with(start) {
            groups
                .delete(&group.name_any(), &Default::default())
                .await?;
        }
    }
    Ok(())
}

async fn whole_card(ctx: TestContext) -> Result<()> {
    with_operator(ctx, |ctx| async move {
        let node = gpu_node(&ctx, "h800", h800_node(), vec![], &[]).await?;
        create_pod(
            &ctx,
            gpu_pod("whole-card-demo", json!({"nvidia.com/gpu": "1"})),
        )
        .await?;
        let (pod, slices) = bound(&ctx, "whole-card-demo").await?;
        ensure!(pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node.as_str()));
        ensure!(
            slices.len() == 1 && slices[0].spec.mode == SliceMode::Whole,
            "slices: {slices:?}"
        );
        let allocation = allocation(&pod)?;
        ensure!(
            allocation.containers[0].cards[0].slice == slices[0].name_any(),
            "annotation names the slice"
        );
        ensure!(!allocation.containers[0].cards[0].uuid.is_empty());
        // Whole cards go to cards that are not in MIG mode.
        ensure!(
            slices[0].spec.card.as_ref().is_some_and(|c| c.index < 6),
            "card: {:?}",
            slices[0].spec.card
        );
        Ok(())
    })
    .await
}

async fn tdm_half_a_card_and_4_gib(ctx: TestContext) -> Result<()> {
    with_operator(ctx, |ctx| async move {
        gpu_node(&ctx, "h800", h800_node(), vec![], &[]).await?;
        create_pod(
            &ctx,
            gpu_pod(
                "tdm-demo",
                json!({"aliyun.com/gpu-core": "50", "aliyun.com/gpu-memory": "4"}),
            ),
        )
        .await?;
        create_pod(
            &ctx,
            gpu_pod(
                "tdm-demo-2",
                json!({"aliyun.com/gpu-core": "50", "aliyun.com/gpu-memory": "4"}),
            ),
        )
        .await?;
        let (_, first) = bound(&ctx, "tdm-demo").await?;
        let (_, second) = bound(&ctx, "tdm-demo-2").await?;
        for slices in [&first, &second] {
            ensure!(
                slices.len() == 1 && slices[0].spec.mode == SliceMode::Tdm,
                "slices: {slices:?}"
            );
            ensure!(
                slices[0].spec.core == Some(50) && slices[0].spec.memory.as_deref() == Some("4Gi")
            );
        }
        // Binpack: the second half goes onto the card the first half uses.
        ensure!(
            first[0].spec.card == second[0].spec.card,
            "binpacked: {:?} vs {:?}",
            first[0].spec.card,
            second[0].spec.card
        );
        Ok(())
    })
    .await
}

async fn mig_3_slices_and_4_gib(ctx: TestContext) -> Result<()> {
    with_operator(ctx, |ctx| async move {
        gpu_node(&ctx, "h800", h800_node(), vec![], &[]).await?;
        create_pod(
            &ctx,
            gpu_pod(
                "mig-demo",
                json!({"aliyun.com/gpu-slice": "3", "aliyun.com/gpu-memory": "4"}),
            ),
        )
        .await?;
        let (pod, slices) = bound(&ctx, "mig-demo").await?;
        ensure!(
            slices.len() == 1 && slices[0].spec.mode == SliceMode::Mig,
            "slices: {slices:?}"
        );
        let spec = &slices[0].spec;
        ensure!(
            spec.mig_profile.as_deref() == Some("3g.40gb") && spec.slices == Some(3),
            "{spec:?}"
        );
        ensure!(
            matches!(spec.mig_placement_start, Some(0 | 4)),
            "legal start: {spec:?}"
        );
        ensure!(
            spec.card.as_ref().is_some_and(|c| c.index >= 6),
            "a MIG-enabled card: {spec:?}"
        );
        ensure!(
            allocation(&pod)?.containers[0].cards[0].memory_mib == Some(4096),
            "visible memory capped at the request"
        );
        Ok(())
    })
    .await
}

async fn two_cards_of_one_configuration(ctx: TestContext) -> Result<()> {
    with_operator(ctx, |ctx| async move {
        gpu_node(&ctx, "h800", h800_node(), vec![], &[]).await?;
        let mut pod = gpu_pod(
            "multi-gpu-demo",
            json!({"aliyun.com/gpu-core": "50", "aliyun.com/gpu-memory": "4"}),
        );
        pod["metadata"]["labels"] = json!({"replica": "2"});
        create_pod(&ctx, pod).await?;
        let (_, slices) = bound(&ctx, "multi-gpu-demo").await?;
        ensure!(slices.len() == 2, "slices: {slices:?}");
        let cards: Vec<u32> = slices
            .iter()
            .filter_map(|s| s.spec.card.as_ref().map(|c| c.index))
            .collect();
        ensure!(cards[0] != cards[1], "two distinct cards: {cards:?}");
        let mut replicas: Vec<u32> = slices.iter().map(|s| s.spec.replica_index).collect();
        replicas.sort_unstable();
        ensure!(replicas == [0, 1]);
        Ok(())
    })
    .await
}

async fn ppu_810e_four_cards_in_one_group(ctx: TestContext) -> Result<()> {
    with_operator(ctx, |ctx| async move {
        let cards = (0..8)
            .map(|i| {
                ppu(
                    i,
                    "PPU-810E",
                    Some(if i < 4 { "icn0" } else { "icn1" }),
                    i / 2,
                )
            })
            .collect();
        gpu_node(
            &ctx,
            "ppu810e",
            cards,
            vec![],
            &[("accelerator/vendor", "ppu")],
        )
        .await?;
        // One card of the first group is taken, so only the second group has four free.
        create_pod(&ctx, gpu_pod("one", json!({"aliyun.com/gpu": "1"}))).await?;
        bound(&ctx, "one").await?;
        let mut pod = gpu_pod("train", json!({"aliyun.com/gpu": "4"}));
        pod["spec"]["nodeSelector"] = json!({"accelerator/vendor": "ppu"});
        create_pod(&ctx, pod).await?;
        let (_, slices) = bound(&ctx, "train").await?;
        let cards: Vec<u32> = slices
            .iter()
            .filter_map(|s| s.spec.card.as_ref().map(|c| c.index))
            .collect();
        ensure!(cards.len() == 4, "cards: {cards:?}");
        let groups: std::collections::BTreeSet<bool> = cards.iter().map(|c| *c < 4).collect();
        ensure!(
            groups.len() == 1,
            "four cards of one interconnect group: {cards:?}"
        );
        Ok(())
    })
    .await
}

async fn ppu_m890p_four_cards_with_rdma(ctx: TestContext) -> Result<()> {
    with_operator(ctx, |ctx| async move {
        let cards = (0..8).map(|i| ppu(i, "PPU-M890P", None, i / 2)).collect();
        let nics = (0..4).map(nic).collect();
        gpu_node(&ctx, "m890p", cards, nics, &[]).await?;
        let mut pod = gpu_pod(
            "training",
            json!({"aliyun.com/gpu": "4", "aliyun.com/rdma": "1"}),
        );
        pod["spec"]["hostNetwork"] = json!(true);
        create_pod(&ctx, pod).await?;
        let (pod, slices) = bound(&ctx, "training").await?;
        ensure!(slices.len() == 4);
        let allocation = allocation(&pod)?;
        let nics = &allocation.containers[0].nics;
        ensure!(!nics.is_empty(), "RDMA NICs attached: {allocation:?}");
        // Two cards per switch: four cards span two switches, and each has its NIC.
        let switches: std::collections::BTreeSet<u32> = allocation.containers[0]
            .cards
            .iter()
            .map(|c| c.index / 2)
            .collect();
        ensure!(
            switches.len() == 2,
            "cards packed under two PCIe switches: {allocation:?}"
        );
        for switch in switches {
            ensure!(
                nics.contains(&format!("mlx5_{switch}")),
                "NIC of switch {switch} attached: {nics:?}"
            );
        }
        Ok(())
    })
    .await
}

async fn contract_violations_are_reported(ctx: TestContext) -> Result<()> {
    with_operator(ctx, |ctx| async move {
        gpu_node(&ctx, "h800", h800_node(), vec![], &[]).await?;
        create_pod(
            &ctx,
            gpu_pod("bad-slice", json!({"aliyun.com/gpu-slice": "5"})),
        )
        .await?;
        create_pod(
            &ctx,
            gpu_pod("too-big", json!({"aliyun.com/gpu-memory": "200"})),
        )
        .await?;
        create_pod(
            &ctx,
            gpu_pod(
                "core-zero",
                json!({"aliyun.com/gpu-core": "0", "aliyun.com/gpu-memory": "1"}),
            ),
        )
        .await?;
        let pods = ctx.api::<Pod>();
        let condition = |name: &'static str| {
            let pods = pods.clone();
            async move {
                let pod = pods.get(name).await?;
                let conditions = pod.status.and_then(|s| s.conditions).unwrap_or_default();
                Ok(conditions
                    .into_iter()
                    .find(|c| c.type_ == "PodScheduled" && c.status == "False"))
            }
        };
        let bad = ctx
            .wait_for("bad-slice to be marked", Duration::from_secs(20), || {
                condition("bad-slice")
            })
            .await?;
        ensure!(bad.reason.as_deref() == Some("InvalidGpuSlice"), "{bad:?}");
        ensure!(
            bad.message.as_deref()
                == Some(
                    r#"container "app": aliyun.com/gpu-slice must be one of 1, 2, 3, 4, 7; got 5"#
                ),
            "{bad:?}"
        );
        // The first attempt may come before the operator sees the node's agent report (and
        // says so); the verdict on the memory comes with the next.
        let big = ctx
            .wait_for(
                "too-big to be marked for its memory",
                Duration::from_secs(20),
                || {
                    let marked = condition("too-big");
                    async move {
                        Ok(marked.await?.filter(|c| {
                            c.message
                                .as_deref()
                                .is_some_and(|m| m.contains("gpu-memory"))
                        }))
                    }
                },
            )
            .await?;
        let message = big.message.unwrap_or_default();
        ensure!(
            message.starts_with("0/1 nodes are available: 1 ") && message.contains("gpu-memory"),
            "{message}"
        );
        bound(&ctx, "core-zero").await?;
        event(
            &ctx,
            "involvedObject.name=core-zero,type=Warning",
            "GpuCoreZero",
        )
        .await?;
        Ok(())
    })
    .await
}

async fn stale_agent_cards_are_withheld(ctx: TestContext) -> Result<()> {
    with_operator(ctx, |ctx| async move {
        let node = gpu_node(&ctx, "h800", h800_node(), vec![], &[]).await?;
        // The agent's last heartbeat is three minutes old: its cards are not offered.
        let stale = Time(
            Timestamp::now()
                .saturating_sub(k8s_openapi::jiff::SignedDuration::from_secs(180))
                .context("time")?,
        );
        let status = json!({"status": {"heartbeatTime": stale}});
        ctx.cluster_api::<TopologyGroup>()
            .patch_status(&node, &PatchParams::default(), &Patch::Merge(&status))
            .await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        create_pod(&ctx, gpu_pod("waits", json!({"nvidia.com/gpu": "1"}))).await?;
        let pods = ctx.api::<Pod>();
        let message = ctx
            .wait_for(
                "the pod to be reported unschedulable",
                Duration::from_secs(20),
                || async {
                    let pod = pods.get("waits").await?;
                    let condition = pod
                        .status
                        .and_then(|s| s.conditions)
                        .unwrap_or_default()
                        .into_iter()
                        .find(|c| c.type_ == "PodScheduled");
                    Ok(condition.and_then(|c| c.message))
                },
            )
            .await?;
        ensure!(
            message == "0/1 nodes are available: 1 node(s) had no node agent offering cards.",
            "{message}"
        );
        let groups = ctx.cluster_api::<TopologyGroup>();
        let reporting = ctx
            .wait_for(
                "the group to be marked stale",
                Duration::from_secs(20),
                || async {
                    let group = groups.get(&node).await?;
                    Ok(group
                        .status
                        .unwrap_or_default()
                        .conditions
                        .into_iter()
                        .find(|c| c.type_ == "AgentReporting" && c.status == "False"))
                },
            )
            .await?;
        ensure!(reporting.reason == "HeartbeatStale", "{reporting:?}");
        // The same heartbeat from an agent that beats every 2 minutes is within its three beats:
        // the cards are offered again.
        let slower = json!({"status": {"heartbeatIntervalSeconds": 120}});
        groups
            .patch_status(&node, &PatchParams::default(), &Patch::Merge(&slower))
            .await?;
        bound(&ctx, "waits").await?;
        Ok(())
    })
    .await
}

async fn metrics_and_readiness_are_served(ctx: TestContext) -> Result<()> {
    gpu_node(&ctx, "h800", h800_node(), vec![], &[]).await?;
    let operator = Operator::start(&ctx, "op-metrics").await?;
    operator.wait_ready(&ctx).await?;
    ensure!(operator.get("/healthz")?.starts_with("HTTP/1.0 200"));
    // The operator sees every namespace, where earlier tests may leave pods being deleted: count
    // from what it had counted before this test's pods.
    let attempts = |result: &str| -> Result<u64> {
        let metrics = operator.get("/metrics")?;
        let series =
            format!(r#"runtimekit_operator_scheduling_attempts_total{{result="{result}"}} "#);
        Ok(metrics
            .lines()
            .find_map(|l| l.strip_prefix(series.as_str()))
            .map_or(Ok(0), str::parse)?)
    };
    let (scheduled, invalid) = (attempts("Scheduled")?, attempts("Invalid")?);
    create_pod(&ctx, gpu_pod("counted", json!({"nvidia.com/gpu": "1"}))).await?;
    create_pod(
        &ctx,
        gpu_pod("broken", json!({"aliyun.com/gpu-slice": "5"})),
    )
    .await?;
    bound(&ctx, "counted").await?;
    let expected = [
        "runtimekit_operator_decision_seconds_count",
        "runtimekit_operator_create_to_bound_seconds_bucket",
        "runtimekit_operator_binding_seconds_sum",
        "runtimekit_operator_queue_depth",
        r#"runtimekit_operator_gangs{phase="Running"}"#,
    ];
    let served = ctx
        .wait_for(
            "the attempts to be counted and every series served",
            Duration::from_secs(20),
            || async {
                let metrics = operator.get("/metrics")?;
                let counted = attempts("Scheduled")? > scheduled && attempts("Invalid")? > invalid;
                Ok((counted && expected.iter().all(|e| metrics.contains(e))).then_some(()))
            },
        )
        .await;
    if let Err(error) = served {
        bail!("{error:#}\n/metrics:\n{}", operator.get("/metrics")?);
    }
    finish(&ctx, operator).await
}

async fn restart_recreates_slices_from_allocations(ctx: TestContext) -> Result<()> {
    let cards: Vec<CardStatus> = h800_whole_cards().into_iter().take(2).collect();
    let node = gpu_node(&ctx, "h800", cards.clone(), vec![], &[]).await?;
    // An operator bound this pod to card 1 and died before its GpuSlice was written: all that is
    // left is the allocation annotation the Binding copied onto the pod.
    let pod = create_pod(&ctx, gpu_pod("interrupted", json!({"nvidia.com/gpu": "1"}))).await?;
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let slice_name = format!("interrupted-{}-0-0", &uid[..8]);
    let recorded = Allocation {
        node: node.clone(),
        containers: vec![runtimekit_contract::allocation::ContainerAllocation {
            name: "app".into(),
            cards: vec![runtimekit_contract::allocation::AllocatedCard {
                index: 1,
                uuid: cards[1].uuid.clone(),
                mode: "Whole".into(),
                slice: slice_name.clone(),
                ..Default::default()
            }],
            nics: vec![],
        }],
    };
    let binding = json!({"apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": "interrupted",
                     "annotations": {"aliyun.com/allocation": serde_json::to_string(&recorded)?}},
        "target": {"kind": "Node", "name": node}});
    // Only the operator may bind with an allocation (config/operator/admission-policy.yaml).
    install_operator_access(&ctx)?;
    let as_operator: kube::Api<Pod> =
        kube::Api::namespaced(operator_client(&ctx).await?, &ctx.namespace);
    let _: serde_json::Value = as_operator
        .create_subresource("binding", "interrupted", &PostParams::default(), &binding)
        .await?;

    let operator = Operator::start(&ctx, "op-0").await?;
    let slice_on_card = |index: u32| {
        let name = slice_name.clone();
        let uid = uid.clone();
        let ctx = &ctx;
        async move {
            let slice = match ctx.api::<GpuSlice>().get(&name).await {
                Ok(s) if s.metadata.deletion_timestamp.is_none() => s,
                _ => return Ok(None),
            };
            ensure!(
                slice.spec.card.as_ref().map(|c| c.index) == Some(index)
                    && slice.spec.pod.uid == uid
                    && slice.owner_references().iter().any(|o| o.uid == uid),
                "re-created as recorded and owned by the pod: {slice:?}"
            );
            Ok(Some(slice))
        }
    };
    ctx.wait_for(
        "the missing slice to be re-created",
        Duration::from_secs(30),
        || slice_on_card(1),
    )
    .await?;
    // The recorded card is not handed out again: the next pod gets the other one, and a third
    // waits.
    create_pod(&ctx, gpu_pod("next", json!({"nvidia.com/gpu": "1"}))).await?;
    let (_, next) = bound(&ctx, "next").await?;
    ensure!(
        next[0].spec.card.as_ref().map(|c| c.index) == Some(0),
        "next got {:?}",
        next[0].spec.card
    );
    create_pod(&ctx, gpu_pod("third", json!({"nvidia.com/gpu": "1"}))).await?;
    event(
        &ctx,
        "involvedObject.name=third,reason=FailedScheduling",
        "0/1 nodes are available",
    )
    .await?;

    // A slice deleted under a running pod comes back once the agent has let it go.
    ctx.api::<GpuSlice>()
        .delete(&slice_name, &DeleteParams::default())
        .await?;
    ctx.api::<GpuSlice>()
        .patch(
            &slice_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await?;
    ctx.wait_for(
        "the deleted slice to be re-created",
        Duration::from_secs(30),
        || slice_on_card(1),
    )
    .await?;
    ensure!(
        bound_count(&ctx).await? == 2,
        "third stays pending: the card came back to its pod, not to the pool"
    );
    finish(&ctx, operator).await
}

async fn standby_takes_over_when_the_leader_dies(ctx: TestContext) -> Result<()> {
    gpu_node(&ctx, "h800", h800_node(), vec![], &[]).await?;
    // The timings a deployment uses: the takeover must happen within 15 s of them.
    let leader = Operator::start_with(&ctx, "op-leader", Timing::default()).await?;
    create_pod(&ctx, gpu_pod("before", json!({"nvidia.com/gpu": "1"}))).await?;
    bound(&ctx, "before").await?;
    let standby = Operator::start_with(&ctx, "op-standby", Timing::default()).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    leader.kill();
    let killed = std::time::Instant::now();
    create_pod(&ctx, gpu_pod("after", json!({"nvidia.com/gpu": "1"}))).await?;
    bound(&ctx, "after").await?;
    let took = killed.elapsed();
    ensure!(
        took < Duration::from_secs(15),
        "the standby took {took:?} to take over"
    );
    let lease = ctx.kubectl_ok(
        &[
            "get",
            "lease",
            &ctx.namespace,
            "--namespace",
            OPERATOR_NAMESPACE,
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ],
        None,
    )?;
    ensure!(lease == "op-standby", "holder: {lease}");
    standby.stop().await?;
    invariants(&ctx).await?;
    delete_groups(&ctx).await
}

/// No card over-committed, every bound GPU pod holds exactly its slices, no slice without a live pod.
async fn invariants(ctx: &TestContext) -> Result<()> {
    let pods = ctx.api::<Pod>().list(&ListParams::default()).await?.items;
    let slices = ctx
        .api::<GpuSlice>()
        .list(&ListParams::default())
        .await?
        .items;
    let config = RuntimeKitConfig::default();
    let live: BTreeMap<String, &Pod> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| (p.metadata.uid.clone().unwrap_or_default(), p))
        .collect();
    for slice in slices
        .iter()
        .filter(|s| s.metadata.deletion_timestamp.is_none())
    {
        let Some(pod) = live.get(&slice.spec.pod.uid) else {
            bail!("slice {} has no live pod", slice.name_any())
        };
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        ensure!(
            node.is_none() || node == slice.spec.node_name,
            "slice {} is on {:?}, its pod on {node:?}",
            slice.name_any(),
            slice.spec.node_name
        );
    }
    for pod in live.values() {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            continue;
        };
        // An ended pod's slices are released: it holds nothing any more.
        if matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        ) {
            continue;
        }
        let Ok(request) = parse_pod(pod, &config) else {
            continue;
        };
        if !request.ours {
            continue;
        }
        let want: u32 = request.containers.iter().map(|c| c.cards.cards()).sum();
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let have: BTreeMap<String, Option<u32>> = slices
            .iter()
            .filter(|s| s.spec.pod.uid == uid && s.spec.node_name.as_deref() == Some(node.as_str()))
            .map(|s| (s.name_any(), s.spec.card.as_ref().map(|c| c.index)))
            .collect();
        ensure!(
            have.len() == want as usize,
            "pod {} holds {} slices for {want} cards",
            pod.name_any(),
            have.len()
        );
        // The allocation annotation names exactly the slices, card for card.
        if want > 0 {
            let recorded: BTreeMap<String, Option<u32>> = allocation(pod)?
                .containers
                .iter()
                .flat_map(|c| {
                    c.cards
                        .iter()
                        .map(|card| (card.slice.clone(), Some(card.index)))
                })
                .collect();
            ensure!(
                recorded == have,
                "pod {} records {recorded:?} but holds {have:?}",
                pod.name_any()
            );
        }
    }
    let models: BTreeMap<(String, u32), (String, u64)> = ctx
        .cluster_api::<TopologyGroup>()
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|g| Some((g.spec.node_name.clone()?, g.status?)))
        .flat_map(|(node, status)| {
            status
                .cards
                .into_iter()
                .map(move |c| ((node.clone(), c.index), (c.model, c.memory_mib)))
        })
        .collect();
    let mut per_card: BTreeMap<(String, u32), Vec<&GpuSlice>> = BTreeMap::new();
    for slice in &slices {
        if let (Some(node), Some(card)) = (&slice.spec.node_name, &slice.spec.card) {
            per_card
                .entry((node.clone(), card.index))
                .or_default()
                .push(slice);
        }
    }
    for ((node, card), on_card) in per_card {
        let modes: std::collections::BTreeSet<_> = on_card
            .iter()
            .map(|s| format!("{:?}", s.spec.mode))
            .collect();
        ensure!(
            modes.len() == 1,
            "card {card} of {node} mixes modes: {modes:?}"
        );
        if on_card[0].spec.mode == SliceMode::Whole {
            ensure!(
                on_card.len() == 1,
                "card {card} of {node} is given whole {} times",
                on_card.len()
            );
        }
        let core: u32 = on_card.iter().filter_map(|s| s.spec.core).sum();
        ensure!(
            core <= 100,
            "card {card} of {node} has {core}% core allocated"
        );
        if on_card[0].spec.mode == SliceMode::Tdm {
            let memory: u64 = on_card
                .iter()
                .filter_map(|s| s.spec.memory.as_deref())
                .map(|m| parse_slice_memory(m).context("slice memory"))
                .sum::<Result<u64>>()?;
            let capacity = models.get(&(node.clone(), card)).map(|m| m.1);
            ensure!(
                capacity.is_none_or(|capacity| memory <= capacity),
                "card {card} of {node} has {memory} MiB allocated of {capacity:?}"
            );
        }
        let mut mask = 0u8;
        for slice in on_card.iter().filter(|s| s.spec.mode == SliceMode::Mig) {
            let (model, memory) = models
                .get(&(node.clone(), card))
                .cloned()
                .context("card of a MIG slice is reported")?;
            let table = runtimekit_contract::mig::table_for(&model, memory)
                .context("MIG table of the card")?;
            let profile = slice
                .spec
                .mig_profile
                .as_deref()
                .and_then(|p| table.profile(p))
                .context("profile of the card's model")?;
            let start = u8::try_from(slice.spec.mig_placement_start.unwrap_or(u32::MAX))?;
            ensure!(
                table.legal_starts(profile, mask).contains(&start),
                "MIG instance {} at {start} is illegal or overlaps on card {card} of {node}",
                profile.name
            );
            mask |= profile.mask_at(start);
        }
    }
    Ok(())
}
