//! A test kubelet that speaks the real protocols, for the device plugin's tests and the
//! end-to-end tests (kwok nodes have no kubelet).
//!
//! Like the kubelet's device manager it serves `v1beta1.Registration` on
//! `<root>/device-plugins/kubelet.sock` (checking the version and the resource name as the
//! kubelet does), dials each plugin's endpoint, calls GetDevicePluginOptions and keeps a
//! ListAndWatch stream open; it admits containers by choosing devices from the healthy,
//! unallocated ones (asking GetPreferredAllocation first when the plugin offers it), calls
//! Allocate once per container and PreStartContainer when required, and keeps its books in
//! memory (its checkpoint), which it serves through `v1.PodResourcesLister` on
//! `<root>/pod-resources/kubelet.sock`. [`TestKubelet::restart`] behaves like a new kubelet:
//! it removes every socket in the device-plugin folder and creates `kubelet.sock` again.
//! Optionally it writes capacity and allocatable into a Node's status, and admits the pods
//! bound to the Node, as a kubelet does.

use crate::util::AbortOnDrop;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher;
use runtimekit_proto::deviceplugin::v1beta1 as dp;
use runtimekit_proto::deviceplugin::v1beta1::device_plugin_client::DevicePluginClient;
use runtimekit_proto::deviceplugin::v1beta1::registration_server::{
    Registration, RegistrationServer,
};
use runtimekit_proto::podresources::v1 as pr;
use runtimekit_proto::podresources::v1::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;
use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

/// A pod as the kubelet knows it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PodRef {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its UID.
    pub uid: String,
}

/// One registered plugin, as the test kubelet sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct PluginView {
    /// The options it gave.
    pub options: dp::DevicePluginOptions,
    /// Its devices, as the last ListAndWatch message listed them.
    pub devices: Vec<dp::Device>,
    /// Whether its ListAndWatch stream is open.
    pub connected: bool,
    /// How many times it registered.
    pub registrations: u32,
}

impl PluginView {
    /// The IDs of its healthy devices.
    pub fn healthy(&self) -> Vec<String> {
        self.devices
            .iter()
            .filter(|d| d.health == dp::HEALTHY)
            .map(|d| d.id.clone())
            .collect()
    }
}

/// What the test kubelet knows now.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KubeletView {
    /// Plugins by resource name.
    pub plugins: BTreeMap<String, PluginView>,
    /// Devices given to containers: (pod UID, container) → resource → device IDs.
    pub allocations: BTreeMap<(String, String), BTreeMap<String, Vec<String>>>,
    /// The outcome of admitting each pod (by UID), when pods are admitted from a Node.
    pub admissions: BTreeMap<String, Result<(), String>>,
}

impl KubeletView {
    /// Capacity (devices) and allocatable (healthy devices) of every registered resource, as
    /// the kubelet reports them in the Node's status.
    pub fn capacity(&self) -> BTreeMap<String, (u64, u64)> {
        self.plugins
            .iter()
            .map(|(name, p)| {
                (
                    name.clone(),
                    (p.devices.len() as u64, p.healthy().len() as u64),
                )
            })
            .collect()
    }

    /// The devices of `resource` given to a pod's containers.
    pub fn devices_of(&self, pod_uid: &str, resource: &str) -> Vec<String> {
        self.allocations
            .iter()
            .filter(|((uid, _), _)| uid == pod_uid)
            .flat_map(|(_, r)| r.get(resource).cloned().unwrap_or_default())
            .collect()
    }
}

struct Plugin {
    client: DevicePluginClient<Channel>,
    view: PluginView,
    generation: u64,
    _watch: AbortOnDrop<()>,
}

#[derive(Default)]
struct Books {
    plugins: BTreeMap<String, Plugin>,
    registrations: BTreeMap<String, u32>,
    allocations: BTreeMap<(String, String), BTreeMap<String, Vec<String>>>,
    pods: BTreeMap<String, PodRef>,
    admissions: BTreeMap<String, Result<(), String>>,
    generation: u64,
}

struct Shared {
    books: Mutex<Books>,
    changed: watch::Sender<u64>,
    admitting: tokio::sync::Mutex<()>,
}

impl Shared {
    fn books(&self) -> MutexGuard<'_, Books> {
        self.books.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn touch(&self) {
        self.changed.send_modify(|n| *n += 1);
    }

    fn view(&self) -> KubeletView {
        let books = self.books();
        KubeletView {
            plugins: books
                .plugins
                .iter()
                .map(|(k, p)| (k.clone(), p.view.clone()))
                .collect(),
            allocations: books.allocations.clone(),
            admissions: books.admissions.clone(),
        }
    }
}

/// Checks a resource name as the kubelet's `Register` does (`v1helper.IsExtendedResourceName`).
pub fn check_resource_name(name: &str) -> Result<(), String> {
    let bad = |why: &str| Err(format!("invalid resource name {name:?}: {why}"));
    let Some((prefix, base)) = name.split_once('/') else {
        return bad("it has no domain prefix");
    };
    if name.contains("kubernetes.io/") {
        return bad("the kubernetes.io domain is reserved");
    }
    if name.starts_with("requests.") {
        return bad("it must not start with requests.");
    }
    let dns_label = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if prefix.len() > 253 || !prefix.split('.').all(dns_label) {
        return bad("the prefix is not a DNS subdomain");
    }
    let ok_char = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.');
    let bytes = base.as_bytes();
    let valid = !bytes.is_empty()
        && bytes.len() <= 63
        && bytes.iter().all(|b| ok_char(*b))
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric);
    if !valid {
        return bad("the name is not a qualified name");
    }
    Ok(())
}

#[derive(Clone)]
struct RegistrationService {
    shared: Arc<Shared>,
    dir: PathBuf,
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn register(
        &self,
        request: Request<dp::RegisterRequest>,
    ) -> Result<Response<dp::Empty>, Status> {
        let request = request.into_inner();
        if request.version != dp::VERSION {
            return Err(Status::invalid_argument(format!(
                "unsupported device plugin API version {:?}; supported: {}",
                request.version,
                dp::VERSION
            )));
        }
        check_resource_name(&request.resource_name).map_err(Status::invalid_argument)?;
        if request.endpoint.contains('/') || request.endpoint.is_empty() {
            return Err(Status::invalid_argument(format!(
                "endpoint {:?} must be a socket file name in the device-plugin folder",
                request.endpoint
            )));
        }
        let endpoint = self.dir.join(&request.endpoint);
        // Like the kubelet, answer now and dial the plugin in the background.
        tokio::spawn(connect_plugin(self.shared.clone(), request, endpoint));
        Ok(Response::new(dp::Empty {}))
    }
}

async fn connect_plugin(shared: Arc<Shared>, request: dp::RegisterRequest, endpoint: PathBuf) {
    let resource = request.resource_name.clone();
    let mut channel = None;
    for _ in 0..50 {
        if let Ok(c) = runtimekit_resource_layer::connect(&endpoint).await {
            channel = Some(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let Some(channel) = channel else {
        tracing::warn!(%resource, endpoint = %endpoint.display(), "test kubelet: cannot dial the plugin");
        return;
    };
    let mut client = DevicePluginClient::new(channel);
    let Ok(options) = client.get_device_plugin_options(dp::Empty {}).await else {
        return;
    };
    let Ok(stream) = client.list_and_watch(dp::Empty {}).await else {
        return;
    };
    let mut stream = stream.into_inner();
    let generation = {
        let mut books = shared.books();
        books.generation += 1;
        books.generation
    };
    let watcher_shared = shared.clone();
    let watcher_resource = resource.clone();
    let watch = tokio::spawn(async move {
        let shared = watcher_shared;
        while let Ok(Some(message)) = stream.message().await {
            {
                let mut books = shared.books();
                let Some(plugin) = books.plugins.get_mut(&watcher_resource) else {
                    return;
                };
                if plugin.generation != generation {
                    return;
                }
                plugin.view.devices = message.devices;
                plugin.view.connected = true;
            }
            shared.touch();
        }
        // The plugin went away: its devices stay known but none is healthy.
        {
            let mut books = shared.books();
            if let Some(plugin) = books
                .plugins
                .get_mut(&watcher_resource)
                .filter(|p| p.generation == generation)
            {
                plugin.view.connected = false;
                for device in &mut plugin.view.devices {
                    device.health = dp::UNHEALTHY.into();
                }
            }
        }
        shared.touch();
    });
    {
        let mut books = shared.books();
        let count = books.registrations.entry(resource.clone()).or_default();
        *count += 1;
        let registrations = *count;
        let devices = books
            .plugins
            .get(&resource)
            .map(|p| p.view.devices.clone())
            .unwrap_or_default();
        books.plugins.insert(
            resource,
            Plugin {
                client,
                view: PluginView {
                    options: options.into_inner(),
                    devices,
                    connected: false,
                    registrations,
                },
                generation,
                _watch: AbortOnDrop(watch),
            },
        );
    }
    shared.touch();
}

#[derive(Clone)]
struct PodResourcesService {
    shared: Arc<Shared>,
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

struct Servers {
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// A test kubelet on a folder that stands for `/var/lib/kubelet`.
pub struct TestKubelet {
    root: PathBuf,
    shared: Arc<Shared>,
    servers: Option<Servers>,
    _tasks: Vec<AbortOnDrop<()>>,
}

impl std::fmt::Debug for TestKubelet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestKubelet")
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

fn bind(path: &Path) -> std::io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    if std::fs::symlink_metadata(path).is_ok() {
        std::fs::remove_file(path)?;
    }
    UnixListener::bind(path)
}

impl TestKubelet {
    /// Starts a kubelet whose folder is `root`.
    pub async fn start(root: &Path) -> std::io::Result<TestKubelet> {
        let mut kubelet = TestKubelet {
            root: root.to_owned(),
            shared: Arc::new(Shared {
                books: Mutex::default(),
                changed: watch::channel(0).0,
                admitting: tokio::sync::Mutex::new(()),
            }),
            servers: None,
            _tasks: Vec::new(),
        };
        kubelet.serve()?;
        Ok(kubelet)
    }

    /// The device-plugin folder (`<root>/device-plugins`).
    pub fn device_plugin_dir(&self) -> PathBuf {
        self.root.join("device-plugins")
    }

    /// The pod-resources socket (`<root>/pod-resources/kubelet.sock`).
    pub fn pod_resources_socket(&self) -> PathBuf {
        self.root.join("pod-resources").join("kubelet.sock")
    }

    fn serve(&mut self) -> std::io::Result<()> {
        let (stop, stopped) = watch::channel(false);
        let registration = bind(&self.device_plugin_dir().join("kubelet.sock"))?;
        let pod_resources = bind(&self.pod_resources_socket())?;
        let until = |mut rx: watch::Receiver<bool>| async move {
            let _ = rx.changed().await;
        };
        let registration = tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(RegistrationService {
                shared: self.shared.clone(),
                dir: self.device_plugin_dir(),
            }))
            .serve_with_incoming_shutdown(
                UnixListenerStream::new(registration),
                until(stopped.clone()),
            );
        let pod_resources = tonic::transport::Server::builder()
            .add_service(PodResourcesListerServer::new(PodResourcesService {
                shared: self.shared.clone(),
            }))
            .serve_with_incoming_shutdown(UnixListenerStream::new(pod_resources), until(stopped));
        self.servers = Some(Servers {
            stop,
            tasks: vec![
                tokio::spawn(async move {
                    let _ = registration.await;
                }),
                tokio::spawn(async move {
                    let _ = pod_resources.await;
                }),
            ],
        });
        Ok(())
    }

    async fn stop_servers(&mut self) {
        if let Some(servers) = self.servers.take() {
            let _ = servers.stop.send(true);
            for task in servers.tasks {
                let _ = tokio::time::timeout(Duration::from_secs(2), task).await;
            }
        }
    }

    /// Restarts like a new kubelet: every socket in the device-plugin folder is removed,
    /// the plugins are forgotten (their devices are kept, unhealthy, until they register
    /// again), the allocations are kept (the checkpoint), and `kubelet.sock` is created anew.
    pub async fn restart(&mut self) -> std::io::Result<()> {
        self.stop_servers().await;
        for entry in std::fs::read_dir(self.device_plugin_dir())?.flatten() {
            use std::os::unix::fs::FileTypeExt;
            if entry.file_type().is_ok_and(|t| t.is_socket()) {
                std::fs::remove_file(entry.path())?;
            }
        }
        {
            let mut books = self.shared.books();
            for plugin in books.plugins.values_mut() {
                plugin.view.connected = false;
                for device in &mut plugin.view.devices {
                    device.health = dp::UNHEALTHY.into();
                }
            }
        }
        self.shared.touch();
        self.serve()
    }

    /// What the kubelet knows now.
    pub fn view(&self) -> KubeletView {
        self.shared.view()
    }

    /// Waits until `check` returns `Some` for the kubelet's view, for at most `timeout`.
    pub async fn wait_until<T>(
        &self,
        timeout: Duration,
        mut check: impl FnMut(&KubeletView) -> Option<T>,
    ) -> Result<T, String> {
        let mut changed = self.shared.changed.subscribe();
        let wait = async {
            loop {
                if let Some(value) = check(&self.view()) {
                    return value;
                }
                let _ = tokio::time::timeout(Duration::from_millis(200), changed.changed()).await;
            }
        };
        tokio::time::timeout(timeout, wait).await.map_err(|_| {
            format!(
                "timed out after {timeout:?}; the kubelet saw {:#?}",
                summary(&self.view())
            )
        })
    }

    /// Gives `count` devices of `resource` to a container, as the kubelet's device manager
    /// does at admission: the healthy devices no container holds, the plugin's suggestion
    /// first, then Allocate. Returns the devices and the plugin's answer.
    pub async fn allocate(
        &self,
        pod: &PodRef,
        container: &str,
        resource: &str,
        count: usize,
    ) -> Result<(Vec<String>, dp::ContainerAllocateResponse), String> {
        let _serial = self.shared.admitting.lock().await;
        allocate(&self.shared, pod, container, resource, count).await
    }

    /// Calls PreStartContainer for every resource of a container whose plugin asks for it.
    pub async fn start_container(&self, pod_uid: &str, container: &str) -> Result<(), String> {
        start_container(&self.shared, pod_uid, container).await
    }

    /// Forgets a pod's allocations (the pod was deleted).
    pub fn release(&self, pod_uid: &str) {
        release(&self.shared, pod_uid);
    }

    /// Keeps `node`'s capacity and allocatable for the registered resources as the kubelet
    /// would report them, until the kubelet is dropped.
    pub fn sync_node(&mut self, client: Client, node: &str) {
        let task = tokio::spawn(sync_node(self.shared.clone(), client, node.to_owned()));
        self._tasks.push(AbortOnDrop(task));
    }

    /// Admits the pods bound to `node` as they come (their device-plugin resources, container
    /// by container, then PreStartContainer), and releases them when they are deleted, until
    /// the kubelet is dropped. The outcomes are in [`KubeletView::admissions`].
    pub fn admit_pods(&mut self, client: Client, node: &str) {
        let task = tokio::spawn(admit_pods(self.shared.clone(), client, node.to_owned()));
        self._tasks.push(AbortOnDrop(task));
    }
}

impl Drop for TestKubelet {
    fn drop(&mut self) {
        if let Some(servers) = &self.servers {
            let _ = servers.stop.send(true);
        }
    }
}

/// A short description of a view, for timeouts.
fn summary(view: &KubeletView) -> BTreeMap<String, String> {
    view.plugins
        .iter()
        .map(|(name, p)| {
            (
                name.clone(),
                format!(
                    "{} devices, {} healthy, connected: {}, registrations: {}",
                    p.devices.len(),
                    p.healthy().len(),
                    p.connected,
                    p.registrations
                ),
            )
        })
        .collect()
}

async fn allocate(
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

async fn start_container(shared: &Shared, pod_uid: &str, container: &str) -> Result<(), String> {
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

fn release(shared: &Shared, pod_uid: &str) {
    {
        let mut books = shared.books();
        books.allocations.retain(|(uid, _), _| uid != pod_uid);
        books.pods.remove(pod_uid);
    }
    shared.touch();
}

/// Keeps the Node's capacity and allocatable for the registered resources in line with the
/// plugins' devices, checking again every second (kwok writes the status too).
async fn sync_node(shared: Arc<Shared>, client: Client, node: String) {
    let nodes: Api<Node> = Api::all(client);
    let mut changed = shared.changed.subscribe();
    loop {
        let capacity = shared.view().capacity();
        if let Ok(current) = nodes.get_status(&node).await {
            let status = current.status.unwrap_or_default();
            let have = |map: &Option<
                BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
            >,
                        name: &str| {
                map.as_ref().and_then(|m| m.get(name)).map(|q| q.0.clone())
            };
            let stale = capacity.iter().any(|(name, (c, a))| {
                have(&status.capacity, name) != Some(c.to_string())
                    || have(&status.allocatable, name) != Some(a.to_string())
            });
            if stale {
                let caps: BTreeMap<&String, String> = capacity
                    .iter()
                    .map(|(k, (c, _))| (k, c.to_string()))
                    .collect();
                let allocs: BTreeMap<&String, String> = capacity
                    .iter()
                    .map(|(k, (_, a))| (k, a.to_string()))
                    .collect();
                let patch =
                    serde_json::json!({"status": {"capacity": caps, "allocatable": allocs}});
                if let Err(error) = nodes
                    .patch_status(&node, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    tracing::warn!(%error, %node, "test kubelet: cannot write the node's status");
                }
            }
        }
        let _ = tokio::time::timeout(Duration::from_secs(1), changed.changed()).await;
    }
}

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

async fn admit_pods(shared: Arc<Shared>, client: Client, node: String) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_names_are_checked_as_the_kubelet_does() {
        for good in [
            "aliyun.com/gpu-core",
            "nvidia.com/gpu",
            "example.org/mig-1g.10gb",
        ] {
            assert_eq!(check_resource_name(good), Ok(()), "{good}");
        }
        for bad in [
            "gpu",
            "kubernetes.io/gpu",
            "requests.aliyun.com/gpu",
            "Aliyun.com/gpu",
            "aliyun.com/-gpu",
            "aliyun.com/",
        ] {
            assert!(check_resource_name(bad).is_err(), "{bad}");
        }
    }
}
