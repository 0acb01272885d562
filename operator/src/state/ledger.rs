//! The ledger the custom resources keep, summed for the operator's metrics: GpuSlices by node,
//! mode, phase and profile; GangGroups with their phase, members and attempts; TopologyGroups
//! with their tier and capacity. Read from the state the watches keep, under its lock.

use super::State;
use runtimekit_crds::{GangPhase, SliceMode, SlicePhase, Tier, TopologyCapacity};
use std::collections::BTreeMap;

/// One GangGroup's line.
#[derive(Debug, Clone, PartialEq)]
pub struct GangLine {
    pub namespace: String,
    pub name: String,
    pub phase: String,
    pub min_member: u32,
    /// (seen, reserved, bound, running) members.
    pub members: [u32; 4],
    pub attempts: u32,
}

/// One TopologyGroup's line.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupLine {
    pub name: String,
    pub tier: String,
    pub capacity: TopologyCapacity,
}

/// The ledger now.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Ledger {
    /// GpuSlices counted by (node, mode, phase, profile); `-` where there is none.
    pub slices: BTreeMap<(String, String, String, String), u64>,
    pub gangs: Vec<GangLine>,
    pub groups: Vec<GroupLine>,
}

fn mode_name(mode: SliceMode) -> &'static str {
    match mode {
        SliceMode::Whole => "Whole",
        SliceMode::Tdm => "TDM",
        SliceMode::Mig => "MIG",
    }
}

fn tier_name(tier: Tier) -> String {
    format!("{tier:?}")
}

fn phase_name(phase: Option<SlicePhase>) -> String {
    phase.map_or_else(|| "Pending".into(), |p| format!("{p:?}"))
}

fn gang_phase(phase: Option<GangPhase>) -> String {
    phase.map_or_else(|| "Waiting".into(), |p| format!("{p:?}"))
}

impl State {
    /// The ledger as the watches show it now.
    pub fn ledger(&self) -> Ledger {
        let mut slices = BTreeMap::new();
        for record in self.slices.values() {
            let key = (
                record.node.clone().unwrap_or_else(|| "-".into()),
                mode_name(record.mode).to_owned(),
                phase_name(record.phase),
                record.profile.clone().unwrap_or_else(|| "-".into()),
            );
            *slices.entry(key).or_insert(0) += 1;
        }
        let gangs = self
            .gangs
            .values()
            .map(|gang| {
                let status = gang.status.clone().unwrap_or_default();
                let members = status.members.unwrap_or_default();
                GangLine {
                    namespace: gang.metadata.namespace.clone().unwrap_or_default(),
                    name: gang.metadata.name.clone().unwrap_or_default(),
                    phase: gang_phase(status.phase),
                    min_member: gang.spec.min_member,
                    members: [
                        members.seen,
                        members.reserved,
                        members.bound,
                        members.running,
                    ],
                    attempts: status.attempts,
                }
            })
            .collect();
        let mut groups: Vec<GroupLine> = self
            .node_groups
            .iter()
            .map(|(name, group)| GroupLine {
                name: name.clone(),
                tier: tier_name(Tier::Node),
                capacity: group.capacity.clone(),
            })
            .collect();
        groups.extend(self.derived_groups.iter().map(|(name, status)| {
            let tier = self
                .tree
                .derived
                .get(name)
                .map(|g| g.tier)
                .or_else(|| self.applied_groups.get(name).map(|g| g.tier));
            GroupLine {
                name: name.clone(),
                tier: tier.map_or_else(|| "-".into(), tier_name),
                capacity: status.capacity.clone().unwrap_or_default(),
            }
        }));
        Ledger {
            slices,
            gangs,
            groups,
        }
    }
}
