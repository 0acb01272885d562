//! Instances: TDM shares and MIG instances under caller-chosen keys, checked against the
//! card (MIG per the contract's tables, shares only where the hardware can share), created,
//! adopted, destroyed and listed, and kept in the state file so they survive a restart.

use super::profile::{CardSpec, VendorName, mig_uuid};
use super::{SimState, SimulatedBackend};
use crate::backend::{DestroyTarget, select_devices};
use crate::error::LayerError;
use crate::instances::{
    CreateRequest, InstanceRecord, MigIds, Resolution, ShareSpec, check_mig_placement, resolve,
    table_profiles,
};
use crate::store::change_and_save;
use crate::util::lock;
use runtimekit_proto::resource::v1alpha1 as pb;
use std::collections::BTreeSet;

/// Memory a MIG profile really offers: a little under what its name states (1g.10gb offers
/// 9984 MiB on an H100), in 128 MiB steps.
pub(super) fn hardware_mig_memory(named_mib: u64) -> u64 {
    named_mib * 39 / 40 / 128 * 128
}

impl SimulatedBackend {
    /// The backend name the state file is written for.
    fn backend_name(&self) -> String {
        format!("simulated:{}", self.profile.name)
    }

    /// Saves the instances to the state file, if there is one.
    pub(super) fn persist(&self, instances: &[InstanceRecord]) -> Result<(), LayerError> {
        match &self.store {
            Some(store) => store.save(&self.backend_name(), &self.options.node_name, instances),
            None => Ok(()),
        }
    }

    /// Checks an instance read from the state file (or the profile) against the cards.
    pub(super) fn check_loaded(
        &self,
        existing: &[InstanceRecord],
        record: &InstanceRecord,
    ) -> Result<(), LayerError> {
        let index = record.device_index;
        if self.uuid(index) != Some(record.device_uuid.as_str()) {
            return Err(LayerError::InvalidArgument(format!(
                "no card {index} with UUID {}",
                record.device_uuid
            )));
        }
        let others: Vec<&InstanceRecord> = existing
            .iter()
            .filter(|r| r.device_index == index)
            .collect();
        self.check_spec(index, &record.spec, &others).map(|_| ())
    }

    /// Checks a spec against the card and the instances on it; returns the MIG profile.
    fn check_spec(
        &self,
        index: u32,
        spec: &ShareSpec,
        others: &[&InstanceRecord],
    ) -> Result<Option<pb::MigProfileInfo>, LayerError> {
        let card = self.card(index);
        match spec {
            ShareSpec::Tdm { memory_mib, .. } => {
                if card.model.vendor == VendorName::Amd {
                    return Err(LayerError::SharingUnsupported {
                        index,
                        model: card.model.product_name.clone(),
                    });
                }
                if card.mig_enabled {
                    return Err(LayerError::MigModeEnabled { index });
                }
                if *memory_mib > card.model.memory_mib {
                    return Err(LayerError::InvalidArgument(format!(
                        "memory cap {memory_mib} MiB is more than card {index}'s {} MiB",
                        card.model.memory_mib
                    )));
                }
                Ok(None)
            }
            ShareSpec::Mig { profile, start } => {
                let Some(table) = card.table else {
                    return Err(LayerError::MigUnsupported {
                        index,
                        model: card.model.product_name.clone(),
                    });
                };
                if !card.mig_enabled {
                    return Err(LayerError::MigModeDisabled {
                        index,
                        model: card.model.product_name.clone(),
                    });
                }
                let profile = check_mig_placement(table, index, profile, *start, others)?;
                Ok(self
                    .mig_profiles(card)
                    .into_iter()
                    .find(|p| p.name == profile.name))
            }
        }
    }

    /// The MIG profiles of a card as the simulated hardware reports them.
    pub(super) fn mig_profiles(&self, card: &CardSpec) -> Vec<pb::MigProfileInfo> {
        let Some(table) = card.table else {
            return Vec::new();
        };
        table_profiles(table)
            .into_iter()
            .map(|mut p| {
                p.memory_mib = hardware_mig_memory(p.memory_mib);
                p
            })
            .collect()
    }

    /// The wire form of a record, with its card's MIG profiles.
    fn instance_proto(&self, record: &InstanceRecord) -> pb::Instance {
        let profiles = self.mig_profiles(self.card(record.device_index));
        record.to_proto(&profiles)
    }

    /// The GPU-instance ID the next MIG instance on a card gets, as the driver hands them out.
    fn lowest_free_gi(state: &SimState, index: u32) -> u32 {
        let used: BTreeSet<u32> = state
            .instances
            .iter()
            .filter(|r| r.device_index == index)
            .filter_map(|r| r.mig.as_ref().map(|m| m.gpu_instance_id))
            .collect();
        (1..).find(|id| !used.contains(id)).unwrap_or(1)
    }

    /// Changes the instances of a card and saves them; a failed save undoes the change.
    fn change(
        &self,
        state: &mut SimState,
        index: u32,
        change: impl FnOnce(&mut Vec<InstanceRecord>),
    ) -> Result<(), LayerError> {
        self.advance(state, index, self.options.clock.now_ms());
        change_and_save(&mut state.instances, change, |instances| {
            self.persist(instances)
        })
    }

    /// Creates the instance of a request, returns the one its key already names, or adopts
    /// the unkeyed MIG instance it describes.
    pub(super) fn create(
        &self,
        request: CreateRequest,
    ) -> Result<pb::CreateInstanceResponse, LayerError> {
        let index = request.device_index;
        self.check_device(index, request.device_uuid.as_deref())?;
        let mut state = self.enter(&[index])?;
        if state.cards[index as usize].lost {
            return Err(self.lost_error(index));
        }
        let uuid = self.uuids[index as usize].clone();
        match resolve(&state.instances, &request, &uuid)? {
            Resolution::Existing(i) => Ok(pb::CreateInstanceResponse {
                instance: Some(self.instance_proto(&state.instances[i])),
                created: false,
                adopted: false,
            }),
            Resolution::Adopt(i) => {
                let key = request.key.clone();
                self.change(&mut state, index, |instances| instances[i].key = Some(key))?;
                tracing::info!(key = %request.key, card = index, "adopted an unkeyed MIG instance");
                Ok(pb::CreateInstanceResponse {
                    instance: Some(self.instance_proto(&state.instances[i])),
                    created: false,
                    adopted: true,
                })
            }
            Resolution::New => {
                let others: Vec<&InstanceRecord> = state
                    .instances
                    .iter()
                    .filter(|r| r.device_index == index)
                    .collect();
                self.check_spec(index, &request.spec, &others)?;
                let now = self.options.clock.now_ms();
                let mig = matches!(request.spec, ShareSpec::Mig { .. }).then(|| {
                    let gpu_instance_id = Self::lowest_free_gi(&state, index);
                    MigIds {
                        gpu_instance_id,
                        compute_instance_id: 0,
                        device_uuid: mig_uuid(&uuid, gpu_instance_id, now),
                        no_compute_instance: false,
                    }
                });
                let record = InstanceRecord {
                    key: Some(request.key.clone()),
                    device_index: index,
                    device_uuid: uuid,
                    spec: request.spec,
                    mig,
                    created_unix_ms: now,
                };
                let instance = self.instance_proto(&record);
                self.change(&mut state, index, |instances| instances.push(record))?;
                tracing::info!(key = %request.key, card = index, "created an instance");
                Ok(pb::CreateInstanceResponse {
                    instance: Some(instance),
                    created: true,
                    adopted: false,
                })
            }
        }
    }

    /// Destroys an instance by key, or an unkeyed MIG instance by card and GPU-instance ID.
    pub(super) fn destroy(
        &self,
        target: DestroyTarget,
    ) -> Result<pb::DestroyInstanceResponse, LayerError> {
        let found = {
            let state = lock(&self.state);
            state
                .instances
                .iter()
                .find(|r| match &target {
                    DestroyTarget::Key(key) => r.key.as_deref() == Some(key.as_str()),
                    DestroyTarget::Mig {
                        device_index,
                        gpu_instance_id,
                    } => {
                        r.device_index == *device_index
                            && r.mig.as_ref().map(|m| m.gpu_instance_id) == Some(*gpu_instance_id)
                    }
                })
                .cloned()
        };
        if let DestroyTarget::Mig { device_index, .. } = &target {
            self.check_device(*device_index, None)?;
        }
        let Some(record) = found else {
            return Ok(pb::DestroyInstanceResponse {
                existed: false,
                instance: None,
            });
        };
        let index = record.device_index;
        let mut state = self.enter(&[index])?;
        if record.mig.is_some() && state.cards[index as usize].lost {
            return Err(self.lost_error(index));
        }
        let Some(position) = state.instances.iter().position(|r| *r == record) else {
            // Destroyed by a concurrent call meanwhile.
            return Ok(pb::DestroyInstanceResponse {
                existed: false,
                instance: None,
            });
        };
        self.change(&mut state, index, |instances| {
            instances.remove(position);
        })?;
        tracing::info!(instance = %record.describe(), card = index, "destroyed an instance");
        Ok(pb::DestroyInstanceResponse {
            existed: true,
            instance: Some(self.instance_proto(&record)),
        })
    }

    /// The instances of the selected cards.
    pub(super) fn instances_of(&self, devices: &[u32]) -> Result<Vec<pb::Instance>, LayerError> {
        let selected = select_devices(devices, self.count())?;
        let state = self.enter(&selected)?;
        Ok(state
            .instances
            .iter()
            .filter(|r| selected.contains(&r.device_index))
            .map(|r| self.instance_proto(r))
            .collect())
    }
}
