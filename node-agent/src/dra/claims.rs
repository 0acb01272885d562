//! What an allocated ResourceClaim asks of this node, checked against what the node holds,
//! without I/O. The allocator decided from the published pool, but the node is the last word:
//! a device already prepared for another claim (when it is exclusive), a card the kit's own
//! ledger gave away since, or shares beyond a card's capacity fail the claim with a message
//! naming why, before anything is made, so a card never gets a second tenant it cannot hold.

use crate::model::{ClaimPod, NodeState, PreparedDevice, mig_enabled, tdm_capable};
use k8s_openapi::api::resource::v1::{DeviceRequestAllocationResult, ResourceClaim};
use runtimekit_contract::dra::{
    CAPACITY_CORE, CAPACITY_MEMORY, DeviceName, base_request, nic_device,
};
use runtimekit_contract::quantity::parse_whole;
use runtimekit_crds::SliceMode;
use runtimekit_injection::grant::{Grant, GrantedCard, Mode};
use runtimekit_proto::resource::v1alpha1 as pb;

/// One device of a claim as this node prepares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    /// The request it was allocated for, without a subrequest (what containers name).
    pub request: String,
    /// The device's name in the pool.
    pub device: String,
    /// What it is.
    pub part: Part,
    /// Given for monitoring only (`adminAccess`): nothing is made and nothing is exclusive.
    pub admin: bool,
}

/// What a device is on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// A card, whole.
    Whole {
        /// The card.
        card: u32,
        /// Its UUID.
        uuid: String,
    },
    /// A time-division share of a card.
    Share {
        /// The card.
        card: u32,
        /// Its UUID.
        uuid: String,
        /// Compute percent; `None` means no compute cap.
        core: Option<u32>,
        /// Memory cap in MiB; `None` means none.
        memory_mib: Option<u64>,
    },
    /// A MIG instance.
    Mig {
        /// The card.
        card: u32,
        /// Its UUID.
        uuid: String,
        /// The profile, as the card names it.
        profile: String,
        /// The placement start.
        start: u32,
    },
    /// An RDMA NIC.
    Nic {
        /// Its name.
        name: String,
    },
}

impl Part {
    /// The card it is on.
    pub fn card(&self) -> Option<u32> {
        match self {
            Part::Whole { card, .. } | Part::Share { card, .. } | Part::Mig { card, .. } => {
                Some(*card)
            }
            Part::Nic { .. } => None,
        }
    }

    /// How it uses its card.
    pub fn mode(&self) -> Option<SliceMode> {
        match self {
            Part::Whole { .. } => Some(SliceMode::Whole),
            Part::Share { .. } => Some(SliceMode::Tdm),
            Part::Mig { .. } => Some(SliceMode::Mig),
            Part::Nic { .. } => None,
        }
    }
}

/// The resource-layer key of an instance made for a claim's device: `dra:<uid>:<device>`,
/// which the slice enactor never takes for one of its own (those are `<namespace>/<name>`).
pub fn instance_key(claim_uid: &str, request: &str, device: &str) -> String {
    format!("dra:{claim_uid}:{request}:{device}")
}

/// Whether a resource-layer key is one the DRA plugin makes.
pub fn is_claim_key(key: &str) -> bool {
    key.starts_with("dra:")
}

/// The record of a planned device once prepared, for the claim reserved for `pods`.
pub fn prepared(
    claim: &str,
    claim_uid: &str,
    planned: &Planned,
    pods: &[ClaimPod],
) -> PreparedDevice {
    let (core, memory_mib) = match &planned.part {
        Part::Share {
            core, memory_mib, ..
        } => (*core, *memory_mib),
        _ => (None, None),
    };
    PreparedDevice {
        claim: claim.to_owned(),
        claim_uid: claim_uid.to_owned(),
        request: planned.request.clone(),
        device: planned.device.clone(),
        card: planned.part.card(),
        mode: if planned.admin {
            None
        } else {
            planned.part.mode()
        },
        instance_key: matches!(planned.part, Part::Share { .. } | Part::Mig { .. })
            .then(|| instance_key(claim_uid, &planned.request, &planned.device))
            .filter(|_| !planned.admin),
        core,
        memory_mib,
        pods: pods.to_vec(),
    }
}

/// The pods a claim is reserved for.
pub fn reserved_pods(claim: &ResourceClaim) -> Vec<ClaimPod> {
    claim
        .status
        .as_ref()
        .and_then(|s| s.reserved_for.as_ref())
        .into_iter()
        .flatten()
        .filter(|r| r.resource == "pods" && r.api_group.as_deref().unwrap_or_default().is_empty())
        .map(|r| ClaimPod {
            name: r.name.clone(),
            uid: r.uid.clone(),
        })
        .collect()
}

/// The resource-layer instance a planned device needs (a share or a MIG placement, unless
/// given for monitoring only), with its key.
pub fn instance(claim_uid: &str, planned: &Planned) -> Option<(String, pb::InstanceSpec)> {
    if planned.admin {
        return None;
    }
    let (card, uuid, kind) = match &planned.part {
        Part::Share {
            card,
            uuid,
            core,
            memory_mib,
        } => (
            card,
            uuid,
            pb::instance_spec::Kind::Tdm(pb::TdmSpec {
                core_percent: core.unwrap_or(0),
                memory_mib: memory_mib.unwrap_or(0),
            }),
        ),
        Part::Mig {
            card,
            uuid,
            profile,
            start,
        } => (
            card,
            uuid,
            pb::instance_spec::Kind::Mig(pb::MigSpec {
                profile: profile.clone(),
                placement_start: *start,
            }),
        ),
        Part::Whole { .. } | Part::Nic { .. } => return None,
    };
    Some((
        instance_key(claim_uid, &planned.request, &planned.device),
        pb::InstanceSpec {
            device_index: *card,
            device_uuid: uuid.clone(),
            kind: Some(kind),
        },
    ))
}

/// What each request of the claim gives its containers, in the order the requests first
/// appear: its cards (a device given for monitoring only is given whole, without caps) and NICs.
pub fn grants(claim_uid: &str, planned: &[Planned]) -> Vec<(String, Grant)> {
    let mut grants: Vec<(String, Grant)> = Vec::new();
    for device in planned {
        let at = match grants.iter().position(|(r, _)| *r == device.request) {
            Some(at) => at,
            None => {
                grants.push((device.request.clone(), Grant::default()));
                grants.len() - 1
            }
        };
        let grant = &mut grants[at].1;
        let card = |index: &u32, uuid: &str, mode| GrantedCard {
            index: *index,
            uuid: uuid.to_owned(),
            mode,
            core: None,
            memory_mib: None,
            instance: None,
        };
        match &device.part {
            Part::Nic { name } => grant.nics.push(name.clone()),
            Part::Whole { card: i, uuid }
            | Part::Share { card: i, uuid, .. }
            | Part::Mig { card: i, uuid, .. }
                if device.admin =>
            {
                grant.cards.push(card(i, uuid, Mode::Whole));
            }
            Part::Whole { card: i, uuid } => grant.cards.push(card(i, uuid, Mode::Whole)),
            Part::Share {
                card: i,
                uuid,
                core,
                memory_mib,
            } => grant.cards.push(GrantedCard {
                core: *core,
                memory_mib: *memory_mib,
                ..card(i, uuid, Mode::Tdm)
            }),
            Part::Mig { card: i, uuid, .. } => grant.cards.push(GrantedCard {
                instance: Some(instance_key(claim_uid, &device.request, &device.device)),
                ..card(i, uuid, Mode::Mig)
            }),
        }
    }
    grants
}

/// What the claim's allocation asks of this node's pool, checked against what the node holds
/// (`state.prepared` other than this claim's own).
pub fn plan(
    claim: &ResourceClaim,
    node: &str,
    driver: &str,
    state: &NodeState,
) -> Result<Vec<Planned>, String> {
    let name = format!(
        "{}/{}",
        claim.metadata.namespace.as_deref().unwrap_or_default(),
        claim.metadata.name.as_deref().unwrap_or_default()
    );
    let uid = claim.metadata.uid.as_deref().unwrap_or_default();
    if claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .is_none()
    {
        return Err(format!("ResourceClaim {name} is not allocated"));
    }
    let inventory = state
        .inventory
        .as_ref()
        .ok_or_else(|| "the node agent has not read the node's cards yet".to_owned())?;
    let others: Vec<&PreparedDevice> = state
        .prepared
        .iter()
        .filter(|p| p.claim_uid != uid)
        .collect();
    let mut planned: Vec<Planned> = Vec::new();
    for result in runtimekit_contract::dra::allocated(claim, driver) {
        if result.pool != node {
            return Err(format!(
                "ResourceClaim {name}: device {} was allocated from pool {}, not from this node {node}",
                result.device, result.pool
            ));
        }
        let admin = result.admin_access == Some(true);
        let part = part_of(result, inventory, &name)?;
        if !admin {
            let own = format!("dra:{uid}:");
            check(&part, &result.device, state, &others, &planned, &own)?;
        }
        planned.push(Planned {
            request: base_request(&result.request).to_owned(),
            device: result.device.clone(),
            part,
            admin,
        });
    }
    Ok(planned)
}

/// What a result's device is on this node.
fn part_of(
    result: &DeviceRequestAllocationResult,
    inventory: &crate::model::Inventory,
    claim: &str,
) -> Result<Part, String> {
    let unknown = || {
        format!(
            "ResourceClaim {claim}: device {} is not a device this node offers",
            result.device
        )
    };
    let parsed = DeviceName::parse(&result.device).ok_or_else(unknown)?;
    let card = |index: u32| inventory.devices.get(&index).ok_or_else(unknown);
    Ok(match parsed {
        DeviceName::Whole(index) => Part::Whole {
            card: index,
            uuid: card(index)?.uuid.clone(),
        },
        DeviceName::Share(index) => {
            let consumed = |name: &str| -> Result<Option<u64>, String> {
                let Some(quantity) = result.consumed_capacity.as_ref().and_then(|c| c.get(name))
                else {
                    return Ok(None);
                };
                let value = parse_whole(&quantity.0)
                    .ok()
                    .and_then(|v| u64::try_from(v).ok())
                    .ok_or_else(|| {
                        format!(
                            "ResourceClaim {claim}: device {} was given {name} {:?}, which is not a whole amount",
                            result.device, quantity.0
                        )
                    })?;
                Ok(Some(value))
            };
            let core = consumed(CAPACITY_CORE)?.filter(|c| *c > 0);
            let memory = consumed(CAPACITY_MEMORY)?
                .filter(|m| *m > 0)
                .map(|bytes| bytes.div_ceil(1 << 20));
            Part::Share {
                card: index,
                uuid: card(index)?.uuid.clone(),
                core: core.map(|c| u32::try_from(c).unwrap_or(u32::MAX)),
                memory_mib: memory,
            }
        }
        DeviceName::Mig {
            card: index,
            profile,
            start,
        } => {
            let device = card(index)?;
            let profile = device
                .mig
                .as_ref()
                .and_then(|m| {
                    m.profiles.iter().find(|p| {
                        DeviceName::names_profile(&profile, &p.name) && p.starts.contains(&start)
                    })
                })
                .ok_or_else(unknown)?;
            Part::Mig {
                card: index,
                uuid: device.uuid.clone(),
                profile: profile.name.clone(),
                start,
            }
        }
        DeviceName::Nic(_) => {
            let nic = inventory
                .nics
                .iter()
                .find(|n| nic_device(&n.name) == result.device)
                .ok_or_else(unknown)?;
            Part::Nic {
                name: nic.name.clone(),
            }
        }
    })
}

/// Whether the node can still give `part`: the card is healthy and in the mode the part needs,
/// and nothing else holds what the part needs of it.
fn check(
    part: &Part,
    device_name: &str,
    state: &NodeState,
    others: &[&PreparedDevice],
    earlier: &[Planned],
    own_keys: &str,
) -> Result<(), String> {
    let Some(index) = part.card() else {
        return Ok(());
    };
    let inventory = state.inventory.as_ref().ok_or("no inventory")?;
    let device = &inventory.devices[&index];
    let refuse = |why: String| Err(format!("device {device_name} (card {index}): {why}"));
    if !state.healthy(device) {
        return refuse(format!(
            "the card is unhealthy ({})",
            state
                .faults
                .reason(index)
                .unwrap_or_else(|| "reported unhealthy by the resource layer".into())
        ));
    }
    let claims_on = |modes: &[SliceMode]| -> Vec<String> {
        others
            .iter()
            .filter(|p| p.card == Some(index) && p.mode.is_some_and(|m| modes.contains(&m)))
            .map(|p| format!("ResourceClaim {}", p.claim))
            .chain(
                earlier
                    .iter()
                    .filter(|p| !p.admin && p.part.card() == Some(index))
                    .filter(|p| p.part.mode().is_some_and(|m| modes.contains(&m)))
                    .map(|p| format!("request {} of this claim", p.request)),
            )
            .collect()
    };
    let held_whole = !state.held_whole.get(&index).is_none_or(Vec::is_empty);
    let slices: Vec<String> = state
        .slices_on(index)
        .map(|s| format!("GpuSlice {}/{}", s.namespace, s.name))
        .collect();
    match part {
        Part::Whole { .. } => {
            if mig_enabled(device) {
                return refuse("the card is in MIG mode".into());
            }
            let mut holders = claims_on(&[SliceMode::Whole, SliceMode::Tdm, SliceMode::Mig]);
            holders.extend(slices);
            if held_whole {
                holders.push("a pod the kubelet gave it whole through the device plugin".into());
            }
            let foreign: Vec<String> = device
                .instances
                .iter()
                .filter(|i| !i.key.starts_with(own_keys))
                .map(|i| {
                    format!(
                        "instance {}",
                        if i.key.is_empty() {
                            "(unclaimed)"
                        } else {
                            &i.key
                        }
                    )
                })
                .collect();
            holders.extend(foreign);
            if !holders.is_empty() {
                return refuse(format!(
                    "the card is already held by {}",
                    holders.join(", ")
                ));
            }
        }
        Part::Share {
            core, memory_mib, ..
        } => {
            if !tdm_capable(device) {
                return refuse("the card cannot hold time-division shares".into());
            }
            let mut whole = claims_on(&[SliceMode::Whole]);
            whole.extend(
                state
                    .slices_on(index)
                    .filter(|s| s.mode == SliceMode::Whole)
                    .map(|s| format!("GpuSlice {}/{}", s.namespace, s.name)),
            );
            if held_whole {
                whole.push("a pod the kubelet gave it whole through the device plugin".into());
            }
            if !whole.is_empty() {
                return refuse(format!("the card is held whole by {}", whole.join(", ")));
            }
            let (mut used_core, mut used_memory) = (0u64, 0u64);
            for slice in state.slices_on(index).filter(|s| s.mode == SliceMode::Tdm) {
                used_core += u64::from(slice.core.unwrap_or(0));
                used_memory += slice.memory_mib.unwrap_or(0);
            }
            for other in others.iter().filter(|p| p.card == Some(index)) {
                used_core += u64::from(other.core.unwrap_or(0));
                used_memory += other.memory_mib.unwrap_or(0);
            }
            for earlier in earlier {
                if let Part::Share {
                    card,
                    core,
                    memory_mib,
                    ..
                } = &earlier.part
                    && *card == index
                {
                    used_core += u64::from(core.unwrap_or(0));
                    used_memory += memory_mib.unwrap_or(0);
                }
            }
            let want_core = u64::from(core.unwrap_or(0));
            if used_core + want_core > 100 {
                return refuse(format!(
                    "{want_core}% core asked, but the card's shares already hold {used_core}% of 100%"
                ));
            }
            let want_memory = memory_mib.unwrap_or(0);
            if used_memory + want_memory > device.memory_mib {
                return refuse(format!(
                    "{want_memory} MiB asked, but the card's shares already hold {used_memory} of its {} MiB",
                    device.memory_mib
                ));
            }
        }
        Part::Mig { profile, start, .. } => {
            if !mig_enabled(device) {
                return refuse("the card is not in MIG mode".into());
            }
            let size = |profile: &str| {
                device
                    .mig
                    .as_ref()
                    .and_then(|m| m.profiles.iter().find(|p| p.name == profile))
                    .map_or(1, |p| p.memory_slices)
            };
            let mine = *start..start + size(profile);
            let overlapping: Vec<String> = device
                .instances
                .iter()
                .filter(|i| !i.key.starts_with(own_keys))
                .filter_map(|i| {
                    let Some(pb::instance_spec::Kind::Mig(spec)) =
                        i.spec.as_ref().and_then(|s| s.kind.as_ref())
                    else {
                        return None;
                    };
                    let theirs = spec.placement_start..spec.placement_start + size(&spec.profile);
                    (theirs.start < mine.end && mine.start < theirs.end)
                        .then(|| format!("{} at {}", spec.profile, spec.placement_start))
                })
                .collect();
            if !overlapping.is_empty() {
                return refuse(format!(
                    "{profile} at {start} overlaps the card's instances {}",
                    overlapping.join(", ")
                ));
            }
        }
        Part::Nic { .. } => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests;
