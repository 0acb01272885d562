//! The raw NVML calls that nvml-wrapper 0.13 does not wrap, or wraps wrongly:
//!
//! - GPU-instance placements (`Device::possible_placements` never sets the length of its
//!   vector and always returns nothing), creation at a placement, listing, destruction;
//! - compute instances: profile, creation, listing, destruction;
//! - the GPU-instance ID of a MIG device handle;
//! - remapped rows;
//! - the far-end type of an NVLink (`NvLink::remote_device_type` writes into a temporary and
//!   always answers `Unknown`);
//! - the driver's name of a GPU-instance profile;
//! - field values with their scope (nvml-wrapper sets every scope to 0: link 0 only);
//! - waiting for an event with the GPU and compute instance it names.
//!
//! Every call goes through the function table nvml-wrapper loaded (`Nvml::lib()`), so a symbol
//! missing from an old driver is an error, not a crash. Handles of GPU and compute instances
//! never leave this module: callers name instances by their IDs.
#![allow(unsafe_code)]

use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper::event::EventSet;
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings as nv;
use nvml_wrapper_sys::bindings::{
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, nvmlComputeInstance_t, nvmlComputeInstanceInfo_t,
    nvmlComputeInstancePlacement_t, nvmlComputeInstanceProfileInfo_t, nvmlDevice_t,
    nvmlEventData_t, nvmlFieldValue_t, nvmlGpuInstance_t, nvmlGpuInstanceInfo_t,
    nvmlGpuInstancePlacement_t, nvmlGpuInstanceProfileInfo_v2_t,
    nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED, nvmlReturn_enum_NVML_SUCCESS, nvmlValue_t,
};
use std::ptr;

/// A placement of a GPU instance: first memory slice and number of slices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GiPlacement {
    pub start: u32,
    pub size: u32,
}

/// A GPU instance as NVML describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GiInfo {
    pub id: u32,
    /// `ProfileInfo.id` of its profile.
    pub profile_id: u32,
    pub placement: GiPlacement,
}

/// Remapped rows of a card.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemappedRows {
    pub correctable: u32,
    pub uncorrectable: u32,
    pub pending: bool,
    pub failure: bool,
}

fn handle(device: &Device<'_>) -> nvmlDevice_t {
    // SAFETY: the raw handle is used only inside the functions of this module, while `device`
    // and the `Nvml` it borrows are alive; it is never stored.
    unsafe { device.handle() }
}

fn empty_gi_info() -> nvmlGpuInstanceInfo_t {
    nvmlGpuInstanceInfo_t {
        device: ptr::null_mut(),
        id: 0,
        profileId: 0,
        placement: nvmlGpuInstancePlacement_t { start: 0, size: 0 },
    }
}

fn empty_ci_profile() -> nvmlComputeInstanceProfileInfo_t {
    nvmlComputeInstanceProfileInfo_t {
        id: 0,
        sliceCount: 0,
        instanceCount: 0,
        multiprocessorCount: 0,
        sharedCopyEngineCount: 0,
        sharedDecoderCount: 0,
        sharedEncoderCount: 0,
        sharedJpegCount: 0,
        sharedOfaCount: 0,
    }
}

/// The placements a GPU-instance profile (`profile_id` = `ProfileInfo.id`) may use on the card.
pub fn possible_placements(
    nvml: &Nvml,
    device: &Device<'_>,
    profile_id: u32,
) -> Result<Vec<GiPlacement>, NvmlError> {
    let sym = nvml_sym(
        nvml.lib()
            .nvmlDeviceGetGpuInstancePossiblePlacements_v2
            .as_ref(),
    )?;
    let dev = handle(device);
    let mut count: u32 = 0;
    // SAFETY: a null array asks NVML only for the number of placements, written to `count`.
    unsafe { nvml_try(sym(dev, profile_id, ptr::null_mut(), &mut count))? };
    let mut placements = vec![nvmlGpuInstancePlacement_t { start: 0, size: 0 }; count as usize];
    // SAFETY: `placements` has room for `count` entries; NVML writes at most that many and
    // stores the number written in `count`.
    unsafe { nvml_try(sym(dev, profile_id, placements.as_mut_ptr(), &mut count))? };
    placements.truncate(count as usize);
    Ok(placements
        .into_iter()
        .map(|p| GiPlacement {
            start: p.start,
            size: p.size,
        })
        .collect())
}

fn gi_info(nvml: &Nvml, gi: nvmlGpuInstance_t) -> Result<GiInfo, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlGpuInstanceGetInfo.as_ref())?;
    let mut info = empty_gi_info();
    // SAFETY: `gi` is a GPU-instance handle NVML just returned; `info` is a valid out-pointer.
    unsafe { nvml_try(sym(gi, &mut info))? };
    Ok(GiInfo {
        id: info.id,
        profile_id: info.profileId,
        placement: GiPlacement {
            start: info.placement.start,
            size: info.placement.size,
        },
    })
}

fn gi_by_id(nvml: &Nvml, device: &Device<'_>, id: u32) -> Result<nvmlGpuInstance_t, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetGpuInstanceById.as_ref())?;
    let mut gi: nvmlGpuInstance_t = ptr::null_mut();
    // SAFETY: `gi` is a valid out-pointer; NVML fills it with a handle owned by the driver.
    unsafe { nvml_try(sym(handle(device), id, &mut gi))? };
    Ok(gi)
}

/// The GPU instances of a profile on the card; `max` is the profile's instance count.
pub fn gpu_instances(
    nvml: &Nvml,
    device: &Device<'_>,
    profile_id: u32,
    max: u32,
) -> Result<Vec<GiInfo>, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetGpuInstances.as_ref())?;
    let mut handles: Vec<nvmlGpuInstance_t> = vec![ptr::null_mut(); max.max(1) as usize];
    let mut count: u32 = 0;
    // SAFETY: `handles` has room for the profile's maximum instance count, which is the most
    // NVML writes; it stores the number written in `count`.
    unsafe {
        nvml_try(sym(
            handle(device),
            profile_id,
            handles.as_mut_ptr(),
            &mut count,
        ))?
    };
    handles.truncate(count as usize);
    handles.into_iter().map(|gi| gi_info(nvml, gi)).collect()
}

/// Creates a GPU instance of a profile at a placement.
pub fn create_gpu_instance(
    nvml: &Nvml,
    device: &Device<'_>,
    profile_id: u32,
    placement: GiPlacement,
) -> Result<GiInfo, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlDeviceCreateGpuInstanceWithPlacement.as_ref())?;
    let place = nvmlGpuInstancePlacement_t {
        start: placement.start,
        size: placement.size,
    };
    let mut gi: nvmlGpuInstance_t = ptr::null_mut();
    // SAFETY: `place` lives across the call; `gi` is a valid out-pointer.
    unsafe { nvml_try(sym(handle(device), profile_id, &place, &mut gi))? };
    gi_info(nvml, gi)
}

/// The ID of a compute-instance profile (`NVML_COMPUTE_INSTANCE_PROFILE_*` index) in a GPU
/// instance, with shared engines.
fn ci_profile_id(nvml: &Nvml, gi: nvmlGpuInstance_t, index: u32) -> Result<u32, NvmlError> {
    let sym = nvml_sym(
        nvml.lib()
            .nvmlGpuInstanceGetComputeInstanceProfileInfo
            .as_ref(),
    )?;
    let mut info = empty_ci_profile();
    // SAFETY: `gi` is a live GPU-instance handle; `info` is a valid out-pointer.
    unsafe {
        nvml_try(sym(
            gi,
            index,
            NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
            &mut info,
        ))?
    };
    Ok(info.id)
}

fn ci_id(nvml: &Nvml, ci: nvmlComputeInstance_t) -> Result<u32, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlComputeInstanceGetInfo_v2.as_ref())?;
    let mut info = nvmlComputeInstanceInfo_t {
        device: ptr::null_mut(),
        gpuInstance: ptr::null_mut(),
        id: 0,
        profileId: 0,
        placement: nvmlComputeInstancePlacement_t { start: 0, size: 0 },
    };
    // SAFETY: `ci` is a compute-instance handle NVML just returned; `info` is a valid
    // out-pointer.
    unsafe { nvml_try(sym(ci, &mut info))? };
    Ok(info.id)
}

/// Creates the compute instance of profile `ci_profile_index` in the GPU instance `gi_id` and
/// returns its ID.
pub fn create_compute_instance(
    nvml: &Nvml,
    device: &Device<'_>,
    gi_id: u32,
    ci_profile_index: u32,
) -> Result<u32, NvmlError> {
    let gi = gi_by_id(nvml, device, gi_id)?;
    let profile_id = ci_profile_id(nvml, gi, ci_profile_index)?;
    let sym = nvml_sym(nvml.lib().nvmlGpuInstanceCreateComputeInstance.as_ref())?;
    let mut ci: nvmlComputeInstance_t = ptr::null_mut();
    // SAFETY: `gi` is a live GPU-instance handle; `ci` is a valid out-pointer.
    unsafe { nvml_try(sym(gi, profile_id, &mut ci))? };
    ci_id(nvml, ci)
}

/// Compute-instance profile indexes asked before giving up on a driver that never answers
/// INVALID_ARGUMENT.
const MAX_CI_PROFILE_INDEXES: u32 = 32;

/// The compute instances of a GPU instance, as (ID, handle), over every CI profile the driver
/// has: indexes until INVALID_ARGUMENT (newer drivers have profiles past nvml-wrapper's
/// constants), skipping those that do not fit this GPU instance (NOT_SUPPORTED).
fn compute_instances(
    nvml: &Nvml,
    gi: nvmlGpuInstance_t,
) -> Result<Vec<(u32, nvmlComputeInstance_t)>, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlGpuInstanceGetComputeInstances.as_ref())?;
    let mut out = Vec::new();
    for index in 0..MAX_CI_PROFILE_INDEXES {
        let profile_id = match ci_profile_id(nvml, gi, index) {
            Ok(id) => id,
            Err(NvmlError::NotSupported) => continue,
            Err(NvmlError::InvalidArg) => break,
            Err(e) => return Err(e),
        };
        // A GPU instance has at most 8 compute slices, so at most 8 compute instances.
        let mut handles: Vec<nvmlComputeInstance_t> = vec![ptr::null_mut(); 8];
        let mut count: u32 = 0;
        // SAFETY: `handles` has room for 8 entries, the most a GPU instance holds; NVML stores
        // the number written in `count`.
        unsafe { nvml_try(sym(gi, profile_id, handles.as_mut_ptr(), &mut count))? };
        handles.truncate(count as usize);
        for ci in handles {
            out.push((ci_id(nvml, ci)?, ci));
        }
    }
    Ok(out)
}

/// The IDs of the compute instances of GPU instance `gi_id`.
pub fn compute_instance_ids(
    nvml: &Nvml,
    device: &Device<'_>,
    gi_id: u32,
) -> Result<Vec<u32>, NvmlError> {
    let gi = gi_by_id(nvml, device, gi_id)?;
    Ok(compute_instances(nvml, gi)?
        .into_iter()
        .map(|(id, _)| id)
        .collect())
}

/// Destroys GPU instance `gi_id` and its compute instances (these first). Returns false when
/// there was no such GPU instance.
pub fn destroy_gpu_instance(
    nvml: &Nvml,
    device: &Device<'_>,
    gi_id: u32,
) -> Result<bool, NvmlError> {
    let gi = match gi_by_id(nvml, device, gi_id) {
        Ok(gi) => gi,
        Err(NvmlError::NotFound | NvmlError::InvalidArg) => return Ok(false),
        Err(e) => return Err(e),
    };
    let destroy_ci = nvml_sym(nvml.lib().nvmlComputeInstanceDestroy.as_ref())?;
    for (_, ci) in compute_instances(nvml, gi)? {
        // SAFETY: `ci` is a live compute-instance handle of this GPU instance.
        unsafe { nvml_try(destroy_ci(ci))? };
    }
    let destroy_gi = nvml_sym(nvml.lib().nvmlGpuInstanceDestroy.as_ref())?;
    // SAFETY: `gi` is a live GPU-instance handle with no compute instance left.
    unsafe { nvml_try(destroy_gi(gi))? };
    Ok(true)
}

/// An NVML event as the driver gives it (nvml-wrapper drops the instance IDs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawEvent {
    /// The device handle the event names, as an address (compared, never dereferenced).
    pub device: usize,
    /// NVML's event type bits.
    pub kind: u64,
    /// The XID, for XID events.
    pub data: u64,
    /// The GPU and compute instance the driver names, when it names one.
    pub gpu_instance: Option<u32>,
    pub compute_instance: Option<u32>,
}

/// Waits up to `timeout_ms` for the next event of `set`.
pub fn wait_event(nvml: &Nvml, set: &EventSet<'_>, timeout_ms: u32) -> Result<RawEvent, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlEventSetWait_v2.as_ref())?;
    let mut data = nvmlEventData_t {
        device: ptr::null_mut(),
        eventType: 0,
        eventData: 0,
        gpuInstanceId: u32::MAX,
        computeInstanceId: u32::MAX,
    };
    // SAFETY: the set's handle lives as long as `set`; `data` is a valid out-struct.
    unsafe { nvml_try(sym(set.handle(), &mut data, timeout_ms))? };
    let id = |v: u32| (v != u32::MAX).then_some(v);
    Ok(RawEvent {
        device: data.device as usize,
        kind: data.eventType,
        data: data.eventData,
        gpu_instance: id(data.gpuInstanceId),
        compute_instance: id(data.computeInstanceId),
    })
}

/// Whether `device` is the device an event names.
pub fn same_device(device: &Device<'_>, event_device: usize) -> bool {
    handle(device) as usize == event_device
}

/// The UUID of the device an event names.
pub fn device_uuid(nvml: &Nvml, event_device: usize) -> Result<String, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetUUID.as_ref())?;
    let mut buffer = [0 as std::os::raw::c_char; 96];
    let length = u32::try_from(buffer.len()).map_err(|_| NvmlError::InvalidArg)?;
    // SAFETY: the handle is one NVML gave in an event; `buffer` has `length` bytes.
    unsafe {
        nvml_try(sym(
            event_device as nvmlDevice_t,
            buffer.as_mut_ptr(),
            length,
        ))?
    };
    Ok(c_name(&buffer))
}

/// Field values with their scopes (a link, or `u32::MAX` for all links): nvml-wrapper's call
/// sets every scope to 0, which reads link 0 only. Each answer is the value, or `None` when the
/// driver refused that field (or it is negative or not a number).
pub fn field_values(
    nvml: &Nvml,
    device: &Device<'_>,
    fields: &[(u32, u32)],
) -> Result<Vec<Option<u64>>, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetFieldValues.as_ref())?;
    let mut values: Vec<nvmlFieldValue_t> = fields
        .iter()
        .map(|&(field, scope)| nvmlFieldValue_t {
            fieldId: field,
            scopeId: scope,
            timestamp: 0,
            latencyUsec: 0,
            valueType: 0,
            nvmlReturn: nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED,
            value: nvmlValue_t { ullVal: 0 },
        })
        .collect();
    let count = i32::try_from(values.len()).map_err(|_| NvmlError::InvalidArg)?;
    // SAFETY: `values` holds `count` entries, each with its field and scope set.
    unsafe { nvml_try(sym(handle(device), count, values.as_mut_ptr()))? };
    Ok(values.iter().map(field_u64).collect())
}

/// A field value as a count, by its type.
fn field_u64(value: &nvmlFieldValue_t) -> Option<u64> {
    if value.nvmlReturn != nvmlReturn_enum_NVML_SUCCESS {
        return None;
    }
    // SAFETY: `valueType` says which member of the union the driver wrote.
    unsafe {
        match value.valueType {
            nv::nvmlValueType_enum_NVML_VALUE_TYPE_DOUBLE => {
                let v = value.value.dVal;
                (v >= 0.0 && v.is_finite()).then_some(v as u64)
            }
            nv::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT => {
                Some(u64::from(value.value.uiVal))
            }
            // `unsigned long` is 32 bits on some targets.
            #[allow(clippy::unnecessary_cast)]
            nv::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG => Some(value.value.ulVal as u64),
            nv::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG => Some(value.value.ullVal),
            nv::nvmlValueType_enum_NVML_VALUE_TYPE_SIGNED_LONG_LONG => {
                u64::try_from(value.value.sllVal).ok()
            }
            nv::nvmlValueType_enum_NVML_VALUE_TYPE_SIGNED_INT => {
                u64::try_from(value.value.siVal).ok()
            }
            nv::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_SHORT => {
                Some(u64::from(value.value.usVal))
            }
            _ => None,
        }
    }
}

/// A GPM sample buffer the driver allocated, named by its address. It outlives any one call
/// (the backend keeps each card's last sample), so it is freed explicitly with [`gpm_free`].
#[derive(Debug, PartialEq, Eq)]
pub struct GpmBuffer(usize);

/// Allocates a GPM sample buffer.
pub fn gpm_alloc(nvml: &Nvml) -> Result<GpmBuffer, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlGpmSampleAlloc.as_ref())?;
    let mut sample: nv::nvmlGpmSample_t = ptr::null_mut();
    // SAFETY: `sample` is a valid out-pointer.
    unsafe { nvml_try(sym(&mut sample))? };
    Ok(GpmBuffer(sample as usize))
}

/// Frees a GPM sample buffer.
pub fn gpm_free(nvml: &Nvml, buffer: GpmBuffer) {
    if let Ok(sym) = nvml_sym(nvml.lib().nvmlGpmSampleFree.as_ref()) {
        // SAFETY: the buffer came from `gpm_alloc` and is freed once (it is consumed).
        let _ = unsafe { sym(buffer.0 as nv::nvmlGpmSample_t) };
    }
}

/// Takes a GPM sample of the card into `buffer`.
pub fn gpm_take(nvml: &Nvml, device: &Device<'_>, buffer: &GpmBuffer) -> Result<(), NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlGpmSampleGet.as_ref())?;
    // SAFETY: the buffer is live (from `gpm_alloc`, not yet freed).
    unsafe { nvml_try(sym(handle(device), buffer.0 as nv::nvmlGpmSample_t)) }
}

/// GPM metrics `ids` over the time between two samples of one card; each is `None` when the
/// driver refused it.
pub fn gpm_metrics(
    nvml: &Nvml,
    first: &GpmBuffer,
    second: &GpmBuffer,
    ids: &[u32],
) -> Result<Vec<Option<f64>>, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlGpmMetricsGet.as_ref())?;
    let empty = nv::nvmlGpmMetric_t {
        metricId: 0,
        nvmlReturn: nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED,
        value: 0.0,
        metricInfo: nv::nvmlGpmMetric_t__bindgen_ty_1 {
            shortName: ptr::null_mut(),
            longName: ptr::null_mut(),
            unit: ptr::null_mut(),
        },
    };
    let mut get = Box::new(nv::nvmlGpmMetricsGet_t {
        version: nv::NVML_GPM_METRICS_GET_VERSION,
        numMetrics: u32::try_from(ids.len()).map_err(|_| NvmlError::InvalidArg)?,
        sample1: first.0 as nv::nvmlGpmSample_t,
        sample2: second.0 as nv::nvmlGpmSample_t,
        metrics: [empty; 210],
    });
    if ids.len() > get.metrics.len() {
        return Err(NvmlError::InvalidArg);
    }
    for (slot, &id) in get.metrics.iter_mut().zip(ids) {
        slot.metricId = id;
    }
    // SAFETY: `get` is a valid, versioned structure naming two live samples.
    unsafe { nvml_try(sym(&mut *get))? };
    Ok(get
        .metrics
        .iter()
        .take(ids.len())
        .map(|m| (m.nvmlReturn == nvmlReturn_enum_NVML_SUCCESS).then_some(m.value))
        .collect())
}

/// The GPU-instance ID of a MIG device handle.
pub fn gpu_instance_id(nvml: &Nvml, mig_device: &Device<'_>) -> Result<u32, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetGpuInstanceId.as_ref())?;
    let mut id: u32 = 0;
    // SAFETY: `id` is a valid out-pointer.
    unsafe { nvml_try(sym(handle(mig_device), &mut id))? };
    Ok(id)
}

/// Remapped rows of the card (Ampere and newer).
pub fn remapped_rows(nvml: &Nvml, device: &Device<'_>) -> Result<RemappedRows, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetRemappedRows.as_ref())?;
    let (mut correctable, mut uncorrectable, mut pending, mut failure) = (0u32, 0u32, 0u32, 0u32);
    // SAFETY: the four out-pointers are valid for the duration of the call.
    unsafe {
        nvml_try(sym(
            handle(device),
            &mut correctable,
            &mut uncorrectable,
            &mut pending,
            &mut failure,
        ))?
    };
    Ok(RemappedRows {
        correctable,
        uncorrectable,
        pending: pending != 0,
        failure: failure != 0,
    })
}

/// The raw far-end type of an NVLink (`nvmlIntNvLinkDeviceType_t`: 0 GPU, 1 IBM NPU,
/// 2 switch, 255 unknown).
pub fn nvlink_remote_type(nvml: &Nvml, device: &Device<'_>, link: u32) -> Result<u32, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetNvLinkRemoteDeviceType.as_ref())?;
    let mut kind: u32 = 255;
    // SAFETY: `kind` is a valid out-pointer of the enum's C type (unsigned int).
    unsafe { nvml_try(sym(handle(device), link, &mut kind))? };
    Ok(kind)
}

/// The driver's name of a GPU-instance profile (`NVML_GPU_INSTANCE_PROFILE_*` index), for
/// example `3g.40gb`.
pub fn gi_profile_name(
    nvml: &Nvml,
    device: &Device<'_>,
    profile_index: u32,
) -> Result<String, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetGpuInstanceProfileInfoV.as_ref())?;
    // NVML_STRUCT_VERSION(GpuInstanceProfileInfo, 2): the struct size with the version in the
    // top byte.
    let size = u32::try_from(size_of::<nvmlGpuInstanceProfileInfo_v2_t>())
        .map_err(|_| NvmlError::InvalidArg)?;
    let mut info = nvmlGpuInstanceProfileInfo_v2_t {
        version: size | (2 << 24),
        id: 0,
        isP2pSupported: 0,
        sliceCount: 0,
        instanceCount: 0,
        multiprocessorCount: 0,
        copyEngineCount: 0,
        decoderCount: 0,
        encoderCount: 0,
        jpegCount: 0,
        ofaCount: 0,
        memorySizeMB: 0,
        name: [0; 96],
    };
    // SAFETY: `info` is a valid, versioned out-struct for the duration of the call.
    unsafe { nvml_try(sym(handle(device), profile_index, &mut info))? };
    Ok(c_name(&info.name))
}

/// A NUL-terminated C character array as a string.
fn c_name(chars: &[std::os::raw::c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c.to_ne_bytes()[0])
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_values_are_read_by_their_type() {
        let value = |kind, value, ret| nvmlFieldValue_t {
            fieldId: 0,
            scopeId: 0,
            timestamp: 0,
            latencyUsec: 0,
            valueType: kind,
            nvmlReturn: ret,
            value,
        };
        let ok = nvmlReturn_enum_NVML_SUCCESS;
        let cases = [
            (
                value(
                    nv::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT,
                    nvmlValue_t { uiVal: 7 },
                    ok,
                ),
                Some(7),
            ),
            (
                value(
                    nv::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
                    nvmlValue_t { ullVal: 1 << 40 },
                    ok,
                ),
                Some(1 << 40),
            ),
            (
                value(
                    nv::nvmlValueType_enum_NVML_VALUE_TYPE_SIGNED_LONG_LONG,
                    nvmlValue_t { sllVal: -1 },
                    ok,
                ),
                None,
            ),
            (
                value(
                    nv::nvmlValueType_enum_NVML_VALUE_TYPE_DOUBLE,
                    nvmlValue_t { dVal: 41.9 },
                    ok,
                ),
                Some(41),
            ),
            (
                value(
                    nv::nvmlValueType_enum_NVML_VALUE_TYPE_DOUBLE,
                    nvmlValue_t { dVal: f64::NAN },
                    ok,
                ),
                None,
            ),
            (
                value(
                    nv::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT,
                    nvmlValue_t { uiVal: 7 },
                    nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED,
                ),
                None,
            ),
        ];
        for (field, expected) in cases {
            assert_eq!(field_u64(&field), expected);
        }
    }

    #[test]
    fn c_names_stop_at_nul() {
        let mut name = [0 as std::os::raw::c_char; 8];
        for (slot, b) in name.iter_mut().zip(b"3g.40gb") {
            *slot = *b as std::os::raw::c_char;
        }
        assert_eq!(c_name(&name), "3g.40gb");
        assert_eq!(c_name(&[0; 4]), "");
    }
}
