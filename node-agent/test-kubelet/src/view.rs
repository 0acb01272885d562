//! What the test kubelet shows its tests: the plugins it registered, the devices it gave to
//! containers and the outcome of admitting each pod.

use runtimekit_proto::deviceplugin::v1beta1 as dp;
use std::collections::BTreeMap;

/// A pod as the kubelet knows it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PodRef {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its UID.
    pub uid: String,
}

/// One registered plugin, as the test kubelet sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct PluginView {
    /// The options it gave.
    pub options: dp::DevicePluginOptions,
    /// Its devices, as the last ListAndWatch message listed them.
    pub devices: Vec<dp::Device>,
    /// Whether its ListAndWatch stream is open.
    pub connected: bool,
    /// How many times it registered.
    pub registrations: u32,
}

impl PluginView {
    /// The IDs of its healthy devices.
    pub fn healthy(&self) -> Vec<String> {
        self.devices
            .iter()
            .filter(|d| d.health == dp::HEALTHY)
            .map(|d| d.id.clone())
            .collect()
    }
}

/// What the test kubelet knows now.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KubeletView {
    /// Plugins by resource name.
    pub plugins: BTreeMap<String, PluginView>,
    /// Devices given to containers: (pod UID, container) → resource → device IDs.
    pub allocations: BTreeMap<(String, String), BTreeMap<String, Vec<String>>>,
    /// The outcome of admitting each pod (by UID), when pods are admitted from a Node.
    pub admissions: BTreeMap<String, Result<(), String>>,
}

impl KubeletView {
    /// Capacity (devices) and allocatable (healthy devices) of every registered resource, as
    /// the kubelet reports them in the Node's status.
    pub fn capacity(&self) -> BTreeMap<String, (u64, u64)> {
        self.plugins
            .iter()
            .map(|(name, p)| {
                (
                    name.clone(),
                    (p.devices.len() as u64, p.healthy().len() as u64),
                )
            })
            .collect()
    }

    /// The devices of `resource` given to a pod's containers.
    pub fn devices_of(&self, pod_uid: &str, resource: &str) -> Vec<String> {
        self.allocations
            .iter()
            .filter(|((uid, _), _)| uid == pod_uid)
            .flat_map(|(_, r)| r.get(resource).cloned().unwrap_or_default())
            .collect()
    }
}
