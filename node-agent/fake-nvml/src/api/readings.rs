//! What a card reads: sensors, clocks, utilisation, PCIe, ECC, retired pages and remapped
//! rows, throttling, processes and their utilisation samples, and field values.

use super::{INVALID, MIB, NOT_FOUND, NOT_SUPPORTED, Ret, put, put_list, query, ret};
use crate::world::{Card, Process};
use nvml_wrapper_sys::bindings::{self as nv, field_id};
use std::os::raw::{c_int, c_uint, c_ulonglong};

/// A `u32` reading of the card, NOT_SUPPORTED on a MIG device.
fn card_value(
    call: &str,
    device: nv::nvmlDevice_t,
    out: *mut c_uint,
    read: impl FnOnce(&Card) -> Result<u32, Ret>,
) -> Ret {
    ret(query(call, device, |_, card, gi| {
        if gi.is_some() {
            return Err(NOT_SUPPORTED);
        }
        let value = read(card)?;
        // SAFETY: the caller's out-pointer.
        unsafe { put(out, value) }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: nv::nvmlDevice_t,
    sensor: nv::nvmlTemperatureSensors_t,
    temp: *mut c_uint,
) -> Ret {
    card_value("nvmlDeviceGetTemperature", device, temp, |c| match sensor {
        nv::nvmlTemperatureSensors_enum_NVML_TEMPERATURE_GPU => Ok(c.readings.gpu_temp_c),
        _ => Err(INVALID),
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeMode(
    device: nv::nvmlDevice_t,
    mode: *mut nv::nvmlComputeMode_t,
) -> Ret {
    ret(query("nvmlDeviceGetComputeMode", device, |_, card, _| {
        // SAFETY: the caller's out-pointer.
        unsafe { put(mode, card.compute_mode as nv::nvmlComputeMode_t) }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(
    device: nv::nvmlDevice_t,
    power: *mut c_uint,
) -> Ret {
    card_value("nvmlDeviceGetPowerUsage", device, power, |c| {
        Ok(c.readings.power_mw)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTotalEnergyConsumption(
    device: nv::nvmlDevice_t,
    energy: *mut c_ulonglong,
) -> Ret {
    ret(query(
        "nvmlDeviceGetTotalEnergyConsumption",
        device,
        |_, card, _| {
            // SAFETY: the caller's out-pointer.
            unsafe { put(energy, card.readings.energy_mj) }
        },
    ))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(
    device: nv::nvmlDevice_t,
    kind: nv::nvmlClockType_t,
    clock: *mut c_uint,
) -> Ret {
    card_value("nvmlDeviceGetClockInfo", device, clock, |c| match kind {
        nv::nvmlClockType_enum_NVML_CLOCK_GRAPHICS | nv::nvmlClockType_enum_NVML_CLOCK_SM => {
            Ok(c.readings.sm_clock_mhz)
        }
        nv::nvmlClockType_enum_NVML_CLOCK_MEM => Ok(c.readings.mem_clock_mhz),
        _ => Err(NOT_SUPPORTED),
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: nv::nvmlDevice_t,
    utilization: *mut nv::nvmlUtilization_t,
) -> Ret {
    ret(query(
        "nvmlDeviceGetUtilizationRates",
        device,
        |_, card, gi| {
            if gi.is_some() {
                return Err(NOT_SUPPORTED);
            }
            let value = nv::nvmlUtilization_t {
                gpu: card.readings.gpu_util,
                memory: card.readings.mem_util,
            };
            // SAFETY: the caller's out-pointer.
            unsafe { put(utilization, value) }
        },
    ))
}

/// Encoder and decoder: idle, sampled every 167 ms as on real cards.
fn codec(call: &str, device: nv::nvmlDevice_t, value: *mut c_uint, period: *mut c_uint) -> Ret {
    ret(query(call, device, |_, _, _| {
        // SAFETY: the caller's out-pointers.
        unsafe {
            put(value, 0)?;
            put(period, 167_000)
        }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetEncoderUtilization(
    device: nv::nvmlDevice_t,
    value: *mut c_uint,
    period: *mut c_uint,
) -> Ret {
    codec("nvmlDeviceGetEncoderUtilization", device, value, period)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDecoderUtilization(
    device: nv::nvmlDevice_t,
    value: *mut c_uint,
    period: *mut c_uint,
) -> Ret {
    codec("nvmlDeviceGetDecoderUtilization", device, value, period)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPcieThroughput(
    device: nv::nvmlDevice_t,
    counter: nv::nvmlPcieUtilCounter_t,
    value: *mut c_uint,
) -> Ret {
    card_value(
        "nvmlDeviceGetPcieThroughput",
        device,
        value,
        |c| match counter {
            nv::nvmlPcieUtilCounter_enum_NVML_PCIE_UTIL_TX_BYTES => Ok(c.readings.pcie_tx_kb_per_s),
            nv::nvmlPcieUtilCounter_enum_NVML_PCIE_UTIL_RX_BYTES => Ok(c.readings.pcie_rx_kb_per_s),
            _ => Err(INVALID),
        },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPcieReplayCounter(
    device: nv::nvmlDevice_t,
    value: *mut c_uint,
) -> Ret {
    card_value("nvmlDeviceGetPcieReplayCounter", device, value, |c| {
        Ok(c.readings.pcie_replays)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    device: nv::nvmlDevice_t,
    error: nv::nvmlMemoryErrorType_t,
    counter: nv::nvmlEccCounterType_t,
    count: *mut c_ulonglong,
) -> Ret {
    ret(query(
        "nvmlDeviceGetTotalEccErrors",
        device,
        |_, card, _| {
            let r = &card.readings;
            let value = match (error, counter) {
                (0, 0) => r.ecc_sbe_volatile,
                (1, 0) => r.ecc_dbe_volatile,
                (0, 1) => r.ecc_sbe_aggregate,
                (1, 1) => r.ecc_dbe_aggregate,
                _ => return Err(INVALID),
            };
            // SAFETY: the caller's out-pointer.
            unsafe { put(count, value) }
        },
    ))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPagesPendingStatus(
    device: nv::nvmlDevice_t,
    pending: *mut nv::nvmlEnableState_t,
) -> Ret {
    ret(query(
        "nvmlDeviceGetRetiredPagesPendingStatus",
        device,
        |_, card, _| {
            let on = card.readings.retired_pages_pending;
            // SAFETY: the caller's out-pointer.
            unsafe { put(pending, nv::nvmlEnableState_t::from(on)) }
        },
    ))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPages_v2(
    device: nv::nvmlDevice_t,
    cause: nv::nvmlPageRetirementCause_t,
    count: *mut c_uint,
    addresses: *mut c_ulonglong,
    timestamps: *mut c_ulonglong,
) -> Ret {
    ret(query(
        "nvmlDeviceGetRetiredPages_v2",
        device,
        |_, card, _| {
            let n = match cause {
                0 => card.readings.retired_pages_sbe,
                1 => card.readings.retired_pages_dbe,
                _ => return Err(INVALID),
            };
            let pages: Vec<c_ulonglong> = (0..u64::from(n)).map(|i| 0x1000 * (i + 1)).collect();
            // SAFETY: the caller's arrays of `*count` entries (or none).
            unsafe {
                if !timestamps.is_null() && !addresses.is_null() {
                    let mut room = count.read();
                    put_list(&pages, timestamps, &mut room)?;
                }
                put_list(&pages, addresses, count)
            }
        },
    ))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRemappedRows(
    device: nv::nvmlDevice_t,
    correctable: *mut c_uint,
    uncorrectable: *mut c_uint,
    pending: *mut c_uint,
    failure: *mut c_uint,
) -> Ret {
    ret(query("nvmlDeviceGetRemappedRows", device, |_, card, _| {
        let r = &card.readings;
        // SAFETY: the caller's out-pointers.
        unsafe {
            put(correctable, r.remapped_correctable)?;
            put(uncorrectable, r.remapped_uncorrectable)?;
            put(pending, c_uint::from(r.remap_pending))?;
            put(failure, c_uint::from(r.remap_failure))
        }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetViolationStatus(
    device: nv::nvmlDevice_t,
    policy: nv::nvmlPerfPolicyType_t,
    time: *mut nv::nvmlViolationTime_t,
) -> Ret {
    ret(query(
        "nvmlDeviceGetViolationStatus",
        device,
        |_, card, _| {
            let ns = match policy {
                nv::nvmlPerfPolicyType_enum_NVML_PERF_POLICY_POWER => {
                    card.readings.power_violation_ns
                }
                nv::nvmlPerfPolicyType_enum_NVML_PERF_POLICY_THERMAL => {
                    card.readings.thermal_violation_ns
                }
                _ => return Err(NOT_SUPPORTED),
            };
            let value = nv::nvmlViolationTime_t {
                referenceTime: now_us(),
                violationTime: ns,
            };
            // SAFETY: the caller's out-pointer.
            unsafe { put(time, value) }
        },
    ))
}

/// The processes a device handle sees: the card's, or a MIG device's own.
fn processes_of(card: &Card, gi: Option<u32>, graphics: bool) -> Vec<nv::nvmlProcessInfo_t> {
    card.processes
        .iter()
        .filter(|p| p.graphics == graphics)
        .filter(|p| gi.is_none() || p.gpu_instance_id == gi)
        .map(|p: &Process| nv::nvmlProcessInfo_t {
            pid: p.pid,
            usedGpuMemory: p.used_mib.map_or(u64::MAX, |m| m * MIB),
            gpuInstanceId: p.gpu_instance_id.unwrap_or(u32::MAX),
            computeInstanceId: p.compute_instance_id.unwrap_or(u32::MAX),
        })
        .collect()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: nv::nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nv::nvmlProcessInfo_t,
) -> Ret {
    ret(query(
        "nvmlDeviceGetComputeRunningProcesses_v3",
        device,
        |_, card, gi| {
            // SAFETY: the caller's array of `*count` entries (or none).
            unsafe { put_list(&processes_of(card, gi, false), infos, count) }
        },
    ))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v3(
    device: nv::nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nv::nvmlProcessInfo_t,
) -> Ret {
    ret(query(
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
        device,
        |_, card, gi| {
            // SAFETY: the caller's array of `*count` entries (or none).
            unsafe { put_list(&processes_of(card, gi, true), infos, count) }
        },
    ))
}

/// Microseconds since the epoch, NVML's sample clock.
fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    device: nv::nvmlDevice_t,
    samples: *mut nv::nvmlProcessUtilizationSample_t,
    count: *mut c_uint,
    last_seen: c_ulonglong,
) -> Ret {
    ret(query(
        "nvmlDeviceGetProcessUtilization",
        device,
        |w, card, gi| {
            // The driver's newest sample, on its sampling grid; busy processes only.
            let period = w.sample_period_ms.max(1) * 1000;
            let taken = w.sample_at_us.unwrap_or(now_us() / period * period);
            let list: Vec<nv::nvmlProcessUtilizationSample_t> = card
                .processes
                .iter()
                .filter(|p| gi.is_none() || p.gpu_instance_id == gi)
                .filter(|p| (p.sm_util > 0 || p.mem_util > 0) && taken > last_seen)
                .map(|p| nv::nvmlProcessUtilizationSample_t {
                    pid: p.pid,
                    timeStamp: taken,
                    smUtil: p.sm_util,
                    memUtil: p.mem_util,
                    encUtil: 0,
                    decUtil: 0,
                })
                .collect();
            if list.is_empty() {
                return Err(NOT_FOUND);
            }
            // SAFETY: the caller's array of `*count` entries (or none).
            unsafe { put_list(&list, samples, count) }
        },
    ))
}

/// One field of a card for `scope` (a link, or `u32::MAX` for all), or why not.
fn field(card: &Card, id: u32, scope: u32) -> Result<u64, Ret> {
    let links = &card.links;
    let one_or_all = |read: fn(&crate::world::Link) -> u64| -> Result<u64, Ret> {
        if scope == u32::MAX {
            Ok(links.iter().map(read).sum())
        } else {
            links.get(scope as usize).map(read).ok_or(INVALID)
        }
    };
    let total = |read: fn(&crate::world::Link) -> u64| -> u64 { links.iter().map(read).sum() };
    match id {
        field_id::NVML_FI_DEV_MEMORY_TEMP => Ok(u64::from(card.readings.memory_temp_c)),
        field_id::NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX => one_or_all(|l| l.tx_kib),
        field_id::NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX => one_or_all(|l| l.rx_kib),
        field_id::NVML_FI_DEV_NVLINK_ERROR_DL_CRC => links
            .get(scope as usize)
            .map(|l| l.crc_flit_errors + l.crc_data_errors)
            .ok_or(INVALID),
        field_id::NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY => links
            .get(scope as usize)
            .map(|l| l.replay_errors)
            .ok_or(INVALID),
        field_id::NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY => links
            .get(scope as usize)
            .map(|l| l.recovery_errors)
            .ok_or(INVALID),
        field_id::NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL => Ok(total(|l| l.crc_flit_errors)),
        field_id::NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL => Ok(total(|l| l.crc_data_errors)),
        field_id::NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL => Ok(total(|l| l.replay_errors)),
        field_id::NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL => Ok(total(|l| l.recovery_errors)),
        _ => Err(NOT_SUPPORTED),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(
    device: nv::nvmlDevice_t,
    count: c_int,
    values: *mut nv::nvmlFieldValue_t,
) -> Ret {
    ret(query("nvmlDeviceGetFieldValues", device, |_, card, _| {
        if values.is_null() || count < 0 {
            return Err(INVALID);
        }
        for i in 0..count as usize {
            // SAFETY: the caller's array of `count` entries, each with its field and scope set.
            let slot = unsafe { &mut *values.add(i) };
            match field(card, slot.fieldId, slot.scopeId) {
                Ok(v) => {
                    slot.nvmlReturn = super::OK;
                    slot.valueType = nv::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
                    slot.value = nv::nvmlValue_t { ullVal: v };
                }
                Err(code) => slot.nvmlReturn = code,
            }
            slot.timestamp = i64::try_from(now_us()).unwrap_or(i64::MAX);
            slot.latencyUsec = 0;
        }
        Ok(())
    }))
}
