//! Types shared by several resources.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The condition type every resource here reports.
pub const CONDITION_READY: &str = "Ready";

/// The condition a node's TopologyGroup carries when the node installer sets the node up:
/// `False` while containerd does not run the `lj-runtime` handler, and then the operator
/// withholds the node's cards.
pub const CONDITION_RUNTIME_READY: &str = "RuntimeReady";

/// A tier of the network topology tree, from the closest (one node) to the widest.
///
/// A gang is packed into the lowest tier that holds all of its members.
#[derive(
    Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash,
)]
pub enum Tier {
    /// One Kubernetes node.
    Node,
    /// A group of nodes joined by a fast fabric (for example one NVLink domain).
    HyperNode,
    /// The nodes behind one leaf (access) switch.
    LeafSwitch,
    /// One network pod: the widest domain a gang may span.
    NetworkPod,
}

impl Tier {
    /// Every tier, from the closest to the widest.
    pub const ALL: [Tier; 4] = [
        Tier::Node,
        Tier::HyperNode,
        Tier::LeafSwitch,
        Tier::NetworkPod,
    ];
}

impl std::fmt::Display for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Tier::Node => "node",
            Tier::HyperNode => "HyperNode",
            Tier::LeafSwitch => "leaf switch",
            Tier::NetworkPod => "network pod",
        })
    }
}

/// Sets the condition of `condition.type_` in `conditions`, keeping its `lastTransitionTime` when
/// the status did not change, so repeated reconciles do not rewrite it. Returns whether anything
/// changed.
pub fn set_condition(conditions: &mut Vec<Condition>, mut condition: Condition) -> bool {
    match conditions.iter_mut().find(|c| c.type_ == condition.type_) {
        Some(existing) => {
            if existing.status == condition.status {
                condition.last_transition_time = existing.last_transition_time.clone();
            }
            let changed = *existing != condition;
            *existing = condition;
            changed
        }
        None => {
            conditions.push(condition);
            true
        }
    }
}

/// A point in time, as the API writes it.
pub(crate) type Timestamp = Time;

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp as Jiff;

    fn ready(status: &str, at: i64, message: &str) -> Condition {
        Condition {
            type_: CONDITION_READY.into(),
            status: status.into(),
            reason: "Test".into(),
            message: message.into(),
            last_transition_time: Time(Jiff::from_second(at).expect("valid time")),
            observed_generation: None,
        }
    }

    #[test]
    fn same_status_keeps_transition_time() {
        let mut conditions = vec![ready("True", 10, "a")];
        assert!(set_condition(&mut conditions, ready("True", 20, "b")));
        assert_eq!(
            conditions[0].last_transition_time,
            ready("True", 10, "").last_transition_time
        );
        assert_eq!(conditions[0].message, "b");
        assert!(!set_condition(&mut conditions, ready("True", 30, "b")));
    }

    #[test]
    fn new_status_moves_transition_time() {
        let mut conditions = vec![ready("True", 10, "a")];
        assert!(set_condition(&mut conditions, ready("False", 20, "a")));
        assert_eq!(conditions.len(), 1);
        assert_eq!(
            conditions[0].last_transition_time,
            ready("False", 20, "").last_transition_time
        );
    }
}
