//! The exporter's per-node switch: the label `<prefix>/exporter-enabled=false` on the node's own
//! Node object switches the exporter off on that node (the shared configuration's
//! `features.exporter: false` switches it off everywhere, and then nothing listens at all).
//! The label is watched, so it takes effect without restarting the agent.

use super::Snapshot;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use runtimekit_contract::config::SWITCHED_OFF;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Why the exporter is off on a node with `labels`, if its switch label `label` says so.
pub fn off_by(labels: &BTreeMap<String, String>, label: &str) -> Option<String> {
    (labels.get(label).map(String::as_str) == Some(SWITCHED_OFF))
        .then(|| format!("the node is labelled {label}={SWITCHED_OFF}"))
}

/// Watches the node's labels for ever, switching `snapshot` off and on as `label` says.
pub async fn follow(client: Client, node: String, label: String, snapshot: Arc<Snapshot>) {
    let config = watcher::Config::default().fields(&format!("metadata.name={node}"));
    let mut events = Box::pin(
        watcher(Api::<Node>::all(client), config)
            .applied_objects()
            .default_backoff(),
    );
    while let Some(event) = events.next().await {
        match event {
            Ok(object) => {
                let off = off_by(object.labels(), &label);
                if off != snapshot.off() {
                    tracing::info!(switched_off = ?off, "the exporter's switch changed");
                }
                snapshot.switch_off(off);
            }
            Err(error) => tracing::warn!(%error, "watching the node's exporter switch"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_false_switches_the_exporter_off() {
        let label = "aliyun.com/exporter-enabled";
        let with = |value: &str| BTreeMap::from([(label.to_owned(), value.to_owned())]);
        assert_eq!(
            off_by(&with("false"), label).as_deref(),
            Some("the node is labelled aliyun.com/exporter-enabled=false")
        );
        assert_eq!(off_by(&with("true"), label), None);
        assert_eq!(off_by(&with("off"), label), None);
        assert_eq!(off_by(&BTreeMap::new(), label), None);
    }
}
