//! What the node's resource layer says about its device files: each card's by UUID, each MIG
//! instance's by key, each NIC's by name, and the control files every card needs.

use runtimekit_proto::resource::v1alpha1 as pb;
use std::collections::BTreeMap;

/// A MIG instance as a container is given it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigDevice {
    /// `MIG-<uuid>`.
    pub uuid: String,
    /// Its capability devices.
    pub nodes: Vec<String>,
}

/// The node's device files.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hardware {
    /// Each card's device files, by UUID.
    pub cards: BTreeMap<String, Vec<String>>,
    /// The files every container with a card needs.
    pub control: Vec<String>,
    /// MIG instances, by their resource-layer key.
    pub instances: BTreeMap<String, MigDevice>,
    /// Each NIC's device files, by name.
    pub nics: BTreeMap<String, Vec<String>>,
    /// The folder the files live under on the host (`/dev` in the container).
    pub device_root: String,
}

impl Hardware {
    /// From a listing of the cards (with their instances).
    pub fn from_listing(listing: &pb::ListDevicesResponse) -> Hardware {
        let mut hardware = Hardware {
            control: listing.control_nodes.clone(),
            device_root: listing.device_root.clone(),
            ..Hardware::default()
        };
        for device in &listing.devices {
            hardware
                .cards
                .insert(device.uuid.clone(), device.device_nodes.clone());
            for instance in &device.instances {
                if let Some(mig) = instance.mig.as_ref().filter(|_| !instance.key.is_empty()) {
                    hardware.instances.insert(
                        instance.key.clone(),
                        MigDevice {
                            uuid: mig.device_uuid.clone(),
                            nodes: mig.device_nodes.clone(),
                        },
                    );
                }
            }
        }
        for nic in &listing.nics {
            hardware
                .nics
                .insert(nic.name.clone(), nic.device_nodes.clone());
        }
        hardware
    }

    /// Every device file of the node: cards, instances, NICs and the control files.
    pub fn all_files(&self) -> Vec<String> {
        let mut files: Vec<String> = self
            .cards
            .values()
            .chain(self.nics.values())
            .flatten()
            .chain(self.instances.values().flat_map(|m| m.nodes.iter()))
            .chain(self.control.iter())
            .cloned()
            .collect();
        files.sort();
        files.dedup();
        files
    }
}
