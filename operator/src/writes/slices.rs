//! Writes to GpuSlices besides their creation: releasing them, removing the node agent's
//! finalizer where no agent will, and marking a gang member's slice Reserved.

use super::{apply_body, log_failure};
use crate::state::Work;
use futures::future::join_all;
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use runtimekit_crds::{GpuSlice, SLICE_FINALIZER, SlicePhase};

/// Deletes the slices `work` releases and removes the finalizers it names, all at once.
pub async fn carry_out(client: &Client, work: &Work) {
    join_all(work.release.iter().map(|(namespace, name)| async move {
        let api: Api<GpuSlice> = Api::namespaced(client.clone(), namespace);
        let result = api.delete(name, &DeleteParams::background()).await;
        if result.is_ok() {
            tracing::info!(slice = %name, %namespace, "released the slice of an ended pod");
        }
        log_failure("a slice's release", name, result.map(|_| ()));
    }))
    .await;
    join_all(work.unfinalize.iter().map(|(namespace, name)| async move {
        let api: Api<GpuSlice> = Api::namespaced(client.clone(), namespace);
        let result = remove_finalizer(&api, name).await;
        log_failure("a slice's finalizer", name, result);
    }))
    .await;
}

/// Removes the agent's finalizer with a JSON patch guarded by a test of the exact list, so a
/// concurrent change makes it fail rather than drop someone else's finalizer.
async fn remove_finalizer(api: &Api<GpuSlice>, name: &str) -> Result<(), kube::Error> {
    let slice = match api.get(name).await {
        Ok(s) => s,
        Err(kube::Error::Api(e)) if e.code == 404 => return Ok(()),
        Err(e) => return Err(e),
    };
    let finalizers = slice.metadata.finalizers.clone().unwrap_or_default();
    let Some(index) = finalizers.iter().position(|f| f == SLICE_FINALIZER) else {
        return Ok(());
    };
    let patch = serde_json::json!([
        {"op": "test", "path": "/metadata/finalizers", "value": finalizers},
        {"op": "remove", "path": format!("/metadata/finalizers/{index}")},
    ]);
    let patch: json_patch::Patch =
        serde_json::from_value(patch).map_err(kube::Error::SerdeError)?;
    api.patch(name, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await
        .map(|_| ())
}

/// Marks a gang member's slice Reserved as `manager`: written, not yet bound. Best effort: the
/// phase is informational, and the node agent sets the next one.
pub async fn mark_reserved(api: &Api<GpuSlice>, name: &str, manager: &str) {
    let body =
        apply_body::<GpuSlice>(serde_json::json!({"status": {"phase": SlicePhase::Reserved}}));
    if let Err(error) = api
        .patch_status(name, &PatchParams::apply(manager), &Patch::Apply(&body))
        .await
    {
        tracing::debug!(slice = name, %error, "could not mark a slice Reserved");
    }
}
