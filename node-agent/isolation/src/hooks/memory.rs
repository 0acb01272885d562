//! The allocation paths: each reserves its bytes in the ledger before the driver is asked,
//! gives them back if the driver refuses, and returns them when the memory is freed. Past the
//! cap the answer is the driver's own `CUDA_ERROR_OUT_OF_MEMORY`.

use crate::real::function;
use crate::state::{Capped, Key, Outermost, current_device, isolation};
use runtimekit_cuda_abi::{
    self as abi, Array3dDescriptor, ArrayDescriptor, CuDevice, CuDevicePtr, CuDevicePtrV1,
    CuMemHandle, CuResult, Handle, MemAllocationProp,
};
use std::ffi::c_uint;

/// Runs `allocate` (the real call, and the key of what it made) for `bytes` on `device` under
/// the device's cap. No device (no current context) goes to the driver as it is: it refuses.
fn capped(
    device: Option<CuDevice>,
    bytes: u64,
    allocate: impl FnOnce() -> (CuResult, Option<Key>),
) -> CuResult {
    let Some(_outermost) = Outermost::enter() else {
        return allocate().0;
    };
    let state = isolation();
    let reserved = match device.map(|d| state.reserve(d, bytes)) {
        None => Capped::Free,
        Some(Ok(reserved)) => reserved,
        Some(Err(refused)) => return refused,
    };
    let (result, key) = allocate();
    if let Capped::Reserved(card) = reserved {
        match key.filter(|_| result == abi::SUCCESS) {
            Some(key) => state.record(key, card, bytes),
            None => state.release(card, bytes),
        }
    }
    result
}

/// The real function, or `CUDA_ERROR_NOT_FOUND` from the hook when the driver has none.
macro_rules! real_or_not_found {
    ($name:literal, $ty:ty) => {
        match function!(cuda, $name, $ty) {
            Some(f) => f,
            None => return abi::ERROR_NOT_FOUND,
        }
    };
}

/// Frees by `free` (the real call) and, when the driver agrees, gives the bytes of `key` back.
fn freed(key: Key, free: impl FnOnce() -> CuResult) -> CuResult {
    let Some(_outermost) = Outermost::enter() else {
        return free();
    };
    let result = free();
    if result == abi::SUCCESS {
        isolation().forget(key);
    }
    result
}

type AllocFn = unsafe extern "C" fn(*mut CuDevicePtr, usize) -> CuResult;

/// A device pointer the driver wrote (0 if it wrote none).
unsafe fn written(out: *mut CuDevicePtr) -> u64 {
    // SAFETY: the caller's out-pointer, read only after the driver succeeded.
    if out.is_null() {
        0
    } else {
        unsafe { out.read() }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(out: *mut CuDevicePtr, bytes: usize) -> CuResult {
    let real = real_or_not_found!("cuMemAlloc_v2", AllocFn);
    capped(current_device(), bytes as u64, || {
        // SAFETY: the caller's arguments, passed on.
        let result = unsafe { real(out, bytes) };
        // SAFETY: read after the call.
        (result, Some(Key::Pointer(unsafe { written(out) })))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc(out: *mut CuDevicePtrV1, bytes: c_uint) -> CuResult {
    type F = unsafe extern "C" fn(*mut CuDevicePtrV1, c_uint) -> CuResult;
    let real = real_or_not_found!("cuMemAlloc", F);
    capped(current_device(), u64::from(bytes), || {
        // SAFETY: the caller's arguments, passed on.
        let result = unsafe { real(out, bytes) };
        // SAFETY: read after the call.
        let address = if out.is_null() {
            0
        } else {
            unsafe { out.read() }
        };
        (result, Some(Key::PointerV1(address)))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocManaged(
    out: *mut CuDevicePtr,
    bytes: usize,
    flags: c_uint,
) -> CuResult {
    type F = unsafe extern "C" fn(*mut CuDevicePtr, usize, c_uint) -> CuResult;
    let real = real_or_not_found!("cuMemAllocManaged", F);
    // Managed memory counts where it is allocated from: the current context's card.
    capped(current_device(), bytes as u64, || {
        // SAFETY: the caller's arguments, passed on.
        let result = unsafe { real(out, bytes, flags) };
        // SAFETY: read after the call.
        (result, Some(Key::Pointer(unsafe { written(out) })))
    })
}

type AsyncFn = unsafe extern "C" fn(*mut CuDevicePtr, usize, Handle) -> CuResult;

/// `cuMemAllocAsync` and its per-thread variant through `real`.
unsafe fn alloc_async(
    real: AsyncFn,
    out: *mut CuDevicePtr,
    bytes: usize,
    stream: Handle,
) -> CuResult {
    capped(current_device(), bytes as u64, || {
        // SAFETY: the caller's arguments, passed on.
        let result = unsafe { real(out, bytes, stream) };
        // SAFETY: read after the call.
        (result, Some(Key::Pointer(unsafe { written(out) })))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync(
    out: *mut CuDevicePtr,
    bytes: usize,
    stream: Handle,
) -> CuResult {
    let real = real_or_not_found!("cuMemAllocAsync", AsyncFn);
    // SAFETY: the caller's arguments.
    unsafe { alloc_async(real, out, bytes, stream) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(
    out: *mut CuDevicePtr,
    bytes: usize,
    stream: Handle,
) -> CuResult {
    let real = real_or_not_found!("cuMemAllocAsync_ptsz", AsyncFn);
    // SAFETY: the caller's arguments.
    unsafe { alloc_async(real, out, bytes, stream) }
}

type PoolFn = unsafe extern "C" fn(*mut CuDevicePtr, usize, Handle, Handle) -> CuResult;

/// `cuMemAllocFromPoolAsync` and its per-thread variant through `real`.
unsafe fn alloc_from_pool(
    real: PoolFn,
    out: *mut CuDevicePtr,
    bytes: usize,
    pool: Handle,
    stream: Handle,
) -> CuResult {
    capped(current_device(), bytes as u64, || {
        // SAFETY: the caller's arguments, passed on.
        let result = unsafe { real(out, bytes, pool, stream) };
        // SAFETY: read after the call.
        (result, Some(Key::Pointer(unsafe { written(out) })))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    out: *mut CuDevicePtr,
    bytes: usize,
    pool: Handle,
    stream: Handle,
) -> CuResult {
    let real = real_or_not_found!("cuMemAllocFromPoolAsync", PoolFn);
    // SAFETY: the caller's arguments.
    unsafe { alloc_from_pool(real, out, bytes, pool, stream) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    out: *mut CuDevicePtr,
    bytes: usize,
    pool: Handle,
    stream: Handle,
) -> CuResult {
    let real = real_or_not_found!("cuMemAllocFromPoolAsync_ptsz", PoolFn);
    // SAFETY: the caller's arguments.
    unsafe { alloc_from_pool(real, out, bytes, pool, stream) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    out: *mut CuDevicePtr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element_bytes: c_uint,
) -> CuResult {
    type F = unsafe extern "C" fn(*mut CuDevicePtr, *mut usize, usize, usize, c_uint) -> CuResult;
    let real = real_or_not_found!("cuMemAllocPitch_v2", F);
    let Some(_outermost) = Outermost::enter() else {
        // SAFETY: the caller's arguments, passed on.
        return unsafe { real(out, pitch, width, height, element_bytes) };
    };
    let state = isolation();
    let device = current_device();
    // The rows' padding is known only once the driver chose the pitch: reserve the unpadded
    // size first, then the padding, undoing the allocation if the padding passes the cap.
    let unpadded = (width as u64).saturating_mul(height as u64);
    let reserved = match device.map(|d| state.reserve(d, unpadded)) {
        None => Capped::Free,
        Some(Ok(reserved)) => reserved,
        Some(Err(refused)) => return refused,
    };
    // SAFETY: the caller's arguments, passed on.
    let result = unsafe { real(out, pitch, width, height, element_bytes) };
    let Capped::Reserved(card) = reserved else {
        return result;
    };
    if result != abi::SUCCESS || pitch.is_null() {
        state.release(card, unpadded);
        return result;
    }
    // SAFETY: written by the driver on success.
    let (address, padded) = unsafe {
        (
            written(out),
            (pitch.read() as u64).saturating_mul(height as u64),
        )
    };
    let padding = padded.saturating_sub(unpadded);
    if padding > 0 && state.reserve_on(card, padding).is_err() {
        if let Some(free) = function!(
            cuda,
            "cuMemFree_v2",
            unsafe extern "C" fn(CuDevicePtr) -> CuResult
        ) {
            // SAFETY: the allocation just made.
            unsafe { free(address) };
        }
        state.release(card, unpadded);
        return abi::ERROR_OUT_OF_MEMORY;
    }
    state.record(Key::Pointer(address), card, unpadded + padding);
    result
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFree_v2(address: CuDevicePtr) -> CuResult {
    let real = real_or_not_found!(
        "cuMemFree_v2",
        unsafe extern "C" fn(CuDevicePtr) -> CuResult
    );
    // SAFETY: the caller's argument.
    freed(Key::Pointer(address), || unsafe { real(address) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFree(address: CuDevicePtrV1) -> CuResult {
    let real = real_or_not_found!("cuMemFree", unsafe extern "C" fn(CuDevicePtrV1) -> CuResult);
    // SAFETY: the caller's argument.
    freed(Key::PointerV1(address), || unsafe { real(address) })
}

type FreeAsyncFn = unsafe extern "C" fn(CuDevicePtr, Handle) -> CuResult;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeAsync(address: CuDevicePtr, stream: Handle) -> CuResult {
    let real = real_or_not_found!("cuMemFreeAsync", FreeAsyncFn);
    // SAFETY: the caller's arguments.
    freed(Key::Pointer(address), || unsafe { real(address, stream) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeAsync_ptsz(address: CuDevicePtr, stream: Handle) -> CuResult {
    let real = real_or_not_found!("cuMemFreeAsync_ptsz", FreeAsyncFn);
    // SAFETY: the caller's arguments.
    freed(Key::Pointer(address), || unsafe { real(address, stream) })
}

/// An array of `bytes` made by `create`, counted on the current context's card.
fn array(out: *mut Handle, bytes: u64, create: impl FnOnce() -> CuResult) -> CuResult {
    capped(current_device(), bytes, || {
        let result = create();
        // SAFETY: the caller's out-pointer, read after the call.
        let handle = if out.is_null() {
            0
        } else {
            (unsafe { out.read() }) as usize
        };
        (result, Some(Key::Array(handle)))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayCreate_v2(
    out: *mut Handle,
    desc: *const ArrayDescriptor,
) -> CuResult {
    type F = unsafe extern "C" fn(*mut Handle, *const ArrayDescriptor) -> CuResult;
    let real = real_or_not_found!("cuArrayCreate_v2", F);
    // SAFETY: the caller's descriptor, when not null.
    let bytes = unsafe { desc.as_ref() }.map_or(0, |d| {
        abi::array_bytes(d.width, d.height, 0, d.format, d.num_channels, 1)
    });
    // SAFETY: the caller's arguments, passed on.
    array(out, bytes, || unsafe { real(out, desc) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    out: *mut Handle,
    desc: *const Array3dDescriptor,
) -> CuResult {
    type F = unsafe extern "C" fn(*mut Handle, *const Array3dDescriptor) -> CuResult;
    let real = real_or_not_found!("cuArray3DCreate_v2", F);
    // SAFETY: the caller's descriptor, when not null.
    let bytes = unsafe { desc.as_ref() }.map_or(0, |d| {
        abi::array_bytes(d.width, d.height, d.depth, d.format, d.num_channels, 1)
    });
    // SAFETY: the caller's arguments, passed on.
    array(out, bytes, || unsafe { real(out, desc) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayCreate(
    out: *mut Handle,
    desc: *const Array3dDescriptor,
    levels: c_uint,
) -> CuResult {
    type F = unsafe extern "C" fn(*mut Handle, *const Array3dDescriptor, c_uint) -> CuResult;
    let real = real_or_not_found!("cuMipmappedArrayCreate", F);
    // SAFETY: the caller's descriptor, when not null.
    let bytes = unsafe { desc.as_ref() }.map_or(0, |d| {
        abi::array_bytes(d.width, d.height, d.depth, d.format, d.num_channels, levels)
    });
    // SAFETY: the caller's arguments, passed on.
    array(out, bytes, || unsafe { real(out, desc, levels) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayDestroy(handle: Handle) -> CuResult {
    let real = real_or_not_found!("cuArrayDestroy", unsafe extern "C" fn(Handle) -> CuResult);
    // SAFETY: the caller's argument.
    freed(Key::Array(handle as usize), || unsafe { real(handle) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayDestroy(handle: Handle) -> CuResult {
    let real = real_or_not_found!(
        "cuMipmappedArrayDestroy",
        unsafe extern "C" fn(Handle) -> CuResult
    );
    // SAFETY: the caller's argument.
    freed(Key::Array(handle as usize), || unsafe { real(handle) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut CuMemHandle,
    bytes: usize,
    prop: *const MemAllocationProp,
    flags: u64,
) -> CuResult {
    type F =
        unsafe extern "C" fn(*mut CuMemHandle, usize, *const MemAllocationProp, u64) -> CuResult;
    let real = real_or_not_found!("cuMemCreate", F);
    // Physical memory is counted where it lives: on the device the properties name; host
    // memory is not the card's.
    // SAFETY: the caller's properties, when not null.
    let device = unsafe { prop.as_ref() }
        .filter(|p| p.location.kind == abi::MEM_LOCATION_DEVICE)
        .map(|p| p.location.id);
    capped(device, bytes as u64, || {
        // SAFETY: the caller's arguments, passed on.
        let result = unsafe { real(handle, bytes, prop, flags) };
        // SAFETY: read after the call.
        let made = if handle.is_null() {
            0
        } else {
            unsafe { handle.read() }
        };
        (result, Some(Key::Physical(made)))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRelease(handle: CuMemHandle) -> CuResult {
    let real = real_or_not_found!(
        "cuMemRelease",
        unsafe extern "C" fn(CuMemHandle) -> CuResult
    );
    // SAFETY: the caller's argument.
    freed(Key::Physical(handle), || unsafe { real(handle) })
}
