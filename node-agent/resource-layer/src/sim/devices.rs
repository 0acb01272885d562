//! Discovery: the simulated cards as the backend lists them (identity, MIG state, topology
//! from the profile, instances), a lost card as a placeholder, and the paths between the
//! cards that answer.

use super::{SimState, SimulatedBackend};
use crate::backend::select_devices;
use crate::error::LayerError;
use runtimekit_proto::resource::v1alpha1 as pb;

impl SimulatedBackend {
    /// The selected cards, the paths between those that answer and the NICs.
    pub(super) fn list_cards(
        &self,
        devices: &[u32],
    ) -> Result<pb::ListDevicesResponse, LayerError> {
        let selected = select_devices(devices, self.count())?;
        let state = self.enter(&selected)?;
        let answering: Vec<u32> = selected
            .iter()
            .copied()
            .filter(|&i| !state.cards[i as usize].lost)
            .collect();
        Ok(pb::ListDevicesResponse {
            devices: selected.iter().map(|&i| self.device(&state, i)).collect(),
            nics: self.profile.nics.clone(),
            paths: self
                .profile
                .paths
                .iter()
                .filter(|p| answering.contains(&p.a) && answering.contains(&p.b))
                .cloned()
                .collect(),
            control_nodes: Vec::new(),
            device_root: String::new(),
            errors: Vec::new(),
        })
    }

    /// A card as the backend lists it; a lost card has its UUID and faults only.
    fn device(&self, state: &SimState, index: u32) -> pb::Device {
        let card = self.card(index);
        let uuid = self.uuids[index as usize].clone();
        let faults = self.hub.faults_of(index);
        if state.cards[index as usize].lost {
            let mut device = pb::Device {
                index,
                uuid,
                healthy: false,
                faults,
                ..Default::default()
            };
            device.set_state(pb::DeviceState::Lost);
            device.set_vendor(card.model.vendor.into());
            return device;
        }
        let profiles = self.mig_profiles(card);
        let instances = state
            .instances
            .iter()
            .filter(|r| r.device_index == index)
            .map(|r| r.to_proto(&profiles))
            .collect();
        let mig = match card.table {
            Some(table) => pb::MigState {
                capable: true,
                enabled: card.mig_enabled,
                pending_enabled: card.mig_enabled,
                table: table.model.to_string(),
                compute_slices: u32::from(table.compute_slices),
                memory_slices: u32::from(table.memory_slices),
                profiles,
            },
            None => pb::MigState::default(),
        };
        let mut device = pb::Device {
            index,
            uuid,
            model: card.model.product_name.clone(),
            memory_mib: card.model.memory_mib,
            pci_bus_id: card.pci_bus_id.clone(),
            pci_device_id: card.model.pci_device_id,
            serial: format!("1{:012}", self.card_seed(index) % 1_000_000_000_000),
            healthy: self.hub.healthy(index),
            faults,
            mig: Some(mig),
            topology: Some(card.topology.clone()),
            instances,
            ..Default::default()
        };
        device.set_vendor(card.model.vendor.into());
        device.set_state(pb::DeviceState::Ok);
        device
    }
}
