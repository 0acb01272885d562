//! The part of the CUDA driver API (`cuda.h`, 12.x) that the isolation library intercepts and
//! the fake driver answers: result codes, handle types, and the layouts of the structures whose
//! fields decide how much device memory a call takes. Types only: nothing here is exported as
//! a C symbol, so linking this crate into a `cdylib` adds no entry point.

use std::ffi::{c_uint, c_void};

/// `CUresult`.
pub type CuResult = i32;
/// `CUdevice`: a device ordinal as the driver numbers the devices it sees.
pub type CuDevice = i32;
/// `CUdeviceptr` (`_v2`, 64-bit).
pub type CuDevicePtr = u64;
/// `CUdeviceptr_v1`, the 32-bit pointer of the pre-3.2 entry points.
pub type CuDevicePtrV1 = u32;
/// `CUcontext`, `CUstream`, `CUarray`, `CUmipmappedArray`, `CUmemoryPool`, `CUfunction`.
pub type Handle = *mut c_void;
/// `CUmemGenericAllocationHandle`.
pub type CuMemHandle = u64;

/// `cuLaunchKernel` (and `_ptsz`): function, grid x/y/z, block x/y/z, shared memory bytes,
/// stream, kernel parameters, extra options.
pub type LaunchKernel = unsafe extern "C" fn(
    Handle,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    Handle,
    *mut *mut c_void,
    *mut *mut c_void,
) -> CuResult;

/// `cuLaunchCooperativeKernel` (and `_ptsz`): `cuLaunchKernel`'s parameters without the extra
/// options.
pub type LaunchCooperativeKernel = unsafe extern "C" fn(
    Handle,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    Handle,
    *mut *mut c_void,
) -> CuResult;

/// `CUDA_SUCCESS`.
pub const SUCCESS: CuResult = 0;
/// `CUDA_ERROR_INVALID_VALUE`.
pub const ERROR_INVALID_VALUE: CuResult = 1;
/// `CUDA_ERROR_OUT_OF_MEMORY`: what every allocation past a cap returns.
pub const ERROR_OUT_OF_MEMORY: CuResult = 2;
/// `CUDA_ERROR_NOT_INITIALIZED`.
pub const ERROR_NOT_INITIALIZED: CuResult = 3;
/// `CUDA_ERROR_INVALID_DEVICE`.
pub const ERROR_INVALID_DEVICE: CuResult = 101;
/// `CUDA_ERROR_INVALID_CONTEXT`.
pub const ERROR_INVALID_CONTEXT: CuResult = 201;
/// `CUDA_ERROR_NOT_FOUND`.
pub const ERROR_NOT_FOUND: CuResult = 500;

/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`: ask for the `_ptsz`/`_ptds` variant.
pub const PROC_ADDRESS_PER_THREAD: u64 = 2;
/// `CU_GET_PROC_ADDRESS_SUCCESS`, `_SYMBOL_NOT_FOUND`, `_VERSION_NOT_SUFFICIENT`.
pub const PROC_ADDRESS_FOUND: i32 = 0;
/// See [`PROC_ADDRESS_FOUND`].
pub const PROC_ADDRESS_NOT_FOUND: i32 = 1;
/// See [`PROC_ADDRESS_FOUND`].
pub const PROC_ADDRESS_VERSION_NOT_SUFFICIENT: i32 = 2;

/// `CU_MEM_LOCATION_TYPE_DEVICE`: a `cuMemCreate` that takes device memory.
pub const MEM_LOCATION_DEVICE: u32 = 1;

/// `CUuuid`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CuUuid {
    /// The sixteen bytes.
    pub bytes: [u8; 16],
}

impl CuUuid {
    /// The UUID as NVIDIA writes a card's: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    pub fn card_name(&self) -> String {
        let hex: String = self.bytes.iter().map(|b| format!("{b:02x}")).collect();
        format!(
            "GPU-{}-{}-{}-{}-{}",
            &hex[0..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..32]
        )
    }

    /// Reads `GPU-…` or `MIG-…` (or a bare UUID) back into bytes.
    pub fn parse(text: &str) -> Option<CuUuid> {
        let bare = text
            .strip_prefix("GPU-")
            .or_else(|| text.strip_prefix("MIG-"))
            .unwrap_or(text);
        let hex: String = bare.chars().filter(|c| *c != '-').collect();
        if hex.len() != 32 || !hex.is_ascii() {
            return None;
        }
        let mut bytes = [0u8; 16];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(CuUuid { bytes })
    }
}

/// `CUDA_ARRAY_DESCRIPTOR` (`_v2`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ArrayDescriptor {
    /// Width in elements.
    pub width: usize,
    /// Height in elements (0 for 1D).
    pub height: usize,
    /// `CUarray_format`.
    pub format: u32,
    /// Channels per element (1, 2 or 4).
    pub num_channels: u32,
}

/// `CUDA_ARRAY3D_DESCRIPTOR` (`_v2`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Array3dDescriptor {
    /// Width in elements.
    pub width: usize,
    /// Height in elements (0 for 1D).
    pub height: usize,
    /// Depth in elements (0 for 1D and 2D).
    pub depth: usize,
    /// `CUarray_format`.
    pub format: u32,
    /// Channels per element.
    pub num_channels: u32,
    /// `CUDA_ARRAY3D_*` flags.
    pub flags: u32,
}

/// `CUmemLocation`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MemLocation {
    /// `CUmemLocationType`.
    pub kind: u32,
    /// The device ordinal when `kind` is [`MEM_LOCATION_DEVICE`].
    pub id: i32,
}

/// `CUmemAllocationProp`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MemAllocationProp {
    /// `CUmemAllocationType`.
    pub kind: u32,
    /// `CUmemAllocationHandleType`.
    pub requested_handle_types: u32,
    /// Where the memory lives.
    pub location: MemLocation,
    /// Windows only.
    pub win32_handle_meta_data: *mut c_void,
    /// `allocFlags`: compression type, GPUDirect RDMA, usage, reserved.
    pub alloc_flags: [u8; 8],
}

/// Bytes of one channel of a `CUarray_format`. Formats that pack several channels (the
/// block-compressed and video formats) are given their bytes per element and one channel.
pub fn format_bytes(format: u32) -> u64 {
    match format {
        0x01 | 0x08 | 0x50 => 1,        // UNSIGNED_INT8, SIGNED_INT8, UNORM_INT8X1
        0x02 | 0x09 | 0x10 | 0x53 => 2, // (UN)SIGNED_INT16, HALF, UNORM_INT16X1
        0x03 | 0x0a | 0x20 => 4,        // (UN)SIGNED_INT32, FLOAT
        0x91..=0x9e => 16,              // BC1-BC7 (bytes per 4x4 block, an upper bound)
        0xb0 => 2,                      // NV12 (1.5 bytes a pixel, rounded up)
        _ => 4,
    }
}

/// The bytes an array of `width` x `height` x `depth` elements takes (a dimension of 0 counts
/// as 1), each `channels` channels of `format`, with `levels` mipmap levels (1 for a plain
/// array), each level half the previous in every dimension.
pub fn array_bytes(
    width: usize,
    height: usize,
    depth: usize,
    format: u32,
    channels: u32,
    levels: u32,
) -> u64 {
    let element = format_bytes(format) * u64::from(channels.max(1));
    let dims = [width, height, depth].map(|d| u64::try_from(d.max(1)).unwrap_or(u64::MAX));
    (0..levels.max(1))
        .map(|level| {
            let shrink = |d: u64| (d >> level.min(63)).max(1);
            shrink(dims[0])
                .saturating_mul(shrink(dims[1]))
                .saturating_mul(shrink(dims[2]))
                .saturating_mul(element)
        })
        .fold(0u64, u64::saturating_add)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_read_back_as_written() {
        let uuid = CuUuid {
            bytes: [
                0x5e, 0x48, 0xbb, 0x40, 0x67, 0x46, 0xac, 0xa6, 0x1a, 0xff, 0x13, 0xcf, 0xe0, 0x02,
                0x4f, 0x80,
            ],
        };
        assert_eq!(uuid.card_name(), "GPU-5e48bb40-6746-aca6-1aff-13cfe0024f80");
        assert_eq!(CuUuid::parse(&uuid.card_name()), Some(uuid));
        assert_eq!(
            CuUuid::parse("MIG-5e48bb40-6746-aca6-1aff-13cfe0024f80"),
            Some(uuid)
        );
        assert_eq!(CuUuid::parse("GPU-5e48"), None);
        assert_eq!(
            CuUuid::parse("GPU-zz48bb40-6746-aca6-1aff-13cfe0024f80"),
            None
        );
    }

    #[test]
    fn array_sizes_count_every_level() {
        assert_eq!(array_bytes(1024, 0, 0, 0x20, 1, 1), 4096);
        assert_eq!(array_bytes(64, 64, 0, 0x01, 4, 1), 64 * 64 * 4);
        // Three levels of a 4x4 float array: 16 + 4 + 1 elements.
        assert_eq!(array_bytes(4, 4, 0, 0x20, 1, 3), 21 * 4);
        assert_eq!(array_bytes(usize::MAX, usize::MAX, 2, 0x20, 4, 1), u64::MAX);
    }
}
