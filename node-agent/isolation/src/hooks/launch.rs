//! The launch paths: each passes its launch through the card's compute gate (which may make it
//! wait) before the driver runs it. A launch costs its grid's block count; a graph, whose
//! kernels the library does not see, costs `GRAPH_BLOCKS`.

use crate::real::function;
use crate::state::{Outermost, isolation};
use runtimekit_cuda_abi::{self as abi, CuResult, Handle, LaunchCooperativeKernel, LaunchKernel};
use std::ffi::{c_uint, c_void};

/// What one graph launch is charged, in blocks.
const GRAPH_BLOCKS: u64 = 1024;

/// Waits at the gate for a launch of `blocks`, then runs `launch` (a nested call, the driver's
/// own, goes straight through).
fn gated(blocks: u64, launch: impl FnOnce() -> CuResult) -> CuResult {
    if let Some(_outermost) = Outermost::enter() {
        isolation().gate(blocks.max(1));
    }
    launch()
}

fn grid(x: c_uint, y: c_uint, z: c_uint) -> u64 {
    u64::from(x) * u64::from(y.max(1)) * u64::from(z.max(1))
}

/// Exports `$name`, the hook of the driver's launch entry point of that name (of type `$ty`:
/// `cuLaunchKernel`'s parameters, `cuLaunchCooperativeKernel`'s without `extra`).
macro_rules! launch_hook {
    ($name:ident, $ty:ty $(, $extra:ident)?) => {
        #[unsafe(no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "C" fn $name(
            f: Handle,
            gx: c_uint,
            gy: c_uint,
            gz: c_uint,
            bx: c_uint,
            by: c_uint,
            bz: c_uint,
            shared: c_uint,
            stream: Handle,
            params: *mut *mut c_void,
            $($extra: *mut *mut c_void,)?
        ) -> CuResult {
            let Some(real) = function!(cuda, $name, $ty) else {
                return abi::ERROR_NOT_FOUND;
            };
            // SAFETY: the caller's arguments, passed on.
            gated(grid(gx, gy, gz), || unsafe {
                real(f, gx, gy, gz, bx, by, bz, shared, stream, params $(, $extra)?)
            })
        }
    };
}

launch_hook!(cuLaunchKernel, LaunchKernel, extra);
launch_hook!(cuLaunchKernel_ptsz, LaunchKernel, extra);
launch_hook!(cuLaunchCooperativeKernel, LaunchCooperativeKernel);
launch_hook!(cuLaunchCooperativeKernel_ptsz, LaunchCooperativeKernel);

/// The start of `CUlaunchConfig`: the grid's dimensions.
#[repr(C)]
#[derive(Debug)]
pub struct LaunchConfigGrid {
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
}

type KernelExFn = unsafe extern "C" fn(
    *const LaunchConfigGrid,
    Handle,
    *mut *mut c_void,
    *mut *mut c_void,
) -> CuResult;

/// `cuLaunchKernelEx` and its per-thread variant through `real`.
unsafe fn kernel_ex(
    real: KernelExFn,
    config: *const LaunchConfigGrid,
    f: Handle,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CuResult {
    // SAFETY: the caller's configuration, when not null.
    let blocks = unsafe { config.as_ref() }.map_or(1, |c| grid(c.grid_x, c.grid_y, c.grid_z));
    // SAFETY: the caller's arguments, passed on.
    gated(blocks, || unsafe { real(config, f, params, extra) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernelEx(
    config: *const LaunchConfigGrid,
    f: Handle,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CuResult {
    let Some(real) = function!(cuda, "cuLaunchKernelEx", KernelExFn) else {
        return abi::ERROR_NOT_FOUND;
    };
    // SAFETY: the caller's arguments.
    unsafe { kernel_ex(real, config, f, params, extra) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernelEx_ptsz(
    config: *const LaunchConfigGrid,
    f: Handle,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CuResult {
    let Some(real) = function!(cuda, "cuLaunchKernelEx_ptsz", KernelExFn) else {
        return abi::ERROR_NOT_FOUND;
    };
    // SAFETY: the caller's arguments.
    unsafe { kernel_ex(real, config, f, params, extra) }
}

type GraphFn = unsafe extern "C" fn(Handle, Handle) -> CuResult;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphLaunch(graph: Handle, stream: Handle) -> CuResult {
    let Some(real) = function!(cuda, "cuGraphLaunch", GraphFn) else {
        return abi::ERROR_NOT_FOUND;
    };
    // SAFETY: the caller's arguments, passed on.
    gated(GRAPH_BLOCKS, || unsafe { real(graph, stream) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphLaunch_ptsz(graph: Handle, stream: Handle) -> CuResult {
    let Some(real) = function!(cuda, "cuGraphLaunch_ptsz", GraphFn) else {
        return abi::ERROR_NOT_FOUND;
    };
    // SAFETY: the caller's arguments, passed on.
    gated(GRAPH_BLOCKS, || unsafe { real(graph, stream) })
}
