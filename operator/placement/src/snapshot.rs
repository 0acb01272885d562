//! A cluster built at once from listed objects, for tools that answer one question with the
//! engine (`kubectl gpu fit`), and the rules the operator's incremental feeding shares with it:
//! when an agent counts as reporting, and how cards given whole to other schedulers' pods are
//! held.

use crate::{Cluster, NodeDevices, NodeInfo, Resources, Settings, Share, SliceInput};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use runtimekit_contract::RuntimeKitConfig;
use runtimekit_crds::{
    CONDITION_RUNTIME_READY, CardStatus, GpuSlice, TopologyGroup, TopologyGroupStatus,
};
use std::time::Duration;

/// How often an agent that does not say is taken to heartbeat: the agent's default.
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(30);

/// How many heartbeats an agent may miss before its node's cards are withheld.
pub const MISSED_HEARTBEATS: u32 = 3;

/// A node agent's last heartbeat and the interval it promises to beat at, from its
/// TopologyGroup's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heartbeat {
    /// When it last beat.
    pub at: Option<Timestamp>,
    /// How often it beats.
    pub every: Duration,
}

/// Whether the node runs the `lj-runtime` handler: no `RuntimeReady` condition that is
/// `False` (agents without the node installer, and older ones, report none).
pub fn runtime_ready(status: &TopologyGroupStatus) -> bool {
    !status
        .conditions
        .iter()
        .any(|c| c.type_ == CONDITION_RUNTIME_READY && c.status == "False")
}

impl Heartbeat {
    /// The heartbeat a node-tier group's status reports.
    pub fn of(status: &TopologyGroupStatus) -> Self {
        Self {
            at: status.heartbeat_time.as_ref().map(|t| t.0),
            every: status
                .heartbeat_interval_seconds
                .map_or(DEFAULT_HEARTBEAT_INTERVAL, |s| {
                    Duration::from_secs(u64::from(s))
                }),
        }
    }

    /// How long the agent may go without a beat: three of its intervals, so one late beat on a
    /// loaded apiserver does not withhold a node, whatever interval the agent runs with.
    pub fn stale_after(&self) -> Duration {
        self.every.saturating_mul(MISSED_HEARTBEATS)
    }

    /// Whether the agent still counts as reporting at `now`.
    pub fn fresh(&self, now: Timestamp) -> bool {
        let stale_after = i64::try_from(self.stale_after().as_secs()).unwrap_or(i64::MAX);
        self.at
            .is_some_and(|t| now.as_second().saturating_sub(t.as_second()) <= stale_after)
    }
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
        cluster.set_agent_reporting(
            &devices.node,
            Heartbeat::of(&status).fresh(now) && runtime_ready(&status),
        );
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
    use serde_json::{Value, json};

    /// A node, its group and a pod bound to it; `heartbeat` is the status's heartbeat fields.
    fn objects(heartbeat: Value) -> (Vec<Node>, Vec<TopologyGroup>, Vec<Pod>) {
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
        let mut status = heartbeat;
        status["cards"] = json!([card(0, true), card(1, false)]);
        let group: TopologyGroup = serde_json::from_value(json!({
            "apiVersion": "runtimekit.aliyun.com/v1alpha1", "kind": "TopologyGroup",
            "metadata": {"name": "n1"}, "spec": {"tier": "Node", "nodeName": "n1"},
            "status": status}))
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
        let (nodes, groups, pods) = objects(json!({"heartbeatTime": now.to_string()}));
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

    /// Whether the node's cards are offered at `now` with these heartbeat fields.
    fn offered(heartbeat: Value, now: Timestamp) -> bool {
        let (nodes, groups, pods) = objects(heartbeat);
        let listed = Listed {
            nodes: &nodes,
            groups: &groups,
            slices: &[],
            pods: &pods,
        };
        let (cluster, _) = cluster_from(&RuntimeKitConfig::default(), listed, now);
        match cluster.decide(&pod("500m")) {
            Ok(_) => true,
            Err(refused) => {
                assert!(
                    refused.to_string().contains("no node agent offering cards"),
                    "{refused}"
                );
                false
            }
        }
    }

    #[test]
    fn a_stale_heartbeat_withholds_the_nodes_cards() {
        let now = Timestamp::now();
        let ago = |seconds: u64| (now - Duration::from_secs(seconds)).to_string();
        // An agent that does not say beats every 30 s: three missed beats withhold its cards.
        assert!(offered(json!({"heartbeatTime": ago(90)}), now));
        assert!(!offered(json!({"heartbeatTime": ago(95)}), now));
        // One that beats every 60 s may go 180 s; one that beats every 10 s only 30 s.
        let every = |at: String, seconds: u32| json!({"heartbeatTime": at, "heartbeatIntervalSeconds": seconds});
        assert!(offered(every(ago(150), 60), now));
        assert!(!offered(every(ago(185), 60), now));
        assert!(!offered(every(ago(35), 10), now));
        // No heartbeat at all: never offered.
        assert!(!offered(json!({}), now));
    }
}
