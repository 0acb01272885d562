//! How programs reach the hooks, every way they reach the driver:
//! - direct linking: the hooks are exported under the driver's names, and a preloaded
//!   library's definitions come first;
//! - `dlopen` + `dlsym` (how the CUDA runtime loads the driver): `dlsym` is hooked, and a
//!   `cu*`/`nvml*` name the real lookup finds comes back as its hook;
//! - `cuGetProcAddress` and `_v2` (how the runtime, PyTorch and NCCL resolve every other entry
//!   point): the driver picks the variant for the requested version and per-thread flag, and
//!   the hook of exactly that variant replaces it. On driver 580 every pointer it returns is
//!   one of the library's exported symbols (checked on an H200: `docs/isolation.md`), so the
//!   variant is found by comparing addresses, never guessed from the version.
#![allow(non_snake_case, clippy::missing_safety_doc)]

mod info;
mod launch;
mod memory;

use crate::real;
use runtimekit_cuda_abi::{self as abi, CuResult};
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::sync::OnceLock;

/// `(name, address)` of each hook `module::name`.
macro_rules! table {
    ($($module:ident :: $name:ident),* $(,)?) => {
        vec![$((stringify!($name), $module::$name as *const () as usize)),*]
    };
}

/// Every hook, by the exported name it stands in for.
fn hooks() -> &'static [(&'static str, usize)] {
    static HOOKS: OnceLock<Vec<(&'static str, usize)>> = OnceLock::new();
    HOOKS.get_or_init(|| {
        table![
            memory::cuMemAlloc,
            memory::cuMemAlloc_v2,
            memory::cuMemAllocPitch_v2,
            memory::cuMemAllocManaged,
            memory::cuMemAllocAsync,
            memory::cuMemAllocAsync_ptsz,
            memory::cuMemAllocFromPoolAsync,
            memory::cuMemAllocFromPoolAsync_ptsz,
            memory::cuMemFree,
            memory::cuMemFree_v2,
            memory::cuMemFreeAsync,
            memory::cuMemFreeAsync_ptsz,
            memory::cuArrayCreate_v2,
            memory::cuArray3DCreate_v2,
            memory::cuMipmappedArrayCreate,
            memory::cuArrayDestroy,
            memory::cuMipmappedArrayDestroy,
            memory::cuMemCreate,
            memory::cuMemRelease,
            info::cuMemGetInfo,
            info::cuMemGetInfo_v2,
            info::cuDeviceTotalMem,
            info::cuDeviceTotalMem_v2,
            info::nvmlDeviceGetMemoryInfo,
            info::nvmlDeviceGetMemoryInfo_v2,
            launch::cuLaunchKernel,
            launch::cuLaunchKernel_ptsz,
            launch::cuLaunchKernelEx,
            launch::cuLaunchKernelEx_ptsz,
            launch::cuLaunchCooperativeKernel,
            launch::cuLaunchCooperativeKernel_ptsz,
            launch::cuGraphLaunch,
            launch::cuGraphLaunch_ptsz,
            self::cuGetProcAddress,
            self::cuGetProcAddress_v2,
        ]
    })
}

/// The hook of the exported name `name`.
fn hook(name: &[u8]) -> Option<usize> {
    hooks()
        .iter()
        .find(|(n, _)| n.as_bytes() == name)
        .map(|(_, h)| *h)
}

/// The hook standing in for `found`, the real driver's answer to `cuGetProcAddress(requested)`:
/// the hook of the variant (`requested` itself or `requested_<suffix>`) whose real address it
/// is; `found` itself when no hook stands in for it.
fn substitute(requested: &[u8], found: usize) -> usize {
    for (name, hook) in hooks() {
        let Some(rest) = name.as_bytes().strip_prefix(requested) else {
            continue;
        };
        if !(rest.is_empty() || rest.starts_with(b"_")) {
            continue;
        }
        let Ok(name) = CString::new(*name) else {
            continue;
        };
        if real::cuda(&name) == Some(found) {
            return *hook;
        }
    }
    found
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    let Some(real) = real::dlsym() else {
        return std::ptr::null_mut();
    };
    // SAFETY: the caller's arguments, passed on.
    let found = unsafe { real(handle, symbol) };
    if found.is_null() || symbol.is_null() {
        return found;
    }
    // SAFETY: a NUL-terminated name (dlsym found it).
    let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    if !(name.starts_with(b"cu") || name.starts_with(b"nvml")) {
        return found;
    }
    hook(name).map_or(found, |h| h as *mut c_void)
}

/// Puts the hook in place of the driver's answer in `*pfn`.
unsafe fn replace_answer(result: CuResult, symbol: *const c_char, pfn: *mut *mut c_void) {
    if result != abi::SUCCESS || symbol.is_null() || pfn.is_null() {
        return;
    }
    // SAFETY: the driver wrote `*pfn`; the name is NUL-terminated.
    unsafe {
        let found = pfn.read();
        if !found.is_null() {
            let name = CStr::from_ptr(symbol).to_bytes();
            pfn.write(substitute(name, found as usize) as *mut c_void);
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CuResult {
    type F =
        unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> CuResult;
    let Some(real) = real::function!(cuda, "cuGetProcAddress_v2", F) else {
        return abi::ERROR_NOT_FOUND;
    };
    // SAFETY: the caller's arguments, passed on.
    let result = unsafe { real(symbol, pfn, version, flags, status) };
    // SAFETY: as above.
    unsafe { replace_answer(result, symbol, pfn) };
    result
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> CuResult {
    type F = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64) -> CuResult;
    let Some(real) = real::function!(cuda, "cuGetProcAddress", F) else {
        return abi::ERROR_NOT_FOUND;
    };
    // SAFETY: the caller's arguments, passed on.
    let result = unsafe { real(symbol, pfn, version, flags) };
    // SAFETY: as above.
    unsafe { replace_answer(result, symbol, pfn) };
    result
}
