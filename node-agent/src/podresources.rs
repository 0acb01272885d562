//! Which cards the kubelet gave whole to pods, from its pod-resources API: the same card is
//! offered under two whole-card names (`<prefix>/gpu` and `nvidia.com/gpu`), and the kubelet
//! keeps their books apart, so the agent reads them to keep a card given under one name from
//! being given again under the other, or shared. The same listing says which containers use
//! each ResourceClaim, which the exporter labels a claim's series with.

use crate::model::{ClaimUser, Inventory, NodeState, WholeHolder};
use runtimekit_proto::podresources::v1 as pr;
use runtimekit_proto::podresources::v1::pod_resources_lister_client::PodResourcesListerClient;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::sync::watch;

/// How long one List call may take.
const LIST_TIMEOUT: Duration = Duration::from_secs(2);

/// The pods and their devices, as the kubelet reports them now.
pub async fn list(socket: &Path) -> Result<Vec<pr::PodResources>, String> {
    if !socket.exists() {
        return Err(format!("{} does not exist", socket.display()));
    }
    let channel = tokio::time::timeout(LIST_TIMEOUT, runtimekit_resource_layer::connect(socket))
        .await
        .map_err(|_| format!("{} does not answer", socket.display()))?
        .map_err(|e| format!("cannot reach {}: {e}", socket.display()))?;
    let mut request = tonic::Request::new(pr::ListPodResourcesRequest {});
    request.set_timeout(LIST_TIMEOUT);
    let response = PodResourcesListerClient::new(channel)
        .list(request)
        .await
        .map_err(|s| format!("List on {} failed: {}", socket.display(), s.message()))?;
    Ok(response.into_inner().pod_resources)
}

/// The cards given whole through one of `whole` (resource names), by card index, to pods other
/// than `own` (pods of this scheduler, whose cards their GpuSlices account; the kubelet keeps an
/// ended pod's devices in its books until the pod object goes).
pub fn held_whole(
    pods: &[pr::PodResources],
    inventory: &Inventory,
    whole: &[String],
    own: &BTreeSet<String>,
) -> BTreeMap<u32, Vec<WholeHolder>> {
    let mut held: BTreeMap<u32, Vec<WholeHolder>> = BTreeMap::new();
    for pod in pods {
        if own.contains(&format!("{}/{}", pod.namespace, pod.name)) {
            continue;
        }
        let devices = pod.containers.iter().flat_map(|c| c.devices.iter());
        for devices in devices.filter(|d| whole.contains(&d.resource_name)) {
            for id in &devices.device_ids {
                if let Some(card) = inventory.by_uuid(id) {
                    let holder = WholeHolder {
                        resource: devices.resource_name.clone(),
                        pod: format!("{}/{}", pod.namespace, pod.name),
                    };
                    let holders = held.entry(card.index).or_default();
                    if !holders.contains(&holder) {
                        holders.push(holder);
                        holders.sort();
                    }
                }
            }
        }
    }
    held
}

/// The containers using each claim (`<namespace>/<name>`), from the kubelet's listing.
pub fn claim_users(pods: &[pr::PodResources]) -> BTreeMap<String, Vec<ClaimUser>> {
    let mut users: BTreeMap<String, Vec<ClaimUser>> = BTreeMap::new();
    for pod in pods {
        for container in &pod.containers {
            for claim in &container.dynamic_resources {
                let user = ClaimUser {
                    namespace: pod.namespace.clone(),
                    pod: pod.name.clone(),
                    container: container.name.clone(),
                };
                let key = format!("{}/{}", claim.claim_namespace, claim.claim_name);
                let list = users.entry(key).or_default();
                if !list.contains(&user) {
                    list.push(user);
                    list.sort();
                }
            }
        }
    }
    users
}

/// Keeps `held_whole` and `claim_users` in the node state current, polling every `interval`;
/// while the API cannot be reached, nothing is known to be held or used.
pub async fn poll(
    socket: PathBuf,
    state: watch::Sender<NodeState>,
    whole: Vec<String>,
    interval: Duration,
) {
    let mut reachable = None;
    loop {
        let (held, users) = match list(&socket).await {
            Ok(pods) => {
                if reachable != Some(true) {
                    tracing::info!(socket = %socket.display(), "reading the kubelet's pod resources");
                    reachable = Some(true);
                }
                let (inventory, own) = {
                    let now = state.borrow();
                    (
                        now.inventory.clone().unwrap_or_default(),
                        now.own_pods.clone(),
                    )
                };
                // Forget own pods that have neither slices nor a place in the kubelet's books.
                let listed: BTreeSet<String> = pods
                    .iter()
                    .map(|p| format!("{}/{}", p.namespace, p.name))
                    .collect();
                state.send_if_modified(|s| {
                    let before = s.own_pods.len();
                    let slices: BTreeSet<String> = s
                        .slices
                        .iter()
                        .map(|x| format!("{}/{}", x.pod_namespace, x.pod_name))
                        .collect();
                    s.own_pods
                        .retain(|p| listed.contains(p) || slices.contains(p));
                    s.own_pods.len() != before
                });
                (
                    held_whole(&pods, &inventory, &whole, &own),
                    claim_users(&pods),
                )
            }
            Err(error) => {
                if reachable != Some(false) {
                    tracing::info!(%error, "the kubelet's pod-resources API cannot be read; cards given whole are not tracked");
                    reachable = Some(false);
                }
                (BTreeMap::new(), BTreeMap::new())
            }
        };
        state.send_if_modified(|s| {
            let changed = s.held_whole != held || s.claim_users != users;
            s.held_whole = held;
            s.claim_users = users;
            changed
        });
        tokio::time::sleep(interval).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use runtimekit_proto::resource::v1alpha1 as pb;

    #[test]
    fn whole_cards_are_found_by_uuid() {
        let mut inventory = Inventory::default();
        inventory.merge(
            pb::ListDevicesResponse {
                devices: (0..2)
                    .map(|i| pb::Device {
                        index: i,
                        uuid: format!("GPU-{i}"),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            },
            &[],
        );
        let pod = pr::PodResources {
            name: "p".into(),
            namespace: "ns".into(),
            containers: vec![pr::ContainerResources {
                name: "c".into(),
                devices: vec![
                    pr::ContainerDevices {
                        resource_name: "nvidia.com/gpu".into(),
                        device_ids: vec!["GPU-1".into()],
                        topology: None,
                    },
                    pr::ContainerDevices {
                        resource_name: "aliyun.com/gpu-core".into(),
                        device_ids: vec!["GPU-0::3".into()],
                        topology: None,
                    },
                ],
                ..Default::default()
            }],
            ..Default::default()
        };
        let whole = ["aliyun.com/gpu".into(), "nvidia.com/gpu".into()];
        let own = BTreeSet::from(["ns/ours".to_owned()]);
        let ours = pr::PodResources {
            name: "ours".into(),
            ..pod.clone()
        };
        let held = held_whole(&[pod, ours], &inventory, &whole, &own);
        assert_eq!(
            held,
            BTreeMap::from([(
                1,
                vec![WholeHolder {
                    resource: "nvidia.com/gpu".into(),
                    pod: "ns/p".into()
                }]
            )])
        );
    }
}
