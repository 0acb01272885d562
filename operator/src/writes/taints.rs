//! The health taint's writes to Nodes. `spec.taints` is an atomic list (server-side apply would
//! take the whole list), so the writer reads the Node, replaces only the health-taint entry and
//! writes the list back under the resourceVersion it read: a change anyone made meanwhile fails
//! the write (409) rather than being lost, and the next pass tries again.

use super::{HEALTH, is_not_found};
use crate::state::TaintChange;
use k8s_openapi::api::core::v1::{Node, Taint};
use kube::api::{Api, Patch, PatchParams};
use runtimekit_placement::TaintEffect;

/// Gives `change.node` the health taint `change` asks for (key `key`), leaving every other
/// taint as it is; a failure is logged and retried by a later pass.
pub async fn set_health_taint(api: &Api<Node>, key: &str, change: &TaintChange) {
    let node = &change.node;
    let result = write(api, key, change).await;
    match &result {
        Ok(true) => match &change.taint {
            Some(taint) => {
                tracing::info!(node, value = %taint.value, "health taint set: a card is faulted")
            }
            None => tracing::info!(node, "health taint removed"),
        },
        Ok(false) => {}
        Err(error) if is_not_found(error) => {}
        Err(error) => tracing::warn!(node, %error, "could not write the health taint"),
    }
}

/// Writes the taint list; `Ok(false)` when the Node already has it.
async fn write(api: &Api<Node>, key: &str, change: &TaintChange) -> Result<bool, kube::Error> {
    let current = api.get(&change.node).await?;
    let existing = current
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let mut taints: Vec<Taint> = existing.iter().filter(|t| t.key != key).cloned().collect();
    if let Some(taint) = &change.taint {
        taints.push(Taint {
            key: key.to_owned(),
            value: Some(taint.value.clone()),
            effect: effect_name(taint.effect).to_owned(),
            time_added: None,
        });
    }
    if taints == existing {
        return Ok(false);
    }
    let list = if taints.is_empty() {
        serde_json::Value::Null
    } else {
        serde_json::to_value(&taints).map_err(kube::Error::SerdeError)?
    };
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": current.metadata.resource_version},
        "spec": {"taints": list},
    });
    let params = PatchParams {
        field_manager: Some(HEALTH.into()),
        ..PatchParams::default()
    };
    api.patch(&change.node, &params, &Patch::Merge(&patch))
        .await?;
    Ok(true)
}

/// The API's name of a taint effect.
fn effect_name(effect: TaintEffect) -> &'static str {
    match effect {
        TaintEffect::NoSchedule => "NoSchedule",
        TaintEffect::PreferNoSchedule => "PreferNoSchedule",
        TaintEffect::NoExecute => "NoExecute",
    }
}
