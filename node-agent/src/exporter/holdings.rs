//! What each container holds on the node's cards, whoever allocated it: the GpuSlices of the
//! kit's scheduler, and the devices of ResourceClaims the DRA plugin prepared, one holding per
//! container using the claim (as the kubelet's pod resources list them). The exporter's
//! container series are one per holding.

use crate::model::NodeState;
use runtimekit_crds::SliceMode;

/// One container's part of one card.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holding {
    pub card: u32,
    pub mode: SliceMode,
    /// A share's compute percent.
    pub core: Option<u32>,
    /// A share's (or MIG slice's) memory in MiB, when stated.
    pub memory_mib: Option<u64>,
    /// The resource-layer instance of a share or a MIG instance.
    pub instance_key: String,
    /// The MIG profile, when the allocation names it (a claim's comes from its instance).
    pub mig_profile: Option<String>,
    /// The pod's UID, by which its processes are found.
    pub pod_uid: String,
    pub pod_namespace: String,
    pub pod_name: String,
    pub container: String,
}

/// Every holding on the node: the slices', then the claims'.
pub fn holdings(state: &NodeState) -> Vec<Holding> {
    let slices = state.slices.iter().map(|s| Holding {
        card: s.card,
        mode: s.mode,
        core: s.core,
        memory_mib: s.memory_mib,
        instance_key: s.key(),
        mig_profile: s.mig_profile.clone(),
        pod_uid: s.pod_uid.clone(),
        pod_namespace: s.pod_namespace.clone(),
        pod_name: s.pod_name.clone(),
        container: s.container.clone(),
    });
    let claims = state.prepared.iter().flat_map(|device| {
        let card = device.holds_card();
        let mode = device.mode;
        let users = state.claim_users.get(&device.claim);
        users.into_iter().flatten().filter_map(move |user| {
            Some(Holding {
                card: card?,
                mode: mode?,
                core: device.core,
                memory_mib: device.memory_mib,
                instance_key: device.instance_key.clone().unwrap_or_default(),
                mig_profile: None,
                pod_uid: device
                    .pods
                    .iter()
                    .find(|p| p.name == user.pod)
                    .map(|p| p.uid.clone())
                    .unwrap_or_default(),
                pod_namespace: user.namespace.clone(),
                pod_name: user.pod.clone(),
                container: user.container.clone(),
            })
        })
    });
    slices.chain(claims).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ClaimPod, ClaimUser, PreparedDevice};

    #[test]
    fn a_prepared_claim_is_held_by_each_container_using_it() {
        let mut state = NodeState::default();
        let device = |device: &str, card, mode| PreparedDevice {
            claim: "ml/infer-gpu".into(),
            claim_uid: "c1".into(),
            request: "gpu".into(),
            device: device.into(),
            card,
            mode,
            instance_key: Some(format!("dra:c1:gpu:{device}")),
            core: Some(50),
            memory_mib: Some(4096),
            pods: vec![ClaimPod {
                name: "infer".into(),
                uid: "pod-1".into(),
            }],
        };
        state.prepared = vec![
            device("gpu-2-share", Some(2), Some(SliceMode::Tdm)),
            // Given for monitoring only, and a NIC: neither holds a card.
            device("gpu-3", Some(3), None),
            device("nic-mlx5-0", None, None),
        ];
        state.claim_users.insert(
            "ml/infer-gpu".into(),
            ["app", "sidecar"]
                .map(|c| ClaimUser {
                    namespace: "ml".into(),
                    pod: "infer".into(),
                    container: c.into(),
                })
                .to_vec(),
        );
        let held = holdings(&state);
        let seen: Vec<(u32, &str, &str, &str)> = held
            .iter()
            .map(|h| {
                (
                    h.card,
                    h.pod_uid.as_str(),
                    h.container.as_str(),
                    h.instance_key.as_str(),
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                (2, "pod-1", "app", "dra:c1:gpu:gpu-2-share"),
                (2, "pod-1", "sidecar", "dra:c1:gpu:gpu-2-share")
            ]
        );
        // A claim no container uses yet has no series.
        state.claim_users.clear();
        assert!(holdings(&state).is_empty());
    }
}
