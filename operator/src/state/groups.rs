//! TopologyGroups: a node-tier group carries its node's cards, NICs and heartbeat; higher tiers
//! are derived from node labels or applied by an administrator. Also what the TopologyGroup
//! controller must write.

use super::nodes::network_position;
use super::{Feed, Now, State};
use crate::topology::{self, AppliedGroup, DERIVED_LABEL};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use runtimekit_crds::{CardHealth, CardStatus, NicStatus, Tier, TopologyCapacity, TopologyGroup};
use runtimekit_placement as placement;
use runtimekit_placement::snapshot::{Heartbeat, outside_holder, outside_holds, runtime_ready};
use std::collections::{BTreeMap, BTreeSet};

impl Feed for TopologyGroup {
    const KIND: &'static str = "TopologyGroup";
    fn key(&self) -> String {
        self.name_any()
    }
    fn apply(&self, state: &mut State, now: Now) {
        state.apply_group(self, now.wall);
    }
    fn remove(key: &str, state: &mut State, _now: Now) {
        state.delete_group(key);
    }
    fn known(state: &State) -> Vec<String> {
        state.group_names()
    }
}

/// A node-tier TopologyGroup, as far as the state needs it.
#[derive(Debug, Clone)]
pub(super) struct NodeGroup {
    /// The node it describes.
    pub(super) node: String,
    /// The agent's last heartbeat and its interval.
    heartbeat: Heartbeat,
    /// The group's parent as the API has it.
    parent: Option<String>,
    /// The capacity the agent reports.
    pub(super) capacity: TopologyCapacity,
    /// Whether the agent was last reported as not reporting.
    stale_reported: bool,
    /// A hash of the cards and NICs last given to the engine.
    devices: u64,
    /// The cards its agent reports Unhealthy, by index.
    pub(super) faulted: Vec<u32>,
    /// Whether the node runs the `lj-runtime` handler (no `RuntimeReady` condition that is
    /// `False`: agents without the installer, and older ones, report none).
    runtime_ready: bool,
}

impl NodeGroup {
    /// Whether the node's cards may be offered now.
    fn offered(&self, now: Timestamp) -> bool {
        self.heartbeat.fresh(now) && self.runtime_ready
    }
}

/// What the TopologyGroup controller must write.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TopologyPlan {
    /// Derived groups to create or update: (name, tier, parent).
    pub derived: Vec<(String, Tier, Option<String>)>,
    /// Derived groups no node names any more.
    pub obsolete: Vec<String>,
    /// Node-tier groups whose parent must change: (group, parent).
    pub parents: Vec<(String, Option<String>)>,
    /// Higher-tier groups' status: (name, member nodes, aggregate capacity).
    pub status: Vec<(String, Vec<String>, TopologyCapacity)>,
    /// Node-tier groups whose agent's reporting changed: (group, reporting).
    pub reporting: Vec<(String, bool)>,
}

/// A hash of a node's cards and NICs, to tell a heartbeat from a change of devices.
fn devices_hash(cards: &[CardStatus], nics: &[NicStatus]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    serde_json::to_string(&(cards, nics))
        .unwrap_or_default()
        .hash(&mut hasher);
    hasher.finish()
}

impl State {
    /// Holds, whole, the cards of `node` its agent reports given whole to pods of another
    /// scheduler, so no decision picks them; cards no longer held are released.
    fn hold_outside(&mut self, node: &str, cards: &[CardStatus]) {
        let holder = outside_holder(node);
        if self.engine.release(&holder) {
            self.capacity_freed = true;
        }
        for hold in outside_holds(node, cards) {
            self.engine.upsert_slice(hold);
        }
    }

    /// Applies a TopologyGroup: a node-tier group carries the node's cards, NICs and heartbeat;
    /// an administrator's higher-tier group places its members.
    pub fn apply_group(&mut self, group: &TopologyGroup, now: Timestamp) {
        let name = group.name_any();
        if group.spec.tier == Tier::Node {
            let Some(node) = group.spec.node_name.clone() else {
                return;
            };
            let status = group.status.clone().unwrap_or_default();
            let cards: Vec<placement::CardInfo> = status
                .cards
                .iter()
                .map(placement::CardInfo::from_status)
                .collect();
            let nics: Vec<placement::NicInfo> = status
                .nics
                .iter()
                .map(placement::NicInfo::from_status)
                .collect();
            // Heartbeats rewrite the status every few seconds; the devices rarely change.
            let devices = devices_hash(&status.cards, &status.nics);
            if self
                .node_groups
                .get(&name)
                .is_none_or(|g| g.devices != devices)
            {
                self.engine.set_devices(&node, &cards, &nics);
                self.hold_outside(&node, &status.cards);
            }
            let heartbeat = Heartbeat::of(&status);
            let runtime_ready = runtime_ready(&status);
            let offered = heartbeat.fresh(now) && runtime_ready;
            let was_offered = self.node_groups.get(&name).is_some_and(|g| g.offered(now));
            if offered && !was_offered {
                self.capacity_freed = true;
            }
            self.engine.set_agent_reporting(&node, offered);
            let stale_reported = self
                .node_groups
                .get(&name)
                .is_some_and(|g| g.stale_reported);
            let capacity = status.capacity.clone().unwrap_or_default();
            let faulted = status
                .cards
                .iter()
                .filter(|c| c.health == CardHealth::Unhealthy)
                .map(|c| c.index)
                .collect();
            self.node_groups.insert(
                name,
                NodeGroup {
                    node,
                    heartbeat,
                    parent: group.spec.parent.clone(),
                    capacity,
                    stale_reported,
                    devices,
                    faulted,
                    runtime_ready,
                },
            );
            return;
        }
        let derived = group
            .labels()
            .get(DERIVED_LABEL)
            .is_some_and(|v| v == "true");
        if derived {
            self.derived_groups
                .insert(name, group.status.clone().unwrap_or_default());
            return;
        }
        let applied = AppliedGroup {
            name: name.clone(),
            tier: group.spec.tier,
            parent: group.spec.parent.clone(),
            members: group.spec.members.clone().unwrap_or_default(),
        };
        if self.applied_groups.get(&name) != Some(&applied) {
            self.applied_groups.insert(name, applied);
            self.tree_dirty = true;
        }
    }

    /// Forgets a deleted TopologyGroup.
    pub fn delete_group(&mut self, name: &str) {
        self.derived_groups.remove(name);
        if let Some(group) = self.node_groups.remove(name) {
            self.engine.set_devices(&group.node, &[], &[]);
            self.engine.release(&outside_holder(&group.node));
            self.engine.set_agent_reporting(&group.node, false);
        }
        if self.applied_groups.remove(name).is_some() {
            self.tree_dirty = true;
        }
    }

    /// Names of every known TopologyGroup.
    pub fn group_names(&self) -> Vec<String> {
        self.node_groups
            .keys()
            .chain(self.applied_groups.keys())
            .chain(self.derived_groups.keys())
            .cloned()
            .collect()
    }

    /// What the TopologyGroup controller must write to make the API match the tree, the
    /// aggregate capacities and the agents' reporting.
    pub fn topology_plan(&mut self, now: Timestamp) -> TopologyPlan {
        let mut plan = TopologyPlan::default();
        for group in self.tree.derived.values() {
            plan.derived
                .push((group.name.clone(), group.tier, group.parent.clone()));
        }
        plan.obsolete = self
            .derived_groups
            .keys()
            .filter(|n| !self.tree.derived.contains_key(*n))
            .cloned()
            .collect();
        let mut members: BTreeMap<String, (Vec<String>, TopologyCapacity)> = BTreeMap::new();
        for (name, group) in &mut self.node_groups {
            let position = self
                .tree
                .positions
                .get(&group.node)
                .cloned()
                .unwrap_or_default();
            let parent = position
                .hyper_node
                .clone()
                .or(position.leaf_switch.clone())
                .or(position.network_pod.clone());
            if group.parent != parent {
                plan.parents.push((name.clone(), parent));
            }
            let reporting = group.heartbeat.fresh(now);
            // A group its agent has not written yet (created, its status on the way) has not
            // stopped reporting: a fleet's rollout would otherwise warn and write twice a node.
            let started = group.heartbeat.at.is_some();
            if started && group.stale_reported == reporting {
                group.stale_reported = !reporting;
                plan.reporting.push((name.clone(), reporting));
            }
            for tier_group in [
                &position.hyper_node,
                &position.leaf_switch,
                &position.network_pod,
            ]
            .into_iter()
            .flatten()
            {
                let entry = members.entry(tier_group.clone()).or_default();
                entry.0.push(group.node.clone());
                let c = &group.capacity;
                entry.1.nodes += 1;
                entry.1.cards += c.cards;
                entry.1.healthy_cards += c.healthy_cards;
                entry.1.free_cards += c.free_cards;
                entry.1.mig_cards += c.mig_cards;
            }
        }
        let higher: BTreeSet<&String> = self
            .tree
            .derived
            .keys()
            .chain(self.applied_groups.keys())
            .collect();
        for name in higher {
            let (nodes, capacity) = members.remove(name).unwrap_or_default();
            let current = self.derived_groups.get(name.as_str());
            if current.is_none_or(|s| s.nodes != nodes || s.capacity.as_ref() != Some(&capacity)) {
                plan.status.push((name.clone(), nodes, capacity));
            }
        }
        plan
    }

    /// Withholds the cards of nodes whose agent stopped reporting, and offers them again when it
    /// resumes.
    pub fn refresh_heartbeats(&mut self, now: Timestamp) {
        for group in self.node_groups.values() {
            self.engine
                .set_agent_reporting(&group.node, group.offered(now));
        }
    }

    /// Recomputes the topology tree if node labels or applied groups changed, and moves the
    /// nodes whose position changed.
    pub fn refresh_topology(&mut self) -> bool {
        if !self.tree_dirty {
            return false;
        }
        self.tree_dirty = false;
        let applied: Vec<AppliedGroup> = self.applied_groups.values().cloned().collect();
        let tree = topology::build(
            self.nodes
                .iter()
                .map(|(n, info)| (n.as_str(), &info.labels)),
            &applied,
            &self.config.topology_labels,
        );
        for (name, info) in &mut self.nodes {
            let position = network_position(&tree.positions.get(name).cloned().unwrap_or_default());
            if info.position != position {
                info.position = position;
                self.engine.upsert_node(info.clone());
            }
        }
        self.tree = tree;
        true
    }
}
