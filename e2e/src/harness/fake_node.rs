//! Fake GPU nodes: kwok-managed (or hung) Node objects with the labels, capacity and taints a
//! test gives them, deleted when the test ends.

use super::context::TestContext;
use crate::cluster::simulated::kwok_node_object;
use anyhow::Result;
use k8s_openapi::api::core::v1::Node;
use kube::api::PostParams;
use std::collections::BTreeMap;

/// A kwok-managed node to create.
#[derive(Debug, Clone)]
pub struct FakeNode {
    name: String,
    labels: BTreeMap<String, String>,
    capacity: BTreeMap<String, String>,
    taints: Vec<serde_json::Value>,
    hung: bool,
}

impl FakeNode {
    /// A node with 64 CPUs, 512 GiB and 110 pods, and no GPUs yet.
    pub fn new(name: &str) -> FakeNode {
        FakeNode {
            name: name.into(),
            labels: BTreeMap::new(),
            capacity: BTreeMap::new(),
            taints: Vec::new(),
            hung: false,
        }
    }

    /// A node that reports Ready but whose kubelet never acts: kwok does not manage it, so pods
    /// bound to it never start and pods deleted there stay Terminating.
    pub fn hung(mut self) -> FakeNode {
        self.hung = true;
        self
    }

    /// Adds a label.
    pub fn label(mut self, key: &str, value: &str) -> FakeNode {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// Sets a capacity (and allocatable) entry, such as `nvidia.com/gpu: 8`.
    pub fn capacity(mut self, resource: &str, quantity: &str) -> FakeNode {
        self.capacity.insert(resource.into(), quantity.into());
        self
    }

    /// Adds a taint.
    pub fn taint(mut self, key: &str, value: &str, effect: &str) -> FakeNode {
        self.taints
            .push(serde_json::json!({"key": key, "value": value, "effect": effect}));
        self
    }
}

impl TestContext {
    /// The full name of this test's node `short`: the namespace, then `short`, cut to the 63
    /// characters a node name may have as its hostname label (the namespace is shortened; its
    /// `e2e-<n>-` start keeps the names of different tests apart).
    pub fn node_name(&self, short: &str) -> String {
        let room = 63usize.saturating_sub(short.len() + 1);
        let namespace: String = self.namespace.chars().take(room).collect();
        format!("{}-{short}", namespace.trim_end_matches('-'))
    }

    /// Creates a kwok-managed (or [hung](FakeNode::hung)) node for this test; its name is
    /// prefixed with the namespace and it is deleted when the test ends.
    pub async fn fake_node(&self, node: FakeNode) -> Result<Node> {
        let name = self.node_name(&node.name);
        let node_object =
            kwok_node_object(&name, &node.labels, &node.capacity, &node.taints, node.hung)?;
        self.nodes
            .lock()
            .map_err(|_| anyhow::anyhow!("node list poisoned"))?
            .push(name.clone());
        Ok(self
            .cluster_api::<Node>()
            .create(&PostParams::default(), &node_object)
            .await?)
    }
}
