//! Priority and preemption against the real apiserver (its Priority admission sets
//! `spec.priority` from the PriorityClass) and the disruption controller (a budget's
//! `disruptionsAllowed`): one node of eight H800 cards full of low-priority whole-card,
//! time-division and MIG pods; a high-priority pod of each kind gets room by the fewest
//! evictions, each victim marked `DisruptionTarget` and told who preempted it, the preemptor
//! nominated to the node; a budget is kept where another victim exists; a pod with
//! `preemptionPolicy: Never`, and one of equal priority, evict nobody.

use crate::operator::{
    AgentTeardown, bound, create_pod, gpu_node, gpu_pod, h800_node, unschedulable, with_operator,
};
use anyhow::{Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{DeleteParams, ListParams, PostParams};
use runtimekit_e2e::harness::Test;
use runtimekit_e2e::{TestContext, tests};
use serde_json::{Value, json};
use std::time::Duration;

pub const TESTS: &[Test] = tests![preemption_makes_room_by_the_fewest_evictions];

const WAIT: Duration = Duration::from_secs(30);
/// The finalizer that keeps the share pods Terminating until the test lets them go.
const HOLD: &str = "e2e.runtimekit.aliyun.com/hold";

/// The cluster-scoped PriorityClasses of this test, named after its namespace.
#[derive(Clone)]
struct Classes {
    lowest: String,
    low: String,
    high: String,
    never: String,
}

async fn classes(ctx: &TestContext) -> Result<Classes> {
    let ns = &ctx.namespace;
    let classes = Classes {
        lowest: format!("{ns}-lowest"),
        low: format!("{ns}-low"),
        high: format!("{ns}-high"),
        never: format!("{ns}-never"),
    };
    let api = ctx.cluster_api::<PriorityClass>();
    for (name, value, policy) in [
        (&classes.lowest, 10, "PreemptLowerPriority"),
        (&classes.low, 100, "PreemptLowerPriority"),
        (&classes.high, 1000, "PreemptLowerPriority"),
        (&classes.never, 1000, "Never"),
    ] {
        let class: PriorityClass = serde_json::from_value(json!({
            "metadata": {"name": name}, "value": value, "preemptionPolicy": policy}))?;
        api.create(&PostParams::default(), &class).await?;
    }
    Ok(classes)
}

async fn delete_classes(ctx: &TestContext, classes: &Classes) -> Result<()> {
    let api = ctx.cluster_api::<PriorityClass>();
    for name in [&classes.lowest, &classes.low, &classes.high, &classes.never] {
        api.delete(name, &DeleteParams::default()).await?;
    }
    Ok(())
}

fn with_class(name: &str, class: &str, limits: Value) -> Value {
    let mut pod = gpu_pod(name, limits);
    pod["spec"]["priorityClassName"] = json!(class);
    pod
}

/// The pods `preemptor` evicted, from the Events its victims got.
async fn victims_of(ctx: &TestContext, preemptor: &str, at_least: usize) -> Result<Vec<String>> {
    let text = format!("Preempted by pod {}/{preemptor} on node", ctx.namespace);
    ctx.wait_for(
        &format!("{at_least} victim(s) of {preemptor}"),
        WAIT,
        || async {
            let events = ctx.kubectl_ok(
                &["get", "events", "--field-selector", "reason=Preempted", "-o",
                  "jsonpath={range .items[*]}{.involvedObject.name}{\"\\t\"}{.message}{\"\\n\"}{end}"],
                None,
            )?;
            let mut names: Vec<String> = events
                .lines()
                .filter(|l| l.contains(&text))
                .filter_map(|l| l.split('\t').next().map(str::to_owned))
                .collect();
            names.sort();
            names.dedup();
            Ok((names.len() >= at_least).then_some(names))
        },
    )
    .await
}

/// Waits until none of `names` exists any more.
async fn gone(ctx: &TestContext, names: &[String]) -> Result<()> {
    let pods = ctx.api::<Pod>();
    ctx.wait_for("the victims to be gone", WAIT, || async {
        for name in names {
            if pods.get_opt(name).await?.is_some() {
                return Ok(None);
            }
        }
        Ok(Some(()))
    })
    .await
}

async fn preemption_makes_room_by_the_fewest_evictions(ctx: TestContext) -> Result<()> {
    let classes = classes(&ctx).await?;
    let names = classes.clone();
    let result = with_operator(ctx.clone(), |ctx| async move {
        let classes = names;
        let node = gpu_node(&ctx, "preempt", h800_node(), vec![], &[]).await?;
        let _teardown = AgentTeardown::start(&ctx);
        // A class that does not exist is refused by the apiserver.
        let missing = create_pod(
            &ctx,
            with_class("missing", "no-such-class", json!({"aliyun.com/gpu": "1"})),
        )
        .await;
        ensure!(
            missing
                .as_ref()
                .is_err_and(|e| e.to_string().contains("no-such-class")),
            "{missing:?}"
        );
        // Fill the node: cards 0-4 whole (0 and 1 guarded by a budget and of the lowest
        // priority), card 5 in four 25 % shares of the lowest priority (so that a share is
        // cheaper to evict than a whole card of higher priority, which would be one victim
        // instead of two), cards 6 and 7 (MIG) one 7g instance each.
        let mut low = Vec::new();
        for i in 0..5 {
            let name = format!("whole-{i}");
            let class = if i < 2 { &classes.lowest } else { &classes.low };
            let mut pod = with_class(&name, class, json!({"nvidia.com/gpu": "1"}));
            if i < 2 {
                pod["metadata"]["labels"] = json!({"app": "guarded"});
            }
            create_pod(&ctx, pod).await?;
            low.push(name);
        }
        for i in 0..4 {
            let name = format!("share-{i}");
            // Held in Terminating by a finalizer, so the test sees a victim's mark and the
            // preemptor waiting for its room.
            let mut pod = with_class(&name, &classes.lowest, json!({"aliyun.com/gpu-core": "25"}));
            pod["metadata"]["finalizers"] = json!([HOLD]);
            create_pod(&ctx, pod).await?;
            low.push(name);
        }
        for i in 0..2 {
            let name = format!("mig-{i}");
            create_pod(
                &ctx,
                with_class(&name, &classes.low, json!({"aliyun.com/gpu-slice": "7"})),
            )
            .await?;
            low.push(name);
        }
        for name in &low {
            bound(&ctx, name).await?;
        }
        // An integer minAvailable: bare pods have no controller for a maxUnavailable to scale by.
        let budget: PodDisruptionBudget = serde_json::from_value(json!({
            "metadata": {"name": "guarded"},
            "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "guarded"}}}}))?;
        ctx.api::<PodDisruptionBudget>()
            .create(&PostParams::default(), &budget)
            .await?;
        ctx.wait_for(
            "the disruption controller to count the budget",
            WAIT,
            || async {
                let budget = ctx.api::<PodDisruptionBudget>().get("guarded").await?;
                Ok(budget
                    .status
                    .filter(|s| s.expected_pods == Some(2))
                    .map(|_| ()))
            },
        )
        .await?;

        // Of the lowest priority (equal to the lowest pods), and `Never`: they evict nobody.
        create_pod(
            &ctx,
            with_class("equal", &classes.lowest, json!({"nvidia.com/gpu": "1"})),
        )
        .await?;
        create_pod(
            &ctx,
            with_class("never", &classes.never, json!({"nvidia.com/gpu": "1"})),
        )
        .await?;
        for name in ["equal", "never"] {
            let why = unschedulable(&ctx, name).await?;
            ensure!(!why.contains("Preemption"), "{name}: {why}");
        }

        // A half-card share frees two quarter shares of one card, not a whole card.
        create_pod(
            &ctx,
            with_class("infer", &classes.high, json!({"aliyun.com/gpu-core": "50"})),
        )
        .await?;
        let victims = victims_of(&ctx, "infer", 2).await?;
        ensure!(
            victims.len() == 2 && victims.iter().all(|v| v.starts_with("share-")),
            "{victims:?}"
        );
        let pods = ctx.api::<Pod>();
        for victim in &victims {
            let pod = pods.get(victim).await?;
            ensure!(
                pod.metadata.deletion_timestamp.is_some(),
                "{victim} is not being deleted"
            );
            let mark = pod
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .into_iter()
                .find(|c| c.type_ == "DisruptionTarget");
            ensure!(
                mark.as_ref()
                    .is_some_and(|c| c.status == "True"
                        && c.reason.as_deref() == Some("PreemptionByScheduler")),
                "{victim}: {mark:?}"
            );
        }
        // While they terminate the preemptor waits, nominated to the node, and the room is
        // held for it: a share of the lowest priority created now (it can evict nobody) does not take it.
        let preemptor = pods.get("infer").await?;
        let nominated = preemptor
            .status
            .as_ref()
            .and_then(|s| s.nominated_node_name.clone());
        ensure!(
            nominated.as_deref() == Some(node.as_str()),
            "nominated {nominated:?}"
        );
        ensure!(
            preemptor
                .spec
                .as_ref()
                .and_then(|s| s.node_name.as_ref())
                .is_none(),
            "placed before its victims went"
        );
        create_pod(
            &ctx,
            with_class(
                "sneak",
                &classes.lowest,
                json!({"aliyun.com/gpu-core": "50"}),
            ),
        )
        .await?;
        for victim in &victims {
            ctx.kubectl_ok(
                &[
                    "patch",
                    "pod",
                    victim,
                    "--type=merge",
                    "-p",
                    r#"{"metadata":{"finalizers":null}}"#,
                ],
                None,
            )?;
        }
        gone(&ctx, &victims).await?;
        bound(&ctx, "infer").await?;
        let why = unschedulable(&ctx, "sneak").await?;
        ensure!(!why.contains("Preemption"), "sneak: {why}");
        // Exactly two victims in all: the room was not lost to the sneak and bought again.
        ensure!(victims_of(&ctx, "infer", 2).await?.len() == 2);

        // A MIG instance of 3 slices frees one 7g instance.
        create_pod(
            &ctx,
            with_class("train", &classes.high, json!({"aliyun.com/gpu-slice": "3"})),
        )
        .await?;
        let victims = victims_of(&ctx, "train", 1).await?;
        ensure!(
            victims.len() == 1 && victims[0].starts_with("mig-"),
            "{victims:?}"
        );
        bound(&ctx, "train").await?;

        // A whole card: the guarded pods have the lowest priority, but their budget allows no
        // disruption while unguarded ones can go.
        create_pod(
            &ctx,
            with_class("serve", &classes.high, json!({"nvidia.com/gpu": "1"})),
        )
        .await?;
        let victims = victims_of(&ctx, "serve", 1).await?;
        ensure!(
            victims.len() == 1 && ["whole-2", "whole-3", "whole-4"].contains(&victims[0].as_str()),
            "{victims:?}"
        );
        bound(&ctx, "serve").await?;

        // Nobody else was evicted: the equal-priority and Never pods are still waiting.
        let pods = ctx.api::<Pod>().list(&ListParams::default()).await?.items;
        let alive = |name: &str| {
            pods.iter()
                .any(|p| p.metadata.name.as_deref() == Some(name))
        };
        for name in ["whole-0", "whole-1", "equal", "never"] {
            ensure!(alive(name), "{name} is gone");
        }
        for name in ["equal", "never"] {
            let pod = pods
                .iter()
                .find(|p| p.metadata.name.as_deref() == Some(name));
            ensure!(
                pod.and_then(|p| p.spec.as_ref()?.node_name.clone())
                    .is_none(),
                "{name} was placed"
            );
        }
        Ok(())
    })
    .await;
    // Pods still held by the finalizer would outlive the test's namespace.
    let _ = ctx.kubectl(
        &[
            "patch",
            "pod",
            "share-2",
            "share-3",
            "--type=merge",
            "-p",
            r#"{"metadata":{"finalizers":null}}"#,
        ],
        None,
    );
    delete_classes(&ctx, &classes).await?;
    result
}
