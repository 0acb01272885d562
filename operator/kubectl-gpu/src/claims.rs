//! What ResourceClaims allocated from the kit's DRA driver hold, read as entries of the same
//! shape as the GpuSlices of the ledger, so `kubectl gpu nodes`, `pods` and `explain` show both
//! kinds of allocation alike: one entry per card device of a claim and container using it,
//! named `resourceclaim/<claim>`.

use crate::slices::{SliceRow, slice_row};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{DeviceRequestAllocationResult, ResourceClaim};
use runtimekit_contract::dra::{
    CAPACITY_CORE, CAPACITY_MEMORY, CLAIM_HOLDER, DeviceName, allocated, base_request, nic_device,
};
use runtimekit_crds::{CardRef, GpuSlice, GpuSliceSpec, PodRef, SliceMode, TopologyGroup};

/// One card a claim holds for one container (or for no pod yet).
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimEntry {
    /// The holding in the ledger's shape.
    pub slice: GpuSlice,
    /// Whether a pod uses the claim (`status.reservedFor`).
    pub reserved: bool,
}

/// The entries of every claim allocated from `driver`, with the containers of `pods` that use
/// them and the cards' UUIDs, MIG profiles and NIC names from `groups`.
pub fn entries(
    claims: &[ResourceClaim],
    pods: &[Pod],
    groups: &[TopologyGroup],
    driver: &str,
) -> Vec<ClaimEntry> {
    let mut entries = Vec::new();
    for claim in claims {
        let namespace = claim.metadata.namespace.clone().unwrap_or_default();
        let name = claim.metadata.name.clone().unwrap_or_default();
        let status = claim.status.as_ref();
        let results: Vec<&DeviceRequestAllocationResult> = allocated(claim, driver).collect();
        let users: Vec<&Pod> = status
            .and_then(|s| s.reserved_for.as_ref())
            .into_iter()
            .flatten()
            .filter(|r| r.resource == "pods")
            .filter_map(|r| {
                pods.iter().find(|p| {
                    p.metadata.uid.as_deref() == Some(r.uid.as_str())
                        && p.metadata.namespace.as_deref() == Some(namespace.as_str())
                })
            })
            .collect();
        let group = |pool: &str| {
            groups
                .iter()
                .find(|g| g.metadata.name.as_deref() == Some(pool))
        };
        for result in &results {
            let Some(device) = DeviceName::parse(&result.device) else {
                continue;
            };
            let request = base_request(&result.request);
            // The NICs given for the same request go with its cards.
            let nics: Vec<String> = results
                .iter()
                .filter(|r| base_request(&r.request) == request && r.pool == result.pool)
                .filter_map(|r| nic_name(group(&r.pool), &r.device))
                .collect();
            let Some(spec) = card_spec(&device, result, group(&result.pool)) else {
                continue;
            };
            let holders: Vec<PodRef> = if users.is_empty() {
                vec![PodRef {
                    namespace: namespace.clone(),
                    name: "-".into(),
                    uid: String::new(),
                    container: "-".into(),
                }]
            } else {
                users
                    .iter()
                    .flat_map(|pod| containers_using(pod, &name, request))
                    .collect()
            };
            for (replica, pod) in holders.into_iter().enumerate() {
                let mut slice = GpuSlice::new(
                    &format!("resourceclaim/{name}"),
                    GpuSliceSpec {
                        pod,
                        replica_index: u32::try_from(replica).unwrap_or(u32::MAX),
                        nics: nics.clone(),
                        ..spec.clone()
                    },
                );
                slice.metadata.namespace = Some(namespace.clone());
                entries.push(ClaimEntry {
                    slice,
                    reserved: !users.is_empty(),
                });
            }
        }
    }
    entries
}

/// The rows `kubectl gpu pods` shows for the entries: the phase says the card is given through
/// a claim (`Claimed`), or allocated to a claim no pod uses yet (`Allocated`).
pub fn rows(entries: &[ClaimEntry]) -> Vec<SliceRow> {
    entries
        .iter()
        .map(|entry| SliceRow {
            phase: if entry.reserved {
                "Claimed"
            } else {
                "Allocated"
            }
            .into(),
            ..slice_row(&entry.slice)
        })
        .collect()
}

/// The node agents' TopologyGroups without the claim holders the entries show, so a claim is
/// counted once: as what it holds, not also as an opaque holder of the card.
pub fn without_shown_holders(
    groups: &[TopologyGroup],
    entries: &[ClaimEntry],
) -> Vec<TopologyGroup> {
    let shown: Vec<String> = entries
        .iter()
        .map(|e| {
            let claim = e.slice.metadata.name.as_deref().unwrap_or_default();
            format!(
                "{CLAIM_HOLDER}{}/{}",
                e.slice.metadata.namespace.as_deref().unwrap_or_default(),
                claim.trim_start_matches(CLAIM_HOLDER)
            )
        })
        .collect();
    let mut groups = groups.to_vec();
    for card in groups
        .iter_mut()
        .filter_map(|g| g.status.as_mut())
        .flat_map(|s| s.cards.iter_mut())
    {
        card.held_by.retain(|h| !shown.contains(h));
    }
    groups
}

/// What a card device of the pool holds, in the ledger's shape (the pod left default).
fn card_spec(
    device: &DeviceName,
    result: &DeviceRequestAllocationResult,
    group: Option<&TopologyGroup>,
) -> Option<GpuSliceSpec> {
    let (index, mode) = match device {
        DeviceName::Whole(index) => (*index, SliceMode::Whole),
        DeviceName::Share(index) => (*index, SliceMode::Tdm),
        DeviceName::Mig { card, .. } => (*card, SliceMode::Mig),
        DeviceName::Nic(_) => return None,
    };
    let card = group
        .and_then(|g| g.status.as_ref())
        .and_then(|s| s.cards.iter().find(|c| c.index == index));
    let consumed = |name: &str| {
        result
            .consumed_capacity
            .as_ref()
            .and_then(|c| c.get(name))
            .map(|q| q.0.clone())
    };
    let (mig_profile, mig_placement_start) = match device {
        DeviceName::Mig { profile, start, .. } => {
            let named = card
                .into_iter()
                .flat_map(|c| &c.mig_instances)
                .find(|i| {
                    i.placement_start == *start && DeviceName::names_profile(profile, &i.profile)
                })
                .map_or_else(|| profile.clone(), |i| i.profile.clone());
            (Some(named), Some(*start))
        }
        _ => (None, None),
    };
    let share = mode == SliceMode::Tdm;
    Some(GpuSliceSpec {
        node_name: Some(result.pool.clone()),
        card: Some(CardRef {
            index,
            uuid: card.map(|c| c.uuid.clone()).unwrap_or_default(),
        }),
        mode,
        core: share
            .then(|| consumed(CAPACITY_CORE)?.parse().ok())
            .flatten()
            .filter(|c| *c > 0),
        memory: share.then(|| consumed(CAPACITY_MEMORY)).flatten(),
        slices: None,
        mig_profile,
        mig_placement_start,
        pod: PodRef {
            namespace: String::new(),
            name: String::new(),
            uid: String::new(),
            container: String::new(),
        },
        replica_index: 0,
        gang: None,
        nics: Vec::new(),
    })
}

/// The NIC a NIC device names, by the node's reported NICs.
fn nic_name(group: Option<&TopologyGroup>, device: &str) -> Option<String> {
    group?
        .status
        .as_ref()?
        .nics
        .iter()
        .find(|n| nic_device(&n.name) == device)
        .map(|n| n.name.clone())
}

/// The containers of `pod` that use the pod's claim `claim` for `request` (all of its requests
/// when a container names none).
fn containers_using(pod: &Pod, claim: &str, request: &str) -> Vec<PodRef> {
    let status = pod.status.as_ref();
    // The pod's own name for the claim: a direct one, or one made from a template.
    let pod_names: Vec<String> = pod
        .spec
        .iter()
        .flat_map(|s| s.resource_claims.iter().flatten())
        .filter(|c| c.resource_claim_name.as_deref() == Some(claim))
        .map(|c| c.name.clone())
        .chain(
            status
                .and_then(|s| s.resource_claim_statuses.as_ref())
                .into_iter()
                .flatten()
                .filter(|c| c.resource_claim_name.as_deref() == Some(claim))
                .map(|c| c.name.clone()),
        )
        .collect();
    // Containers whose extended resources kube-scheduler turned into this claim.
    let extended: Vec<String> = status
        .and_then(|s| s.extended_resource_claim_status.as_ref())
        .filter(|e| e.resource_claim_name == claim)
        .map(|e| {
            e.request_mappings
                .iter()
                .filter(|m| m.request_name == request)
                .map(|m| m.container_name.clone())
                .collect()
        })
        .unwrap_or_default();
    let reference = |container: &str| PodRef {
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        name: pod.metadata.name.clone().unwrap_or_default(),
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        container: container.to_owned(),
    };
    let mut using: Vec<PodRef> = pod
        .spec
        .iter()
        .flat_map(|s| &s.containers)
        .filter(|c| {
            extended.contains(&c.name)
                || c.resources
                    .as_ref()
                    .and_then(|r| r.claims.as_ref())
                    .into_iter()
                    .flatten()
                    .any(|used| {
                        pod_names.contains(&used.name)
                            && used.request.as_deref().is_none_or(|r| r == request)
                    })
        })
        .map(|c| reference(&c.name))
        .collect();
    if using.is_empty() {
        using.push(reference("-"));
    }
    using
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const DRIVER: &str = "gpu.runtimekit.aliyun.com";

    fn group() -> TopologyGroup {
        let cards: Vec<serde_json::Value> = (0..3)
            .map(|i| {
                let instances = if i == 2 {
                    json!([{"profile": "1g.10gb", "placementStart": 3, "gpuInstanceId": 9}])
                } else {
                    json!([])
                };
                json!({
                    "index": i, "uuid": format!("GPU-{i}"), "vendor": "Nvidia", "model": "H800",
                    "memoryMib": 81559, "migCapable": true, "migEnabled": i == 2,
                    "health": "Healthy",
                    "heldBy": [format!("resourceclaim/ml/c{i}"), "other/web".to_owned()],
                    "migInstances": instances,
                })
            })
            .collect();
        serde_json::from_value(json!({
            "apiVersion": "runtimekit.aliyun.com/v1alpha1", "kind": "TopologyGroup",
            "metadata": {"name": "n1"},
            "spec": {"tier": "Node", "nodeName": "n1"},
            "status": {"cards": cards, "nics": [{"name": "mlx5_0"}]},
        }))
        .unwrap()
    }

    fn claim(name: &str, results: serde_json::Value, reserved: Option<&str>) -> ResourceClaim {
        let mut status = json!({"allocation": {"devices": {"results": results}}});
        if let Some(uid) = reserved {
            status["reservedFor"] = json!([{"resource": "pods", "name": "p", "uid": uid}]);
        }
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ml"},
            "spec": {}, "status": status,
        }))
        .unwrap()
    }

    fn result(request: &str, device: &str) -> serde_json::Value {
        json!({"request": request, "driver": DRIVER, "pool": "n1", "device": device})
    }

    fn pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ml", "uid": "u1"},
            "spec": {
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}],
                "containers": [
                    {"name": "app", "resources": {"claims": [{"name": "gpu"}]}},
                    {"name": "sidecar"},
                ],
            },
            "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "c0"}]},
        }))
        .unwrap()
    }

    #[test]
    fn a_claims_cards_read_as_what_they_are_for_the_containers_using_them() {
        let mut share = result("gpu", "gpu-0-share");
        share["consumedCapacity"] = json!({"core": "50", "memory": "4Gi"});
        let claims = [
            claim(
                "c0",
                json!([share, result("gpu", "nic-mlx5-0"), result("other", "gpu-9")]),
                Some("u1"),
            ),
            claim("c1", json!([result("gpu", "gpu-1")]), None),
            claim(
                "c2",
                json!([result("gpu", "gpu-2-mig-1g10gb-3"), {"request": "x", "driver": "other.example.com", "pool": "n1", "device": "gpu-2"}]),
                None,
            ),
        ];
        let found = entries(&claims, &[pod()], &[group()], DRIVER);
        let rows = rows(&found);
        let shown: Vec<String> = rows
            .iter()
            .map(|r| {
                format!(
                    "{} {} {} {} {} {:?} {}",
                    r.pod, r.container, r.mode, r.share, r.phase, r.card, r.slice
                )
            })
            .collect();
        assert_eq!(
            shown,
            [
                "p app TDM 50% 4Gi Claimed Some(0) resourceclaim/c0",
                // The container names the claim without a request: it gets all of them.
                "p app Whole whole card Claimed Some(9) resourceclaim/c0",
                "- - Whole whole card Allocated Some(1) resourceclaim/c1",
                "- - MIG 1g.10gb@3 Allocated Some(2) resourceclaim/c2",
            ]
        );
        assert_eq!(rows[0].nics, ["mlx5_0"]);
        assert_eq!(rows[0].card_uuid.as_deref(), Some("GPU-0"));
        // gpu-9 is not a card the node reports: its UUID is unknown, and it is still shown.
        assert_eq!(rows[1].card_uuid.as_deref(), Some(""));

        let groups = without_shown_holders(&[group()], &found);
        let held: Vec<&Vec<String>> = groups[0]
            .status
            .iter()
            .flat_map(|s| &s.cards)
            .map(|c| &c.held_by)
            .collect();
        assert!(
            held.iter().all(|h| *h == &vec!["other/web".to_owned()]),
            "{held:?}"
        );
    }

    #[test]
    fn an_unchanged_pods_extended_resource_claim_names_its_container() {
        let mut pod = pod();
        pod.status = Some(
            serde_json::from_value(json!({"extendedResourceClaimStatus": {
                "resourceClaimName": "c0",
                "requestMappings": [{"containerName": "sidecar", "resourceName": "nvidia.com/gpu", "requestName": "container-1-request-0"}],
            }}))
            .unwrap(),
        );
        let claims = [claim(
            "c0",
            json!([result("container-1-request-0", "gpu-1")]),
            Some("u1"),
        )];
        let rows = rows(&entries(&claims, &[pod], &[group()], DRIVER));
        assert_eq!(rows.len(), 1);
        assert_eq!(
            (rows[0].container.as_str(), rows[0].mode.as_str()),
            ("sidecar", "Whole")
        );
    }
}
