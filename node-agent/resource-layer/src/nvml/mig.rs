//! MIG: the GPU-instance profiles of a card (from the contract's table of the model, with the
//! sizes, profile IDs and placements the driver reports; probed on a model without a table),
//! the GPU instances on it, and creating one at a placement with its full compute instance.
//! MIG mode is read, never changed.

use super::Shared;
use super::convert::{
    call_error, ci_profile_index, fallback_profile_name, gi_profile_index, mib, no_room,
};
use super::raw;
use crate::error::LayerError;
use crate::instances::{InstanceRecord, MigIds, ShareSpec, check_mig_placement, max_alone};
use nvml_wrapper::Device;
use nvml_wrapper::error::NvmlError;
use runtimekit_contract::mig::{MigProfile, MigTable, table_for};
use runtimekit_proto::resource::v1alpha1 as pb;
use std::collections::BTreeMap;

/// A GPU-instance profile of a card as the driver reports it.
#[derive(Debug, Clone)]
pub(super) struct HwProfile {
    /// The contract's profile, when the model has a table.
    table: Option<&'static MigProfile>,
    /// `ProfileInfo.id`.
    id: u32,
    slices: u32,
    instance_count: u32,
    memory_mb: u64,
    multiprocessors: u32,
    placements: Vec<raw::GiPlacement>,
    hw_name: String,
}

impl HwProfile {
    fn name(&self) -> String {
        match self.table {
            Some(p) => p.name.to_string(),
            None if !self.hw_name.is_empty() => self.hw_name.clone(),
            None => fallback_profile_name(self.slices, self.memory_mb),
        }
    }
}

/// GPU-instance profile indexes asked before giving up on a driver that never answers
/// INVALID_ARGUMENT (driver 550 has 17).
const MAX_PROFILE_INDEXES: u32 = 64;

impl Shared {
    /// The contract's MIG table of the card's model, if it has one.
    pub(super) fn table_of(dev: &Device<'_>) -> Option<&'static MigTable> {
        let name = dev.name().ok()?;
        let memory = dev.memory_info().ok().map(|m| mib(m.total))?;
        table_for(&name, memory)
    }

    /// MIG mode (current, pending); `None` when the card has no MIG.
    pub(super) fn mig_mode(dev: &Device<'_>) -> Option<(bool, bool)> {
        dev.mig_mode()
            .ok()
            .map(|m| (m.current == 1, m.pending == 1))
    }

    /// The GPU-instance profiles of a card: every index the driver answers, until it says
    /// INVALID_ARGUMENT (newer drivers have profiles past nvml-wrapper's constants, and
    /// instances of any profile occupy slices). A profile is left out only when the driver
    /// says NOT_SUPPORTED; any other error is the caller's, so no instance goes unlisted.
    pub(super) fn hw_profiles(
        &self,
        dev: &Device<'_>,
        table: Option<&'static MigTable>,
    ) -> Result<Vec<HwProfile>, NvmlError> {
        let mut out = Vec::new();
        for index in 0..MAX_PROFILE_INDEXES {
            let info = match dev.profile_info(index) {
                Ok(info) => info,
                Err(NvmlError::NotSupported) => continue,
                Err(NvmlError::InvalidArg) => break,
                Err(e) => return Err(e),
            };
            let table = table.and_then(|t| {
                t.profiles
                    .iter()
                    .find(|p| gi_profile_index(p.slices, p.memory_slices) == Some(index))
            });
            out.push(HwProfile {
                table,
                id: info.id,
                slices: info.slice_count,
                instance_count: info.instance_count,
                memory_mb: info.memory_size_mb,
                multiprocessors: info.multiprocessor_count,
                placements: raw::possible_placements(&self.nvml, dev, info.id).unwrap_or_default(),
                hw_name: raw::gi_profile_name(&self.nvml, dev, index).unwrap_or_default(),
            });
        }
        Ok(out)
    }

    /// The profiles on the wire: the table's, with what the driver reports.
    pub(super) fn profile_infos(
        table: Option<&'static MigTable>,
        hw: &[HwProfile],
    ) -> Vec<pb::MigProfileInfo> {
        match table {
            Some(t) => t
                .profiles
                .iter()
                .map(|p| {
                    let h = hw
                        .iter()
                        .find(|h| h.table.is_some_and(|x| x.name == p.name));
                    pb::MigProfileInfo {
                        name: p.name.to_string(),
                        slices: u32::from(p.slices),
                        memory_slices: u32::from(p.memory_slices),
                        memory_mib: h.map_or(p.memory_mib(), |h| h.memory_mb),
                        starts: match h {
                            Some(h) if !h.placements.is_empty() => {
                                h.placements.iter().map(|pl| pl.start).collect()
                            }
                            _ => p.starts.iter().map(|s| u32::from(*s)).collect(),
                        },
                        max_instances: h.map_or_else(|| max_alone(t, p), |h| h.instance_count),
                        nvml_profile_id: h.map_or(0, |h| h.id),
                        multiprocessors: h.map_or(0, |h| h.multiprocessors),
                        hardware_name: h
                            .map(|h| h.hw_name.clone())
                            .filter(|n| !n.is_empty() && n != p.name)
                            .unwrap_or_default(),
                    }
                })
                .collect(),
            None => hw
                .iter()
                .map(|h| pb::MigProfileInfo {
                    name: h.name(),
                    slices: h.slices,
                    memory_slices: h.placements.first().map_or(0, |p| p.size),
                    memory_mib: h.memory_mb,
                    starts: h.placements.iter().map(|p| p.start).collect(),
                    max_instances: h.instance_count,
                    nvml_profile_id: h.id,
                    multiprocessors: h.multiprocessors,
                    hardware_name: h.hw_name.clone(),
                })
                .collect(),
        }
    }

    /// MIG device UUIDs by GPU-instance ID.
    pub(super) fn mig_uuids(&self, dev: &Device<'_>) -> BTreeMap<u32, String> {
        let max = dev.mig_device_count().unwrap_or(0);
        (0..max)
            .filter_map(|i| {
                let mig = dev.mig_device_by_index(i).ok()?;
                Some((
                    raw::gpu_instance_id(&self.nvml, &mig).ok()?,
                    mig.uuid().ok()?,
                ))
            })
            .collect()
    }

    /// The GPU instances on a card, unkeyed.
    pub(super) fn hw_instances(
        &self,
        dev: &Device<'_>,
        index: u32,
        uuid: &str,
        hw: &[HwProfile],
    ) -> Result<Vec<InstanceRecord>, LayerError> {
        let uuids = self.mig_uuids(dev);
        let now = self.clock.now_ms();
        let mut out = Vec::new();
        for profile in hw {
            let gis = raw::gpu_instances(&self.nvml, dev, profile.id, profile.instance_count)
                .map_err(|e| call_error("nvmlDeviceGetGpuInstances", index, uuid, e))?;
            for gi in gis {
                let cis = raw::compute_instance_ids(&self.nvml, dev, gi.id).map_err(|e| {
                    call_error("nvmlGpuInstanceGetComputeInstances", index, uuid, e)
                })?;
                out.push(InstanceRecord {
                    key: None,
                    device_index: index,
                    device_uuid: uuid.to_string(),
                    spec: ShareSpec::Mig {
                        profile: profile.name(),
                        start: u8::try_from(gi.placement.start).unwrap_or(u8::MAX),
                    },
                    mig: Some(MigIds {
                        gpu_instance_id: gi.id,
                        compute_instance_id: cis.first().copied().unwrap_or(0),
                        device_uuid: uuids.get(&gi.id).cloned().unwrap_or_default(),
                        no_compute_instance: cis.is_empty(),
                    }),
                    created_unix_ms: now,
                });
            }
        }
        out.sort_by_key(|r| r.mig.as_ref().map(|m| m.gpu_instance_id));
        Ok(out)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn create_mig(
        &self,
        dev: &Device<'_>,
        index: u32,
        uuid: &str,
        key: &str,
        profile_name: &str,
        start: u8,
        on_card: &[InstanceRecord],
    ) -> Result<InstanceRecord, LayerError> {
        let name = dev
            .name()
            .map_err(|e| call_error("nvmlDeviceGetName", index, uuid, e))?;
        let Some((current, _)) = Self::mig_mode(dev) else {
            return Err(LayerError::MigUnsupported { index, model: name });
        };
        let Some(table) = Self::table_of(dev) else {
            return Err(LayerError::MigUnsupported { index, model: name });
        };
        if !current {
            return Err(LayerError::MigModeDisabled { index, model: name });
        }
        let others: Vec<&InstanceRecord> = on_card
            .iter()
            .filter(|r| matches!(r.spec, ShareSpec::Mig { .. }))
            .collect();
        let profile = check_mig_placement(table, index, profile_name, start, &others)?;
        let gi_index =
            gi_profile_index(profile.slices, profile.memory_slices).ok_or_else(|| {
                LayerError::Unsupported(format!("no NVML profile for {}", profile.name))
            })?;
        let info = dev
            .profile_info(gi_index)
            .map_err(|e| call_error("nvmlDeviceGetGpuInstanceProfileInfo", index, uuid, e))?;
        let placement = raw::GiPlacement {
            start: u32::from(start),
            size: u32::from(profile.memory_slices),
        };
        // The driver's own placement list must agree with the table.
        if let Ok(possible) = raw::possible_placements(&self.nvml, dev, info.id)
            && !possible.is_empty()
            && !possible.contains(&placement)
        {
            return Err(LayerError::IllegalPlacement {
                table: table.model.to_string(),
                profile: profile.name.to_string(),
                start: u32::from(start),
                legal: possible
                    .iter()
                    .map(|p| p.start.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        let gi = raw::create_gpu_instance(&self.nvml, dev, info.id, placement).map_err(|e| {
            if no_room(&e) {
                LayerError::Overlap {
                    index,
                    profile: profile.name.to_string(),
                    start: u32::from(start),
                    other: "an instance the driver reports there".into(),
                }
            } else {
                call_error("nvmlDeviceCreateGpuInstanceWithPlacement", index, uuid, e)
            }
        })?;
        let ci_index = ci_profile_index(profile.slices).ok_or_else(|| {
            LayerError::Unsupported(format!("no compute-instance profile for {}", profile.name))
        })?;
        let ci = match raw::create_compute_instance(&self.nvml, dev, gi.id, ci_index) {
            Ok(ci) => ci,
            Err(e) => {
                let _ = raw::destroy_gpu_instance(&self.nvml, dev, gi.id);
                return Err(call_error(
                    "nvmlGpuInstanceCreateComputeInstance",
                    index,
                    uuid,
                    e,
                ));
            }
        };
        tracing::info!(
            key,
            card = index,
            gpu_instance = gi.id,
            "created a MIG instance"
        );
        Ok(InstanceRecord {
            key: Some(key.to_string()),
            device_index: index,
            device_uuid: uuid.to_string(),
            spec: ShareSpec::Mig {
                profile: profile.name.to_string(),
                start,
            },
            mig: Some(MigIds {
                gpu_instance_id: gi.id,
                compute_instance_id: ci,
                device_uuid: self.mig_uuids(dev).remove(&gi.id).unwrap_or_default(),
                no_compute_instance: false,
            }),
            created_unix_ms: self.clock.now_ms(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hardware_profiles_are_named_from_the_table_or_the_driver() {
        let table = table_for("NVIDIA H100 80GB HBM3", 81_559 * 1024 / 1024).expect("table");
        let p = table.profile("3g.40gb").expect("3g");
        let hw = HwProfile {
            table: Some(p),
            id: 9,
            slices: 3,
            instance_count: 2,
            memory_mb: 40_448,
            multiprocessors: 60,
            placements: vec![
                raw::GiPlacement { start: 0, size: 4 },
                raw::GiPlacement { start: 4, size: 4 },
            ],
            hw_name: "3g.40gb".into(),
        };
        assert_eq!(hw.name(), "3g.40gb");
        let infos = Shared::profile_infos(Some(table), std::slice::from_ref(&hw));
        let info = infos.iter().find(|i| i.name == "3g.40gb").expect("listed");
        assert_eq!(info.memory_mib, 40_448);
        assert_eq!(info.starts, [0, 4]);
        assert_eq!(info.nvml_profile_id, 9);
        assert_eq!(info.multiprocessors, 60);
        assert!(info.hardware_name.is_empty(), "same name as the table");
        // Profiles the driver did not report keep the table's figures.
        let g1 = infos.iter().find(|i| i.name == "1g.10gb").expect("listed");
        assert_eq!(g1.memory_mib, 10_240);
        assert_eq!(g1.max_instances, 7);
        // Without a table, the driver's name or one built from slices and memory.
        let bare = HwProfile {
            table: None,
            hw_name: String::new(),
            ..hw
        };
        assert_eq!(bare.name(), "3g.40gb");
        let listed = Shared::profile_infos(None, &[bare]);
        assert_eq!(listed[0].memory_slices, 4);
    }
}
