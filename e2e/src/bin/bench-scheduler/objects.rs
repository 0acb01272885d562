//! Part 2's floor: what one more object per pod costs this apiserver, whatever a scheduler does
//! with it. Ours writes one GpuSlice per card beside each Binding (the spec's contract, what
//! `kubectl get gpuslices` shows); this prices that write against the smallest custom resource
//! and a built-in object, so a ratio target can be read against what is possible at all.
//!
//! Each kind is created `count` times into a namespace of its own with one JSON watch open on
//! it, as the operator's informer holds on GpuSlices, and the apiserver's CPU is counted from
//! the first create until the watch has seen the last. The GpuSlice is a copy of its CRD under a
//! benchmark group (same schema and CEL rules), so the running operator does not take the
//! copies for allocations; it is owned by a pod, as ours are, and carries no finalizer, so the
//! namespace can go (a finalizer is one string more).

use crate::CONCURRENCY;
use crate::measure::{Processes, cleanup, cpu_of};
use anyhow::{Context, Result, bail};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, CustomResourceDefinitionNames,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use runtimekit_e2e::cluster::apply_crds;
use runtimekit_e2e::load::namespace;
use serde_json::json;
use std::collections::HashSet;
use std::time::Duration;

/// The group the benchmark's own resources are served under.
const GROUP: &str = "bench.runtimekit.aliyun.com";
/// How the priced objects' names start: the watch counts only these (a namespace also gets a
/// ConfigMap of the cluster's CA from the controller-manager).
const NAME_PREFIX: &str = "priced-";

/// The apiserver's CPU for one kind of object.
#[derive(Debug, Clone)]
pub struct ObjectCost {
    /// The kind's key in the JSON line.
    pub key: &'static str,
    pub kind: &'static str,
    pub creates: usize,
    pub ms_per_create: f64,
}

/// The kinds priced, cheapest last.
#[derive(Debug, Clone, Copy)]
enum Kind {
    /// A GpuSlice as the operator writes one for a whole card.
    GpuSlice,
    /// A custom resource with one string field and a one-field schema.
    Minimal,
    /// A ConfigMap with one key: no custom-resource machinery at all.
    ConfigMap,
}

impl Kind {
    fn describe(self) -> &'static str {
        match self {
            Kind::GpuSlice => "GpuSlice, whole card (its schema, CEL rules and pod owner)",
            Kind::Minimal => "custom resource, one string field",
            Kind::ConfigMap => "ConfigMap, one key (built in)",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Kind::GpuSlice => "gpuslice",
            Kind::Minimal => "minimal_custom_resource",
            Kind::ConfigMap => "configmap",
        }
    }

    fn resource(self) -> ApiResource {
        let (group, version, kind, plural) = match self {
            Kind::GpuSlice => (GROUP, "v1alpha1", "BenchSlice", "benchslices"),
            Kind::Minimal => (GROUP, "v1", "BenchProbe", "benchprobes"),
            Kind::ConfigMap => ("", "v1", "ConfigMap", "configmaps"),
        };
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
    }

    /// Object `i`, owned by the pod `owner` where the real object would be.
    fn object(self, i: usize, ns: &str, owner: &Pod) -> DynamicObject {
        let name = format!("{NAME_PREFIX}{i}");
        let uid = owner.uid().unwrap_or_default();
        let mut object = DynamicObject::new(&name, &self.resource());
        object.data = match self {
            Kind::GpuSlice => {
                object.metadata.owner_references = Some(vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "Pod".into(),
                    name: owner.name_any(),
                    uid: uid.clone(),
                    controller: Some(true),
                    block_owner_deletion: None,
                }]);
                // The fields the operator writes for one whole card.
                json!({ "spec": {
                    "nodeName": format!("bench-{}", i % 1000),
                    "card": {
                        "index": i % 8,
                        "uuid": format!("GPU-{:08x}-0000-0000-0000-{i:012x}", i % 1000),
                    },
                    "mode": "Whole",
                    "pod": { "namespace": ns, "name": format!("p{i}"), "uid": uid, "container": "main" },
                    "replicaIndex": 0,
                } })
            }
            Kind::Minimal => json!({ "spec": { "pod": uid } }),
            Kind::ConfigMap => json!({ "data": { "pod": uid } }),
        };
        object
    }
}

/// The CRD's name and names for `kind`, as [`Kind::resource`] serves it.
fn crd_names(kind: Kind) -> (String, CustomResourceDefinitionNames) {
    let resource = kind.resource();
    let names = CustomResourceDefinitionNames {
        singular: Some(resource.kind.to_lowercase()),
        list_kind: Some(format!("{}List", resource.kind)),
        kind: resource.kind,
        plural: resource.plural.clone(),
        ..CustomResourceDefinitionNames::default()
    };
    (format!("{}.{GROUP}", resource.plural), names)
}

/// The benchmark's CRDs: the GpuSlice's under the benchmark group, and the smallest one.
fn crds() -> Result<Vec<CustomResourceDefinition>> {
    let mut slice = runtimekit_crds::all()
        .into_iter()
        .find(|crd| crd.spec.names.kind == "GpuSlice")
        .context("the GpuSlice CRD")?;
    let (name, names) = crd_names(Kind::GpuSlice);
    slice.metadata = kube::api::ObjectMeta {
        name: Some(name),
        ..kube::api::ObjectMeta::default()
    };
    slice.spec.group = GROUP.into();
    slice.spec.names = names;
    let (name, names) = crd_names(Kind::Minimal);
    let minimal: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": { "name": name },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": names,
            "versions": [{
                "name": Kind::Minimal.resource().version, "served": true, "storage": true,
                "schema": { "openAPIV3Schema": { "type": "object", "properties": {
                    "spec": { "type": "object", "properties": { "pod": { "type": "string" } } }
                } } }
            }]
        }
    }))?;
    Ok(vec![slice, minimal])
}

/// Prices `count` creates of each kind, then removes what it made.
pub async fn costs(
    client: &Client,
    processes: &Processes,
    count: usize,
) -> Result<Vec<ObjectCost>> {
    let crds = crds()?;
    apply_crds(client, &crds).await?;
    let mut costs = Vec::new();
    for kind in [Kind::GpuSlice, Kind::Minimal, Kind::ConfigMap] {
        costs.push(price(client, processes, kind, count).await?);
    }
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in &crds {
        api.delete(&crd.name_any(), &DeleteParams::default())
            .await?;
    }
    Ok(costs)
}

async fn price(
    client: &Client,
    processes: &Processes,
    kind: Kind,
    count: usize,
) -> Result<ObjectCost> {
    let ns = format!("bench-objects-{}", kind.resource().plural);
    namespace(client, &ns).await?;
    // Never scheduled: it only owns the slices, as a pod owns its own.
    let owner: Pod = serde_json::from_value(json!({
        "metadata": { "name": "owner" },
        "spec": { "schedulerName": "none", "containers": [{ "name": "main", "image": "none" }] }
    }))?;
    let owner = Api::<Pod>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &owner)
        .await?;
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &kind.resource());
    let (listed, mut listed_rx) = tokio::sync::watch::channel(false);
    let (seen_tx, mut seen) = tokio::sync::watch::channel(0usize);
    let watch = tokio::spawn({
        let api = api.clone();
        async move {
            let mut names = HashSet::new();
            let mut events = watcher(api, watcher::Config::default()).boxed();
            while let Ok(Some(event)) = events.try_next().await {
                match event {
                    watcher::Event::InitDone => {
                        let _ = listed.send(true);
                    }
                    watcher::Event::Apply(object) if object.name_any().starts_with(NAME_PREFIX) => {
                        names.insert(object.name_any());
                        let _ = seen_tx.send(names.len());
                    }
                    _ => {}
                }
            }
        }
    });
    listed_rx.wait_for(|listed| *listed).await?;
    let before = cpu_of(&processes.cpu(), "kube-apiserver");
    stream::iter((0..count).map(|i| kind.object(i, &ns, &owner)))
        .map(|object| {
            let api = api.clone();
            async move { api.create(&PostParams::default(), &object).await }
        })
        .buffer_unordered(CONCURRENCY)
        .try_for_each(|_| futures::future::ready(Ok(())))
        .await
        .with_context(|| format!("creating {}", kind.describe()))?;
    let all_seen = tokio::time::timeout(Duration::from_secs(300), seen.wait_for(|n| *n >= count));
    if !matches!(all_seen.await, Ok(Ok(_))) {
        bail!("the watch did not see every {} in time", kind.describe());
    }
    let after = cpu_of(&processes.cpu(), "kube-apiserver");
    watch.abort();
    cleanup(client, &ns).await?;
    Ok(ObjectCost {
        key: kind.key(),
        kind: kind.describe(),
        creates: count,
        ms_per_create: (after - before) * 1000.0 / count.max(1) as f64,
    })
}
