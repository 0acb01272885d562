//! Health: XID and double-bit ECC events from an NVML event set, and a poll of volatile DBE
//! counts, remapped rows, pending page retirement, lost cards and memory held by dead
//! processes. NVML reports an XID, not its end: an XID fault clears once no XID of that code
//! came for `xid_clear_after` and the card answers its poll. GPU_IS_LOST from any call marks a
//! card lost; a real query that succeeds clears it.

use super::Shared;
use super::convert::mib;
use super::raw;
use crate::faults;
use crate::sysfs::Sysfs;
use crate::util::lock;
use nvml_wrapper::Device;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{ComputeMode, EccCounter, MemoryError};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::event::EventSet;
use nvml_wrapper_sys::bindings::NVML_NVLINK_MAX_LINKS;
use runtimekit_proto::resource::v1alpha1 as pb;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::Duration;

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

/// A card answered GPU_IS_LOST.
struct Lost;

/// What the poll remembers of a card's NVLink links.
#[derive(Debug, Default)]
pub(super) struct NvlinkWatch {
    /// Links seen active: one of them inactive now is down.
    expected: BTreeSet<u32>,
    /// The error total at the last poll.
    errors: Option<u64>,
}

impl NvlinkWatch {
    /// Takes in a poll's active links and error total; returns the links down and the errors
    /// since the last poll.
    fn observe(&mut self, active: &BTreeSet<u32>, errors: Option<u64>) -> (Vec<u32>, u64) {
        self.expected.extend(active);
        let down = self.expected.difference(active).copied().collect();
        let new_errors = match (self.errors, errors) {
            (Some(before), Some(now)) => now.saturating_sub(before),
            _ => 0,
        };
        if errors.is_some() {
            self.errors = errors;
        }
        (down, new_errors)
    }
}

/// Sorts a call's answer: GPU_IS_LOST stops the poll; other errors leave that check out.
fn answer<T>(result: Result<T, NvmlError>) -> Result<Option<T>, Lost> {
    match result {
        Ok(value) => Ok(Some(value)),
        Err(NvmlError::GpuLost) => Err(Lost),
        Err(_) => Ok(None),
    }
}

impl Shared {
    /// The health poll of one card. GPU_IS_LOST from any call marks the card lost; only a
    /// real query that succeeds clears it (a handle lookup succeeds on a card fallen off the
    /// bus).
    fn poll_card(&self, index: u32) {
        let uuid = self.uuid_of(index);
        let dev = match self.nvml.device_by_index(index) {
            Ok(dev) => dev,
            Err(NvmlError::GpuLost) => {
                self.mark_lost(index);
                return;
            }
            Err(error) => {
                tracing::debug!(card = index, %error, "cannot poll the card");
                return;
            }
        };
        let polled = self
            .watch
            .call(index, &uuid, || self.poll_checks(&dev, index, &uuid));
        match polled {
            Ok(()) => self.clear_quiet_xids(index),
            Err(Lost) => self.mark_lost(index),
        }
    }

    /// Clears the XID faults of a card that answers when no XID of that code came for
    /// `xid_clear_after`.
    fn clear_quiet_xids(&self, index: u32) {
        let quiet: Vec<u32> = {
            let mut seen = lock(&self.xid_seen);
            let codes: Vec<u32> = seen
                .iter()
                .filter(|((card, _), at)| {
                    *card == index && at.elapsed() >= self.options.xid_clear_after
                })
                .map(|((_, code), _)| *code)
                .collect();
            for code in &codes {
                seen.remove(&(index, *code));
            }
            codes
        };
        for code in quiet {
            self.hub.clear(index, Some(pb::FaultKind::Xid), Some(code));
        }
    }

    /// The checks of one card's poll.
    fn poll_checks(&self, dev: &Device<'_>, index: u32, uuid: &str) -> Result<(), Lost> {
        if answer(dev.memory_info())?.is_some() {
            self.hub.clear(index, Some(pb::FaultKind::GpuLost), None);
        }
        match answer(dev.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile))? {
            Some(0) => {
                self.hub.clear(index, Some(pb::FaultKind::EccDbe), None);
            }
            Some(n) => {
                self.hub.raise(index, uuid, faults::ecc_dbe(n));
            }
            None => {}
        }
        if let Some(rows) = answer(raw::remapped_rows(&self.nvml, dev))? {
            if rows.failure {
                self.hub.raise(index, uuid, faults::row_remap_failure());
            } else {
                self.hub
                    .clear(index, Some(pb::FaultKind::RowRemapFailure), None);
            }
            if rows.pending {
                self.hub.raise(
                    index,
                    uuid,
                    faults::row_remap_pending(u64::from(rows.uncorrectable)),
                );
            } else {
                self.hub
                    .clear(index, Some(pb::FaultKind::RowRemapPending), None);
            }
        }
        match answer(dev.are_pages_pending_retired())? {
            Some(true) => {
                self.hub.raise(index, uuid, faults::retired_pages_pending());
            }
            Some(false) => {
                self.hub
                    .clear(index, Some(pb::FaultKind::RetiredPagesPending), None);
            }
            None => {}
        }
        self.poll_nvlink(dev, index, uuid)?;
        match answer(dev.compute_mode())? {
            Some(ComputeMode::Default) | None => {
                self.hub
                    .clear(index, Some(pb::FaultKind::ComputeMode), None);
            }
            Some(mode) => {
                let prohibited = mode == ComputeMode::Prohibited;
                self.hub.raise_current(
                    index,
                    uuid,
                    faults::compute_mode(&format!("{mode:?}"), prohibited),
                );
            }
        }
        if self.liveness_unavailable.is_none() {
            let dead_now: Vec<(u32, u64)> = answer(dev.running_compute_processes())?
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
                        .raise(index, uuid, faults::dead_process_memory(pid, total));
                }
                None => {
                    self.hub
                        .clear(index, Some(pb::FaultKind::DeadProcessMemory), None);
                }
            }
        }
        Ok(())
    }

    /// NVLink: a link seen active that is down now, and error bursts between polls.
    fn poll_nvlink(&self, dev: &Device<'_>, index: u32, uuid: &str) -> Result<(), Lost> {
        let mut active = BTreeSet::new();
        for link in 0..NVML_NVLINK_MAX_LINKS {
            match dev.link_wrapper_for(link).is_active() {
                Ok(true) => {
                    active.insert(link);
                }
                Ok(false) => {}
                Err(NvmlError::GpuLost) => return Err(Lost),
                // Past the card's links, or no NVLink at all.
                Err(_) => break,
            }
        }
        let errors = self.nvlink_error_total(dev);
        let (down, burst) = lock(&self.nvlink)
            .entry(index)
            .or_default()
            .observe(&active, errors);
        if down.is_empty() {
            self.hub.clear(index, Some(pb::FaultKind::NvlinkDown), None);
        } else {
            self.hub
                .raise_current(index, uuid, faults::nvlink_down(&down));
        }
        if burst > self.options.nvlink_error_burst {
            self.hub.raise(index, uuid, faults::nvlink_errors(burst));
        } else {
            self.hub
                .clear(index, Some(pb::FaultKind::NvlinkErrors), None);
        }
        Ok(())
    }

    /// The health poll of every card.
    pub(super) fn poll_health(&self) {
        for index in 0..self.count {
            self.poll_card(index);
        }
    }

    /// An event set with XID and DBE events of every card that supports them. A card whose
    /// event types cannot be read, or that refuses the registration, gets an EVENTS_UNWATCHED
    /// warning: its XIDs go unseen, and that must show.
    fn event_set(&self) -> Option<EventSet<'_>> {
        let wanted = EventTypes::CRITICAL_XID_ERROR | EventTypes::DOUBLE_BIT_ECC_ERROR;
        let mut set = self.nvml.create_event_set().ok()?;
        let mut registered: Vec<(u32, EventTypes)> = Vec::new();
        for index in 0..self.count {
            let uuid = self.uuid_of(index);
            let Ok(dev) = self.nvml.device_by_index(index) else {
                continue;
            };
            let supported = self
                .watch
                .call(index, &uuid, || dev.supported_event_types());
            let events = match supported {
                Ok(types) => wanted & types,
                Err(error) => {
                    self.hub
                        .raise(index, &uuid, faults::events_unwatched(&error.to_string()));
                    continue;
                }
            };
            if events.is_empty() {
                continue;
            }
            match self
                .watch
                .call(index, &uuid, || dev.register_events(events, set))
            {
                Ok(s) => {
                    set = s;
                    registered.push((index, events));
                }
                Err(error) => {
                    self.hub
                        .raise(index, &uuid, faults::events_unwatched(&error.to_string()));
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

    /// Starts the health threads: one that waits for events, and one poll per card, so a
    /// card whose calls hang holds up neither the other cards' polls nor anyone's XIDs.
    pub(super) fn start_health(self: &Arc<Self>) {
        let mut wakers = lock(&self.wakers);
        for index in 0..self.count {
            let (wake, woken) = mpsc::channel();
            let shared = self.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("rl-nvml-poll-{index}"))
                .spawn(move || shared.poll_loop(index, &woken));
            match spawned {
                Ok(_) => wakers.push(wake),
                Err(error) => {
                    tracing::error!(card = index, %error, "cannot start the card's health poll");
                }
            }
        }
        drop(wakers);
        let shared = self.clone();
        let spawned = std::thread::Builder::new()
            .name("rl-nvml-events".into())
            .spawn(move || shared.event_loop());
        if let Err(error) = spawned {
            tracing::error!(%error, "cannot start the NVML event thread; XIDs are not watched");
        }
    }

    /// Polls card `index` every `poll_interval`, and at once when woken, until the backend is
    /// dropped.
    fn poll_loop(&self, index: u32, woken: &mpsc::Receiver<()>) {
        while !self.stop.load(Ordering::SeqCst) {
            match woken.recv_timeout(self.options.poll_interval) {
                Ok(()) | Err(mpsc::RecvTimeoutError::Timeout) => self.poll_card(index),
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    /// Asks card `index`'s poll to run now.
    fn wake_poll(&self, index: u32) {
        if let Some(wake) = lock(&self.wakers).get(index as usize) {
            let _ = wake.send(());
        }
    }

    /// Waits for NVML events until the backend is dropped.
    fn event_loop(&self) {
        let set = self.event_set();
        if set.is_none() {
            tracing::warn!("no NVML event set: XIDs are not watched, the rest is polled");
            return;
        }
        while !self.stop.load(Ordering::SeqCst) {
            match set.as_ref().map(|s| raw::wait_event(&self.nvml, s, 500)) {
                Some(Ok(event)) => self.on_event(&event),
                Some(Err(NvmlError::Timeout)) | None => {}
                Some(Err(NvmlError::GpuLost)) => {
                    // Some card fell off the bus: the polls find which.
                    tracing::warn!("waiting for NVML events: a card is lost");
                    (0..self.count).for_each(|i| self.wake_poll(i));
                }
                Some(Err(error)) => {
                    tracing::debug!(%error, "waiting for NVML events failed");
                    std::thread::sleep(Duration::from_millis(500));
                }
            }
        }
    }

    /// The card an event names: by its handle, else by its UUID (the handle of a card fallen
    /// off the bus may not be listed any more, and its UUID may not be readable: XID 79).
    fn event_card(&self, event: &raw::RawEvent) -> Option<u32> {
        (0..self.count)
            .find(|&i| {
                self.nvml
                    .device_by_index(i)
                    .is_ok_and(|d| raw::same_device(&d, event.device))
            })
            .or_else(|| {
                let uuid = raw::device_uuid(&self.nvml, event.device).ok()?;
                self.index_of_uuid(&uuid)
            })
    }

    /// An XID raises its fault; a double-bit ECC event polls the card at once. An event no
    /// card can be found for polls every card.
    fn on_event(&self, event: &raw::RawEvent) {
        let Some(index) = self.event_card(event) else {
            tracing::warn!(
                kind = event.kind,
                data = event.data,
                "an NVML event names no card this backend knows; polling every card"
            );
            (0..self.count).for_each(|i| self.wake_poll(i));
            return;
        };
        let uuid = self.uuid_of(index);
        let kind = EventTypes::from_bits_truncate(event.kind);
        if kind.contains(EventTypes::CRITICAL_XID_ERROR) {
            let code = u32::try_from(event.data).unwrap_or(u32::MAX);
            lock(&self.last_xid).insert(index, code);
            lock(&self.xid_seen).insert((index, code), std::time::Instant::now());
            // In MIG mode the driver names the instance an XID concerns: fault only it.
            let fault = match event.gpu_instance {
                Some(gi) => faults::xid(code).in_instance(gi, event.compute_instance),
                None => faults::xid(code),
            };
            self.hub.raise(index, &uuid, fault);
        }
        if kind.contains(EventTypes::DOUBLE_BIT_ECC_ERROR) {
            self.wake_poll(index);
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

    #[test]
    fn a_link_seen_active_and_now_inactive_is_down() {
        let mut watch = NvlinkWatch::default();
        let all: BTreeSet<u32> = (0..4).collect();
        assert_eq!(watch.observe(&all, Some(10)), (vec![], 0));
        let some: BTreeSet<u32> = [0, 1, 3].into();
        assert_eq!(watch.observe(&some, Some(15)), (vec![2], 5));
        assert_eq!(watch.observe(&all, None), (vec![], 0), "no total: no burst");
        assert_eq!(watch.observe(&all, Some(15)), (vec![], 0));
    }
}
