//! Which API gives the node's whole cards: the device plugin (the default), or DRA when the
//! node is labelled `<prefix>/device-api=dra`. The label is read once at start, because the
//! two must never both offer a card: when it changes, the agent stops (its DaemonSet starts it
//! again) and the new agent serves the other API from scratch.

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use runtimekit_contract::config::DEVICE_API_DRA;
use std::collections::BTreeMap;

/// Whether a node with `labels` moved its whole cards to DRA.
pub fn uses_dra(labels: &BTreeMap<String, String>, label: &str) -> bool {
    labels.get(label).map(String::as_str) == Some(DEVICE_API_DRA)
}

/// How soon the node is read again when it cannot be read.
const RETRY: std::time::Duration = std::time::Duration::from_secs(2);

/// Reads the node's label, waiting for the node to exist (a kubelet registers it after the
/// agent may have started) and for the apiserver to answer.
pub async fn read(client: &Client, node: &str, label: &str) -> bool {
    let nodes = Api::<Node>::all(client.clone());
    let mut tries = 0u32;
    loop {
        match nodes.get_opt(node).await {
            Ok(Some(object)) => return uses_dra(object.labels(), label),
            Ok(None) if tries.is_multiple_of(15) => {
                tracing::warn!(%node, "the node does not exist yet; waiting for it to learn its device API");
            }
            Err(error) if tries.is_multiple_of(15) => {
                tracing::warn!(%node, %error, "cannot read the node to learn its device API; retrying");
            }
            _ => {}
        }
        tries = tries.wrapping_add(1);
        tokio::time::sleep(RETRY).await;
    }
}

/// Returns once the node's label says otherwise than `dra`.
pub async fn until_changed(client: Client, node: String, label: String, dra: bool) {
    let config = watcher::Config::default().fields(&format!("metadata.name={node}"));
    let mut events = Box::pin(
        watcher(Api::<Node>::all(client), config)
            .applied_objects()
            .default_backoff(),
    );
    while let Some(event) = events.next().await {
        match event {
            Ok(object) if uses_dra(object.labels(), &label) != dra => {
                tracing::warn!(%label, from_dra = dra, "the node's device API changed; stopping so the agent starts again serving the other");
                return;
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "watching the node's device-API label"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_dra_moves_a_node() {
        let label = "aliyun.com/device-api";
        let with = |v: &str| BTreeMap::from([(label.to_owned(), v.to_owned())]);
        assert!(uses_dra(&with("dra"), label));
        assert!(!uses_dra(&with("device-plugin"), label));
        assert!(!uses_dra(&with("DRA"), label));
        assert!(!uses_dra(&BTreeMap::new(), label));
    }
}
