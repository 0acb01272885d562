//! The Node's capacity and allocatable, written as the kubelet reports them.

use crate::books::Shared;
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// Keeps the Node's capacity and allocatable for the registered resources in line with the
/// plugins' devices, checking again every second (kwok writes the status too).
pub(crate) async fn sync_node(shared: Arc<Shared>, client: Client, node: String) {
    let nodes: Api<Node> = Api::all(client);
    let mut changed = shared.changed.subscribe();
    loop {
        let capacity = shared.view().capacity();
        if let Ok(current) = nodes.get_status(&node).await {
            let status = current.status.unwrap_or_default();
            let have = |map: &Option<
                BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
            >,
                        name: &str| {
                map.as_ref().and_then(|m| m.get(name)).map(|q| q.0.clone())
            };
            let stale = capacity.iter().any(|(name, (c, a))| {
                have(&status.capacity, name) != Some(c.to_string())
                    || have(&status.allocatable, name) != Some(a.to_string())
            });
            if stale {
                let caps: BTreeMap<&String, String> = capacity
                    .iter()
                    .map(|(k, (c, _))| (k, c.to_string()))
                    .collect();
                let allocs: BTreeMap<&String, String> = capacity
                    .iter()
                    .map(|(k, (_, a))| (k, a.to_string()))
                    .collect();
                let patch =
                    serde_json::json!({"status": {"capacity": caps, "allocatable": allocs}});
                if let Err(error) = nodes
                    .patch_status(&node, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    tracing::warn!(%error, %node, "test kubelet: cannot write the node's status");
                }
            }
        }
        let _ = tokio::time::timeout(Duration::from_secs(1), changed.changed()).await;
    }
}
