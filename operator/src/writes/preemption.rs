//! The writes of a preemption, in kube-scheduler's order: the preemptor's
//! `status.nominatedNodeName`, then for each victim the `DisruptionTarget` condition (reason
//! `PreemptionByScheduler`, which Job and JobSet read as a disruption, not a failure), an Event
//! naming the preemptor, and its deletion with its own grace period. A victim whose condition
//! cannot be written is not deleted (the admission policy lets the operator delete only pods it
//! marked so); every write names the pod's UID, so a pod recreated under the same name is left
//! alone.

use crate::state::{Eviction, Victim};
use crate::writes::report::{Condition, Reports};
use futures::future::join_all;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Client, ResourceExt};
use serde_json::json;

/// The condition a victim gets.
pub const DISRUPTION_TARGET: &str = "DisruptionTarget";
/// Its reason, as kube-scheduler writes it.
pub const PREEMPTION_BY_SCHEDULER: &str = "PreemptionByScheduler";

/// Writes every eviction of `eviction`; failures are logged (the preemptor retries, and
/// preempts again only once its nomination ends).
pub async fn evict(client: &Client, reports: &Reports, scheduler: &str, eviction: &Eviction) {
    let preemptor = &eviction.preemptor;
    if let Err(error) = nominate(client, preemptor, &eviction.node).await {
        tracing::warn!(pod = %preemptor.name_any(), %error, "could not record the nominated node");
    }
    let results = join_all(
        eviction
            .victims
            .iter()
            .map(|victim| evict_one(client, reports, scheduler, eviction, victim)),
    )
    .await;
    for (victim, result) in eviction.victims.iter().zip(results) {
        if let Err(error) = result
            && !crate::writes::is_not_found(&error)
        {
            tracing::warn!(victim = %victim.name, namespace = %victim.namespace, %error, "could not evict a preemption victim");
        }
    }
}

/// Sets the preemptor's `status.nominatedNodeName`.
async fn nominate(client: &Client, pod: &Pod, node: &str) -> Result<(), kube::Error> {
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
    let patch =
        json!({"metadata": {"uid": pod.metadata.uid}, "status": {"nominatedNodeName": node}});
    api.patch_status(
        &pod.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .map(drop)
}

/// Marks one victim, tells it why, and deletes it with its grace period.
async fn evict_one(
    client: &Client,
    reports: &Reports,
    scheduler: &str,
    eviction: &Eviction,
    victim: &Victim,
) -> Result<(), kube::Error> {
    let message = format!("{scheduler}: preempting to accommodate a higher priority pod");
    let condition = Condition {
        type_: DISRUPTION_TARGET,
        status: "True",
        reason: PREEMPTION_BY_SCHEDULER,
        message: &message,
    };
    reports
        .set_condition(
            &victim.namespace,
            &victim.name,
            Some(&victim.uid),
            &condition,
        )
        .await?;
    let preemptor = &eviction.preemptor;
    let reference = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(victim.namespace.clone()),
        name: Some(victim.name.clone()),
        uid: Some(victim.uid.clone()),
        ..ObjectReference::default()
    };
    let note = format!(
        "Preempted by pod {}/{} on node {}",
        preemptor.namespace().unwrap_or_default(),
        preemptor.name_any(),
        eviction.node
    );
    reports
        .event(&reference, false, "Preempted", "Preempting", &note)
        .await;
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(victim.uid.clone()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    Api::<Pod>::namespaced(client.clone(), &victim.namespace)
        .delete(&victim.name, &params)
        .await
        .map(drop)
}
