//! Events and GPM. Event sets live in the library's memory (cards and types registered);
//! `nvmlEventSetWait_v2` hands out the world's waiting events of registered cards, oldest
//! first. GPM samples carry their card and time; metrics come from the card's readings.

use super::{INVALID, NOT_SUPPORTED, OK, Ret, change, put, query, ret};
use crate::handles;
use crate::state::{self, Changed};
use nvml_wrapper_sys::bindings as nv;
use std::collections::BTreeMap;
use std::os::raw::{c_uint, c_ulonglong};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Event sets by handle: the (card, types) registered in each.
static SETS: Mutex<BTreeMap<usize, Vec<(u32, u64)>>> = Mutex::new(BTreeMap::new());
/// Event-set handles start here (apart from every other kind of handle).
const SET_BASE: usize = 0x800_0000;

fn sets() -> std::sync::MutexGuard<'static, BTreeMap<usize, Vec<(u32, u64)>>> {
    match SETS.lock() {
        Ok(s) => s,
        Err(poisoned) => poisoned.into_inner(),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: nv::nvmlDevice_t,
    types: *mut c_ulonglong,
) -> Ret {
    ret(query(
        "nvmlDeviceGetSupportedEventTypes",
        device,
        |_, card, _| {
            // SAFETY: the caller's out-pointer.
            unsafe { put(types, card.supported_events) }
        },
    ))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut nv::nvmlEventSet_t) -> Ret {
    ret((|| {
        state::enter("nvmlEventSetCreate", None, false)?;
        let mut all = sets();
        let handle = SET_BASE + all.len() + 1;
        all.insert(handle, Vec::new());
        // SAFETY: the caller's out-pointer.
        unsafe { put(set, handle as nv::nvmlEventSet_t) }
    })())
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlEventSetFree(set: nv::nvmlEventSet_t) -> Ret {
    match sets().remove(&(set as usize)) {
        Some(_) => OK,
        None => INVALID,
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceRegisterEvents(
    device: nv::nvmlDevice_t,
    types: c_ulonglong,
    set: nv::nvmlEventSet_t,
) -> Ret {
    ret(query("nvmlDeviceRegisterEvents", device, |_, card, gi| {
        if gi.is_some() {
            return Err(NOT_SUPPORTED);
        }
        if types & !card.supported_events != 0 {
            return Err(NOT_SUPPORTED);
        }
        let index = handles::device(device).ok_or(INVALID)?.card();
        let mut all = sets();
        let registered = all.get_mut(&(set as usize)).ok_or(INVALID)?;
        registered.push((index, types));
        Ok(())
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: nv::nvmlEventSet_t,
    data: *mut nv::nvmlEventData_t,
    timeout_ms: c_uint,
) -> Ret {
    ret((|| {
        if data.is_null() {
            return Err(INVALID);
        }
        state::enter("nvmlEventSetWait_v2", None, false)?;
        let registered = sets().get(&(set as usize)).cloned().ok_or(INVALID)?;
        let deadline = Instant::now() + Duration::from_millis(u64::from(timeout_ms));
        loop {
            let event = state::with_world(|w| {
                let found = w.events.iter().position(|e| {
                    registered
                        .iter()
                        .any(|&(card, types)| card == e.card && types & e.kind != 0)
                });
                match found {
                    Some(i) => (Some(w.events.remove(i)), Changed::Yes),
                    None => (None, Changed::No),
                }
            });
            if let Some(e) = event {
                let value = nv::nvmlEventData_t {
                    device: handles::card(e.card),
                    eventType: e.kind,
                    eventData: e.data,
                    gpuInstanceId: e.gpu_instance_id,
                    computeInstanceId: e.compute_instance_id,
                };
                // SAFETY: checked non-null above.
                return unsafe { put(data, value) };
            }
            if Instant::now() >= deadline {
                return Err(nv::nvmlReturn_enum_NVML_ERROR_TIMEOUT);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    })())
}

/// A GPM sample: the card it was taken on and when.
#[derive(Debug, Default)]
struct Sample {
    card: Option<u32>,
    taken: Option<Instant>,
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmQueryDeviceSupport(
    device: nv::nvmlDevice_t,
    support: *mut nv::nvmlGpmSupport_t,
) -> Ret {
    ret(query("nvmlGpmQueryDeviceSupport", device, |_, card, _| {
        if support.is_null() {
            return Err(INVALID);
        }
        // SAFETY: a non-null structure the caller owns, its version set.
        unsafe { (*support).isSupportedDevice = c_uint::from(card.gpm) };
        Ok(())
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmSampleAlloc(sample: *mut nv::nvmlGpmSample_t) -> Ret {
    let handle = Box::into_raw(Box::new(Sample::default())).cast::<nv::nvmlGpmSample_st>();
    // SAFETY: the caller's out-pointer.
    ret(unsafe { put(sample, handle) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmSampleFree(sample: nv::nvmlGpmSample_t) -> Ret {
    if sample.is_null() {
        return INVALID;
    }
    // SAFETY: the handle came from `nvmlGpmSampleAlloc` and is freed once.
    drop(unsafe { Box::from_raw(sample.cast::<Sample>()) });
    OK
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmSampleGet(
    device: nv::nvmlDevice_t,
    sample: nv::nvmlGpmSample_t,
) -> Ret {
    ret((|| {
        let index = handles::device(device).ok_or(INVALID)?.card();
        change("nvmlGpmSampleGet", index, |card| {
            if !card.gpm {
                return Err(NOT_SUPPORTED);
            }
            if sample.is_null() {
                return Err(INVALID);
            }
            card.gpm_samples += 1;
            // SAFETY: a live sample from `nvmlGpmSampleAlloc`.
            let s = unsafe { &mut *sample.cast::<Sample>() };
            s.card = Some(index);
            s.taken = Some(Instant::now());
            Ok(())
        })
    })())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmMetricsGet(metrics: *mut nv::nvmlGpmMetricsGet_t) -> Ret {
    ret((|| {
        if metrics.is_null() {
            return Err(INVALID);
        }
        // SAFETY: a non-null structure the caller owns, with two live samples.
        let get = unsafe { &mut *metrics };
        if get.sample1.is_null() || get.sample2.is_null() {
            return Err(INVALID);
        }
        // SAFETY: live samples from `nvmlGpmSampleAlloc`.
        let (a, b) = unsafe {
            (
                &*get.sample1.cast::<Sample>(),
                &*get.sample2.cast::<Sample>(),
            )
        };
        let (Some(card), Some(first), Some(second)) = (a.card, a.taken, b.taken) else {
            return Err(INVALID);
        };
        if b.card != Some(card) || second <= first {
            return Err(INVALID);
        }
        state::enter("nvmlGpmMetricsGet", Some(card), false)?;
        let percent = state::read(|w| w.cards.get(card as usize).map(|c| c.readings.gpm_percent))
            .ok_or(INVALID)?;
        let count = (get.numMetrics as usize).min(get.metrics.len());
        for metric in get.metrics.iter_mut().take(count) {
            let slot = match metric.metricId {
                nv::nvmlGpmMetricId_t_NVML_GPM_METRIC_GRAPHICS_UTIL => Some(0),
                nv::nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_UTIL => Some(1),
                nv::nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_OCCUPANCY => Some(2),
                nv::nvmlGpmMetricId_t_NVML_GPM_METRIC_ANY_TENSOR_UTIL => Some(3),
                nv::nvmlGpmMetricId_t_NVML_GPM_METRIC_DRAM_BW_UTIL => Some(4),
                _ => None,
            };
            match slot {
                Some(i) => {
                    metric.nvmlReturn = OK;
                    metric.value = percent[i];
                }
                None => metric.nvmlReturn = NOT_SUPPORTED,
            }
        }
        Ok(())
    })())
}
