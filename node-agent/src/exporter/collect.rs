//! The exporter's collector: every interval, one sample of the node (the resource layer's
//! card and instance readings, the agent's slices and faults, each process's pod) becomes the
//! snapshot a scrape serves. A reading the resource layer cannot give leaves its families
//! empty for that sample; health still shows.

use super::Snapshot;
use super::families::{Inputs, families};
use super::pids::pods_of;
use crate::model::NodeState;
use runtimekit_proto::resource::v1alpha1 as pb;
use runtimekit_proto::resource::v1alpha1::resource_layer_client::ResourceLayerClient;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tonic::transport::Channel;

/// How long one reading of the resource layer may take.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// The collector of one node.
#[derive(Debug)]
pub struct Collector {
    pub node: String,
    pub driver_version: String,
    pub layer: ResourceLayerClient<Channel>,
    pub state: watch::Receiver<NodeState>,
    pub snapshot: Arc<Snapshot>,
    pub interval: Duration,
    /// Where processes' cgroups are read (`/proc`).
    pub proc_root: PathBuf,
}

impl Collector {
    /// Samples the node every interval, forever (not while the exporter is switched off).
    pub async fn run(mut self) {
        loop {
            if self.snapshot.off().is_none() {
                self.sample().await;
            }
            tokio::time::sleep(self.interval).await;
        }
    }

    /// One sample into the snapshot.
    pub async fn sample(&mut self) {
        let mut request = tonic::Request::new(pb::GetDeviceMetricsRequest {
            device_indexes: Vec::new(),
            include_processes: true,
        });
        request.set_timeout(READ_TIMEOUT);
        let metrics = match self.layer.get_device_metrics(request).await {
            Ok(answer) => answer.into_inner().devices,
            Err(status) => {
                tracing::warn!(error = %status.message(), "exporter: card readings failed");
                Vec::new()
            }
        };
        let mut request = tonic::Request::new(pb::GetInstanceMetricsRequest { keys: Vec::new() });
        request.set_timeout(READ_TIMEOUT);
        let instances = match self.layer.get_instance_metrics(request).await {
            Ok(answer) => answer.into_inner().instances,
            Err(status) => {
                tracing::warn!(error = %status.message(), "exporter: instance readings failed");
                Vec::new()
            }
        };
        let pids: Vec<u32> = metrics
            .iter()
            .flat_map(|m| m.processes.iter().map(|p| p.pid))
            .collect();
        let proc_root = self.proc_root.clone();
        let pod_of_pid = tokio::task::spawn_blocking(move || pods_of(pids, &proc_root))
            .await
            .unwrap_or_default();
        let state = self.state.borrow().clone();
        let built = families(&Inputs {
            node_name: &self.node,
            hostname: &self.node,
            driver_version: &self.driver_version,
            state: &state,
            metrics: &metrics,
            instances: &instances,
            pod_of_pid: &pod_of_pid,
        });
        self.snapshot.set(built);
    }
}
