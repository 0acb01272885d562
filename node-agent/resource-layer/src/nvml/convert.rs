//! Pure conversions between NVML's vocabulary and the resource layer's: errors, MIG profile
//! indexes, topology levels, NVLink far-end types, field values.

use crate::error::LayerError;
use nvml_wrapper::enum_wrappers::device::TopologyLevel;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings::{
    NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE, NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
    NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE, NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
    NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE, NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
    NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE, NVML_GPU_INSTANCE_PROFILE_1_SLICE,
    NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2, NVML_GPU_INSTANCE_PROFILE_2_SLICE,
    NVML_GPU_INSTANCE_PROFILE_3_SLICE, NVML_GPU_INSTANCE_PROFILE_4_SLICE,
    NVML_GPU_INSTANCE_PROFILE_7_SLICE, nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES,
};
use runtimekit_proto::resource::v1alpha1::{LinkRemote, PathLevel};

/// What a failed `nvmlInit` means to a user.
pub fn init_error(error: NvmlError) -> LayerError {
    match error {
        NvmlError::LibloadingError(e) => LayerError::NvmlNotFound(e.to_string()),
        NvmlError::LibraryNotFound => {
            LayerError::NvmlNotFound("libnvidia-ml.so.1 could not be found or loaded".into())
        }
        NvmlError::FailedToLoadSymbol(s) => LayerError::NvmlNotFound(format!(
            "the NVML library lacks a symbol it needs ({s}); the driver is too old"
        )),
        NvmlError::DriverNotLoaded => LayerError::DriverNotLoaded(
            "the NVML library is present but the NVIDIA kernel module is not loaded".into(),
        ),
        NvmlError::NoPermission => LayerError::Nvml {
            call: "nvmlInit_v2",
            index: None,
            message: "no permission to use the NVIDIA driver".into(),
        },
        other => LayerError::Nvml {
            call: "nvmlInit_v2",
            index: None,
            message: other.to_string(),
        },
    }
}

/// What a failed NVML call on card `index` means.
pub fn call_error(call: &'static str, index: u32, uuid: &str, error: NvmlError) -> LayerError {
    match error {
        NvmlError::GpuLost => LayerError::DeviceLost {
            index,
            uuid: uuid.to_string(),
        },
        NvmlError::Timeout => LayerError::Hang {
            index,
            waited: std::time::Duration::ZERO,
        },
        NvmlError::NotSupported => {
            LayerError::Unsupported(format!("{call} is not supported on card {index}"))
        }
        other => LayerError::Nvml {
            call,
            index: Some(index),
            message: other.to_string(),
        },
    }
}

/// The NVML GPU-instance profile index (`NVML_GPU_INSTANCE_PROFILE_*`) of a profile with
/// `slices` compute slices over `memory_slices` memory slices (media-extension variants are
/// never used).
pub fn gi_profile_index(slices: u8, memory_slices: u8) -> Option<u32> {
    Some(match (slices, memory_slices) {
        (1, 1) => NVML_GPU_INSTANCE_PROFILE_1_SLICE,
        (1, 2) => NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2,
        (2, 2) => NVML_GPU_INSTANCE_PROFILE_2_SLICE,
        (3, 4) => NVML_GPU_INSTANCE_PROFILE_3_SLICE,
        (4, 4) => NVML_GPU_INSTANCE_PROFILE_4_SLICE,
        (7, 8) => NVML_GPU_INSTANCE_PROFILE_7_SLICE,
        _ => return None,
    })
}

/// The compute-instance profile index (`NVML_COMPUTE_INSTANCE_PROFILE_*`) that spans a whole
/// GPU instance of `slices` compute slices.
pub fn ci_profile_index(slices: u8) -> Option<u32> {
    Some(match slices {
        1 => NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
        2 => NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
        3 => NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
        4 => NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
        6 => NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE,
        7 => NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
        8 => NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE,
        _ => return None,
    })
}

/// The `nvidia-smi topo` name of an NVML topology level.
pub fn path_level(level: TopologyLevel) -> PathLevel {
    match level {
        TopologyLevel::Internal => PathLevel::Board,
        TopologyLevel::Single => PathLevel::Pix,
        TopologyLevel::Multiple => PathLevel::Pxb,
        TopologyLevel::HostBridge => PathLevel::Phb,
        TopologyLevel::Node => PathLevel::Node,
        TopologyLevel::System => PathLevel::Sys,
    }
}

/// The far end of an NVLink from NVML's raw device type.
pub fn link_remote(raw: u32) -> LinkRemote {
    match raw {
        0 => LinkRemote::Device,
        1 => LinkRemote::Cpu,
        2 => LinkRemote::Switch,
        _ => LinkRemote::Unspecified,
    }
}

/// Whether a failed GPU-instance creation means there is no room for it (NVML answers
/// INSUFFICIENT_RESOURCES, which nvml-wrapper 0.13 does not name, or IN_USE).
pub fn no_room(error: &NvmlError) -> bool {
    matches!(error, NvmlError::InUse)
        || matches!(error, NvmlError::UnexpectedVariant(code) if *code == nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES)
}

/// Bytes to MiB.
pub fn mib(bytes: u64) -> u64 {
    bytes >> 20
}

/// A profile name from the hardware when no table names it: `<slices>g.<GB>gb`, the GB
/// rounded like NVIDIA's names (up from the MiB the driver reports).
pub fn fallback_profile_name(slices: u32, memory_mb: u64) -> String {
    format!("{slices}g.{}gb", memory_mb.div_ceil(1024))
}

#[cfg(test)]
mod tests {
    use super::*;
    use runtimekit_contract::mig::{A30_24GB, ALL_TABLES};

    #[test]
    fn every_table_profile_has_an_nvml_index() {
        for table in ALL_TABLES {
            for p in table.profiles {
                assert!(
                    gi_profile_index(p.slices, p.memory_slices).is_some(),
                    "{} {}",
                    table.model,
                    p.name
                );
                assert!(ci_profile_index(p.slices).is_some(), "{}", p.name);
            }
        }
    }

    #[test]
    fn profile_indexes_match_nvml_constants() {
        // nvml.h: 1_SLICE 0, 2_SLICE 1, 3_SLICE 2, 4_SLICE 3, 7_SLICE 4, 1_SLICE_REV2 9.
        assert_eq!(gi_profile_index(1, 1), Some(0));
        assert_eq!(gi_profile_index(2, 2), Some(1));
        assert_eq!(gi_profile_index(3, 4), Some(2));
        assert_eq!(gi_profile_index(4, 4), Some(3));
        assert_eq!(gi_profile_index(7, 8), Some(4));
        assert_eq!(gi_profile_index(1, 2), Some(9));
        assert_eq!(gi_profile_index(3, 3), None);
        let a30_4g = A30_24GB.profile("4g.24gb").expect("4g");
        assert_eq!(
            gi_profile_index(a30_4g.slices, a30_4g.memory_slices),
            Some(3)
        );
        assert_eq!(ci_profile_index(3), Some(2));
        assert_eq!(ci_profile_index(7), Some(4));
        assert_eq!(ci_profile_index(5), None);
    }

    #[test]
    fn errors_map_to_reasons() {
        assert_eq!(
            call_error("x", 2, "GPU-2", NvmlError::GpuLost),
            LayerError::DeviceLost {
                index: 2,
                uuid: "GPU-2".into()
            }
        );
        assert_eq!(
            call_error("x", 2, "GPU-2", NvmlError::Timeout)
                .reason()
                .as_str(),
            "CallHang"
        );
        assert_eq!(
            call_error("nvmlDeviceGetMigMode", 1, "", NvmlError::NotSupported).to_string(),
            "nvmlDeviceGetMigMode is not supported on card 1"
        );
        let other = call_error("nvmlDeviceGetMemoryInfo", 1, "", NvmlError::Unknown);
        assert_eq!(other.reason().as_str(), "NvmlError");
        assert_eq!(
            other.to_string(),
            "nvmlDeviceGetMemoryInfo failed on card 1: an internal driver error occurred"
        );
        assert_eq!(
            init_error(NvmlError::DriverNotLoaded).reason().as_str(),
            "DriverNotLoaded"
        );
        assert_eq!(
            init_error(NvmlError::LibraryNotFound).reason().as_str(),
            "NvmlNotFound"
        );
        assert!(
            init_error(NvmlError::LibraryNotFound)
                .to_string()
                .starts_with("NVML library not found: ")
        );
        assert_eq!(
            init_error(NvmlError::Unknown).reason().as_str(),
            "NvmlError"
        );
    }

    #[test]
    fn no_room_is_recognised() {
        assert!(no_room(&NvmlError::UnexpectedVariant(23)));
        assert!(no_room(&NvmlError::InUse));
        assert!(!no_room(&NvmlError::UnexpectedVariant(25)));
        assert!(!no_room(&NvmlError::InvalidArg));
    }

    #[test]
    fn topology_and_links() {
        assert_eq!(path_level(TopologyLevel::Internal), PathLevel::Board);
        assert_eq!(path_level(TopologyLevel::Single), PathLevel::Pix);
        assert_eq!(path_level(TopologyLevel::Multiple), PathLevel::Pxb);
        assert_eq!(path_level(TopologyLevel::HostBridge), PathLevel::Phb);
        assert_eq!(path_level(TopologyLevel::Node), PathLevel::Node);
        assert_eq!(path_level(TopologyLevel::System), PathLevel::Sys);
        assert_eq!(link_remote(0), LinkRemote::Device);
        assert_eq!(link_remote(1), LinkRemote::Cpu);
        assert_eq!(link_remote(2), LinkRemote::Switch);
        assert_eq!(link_remote(255), LinkRemote::Unspecified);
    }

    #[test]
    fn values_and_names() {
        assert_eq!(mib(81_559 * 1024 * 1024 + 5), 81_559);
        // H100 1g.10gb reports 9984 MiB, 7g.80gb 81152 MiB; H200 1g.18gb 18432 MiB.
        assert_eq!(fallback_profile_name(1, 9984), "1g.10gb");
        assert_eq!(fallback_profile_name(7, 81_152), "7g.80gb");
        assert_eq!(fallback_profile_name(1, 18_432), "1g.18gb");
    }
}
