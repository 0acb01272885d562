//! What a run's pods ask for and which scheduler places them: ours or kube-scheduler, or the
//! peer (Volcano), whose pods also name a PodGroup made for them, as its controller would.
//! Gangs find their group made before the scheduler starts, for both: Volcano's PodGroup, or
//! our GangGroup as a user may apply it. DRA pods find their ResourceClaimTemplate made.

use anyhow::Result;
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use runtimekit_crds::{GangGroup, GangGroupSpec};
use runtimekit_e2e::load::FLEET_LABEL;
use serde_json::{Value, json};

use crate::CONCURRENCY;

/// The kit's whole-card DeviceClass (`config/dra`), which DRA pods' claims name.
const WHOLE_CARD_CLASS: &str = "gpu.runtimekit.aliyun.com";

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
    /// DRA: each pod asks for one whole card through a claim from the ResourceClaimTemplate of
    /// this name (made in the run's namespace), instead of through `limits`.
    pub claim_template: Option<String>,
    /// The fleet (node name prefix) the pods keep to, if not every node.
    pub fleet: Option<String>,
}

impl Workload {
    /// Single pods for `scheduler` with `limits`.
    pub fn new(scheduler: &str, limits: Value) -> Workload {
        Workload {
            scheduler: scheduler.into(),
            limits,
            gang: 1,
            volcano: false,
            claim_template: None,
            fleet: None,
        }
    }

    /// The same pods asking for one whole card through a claim of the kit's DRA driver.
    pub fn through_claims(self, template: &str) -> Workload {
        Workload {
            claim_template: Some(template.into()),
            ..self
        }
    }

    /// The same pods on the nodes of `fleet` only.
    pub fn on_fleet(self, fleet: &str) -> Workload {
        Workload {
            fleet: Some(fleet.into()),
            ..self
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
        let mut spec = json!({"schedulerName": self.scheduler, "runtimeClassName": "lj-runtime", "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "app", "image": "busybox", "resources": {"limits": self.limits}}]});
        if let Some(template) = &self.claim_template {
            // A DRA pod as its users write it: no runtime class, the claim named.
            spec = json!({"schedulerName": self.scheduler, "terminationGracePeriodSeconds": 0,
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
                "containers": [{"name": "app", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}]});
        }
        if let Some(fleet) = &self.fleet {
            spec["nodeSelector"] = json!({FLEET_LABEL: fleet});
        }
        Ok(serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec,
        }))?)
    }

    /// Creates the objects `count` pods name before they are created: the ResourceClaimTemplate
    /// of claim pods, a PodGroup for every Volcano pod or gang, a GangGroup for each of our gangs
    /// (without it the operator makes one from the pods' labels, as Volcano's controller would
    /// make the PodGroup).
    pub async fn create_groups(&self, client: &Client, ns: &str, count: usize) -> Result<()> {
        if let Some(template) = &self.claim_template {
            let object: ResourceClaimTemplate = serde_json::from_value(json!({
                "metadata": {"name": template},
                "spec": {"spec": {"devices": {"requests": [{"name": "gpu",
                    "exactly": {"deviceClassName": WHOLE_CARD_CLASS}}]}}},
            }))?;
            Api::<ResourceClaimTemplate>::namespaced(client.clone(), ns)
                .create(&PostParams::default(), &object)
                .await?;
        }
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
