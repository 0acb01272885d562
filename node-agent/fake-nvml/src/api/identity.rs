//! What a card is and where it sits: identity, PCI, memory, CPU affinity, the PCIe level
//! between two cards and NVLink links.

use super::{INVALID, MIB, NOT_SUPPORTED, Ret, VERSION_MISMATCH, put, put_str, query, ret};
use crate::handles;

use crate::world::Card;
use nvml_wrapper_sys::bindings as nv;
use std::os::raw::{c_char, c_uint, c_ulong};

/// A MIG device's GPU instance on `card`.
fn instance(card: &Card, gi: u32) -> Result<&crate::world::GpuInstance, Ret> {
    card.mig
        .as_ref()
        .and_then(|m| m.instances.iter().find(|g| g.id == gi))
        .ok_or(INVALID)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: nv::nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> Ret {
    ret(query("nvmlDeviceGetUUID", device, |_, card, gi| {
        let text = match gi {
            Some(gi) => instance(card, gi)?.uuid.clone(),
            None => card.uuid.clone(),
        };
        // SAFETY: the caller's buffer of `length` bytes.
        unsafe { put_str(&text, uuid, length) }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: nv::nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> Ret {
    ret(query("nvmlDeviceGetName", device, |_, card, _| {
        // SAFETY: the caller's buffer of `length` bytes.
        unsafe { put_str(&card.name, name, length) }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSerial(
    device: nv::nvmlDevice_t,
    serial: *mut c_char,
    length: c_uint,
) -> Ret {
    ret(query("nvmlDeviceGetSerial", device, |_, card, _| {
        // SAFETY: the caller's buffer of `length` bytes.
        unsafe { put_str(&card.serial, serial, length) }
    }))
}

/// NVML's PCI structure for a bus ID in NVML's form (`00000000:17:00.0`).
fn pci_info(bus_id: &str, device_id: u32) -> nv::nvmlPciInfo_t {
    let mut info = nv::nvmlPciInfo_t {
        busIdLegacy: [0; 16],
        domain: 0,
        bus: 0,
        device: 0,
        pciDeviceId: device_id,
        pciSubSystemId: 0,
        busId: [0; 32],
    };
    let parts: Vec<&str> = bus_id.split([':', '.']).collect();
    let hex = |i: usize| {
        parts
            .get(i)
            .and_then(|p| u32::from_str_radix(p, 16).ok())
            .unwrap_or(0)
    };
    info.domain = hex(0);
    info.bus = hex(1);
    info.device = hex(2);
    let legacy = format!("{:04x}:{:02x}:{:02x}.0", info.domain, info.bus, info.device);
    for (slot, b) in info.busId.iter_mut().zip(bus_id.bytes().take(31)) {
        *slot = b as c_char;
    }
    for (slot, b) in info.busIdLegacy.iter_mut().zip(legacy.bytes().take(15)) {
        *slot = b as c_char;
    }
    info
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: nv::nvmlDevice_t,
    pci: *mut nv::nvmlPciInfo_t,
) -> Ret {
    ret(query("nvmlDeviceGetPciInfo_v3", device, |_, card, _| {
        // SAFETY: the caller's out-pointer.
        unsafe { put(pci, pci_info(&card.pci_bus_id, card.pci_device_id)) }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(
    device: nv::nvmlDevice_t,
    minor: *mut c_uint,
) -> Ret {
    ret(query("nvmlDeviceGetMinorNumber", device, |_, card, gi| {
        if gi.is_some() {
            return Err(NOT_SUPPORTED);
        }
        // SAFETY: the caller's out-pointer.
        unsafe { put(minor, card.minor) }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nv::nvmlDevice_t,
    memory: *mut nv::nvmlMemory_v2_t,
) -> Ret {
    ret(query(
        "nvmlDeviceGetMemoryInfo_v2",
        device,
        |_, card, gi| {
            if memory.is_null() {
                return Err(INVALID);
            }
            let expected = (size_of::<nv::nvmlMemory_v2_t>() | (2 << 24)) as c_uint;
            // SAFETY: a non-null, caller-owned structure whose version the caller set.
            if unsafe { (*memory).version } != expected {
                return Err(VERSION_MISMATCH);
            }
            let (total, reserved, used) = match gi {
                Some(gi) => {
                    let instance = instance(card, gi)?;
                    let profile = card
                        .mig
                        .as_ref()
                        .and_then(|m| m.profiles.iter().find(|p| p.id == instance.profile_id))
                        .ok_or(INVALID)?;
                    (profile.memory_mb, 0, instance.memory_used_mib)
                }
                None => (
                    card.memory_total_mib,
                    card.memory_reserved_mib,
                    card.memory_used_mib,
                ),
            };
            let value = nv::nvmlMemory_v2_t {
                version: expected,
                total: total * MIB,
                reserved: reserved * MIB,
                free: total.saturating_sub(reserved + used) * MIB,
                used: used * MIB,
            };
            // SAFETY: checked non-null above.
            unsafe { put(memory, value) }
        },
    ))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCpuAffinity(
    device: nv::nvmlDevice_t,
    size: c_uint,
    set: *mut c_ulong,
) -> Ret {
    ret(query("nvmlDeviceGetCpuAffinity", device, |_, card, _| {
        if set.is_null() {
            return Err(INVALID);
        }
        for i in 0..size as usize {
            let word = card.cpu_affinity.get(i).copied().unwrap_or(0);
            // SAFETY: the caller's array has `size` words.
            unsafe { set.add(i).write(word as c_ulong) };
        }
        Ok(())
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTopologyCommonAncestor(
    device1: nv::nvmlDevice_t,
    device2: nv::nvmlDevice_t,
    level: *mut nv::nvmlGpuTopologyLevel_t,
) -> Ret {
    ret(query(
        "nvmlDeviceGetTopologyCommonAncestor",
        device1,
        |w, a, _| {
            let other = handles::device(device2).ok_or(INVALID)?.card();
            let b = w.cards.get(other as usize).ok_or(INVALID)?;
            let value = if std::ptr::eq(a, b) {
                nv::nvmlGpuLevel_enum_NVML_TOPOLOGY_INTERNAL
            } else if a.pcie_switch == b.pcie_switch {
                nv::nvmlGpuLevel_enum_NVML_TOPOLOGY_SINGLE
            } else if a.numa_node == b.numa_node {
                nv::nvmlGpuLevel_enum_NVML_TOPOLOGY_NODE
            } else {
                nv::nvmlGpuLevel_enum_NVML_TOPOLOGY_SYSTEM
            };
            // SAFETY: the caller's out-pointer.
            unsafe { put(level, value) }
        },
    ))
}

/// Link `link` of the card: INVALID_ARGUMENT past its links, NOT_SUPPORTED without any.
fn link(card: &Card, link: c_uint) -> Result<&crate::world::Link, Ret> {
    if card.links.is_empty() {
        return Err(NOT_SUPPORTED);
    }
    card.links.get(link as usize).ok_or(INVALID)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkState(
    device: nv::nvmlDevice_t,
    number: c_uint,
    active: *mut nv::nvmlEnableState_t,
) -> Ret {
    ret(query("nvmlDeviceGetNvLinkState", device, |_, card, _| {
        let on = link(card, number)?.active;
        // SAFETY: the caller's out-pointer.
        unsafe { put(active, nv::nvmlEnableState_t::from(on)) }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemotePciInfo_v2(
    device: nv::nvmlDevice_t,
    number: c_uint,
    pci: *mut nv::nvmlPciInfo_t,
) -> Ret {
    ret(query(
        "nvmlDeviceGetNvLinkRemotePciInfo_v2",
        device,
        |_, card, _| {
            let far = &link(card, number)?.remote_bus_id;
            // SAFETY: the caller's out-pointer.
            unsafe { put(pci, pci_info(far, 0)) }
        },
    ))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemoteDeviceType(
    device: nv::nvmlDevice_t,
    number: c_uint,
    kind: *mut nv::nvmlIntNvLinkDeviceType_t,
) -> Ret {
    ret(query(
        "nvmlDeviceGetNvLinkRemoteDeviceType",
        device,
        |_, card, _| {
            let remote = link(card, number)?.remote_type;
            // SAFETY: the caller's out-pointer.
            unsafe { put(kind, remote as nv::nvmlIntNvLinkDeviceType_t) }
        },
    ))
}
