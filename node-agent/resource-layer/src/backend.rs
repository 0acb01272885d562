//! The one internal trait every backend implements; the gRPC service is a thin layer over it.
//!
//! Methods are blocking (NVML is a blocking C library, and a simulated hang blocks like a real
//! one); the gRPC layer runs them on the blocking pool and answers at the caller's deadline.

use crate::device_nodes::DeviceNodes;
use crate::error::LayerError;
use crate::health::HealthHub;
use crate::instances::CreateRequest;
use runtimekit_proto::resource::v1alpha1 as pb;

/// What a backend does.
pub trait Backend: Send + Sync + std::fmt::Debug + 'static {
    /// What serves the API.
    fn info(&self) -> pb::GetInfoResponse;

    /// Cards (all when `devices` is empty), with NICs and pairwise paths.
    fn list_devices(&self, devices: &[u32]) -> Result<pb::ListDevicesResponse, LayerError>;

    /// Creates an instance, idempotent by key.
    fn create_instance(
        &self,
        request: CreateRequest,
    ) -> Result<pb::CreateInstanceResponse, LayerError>;

    /// Destroys an instance; nothing to destroy is not an error.
    fn destroy_instance(
        &self,
        target: DestroyTarget,
    ) -> Result<pb::DestroyInstanceResponse, LayerError>;

    /// Instances on the cards (all when `devices` is empty), with the cards whose instances
    /// could not be read.
    fn list_instances(&self, devices: &[u32]) -> Result<pb::ListInstancesResponse, LayerError>;

    /// Card metrics (all when `devices` is empty).
    fn device_metrics(
        &self,
        devices: &[u32],
        include_processes: bool,
    ) -> Result<pb::GetDeviceMetricsResponse, LayerError>;

    /// Each card's busy time and its processes' SM utilisation: what the compute meter reads
    /// every second. Backends whose full readings cost more answer it with less.
    fn process_metrics(&self) -> Result<pb::GetDeviceMetricsResponse, LayerError> {
        self.device_metrics(&[], true)
    }

    /// Instance metrics (every keyed instance when `keys` is empty).
    fn instance_metrics(
        &self,
        keys: &[String],
    ) -> Result<pb::GetInstanceMetricsResponse, LayerError>;

    /// The health hub of this backend.
    fn health(&self) -> &HealthHub;

    /// Where the device files of the cards, instances and NICs are; `None` when the backend
    /// has none to offer (a simulated backend without a device folder).
    fn device_nodes(&self) -> Option<&DeviceNodes>;

    /// Fault injection, where the backend has it (the simulated one).
    fn faults(&self) -> Option<&dyn FaultInjector> {
        None
    }
}

/// What to destroy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DestroyTarget {
    /// The instance with this key.
    Key(String),
    /// A MIG instance by card and GPU-instance ID.
    Mig {
        device_index: u32,
        gpu_instance_id: u32,
    },
}

impl DestroyTarget {
    /// Checks a destroy request from the wire.
    pub fn from_proto(request: pb::DestroyInstanceRequest) -> Result<Self, LayerError> {
        match request.target {
            Some(pb::destroy_instance_request::Target::Key(key)) => {
                crate::instances::check_key(&key)?;
                Ok(Self::Key(key))
            }
            Some(pb::destroy_instance_request::Target::MigInstance(r)) => Ok(Self::Mig {
                device_index: r.device_index,
                gpu_instance_id: r.gpu_instance_id,
            }),
            None => Err(LayerError::InvalidArgument(
                "destroy needs a key or a MIG instance".into(),
            )),
        }
    }
}

/// Fault injection for tests and the demo.
pub trait FaultInjector: Send + Sync {
    /// Starts a fault.
    fn inject(&self, request: &pb::InjectFaultRequest) -> Result<pb::DeviceFault, LayerError>;
    /// Ends the matching injected faults of a card (every kind when `kind` is `None`, every
    /// XID when `xid` is `None`); returns how many.
    fn clear(
        &self,
        device: u32,
        kind: Option<pb::FaultKind>,
        xid: Option<u32>,
    ) -> Result<u32, LayerError>;
    /// The injected faults in force.
    fn list(&self) -> Vec<pb::DeviceFault>;
    /// Lists process `pid` on card `device` with `sm_percent` of its SM time (0 removes it).
    fn set_process_load(&self, device: u32, pid: u32, sm_percent: u32) -> Result<(), LayerError>;
}

/// Checks that card `index` is one of `count` and, when the caller names the UUID it expects,
/// that the card has it (`uuid_of` reads the card's UUID).
pub fn check_device(
    index: u32,
    count: u32,
    expected: Option<&str>,
    uuid_of: impl FnOnce() -> String,
) -> Result<(), LayerError> {
    if index >= count {
        return Err(LayerError::NoSuchDevice { index, count });
    }
    if let Some(expected) = expected {
        let actual = uuid_of();
        if expected != actual {
            return Err(LayerError::UuidMismatch {
                index,
                expected: expected.to_string(),
                actual,
            });
        }
    }
    Ok(())
}

/// The cards a call is about: `requested`, or all `0..count` when it is empty; unknown
/// indexes are an error.
pub fn select_devices(requested: &[u32], count: u32) -> Result<Vec<u32>, LayerError> {
    if requested.is_empty() {
        return Ok((0..count).collect());
    }
    let mut selected = Vec::with_capacity(requested.len());
    for &index in requested {
        if index >= count {
            return Err(LayerError::NoSuchDevice { index, count });
        }
        if !selected.contains(&index) {
            selected.push(index);
        }
    }
    selected.sort_unstable();
    Ok(selected)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selection_defaults_to_all_and_rejects_unknown() {
        assert_eq!(select_devices(&[], 3), Ok(vec![0, 1, 2]));
        assert_eq!(select_devices(&[2, 0, 2], 3), Ok(vec![0, 2]));
        assert_eq!(
            select_devices(&[3], 3),
            Err(LayerError::NoSuchDevice { index: 3, count: 3 })
        );
    }

    #[test]
    fn a_card_must_exist_and_have_the_expected_uuid() {
        let uuid = || "GPU-1".to_string();
        assert_eq!(check_device(1, 2, None, uuid), Ok(()));
        assert_eq!(check_device(1, 2, Some("GPU-1"), uuid), Ok(()));
        assert_eq!(
            check_device(2, 2, Some("GPU-1"), uuid),
            Err(LayerError::NoSuchDevice { index: 2, count: 2 })
        );
        assert_eq!(
            check_device(1, 2, Some("GPU-9"), uuid),
            Err(LayerError::UuidMismatch {
                index: 1,
                expected: "GPU-9".into(),
                actual: "GPU-1".into(),
            })
        );
    }

    #[test]
    fn destroy_target_needs_a_target() {
        assert!(DestroyTarget::from_proto(pb::DestroyInstanceRequest { target: None }).is_err());
        let key = pb::DestroyInstanceRequest {
            target: Some(pb::destroy_instance_request::Target::Key("k".into())),
        };
        assert_eq!(
            DestroyTarget::from_proto(key),
            Ok(DestroyTarget::Key("k".into()))
        );
    }
}
