//! Memory queries report the cap as the card's size and the container's own use: the driver's
//! `cuMemGetInfo` and `cuDeviceTotalMem`, and NVML's `nvmlDeviceGetMemoryInfo`.

use crate::real::function;
use crate::state::{current_device, isolation};
use runtimekit_cuda_abi::{self as abi, CuDevice, CuResult};
use std::ffi::{CStr, c_char, c_uint, c_void};

/// `free` and `total` of `device` as the container may use them.
fn clamp(device: Option<CuDevice>, free: u64, total: u64) -> (u64, u64) {
    match device.and_then(|d| isolation().usage(d)) {
        Some((used, cap)) => (free.min(cap.saturating_sub(used)), total.min(cap)),
        None => (free, total),
    }
}

/// Writes the clamped `free` and `total` through out-pointers of type `T`.
unsafe fn write_clamped<T: TryFrom<u64> + Into<u64> + Copy>(free: *mut T, total: *mut T) {
    if free.is_null() || total.is_null() {
        return;
    }
    // SAFETY: the caller's out-pointers, just written by the driver.
    let (f, t) = unsafe { (free.read().into(), total.read().into()) };
    let (f, t) = clamp(current_device(), f, t);
    // SAFETY: as above; the clamped values are no larger than the driver's.
    unsafe {
        if let (Ok(f), Ok(t)) = (T::try_from(f), T::try_from(t)) {
            free.write(f);
            total.write(t);
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CuResult {
    type F = unsafe extern "C" fn(*mut usize, *mut usize) -> CuResult;
    let Some(real) = function!(cuda, "cuMemGetInfo_v2", F) else {
        return abi::ERROR_NOT_FOUND;
    };
    // SAFETY: the caller's arguments, passed on.
    let result = unsafe { real(free, total) };
    if result == abi::SUCCESS {
        let (f, t) = (free.cast::<u64>(), total.cast::<u64>());
        // SAFETY: size_t is 64-bit on every target this builds for.
        unsafe { write_clamped(f, t) };
    }
    result
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) -> CuResult {
    type F = unsafe extern "C" fn(*mut c_uint, *mut c_uint) -> CuResult;
    let Some(real) = function!(cuda, "cuMemGetInfo", F) else {
        return abi::ERROR_NOT_FOUND;
    };
    // SAFETY: the caller's arguments, passed on.
    let result = unsafe { real(free, total) };
    if result == abi::SUCCESS {
        // SAFETY: the driver wrote both.
        unsafe { write_clamped(free, total) };
    }
    result
}

/// The cap of `device`, if it has one.
fn cap_of(device: CuDevice) -> Option<u64> {
    let state = isolation();
    state
        .card(device)
        .ok()
        .flatten()
        .map(|card| state.cap(card))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, device: CuDevice) -> CuResult {
    type F = unsafe extern "C" fn(*mut usize, CuDevice) -> CuResult;
    let Some(real) = function!(cuda, "cuDeviceTotalMem_v2", F) else {
        return abi::ERROR_NOT_FOUND;
    };
    // SAFETY: the caller's arguments, passed on.
    let result = unsafe { real(bytes, device) };
    if let (abi::SUCCESS, false, Some(cap)) = (result, bytes.is_null(), cap_of(device)) {
        // SAFETY: written by the driver.
        unsafe { bytes.write((*bytes).min(usize::try_from(cap).unwrap_or(usize::MAX))) };
    }
    result
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem(bytes: *mut c_uint, device: CuDevice) -> CuResult {
    type F = unsafe extern "C" fn(*mut c_uint, CuDevice) -> CuResult;
    let Some(real) = function!(cuda, "cuDeviceTotalMem", F) else {
        return abi::ERROR_NOT_FOUND;
    };
    // SAFETY: the caller's arguments, passed on.
    let result = unsafe { real(bytes, device) };
    if let (abi::SUCCESS, false, Some(cap)) = (result, bytes.is_null(), cap_of(device)) {
        // SAFETY: written by the driver.
        unsafe { bytes.write((*bytes).min(c_uint::try_from(cap).unwrap_or(c_uint::MAX))) };
    }
    result
}

/// `nvmlMemory_t`.
#[repr(C)]
#[derive(Debug)]
pub struct NvmlMemory {
    total: u64,
    free: u64,
    used: u64,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
#[derive(Debug)]
pub struct NvmlMemoryV2 {
    version: c_uint,
    total: u64,
    reserved: u64,
    free: u64,
    used: u64,
}

/// NVML's success.
const NVML_SUCCESS: c_uint = 0;

/// The container's use and cap of the NVML device `device`, by its UUID.
fn nvml_usage(device: *mut c_void) -> Option<(u64, u64)> {
    type F = unsafe extern "C" fn(*mut c_void, *mut c_char, c_uint) -> c_uint;
    let uuid_of = function!(nvml, "nvmlDeviceGetUUID", F)?;
    let mut buffer = [0 as c_char; 96];
    // SAFETY: a buffer of its stated length.
    if unsafe { uuid_of(device, buffer.as_mut_ptr(), 96) } != NVML_SUCCESS {
        return None;
    }
    // SAFETY: NVML wrote a NUL-terminated UUID into the buffer.
    let uuid = unsafe { CStr::from_ptr(buffer.as_ptr()) }.to_string_lossy();
    isolation().card_usage_by_uuid(&uuid)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: *mut c_void,
    memory: *mut NvmlMemory,
) -> c_uint {
    type F = unsafe extern "C" fn(*mut c_void, *mut NvmlMemory) -> c_uint;
    let Some(real) = function!(nvml, "nvmlDeviceGetMemoryInfo", F) else {
        return 13; // NVML_ERROR_FUNCTION_NOT_FOUND
    };
    // SAFETY: the caller's arguments, passed on.
    let result = unsafe { real(device, memory) };
    if result == NVML_SUCCESS
        // SAFETY: written by NVML.
        && let (Some(m), Some((used, cap))) = (unsafe { memory.as_mut() }, nvml_usage(device))
    {
        m.total = m.total.min(cap);
        m.used = used.min(m.total);
        m.free = m.total - m.used;
    }
    result
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: *mut c_void,
    memory: *mut NvmlMemoryV2,
) -> c_uint {
    type F = unsafe extern "C" fn(*mut c_void, *mut NvmlMemoryV2) -> c_uint;
    let Some(real) = function!(nvml, "nvmlDeviceGetMemoryInfo_v2", F) else {
        return 13; // NVML_ERROR_FUNCTION_NOT_FOUND
    };
    // SAFETY: the caller's arguments, passed on.
    let result = unsafe { real(device, memory) };
    if result == NVML_SUCCESS
        // SAFETY: written by NVML.
        && let (Some(m), Some((used, cap))) = (unsafe { memory.as_mut() }, nvml_usage(device))
    {
        m.total = m.total.min(cap);
        m.reserved = 0;
        m.used = used.min(m.total);
        m.free = m.total - m.used;
    }
    result
}
