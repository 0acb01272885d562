//! The GpuSlice controller: deletes the slices of pods that ended or vanished (the node agent
//! then destroys the instance and removes its finalizer, and only then does the capacity return),
//! and removes the finalizer itself where no agent ever will: the node is gone, or the pod was
//! never bound so nothing was enacted. It also re-creates the GpuSlices a bound pod's allocation
//! annotation names that do not exist (writes interrupted by a restart, or a slice deleted under
//! a running pod).

use crate::scheduler;
use crate::shared::Shared;
use crate::state::Work;
use futures::future::join_all;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use runtimekit_crds::{GpuSlice, SLICE_FINALIZER};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Runs the controller until the task is dropped.
pub async fn run(shared: Arc<Shared>, client: Client) {
    let mut changes = shared.subscribe();
    loop {
        let work = shared.lock().take_work();
        if work != Work::default() {
            apply(&client, &work).await;
        }
        restore(&shared, &client).await;
        tokio::select! {
            _ = changes.changed() => {}
            () = tokio::time::sleep(Duration::from_secs(10)) => {}
        }
    }
}

async fn apply(client: &Client, work: &Work) {
    join_all(work.release.iter().map(|(namespace, name)| async move {
        let api: Api<GpuSlice> = Api::namespaced(client.clone(), namespace);
        match api.delete(name, &DeleteParams::background()).await {
            Ok(_) => {
                tracing::info!(slice = %name, %namespace, "released the slice of an ended pod")
            }
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(error) => {
                tracing::warn!(slice = %name, %namespace, %error, "could not release a slice")
            }
        }
    }))
    .await;
    join_all(work.unfinalize.iter().map(|(namespace, name)| async move {
        let api: Api<GpuSlice> = Api::namespaced(client.clone(), namespace);
        if let Err(error) = remove_finalizer(&api, name).await {
            tracing::warn!(slice = %name, %namespace, %error, "could not remove the finalizer of a slice");
        }
    }))
    .await;
}

/// Re-creates the slices bound pods' allocations name that do not exist.
async fn restore(shared: &Shared, client: &Client) {
    let missing = shared.lock().restore_due(Instant::now());
    if missing.is_empty() {
        return;
    }
    let created = join_all(missing.iter().map(|slice| async move {
        let namespace = slice.namespace().unwrap_or_default();
        let api: Api<GpuSlice> = Api::namespaced(client.clone(), &namespace);
        let created = scheduler::create_slice(&api, slice).await;
        match &created {
            Ok(()) => {
                tracing::info!(slice = %slice.name_any(), %namespace, "re-created a slice from its pod's allocation");
            }
            Err(error) => {
                tracing::warn!(slice = %slice.name_any(), %namespace, %error, "could not re-create a slice; will retry");
            }
        }
        created.is_ok()
    }))
    .await;
    let now = Instant::now();
    let mut state = shared.lock();
    state.slices_created(missing.iter().zip(created.iter().copied()));
    let mut pods: BTreeMap<&str, bool> = BTreeMap::new();
    for (slice, ok) in missing.iter().zip(created) {
        *pods.entry(slice.spec.pod.uid.as_str()).or_insert(true) &= ok;
    }
    for (uid, ok) in pods {
        state.restored(uid, ok, now);
    }
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
