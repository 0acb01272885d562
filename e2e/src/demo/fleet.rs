//! The demo cluster's nodes and where they sit in the network: every shipped profile, spread
//! over two network pods, each with leaf switches and HyperNodes inside. Pure data, no I/O.

use crate::cluster::real_node::ENABLE_LABEL;
use crate::cluster::simulated::SimulatedNode;
use runtimekit_contract::config::TopologyLabels;
use std::collections::BTreeMap;

/// A node's place in the network: network pod, leaf switch, HyperNode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// The network pod.
    pub network_pod: &'static str,
    /// The leaf (access) switch.
    pub leaf_switch: &'static str,
    /// The HyperNode (the nodes of one NVLink/scale-up domain).
    pub hyper_node: &'static str,
}

impl Position {
    /// The node labels that say this position, under the configured label keys.
    pub fn labels(&self, keys: &TopologyLabels) -> BTreeMap<String, String> {
        BTreeMap::from([
            (keys.network_pod.clone(), self.network_pod.to_owned()),
            (keys.leaf_switch.clone(), self.leaf_switch.to_owned()),
            (keys.hyper_node.clone(), self.hyper_node.to_owned()),
        ])
    }
}

/// The node label the usage guide (section 2) advises for a card vendor, `kubectl label node
/// <node> accelerator/vendor=ppu`, for pods to select with a nodeSelector.
pub const VENDOR_LABEL: &str = "accelerator/vendor";
/// A label of the same kind for the card model: the guide's labels are the administrator's own,
/// and the vendor alone does not tell a PPU 810E node from a PPU M890P one.
pub const MODEL_LABEL: &str = "accelerator/model";

/// The vendor and model labels an administrator gives a node of `profile` (the profile's name
/// less its card count: `ppu-810e-8` is vendor `ppu`, model `ppu-810e`).
pub fn accelerator_labels(profile: &str) -> BTreeMap<String, String> {
    let model = profile.rsplit_once('-').map_or(profile, |(model, _)| model);
    let vendor = match model.split('-').next().unwrap_or(model) {
        "ppu" => "ppu",
        "mi300x" => "amd",
        _ => "nvidia",
    };
    BTreeMap::from([
        (VENDOR_LABEL.to_owned(), vendor.to_owned()),
        (MODEL_LABEL.to_owned(), model.to_owned()),
    ])
}

/// Where the real node sits: beside a simulated H800 node in the first HyperNode.
pub const REAL_NODE_POSITION: Position = Position {
    network_pod: "pod-a",
    leaf_switch: "leaf-a1",
    hyper_node: "hn-a1",
};

/// The simulated nodes: (name, profile, position).
const SIMULATED: &[(&str, &str, Position)] = &[
    ("h800-1", "h800-8", REAL_NODE_POSITION),
    ("a100-1", "a100-40gb-8", at("pod-a", "leaf-a1", "hn-a2")),
    ("a100-2", "a100-40gb-8", at("pod-a", "leaf-a1", "hn-a2")),
    ("mi300x-1", "mi300x-8", at("pod-a", "leaf-a2", "hn-a3")),
    ("mi300x-2", "mi300x-8", at("pod-a", "leaf-a2", "hn-a3")),
    ("ppu810e-1", "ppu-810e-8", at("pod-b", "leaf-b1", "hn-b1")),
    ("ppu810e-2", "ppu-810e-8", at("pod-b", "leaf-b1", "hn-b1")),
    ("ppu890p-1", "ppu-m890p-8", at("pod-b", "leaf-b2", "hn-b2")),
    ("ppu890p-2", "ppu-m890p-8", at("pod-b", "leaf-b2", "hn-b2")),
];

const fn at(
    network_pod: &'static str,
    leaf_switch: &'static str,
    hyper_node: &'static str,
) -> Position {
    Position {
        network_pod,
        leaf_switch,
        hyper_node,
    }
}

/// The simulated nodes to start, labelled as GPU nodes at their positions.
pub fn simulated_nodes(keys: &TopologyLabels) -> Vec<SimulatedNode> {
    SIMULATED
        .iter()
        .map(|(name, profile, position)| {
            let mut labels = position.labels(keys);
            labels.extend(accelerator_labels(profile));
            labels.insert(ENABLE_LABEL.into(), "true".into());
            SimulatedNode {
                name: (*name).into(),
                profile: (*profile).into(),
                labels,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn every_shipped_profile_runs_and_both_network_pods_hold_several_hypernodes() {
        let shipped: BTreeSet<String> =
            std::fs::read_dir(crate::tools::repo_root().join("node-agent/resource-layer/profiles"))
                .unwrap()
                .map(|e| {
                    let name = e.unwrap().file_name().into_string().unwrap();
                    name.trim_end_matches(".yaml").to_owned()
                })
                .collect();
        let nodes = simulated_nodes(&TopologyLabels::default());
        let run: BTreeSet<String> = nodes.iter().map(|n| n.profile.clone()).collect();
        assert_eq!(run, shipped);
        for pod in ["pod-a", "pod-b"] {
            let inside = |key: fn(&Position) -> &'static str| {
                SIMULATED
                    .iter()
                    .filter(|(_, _, p)| p.network_pod == pod)
                    .map(|(_, _, p)| key(p))
                    .collect::<BTreeSet<_>>()
                    .len()
            };
            assert!(inside(|p| p.leaf_switch) >= 2, "{pod}: leaf switches");
            assert!(inside(|p| p.hyper_node) >= 2, "{pod}: HyperNodes");
        }
        let names: BTreeSet<&str> = SIMULATED.iter().map(|(n, _, _)| *n).collect();
        assert_eq!(names.len(), SIMULATED.len(), "node names are unique");
        assert!(nodes.iter().all(|n| n.labels[ENABLE_LABEL] == "true"));
    }

    #[test]
    fn nodes_are_labelled_by_vendor_and_model_as_the_guide_advises() {
        let labels = |profile| {
            let l = accelerator_labels(profile);
            (l[VENDOR_LABEL].clone(), l[MODEL_LABEL].clone())
        };
        assert_eq!(labels("ppu-810e-8"), ("ppu".into(), "ppu-810e".into()));
        assert_eq!(labels("ppu-m890p-8"), ("ppu".into(), "ppu-m890p".into()));
        assert_eq!(labels("a100-40gb-8"), ("nvidia".into(), "a100-40gb".into()));
        assert_eq!(labels("h800-8"), ("nvidia".into(), "h800".into()));
        assert_eq!(labels("mi300x-8"), ("amd".into(), "mi300x".into()));
    }
}
