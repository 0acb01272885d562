//! What an allocated ResourceClaim asks of this node, checked against what the node holds,
//! without I/O. The allocator decided from the published pool, but the node is the last word:
//! a device already prepared for another claim (when it is exclusive), a card the kit's own
//! ledger gave away since, or shares beyond a card's capacity fail the claim with a message
//! naming why, before anything is made, so a card never gets a second tenant it cannot hold.

use super::names::{CAPACITY_CORE, CAPACITY_MEMORY, DeviceName, nic_device};
use crate::model::{NodeState, PreparedDevice, mig_enabled, tdm_capable};
use k8s_openapi::api::resource::v1::{DeviceRequestAllocationResult, ResourceClaim};
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

/// `request` without a subrequest (`gpu/first` is `gpu`).
pub fn base_request(request: &str) -> &str {
    request.split_once('/').map_or(request, |(base, _)| base)
}

/// The record of a planned device once prepared.
pub fn prepared(claim: &str, claim_uid: &str, planned: &Planned) -> PreparedDevice {
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
    }
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
    let allocation = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .ok_or_else(|| format!("ResourceClaim {name} is not allocated"))?;
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
    for result in allocation
        .devices
        .as_ref()
        .and_then(|d| d.results.as_ref())
        .into_iter()
        .flatten()
    {
        if result.driver != driver {
            continue;
        }
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
mod tests {
    use super::*;
    use crate::fixtures::{four_cards, slice};
    use runtimekit_crds::SlicePhase;
    use serde_json::json;

    const DRIVER: &str = "gpu.runtimekit.aliyun.com";

    fn claim(uid: &str, results: serde_json::Value) -> ResourceClaim {
        serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"namespace": "team", "name": format!("claim-{uid}"), "uid": uid},
            "spec": {"devices": {"requests": []}},
            "status": {"allocation": {"devices": {"results": results}}},
        }))
        .expect("claim")
    }

    fn result(request: &str, device: &str) -> serde_json::Value {
        json!({"request": request, "driver": DRIVER, "pool": "n1", "device": device})
    }

    fn share(core: &str, memory: &str) -> serde_json::Value {
        json!({"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-1-share",
               "shareID": "00000000-0000-0000-0000-000000000001",
               "consumedCapacity": {"core": core, "memory": memory}})
    }

    fn state() -> NodeState {
        let mut state = four_cards();
        let mig = state
            .inventory
            .as_mut()
            .and_then(|i| i.devices.get_mut(&3))
            .and_then(|d| d.mig.as_mut())
            .expect("mig");
        mig.profiles = vec![
            pb::MigProfileInfo {
                name: "1g.10gb".into(),
                slices: 1,
                memory_slices: 1,
                starts: (0..7).collect(),
                ..Default::default()
            },
            pb::MigProfileInfo {
                name: "3g.40gb".into(),
                slices: 3,
                memory_slices: 4,
                starts: vec![0, 4],
                ..Default::default()
            },
        ];
        state
    }

    fn other_claim(card: u32, mode: SliceMode, core: Option<u32>) -> PreparedDevice {
        PreparedDevice {
            claim: "team/other".into(),
            claim_uid: "other".into(),
            request: "gpu".into(),
            device: "x".into(),
            card: Some(card),
            mode: Some(mode),
            instance_key: None,
            core,
            memory_mib: core.map(|_| 1024),
        }
    }

    #[test]
    fn a_free_card_a_share_a_placement_and_a_nic_are_planned() {
        let claim = claim(
            "u1",
            json!([result("gpu/first", "gpu-0"), share("50", "4Gi"),
                   result("mig", "gpu-3-mig-1g10gb-2"), result("nic", "nic-mlx5-0"),
                   {"request": "other", "driver": "other.example.com", "pool": "n1", "device": "dev-0"}]),
        );
        let planned = plan(&claim, "n1", DRIVER, &state()).expect("planned");
        let parts: Vec<(&str, &Part)> = planned
            .iter()
            .map(|p| (p.request.as_str(), &p.part))
            .collect();
        assert_eq!(
            parts,
            [
                (
                    "gpu",
                    &Part::Whole {
                        card: 0,
                        uuid: "GPU-0".into()
                    }
                ),
                (
                    "gpu",
                    &Part::Share {
                        card: 1,
                        uuid: "GPU-1".into(),
                        core: Some(50),
                        memory_mib: Some(4096)
                    }
                ),
                (
                    "mig",
                    &Part::Mig {
                        card: 3,
                        uuid: "GPU-3".into(),
                        profile: "1g.10gb".into(),
                        start: 2
                    }
                ),
                (
                    "nic",
                    &Part::Nic {
                        name: "mlx5_0".into()
                    }
                ),
            ],
            "another driver's result is not this node's to prepare"
        );
        let record = prepared("team/claim-u1", "u1", &planned[1]);
        assert_eq!(
            record.instance_key.as_deref(),
            Some("dra:u1:gpu:gpu-1-share")
        );
        assert!(is_claim_key(
            record.instance_key.as_deref().unwrap_or_default()
        ));
        assert_eq!(
            prepared("team/claim-u1", "u1", &planned[0]).instance_key,
            None
        );
        let (key, spec) = instance("u1", &planned[2]).expect("a MIG placement is made");
        assert_eq!(key, "dra:u1:mig:gpu-3-mig-1g10gb-2");
        assert_eq!(spec.device_index, 3);
        assert!(instance("u1", &planned[0]).is_none() && instance("u1", &planned[3]).is_none());
        let grants = grants("u1", &planned);
        let requests: Vec<&str> = grants.iter().map(|(r, _)| r.as_str()).collect();
        assert_eq!(requests, ["gpu", "mig", "nic"]);
        let gpu = &grants[0].1;
        assert_eq!(
            gpu.cards.iter().map(|c| c.mode).collect::<Vec<_>>(),
            [Mode::Whole, Mode::Tdm]
        );
        assert_eq!(
            (gpu.cards[1].core, gpu.cards[1].memory_mib),
            (Some(50), Some(4096))
        );
        assert_eq!(
            grants[1].1.instance_keys(),
            ["dra:u1:mig:gpu-3-mig-1g10gb-2"]
        );
        assert_eq!(grants[2].1.nics, ["mlx5_0"]);
        let mut monitoring = planned[1].clone();
        monitoring.admin = true;
        assert!(
            instance("u1", &monitoring).is_none(),
            "nothing is made for admin access"
        );
        assert_eq!(grants_of(&monitoring)[0].mode, Mode::Whole);
    }

    fn grants_of(planned: &Planned) -> Vec<GrantedCard> {
        grants("u", std::slice::from_ref(planned))
            .into_iter()
            .flat_map(|(_, g)| g.cards)
            .collect()
    }

    #[test]
    fn a_card_held_elsewhere_is_never_given_a_second_tenant() {
        let mut state = state();
        state.slices = vec![slice("t", 1, SliceMode::Tdm, SlicePhase::Ready)];
        state.prepared = vec![other_claim(0, SliceMode::Whole, None)];
        let error = plan(
            &claim("u1", json!([result("gpu", "gpu-0")])),
            "n1",
            DRIVER,
            &state,
        )
        .expect_err("held");
        assert_eq!(
            error,
            "device gpu-0 (card 0): the card is already held by ResourceClaim team/other"
        );
        let error = plan(
            &claim("u1", json!([result("gpu", "gpu-1")])),
            "n1",
            DRIVER,
            &state,
        )
        .expect_err("sliced");
        assert!(error.contains("GpuSlice ns/t"), "{error}");
        // Two requests of one claim cannot take one card whole twice either.
        let twice = claim("u1", json!([result("a", "gpu-2"), result("b", "gpu-2")]));
        let error = plan(&twice, "n1", DRIVER, &state).expect_err("twice");
        assert!(error.contains("request a of this claim"), "{error}");
        // The claim's own earlier preparation is not another tenant.
        state.prepared = vec![PreparedDevice {
            claim_uid: "u1".into(),
            ..other_claim(0, SliceMode::Whole, None)
        }];
        assert!(
            plan(
                &claim("u1", json!([result("gpu", "gpu-0")])),
                "n1",
                DRIVER,
                &state
            )
            .is_ok()
        );
    }

    #[test]
    fn shares_beyond_a_cards_capacity_are_refused() {
        let mut state = state();
        state.slices = vec![slice("t", 1, SliceMode::Tdm, SlicePhase::Ready)];
        state.prepared = vec![other_claim(1, SliceMode::Tdm, Some(30))];
        assert!(
            plan(
                &claim("u1", json!([share("20", "1Gi")])),
                "n1",
                DRIVER,
                &state
            )
            .is_ok()
        );
        let error = plan(
            &claim("u1", json!([share("21", "1Gi")])),
            "n1",
            DRIVER,
            &state,
        )
        .expect_err("over");
        assert_eq!(
            error,
            "device gpu-1-share (card 1): 21% core asked, but the card's shares already hold 80% of 100%"
        );
        let error = plan(
            &claim("u1", json!([share("0", "80Gi")])),
            "n1",
            DRIVER,
            &state,
        )
        .expect_err("memory");
        assert!(
            error.contains(
                "81920 MiB asked, but the card's shares already hold 5120 of its 81559 MiB"
            ),
            "{error}"
        );
        state.prepared = vec![other_claim(1, SliceMode::Whole, None)];
        let error = plan(
            &claim("u1", json!([share("10", "1Gi")])),
            "n1",
            DRIVER,
            &state,
        )
        .expect_err("whole");
        assert!(
            error.contains("held whole by ResourceClaim team/other"),
            "{error}"
        );
    }

    #[test]
    fn a_placement_overlapping_an_instance_is_refused() {
        // Card 3 holds a 3g.40gb at 4 (slice ns/a) and an unclaimed 1g.10gb at 0.
        let state = state();
        let error = plan(
            &claim("u1", json!([result("mig", "gpu-3-mig-1g10gb-5")])),
            "n1",
            DRIVER,
            &state,
        )
        .expect_err("overlap");
        assert_eq!(
            error,
            "device gpu-3-mig-1g10gb-5 (card 3): 1g.10gb at 5 overlaps the card's instances 3g.40gb at 4"
        );
        let error = plan(
            &claim("u1", json!([result("mig", "gpu-3-mig-3g40gb-0")])),
            "n1",
            DRIVER,
            &state,
        )
        .expect_err("overlap");
        assert!(error.contains("1g.10gb at 0"), "{error}");
        let error = plan(
            &claim("u1", json!([result("gpu", "gpu-3")])),
            "n1",
            DRIVER,
            &state,
        )
        .expect_err("mig mode");
        assert!(error.contains("in MIG mode"), "{error}");
    }

    #[test]
    fn foreign_unknown_and_unallocated_claims_say_why() {
        let state = state();
        let elsewhere = claim(
            "u1",
            json!([{"request": "gpu", "driver": DRIVER, "pool": "n2", "device": "gpu-0"}]),
        );
        assert_eq!(
            plan(&elsewhere, "n1", DRIVER, &state).expect_err("pool"),
            "ResourceClaim team/claim-u1: device gpu-0 was allocated from pool n2, not from this node n1"
        );
        for device in [
            "gpu-9",
            "gpu-0-mig-1g10gb-0",
            "gpu-3-mig-7g80gb-0",
            "nic-mlx5-9",
            "fpga-0",
        ] {
            let error = plan(
                &claim("u1", json!([result("gpu", device)])),
                "n1",
                DRIVER,
                &state,
            )
            .expect_err(device);
            assert!(
                error.contains("is not a device this node offers"),
                "{device}: {error}"
            );
        }
        let mut pending = claim("u1", json!([]));
        pending.status = None;
        assert_eq!(
            plan(&pending, "n1", DRIVER, &state).expect_err("pending"),
            "ResourceClaim team/claim-u1 is not allocated"
        );
        let admin = claim(
            "u1",
            json!([{"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-3-mig-1g10gb-5", "adminAccess": true}]),
        );
        assert!(
            plan(&admin, "n1", DRIVER, &state).is_ok(),
            "admin access watches, it does not hold"
        );
    }
}
