//! Metrics: the DCGM field set from NVML calls (interfaces notes, section 1.2), DCP ratios
//! from GPM where the card has it (Hopper and newer), processes with their memory, SM
//! utilisation, MIG instance and liveness, and the metrics of each keyed instance.

use super::Shared;
use super::convert::mib;
use super::raw;
use crate::backend::select_devices;
use crate::error::LayerError;
use crate::instances::{InstanceRecord, ShareSpec};
use crate::sysfs::Sysfs;
use crate::util::lock;
use nvml_wrapper::Device;
use nvml_wrapper::enum_wrappers::device::{
    Clock as NvClock, EccCounter, MemoryError, PcieUtilCounter, PerformancePolicy, RetirementCause,
    TemperatureSensor,
};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::sys_exports::field_id;
use nvml_wrapper_sys::bindings::{self as nv, NVML_NVLINK_MAX_LINKS};
use runtimekit_proto::resource::v1alpha1 as pb;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How long a process's utilisation sample counts: the driver samples every few hundred
/// milliseconds, and a process with no newer sample has been idle since.
const SAMPLE_LIFETIME_US: u64 = 5_000_000;

/// The per-process utilisation samples of one card read so far: the newest per process.
#[derive(Debug, Default)]
pub(super) struct UtilSamples {
    /// PID -> (sample time in µs since the epoch, SM %).
    newest: BTreeMap<u32, (u64, u32)>,
}

impl UtilSamples {
    /// The time of the newest sample, to ask NVML only for newer ones.
    fn newest(&self) -> Option<u64> {
        self.newest.values().map(|(t, _)| *t).max()
    }

    /// Takes in samples (PID, time, SM %), keeping the newest per process.
    fn add(&mut self, samples: impl Iterator<Item = (u32, u64, u32)>) {
        for (pid, time, sm) in samples {
            let entry = self.newest.entry(pid).or_insert((time, sm));
            if time >= entry.0 {
                *entry = (time, sm);
            }
        }
    }

    /// SM % by PID of the processes sampled busy within the sample lifetime before `now_us`;
    /// older samples are forgotten.
    fn at(&mut self, now_us: u64) -> BTreeMap<u32, u32> {
        let oldest = now_us.saturating_sub(SAMPLE_LIFETIME_US);
        self.newest.retain(|_, (t, _)| *t >= oldest);
        self.newest
            .iter()
            .map(|(pid, (_, sm))| (*pid, *sm))
            .collect()
    }
}

/// Microseconds since the epoch, NVML's sample clock.
fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// The shortest time GPM ratios are computed over.
const GPM_INTERVAL: Duration = Duration::from_secs(1);

/// A card's GPM state: its last sample with when it was taken, and the last ratios.
#[derive(Debug, Default)]
pub(super) struct GpmCard {
    pub(super) previous: Option<(raw::GpmBuffer, Instant)>,
    ratios: Option<[Option<f64>; 5]>,
}

/// What field values say of a card's memory and NVLink links.
#[derive(Debug, Default)]
struct NvlinkReadings {
    memory_temp_c: Option<u32>,
    /// Throughput of all links, in KiB.
    tx_kib: Option<u64>,
    rx_kib: Option<u64>,
    crc_flit: Option<u64>,
    crc_data: Option<u64>,
    replay: Option<u64>,
    recovery: Option<u64>,
}

/// Per-link error counters (scope: the link) and the device totals they replace; the per-link
/// ones are gone on Blackwell, the totals are what older drivers have.
const PER_LINK_ERRORS: [(u32, u32); 3] = [
    (
        field_id::NVML_FI_DEV_NVLINK_ERROR_DL_CRC,
        field_id::NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
    ),
    (
        field_id::NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY,
        field_id::NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
    ),
    (
        field_id::NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY,
        field_id::NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL,
    ),
];

impl Shared {
    /// The card's NVLink error total (CRC flit and data, replay, recovery), when it has one.
    pub(super) fn nvlink_error_total(&self, dev: &Device<'_>) -> Option<u64> {
        let r = self.nvlink_readings(dev);
        let parts = [r.crc_flit, r.crc_data, r.replay, r.recovery];
        parts
            .iter()
            .any(Option::is_some)
            .then(|| parts.iter().flatten().sum())
    }

    /// Memory temperature and NVLink counters in one field-value call: throughput summed by
    /// the driver (scope `UINT_MAX`), error counters summed here over every link that has
    /// them, the device totals where no link does.
    fn nvlink_readings(&self, dev: &Device<'_>) -> NvlinkReadings {
        let all = u32::MAX;
        let mut fields = vec![
            (field_id::NVML_FI_DEV_MEMORY_TEMP, 0),
            (field_id::NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, all),
            (field_id::NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, all),
            (field_id::NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL, 0),
        ];
        for (per_link, total) in PER_LINK_ERRORS {
            fields.push((total, 0));
            fields.extend((0..NVML_NVLINK_MAX_LINKS).map(|link| (per_link, link)));
        }
        let Ok(values) = raw::field_values(&self.nvml, dev, &fields) else {
            return NvlinkReadings::default();
        };
        let per_link = NVML_NVLINK_MAX_LINKS as usize;
        let errors = |n: usize| {
            let start = 4 + n * (1 + per_link);
            let links: Vec<u64> = values[start + 1..start + 1 + per_link]
                .iter()
                .flatten()
                .copied()
                .collect();
            if links.is_empty() {
                values[start]
            } else {
                Some(links.iter().sum())
            }
        };
        NvlinkReadings {
            memory_temp_c: values[0].and_then(|v| u32::try_from(v).ok()),
            tx_kib: values[1],
            rx_kib: values[2],
            crc_data: values[3],
            crc_flit: errors(0),
            replay: errors(1),
            recovery: errors(2),
        }
    }

    /// The processes on a card, with the instance key of the MIG instance each runs in.
    fn processes(&self, dev: &Device<'_>, index: u32, uuid: &str) -> Vec<pb::ProcessMetrics> {
        let mut list = dev.running_compute_processes().unwrap_or_default();
        for p in dev.running_graphics_processes().unwrap_or_default() {
            if !list.iter().any(|q| q.pid == p.pid) {
                list.push(p);
            }
        }
        let util = {
            let mut all = lock(&self.util);
            let card = all.entry(index).or_default();
            match dev.process_utilization_stats(card.newest()) {
                Ok(fresh) => {
                    card.add(fresh.iter().map(|s| (s.pid, s.timestamp, s.sm_util)));
                    Some(card.at(now_us()))
                }
                // No process was busy since the last sample.
                Err(NvmlError::NotFound) => Some(card.at(now_us())),
                // The card does not sample processes: nothing is known.
                Err(_) => None,
            }
        };
        let keys: BTreeMap<u32, String> = lock(&self.ledger)
            .iter()
            .filter(|r| r.device_uuid == uuid)
            .filter_map(|r| Some((r.mig.as_ref()?.gpu_instance_id, r.key.clone()?)))
            .collect();
        list.into_iter()
            .map(|p| pb::ProcessMetrics {
                pid: p.pid,
                name: self.nvml.sys_process_name(p.pid, 64).unwrap_or_default(),
                used_memory_mib: match p.used_gpu_memory {
                    UsedGpuMemory::Used(bytes) => Some(mib(bytes)),
                    UsedGpuMemory::Unavailable => None,
                },
                // NVML gives idle processes no sample: they read 0.
                sm_util_percent: util.as_ref().map(|u| u.get(&p.pid).copied().unwrap_or(0)),
                gpu_instance_id: p.gpu_instance_id,
                compute_instance_id: p.compute_instance_id,
                alive: self
                    .liveness_unavailable
                    .is_none()
                    .then(|| Sysfs::process_alive(p.pid)),
                instance_key: p
                    .gpu_instance_id
                    .and_then(|gi| keys.get(&gi).cloned())
                    .unwrap_or_default(),
            })
            .collect()
    }

    /// The metrics of one card; `gpm` carries its GPM ratios when it has them.
    fn metrics(
        &self,
        dev: &Device<'_>,
        index: u32,
        include_processes: bool,
        gpm: Option<[Option<f64>; 5]>,
    ) -> pb::DeviceMetrics {
        let uuid = self.uuid_of(index);
        let memory = dev.memory_info().ok();
        let nvlink = self.nvlink_readings(dev);
        let utilization = dev.utilization_rates().ok();
        let rows = raw::remapped_rows(&self.nvml, dev).ok();
        let ecc = |e: MemoryError, c: EccCounter| dev.total_ecc_errors(e, c).ok();
        let gpm = gpm.unwrap_or_default();
        pb::DeviceMetrics {
            device_index: index,
            device_uuid: uuid.clone(),
            timestamp_unix_ms: self.clock.now_ms(),
            sm_clock_mhz: dev.clock_info(NvClock::SM).ok(),
            mem_clock_mhz: dev.clock_info(NvClock::Memory).ok(),
            gpu_temp_c: dev.temperature(TemperatureSensor::Gpu).ok(),
            memory_temp_c: nvlink.memory_temp_c,
            power_usage_w: dev.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
            total_energy_mj: dev.total_energy_consumption().ok(),
            gpu_util_percent: utilization.as_ref().map(|u| u.gpu),
            mem_copy_util_percent: utilization.as_ref().map(|u| u.memory),
            enc_util_percent: dev.encoder_utilization().ok().map(|u| u.utilization),
            dec_util_percent: dev.decoder_utilization().ok().map(|u| u.utilization),
            fb_used_mib: memory.as_ref().map(|m| mib(m.used)),
            fb_free_mib: memory.as_ref().map(|m| mib(m.free)),
            fb_reserved_mib: memory.as_ref().map(|m| mib(m.reserved)),
            // NVML reports KB/s.
            pcie_tx_bytes_per_s: dev
                .pcie_throughput(PcieUtilCounter::Send)
                .ok()
                .map(|kb| u64::from(kb) * 1024),
            pcie_rx_bytes_per_s: dev
                .pcie_throughput(PcieUtilCounter::Receive)
                .ok()
                .map(|kb| u64::from(kb) * 1024),
            pcie_replay_count: dev.pcie_replay_counter().ok().map(u64::from),
            // The throughput fields count KiB.
            nvlink_tx_bytes: nvlink.tx_kib.map(|kib| kib.saturating_mul(1024)),
            nvlink_rx_bytes: nvlink.rx_kib.map(|kib| kib.saturating_mul(1024)),
            ecc_sbe_volatile: ecc(MemoryError::Corrected, EccCounter::Volatile),
            ecc_dbe_volatile: ecc(MemoryError::Uncorrected, EccCounter::Volatile),
            ecc_sbe_aggregate: ecc(MemoryError::Corrected, EccCounter::Aggregate),
            ecc_dbe_aggregate: ecc(MemoryError::Uncorrected, EccCounter::Aggregate),
            retired_pages_sbe: dev
                .retired_pages(RetirementCause::MultipleSingleBitEccErrors)
                .ok()
                .map(|p| p.len() as u64),
            retired_pages_dbe: dev
                .retired_pages(RetirementCause::DoubleBitEccError)
                .ok()
                .map(|p| p.len() as u64),
            retired_pages_pending: dev.are_pages_pending_retired().ok(),
            remapped_rows_correctable: rows.map(|r| u64::from(r.correctable)),
            remapped_rows_uncorrectable: rows.map(|r| u64::from(r.uncorrectable)),
            row_remap_pending: rows.map(|r| r.pending),
            row_remap_failure: rows.map(|r| r.failure),
            xid_last: lock(&self.last_xid).get(&index).map(|x| u64::from(*x)),
            nvlink_crc_flit_errors: nvlink.crc_flit,
            nvlink_crc_data_errors: nvlink.crc_data,
            nvlink_replay_errors: nvlink.replay,
            nvlink_recovery_errors: nvlink.recovery,
            power_violation_ns: dev
                .violation_status(PerformancePolicy::Power)
                .ok()
                .map(|v| v.violation_time),
            thermal_violation_ns: dev
                .violation_status(PerformancePolicy::Thermal)
                .ok()
                .map(|v| v.violation_time),
            gr_engine_active: gpm[0],
            sm_active: gpm[1],
            sm_occupancy: gpm[2],
            pipe_tensor_active: gpm[3],
            dram_active: gpm[4],
            processes: if include_processes {
                self.processes(dev, index, &uuid)
            } else {
                Vec::new()
            },
        }
    }

    /// GPM ratios (graphics, SM active, SM occupancy, tensor, DRAM) of the cards that have
    /// GPM, over the time since each card's previous sample: one sample per card and call,
    /// never a wait. A card's first call has none; a call less than [`GPM_INTERVAL`] after the
    /// previous sample repeats the last ratios (shorter intervals are noise).
    fn gpm_ratios(&self, cards: &[u32]) -> BTreeMap<u32, [Option<f64>; 5]> {
        let ids = [
            nv::nvmlGpmMetricId_t_NVML_GPM_METRIC_GRAPHICS_UTIL,
            nv::nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_UTIL,
            nv::nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_OCCUPANCY,
            nv::nvmlGpmMetricId_t_NVML_GPM_METRIC_ANY_TENSOR_UTIL,
            nv::nvmlGpmMetricId_t_NVML_GPM_METRIC_DRAM_BW_UTIL,
        ];
        let mut out = BTreeMap::new();
        for &index in cards {
            let Ok(dev) = self.nvml.device_by_index(index) else {
                continue;
            };
            let uuid = self.uuid_of(index);
            if !self
                .watch
                .call(index, &uuid, || dev.gpm_support())
                .unwrap_or(false)
            {
                continue;
            }
            let mut gpm = lock(&self.gpm);
            let card = gpm.entry(index).or_default();
            let due = card
                .previous
                .as_ref()
                .is_none_or(|(_, at)| at.elapsed() >= GPM_INTERVAL);
            if due {
                let Ok(buffer) = raw::gpm_alloc(&self.nvml) else {
                    continue;
                };
                let taken = self
                    .watch
                    .call(index, &uuid, || raw::gpm_take(&self.nvml, &dev, &buffer));
                if taken.is_err() {
                    raw::gpm_free(&self.nvml, buffer);
                    continue;
                }
                if let Some((previous, _)) = card.previous.take() {
                    if let Ok(values) = raw::gpm_metrics(&self.nvml, &previous, &buffer, &ids) {
                        let mut ratios = [None; 5];
                        for (slot, v) in ratios.iter_mut().zip(values) {
                            *slot = v.map(|m| (m / 100.0).clamp(0.0, 1.0));
                        }
                        card.ratios = Some(ratios);
                    }
                    raw::gpm_free(&self.nvml, previous);
                }
                card.previous = Some((buffer, Instant::now()));
            }
            if let Some(ratios) = card.ratios {
                out.insert(index, ratios);
            }
        }
        out
    }

    /// The metrics of the selected cards; a card that cannot be read is listed under `errors`.
    pub(super) fn device_metrics(
        &self,
        devices: &[u32],
        include_processes: bool,
    ) -> Result<pb::GetDeviceMetricsResponse, LayerError> {
        let selected = select_devices(devices, self.count)?;
        let mut gpm = self.gpm_ratios(&selected);
        Ok(self.each_card(selected, |dev, index| {
            self.metrics(dev, index, include_processes, gpm.remove(&index))
        }))
    }

    /// Each card's busy time and its processes, and no other reading: what the compute meter
    /// asks for every second.
    pub(super) fn process_metrics(&self) -> Result<pb::GetDeviceMetricsResponse, LayerError> {
        let selected = select_devices(&[], self.count)?;
        Ok(self.each_card(selected, |dev, index| {
            let uuid = self.uuid_of(index);
            pb::DeviceMetrics {
                device_index: index,
                timestamp_unix_ms: self.clock.now_ms(),
                gpu_util_percent: dev.utilization_rates().ok().map(|u| u.gpu),
                processes: self.processes(dev, index, &uuid),
                device_uuid: uuid,
                ..pb::DeviceMetrics::default()
            }
        }))
    }

    /// `read` of each of `selected`, under the hang watch; a card that cannot be read is listed
    /// under `errors` (and marked lost when it is).
    fn each_card(
        &self,
        selected: Vec<u32>,
        mut read: impl FnMut(&Device<'_>, u32) -> pb::DeviceMetrics,
    ) -> pb::GetDeviceMetricsResponse {
        let mut response = pb::GetDeviceMetricsResponse::default();
        for index in selected {
            let uuid = self.uuid_of(index);
            let read = self.watch.call(index, &uuid, || -> Result<_, LayerError> {
                let dev = self.dev(index)?;
                Ok(read(&dev, index))
            });
            match read {
                Ok(metrics) => response.devices.push(metrics),
                Err(error) => {
                    if matches!(error, LayerError::DeviceLost { .. }) {
                        self.mark_lost(index);
                    }
                    response.errors.push(error.on_device(index, uuid));
                }
            }
        }
        response
    }

    /// The metrics of the keyed instances (all when `keys` is empty); a card that cannot be
    /// read lists its instances under `errors`.
    pub(super) fn instance_metrics(
        &self,
        keys: &[String],
    ) -> Result<pb::GetInstanceMetricsResponse, LayerError> {
        let records: Vec<InstanceRecord> = lock(&self.ledger)
            .iter()
            .filter(|r| r.keyed_among(keys))
            .cloned()
            .collect();
        let now = self.clock.now_ms();
        let mut response = pb::GetInstanceMetricsResponse::default();
        let mut cards: Vec<u32> = records
            .iter()
            .map(|r| self.index_of_uuid(&r.device_uuid).unwrap_or(r.device_index))
            .collect();
        cards.sort_unstable();
        cards.dedup();
        for index in cards {
            let uuid = self.uuid_of(index);
            let read = self.watch.call(
                index,
                &uuid,
                || -> Result<Vec<pb::InstanceMetrics>, LayerError> {
                    let dev = self.dev(index)?;
                    let processes = self.processes(&dev, index, &uuid);
                    Ok(records
                        .iter()
                        .filter(|r| r.device_uuid == uuid)
                        .map(|r| self.instance_reading(r, index, now, &processes))
                        .collect())
                },
            );
            match read {
                Ok(metrics) => response.instances.extend(metrics),
                Err(error) => response.errors.push(error.on_device(index, uuid)),
            }
        }
        Ok(response)
    }

    /// The metrics of one keyed instance on card `index`, given the card's processes.
    fn instance_reading(
        &self,
        record: &InstanceRecord,
        index: u32,
        now: u64,
        processes: &[pb::ProcessMetrics],
    ) -> pb::InstanceMetrics {
        let mut m = pb::InstanceMetrics {
            key: record.key.clone().unwrap_or_default(),
            device_index: index,
            device_uuid: record.device_uuid.clone(),
            timestamp_unix_ms: now,
            ..Default::default()
        };
        match (&record.spec, &record.mig) {
            (
                ShareSpec::Tdm {
                    core_percent,
                    memory_mib,
                },
                _,
            ) => {
                m.set_kind(pb::InstanceKind::Tdm);
                m.core_limit_percent = *core_percent;
                m.memory_limit_mib = *memory_mib;
            }
            (ShareSpec::Mig { profile, .. }, Some(ids)) => {
                m.set_kind(pb::InstanceKind::Mig);
                m.profile = profile.clone();
                m.gpu_instance_id = Some(ids.gpu_instance_id);
                let mig_memory = self
                    .nvml
                    .device_by_uuid(ids.device_uuid.as_str())
                    .and_then(|d| d.memory_info())
                    .ok();
                m.memory_limit_mib = mig_memory.as_ref().map_or(0, |x| mib(x.total));
                m.memory_used_mib = mig_memory.as_ref().map(|x| mib(x.used));
                m.processes = processes
                    .iter()
                    .filter(|p| p.gpu_instance_id == Some(ids.gpu_instance_id))
                    .cloned()
                    .collect();
                let utils: Vec<u32> = m
                    .processes
                    .iter()
                    .filter_map(|p| p.sm_util_percent)
                    .collect();
                m.sm_util_percent = (!utils.is_empty()).then(|| utils.iter().sum::<u32>().min(100));
            }
            (ShareSpec::Mig { profile, .. }, None) => {
                m.set_kind(pb::InstanceKind::Mig);
                m.profile = profile.clone();
            }
        }
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reader_sees_the_newest_samples_and_idle_processes_age_out() {
        let mut card = UtilSamples::default();
        assert_eq!(card.newest(), None);
        card.add([(1, 1_000_000, 40), (2, 1_000_000, 10)].into_iter());
        card.add([(1, 2_000_000, 55)].into_iter());
        assert_eq!(card.newest(), Some(2_000_000));
        // Read twice: the second reader sees what the first did.
        let first = card.at(2_500_000);
        assert_eq!(first, card.at(2_500_000));
        assert_eq!(first, BTreeMap::from([(1, 55), (2, 10)]));
        // An older sample never replaces a newer one.
        card.add([(1, 1_500_000, 99)].into_iter());
        assert_eq!(card.at(2_500_000)[&1], 55);
        // Six seconds on, process 2 has had no sample for longer than a sample counts.
        assert_eq!(card.at(6_500_000), BTreeMap::from([(1, 55)]));
    }
}
