//! The GpuSlice controller: deletes the slices of pods that ended or vanished (the node agent
//! then destroys the instance and removes its finalizer, and only then does the capacity return),
//! and removes the finalizer itself where no agent ever will: the node is gone, or the pod was
//! never bound so nothing was enacted. It also re-creates the GpuSlices a bound pod's allocation
//! annotation names that do not exist (writes interrupted by a restart, or a slice deleted under
//! a running pod). It tells the pod of a slice its node agent reports Failed what happened.

use crate::shared::Shared;
use crate::state::Work;
use crate::writes::report::Reports;
use crate::writes::{self, binding::create_slice};
use futures::future::join_all;
use kube::api::Api;
use kube::{Client, ResourceExt};
use runtimekit_crds::GpuSlice;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Runs the controller until the task is dropped.
pub async fn run(shared: Arc<Shared>, client: Client, reports: Reports) {
    let mut changes = shared.subscribe();
    loop {
        let work = shared.lock().take_work();
        if work != Work::default() {
            let failed = writes::slices::carry_out(&client, &work).await;
            let mut state = shared.lock();
            state.release_again(failed.release);
        }
        for ((_, slice), failure) in &work.failed {
            reports.slice_failed(slice, failure).await;
        }
        restore(&shared, &client).await;
        tokio::select! {
            _ = changes.changed() => {}
            () = tokio::time::sleep(Duration::from_secs(10)) => {}
        }
    }
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
        let created = create_slice(&api, slice, writes::SLICES).await;
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
