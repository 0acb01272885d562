//! MIG: mode, GPU-instance profiles and placements, GPU and compute instances (listed,
//! created, destroyed) and MIG device handles. Instances are created with the driver's rules:
//! a placement the profile allows, no overlap, at most the profile's instance count, compute
//! instances within their GPU instance's slices; destroying one that processes use is IN_USE.

use super::{
    IN_USE, INSUFFICIENT_RESOURCES, INVALID, NOT_FOUND, NOT_SUPPORTED, Ret, VERSION_MISMATCH,
    change, put, put_list, query, ret,
};
use crate::handles;

use crate::world::{Card, ComputeInstance, GiProfile, GpuInstance, Mig};
use nvml_wrapper_sys::bindings as nv;
use std::os::raw::{c_char, c_uint};

fn mig(card: &Card) -> Result<&Mig, Ret> {
    card.mig.as_ref().ok_or(NOT_SUPPORTED)
}

/// A GPU-instance profile by `NVML_GPU_INSTANCE_PROFILE_*` index, as the driver answers: MIG
/// off or an index it does not offer is NOT_SUPPORTED, one past its count INVALID_ARGUMENT.
fn profile_by_index(card: &Card, index: c_uint) -> Result<&GiProfile, Ret> {
    let m = mig(card)?;
    if index >= m.profile_count {
        return Err(INVALID);
    }
    if !m.current {
        return Err(NOT_SUPPORTED);
    }
    m.profiles
        .iter()
        .find(|p| p.index == index)
        .ok_or(NOT_SUPPORTED)
}

/// NVML's description of GPU-instance profile `$p` in structure `$kind` (version 1 or 2, which
/// differ only in a version first and a name last), with any extra fields.
macro_rules! profile_info {
    ($kind:ident, $p:expr $(, $field:ident: $value:expr)*) => {
        nv::$kind {
            id: $p.id,
            isP2pSupported: 0,
            sliceCount: $p.slices,
            instanceCount: $p.instance_count,
            multiprocessorCount: $p.multiprocessors,
            copyEngineCount: $p.slices,
            decoderCount: 0,
            encoderCount: 0,
            jpegCount: 0,
            ofaCount: 0,
            memorySizeMB: $p.memory_mb,
            $($field: $value,)*
        }
    };
}

fn profile_by_id(m: &Mig, id: c_uint) -> Result<&GiProfile, Ret> {
    m.profiles.iter().find(|p| p.id == id).ok_or(INVALID)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: nv::nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> Ret {
    ret(query("nvmlDeviceGetMigMode", device, |_, card, _| {
        let m = mig(card)?;
        // SAFETY: the caller's out-pointers.
        unsafe {
            put(current, c_uint::from(m.current))?;
            put(pending, c_uint::from(m.pending))
        }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfo(
    device: nv::nvmlDevice_t,
    index: c_uint,
    info: *mut nv::nvmlGpuInstanceProfileInfo_t,
) -> Ret {
    ret(query(
        "nvmlDeviceGetGpuInstanceProfileInfo",
        device,
        |_, card, _| {
            let p = profile_by_index(card, index)?;
            let value = profile_info!(nvmlGpuInstanceProfileInfo_t, p);
            // SAFETY: the caller's out-pointer.
            unsafe { put(info, value) }
        },
    ))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfoV(
    device: nv::nvmlDevice_t,
    index: c_uint,
    info: *mut nv::nvmlGpuInstanceProfileInfo_v2_t,
) -> Ret {
    ret(query(
        "nvmlDeviceGetGpuInstanceProfileInfoV",
        device,
        |_, card, _| {
            if info.is_null() {
                return Err(INVALID);
            }
            let expected = (size_of::<nv::nvmlGpuInstanceProfileInfo_v2_t>() | (2 << 24)) as c_uint;
            // SAFETY: a non-null, caller-owned structure whose version the caller set.
            if unsafe { (*info).version } != expected {
                return Err(VERSION_MISMATCH);
            }
            let p = profile_by_index(card, index)?;
            let mut name = [0 as c_char; 96];
            for (slot, b) in name.iter_mut().zip(p.name.bytes().take(95)) {
                *slot = b as c_char;
            }
            let value =
                profile_info!(nvmlGpuInstanceProfileInfo_v2_t, p, version: expected, name: name);
            // SAFETY: checked non-null above.
            unsafe { put(info, value) }
        },
    ))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    device: nv::nvmlDevice_t,
    profile_id: c_uint,
    placements: *mut nv::nvmlGpuInstancePlacement_t,
    count: *mut c_uint,
) -> Ret {
    ret(query(
        "nvmlDeviceGetGpuInstancePossiblePlacements_v2",
        device,
        |_, card, _| {
            let m = mig(card)?;
            if !m.current {
                return Err(NOT_SUPPORTED);
            }
            let p = profile_by_id(m, profile_id)?;
            let list: Vec<nv::nvmlGpuInstancePlacement_t> = p
                .starts
                .iter()
                .map(|&start| nv::nvmlGpuInstancePlacement_t {
                    start,
                    size: p.memory_slices,
                })
                .collect();
            // SAFETY: the caller's array of `*count` entries (or none).
            unsafe { put_list(&list, placements, count) }
        },
    ))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstances(
    device: nv::nvmlDevice_t,
    profile_id: c_uint,
    instances: *mut nv::nvmlGpuInstance_t,
    count: *mut c_uint,
) -> Ret {
    ret(query("nvmlDeviceGetGpuInstances", device, |_, card, _| {
        let m = mig(card)?;
        if !m.current {
            return Err(NOT_SUPPORTED);
        }
        let p = profile_by_id(m, profile_id)?;
        let index = handles::device(device).ok_or(INVALID)?.card();
        let list: Vec<nv::nvmlGpuInstance_t> = m
            .instances
            .iter()
            .filter(|g| g.profile_id == p.id)
            .map(|g| handles::gpu_instance(index, g.id))
            .collect();
        if instances.is_null() || count.is_null() {
            return Err(INVALID);
        }
        // The caller's array has room for the profile's instance count.
        // SAFETY: as above.
        unsafe {
            count.write(p.instance_count);
            put_list(&list, instances, count)
        }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceById(
    device: nv::nvmlDevice_t,
    id: c_uint,
    instance: *mut nv::nvmlGpuInstance_t,
) -> Ret {
    ret(query(
        "nvmlDeviceGetGpuInstanceById",
        device,
        |_, card, _| {
            let m = mig(card)?;
            if !m.current {
                return Err(NOT_SUPPORTED);
            }
            m.instances.iter().find(|g| g.id == id).ok_or(NOT_FOUND)?;
            let index = handles::device(device).ok_or(INVALID)?.card();
            // SAFETY: the caller's out-pointer.
            unsafe { put(instance, handles::gpu_instance(index, id)) }
        },
    ))
}

/// A read of GPU instance `handle` by `call`.
fn gi_query<T>(
    call: &str,
    handle: nv::nvmlGpuInstance_t,
    f: impl FnOnce(&Mig, &GpuInstance) -> Result<T, Ret>,
) -> Result<T, Ret> {
    let (card, id) = handles::gpu_instance_of(handle).ok_or(INVALID)?;
    query(call, handles::card(card), |_, c, _| {
        let m = mig(c)?;
        let gi = m.instances.iter().find(|g| g.id == id).ok_or(INVALID)?;
        f(m, gi)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetInfo(
    instance: nv::nvmlGpuInstance_t,
    info: *mut nv::nvmlGpuInstanceInfo_t,
) -> Ret {
    ret(gi_query("nvmlGpuInstanceGetInfo", instance, |_, gi| {
        let (card, _) = handles::gpu_instance_of(instance).ok_or(INVALID)?;
        let value = nv::nvmlGpuInstanceInfo_t {
            device: handles::card(card),
            id: gi.id,
            profileId: gi.profile_id,
            placement: nv::nvmlGpuInstancePlacement_t {
                start: gi.start,
                size: gi.size,
            },
        };
        // SAFETY: the caller's out-pointer.
        unsafe { put(info, value) }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceCreateGpuInstanceWithPlacement(
    device: nv::nvmlDevice_t,
    profile_id: c_uint,
    placement: *const nv::nvmlGpuInstancePlacement_t,
    instance: *mut nv::nvmlGpuInstance_t,
) -> Ret {
    ret((|| {
        if placement.is_null() || instance.is_null() {
            return Err(INVALID);
        }
        // SAFETY: a non-null placement the caller owns.
        let place = unsafe { placement.read() };
        let index = handles::device(device).ok_or(INVALID)?.card();
        let id = change("nvmlDeviceCreateGpuInstanceWithPlacement", index, |card| {
            let m = card.mig.as_mut().ok_or(NOT_SUPPORTED)?;
            if !m.current {
                return Err(NOT_SUPPORTED);
            }
            let p = profile_by_id(m, profile_id)?.clone();
            if place.size != p.memory_slices || !p.starts.contains(&place.start) {
                return Err(INVALID);
            }
            let overlaps = m
                .instances
                .iter()
                .any(|g| place.start < g.start + g.size && g.start < place.start + place.size);
            let of_profile = m.instances.iter().filter(|g| g.profile_id == p.id).count();
            if overlaps || of_profile >= p.instance_count as usize {
                return Err(INSUFFICIENT_RESOURCES);
            }
            let id = (1..)
                .find(|i| m.instances.iter().all(|g| g.id != *i))
                .ok_or(INVALID)?;
            m.instances.push(GpuInstance {
                id,
                profile_id: p.id,
                start: place.start,
                size: place.size,
                uuid: format!("MIG-{index:08x}-0000-5000-8000-{id:012x}"),
                memory_used_mib: 0,
                compute_instances: Vec::new(),
            });
            Ok(id)
        })?;
        // SAFETY: checked non-null above.
        unsafe { put(instance, handles::gpu_instance(index, id)) }
    })())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfo(
    instance: nv::nvmlGpuInstance_t,
    index: c_uint,
    _engines: c_uint,
    info: *mut nv::nvmlComputeInstanceProfileInfo_t,
) -> Ret {
    ret(gi_query(
        "nvmlGpuInstanceGetComputeInstanceProfileInfo",
        instance,
        |m, gi| {
            if index >= m.compute_profile_count {
                return Err(INVALID);
            }
            let p = profile_by_id(m, gi.profile_id)?;
            let c = p
                .compute_profiles
                .iter()
                .find(|c| c.index == index)
                .ok_or(NOT_SUPPORTED)?;
            let value = nv::nvmlComputeInstanceProfileInfo_t {
                id: c.id,
                sliceCount: c.slices,
                instanceCount: p.slices / c.slices.max(1),
                multiprocessorCount: p.multiprocessors * c.slices / p.slices.max(1),
                sharedCopyEngineCount: p.slices,
                sharedDecoderCount: 0,
                sharedEncoderCount: 0,
                sharedJpegCount: 0,
                sharedOfaCount: 0,
            };
            // SAFETY: the caller's out-pointer.
            unsafe { put(info, value) }
        },
    ))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceCreateComputeInstance(
    instance: nv::nvmlGpuInstance_t,
    profile_id: c_uint,
    created: *mut nv::nvmlComputeInstance_t,
) -> Ret {
    ret((|| {
        let (index, gi_id) = handles::gpu_instance_of(instance).ok_or(INVALID)?;
        let ci = change("nvmlGpuInstanceCreateComputeInstance", index, |card| {
            let m = card.mig.as_mut().ok_or(NOT_SUPPORTED)?;
            let profiles = m.profiles.clone();
            let gi = m
                .instances
                .iter_mut()
                .find(|g| g.id == gi_id)
                .ok_or(INVALID)?;
            let p = profiles
                .iter()
                .find(|p| p.id == gi.profile_id)
                .ok_or(INVALID)?;
            let slices_of = |id: u32| {
                p.compute_profiles
                    .iter()
                    .find(|c| c.id == id)
                    .map_or(0, |c| c.slices)
            };
            let wanted = p
                .compute_profiles
                .iter()
                .find(|c| c.id == profile_id)
                .ok_or(INVALID)?;
            let used: u32 = gi
                .compute_instances
                .iter()
                .map(|c| slices_of(c.profile_id))
                .sum();
            if used + wanted.slices > p.slices {
                return Err(INSUFFICIENT_RESOURCES);
            }
            let id = (0..)
                .find(|i| gi.compute_instances.iter().all(|c| c.id != *i))
                .ok_or(INVALID)?;
            gi.compute_instances
                .push(ComputeInstance { id, profile_id });
            Ok(id)
        })?;
        // SAFETY: the caller's out-pointer.
        unsafe { put(created, handles::compute_instance(index, gi_id, ci)) }
    })())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstances(
    instance: nv::nvmlGpuInstance_t,
    profile_id: c_uint,
    instances: *mut nv::nvmlComputeInstance_t,
    count: *mut c_uint,
) -> Ret {
    ret(gi_query(
        "nvmlGpuInstanceGetComputeInstances",
        instance,
        |_, gi| {
            let (card, _) = handles::gpu_instance_of(instance).ok_or(INVALID)?;
            let list: Vec<nv::nvmlComputeInstance_t> = gi
                .compute_instances
                .iter()
                .filter(|c| c.profile_id == profile_id)
                .map(|c| handles::compute_instance(card, gi.id, c.id))
                .collect();
            if count.is_null() {
                return Err(INVALID);
            }
            // The caller's array has room for the profile's instance count (at most 8).
            // SAFETY: as above.
            unsafe {
                count.write(8);
                put_list(&list, instances, count)
            }
        },
    ))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlComputeInstanceGetInfo_v2(
    instance: nv::nvmlComputeInstance_t,
    info: *mut nv::nvmlComputeInstanceInfo_t,
) -> Ret {
    ret((|| {
        let (card, gi_id, ci_id) = handles::compute_instance_of(instance).ok_or(INVALID)?;
        let gi = handles::gpu_instance(card, gi_id);
        let value = gi_query("nvmlComputeInstanceGetInfo_v2", gi, |_, g| {
            let ci = g
                .compute_instances
                .iter()
                .find(|c| c.id == ci_id)
                .ok_or(INVALID)?;
            Ok(nv::nvmlComputeInstanceInfo_t {
                device: handles::card(card),
                gpuInstance: gi,
                id: ci.id,
                profileId: ci.profile_id,
                placement: nv::nvmlComputeInstancePlacement_t { start: 0, size: 0 },
            })
        })?;
        // SAFETY: the caller's out-pointer.
        unsafe { put(info, value) }
    })())
}

/// Whether a process runs in GPU instance `gi` (and compute instance `ci`, when given).
fn in_use(card: &Card, gi: u32, ci: Option<u32>) -> bool {
    card.processes
        .iter()
        .any(|p| p.gpu_instance_id == Some(gi) && (ci.is_none() || p.compute_instance_id == ci))
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlComputeInstanceDestroy(instance: nv::nvmlComputeInstance_t) -> Ret {
    ret((|| {
        let (index, gi_id, ci_id) = handles::compute_instance_of(instance).ok_or(INVALID)?;
        change("nvmlComputeInstanceDestroy", index, |card| {
            if in_use(card, gi_id, Some(ci_id)) {
                return Err(IN_USE);
            }
            let m = card.mig.as_mut().ok_or(NOT_SUPPORTED)?;
            let gi = m
                .instances
                .iter_mut()
                .find(|g| g.id == gi_id)
                .ok_or(INVALID)?;
            let before = gi.compute_instances.len();
            gi.compute_instances.retain(|c| c.id != ci_id);
            if gi.compute_instances.len() == before {
                return Err(INVALID);
            }
            Ok(())
        })
    })())
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlGpuInstanceDestroy(instance: nv::nvmlGpuInstance_t) -> Ret {
    ret((|| {
        let (index, gi_id) = handles::gpu_instance_of(instance).ok_or(INVALID)?;
        change("nvmlGpuInstanceDestroy", index, |card| {
            if in_use(card, gi_id, None) {
                return Err(IN_USE);
            }
            let m = card.mig.as_mut().ok_or(NOT_SUPPORTED)?;
            let gi = m.instances.iter().find(|g| g.id == gi_id).ok_or(INVALID)?;
            if !gi.compute_instances.is_empty() {
                return Err(IN_USE);
            }
            m.instances.retain(|g| g.id != gi_id);
            Ok(())
        })
    })())
}

/// The MIG devices of a card: GPU instances with a compute instance, by ID.
fn mig_devices(card: &Card) -> Vec<u32> {
    let mut ids: Vec<u32> = card
        .mig
        .iter()
        .flat_map(|m| &m.instances)
        .filter(|g| !g.compute_instances.is_empty())
        .map(|g| g.id)
        .collect();
    ids.sort_unstable();
    ids
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: nv::nvmlDevice_t,
    count: *mut c_uint,
) -> Ret {
    ret(query(
        "nvmlDeviceGetMaxMigDeviceCount",
        device,
        |_, card, _| {
            let m = mig(card)?;
            let most = m
                .profiles
                .iter()
                .map(|p| p.instance_count)
                .max()
                .unwrap_or(0);
            // SAFETY: the caller's out-pointer.
            unsafe { put(count, most) }
        },
    ))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: nv::nvmlDevice_t,
    index: c_uint,
    handle: *mut nv::nvmlDevice_t,
) -> Ret {
    ret(query(
        "nvmlDeviceGetMigDeviceHandleByIndex",
        device,
        |_, card, _| {
            let gi = *mig_devices(card).get(index as usize).ok_or(NOT_FOUND)?;
            let c = handles::device(device).ok_or(INVALID)?.card();
            // SAFETY: the caller's out-pointer.
            unsafe { put(handle, handles::mig(c, gi)) }
        },
    ))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(
    device: nv::nvmlDevice_t,
    id: *mut c_uint,
) -> Ret {
    ret(query("nvmlDeviceGetGpuInstanceId", device, |_, _, gi| {
        let gi = gi.ok_or(NOT_SUPPORTED)?;
        // SAFETY: the caller's out-pointer.
        unsafe { put(id, gi) }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(
    device: nv::nvmlDevice_t,
    id: *mut c_uint,
) -> Ret {
    ret(query(
        "nvmlDeviceGetComputeInstanceId",
        device,
        |_, card, gi| {
            let gi = gi.ok_or(NOT_SUPPORTED)?;
            let ci = card
                .mig
                .iter()
                .flat_map(|m| &m.instances)
                .find(|g| g.id == gi)
                .and_then(|g| g.compute_instances.first())
                .ok_or(NOT_FOUND)?;
            // SAFETY: the caller's out-pointer.
            unsafe { put(id, ci.id) }
        },
    ))
}
