//! Trust boundaries, tried as an attacker would: a user with the standard `edit` ClusterRole
//! tries to forge, change and remove the allocation annotation a restarted operator accounts
//! cards from, and to bind a pod with one; the operator tries to delete a pod outside any gang,
//! and may not write a slice's status.
//! The admission policies are the files users apply (`config/operator/admission-policy.yaml`).

use crate::operator::{OPERATOR_USER, bound, gpu_node, gpu_pod, h800_node, with_operator};
use anyhow::{Result, ensure};
use runtimekit_e2e::harness::Test;
use runtimekit_e2e::{TestContext, tests};
use serde_json::json;
use std::time::Duration;

pub const TESTS: &[Test] = tests![
    forged_allocations_are_refused,
    the_operator_deletes_only_gang_members,
    a_slices_status_is_its_node_agents_not_the_operators,
];

const MALLORY: &str = "mallory";
const ANNOTATION: &str = "aliyun.com/allocation";

/// Runs kubectl as `user` (the test's admin impersonates it) and returns its error output,
/// failing if the command succeeded.
fn refused(ctx: &TestContext, user: &str, args: &[&str], stdin: Option<&str>) -> Result<String> {
    let mut all = vec!["--as", user];
    all.extend_from_slice(args);
    let output = ctx.kubectl(&all, stdin)?;
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    ensure!(
        !output.status.success(),
        "kubectl {} as {user} was allowed",
        args.join(" ")
    );
    Ok(stderr)
}

/// Waits until RBAC lets `user` `verb` `resource` in the test's namespace (a new RoleBinding,
/// or the aggregated `edit` role, takes a moment to count).
async fn can(ctx: &TestContext, user: &str, verb: &str, resource: &str) -> Result<()> {
    ctx.wait_for(
        &format!("{user} to be allowed to {verb} {resource}"),
        Duration::from_secs(20),
        || async {
            let output = ctx.kubectl(&["auth", "can-i", verb, resource, "--as", user], None)?;
            Ok(output.status.success().then_some(()))
        },
    )
    .await
}

/// Waits until the apiserver enforces the policies (they load a moment after being applied),
/// probing with a server-side dry run that changes nothing.
async fn policies_enforced(ctx: &TestContext, probe: &serde_json::Value) -> Result<()> {
    let text = probe.to_string();
    ctx.wait_for(
        "the admission policies to be enforced",
        Duration::from_secs(20),
        || async {
            let output = ctx.kubectl(&["create", "--dry-run=server", "-f", "-"], Some(&text))?;
            Ok((!output.status.success()).then_some(()))
        },
    )
    .await
}

fn forged_pod(name: &str) -> serde_json::Value {
    let mut pod = gpu_pod(name, json!({"nvidia.com/gpu": "1"}));
    pod["metadata"]["annotations"] = json!({ANNOTATION: r#"{"node":"n1","containers":[]}"#});
    pod
}

async fn forged_allocations_are_refused(ctx: TestContext) -> Result<()> {
    with_operator(ctx, |ctx| async move {
        gpu_node(&ctx, "h800", h800_node(), vec![], &[]).await?;
        ctx.kubectl_ok(
            &[
                "create",
                "rolebinding",
                "mallory-edit",
                "--clusterrole=edit",
                "--user",
                MALLORY,
            ],
            None,
        )?;
        can(&ctx, MALLORY, "create", "pods").await?;
        policies_enforced(&ctx, &forged_pod("probe")).await?;

        // Created with a forged allocation: refused, also for a pod of another scheduler.
        let error = refused(
            &ctx,
            MALLORY,
            &["create", "-f", "-"],
            Some(&forged_pod("forged").to_string()),
        )?;
        ensure!(
            error.contains("aliyun.com/allocation is written only by the runtimekit scheduler"),
            "{error}"
        );

        // A pod the scheduler bound: its allocation cannot be changed or removed.
        ctx.kubectl_ok(
            &["--as", MALLORY, "create", "-f", "-"],
            Some(&gpu_pod("honest", json!({"nvidia.com/gpu": "1"})).to_string()),
        )?;
        let (pod, _) = bound(&ctx, "honest").await?;
        let recorded = pod.metadata.annotations.clone().unwrap_or_default();
        let error = refused(
            &ctx,
            MALLORY,
            &[
                "annotate",
                "pod",
                "honest",
                "--overwrite",
                &format!("{ANNOTATION}={{}}"),
            ],
            None,
        )?;
        ensure!(error.contains("it cannot be changed"), "{error}");
        let error = refused(
            &ctx,
            MALLORY,
            &["annotate", "pod", "honest", &format!("{ANNOTATION}-")],
            None,
        )?;
        ensure!(error.contains("it cannot be removed"), "{error}");
        let error = refused(
            &ctx,
            MALLORY,
            &[
                "patch",
                "pod",
                "honest",
                "--subresource=status",
                "--type=merge",
                "-p",
                &json!({"metadata": {"annotations": {ANNOTATION: null}}}).to_string(),
            ],
            None,
        )?;
        ensure!(
            error.contains("it cannot be removed") || error.contains("forbidden"),
            "{error}"
        );
        let after = ctx
            .api::<k8s_openapi::api::core::v1::Pod>()
            .get("honest")
            .await?;
        ensure!(
            after
                .metadata
                .annotations
                .unwrap_or_default()
                .get(ANNOTATION)
                == recorded.get(ANNOTATION),
            "the allocation is as the scheduler wrote it"
        );

        // A pod no scheduler bound yet: an allocation cannot be added.
        let mut waiting = gpu_pod("waiting", json!({"nvidia.com/gpu": "1"}));
        waiting["spec"]["schedulerName"] = json!("nobody");
        ctx.kubectl_ok(
            &["--as", MALLORY, "create", "-f", "-"],
            Some(&waiting.to_string()),
        )?;
        let error = refused(
            &ctx,
            MALLORY,
            &["annotate", "pod", "waiting", &format!("{ANNOTATION}={{}}")],
            None,
        )?;
        ensure!(error.contains("it cannot be added"), "{error}");

        // Even a user allowed to bind may not bind with an allocation.
        ctx.kubectl_ok(
            &[
                "create",
                "role",
                "binder",
                "--verb=create",
                "--resource=pods/binding",
            ],
            None,
        )?;
        ctx.kubectl_ok(
            &[
                "create",
                "rolebinding",
                "mallory-binder",
                "--role=binder",
                "--user",
                MALLORY,
            ],
            None,
        )?;
        let binding = json!({"apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": "waiting", "annotations": {ANNOTATION: "{}"}},
            "target": {"kind": "Node", "name": "anywhere"}});
        let path = format!("/api/v1/namespaces/{}/pods/waiting/binding", ctx.namespace);
        let error = ctx
            .wait_for(
                "the binding to be refused",
                Duration::from_secs(10),
                || async {
                    let output = ctx.kubectl(
                        &["--as", MALLORY, "create", "--raw", &path, "-f", "-"],
                        Some(&binding.to_string()),
                    )?;
                    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
                    ensure!(!output.status.success(), "the binding was allowed");
                    // RBAC may take a moment to grant pods/binding; only the policy's refusal counts.
                    Ok(stderr
                        .contains("only the runtimekit scheduler binds")
                        .then_some(stderr))
                },
            )
            .await?;
        ensure!(error.contains(&format!("{MALLORY} may not")), "{error}");
        Ok(())
    })
    .await
}

async fn the_operator_deletes_only_gang_members(ctx: TestContext) -> Result<()> {
    with_operator(ctx, |ctx| async move {
        let mut pod = gpu_pod("bystander", json!({"nvidia.com/gpu": "1"}));
        pod["spec"]["schedulerName"] = json!("nobody");
        ctx.kubectl_ok(&["create", "-f", "-"], Some(&pod.to_string()))?;
        let error = ctx
            .wait_for(
                "the delete to be refused",
                Duration::from_secs(20),
                || async {
                    let output = ctx.kubectl(
                        &[
                            "--as",
                            OPERATOR_USER,
                            "delete",
                            "pod",
                            "bystander",
                            "--dry-run=server",
                        ],
                        None,
                    )?;
                    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
                    Ok((!output.status.success()).then_some(stderr))
                },
            )
            .await?;
        ensure!(
            error.contains("deletes only members of a gang that opted in"),
            "{error}"
        );
        ctx.kubectl_ok(&["get", "pod", "bystander"], None)?;
        Ok(())
    })
    .await
}

/// The operator creates and deletes slices but writes no slice status: that is the node agent's
/// (phases, the instance it made), so the operator's role does not reach it.
async fn a_slices_status_is_its_node_agents_not_the_operators(ctx: TestContext) -> Result<()> {
    with_operator(ctx, |ctx| async move {
        let may_patch_status = |resource: &str| -> Result<bool> {
            let args = [
                "auth",
                "can-i",
                "patch",
                resource,
                "--subresource=status",
                "--as",
                OPERATOR_USER,
            ];
            Ok(ctx.kubectl(&args, None)?.status.success())
        };
        // Its own objects' status it writes (which also shows its role counts by now).
        ctx.wait_for(
            "the operator to be allowed to write a GangGroup's status",
            Duration::from_secs(20),
            || async { Ok(may_patch_status("ganggroups.runtimekit.aliyun.com")?.then_some(())) },
        )
        .await?;
        ensure!(
            !may_patch_status("gpuslices.runtimekit.aliyun.com")?,
            "the operator may write a slice's status"
        );
        Ok(())
    })
    .await
}
