//! The exported NVML symbols. Each one checks the call's scripted faults first
//! ([`state::enter`]), then answers from the world. Pointers are checked for null; buffers too
//! small get INSUFFICIENT_SIZE with the size needed, as NVML does.
#![allow(non_snake_case, clippy::missing_safety_doc)]

mod events;
mod identity;
mod mig;
mod readings;

use crate::handles::{self, Device};
use crate::state::{self, Changed, Ret};
use crate::world::{Card, World};
use nvml_wrapper_sys::bindings as nv;
use std::os::raw::{c_char, c_uint};

const OK: Ret = nv::nvmlReturn_enum_NVML_SUCCESS;
const INVALID: Ret = nv::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
const NOT_SUPPORTED: Ret = nv::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
const NOT_FOUND: Ret = nv::nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
const INSUFFICIENT_SIZE: Ret = nv::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
const INSUFFICIENT_RESOURCES: Ret = nv::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES;
const IN_USE: Ret = nv::nvmlReturn_enum_NVML_ERROR_IN_USE;
const VERSION_MISMATCH: Ret = nv::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
const MIB: u64 = 1024 * 1024;

fn ret(result: Result<(), Ret>) -> Ret {
    match result {
        Ok(()) => OK,
        Err(code) => code,
    }
}

/// Writes `value` through `ptr`.
unsafe fn put<T>(ptr: *mut T, value: T) -> Result<(), Ret> {
    if ptr.is_null() {
        return Err(INVALID);
    }
    // SAFETY: the caller passed a non-null out-pointer for a `T`.
    unsafe { ptr.write(value) };
    Ok(())
}

/// Copies `text` with its NUL into a caller's buffer of `length` bytes.
unsafe fn put_str(text: &str, buffer: *mut c_char, length: c_uint) -> Result<(), Ret> {
    if buffer.is_null() {
        return Err(INVALID);
    }
    let bytes = text.as_bytes();
    if bytes.len() + 1 > length as usize {
        return Err(INSUFFICIENT_SIZE);
    }
    // SAFETY: the buffer holds `length` bytes, more than the text and its NUL.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), buffer, bytes.len());
        buffer.add(bytes.len()).write(0);
    }
    Ok(())
}

/// Writes `items` into a caller's array whose room is `*count` (none when `array` is null);
/// `*count` becomes the number there is. Too little room is INSUFFICIENT_SIZE.
unsafe fn put_list<T: Copy>(items: &[T], array: *mut T, count: *mut c_uint) -> Result<(), Ret> {
    if count.is_null() {
        return Err(INVALID);
    }
    // SAFETY: `count` is a non-null in/out pointer.
    let room = unsafe { count.read() } as usize;
    let needed = c_uint::try_from(items.len()).map_err(|_| INVALID)?;
    // SAFETY: as above.
    unsafe { count.write(needed) };
    if array.is_null() || room < items.len() {
        return if items.is_empty() {
            Ok(())
        } else {
            Err(INSUFFICIENT_SIZE)
        };
    }
    // SAFETY: the array has room for `room` >= `items.len()` entries.
    unsafe { std::ptr::copy_nonoverlapping(items.as_ptr(), array, items.len()) };
    Ok(())
}

/// A read of device `handle` by `call`: its faults, then `f` on the world, the card and the
/// GPU-instance ID when the handle is a MIG device.
fn query<T>(
    call: &str,
    handle: nv::nvmlDevice_t,
    f: impl FnOnce(&World, &Card, Option<u32>) -> Result<T, Ret>,
) -> Result<T, Ret> {
    let device = handles::device(handle).ok_or(INVALID)?;
    state::enter(call, Some(device.card()), false)?;
    state::read(|w| {
        let card = w.cards.get(device.card() as usize).ok_or(INVALID)?;
        let gi = match device {
            Device::Mig(_, gi) => Some(gi),
            Device::Card(_) => None,
        };
        f(w, card, gi)
    })
}

/// A change to card `index` by `call`: its faults, then `f`; the world is written back when
/// `f` succeeds.
fn change<T>(
    call: &str,
    index: u32,
    f: impl FnOnce(&mut Card) -> Result<T, Ret>,
) -> Result<T, Ret> {
    state::enter(call, Some(index), false)?;
    state::with_world(|w| match w.cards.get_mut(index as usize).ok_or(INVALID) {
        Ok(card) => match f(card) {
            Ok(out) => (Ok(out), Changed::Yes),
            Err(e) => (Err(e), Changed::No),
        },
        Err(e) => (Err(e), Changed::No),
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit_v2() -> Ret {
    state::set_initialized(true);
    ret(state::enter("nvmlInit_v2", None, false))
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlShutdown() -> Ret {
    state::set_initialized(false);
    OK
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) -> Ret {
    ret((|| {
        state::enter("nvmlSystemGetDriverVersion", None, false)?;
        let text = state::read(|w| w.driver_version.clone());
        // SAFETY: the caller's buffer of `length` bytes.
        unsafe { put_str(&text, version, length) }
    })())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetProcessName(
    pid: c_uint,
    name: *mut c_char,
    length: c_uint,
) -> Ret {
    ret((|| {
        state::enter("nvmlSystemGetProcessName", None, false)?;
        let text = state::read(|w| w.process_names.get(&pid).cloned()).ok_or(NOT_FOUND)?;
        // SAFETY: the caller's buffer of `length` bytes.
        unsafe { put_str(&text, name, length) }
    })())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> Ret {
    ret((|| {
        state::enter("nvmlDeviceGetCount_v2", None, false)?;
        let n = state::read(|w| w.cards.len());
        // SAFETY: the caller's out-pointer.
        unsafe { put(count, c_uint::try_from(n).map_err(|_| INVALID)?) }
    })())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nv::nvmlDevice_t,
) -> Ret {
    ret((|| {
        state::enter("nvmlDeviceGetHandleByIndex_v2", Some(index), true)?;
        let n = state::read(|w| w.cards.len());
        if index as usize >= n {
            return Err(INVALID);
        }
        // SAFETY: the caller's out-pointer.
        unsafe { put(device, handles::card(index)) }
    })())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut nv::nvmlDevice_t,
) -> Ret {
    ret((|| {
        if uuid.is_null() {
            return Err(INVALID);
        }
        // SAFETY: the caller passes a NUL-terminated UUID.
        let wanted = unsafe { std::ffi::CStr::from_ptr(uuid) }
            .to_string_lossy()
            .into_owned();
        state::enter("nvmlDeviceGetHandleByUUID", None, true)?;
        let found = state::read(|w| {
            w.cards.iter().enumerate().find_map(|(i, card)| {
                let i = u32::try_from(i).ok()?;
                if card.uuid == wanted {
                    return Some(handles::card(i));
                }
                let gis = &card.mig.as_ref()?.instances;
                let gi = gis
                    .iter()
                    .find(|g| !g.uuid.is_empty() && g.uuid == wanted)?;
                Some(handles::mig(i, gi.id))
            })
        });
        // SAFETY: the caller's out-pointer.
        unsafe { put(device, found.ok_or(NOT_FOUND)?) }
    })())
}
