//! Gangs against the real control plane, through the real JobSet and Job controllers: placed
//! all at once, refused when they could never be complete, and what a timed-out attempt does.
//! By default it does nothing the pods' owner counts as a failure: the usage guide's JobSet
//! survives attempts that time out, and its Job counts no failed pod.

use crate::operator::{
    create_pod, event, gpu_node, gpu_pod, h800_node, nic, ppu, reporting_node, slices,
    with_operator,
};
use anyhow::{Context, Result, ensure};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use runtimekit_crds::{GangGroup, GangGroupStatus, GangPhase, GpuSlice};
use runtimekit_e2e::harness::Test;
use runtimekit_e2e::{FakeNode, TestContext, tests};
use serde_json::json;
use std::time::Duration;

pub const TESTS: &[Test] = tests![
    seven_worker_jobset_gang,
    gang_that_cannot_fit_stays_pending,
    gang_larger_than_its_jobset_fails,
    usage_guide_jobset_survives_a_timed_out_attempt,
    late_members_join_after_a_timed_out_attempt,
    gang_that_never_runs_keeps_its_bound_members,
    gang_that_opts_in_deletes_its_bound_members,
    gang_of_bare_pods_is_created_and_collected_with_them,
];

/// The usage guide's JobSet (section 4.2), verbatim.
const USAGE_GUIDE_JOBSET: &str = include_str!("../../../contract/tests/seeds/4.2-gang-jobset.yaml");

/// Four nodes of two PPU cards with a NIC each, under two leaf switches of one network pod.
async fn four_ppu_nodes(ctx: &TestContext) -> Result<()> {
    for (i, leaf) in [(0, "l1"), (1, "l1"), (2, "l2"), (3, "l2")] {
        let cards = (0..2).map(|c| ppu(c, "PPU-M890P", None, c)).collect();
        let labels = [
            ("runtimekit.aliyun.com/leaf-switch", leaf),
            ("runtimekit.aliyun.com/network-pod", "p1"),
        ];
        gpu_node(ctx, &format!("n{i}"), cards, vec![nic(0), nic(1)], &labels).await?;
    }
    Ok(())
}

/// Applies a GangGroup ahead of its members, so the test sets its timeout and policy.
fn apply_gang(ctx: &TestContext, gang: serde_json::Value) -> Result<()> {
    let mut gang = gang;
    gang["apiVersion"] = json!("runtimekit.aliyun.com/v1alpha1");
    gang["kind"] = json!("GangGroup");
    ctx.kubectl_ok(&["apply", "-f", "-"], Some(&gang.to_string()))?;
    Ok(())
}

/// Waits for the gang `name`'s status to satisfy `done`, and returns it.
async fn gang_status(
    ctx: &TestContext,
    name: &str,
    what: &str,
    timeout: Duration,
    done: impl Fn(&GangGroupStatus) -> bool,
) -> Result<GangGroupStatus> {
    let gangs = ctx.api::<GangGroup>();
    ctx.wait_for(what, timeout, || async {
        let status = gangs.get_opt(name).await?.and_then(|g| g.status);
        Ok(status.filter(|s| done(s)))
    })
    .await
}

fn timed_out(status: &GangGroupStatus) -> bool {
    status.phase == Some(GangPhase::TimedOut) && status.attempts >= 1
}

fn running(status: &GangGroupStatus) -> bool {
    status.phase == Some(GangPhase::Running)
}

/// The test's pods that exist, and how many of them are bound.
async fn pods(ctx: &TestContext) -> Result<(Vec<Pod>, usize)> {
    let list = ctx.api::<Pod>().list(&ListParams::default()).await?.items;
    let bound = list
        .iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some())
        .count();
    Ok((list, bound))
}

/// A gang member outside any JobSet: a one-card pod labelled with the gang's name and size.
fn member(name: &str, gang: &str, min_member: u32) -> serde_json::Value {
    let mut pod = gpu_pod(name, json!({"nvidia.com/gpu": "1"}));
    pod["metadata"]["labels"] =
        json!({"aliyun.com/min-member": min_member.to_string(), "aliyun.com/gang-name": gang});
    pod
}

pub(crate) fn gang_jobset(
    name: &str,
    workers: u32,
    min_member: u32,
    limits: serde_json::Value,
) -> serde_json::Value {
    json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": name},
        "spec": {"replicatedJobs": [{"name": "worker", "template": {"spec": {
            "completionMode": "Indexed", "parallelism": workers, "completions": workers, "backoffLimit": 2,
            "template": {
                "metadata": {"labels": {"app": name, "aliyun.com/min-member": min_member.to_string()}},
                "spec": {"schedulerName": "lj-runtimekit-scheduler", "runtimeClassName": "lj-runtime", "hostNetwork": true, "restartPolicy": "Never",
                         "containers": [{"name": "trainer", "image": "busybox", "resources": {"limits": limits},
                                         "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}}}]}}}}}]}
    })
}

async fn seven_worker_jobset_gang(ctx: TestContext) -> Result<()> {
    with_operator(ctx, |ctx| async move {
        // Four nodes of two cards under two leaf switches of one network pod: the gang of seven
        // cannot fit one leaf switch (four cards), so it spans the network pod.
        for (i, leaf) in [(0, "l1"), (1, "l1"), (2, "l2"), (3, "l2")] {
            let cards = (0..2).map(|c| ppu(c, "PPU-M890P", None, c)).collect();
            let labels = [
                ("runtimekit.aliyun.com/leaf-switch", leaf),
                ("runtimekit.aliyun.com/network-pod", "p1"),
            ];
            gpu_node(&ctx, &format!("n{i}"), cards, vec![nic(0), nic(1)], &labels).await?;
        }
        ctx.kubectl_ok(
            &["apply", "-f", "-"],
            Some(
                &gang_jobset(
                    "gang-nccl-test",
                    7,
                    7,
                    json!({"aliyun.com/gpu": "1", "aliyun.com/rdma": "1"}),
                )
                .to_string(),
            ),
        )?;
        let gangs = ctx.api::<GangGroup>();
        let gang = ctx
            .wait_for("the gang to run", Duration::from_secs(60), || async {
                let gang = gangs.get_opt("gang-nccl-test").await?;
                Ok(gang.filter(|g| {
                    g.status.as_ref().and_then(|s| s.phase) == Some(GangPhase::Running)
                }))
            })
            .await?;
        let status = gang.status.context("status")?;
        ensure!(
            status
                .members
                .as_ref()
                .is_some_and(|m| m.seen == 7 && m.running == 7),
            "{status:?}"
        );
        let placement = status.placement.context("placement")?;
        ensure!(
            placement.tier == runtimekit_crds::Tier::NetworkPod
                && placement.group == "networkpod-p1",
            "{placement:?}"
        );
        ensure!(
            gang.spec.job_set.as_deref() == Some("gang-nccl-test") && gang.spec.min_member == 7
        );
        Ok(())
    })
    .await
}

async fn gang_larger_than_its_jobset_fails(ctx: TestContext) -> Result<()> {
    with_operator(ctx, |ctx| async move {
        gpu_node(&ctx, "h800", h800_node(), vec![], &[]).await?;
        // min-member 7 on a replicated job of parallelism 3: the gang could never be complete.
        ctx.kubectl_ok(
            &["apply", "-f", "-"],
            Some(&gang_jobset("short", 3, 7, json!({"nvidia.com/gpu": "1"})).to_string()),
        )?;
        let gangs = ctx.api::<GangGroup>();
        let status = ctx
            .wait_for("the gang to fail", Duration::from_secs(30), || async {
                let gang = gangs.get_opt("short").await?;
                Ok(gang
                    .and_then(|g| g.status)
                    .filter(|s| s.phase == Some(GangPhase::Failed)))
            })
            .await?;
        let message = status.message.unwrap_or_default();
        ensure!(
            message.contains("aliyun.com/min-member is 7")
                && message
                    .contains(r#"JobSet "short" runs 3 pods with it at once; they must be equal"#),
            "{message}"
        );
        ensure!(
            slices(&ctx).await?.is_empty(),
            "nothing is reserved for a gang that cannot be complete"
        );
        event(&ctx, "reason=FailedScheduling", "gang short: label").await?;
        let pods = ctx.api::<Pod>();
        ctx.wait_for(
            "every member marked InvalidGang",
            Duration::from_secs(20),
            || async {
                let list = pods.list(&ListParams::default()).await?.items;
                let marked = list.iter().all(|p| {
                    p.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|c| {
                            c.iter().any(|c| {
                                c.type_ == "PodScheduled"
                                    && c.reason.as_deref() == Some("InvalidGang")
                            })
                        })
                });
                Ok((list.len() == 3 && marked).then_some(()))
            },
        )
        .await
    })
    .await
}

async fn gang_that_cannot_fit_stays_pending(ctx: TestContext) -> Result<()> {
    with_operator(ctx, |ctx| async move {
        for i in 0..2 {
            let cards = (0..2).map(|c| ppu(c, "PPU-M890P", None, c)).collect();
            gpu_node(
                &ctx,
                &format!("n{i}"),
                cards,
                vec![],
                &[("runtimekit.aliyun.com/network-pod", &format!("p{i}"))],
            )
            .await?;
        }
        // Five cards in two network pods of two: no network pod holds the gang, and it never spans them.
        ctx.kubectl_ok(
            &["apply", "-f", "-"],
            Some(&gang_jobset("big", 5, 5, json!({"aliyun.com/gpu": "1"})).to_string()),
        )?;
        let gangs = ctx.api::<GangGroup>();
        let message = ctx
            .wait_for(
                "the gang to report why it waits",
                Duration::from_secs(30),
                || async {
                    let gang = gangs.get_opt("big").await?;
                    let status = gang.and_then(|g| g.status).unwrap_or_default();
                    Ok(status.message.filter(|m| {
                        status.phase == Some(GangPhase::Waiting)
                            && m.contains("nodes are available")
                    }))
                },
            )
            .await?;
        ensure!(message.contains("0/2 nodes are available"), "{message}");
        tokio::time::sleep(Duration::from_secs(2)).await;
        let pods = ctx.api::<Pod>().list(&ListParams::default()).await?.items;
        ensure!(
            pods.len() == 5
                && pods.iter().all(|p| p
                    .spec
                    .as_ref()
                    .and_then(|s| s.node_name.as_ref())
                    .is_none()),
            "every member stays Pending"
        );
        ensure!(slices(&ctx).await?.is_empty(), "nothing is reserved");
        event(&ctx, "reason=FailedScheduling", "gang big").await?;
        Ok(())
    })
    .await
}

async fn usage_guide_jobset_survives_a_timed_out_attempt(ctx: TestContext) -> Result<()> {
    with_operator(ctx, |ctx| async move {
        four_ppu_nodes(&ctx).await?;
        // Two of the eight cards taken: room for six of the seven workers.
        for name in ["blocker-0", "blocker-1"] {
            create_pod(&ctx, gpu_pod(name, json!({"aliyun.com/gpu": "1"}))).await?;
        }
        ctx.wait_for("the blockers bound", Duration::from_secs(30), || async {
            Ok((pods(&ctx).await?.1 == 2).then_some(()))
        })
        .await?;
        // The gang's timeout set short, ahead of the JobSet.
        apply_gang(
            &ctx,
            json!({"metadata": {"name": "gang-nccl-test"},
                   "spec": {"minMember": 7, "timeoutSeconds": 3, "jobSet": "gang-nccl-test"}}),
        )?;
        ctx.kubectl_ok(&["apply", "-f", "-"], Some(USAGE_GUIDE_JOBSET))?;
        let first = gang_status(
            &ctx,
            "gang-nccl-test",
            "the first attempt to time out",
            Duration::from_secs(60),
            timed_out,
        )
        .await?;
        let message = first.message.unwrap_or_default();
        ensure!(
            message.contains("0 of 7 running, 0 bound, 7 exist")
                && message.contains("nothing is held"),
            "{message}"
        );
        let (members, bound) = pods(&ctx).await?;
        ensure!(
            members.len() == 9 && bound == 2,
            "every worker stays Pending"
        );
        ensure!(
            slices(&ctx).await?.len() == 2,
            "the workers hold no slice: only the blockers' two"
        );
        event(
            &ctx,
            "reason=FailedScheduling",
            "gang gang-nccl-test: not complete and running",
        )
        .await?;
        // Capacity comes back: the blockers go, and their slices once the node agent (played
        // here by the test) has torn them down. A later attempt, after its backoff, places all
        // seven.
        let pods_api = ctx.api::<Pod>();
        for name in ["blocker-0", "blocker-1"] {
            pods_api.delete(name, &DeleteParams::default()).await?;
        }
        let slices_api = ctx.api::<GpuSlice>();
        for slice in slices(&ctx).await? {
            let unfinalized = json!({"metadata": {"finalizers": null}});
            slices_api
                .patch(
                    &slice.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&unfinalized),
                )
                .await?;
        }
        let ran = gang_status(
            &ctx,
            "gang-nccl-test",
            "the gang to run",
            Duration::from_secs(90),
            running,
        )
        .await?;
        ensure!(
            ran.attempts >= 1,
            "the timed-out attempts stay recorded: {ran:?}"
        );
        ensure!(
            ran.members.as_ref().is_some_and(|m| m.running == 7),
            "{ran:?}"
        );
        let job = ctx.api::<Job>().get("gang-nccl-test-worker-0").await?;
        let job_status = job.status.unwrap_or_default();
        ensure!(
            job_status.failed.unwrap_or(0) == 0,
            "the Job counts no failed pod: {job_status:?}"
        );
        let job_set = ctx.kubectl_ok(
            &[
                "get",
                "jobset",
                "gang-nccl-test",
                "-o",
                "jsonpath={.status.conditions}",
            ],
            None,
        )?;
        ensure!(
            !job_set.contains(r#""type":"Failed""#),
            "the JobSet is not failed: {job_set}"
        );
        Ok(())
    })
    .await
}

async fn late_members_join_after_a_timed_out_attempt(ctx: TestContext) -> Result<()> {
    with_operator(ctx, |ctx| async move {
        gpu_node(&ctx, "h800", h800_node(), vec![], &[]).await?;
        apply_gang(
            &ctx,
            json!({"metadata": {"name": "g"}, "spec": {"minMember": 4, "timeoutSeconds": 2}}),
        )?;
        for i in 0..3 {
            create_pod(&ctx, member(&format!("m{i}"), "g", 4)).await?;
        }
        let status = gang_status(
            &ctx,
            "g",
            "the gang to time out",
            Duration::from_secs(30),
            timed_out,
        )
        .await?;
        let message = status.message.unwrap_or_default();
        ensure!(
            message.contains("waiting for members: 3 of 4 exist")
                && message.contains("nothing is held"),
            "{message}"
        );
        ensure!(slices(&ctx).await?.is_empty(), "no reservation is left");
        let (members, bound) = pods(&ctx).await?;
        ensure!(
            members.len() == 3
                && bound == 0
                && members
                    .iter()
                    .all(|p| p.metadata.deletion_timestamp.is_none()),
            "the members wait, untouched"
        );
        // The last member arrives: the gang is complete and runs.
        create_pod(&ctx, member("m3", "g", 4)).await?;
        let ran = gang_status(
            &ctx,
            "g",
            "the gang to run",
            Duration::from_secs(60),
            running,
        )
        .await?;
        ensure!(ran.attempts >= 1, "{ran:?}");
        ensure!(pods(&ctx).await?.1 == 4, "every member bound");
        Ok(())
    })
    .await
}

/// A gang of two on a node whose kubelet hangs (pods bound there never start), with `policy`.
async fn gang_on_a_hung_node(ctx: &TestContext, on_timeout: &str) -> Result<GangGroupStatus> {
    reporting_node(ctx, FakeNode::new("h800").hung(), h800_node(), vec![]).await?;
    apply_gang(
        ctx,
        json!({"metadata": {"name": "stuck"},
               "spec": {"minMember": 2, "timeoutSeconds": 3, "onTimeout": on_timeout}}),
    )?;
    for i in 0..2 {
        create_pod(ctx, member(&format!("m{i}"), "stuck", 2)).await?;
    }
    gang_status(
        ctx,
        "stuck",
        "both members bound",
        Duration::from_secs(20),
        |s| s.members.as_ref().is_some_and(|m| m.bound == 2),
    )
    .await?;
    ensure!(live_slices(ctx).await? == 2, "one slice per member");
    gang_status(
        ctx,
        "stuck",
        "the gang to time out",
        Duration::from_secs(30),
        timed_out,
    )
    .await
}

async fn live_slices(ctx: &TestContext) -> Result<usize> {
    let list: Vec<GpuSlice> = slices(ctx).await?;
    Ok(list
        .iter()
        .filter(|s| s.metadata.deletion_timestamp.is_none())
        .count())
}

async fn gang_that_never_runs_keeps_its_bound_members(ctx: TestContext) -> Result<()> {
    with_operator(ctx, |ctx| async move {
        let status = gang_on_a_hung_node(&ctx, "KeepBoundMembers").await?;
        let message = status.message.clone().unwrap_or_default();
        ensure!(
            message.contains("0 of 2 running, 2 bound")
                && message.contains("the 2 bound members keep their cards"),
            "{status:?}"
        );
        // Past a second timeout and its backoff, nothing is deleted or released.
        gang_status(
            &ctx,
            "stuck",
            "a second attempt to time out",
            Duration::from_secs(30),
            |s| s.attempts >= 2,
        )
        .await?;
        let (members, bound) = pods(&ctx).await?;
        ensure!(
            members.len() == 2
                && bound == 2
                && members
                    .iter()
                    .all(|p| p.metadata.deletion_timestamp.is_none()),
            "the bound members stay"
        );
        ensure!(live_slices(&ctx).await? == 2, "and keep their slices");
        for pod in &members {
            ctx.api::<Pod>()
                .delete(
                    &pod.name_any(),
                    &DeleteParams {
                        grace_period_seconds: Some(0),
                        ..DeleteParams::default()
                    },
                )
                .await?;
        }
        Ok(())
    })
    .await
}

async fn gang_that_opts_in_deletes_its_bound_members(ctx: TestContext) -> Result<()> {
    with_operator(ctx, |ctx| async move {
        let status = gang_on_a_hung_node(&ctx, "DeleteBoundMembers").await?;
        ensure!(
            status.message.as_deref().is_some_and(|m| {
                m.contains("0 of 2 running") && m.contains("the 2 bound members are deleted")
            }),
            "{status:?}"
        );
        ensure!(
            status.placement.is_none(),
            "the placement is cleared: {status:?}"
        );
        let pods_api = ctx.api::<Pod>();
        ctx.wait_for(
            "the members to be deleted",
            Duration::from_secs(20),
            || async {
                let list = pods_api.list(&ListParams::default()).await?.items;
                Ok(list
                    .iter()
                    .all(|p| p.metadata.deletion_timestamp.is_some())
                    .then_some(()))
            },
        )
        .await?;
        // The hung node never confirms the deletions: finish them as its kubelet would.
        for name in ["m0", "m1"] {
            pods_api
                .delete(
                    name,
                    &DeleteParams {
                        grace_period_seconds: Some(0),
                        ..DeleteParams::default()
                    },
                )
                .await?;
        }
        ctx.wait_for(
            "the slices to be released",
            Duration::from_secs(20),
            || async { Ok((live_slices(&ctx).await? == 0).then_some(())) },
        )
        .await
        .context("the deleted members' slices")?;
        Ok(())
    })
    .await
}

/// A gang of pods labelled with a gang name and no GangGroup: the operator creates it, owned by
/// the members, and the garbage collector takes it when they are gone.
async fn gang_of_bare_pods_is_created_and_collected_with_them(ctx: TestContext) -> Result<()> {
    with_operator(ctx, |ctx| async move {
        gpu_node(&ctx, "h800", h800_node(), vec![], &[]).await?;
        for i in 0..2 {
            create_pod(&ctx, member(&format!("b{i}"), "bare", 2)).await?;
        }
        gang_status(
            &ctx,
            "bare",
            "the created gang to bind",
            Duration::from_secs(30),
            |s| s.members.as_ref().is_some_and(|m| m.bound == 2),
        )
        .await?;
        // Each member hears where it went, as a pod kube-scheduler binds does.
        for i in 0..2 {
            let selector = format!("involvedObject.name=b{i},reason=Scheduled");
            let node = ctx.node_name("h800");
            event(
                &ctx,
                &selector,
                &format!("Successfully assigned {}/b{i} to {node}", ctx.namespace),
            )
            .await?;
        }
        // Created when the first member appeared, owned by the members that existed then.
        let gang = ctx.api::<GangGroup>().get("bare").await?;
        let owners: Vec<(String, String)> = gang
            .owner_references()
            .iter()
            .map(|o| (o.kind.clone(), o.name.clone()))
            .collect();
        ensure!(
            !owners.is_empty()
                && owners
                    .iter()
                    .all(|(kind, name)| kind == "Pod" && ["b0", "b1"].contains(&name.as_str())),
            "owned by its members: {owners:?}"
        );
        ctx.api::<Pod>()
            .delete_collection(
                &DeleteParams::default().grace_period(0),
                &ListParams::default(),
            )
            .await?;
        ctx.wait_for(
            "the GangGroup to be collected",
            Duration::from_secs(60),
            || async {
                Ok(ctx
                    .api::<GangGroup>()
                    .get_opt("bare")
                    .await?
                    .is_none()
                    .then_some(()))
            },
        )
        .await?;
        Ok(())
    })
    .await
}
