//! The objects a [`Decision`] becomes: the GpuSlice of each card (its name and body) and the
//! allocation annotation the Binding carries. The operator's scheduler and gang controller write
//! them; its state rebuilds the same objects to find the slices a bound pod is missing.

use crate::Decision;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use runtimekit_contract::allocation::Allocation;
use runtimekit_crds::{GpuSlice, SLICE_FINALIZER};

/// The name of the GpuSlice for one card of one container: unique per pod UID, so a new pod of
/// the same name never collides with the slices of an old one still being released.
pub fn slice_name(pod: &str, uid: &str, container_index: usize, replica: u32) -> String {
    let pod: String = pod.chars().take(200).collect();
    let uid: String = uid
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(8)
        .collect();
    format!(
        "{}-{uid}-{container_index}-{replica}",
        pod.trim_end_matches(['-', '.'])
    )
}

/// The allocation annotation of a decision: the cards, and the GpuSlice recording each.
pub fn allocation_of(pod: &Pod, decision: &Decision) -> Allocation {
    let name = pod_name(pod);
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let containers: Vec<&str> = pod
        .spec
        .iter()
        .flat_map(|s| s.containers.iter().map(|c| c.name.as_str()))
        .collect();
    decision.allocation(|container, replica| {
        let index = containers.iter().position(|c| *c == container).unwrap_or(0);
        slice_name(&name, &uid, index, replica)
    })
}

/// The GpuSlices and the allocation annotation of a decision.
pub fn slices_and_allocation(pod: &Pod, decision: &Decision) -> (Vec<GpuSlice>, Allocation) {
    let allocation = allocation_of(pod, decision);
    let slices = slice_objects(
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        &pod_name(pod),
        pod.metadata.uid.as_deref().unwrap_or_default(),
        decision,
        &slice_names(&allocation),
    );
    (slices, allocation)
}

/// The GpuSlice of each card an allocation records, in the order of
/// [`Decision::gpu_slices`].
pub fn slice_names(allocation: &Allocation) -> Vec<String> {
    allocation
        .containers
        .iter()
        .flat_map(|c| c.cards.iter().map(|card| card.slice.clone()))
        .collect()
}

/// The GpuSlices of the pod `namespace/name` (`uid`) for a decision, named by `names` in the
/// order of [`Decision::gpu_slices`]: owned by the pod, so they go when it goes, and carrying
/// the node agent's finalizer, so their capacity returns only once the agent has let go.
pub fn slice_objects(
    namespace: &str,
    name: &str,
    uid: &str,
    decision: &Decision,
    names: &[String],
) -> Vec<GpuSlice> {
    let owner = OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: name.to_owned(),
        uid: uid.to_owned(),
        controller: Some(true),
        block_owner_deletion: None,
    };
    decision
        .gpu_slices(namespace, name)
        .into_iter()
        .zip(names)
        .map(|(spec, slice)| GpuSlice {
            metadata: ObjectMeta {
                name: Some(slice.clone()),
                namespace: Some(namespace.to_owned()),
                owner_references: Some(vec![owner.clone()]),
                finalizers: Some(vec![SLICE_FINALIZER.into()]),
                ..ObjectMeta::default()
            },
            spec,
            status: None,
        })
        .collect()
}

/// The pod's name, or its generateName before the apiserver named it (as kube's `name_any`).
fn pod_name(pod: &Pod) -> String {
    pod.metadata
        .name
        .clone()
        .or_else(|| pod.metadata.generate_name.clone())
        .unwrap_or_default()
}
