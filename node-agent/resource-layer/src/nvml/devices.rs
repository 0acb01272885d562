//! Discovery: what the NVML backend lists of each card (index, UUID, name, memory, PCI,
//! serial, MIG state, topology, instances), the placeholder a lost card leaves, and a card
//! read in part: one card's failing query is that card's error, never the listing's.

use super::Shared;
use super::convert::{call_error, mib};
use crate::backend::select_devices;
use crate::error::LayerError;
use runtimekit_contract::mig::table_for;
use runtimekit_proto::resource::v1alpha1 as pb;

impl Shared {
    /// The selected cards (a lost one as a placeholder), the paths between them and the RDMA
    /// NICs.
    pub(super) fn list_devices(
        &self,
        devices: &[u32],
    ) -> Result<pb::ListDevicesResponse, LayerError> {
        let selected = select_devices(devices, self.count)?;
        let mut out = Vec::new();
        let mut errors = Vec::new();
        for &index in &selected {
            let uuid = self.uuid_of(index);
            let mut partial = Vec::new();
            match self
                .watch
                .call(index, &uuid, || self.device_proto(index, &mut partial))
            {
                Ok(device) => out.push(device),
                Err(LayerError::DeviceLost { .. }) => {
                    self.mark_lost(index);
                    out.push(self.placeholder(index, pb::DeviceState::Lost));
                }
                Err(e) => {
                    partial.push(e.on_device(index, uuid));
                    out.push(self.placeholder(index, pb::DeviceState::Partial));
                }
            }
            errors.append(&mut partial);
        }
        let paths = self.paths_and_groups(&mut out);
        Ok(pb::ListDevicesResponse {
            devices: out,
            nics: self.sysfs.rdma_nics(),
            paths,
            control_nodes: Vec::new(),
            device_root: String::new(),
            errors,
        })
    }

    /// Everything the backend reports of a card that answers. A failure to read its MIG
    /// instances goes to `errors` and leaves the card `Partial` with the instances the ledger
    /// knows; any other failure is the caller's.
    fn device_proto(
        &self,
        index: u32,
        errors: &mut Vec<pb::DeviceError>,
    ) -> Result<pb::Device, LayerError> {
        let dev = self.dev(index)?;
        let uuid = dev
            .uuid()
            .map_err(|e| call_error("nvmlDeviceGetUUID", index, &self.uuid_of(index), e))?;
        let e = |call| {
            let uuid = uuid.clone();
            move |err| call_error(call, index, &uuid, err)
        };
        let name = dev.name().map_err(e("nvmlDeviceGetName"))?;
        let memory = dev.memory_info().map_err(e("nvmlDeviceGetMemoryInfo_v2"))?;
        let pci = dev.pci_info().map_err(e("nvmlDeviceGetPciInfo_v3"))?;
        let table = table_for(&name, mib(memory.total));
        let mode = Self::mig_mode(&dev);
        let (instances, mut profiles, state) = match self.instances_on(&dev, index, &uuid) {
            Ok((instances, profiles)) => (instances, profiles, pb::DeviceState::Ok),
            Err(e @ LayerError::DeviceLost { .. }) => return Err(e),
            Err(e) => {
                errors.push(e.on_device(index, uuid.clone()));
                (self.remembered(&uuid), Vec::new(), pb::DeviceState::Partial)
            }
        };
        if profiles.is_empty() && mode.is_some() {
            // MIG off: the driver offers no profiles; the table's are shown.
            let hw = self.hw_profiles(&dev, table).unwrap_or_default();
            profiles = Self::profile_infos(table, &hw);
        }
        let mig = match mode {
            Some((current, pending)) => pb::MigState {
                capable: true,
                enabled: current,
                pending_enabled: pending,
                table: table.map(|t| t.model.to_string()).unwrap_or_default(),
                compute_slices: table.map_or(0, |t| u32::from(t.compute_slices)),
                memory_slices: table.map_or(0, |t| u32::from(t.memory_slices)),
                profiles: profiles.clone(),
            },
            None => pb::MigState::default(),
        };
        let topology = self.topology(&dev, &pci.bus_id);
        let mut device = pb::Device {
            index,
            uuid: uuid.clone(),
            model: name,
            memory_mib: mib(memory.total),
            pci_bus_id: pci.bus_id,
            pci_device_id: pci.pci_device_id,
            serial: dev.serial().unwrap_or_default(),
            healthy: self.hub.healthy(index),
            faults: self.hub.faults_of(index),
            mig: Some(mig),
            topology: Some(topology),
            instances: instances.iter().map(|r| r.to_proto(&profiles)).collect(),
            ..Default::default()
        };
        device.set_vendor(pb::Vendor::Nvidia);
        device.set_state(state);
        Ok(device)
    }

    /// A card that fell off the bus (`Lost`) or could not be read (`Partial`): its UUID,
    /// health, faults and remembered instances, nothing read from it.
    fn placeholder(&self, index: u32, state: pb::DeviceState) -> pb::Device {
        let uuid = self.uuid_of(index);
        let mut device = pb::Device {
            index,
            instances: self
                .remembered(&uuid)
                .iter()
                .map(|r| r.to_proto(&[]))
                .collect(),
            uuid,
            healthy: self.hub.healthy(index),
            faults: self.hub.faults_of(index),
            ..Default::default()
        };
        device.set_vendor(pb::Vendor::Nvidia);
        device.set_state(state);
        device
    }
}
