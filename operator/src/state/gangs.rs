//! GangGroups and their members: one decision reserves every pending member, and the
//! reservation ends once their bindings are written: bound members keep their allocations, the
//! others give theirs back.

use super::{Feed, Now, PodRecord, State, namespaced_key, split_key};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use runtimekit_contract::ContractError;
use runtimekit_crds::{GangGroup, GangPlacement, Tier};
use runtimekit_placement::quota::QuotaExceeded;
use runtimekit_placement::{self as placement, CommitError, ConvertError, Unschedulable};
use std::sync::Arc;

impl Feed for GangGroup {
    const KIND: &'static str = "GangGroup";
    fn key(&self) -> String {
        namespaced_key(&self.namespace().unwrap_or_default(), &self.name_any())
    }
    fn apply(&self, state: &mut State, _now: Now) {
        state.apply_gang(self);
    }
    fn remove(key: &str, state: &mut State, _now: Now) {
        let (namespace, name) = split_key(key);
        state.delete_gang(namespace, name);
    }
    fn known(state: &State) -> Vec<String> {
        state
            .gang_keys()
            .into_iter()
            .map(|(namespace, name)| namespaced_key(&namespace, &name))
            .collect()
    }
}

/// Why a gang's pending members could not be reserved. The message is what the members are told.
#[derive(Debug, thiserror::Error)]
pub enum GangError {
    /// A member breaks the resource contract.
    #[error("member {member}: {source}")]
    Contract {
        member: String,
        source: ContractError,
    },
    /// A member's requests cannot be read.
    #[error("member {member}: {source}")]
    Convert {
        member: String,
        source: ConvertError,
    },
    /// The members do not fit together.
    #[error(transparent)]
    Unschedulable(#[from] Unschedulable),
    /// The decision could not be reserved.
    #[error(transparent)]
    Reserve(#[from] CommitError),
    /// The members together would take their namespace past a quota.
    #[error(transparent)]
    Quota(#[from] QuotaExceeded),
}

/// A gang's members as decided, ready to be written.
#[derive(Debug, Clone)]
pub struct GangBinding {
    /// Each member's pod and decision.
    pub members: Vec<(Arc<Pod>, placement::Decision)>,
    /// Where the gang went.
    pub placement: GangPlacement,
    /// The annotation the allocations go into.
    pub annotation: String,
}

impl State {
    /// The GangGroup of (namespace, name), if it exists.
    pub fn gang(&self, namespace: &str, name: &str) -> Option<&Arc<GangGroup>> {
        self.gangs.get(&(namespace.to_owned(), name.to_owned()))
    }

    /// Every GangGroup.
    pub fn gangs(&self) -> impl Iterator<Item = &Arc<GangGroup>> {
        self.gangs.values()
    }

    /// The gangs that have member pods, by (namespace, name).
    pub fn gangs_with_members(&self) -> Vec<(String, String)> {
        self.gang_pods
            .iter()
            .filter(|(_, m)| !m.is_empty())
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// The member pods of a gang that count: running, pending or completed successfully (a
    /// failed or deleted member is being replaced by its controller).
    pub fn gang_members(&self, namespace: &str, name: &str) -> Vec<&PodRecord> {
        let key = (namespace.to_owned(), name.to_owned());
        self.gang_pods
            .get(&key)
            .into_iter()
            .flatten()
            .filter_map(|uid| self.pods.get(uid))
            .filter(|p| !p.life.replaced())
            .collect()
    }

    /// Applies a GangGroup.
    pub fn apply_gang(&mut self, gang: &GangGroup) {
        let key = (gang.namespace().unwrap_or_default(), gang.name_any());
        self.gangs.insert(key, Arc::new(gang.clone()));
    }

    /// Forgets a deleted GangGroup.
    pub fn delete_gang(&mut self, namespace: &str, name: &str) {
        self.gangs.remove(&(namespace.to_owned(), name.to_owned()));
    }

    /// Keys of every known GangGroup.
    pub fn gang_keys(&self) -> Vec<(String, String)> {
        self.gangs.keys().cloned().collect()
    }

    /// Decides and reserves a gang's pending members in one decision, all or nothing. On
    /// success the members are in flight until their writes are done ([`State::gang_written`]).
    pub fn reserve_gang(
        &mut self,
        namespace: &str,
        name: &str,
        highest_tier: Tier,
    ) -> Result<GangBinding, GangError> {
        let names = self.names.clone();
        let mut members = Vec::new();
        let mut inputs = Vec::new();
        for record in self.gang_members(namespace, name) {
            let Some(pending) = record
                .pending
                .as_ref()
                .filter(|_| !self.in_flight(&record.uid))
            else {
                continue;
            };
            let request = pending
                .request
                .as_ref()
                .map_err(|source| GangError::Contract {
                    member: record.name.clone(),
                    source: source.clone(),
                })?;
            let input =
                placement::PodInput::from_pod(&pending.pod, request, &names).map_err(|source| {
                    GangError::Convert {
                        member: record.name.clone(),
                        source,
                    }
                })?;
            members.push(Arc::clone(&pending.pod));
            inputs.push(input);
        }
        let uids: Vec<&str> = inputs.iter().map(|i| i.uid.as_str()).collect();
        self.check_quota(namespace, &uids)?;
        let mut constraint = placement::GangConstraint::new(namespaced_key(namespace, name));
        constraint.highest_tier = highest_tier;
        let decision = self.engine.decide_gang(&inputs, &constraint)?;
        self.engine.reserve_gang(&decision)?;
        let placement = decision.placement();
        let mut bound = Vec::new();
        for pod in members {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            if let Some(d) = decision.members.iter().find(|d| d.pod_uid == uid) {
                self.start_flight(&uid);
                bound.push((pod, d.clone()));
            }
        }
        let annotation = self.allocation_annotation();
        Ok(GangBinding {
            members: bound,
            placement,
            annotation,
        })
    }

    /// A reserved gang's writes are done, `(uid, bound)` for each member: the reservation ends,
    /// bound members keep their allocations as ordinary pods, and the others give back what they
    /// hold (they stay pending and are placed again).
    pub fn gang_written(&mut self, namespace: &str, name: &str, members: &[(String, bool)]) {
        self.engine.confirm_gang(&namespaced_key(namespace, name));
        for (uid, bound) in members {
            if *bound {
                self.bound(uid);
            } else {
                self.release_unbound(uid);
            }
        }
    }
}
