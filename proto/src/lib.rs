//! The resource-layer gRPC API and the kubelet protos the node agent speaks, generated at build
//! time from the `.proto` files in this crate (pure Rust, no system `protoc`).
//!
//! - [`resource::v1alpha1`]: the resource-layer API (`runtimekit.resource.v1alpha1`), served
//!   by `runtimekit-resource-layer` on a unix socket: devices and topology, TDM and MIG
//!   instances, metrics, health events, and fault injection for the simulated backend.
//! - [`deviceplugin::v1beta1`]: the kubelet device-plugin API, verbatim from Kubernetes 1.37
//!   (`k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/api.proto`).
//! - [`podresources::v1`]: the kubelet pod-resources API, verbatim from Kubernetes 1.37
//!   (`k8s.io/kubelet/pkg/apis/podresources/v1/api.proto`).
//! - [`dra::v1`]: the kubelet's DRA plugin API (`NodePrepareResources`,
//!   `NodeUnprepareResources`), verbatim from Kubernetes 1.37
//!   (`k8s.io/kubelet/pkg/apis/dra/v1/api.proto`); 1.35 speaks it too.
//! - [`pluginregistration`]: the kubelet's plugin-registration API, verbatim from Kubernetes
//!   1.37 (`k8s.io/kubelet/pkg/apis/pluginregistration/v1/api.proto`).
//! - [`cri::v1`]: the Container Runtime Interface (`runtime.v1`), verbatim from
//!   `k8s.io/cri-api` v0.37.2; client side only (the node installer asks containerd).
//!
//! The other modules have both the client and the server side.

/// The resource-layer API.
pub mod resource {
    /// Version `v1alpha1` of the resource-layer API.
    #[allow(
        missing_debug_implementations,
        unused_qualifications,
        clippy::all,
        clippy::unwrap_used,
        clippy::panic
    )]
    pub mod v1alpha1 {
        include!(concat!(
            env!("OUT_DIR"),
            "/resource/runtimekit.resource.v1alpha1.rs"
        ));
    }
}

/// The kubelet device-plugin API.
pub mod deviceplugin {
    /// Version `v1beta1`, the only one the kubelet supports.
    #[allow(
        missing_debug_implementations,
        unused_qualifications,
        clippy::all,
        clippy::unwrap_used,
        clippy::panic
    )]
    pub mod v1beta1 {
        include!(concat!(env!("OUT_DIR"), "/deviceplugin/v1beta1.rs"));

        /// `Device.health` of a healthy device.
        pub const HEALTHY: &str = "Healthy";
        /// `Device.health` of an unhealthy device.
        pub const UNHEALTHY: &str = "Unhealthy";
        /// The API version a plugin registers with.
        pub const VERSION: &str = "v1beta1";
        /// The folder of the kubelet's and the plugins' sockets.
        pub const DEVICE_PLUGIN_PATH: &str = "/var/lib/kubelet/device-plugins/";
        /// The kubelet's registration socket.
        pub const KUBELET_SOCKET: &str = "/var/lib/kubelet/device-plugins/kubelet.sock";
    }
}

/// The kubelet's DRA plugin API.
pub mod dra {
    /// Version `v1`, served by the kubelet since 1.34.
    #[allow(
        missing_debug_implementations,
        unused_qualifications,
        clippy::all,
        clippy::unwrap_used,
        clippy::panic
    )]
    pub mod v1 {
        include!(concat!(
            env!("OUT_DIR"),
            "/dra/k8s.io.kubelet.pkg.apis.dra.v1.rs"
        ));

        /// The service name a plugin names among its supported versions.
        pub const SERVICE: &str = "v1.DRAPlugin";
    }
}

/// The kubelet's plugin-registration API (its package is `pluginregistration`, with no version).
#[allow(
    missing_debug_implementations,
    unused_qualifications,
    clippy::all,
    clippy::unwrap_used,
    clippy::panic
)]
pub mod pluginregistration {
    include!(concat!(
        env!("OUT_DIR"),
        "/pluginregistration/pluginregistration.rs"
    ));

    /// `PluginInfo.type` of a DRA plugin.
    pub const DRA_PLUGIN: &str = "DRAPlugin";
}

/// The kubelet pod-resources API.
pub mod podresources {
    /// Version `v1`.
    #[allow(
        missing_debug_implementations,
        unused_qualifications,
        clippy::all,
        clippy::unwrap_used,
        clippy::panic
    )]
    pub mod v1 {
        include!(concat!(env!("OUT_DIR"), "/podresources/v1.rs"));

        /// The kubelet's pod-resources socket.
        pub const KUBELET_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";
    }
}

/// The Container Runtime Interface.
pub mod cri {
    /// Version `v1` (package `runtime.v1`).
    #[allow(
        missing_debug_implementations,
        unused_qualifications,
        clippy::all,
        clippy::unwrap_used,
        clippy::panic
    )]
    pub mod v1 {
        include!(concat!(env!("OUT_DIR"), "/cri/runtime.v1.rs"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn services_have_their_upstream_wire_names() {
        // The kubelet dials these exact names; a renamed package would break registration.
        assert_eq!(
            deviceplugin::v1beta1::registration_server::SERVICE_NAME,
            "v1beta1.Registration"
        );
        assert_eq!(
            deviceplugin::v1beta1::device_plugin_server::SERVICE_NAME,
            "v1beta1.DevicePlugin"
        );
        assert_eq!(
            podresources::v1::pod_resources_lister_server::SERVICE_NAME,
            "v1.PodResourcesLister"
        );
        assert_eq!(
            resource::v1alpha1::resource_layer_server::SERVICE_NAME,
            "runtimekit.resource.v1alpha1.ResourceLayer"
        );
        assert_eq!(
            resource::v1alpha1::fault_injection_server::SERVICE_NAME,
            "runtimekit.resource.v1alpha1.FaultInjection"
        );
    }

    #[test]
    fn register_request_encodes_with_upstream_field_numbers() {
        let request = deviceplugin::v1beta1::RegisterRequest {
            version: deviceplugin::v1beta1::VERSION.into(),
            endpoint: "a.sock".into(),
            resource_name: "x/y".into(),
            options: Some(deviceplugin::v1beta1::DevicePluginOptions {
                pre_start_required: false,
                get_preferred_allocation_available: true,
            }),
        };
        let mut want = vec![0x0a, 7];
        want.extend_from_slice(b"v1beta1");
        want.extend_from_slice(&[0x12, 6]);
        want.extend_from_slice(b"a.sock");
        want.extend_from_slice(&[0x1a, 3]);
        want.extend_from_slice(b"x/y");
        want.extend_from_slice(&[0x22, 2, 0x10, 1]);
        assert_eq!(request.encode_to_vec(), want);
    }

    #[test]
    fn pod_resources_have_the_1_37_fields() {
        // ContainerResources.dynamic_resources is field 5; ClaimResource.device_name field 4
        // (share_id, 5, arrived in 1.35).
        let container = podresources::v1::ContainerResources {
            dynamic_resources: vec![podresources::v1::DynamicResource::default()],
            ..Default::default()
        };
        assert_eq!(container.encode_to_vec(), [0x2a, 0]);
        let claim = podresources::v1::ClaimResource {
            device_name: "gpu-0".into(),
            ..Default::default()
        };
        let mut want = vec![0x22, 5];
        want.extend_from_slice(b"gpu-0");
        assert_eq!(claim.encode_to_vec(), want);
    }
}
