//! The kubelet's `v1beta1.Registration` server: checks each plugin's request as the kubelet
//! does, then dials the plugin, asks its options and keeps its ListAndWatch stream open.

use crate::books::{Plugin, Shared};
use crate::view::PluginView;
use runtimekit_node_agent::task::AbortOnDrop;
use runtimekit_proto::deviceplugin::v1beta1 as dp;
use runtimekit_proto::deviceplugin::v1beta1::device_plugin_client::DevicePluginClient;
use runtimekit_proto::deviceplugin::v1beta1::registration_server::Registration;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tonic::{Request, Response, Status};

/// Checks a resource name as the kubelet's `Register` does (`v1helper.IsExtendedResourceName`).
fn check_resource_name(name: &str) -> Result<(), String> {
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

/// The Registration server, dialing plugins in `dir` (the device-plugin folder).
#[derive(Clone)]
pub(crate) struct RegistrationService {
    pub(crate) shared: Arc<Shared>,
    pub(crate) dir: PathBuf,
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
