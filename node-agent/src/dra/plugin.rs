//! The kubelet plugin of the DRA driver: registers with the kubelet (plugin registration,
//! `DRAPlugin` type, service `v1.DRAPlugin`), and prepares and unprepares the claims of the
//! node's pods.
//!
//! Preparing a claim reads it from the apiserver, checks what its allocation asks against what
//! the node holds ([`claims::plan`]), records its devices (so the enactor and the device plugin
//! keep off its cards from then on), makes its shares and MIG instances through the resource
//! layer, makes the isolation folder of each time-division request, writes its CDI spec and
//! answers the kubelet with one CDI device per request. Every step is undone when a later one
//! fails, and the checkpoint is written before the kubelet is answered. Preparing a claim
//! again answers what was answered; unpreparing destroys what was made. At start the driver
//! adopts what its checkpoint records, writes back a CDI spec that went missing, and removes
//! the CDI specs and instances of claims it no longer holds.

use super::authority;
use super::cdi;
use super::checkpoint::{AnsweredDevice, Checkpoint, PreparedClaim};
use super::claims::{self, Planned};
use super::config::{self, RequestConfig};
use crate::layer::InventoryRefresher;
use crate::model::NodeState;
use crate::task::AbortOnDrop;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::Api;
use kube::{Client, ResourceExt};
use runtimekit_injection::hardware::Hardware;
use runtimekit_injection::host::{self, IsolationFolder};
use runtimekit_lj_runtime::config::CorePolicy;
use runtimekit_proto::dra::v1 as dra;
use runtimekit_proto::dra::v1::dra_plugin_server::{DraPlugin, DraPluginServer};
use runtimekit_proto::pluginregistration as registration;
use runtimekit_proto::pluginregistration::registration_server::{Registration, RegistrationServer};
use runtimekit_proto::resource::v1alpha1 as pb;
use runtimekit_proto::resource::v1alpha1::resource_layer_client::ResourceLayerClient;
use runtimekit_resource_layer::reason_of;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::DuplexStream;
use tokio::net::UnixListener;
use tokio::sync::{Mutex, mpsc, watch};
use tokio_stream::wrappers::{ReceiverStream, UnixListenerStream};
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

/// The kubelet's name of the service this plugin serves.
pub const SERVICE_VERSION: &str = "v1.DRAPlugin";
/// How long one resource-layer call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// How often the sockets are looked at (a kubelet that wiped its folders gets them again).
const SOCKET_CHECK: Duration = Duration::from_secs(5);

/// Where the plugin's files go.
#[derive(Debug, Clone)]
pub struct Paths {
    /// The kubelet's plugin-registration folder (`/var/lib/kubelet/plugins_registry`).
    pub registry_dir: PathBuf,
    /// The folder of the plugin's own socket (`/var/lib/kubelet/plugins/<driver>`).
    pub plugin_dir: PathBuf,
    /// The container runtime's CDI folder.
    pub cdi_dir: PathBuf,
    /// The checkpoint file.
    pub checkpoint: PathBuf,
    /// The isolation library given to time-division holders.
    pub isolation_library: PathBuf,
    /// Where their isolation folders are made (the meter reads every folder there).
    pub isolation_state_dir: PathBuf,
    /// The node's core policy (`RUNTIMEKIT_GPU_CORE_POLICY`), unless a claim's configuration
    /// sets another.
    pub core_policy: CorePolicy,
}

/// What the DRA driver works with.
pub struct Settings {
    /// The apiserver (claims are read from it).
    pub client: Client,
    /// This node (the pool).
    pub node: String,
    /// The driver name.
    pub driver: String,
    /// Where its files go.
    pub paths: Paths,
    /// The resource layer.
    pub layer: ResourceLayerClient<Channel>,
    /// What the agent knows; the driver records prepared devices in it.
    pub state: watch::Sender<NodeState>,
    /// Lists the cards before a claim is checked.
    pub inventory: InventoryRefresher,
}

/// The DRA driver's node side.
#[derive(Clone)]
pub struct Driver {
    inner: Arc<Inner>,
}

struct Inner {
    settings: Settings,
    /// Held through a whole prepare or unprepare, so each sees what the one before did.
    record: Mutex<Checkpoint>,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("node", &self.node)
            .field("driver", &self.driver)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.settings.fmt(f)
    }
}

/// What the kubelet names a claim by.
fn claim_ref(claim: &dra::Claim) -> String {
    format!("{}/{}", claim.namespace, claim.name)
}

impl Driver {
    /// A driver; reads the checkpoint (an unreadable one is an error: its claims must not be
    /// forgotten) and records its devices in the node's state.
    pub fn new(settings: Settings) -> Result<Driver, String> {
        let record = Checkpoint::load(&settings.paths.checkpoint)?;
        settings
            .state
            .send_modify(|s| s.prepared = record.devices());
        Ok(Driver {
            inner: Arc::new(Inner {
                settings,
                record: Mutex::new(record),
            }),
        })
    }

    /// The registration and plugin sockets.
    pub fn sockets(&self) -> (PathBuf, PathBuf) {
        let paths = &self.inner.settings.paths;
        (
            paths
                .registry_dir
                .join(format!("{}-reg.sock", self.inner.settings.driver)),
            paths.plugin_dir.join("dra.sock"),
        )
    }

    /// Adopts what the checkpoint records, then serves the kubelet for ever (serving again
    /// when a socket disappears).
    pub async fn run(self) {
        self.adopt().await;
        loop {
            let served = match self.serve() {
                Ok(served) => served,
                Err(error) => {
                    tracing::error!(%error, "cannot serve the DRA plugin; retrying");
                    tokio::time::sleep(SOCKET_CHECK).await;
                    continue;
                }
            };
            let (registration, plugin) = self.sockets();
            tracing::info!(registration = %registration.display(), plugin = %plugin.display(), driver = %self.inner.settings.driver, "serving the DRA plugin");
            while registration.exists() && plugin.exists() {
                tokio::time::sleep(SOCKET_CHECK).await;
            }
            tracing::warn!("a DRA plugin socket disappeared; serving again");
            drop(served);
        }
    }

    fn serve(&self) -> std::io::Result<(AbortOnDrop<()>, AbortOnDrop<()>)> {
        let (registration, plugin) = self.sockets();
        let listen = |socket: &Path| -> std::io::Result<UnixListener> {
            if let Some(dir) = socket.parent() {
                std::fs::create_dir_all(dir)?;
            }
            if std::fs::symlink_metadata(socket).is_ok() {
                std::fs::remove_file(socket)?;
            }
            runtimekit_resource_layer::listen_private(socket)
        };
        // The plugin's socket first: the kubelet connects to it once registration answers.
        let plugin_incoming = UnixListenerStream::new(listen(&plugin)?);
        let service = tonic::transport::Server::builder()
            .add_service(DraPluginServer::new(self.clone()))
            .serve_with_incoming(plugin_incoming);
        let registrar = Registrar {
            driver: self.inner.settings.driver.clone(),
            endpoint: plugin.display().to_string(),
        };
        let registering = tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(registrar))
            .serve_with_incoming(relayed(listen(&registration)?));
        Ok((
            AbortOnDrop(tokio::spawn(async move {
                if let Err(error) = service.await {
                    tracing::error!(%error, "the DRA plugin's server stopped");
                }
            })),
            AbortOnDrop(tokio::spawn(async move {
                if let Err(error) = registering.await {
                    tracing::error!(%error, "the DRA plugin's registration server stopped");
                }
            })),
        ))
    }

    /// Takes up what the checkpoint records: CDI specs written back where missing, the specs
    /// and instances of claims no longer held removed.
    async fn adopt(&self) {
        let record = self.inner.record.lock().await;
        for (uid, claim) in &record.claims {
            let path = cdi::spec_path(
                &self.inner.settings.paths.cdi_dir,
                &self.inner.settings.driver,
                uid,
            );
            let current = std::fs::read_to_string(&path)
                .ok()
                .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok());
            if current.as_ref() != Some(&claim.cdi_spec) {
                match cdi::write(&path, &claim.cdi_spec) {
                    Ok(()) => {
                        tracing::info!(claim = %format!("{}/{}", claim.namespace, claim.name), "wrote the claim's CDI spec back")
                    }
                    Err(error) => {
                        tracing::error!(%error, "cannot write a prepared claim's CDI spec back")
                    }
                }
            }
        }
        if let Ok(entries) = std::fs::read_dir(&self.inner.settings.paths.cdi_dir) {
            for entry in entries.flatten() {
                let name = entry.file_name();
                let Some(uid) =
                    cdi::claim_of_spec(&name.to_string_lossy(), &self.inner.settings.driver)
                else {
                    continue;
                };
                if !record.claims.contains_key(&uid) {
                    tracing::info!(file = %entry.path().display(), "removing the CDI spec of a claim no longer prepared");
                    if let Err(error) = cdi::remove(&entry.path()) {
                        tracing::warn!(%error, "cannot remove a stale CDI spec");
                    }
                }
            }
        }
        let held: BTreeSet<String> = record
            .devices()
            .into_iter()
            .filter_map(|d| d.instance_key)
            .collect();
        let mut layer = self.inner.settings.layer.clone();
        let instances = match layer
            .list_instances(pb::ListInstancesRequest::default())
            .await
        {
            Ok(response) => response.into_inner().instances,
            Err(status) => {
                tracing::warn!(error = %status.message(), "cannot list instances to remove claims' leftovers");
                return;
            }
        };
        for instance in instances {
            if claims::is_claim_key(&instance.key) && !held.contains(&instance.key) {
                match destroy(&mut layer, &instance.key).await {
                    Ok(_) => {
                        tracing::info!(key = %instance.key, "destroyed the instance of a claim no longer prepared")
                    }
                    Err(error) => {
                        tracing::warn!(key = %instance.key, %error, "cannot destroy a claim's leftover instance")
                    }
                }
            }
        }
        drop(record);
        self.inner.settings.inventory.wake();
    }

    /// Prepares one claim; the error is what the kubelet shows on the pod.
    async fn prepare(&self, claim: &dra::Claim) -> Result<Vec<AnsweredDevice>, String> {
        let inner = &self.inner;
        let mut record = inner.record.lock().await;
        if let Some(done) = record.claims.get(&claim.uid) {
            return Ok(done.answered.clone());
        }
        let api: Api<ResourceClaim> =
            Api::namespaced(inner.settings.client.clone(), &claim.namespace);
        let object = api
            .get(&claim.name)
            .await
            .map_err(|e| format!("reading ResourceClaim {}: {e}", claim_ref(claim)))?;
        if object.uid().as_deref() != Some(claim.uid.as_str()) {
            return Err(format!(
                "ResourceClaim {} is now UID {}, not the {} the kubelet asked for",
                claim_ref(claim),
                object.uid().unwrap_or_default(),
                claim.uid
            ));
        }
        inner.settings.inventory.refresh().await;
        let planned = claims::plan(
            &object,
            &inner.settings.node,
            &inner.settings.driver,
            &inner.settings.state.borrow().clone(),
        )?;
        let name = claim_ref(claim);
        let configs = config::read(&object, &inner.settings.driver, &planned)
            .map_err(|e| format!("ResourceClaim {name}: {e}"))?;
        let pods = claims::reserved_pods(&object);
        let devices: Vec<_> = planned
            .iter()
            .map(|p| claims::prepared(&name, &claim.uid, p, &pods))
            .collect();
        // Recorded before anything is made, so no GpuSlice is enacted on these cards meanwhile.
        inner.settings.state.send_modify(|s| {
            s.prepared.retain(|p| p.claim_uid != claim.uid);
            s.prepared.extend(devices.iter().cloned());
        });
        let mut made = Made::default();
        match self
            .make(&object, &claim.uid, &planned, &configs, &mut made)
            .await
        {
            Ok((spec, answered)) => {
                record.claims.insert(
                    claim.uid.clone(),
                    PreparedClaim {
                        namespace: claim.namespace.clone(),
                        name: claim.name.clone(),
                        devices,
                        answered: answered.clone(),
                        cdi_spec: spec,
                        folders: made.folders.clone(),
                    },
                );
                if let Err(error) = record.save(&inner.settings.paths.checkpoint) {
                    record.claims.remove(&claim.uid);
                    self.undo(&claim.uid, &made).await;
                    return Err(error);
                }
                tracing::info!(claim = %name, devices = answered.len(), "prepared the claim");
                inner.settings.inventory.wake();
                Ok(answered)
            }
            Err(error) => {
                self.undo(&claim.uid, &made).await;
                tracing::warn!(claim = %name, %error, "cannot prepare the claim");
                Err(error)
            }
        }
    }

    /// Makes what the plan needs; `made` says what to undo.
    async fn make(
        &self,
        object: &ResourceClaim,
        uid: &str,
        planned: &[Planned],
        configs: &BTreeMap<String, RequestConfig>,
        made: &mut Made,
    ) -> Result<(serde_json::Value, Vec<AnsweredDevice>), String> {
        let inner = &self.inner;
        let mut layer = inner.settings.layer.clone();
        for device in planned {
            let Some((key, spec)) = claims::instance(uid, device) else {
                continue;
            };
            let mut request = Request::new(pb::CreateInstanceRequest {
                key: key.clone(),
                spec: Some(spec),
            });
            request.set_timeout(CALL_TIMEOUT);
            made.instances.push(key.clone());
            layer.create_instance(request).await.map_err(|e| {
                format!(
                    "device {}: the resource layer cannot make it ({}: {})",
                    device.device,
                    reason_of(&e).unwrap_or("ResourceLayerError"),
                    e.message()
                )
            })?;
        }
        let mut request = Request::new(pb::ListDevicesRequest::default());
        request.set_timeout(CALL_TIMEOUT);
        let listing = layer
            .list_devices(request)
            .await
            .map_err(|e| format!("listing the node's devices: {}", e.message()))?
            .into_inner();
        let hardware = Hardware::from_listing(&listing);
        let mut devices = Vec::new();
        let mut ids = BTreeMap::new();
        for (request, grant) in claims::grants(uid, planned) {
            let mut given = runtimekit_injection::given::given(Some(&grant), &hardware)
                .map_err(|e| format!("request {request}: {e}"))?;
            if grant.needs_enforcing() {
                let folder = inner
                    .settings
                    .paths
                    .isolation_state_dir
                    .join(format!("claim-{uid}-{request}"));
                made.folders.push(folder.clone());
                given.enforcement = Some(host::make_isolation_folder(&IsolationFolder {
                    library: &inner.settings.paths.isolation_library,
                    folder,
                    image_preload: "",
                    core_policy: configs
                        .get(&request)
                        .and_then(|c| c.core_policy)
                        .unwrap_or(inner.settings.paths.core_policy)
                        .variable(),
                })?);
            }
            devices.push(cdi::device(
                &cdi::device_name(uid, &request),
                &given,
                &host::stat,
            ));
            ids.insert(
                request.clone(),
                cdi::device_id(&inner.settings.driver, uid, &request),
            );
        }
        let spec = cdi::spec(&inner.settings.driver, devices);
        let path = cdi::spec_path(&inner.settings.paths.cdi_dir, &inner.settings.driver, uid);
        made.spec = Some(path.clone());
        cdi::write(&path, &spec)?;
        Ok((spec, answered(object, &inner.settings.driver, &mut ids)))
    }

    /// Removes what a failed prepare made, and its record in the node's state.
    async fn undo(&self, uid: &str, made: &Made) {
        let mut layer = self.inner.settings.layer.clone();
        for key in &made.instances {
            if let Err(error) = destroy(&mut layer, key).await {
                tracing::warn!(%key, %error, "cannot destroy the instance of a failed prepare (removed at the next start)");
            }
        }
        remove_files(made.spec.as_deref(), &made.folders);
        self.inner
            .settings
            .state
            .send_modify(|s| s.prepared.retain(|p| p.claim_uid != uid));
        self.inner.settings.inventory.wake();
    }

    /// Unprepares one claim: what was made for it is destroyed, its files removed.
    async fn unprepare(&self, claim: &dra::Claim) -> Result<(), String> {
        let inner = &self.inner;
        let mut record = inner.record.lock().await;
        let Some(done) = record.claims.get(&claim.uid).cloned() else {
            return Ok(());
        };
        let mut layer = inner.settings.layer.clone();
        for key in done.devices.iter().filter_map(|d| d.instance_key.as_ref()) {
            destroy(&mut layer, key).await?;
        }
        let spec = cdi::spec_path(
            &inner.settings.paths.cdi_dir,
            &inner.settings.driver,
            &claim.uid,
        );
        remove_files(Some(&spec), &done.folders);
        record.claims.remove(&claim.uid);
        record.save(&inner.settings.paths.checkpoint)?;
        inner
            .settings
            .state
            .send_modify(|s| s.prepared.retain(|p| p.claim_uid != claim.uid));
        inner.settings.inventory.wake();
        tracing::info!(claim = %claim_ref(claim), "unprepared the claim");
        Ok(())
    }
}

/// The registration socket's connections, each through the [`authority`] relay (the
/// kubelet's registration requests carry the socket's path as their authority).
fn relayed(listener: UnixListener) -> ReceiverStream<std::io::Result<DuplexStream>> {
    let (connections, incoming) = mpsc::channel(16);
    tokio::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(error) => {
                    tracing::warn!(%error, "accepting a registration connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let (server_side, relay_side) = tokio::io::duplex(64 * 1024);
            if connections.send(Ok(server_side)).await.is_err() {
                return;
            }
            tokio::spawn(async move {
                let (from_kubelet, mut to_kubelet) = stream.into_split();
                let (mut from_server, to_server) = tokio::io::split(relay_side);
                let (up, down) = tokio::join!(
                    authority::rewrite(from_kubelet, to_server),
                    tokio::io::copy(&mut from_server, &mut to_kubelet)
                );
                if let Err(error) = up.and(down.map(|_| ())) {
                    tracing::debug!(%error, "a registration connection ended");
                }
            });
        }
    });
    ReceiverStream::new(incoming)
}

/// What a prepare made so far.
#[derive(Debug, Default)]
struct Made {
    instances: Vec<String>,
    folders: Vec<PathBuf>,
    spec: Option<PathBuf>,
}

/// What the kubelet is told of each of this driver's results: the CDI device of its request
/// goes with the request's first result only (one device gives the request's whole grant).
fn answered(
    claim: &ResourceClaim,
    driver: &str,
    ids: &mut BTreeMap<String, String>,
) -> Vec<AnsweredDevice> {
    runtimekit_contract::dra::allocated(claim, driver)
        .map(|r| AnsweredDevice {
            requests: vec![r.request.clone()],
            pool: r.pool.clone(),
            device: r.device.clone(),
            cdi_ids: ids
                .remove(runtimekit_contract::dra::base_request(&r.request))
                .into_iter()
                .collect(),
            share_id: r.share_id.clone(),
        })
        .collect()
}

fn remove_files(spec: Option<&Path>, folders: &[PathBuf]) {
    if let Some(spec) = spec
        && let Err(error) = cdi::remove(spec)
    {
        tracing::warn!(%error, "cannot remove a claim's CDI spec");
    }
    for folder in folders {
        if folder.exists()
            && let Err(error) = std::fs::remove_dir_all(folder)
        {
            tracing::warn!(folder = %folder.display(), %error, "cannot remove a claim's isolation folder");
        }
    }
}

async fn destroy(layer: &mut ResourceLayerClient<Channel>, key: &str) -> Result<bool, String> {
    let mut request = Request::new(pb::DestroyInstanceRequest {
        target: Some(pb::destroy_instance_request::Target::Key(key.to_owned())),
    });
    request.set_timeout(CALL_TIMEOUT);
    layer
        .destroy_instance(request)
        .await
        .map(|r| r.into_inner().existed)
        .map_err(|e| format!("destroying instance {key}: {}", e.message()))
}

#[tonic::async_trait]
impl DraPlugin for Driver {
    async fn node_prepare_resources(
        &self,
        request: Request<dra::NodePrepareResourcesRequest>,
    ) -> Result<Response<dra::NodePrepareResourcesResponse>, Status> {
        let mut response = dra::NodePrepareResourcesResponse::default();
        for claim in request.into_inner().claims {
            let answer = match self.prepare(&claim).await {
                Ok(devices) => dra::NodePrepareResourceResponse {
                    devices: devices
                        .into_iter()
                        .map(|d| dra::Device {
                            request_names: d.requests,
                            pool_name: d.pool,
                            device_name: d.device,
                            cdi_device_ids: d.cdi_ids,
                            share_id: d.share_id,
                        })
                        .collect(),
                    error: String::new(),
                },
                Err(error) => dra::NodePrepareResourceResponse {
                    devices: Vec::new(),
                    error,
                },
            };
            response.claims.insert(claim.uid.clone(), answer);
        }
        Ok(Response::new(response))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<dra::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<dra::NodeUnprepareResourcesResponse>, Status> {
        let mut response = dra::NodeUnprepareResourcesResponse::default();
        for claim in request.into_inner().claims {
            let error = self.unprepare(&claim).await.err().unwrap_or_default();
            if !error.is_empty() {
                tracing::warn!(claim = %claim_ref(&claim), %error, "cannot unprepare the claim");
            }
            response.claims.insert(
                claim.uid.clone(),
                dra::NodeUnprepareResourceResponse { error },
            );
        }
        Ok(Response::new(response))
    }
}

/// Answers the kubelet's plugin watcher.
#[derive(Debug, Clone)]
struct Registrar {
    driver: String,
    endpoint: String,
}

#[tonic::async_trait]
impl Registration for Registrar {
    async fn get_info(
        &self,
        _request: Request<registration::InfoRequest>,
    ) -> Result<Response<registration::PluginInfo>, Status> {
        Ok(Response::new(registration::PluginInfo {
            r#type: registration::DRA_PLUGIN.into(),
            name: self.driver.clone(),
            endpoint: self.endpoint.clone(),
            supported_versions: vec![SERVICE_VERSION.into()],
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<registration::RegistrationStatus>,
    ) -> Result<Response<registration::RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            tracing::info!(driver = %self.driver, "the kubelet registered the DRA plugin");
        } else {
            tracing::error!(driver = %self.driver, error = %status.error, "the kubelet refused the DRA plugin");
        }
        Ok(Response::new(registration::RegistrationStatusResponse {}))
    }
}
