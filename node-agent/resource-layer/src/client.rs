//! Connecting to a resource-layer server on a unix socket (tonic over UDS).

use hyper_util::rt::TokioIo;
use runtimekit_proto::resource::v1alpha1::fault_injection_client::FaultInjectionClient;
use runtimekit_proto::resource::v1alpha1::resource_layer_client::ResourceLayerClient;
use std::path::{Path, PathBuf};
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};
use tower::service_fn;

pub use crate::error::reason_of;

/// The endpoint of a UDS channel; the URI is a placeholder, the connector dials the socket.
fn endpoint() -> Endpoint {
    Endpoint::from_static("http://[::]:50051")
}

fn connector(
    path: PathBuf,
) -> impl tower::Service<
    Uri,
    Response = TokioIo<UnixStream>,
    Error = std::io::Error,
    Future = impl Send + 'static,
> + Clone
+ Send
+ 'static {
    service_fn(move |_: Uri| {
        let path = path.clone();
        async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
    })
}

/// A channel to the server on `socket`, connected now (fails when nothing listens).
pub async fn connect(socket: impl AsRef<Path>) -> Result<Channel, tonic::transport::Error> {
    endpoint()
        .connect_with_connector(connector(socket.as_ref().to_path_buf()))
        .await
}

/// A channel to the server on `socket` that connects on first use and reconnects after the
/// server restarts.
pub fn connect_lazy(socket: impl AsRef<Path>) -> Channel {
    endpoint().connect_with_connector_lazy(connector(socket.as_ref().to_path_buf()))
}

/// A resource-layer client on `socket`.
pub async fn resource_client(
    socket: impl AsRef<Path>,
) -> Result<ResourceLayerClient<Channel>, tonic::transport::Error> {
    Ok(ResourceLayerClient::new(connect(socket).await?))
}

/// A fault-injection client on `socket` (simulated backend only).
pub async fn fault_client(
    socket: impl AsRef<Path>,
) -> Result<FaultInjectionClient<Channel>, tonic::transport::Error> {
    Ok(FaultInjectionClient::new(connect(socket).await?))
}
