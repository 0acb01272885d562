//! Faults with nothing spare. Each test fills a cluster to 100 % with pods of every request kind
//! (whole cards, time-division shares, MIG instances), so a card leaked by the fault shows as a
//! pod that cannot be placed. After the fault every pod must be bound exactly once with exactly
//! its slices; then every pod is deleted and the cluster filled again, which succeeds only if
//! every card came back. No node agent runs here: the test plays the agents (their
//! TopologyGroups, and the finalizers they remove once a slice is torn down).

use crate::operator::{
    Operator, bound_count, create_pod, finish, gpu_node, gpu_pod, h800_node, settled,
};
use anyhow::{Result, ensure};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{DeleteParams, ListParams};
use runtimekit_crds::{GpuSlice, TopologyGroup};
use runtimekit_e2e::harness::Test;
use runtimekit_e2e::load::tear_down_released;
use runtimekit_e2e::{TestContext, tests};
use runtimekit_operator::leader::Timing;
use serde_json::json;
use std::time::Duration;

pub const TESTS: &[Test] = tests![
    operator_killed_mid_burst_at_full_capacity,
    leader_killed_with_writes_in_flight,
    apiserver_away_past_the_renew_deadline,
    etcd_restarted_at_full_capacity,
    node_deleted_with_bound_slices,
];

/// Pods per node that fill it exactly: three whole cards, three cards of two 50 % shares, and
/// the two MIG cards one 7-slice instance each.
const PER_NODE: usize = 11;

/// Two nodes of eight H800s (six outside MIG mode, two in it).
async fn full_cluster(ctx: &TestContext) -> Result<()> {
    for i in 0..2 {
        gpu_node(ctx, &format!("n{i}"), h800_node(), vec![], &[]).await?;
    }
    Ok(())
}

/// The pods that fill `nodes` nodes, named with `prefix`.
fn filling_pods(prefix: &str, nodes: usize) -> Vec<serde_json::Value> {
    let mut pods = Vec::new();
    for i in 0..nodes {
        for w in 0..3 {
            pods.push(gpu_pod(
                &format!("{prefix}-whole-{i}-{w}"),
                json!({"nvidia.com/gpu": "1"}),
            ));
        }
        for t in 0..6 {
            pods.push(gpu_pod(
                &format!("{prefix}-share-{i}-{t}"),
                json!({"aliyun.com/gpu-core": "50", "aliyun.com/gpu-memory": "8"}),
            ));
        }
        for m in 0..2 {
            pods.push(gpu_pod(
                &format!("{prefix}-mig-{i}-{m}"),
                json!({"aliyun.com/gpu-slice": "7", "aliyun.com/gpu-memory": "8"}),
            ));
        }
    }
    pods
}

async fn create_all(ctx: &TestContext, pods: &[serde_json::Value]) -> Result<()> {
    for pod in pods {
        create_pod(ctx, pod.clone()).await?;
    }
    Ok(())
}

async fn all_bound(ctx: &TestContext, count: usize, what: &str) -> Result<()> {
    ctx.wait_for(what, Duration::from_secs(90), || async {
        Ok((bound_count(ctx).await? == count).then_some(()))
    })
    .await
}

/// One slice per bound pod: nothing written twice.
async fn one_slice_per_pod(ctx: &TestContext, pods: usize) -> Result<()> {
    settled(ctx).await?;
    let slices = ctx
        .api::<GpuSlice>()
        .list(&ListParams::default())
        .await?
        .items;
    ensure!(
        slices.len() == pods,
        "one slice per pod, no duplicates: {} slices for {pods} pods",
        slices.len()
    );
    Ok(())
}

/// Deletes every pod of the test and, as the agents do once a slice is torn down, removes the
/// slices' finalizers; returns when no slice is left.
async fn free_all(ctx: &TestContext) -> Result<()> {
    let pods = ctx.api::<Pod>();
    for pod in pods.list(&ListParams::default()).await?.items {
        pods.delete(&pod.name_any(), &DeleteParams::default().grace_period(0))
            .await?;
    }
    ctx.wait_for(
        "every slice released and torn down",
        Duration::from_secs(60),
        || async {
            let slices_left = tear_down_released(&ctx.client, &ctx.namespace).await?;
            let pods_left = pods.list(&ListParams::default()).await?.items.len();
            Ok((slices_left == 0 && pods_left == 0).then_some(()))
        },
    )
    .await
}

/// Frees the cluster and fills it again: every card must have come back. Then finishes the test
/// (invariants, operator stopped, groups deleted).
async fn nothing_leaked(ctx: &TestContext, operator: Operator, nodes: usize) -> Result<()> {
    free_all(ctx).await?;
    let pods = filling_pods("again", nodes);
    create_all(ctx, &pods).await?;
    all_bound(ctx, pods.len(), "the cluster filled again: no card leaked").await?;
    one_slice_per_pod(ctx, pods.len()).await?;
    finish(ctx, operator).await
}

async fn operator_killed_mid_burst_at_full_capacity(ctx: TestContext) -> Result<()> {
    full_cluster(&ctx).await?;
    let operator = Operator::start(&ctx, "op-a").await?;
    operator.wait_ready(&ctx).await?;
    let pods = filling_pods("burst", 2);
    // The operator is killed as soon as five pods are bound, with creations and writes in flight.
    let kill = async {
        let bound = ctx
            .wait_for("five bindings", Duration::from_secs(30), || async {
                Ok(Some(bound_count(&ctx).await?).filter(|bound| *bound >= 5))
            })
            .await?;
        operator.kill();
        anyhow::Ok(bound)
    };
    let (created, bound_at_kill) = futures::join!(create_all(&ctx, &pods), kill);
    created?;
    ensure!(
        bound_at_kill? < pods.len(),
        "the kill came after the whole burst was bound, so it tests nothing"
    );
    let restarted = Operator::start(&ctx, "op-b").await?;
    all_bound(&ctx, pods.len(), "every pod bound after the restart").await?;
    one_slice_per_pod(&ctx, pods.len()).await?;
    nothing_leaked(&ctx, restarted, 2).await
}

async fn leader_killed_with_writes_in_flight(ctx: TestContext) -> Result<()> {
    full_cluster(&ctx).await?;
    let leader = Operator::start(&ctx, "op-leader").await?;
    leader.wait_ready(&ctx).await?;
    let standby = Operator::start(&ctx, "op-standby").await?;
    let pods = filling_pods("burst", 2);
    let kill = async {
        ctx.wait_for("the first bindings", Duration::from_secs(30), || async {
            Ok(Some(bound_count(&ctx).await?).filter(|bound| *bound >= 3))
        })
        .await?;
        leader.kill();
        anyhow::Ok(())
    };
    let (created, killed) = futures::join!(create_all(&ctx, &pods), kill);
    created?;
    killed?;
    all_bound(&ctx, pods.len(), "every pod bound by the standby").await?;
    one_slice_per_pod(&ctx, pods.len()).await?;
    nothing_leaked(&ctx, standby, 2).await
}

async fn apiserver_away_past_the_renew_deadline(ctx: TestContext) -> Result<()> {
    full_cluster(&ctx).await?;
    // The deployment's Lease timings: an outage longer than the renew deadline (7 s) ends the
    // leader, which its Deployment starts again; it rebuilds from the API.
    let mut operator = Operator::start_with(&ctx, "op-a", Timing::default()).await?;
    let pods = filling_pods("burst", 2);
    let (first, rest) = pods.split_at(pods.len() / 2);
    create_all(&ctx, first).await?;
    ctx.restart_apiserver(Timing::default().renew_deadline + Duration::from_secs(3))
        .await?;
    let ended = ctx
        .wait_for("the leader to give up", Duration::from_secs(30), || async {
            Ok(operator.has_ended().then_some(()))
        })
        .await;
    ensure!(
        ended.is_ok(),
        "a leader that cannot renew past its deadline stops leading"
    );
    if let Err(error) = operator.stop().await {
        eprintln!("the operator ended during the outage ({error:#}); starting it again");
    }
    operator = Operator::start_with(&ctx, "op-a", Timing::default()).await?;
    create_all(&ctx, rest).await?;
    all_bound(&ctx, pods.len(), "every pod bound after the outage").await?;
    one_slice_per_pod(&ctx, pods.len()).await?;
    nothing_leaked(&ctx, operator, 2).await
}

async fn etcd_restarted_at_full_capacity(ctx: TestContext) -> Result<()> {
    full_cluster(&ctx).await?;
    let operator = Operator::start(&ctx, "op-a").await?;
    operator.wait_ready(&ctx).await?;
    let pods = filling_pods("burst", 2);
    let (first, rest) = pods.split_at(pods.len() / 2);
    create_all(&ctx, first).await?;
    ctx.restart_etcd(Duration::from_secs(3)).await?;
    create_all(&ctx, rest).await?;
    all_bound(&ctx, pods.len(), "every pod bound after etcd came back").await?;
    one_slice_per_pod(&ctx, pods.len()).await?;
    nothing_leaked(&ctx, operator, 2).await
}

async fn node_deleted_with_bound_slices(ctx: TestContext) -> Result<()> {
    full_cluster(&ctx).await?;
    let operator = Operator::start(&ctx, "op-a").await?;
    let pods = filling_pods("burst", 2);
    create_all(&ctx, &pods).await?;
    all_bound(&ctx, pods.len(), "the cluster full").await?;
    let gone = ctx.node_name("n1");
    ctx.cluster_api::<Node>()
        .delete(&gone, &DeleteParams::default())
        .await?;
    // Pod GC deletes the pods bound to the node; the node's TopologyGroup goes with it (the
    // Node owns it); the operator removes the finalizers no agent will.
    let groups = ctx.cluster_api::<TopologyGroup>();
    ctx.wait_for(
        "the node's pods, slices and TopologyGroup gone",
        Duration::from_secs(120),
        || async {
            let pods_left = ctx.api::<Pod>().list(&ListParams::default()).await?.items;
            let on_gone = pods_left
                .iter()
                .filter(|p| {
                    p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(gone.as_str())
                })
                .count();
            let slices = ctx
                .api::<GpuSlice>()
                .list(&ListParams::default())
                .await?
                .items;
            let slices_on_gone = slices
                .iter()
                .filter(|s| s.spec.node_name.as_deref() == Some(gone.as_str()))
                .count();
            let group = groups.get_opt(&gone).await?;
            Ok((on_gone == 0 && slices_on_gone == 0 && group.is_none()).then_some(()))
        },
    )
    .await?;
    ensure!(
        bound_count(&ctx).await? == PER_NODE,
        "the other node's pods stay"
    );
    // The node comes back empty, and both nodes fill again.
    gpu_node(&ctx, "n1", h800_node(), vec![], &[]).await?;
    nothing_leaked(&ctx, operator, 2).await
}
