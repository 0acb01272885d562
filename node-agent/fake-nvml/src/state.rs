//! The library's side of the world file: found beside the library itself, reread when it
//! changed, written back when a call changes the world, and the per-call faults.

use crate::world::World;
use nvml_wrapper_sys::bindings as nv;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

/// The world file's name, in the library's folder.
pub const WORLD_FILE: &str = "fake-nvml.json";

/// An NVML return code.
pub type Ret = nv::nvmlReturn_t;

#[derive(Debug, Default)]
struct Loaded {
    path: Option<PathBuf>,
    /// (inode, size, mtime in ns) of the file as last read or written.
    seen: Option<(u64, u64, i128)>,
    world: World,
    initialized: bool,
}

static STATE: Mutex<Option<Loaded>> = Mutex::new(None);

/// The library's state, created on first use.
fn state() -> std::sync::MutexGuard<'static, Option<Loaded>> {
    let mut guard = match STATE.lock() {
        Ok(s) => s,
        Err(poisoned) => poisoned.into_inner(),
    };
    guard.get_or_insert_with(Loaded::default);
    guard
}

/// The path of this library, from the dynamic linker.
fn own_path() -> Option<PathBuf> {
    let mut info = libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    let anchor = own_path as *const libc::c_void;
    // SAFETY: `info` is a valid out-struct; `anchor` is an address inside this library.
    if unsafe { libc::dladdr(anchor, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr filled `dli_fname` with a NUL-terminated path owned by the linker.
    let name = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
    Some(PathBuf::from(name.to_string_lossy().into_owned()))
}

fn stamp(path: &PathBuf) -> Option<(u64, u64, i128)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((
        meta.ino(),
        meta.size(),
        i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
    ))
}

impl Loaded {
    /// Rereads the world when its file changed since it was last read or written.
    fn refresh(&mut self) {
        if self.path.is_none() {
            self.path = own_path().and_then(|p| Some(p.parent()?.join(WORLD_FILE)));
        }
        let Some(path) = self.path.clone() else {
            return;
        };
        let now = stamp(&path);
        if now.is_some()
            && now != self.seen
            && let Some(world) = std::fs::read(&path)
                .ok()
                .and_then(|b| serde_json::from_slice::<World>(&b).ok())
        {
            self.world = world;
            self.seen = now;
        }
    }

    /// Writes the world back (through a new file, so a reader never sees half of it).
    fn save(&mut self) {
        let Some(path) = self.path.clone() else {
            return;
        };
        let Ok(text) = serde_json::to_vec_pretty(&self.world) else {
            return;
        };
        let temp = path.with_extension(format!("json.{}", std::process::id()));
        if std::fs::write(&temp, text).is_ok() && std::fs::rename(&temp, &path).is_ok() {
            self.seen = stamp(&path);
        }
    }
}

/// Runs `f` on the current world; `Changed::Yes` from it writes the world back.
pub fn with_world<T>(f: impl FnOnce(&mut World) -> (T, Changed)) -> T {
    let mut guard = state();
    let Some(loaded) = guard.as_mut() else {
        return f(&mut World::default()).0;
    };
    loaded.refresh();
    let (out, changed) = f(&mut loaded.world);
    if changed == Changed::Yes {
        loaded.save();
    }
    out
}

/// Reads the current world.
pub fn read<T>(f: impl FnOnce(&World) -> T) -> T {
    with_world(|w| (f(w), Changed::No))
}

/// Whether a call changed the world.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Changed {
    Yes,
    No,
}

/// Marks the library initialised (or not); calls before `nvmlInit` answer UNINITIALIZED.
pub fn set_initialized(on: bool) {
    if let Some(loaded) = state().as_mut() {
        loaded.initialized = on;
    }
}

fn initialized() -> bool {
    state().as_ref().is_some_and(|l| l.initialized)
}

/// NVML's code for an error named without `NVML_ERROR_`.
pub fn error_code(name: &str) -> Ret {
    match name {
        "UNINITIALIZED" => nv::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED,
        "INVALID_ARGUMENT" => nv::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT,
        "NOT_SUPPORTED" => nv::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED,
        "NO_PERMISSION" => nv::nvmlReturn_enum_NVML_ERROR_NO_PERMISSION,
        "NOT_FOUND" => nv::nvmlReturn_enum_NVML_ERROR_NOT_FOUND,
        "INSUFFICIENT_SIZE" => nv::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE,
        "DRIVER_NOT_LOADED" => nv::nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED,
        "TIMEOUT" => nv::nvmlReturn_enum_NVML_ERROR_TIMEOUT,
        "GPU_IS_LOST" => nv::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST,
        "RESET_REQUIRED" => nv::nvmlReturn_enum_NVML_ERROR_RESET_REQUIRED,
        "IN_USE" => nv::nvmlReturn_enum_NVML_ERROR_IN_USE,
        "NO_DATA" => nv::nvmlReturn_enum_NVML_ERROR_NO_DATA,
        "INSUFFICIENT_RESOURCES" => nv::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES,
        _ => nv::nvmlReturn_enum_NVML_ERROR_UNKNOWN,
    }
}

/// The start of every call: UNINITIALIZED before `nvmlInit`, then the scripted faults of
/// `call` on `card` (hangs block without holding the world), then GPU_IS_LOST for a lost card
/// unless `lookup` (a handle lookup, which succeeds on a card fallen off the bus).
pub fn enter(call: &str, card: Option<u32>, lookup: bool) -> Result<(), Ret> {
    if !initialized() {
        return Err(nv::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED);
    }
    let (hang, error, lost) = with_world(|w| {
        let lost = !lookup
            && card
                .and_then(|c| w.cards.get(c as usize))
                .is_some_and(|c| c.lost);
        let found = w.faults.iter().position(|f| {
            f.call == call && (f.card.is_none() || f.card == card) && f.times != Some(0)
        });
        let Some(i) = found else {
            return ((0, None, lost), Changed::No);
        };
        let fault = &mut w.faults[i];
        let out = (fault.hang_ms, fault.error.clone(), lost);
        match fault.times.as_mut() {
            Some(times) => {
                *times -= 1;
                (out, Changed::Yes)
            }
            None => (out, Changed::No),
        }
    });
    if hang > 0 {
        std::thread::sleep(Duration::from_millis(hang));
    }
    match (error, lost) {
        (Some(name), _) => Err(error_code(&name)),
        (None, true) => Err(nv::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST),
        (None, false) => Ok(()),
    }
}
