//! Nodes as the watch delivers them, placed in the network tree.

use super::{Feed, Now, State, Unfinalize};
use crate::topology::Position;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use runtimekit_placement as placement;

impl Feed for Node {
    const KIND: &'static str = "Node";
    fn key(&self) -> String {
        self.name_any()
    }
    fn apply(&self, state: &mut State, _now: Now) {
        state.apply_node(self);
    }
    fn remove(key: &str, state: &mut State, _now: Now) {
        state.delete_node(key);
    }
    fn known(state: &State) -> Vec<String> {
        state.node_names()
    }
}

/// The network pod of nodes that name none: without topology labels the whole cluster is one
/// domain, so gangs can still span nodes.
pub const IMPLICIT_NETWORK_POD: &str = "cluster";
pub(super) fn network_position(position: &Position) -> placement::NetworkPosition {
    placement::NetworkPosition {
        hyper_node: position.hyper_node.clone(),
        leaf_switch: position.leaf_switch.clone(),
        network_pod: Some(
            position
                .network_pod
                .clone()
                .unwrap_or_else(|| IMPLICIT_NETWORK_POD.into()),
        ),
    }
}

impl State {
    /// Applies a node.
    pub fn apply_node(&mut self, node: &Node) {
        let mut info =
            match placement::NodeInfo::from_node(node, &self.names, &self.config.topology_labels) {
                Ok(info) => info,
                Err(error) => {
                    tracing::warn!(%error, "node cannot be read; it is not offered");
                    return;
                }
            };
        let name = info.name.clone();
        info.position =
            network_position(&self.tree.positions.get(&name).cloned().unwrap_or_default());
        let labels_changed = self
            .nodes
            .get(&name)
            .is_none_or(|old| old.labels != info.labels);
        if labels_changed {
            self.tree_dirty = true;
        }
        if self.nodes.get(&name) != Some(&info) {
            self.capacity_freed = true;
            self.engine.upsert_node(info.clone());
        }
        // A slice seen before its node (a starting operator's watches race) was taken for one
        // whose node is gone: its agent finalizes it after all, once it has destroyed what it
        // enacted. Slices of pods never bound stay the operator's to finalize while no agent has
        // acted on them.
        let here: Vec<((String, String), bool)> = self
            .work
            .unfinalize
            .iter()
            .filter(|(_, why)| **why == Unfinalize::NodeGone)
            .filter_map(|(key, _)| {
                let slice = self.slices.get(key)?;
                (slice.node.as_deref() == Some(name.as_str())).then(|| {
                    let never_bound = self
                        .pods
                        .get(&slice.pod_uid)
                        .is_some_and(|p| p.node.is_none());
                    (key.clone(), never_bound)
                })
            })
            .collect();
        for (key, never_bound) in here {
            if never_bound {
                self.work.unfinalize.insert(key, Unfinalize::NeverEnacted);
            } else {
                self.work.unfinalize.remove(&key);
            }
        }
        self.nodes.insert(name, info);
    }

    /// Forgets a deleted node; slices on it can no longer be released by its agent.
    pub fn delete_node(&mut self, name: &str) {
        self.nodes.remove(name);
        self.engine.remove_node(name);
        self.tree_dirty = true;
        let stranded: Vec<(String, String)> = self
            .slices
            .iter()
            .filter(|(_, s)| s.deleting && s.finalized && s.node.as_deref() == Some(name))
            .map(|(k, _)| k.clone())
            .collect();
        for key in stranded {
            self.work.unfinalize.insert(key, Unfinalize::NodeGone);
        }
    }

    /// Names of every known node.
    pub fn node_names(&self) -> Vec<String> {
        self.nodes.keys().cloned().collect()
    }
}
