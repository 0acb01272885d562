//! The GangGroup controller's writes: the GangGroup itself, its status, and the deletion of
//! bound members of a timed-out attempt when the gang opted in.

use super::{GANGS, apply_body, is_not_found};
use futures::future::join_all;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Client, ResourceExt};
use runtimekit_crds::{GangGroup, GangGroupStatus};

/// Creates `gang`; `None` when it exists already (another pass or replica created it).
pub async fn create(client: &Client, gang: &GangGroup) -> Result<Option<GangGroup>, kube::Error> {
    let api: Api<GangGroup> =
        Api::namespaced(client.clone(), &gang.namespace().unwrap_or_default());
    let params = PostParams {
        field_manager: Some(GANGS.into()),
        ..PostParams::default()
    };
    match api.create(&params, gang).await {
        Ok(created) => Ok(Some(created)),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(None),
        Err(error) => Err(error),
    }
}

/// Applies `status` to `gang` and returns the gang as written.
pub async fn write_status(
    client: &Client,
    gang: &GangGroup,
    status: &GangGroupStatus,
) -> Result<GangGroup, kube::Error> {
    let api: Api<GangGroup> =
        Api::namespaced(client.clone(), &gang.namespace().unwrap_or_default());
    let body = apply_body::<GangGroup>(serde_json::json!({ "status": status }));
    api.patch_status(
        &gang.name_any(),
        &PatchParams::apply(GANGS).force(),
        &Patch::Apply(&body),
    )
    .await
}

/// Deletes the member pods `members` (name, UID), all at once, each only if it is still the pod
/// of that UID: a member recreated under the same name is never deleted for its predecessor.
/// Returns each member whose delete failed, with the error; a member already gone or replaced
/// is not a failure.
pub async fn delete_members(
    client: &Client,
    namespace: &str,
    members: &[(String, String)],
) -> Vec<(String, kube::Error)> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let deleted = join_all(members.iter().map(|(name, uid)| {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::background()
        };
        let pods = &pods;
        async move { pods.delete(name, &params).await }
    }))
    .await;
    members
        .iter()
        .zip(deleted)
        .filter_map(|((name, _), result)| match result {
            Err(kube::Error::Api(status)) if status.code == 409 => None,
            Err(error) if !is_not_found(&error) => Some((name.clone(), error)),
            _ => None,
        })
        .collect()
}
