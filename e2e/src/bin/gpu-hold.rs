//! `runtimekit-gpu-hold`: holds a known amount of memory on one card through the CUDA driver,
//! for `e2e/gpu-check.sh` to find the process in NVML's list with that memory. It loads
//! `libcuda.so.1` itself (no CUDA toolkit needed, only the driver), allocates, says so on
//! stdout, waits, frees and exits.
#![allow(unsafe_code)]

use clap::Parser;
use libloading::{Library, Symbol};
use std::ffi::c_void;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(name = "runtimekit-gpu-hold", version, about)]
struct Cli {
    /// The card, by CUDA's device ordinal.
    #[arg(long, default_value_t = 0)]
    card: i32,
    /// How much to hold, in MiB.
    #[arg(long, default_value_t = 1024)]
    mib: usize,
    /// How long to hold it, in seconds.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
}

type CuResult = i32;
type CuDevice = i32;
type CuContext = *mut c_void;
type CuDevicePtr = u64;

/// A CUDA driver call's result as an error.
fn check(call: &str, result: CuResult) -> Result<(), String> {
    if result == 0 {
        Ok(())
    } else {
        Err(format!("{call} failed with CUDA error {result}"))
    }
}

fn hold(cli: &Cli) -> Result<(), String> {
    // SAFETY: loading the driver library runs its initialisers, as any CUDA program does.
    let cuda = unsafe { Library::new("libcuda.so.1") }
        .map_err(|e| format!("cannot load libcuda.so.1 (is the NVIDIA driver installed?): {e}"))?;
    // SAFETY: each symbol is looked up with the signature of cuda.h for its name.
    unsafe {
        let init: Symbol<unsafe extern "C" fn(u32) -> CuResult> =
            cuda.get(b"cuInit\0").map_err(|e| e.to_string())?;
        let device_get: Symbol<unsafe extern "C" fn(*mut CuDevice, i32) -> CuResult> =
            cuda.get(b"cuDeviceGet\0").map_err(|e| e.to_string())?;
        let ctx_create: Symbol<unsafe extern "C" fn(*mut CuContext, u32, CuDevice) -> CuResult> =
            cuda.get(b"cuCtxCreate_v2\0").map_err(|e| e.to_string())?;
        let mem_alloc: Symbol<unsafe extern "C" fn(*mut CuDevicePtr, usize) -> CuResult> =
            cuda.get(b"cuMemAlloc_v2\0").map_err(|e| e.to_string())?;
        let mem_free: Symbol<unsafe extern "C" fn(CuDevicePtr) -> CuResult> =
            cuda.get(b"cuMemFree_v2\0").map_err(|e| e.to_string())?;
        let ctx_destroy: Symbol<unsafe extern "C" fn(CuContext) -> CuResult> =
            cuda.get(b"cuCtxDestroy_v2\0").map_err(|e| e.to_string())?;
        check("cuInit", init(0))?;
        let mut device: CuDevice = 0;
        check("cuDeviceGet", device_get(&mut device, cli.card))?;
        let mut context: CuContext = std::ptr::null_mut();
        check("cuCtxCreate_v2", ctx_create(&mut context, 0, device))?;
        let mut memory: CuDevicePtr = 0;
        check("cuMemAlloc_v2", mem_alloc(&mut memory, cli.mib << 20))?;
        println!(
            "holding {} MiB on card {} as pid {}",
            cli.mib,
            cli.card,
            std::process::id()
        );
        std::thread::sleep(Duration::from_secs(cli.seconds));
        check("cuMemFree_v2", mem_free(memory))?;
        check("cuCtxDestroy_v2", ctx_destroy(context))?;
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match hold(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
