//! Asks the node's resource layer for its device files (`runtimekit_injection::hardware`).

use runtimekit_injection::hardware::Hardware;
use runtimekit_proto::resource::v1alpha1 as pb;
use runtimekit_proto::resource::v1alpha1::resource_layer_client::ResourceLayerClient;
use std::path::Path;
use std::time::Duration;

/// How long one question to the resource layer may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The device files the resource layer at `socket` lists.
pub async fn query(socket: &Path) -> Result<Hardware, String> {
    let channel = runtimekit_resource_layer::client::connect(socket)
        .await
        .map_err(|e| {
            format!(
                "cannot reach the resource layer at {}: {e}",
                socket.display()
            )
        })?;
    let mut client = ResourceLayerClient::new(channel);
    let mut request = tonic::Request::new(pb::ListDevicesRequest::default());
    request.set_timeout(CALL_TIMEOUT);
    let listing = client
        .list_devices(request)
        .await
        .map_err(|e| format!("the resource layer did not list the cards: {}", e.message()))?;
    Ok(Hardware::from_listing(listing.get_ref()))
}
