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
//!
//! - [`view`]: what the tests see ([`KubeletView`], [`PluginView`], [`PodRef`]);
//! - `books`: what the kubelet keeps in memory, shared by its servers and tasks;
//! - `registration`: the Registration server and the connection to each plugin;
//! - `pod_resources`: the PodResourcesLister server;
//! - `admission`: giving devices to containers and admitting the pods bound to a Node;
//! - `node_status`: the Node's capacity and allocatable.
//!
//! It is a crate of its own, used only as a dev-dependency, so the agent's binary does not
//! carry it; its binary `runtimekit-test-kubelet` plays it for the demo cluster's kwok nodes.

mod admission;
mod books;
mod node_status;
mod pod_resources;
mod registration;
pub mod view;

pub use view::{KubeletView, PluginView, PodRef};

use books::Shared;
use kube::Client;
use pod_resources::PodResourcesService;
use registration::RegistrationService;
use runtimekit_node_agent::task::AbortOnDrop;
use runtimekit_proto::deviceplugin::v1beta1 as dp;
use runtimekit_proto::deviceplugin::v1beta1::registration_server::RegistrationServer;
use runtimekit_proto::podresources::v1::pod_resources_lister_server::PodResourcesListerServer;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio_stream::wrappers::UnixListenerStream;

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
        admission::allocate(&self.shared, pod, container, resource, count).await
    }

    /// Calls PreStartContainer for every resource of a container whose plugin asks for it.
    pub async fn start_container(&self, pod_uid: &str, container: &str) -> Result<(), String> {
        admission::start_container(&self.shared, pod_uid, container).await
    }

    /// Forgets a pod's allocations (the pod was deleted).
    pub fn release(&self, pod_uid: &str) {
        admission::release(&self.shared, pod_uid);
    }

    /// Keeps `node`'s capacity and allocatable for the registered resources as the kubelet
    /// would report them, until the kubelet is dropped.
    pub fn sync_node(&mut self, client: Client, node: &str) {
        let task = tokio::spawn(node_status::sync_node(
            self.shared.clone(),
            client,
            node.to_owned(),
        ));
        self._tasks.push(AbortOnDrop(task));
    }

    /// Admits the pods bound to `node` as they come (their device-plugin resources, container
    /// by container, then PreStartContainer), and releases them when they are deleted, until
    /// the kubelet is dropped. The outcomes are in [`KubeletView::admissions`].
    pub fn admit_pods(&mut self, client: Client, node: &str) {
        let task = tokio::spawn(admission::admit_pods(
            self.shared.clone(),
            client,
            node.to_owned(),
        ));
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
