//! Kernels, for the GPU check: PTX given to the driver as text (no CUDA toolkit needed; the
//! driver's JIT assembles it), launched through the driver as found the chosen way.

use crate::{Driver, check};
use runtimekit_cuda_abi::{CuDevice, CuDevicePtr, CuResult, Handle, LaunchKernel};
use std::ffi::{c_int, c_uint, c_void};
use std::time::{Duration, Instant};

/// Three kernels: `empty` does nothing; `spin` has each thread loop `iterations` times and
/// store its sum (a fixed amount of work per launch); `poison` stores to an address no
/// allocation has, which the card reports as an illegal address. PTX 6.0 for sm_70 assembles
/// for every card since Volta.
const PTX: &str = r#".version 6.0
.target sm_70
.address_size 64

.visible .entry empty()
{
    ret;
}

.visible .entry spin(.param .u64 out, .param .u32 iterations)
{
    .reg .pred %p;
    .reg .b32 %r<4>;
    .reg .b64 %rd<3>;
    ld.param.u64 %rd1, [out];
    ld.param.u32 %r1, [iterations];
    mov.u32 %r2, 0;
    mov.u32 %r3, 0;
LOOP:
    add.u32 %r3, %r3, %r2;
    add.u32 %r2, %r2, 1;
    setp.lt.u32 %p, %r2, %r1;
    @%p bra LOOP;
    cvta.to.global.u64 %rd2, %rd1;
    st.global.u32 [%rd2], %r3;
    ret;
}

.visible .entry poison()
{
    .reg .b32 %r<2>;
    .reg .b64 %rd<2>;
    mov.u64 %rd1, 0xdead0000dead0000;
    mov.u32 %r1, 1;
    st.global.u32 [%rd1], %r1;
    ret;
}
"#;

/// `CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`.
const MULTIPROCESSOR_COUNT: c_int = 16;

/// The loaded module's kernels and the calls that run them.
pub struct Kernels {
    empty: Handle,
    spin: Handle,
    poison: Handle,
    launch: LaunchKernel,
    synchronize: unsafe extern "C" fn() -> CuResult,
    multiprocessors: c_uint,
    out: CuDevicePtr,
}

impl Kernels {
    /// Loads the PTX into the current context.
    pub fn load(driver: &Driver, device: CuDevice) -> Result<Kernels, String> {
        let load: unsafe extern "C" fn(*mut Handle, *const c_void) -> CuResult =
            driver.entry("cuModuleLoadData", "cuModuleLoadData", false)?;
        let function: unsafe extern "C" fn(*mut Handle, Handle, *const i8) -> CuResult =
            driver.entry("cuModuleGetFunction", "cuModuleGetFunction", false)?;
        let attribute: unsafe extern "C" fn(*mut c_int, c_int, CuDevice) -> CuResult =
            driver.entry("cuDeviceGetAttribute", "cuDeviceGetAttribute", false)?;
        let alloc: unsafe extern "C" fn(*mut CuDevicePtr, usize) -> CuResult =
            driver.entry("cuMemAlloc", "cuMemAlloc_v2", false)?;
        let text = std::ffi::CString::new(PTX).map_err(|e| e.to_string())?;
        let mut module: Handle = std::ptr::null_mut();
        let (mut empty, mut spin, mut poison): (Handle, Handle, Handle) = (
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        );
        let mut multiprocessors: c_int = 0;
        let mut out: CuDevicePtr = 0;
        // SAFETY: cuda.h's signatures; valid pointers and NUL-terminated strings.
        unsafe {
            check("cuModuleLoadData", load(&mut module, text.as_ptr().cast()))?;
            check(
                "cuModuleGetFunction(empty)",
                function(&mut empty, module, c"empty".as_ptr()),
            )?;
            check(
                "cuModuleGetFunction(spin)",
                function(&mut spin, module, c"spin".as_ptr()),
            )?;
            check(
                "cuModuleGetFunction(poison)",
                function(&mut poison, module, c"poison".as_ptr()),
            )?;
            check(
                "cuDeviceGetAttribute",
                attribute(&mut multiprocessors, MULTIPROCESSOR_COUNT, device),
            )?;
            check("cuMemAlloc_v2", alloc(&mut out, 4))?;
        }
        Ok(Kernels {
            empty,
            spin,
            poison,
            launch: driver.entry("cuLaunchKernel", "cuLaunchKernel", false)?,
            synchronize: driver.entry("cuCtxSynchronize", "cuCtxSynchronize", false)?,
            multiprocessors: c_uint::try_from(multiprocessors).map_err(|e| e.to_string())?,
            out,
        })
    }

    /// Launches `function` on `blocks` blocks of 128 threads with `params`.
    fn run(&self, function: Handle, blocks: c_uint, params: &mut [*mut c_void]) -> CuResult {
        let params = if params.is_empty() {
            std::ptr::null_mut()
        } else {
            params.as_mut_ptr()
        };
        // SAFETY: a kernel of the loaded module with the parameters its PTX declares.
        unsafe {
            (self.launch)(
                function,
                blocks,
                1,
                1,
                128,
                1,
                1,
                0,
                std::ptr::null_mut(),
                params,
                std::ptr::null_mut(),
            )
        }
    }

    fn synchronize(&self) -> CuResult {
        // SAFETY: no arguments.
        unsafe { (self.synchronize)() }
    }

    /// The mean time of one launch of an empty kernel, over `count` launches made back to back
    /// (the card runs them meanwhile; one synchronisation at the end).
    pub fn launch_overhead(&self, count: u32) -> Result<Duration, String> {
        check("cuLaunchKernel", self.run(self.empty, 1, &mut []))?;
        check("cuCtxSynchronize", self.synchronize())?;
        let started = Instant::now();
        for _ in 0..count {
            check("cuLaunchKernel", self.run(self.empty, 1, &mut []))?;
        }
        let elapsed = started.elapsed();
        check("cuCtxSynchronize", self.synchronize())?;
        Ok(elapsed / count.max(1))
    }

    /// Runs `spin` kernels of `iterations` on every multiprocessor for `warmup` and then
    /// `seconds`, synchronising after each; how many completed after the warm-up, or the error
    /// that stopped them.
    pub fn spin(&self, iterations: u32, warmup: f64, seconds: f64) -> (u64, CuResult) {
        let mut out = self.out;
        let mut iterations = iterations;
        let start = Instant::now() + Duration::from_secs_f64(warmup);
        let deadline = start + Duration::from_secs_f64(seconds);
        let mut done = 0;
        while Instant::now() < deadline {
            let mut params: [*mut c_void; 2] =
                [(&raw mut out).cast(), (&raw mut iterations).cast()];
            let launched = self.run(self.spin, self.multiprocessors * 4, &mut params);
            let result = if launched == 0 {
                self.synchronize()
            } else {
                launched
            };
            if result != 0 {
                return (done, result);
            }
            if Instant::now() > start {
                done += 1;
            }
        }
        (done, 0)
    }

    /// Launches `poison` and synchronises: the error the card reports.
    pub fn poison(&self) -> CuResult {
        match self.run(self.poison, 1, &mut []) {
            0 => self.synchronize(),
            error => error,
        }
    }
}
