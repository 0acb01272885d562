//! Admitting containers as the kubelet's device manager does: choosing devices (the plugin's
//! suggestion first), Allocate, PreStartContainer, and releasing a pod's devices; and admitting
//! the pods bound to a Node as they come.

use crate::books::Shared;
use crate::view::PodRef;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::Api;
use kube::runtime::watcher;
use runtimekit_proto::deviceplugin::v1beta1 as dp;
use runtimekit_proto::deviceplugin::v1beta1::device_plugin_client::DevicePluginClient;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use tonic::Request;
use tonic::transport::Channel;

/// Gives `count` devices of `resource` to a container; see [`crate::TestKubelet::allocate`].
pub(crate) async fn allocate(
    shared: &Shared,
    pod: &PodRef,
    container: &str,
    resource: &str,
    count: usize,
) -> Result<(Vec<String>, dp::ContainerAllocateResponse), String> {
    let (mut client, options, available) = {
        let books = shared.books();
        let plugin = books
            .plugins
            .get(resource)
            .ok_or_else(|| format!("no device plugin serves {resource}"))?;
        let taken: BTreeSet<&String> = books
            .allocations
            .iter()
            .filter(|((uid, c), _)| !(uid == &pod.uid && c == container))
            .filter_map(|(_, r)| r.get(resource))
            .flatten()
            .collect();
        let available: Vec<String> = plugin
            .view
            .healthy()
            .into_iter()
            .filter(|id| !taken.contains(id))
            .collect();
        (plugin.client.clone(), plugin.view.options, available)
    };
    if available.len() < count {
        return Err(format!(
            "UnexpectedAdmissionError: requested {count} of {resource}, {} available",
            available.len()
        ));
    }
    let mut chosen: Vec<String> = Vec::new();
    if options.get_preferred_allocation_available && available.len() > count {
        let request = dp::PreferredAllocationRequest {
            container_requests: vec![dp::ContainerPreferredAllocationRequest {
                available_device_i_ds: available.clone(),
                must_include_device_i_ds: Vec::new(),
                allocation_size: i32::try_from(count).unwrap_or(i32::MAX),
            }],
        };
        let preferred = client
            .get_preferred_allocation(request)
            .await
            .map_err(|s| format!("GetPreferredAllocation failed: {}", s.message()))?
            .into_inner();
        for id in preferred
            .container_responses
            .into_iter()
            .flat_map(|r| r.device_i_ds)
        {
            if available.contains(&id) && !chosen.contains(&id) && chosen.len() < count {
                chosen.push(id);
            }
        }
    }
    for id in &available {
        if chosen.len() == count {
            break;
        }
        if !chosen.contains(id) {
            chosen.push(id.clone());
        }
    }
    let response = client
        .allocate(dp::AllocateRequest {
            container_requests: vec![dp::ContainerAllocateRequest {
                devices_ids: chosen.clone(),
            }],
        })
        .await
        .map_err(|s| format!("UnexpectedAdmissionError: Allocate failed: {}", s.message()))?
        .into_inner();
    let answer = response
        .container_responses
        .into_iter()
        .next()
        .ok_or_else(|| "Allocate answered no container".to_owned())?;
    {
        let mut books = shared.books();
        books.pods.insert(pod.uid.clone(), pod.clone());
        books
            .allocations
            .entry((pod.uid.clone(), container.to_owned()))
            .or_default()
            .insert(resource.to_owned(), chosen.clone());
    }
    shared.touch();
    Ok((chosen, answer))
}

/// Calls PreStartContainer for a container's resources whose plugin asks for it.
pub(crate) async fn start_container(
    shared: &Shared,
    pod_uid: &str,
    container: &str,
) -> Result<(), String> {
    let calls: Vec<(String, DevicePluginClient<Channel>, Vec<String>)> = {
        let books = shared.books();
        let Some(resources) = books
            .allocations
            .get(&(pod_uid.to_owned(), container.to_owned()))
        else {
            return Ok(());
        };
        resources
            .iter()
            .filter_map(|(resource, ids)| {
                let plugin = books.plugins.get(resource)?;
                plugin
                    .view
                    .options
                    .pre_start_required
                    .then(|| (resource.clone(), plugin.client.clone(), ids.clone()))
            })
            .collect()
    };
    for (resource, mut client, ids) in calls {
        let mut request = Request::new(dp::PreStartContainerRequest { devices_ids: ids });
        request.set_timeout(Duration::from_secs(30));
        client
            .pre_start_container(request)
            .await
            .map_err(|s| format!("PreStartContainer for {resource} failed: {}", s.message()))?;
    }
    Ok(())
}

/// Forgets a pod's allocations.
pub(crate) fn release(shared: &Shared, pod_uid: &str) {
    {
        let mut books = shared.books();
        books.allocations.retain(|(uid, _), _| uid != pod_uid);
        books.pods.remove(pod_uid);
    }
    shared.touch();
}

/// The device counts each container of `pod` asks for, by resource.
fn limits(pod: &Pod) -> Vec<(String, BTreeMap<String, usize>)> {
    pod.spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .map(|c| {
            let limits = c
                .resources
                .as_ref()
                .and_then(|r| r.limits.clone())
                .unwrap_or_default()
                .into_iter()
                .filter_map(|(k, q)| Some((k, q.0.parse::<usize>().ok()?)))
                .collect();
            (c.name.clone(), limits)
        })
        .collect()
}

/// Admits one pod: its resources container by container, then PreStartContainer; on a failed
/// allocation the pod's devices are given back.
async fn admit(shared: &Shared, pod: &Pod) -> Result<(), String> {
    let _serial = shared.admitting.lock().await;
    let key = PodRef {
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        name: pod.metadata.name.clone().unwrap_or_default(),
        uid: pod.metadata.uid.clone().unwrap_or_default(),
    };
    let registered: BTreeSet<String> = shared.books().plugins.keys().cloned().collect();
    let containers = limits(pod);
    for (container, limits) in &containers {
        for (resource, count) in limits {
            if *count == 0 || !registered.contains(resource) {
                continue;
            }
            if let Err(error) = allocate(shared, &key, container, resource, *count).await {
                release(shared, &key.uid);
                return Err(error);
            }
        }
    }
    for (container, _) in &containers {
        start_container(shared, &key.uid, container).await?;
    }
    Ok(())
}

/// Admits the pods bound to `node` as they come and releases them when they go.
pub(crate) async fn admit_pods(shared: Arc<Shared>, client: Client, node: String) {
    let pods: Api<Pod> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let mut events = Box::pin(watcher(pods, config));
    let mut known: BTreeSet<String> = BTreeSet::new();
    while let Some(event) = events.next().await {
        let (pod, deleted) = match event {
            Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => (pod, false),
            Ok(watcher::Event::Delete(pod)) => (pod, true),
            Ok(watcher::Event::Init | watcher::Event::InitDone) => continue,
            Err(error) => {
                tracing::warn!(%error, "test kubelet: watching pods");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if deleted || pod.metadata.deletion_timestamp.is_some() {
            if known.remove(&uid) {
                release(&shared, &uid);
            }
            continue;
        }
        if !known.insert(uid.clone()) {
            continue;
        }
        let outcome = admit(&shared, &pod).await;
        if let Err(error) = &outcome {
            tracing::info!(pod = ?pod.metadata.name, %error, "test kubelet: the pod was not admitted");
        }
        shared.books().admissions.insert(uid, outcome);
        shared.touch();
    }
}
