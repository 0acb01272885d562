//! The control plane itself and this project's CRDs on it: installation, documentation, CEL
//! validation, printer columns, JobSet's pod creation and kwok's nodes.

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use runtimekit_crds::{GangGroup, GpuSlice, TopologyGroup};
use runtimekit_e2e::harness::Test;
use runtimekit_e2e::{FakeNode, TestContext, parse_table, tests};
use serde_json::json;
use std::time::Duration;

pub const TESTS: &[Test] = tests![
    crds_are_established_and_documented,
    cel_rules_reject_invalid_objects,
    immutable_fields_stay_put,
    printer_columns_show_real_values,
    jobset_creates_its_pods,
    kwok_node_runs_bound_pods,
    deployment_manifests_are_accepted,
];

async fn crds_are_established_and_documented(ctx: TestContext) -> Result<()> {
    let api = ctx.cluster_api::<CustomResourceDefinition>();
    for name in
        ["gpuslices", "topologygroups", "ganggroups"].map(|p| format!("{p}.runtimekit.aliyun.com"))
    {
        let crd = api.get(&name).await?;
        let established = crd
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        ensure!(established, "{name} is not Established");
    }
    let explained = ctx.kubectl_ok(&["explain", "gpuslice.spec"], None)?;
    for expected in [
        "Compute share of the card in percent, 1-100",
        "MIG instance size in compute slices",
        "migPlacementStart",
        "nodeName",
    ] {
        ensure!(
            explained.contains(expected),
            "kubectl explain gpuslice.spec lacks {expected:?}:\n{explained}"
        );
    }
    let explained = ctx.kubectl_ok(&["explain", "ganggroup.spec.timeoutSeconds"], None)?;
    ensure!(
        explained.contains("retries with backoff"),
        "kubectl explain ganggroup.spec.timeoutSeconds:\n{explained}"
    );
    Ok(())
}

/// Applies `manifest` and returns kubectl's error output, failing if it was accepted.
fn rejected(ctx: &TestContext, manifest: &serde_json::Value) -> Result<String> {
    let output = ctx.kubectl(&["apply", "-f", "-"], Some(&manifest.to_string()))?;
    ensure!(!output.status.success(), "accepted: {manifest}");
    Ok(String::from_utf8_lossy(&output.stderr).into_owned())
}

fn slice(name: &str, spec: serde_json::Value) -> serde_json::Value {
    let mut full = json!({
        "nodeName": "n1",
        "card": {"index": 0, "uuid": "GPU-0"},
        "pod": {"namespace": "x", "name": "p", "uid": "u", "container": "app"},
    });
    for (k, v) in spec.as_object().into_iter().flatten() {
        full[k] = v.clone();
    }
    json!({"apiVersion": "runtimekit.aliyun.com/v1alpha1", "kind": "GpuSlice", "metadata": {"name": name}, "spec": full})
}

async fn cel_rules_reject_invalid_objects(ctx: TestContext) -> Result<()> {
    let cases = [
        (
            slice("core", json!({"mode": "TDM", "core": 150})),
            "core must be between 1 and 100 (percent of one card)",
        ),
        (
            slice(
                "slices",
                json!({"mode": "MIG", "slices": 5, "migProfile": "5g.50gb", "migPlacementStart": 0}),
            ),
            "slices must be one of 1, 2, 3, 4, 7",
        ),
        (
            slice(
                "start",
                json!({"mode": "MIG", "slices": 4, "migProfile": "4g.40gb", "migPlacementStart": 4}),
            ),
            "migPlacementStart is not a legal start for this slice count",
        ),
        (
            slice(
                "profile",
                json!({"mode": "MIG", "slices": 3, "migProfile": "1g.10gb", "migPlacementStart": 0}),
            ),
            "migProfile must have as many compute slices as slices",
        ),
        (
            slice(
                "mixed",
                json!({"mode": "MIG", "slices": 3, "migProfile": "3g.40gb", "migPlacementStart": 0, "core": 50}),
            ),
            "a MIG slice needs slices, migProfile and migPlacementStart, and carries no core",
        ),
        (
            slice("whole", json!({"mode": "Whole", "core": 10})),
            "a Whole slice takes the whole card",
        ),
        (
            slice("memory", json!({"mode": "TDM", "memory": "4GB"})),
            "memory must be a positive whole number of Mi or Gi",
        ),
        (
            json!({"apiVersion": "runtimekit.aliyun.com/v1alpha1", "kind": "GangGroup", "metadata": {"name": "g"}, "spec": {"minMember": 0}}),
            "minMember must be at least 1",
        ),
        (
            json!({"apiVersion": "runtimekit.aliyun.com/v1alpha1", "kind": "GangGroup", "metadata": {"name": "g"}, "spec": {"minMember": 2, "timeoutSeconds": 0}}),
            "timeoutSeconds must be between 1 and 86400",
        ),
        (
            json!({"apiVersion": "runtimekit.aliyun.com/v1alpha1", "kind": "TopologyGroup", "metadata": {"name": format!("{}-tg1", ctx.namespace)}, "spec": {"tier": "Node"}}),
            "nodeName is required for tier Node and not allowed for higher tiers",
        ),
        (
            json!({"apiVersion": "runtimekit.aliyun.com/v1alpha1", "kind": "TopologyGroup", "metadata": {"name": format!("{}-tg2", ctx.namespace)}, "spec": {"tier": "NetworkPod", "parent": "dc"}}),
            "NetworkPod is the widest tier and has no parent",
        ),
    ];
    for (manifest, message) in cases {
        let stderr = rejected(&ctx, &manifest)?;
        ensure!(
            stderr.contains(message),
            "expected {message:?} for {manifest}, got: {stderr}"
        );
    }
    Ok(())
}

async fn immutable_fields_stay_put(ctx: TestContext) -> Result<()> {
    ctx.kubectl_ok(
        &["apply", "-f", "-"],
        Some(&slice("fixed", json!({"mode": "Whole"})).to_string()),
    )?;
    let moved = ctx.kubectl(
        &[
            "patch",
            "gpuslice",
            "fixed",
            "--type=merge",
            "-p",
            r#"{"spec":{"nodeName":"n2"}}"#,
        ],
        None,
    )?;
    ensure!(!moved.status.success(), "nodeName changed");
    ensure!(String::from_utf8_lossy(&moved.stderr).contains("spec.nodeName is immutable once set"));
    let recarded = ctx.kubectl(
        &[
            "patch",
            "gpuslice",
            "fixed",
            "--type=merge",
            "-p",
            r#"{"spec":{"card":{"index":5}}}"#,
        ],
        None,
    )?;
    ensure!(String::from_utf8_lossy(&recarded.stderr).contains("spec.card is immutable once set"));
    Ok(())
}

async fn printer_columns_show_real_values(ctx: TestContext) -> Result<()> {
    let params = PatchParams::apply("e2e").force();
    let slices = ctx.api::<GpuSlice>();
    let tdm = slice(
        "tdm-0",
        json!({"mode": "TDM", "core": 50, "memory": "4Gi", "pod": {"namespace": ctx.namespace, "name": "tdm-demo", "uid": "u1", "container": "app"}}),
    );
    let mig = slice(
        "mig-0",
        json!({"mode": "MIG", "slices": 3, "migProfile": "3g.40gb", "migPlacementStart": 4, "memory": "4Gi", "card": {"index": 3, "uuid": "GPU-3"}, "pod": {"namespace": ctx.namespace, "name": "mig-demo", "uid": "u2", "container": "app"}}),
    );
    for object in [&tdm, &mig] {
        let name = object["metadata"]["name"].as_str().context("name")?;
        slices.patch(name, &params, &Patch::Apply(object)).await?;
    }
    let status = |phase: &str| json!({"apiVersion": "runtimekit.aliyun.com/v1alpha1", "kind": "GpuSlice", "status": {"phase": phase}});
    slices
        .patch_status("tdm-0", &params, &Patch::Apply(status("Ready")))
        .await?;
    slices
        .patch_status("mig-0", &params, &Patch::Apply(status("Creating")))
        .await?;

    let table = ctx.kubectl_ok(&["get", "gpuslices"], None)?;
    let columns = [
        "NAME", "NODE", "CARD", "MODE", "CORE", "MEMORY", "PROFILE", "POD", "PHASE",
    ];
    let expected = [
        [
            "mig-0", "n1", "3", "MIG", "", "4Gi", "3g.40gb", "mig-demo", "Creating",
        ],
        [
            "tdm-0", "n1", "0", "TDM", "50", "4Gi", "", "tdm-demo", "Ready",
        ],
    ];
    ensure!(
        cells(&table, &columns) == expected,
        "kubectl get gpuslices:\n{table}"
    );

    let gangs = ctx.api::<GangGroup>();
    let gang = json!({"apiVersion": "runtimekit.aliyun.com/v1alpha1", "kind": "GangGroup", "metadata": {"name": "train"}, "spec": {"minMember": 7}});
    gangs.patch("train", &params, &Patch::Apply(&gang)).await?;
    let gang_status = json!({"apiVersion": "runtimekit.aliyun.com/v1alpha1", "kind": "GangGroup", "status": {
        "phase": "Reserved", "members": {"seen": 7, "reserved": 7, "bound": 3, "running": 0}, "attempts": 1,
        "placement": {"tier": "LeafSwitch", "group": "leaf-1", "nodes": ["a", "b"]}}});
    gangs
        .patch_status("train", &params, &Patch::Apply(&gang_status))
        .await?;
    let table = ctx.kubectl_ok(&["get", "ganggroups"], None)?;
    let columns = [
        "NAME", "MIN", "SEEN", "RESERVED", "BOUND", "RUNNING", "PHASE", "TIER", "ATTEMPTS",
    ];
    ensure!(
        cells(&table, &columns)
            == [[
                "train",
                "7",
                "7",
                "7",
                "3",
                "0",
                "Reserved",
                "LeafSwitch",
                "1"
            ]],
        "kubectl get ganggroups:\n{table}"
    );

    let groups = ctx.cluster_api::<TopologyGroup>();
    let name = format!("{}-node", ctx.namespace);
    let group = json!({"apiVersion": "runtimekit.aliyun.com/v1alpha1", "kind": "TopologyGroup", "metadata": {"name": name}, "spec": {"tier": "Node", "nodeName": name, "parent": "hn-1"}});
    groups.patch(&name, &params, &Patch::Apply(&group)).await?;
    let group_status = json!({"apiVersion": "runtimekit.aliyun.com/v1alpha1", "kind": "TopologyGroup", "status": {
        "capacity": {"nodes": 1, "cards": 8, "healthyCards": 7, "freeCards": 5, "migCards": 2}}});
    groups
        .patch_status(&name, &params, &Patch::Apply(&group_status))
        .await?;
    let table = ctx.kubectl_ok(&["get", "topologygroups", &name], None);
    let _ = groups.delete(&name, &Default::default()).await;
    let table = table?;
    let columns = [
        "NAME", "TIER", "PARENT", "NODES", "CARDS", "HEALTHY", "FREE",
    ];
    ensure!(
        cells(&table, &columns) == [[name.as_str(), "Node", "hn-1", "1", "8", "7", "5"]],
        "kubectl get topologygroups:\n{table}"
    );
    Ok(())
}

/// The named columns of every row of a `kubectl get` table, failing on a missing column.
fn cells(table: &str, columns: &[&str]) -> Vec<Vec<String>> {
    parse_table(table)
        .iter()
        .map(|row| {
            columns
                .iter()
                .map(|c| {
                    row.get(*c)
                        .cloned()
                        .unwrap_or_else(|| format!("<no column {c}>"))
                })
                .collect()
        })
        .collect()
}

async fn jobset_creates_its_pods(ctx: TestContext) -> Result<()> {
    // No successPolicy or network: JobSet's own defaulting webhook fills them in.
    let jobset = json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "three"},
        "spec": {"replicatedJobs": [{"name": "worker", "template": {"spec": {
            "completionMode": "Indexed", "parallelism": 3, "completions": 3,
            "template": {"metadata": {"labels": {"aliyun.com/min-member": "3"}},
                         "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}}}]}
    });
    ctx.kubectl_ok(&["apply", "-f", "-"], Some(&jobset.to_string()))?;
    let pods = ctx.api::<Pod>();
    let found = ctx
        .wait_for(
            "3 pods of JobSet three",
            Duration::from_secs(60),
            || async {
                let list = pods
                    .list(&ListParams::default().labels("jobset.sigs.k8s.io/jobset-name=three"))
                    .await?;
                Ok((list.items.len() == 3).then_some(list.items))
            },
        )
        .await?;
    for pod in &found {
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        ensure!(
            labels.get("aliyun.com/min-member").map(String::as_str) == Some("3"),
            "template labels reach the pods"
        );
        ensure!(
            labels
                .get("jobset.sigs.k8s.io/replicatedjob-name")
                .map(String::as_str)
                == Some("worker")
        );
    }
    Ok(())
}

async fn kwok_node_runs_bound_pods(ctx: TestContext) -> Result<()> {
    let node = ctx
        .fake_node(
            FakeNode::new("gpu")
                .capacity("nvidia.com/gpu", "8")
                .label("lj_runtimekit_enable", "true"),
        )
        .await?;
    let node_name = node.metadata.name.clone().context("node name")?;
    let nodes = ctx.cluster_api::<k8s_openapi::api::core::v1::Node>();
    let ready = ctx
        .wait_for(
            "the kwok node to be Ready",
            Duration::from_secs(30),
            || async {
                let node = nodes.get(&node_name).await?;
                let status = node.status.unwrap_or_default();
                let ready = status
                    .conditions
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                Ok(ready.then_some(status.allocatable.unwrap_or_default()))
            },
        )
        .await?;
    ensure!(
        ready.get("nvidia.com/gpu").map(|q| q.0.as_str()) == Some("8"),
        "allocatable: {ready:?}"
    );

    let pods = ctx.api::<Pod>();
    for i in 0..2 {
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": format!("gpu-{i}")},
            "spec": {"schedulerName": "none", "containers": [{"name": "c", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}
        }))?;
        pods.create(&PostParams::default(), &pod).await?;
        // Bind the way a scheduler does: a Binding to the pods/binding subresource.
        let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": format!("gpu-{i}")}, "target": {"kind": "Node", "name": node_name}});
        let _: serde_json::Value = pods
            .create_subresource(
                "binding",
                &format!("gpu-{i}"),
                &PostParams::default(),
                &binding,
            )
            .await?;
    }
    ctx.wait_for(
        "both pods Running on the kwok node",
        Duration::from_secs(30),
        || async {
            let list = pods.list(&ListParams::default()).await?;
            let running = list.items.iter().filter(|p| {
                p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node_name.as_str())
                    && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            });
            Ok((running.count() == 2).then_some(()))
        },
    )
    .await
}

async fn deployment_manifests_are_accepted(ctx: TestContext) -> Result<()> {
    let config = runtimekit_e2e::tools::repo_root().join("config");
    let config = config.to_string_lossy();
    let rendered = ctx.kubectl_ok(&["kustomize", &config], None)?;
    ensure!(
        rendered.contains("kind: Deployment") && rendered.contains("kind: RuntimeClass"),
        "kustomize output:\n{rendered}"
    );
    // A server-side dry run validates every object against the real API, CRDs included; the
    // namespaced objects need their namespace to exist.
    ctx.kubectl_ok(&["apply", "-f", "-"], Some(r#"{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "runtimekit-system"}}"#))?;
    let applied = ctx.kubectl_ok(
        &[
            "apply",
            "--server-side",
            "--dry-run=server",
            "--namespace=runtimekit-system",
            "-k",
            &config,
        ],
        None,
    )?;
    ensure!(
        applied.contains("deployment.apps/runtimekit-operator serverside-applied (server dry run)"),
        "dry run:\n{applied}"
    );
    Ok(())
}
