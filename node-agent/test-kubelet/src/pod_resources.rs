//! The kubelet's `v1.PodResourcesLister` server, answering from the test kubelet's books.

use crate::books::Shared;
use crate::view::PodRef;
use runtimekit_proto::podresources::v1 as pr;
use runtimekit_proto::podresources::v1::pod_resources_lister_server::PodResourcesLister;
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// The PodResourcesLister server.
#[derive(Clone)]
pub(crate) struct PodResourcesService {
    pub(crate) shared: Arc<Shared>,
}

impl PodResourcesService {
    fn pod(&self, uid: &str, pod: &PodRef) -> pr::PodResources {
        let books = self.shared.books();
        let containers = books
            .allocations
            .iter()
            .filter(|((u, _), _)| u == uid)
            .map(|((_, container), resources)| pr::ContainerResources {
                name: container.clone(),
                devices: resources
                    .iter()
                    .map(|(resource, ids)| pr::ContainerDevices {
                        resource_name: resource.clone(),
                        device_ids: ids.clone(),
                        topology: None,
                    })
                    .collect(),
                ..Default::default()
            })
            .collect();
        pr::PodResources {
            name: pod.name.clone(),
            namespace: pod.namespace.clone(),
            containers,
            ..Default::default()
        }
    }
}

#[tonic::async_trait]
impl PodResourcesLister for PodResourcesService {
    async fn list(
        &self,
        _request: Request<pr::ListPodResourcesRequest>,
    ) -> Result<Response<pr::ListPodResourcesResponse>, Status> {
        let pods: Vec<(String, PodRef)> = self
            .shared
            .books()
            .pods
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        Ok(Response::new(pr::ListPodResourcesResponse {
            pod_resources: pods.iter().map(|(uid, pod)| self.pod(uid, pod)).collect(),
        }))
    }

    async fn get_allocatable_resources(
        &self,
        _request: Request<pr::AllocatableResourcesRequest>,
    ) -> Result<Response<pr::AllocatableResourcesResponse>, Status> {
        let devices = self
            .shared
            .view()
            .plugins
            .iter()
            .map(|(resource, p)| pr::ContainerDevices {
                resource_name: resource.clone(),
                device_ids: p.healthy(),
                topology: None,
            })
            .collect();
        Ok(Response::new(pr::AllocatableResourcesResponse {
            devices,
            ..Default::default()
        }))
    }

    async fn get(
        &self,
        request: Request<pr::GetPodResourcesRequest>,
    ) -> Result<Response<pr::GetPodResourcesResponse>, Status> {
        let request = request.into_inner();
        let found = self
            .shared
            .books()
            .pods
            .iter()
            .find(|(_, p)| p.name == request.pod_name && p.namespace == request.pod_namespace)
            .map(|(k, v)| (k.clone(), v.clone()));
        let (uid, pod) = found.ok_or_else(|| {
            Status::not_found(format!(
                "pod {}/{} is not known",
                request.pod_namespace, request.pod_name
            ))
        })?;
        Ok(Response::new(pr::GetPodResourcesResponse {
            pod_resources: Some(self.pod(&uid, &pod)),
        }))
    }
}
