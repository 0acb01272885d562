//! What the test kubelet keeps in memory, shared by its servers and tasks: the registered
//! plugins, the devices given to containers (its checkpoint) and the admitted pods.

use crate::view::{KubeletView, PluginView, PodRef};
use runtimekit_node_agent::task::AbortOnDrop;
use runtimekit_proto::deviceplugin::v1beta1::device_plugin_client::DevicePluginClient;
use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use tokio::sync::watch;
use tonic::transport::Channel;

/// A registered plugin: the client to call it, what it showed, and its ListAndWatch task.
pub(crate) struct Plugin {
    pub(crate) client: DevicePluginClient<Channel>,
    pub(crate) view: PluginView,
    /// Which registration this is; a stream of an older one stops writing.
    pub(crate) generation: u64,
    pub(crate) _watch: AbortOnDrop<()>,
}

/// The kubelet's books.
#[derive(Default)]
pub(crate) struct Books {
    /// Plugins by resource name.
    pub(crate) plugins: BTreeMap<String, Plugin>,
    /// How many times each resource registered.
    pub(crate) registrations: BTreeMap<String, u32>,
    /// (pod UID, container) → resource → device IDs.
    pub(crate) allocations: BTreeMap<(String, String), BTreeMap<String, Vec<String>>>,
    /// Pods holding devices, by UID.
    pub(crate) pods: BTreeMap<String, PodRef>,
    /// The outcome of admitting each pod, by UID.
    pub(crate) admissions: BTreeMap<String, Result<(), String>>,
    /// The last registration's generation.
    pub(crate) generation: u64,
}

/// The books and the signals around them, shared by the servers and tasks.
pub(crate) struct Shared {
    pub(crate) books: Mutex<Books>,
    /// Counts changes, so waiters wake up.
    pub(crate) changed: watch::Sender<u64>,
    /// Admits one container at a time, as the device manager does.
    pub(crate) admitting: tokio::sync::Mutex<()>,
}

impl Shared {
    pub(crate) fn books(&self) -> MutexGuard<'_, Books> {
        self.books.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Tells the waiters that something changed.
    pub(crate) fn touch(&self) {
        self.changed.send_modify(|n| *n += 1);
    }

    pub(crate) fn view(&self) -> KubeletView {
        let books = self.books();
        KubeletView {
            plugins: books
                .plugins
                .iter()
                .map(|(k, p)| (k.clone(), p.view.clone()))
                .collect(),
            allocations: books.allocations.clone(),
            admissions: books.admissions.clone(),
        }
    }
}
