//! The handles the fake gives out: small integers in pointer form (NVML's handles are opaque
//! to callers), one range per kind, so any handle says what it names.

use nvml_wrapper_sys::bindings as nv;

const CARD: usize = 0x1_0000;
const MIG: usize = 0x100_0000;
const GPU_INSTANCE: usize = 0x200_0000;
const COMPUTE_INSTANCE: usize = 0x400_0000;
/// Cards and GPU-instance IDs each fit in 8 bits.
const SPAN: usize = 0x100;

/// What a device handle names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    Card(u32),
    /// A MIG device: card and GPU-instance ID.
    Mig(u32, u32),
}

impl Device {
    pub fn card(self) -> u32 {
        match self {
            Device::Card(c) | Device::Mig(c, _) => c,
        }
    }
}

pub fn card(index: u32) -> nv::nvmlDevice_t {
    (CARD + index as usize) as nv::nvmlDevice_t
}

pub fn mig(card: u32, gpu_instance: u32) -> nv::nvmlDevice_t {
    (MIG + card as usize * SPAN + gpu_instance as usize) as nv::nvmlDevice_t
}

pub fn device(handle: nv::nvmlDevice_t) -> Option<Device> {
    let n = handle as usize;
    if (CARD..CARD + SPAN).contains(&n) {
        return u32::try_from(n - CARD).ok().map(Device::Card);
    }
    if (MIG..MIG + SPAN * SPAN).contains(&n) {
        let rest = n - MIG;
        return Some(Device::Mig(
            u32::try_from(rest / SPAN).ok()?,
            u32::try_from(rest % SPAN).ok()?,
        ));
    }
    None
}

pub fn gpu_instance(card: u32, id: u32) -> nv::nvmlGpuInstance_t {
    (GPU_INSTANCE + card as usize * SPAN + id as usize) as nv::nvmlGpuInstance_t
}

/// (card, GPU-instance ID) of a GPU-instance handle.
pub fn gpu_instance_of(handle: nv::nvmlGpuInstance_t) -> Option<(u32, u32)> {
    let n = (handle as usize).checked_sub(GPU_INSTANCE)?;
    (n < SPAN * SPAN).then_some(())?;
    Some((u32::try_from(n / SPAN).ok()?, u32::try_from(n % SPAN).ok()?))
}

pub fn compute_instance(card: u32, gi: u32, ci: u32) -> nv::nvmlComputeInstance_t {
    (COMPUTE_INSTANCE + (card as usize * SPAN + gi as usize) * SPAN + ci as usize)
        as nv::nvmlComputeInstance_t
}

/// (card, GPU-instance ID, compute-instance ID) of a compute-instance handle.
pub fn compute_instance_of(handle: nv::nvmlComputeInstance_t) -> Option<(u32, u32, u32)> {
    let n = (handle as usize).checked_sub(COMPUTE_INSTANCE)?;
    (n < SPAN * SPAN * SPAN).then_some(())?;
    Some((
        u32::try_from(n / (SPAN * SPAN)).ok()?,
        u32::try_from(n / SPAN % SPAN).ok()?,
        u32::try_from(n % SPAN).ok()?,
    ))
}
