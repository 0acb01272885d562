//! Every write the operator makes to the apiserver, in one place. Each writer has its own field
//! manager, so `kubectl get -o yaml --show-managed-fields` says which part of the operator set a
//! field. The controllers decide what to write (from the state, without I/O) and call these.

pub mod binding;
pub mod gangs;
pub mod preemption;
pub mod report;
pub mod slices;
pub mod taints;
pub mod topology;

/// The scheduler: the GpuSlices and Bindings of single pods.
pub const SCHEDULER: &str = "lj-runtimekit-scheduler";
/// The GangGroup controller: GangGroups, their status, and the slices and Bindings of members.
/// It keeps the scheduler's name: gang statuses written before this split are owned by it, and
/// server-side apply clears a field left out (a cleared message) only for its own manager.
pub const GANGS: &str = SCHEDULER;
/// The GpuSlice controller: slices re-created from a bound pod's allocation.
pub const SLICES: &str = "lj-runtimekit-slices";
/// The TopologyGroup controller: derived groups, parents, aggregate capacity, agent reporting.
pub const TOPOLOGY: &str = "runtimekit-topology";
/// The health taint on Nodes of faulted cards (`features.healthTaint`).
pub const HEALTH: &str = "runtimekit-health";

/// A server-side apply body for a `K`: `fields` (a JSON object) with the `apiVersion` and `kind`
/// every apply body must name.
pub fn apply_body<K: kube::Resource<DynamicType = ()>>(
    mut fields: serde_json::Value,
) -> serde_json::Value {
    if let Some(object) = fields.as_object_mut() {
        object.insert("apiVersion".into(), K::api_version(&()).into());
        object.insert("kind".into(), K::kind(&()).into());
    }
    fields
}

/// Whether the apiserver answered that the object does not exist.
pub fn is_not_found(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 404)
}

/// Logs a failed write; a 404 means the object went away meanwhile, which needs no retry.
pub fn log_failure(what: &str, name: &str, result: Result<(), kube::Error>) {
    if let Err(error) = &result
        && !is_not_found(error)
    {
        tracing::warn!(name, %error, "could not write {what}");
    }
}
