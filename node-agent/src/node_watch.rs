//! One watch of the agent's own Node, shared by everything that reads it: the exporter's
//! switch label, the device-API label, the DRA pool (labels for the network position, UID
//! for the slices' owner) and the reporter (the capacity the kubelet left of MiB mode's
//! node-level resources). Each reader follows a [`watch::Receiver`] instead of opening a watch
//! of its own.

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use std::collections::BTreeMap;
use tokio::sync::watch;

/// What the agent reads of its Node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeFacts {
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its UID; `None` once it is deleted.
    pub uid: Option<String>,
    /// Its status's capacity, as quantities.
    pub capacity: BTreeMap<String, String>,
}

/// The capacity in a Node's status, as quantities.
fn capacity(node: &Node) -> BTreeMap<String, String> {
    node.status
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .map(|c| c.iter().map(|(k, v)| (k.clone(), v.0.clone())).collect())
        .unwrap_or_default()
}

/// The node as last seen: `None` until the watch first sees it (a kubelet registers its node
/// after the agent may have started).
pub type Facts = watch::Receiver<Option<NodeFacts>>;

/// A channel for the node's facts, to be fed by [`follow`].
pub fn channel() -> (watch::Sender<Option<NodeFacts>>, Facts) {
    watch::channel(None)
}

/// Watches the node for ever, keeping `facts` equal to it (a deleted node has no UID).
pub async fn follow(client: Client, node: String, facts: watch::Sender<Option<NodeFacts>>) {
    let config = watcher::Config::default().fields(&format!("metadata.name={node}"));
    let mut events = Box::pin(watcher(Api::<Node>::all(client), config).default_backoff());
    while let Some(event) = events.next().await {
        let next = match event {
            Ok(watcher::Event::Apply(object) | watcher::Event::InitApply(object)) => NodeFacts {
                labels: object.labels().clone(),
                uid: object.uid(),
                capacity: capacity(&object),
            },
            Ok(watcher::Event::Delete(object)) => NodeFacts {
                labels: object.labels().clone(),
                uid: None,
                capacity: capacity(&object),
            },
            Ok(_) => continue,
            Err(error) => {
                tracing::warn!(%error, %node, "watching the node");
                continue;
            }
        };
        facts.send_if_modified(|known| {
            let changed = known.as_ref() != Some(&next);
            *known = Some(next);
            changed
        });
    }
}

/// Waits until the node has been seen; `None` when the watch stopped.
pub async fn seen(facts: &mut Facts) -> Option<NodeFacts> {
    facts
        .wait_for(Option::is_some)
        .await
        .ok()
        .and_then(|f| f.clone())
}
