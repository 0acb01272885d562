//! The writes of a decision: its GpuSlices and its Binding. Each branch that can leave the
//! outcome in doubt (a conflict, an answer of unknown fate) is settled by reading back.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use runtimekit_contract::allocation::Allocation;
use runtimekit_crds::GpuSlice;

/// Why writing a binding failed.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("creating GpuSlice {name}: {source}")]
    Slice { name: String, source: kube::Error },
    #[error("GpuSlice {name} exists for another pod")]
    SliceTaken { name: String },
    #[error("posting the Binding: {0}")]
    Binding(kube::Error),
    #[error("the pod is already bound to {node:?} with another allocation")]
    BoundElsewhere { node: String },
    #[error("encoding the allocation: {0}")]
    Encode(#[from] serde_json::Error),
}

/// Posts the Binding of a decided pod, carrying its allocation annotation (the apiserver copies
/// it onto the pod). A pod already bound is fine only if it is bound exactly so: an earlier try
/// of this decision landed.
pub async fn post_binding(
    client: &Client,
    pod: &Pod,
    annotation: &str,
    allocation: &Allocation,
) -> Result<(), BindError> {
    let namespace = pod.namespace().unwrap_or_default();
    let recorded = serde_json::to_string(allocation)?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let binding = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": pod.name_any(), "annotations": {annotation: recorded}},
        "target": {"apiVersion": "v1", "kind": "Node", "name": allocation.node},
    });
    let posted: Result<serde_json::Value, kube::Error> = pods
        .create_subresource("binding", &pod.name_any(), &PostParams::default(), &binding)
        .await;
    let error = match posted {
        Ok(_) => return Ok(()),
        // A plain rejection: the Binding did not land.
        Err(kube::Error::Api(e)) if e.code != 409 && e.code < 500 => {
            return Err(BindError::Binding(kube::Error::Api(e)));
        }
        // Already bound (an earlier try landed), or the request's fate is unknown (a timeout,
        // a dropped connection): the pod says whether this Binding is the one that holds.
        Err(e) => e,
    };
    let current = pods
        .get(&pod.name_any())
        .await
        .map_err(BindError::Binding)?;
    let node = current.spec.as_ref().and_then(|s| s.node_name.clone());
    match node {
        Some(node)
            if node == allocation.node
                && current.annotations().get(annotation) == Some(&recorded) =>
        {
            Ok(())
        }
        Some(node) => Err(BindError::BoundElsewhere { node }),
        None => Err(BindError::Binding(error)),
    }
}

/// Creates one slice as `manager`; an identical slice already there (from an earlier try) is
/// fine.
pub async fn create_slice(
    api: &Api<GpuSlice>,
    slice: &GpuSlice,
    manager: &str,
) -> Result<(), BindError> {
    let name = slice.name_any();
    match api
        .create(
            &PostParams {
                field_manager: Some(manager.into()),
                ..PostParams::default()
            },
            slice,
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => {
            let existing = api.get(&name).await.map_err(|source| BindError::Slice {
                name: name.clone(),
                source,
            })?;
            if existing.spec == slice.spec && existing.metadata.deletion_timestamp.is_none() {
                Ok(())
            } else {
                Err(BindError::SliceTaken { name })
            }
        }
        Err(source) => Err(BindError::Slice { name, source }),
    }
}
