//! Readings: the metrics a simulated card and its instances report, built from one workload
//! per instance (the wave model of `metrics`); counters are brought up to date before the
//! instances of a card change.

use super::instances::hardware_mig_memory;
use super::metrics::{Workload, card_util, noise};
use super::profile::VendorName;
use super::{SimState, SimulatedBackend};
use crate::backend::select_devices;
use crate::error::LayerError;
use crate::instances::{InstanceRecord, ShareSpec};
use crate::util::lock;
use runtimekit_proto::resource::v1alpha1 as pb;

impl SimulatedBackend {
    /// The simulated workload of an instance: its memory and compute follow slow waves inside
    /// its caps (a TDM share's cap, or the MIG profile's memory and slices).
    fn workload(&self, record: &InstanceRecord) -> Workload {
        let card = self.card(record.device_index);
        let identity = format!(
            "{}/{}/{}",
            record.device_uuid,
            record.created_unix_ms,
            record.key.as_deref().unwrap_or("-")
        );
        let usable = card
            .model
            .memory_mib
            .saturating_sub(card.model.reserved_mib);
        match &record.spec {
            ShareSpec::Tdm {
                core_percent,
                memory_mib,
            } => Workload::new(
                self.options.seed,
                &identity,
                record.key.clone(),
                None,
                if *memory_mib == 0 {
                    usable / 4
                } else {
                    (*memory_mib).min(usable)
                },
                if *core_percent == 0 {
                    1.0
                } else {
                    f64::from(*core_percent) / 100.0
                },
            ),
            ShareSpec::Mig { profile, .. } => {
                let table = card.table;
                let named = table.and_then(|t| t.profile(profile));
                Workload::new(
                    self.options.seed,
                    &identity,
                    record.key.clone(),
                    record.mig.as_ref().map(|m| m.gpu_instance_id),
                    named.map_or(0, |p| hardware_mig_memory(p.memory_mib())),
                    match (named, table) {
                        (Some(p), Some(t)) => f64::from(p.slices) / f64::from(t.compute_slices),
                        _ => 0.0,
                    },
                )
            }
        }
    }

    /// The workloads of a card's instances.
    fn workloads(&self, state: &SimState, index: u32) -> Vec<Workload> {
        state
            .instances
            .iter()
            .filter(|r| r.device_index == index)
            .map(|r| self.workload(r))
            .collect()
    }

    /// Brings a card's counters up to now with its current instances (before they change).
    pub(super) fn advance(&self, state: &mut SimState, index: u32, now: u64) {
        let workloads = self.workloads(state, index);
        state.cards[index as usize]
            .counters
            .advance(self.card_seed(index), &workloads, now);
    }

    /// The one process a workload runs.
    fn process(workload: &Workload, t_ms: u64) -> pb::ProcessMetrics {
        pb::ProcessMetrics {
            pid: workload.pid,
            name: "python3".into(),
            used_memory_mib: Some(workload.memory_mib(t_ms)),
            sm_util_percent: Some(workload.card_percent(t_ms).round() as u32),
            gpu_instance_id: workload.gpu_instance_id,
            compute_instance_id: workload.gpu_instance_id.map(|_| 0),
            alive: Some(true),
            instance_key: workload.key.clone().unwrap_or_default(),
        }
    }

    /// The metrics of one card that answers, at `now`.
    fn card_metrics(
        &self,
        state: &mut SimState,
        index: u32,
        include_processes: bool,
        now: u64,
    ) -> pb::DeviceMetrics {
        self.advance(state, index, now);
        let card = self.card(index);
        let model = &card.model;
        let seed = self.card_seed(index);
        let workloads = self.workloads(state, index);
        let cs = &state.cards[index as usize];
        let loaded: u32 = cs.loads.values().sum();
        let util = card_util(seed, &workloads, now).max(f64::from(loaded.min(100)));
        let n = |salt: u64| noise(seed ^ salt, now);
        let nvidia = model.vendor == VendorName::Nvidia;
        let dead_mib: u64 = cs.dead.iter().map(|(_, mib)| mib).sum();
        let usable = model.memory_mib.saturating_sub(model.reserved_mib);
        let used =
            (workloads.iter().map(|w| w.memory_mib(now)).sum::<u64>() + dead_mib).min(usable);
        let temp = (30.0 + 0.45 * util + n(1)).clamp(25.0, 90.0);
        let mem_copy = (util * 0.55 + 2.0 * n(2)).clamp(0.0, 100.0);
        let power = model.idle_power_w
            + (model.max_power_w - model.idle_power_w) * util / 100.0
            + 2.0 * n(3);
        let sm_clock = if util > 2.0 {
            model.max_sm_clock_mhz - if temp > 80.0 { 90 } else { 0 }
        } else {
            model.idle_sm_clock_mhz
        };
        let pcie_rx =
            (model.pcie_gb_per_s * 1e9 * 0.2 * util / 100.0 * (1.0 + 0.1 * n(4))).max(0.0);
        let links = card.link_count() > 0;
        let ratio = |f: f64| (f / 100.0).clamp(0.0, 1.0);
        let link_bytes = cs.counters.link_bytes(card);
        let mut processes = Vec::new();
        if include_processes {
            processes.extend(workloads.iter().map(|w| Self::process(w, now)));
            processes.extend(cs.loads.iter().map(|(&pid, &percent)| pb::ProcessMetrics {
                pid,
                name: "load".into(),
                sm_util_percent: Some(percent),
                alive: Some(true),
                ..Default::default()
            }));
            processes.extend(cs.dead.iter().map(|&(pid, mib)| pb::ProcessMetrics {
                pid,
                used_memory_mib: Some(mib),
                sm_util_percent: Some(0),
                alive: Some(false),
                ..Default::default()
            }));
        }
        pb::DeviceMetrics {
            device_index: index,
            device_uuid: self.uuids[index as usize].clone(),
            timestamp_unix_ms: now,
            sm_clock_mhz: Some(sm_clock),
            mem_clock_mhz: Some(model.mem_clock_mhz),
            gpu_temp_c: Some(temp.round() as u32),
            memory_temp_c: Some((temp + 6.0).round() as u32),
            power_usage_w: Some((power.max(0.0) * 1000.0).round() / 1000.0),
            total_energy_mj: Some(cs.counters.energy_mj(card)),
            gpu_util_percent: Some(util.round() as u32),
            mem_copy_util_percent: Some(mem_copy.round() as u32),
            enc_util_percent: Some(0),
            dec_util_percent: Some(0),
            fb_used_mib: Some(used),
            fb_free_mib: Some(usable - used),
            fb_reserved_mib: Some(model.reserved_mib),
            pcie_tx_bytes_per_s: Some((pcie_rx * 0.6) as u64),
            pcie_rx_bytes_per_s: Some(pcie_rx as u64),
            pcie_replay_count: Some(seed % 3),
            nvlink_tx_bytes: links.then_some(link_bytes),
            nvlink_rx_bytes: links.then_some(link_bytes / 10 * 9),
            ecc_sbe_volatile: Some(0),
            ecc_dbe_volatile: Some(cs.dbe_volatile),
            ecc_sbe_aggregate: Some(seed % 4),
            ecc_dbe_aggregate: Some(cs.dbe_aggregate),
            retired_pages_sbe: (nvidia && !model.row_remapping).then_some(0),
            retired_pages_dbe: (nvidia && !model.row_remapping).then_some(0),
            retired_pages_pending: (nvidia && !model.row_remapping).then_some(false),
            remapped_rows_correctable: model.row_remapping.then_some(seed % 2),
            remapped_rows_uncorrectable: model.row_remapping.then_some(0),
            row_remap_pending: model.row_remapping.then_some(false),
            row_remap_failure: model.row_remapping.then_some(false),
            xid_last: cs.last_xid.map(u64::from),
            nvlink_crc_flit_errors: (links && nvidia).then_some(0),
            nvlink_crc_data_errors: (links && nvidia).then_some(0),
            nvlink_replay_errors: (links && nvidia).then_some(0),
            nvlink_recovery_errors: (links && nvidia).then_some(0),
            power_violation_ns: None,
            thermal_violation_ns: None,
            gr_engine_active: model.gpm.then(|| ratio(util)),
            sm_active: model.gpm.then(|| ratio(util * 0.92)),
            sm_occupancy: model.gpm.then(|| ratio(util * 0.4)),
            pipe_tensor_active: model.gpm.then(|| ratio(util * 0.55)),
            dram_active: model.gpm.then(|| ratio(mem_copy)),
            processes,
        }
    }

    /// The metrics of the selected cards; a lost card is listed under `errors`.
    pub(super) fn read_cards(
        &self,
        devices: &[u32],
        include_processes: bool,
    ) -> Result<pb::GetDeviceMetricsResponse, LayerError> {
        let selected = select_devices(devices, self.count())?;
        let mut state = self.enter(&selected)?;
        let now = self.options.clock.now_ms();
        let mut response = pb::GetDeviceMetricsResponse::default();
        for index in selected {
            if state.cards[index as usize].lost {
                response.errors.push(self.lost_entry(index));
            } else {
                response
                    .devices
                    .push(self.card_metrics(&mut state, index, include_processes, now));
            }
        }
        Ok(response)
    }

    /// The metrics of the keyed instances (all when `keys` is empty); a lost card lists its
    /// instances under `errors`.
    pub(super) fn read_instances(
        &self,
        keys: &[String],
    ) -> Result<pb::GetInstanceMetricsResponse, LayerError> {
        let cards: Vec<u32> = {
            let state = lock(&self.state);
            let mut cards: Vec<u32> = state
                .instances
                .iter()
                .filter(|r| r.keyed_among(keys))
                .map(|r| r.device_index)
                .collect();
            cards.sort_unstable();
            cards.dedup();
            cards
        };
        let state = self.enter(&cards)?;
        let now = self.options.clock.now_ms();
        let mut response = pb::GetInstanceMetricsResponse::default();
        for index in cards {
            if state.cards[index as usize].lost {
                response.errors.push(self.lost_entry(index));
                continue;
            }
            for record in state
                .instances
                .iter()
                .filter(|r| r.device_index == index && r.keyed_among(keys))
            {
                response
                    .instances
                    .push(self.instance_metrics(record, index, now));
            }
        }
        Ok(response)
    }

    /// The metrics of one keyed instance on card `index`.
    fn instance_metrics(
        &self,
        record: &InstanceRecord,
        index: u32,
        now: u64,
    ) -> pb::InstanceMetrics {
        let workload = self.workload(record);
        let (kind, core, limit, profile) = match &record.spec {
            ShareSpec::Tdm {
                core_percent,
                memory_mib,
            } => (
                pb::InstanceKind::Tdm,
                *core_percent,
                *memory_mib,
                String::new(),
            ),
            ShareSpec::Mig { profile, .. } => (
                pb::InstanceKind::Mig,
                0,
                workload.memory_limit_mib,
                profile.clone(),
            ),
        };
        let util = match kind {
            pb::InstanceKind::Mig => workload.busy_percent(now),
            _ => workload.card_percent(now),
        };
        let mut metrics = pb::InstanceMetrics {
            key: record.key.clone().unwrap_or_default(),
            device_index: index,
            device_uuid: record.device_uuid.clone(),
            timestamp_unix_ms: now,
            sm_util_percent: Some(util.round() as u32),
            memory_used_mib: Some(workload.memory_mib(now)),
            memory_limit_mib: limit,
            core_limit_percent: core,
            gpu_instance_id: record.mig.as_ref().map(|m| m.gpu_instance_id),
            profile,
            processes: vec![Self::process(&workload, now)],
            ..Default::default()
        };
        metrics.set_kind(kind);
        metrics
    }
}
