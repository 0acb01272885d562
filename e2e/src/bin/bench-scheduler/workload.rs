//! What a run's pods ask for and which scheduler places them: ours or kube-scheduler, or the
//! peer (Volcano), whose pods also name a PodGroup made for them, as its controller would.
//! Gangs find their group made before the scheduler starts, for both: Volcano's PodGroup, or
//! our GangGroup as a user may apply it.

use anyhow::Result;
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use runtimekit_crds::{GangGroup, GangGroupSpec};
use serde_json::{Value, json};

use crate::CONCURRENCY;

/// The scheduler name Volcano's pods give.
pub const VOLCANO_SCHEDULER: &str = "volcano";

/// The pods of a run.
#[derive(Debug, Clone)]
pub struct Workload {
    /// The scheduler the pods name.
    pub scheduler: String,
    /// Each pod's container limits.
    pub limits: Value,
    /// Pods per gang; 1 for pods on their own.
    pub gang: usize,
    /// Volcano's pods: each group of `gang` pods gets a PodGroup and names it.
    pub volcano: bool,
}

impl Workload {
    /// Single pods for `scheduler` with `limits`.
    pub fn new(scheduler: &str, limits: Value) -> Workload {
        Workload {
            scheduler: scheduler.into(),
            limits,
            gang: 1,
            volcano: false,
        }
    }

    /// The same pods in gangs of `size`, all or nothing.
    pub fn in_gangs(self, size: usize) -> Workload {
        Workload { gang: size, ..self }
    }

    /// The same pods for Volcano.
    pub fn for_volcano(self) -> Workload {
        Workload {
            scheduler: VOLCANO_SCHEDULER.into(),
            volcano: true,
            ..self
        }
    }

    /// Pod `i` of the run, named `<prefix>-<i>`.
    pub fn pod(&self, prefix: &str, i: usize) -> Result<Pod> {
        let group = format!("g-{:05}", i / self.gang);
        let mut metadata = json!({"name": format!("{prefix}-{i:05}")});
        if self.volcano {
            metadata["annotations"] = json!({"scheduling.k8s.io/group-name": group});
        } else if self.gang > 1 {
            metadata["labels"] = json!({"aliyun.com/gang-name": group, "aliyun.com/min-member": self.gang.to_string()});
        }
        Ok(serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": metadata,
            "spec": {"schedulerName": self.scheduler, "runtimeClassName": "lj-runtime", "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "app", "image": "busybox", "resources": {"limits": self.limits}}]}
        }))?)
    }

    /// Creates the groups `count` pods name before they are created: a PodGroup for every
    /// Volcano pod or gang, a GangGroup for each of our gangs (without it the operator makes one
    /// from the pods' labels, as Volcano's controller would make the PodGroup).
    pub async fn create_groups(&self, client: &Client, ns: &str, count: usize) -> Result<()> {
        if !self.volcano && self.gang == 1 {
            return Ok(());
        }
        let (volcano, size) = (self.volcano, self.gang);
        let pod_groups: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &pod_group());
        let gang_groups: Api<GangGroup> = Api::namespaced(client.clone(), ns);
        stream::iter(0..count.div_ceil(size))
            .map(|g| {
                let (pod_groups, gang_groups) = (pod_groups.clone(), gang_groups.clone());
                async move {
                    let name = format!("g-{g:05}");
                    if volcano {
                        let group: DynamicObject = serde_json::from_value(json!({
                            "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
                            "metadata": {"name": name},
                            "spec": {"minMember": size, "queue": "default"}
                        }))?;
                        pod_groups.create(&PostParams::default(), &group).await?;
                    } else {
                        let spec = GangGroupSpec::with_min_member(u32::try_from(size)?);
                        let group = GangGroup::new(&name, spec);
                        gang_groups.create(&PostParams::default(), &group).await?;
                    }
                    Ok::<(), anyhow::Error>(())
                }
            })
            .buffer_unordered(CONCURRENCY)
            .try_collect::<Vec<()>>()
            .await?;
        Ok(())
    }
}

/// Volcano's PodGroup.
fn pod_group() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("scheduling.volcano.sh", "v1beta1", "PodGroup"),
        "podgroups",
    )
}
