//! `kubectl gpu` (the `kubectl-gpu` binary) against the real apiserver and operator: a node of
//! eight H800 cards (two in MIG mode) under a leaf switch and a network pod, a time-division pod,
//! a MIG pod and a pod that cannot be placed; `nodes`, `pods` and `explain` say what the ledger
//! holds, in tables, JSON and YAML, and honour `--context`.

use crate::operator::{Operator, bound, create_pod, finish, gpu_node, gpu_pod, h800_node};
use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use runtimekit_e2e::harness::Test;
use runtimekit_e2e::workspace_binary::workspace_binary;
use runtimekit_e2e::{TestContext, tests};
use serde_json::json;
use std::path::Path;
use std::time::Duration;

pub const TESTS: &[Test] = tests![kubectl_gpu_tells_nodes_pods_and_why];

/// Runs `kubectl-gpu` with `args` as the cluster's administrator: its output, or its error.
pub(crate) fn plugin(binary: &Path, kubeconfig: &Path, args: &[&str]) -> Result<String> {
    let output = std::process::Command::new(binary)
        .env("KUBECONFIG", kubeconfig)
        .args(args)
        .output()?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    ensure!(
        output.status.success(),
        "kubectl-gpu {args:?}: {}{stdout}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(stdout)
}

async fn kubectl_gpu_tells_nodes_pods_and_why(ctx: TestContext) -> Result<()> {
    let binary = workspace_binary("runtimekit-kubectl-gpu", "kubectl-gpu")?;
    let kubeconfig = ctx.kubeconfig_for("plugin-admin", &["system:masters"])?;
    let labels = [
        ("runtimekit.aliyun.com/leaf-switch", "leaf-9"),
        ("runtimekit.aliyun.com/network-pod", "np-9"),
    ];
    let node = gpu_node(&ctx, "plugin", h800_node(), vec![], &labels).await?;
    let operator = Operator::start(&ctx, "op-plugin").await?;
    let on_node = |name: &str, limits: serde_json::Value| {
        let mut pod = gpu_pod(name, limits);
        pod["spec"]["nodeSelector"] = json!({"kubernetes.io/hostname": node});
        pod
    };
    create_pod(
        &ctx,
        on_node(
            "infer",
            json!({"aliyun.com/gpu-core": "30", "aliyun.com/gpu-memory": "4"}),
        ),
    )
    .await?;
    create_pod(
        &ctx,
        on_node("sliced", json!({"aliyun.com/gpu-slice": "3"})),
    )
    .await?;
    let mut stuck = gpu_pod("stuck", json!({"aliyun.com/gpu": "1"}));
    stuck["spec"]["nodeSelector"] = json!({"pool": "nowhere"});
    create_pod(&ctx, stuck).await?;
    bound(&ctx, "infer").await?;
    bound(&ctx, "sliced").await?;
    ctx.wait_for(
        "the stuck pod reported",
        Duration::from_secs(30),
        || async {
            let pod = ctx.api::<Pod>().get("stuck").await?;
            let conditions = pod.status.and_then(|s| s.conditions).unwrap_or_default();
            Ok(conditions
                .iter()
                .any(|c| c.type_ == "PodScheduled" && c.status == "False")
                .then_some(()))
        },
    )
    .await?;
    let ns = ctx.namespace.as_str();
    let run = |args: &[&str]| plugin(&binary, &kubeconfig, args);

    // nodes: the TDM card with 70 % left, the MIG card with its instance, the position; the
    // operator builds the network tiers from the node's labels, so wait for them.
    let nodes = ctx
        .wait_for("the node's position", Duration::from_secs(30), || async {
            let text = run(&["nodes"])?;
            Ok(text
                .contains("networkpod-np-9/leafswitch-leaf-9")
                .then_some(text))
        })
        .await?;
    // The widest tier has no parent: its cell is empty, not the placeholder of a stored null.
    let widest = ctx.kubectl_ok(&["get", "topologygroup", "networkpod-np-9"], None)?;
    ensure!(
        widest.contains("NetworkPod") && !widest.contains("<no value>"),
        "{widest}"
    );
    let ours: Vec<&str> = nodes.lines().filter(|l| l.starts_with(&node)).collect();
    ensure!(ours.len() == 8, "eight cards of {node}:\n{nodes}");
    ensure!(
        ours.iter()
            .any(|l| l.contains(" TDM ") && l.contains(" 70% ") && l.contains(" 76Gi ")),
        "the shared card:\n{nodes}"
    );
    ensure!(
        ours.iter()
            .any(|l| l.contains(" MIG ") && l.contains("3g.40gb@")),
        "the MIG card's instance:\n{nodes}"
    );
    ensure!(
        nodes.lines().next().is_some_and(|h| h.starts_with("NODE ")),
        "{nodes}"
    );
    let wide = run(&["nodes", "-o", "wide"])?;
    ensure!(wide.contains(&format!("{ns}/infer")), "{wide}");

    // pods: one row per slice, in the namespace.
    let pods = run(&["pods", "-n", ns])?;
    ensure!(
        pods.lines()
            .any(|l| l.contains("infer") && l.contains("30% 4Gi")),
        "{pods}"
    );
    ensure!(
        pods.lines()
            .any(|l| l.contains("sliced") && l.contains("3g.40gb@")),
        "{pods}"
    );
    let json: serde_json::Value = serde_json::from_str(&run(&["pods", "-n", ns, "-o", "json"])?)?;
    let rows = json.as_array().context("a JSON list")?;
    ensure!(rows.len() == 2, "{json}");
    let all = run(&["pods", "-A"])?;
    ensure!(all.contains(ns), "{all}");

    // explain: where and why.
    let infer = run(&["explain", "infer", "-n", ns])?;
    ensure!(
        infer.contains(&format!(
            "runs on node {node}, under networkpod-np-9/leafswitch-leaf-9"
        )) && infer.contains("a time-division share (30% 4Gi) of card"),
        "{infer}"
    );
    let stuck = run(&["explain", "stuck", "-n", ns])?;
    ensure!(
        stuck.contains("is not placed (Unschedulable)")
            && stuck.contains("The scheduler says: 0/")
            && stuck.contains("nodeSelector or affinity rules those nodes out"),
        "{stuck}"
    );
    let yaml: serde_yaml::Value =
        serde_yaml::from_str(&run(&["explain", "stuck", "-n", ns, "-o", "yaml"])?)?;
    ensure!(yaml["verdict"] == "Pending", "{yaml:?}");

    // fit: where a pod would land, or why nowhere, and nothing is created.
    let scratch = ctx.scratch_dir()?;
    let manifest = |file: &str, pod: serde_json::Value| -> Result<String> {
        let path = scratch.join(file);
        std::fs::write(&path, serde_yaml::to_string(&pod)?)?;
        Ok(path.to_string_lossy().into_owned())
    };
    let fits = manifest(
        "fits.yaml",
        on_node(
            "fitted",
            json!({"aliyun.com/gpu-core": "50", "aliyun.com/gpu-memory": "8"}),
        ),
    )?;
    let fit = run(&["fit", "-f", &fits, "-n", ns])?;
    ensure!(
        fit.contains(&format!(
            "would land on node {node}, under networkpod-np-9/leafswitch-leaf-9"
        )) && fit.contains("as a time-division share (50% 8Gi)")
            && fit.contains("Nothing was created"),
        "{fit}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&run(&["fit", "-f", &fits, "-n", ns, "-o", "json"])?)?;
    ensure!(
        json["fits"] == true && json["node"] == node.as_str(),
        "{json}"
    );
    ensure!(
        ctx.api::<Pod>().get_opt("fitted").await?.is_none(),
        "fit created the pod"
    );
    let mut nowhere = gpu_pod("nowhere", json!({"aliyun.com/gpu": "1"}));
    nowhere["spec"]["nodeSelector"] = json!({"pool": "nowhere"});
    let nowhere = manifest("nowhere.yaml", nowhere)?;
    let fit = run(&["fit", "-f", &nowhere, "-n", ns])?;
    ensure!(
        fit.contains("would not be placed now")
            && fit.contains("The scheduler would say: 0/")
            && fit.contains("didn't match Pod's node affinity/selector"),
        "{fit}"
    );
    let broken = manifest(
        "broken.yaml",
        gpu_pod("broken", json!({"aliyun.com/gpu-core": "150"})),
    )?;
    let refused = run(&["fit", "-f", &broken, "-n", ns]);
    ensure!(
        refused
            .as_ref()
            .is_err_and(|e| e.to_string().contains("breaks the resource contract")),
        "{refused:?}"
    );

    // Real kubectl finds it as a plugin on PATH: `kubectl gpu ...`.
    let kubectl = runtimekit_e2e::tools::Tools::ensure()?.kubectl();
    let dir = binary.parent().context("the plugin's folder")?;
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs = vec![dir.to_path_buf()];
    dirs.extend(std::env::split_paths(&path));
    let through_kubectl = std::process::Command::new(kubectl)
        .env("KUBECONFIG", &kubeconfig)
        .env("PATH", std::env::join_paths(dirs)?)
        .args(["gpu", "pods", "-n", ns])
        .output()?;
    ensure!(
        through_kubectl.status.success()
            && String::from_utf8_lossy(&through_kubectl.stdout).contains("30% 4Gi"),
        "kubectl gpu pods: {}",
        String::from_utf8_lossy(&through_kubectl.stderr)
    );

    // --context is honoured: a context the kubeconfig lacks is an error, not the default.
    ensure!(
        run(&["nodes", "--context", "no-such-context"]).is_err(),
        "an unknown context must fail"
    );
    ctx.kubectl_ok(&["delete", "pod", "stuck", "--wait=false"], None)?;
    finish(&ctx, operator).await
}
