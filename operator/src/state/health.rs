//! The optional health taint (`features.healthTaint`): which nodes must carry the taint
//! `<prefix>/gpu-unhealthy` because a card of theirs is faulted, and which must lose it. The
//! faulted cards are those the node's agent reports Unhealthy in its TopologyGroup; the engine
//! withholds them whether or not the taint is on.

use super::State;
use runtimekit_contract::HealthTaint;
use runtimekit_placement::{Taint, TaintEffect};
use std::collections::BTreeMap;

/// The longest value a taint may carry (a label value).
const MAX_VALUE: usize = 63;

/// A node whose health taint must change: to `taint`, or removed when `None`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaintChange {
    /// The node.
    pub node: String,
    /// Its health taint from now on.
    pub taint: Option<Taint>,
}

/// The taint's value: the faulted cards, `gpu0_gpu3`, as many as fit a label value.
fn value(faulted: &[u32]) -> String {
    let mut value = String::new();
    for card in faulted {
        let entry = format!("gpu{card}");
        let separator = usize::from(!value.is_empty());
        if value.len() + separator + entry.len() > MAX_VALUE {
            break;
        }
        if separator == 1 {
            value.push('_');
        }
        value.push_str(&entry);
    }
    value
}

impl State {
    /// The taint key health taints use under this configuration.
    pub fn health_taint_key(&self) -> &str {
        &self.names.health_taint
    }

    /// The nodes whose health taint differs from what their cards' health asks for. With the
    /// switch off, every health taint is removed (one left by an earlier setting too); taints
    /// of other keys are never touched.
    pub fn health_taint_changes(&self) -> Vec<TaintChange> {
        let effect = match self.config.features.health_taint {
            HealthTaint::Off => None,
            HealthTaint::NoSchedule => Some(TaintEffect::NoSchedule),
            HealthTaint::PreferNoSchedule => Some(TaintEffect::PreferNoSchedule),
        };
        let key = self.health_taint_key();
        let faulted_by_node: BTreeMap<&str, &[u32]> = self
            .node_groups
            .values()
            .map(|g| (g.node.as_str(), g.faulted.as_slice()))
            .collect();
        let mut changes = Vec::new();
        for (name, node) in &self.nodes {
            let faulted = faulted_by_node
                .get(name.as_str())
                .copied()
                .unwrap_or_default();
            let wanted = effect.filter(|_| !faulted.is_empty()).map(|effect| Taint {
                key: key.to_owned(),
                value: value(faulted),
                effect,
            });
            let current = node.taints.iter().find(|t| t.key == key);
            if current != wanted.as_ref() {
                changes.push(TaintChange {
                    node: name.clone(),
                    taint: wanted,
                });
            }
        }
        changes
    }
}

#[cfg(test)]
mod tests {
    use super::value;

    #[test]
    fn the_value_names_the_faulted_cards_within_a_label_value() {
        assert_eq!(value(&[3]), "gpu3");
        assert_eq!(value(&[0, 3]), "gpu0_gpu3");
        let many: Vec<u32> = (0..32).collect();
        let long = value(&many);
        assert!(long.len() <= 63, "{long}");
        assert!(
            long.starts_with("gpu0_gpu1_") && long.ends_with(char::is_numeric),
            "{long}"
        );
    }
}
