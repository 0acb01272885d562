//! Health: XID and double-bit ECC events from an NVML event set, and a poll of volatile DBE
//! counts, remapped rows, pending page retirement, lost cards and memory held by dead
//! processes. XID faults stay until the resource layer restarts, as in the NVIDIA device
//! plugin: NVML reports the error, not its end.

use super::Shared;
use super::convert::mib;
use super::raw;
use crate::faults;
use crate::sysfs::Sysfs;
use crate::util::lock;
use nvml_wrapper::Device;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::event::EventSet;
use runtimekit_proto::resource::v1alpha1 as pb;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Dead-process bookkeeping: a process is reported dead only when two polls in a row found
/// it holding memory with no process behind it (one that just exited may still be listed).
/// Returns the confirmed (PID, MiB) and the PIDs to remember for the next poll.
fn dead_verdict(
    previous: &BTreeSet<u32>,
    dead_now: &[(u32, u64)],
) -> (Vec<(u32, u64)>, BTreeSet<u32>) {
    let confirmed = dead_now
        .iter()
        .copied()
        .filter(|(pid, _)| previous.contains(pid))
        .collect();
    (confirmed, dead_now.iter().map(|(pid, _)| *pid).collect())
}

impl Shared {
    /// The health poll of one card.
    fn poll_card(&self, index: u32) {
        let uuid = self.uuid_of(index);
        let dev = match self.nvml.device_by_index(index) {
            Ok(dev) => dev,
            Err(NvmlError::GpuLost) => {
                self.hub.raise(index, &uuid, faults::gpu_lost());
                return;
            }
            Err(error) => {
                tracing::debug!(card = index, %error, "cannot poll the card");
                return;
            }
        };
        self.hub.clear(index, Some(pb::FaultKind::GpuLost), None);
        self.watch.call(index, &uuid, || {
            match dev.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile) {
                Ok(0) => {
                    self.hub.clear(index, Some(pb::FaultKind::EccDbe), None);
                }
                Ok(n) => {
                    self.hub.raise(index, &uuid, faults::ecc_dbe(n));
                }
                Err(_) => {}
            }
            if let Ok(rows) = raw::remapped_rows(&self.nvml, &dev) {
                if rows.failure {
                    self.hub.raise(index, &uuid, faults::row_remap_failure());
                } else {
                    self.hub
                        .clear(index, Some(pb::FaultKind::RowRemapFailure), None);
                }
                if rows.pending {
                    self.hub.raise(
                        index,
                        &uuid,
                        faults::row_remap_pending(u64::from(rows.uncorrectable)),
                    );
                } else {
                    self.hub
                        .clear(index, Some(pb::FaultKind::RowRemapPending), None);
                }
            }
            match dev.are_pages_pending_retired() {
                Ok(true) => {
                    self.hub
                        .raise(index, &uuid, faults::retired_pages_pending());
                }
                Ok(false) => {
                    self.hub
                        .clear(index, Some(pb::FaultKind::RetiredPagesPending), None);
                }
                Err(_) => {}
            }
            if self.options.check_process_liveness {
                let dead_now: Vec<(u32, u64)> = dev
                    .running_compute_processes()
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|p| !Sysfs::process_alive(p.pid))
                    .filter_map(|p| match p.used_gpu_memory {
                        UsedGpuMemory::Used(bytes) if bytes > 0 => Some((p.pid, mib(bytes))),
                        _ => None,
                    })
                    .collect();
                let confirmed = {
                    let mut seen = lock(&self.dead_seen);
                    let previous = seen.remove(&index).unwrap_or_default();
                    let (confirmed, next) = dead_verdict(&previous, &dead_now);
                    seen.insert(index, next);
                    confirmed
                };
                match confirmed.first() {
                    Some(&(pid, _)) => {
                        let total = confirmed.iter().map(|(_, m)| m).sum();
                        self.hub
                            .raise(index, &uuid, faults::dead_process_memory(pid, total));
                    }
                    None => {
                        self.hub
                            .clear(index, Some(pb::FaultKind::DeadProcessMemory), None);
                    }
                }
            }
        });
    }

    /// The health poll of every card.
    pub(super) fn poll_health(&self) {
        for index in 0..self.count {
            self.poll_card(index);
        }
    }

    /// An event set with XID and DBE events of every card that supports them.
    fn event_set(&self) -> Option<EventSet<'_>> {
        let wanted = EventTypes::CRITICAL_XID_ERROR | EventTypes::DOUBLE_BIT_ECC_ERROR;
        let mut set = self.nvml.create_event_set().ok()?;
        let mut registered: Vec<(u32, EventTypes)> = Vec::new();
        for index in 0..self.count {
            let Ok(dev) = self.nvml.device_by_index(index) else {
                continue;
            };
            let events = wanted & dev.supported_event_types().unwrap_or(EventTypes::empty());
            if events.is_empty() {
                continue;
            }
            match dev.register_events(events, set) {
                Ok(s) => {
                    set = s;
                    registered.push((index, events));
                }
                Err(error) => {
                    tracing::warn!(card = index, %error, "cannot watch the card's XID events");
                    // A failed registration frees the set: start over without this card.
                    set = self.nvml.create_event_set().ok()?;
                    for &(i, ev) in &registered {
                        if let Ok(d) = self.nvml.device_by_index(i) {
                            set = d.register_events(ev, set).ok()?;
                        }
                    }
                }
            }
        }
        Some(set)
    }

    /// Waits for NVML events and polls every `poll_interval` until the backend is dropped.
    pub(super) fn health_loop(self: Arc<Self>) {
        let set = self.event_set();
        if set.is_none() {
            tracing::warn!("no NVML event set: XIDs are not watched, the rest is polled");
        }
        let mut next_poll = Instant::now() + self.options.poll_interval;
        while !self.stop.load(Ordering::SeqCst) {
            match &set {
                Some(set) => match set.wait(500) {
                    Ok(event) => self.on_event(&event.device, event.event_type, event.event_data),
                    Err(NvmlError::Timeout) => {}
                    Err(error) => {
                        tracing::debug!(%error, "waiting for NVML events failed");
                        std::thread::sleep(Duration::from_millis(500));
                    }
                },
                None => std::thread::sleep(Duration::from_millis(500)),
            }
            if Instant::now() >= next_poll {
                self.poll_health();
                next_poll = Instant::now() + self.options.poll_interval;
            }
        }
    }

    /// An XID raises its fault; a double-bit ECC event polls the card at once.
    fn on_event(&self, device: &Device<'_>, kind: EventTypes, xid: Option<XidError>) {
        let Some(index) = device.uuid().ok().and_then(|u| self.index_of_uuid(&u)) else {
            return;
        };
        let uuid = self.uuid_of(index);
        if kind.contains(EventTypes::CRITICAL_XID_ERROR) {
            let code = match xid {
                Some(XidError::Value(v)) => u32::try_from(v).unwrap_or(u32::MAX),
                _ => 0,
            };
            lock(&self.last_xid).insert(index, code);
            self.hub.raise(index, &uuid, faults::xid(code));
        }
        if kind.contains(EventTypes::DOUBLE_BIT_ECC_ERROR) {
            self.poll_card(index);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dead_processes_need_two_polls() {
        let (confirmed, next) = dead_verdict(&BTreeSet::new(), &[(42, 100)]);
        assert!(confirmed.is_empty());
        assert_eq!(next, BTreeSet::from([42]));
        let (confirmed, next) = dead_verdict(&next, &[(42, 100), (43, 5)]);
        assert_eq!(confirmed, [(42, 100)]);
        assert_eq!(next, BTreeSet::from([42, 43]));
        let (confirmed, next) = dead_verdict(&next, &[]);
        assert!(confirmed.is_empty());
        assert!(next.is_empty());
    }
}
