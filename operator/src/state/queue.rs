//! The pending queue: pods in creation order, per-pod backoff, decisions, and the pods whose
//! decision is being written.

use super::preemption::Preempted;
use super::{Eviction, InFlight, PodRecord, RETRY_BACKOFF, SliceRecord, State, Unfinalize};
use k8s_openapi::api::core::v1::Pod;
use runtimekit_contract::Warning;
use runtimekit_placement as placement;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the scheduler should do with one pending pod.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// Bind it as decided (the engine has taken the capacity).
    Bind(Box<Binding>),
    /// It does not fit; report why if the message changed.
    Unschedulable {
        /// The aggregated reason.
        message: String,
        /// Whether it differs from the last report for this pod.
        changed: bool,
    },
    /// It breaks the resource contract; report once.
    Invalid {
        /// Every broken rule.
        message: String,
        /// A stable reason.
        reason: &'static str,
        /// Whether it was not reported yet.
        changed: bool,
    },
    /// It does not fit, and pods of lower priority are to be evicted for it.
    Preempt {
        /// The evictions to write.
        eviction: Box<Eviction>,
        /// The aggregated reason, with what preemption does about it.
        message: String,
        /// Whether it differs from the last report for this pod.
        changed: bool,
    },
    /// Nothing to do (gone, bound, in flight, or a gang member the gang controller places).
    Skip,
}

/// A decided pod and what it takes to bind it.
#[derive(Debug, Clone)]
pub struct Binding {
    /// The pod, as cached.
    pub pod: Arc<Pod>,
    /// Where it goes.
    pub decision: placement::Decision,
    /// Warnings the contract raised, to report once.
    pub warnings: Vec<Warning>,
    /// The annotation the allocation goes into.
    pub annotation: String,
}

/// Retry bookkeeping of one pod.
#[derive(Debug, Clone)]
pub(super) struct Attempts {
    /// Failed attempts in a row.
    count: u32,
    /// When it may try again.
    next: Instant,
    /// The message last reported to the pod and when, so each is reported once.
    reported: Option<(String, Instant)>,
    /// The pod breaks the contract: only replacing it helps, so freed capacity does not hurry it.
    broken: bool,
}

/// Whether two messages differ only in their numbers ("0/40 nodes ...: 12 ..." and
/// "0/40 nodes ...: 13 ..."), compared without copying either, as it runs on every failed
/// attempt.
fn only_numbers_differ(a: &str, b: &str) -> bool {
    fn words(s: &str) -> impl Iterator<Item = char> + '_ {
        s.chars().filter(|c| !c.is_ascii_digit())
    }
    words(a).eq(words(b))
}

/// The decision an interrupted binding had made, rebuilt from the slices it wrote.
fn resumed_decision(
    input: &placement::PodInput,
    slices: &[SliceRecord],
) -> Option<placement::Decision> {
    let node = slices.first()?.input.as_ref()?.node.clone();
    let mut containers: Vec<placement::ContainerPlacement> = Vec::new();
    for slice in slices {
        let card = slice.input.as_ref().filter(|i| i.node == node)?;
        let placement_card = placement::CardPlacement {
            index: card.card_index,
            uuid: card.card_uuid.clone(),
            replica: card.replica,
            share: card.share.clone(),
        };
        match containers
            .iter_mut()
            .find(|c| c.container == card.container)
        {
            Some(c) => c.cards.push(placement_card),
            None => containers.push(placement::ContainerPlacement {
                container: card.container.clone(),
                cards: vec![placement_card],
                nics: Vec::new(),
                locality: None,
            }),
        }
        if !slice.nics.is_empty()
            && let Some(c) = containers
                .iter_mut()
                .find(|c| c.container == card.container)
        {
            c.nics = slice.nics.clone();
        }
    }
    for c in &mut containers {
        c.cards.sort_by_key(|card| card.replica);
    }
    Some(placement::Decision {
        pod_uid: input.uid.clone(),
        node,
        containers,
        resources: input.resources.clone(),
        gang: input.gang.clone(),
    })
}

impl State {
    /// The pods waiting to be placed, oldest first (kept in order, so no pass sorts them).
    pub fn pending(&self) -> impl Iterator<Item = &PodRecord> {
        self.pending
            .iter()
            .filter_map(|(_, uid)| self.pods.get(uid))
    }

    /// How many pods wait to be placed.
    pub fn pending_count(&self) -> usize {
        self.pending.len()
    }

    /// How many pods the engine holds capacity for.
    pub fn holding_count(&self) -> usize {
        self.engine.pod_count()
    }

    /// Pending pods (not in flight, not gang members) whose backoff has passed, oldest first.
    pub fn ready(&self, now: Instant, limit: usize) -> Vec<String> {
        self.pending()
            .filter(|p| !self.in_flight.contains_key(&p.uid))
            .filter(|p| {
                !p.pending
                    .as_ref()
                    .is_some_and(|pending| pending.request.as_ref().is_ok_and(|r| r.gang.is_some()))
            })
            .filter(|p| self.attempts.get(&p.uid).is_none_or(|a| a.next <= now))
            .take(limit)
            .map(|p| p.uid.clone())
            .collect()
    }

    /// When the earliest backed-off pod becomes ready again.
    pub fn next_retry(&self) -> Option<Instant> {
        self.attempts
            .iter()
            .filter(|(uid, _)| self.pods.get(*uid).is_some_and(|p| p.pending.is_some()))
            .map(|(_, a)| a.next)
            .min()
    }

    /// Lets every backed-off pod try again soon: capacity was freed or a node appeared.
    pub fn retry_soon(&mut self, now: Instant) {
        for attempts in self.attempts.values_mut().filter(|a| !a.broken) {
            attempts.next = attempts.next.min(now + Duration::from_millis(200));
        }
    }

    /// Backs off a pod that did not fit; returns whether `message` is to be reported: a new
    /// reason at once, new counts of the same reasons at most once a minute.
    pub(super) fn back_off(&mut self, uid: &str, now: Instant, message: &str) -> bool {
        let attempts = self.attempts.entry(uid.to_owned()).or_insert(Attempts {
            count: 0,
            next: now,
            reported: None,
            broken: false,
        });
        attempts.count += 1;
        attempts.next = now + RETRY_BACKOFF.after(attempts.count);
        let changed = match &attempts.reported {
            None => true,
            Some((reported, _)) if reported == message => false,
            // In a filling cluster the node counts move on every attempt; reporting each would
            // be a condition and an Event per pod per retry, when the apiserver has least room.
            Some((reported, at)) if only_numbers_differ(reported, message) => {
                now >= *at + RETRY_BACKOFF.max
            }
            Some(_) => true,
        };
        if changed {
            attempts.reported = Some((message.to_owned(), now));
        }
        changed
    }

    /// Backs off a pod that breaks the contract: it only changes by being replaced, so it is
    /// retried rarely and never hurried by freed capacity.
    pub(super) fn back_off_broken(&mut self, uid: &str, now: Instant, message: &str) -> bool {
        let changed = self.back_off(uid, now, message);
        if let Some(attempts) = self.attempts.get_mut(uid) {
            attempts.next = now + RETRY_BACKOFF.max;
            attempts.broken = true;
        }
        changed
    }

    /// Decides one pending pod. A decided pod's capacity is taken at once (assumed) so the next
    /// decision sees it, and the pod is in flight until the watch shows it bound (or gone), or
    /// until [`State::bind_failed`].
    pub fn schedule(&mut self, uid: &str, now: Instant) -> Outcome {
        let Some(record) = self.pods.get(uid) else {
            return Outcome::Skip;
        };
        let Some(pending) = record.pending.clone() else {
            return Outcome::Skip;
        };
        if self.in_flight.contains_key(uid) {
            return Outcome::Skip;
        }
        let request = match &pending.request {
            Ok(request) if request.gang.is_some() => return Outcome::Skip,
            Ok(request) => request.clone(),
            Err(error) => {
                let message = error.to_string();
                let changed = self.back_off_broken(uid, now, &message);
                return Outcome::Invalid {
                    message,
                    reason: error.reason(),
                    changed,
                };
            }
        };
        let input = match placement::PodInput::from_pod(&pending.pod, &request, &self.names) {
            Ok(input) => input,
            Err(error) => {
                let message = error.to_string();
                let changed = self.back_off_broken(uid, now, &message);
                return Outcome::Invalid {
                    message,
                    reason: "InvalidPod",
                    changed,
                };
            }
        };
        // Slices of a pod that is not bound are left by an interrupted binding. A complete set
        // means its Binding may have been posted already: bind to exactly those slices (posting
        // it again is harmless). An incomplete set means it was not (the Binding comes after the
        // last slice), so they are removed, finalizer included, and the pod decided afresh.
        let leftovers: Vec<SliceRecord> = self.slices_of(uid).into_iter().cloned().collect();
        if leftovers.iter().any(|s| s.deleting) {
            // Still holding the cards of slices being removed: wait until they are gone.
            return Outcome::Skip;
        }
        if !leftovers.is_empty() {
            let wanted: u32 = request.containers.iter().map(|c| c.cards.cards()).sum();
            if let Some(decision) =
                resumed_decision(&input, &leftovers).filter(|_| leftovers.len() == wanted as usize)
            {
                self.start_flight(uid);
                let annotation = self.allocation_annotation();
                return Outcome::Bind(Box::new(Binding {
                    pod: pending.pod,
                    decision,
                    warnings: Vec::new(),
                    annotation,
                }));
            }
            for slice in leftovers {
                let key = (slice.namespace, slice.name);
                self.work.release.insert(key.clone());
                self.work
                    .unfinalize
                    .entry(key)
                    .or_insert(Unfinalize::NeverEnacted);
            }
            return Outcome::Skip;
        }
        if let Err(exceeded) = self.check_quota(&record.namespace, &[uid]) {
            let message = exceeded.to_string();
            let changed = self.back_off(uid, now, &message);
            return Outcome::Unschedulable { message, changed };
        }
        // The room held for it, if it waits for victims, is its own to decide with.
        let nominated = self.lift_nomination(uid);
        match self.engine.decide(&input) {
            Ok(decision) => match self.engine.commit(&decision) {
                Ok(()) => {
                    self.start_flight(uid);
                    let annotation = self.allocation_annotation();
                    Outcome::Bind(Box::new(Binding {
                        pod: pending.pod,
                        decision,
                        warnings: request.warnings,
                        annotation,
                    }))
                }
                Err(error) => {
                    let message = error.to_string();
                    let changed = self.back_off(uid, now, &message);
                    Outcome::Unschedulable { message, changed }
                }
            },
            Err(unschedulable) => {
                let mut message = unschedulable.to_string();
                let eviction = match self.preempt(uid, &input, nominated) {
                    Preempted::Waiting { node, left } => {
                        message.push_str(&format!(
                            " Preemption: waiting for {left} pod(s) of lower priority evicted from node {node} to terminate."
                        ));
                        None
                    }
                    Preempted::Evict(eviction) => {
                        message.push_str(&format!(
                            " Preemption: {} pod(s) of lower priority on node {} are being evicted for it.",
                            eviction.victims.len(),
                            eviction.node
                        ));
                        Some(eviction)
                    }
                    Preempted::Nothing => None,
                };
                let changed = self.back_off(uid, now, &message);
                match eviction {
                    Some(eviction) => Outcome::Preempt {
                        eviction: Box::new(eviction),
                        message,
                        changed,
                    },
                    None => Outcome::Unschedulable { message, changed },
                }
            }
        }
    }

    /// The binding of `uid` was accepted and its writes are done. The pod stays in flight until
    /// the watch shows it bound, so it is never decided a second time in between.
    pub fn bound(&mut self, uid: &str) {
        self.attempts.remove(uid);
        if self.finished(uid) {
            // The pod ended or was deleted while its writes ran.
            self.end_flight(uid);
            self.hold_only_written_slices(uid);
        } else if self.pods.get(uid).is_some_and(|p| p.pending.is_none()) {
            self.end_flight(uid);
            // Slices whose writes failed are re-created from the allocation.
            self.settle_recorded(uid);
        } else if let Some(in_flight) = self.in_flight.get_mut(uid) {
            *in_flight = InFlight::Written;
        }
    }

    /// Puts `uid`'s decision in flight: from now on it holds its quota.
    pub(super) fn start_flight(&mut self, uid: &str) {
        self.in_flight.insert(uid.to_owned(), InFlight::Writing);
        self.sync_holding(uid);
    }

    /// Ends `uid`'s flight: it holds its quota only if it is bound.
    pub(super) fn end_flight(&mut self, uid: &str) {
        self.in_flight.remove(uid);
        self.sync_holding(uid);
    }

    /// Whether the writes of any decision are still running.
    pub fn writes_running(&self) -> bool {
        self.in_flight.values().any(|s| *s == InFlight::Writing)
    }

    /// Whether a decision for `uid` is being written or waits for the watch to show it bound.
    pub fn in_flight(&self, uid: &str) -> bool {
        self.in_flight.contains_key(uid)
    }

    /// The binding of `uid` failed: its capacity returns and it retries after a backoff.
    pub fn bind_failed(&mut self, uid: &str, now: Instant, message: &str) -> bool {
        self.end_flight(uid);
        if self.finished(uid) {
            self.hold_only_written_slices(uid);
            return false;
        }
        if self.pods.get(uid).is_some_and(|p| p.node.is_some()) {
            // The pod is bound all the same (an earlier try landed): what it records counts.
            self.settle_recorded(uid);
            return false;
        }
        self.hold_only_written_slices(uid);
        self.back_off(uid, now, message)
    }
}
