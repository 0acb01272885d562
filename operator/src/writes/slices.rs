//! Writes to GpuSlices besides their creation: releasing them, and removing the node agent's
//! finalizer where no agent will.

use super::{is_not_found, log_failure};
use crate::state::{Unfinalize, Work};
use futures::future::join_all;
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use runtimekit_crds::{GpuSlice, SLICE_FINALIZER, SlicePhase};
use std::collections::BTreeSet;

/// What [`carry_out`] could not do, to try again.
#[derive(Debug, Default)]
pub struct Failed {
    /// Slices whose delete failed.
    pub release: Vec<(String, String)>,
}

/// Deletes the slices `work` releases and removes the finalizers it names, all at once. Returns
/// what failed, to try again.
pub async fn carry_out(client: &Client, work: &Work) -> Failed {
    let released = join_all(work.release.iter().map(|(namespace, name)| async move {
        let api: Api<GpuSlice> = Api::namespaced(client.clone(), namespace);
        let result = api.delete(name, &DeleteParams::background()).await;
        if result.is_ok() {
            tracing::info!(slice = %name, %namespace, "released the slice of an ended pod");
        }
        let failed = result.as_ref().is_err_and(|e| !is_not_found(e));
        log_failure("a slice's release", name, result.map(|_| ()));
        failed
    }))
    .await;
    join_all(
        work.unfinalize
            .iter()
            .map(|((namespace, name), why)| async move {
                let api: Api<GpuSlice> = Api::namespaced(client.clone(), namespace);
                let result = remove_finalizer(&api, name, *why).await;
                log_failure("a slice's finalizer", name, result);
            }),
    )
    .await;
    Failed {
        release: failures(&work.release, released),
    }
}

/// The keys whose write failed.
fn failures(keys: &BTreeSet<(String, String)>, failed: Vec<bool>) -> Vec<(String, String)> {
    keys.iter()
        .zip(failed)
        .filter(|(_, failed)| *failed)
        .map(|(key, _)| key.clone())
        .collect()
}

/// Removes the agent's finalizer with a JSON patch guarded by a test of the exact list, so a
/// concurrent change makes it fail rather than drop someone else's finalizer. A slice of a pod
/// never bound keeps it once its status shows an agent acted (the agent writes Bound before it
/// touches a card), and the test of the resourceVersion makes that check hold at the write.
async fn remove_finalizer(
    api: &Api<GpuSlice>,
    name: &str,
    why: Unfinalize,
) -> Result<(), kube::Error> {
    let slice = match api.get(name).await {
        Ok(s) => s,
        Err(kube::Error::Api(e)) if e.code == 404 => return Ok(()),
        Err(e) => return Err(e),
    };
    let finalizers = slice.metadata.finalizers.clone().unwrap_or_default();
    let Some(index) = finalizers.iter().position(|f| f == SLICE_FINALIZER) else {
        return Ok(());
    };
    let mut patch = vec![
        serde_json::json!({"op": "test", "path": "/metadata/finalizers", "value": finalizers}),
        serde_json::json!({"op": "remove", "path": format!("/metadata/finalizers/{index}")}),
    ];
    if why == Unfinalize::NeverEnacted {
        let phase = slice.status.as_ref().and_then(|s| s.phase);
        if !matches!(phase, None | Some(SlicePhase::Reserved)) {
            tracing::debug!(
                slice = name,
                ?phase,
                "its node agent acted on it and releases it"
            );
            return Ok(());
        }
        let version = slice.metadata.resource_version.clone().unwrap_or_default();
        patch.insert(
            0,
            serde_json::json!({"op": "test", "path": "/metadata/resourceVersion", "value": version}),
        );
    }
    let patch: json_patch::Patch =
        serde_json::from_value(serde_json::Value::Array(patch)).map_err(kube::Error::SerdeError)?;
    api.patch(name, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await
        .map(|_| ())
}
