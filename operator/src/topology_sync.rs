//! The TopologyGroup controller: keeps the derived HyperNode, LeafSwitch and NetworkPod groups
//! in the API, sets each node-tier group's parent, writes every higher tier's aggregate capacity,
//! marks node-tier groups whose agent stopped heartbeating (their cards are not offered), and
//! keeps the optional health taint on the Nodes of faulted cards.

use crate::shared::Shared;
use crate::state::TopologyPlan;
use crate::writes::taints::set_health_taint;
use crate::writes::topology::apply_plan;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::Api;
use runtimekit_crds::TopologyGroup;
use std::sync::Arc;
use std::time::Duration;

/// Runs the controller until the task is dropped.
pub async fn run(shared: Arc<Shared>, client: Client) {
    let nodes: Api<Node> = Api::all(client.clone());
    let api: Api<TopologyGroup> = Api::all(client);
    let mut changes = shared.subscribe();
    loop {
        let now = Timestamp::now();
        let (plan, taints, taint_key) = {
            let mut state = shared.lock();
            state.refresh_topology();
            state.refresh_heartbeats(now);
            let taint_key = state.health_taint_key().to_owned();
            (
                state.topology_plan(now),
                state.health_taint_changes(),
                taint_key,
            )
        };
        if plan != TopologyPlan::default() {
            apply_plan(&api, &plan, now).await;
        }
        for change in &taints {
            set_health_taint(&nodes, &taint_key, change).await;
        }
        // Changes come in bursts (a node list, many heartbeats): settle before the next pass.
        tokio::time::sleep(Duration::from_secs(1)).await;
        tokio::select! {
            _ = changes.changed() => {}
            () = tokio::time::sleep(Duration::from_secs(10)) => {}
        }
    }
}
