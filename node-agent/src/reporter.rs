//! What the agent writes about its node: the node-tier TopologyGroup (created once, its status
//! kept true, with a heartbeat), Events on the Node when a card turns unhealthy or healthy, and
//! the node-level extended resources of MiB mode in the Node's status. Each write site has its
//! own field manager, and a write happens only when something changed (or the heartbeat is due).

use crate::health::Transition;
use crate::model::NodeState;
use crate::node_watch::Facts;
use crate::resources::node_level;
use crate::topology;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder};
use runtimekit_contract::RuntimeKitConfig;
use runtimekit_crds::{TopologyGroup, TopologyGroupStatus};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// The field manager of the TopologyGroup (spec at creation, and status).
pub const TOPOLOGY_MANAGER: &str = "runtimekit-node-agent-topology";
/// The field manager of the Node's status (node-level extended resources).
pub const NODE_STATUS_MANAGER: &str = "runtimekit-node-agent-resources";
/// How often the node-level resources are written even when unchanged.
const NODE_RESOURCES_REFRESH: Duration = Duration::from_secs(600);

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// The status without the heartbeat and the condition's times, to tell a change from a beat.
fn comparable(status: &TopologyGroupStatus) -> TopologyGroupStatus {
    let mut status = status.clone();
    status.heartbeat_time = None;
    for condition in &mut status.conditions {
        condition.last_transition_time = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
    }
    status
}

/// Keeps the node's TopologyGroup and Node status true.
pub struct Reporter {
    /// The agent's client.
    pub client: Client,
    /// This node.
    pub node: String,
    /// The shared configuration (resource names, memory unit).
    pub config: RuntimeKitConfig,
    /// What the agent knows.
    pub state: watch::Receiver<NodeState>,
    /// Cards turning unhealthy or healthy.
    pub transitions: mpsc::Receiver<Transition>,
    /// Events on the Node.
    pub recorder: Recorder,
    /// How often the heartbeat is written.
    pub heartbeat: Duration,
    /// The Node as last seen: a kubelet that drops a resource name from its status (a restart,
    /// or a device plugin of the same name expiring) has the node-level resources written again.
    pub node_facts: Facts,
}

/// Whether the Node's `capacity` lacks or differs from the node-level `resources`.
pub fn node_level_lost(
    resources: &BTreeMap<String, u64>,
    capacity: &BTreeMap<String, String>,
) -> bool {
    resources
        .iter()
        .any(|(name, value)| capacity.get(name) != Some(&value.to_string()))
}

impl std::fmt::Debug for Reporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reporter")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl Reporter {
    /// Writes until the task is dropped.
    pub async fn run(mut self) {
        let groups: Api<TopologyGroup> = Api::all(self.client.clone());
        let nodes: Api<Node> = Api::all(self.client.clone());
        let mut created = false;
        let mut written: Option<TopologyGroupStatus> = None;
        let mut generation = None;
        let mut beat = tokio::time::Instant::now();
        let mut node_level_written: Option<BTreeMap<String, u64>> = None;
        let mut node_resources_at = tokio::time::Instant::now();
        let mut node_ref: Option<ObjectReference> = None;
        loop {
            let state = self.state.borrow_and_update().clone();
            if !created {
                match self.create(&groups, &nodes).await {
                    Ok(g) => {
                        created = true;
                        generation = g;
                    }
                    Err(error) => tracing::warn!(%error, "cannot create the node's TopologyGroup"),
                }
            }
            let due = tokio::time::Instant::now() >= beat;
            if created {
                let heartbeat = match (&written, due) {
                    (Some(w), false) => w.heartbeat_time.clone().unwrap_or_else(now),
                    _ => now(),
                };
                let beat_now = (heartbeat, self.heartbeat);
                let status = topology::status(&state, written.as_ref(), beat_now, generation);
                let changed = written.as_ref().map(comparable) != Some(comparable(&status));
                if changed || due {
                    // A beat with nothing else new is a small merge patch of the one field,
                    // much cheaper for the apiserver than applying the whole status again.
                    let write = if changed {
                        self.write_status(&groups, &status).await
                    } else {
                        self.write_heartbeat(&groups, &status).await
                    };
                    match write {
                        Ok(()) => {
                            written = Some(status);
                            if due {
                                beat = tokio::time::Instant::now() + self.heartbeat;
                            }
                        }
                        Err(kube::Error::Api(e)) if e.code == 404 => {
                            tracing::warn!("the node's TopologyGroup is gone; creating it again");
                            created = false;
                            written = None;
                        }
                        Err(error) => {
                            tracing::warn!(%error, "cannot write the node's TopologyGroup status");
                            beat = tokio::time::Instant::now() + Duration::from_secs(2);
                        }
                    }
                }
            }
            let resources = node_level(&self.config, &state);
            // Rewritten when the Node lost them, and now and then even unchanged.
            let refresh = node_resources_at.elapsed() > NODE_RESOURCES_REFRESH;
            let lost = self
                .node_facts
                .borrow_and_update()
                .as_ref()
                .is_some_and(|node| node_level_lost(&resources, &node.capacity));
            if refresh || lost || node_level_written.as_ref() != Some(&resources) {
                match self.write_node_resources(&nodes, &resources).await {
                    Ok(()) => {
                        node_level_written = Some(resources);
                        node_resources_at = tokio::time::Instant::now();
                    }
                    Err(error) => tracing::warn!(%error, "cannot write the node's resources"),
                }
            }
            let retry = if created {
                self.heartbeat
            } else {
                Duration::from_secs(2)
            };
            let wake = beat.min(tokio::time::Instant::now() + retry);
            tokio::select! {
                changed = self.state.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    // Let a burst of changes land before writing.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                seen = self.node_facts.changed() => {
                    if seen.is_err() {
                        return;
                    }
                }
                transition = self.transitions.recv() => {
                    let Some(transition) = transition else { return };
                    self.node_event(&nodes, &mut node_ref, &transition).await;
                    self.pod_events(&transition).await;
                }
                () = tokio::time::sleep_until(wake) => {}
            }
        }
    }

    /// Creates the TopologyGroup (tier Node, named after the node) with server-side apply, so
    /// fields the operator sets (its parent) are left alone; returns its generation. The Node
    /// owns it, so deleting the node deletes its group (the garbage collector does, even with no
    /// agent or operator running).
    async fn create(
        &self,
        groups: &Api<TopologyGroup>,
        nodes: &Api<Node>,
    ) -> Result<Option<i64>, kube::Error> {
        let node = nodes.get(&self.node).await?;
        let group = serde_json::json!({
            "apiVersion": "runtimekit.aliyun.com/v1alpha1",
            "kind": "TopologyGroup",
            "metadata": {
                "name": self.node,
                "ownerReferences": [{
                    "apiVersion": "v1", "kind": "Node", "name": self.node,
                    "uid": node.metadata.uid.unwrap_or_default(),
                }],
            },
            "spec": {"tier": "Node", "nodeName": self.node},
        });
        let applied = groups
            .patch(
                &self.node,
                &PatchParams::apply(TOPOLOGY_MANAGER),
                &Patch::Apply(&group),
            )
            .await?;
        tracing::info!(group = %self.node, "the node's TopologyGroup exists");
        Ok(applied.metadata.generation)
    }

    async fn write_status(
        &self,
        groups: &Api<TopologyGroup>,
        status: &TopologyGroupStatus,
    ) -> Result<(), kube::Error> {
        let patch = serde_json::json!({
            "apiVersion": "runtimekit.aliyun.com/v1alpha1",
            "kind": "TopologyGroup",
            "status": status,
        });
        groups
            .patch_status(
                &self.node,
                &PatchParams::apply(TOPOLOGY_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await?;
        Ok(())
    }

    /// Writes only the heartbeat of a status that is otherwise unchanged.
    async fn write_heartbeat(
        &self,
        groups: &Api<TopologyGroup>,
        status: &TopologyGroupStatus,
    ) -> Result<(), kube::Error> {
        let patch = serde_json::json!({"status": {"heartbeatTime": status.heartbeat_time}});
        let params = PatchParams {
            field_manager: Some(TOPOLOGY_MANAGER.into()),
            ..PatchParams::default()
        };
        groups
            .patch_status(&self.node, &params, &Patch::Merge(&patch))
            .await?;
        Ok(())
    }

    /// Writes the node-level resources into the Node's status (an empty set releases what this
    /// manager wrote before, for example after a switch from MiB to GiB mode).
    async fn write_node_resources(
        &self,
        nodes: &Api<Node>,
        resources: &BTreeMap<String, u64>,
    ) -> Result<(), kube::Error> {
        let quantities: BTreeMap<&String, String> =
            resources.iter().map(|(k, v)| (k, v.to_string())).collect();
        let status = if quantities.is_empty() {
            serde_json::json!({})
        } else {
            serde_json::json!({"capacity": quantities, "allocatable": quantities})
        };
        let patch = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.node},
            "status": status,
        });
        nodes
            .patch_status(
                &self.node,
                &PatchParams::apply(NODE_STATUS_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await?;
        Ok(())
    }

    /// A Warning Event on each pod with a slice on a card that turns unhealthy, naming the card
    /// and the fault. Nothing is done to the pods: their owners decide (SPEC: nothing a user's
    /// controller counts as a failure is done behind its back); the operator places nothing new
    /// there.
    async fn pod_events(&self, transition: &Transition) {
        if transition.healthy {
            return;
        }
        let pods: Vec<(String, String, String, String)> = self
            .state
            .borrow()
            .slices
            .iter()
            .filter(|s| s.card == transition.card && !s.deleting)
            .map(|s| {
                (
                    s.pod_namespace.clone(),
                    s.pod_name.clone(),
                    s.pod_uid.clone(),
                    s.name.clone(),
                )
            })
            .collect();
        for (namespace, name, uid, slice) in pods {
            let reference = ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                namespace: Some(namespace),
                name: Some(name),
                uid: Some(uid),
                ..ObjectReference::default()
            };
            let event = Event {
                type_: EventType::Warning,
                reason: "GpuUnhealthy".into(),
                note: Some(format!(
                    "card {} ({}) on node {}, which holds this pod's GpuSlice {slice}, is unhealthy: {}",
                    transition.card, transition.uuid, self.node, transition.reason
                )),
                action: "HealthCheck".into(),
                secondary: None,
            };
            if let Err(error) = self.recorder.publish(&event, &reference).await {
                tracing::warn!(%error, "cannot publish an event on a pod");
            }
        }
    }

    /// A Warning Event on the Node when a card turns unhealthy, a Normal one when it recovers.
    async fn node_event(
        &self,
        nodes: &Api<Node>,
        node_ref: &mut Option<ObjectReference>,
        transition: &Transition,
    ) {
        if node_ref.is_none() {
            match nodes.get(&self.node).await {
                Ok(node) => *node_ref = Some(kube::Resource::object_ref(&node, &())),
                Err(error) => {
                    tracing::warn!(%error, "cannot read the Node for an event");
                    return;
                }
            }
        }
        let Some(reference) = node_ref.as_ref() else {
            return;
        };
        let card = format!("card {} ({})", transition.card, transition.uuid);
        let event = if transition.healthy {
            Event {
                type_: EventType::Normal,
                reason: "GpuHealthy".into(),
                note: Some(format!(
                    "{card} is healthy again ({} cleared)",
                    transition.reason
                )),
                action: "HealthCheck".into(),
                secondary: None,
            }
        } else {
            Event {
                type_: EventType::Warning,
                reason: "GpuUnhealthy".into(),
                note: Some(format!(
                    "{card} is unhealthy and taken out of scheduling: {}",
                    transition.reason
                )),
                action: "HealthCheck".into(),
                secondary: None,
            }
        };
        if transition.healthy {
            tracing::info!(card = transition.card, reason = %transition.reason, "the card is healthy again");
        } else {
            tracing::warn!(card = transition.card, reason = %transition.reason, "the card is unhealthy");
        }
        if let Err(error) = self.recorder.publish(&event, reference).await {
            tracing::warn!(%error, "cannot publish an event on the Node");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_level_resource_is_lost_when_the_node_lacks_or_changed_it() {
        let resources = BTreeMap::from([("aliyun.com/gpu-memory".to_owned(), 655_360)]);
        let capacity = |value: Option<&str>| {
            let mut capacity = BTreeMap::from([("cpu".to_owned(), "64".to_owned())]);
            if let Some(value) = value {
                capacity.insert("aliyun.com/gpu-memory".to_owned(), value.to_owned());
            }
            capacity
        };
        assert!(!node_level_lost(&resources, &capacity(Some("655360"))));
        assert!(node_level_lost(&resources, &capacity(None)));
        assert!(node_level_lost(&resources, &capacity(Some("0"))));
        assert!(!node_level_lost(&BTreeMap::new(), &capacity(None)));
    }
}
