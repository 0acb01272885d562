//! The TopologyGroup controller: keeps the derived HyperNode, LeafSwitch and NetworkPod groups
//! in the API, sets each node-tier group's parent, writes every higher tier's aggregate capacity,
//! and marks node-tier groups whose agent stopped heartbeating (their cards are not offered).

use crate::shared::Shared;
use crate::state::TopologyPlan;
use crate::topology::DERIVED_LABEL;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use runtimekit_crds::TopologyGroup;
use std::sync::Arc;
use std::time::Duration;

/// The field manager of this controller's writes.
const FIELD_MANAGER: &str = "runtimekit-topology";
/// The condition this controller owns on node-tier groups (the agent owns Ready).
const REPORTING: &str = "AgentReporting";

/// Runs the controller until the task is dropped.
pub async fn run(shared: Arc<Shared>, client: Client) {
    let api: Api<TopologyGroup> = Api::all(client);
    let mut changes = shared.subscribe();
    loop {
        let plan = {
            let mut state = shared.lock();
            state.refresh_topology();
            state.refresh_heartbeats(Timestamp::now());
            state.topology_plan(Timestamp::now())
        };
        if plan != TopologyPlan::default() {
            apply(&api, &plan).await;
        }
        // Changes come in bursts (a node list, many heartbeats): settle before the next pass.
        tokio::time::sleep(Duration::from_secs(1)).await;
        tokio::select! {
            _ = changes.changed() => {}
            () = tokio::time::sleep(Duration::from_secs(10)) => {}
        }
    }
}

async fn apply(api: &Api<TopologyGroup>, plan: &TopologyPlan) {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    for (name, tier, parent) in &plan.derived {
        let object = serde_json::json!({
            "apiVersion": "runtimekit.aliyun.com/v1alpha1",
            "kind": "TopologyGroup",
            "metadata": {"name": name, "labels": {DERIVED_LABEL: "true"}},
            "spec": {"tier": tier, "parent": parent},
        });
        log(
            name,
            api.patch(name, &params, &Patch::Apply(&object))
                .await
                .map(|_| ()),
        );
    }
    for name in &plan.obsolete {
        log(
            name,
            api.delete(name, &DeleteParams::background())
                .await
                .map(|_| ()),
        );
    }
    for (name, parent) in &plan.parents {
        let object = serde_json::json!({"apiVersion": "runtimekit.aliyun.com/v1alpha1", "kind": "TopologyGroup", "spec": {"tier": "Node", "parent": parent}});
        log(
            name,
            api.patch(name, &params, &Patch::Apply(&object))
                .await
                .map(|_| ()),
        );
    }
    for (name, nodes, capacity) in &plan.status {
        let object = serde_json::json!({"apiVersion": "runtimekit.aliyun.com/v1alpha1", "kind": "TopologyGroup", "status": {"nodes": nodes, "capacity": capacity}});
        log(
            name,
            api.patch_status(name, &params, &Patch::Apply(&object))
                .await
                .map(|_| ()),
        );
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
        let object = serde_json::json!({"apiVersion": "runtimekit.aliyun.com/v1alpha1", "kind": "TopologyGroup", "status": {"conditions": [{
            "type": REPORTING, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": Timestamp::now().to_string(),
        }]}});
        log(
            name,
            api.patch_status(name, &params, &Patch::Apply(&object))
                .await
                .map(|_| ()),
        );
        if !reporting {
            tracing::warn!(group = %name, "node agent stopped heartbeating; its cards are withheld");
        }
    }
}

fn log(name: &str, result: Result<(), kube::Error>) {
    match result {
        Ok(()) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(error) => tracing::warn!(group = name, %error, "could not write a TopologyGroup"),
    }
}
