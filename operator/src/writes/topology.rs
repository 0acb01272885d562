//! The TopologyGroup controller's writes: derived groups, parents of node-tier groups, the
//! aggregate capacity of higher tiers and the agents' reporting condition.

use super::{TOPOLOGY, apply_body, log_failure};
use crate::state::TopologyPlan;
use crate::topology::DERIVED_LABEL;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use runtimekit_crds::TopologyGroup;

/// The condition this controller owns on node-tier groups (the agent owns Ready).
const REPORTING: &str = "AgentReporting";

/// Makes the API match `plan`; each failed write is logged and retried by a later plan.
pub async fn apply_plan(api: &Api<TopologyGroup>, plan: &TopologyPlan, now: Timestamp) {
    let params = PatchParams::apply(TOPOLOGY).force();
    let apply = |name: &str, fields: serde_json::Value| {
        let (name, params) = (name.to_owned(), params.clone());
        async move {
            let body = apply_body::<TopologyGroup>(fields);
            let result = api.patch(&name, &params, &Patch::Apply(&body)).await;
            log_failure("a TopologyGroup", &name, result.map(|_| ()));
        }
    };
    let apply_status = |name: &str, fields: serde_json::Value| {
        let (name, params) = (name.to_owned(), params.clone());
        async move {
            let body = apply_body::<TopologyGroup>(fields);
            let result = api.patch_status(&name, &params, &Patch::Apply(&body)).await;
            log_failure("a TopologyGroup's status", &name, result.map(|_| ()));
        }
    };
    for (name, tier, parent) in &plan.derived {
        let fields = serde_json::json!({
            "metadata": {"name": name, "labels": {DERIVED_LABEL: "true"}},
            "spec": {"tier": tier, "parent": parent},
        });
        apply(name, fields).await;
    }
    for name in &plan.obsolete {
        let result = api.delete(name, &DeleteParams::background()).await;
        log_failure("a TopologyGroup", name, result.map(|_| ()));
    }
    for (name, parent) in &plan.parents {
        apply(
            name,
            serde_json::json!({"spec": {"tier": "Node", "parent": parent}}),
        )
        .await;
    }
    for (name, nodes, capacity) in &plan.status {
        apply_status(
            name,
            serde_json::json!({"status": {"nodes": nodes, "capacity": capacity}}),
        )
        .await;
    }
    for (name, reporting) in &plan.reporting {
        let (status, reason, message) = if *reporting {
            ("True", "Heartbeating", "the node agent reports")
        } else {
            (
                "False",
                "HeartbeatStale",
                "the node agent stopped reporting; its cards are not offered",
            )
        };
        let condition = serde_json::json!({
            "type": REPORTING, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": now.to_string(),
        });
        apply_status(
            name,
            serde_json::json!({"status": {"conditions": [condition]}}),
        )
        .await;
        if !reporting {
            tracing::warn!(group = %name, "node agent stopped heartbeating; its cards are withheld");
        }
    }
}
