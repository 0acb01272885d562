//! The GangGroup controller: creates a GangGroup for pods labelled `aliyun.com/min-member`,
//! checks the size against the JobSet, waits for the members, reserves all of them in one
//! decision, binds only when every member is reserved, and when the gang is not complete and
//! running within its timeout records the attempt and retries with backoff (deleting bound
//! members only when the gang opts in).
//!
//! What a pass does is decided by the pure state machine in [`next`]; this loop only reads the
//! state, asks the apiserver what `next` needs (the JobSet's size), and carries out the result.

pub mod next;

use crate::backoff::Backoff;
use crate::jobset::JobSet;
use crate::shared::Shared;
use crate::state::{GangBinding, Life};
use crate::writes;
use crate::writes::binding::{create_slice, post_binding};
use crate::writes::report::Reports;
use futures::future::join_all;
use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta};
use kube::{Client, ResourceExt};
use next::{Action, Members, Step};
use runtimekit_crds::{GangGroup, GangGroupSpec, GangGroupStatus, GangPhase, GpuSlice};
use runtimekit_placement::objects::{allocation_of, slices_and_allocation};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How often gangs are looked at even without a change (timeouts advance on their own).
const TICK: Duration = Duration::from_secs(1);
/// Gangs whose passes run at once. A placing pass waits on a few round trips; one pass after
/// another left gangs of 8 at 91 pods/s where Volcano, binding every ready gang in one cycle,
/// reached 142. Sixteen keep the apiserver busy (a gang of 8 writes 17 objects) without queueing
/// every gang's writes behind every other's: at 64, 100 gangs of 8 were decided at once and half
/// their members were bound only after 2.7-3.1 s, at 16 after 2.0-2.5 s, at the same rate.
/// Reservations stay one at a time: each takes the state's lock.
const CONCURRENT_PASSES: usize = 16;
/// How long a status whose only change is its member counts waits after the gang's last write,
/// as the Job controller batches its pods' updates: members turning Running one by one cost
/// one write, not one each. The next pass, at most a [`TICK`] later, writes it.
const COUNTS_BATCH: Duration = Duration::from_secs(1);
/// How long a gang's size check holds. A JobSet's jobs and templates cannot change, so reading
/// it on every pass (every second for a gang that waits) only loads the apiserver; it is read
/// again now and then for a JobSet deleted and created again under the same name.
const SIZE_CHECK_HOLDS: Duration = Duration::from_secs(60);

/// Runs the controller until the task is dropped.
pub async fn run(shared: Arc<Shared>, client: Client, reports: Reports) {
    let controller = Controller {
        shared: Arc::clone(&shared),
        client,
        reports,
        memory: Mutex::default(),
    };
    let mut changes = shared.subscribe();
    loop {
        let gangs = {
            let state = shared.lock();
            let mut keys = state.gangs_with_members();
            keys.extend(state.gang_keys());
            keys.sort();
            keys.dedup();
            keys
        };
        // What is remembered of gangs that are gone goes with them.
        controller.memory().retain(|key, _| gangs.contains(key));
        let controller = &controller;
        let passes = stream::iter(gangs)
            .map(|key| async move {
                match controller.held_phase(&key) {
                    Some(held) => held,
                    None => controller.reconcile(&key.0, &key.1).await,
                }
            })
            .buffer_unordered(CONCURRENT_PASSES)
            .collect::<Vec<_>>()
            .await;
        let mut phases: BTreeMap<String, i64> = BTreeMap::new();
        for phase in passes.into_iter().flatten() {
            *phases.entry(format!("{phase:?}")).or_default() += 1;
        }
        for phase in crate::metrics::GANG_PHASES {
            shared
                .metrics
                .set_gangs(phase, phases.get(phase).copied().unwrap_or(0));
        }
        tokio::select! {
            _ = changes.changed() => {}
            () = tokio::time::sleep(TICK) => {}
        }
    }
}

struct Controller {
    shared: Arc<Shared>,
    client: Client,
    reports: Reports,
    /// What passes remember of each gang between them.
    memory: Mutex<BTreeMap<(String, String), Memory>>,
}

/// What the controller remembers of one gang between passes.
#[derive(Default)]
struct Memory {
    /// The last message reported to the members and which members got it, so each member
    /// hears each change once, members that arrive later included.
    reported: (String, BTreeSet<String>),
    /// Set while the last status write failed: until when the gang is left alone.
    hold: Option<Hold>,
    /// The last size check against the gang's JobSet.
    size: Option<SizeCheck>,
    /// When the status was last written.
    written: Option<Instant>,
}

/// One size check of a gang against its JobSet.
struct SizeCheck {
    /// The GangGroup checked.
    gang_uid: String,
    at: Instant,
    /// The contract's message, if the sizes disagree.
    error: Option<String>,
}

/// How long a gang whose status write failed is left alone: the error policy.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Hold {
    /// The apiserver refused the status as invalid: writing it again cannot help, so the gang
    /// waits until its object changes (this resource version is gone).
    UntilChanged(Option<String>),
    /// A transient failure (the apiserver away, overloaded or timing out): retried after a
    /// backoff that doubles with each failure in a row.
    Until { at: Instant, failures: u32 },
}

/// The backoff of a gang whose status write failed transiently.
const WRITE_BACKOFF: Backoff = Backoff {
    first: Duration::from_secs(1),
    max: Duration::from_secs(30),
};

impl Hold {
    /// The hold after `error`, the `failures`-th transient failure in a row if it is transient.
    fn after(error: &kube::Error, gang: &GangGroup, failures: u32, now: Instant) -> Hold {
        match error {
            kube::Error::Api(status) if matches!(status.code, 400 | 403 | 404 | 422) => {
                Hold::UntilChanged(gang.metadata.resource_version.clone())
            }
            _ => Hold::Until {
                at: now + WRITE_BACKOFF.after(failures),
                failures,
            },
        }
    }
}

/// A snapshot of one gang, taken under the lock.
struct Snapshot {
    gang: Option<Arc<GangGroup>>,
    members: Vec<Member>,
    min_member: u32,
    job_set: Option<String>,
}

impl Snapshot {
    /// What the gang's state machine needs of the members.
    fn counts(&self) -> Members {
        Members {
            seen: self.members.len(),
            bound: self.members.iter().filter(|m| m.bound).count(),
            running: self.members.iter().filter(|m| m.running).count(),
        }
    }
}

struct Member {
    uid: String,
    name: String,
    bound: bool,
    running: bool,
    succeeded: bool,
    pod: Option<Arc<Pod>>,
}

/// Who owns a GangGroup created for pods outside a JobSet: the controller of every member when
/// they share one (a Job, a StatefulSet), else the members that exist now; once those are all
/// gone the GangGroup goes, and members that come later have it created again.
fn members_owner(members: &[Member]) -> Vec<OwnerReference> {
    let controllers: Vec<Option<&OwnerReference>> = members
        .iter()
        .map(|m| {
            m.pod.as_ref().and_then(|p| {
                p.owner_references()
                    .iter()
                    .find(|o| o.controller == Some(true))
            })
        })
        .collect();
    if let Some(Some(first)) = controllers.first()
        && controllers
            .iter()
            .all(|c| c.is_some_and(|c| c.uid == first.uid))
    {
        return vec![OwnerReference {
            controller: None,
            block_owner_deletion: None,
            ..(*first).clone()
        }];
    }
    members
        .iter()
        .map(|m| OwnerReference {
            api_version: "v1".into(),
            kind: "Pod".into(),
            name: m.name.clone(),
            uid: m.uid.clone(),
            controller: None,
            block_owner_deletion: None,
        })
        .collect()
}

impl Controller {
    /// Locks the memory of every gang; no pass holds it across an await, so a poisoned lock
    /// only means a pass panicked between two plain map operations.
    fn memory(&self) -> MutexGuard<'_, BTreeMap<(String, String), Memory>> {
        self.memory
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The phase of a gang held after a failed write, which this pass leaves alone; `None` for a
    /// gang to reconcile.
    fn held_phase(&self, key: &(String, String)) -> Option<Option<GangPhase>> {
        let hold = self.memory().get(key)?.hold.clone()?;
        let gang = self.shared.lock().gang(&key.0, &key.1).cloned();
        let waiting = match (&hold, &gang) {
            (Hold::UntilChanged(version), Some(gang)) => *version == gang.metadata.resource_version,
            (Hold::Until { at, .. }, Some(_)) => Instant::now() < *at,
            (_, None) => false,
        };
        if !waiting {
            return None;
        }
        Some(gang.and_then(|g| g.status.as_ref().and_then(|s| s.phase)))
    }

    /// One pass over the gang `namespace/name`: decide with [`next`], then carry it out.
    async fn reconcile(&self, namespace: &str, name: &str) -> Option<GangPhase> {
        let snapshot = self.snapshot(namespace, name);
        let Some(gang) = snapshot.gang.clone() else {
            if !snapshot.members.is_empty() {
                self.create(namespace, name, &snapshot).await;
            }
            return None;
        };
        let now = Timestamp::now();
        let members = snapshot.counts();
        let size_error = if next::backing_off(&gang, now) {
            None
        } else {
            self.check_size(namespace, &gang).await
        };
        let pass = match next::next(&gang, members, size_error, now) {
            Step::Done(pass) => pass,
            Step::Place(status) => {
                let reservation =
                    self.shared
                        .lock()
                        .reserve_gang(namespace, name, gang.spec.highest_tier);
                match reservation {
                    Ok(binding) => {
                        let status = next::reserved(
                            status,
                            members,
                            binding.placement.clone(),
                            binding.members.len(),
                        );
                        // Informational, so written beside the members' writes rather than
                        // before them (one round trip less per gang): the bindings go ahead even
                        // if it fails, and the pass's last write, made after both, says where
                        // they ended.
                        let (marked, failure) = tokio::join!(
                            self.write_status(&gang, status.clone()),
                            self.bind(namespace, name, binding)
                        );
                        if let Err(error) = marked {
                            tracing::warn!(gang = name, %namespace, %error, "could not mark the GangGroup Reserved");
                        }
                        next::bound(&gang, status, members, failure, now)
                    }
                    Err(error) => next::unplaceable(&gang, status, members, error.to_string(), now),
                }
            }
        };
        for action in &pass.actions {
            match action {
                Action::Report { reason, message } => {
                    self.report_members(namespace, name, &snapshot, reason, message)
                        .await;
                }
                Action::DeleteBound => self.delete_bound(namespace, name, &snapshot).await,
            }
        }
        let key = (namespace.to_owned(), name.to_owned());
        let wrote_lately = self
            .memory()
            .get(&key)
            .and_then(|m| m.written)
            .is_some_and(|at| at.elapsed() < COUNTS_BATCH);
        if wrote_lately && next::only_counts_moved(gang.status.as_ref(), &pass.status) {
            return Some(pass.phase);
        }
        match self.write_status(&gang, pass.status).await {
            Ok(()) => {
                self.memory().entry(key).or_default().hold = None;
            }
            Err(error) => {
                let failures = match self.memory().get(&key).and_then(|m| m.hold.as_ref()) {
                    Some(Hold::Until { failures, .. }) => failures + 1,
                    _ => 1,
                };
                // The gang as the state has it now: a Reserved write earlier in this pass may
                // have moved its resource version on.
                let current = self.shared.lock().gang(namespace, name).cloned();
                let hold = Hold::after(
                    &error,
                    current.as_deref().unwrap_or(&gang),
                    failures,
                    Instant::now(),
                );
                tracing::warn!(gang = name, %namespace, %error, ?hold, "could not write the GangGroup status");
                self.memory().entry(key).or_default().hold = Some(hold);
            }
        }
        Some(pass.phase)
    }

    fn snapshot(&self, namespace: &str, name: &str) -> Snapshot {
        let state = self.shared.lock();
        let members: Vec<Member> = state
            .gang_members(namespace, name)
            .into_iter()
            .map(|p| Member {
                uid: p.uid.clone(),
                name: p.name.clone(),
                // A member whose binding landed but is not in the watch yet counts as bound.
                bound: p.node.is_some() || state.in_flight(&p.uid),
                running: p.life.ran(),
                succeeded: p.life == Life::Succeeded,
                pod: p.pending.as_ref().map(|pending| Arc::clone(&pending.pod)),
            })
            .collect();
        let first = state
            .gang_members(namespace, name)
            .into_iter()
            .find_map(|p| p.gang.clone());
        Snapshot {
            gang: state.gang(namespace, name).cloned(),
            members,
            min_member: first.as_ref().map_or(1, |g| g.min_member),
            job_set: first.and_then(|g| g.job_set),
        }
    }

    /// Creates the GangGroup of pods that carry the min-member label, owned by their JobSet, or
    /// else as [`members_owner`] says, so the garbage collector deletes it with them.
    async fn create(&self, namespace: &str, name: &str, snapshot: &Snapshot) {
        let mut owners: Vec<OwnerReference> = Vec::new();
        if let Some(job_set) = &snapshot.job_set {
            let api: Api<JobSet> = Api::namespaced(self.client.clone(), namespace);
            if let Ok(js) = api.get(job_set).await {
                owners.push(OwnerReference {
                    api_version: "jobset.x-k8s.io/v1alpha2".into(),
                    kind: "JobSet".into(),
                    name: js.name_any(),
                    uid: js.metadata.uid.clone().unwrap_or_default(),
                    controller: Some(true),
                    block_owner_deletion: None,
                });
            }
        } else {
            owners = members_owner(&snapshot.members);
        }
        let gang = GangGroup {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(namespace.into()),
                owner_references: (!owners.is_empty()).then_some(owners),
                ..ObjectMeta::default()
            },
            spec: GangGroupSpec {
                job_set: snapshot.job_set.clone(),
                ..GangGroupSpec::with_min_member(snapshot.min_member)
            },
            status: None,
        };
        match writes::gangs::create(&self.client, &gang).await {
            Ok(Some(created)) => self.shared.lock().apply_gang(&created),
            Ok(None) => {}
            Err(error) => {
                tracing::warn!(gang = name, %namespace, %error, "could not create the GangGroup")
            }
        }
    }

    /// For a gang from a JobSet, the contract's message when min-member differs from the number
    /// of pods the JobSet runs carrying the label. A JobSet not found is not checked (yet).
    async fn check_size(&self, namespace: &str, gang: &GangGroup) -> Option<String> {
        let job_set = gang.spec.job_set.as_ref()?;
        let key = (namespace.to_owned(), gang.name_any());
        let uid = gang.metadata.uid.clone().unwrap_or_default();
        if let Some(check) = self.memory().get(&key).and_then(|m| m.size.as_ref())
            && check.gang_uid == uid
            && check.at.elapsed() < SIZE_CHECK_HOLDS
        {
            return check.error.clone();
        }
        let api: Api<JobSet> = Api::namespaced(self.client.clone(), namespace);
        let js = api.get(job_set).await.ok()?;
        let names = self.shared.lock().config.names();
        let parallelism = js.gang_parallelism(&names.min_member_label);
        let membership = runtimekit_contract::GangMembership {
            name: gang.name_any(),
            job_set: Some(job_set.clone()),
            min_member: gang.spec.min_member,
        };
        let error = runtimekit_contract::check_gang_size(
            &names,
            &membership,
            &format!("JobSet {job_set:?}"),
            parallelism,
        )
        .err()
        .map(|v| v.to_string());
        let check = SizeCheck {
            gang_uid: uid,
            at: Instant::now(),
            error: error.clone(),
        };
        self.memory().entry(key).or_default().size = Some(check);
        error
    }

    /// Writes every member's slices and Bindings at once, as for a single pod. Members whose
    /// Binding failed stay pending and give back what they held; the others stay bound, and a
    /// slice of theirs that failed is re-created from the allocation their Binding recorded.
    /// Returns why some member was not bound, if one was not.
    async fn bind(&self, namespace: &str, name: &str, binding: GangBinding) -> Option<String> {
        let slices: Api<GpuSlice> = Api::namespaced(self.client.clone(), namespace);
        let mut all_slices = Vec::new();
        for (pod, decision) in &binding.members {
            let (pod_slices, _) = slices_and_allocation(pod, decision);
            all_slices.extend(pod_slices);
        }
        // The slices carry no phase: the node agent enacts them as it does a single pod's, and a
        // member whose Binding fails gives them back (deleted, and released if enacted).
        let annotation = binding.annotation.as_str();
        let (created, results) = tokio::join!(
            join_all(
                all_slices
                    .iter()
                    .map(|slice| create_slice(&slices, slice, writes::GANGS)),
            ),
            join_all(binding.members.iter().map(|(pod, decision)| {
                let allocation = allocation_of(pod, decision);
                async move {
                    post_binding(&self.client, pod, annotation, &allocation)
                        .await
                        .map_err(|e| e.to_string())
                }
            }))
        );
        self.shared
            .lock()
            .slices_created(all_slices.iter().zip(created.iter().map(Result::is_ok)));
        for (slice, error) in all_slices.iter().zip(&created) {
            if let Err(error) = error {
                tracing::warn!(slice = %slice.name_any(), %namespace, %error, "writing a gang member's GpuSlice failed");
            }
        }
        let written: Vec<(String, bool)> = binding
            .members
            .iter()
            .zip(&results)
            .map(|((_, d), result)| (d.pod_uid.clone(), result.is_ok()))
            .collect();
        self.shared.lock().gang_written(namespace, name, &written);
        self.shared.wake();
        for ((pod, decision), _) in binding
            .members
            .iter()
            .zip(&results)
            .filter(|(_, r)| r.is_ok())
        {
            self.reports.scheduled(pod, &decision.node).await;
        }
        let failure = results.into_iter().find_map(Result::err)?;
        tracing::warn!(gang = name, %namespace, error = %failure, "binding gang members failed");
        Some(failure)
    }

    /// Deletes the bound members that have not finished, each only if it is still the pod this
    /// pass saw (a UID precondition): the gang opted in with `onTimeout: DeleteBoundMembers`.
    /// A member whose delete fails stays, and the next timeout tries again.
    async fn delete_bound(&self, namespace: &str, name: &str, snapshot: &Snapshot) {
        let members: Vec<(String, String)> = snapshot
            .members
            .iter()
            .filter(|m| m.bound && !m.succeeded)
            .map(|m| (m.name.clone(), m.uid.clone()))
            .collect();
        for (pod, error) in writes::gangs::delete_members(&self.client, namespace, &members).await {
            tracing::warn!(%pod, %namespace, %error, "could not delete a bound gang member");
        }
        tracing::info!(gang = name, %namespace, deleted = members.len(), "deleted the bound members of a timed-out attempt");
    }

    async fn report_members(
        &self,
        namespace: &str,
        name: &str,
        snapshot: &Snapshot,
        reason: &str,
        message: &str,
    ) {
        let key = (namespace.to_owned(), name.to_owned());
        let untold: Vec<&Arc<Pod>> = {
            let mut memory = self.memory();
            let (last, told) = &mut memory.entry(key).or_default().reported;
            if last != message {
                *last = message.to_owned();
                told.clear();
            }
            snapshot
                .members
                .iter()
                .filter_map(|m| m.pod.as_ref().filter(|_| told.insert(m.uid.clone())))
                .collect()
        };
        let text = format!("gang {name}: {message}");
        join_all(
            untold
                .into_iter()
                .map(|pod| self.reports.unschedulable(pod, reason, &text)),
        )
        .await;
    }

    /// Writes `status` unless the gang has it already; the gang as written feeds the state at
    /// once, so the next pass starts from it.
    async fn write_status(
        &self,
        gang: &GangGroup,
        status: GangGroupStatus,
    ) -> Result<(), kube::Error> {
        if gang.status.as_ref() == Some(&status) {
            return Ok(());
        }
        let updated = writes::gangs::write_status(&self.client, gang, &status).await?;
        self.shared.lock().apply_gang(&updated);
        let key = (gang.namespace().unwrap_or_default(), gang.name_any());
        self.memory().entry(key).or_default().written = Some(Instant::now());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{Hold, Member, WRITE_BACKOFF, members_owner};
    use runtimekit_crds::{GangGroup, GangGroupSpec, OnTimeout, Tier};
    use std::sync::Arc;
    use std::time::Instant;

    fn member_of(name: &str, job: Option<&str>) -> Member {
        let pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "uid": format!("uid-{name}"), "ownerReferences": job.map(|j| vec![
                serde_json::json!({"apiVersion": "batch/v1", "kind": "Job", "name": j, "uid": format!("uid-{j}"), "controller": true}),
            ])},
        }))
        .expect("pod");
        Member {
            uid: format!("uid-{name}"),
            name: name.into(),
            bound: false,
            running: false,
            succeeded: false,
            pod: Some(Arc::new(pod)),
        }
    }

    #[test]
    fn a_created_gang_is_owned_by_its_members_controller_or_else_by_them() {
        let shared = [member_of("a", Some("job")), member_of("b", Some("job"))];
        let owners: Vec<(String, String, Option<bool>)> = members_owner(&shared)
            .into_iter()
            .map(|o| (o.kind, o.name, o.controller))
            .collect();
        assert_eq!(owners, [("Job".to_owned(), "job".to_owned(), None)]);
        let mixed = [member_of("a", Some("job")), member_of("b", None)];
        let owners: Vec<(String, String)> = members_owner(&mixed)
            .into_iter()
            .map(|o| (o.kind, o.name))
            .collect();
        assert_eq!(
            owners,
            [
                ("Pod".to_owned(), "a".to_owned()),
                ("Pod".to_owned(), "b".to_owned())
            ]
        );
    }

    fn api_error(code: u16) -> kube::Error {
        let status = serde_json::from_value(serde_json::json!({
            "status": "Failure", "message": "refused", "reason": "Refused", "code": code,
        }))
        .expect("status");
        kube::Error::Api(Box::new(status))
    }

    fn gang() -> GangGroup {
        let mut gang = GangGroup::new(
            "train",
            GangGroupSpec {
                min_member: 2,
                timeout_seconds: 60,
                highest_tier: Tier::NetworkPod,
                job_set: None,
                on_timeout: OnTimeout::default(),
            },
        );
        gang.metadata.resource_version = Some("41".into());
        gang
    }

    #[test]
    fn an_invalid_status_waits_for_the_gang_to_change() {
        let hold = Hold::after(&api_error(422), &gang(), 1, Instant::now());
        assert_eq!(hold, Hold::UntilChanged(Some("41".into())));
    }

    #[test]
    fn a_transient_failure_backs_off_doubling() {
        let now = Instant::now();
        for (failures, code) in [(1, 500), (3, 503), (9, 429)] {
            let hold = Hold::after(&api_error(code), &gang(), failures, now);
            assert_eq!(
                hold,
                Hold::Until {
                    at: now + WRITE_BACKOFF.after(failures),
                    failures
                }
            );
        }
    }
}
