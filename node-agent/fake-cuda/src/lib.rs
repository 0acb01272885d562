//! A `libcuda.so.1` test double. It exports, under the driver's own names and symbol versions,
//! the entry points the isolation library intercepts, and answers them from a simulated driver:
//! the devices of `FAKE_CUDA_UUIDS` (comma-separated `GPU-…` UUIDs), else of
//! `NVIDIA_VISIBLE_DEVICES` (what a container was given), else one device, each
//! with `FAKE_CUDA_MEMORY_MIB` of memory (80 GiB by default) that this process's allocations use
//! up, as a real card's would, until the driver says out of memory. Contexts are per thread, as
//! the driver's are. `cuGetProcAddress` answers by name, requested CUDA version and per-thread
//! flag with the driver's own (unhooked) functions, as the real one does.
//!
//! Like the real driver, it binds its own names to itself (`build.rs`): the addresses
//! `cuGetProcAddress` returns and its internal calls never reach a preloaded library's hooks.
//!
//! It has no kernels: a launch, of any function, succeeds at once in a current context. What a
//! launch costs on a real card is measured by the GPU check.
#![allow(unsafe_code, non_snake_case, clippy::missing_safety_doc)]

use runtimekit_cuda_abi::{
    self as abi, Array3dDescriptor, ArrayDescriptor, CuDevice, CuDevicePtr, CuDevicePtrV1,
    CuMemHandle, CuResult, CuUuid, Handle, MemAllocationProp,
};
use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::sync::{Mutex, MutexGuard};

/// The driver version the fake reports (12.8).
const VERSION: c_int = 12080;
const MIB: u64 = 1 << 20;

/// One simulated device.
#[derive(Debug)]
struct Device {
    uuid: CuUuid,
    total: u64,
    used: u64,
}

/// The simulated driver of this process.
#[derive(Debug, Default)]
struct Driver {
    initialised: bool,
    devices: Vec<Device>,
    /// Live allocations (addresses, arrays, physical handles): device and bytes.
    live: HashMap<u64, (usize, u64)>,
    next: u64,
}

static DRIVER: Mutex<Option<Driver>> = Mutex::new(None);

thread_local! {
    /// The calling thread's current context: its device.
    static CURRENT: Cell<Option<usize>> = const { Cell::new(None) };
}

impl Driver {
    fn from_env() -> Driver {
        // As a real driver in a container sees only the cards given to it, the fake sees the
        // ones the runtime made visible, unless a test names its own.
        let uuids = std::env::var("FAKE_CUDA_UUIDS")
            .or_else(|_| std::env::var("NVIDIA_VISIBLE_DEVICES"))
            .unwrap_or_else(|_| "GPU-00000000-0000-0000-0000-000000000001".into());
        let total = std::env::var("FAKE_CUDA_MEMORY_MIB")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(80 * 1024)
            * MIB;
        Driver {
            devices: uuids
                .split(',')
                .filter_map(CuUuid::parse)
                .map(|uuid| Device {
                    uuid,
                    total,
                    used: 0,
                })
                .collect(),
            next: 0x7f00_0000_0000,
            ..Driver::default()
        }
    }

    fn device(&self, ordinal: CuDevice) -> Result<usize, CuResult> {
        usize::try_from(ordinal)
            .ok()
            .filter(|d| *d < self.devices.len())
            .ok_or(abi::ERROR_INVALID_DEVICE)
    }

    /// Takes `bytes` of `device`'s memory; the new allocation's address (or handle).
    fn take(&mut self, device: usize, bytes: u64) -> Result<u64, CuResult> {
        let card = self
            .devices
            .get_mut(device)
            .ok_or(abi::ERROR_INVALID_DEVICE)?;
        if bytes == 0 {
            return Err(abi::ERROR_INVALID_VALUE);
        }
        if card.used.saturating_add(bytes) > card.total {
            return Err(abi::ERROR_OUT_OF_MEMORY);
        }
        card.used += bytes;
        let address = self.next;
        self.next += bytes.div_ceil(512) * 512;
        self.live.insert(address, (device, bytes));
        Ok(address)
    }

    /// Gives back what `take` returned `address` for.
    fn give(&mut self, address: u64) -> Result<(), CuResult> {
        let (device, bytes) = self.live.remove(&address).ok_or(abi::ERROR_INVALID_VALUE)?;
        self.devices[device].used -= bytes;
        Ok(())
    }
}

/// The driver, once `cuInit` ran.
fn driver() -> Result<MutexGuard<'static, Option<Driver>>, CuResult> {
    let guard = DRIVER.lock().unwrap_or_else(|e| e.into_inner());
    if guard.as_ref().is_some_and(|d| d.initialised) {
        Ok(guard)
    } else {
        Err(abi::ERROR_NOT_INITIALIZED)
    }
}

/// Runs `f` on the initialised driver.
fn with<T>(f: impl FnOnce(&mut Driver) -> Result<T, CuResult>) -> Result<T, CuResult> {
    let mut guard = driver()?;
    match guard.as_mut() {
        Some(driver) => f(driver),
        None => Err(abi::ERROR_NOT_INITIALIZED),
    }
}

/// The current context's device.
fn current() -> Result<usize, CuResult> {
    CURRENT.with(Cell::get).ok_or(abi::ERROR_INVALID_CONTEXT)
}

fn code(result: Result<(), CuResult>) -> CuResult {
    result.err().unwrap_or(abi::SUCCESS)
}

/// Writes `value` through `out`.
unsafe fn put<T>(out: *mut T, value: T) -> Result<(), CuResult> {
    if out.is_null() {
        return Err(abi::ERROR_INVALID_VALUE);
    }
    // SAFETY: a non-null out-pointer for a `T`, as the API requires.
    unsafe { out.write(value) };
    Ok(())
}

/// Allocates `bytes` on the current context's device into `out`.
unsafe fn allocate(out: *mut CuDevicePtr, bytes: u64) -> CuResult {
    // SAFETY: the caller's out-pointer.
    code(take_current(bytes).and_then(|address| unsafe { put(out, address) }))
}

/// Takes `bytes` on the current context's device: the new allocation's address.
fn take_current(bytes: u64) -> Result<u64, CuResult> {
    let device = current()?;
    with(|d| d.take(device, bytes))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuInit(_flags: c_uint) -> CuResult {
    let mut guard = DRIVER.lock().unwrap_or_else(|e| e.into_inner());
    guard.get_or_insert_with(Driver::from_env).initialised = true;
    abi::SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CuResult {
    // SAFETY: the caller's out-pointer.
    code(unsafe { put(version, VERSION) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CuResult {
    code(
        with(|d| Ok(c_int::try_from(d.devices.len()).unwrap_or(c_int::MAX)))
            // SAFETY: the caller's out-pointer.
            .and_then(|n| unsafe { put(count, n) }),
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGet(device: *mut CuDevice, ordinal: c_int) -> CuResult {
    code(
        with(|d| d.device(ordinal))
            // SAFETY: the caller's out-pointer.
            .and_then(|_| unsafe { put(device, ordinal) }),
    )
}

/// `cuDeviceGetUuid` and `_v2` (the same answer for a card).
unsafe fn uuid_of(uuid: *mut CuUuid, device: CuDevice) -> CuResult {
    code(
        with(|d| Ok(d.devices[d.device(device)?].uuid))
            // SAFETY: the caller's out-pointer.
            .and_then(|u| unsafe { put(uuid, u) }),
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut CuUuid, device: CuDevice) -> CuResult {
    // SAFETY: the caller's arguments.
    unsafe { uuid_of(uuid, device) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut CuUuid, device: CuDevice) -> CuResult {
    // SAFETY: the caller's arguments.
    unsafe { uuid_of(uuid, device) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, device: CuDevice) -> CuResult {
    code(
        with(|d| Ok(d.devices[d.device(device)?].total))
            // SAFETY: the caller's out-pointer.
            .and_then(|t| unsafe { put(bytes, usize::try_from(t).unwrap_or(usize::MAX)) }),
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem(bytes: *mut c_uint, device: CuDevice) -> CuResult {
    code(
        with(|d| Ok(d.devices[d.device(device)?].total))
            // SAFETY: the caller's out-pointer.
            .and_then(|t| unsafe { put(bytes, c_uint::try_from(t).unwrap_or(c_uint::MAX)) }),
    )
}

/// A context is its device's ordinal plus one, so that none is null.
fn context_of(device: usize) -> Handle {
    (device + 1) as Handle
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v2(
    ctx: *mut Handle,
    _flags: c_uint,
    device: CuDevice,
) -> CuResult {
    code(with(|d| d.device(device)).and_then(|device| {
        CURRENT.with(|c| c.set(Some(device)));
        // SAFETY: the caller's out-pointer.
        unsafe { put(ctx, context_of(device)) }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(ctx: *mut Handle, device: CuDevice) -> CuResult {
    code(
        with(|d| d.device(device))
            // SAFETY: the caller's out-pointer.
            .and_then(|device| unsafe { put(ctx, context_of(device)) }),
    )
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(device: CuDevice) -> CuResult {
    code(with(|d| d.device(device)).map(|_| ()))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetCurrent(ctx: Handle) -> CuResult {
    let device = (ctx as usize).checked_sub(1);
    code(
        with(|d| match device {
            Some(device) if device >= d.devices.len() => Err(abi::ERROR_INVALID_CONTEXT),
            _ => Ok(()),
        })
        .map(|()| CURRENT.with(|c| c.set(device))),
    )
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxDestroy_v2(ctx: Handle) -> CuResult {
    let device = (ctx as usize).checked_sub(1);
    CURRENT.with(|c| {
        if c.get() == device {
            c.set(None);
        }
    });
    abi::SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetDevice(device: *mut CuDevice) -> CuResult {
    code(current().and_then(|d| {
        // SAFETY: the caller's out-pointer.
        unsafe { put(device, CuDevice::try_from(d).unwrap_or(CuDevice::MAX)) }
    }))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSynchronize() -> CuResult {
    code(current().map(|_| ()))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(out: *mut CuDevicePtr, bytes: usize) -> CuResult {
    // SAFETY: the caller's out-pointer.
    unsafe { allocate(out, bytes as u64) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc(out: *mut CuDevicePtrV1, bytes: c_uint) -> CuResult {
    // The 32-bit API hands out the low half, as the driver's legacy entry points do.
    // SAFETY: the caller's out-pointer.
    code(take_current(u64::from(bytes)).and_then(|a| unsafe { put(out, a as CuDevicePtrV1) }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    out: *mut CuDevicePtr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    _element_bytes: c_uint,
) -> CuResult {
    let row = width.div_ceil(512) * 512;
    // SAFETY: the caller's out-pointers.
    let result = unsafe { allocate(out, (row * height) as u64) };
    if result == abi::SUCCESS {
        // SAFETY: as above.
        return code(unsafe { put(pitch, row) });
    }
    result
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocManaged(
    out: *mut CuDevicePtr,
    bytes: usize,
    _flags: c_uint,
) -> CuResult {
    // SAFETY: the caller's out-pointer.
    unsafe { allocate(out, bytes as u64) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync(
    out: *mut CuDevicePtr,
    bytes: usize,
    _stream: Handle,
) -> CuResult {
    // SAFETY: the caller's out-pointer.
    unsafe { allocate(out, bytes as u64) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(
    out: *mut CuDevicePtr,
    bytes: usize,
    _stream: Handle,
) -> CuResult {
    // SAFETY: the caller's out-pointer.
    unsafe { allocate(out, bytes as u64) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    out: *mut CuDevicePtr,
    bytes: usize,
    _pool: Handle,
    _stream: Handle,
) -> CuResult {
    // SAFETY: the caller's out-pointer.
    unsafe { allocate(out, bytes as u64) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    out: *mut CuDevicePtr,
    bytes: usize,
    _pool: Handle,
    _stream: Handle,
) -> CuResult {
    // SAFETY: the caller's out-pointer.
    unsafe { allocate(out, bytes as u64) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(
    pool: *mut Handle,
    device: CuDevice,
) -> CuResult {
    // One pool per device, named by its ordinal plus one.
    code(
        with(|d| d.device(device))
            // SAFETY: the caller's out-pointer.
            .and_then(|d| unsafe { put(pool, (d + 1) as Handle) }),
    )
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFree_v2(address: CuDevicePtr) -> CuResult {
    code(with(|d| d.give(address)))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFree(address: CuDevicePtrV1) -> CuResult {
    let full = with(|d| {
        d.live
            .keys()
            .copied()
            .find(|a| *a as CuDevicePtrV1 == address)
            .ok_or(abi::ERROR_INVALID_VALUE)
    });
    code(full.and_then(|a| with(|d| d.give(a))))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFreeAsync(address: CuDevicePtr, _stream: Handle) -> CuResult {
    code(with(|d| d.give(address)))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFreeAsync_ptsz(address: CuDevicePtr, _stream: Handle) -> CuResult {
    code(with(|d| d.give(address)))
}

/// Free and total memory of the current context's device.
fn info() -> Result<(u64, u64), CuResult> {
    let device = current()?;
    with(|d| {
        let card = &d.devices[device];
        Ok((card.total - card.used, card.total))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CuResult {
    code(info().and_then(|(f, t)| {
        // SAFETY: the caller's out-pointers.
        unsafe {
            put(free, usize::try_from(f).unwrap_or(usize::MAX))?;
            put(total, usize::try_from(t).unwrap_or(usize::MAX))
        }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) -> CuResult {
    code(info().and_then(|(f, t)| {
        // SAFETY: the caller's out-pointers.
        unsafe {
            put(free, c_uint::try_from(f).unwrap_or(c_uint::MAX))?;
            put(total, c_uint::try_from(t).unwrap_or(c_uint::MAX))
        }
    }))
}

/// Allocates an array of `bytes` on the current device into `out` (arrays are handles).
unsafe fn array(out: *mut Handle, bytes: u64) -> CuResult {
    // SAFETY: the caller's out-pointer.
    code(take_current(bytes).and_then(|a| unsafe { put(out, a as Handle) }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayCreate_v2(
    out: *mut Handle,
    desc: *const ArrayDescriptor,
) -> CuResult {
    // SAFETY: the caller's descriptor, when not null.
    let Some(d) = (unsafe { desc.as_ref() }) else {
        return abi::ERROR_INVALID_VALUE;
    };
    let bytes = abi::array_bytes(d.width, d.height, 0, d.format, d.num_channels, 1);
    // SAFETY: the caller's out-pointer.
    unsafe { array(out, bytes) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    out: *mut Handle,
    desc: *const Array3dDescriptor,
) -> CuResult {
    // SAFETY: the caller's descriptor, when not null.
    let Some(d) = (unsafe { desc.as_ref() }) else {
        return abi::ERROR_INVALID_VALUE;
    };
    let bytes = abi::array_bytes(d.width, d.height, d.depth, d.format, d.num_channels, 1);
    // SAFETY: the caller's out-pointer.
    unsafe { array(out, bytes) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayCreate(
    out: *mut Handle,
    desc: *const Array3dDescriptor,
    levels: c_uint,
) -> CuResult {
    // SAFETY: the caller's descriptor, when not null.
    let Some(d) = (unsafe { desc.as_ref() }) else {
        return abi::ERROR_INVALID_VALUE;
    };
    let bytes = abi::array_bytes(d.width, d.height, d.depth, d.format, d.num_channels, levels);
    // SAFETY: the caller's out-pointer.
    unsafe { array(out, bytes) }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuArrayDestroy(array: Handle) -> CuResult {
    code(with(|d| d.give(array as u64)))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMipmappedArrayDestroy(array: Handle) -> CuResult {
    code(with(|d| d.give(array as u64)))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAllocationGranularity(
    granularity: *mut usize,
    _prop: *const MemAllocationProp,
    _option: c_uint,
) -> CuResult {
    // SAFETY: the caller's out-pointer.
    code(unsafe { put(granularity, 2 << 20) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut CuMemHandle,
    bytes: usize,
    prop: *const MemAllocationProp,
    _flags: u64,
) -> CuResult {
    // SAFETY: the caller's properties, when not null.
    let Some(prop) = (unsafe { prop.as_ref() }) else {
        return abi::ERROR_INVALID_VALUE;
    };
    if prop.location.kind != abi::MEM_LOCATION_DEVICE {
        // Host memory: a handle, no device memory.
        let address = with(|d| {
            d.next += 512;
            Ok(d.next)
        });
        // SAFETY: the caller's out-pointer.
        return code(address.and_then(|a| unsafe { put(handle, a) }));
    }
    code(
        with(|d| {
            let device = d.device(prop.location.id)?;
            d.take(device, bytes as u64)
        })
        // SAFETY: the caller's out-pointer.
        .and_then(|a| unsafe { put(handle, a) }),
    )
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemRelease(handle: CuMemHandle) -> CuResult {
    // A host handle was never taken from a device.
    code(with(|d| match d.live.contains_key(&handle) {
        true => d.give(handle),
        false => Ok(()),
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAddressReserve(
    out: *mut CuDevicePtr,
    bytes: usize,
    _alignment: usize,
    _address: CuDevicePtr,
    _flags: u64,
) -> CuResult {
    // Address space only: no memory is taken.
    let address = with(|d| {
        let a = d.next;
        d.next += (bytes as u64).div_ceil(512) * 512;
        Ok(a)
    });
    // SAFETY: the caller's out-pointer.
    code(address.and_then(|a| unsafe { put(out, a) }))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemAddressFree(_address: CuDevicePtr, _bytes: usize) -> CuResult {
    code(with(|_| Ok(())))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemMap(
    _address: CuDevicePtr,
    _bytes: usize,
    _offset: usize,
    _handle: CuMemHandle,
    _flags: u64,
) -> CuResult {
    code(with(|_| Ok(())))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemUnmap(_address: CuDevicePtr, _bytes: usize) -> CuResult {
    code(with(|_| Ok(())))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuLaunchKernel(
    _f: Handle,
    _gx: c_uint,
    _gy: c_uint,
    _gz: c_uint,
    _bx: c_uint,
    _by: c_uint,
    _bz: c_uint,
    _shared: c_uint,
    _stream: Handle,
    _params: *mut *mut c_void,
    _extra: *mut *mut c_void,
) -> CuResult {
    code(current().map(|_| ()))
}

/// `(function, the CUDA version that introduced it)`.
macro_rules! v {
    ($f:ident, $since:literal) => {
        ($f as *const c_void, $since)
    };
}

/// The driver's function for `name` at CUDA `version` with `flags`: the newest variant the
/// version allows, the per-thread one when asked and there is one.
fn lookup(name: &str, version: c_int, flags: u64) -> Result<*const c_void, i32> {
    let per_thread = flags & abi::PROC_ADDRESS_PER_THREAD != 0;
    // (variant, the CUDA version that introduced it)
    let variants: &[(*const c_void, c_int)] = match (name, per_thread) {
        ("cuInit", _) => &[v!(cuInit, 2000)],
        ("cuDriverGetVersion", _) => &[v!(cuDriverGetVersion, 2020)],
        ("cuDeviceGetCount", _) => &[v!(cuDeviceGetCount, 2000)],
        ("cuDeviceGet", _) => &[v!(cuDeviceGet, 2000)],
        ("cuDeviceGetUuid", _) => &[v!(cuDeviceGetUuid, 9020), v!(cuDeviceGetUuid_v2, 11040)],
        ("cuDeviceTotalMem", _) => &[v!(cuDeviceTotalMem, 2000), v!(cuDeviceTotalMem_v2, 3020)],
        ("cuCtxCreate", _) => &[v!(cuCtxCreate_v2, 3020)],
        ("cuCtxDestroy", _) => &[v!(cuCtxDestroy_v2, 4000)],
        ("cuCtxSetCurrent", _) => &[v!(cuCtxSetCurrent, 4000)],
        ("cuCtxGetDevice", _) => &[v!(cuCtxGetDevice, 2000)],
        ("cuCtxSynchronize", _) => &[v!(cuCtxSynchronize, 2000)],
        ("cuDevicePrimaryCtxRetain", _) => &[v!(cuDevicePrimaryCtxRetain, 7000)],
        ("cuDevicePrimaryCtxRelease", _) => &[v!(cuDevicePrimaryCtxRelease_v2, 11000)],
        ("cuMemAlloc", _) => &[v!(cuMemAlloc, 2000), v!(cuMemAlloc_v2, 3020)],
        ("cuMemFree", _) => &[v!(cuMemFree, 2000), v!(cuMemFree_v2, 3020)],
        ("cuMemGetInfo", _) => &[v!(cuMemGetInfo, 2000), v!(cuMemGetInfo_v2, 3020)],
        ("cuMemAllocPitch", _) => &[v!(cuMemAllocPitch_v2, 3020)],
        ("cuDeviceGetDefaultMemPool", _) => &[v!(cuDeviceGetDefaultMemPool, 11020)],
        ("cuMemAllocManaged", _) => &[v!(cuMemAllocManaged, 6000)],
        ("cuMemAllocAsync", false) => &[v!(cuMemAllocAsync, 11020)],
        ("cuMemAllocAsync", true) => &[v!(cuMemAllocAsync_ptsz, 11020)],
        ("cuMemAllocFromPoolAsync", false) => &[v!(cuMemAllocFromPoolAsync, 11020)],
        ("cuMemAllocFromPoolAsync", true) => &[v!(cuMemAllocFromPoolAsync_ptsz, 11020)],
        ("cuMemFreeAsync", false) => &[v!(cuMemFreeAsync, 11020)],
        ("cuMemFreeAsync", true) => &[v!(cuMemFreeAsync_ptsz, 11020)],
        ("cuArrayCreate", _) => &[v!(cuArrayCreate_v2, 3020)],
        ("cuArray3DCreate", _) => &[v!(cuArray3DCreate_v2, 3020)],
        ("cuMipmappedArrayCreate", _) => &[v!(cuMipmappedArrayCreate, 5000)],
        ("cuArrayDestroy", _) => &[v!(cuArrayDestroy, 2000)],
        ("cuMipmappedArrayDestroy", _) => &[v!(cuMipmappedArrayDestroy, 5000)],
        ("cuMemGetAllocationGranularity", _) => &[v!(cuMemGetAllocationGranularity, 10020)],
        ("cuMemCreate", _) => &[v!(cuMemCreate, 10020)],
        ("cuMemRelease", _) => &[v!(cuMemRelease, 10020)],
        ("cuMemAddressReserve", _) => &[v!(cuMemAddressReserve, 10020)],
        ("cuMemAddressFree", _) => &[v!(cuMemAddressFree, 10020)],
        ("cuMemMap", _) => &[v!(cuMemMap, 10020)],
        ("cuMemUnmap", _) => &[v!(cuMemUnmap, 10020)],
        ("cuLaunchKernel", false) => &[v!(cuLaunchKernel, 4000)],
        ("cuGetProcAddress", _) => &[v!(cuGetProcAddress, 11030), v!(cuGetProcAddress_v2, 12000)],
        _ => return Err(abi::PROC_ADDRESS_NOT_FOUND),
    };
    variants
        .iter()
        .rev()
        .find(|(_, since)| *since <= version)
        .map(|(f, _)| *f)
        .ok_or(abi::PROC_ADDRESS_VERSION_NOT_SUFFICIENT)
}

/// `cuGetProcAddress_v2` and, without a status, `cuGetProcAddress`.
unsafe fn proc_address(
    symbol: *const c_char,
    pfn: *mut *const c_void,
    version: c_int,
    flags: u64,
    status: *mut i32,
) -> CuResult {
    if symbol.is_null() || pfn.is_null() {
        return abi::ERROR_INVALID_VALUE;
    }
    // SAFETY: a NUL-terminated name, as the API requires.
    let name = unsafe { CStr::from_ptr(symbol) }.to_string_lossy();
    let found = lookup(&name, version, flags);
    let (pointer, query) = match found {
        Ok(f) => (f, abi::PROC_ADDRESS_FOUND),
        Err(q) => (std::ptr::null(), q),
    };
    // SAFETY: the caller's out-pointers (status may be null).
    unsafe {
        pfn.write(pointer);
        if !status.is_null() {
            status.write(query);
        }
    }
    if found.is_ok() {
        abi::SUCCESS
    } else {
        abi::ERROR_NOT_FOUND
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *const c_void,
    version: c_int,
    flags: u64,
) -> CuResult {
    // SAFETY: the same contract, without the status.
    unsafe { proc_address(symbol, pfn, version, flags, std::ptr::null_mut()) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *const c_void,
    version: c_int,
    flags: u64,
    status: *mut i32,
) -> CuResult {
    // SAFETY: the caller's arguments.
    unsafe { proc_address(symbol, pfn, version, flags, status) }
}
