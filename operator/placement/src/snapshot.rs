//! A cluster built at once from listed objects, for tools that answer one question with the
//! engine (`kubectl gpu fit`), and the rules the operator's incremental feeding shares with it:
//! when an agent counts as reporting, and how cards given whole to other schedulers' pods are
//! held.

use crate::{Cluster, NodeDevices, NodeInfo, Resources, Settings, Share, SliceInput};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use runtimekit_contract::RuntimeKitConfig;
use runtimekit_crds::{CardStatus, GpuSlice, TopologyGroup};
use std::time::Duration;

/// How long a node agent may go without a heartbeat before its cards are withheld.
/// Agents heartbeat every 30 s by default, so this is three missed beats.
pub const AGENT_STALE_AFTER: Duration = Duration::from_secs(90);

/// Whether an agent whose last heartbeat is `heartbeat` still reports at `now`.
pub fn agent_fresh(heartbeat: Option<Timestamp>, now: Timestamp) -> bool {
    let stale_after = i64::try_from(AGENT_STALE_AFTER.as_secs()).unwrap_or(i64::MAX);
    heartbeat.is_some_and(|t| now.as_second().saturating_sub(t.as_second()) <= stale_after)
}

/// The engine's name for whatever holds a node's cards outside the runtimekit scheduler: one
/// holder per node, with one whole-card hold per card its agent reports held.
pub fn outside_holder(node: &str) -> String {
    format!("outside-the-scheduler:{node}")
}

/// The whole-card holds of `node`'s cards its agent reports given whole to pods of another
/// scheduler, so no decision picks them.
pub fn outside_holds(node: &str, cards: &[CardStatus]) -> Vec<SliceInput> {
    cards
        .iter()
        .filter(|c| !c.held_by.is_empty())
        .map(|card| SliceInput {
            pod_uid: outside_holder(node),
            container: "held-whole".into(),
            replica: card.index,
            node: node.to_owned(),
            card_index: card.index,
            card_uuid: card.uuid.clone(),
            share: Share::Whole,
        })
        .collect()
}

/// What a tool listed.
#[derive(Debug, Clone, Copy)]
pub struct Listed<'a> {
    pub nodes: &'a [Node],
    pub groups: &'a [TopologyGroup],
    pub slices: &'a [GpuSlice],
    pub pods: &'a [Pod],
}

/// The cluster `listed` describes at `now`, as the operator would hold it, and a line for each
/// object that could not be read (and is left out).
pub fn cluster_from(
    config: &RuntimeKitConfig,
    listed: Listed,
    now: Timestamp,
) -> (Cluster, Vec<String>) {
    let names = config.names();
    let mut cluster = Cluster::new(Settings::new(config));
    let mut skipped = Vec::new();
    for node in listed.nodes {
        match NodeInfo::from_node(node, &names, &config.topology_labels) {
            Ok(info) => cluster.upsert_node(info),
            Err(error) => skipped.push(error.to_string()),
        }
    }
    for group in listed.groups {
        let Some(devices) = NodeDevices::from_topology_group(group) else {
            continue;
        };
        let status = group.status.clone().unwrap_or_default();
        cluster.set_devices(&devices.node, &devices.cards, &devices.nics);
        for hold in outside_holds(&devices.node, &status.cards) {
            cluster.upsert_slice(hold);
        }
        let heartbeat = status.heartbeat_time.map(|t| t.0);
        cluster.set_agent_reporting(&devices.node, agent_fresh(heartbeat, now));
    }
    for slice in listed.slices {
        match SliceInput::from_gpu_slice(slice) {
            Ok(Some(input)) => cluster.upsert_slice(input),
            Ok(None) => {}
            Err(error) => skipped.push(error.to_string()),
        }
    }
    for pod in listed.pods {
        let ended = pod
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|p| p == "Succeeded" || p == "Failed");
        let (Some(uid), Some(node)) = (
            pod.metadata.uid.as_deref(),
            pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        ) else {
            continue;
        };
        if ended {
            continue;
        }
        match Resources::from_pod(pod, &names) {
            Ok(resources) => cluster.upsert_pod_usage(uid, node, &resources),
            Err(error) => skipped.push(error.to_string()),
        }
    }
    (cluster, skipped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PodInput;
    use runtimekit_contract::parse_pod;
    use serde_json::json;

    fn objects(heartbeat: Timestamp) -> (Vec<Node>, Vec<TopologyGroup>, Vec<Pod>) {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "n1", "labels": {"lj_runtimekit_enable": "true"}},
            "status": {"allocatable": {"cpu": "8", "memory": "64Gi", "pods": "110"},
                "conditions": [{"type": "Ready", "status": "True"}]}}))
        .expect("node");
        let card = |index: u32, held: bool| {
            json!({"index": index, "uuid": format!("GPU-{index}"), "vendor": "Nvidia",
                "model": "NVIDIA H800", "memoryMib": 81920, "health": "Healthy",
                "heldBy": if held { json!(["other/web"]) } else { json!([]) }})
        };
        let group: TopologyGroup = serde_json::from_value(json!({
            "apiVersion": "runtimekit.aliyun.com/v1alpha1", "kind": "TopologyGroup",
            "metadata": {"name": "n1"}, "spec": {"tier": "Node", "nodeName": "n1"},
            "status": {"cards": [card(0, true), card(1, false)],
                "heartbeatTime": heartbeat.to_string()}}))
        .expect("group");
        let running: Pod = serde_json::from_value(json!({
            "metadata": {"name": "busy", "namespace": "ml", "uid": "u-busy"},
            "spec": {"nodeName": "n1", "containers": [{"name": "c",
                "resources": {"requests": {"cpu": "7"}}}]}}))
        .expect("pod");
        (vec![node], vec![group], vec![running])
    }

    fn pod(cpu: &str) -> PodInput {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ml", "uid": "u-p"},
            "spec": {"schedulerName": "lj-runtimekit-scheduler", "runtimeClassName": "lj-runtime",
                "containers": [{"name": "app", "resources": {
                    "requests": {"cpu": cpu},
                    "limits": {"aliyun.com/gpu": "1"}}}]}}))
        .expect("pod");
        let config = RuntimeKitConfig::default();
        let request = parse_pod(&pod, &config).expect("contract");
        PodInput::from_pod(&pod, &request, &config.names()).expect("input")
    }

    #[test]
    fn the_listed_cluster_holds_what_the_operator_would() {
        let now = Timestamp::now();
        let (nodes, groups, pods) = objects(now);
        let listed = Listed {
            nodes: &nodes,
            groups: &groups,
            slices: &[],
            pods: &pods,
        };
        let (cluster, skipped) = cluster_from(&RuntimeKitConfig::default(), listed, now);
        assert!(skipped.is_empty(), "{skipped:?}");
        // Card 0 is held by another scheduler's pod: only card 1 is offered.
        let decision = cluster.decide(&pod("500m")).expect("fits");
        assert_eq!(decision.containers[0].cards[0].index, 1);
        // The bound pod's CPU counts.
        let full = cluster.decide(&pod("2")).expect_err("no CPU left");
        assert!(full.to_string().contains("Insufficient cpu"), "{full}");
    }

    #[test]
    fn a_stale_heartbeat_withholds_the_nodes_cards() {
        let now = Timestamp::now();
        let stale = now - Duration::from_secs(AGENT_STALE_AFTER.as_secs() + 5);
        let (nodes, groups, pods) = objects(stale);
        let listed = Listed {
            nodes: &nodes,
            groups: &groups,
            slices: &[],
            pods: &pods,
        };
        let (cluster, _) = cluster_from(&RuntimeKitConfig::default(), listed, now);
        let refused = cluster.decide(&pod("500m")).expect_err("withheld");
        assert!(
            refused.to_string().contains("no node agent reporting"),
            "{refused}"
        );
        assert!(!agent_fresh(None, now));
    }
}
