//! The device plugin's choices, without I/O: which devices to suggest to the kubelet for a
//! container, and whether the devices the kubelet picked may be given.
//!
//! The v1beta1 protocol does not say which pod an allocation is for. For pods of this project's
//! scheduler the cards are already decided (their GpuSlices), so the suggestion is made for the
//! oldest bound pod whose slices ask for this many devices of this resource and have not been
//! suggested for yet; the kubelet admits pods one at a time, so that is the pod being admitted
//! unless two such pods arrive together, in which case only the attribution in the kubelet's
//! books can differ, never the cards a container uses (those come from its slices).

use crate::model::{NodeState, SliceInfo};
use crate::resources::{Advertised, Kind, base_id, devices, whole_card_available};
use runtimekit_crds::{SliceMode, SlicePhase};
use runtimekit_proto::deviceplugin::v1beta1 as dp;
use runtimekit_resource_layer::device_nodes::container_path;
use std::collections::{BTreeMap, BTreeSet};

/// The container a suggestion was made for.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Claim {
    /// The pod's UID.
    pub pod_uid: String,
    /// The container.
    pub container: String,
}

/// A container of a bound pod whose slices say which cards it gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// The container.
    pub claim: Claim,
    /// How many devices of the resource the container asks for.
    pub size: u32,
    /// The UUIDs of its cards, in replica order (empty: any card will do).
    pub cards: Vec<String>,
}

/// How many devices of `kind` a slice asks for, if any.
fn wants(kind: Kind, slice: &SliceInfo) -> Option<u32> {
    match (kind, slice.mode) {
        (Kind::Whole { .. }, SliceMode::Whole) => Some(1),
        (Kind::Core, SliceMode::Tdm) => slice.core,
        (Kind::Memory, SliceMode::Tdm | SliceMode::Mig) => {
            slice.memory_mib.and_then(|m| u32::try_from(m / 1024).ok())
        }
        (Kind::Slice, SliceMode::Mig) => slice.slices,
        _ => None,
    }
}

/// The containers of pods placed on this node whose slices ask for devices of `kind`, oldest
/// first.
pub fn candidates(kind: Kind, state: &NodeState) -> Vec<Candidate> {
    /// When the oldest slice was created, the size, and the cards (index, UUID).
    type Group = (Option<String>, u32, Vec<(u32, String)>);
    let mut grouped: BTreeMap<Claim, Group> = BTreeMap::new();
    for slice in &state.slices {
        let live = !matches!(
            slice.phase,
            Some(SlicePhase::Failed | SlicePhase::Releasing)
        );
        let Some(amount) = wants(kind, slice).filter(|_| live && !slice.deleting) else {
            continue;
        };
        let claim = Claim {
            pod_uid: slice.pod_uid.clone(),
            container: slice.container.clone(),
        };
        let created = slice.created.as_ref().map(|t| t.0.to_string());
        let entry = grouped.entry(claim).or_insert((created, 0, Vec::new()));
        // Whole cards add up; shares ask for the same amount on each card (the limit).
        entry.1 = if kind.whole() {
            entry.1 + amount
        } else {
            amount
        };
        // MIG slices ask for memory, but memory devices are the TDM cards': any will do.
        if !(kind == Kind::Memory && slice.mode == SliceMode::Mig) {
            entry.2.push((slice.card, slice.card_uuid.clone()));
        }
    }
    let mut candidates: Vec<(Option<String>, Candidate)> = grouped
        .into_iter()
        .map(|(claim, (created, size, mut cards))| {
            cards.sort();
            (
                created,
                Candidate {
                    claim,
                    size,
                    cards: cards.into_iter().map(|(_, u)| u).collect(),
                },
            )
        })
        .collect();
    candidates.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.claim.cmp(&b.1.claim)));
    candidates.into_iter().map(|(_, c)| c).collect()
}

/// Picks `size` devices for `cards` from `available`, `must` first: the whole cards
/// themselves, or replicas spread evenly over the cards.
fn pick_for(
    kind: Kind,
    cards: &[String],
    size: usize,
    available: &[String],
    must: &[String],
) -> Option<Vec<String>> {
    if cards.is_empty() {
        return None;
    }
    if kind.whole() {
        let fits = cards.len() == size
            && cards.iter().all(|c| available.contains(c))
            && must.iter().all(|m| cards.contains(m));
        return fits.then(|| cards.to_vec());
    }
    if must
        .iter()
        .any(|m| !cards.iter().any(|c| c == base_id(kind, m)))
    {
        return None;
    }
    let (each, extra) = (size / cards.len(), size % cards.len());
    let mut picked = Vec::with_capacity(size);
    for (i, card) in cards.iter().enumerate() {
        let quota = each + usize::from(i < extra);
        let mine = |id: &&String| base_id(kind, id) == card;
        let forced: Vec<&String> = must.iter().filter(mine).collect();
        let rest = available
            .iter()
            .filter(mine)
            .filter(|id| !must.contains(id));
        let chosen: Vec<&String> = forced.into_iter().chain(rest).take(quota).collect();
        if chosen.len() < quota {
            return None;
        }
        picked.extend(chosen.into_iter().cloned());
    }
    Some(picked)
}

/// Picks `size` devices when no candidate matches: `must` first, then cards no candidate
/// holds, lowest first.
fn fallback(
    kind: Kind,
    size: usize,
    available: &[String],
    must: &[String],
    reserved: &BTreeSet<String>,
) -> Vec<String> {
    let mut rest: Vec<&String> = available.iter().filter(|id| !must.contains(id)).collect();
    rest.sort_by_key(|id| (reserved.contains(base_id(kind, id)), natural(id)));
    must.iter().chain(rest).take(size).cloned().collect()
}

/// Sorts `X::2` before `X::10`.
fn natural(id: &str) -> (String, u64) {
    match id.rsplit_once("::") {
        Some((base, k)) => (base.to_owned(), k.parse().unwrap_or(u64::MAX)),
        None => (id.to_owned(), 0),
    }
}

/// The devices to suggest for one container, and the container they were picked for.
pub fn preferred(
    kind: Kind,
    request: &dp::ContainerPreferredAllocationRequest,
    state: &NodeState,
    claimed: &BTreeSet<Claim>,
) -> (Vec<String>, Option<Claim>) {
    let size = usize::try_from(request.allocation_size).unwrap_or(0);
    let available = &request.available_device_i_ds;
    let must = &request.must_include_device_i_ds;
    let candidates = candidates(kind, state);
    for candidate in candidates.iter().filter(|c| !claimed.contains(&c.claim)) {
        if usize::try_from(candidate.size).ok() != Some(size) {
            continue;
        }
        if let Some(picked) = pick_for(kind, &candidate.cards, size, available, must) {
            return (picked, Some(candidate.claim.clone()));
        }
    }
    let reserved: BTreeSet<String> = candidates
        .iter()
        .filter(|c| !claimed.contains(&c.claim))
        .flat_map(|c| c.cards.iter().cloned())
        .collect();
    (fallback(kind, size, available, must, &reserved), None)
}

/// The devices the kubelet picked, checked; the answer for the container.
///
/// Whole cards are refused when the card is unhealthy, in MIG mode, holds slices or instances,
/// or is given whole under another name (`held`, from the kubelet's pod resources).
pub fn allocate(
    resource: &Advertised,
    ids: &[String],
    state: &NodeState,
    held: &BTreeMap<u32, Vec<crate::model::WholeHolder>>,
) -> Result<dp::ContainerAllocateResponse, String> {
    let listed: BTreeSet<String> = devices(resource, state).into_iter().map(|d| d.id).collect();
    if let Some(unknown) = ids.iter().find(|id| !listed.contains(*id)) {
        return Err(format!(
            "{unknown} is not a {} device of this node",
            resource.name
        ));
    }
    let mut response = dp::ContainerAllocateResponse::default();
    if !resource.kind.whole() {
        return Ok(response);
    }
    let inventory = state.inventory.as_ref();
    let cards: Vec<_> = ids
        .iter()
        .filter_map(|id| inventory.and_then(|i| i.by_uuid(id)))
        .collect();
    let mut refusals = Vec::new();
    for card in &cards {
        let mut blockers = state.whole_card_blockers(card);
        for holder in held.get(&card.index).into_iter().flatten() {
            if holder.resource != resource.name {
                blockers.push(format!(
                    "it is given whole to pod {} through {}",
                    holder.pod, holder.resource
                ));
            }
        }
        if !blockers.is_empty() {
            refusals.push(format!(
                "card {} ({}) cannot be given whole: {}",
                card.index,
                card.uuid,
                blockers.join(", ")
            ));
        }
    }
    if !refusals.is_empty() {
        return Err(refusals.join("; "));
    }
    let uuids: Vec<&str> = cards.iter().map(|c| c.uuid.as_str()).collect();
    // The same device files lj-runtime gives (the resource layer's), for pods of other
    // schedulers that run without it; lj-runtime replaces the environment below from the
    // pod's allocation for pods of this scheduler.
    if let Some(inventory) = inventory {
        let files = cards
            .iter()
            .flat_map(|c| c.device_nodes.iter())
            .chain(inventory.control_nodes.iter());
        for file in files {
            response.devices.push(dp::DeviceSpec {
                container_path: container_path(file, &inventory.device_root),
                host_path: file.clone(),
                permissions: "rw".into(),
            });
        }
    }
    response
        .envs
        .insert("RUNTIMEKIT_VISIBLE_DEVICES".into(), uuids.join(","));
    if cards
        .iter()
        .all(|c| c.vendor() == runtimekit_proto::resource::v1alpha1::Vendor::Nvidia)
    {
        response
            .envs
            .insert("NVIDIA_VISIBLE_DEVICES".into(), uuids.join(","));
    }
    Ok(response)
}

/// Checks, just before the container starts, that its whole cards may still be used.
pub fn pre_start(resource: &Advertised, ids: &[String], state: &NodeState) -> Result<(), String> {
    if !resource.kind.whole() {
        return Ok(());
    }
    let Some(inventory) = &state.inventory else {
        return Err("the node agent has no answer from the resource layer yet".into());
    };
    let mut refusals = Vec::new();
    for id in ids {
        match inventory.by_uuid(id) {
            Some(card) if whole_card_available(state, card, &resource.name) => {}
            Some(card) => refusals.push(format!(
                "card {} ({}) can no longer be used whole: {}",
                card.index,
                card.uuid,
                state.whole_card_blockers(card).join(", ")
            )),
            None => refusals.push(format!("{id} is not a card of this node")),
        }
    }
    if refusals.is_empty() {
        Ok(())
    } else {
        Err(refusals.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{at, four_cards, slice};
    use crate::resources::advertised;
    use runtimekit_contract::RuntimeKitConfig;

    fn request(
        available: &[String],
        must: &[&str],
        size: i32,
    ) -> dp::ContainerPreferredAllocationRequest {
        dp::ContainerPreferredAllocationRequest {
            available_device_i_ds: available.to_vec(),
            must_include_device_i_ds: must.iter().map(|s| (*s).to_owned()).collect(),
            allocation_size: size,
        }
    }

    fn ids(resource: &Advertised, state: &NodeState) -> Vec<String> {
        devices(resource, state)
            .into_iter()
            .filter(|d| d.health == dp::HEALTHY)
            .map(|d| d.id)
            .collect()
    }

    #[test]
    fn whole_card_suggestions_follow_the_slices() {
        let mut state = four_cards();
        let mut a = slice("a", 2, SliceMode::Whole, SlicePhase::Ready);
        a.created = Some(at(5));
        // Pod b's slices are its placement from the start, a gang member's too: one just
        // written (no phase) and one an earlier operator marked Reserved.
        let mut b1 = slice("b1", 0, SliceMode::Whole, SlicePhase::Bound);
        let mut b2 = slice("b2", 1, SliceMode::Whole, SlicePhase::Reserved);
        b1.phase = None;
        for s in [&mut b1, &mut b2] {
            s.pod_uid = "uid-b".into();
        }
        state.slices = vec![a, b1, b2];
        let whole = advertised(&RuntimeKitConfig::default()).remove(0);
        let available = ids(&whole, &state);
        assert_eq!(available, ["GPU-0", "GPU-1", "GPU-2"]);

        let (picked, claim) = preferred(
            whole.kind,
            &request(&available, &[], 1),
            &state,
            &BTreeSet::new(),
        );
        assert_eq!(picked, ["GPU-2"], "pod a's card");
        assert_eq!(claim.as_ref().map(|c| c.pod_uid.as_str()), Some("uid-a"));
        let (picked, claim) = preferred(
            whole.kind,
            &request(&available, &[], 2),
            &state,
            &BTreeSet::new(),
        );
        assert_eq!(picked, ["GPU-0", "GPU-1"], "pod b's two cards");
        assert_eq!(claim.as_ref().map(|c| c.pod_uid.as_str()), Some("uid-b"));

        // Once a is taken care of, another one-card pod (default scheduler) gets a card no
        // slice names, if there is one; here every card is named, so the lowest free one.
        let claimed = BTreeSet::from([Claim {
            pod_uid: "uid-a".into(),
            container: "app".into(),
        }]);
        let (picked, claim) = preferred(whole.kind, &request(&available, &[], 1), &state, &claimed);
        assert_eq!((picked, claim), (vec!["GPU-2".to_owned()], None));
        let (picked, _) = preferred(
            whole.kind,
            &request(&available, &["GPU-1"], 1),
            &state,
            &claimed,
        );
        assert_eq!(picked, ["GPU-1"], "must-include devices come first");
    }

    #[test]
    fn replica_suggestions_come_from_the_slice_cards() {
        let mut state = four_cards();
        let mut t1 = slice("t1", 1, SliceMode::Tdm, SlicePhase::Ready);
        let mut t2 = slice("t2", 2, SliceMode::Tdm, SlicePhase::Ready);
        for s in [&mut t1, &mut t2] {
            s.pod_uid = "uid-r".into();
            s.core = Some(5);
        }
        state.slices = vec![t1, t2, slice("m", 3, SliceMode::Mig, SlicePhase::Ready)];
        let resources = advertised(&RuntimeKitConfig::default());
        let core = &resources[2];
        let available = ids(core, &state);
        let (picked, claim) = preferred(
            core.kind,
            &request(&available, &[], 5),
            &state,
            &BTreeSet::new(),
        );
        assert_eq!(
            picked,
            ["GPU-1::0", "GPU-1::1", "GPU-1::2", "GPU-2::0", "GPU-2::1"],
            "five replicas spread over the pod's two cards"
        );
        assert!(claim.is_some());
        let slice_resource = &resources[4];
        let available = ids(slice_resource, &state);
        let (picked, _) = preferred(
            slice_resource.kind,
            &request(&available, &[], 3),
            &state,
            &BTreeSet::new(),
        );
        assert_eq!(picked, ["GPU-3::0", "GPU-3::1", "GPU-3::2"]);
        // No slice asks for 7 slices: the lowest ones.
        let (picked, claim) = preferred(
            slice_resource.kind,
            &request(&available, &[], 2),
            &state,
            &BTreeSet::new(),
        );
        assert_eq!((picked.len(), claim), (2, None));
    }

    #[test]
    fn allocate_never_gives_a_sliced_card_whole() {
        let mut state = four_cards();
        state.slices = vec![slice("t", 0, SliceMode::Tdm, SlicePhase::Ready)];
        let resources = advertised(&RuntimeKitConfig::default());
        let whole = &resources[0];
        let error = allocate(whole, &["GPU-0".into()], &state, &BTreeMap::new())
            .expect_err("card 0 holds a share");
        assert!(
            error.contains("card 0 (GPU-0) cannot be given whole: it holds GPU slices (ns/t)"),
            "{error}"
        );
        assert!(
            allocate(whole, &["GPU-3".into()], &state, &BTreeMap::new()).is_err(),
            "MIG card"
        );
        assert!(
            allocate(whole, &["GPU-9".into()], &state, &BTreeMap::new()).is_err(),
            "unknown"
        );
        if let Some(inventory) = state.inventory.as_mut() {
            for (index, device) in &mut inventory.devices {
                device.device_nodes = vec![format!("/sim/dev/nvidia{index}")];
            }
            inventory.control_nodes = vec!["/sim/dev/nvidiactl".into()];
            inventory.device_root = "/sim/dev".into();
        }
        let ok = allocate(
            whole,
            &["GPU-1".into(), "GPU-2".into()],
            &state,
            &BTreeMap::new(),
        )
        .expect("free cards");
        assert_eq!(ok.envs["NVIDIA_VISIBLE_DEVICES"], "GPU-1,GPU-2");
        let files: Vec<(&str, &str)> = ok
            .devices
            .iter()
            .map(|d| (d.container_path.as_str(), d.host_path.as_str()))
            .collect();
        assert_eq!(
            files,
            [
                ("/dev/nvidia1", "/sim/dev/nvidia1"),
                ("/dev/nvidia2", "/sim/dev/nvidia2"),
                ("/dev/nvidiactl", "/sim/dev/nvidiactl")
            ],
            "the same files lj-runtime would give"
        );
        let held = BTreeMap::from([(
            1,
            vec![crate::model::WholeHolder {
                resource: "nvidia.com/gpu".into(),
                pod: "ns/p".into(),
            }],
        )]);
        let error = allocate(whole, &["GPU-1".into()], &state, &held).expect_err("held");
        assert!(
            error.contains("given whole to pod ns/p through nvidia.com/gpu"),
            "{error}"
        );
        assert!(
            allocate(&resources[1], &["GPU-1".into()], &state, &held).is_ok(),
            "same name"
        );

        assert!(pre_start(whole, &["GPU-1".into()], &state).is_ok());
        state
            .slices
            .push(slice("late", 1, SliceMode::Tdm, SlicePhase::Bound));
        assert!(
            pre_start(whole, &["GPU-1".into()], &state).is_err(),
            "sliced since"
        );
        // Shares are not checked card by card: they are only the kubelet's books.
        assert!(
            allocate(
                &resources[2],
                &["GPU-0::7".into()],
                &state,
                &BTreeMap::new()
            )
            .is_ok()
        );
    }
}
