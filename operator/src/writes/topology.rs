//! The TopologyGroup controller's writes: derived groups, parents of node-tier groups, the
//! aggregate capacity of higher tiers and the agents' reporting condition.

use super::{TOPOLOGY, apply_body, log_failure};
use crate::state::TopologyPlan;
use crate::topology::DERIVED_LABEL;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use runtimekit_crds::{Tier, TopologyGroup};

/// The condition this controller owns on node-tier groups (the agent owns Ready).
const REPORTING: &str = "AgentReporting";

/// A group's spec as applied: with no parent, the field is left out (not `null`), so
/// server-side apply drops one this manager set before and kubectl shows the cell empty.
fn spec(tier: &impl serde::Serialize, parent: Option<&str>) -> serde_json::Value {
    let mut spec = serde_json::json!({ "tier": tier });
    if let Some(parent) = parent {
        spec["parent"] = parent.into();
    }
    spec
}

/// Makes the API match `plan`; each failed write is logged and retried by a later plan.
pub async fn apply_plan(api: &Api<TopologyGroup>, plan: &TopologyPlan, now: Timestamp) {
    for (name, tier, parent) in &plan.derived {
        let fields = serde_json::json!({
            "metadata": {"name": name, "labels": {DERIVED_LABEL: "true"}},
            "spec": spec(tier, parent.as_deref()),
        });
        write(api, name, fields, Part::Object).await;
    }
    for name in &plan.obsolete {
        let result = api.delete(name, &DeleteParams::background()).await;
        log_failure("a TopologyGroup", name, result.map(|_| ()));
    }
    for (name, parent) in &plan.parents {
        write(
            api,
            name,
            serde_json::json!({"spec": spec(&Tier::Node, parent.as_deref())}),
            Part::Object,
        )
        .await;
    }
    for (name, nodes, capacity) in &plan.status {
        write(
            api,
            name,
            serde_json::json!({"status": {"nodes": nodes, "capacity": capacity}}),
            Part::Status,
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
        write(
            api,
            name,
            serde_json::json!({"status": {"conditions": [condition]}}),
            Part::Status,
        )
        .await;
        if !reporting {
            tracing::warn!(group = %name, "node agent stopped heartbeating; its cards are withheld");
        }
    }
}

/// Which part of a TopologyGroup a write applies to.
#[derive(Debug, Clone, Copy)]
enum Part {
    /// Its metadata and spec.
    Object,
    /// Its status subresource.
    Status,
}

/// Applies `fields` to the group `name`; a failure is logged and retried by a later plan.
async fn write(api: &Api<TopologyGroup>, name: &str, fields: serde_json::Value, part: Part) {
    let params = PatchParams::apply(TOPOLOGY).force();
    let body = Patch::Apply(apply_body::<TopologyGroup>(fields));
    let result = match part {
        Part::Object => api.patch(name, &params, &body).await,
        Part::Status => api.patch_status(name, &params, &body).await,
    };
    log_failure("a TopologyGroup", name, result.map(|_| ()));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_without_parent_applies_no_parent_field() {
        assert_eq!(
            spec(&Tier::NetworkPod, None),
            serde_json::json!({"tier": "NetworkPod"})
        );
        assert_eq!(
            spec(&Tier::Node, Some("hypernode-a")),
            serde_json::json!({"tier": "Node", "parent": "hypernode-a"})
        );
    }
}
