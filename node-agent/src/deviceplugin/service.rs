//! The `v1beta1.DevicePlugin` service of one resource.

use super::allocation::{self, Claim};
use crate::model::NodeState;
use crate::podresources;
use crate::resources::{Advertised, Kind};
use futures::Stream;
use runtimekit_proto::deviceplugin::v1beta1 as dp;
use runtimekit_proto::deviceplugin::v1beta1::device_plugin_server::DevicePlugin;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

/// How long a suggestion may wait for the agent to see the slices of the pod being admitted.
const PREFERENCE_WAIT: Duration = Duration::from_secs(1);

/// The options a resource registers with: whole cards are checked again just before their
/// container starts; every resource but RDMA shares suggests devices.
pub fn options(kind: Kind) -> dp::DevicePluginOptions {
    dp::DevicePluginOptions {
        pre_start_required: kind.whole(),
        get_preferred_allocation_available: kind != Kind::Rdma,
    }
}

/// The device plugin of one resource.
#[derive(Debug, Clone)]
pub struct PluginService {
    /// The resource.
    pub resource: Advertised,
    /// Its devices, kept current.
    pub devices: watch::Receiver<Vec<dp::Device>>,
    /// What the agent knows.
    pub state: watch::Receiver<NodeState>,
    /// Turns true when the server stops, ending the ListAndWatch streams.
    pub stop: watch::Receiver<bool>,
    /// The kubelet's pod-resources socket, to find cards given whole under another name.
    pub pod_resources: Option<PathBuf>,
    /// Every whole-card resource name.
    pub whole_names: Vec<String>,
    /// The containers suggestions were made for.
    pub claims: Arc<Mutex<BTreeSet<Claim>>>,
}

/// The stream type of ListAndWatch.
pub type DeviceStream =
    Pin<Box<dyn Stream<Item = Result<dp::ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for PluginService {
    async fn get_device_plugin_options(
        &self,
        _request: Request<dp::Empty>,
    ) -> Result<Response<dp::DevicePluginOptions>, Status> {
        Ok(Response::new(options(self.resource.kind)))
    }

    type ListAndWatchStream = DeviceStream;

    async fn list_and_watch(
        &self,
        _request: Request<dp::Empty>,
    ) -> Result<Response<DeviceStream>, Status> {
        let resource = self.resource.name.clone();
        tracing::info!(%resource, "the kubelet is watching the devices");
        let stream = futures::stream::unfold(
            (self.devices.clone(), self.stop.clone(), true),
            |(mut devices, mut stop, first)| async move {
                if !first {
                    tokio::select! {
                        changed = devices.changed() => {
                            if changed.is_err() {
                                return None;
                            }
                        }
                        _ = stop.changed() => return None,
                    }
                }
                if *stop.borrow() {
                    return None;
                }
                let list = devices.borrow_and_update().clone();
                Some((
                    Ok(dp::ListAndWatchResponse { devices: list }),
                    (devices, stop, false),
                ))
            },
        );
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<dp::PreferredAllocationRequest>,
    ) -> Result<Response<dp::PreferredAllocationResponse>, Status> {
        let deadline = tokio::time::Instant::now() + PREFERENCE_WAIT;
        let mut changes = self.state.clone();
        loop {
            let state = changes.borrow_and_update().clone();
            // Nothing is suggested before the wait is over unless a slice claims it: the
            // kubelet can ask before this agent's watch shows the pod's slices (the scheduler
            // writes them and the Binding at once), and a guess gives the pod other devices than
            // its slices name.
            let settle = tokio::time::Instant::now() >= deadline;
            if let Some(responses) = self.suggest(&state, request.get_ref(), settle) {
                return Ok(Response::new(dp::PreferredAllocationResponse {
                    container_responses: responses,
                }));
            }
            let _ = tokio::time::timeout_at(deadline, changes.changed()).await;
        }
    }

    async fn allocate(
        &self,
        request: Request<dp::AllocateRequest>,
    ) -> Result<Response<dp::AllocateResponse>, Status> {
        let held = match (&self.pod_resources, self.resource.kind.whole()) {
            (Some(socket), true) => match podresources::list(socket).await {
                Ok(pods) => {
                    let state = self.state.borrow();
                    let inventory = state.inventory.clone().unwrap_or_default();
                    podresources::held_whole(&pods, &inventory, &self.whole_names, &state.own_pods)
                }
                Err(error) => {
                    tracing::debug!(%error, "checking without the kubelet's pod resources");
                    self.state.borrow().held_whole.clone()
                }
            },
            _ => self.state.borrow().held_whole.clone(),
        };
        let state = self.state.borrow().clone();
        let mut responses = Vec::new();
        for container in &request.get_ref().container_requests {
            match allocation::allocate(&self.resource, &container.devices_ids, &state, &held) {
                Ok(response) => {
                    tracing::info!(resource = %self.resource.name, devices = ?container.devices_ids, "allocated");
                    responses.push(response);
                }
                Err(message) => {
                    tracing::warn!(resource = %self.resource.name, devices = ?container.devices_ids, %message, "refused an allocation");
                    return Err(Status::failed_precondition(message));
                }
            }
        }
        Ok(Response::new(dp::AllocateResponse {
            container_responses: responses,
        }))
    }

    async fn pre_start_container(
        &self,
        request: Request<dp::PreStartContainerRequest>,
    ) -> Result<Response<dp::PreStartContainerResponse>, Status> {
        let state = self.state.borrow().clone();
        allocation::pre_start(&self.resource, &request.get_ref().devices_ids, &state)
            .map_err(|message| {
                tracing::warn!(resource = %self.resource.name, %message, "refused to start a container");
                Status::failed_precondition(message)
            })?;
        Ok(Response::new(dp::PreStartContainerResponse {}))
    }
}

impl PluginService {
    /// Suggests devices for each container of a request. Without `settle`, gives up (`None`)
    /// when a container matches no slice, so the caller can wait for the agent to see the pod.
    fn suggest(
        &self,
        state: &NodeState,
        request: &dp::PreferredAllocationRequest,
        settle: bool,
    ) -> Option<Vec<dp::ContainerPreferredAllocationResponse>> {
        let kind = self.resource.kind;
        let live: BTreeSet<Claim> = allocation::candidates(kind, state)
            .into_iter()
            .map(|c| c.claim)
            .collect();
        let mut claims = self.claims.lock().unwrap_or_else(PoisonError::into_inner);
        claims.retain(|c| live.contains(c));
        let mut taken = claims.clone();
        let mut responses = Vec::new();
        for container in &request.container_requests {
            let (ids, claim) = allocation::preferred(kind, container, state, &taken);
            match claim {
                Some(claim) => {
                    taken.insert(claim);
                }
                None if !settle => return None,
                None => {}
            }
            tracing::info!(
                resource = %self.resource.name,
                size = container.allocation_size,
                devices = ?ids,
                "suggested devices"
            );
            responses.push(dp::ContainerPreferredAllocationResponse { device_i_ds: ids });
        }
        *claims = taken;
        Some(responses)
    }
}
