//! Keys: the hardware does not know instance keys, so the backend keeps them (and TDM shares)
//! in a ledger saved to its state file. Creating, listing and destroying instances join the
//! ledger with the GPU instances on the card: one no key owns is listed unkeyed and can be
//! adopted by creating it again with the same profile and start; the key of one that is gone
//! is forgotten.

use super::Shared;
use super::convert::{call_error, ci_profile_index, mib};
use super::raw;
use crate::backend::{DestroyTarget, select_devices};
use crate::error::LayerError;
use crate::instances::{CreateRequest, InstanceRecord, MigIds, Resolution, ShareSpec, resolve};
use crate::store::change_and_save;
use crate::util::lock;
use nvml_wrapper::Device;
use nvml_wrapper::error::NvmlError;
use runtimekit_proto::resource::v1alpha1 as pb;

impl Shared {
    /// Saves the ledger to the state file, if there is one.
    fn persist(&self, ledger: &[InstanceRecord]) -> Result<(), LayerError> {
        match &self.store {
            Some(store) => store.save("nvml", &self.options.node_name, ledger),
            None => Ok(()),
        }
    }

    /// The instances of a card: TDM shares from the ledger, GPU instances from the hardware
    /// with their keys from the ledger. Keys of GPU instances that are gone are forgotten.
    pub(super) fn instances_on(
        &self,
        dev: &Device<'_>,
        index: u32,
        uuid: &str,
    ) -> Result<(Vec<InstanceRecord>, Vec<pb::MigProfileInfo>), LayerError> {
        let table = Self::table_of(dev);
        let mig_enabled = Self::mig_mode(dev).is_some_and(|(current, _)| current);
        let (hw, profiles) = if mig_enabled {
            let profiles = self
                .hw_profiles(dev, table)
                .map_err(|e| call_error("nvmlDeviceGetGpuInstanceProfileInfo", index, uuid, e))?;
            (
                self.hw_instances(dev, index, uuid, &profiles)?,
                Self::profile_infos(table, &profiles),
            )
        } else {
            (Vec::new(), Vec::new())
        };
        let same = |h: &InstanceRecord, r: &InstanceRecord| {
            r.device_uuid == h.device_uuid
                && r.spec == h.spec
                && r.mig.as_ref().map(|m| m.gpu_instance_id)
                    == h.mig.as_ref().map(|m| m.gpu_instance_id)
        };
        let mut ledger = lock(&self.ledger);
        let before = ledger.len();
        ledger.retain(|r| {
            r.device_uuid != uuid
                || matches!(r.spec, ShareSpec::Tdm { .. })
                || !mig_enabled
                || hw.iter().any(|h| same(h, r))
        });
        if ledger.len() != before {
            tracing::warn!(
                card = index,
                "forgetting keys of MIG instances that are gone"
            );
            if let Err(error) = self.persist(&ledger) {
                tracing::error!(%error, "cannot save the state file");
            }
        }
        let mut out: Vec<InstanceRecord> = ledger
            .iter()
            .filter(|r| r.device_uuid == uuid && matches!(r.spec, ShareSpec::Tdm { .. }))
            .cloned()
            .collect();
        for h in hw {
            match ledger.iter().find(|r| same(&h, r)) {
                Some(keyed) => {
                    let mut keyed = keyed.clone();
                    keyed.device_index = index;
                    keyed.mig = h.mig.clone();
                    out.push(keyed);
                }
                None => out.push(h),
            }
        }
        Ok((out, profiles))
    }

    /// Creates the instance of a request, returns the one its key already names, or adopts
    /// the unkeyed MIG instance it describes.
    pub(super) fn create(
        &self,
        request: CreateRequest,
    ) -> Result<pb::CreateInstanceResponse, LayerError> {
        let index = request.device_index;
        self.check_device(index, request.device_uuid.as_deref())?;
        let _changes = self.card_changes(index);
        let uuid = self.uuid_of(index);
        let dev = self.dev(index)?;
        let (on_card, profiles) = self.instances_on(&dev, index, &uuid)?;
        // Every keyed instance, plus the unkeyed ones of this card.
        let mut all: Vec<InstanceRecord> = lock(&self.ledger).clone();
        all.extend(on_card.iter().filter(|r| r.key.is_none()).cloned());
        match resolve(&all, &request, &uuid)? {
            Resolution::Existing(i) => {
                let existing = on_card
                    .iter()
                    .find(|r| r.key == all[i].key)
                    .unwrap_or(&all[i]);
                Ok(pb::CreateInstanceResponse {
                    instance: Some(existing.to_proto(&profiles)),
                    created: false,
                    adopted: false,
                })
            }
            Resolution::Adopt(i) => {
                let mut record = all[i].clone();
                record.key = Some(request.key.clone());
                if let Some(ids) = record.mig.as_mut().filter(|m| m.no_compute_instance) {
                    // Nothing runs in a GPU instance without a compute instance: give it its
                    // full one before handing it out.
                    self.complete(&dev, index, &uuid, &record.spec, ids)?;
                }
                self.remember(record.clone())?;
                tracing::info!(key = %request.key, card = index, "adopted an unkeyed MIG instance");
                Ok(pb::CreateInstanceResponse {
                    instance: Some(record.to_proto(&profiles)),
                    created: false,
                    adopted: true,
                })
            }
            Resolution::New => {
                let record = match &request.spec {
                    ShareSpec::Tdm { memory_mib, .. } => {
                        if Self::mig_mode(&dev).is_some_and(|(current, _)| current) {
                            return Err(LayerError::MigModeEnabled { index });
                        }
                        let total = dev.memory_info().map(|m| mib(m.total)).unwrap_or(u64::MAX);
                        if *memory_mib > total {
                            return Err(LayerError::InvalidArgument(format!(
                                "memory cap {memory_mib} MiB is more than card {index}'s {total} MiB"
                            )));
                        }
                        InstanceRecord {
                            key: Some(request.key.clone()),
                            device_index: index,
                            device_uuid: uuid.clone(),
                            spec: request.spec.clone(),
                            mig: None,
                            created_unix_ms: self.clock.now_ms(),
                        }
                    }
                    ShareSpec::Mig { profile, start } => self.create_mig(
                        &dev,
                        index,
                        &uuid,
                        &request.key,
                        profile,
                        *start,
                        &on_card,
                    )?,
                };
                let profiles = if record.mig.is_some() && profiles.is_empty() {
                    let table = Self::table_of(&dev);
                    let hw = self.hw_profiles(&dev, table).unwrap_or_default();
                    Self::profile_infos(table, &hw)
                } else {
                    profiles
                };
                if let Err(error) = self.remember(record.clone()) {
                    if let Some(ids) = &record.mig {
                        // Without the key the instance would be an orphan: undo it.
                        let _ = raw::destroy_gpu_instance(&self.nvml, &dev, ids.gpu_instance_id);
                    }
                    return Err(error);
                }
                tracing::info!(key = %request.key, card = index, "created an instance");
                Ok(pb::CreateInstanceResponse {
                    instance: Some(record.to_proto(&profiles)),
                    created: true,
                    adopted: false,
                })
            }
        }
    }

    /// Creates the full compute instance of a GPU instance that has none.
    fn complete(
        &self,
        dev: &Device<'_>,
        index: u32,
        uuid: &str,
        spec: &ShareSpec,
        ids: &mut MigIds,
    ) -> Result<(), LayerError> {
        let ShareSpec::Mig { profile, .. } = spec else {
            return Ok(());
        };
        let slices = Self::table_of(dev)
            .and_then(|t| t.profile(profile))
            .map(|p| p.slices)
            .ok_or_else(|| LayerError::Unsupported(format!("no MIG table entry for {profile}")))?;
        let ci_index = ci_profile_index(slices).ok_or_else(|| {
            LayerError::Unsupported(format!("no compute-instance profile for {profile}"))
        })?;
        ids.compute_instance_id =
            raw::create_compute_instance(&self.nvml, dev, ids.gpu_instance_id, ci_index)
                .map_err(|e| call_error("nvmlGpuInstanceCreateComputeInstance", index, uuid, e))?;
        ids.no_compute_instance = false;
        ids.device_uuid = self
            .mig_uuids(dev)
            .remove(&ids.gpu_instance_id)
            .unwrap_or_default();
        Ok(())
    }

    /// Adds a keyed record to the ledger and saves it; a failed save undoes the addition.
    fn remember(&self, record: InstanceRecord) -> Result<(), LayerError> {
        change_and_save(
            &mut lock(&self.ledger),
            |ledger| ledger.push(record),
            |ledger| self.persist(ledger),
        )
    }

    /// Removes the matching records from the ledger and saves it; a failed save undoes it.
    fn forget(&self, pred: impl Fn(&InstanceRecord) -> bool) -> Result<(), LayerError> {
        change_and_save(
            &mut lock(&self.ledger),
            |ledger| ledger.retain(|r| !pred(r)),
            |ledger| self.persist(ledger),
        )
    }

    /// Destroys an instance by key, or an unkeyed MIG instance by card and GPU-instance ID,
    /// under the hang watch and the card's change lock (a hung call holds up only its card).
    pub(super) fn destroy(
        &self,
        target: DestroyTarget,
    ) -> Result<pb::DestroyInstanceResponse, LayerError> {
        let (index, gi, record) = match &target {
            DestroyTarget::Key(key) => {
                let found = lock(&self.ledger)
                    .iter()
                    .find(|r| r.key.as_deref() == Some(key.as_str()))
                    .cloned();
                let Some(record) = found else {
                    return Ok(pb::DestroyInstanceResponse {
                        existed: false,
                        instance: None,
                    });
                };
                let index = self
                    .index_of_uuid(&record.device_uuid)
                    .unwrap_or(record.device_index);
                (
                    index,
                    record.mig.as_ref().map(|m| m.gpu_instance_id),
                    Some(record),
                )
            }
            DestroyTarget::Mig {
                device_index,
                gpu_instance_id,
            } => {
                self.check_device(*device_index, None)?;
                (*device_index, Some(*gpu_instance_id), None)
            }
        };
        let uuid = self.uuid_of(index);
        let _changes = self.card_changes(index);
        self.watch
            .call(index, &uuid, || self.destroy_on(index, &uuid, gi, record))
    }

    /// Destroys the GPU instance `gi` (if any) on card `index` and forgets its record.
    fn destroy_on(
        &self,
        index: u32,
        uuid: &str,
        gi: Option<u32>,
        record: Option<InstanceRecord>,
    ) -> Result<pb::DestroyInstanceResponse, LayerError> {
        let mut destroyed = record.clone();
        if let Some(gi) = gi {
            let dev = self.dev(index)?;
            if destroyed.is_none() {
                let (on_card, _) = self.instances_on(&dev, index, uuid)?;
                destroyed = on_card
                    .into_iter()
                    .find(|r| r.mig.as_ref().map(|m| m.gpu_instance_id) == Some(gi));
            }
            let existed = raw::destroy_gpu_instance(&self.nvml, &dev, gi).map_err(|e| match e {
                NvmlError::InUse => LayerError::InUse {
                    what: format!("GPU instance {gi} on card {index}"),
                },
                e => call_error("nvmlGpuInstanceDestroy", index, uuid, e),
            })?;
            if !existed && record.is_none() {
                return Ok(pb::DestroyInstanceResponse {
                    existed: false,
                    instance: None,
                });
            }
        }
        self.forget(|r| {
            r.device_uuid == uuid
                && match (&record, gi) {
                    (Some(rec), _) => r.key == rec.key,
                    (None, Some(gi)) => r.mig.as_ref().map(|m| m.gpu_instance_id) == Some(gi),
                    (None, None) => false,
                }
        })?;
        tracing::info!(card = index, "destroyed an instance");
        Ok(pb::DestroyInstanceResponse {
            existed: true,
            instance: destroyed.map(|r| r.to_proto(&[])),
        })
    }

    /// The instances of the selected cards; a card that is lost or cannot be read lists what
    /// the ledger knows of it, with its error.
    pub(super) fn list_instances(
        &self,
        devices: &[u32],
    ) -> Result<pb::ListInstancesResponse, LayerError> {
        let selected = select_devices(devices, self.count)?;
        let mut out = pb::ListInstancesResponse::default();
        for index in selected {
            let uuid = self.uuid_of(index);
            let listed = self.watch.call(index, &uuid, || {
                let dev = self.dev(index)?;
                self.instances_on(&dev, index, &uuid)
            });
            match listed {
                Ok((records, profiles)) => {
                    out.instances
                        .extend(records.iter().map(|r| r.to_proto(&profiles)));
                }
                Err(error) => {
                    if matches!(error, LayerError::DeviceLost { .. }) {
                        self.mark_lost(index);
                    }
                    out.instances
                        .extend(self.remembered(&uuid).iter().map(|r| r.to_proto(&[])));
                    out.errors.push(error.on_device(index, uuid));
                }
            }
        }
        Ok(out)
    }
}
