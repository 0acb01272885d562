//! Errors of the resource layer, each with a gRPC code and a stable PascalCase [`Reason`] that
//! travels in the `runtimekit-reason` metadata entry of the gRPC status.

use crate::reason::Reason;
use runtimekit_proto::resource::v1alpha1 as pb;
use std::time::Duration;
use thiserror::Error;
use tonic::{Code, Status};

/// The metadata key of the stable reason of an error.
pub const REASON_METADATA: &str = "runtimekit-reason";

/// What went wrong in the resource layer.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LayerError {
    /// No card has this index.
    #[error("no card with index {index} (this node has {count})")]
    NoSuchDevice { index: u32, count: u32 },
    /// The card at the index has another UUID than the caller expects.
    #[error("card {index} has UUID {actual}, not {expected}")]
    UuidMismatch {
        index: u32,
        expected: String,
        actual: String,
    },
    /// The card has fallen off the bus or is otherwise inaccessible.
    #[error(
        "card {index} ({uuid}) is lost: it has fallen off the bus or is otherwise inaccessible"
    )]
    DeviceLost { index: u32, uuid: String },
    /// A MIG instance was asked for on a card whose MIG mode is off.
    #[error(
        "card {index} ({model}) is not in MIG mode; MIG mode is an administrator's setting that the resource layer never changes"
    )]
    MigModeDisabled { index: u32, model: String },
    /// A MIG instance was asked for on a model without MIG.
    #[error("card {index} ({model}) does not support MIG")]
    MigUnsupported { index: u32, model: String },
    /// A TDM share was asked for on a card in MIG mode.
    #[error("card {index} is in MIG mode and serves only MIG instances, not TDM shares")]
    MigModeEnabled { index: u32 },
    /// The card's vendor serves whole cards only.
    #[error("card {index} ({model}) serves whole cards only; it cannot be shared")]
    SharingUnsupported { index: u32, model: String },
    /// The model's MIG table has no such profile.
    #[error("{table} has no MIG profile {profile} (it offers {offered})")]
    UnknownProfile {
        table: String,
        profile: String,
        offered: String,
    },
    /// The profile cannot start at this memory slice.
    #[error(
        "{profile} cannot start at memory slice {start} on {table}; its legal starts are {legal}"
    )]
    IllegalPlacement {
        table: String,
        profile: String,
        start: u32,
        legal: String,
    },
    /// The instance would overlap one that exists.
    #[error("{profile} at memory slice {start} on card {index} overlaps {other}")]
    Overlap {
        index: u32,
        profile: String,
        start: u32,
        other: String,
    },
    /// The key names an instance with another spec.
    #[error("instance {key} already exists with a different spec ({existing})")]
    KeyConflict { key: String, existing: String },
    /// The instance is in use and cannot be destroyed.
    #[error("{what} is in use by running processes and cannot be destroyed")]
    InUse { what: String },
    /// A request field is invalid.
    #[error("{0}")]
    InvalidArgument(String),
    /// A hardware call on the card did not return in time.
    #[error("a hardware call on card {index} did not return within {waited:?}")]
    Hang { index: u32, waited: Duration },
    /// The NVML library could not be loaded.
    #[error("NVML library not found: {0}")]
    NvmlNotFound(String),
    /// The NVML library is there but the kernel driver is not.
    #[error("NVIDIA driver is not loaded: {0}")]
    DriverNotLoaded(String),
    /// An NVML call failed.
    #[error("{call} failed{}: {message}", on_card(*.index))]
    Nvml {
        call: &'static str,
        index: Option<u32>,
        message: String,
    },
    /// The backend does not do this.
    #[error("{0}")]
    Unsupported(String),
    /// The hardware profile of the simulated backend is invalid or missing.
    #[error("hardware profile: {0}")]
    Profile(String),
    /// The state file could not be read or written.
    #[error("state file {path}: {message}")]
    State { path: String, message: String },
}

fn on_card(index: Option<u32>) -> String {
    index.map(|i| format!(" on card {i}")).unwrap_or_default()
}

impl LayerError {
    /// The gRPC code of the error.
    pub fn code(&self) -> Code {
        match self {
            Self::NoSuchDevice { .. } => Code::NotFound,
            Self::UuidMismatch { .. }
            | Self::MigModeDisabled { .. }
            | Self::MigUnsupported { .. }
            | Self::MigModeEnabled { .. }
            | Self::SharingUnsupported { .. }
            | Self::Overlap { .. }
            | Self::InUse { .. } => Code::FailedPrecondition,
            Self::DeviceLost { .. } | Self::NvmlNotFound(_) | Self::DriverNotLoaded(_) => {
                Code::Unavailable
            }
            Self::UnknownProfile { .. }
            | Self::IllegalPlacement { .. }
            | Self::InvalidArgument(_)
            | Self::Profile(_) => Code::InvalidArgument,
            Self::KeyConflict { .. } => Code::AlreadyExists,
            Self::Hang { .. } => Code::DeadlineExceeded,
            Self::Nvml { .. } | Self::State { .. } => Code::Internal,
            Self::Unsupported(_) => Code::Unimplemented,
        }
    }

    /// The stable reason of the error, for callers that branch on it, Events and metrics.
    pub fn reason(&self) -> Reason {
        match self {
            Self::NoSuchDevice { .. } => Reason::NoSuchDevice,
            Self::UuidMismatch { .. } => Reason::DeviceUuidMismatch,
            Self::DeviceLost { .. } => Reason::DeviceLost,
            Self::MigModeDisabled { .. } => Reason::MigModeDisabled,
            Self::MigUnsupported { .. } => Reason::MigUnsupported,
            Self::MigModeEnabled { .. } => Reason::MigModeEnabled,
            Self::SharingUnsupported { .. } => Reason::SharingUnsupported,
            Self::UnknownProfile { .. } => Reason::UnknownMigProfile,
            Self::IllegalPlacement { .. } => Reason::IllegalPlacement,
            Self::Overlap { .. } => Reason::InstanceOverlap,
            Self::KeyConflict { .. } => Reason::InstanceKeyConflict,
            Self::InUse { .. } => Reason::InstanceInUse,
            Self::InvalidArgument(_) => Reason::InvalidArgument,
            Self::Hang { .. } => Reason::CallHang,
            Self::NvmlNotFound(_) => Reason::NvmlNotFound,
            Self::DriverNotLoaded(_) => Reason::DriverNotLoaded,
            Self::Nvml { .. } => Reason::NvmlError,
            Self::Unsupported(_) => Reason::Unsupported,
            Self::Profile(_) => Reason::InvalidProfile,
            Self::State { .. } => Reason::StateFile,
        }
    }
}

impl LayerError {
    /// The error as card `index`'s entry in the `errors` of a metrics answer.
    pub fn on_device(&self, index: u32, uuid: String) -> pb::DeviceError {
        pb::DeviceError {
            device_index: index,
            device_uuid: uuid,
            reason: self.reason().to_string(),
            message: self.to_string(),
        }
    }
}

/// A status with the given code, message and reason.
pub fn status_with_reason(code: Code, message: impl Into<String>, reason: Reason) -> Status {
    let mut status = Status::new(code, message);
    status.metadata_mut().insert(
        REASON_METADATA,
        tonic::metadata::MetadataValue::from_static(reason.as_str()),
    );
    status
}

impl From<LayerError> for Status {
    fn from(error: LayerError) -> Self {
        status_with_reason(error.code(), error.to_string(), error.reason())
    }
}

/// The stable reason of a status from the resource layer, if it has one; parse it into a
/// [`Reason`] to branch on it.
pub fn reason_of(status: &Status) -> Option<&str> {
    status.metadata().get(REASON_METADATA)?.to_str().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_carries_code_message_and_reason() {
        let status = Status::from(LayerError::MigModeDisabled {
            index: 3,
            model: "NVIDIA H800".into(),
        });
        assert_eq!(status.code(), Code::FailedPrecondition);
        assert_eq!(reason_of(&status), Some("MigModeDisabled"));
        assert!(
            status
                .message()
                .starts_with("card 3 (NVIDIA H800) is not in MIG mode")
        );
    }

    #[test]
    fn nvml_error_names_the_card_when_known() {
        let on = LayerError::Nvml {
            call: "nvmlDeviceGetMemoryInfo",
            index: Some(2),
            message: "unknown".into(),
        };
        assert_eq!(
            on.to_string(),
            "nvmlDeviceGetMemoryInfo failed on card 2: unknown"
        );
        let off = LayerError::Nvml {
            call: "nvmlDeviceGetCount",
            index: None,
            message: "unknown".into(),
        };
        assert_eq!(off.to_string(), "nvmlDeviceGetCount failed: unknown");
    }

    #[test]
    fn every_code_is_deliberate() {
        let cases = [
            (
                LayerError::NoSuchDevice { index: 9, count: 8 },
                Code::NotFound,
            ),
            (
                LayerError::DeviceLost {
                    index: 1,
                    uuid: "GPU-1".into(),
                },
                Code::Unavailable,
            ),
            (
                LayerError::KeyConflict {
                    key: "k".into(),
                    existing: "tdm".into(),
                },
                Code::AlreadyExists,
            ),
            (
                LayerError::Hang {
                    index: 1,
                    waited: Duration::from_secs(1),
                },
                Code::DeadlineExceeded,
            ),
            (LayerError::Unsupported("x".into()), Code::Unimplemented),
            (LayerError::NvmlNotFound("x".into()), Code::Unavailable),
        ];
        for (error, code) in cases {
            assert_eq!(error.code(), code, "{error}");
        }
    }
}
