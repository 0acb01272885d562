//! What the agent knows about its node, shared by every task: the cards as the resource layer
//! last listed them, the faults active on them, the GpuSlices of the node and the cards the
//! kubelet gave whole to pods. Pure data; the tasks that fill it live elsewhere.

use crate::health::FaultState;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use runtimekit_crds::{GpuSlice, SliceMode, SlicePhase, parse_slice_memory};
use runtimekit_proto::resource::v1alpha1 as pb;
use std::collections::{BTreeMap, BTreeSet};

/// The cards, NICs and card-to-card paths, as the resource layer last reported them.
///
/// A card whose calls hang is not listed again while it hangs (the listing would hang too), so
/// its last answer stays; a card reported lost keeps its last known model and topology.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Inventory {
    /// Cards by index.
    pub devices: BTreeMap<u32, pb::Device>,
    /// RDMA NICs of the node.
    pub nics: Vec<pb::Nic>,
    /// Paths between cards, one per pair (a < b).
    pub paths: Vec<pb::DevicePath>,
    /// The driver's control files every container with a card needs.
    pub control_nodes: Vec<String>,
    /// The folder the device files live under (`/dev` inside containers).
    pub device_root: String,
}

impl Inventory {
    /// Takes in a listing of `listed` cards (every card when `listed` is empty).
    pub fn merge(&mut self, response: pb::ListDevicesResponse, listed: &[u32]) {
        let all = listed.is_empty();
        let covered = |i: u32| all || listed.contains(&i);
        if all {
            let present: BTreeSet<u32> = response.devices.iter().map(|d| d.index).collect();
            self.devices.retain(|i, _| present.contains(i));
        }
        for device in response.devices {
            let merged = match self.devices.get(&device.index) {
                // Nothing (lost) or not everything (partial) was read: keep what was known.
                Some(old)
                    if matches!(
                        device.state(),
                        pb::DeviceState::Lost | pb::DeviceState::Partial
                    ) =>
                {
                    pb::Device {
                        state: device.state,
                        healthy: device.healthy,
                        faults: device.faults,
                        uuid: if device.uuid.is_empty() {
                            old.uuid.clone()
                        } else {
                            device.uuid
                        },
                        ..old.clone()
                    }
                }
                _ => device,
            };
            self.devices.insert(merged.index, merged);
        }
        self.nics = response.nics;
        self.control_nodes = response.control_nodes;
        self.device_root = response.device_root;
        self.paths.retain(|p| {
            !(covered(p.a) && covered(p.b))
                && self.devices.contains_key(&p.a)
                && self.devices.contains_key(&p.b)
        });
        self.paths.extend(response.paths);
        self.paths.sort_by_key(|p| (p.a, p.b));
        self.paths.dedup_by_key(|p| (p.a, p.b));
    }

    /// The card with this UUID.
    pub fn by_uuid(&self, uuid: &str) -> Option<&pb::Device> {
        self.devices.values().find(|d| d.uuid == uuid)
    }

    /// The instances the resource layer reported on every card.
    pub fn instances(&self) -> impl Iterator<Item = &pb::Instance> {
        self.devices.values().flat_map(|d| d.instances.iter())
    }
}

/// The NUMA node of a card, when known.
pub fn numa_node(device: &pb::Device) -> Option<u32> {
    device.topology.as_ref().and_then(|t| t.numa_node)
}

/// Whether a card is in MIG mode.
pub fn mig_enabled(device: &pb::Device) -> bool {
    device.mig.as_ref().is_some_and(|m| m.enabled)
}

/// Whether a card can hold time-division shares (TDM): NVIDIA and PPU cards not in MIG mode.
pub fn tdm_capable(device: &pb::Device) -> bool {
    matches!(device.vendor(), pb::Vendor::Nvidia | pb::Vendor::Ppu) && !mig_enabled(device)
}

/// One GpuSlice of this node as the agent sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct SliceInfo {
    /// The slice's namespace.
    pub namespace: String,
    /// The slice's name.
    pub name: String,
    /// The card's index on the node.
    pub card: u32,
    /// The card's UUID, as the scheduler saw it.
    pub card_uuid: String,
    /// Whole, TDM or MIG.
    pub mode: SliceMode,
    /// Compute share in percent (TDM).
    pub core: Option<u32>,
    /// Memory granted in MiB, when stated.
    pub memory_mib: Option<u64>,
    /// MIG compute slices.
    pub slices: Option<u32>,
    /// MIG profile name.
    pub mig_profile: Option<String>,
    /// MIG placement start.
    pub mig_start: Option<u32>,
    /// The pod's UID.
    pub pod_uid: String,
    /// The pod's namespace.
    pub pod_namespace: String,
    /// The pod's name.
    pub pod_name: String,
    /// The container the slice is for.
    pub container: String,
    /// The phase the status shows now.
    pub phase: Option<SlicePhase>,
    /// The slice is being deleted.
    pub deleting: bool,
    /// When the slice was created.
    pub created: Option<Time>,
}

impl SliceInfo {
    /// The slice as the agent tracks it; `None` for a slice without a card (nothing to enact).
    pub fn from_slice(slice: &GpuSlice) -> Option<SliceInfo> {
        let card = slice.spec.card.as_ref()?;
        Some(SliceInfo {
            namespace: slice.metadata.namespace.clone().unwrap_or_default(),
            name: slice.metadata.name.clone().unwrap_or_default(),
            card: card.index,
            card_uuid: card.uuid.clone(),
            mode: slice.spec.mode,
            core: slice.spec.core,
            memory_mib: slice.spec.memory.as_deref().and_then(parse_slice_memory),
            slices: slice.spec.slices,
            mig_profile: slice.spec.mig_profile.clone(),
            mig_start: slice.spec.mig_placement_start,
            pod_uid: slice.spec.pod.uid.clone(),
            pod_namespace: slice.spec.pod.namespace.clone(),
            pod_name: slice.spec.pod.name.clone(),
            container: slice.spec.pod.container.clone(),
            phase: slice.status.as_ref().and_then(|s| s.phase),
            deleting: slice.metadata.deletion_timestamp.is_some(),
            created: slice.metadata.creation_timestamp.clone(),
        })
    }

    /// The resource-layer instance key of this slice: `<namespace>/<name>`.
    pub fn key(&self) -> String {
        instance_key(&self.namespace, &self.name)
    }

    /// Whether the slice partitions its card (TDM or MIG) rather than taking it whole.
    pub fn partitions(&self) -> bool {
        self.mode != SliceMode::Whole
    }

    /// Whether the agent has acted on the slice (its instance exists or is being made or
    /// destroyed).
    pub fn enacted(&self) -> bool {
        matches!(
            self.phase,
            Some(SlicePhase::Creating | SlicePhase::Ready | SlicePhase::Releasing)
        )
    }
}

/// The resource-layer instance key of a slice.
pub fn instance_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// A card the kubelet gave whole to a pod, as the kubelet's pod-resources API reports it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct WholeHolder {
    /// The whole-card resource it was given through.
    pub resource: String,
    /// `<namespace>/<name>` of the pod.
    pub pod: String,
}

/// Everything the agent knows about its node.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeState {
    /// The cards, once the resource layer has answered.
    pub inventory: Option<Inventory>,
    /// The faults active on each card.
    pub faults: FaultState,
    /// The GpuSlices of this node.
    pub slices: Vec<SliceInfo>,
    /// Whether `slices` reflects a complete listing.
    pub slices_synced: bool,
    /// Cards the kubelet gave whole to pods, by card index (empty when the pod-resources API
    /// cannot be reached).
    pub held_whole: BTreeMap<u32, Vec<WholeHolder>>,
    /// Pods (`<namespace>/<name>`) this agent has seen GpuSlices of on this node, kept while
    /// they have slices or the kubelet still lists them: a card the kubelet's books still give
    /// to such a pod after it ended is not held outside the scheduler.
    pub own_pods: BTreeSet<String>,
    /// The devices the DRA plugin prepared for claims on this node.
    pub prepared: Vec<PreparedDevice>,
    /// The containers using each claim (`<namespace>/<name>`), as the kubelet's pod resources
    /// list them (empty when that API cannot be reached).
    pub claim_users: BTreeMap<String, Vec<ClaimUser>>,
    /// What the node installer beside the agent last said; `None` when the agent runs without
    /// one (`--runtime-status` unset).
    pub install: Option<crate::install::status::InstallStatus>,
}

/// A container using a ResourceClaim.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ClaimUser {
    /// The pod's namespace (the claim's).
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The container.
    pub container: String,
}

/// A pod a claim is reserved for (`status.reservedFor`) when it was prepared.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ClaimPod {
    /// The pod's name, in the claim's namespace.
    pub name: String,
    /// Its UID, by which its processes are found.
    pub uid: String,
}

/// One device of a ResourceClaim that the DRA plugin prepared on this node.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedDevice {
    /// `<namespace>/<name>` of the claim.
    pub claim: String,
    /// The claim's UID.
    pub claim_uid: String,
    /// The request it was allocated for (without a subrequest).
    pub request: String,
    /// The device's name in the pool.
    pub device: String,
    /// The card it is on (none for a NIC).
    pub card: Option<u32>,
    /// How it uses the card.
    pub mode: Option<SliceMode>,
    /// The resource-layer instance made for it (a share or a MIG instance).
    pub instance_key: Option<String>,
    /// A share's compute percent.
    pub core: Option<u32>,
    /// A share's memory cap in MiB.
    pub memory_mib: Option<u64>,
    /// The pods the claim was reserved for.
    #[serde(default)]
    pub pods: Vec<ClaimPod>,
}

impl PreparedDevice {
    /// The card this device holds: none for a NIC, or for a device given for monitoring only
    /// (`adminAccess`, recorded without a mode), which leaves its card to others.
    pub fn holds_card(&self) -> Option<u32> {
        self.mode.and(self.card)
    }
}

impl NodeState {
    /// Whether a card is healthy: listed, not lost, known (a card never read in full is not),
    /// and without a critical fault.
    pub fn healthy(&self, device: &pb::Device) -> bool {
        device.state() != pb::DeviceState::Lost
            && !(device.state() == pb::DeviceState::Partial && device.model.is_empty())
            && device.healthy
            && self.faults.healthy(device.index)
    }

    /// The resource-layer instances the DRA plugin made for claims.
    pub fn prepared_instance_keys(&self) -> impl Iterator<Item = &str> {
        self.prepared
            .iter()
            .filter_map(|p| p.instance_key.as_deref())
    }

    /// The slices on a card.
    pub fn slices_on(&self, card: u32) -> impl Iterator<Item = &SliceInfo> {
        self.slices.iter().filter(move |s| s.card == card)
    }

    /// Why a card may not be given whole to a pod the kubelet admits (empty when it may):
    /// it is unhealthy, in MIG mode, or holds slices, instances or claims.
    pub fn whole_card_blockers(&self, device: &pb::Device) -> Vec<String> {
        let mut blockers = Vec::new();
        if !self.healthy(device) {
            blockers.push(format!(
                "it is unhealthy ({})",
                self.faults
                    .reason(device.index)
                    .unwrap_or_else(|| "reported unhealthy by the resource layer".into())
            ));
        }
        if mig_enabled(device) {
            blockers.push("it is in MIG mode".into());
        }
        let sliced: Vec<String> = self
            .slices_on(device.index)
            .filter(|s| s.partitions())
            .map(SliceInfo::key)
            .collect();
        if !sliced.is_empty() {
            blockers.push(format!("it holds GPU slices ({})", sliced.join(", ")));
        }
        let keyed: BTreeSet<String> = sliced.into_iter().collect();
        let instances: Vec<String> = device
            .instances
            .iter()
            .filter(|i| !keyed.contains(&i.key))
            .map(|i| {
                if i.key.is_empty() {
                    "an unclaimed instance".to_owned()
                } else {
                    i.key.clone()
                }
            })
            .collect();
        if !instances.is_empty() {
            blockers.push(format!("it holds instances ({})", instances.join(", ")));
        }
        let claims = self.claims_holding(device.index);
        if !claims.is_empty() {
            blockers.push(format!(
                "it is prepared for ResourceClaims ({})",
                claims.join(", ")
            ));
        }
        blockers
    }

    /// The claims (`<namespace>/<name>`) that hold a card: every prepared device on it except
    /// those given for monitoring only (`adminAccess`).
    pub fn claims_holding(&self, card: u32) -> Vec<String> {
        let held: BTreeSet<&str> = self
            .prepared
            .iter()
            .filter(|p| p.holds_card() == Some(card))
            .map(|p| p.claim.as_str())
            .collect();
        held.into_iter().map(str::to_owned).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(index: u32, state: pb::DeviceState, model: &str) -> pb::Device {
        pb::Device {
            index,
            uuid: format!("GPU-{index}"),
            model: model.into(),
            state: state.into(),
            healthy: state == pb::DeviceState::Ok,
            ..Default::default()
        }
    }

    #[test]
    fn a_lost_card_keeps_what_was_known_of_it() {
        let mut inventory = Inventory::default();
        inventory.merge(
            pb::ListDevicesResponse {
                control_nodes: Vec::new(),
                device_root: String::new(),
                errors: Vec::new(),
                devices: vec![
                    device(0, pb::DeviceState::Ok, "H800"),
                    device(1, pb::DeviceState::Ok, "H800"),
                ],
                nics: vec![],
                paths: vec![pb::DevicePath {
                    a: 0,
                    b: 1,
                    links: 8,
                    ..Default::default()
                }],
            },
            &[],
        );
        inventory.merge(
            pb::ListDevicesResponse {
                devices: vec![device(1, pb::DeviceState::Lost, "")],
                nics: vec![],
                paths: vec![],
                ..Default::default()
            },
            &[1],
        );
        let lost = &inventory.devices[&1];
        assert_eq!(lost.model, "H800");
        assert_eq!(lost.state(), pb::DeviceState::Lost);
        assert!(!lost.healthy);
        assert_eq!(
            inventory.paths.len(),
            1,
            "a listing of card 1 alone says nothing of the path to card 0"
        );

        // A full listing replaces every path and drops cards no longer listed.
        inventory.merge(
            pb::ListDevicesResponse {
                devices: vec![device(0, pb::DeviceState::Ok, "H800")],
                nics: vec![],
                paths: vec![],
                ..Default::default()
            },
            &[],
        );
        assert_eq!(inventory.devices.len(), 1);
        assert!(inventory.paths.is_empty());
    }

    #[test]
    fn a_card_read_in_part_keeps_its_known_instances_and_an_unknown_one_is_unhealthy() {
        let mut known = device(0, pb::DeviceState::Ok, "H800");
        known.instances = vec![pb::Instance {
            key: "default/pod".into(),
            ..Default::default()
        }];
        let mut inventory = Inventory::default();
        inventory.merge(
            pb::ListDevicesResponse {
                devices: vec![known],
                ..Default::default()
            },
            &[],
        );
        // Its MIG instances could not be read this time: the listing has none.
        let mut partial = device(0, pb::DeviceState::Partial, "H800");
        partial.healthy = true;
        inventory.merge(
            pb::ListDevicesResponse {
                devices: vec![partial.clone(), {
                    let mut never = device(1, pb::DeviceState::Partial, "");
                    never.healthy = true;
                    never
                }],
                ..Default::default()
            },
            &[],
        );
        let card = &inventory.devices[&0];
        assert_eq!(card.state(), pb::DeviceState::Partial);
        assert_eq!(card.instances.len(), 1, "what was known is kept");
        let state = NodeState::default();
        assert!(state.healthy(card), "a card known before stays usable");
        assert!(
            !state.healthy(&inventory.devices[&1]),
            "a card never read cannot be offered"
        );
    }
}
