//! The gRPC services over a backend, and serving them on a unix socket.
//!
//! Every backend call runs on tokio's blocking pool and is raced against the caller's deadline
//! (`grpc-timeout`, capped by [`ServeOptions::call_timeout`]): a hardware call that hangs makes
//! the caller get DEADLINE_EXCEEDED in time, while the blocked thread waits for the hardware.

use crate::backend::{Backend, DestroyTarget};
use crate::error::{LayerError, status_with_reason};
use crate::instances::CreateRequest;
use crate::reason::Reason;
use futures::{Stream, StreamExt};
use runtimekit_proto::resource::v1alpha1 as pb;
use runtimekit_proto::resource::v1alpha1::fault_injection_server::{
    FaultInjection, FaultInjectionServer,
};
use runtimekit_proto::resource::v1alpha1::resource_layer_server::{
    ResourceLayer, ResourceLayerServer,
};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;
use tokio::net::UnixListener;
use tokio::sync::{broadcast::error::RecvError, oneshot};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::metadata::MetadataMap;
use tonic::{Code, Request, Response, Status};

/// How the server runs.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The longest a call may take when the caller sets no shorter deadline.
    pub call_timeout: Duration,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            call_timeout: Duration::from_secs(30),
        }
    }
}

/// Why serving failed.
#[derive(Debug, Error)]
pub enum ServeError {
    /// The socket could not be created.
    #[error("cannot listen on {path}: {source}")]
    Bind {
        path: String,
        source: std::io::Error,
    },
    /// Another server answers on the socket.
    #[error("another server is already listening on {0}")]
    InUse(String),
    /// The server failed while serving.
    #[error("serving failed: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// The server task ended abnormally.
    #[error("the server task ended abnormally: {0}")]
    Task(String),
}

/// The value of a `grpc-timeout` header (`<up to 8 digits><H|M|S|m|u|n>`).
pub fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    if value.len() < 2 || value.len() > 9 {
        return None;
    }
    let (digits, unit) = value.split_at(value.len() - 1);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.checked_mul(3600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// How long a call may run: the caller's deadline, a little early so this server's answer
/// arrives before the caller gives up, capped by the server's limit.
fn call_limit(metadata: &MetadataMap, cap: Duration) -> Duration {
    let deadline = metadata
        .get("grpc-timeout")
        .and_then(|v| v.to_str().ok())
        .and_then(parse_grpc_timeout);
    match deadline {
        Some(d) => d
            .saturating_sub((d / 20).min(Duration::from_millis(25)))
            .min(cap),
        None => cap,
    }
}

/// Runs a backend call on the blocking pool within the call's limit.
async fn run<T, F>(
    backend: &Arc<dyn Backend>,
    metadata: &MetadataMap,
    cap: Duration,
    what: &'static str,
    call: F,
) -> Result<T, Status>
where
    T: Send + 'static,
    F: FnOnce(&dyn Backend) -> Result<T, LayerError> + Send + 'static,
{
    let limit = call_limit(metadata, cap);
    let backend = backend.clone();
    let task = tokio::task::spawn_blocking(move || call(backend.as_ref()));
    match tokio::time::timeout(limit, task).await {
        Ok(Ok(Ok(value))) => Ok(value),
        Ok(Ok(Err(error))) => {
            tracing::debug!(call = what, %error, "call failed");
            Err(error.into())
        }
        Ok(Err(join)) => Err(status_with_reason(
            Code::Internal,
            format!("{what} failed inside the resource layer: {join}"),
            Reason::Internal,
        )),
        Err(_) => {
            tracing::warn!(call = what, ?limit, "call did not finish in time");
            Err(status_with_reason(
                Code::DeadlineExceeded,
                format!(
                    "{what} did not finish within {limit:?}: a hardware call is hanging (the card gets a CALL_HANG fault)"
                ),
                Reason::DeadlineExceeded,
            ))
        }
    }
}

/// The resource-layer gRPC service over a backend.
#[derive(Debug, Clone)]
pub struct ResourceLayerService {
    backend: Arc<dyn Backend>,
    options: ServeOptions,
}

impl ResourceLayerService {
    /// The service over `backend`.
    pub fn new(backend: Arc<dyn Backend>, options: ServeOptions) -> Self {
        Self { backend, options }
    }

    async fn run<T, F>(
        &self,
        metadata: &MetadataMap,
        what: &'static str,
        call: F,
    ) -> Result<T, Status>
    where
        T: Send + 'static,
        F: FnOnce(&dyn Backend) -> Result<T, LayerError> + Send + 'static,
    {
        run(
            &self.backend,
            metadata,
            self.options.call_timeout,
            what,
            call,
        )
        .await
    }
}

/// The stream type of WatchHealth.
pub type HealthStream = Pin<Box<dyn Stream<Item = Result<pb::WatchHealthResponse, Status>> + Send>>;

#[tonic::async_trait]
impl ResourceLayer for ResourceLayerService {
    async fn get_info(
        &self,
        _request: Request<pb::GetInfoRequest>,
    ) -> Result<Response<pb::GetInfoResponse>, Status> {
        Ok(Response::new(self.backend.info()))
    }

    async fn list_devices(
        &self,
        request: Request<pb::ListDevicesRequest>,
    ) -> Result<Response<pb::ListDevicesResponse>, Status> {
        let devices = request.get_ref().device_indexes.clone();
        self.run(request.metadata(), "ListDevices", move |b| {
            let mut listing = b.list_devices(&devices)?;
            if let Some(nodes) = b.device_nodes() {
                nodes.fill_listing(&mut listing);
            }
            Ok(listing)
        })
        .await
        .map(Response::new)
    }

    async fn create_instance(
        &self,
        request: Request<pb::CreateInstanceRequest>,
    ) -> Result<Response<pb::CreateInstanceResponse>, Status> {
        let metadata = request.metadata().clone();
        let create = CreateRequest::from_proto(request.into_inner())?;
        self.run(&metadata, "CreateInstance", move |b| {
            let mut created = b.create_instance(create)?;
            if let (Some(nodes), Some(instance)) = (b.device_nodes(), created.instance.as_mut()) {
                nodes.fill_instance(instance);
            }
            Ok(created)
        })
        .await
        .map(Response::new)
    }

    async fn destroy_instance(
        &self,
        request: Request<pb::DestroyInstanceRequest>,
    ) -> Result<Response<pb::DestroyInstanceResponse>, Status> {
        let metadata = request.metadata().clone();
        let target = DestroyTarget::from_proto(request.into_inner())?;
        self.run(&metadata, "DestroyInstance", move |b| {
            b.destroy_instance(target)
        })
        .await
        .map(Response::new)
    }

    async fn list_instances(
        &self,
        request: Request<pb::ListInstancesRequest>,
    ) -> Result<Response<pb::ListInstancesResponse>, Status> {
        let devices = request.get_ref().device_indexes.clone();
        self.run(request.metadata(), "ListInstances", move |b| {
            let mut listed = b.list_instances(&devices)?;
            if let Some(nodes) = b.device_nodes() {
                listed
                    .instances
                    .iter_mut()
                    .for_each(|i| nodes.fill_instance(i));
            }
            Ok(listed)
        })
        .await
        .map(Response::new)
    }

    async fn get_device_metrics(
        &self,
        request: Request<pb::GetDeviceMetricsRequest>,
    ) -> Result<Response<pb::GetDeviceMetricsResponse>, Status> {
        let pb::GetDeviceMetricsRequest {
            device_indexes,
            include_processes,
        } = request.get_ref().clone();
        self.run(request.metadata(), "GetDeviceMetrics", move |b| {
            b.device_metrics(&device_indexes, include_processes)
        })
        .await
        .map(Response::new)
    }

    async fn get_instance_metrics(
        &self,
        request: Request<pb::GetInstanceMetricsRequest>,
    ) -> Result<Response<pb::GetInstanceMetricsResponse>, Status> {
        let keys = request.get_ref().keys.clone();
        self.run(request.metadata(), "GetInstanceMetrics", move |b| {
            b.instance_metrics(&keys)
        })
        .await
        .map(Response::new)
    }

    type WatchHealthStream = HealthStream;

    async fn watch_health(
        &self,
        _request: Request<pb::WatchHealthRequest>,
    ) -> Result<Response<HealthStream>, Status> {
        let (snapshot, receiver) = self.backend.health().subscribe();
        let first = pb::WatchHealthResponse {
            message: Some(pb::watch_health_response::Message::Snapshot(snapshot)),
        };
        let events = futures::stream::unfold(Some(receiver), |receiver| async move {
            let mut receiver = receiver?;
            match receiver.recv().await {
                Ok(event) => Some((
                    Ok(pb::WatchHealthResponse {
                        message: Some(pb::watch_health_response::Message::Event(event)),
                    }),
                    Some(receiver),
                )),
                Err(RecvError::Lagged(missed)) => Some((
                    Err(status_with_reason(
                        Code::Aborted,
                        format!("the health stream fell {missed} events behind; subscribe again"),
                        Reason::HealthStreamLagged,
                    )),
                    None,
                )),
                Err(RecvError::Closed) => None,
            }
        });
        let stream = futures::stream::once(async move { Ok(first) }).chain(events);
        Ok(Response::new(Box::pin(stream)))
    }
}

/// The fault-injection service, served only when the backend injects faults.
#[derive(Debug, Clone)]
pub struct FaultService {
    backend: Arc<dyn Backend>,
    options: ServeOptions,
}

fn no_injection() -> LayerError {
    LayerError::Unsupported("this backend does not inject faults".into())
}

fn kind_filter(kind: pb::FaultKind) -> Option<pb::FaultKind> {
    (kind != pb::FaultKind::Unspecified).then_some(kind)
}

#[tonic::async_trait]
impl FaultInjection for FaultService {
    async fn inject_fault(
        &self,
        request: Request<pb::InjectFaultRequest>,
    ) -> Result<Response<pb::InjectFaultResponse>, Status> {
        let req = *request.get_ref();
        run(
            &self.backend,
            request.metadata(),
            self.options.call_timeout,
            "InjectFault",
            move |b| b.faults().ok_or_else(no_injection)?.inject(&req),
        )
        .await
        .map(|fault| Response::new(pb::InjectFaultResponse { fault: Some(fault) }))
    }

    async fn clear_fault(
        &self,
        request: Request<pb::ClearFaultRequest>,
    ) -> Result<Response<pb::ClearFaultResponse>, Status> {
        let req = *request.get_ref();
        run(
            &self.backend,
            request.metadata(),
            self.options.call_timeout,
            "ClearFault",
            move |b| {
                b.faults().ok_or_else(no_injection)?.clear(
                    req.device_index,
                    kind_filter(req.kind()),
                    (req.xid != 0).then_some(req.xid),
                )
            },
        )
        .await
        .map(|cleared| Response::new(pb::ClearFaultResponse { cleared }))
    }

    async fn list_faults(
        &self,
        request: Request<pb::ListFaultsRequest>,
    ) -> Result<Response<pb::ListFaultsResponse>, Status> {
        run(
            &self.backend,
            request.metadata(),
            self.options.call_timeout,
            "ListFaults",
            |b| Ok(b.faults().ok_or_else(no_injection)?.list()),
        )
        .await
        .map(|faults| Response::new(pb::ListFaultsResponse { faults }))
    }

    async fn set_process_load(
        &self,
        request: Request<pb::SetProcessLoadRequest>,
    ) -> Result<Response<pb::SetProcessLoadResponse>, Status> {
        let req = *request.get_ref();
        run(
            &self.backend,
            request.metadata(),
            self.options.call_timeout,
            "SetProcessLoad",
            move |b| {
                b.faults().ok_or_else(no_injection)?.set_process_load(
                    req.device_index,
                    req.pid,
                    req.sm_util_percent,
                )
            },
        )
        .await
        .map(|()| Response::new(pb::SetProcessLoadResponse {}))
    }
}

/// A server running in the background; dropping it stops the server.
#[derive(Debug)]
pub struct ServerHandle {
    socket: PathBuf,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), tonic::transport::Error>>>,
}

impl ServerHandle {
    /// The socket the server listens on.
    pub fn socket_path(&self) -> &Path {
        &self.socket
    }

    /// Stops the server, waits until it has stopped and its socket is gone.
    pub async fn shutdown(mut self) -> Result<(), ServeError> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        self.join().await
    }

    /// Waits until the server stops by itself (it does so only on an error).
    pub async fn join(mut self) -> Result<(), ServeError> {
        let Some(task) = self.task.take() else {
            return Ok(());
        };
        match task.await {
            Ok(result) => result.map_err(ServeError::from),
            Err(join) => Err(ServeError::Task(join.to_string())),
        }
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// Binds the socket: creates its folder, replaces a stale socket file, refuses a live one.
fn bind(path: &Path) -> Result<UnixListener, ServeError> {
    let err = |source| ServeError::Bind {
        path: path.display().to_string(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        if !meta.file_type().is_socket() {
            return Err(err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "the path exists and is not a socket",
            )));
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(ServeError::InUse(path.display().to_string()));
        }
        std::fs::remove_file(path).map_err(err)?;
    }
    listen_private(path).map_err(err)
}

/// Binds a unix socket only its owner may connect to (mode 0600): whoever reaches the resource
/// layer or a device plugin can create instances or claim cards, and on a node that is root
/// (the agent, the kubelet). The mode is set right after the bind, before any connection is
/// accepted; the directory the socket lives in should be root's (as the kubelet's and
/// `/run/runtimekit` are).
pub fn listen_private(path: &Path) -> std::io::Result<UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Serves a backend on a unix socket inside the current tokio runtime and returns at once;
/// the server runs until the handle is shut down or dropped. The FaultInjection service is
/// added when the backend injects faults.
pub async fn serve(
    backend: Arc<dyn Backend>,
    socket: impl AsRef<Path>,
    options: ServeOptions,
) -> Result<ServerHandle, ServeError> {
    let socket = socket.as_ref().to_path_buf();
    let listener = bind(&socket)?;
    let (tx, rx) = oneshot::channel::<()>();
    let faults = backend.faults().is_some().then(|| {
        FaultInjectionServer::new(FaultService {
            backend: backend.clone(),
            options: options.clone(),
        })
    });
    let router = tonic::transport::Server::builder()
        .add_service(ResourceLayerServer::new(ResourceLayerService::new(
            backend, options,
        )))
        .add_optional_service(faults);
    let path = socket.clone();
    let task = tokio::spawn(async move {
        let result = router
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                let _ = rx.await;
            })
            .await;
        let _ = std::fs::remove_file(&path);
        result
    });
    tracing::info!(socket = %socket.display(), "serving the resource-layer API");
    Ok(ServerHandle {
        socket,
        shutdown: Some(tx),
        task: Some(task),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse() {
        assert_eq!(parse_grpc_timeout("250m"), Some(Duration::from_millis(250)));
        assert_eq!(parse_grpc_timeout("3S"), Some(Duration::from_secs(3)));
        assert_eq!(parse_grpc_timeout("2M"), Some(Duration::from_secs(120)));
        assert_eq!(parse_grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_grpc_timeout("10u"), Some(Duration::from_micros(10)));
        assert_eq!(parse_grpc_timeout("10n"), Some(Duration::from_nanos(10)));
        assert_eq!(parse_grpc_timeout("m"), None);
        assert_eq!(parse_grpc_timeout("123456789S"), None);
        assert_eq!(parse_grpc_timeout("12x"), None);
    }

    #[test]
    fn call_limit_is_a_little_before_the_deadline_and_capped() {
        let mut metadata = MetadataMap::new();
        let cap = Duration::from_secs(30);
        assert_eq!(call_limit(&metadata, cap), cap);
        metadata.insert("grpc-timeout", "1000m".parse().expect("ascii"));
        assert_eq!(call_limit(&metadata, cap), Duration::from_millis(975));
        metadata.insert("grpc-timeout", "100m".parse().expect("ascii"));
        assert_eq!(call_limit(&metadata, cap), Duration::from_millis(95));
        metadata.insert("grpc-timeout", "60S".parse().expect("ascii"));
        assert_eq!(call_limit(&metadata, cap), cap);
    }
}
