//! The exporter's per-node switch: the label `<prefix>/exporter-enabled=false` on the node's own
//! Node object switches the exporter off on that node (the shared configuration's
//! `features.exporter: false` switches it off everywhere, and then nothing listens at all).
//! The label is followed through the agent's watch of its node, so it takes effect without
//! restarting the agent.

use super::Snapshot;
use crate::node_watch::Facts;
use runtimekit_contract::config::SWITCHED_OFF;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Why the exporter is off on a node with `labels`, if its switch label `label` says so.
pub fn off_by(labels: &BTreeMap<String, String>, label: &str) -> Option<String> {
    (labels.get(label).map(String::as_str) == Some(SWITCHED_OFF))
        .then(|| format!("the node is labelled {label}={SWITCHED_OFF}"))
}

/// Follows the node's labels for ever, switching `snapshot` off and on as `label` says.
pub async fn follow(mut facts: Facts, label: String, snapshot: Arc<Snapshot>) {
    loop {
        let labels = facts.borrow_and_update().as_ref().map(|f| f.labels.clone());
        if let Some(labels) = labels {
            let off = off_by(&labels, &label);
            if off != snapshot.off() {
                tracing::info!(switched_off = ?off, "the exporter's switch changed");
            }
            snapshot.switch_off(off);
        }
        if facts.changed().await.is_err() {
            return;
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
