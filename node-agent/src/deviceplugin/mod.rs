//! The kubelet device plugin, v1beta1, exactly as the kubelet speaks it: one `DevicePlugin`
//! server per resource on a unix socket in the kubelet's device-plugin folder, registered on the
//! kubelet's `kubelet.sock`; registered again whenever the kubelet restarts (a new kubelet
//! removes every socket in the folder and creates `kubelet.sock` anew).

pub mod allocation;
pub mod service;

use crate::model::NodeState;
use crate::resources::{Advertised, devices};
use crate::task::AbortOnDrop;
use runtimekit_proto::deviceplugin::v1beta1 as dp;
use runtimekit_proto::deviceplugin::v1beta1::device_plugin_server::DevicePluginServer;
use runtimekit_proto::deviceplugin::v1beta1::registration_client::RegistrationClient;
use service::{PluginService, options};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;

/// The kubelet's registration socket in its device-plugin folder.
pub const KUBELET_SOCKET: &str = "kubelet.sock";
/// How often the folder is looked at for a kubelet restart.
const WATCH_INTERVAL: Duration = Duration::from_millis(250);
/// How long a registration may take.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(5);

/// The device plugins of every advertised resource.
#[derive(Debug, Clone)]
pub struct DevicePlugins {
    /// The kubelet's device-plugin folder (`/var/lib/kubelet/device-plugins`).
    pub dir: PathBuf,
    /// The resources to advertise.
    pub resources: Vec<Advertised>,
    /// What the agent knows.
    pub state: watch::Receiver<NodeState>,
    /// The kubelet's pod-resources socket.
    pub pod_resources: Option<PathBuf>,
}

/// Identifies one instance of a socket file: a re-created file differs in inode or change time.
fn identity(path: &Path) -> Option<(u64, u64, i64, i64)> {
    std::fs::metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino(), m.ctime(), m.ctime_nsec()))
}

/// One plugin server running.
struct Served {
    socket: PathBuf,
    identity: Option<(u64, u64, i64, i64)>,
    stop: watch::Sender<bool>,
    task: JoinHandle<Result<(), tonic::transport::Error>>,
}

impl Served {
    async fn stop(self) {
        let _ = self.stop.send(true);
        if tokio::time::timeout(Duration::from_secs(2), self.task)
            .await
            .is_err()
        {
            tracing::warn!(socket = %self.socket.display(), "a plugin server did not stop in time");
        }
        // The kubelet may have removed the socket; remove it only if it is still this one.
        if identity(&self.socket).is_some() && identity(&self.socket) == self.identity {
            let _ = std::fs::remove_file(&self.socket);
        }
    }
}

impl DevicePlugins {
    /// Serves and registers the plugins until the task is dropped.
    pub async fn run(self) {
        let (senders, receivers): (Vec<_>, Vec<_>) = self
            .resources
            .iter()
            .map(|_| watch::channel(Vec::<dp::Device>::new()))
            .unzip();
        let _lists = AbortOnDrop(tokio::spawn(keep_lists(
            self.state.clone(),
            self.resources.clone(),
            senders,
        )));
        let mut state = self.state.clone();
        if state.wait_for(|s| s.inventory.is_some()).await.is_err() {
            return;
        }
        let kubelet = self.dir.join(KUBELET_SOCKET);
        let claims = Arc::default();
        let whole_names: Vec<String> = self
            .resources
            .iter()
            .filter(|r| r.kind.whole())
            .map(|r| r.name.clone())
            .collect();
        let mut waiting_logged = false;
        loop {
            let Some(kubelet_id) = identity(&kubelet) else {
                if !waiting_logged {
                    tracing::info!(socket = %kubelet.display(), "waiting for the kubelet");
                    waiting_logged = true;
                }
                tokio::time::sleep(WATCH_INTERVAL).await;
                continue;
            };
            waiting_logged = false;
            let mut servers = Vec::new();
            let mut failed = None;
            for (resource, devices) in self.resources.iter().zip(&receivers) {
                let service = PluginService {
                    resource: resource.clone(),
                    devices: devices.clone(),
                    state: self.state.clone(),
                    stop: watch::channel(false).1,
                    pod_resources: self.pod_resources.clone(),
                    whole_names: whole_names.clone(),
                    claims: Arc::clone(&claims),
                };
                match serve(&self.dir, service) {
                    Ok(served) => servers.push(served),
                    Err(error) => {
                        failed = Some(format!("serving {}: {error}", resource.name));
                        break;
                    }
                }
            }
            if failed.is_none() {
                for resource in &self.resources {
                    if let Err(error) = register(&kubelet, resource).await {
                        failed = Some(error);
                        break;
                    }
                    tracing::info!(resource = %resource.name, endpoint = %resource.socket_name(), "registered with the kubelet");
                }
            }
            if let Some(error) = failed {
                tracing::warn!(%error, "the device plugins are not registered; trying again");
                for served in servers {
                    served.stop().await;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            loop {
                tokio::time::sleep(WATCH_INTERVAL).await;
                let restarted = identity(&kubelet) != Some(kubelet_id);
                let removed = servers
                    .iter()
                    .any(|s| identity(&s.socket).is_none() || identity(&s.socket) != s.identity);
                if restarted || removed {
                    tracing::info!(
                        restarted,
                        removed,
                        "the kubelet restarted; registering again"
                    );
                    break;
                }
            }
            for served in servers {
                served.stop().await;
            }
        }
    }
}

/// Keeps each resource's device list current.
async fn keep_lists(
    mut state: watch::Receiver<NodeState>,
    resources: Vec<Advertised>,
    senders: Vec<watch::Sender<Vec<dp::Device>>>,
) {
    loop {
        let now = state.borrow_and_update().clone();
        for (resource, sender) in resources.iter().zip(&senders) {
            let list = devices(resource, &now);
            sender.send_if_modified(|current| {
                let changed = *current != list;
                if changed {
                    *current = list;
                }
                changed
            });
        }
        if state.changed().await.is_err() {
            return;
        }
    }
}

/// Starts one plugin's server on its socket (replacing a stale file).
fn serve(dir: &Path, mut service: PluginService) -> std::io::Result<Served> {
    std::fs::create_dir_all(dir)?;
    let socket = dir.join(service.resource.socket_name());
    if std::fs::symlink_metadata(&socket).is_ok() {
        std::fs::remove_file(&socket)?;
    }
    let listener = runtimekit_resource_layer::listen_private(&socket)?;
    let (stop, stopped) = watch::channel(false);
    service.stop = stopped.clone();
    let mut shutdown = stopped;
    let task = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(DevicePluginServer::new(service))
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
                let _ = shutdown.changed().await;
            }),
    );
    Ok(Served {
        identity: identity(&socket),
        socket,
        stop,
        task,
    })
}

/// Registers one resource with the kubelet.
async fn register(kubelet: &Path, resource: &Advertised) -> Result<(), String> {
    let channel = tokio::time::timeout(
        REGISTER_TIMEOUT,
        runtimekit_resource_layer::connect(kubelet),
    )
    .await
    .map_err(|_| format!("{} does not answer", kubelet.display()))?
    .map_err(|e| format!("cannot reach {}: {e}", kubelet.display()))?;
    let mut request = tonic::Request::new(dp::RegisterRequest {
        version: dp::VERSION.into(),
        endpoint: resource.socket_name(),
        resource_name: resource.name.clone(),
        options: Some(options(resource.kind)),
    });
    request.set_timeout(REGISTER_TIMEOUT);
    RegistrationClient::new(channel)
        .register(request)
        .await
        .map_err(|s| format!("the kubelet refused {}: {}", resource.name, s.message()))?;
    Ok(())
}
