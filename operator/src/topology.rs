//! The network topology tree, derived without I/O: which HyperNode, leaf switch and network pod
//! each node belongs to, from node labels and from higher-tier TopologyGroups an administrator
//! applied, and the higher-tier groups the operator must keep in the API.

use runtimekit_contract::TopologyLabels;
use runtimekit_crds::Tier;
use std::collections::BTreeMap;

/// The label the operator puts on the TopologyGroups it derives from node labels, so it never
/// touches the ones an administrator applied.
pub const DERIVED_LABEL: &str = "runtimekit.aliyun.com/derived";

/// A node's place in the network, as names of TopologyGroups (absent tiers are `None`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Position {
    /// The node's HyperNode.
    pub hyper_node: Option<String>,
    /// The node's leaf switch.
    pub leaf_switch: Option<String>,
    /// The node's network pod.
    pub network_pod: Option<String>,
}

/// A higher-tier group an administrator applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppliedGroup {
    /// Its name.
    pub name: String,
    /// Its tier (never Node).
    pub tier: Tier,
    /// Its enclosing group, if it names one.
    pub parent: Option<String>,
    /// The groups or nodes it lists as members.
    pub members: Vec<String>,
}

/// A higher-tier group the operator derives from node labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DerivedGroup {
    /// Its name, `<tier>-<label value>`.
    pub name: String,
    /// Its tier.
    pub tier: Tier,
    /// Its enclosing group.
    pub parent: Option<String>,
}

/// The tree: every node's position, and the groups to derive.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tree {
    /// Position of each node, by node name.
    pub positions: BTreeMap<String, Position>,
    /// Groups to create or keep, by name.
    pub derived: BTreeMap<String, DerivedGroup>,
    /// Problems found (for example a group claimed by two parents), for conditions and events.
    pub conflicts: Vec<String>,
}

/// The name of the group derived for `value` of a tier's label: `hypernode-a1`.
pub fn derived_name(tier: Tier, value: &str) -> String {
    let prefix = match tier {
        Tier::Node => "node",
        Tier::HyperNode => "hypernode",
        Tier::LeafSwitch => "leafswitch",
        Tier::NetworkPod => "networkpod",
    };
    let mut name: String = value
        .to_ascii_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    name.truncate(240);
    format!("{prefix}-{}", name.trim_matches(|c| c == '-' || c == '.'))
}

/// Builds the tree. An administrator's groups win over labels: a node (or group) listed as a
/// member of an applied group belongs to it, and an applied group's `parent` is honoured; labels
/// place everything else.
pub fn build<'a>(
    nodes: impl IntoIterator<Item = (&'a str, &'a BTreeMap<String, String>)>,
    applied: &[AppliedGroup],
    labels: &TopologyLabels,
) -> Tree {
    let mut tree = Tree::default();
    // child -> (parent, parent's tier); the first claim wins, later ones are conflicts.
    let mut parents: BTreeMap<String, (String, Tier)> = BTreeMap::new();
    let tiers: BTreeMap<&str, Tier> = applied.iter().map(|g| (g.name.as_str(), g.tier)).collect();
    fn claim(
        parents: &mut BTreeMap<String, (String, Tier)>,
        tree: &mut Tree,
        child: &str,
        parent: &str,
        tier: Tier,
    ) {
        match parents.get(child) {
            Some((existing, _)) if existing != parent => tree.conflicts.push(format!(
                "{child} is claimed by both {existing} and {parent}; keeping {existing}"
            )),
            Some(_) => {}
            None => {
                parents.insert(child.to_owned(), (parent.to_owned(), tier));
            }
        }
    }
    for group in applied.iter().filter(|g| g.tier != Tier::Node) {
        for member in &group.members {
            claim(&mut parents, &mut tree, member, &group.name, group.tier);
        }
    }
    for group in applied.iter().filter(|g| g.tier != Tier::Node) {
        if let Some(parent) = &group.parent {
            match tiers.get(parent.as_str()) {
                Some(&tier) if tier > group.tier => {
                    claim(&mut parents, &mut tree, &group.name, parent, tier)
                }
                Some(_) => tree.conflicts.push(format!(
                    "{} names {parent} as parent, which is not a wider tier",
                    group.name
                )),
                None => claim(
                    &mut parents,
                    &mut tree,
                    &group.name,
                    parent,
                    parent_tier_guess(group.tier),
                ),
            }
        }
    }

    let mut nodes: Vec<(&str, &BTreeMap<String, String>)> = nodes.into_iter().collect();
    nodes.sort_by_key(|(name, _)| *name);
    for (node, node_labels) in &nodes {
        // The chain the labels give, narrowest first.
        let chain: Vec<(Tier, String)> = [
            (Tier::HyperNode, &labels.hyper_node),
            (Tier::LeafSwitch, &labels.leaf_switch),
            (Tier::NetworkPod, &labels.network_pod),
        ]
        .into_iter()
        .filter_map(|(tier, key)| {
            node_labels
                .get(key)
                .filter(|v| !v.is_empty())
                .map(|v| (tier, derived_name(tier, v)))
        })
        .collect();
        let mut child = (*node).to_owned();
        for (tier, group) in &chain {
            if !parents.contains_key(&child) {
                claim(&mut parents, &mut tree, &child, group, *tier);
            }
            let parent = chain.iter().find(|(t, _)| t > tier).map(|(_, g)| g.clone());
            let entry = tree
                .derived
                .entry(group.clone())
                .or_insert_with(|| DerivedGroup {
                    name: group.clone(),
                    tier: *tier,
                    parent: parent.clone(),
                });
            if entry.parent != parent {
                let other = parent.clone().unwrap_or_else(|| "none".into());
                let kept = entry.parent.clone().unwrap_or_else(|| "none".into());
                tree.conflicts.push(format!("node {node} puts {group} under {other}, another node under {kept}; keeping {kept}"));
            }
            child = group.clone();
        }
    }
    // Derived groups' parents come from labels unless an applied group claimed them.
    for group in tree.derived.values() {
        if let Some(parent) = &group.parent {
            parents
                .entry(group.name.clone())
                .or_insert((parent.clone(), parent_tier_guess(group.tier)));
        }
    }

    for (node, _) in &nodes {
        let mut position = Position::default();
        let mut current = (*node).to_owned();
        // Walk up; a cycle or a too-long chain stops after the widest tier.
        for _ in 0..Tier::ALL.len() {
            let Some((parent, tier)) = parents.get(&current).cloned() else {
                break;
            };
            let slot = match tier {
                Tier::HyperNode => &mut position.hyper_node,
                Tier::LeafSwitch => &mut position.leaf_switch,
                Tier::NetworkPod => &mut position.network_pod,
                Tier::Node => break,
            };
            if slot.is_some() {
                break;
            }
            *slot = Some(parent.clone());
            current = parent;
        }
        tree.positions.insert((*node).to_owned(), position);
    }
    tree
}

/// The tier of an enclosing group that is not known by name: the next wider one.
fn parent_tier_guess(tier: Tier) -> Tier {
    match tier {
        Tier::Node => Tier::HyperNode,
        Tier::HyperNode => Tier::LeafSwitch,
        Tier::LeafSwitch | Tier::NetworkPod => Tier::NetworkPod,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        let keys = TopologyLabels::default();
        pairs
            .iter()
            .map(|(tier, v)| {
                let key = match *tier {
                    "hn" => &keys.hyper_node,
                    "leaf" => &keys.leaf_switch,
                    _ => &keys.network_pod,
                };
                (key.clone(), (*v).to_owned())
            })
            .collect()
    }

    fn position(hn: Option<&str>, leaf: Option<&str>, np: Option<&str>) -> Position {
        Position {
            hyper_node: hn.map(Into::into),
            leaf_switch: leaf.map(Into::into),
            network_pod: np.map(Into::into),
        }
    }

    #[test]
    fn labels_give_positions_and_derived_groups() {
        let a = labels(&[("hn", "A1"), ("leaf", "l1"), ("np", "p1")]);
        let b = labels(&[("leaf", "l1"), ("np", "p1")]);
        let c = labels(&[]);
        let tree = build(
            [("a", &a), ("b", &b), ("c", &c)],
            &[],
            &TopologyLabels::default(),
        );
        assert_eq!(
            tree.positions["a"],
            position(
                Some("hypernode-a1"),
                Some("leafswitch-l1"),
                Some("networkpod-p1")
            )
        );
        assert_eq!(
            tree.positions["b"],
            position(None, Some("leafswitch-l1"), Some("networkpod-p1"))
        );
        assert_eq!(tree.positions["c"], Position::default());
        assert_eq!(
            tree.derived["hypernode-a1"].parent.as_deref(),
            Some("leafswitch-l1")
        );
        assert_eq!(
            tree.derived["leafswitch-l1"].parent.as_deref(),
            Some("networkpod-p1")
        );
        assert_eq!(tree.derived["networkpod-p1"].parent, None);
        assert!(tree.conflicts.is_empty());
    }

    #[test]
    fn applied_groups_win_over_labels() {
        let a = labels(&[("hn", "x"), ("np", "p1")]);
        let applied = [
            AppliedGroup {
                name: "hn-admin".into(),
                tier: Tier::HyperNode,
                parent: Some("leaf-admin".into()),
                members: vec!["a".into()],
            },
            AppliedGroup {
                name: "leaf-admin".into(),
                tier: Tier::LeafSwitch,
                parent: None,
                members: vec![],
            },
            AppliedGroup {
                name: "pod-admin".into(),
                tier: Tier::NetworkPod,
                parent: None,
                members: vec!["leaf-admin".into()],
            },
        ];
        let tree = build([("a", &a)], &applied, &TopologyLabels::default());
        assert_eq!(
            tree.positions["a"],
            position(Some("hn-admin"), Some("leaf-admin"), Some("pod-admin"))
        );
    }

    #[test]
    fn disagreeing_labels_are_reported() {
        let a = labels(&[("hn", "h"), ("leaf", "l1")]);
        let b = labels(&[("hn", "h"), ("leaf", "l2")]);
        let tree = build([("a", &a), ("b", &b)], &[], &TopologyLabels::default());
        assert_eq!(
            tree.derived["hypernode-h"].parent.as_deref(),
            Some("leafswitch-l1")
        );
        assert_eq!(tree.conflicts.len(), 1, "{:?}", tree.conflicts);
        assert_eq!(
            tree.positions["b"].leaf_switch.as_deref(),
            Some("leafswitch-l1"),
            "the kept parent places b too"
        );
    }

    #[test]
    fn names_are_dns_safe() {
        assert_eq!(
            derived_name(Tier::LeafSwitch, "Rack_07/A"),
            "leafswitch-rack-07-a"
        );
        assert_eq!(derived_name(Tier::NetworkPod, "--p--"), "networkpod-p");
    }
}
