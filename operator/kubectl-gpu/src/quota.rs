//! Each namespace's use of its quotas on the card resources, counted as the scheduler counts it
//! (every replica of a pod), beside what the apiserver's ResourceQuota counts (once per pod).

use k8s_openapi::api::core::v1::{Pod, ResourceQuota};
use runtimekit_contract::quantity::parse_whole;
use runtimekit_contract::{RuntimeKitConfig, parse_pod};
use runtimekit_placement::quota::{Holding, Quota, Quotas};
use serde::Serialize;
use std::sync::Arc;

/// One quota's limit on one resource and what the namespace holds of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QuotaRow {
    pub namespace: String,
    pub quota: String,
    pub resource: String,
    /// What the namespace's running and bound pods hold, every replica counted: what the
    /// scheduler checks a new pod against.
    pub held: i64,
    pub hard: i64,
    /// What the ResourceQuota's status counts (each pod once, pending pods included).
    pub quota_counts: Option<i64>,
}

/// A row per quota and card resource it limits, by namespace, quota and resource.
pub fn rows(quotas: &[ResourceQuota], pods: &[Pod], config: &RuntimeKitConfig) -> Vec<QuotaRow> {
    let names = config.names();
    let mut ledger = Quotas::default();
    for quota in quotas {
        if let Some(parsed) = Quota::from_resource_quota(quota, &names) {
            ledger.upsert_quota(
                quota.metadata.namespace.as_deref().unwrap_or_default(),
                parsed,
            );
        }
    }
    for pod in pods.iter().filter(|p| holds(p)) {
        let ours = pod.spec.as_ref().and_then(|s| s.scheduler_name.as_deref())
            == Some(config.scheduler_name.as_str());
        let request = ours.then(|| parse_pod(pod, config).ok()).flatten();
        if let Some(holding) = Holding::of(pod, request.as_ref(), &names) {
            ledger.hold(
                pod.metadata.uid.as_deref().unwrap_or_default(),
                pod.metadata.namespace.as_deref().unwrap_or_default(),
                Arc::new(holding),
            );
        }
    }
    ledger
        .usage()
        .into_iter()
        .map(|usage| {
            let quota_counts = quotas
                .iter()
                .find(|q| {
                    q.metadata.namespace.as_deref() == Some(usage.namespace.as_str())
                        && q.metadata.name.as_deref() == Some(usage.quota.as_str())
                })
                .and_then(|q| q.status.as_ref()?.used.as_ref())
                .and_then(|used| used.get(&format!("requests.{}", usage.resource)))
                .and_then(|q| parse_whole(&q.0).ok());
            QuotaRow {
                namespace: usage.namespace,
                quota: usage.quota,
                resource: usage.resource,
                held: usage.held,
                hard: usage.hard,
                quota_counts,
            }
        })
        .collect()
}

/// Whether a pod holds cards as the scheduler counts them: bound, and neither ended nor being
/// deleted.
fn holds(pod: &Pod) -> bool {
    let bound = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty());
    let ended = matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    );
    bound && !ended && pod.metadata.deletion_timestamp.is_none()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn replicas_count_where_the_quota_counts_once() {
        let quota: ResourceQuota = serde_json::from_value(json!({
            "metadata": {"name": "gpu", "namespace": "team-a"},
            "spec": {"hard": {"requests.aliyun.com/gpu-core": "100", "requests.cpu": "8"}},
            "status": {"used": {"requests.aliyun.com/gpu-core": "50"}}}))
        .expect("quota");
        let pod = |name: &str, node: Option<&str>, phase: &str| -> Pod {
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "team-a", "uid": name,
                    "labels": {"replica": "2"}},
                "spec": {"schedulerName": "lj-runtimekit-scheduler", "nodeName": node,
                    "runtimeClassName": "lj-runtime",
                    "containers": [{"name": "c", "resources": {"limits": {"aliyun.com/gpu-core": "50"}}}]},
                "status": {"phase": phase}}))
            .expect("pod")
        };
        let pods = [
            pod("running", Some("n1"), "Running"),
            pod("pending", None, "Pending"),
            pod("done", Some("n1"), "Succeeded"),
        ];
        let rows = rows(&[quota], &pods, &RuntimeKitConfig::default());
        assert_eq!(
            rows,
            vec![QuotaRow {
                namespace: "team-a".into(),
                quota: "gpu".into(),
                resource: "aliyun.com/gpu-core".into(),
                held: 100,
                hard: 100,
                quota_counts: Some(50),
            }]
        );
    }
}
