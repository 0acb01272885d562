//! Which API gives the node's whole cards: the device plugin (the default), or DRA when the
//! node is labelled `<prefix>/device-api=dra`. The label is read once at start, because the
//! two must never both offer a card: when it changes, the agent stops (its DaemonSet starts it
//! again) and the new agent serves the other API from scratch.

use crate::node_watch::{self, Facts};
use runtimekit_contract::config::DEVICE_API_DRA;
use std::collections::BTreeMap;

/// Whether a node with `labels` moved its whole cards to DRA.
pub fn uses_dra(labels: &BTreeMap<String, String>, label: &str) -> bool {
    labels.get(label).map(String::as_str) == Some(DEVICE_API_DRA)
}

/// Whether the node uses DRA, once the node has been seen (`None` when the watch stopped).
pub async fn read(facts: &mut Facts, label: &str) -> Option<bool> {
    node_watch::seen(facts)
        .await
        .map(|node| uses_dra(&node.labels, label))
}

/// Returns once the node's label says otherwise than `dra`.
pub async fn until_changed(mut facts: Facts, label: String, dra: bool) {
    let changed = facts
        .wait_for(|f| {
            f.as_ref()
                .is_some_and(|n| uses_dra(&n.labels, &label) != dra)
        })
        .await
        .is_ok();
    if changed {
        tracing::warn!(%label, from_dra = dra, "the node's device API changed; stopping so the agent starts again serving the other");
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
