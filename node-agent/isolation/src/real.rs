//! The functions the hooks stand in front of: the C library's own `dlsym`, and the real
//! driver's (`libcuda.so.1`) and NVML's (`libnvidia-ml.so.1`) entry points, each looked up
//! once. Lookups go to the library's handle, so they find the library's own definitions and
//! never this library's hooks.

use std::ffi::{CStr, c_char, c_void};
use std::sync::OnceLock;

/// `dlsym`'s symbol version in the C library: the base version of the architecture.
#[cfg(target_arch = "x86_64")]
const DLSYM_VERSION: &CStr = c"GLIBC_2.2.5";
#[cfg(target_arch = "aarch64")]
const DLSYM_VERSION: &CStr = c"GLIBC_2.17";

type Dlsym = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// The C library's `dlsym`.
pub fn dlsym() -> Option<Dlsym> {
    static REAL: OnceLock<usize> = OnceLock::new();
    let address = *REAL.get_or_init(|| {
        // SAFETY: dlvsym with constant NUL-terminated names; RTLD_NEXT finds the definition
        // after this library's, the C library's.
        unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), DLSYM_VERSION.as_ptr()) as usize }
    });
    // SAFETY: a non-zero address is the C library's dlsym, of this signature.
    (address != 0).then(|| unsafe { std::mem::transmute::<usize, Dlsym>(address) })
}

/// A library loaded once and kept.
fn library(name: &CStr, slot: &OnceLock<usize>) -> *mut c_void {
    *slot.get_or_init(|| {
        // SAFETY: a NUL-terminated name; the library stays loaded for the process's life.
        unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_NODELETE) as usize }
    }) as *mut c_void
}

/// The address of `name` (NUL-terminated) in the real driver, if it has one.
pub fn cuda(name: &CStr) -> Option<usize> {
    static DRIVER: OnceLock<usize> = OnceLock::new();
    lookup(library(c"libcuda.so.1", &DRIVER), name)
}

/// The address of `name` (NUL-terminated) in the real NVML, if it has one.
pub fn nvml(name: &CStr) -> Option<usize> {
    static NVML: OnceLock<usize> = OnceLock::new();
    lookup(library(c"libnvidia-ml.so.1", &NVML), name)
}

fn lookup(handle: *mut c_void, name: &CStr) -> Option<usize> {
    if handle.is_null() {
        return None;
    }
    let dlsym = dlsym()?;
    // SAFETY: a handle from dlopen and a NUL-terminated name.
    let address = unsafe { dlsym(handle, name.as_ptr()) } as usize;
    (address != 0).then_some(address)
}

/// The real function `$name` (a string, or the name itself) of library `$lib` (`cuda` or
/// `nvml`) as a `$ty`, looked up once.
macro_rules! function {
    ($lib:ident, $name:ident, $ty:ty) => {
        $crate::real::function!($lib, stringify!($name), $ty)
    };
    ($lib:ident, $name:expr, $ty:ty) => {{
        static ADDRESS: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
        ADDRESS
            .get_or_init(|| {
                $crate::real::$lib(
                    std::ffi::CStr::from_bytes_with_nul(concat!($name, "\0").as_bytes())
                        .unwrap_or_default(),
                )
            })
            // SAFETY: the library's symbol of this name has the signature of its header.
            .map(|address| unsafe { std::mem::transmute::<usize, $ty>(address) })
    }};
}
pub(crate) use function;
