//! `runtimekit-cuda-probe`: a small CUDA driver program that loads `libcuda.so.1` itself (no
//! CUDA toolkit, only the driver) and exercises the paths the isolation library stands in
//! front of, reached the way real programs reach them: by `dlsym` (`--via dlsym`), or by
//! `cuGetProcAddress_v2` as the CUDA runtime 12 does (`--via proc-address`), or
//! `cuGetProcAddress` as runtime 11 does (`--via proc-address-v1`). The isolation tests run it
//! against the fake driver; the GPU check runs it on a real card.
#![allow(unsafe_code)]

mod kernels;

use clap::{Parser, Subcommand, ValueEnum};
use libloading::Library;
use runtimekit_cuda_abi::{
    self as abi, Array3dDescriptor, ArrayDescriptor, CuDevice, CuDevicePtr, CuDevicePtrV1,
    CuMemHandle, CuResult, Handle, MemAllocationProp, MemLocation,
};
use std::ffi::{CString, c_char, c_int, c_uint, c_void};
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(name = "runtimekit-cuda-probe", version, about)]
struct Cli {
    /// How the driver's entry points are found.
    #[arg(long, value_enum, default_value_t = Via::Dlsym)]
    via: Via,
    /// The device, by the driver's ordinal.
    #[arg(long, default_value_t = 0)]
    device: CuDevice,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Via {
    /// `dlsym` on the driver's handle, by exported name.
    Dlsym,
    /// `cuGetProcAddress_v2` at CUDA 12.8, itself found through `cuGetProcAddress`.
    ProcAddress,
    /// `cuGetProcAddress` at CUDA 11.3.
    ProcAddressV1,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Allocates `count` blocks of `mib` MiB by one path, keeping them; one line per block.
    Alloc {
        /// The allocation path.
        #[arg(long, value_enum)]
        path: Path,
        /// The size of each block.
        #[arg(long)]
        mib: u64,
        /// How many blocks.
        #[arg(long, default_value_t = 1)]
        count: u32,
    },
    /// Prints what `cuMemGetInfo` and `cuDeviceTotalMem` say.
    Info,
    /// Prints what NVML's `nvmlDeviceGetMemoryInfo_v2` says of the device (NVML's index).
    NvmlMemory,
    /// Launches as fast as it may for `seconds` (no module: a null function, which only the
    /// fake driver runs): prints the launches a second, and how many in the last second.
    Launches {
        /// Blocks of each launch.
        #[arg(long, default_value_t = 100)]
        blocks: u32,
        /// How long.
        #[arg(long, default_value_t = 1.0)]
        seconds: f64,
    },
    /// Times launches of an empty kernel: prints the mean microseconds per launch.
    LaunchOverhead {
        /// How many launches.
        #[arg(long, default_value_t = 20000)]
        count: u32,
    },
    /// Runs kernels of fixed work on every multiprocessor for `seconds`, synchronising after
    /// each: prints how many a second completed, and the error if one stopped them.
    Spin {
        /// Loop iterations of each thread.
        #[arg(long, default_value_t = 200_000)]
        iterations: u32,
        /// How long, after the warm-up.
        #[arg(long, default_value_t = 10.0)]
        seconds: f64,
        /// Seconds of kernels run first and not counted (while a compute cap settles).
        #[arg(long, default_value_t = 0.0)]
        warmup: f64,
    },
    /// Launches a kernel that stores to an illegal address: prints the error the card reports.
    Poison,
    /// Allocates `mib` MiB, says so, and holds it for `seconds`.
    Hold {
        /// How much.
        #[arg(long)]
        mib: u64,
        /// How long.
        #[arg(long, default_value_t = 30)]
        seconds: u64,
    },
}

/// An allocation path of the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Path {
    /// `cuMemAlloc_v2`.
    Alloc,
    /// `cuMemAlloc`, the 32-bit entry point.
    AllocV1,
    /// `cuMemAllocPitch_v2`, rows padded by the driver.
    Pitch,
    /// `cuMemAllocManaged`.
    Managed,
    /// `cuMemAllocAsync`.
    Async,
    /// `cuMemAllocAsync_ptsz` (per-thread default stream).
    AsyncPtsz,
    /// `cuMemAllocFromPoolAsync`.
    Pool,
    /// `cuArrayCreate_v2`.
    Array,
    /// `cuArray3DCreate_v2`.
    Array3d,
    /// `cuMipmappedArrayCreate`.
    Mipmapped,
    /// `cuMemCreate` + `cuMemAddressReserve` + `cuMemMap` (virtual-memory API).
    Vmm,
}

const MIB: u64 = 1 << 20;
/// A float array row of 64 KiB, 16 rows a MiB: within the 2D array limits of real cards
/// (width at most 131,072 and height at most 65,536 elements).
const FLOATS_PER_ROW: usize = 1 << 14;
const ROWS_PER_MIB: usize = 16;
const FLOAT: u32 = 0x20;

type GetProcAddressV2 =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> CuResult;
type GetProcAddress = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64) -> CuResult;

/// The driver, and how its entry points are found.
pub(crate) struct Driver {
    library: Library,
    via: Via,
    proc_address_v2: Option<GetProcAddressV2>,
    proc_address: Option<GetProcAddress>,
}

impl Driver {
    fn load(via: Via) -> Result<Driver, String> {
        // SAFETY: loading the driver runs its initialisers, as any CUDA program does.
        let library = unsafe { Library::new("libcuda.so.1") }.map_err(|e| {
            format!("cannot load libcuda.so.1 (is the NVIDIA driver installed?): {e}")
        })?;
        let mut driver = Driver {
            library,
            via,
            proc_address_v2: None,
            proc_address: None,
        };
        match via {
            Via::Dlsym => {}
            Via::ProcAddress => {
                let first: GetProcAddressV2 = driver.exported("cuGetProcAddress_v2")?;
                // As the runtime does: ask the driver for cuGetProcAddress itself, and use
                // that from then on.
                let name = c"cuGetProcAddress";
                let mut found: *mut c_void = std::ptr::null_mut();
                let mut status: c_int = 0;
                // SAFETY: cuda.h's signature; valid out-pointers.
                check("cuGetProcAddress_v2", unsafe {
                    first(name.as_ptr(), &mut found, 12080, 0, &mut status)
                })?;
                // SAFETY: the driver's cuGetProcAddress_v2 (CUDA 12.0 and later).
                driver.proc_address_v2 =
                    Some(unsafe { std::mem::transmute::<*mut c_void, GetProcAddressV2>(found) });
            }
            Via::ProcAddressV1 => {
                driver.proc_address = Some(driver.exported("cuGetProcAddress")?);
            }
        }
        Ok(driver)
    }

    /// The exported symbol `name` through `dlsym`.
    fn exported<T: Copy>(&self, name: &str) -> Result<T, String> {
        // SAFETY: the caller names a symbol whose signature is `T`.
        unsafe { self.library.get::<T>(name.as_bytes()) }
            .map(|s| *s)
            .map_err(|e| format!("{name}: {e}"))
    }

    /// The entry point `base` (exported as `exported`), found the chosen way; `per_thread`
    /// asks `cuGetProcAddress` for the per-thread-default-stream variant.
    pub(crate) fn entry<T: Copy>(
        &self,
        base: &str,
        exported: &str,
        per_thread: bool,
    ) -> Result<T, String> {
        let flags = if per_thread {
            abi::PROC_ADDRESS_PER_THREAD
        } else {
            0
        };
        let name = CString::new(base).map_err(|e| e.to_string())?;
        let mut found: *mut c_void = std::ptr::null_mut();
        let result = match (self.via, self.proc_address_v2, self.proc_address) {
            (Via::ProcAddress, Some(get), _) => {
                let mut status: c_int = 0;
                // SAFETY: cuda.h's signature; valid out-pointers.
                unsafe { get(name.as_ptr(), &mut found, 12080, flags, &mut status) }
            }
            (Via::ProcAddressV1, _, Some(get)) => {
                // SAFETY: as above.
                unsafe { get(name.as_ptr(), &mut found, 11030, flags) }
            }
            _ => return self.exported(exported),
        };
        check(&format!("cuGetProcAddress({base})"), result)?;
        if found.is_null() {
            return Err(format!("cuGetProcAddress({base}) found nothing"));
        }
        // SAFETY: the driver's function for `base`, of signature `T`.
        Ok(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&found) })
    }
}

/// A driver call's result as an error.
pub(crate) fn check(call: &str, result: CuResult) -> Result<(), String> {
    if result == abi::SUCCESS {
        Ok(())
    } else {
        Err(format!("{call} failed with CUDA error {result}"))
    }
}

/// Initialises the driver and makes `device`'s primary context current.
fn open(driver: &Driver, device: CuDevice) -> Result<(), String> {
    let init: unsafe extern "C" fn(c_uint) -> CuResult = driver.entry("cuInit", "cuInit", false)?;
    let retain: unsafe extern "C" fn(*mut Handle, CuDevice) -> CuResult = driver.entry(
        "cuDevicePrimaryCtxRetain",
        "cuDevicePrimaryCtxRetain",
        false,
    )?;
    let set_current: unsafe extern "C" fn(Handle) -> CuResult =
        driver.entry("cuCtxSetCurrent", "cuCtxSetCurrent", false)?;
    let mut context: Handle = std::ptr::null_mut();
    // SAFETY: cuda.h's signatures; valid out-pointers.
    unsafe {
        check("cuInit", init(0))?;
        check("cuDevicePrimaryCtxRetain", retain(&mut context, device))?;
        check("cuCtxSetCurrent", set_current(context))
    }
}

/// One allocation of `mib` MiB by `path`.
fn allocate(driver: &Driver, path: Path, mib: u64, device: CuDevice) -> Result<CuResult, String> {
    let bytes = usize::try_from(mib * MIB).map_err(|e| e.to_string())?;
    let rows = usize::try_from(mib).map_err(|e| e.to_string())?;
    let mut address: CuDevicePtr = 0;
    let mut array: Handle = std::ptr::null_mut();
    let null: Handle = std::ptr::null_mut();
    // SAFETY: each entry point is called with cuda.h's signature and valid pointers.
    let result = unsafe {
        match path {
            Path::Alloc => {
                let f: unsafe extern "C" fn(*mut CuDevicePtr, usize) -> CuResult =
                    driver.entry("cuMemAlloc", "cuMemAlloc_v2", false)?;
                f(&mut address, bytes)
            }
            Path::AllocV1 => {
                let f: unsafe extern "C" fn(*mut CuDevicePtrV1, c_uint) -> CuResult =
                    driver.exported("cuMemAlloc")?;
                let mut low: CuDevicePtrV1 = 0;
                f(
                    &mut low,
                    c_uint::try_from(bytes).map_err(|e| e.to_string())?,
                )
            }
            Path::Pitch => {
                let f: unsafe extern "C" fn(
                    *mut CuDevicePtr,
                    *mut usize,
                    usize,
                    usize,
                    c_uint,
                ) -> CuResult = driver.entry("cuMemAllocPitch", "cuMemAllocPitch_v2", false)?;
                // Rows 100 bytes short of 1 MiB: the driver pads them to the full MiB.
                let mut pitch = 0usize;
                f(&mut address, &mut pitch, (1 << 20) - 100, rows, 4)
            }
            Path::Managed => {
                let f: unsafe extern "C" fn(*mut CuDevicePtr, usize, c_uint) -> CuResult =
                    driver.entry("cuMemAllocManaged", "cuMemAllocManaged", false)?;
                f(&mut address, bytes, 1)
            }
            Path::Async | Path::AsyncPtsz => {
                let per_thread = path == Path::AsyncPtsz;
                let name = if per_thread {
                    "cuMemAllocAsync_ptsz"
                } else {
                    "cuMemAllocAsync"
                };
                let f: unsafe extern "C" fn(*mut CuDevicePtr, usize, Handle) -> CuResult =
                    driver.entry("cuMemAllocAsync", name, per_thread)?;
                f(&mut address, bytes, null)
            }
            Path::Pool => {
                let f: unsafe extern "C" fn(*mut CuDevicePtr, usize, Handle, Handle) -> CuResult =
                    driver.entry("cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync", false)?;
                let get_pool: unsafe extern "C" fn(*mut Handle, CuDevice) -> CuResult = driver
                    .entry(
                        "cuDeviceGetDefaultMemPool",
                        "cuDeviceGetDefaultMemPool",
                        false,
                    )?;
                let mut pool: Handle = std::ptr::null_mut();
                check("cuDeviceGetDefaultMemPool", get_pool(&mut pool, device))?;
                f(&mut address, bytes, pool, null)
            }
            Path::Array => {
                let f: unsafe extern "C" fn(*mut Handle, *const ArrayDescriptor) -> CuResult =
                    driver.entry("cuArrayCreate", "cuArrayCreate_v2", false)?;
                let desc = ArrayDescriptor {
                    width: FLOATS_PER_ROW,
                    height: rows * ROWS_PER_MIB,
                    format: FLOAT,
                    num_channels: 1,
                };
                f(&mut array, &desc)
            }
            Path::Array3d | Path::Mipmapped => {
                let desc = Array3dDescriptor {
                    width: FLOATS_PER_ROW,
                    height: rows * ROWS_PER_MIB,
                    depth: 0,
                    format: FLOAT,
                    num_channels: 1,
                    flags: 0,
                };
                if path == Path::Array3d {
                    let f: unsafe extern "C" fn(*mut Handle, *const Array3dDescriptor) -> CuResult =
                        driver.entry("cuArray3DCreate", "cuArray3DCreate_v2", false)?;
                    f(&mut array, &desc)
                } else {
                    let f: unsafe extern "C" fn(
                        *mut Handle,
                        *const Array3dDescriptor,
                        c_uint,
                    ) -> CuResult =
                        driver.entry("cuMipmappedArrayCreate", "cuMipmappedArrayCreate", false)?;
                    f(&mut array, &desc, 1)
                }
            }
            Path::Vmm => {
                let create: unsafe extern "C" fn(
                    *mut CuMemHandle,
                    usize,
                    *const MemAllocationProp,
                    u64,
                ) -> CuResult = driver.entry("cuMemCreate", "cuMemCreate", false)?;
                let reserve: unsafe extern "C" fn(
                    *mut CuDevicePtr,
                    usize,
                    usize,
                    CuDevicePtr,
                    u64,
                ) -> CuResult =
                    driver.entry("cuMemAddressReserve", "cuMemAddressReserve", false)?;
                let map: unsafe extern "C" fn(
                    CuDevicePtr,
                    usize,
                    usize,
                    CuMemHandle,
                    u64,
                ) -> CuResult = driver.entry("cuMemMap", "cuMemMap", false)?;
                let prop = MemAllocationProp {
                    kind: 1, // CU_MEM_ALLOCATION_TYPE_PINNED
                    requested_handle_types: 0,
                    location: MemLocation {
                        kind: abi::MEM_LOCATION_DEVICE,
                        id: device,
                    },
                    win32_handle_meta_data: std::ptr::null_mut(),
                    alloc_flags: [0; 8],
                };
                let mut handle: CuMemHandle = 0;
                let created = create(&mut handle, bytes, &prop, 0);
                if created == abi::SUCCESS {
                    check("cuMemAddressReserve", reserve(&mut address, bytes, 0, 0, 0))?;
                    check("cuMemMap", map(address, bytes, 0, handle, 0))?;
                }
                created
            }
        }
    };
    Ok(result)
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
#[derive(Debug, Default)]
struct NvmlMemoryV2 {
    version: c_uint,
    total: u64,
    reserved: u64,
    free: u64,
    used: u64,
}

/// Prints NVML's memory figures of device `index`.
fn nvml_memory(index: CuDevice) -> Result<(), String> {
    // SAFETY: loading NVML runs its initialisers, as any NVML program does.
    let nvml = unsafe { Library::new("libnvidia-ml.so.1") }
        .map_err(|e| format!("cannot load libnvidia-ml.so.1: {e}"))?;
    let get = |name: &str| -> Result<*mut c_void, String> {
        // SAFETY: looked up by name; cast below to nvml.h's signature.
        unsafe { nvml.get::<*mut c_void>(name.as_bytes()) }
            .map(|s| *s)
            .map_err(|e| format!("{name}: {e}"))
    };
    type Init = unsafe extern "C" fn() -> c_uint;
    type ByIndex = unsafe extern "C" fn(c_uint, *mut Handle) -> c_uint;
    type Memory = unsafe extern "C" fn(Handle, *mut NvmlMemoryV2) -> c_uint;
    // SAFETY: nvml.h's signatures for these names.
    let (init, by_index, memory) = unsafe {
        (
            std::mem::transmute::<*mut c_void, Init>(get("nvmlInit_v2")?),
            std::mem::transmute::<*mut c_void, ByIndex>(get("nvmlDeviceGetHandleByIndex_v2")?),
            std::mem::transmute::<*mut c_void, Memory>(get("nvmlDeviceGetMemoryInfo_v2")?),
        )
    };
    let mut device: Handle = std::ptr::null_mut();
    let mut figures = NvmlMemoryV2 {
        version: (size_of::<NvmlMemoryV2>() | (2 << 24)) as c_uint,
        ..NvmlMemoryV2::default()
    };
    let index = c_uint::try_from(index).map_err(|e| e.to_string())?;
    // SAFETY: valid out-pointers.
    let results = unsafe {
        [
            init(),
            by_index(index, &mut device),
            memory(device, &mut figures),
        ]
    };
    if let Some(failed) = results.iter().find(|r| **r != 0) {
        return Err(format!("NVML failed with error {failed}"));
    }
    println!(
        "total {} used {} free {}",
        figures.total, figures.used, figures.free
    );
    Ok(())
}

fn run(cli: &Cli) -> Result<(), String> {
    if let Command::NvmlMemory = cli.command {
        return nvml_memory(cli.device);
    }
    let driver = Driver::load(cli.via)?;
    open(&driver, cli.device)?;
    match cli.command {
        Command::Alloc { path, mib, count } => {
            for i in 1..=count {
                match allocate(&driver, path, mib, cli.device)? {
                    abi::SUCCESS => println!("allocation {i} of {count}: ok"),
                    error => println!("allocation {i} of {count}: error {error}"),
                }
            }
        }
        Command::Info => {
            let info: unsafe extern "C" fn(*mut usize, *mut usize) -> CuResult =
                driver.entry("cuMemGetInfo", "cuMemGetInfo_v2", false)?;
            let total_mem: unsafe extern "C" fn(*mut usize, CuDevice) -> CuResult =
                driver.entry("cuDeviceTotalMem", "cuDeviceTotalMem_v2", false)?;
            let (mut free, mut total, mut device_total) = (0usize, 0usize, 0usize);
            // SAFETY: cuda.h's signatures; valid out-pointers.
            unsafe {
                check("cuMemGetInfo", info(&mut free, &mut total))?;
                check("cuDeviceTotalMem", total_mem(&mut device_total, cli.device))?;
            }
            println!("free {free} total {total} device_total {device_total}");
        }
        Command::Launches { blocks, seconds } => {
            let launch: runtimekit_cuda_abi::LaunchKernel =
                driver.entry("cuLaunchKernel", "cuLaunchKernel", false)?;
            let started = std::time::Instant::now();
            let deadline = started + Duration::from_secs_f64(seconds);
            // The last second is also counted on its own: a gate settles after a while.
            let last = deadline - Duration::from_secs_f64(seconds.min(1.0));
            let (mut launched, mut in_last) = (0u64, 0u64);
            loop {
                let now = std::time::Instant::now();
                if now >= deadline {
                    break;
                }
                let null = std::ptr::null_mut();
                // SAFETY: cuda.h's signature; the fake driver runs any function.
                check("cuLaunchKernel", unsafe {
                    launch(
                        null,
                        blocks,
                        1,
                        1,
                        1,
                        1,
                        1,
                        0,
                        null,
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                    )
                })?;
                launched += 1;
                if now >= last {
                    in_last += 1;
                }
            }
            println!(
                "launches_per_s {:.1} last_second {in_last}",
                launched as f64 / seconds
            );
        }
        Command::LaunchOverhead { count } => {
            let kernels = kernels::Kernels::load(&driver, cli.device)?;
            let each = kernels.launch_overhead(count)?;
            println!("launch_us {:.3}", each.as_secs_f64() * 1e6);
        }
        Command::Spin {
            iterations,
            seconds,
            warmup,
        } => {
            let kernels = kernels::Kernels::load(&driver, cli.device)?;
            let (done, result) = kernels.spin(iterations, warmup, seconds);
            println!("kernels_per_s {:.2} result {result}", done as f64 / seconds);
        }
        Command::Poison => {
            let kernels = kernels::Kernels::load(&driver, cli.device)?;
            println!("poison result {}", kernels.poison());
        }
        // Answered above: it needs NVML, not the driver.
        Command::NvmlMemory => {}
        Command::Hold { mib, seconds } => {
            let result = allocate(&driver, Path::Alloc, mib, cli.device)?;
            check("cuMemAlloc_v2", result)?;
            println!(
                "holding {mib} MiB on card {} as pid {}",
                cli.device,
                std::process::id()
            );
            std::thread::sleep(Duration::from_secs(seconds));
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("runtimekit-cuda-probe: {error}");
            ExitCode::FAILURE
        }
    }
}
