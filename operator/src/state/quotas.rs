//! ResourceQuotas on the card resources, and what each pod holds against them with its replicas
//! counted: a pod holds from its decision (assumed, being written) until it ends, and a pod
//! whose namespace would then hold more than a quota allows is not placed.

use super::{Feed, Now, State, namespaced_key, split_key};
use k8s_openapi::api::core::v1::ResourceQuota;
use kube::ResourceExt;
use runtimekit_placement::quota::{Holding, Quota, QuotaExceeded};
use std::sync::Arc;

impl Feed for ResourceQuota {
    const KIND: &'static str = "ResourceQuota";
    fn key(&self) -> String {
        namespaced_key(&self.namespace().unwrap_or_default(), &self.name_any())
    }
    fn apply(&self, state: &mut State, _now: Now) {
        let namespace = self.namespace().unwrap_or_default();
        let changed = match Quota::from_resource_quota(self, &state.names) {
            Some(quota) => state.quotas.upsert_quota(&namespace, quota),
            None => state.quotas.remove_quota(&namespace, &self.name_any()),
        };
        // A raised or removed limit may let waiting pods in.
        state.capacity_freed |= changed;
    }
    fn remove(key: &str, state: &mut State, _now: Now) {
        let (namespace, name) = split_key(key);
        state.capacity_freed |= state.quotas.remove_quota(namespace, name);
    }
    fn known(state: &State) -> Vec<String> {
        state
            .quotas
            .quota_keys()
            .into_iter()
            .map(|(namespace, name)| namespaced_key(&namespace, &name))
            .collect()
    }
}

impl State {
    /// Brings the quota ledger in line with pod `uid`: it holds while its decision is in flight,
    /// and while it is bound and has not ended.
    pub(super) fn sync_holding(&mut self, uid: &str) {
        let holds = self.pods.get(uid).and_then(|pod| {
            let holding = pod.holding.as_ref()?;
            let held =
                self.in_flight.contains_key(uid) || (pod.node.is_some() && !pod.life.ended());
            held.then(|| (pod.namespace.clone(), Arc::clone(holding)))
        });
        match holds {
            Some((namespace, holding)) => self.quotas.hold(uid, &namespace, holding),
            None => {
                if self.quotas.release(uid) {
                    self.capacity_freed = true;
                }
            }
        }
    }

    /// Whether `namespace` may take what the pods `uids` would hold, beside what it holds.
    pub(super) fn check_quota(&self, namespace: &str, uids: &[&str]) -> Result<(), QuotaExceeded> {
        let adding: Vec<&Holding> = uids
            .iter()
            .filter_map(|uid| self.pods.get(*uid)?.holding.as_deref())
            .collect();
        if adding.is_empty() {
            return Ok(());
        }
        self.quotas.check(namespace, adding.iter().copied())
    }
}
