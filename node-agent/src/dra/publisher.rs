//! Keeps the node's pool of ResourceSlices equal to what [`pool::slices`] says the node offers:
//! when that changes (a card's use, health or mode, the node's labels), and on every resync, it
//! lists the pool's slices and, if they differ, writes all of them at the next generation and
//! deletes the ones left over, so an allocator never mixes two generations for long. The slices
//! are owned by the Node, so they go with it.

use super::pool::{self, PoolInput};
use crate::model::NodeState;
use crate::node_watch::{Facts, NodeFacts};
use k8s_openapi::api::resource::v1::{ResourceSlice, ResourceSliceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::{Client, Resource, ResourceExt};
use runtimekit_contract::RuntimeKitConfig;
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::sync::watch;

/// The field manager of the pool's slices.
pub const FIELD_MANAGER: &str = "runtimekit-node-agent-dra";
/// The label every slice of the pool carries, naming its node (field selectors on the driver
/// and node are used to list; the label lets a user find them).
pub const NODE_LABEL: &str = "runtimekit.aliyun.com/dra-node";

/// The publisher's settings and handles.
#[derive(Clone)]
pub struct Publisher {
    /// The apiserver.
    pub client: Client,
    /// This node.
    pub node: String,
    /// The driver name.
    pub driver: String,
    /// The shared configuration.
    pub config: RuntimeKitConfig,
    /// What the agent knows.
    pub state: watch::Receiver<NodeState>,
    /// The node: its labels (the pool's network position) and UID (the slices' owner).
    pub facts: Facts,
    /// How often the slices are compared with what is offered without a change.
    pub resync: Duration,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("node", &self.node)
            .field("driver", &self.driver)
            .finish_non_exhaustive()
    }
}

impl Publisher {
    /// Runs for ever.
    pub async fn run(mut self) {
        let taints = keeps_device_taints(&self.client).await;
        let slices: Api<ResourceSlice> = Api::all(self.client.clone());
        let mut published: Option<Vec<ResourceSliceSpec>> = None;
        let mut written = Written::new();
        let mut next_resync = tokio::time::Instant::now();
        loop {
            let state = self.state.borrow_and_update().clone();
            let node = self.facts.borrow_and_update().clone().unwrap_or_default();
            let due = tokio::time::Instant::now() >= next_resync;
            if state.inventory.is_some() && node.uid.is_some() {
                let offered = pool::slices(&PoolInput {
                    node: &self.node,
                    driver: &self.driver,
                    config: &self.config,
                    state: &state,
                    labels: &node.labels,
                    taints,
                });
                if due || published.as_ref() != Some(&offered) {
                    match self.reconcile(&slices, &offered, &node, &mut written).await {
                        Ok(()) => published = Some(offered),
                        Err(error) => {
                            published = None;
                            tracing::warn!(%error, "cannot publish the node's ResourceSlices");
                        }
                    }
                }
                if due {
                    next_resync = tokio::time::Instant::now() + self.resync;
                }
            }
            let retry = if published.is_none() {
                Duration::from_secs(2)
            } else {
                next_resync.saturating_duration_since(tokio::time::Instant::now())
            };
            tokio::select! {
                changed = self.state.changed() => if changed.is_err() { return },
                changed = self.facts.changed() => if changed.is_err() { return },
                () = tokio::time::sleep(retry) => {}
            }
        }
    }

    /// Makes the pool's slices equal to `offered`.
    async fn reconcile(
        &self,
        slices: &Api<ResourceSlice>,
        offered: &[ResourceSliceSpec],
        node: &NodeFacts,
        written: &mut Written,
    ) -> Result<(), kube::Error> {
        let listed = slices
            .list(&ListParams::default().fields(&format!(
                "spec.nodeName={},spec.driver={}",
                self.node, self.driver
            )))
            .await?
            .items;
        let mut current: Vec<&ResourceSlice> = listed.iter().collect();
        current.sort_by_key(|s| s.name_any());
        let names: Vec<String> = (0..offered.len())
            .map(|i| slice_name(&self.node, &self.driver, i))
            .collect();
        let generation = current.iter().map(|s| s.spec.pool.generation).max();
        let same = current.len() == offered.len()
            && current.iter().all(|s| {
                names.contains(&s.name_any()) && Some(s.spec.pool.generation) == generation
            })
            && names.iter().zip(offered).all(|(name, spec)| {
                // The apiserver writes quantities in their canonical form and drops empty
                // lists, so a slice is compared with what this agent last wrote to it, and
                // taken as unchanged while its resourceVersion is still the one written.
                current
                    .iter()
                    .find(|s| &s.name_any() == name)
                    .is_some_and(|s| {
                        written.get(name).is_some_and(|(sent, version)| {
                            s.resource_version().as_ref() == Some(version)
                                && *sent == without_generation(spec)
                        })
                    })
            });
        if same {
            return Ok(());
        }
        let generation = generation.map_or(1, |g| g + 1);
        let owner = OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: self.node.clone(),
            uid: node.uid.clone().unwrap_or_default(),
            controller: Some(true),
            block_owner_deletion: None,
        };
        for (name, spec) in names.iter().zip(offered) {
            let mut spec = spec.clone();
            spec.pool.generation = generation;
            let slice = ResourceSlice {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    labels: Some(BTreeMap::from([(NODE_LABEL.to_owned(), self.node.clone())])),
                    owner_references: Some(vec![owner.clone()]),
                    ..ObjectMeta::default()
                },
                spec,
            };
            let mut body = serde_json::to_value(&slice).map_err(kube::Error::SerdeError)?;
            body["apiVersion"] = ResourceSlice::api_version(&()).into();
            body["kind"] = ResourceSlice::kind(&()).into();
            written.remove(name);
            let stored = slices
                .patch(
                    name,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(&body),
                )
                .await?;
            if let Some(version) = stored.resource_version() {
                written.insert(name.clone(), (without_generation(&slice.spec), version));
            }
        }
        written.retain(|name, _| names.contains(name));
        for stale in current.iter().filter(|s| !names.contains(&s.name_any())) {
            match slices
                .delete(&stale.name_any(), &DeleteParams::default())
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        tracing::info!(
            generation,
            slices = offered.len(),
            devices = offered
                .iter()
                .map(|s| s.devices.as_ref().map_or(0, Vec::len))
                .sum::<usize>(),
            "published the node's ResourceSlices"
        );
        Ok(())
    }
}

/// The name of the pool's slice `index`.
pub fn slice_name(node: &str, driver: &str, index: usize) -> String {
    format!("{node}-{driver}-{index}")
}

/// What this agent last wrote to each slice (generation left out), and the resourceVersion
/// the apiserver gave it.
type Written = BTreeMap<String, (ResourceSliceSpec, String)>;

fn without_generation(spec: &ResourceSliceSpec) -> ResourceSliceSpec {
    let mut spec = spec.clone();
    spec.pool.generation = 0;
    spec
}

/// Whether the cluster keeps device taints: on by default from Kubernetes 1.36 (beta), GA in
/// 1.37; an older apiserver drops the field, so a faulted card is withdrawn instead.
async fn keeps_device_taints(client: &Client) -> bool {
    match client.apiserver_version().await {
        Ok(info) => {
            let minor: u32 = info
                .minor
                .trim_end_matches(|c: char| !c.is_ascii_digit())
                .parse()
                .unwrap_or(0);
            info.major == "1" && minor >= 36
        }
        Err(error) => {
            tracing::warn!(%error, "cannot read the apiserver's version; faulted cards are withdrawn rather than tainted");
            false
        }
    }
}
