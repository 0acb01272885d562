//! Priority and preemption. A pending pod that fits nowhere may have pods of lower priority
//! evicted for it (the engine picks them, [`placement::Cluster::preempt`]); it is then nominated
//! to their node, and the room they leave is held for it: its decision counts in the engine
//! under its nomination, beside the victims until they are gone, so no other pod takes the
//! room meanwhile. The nomination ends when the pod is placed, when it goes, or when its
//! victims are gone and it still does not fit (it may then preempt again).
//!
//! PodDisruptionBudgets are read to tell which victims break one; the engine keeps them where
//! another choice exists.

use super::{Feed, Now, PodRecord, State, namespaced_key, split_key};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;
use kube::core::{Selector, SelectorExt};
use runtimekit_placement::{self as placement, Candidate};
use std::collections::BTreeSet;
use std::sync::Arc;

/// A PodDisruptionBudget, as preemption reads it.
#[derive(Debug, Clone)]
pub(super) struct Budget {
    /// `None`: it selects no pod (no selector).
    selector: Option<Selector>,
    /// `status.disruptionsAllowed`.
    allowed: i32,
}

impl Feed for PodDisruptionBudget {
    const KIND: &'static str = "PodDisruptionBudget";
    fn key(&self) -> String {
        namespaced_key(&self.namespace().unwrap_or_default(), &self.name_any())
    }
    fn apply(&self, state: &mut State, _now: Now) {
        let selector = self
            .spec
            .as_ref()
            .and_then(|s| s.selector.clone())
            .and_then(|s| Selector::try_from(s).ok());
        let allowed = self
            .status
            .as_ref()
            .and_then(|s| s.disruptions_allowed)
            .unwrap_or(0);
        state.budgets.insert(
            (self.namespace().unwrap_or_default(), self.name_any()),
            Budget { selector, allowed },
        );
    }
    fn remove(key: &str, state: &mut State, _now: Now) {
        let (namespace, name) = split_key(key);
        state
            .budgets
            .remove(&(namespace.to_owned(), name.to_owned()));
    }
    fn known(state: &State) -> Vec<String> {
        state
            .budgets
            .keys()
            .map(|(namespace, name)| namespaced_key(namespace, name))
            .collect()
    }
}

/// A pod nominated to a node while its victims terminate.
#[derive(Debug, Clone)]
pub(super) struct Nomination {
    /// Where it goes once they are gone; held in the engine under [`nominee`].
    decision: placement::Decision,
    /// The victims' UIDs.
    victims: BTreeSet<String>,
}

/// A pod to evict for a preemptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Victim {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID (a precondition of every write).
    pub uid: String,
}

/// The evictions a preemption calls for, to be written by the scheduler.
#[derive(Debug, Clone)]
pub struct Eviction {
    /// The pod they make room for.
    pub preemptor: Arc<Pod>,
    /// The node it is nominated to.
    pub node: String,
    /// The pods to evict.
    pub victims: Vec<Victim>,
}

/// The engine's key for the room held for a nominated pod.
fn nominee(uid: &str) -> String {
    format!("{uid}/nominated")
}

/// What a pod that did not fit gets from preemption.
pub(super) enum Preempted {
    /// Its victims are still terminating: it keeps waiting for their room.
    Waiting { node: String, left: usize },
    /// Victims were chosen now.
    Evict(Eviction),
    /// No eviction makes it fit, or it does not preempt (`preemptionPolicy: Never`).
    Nothing,
}

impl State {
    /// Gives the room held for `uid`'s nomination back to the engine, so its next decision can
    /// use it; the nomination is returned to be kept or dropped.
    pub(super) fn lift_nomination(&mut self, uid: &str) -> Option<Nomination> {
        let nomination = self.nominations.remove(uid)?;
        self.engine.release(&nominee(uid));
        Some(nomination)
    }

    /// Ends `uid`'s nomination, if any (it was placed or is gone).
    pub(super) fn drop_nomination(&mut self, uid: &str) {
        if self.lift_nomination(uid).is_some() {
            self.capacity_freed = true;
        }
    }

    fn hold_nomination(&mut self, uid: &str, nomination: Nomination) {
        let mut held = nomination.decision.clone();
        held.pod_uid = nominee(uid);
        self.engine.nominate(&held);
        self.nominations.insert(uid.to_owned(), nomination);
    }

    /// What preemption does for a pod that fits nowhere now. `lifted` is its nomination, taken
    /// out before its decision.
    pub(super) fn preempt(
        &mut self,
        uid: &str,
        input: &placement::PodInput,
        lifted: Option<Nomination>,
    ) -> Preempted {
        let Some(record) = self.pods.get(uid) else {
            return Preempted::Nothing;
        };
        let (priority, preempts) = (record.priority, record.preempts);
        if let Some(nomination) = lifted {
            let left = nomination
                .victims
                .iter()
                .filter(|v| self.pods.contains_key(*v))
                .count();
            if left > 0 {
                let node = nomination.decision.node.clone();
                self.hold_nomination(uid, nomination);
                return Preempted::Waiting { node, left };
            }
        }
        if !preempts {
            return Preempted::Nothing;
        }
        let Some(pod) = record.pending.as_ref().map(|p| Arc::clone(&p.pod)) else {
            return Preempted::Nothing;
        };
        let (candidates, budgets) = self.candidates(priority);
        let Some(preemption) = self.engine.preempt(input, priority, &candidates, &budgets) else {
            return Preempted::Nothing;
        };
        let victims: Vec<Victim> = preemption
            .victims
            .iter()
            .filter_map(|v| self.pods.get(v))
            .map(|p| Victim {
                namespace: p.namespace.clone(),
                name: p.name.clone(),
                uid: p.uid.clone(),
            })
            .collect();
        let node = preemption.node.clone();
        self.hold_nomination(
            uid,
            Nomination {
                decision: preemption.decision,
                victims: preemption.victims.into_iter().collect(),
            },
        );
        Preempted::Evict(Eviction {
            preemptor: pod,
            node,
            victims,
        })
    }

    /// The running pods of lower priority than `priority`, and each PodDisruptionBudget's
    /// disruptions allowed, by position.
    fn candidates(&self, priority: i32) -> (Vec<Candidate>, Vec<i32>) {
        let budgets: Vec<(&(String, String), &Budget)> = self.budgets.iter().collect();
        let allowed = budgets.iter().map(|(_, b)| b.allowed).collect();
        let selects = |pod: &PodRecord| -> Vec<usize> {
            budgets
                .iter()
                .enumerate()
                .filter(|(_, ((namespace, _), budget))| {
                    *namespace == pod.namespace
                        && budget
                            .selector
                            .as_ref()
                            .is_some_and(|s| s.matches(&pod.labels))
                })
                .map(|(i, _)| i)
                .collect()
        };
        let mut candidates: Vec<Candidate> = self
            .pods
            .values()
            .filter(|p| p.node.is_some() && !p.life.ended() && p.priority < priority)
            .map(|p| Candidate {
                uid: p.uid.clone(),
                priority: p.priority,
                gang: p
                    .gang
                    .as_ref()
                    .map(|g| namespaced_key(&p.namespace, &g.name)),
                budgets: selects(p),
            })
            .collect();
        // The pods are kept by hash: sorted, the choice does not depend on that order.
        candidates.sort_by(|a, b| a.uid.cmp(&b.uid));
        (candidates, allowed)
    }
}
