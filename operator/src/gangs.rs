//! The GangGroup controller: creates a GangGroup for pods labelled `aliyun.com/min-member`,
//! checks the size against the JobSet, waits for the members, reserves all of them in one
//! decision, binds only when every member is reserved, and rolls everything back when the gang
//! is not complete and running within its timeout, retrying with backoff.

use crate::jobset::JobSet;
use crate::report::Reports;
use crate::scheduler::{self, FIELD_MANAGER};
use crate::shared::Shared;
use crate::state::GangBinding;
use futures::future::join_all;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use runtimekit_crds::{
    GangGroup, GangGroupSpec, GangGroupStatus, GangMembers, GangPhase, GpuSlice, SlicePhase, Tier,
    set_condition,
};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

/// The condition that latches once every member of the current attempt ran: a gang that ran is
/// never rolled back for a late member.
const RAN: &str = "Ran";

/// How often gangs are looked at even without a change (timeouts advance on their own).
const TICK: Duration = Duration::from_secs(1);
/// The first backoff after a rollback; it doubles per attempt up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(5);
const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// Runs the controller until the task is dropped.
pub async fn run(shared: Arc<Shared>, client: Client, reports: Reports) {
    let mut controller = Controller {
        shared: Arc::clone(&shared),
        client,
        reports,
        reported: BTreeMap::new(),
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
        let mut phases: BTreeMap<String, i64> = BTreeMap::new();
        for (namespace, name) in gangs {
            if let Some(phase) = controller.reconcile(&namespace, &name).await {
                *phases.entry(format!("{phase:?}")).or_default() += 1;
            }
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
    /// The last message reported to each gang's members and which members got it, so each
    /// member hears each change once, members that arrive later included.
    reported: BTreeMap<(String, String), (String, BTreeSet<String>)>,
}

/// A snapshot of one gang, taken under the lock.
struct Snapshot {
    gang: Option<Arc<GangGroup>>,
    members: Vec<Member>,
    min_member: u32,
    job_set: Option<String>,
}

struct Member {
    uid: String,
    name: String,
    bound: bool,
    running: bool,
    pod: Option<Arc<Pod>>,
}

impl Controller {
    async fn reconcile(&mut self, namespace: &str, name: &str) -> Option<GangPhase> {
        let snapshot = self.snapshot(namespace, name);
        let Some(gang) = snapshot.gang.clone() else {
            if !snapshot.members.is_empty() {
                self.create(namespace, name, &snapshot).await;
            }
            return None;
        };
        let status = gang.status.clone().unwrap_or_default();
        let now = Timestamp::now();
        let min = gang.spec.min_member as usize;
        let seen = snapshot.members.len();
        let bound = snapshot.members.iter().filter(|m| m.bound).count();
        let running = snapshot.members.iter().filter(|m| m.running).count();
        let mut next = GangGroupStatus {
            phase: status.phase,
            members: Some(GangMembers {
                seen: count(seen),
                reserved: count(bound),
                bound: count(bound),
                running: count(running),
            }),
            placement: status.placement.clone(),
            attempts: status.attempts,
            attempt_start_time: status.attempt_start_time.clone(),
            message: status.message.clone(),
            observed_generation: gang.metadata.generation,
            conditions: status.conditions.clone(),
        };

        // After a rollback the gang waits out its backoff before the next attempt.
        let start = next.attempt_start_time.as_ref().map(|t| t.0);
        if start.is_some_and(|s| s > now) {
            self.write_status(&gang, next).await;
            return Some(GangPhase::TimedOut);
        }
        if next.attempt_start_time.is_none() || next.phase == Some(GangPhase::TimedOut) {
            next.attempt_start_time = Some(Time(now));
            next.phase = Some(GangPhase::Waiting);
        }

        if let Some(message) = self.check_size(namespace, &gang).await {
            next.phase = Some(GangPhase::Failed);
            next.message = Some(message.clone());
            self.report_members(namespace, name, &snapshot, "InvalidGang", &message)
                .await;
            self.write_status(&gang, next).await;
            return Some(GangPhase::Failed);
        }

        let pending = seen - bound;
        let ran = next
            .conditions
            .iter()
            .any(|c| c.type_ == RAN && c.status == "True");
        if seen >= min && running >= min {
            next.phase = Some(GangPhase::Running);
            next.message = None;
            if !ran {
                set_condition(
                    &mut next.conditions,
                    condition(
                        RAN,
                        "True",
                        "AllMembersRunning",
                        "every member ran in this attempt",
                    ),
                );
            }
        } else if seen < min {
            next.phase = Some(GangPhase::Waiting);
            let message = format!("waiting for members: {seen} of {min} exist");
            next.message = Some(message.clone());
            self.report_members(namespace, name, &snapshot, "GangIncomplete", &message)
                .await;
        } else if pending > 0 && (bound == 0 || ran) {
            // All pending members in one decision: the whole gang at first, or the replacements
            // of members that failed after the gang ran.
            match self.place(namespace, name, gang.spec.highest_tier) {
                Ok(binding) => {
                    next.placement = Some(binding.placement.clone());
                    next.phase = Some(GangPhase::Reserved);
                    next.message = None;
                    next.members = Some(GangMembers {
                        seen: count(seen),
                        reserved: count(bound + binding.members.len()),
                        bound: count(bound),
                        running: count(running),
                    });
                    self.write_status(&gang, next.clone()).await;
                    let bound_now = self.bind(namespace, name, binding).await;
                    next.phase = Some(if bound_now {
                        GangPhase::Bound
                    } else {
                        GangPhase::Waiting
                    });
                    if !bound_now {
                        next.message =
                            Some("binding the gang failed; rolled back and retrying".into());
                    }
                }
                Err(message) => {
                    next.phase = Some(GangPhase::Waiting);
                    next.message = Some(message.clone());
                    self.report_members(namespace, name, &snapshot, "Unschedulable", &message)
                        .await;
                }
            }
        } else {
            next.phase = Some(GangPhase::Bound);
        }

        let timeout = i64::from(gang.spec.timeout_seconds);
        let started = next.attempt_start_time.as_ref().map_or(now, |t| t.0);
        let ran = next
            .conditions
            .iter()
            .any(|c| c.type_ == RAN && c.status == "True");
        if !ran && now.as_second() - started.as_second() > timeout {
            self.roll_back(namespace, name, &snapshot).await;
            next.attempts += 1;
            let backoff = FIRST_BACKOFF
                .saturating_mul(1 << (next.attempts - 1).min(6))
                .min(MAX_BACKOFF);
            next.phase = Some(GangPhase::TimedOut);
            next.message = Some(format!(
                "not complete and running within {timeout} s ({running} of {min} running, {seen} seen); rolled back, attempt {} starts in {} s",
                next.attempts + 1,
                backoff.as_secs()
            ));
            next.attempt_start_time = Some(Time(
                now.saturating_add(
                    k8s_openapi::jiff::SignedDuration::try_from(backoff).unwrap_or_default(),
                )
                .unwrap_or(now),
            ));
            next.placement = None;
            next.members = Some(GangMembers {
                seen: count(seen),
                reserved: 0,
                bound: 0,
                running: 0,
            });
            set_condition(
                &mut next.conditions,
                condition(RAN, "False", "RolledBack", "the attempt was rolled back"),
            );
        }
        let phase = next.phase;
        self.write_status(&gang, next).await;
        phase
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
                running: p.running || p.succeeded,
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

    /// Creates the GangGroup of pods that carry the min-member label, owned by their JobSet.
    async fn create(&self, namespace: &str, name: &str, snapshot: &Snapshot) {
        let mut owner = None;
        if let Some(job_set) = &snapshot.job_set {
            let api: Api<JobSet> = Api::namespaced(self.client.clone(), namespace);
            if let Ok(js) = api.get(job_set).await {
                owner = Some(OwnerReference {
                    api_version: "jobset.x-k8s.io/v1alpha2".into(),
                    kind: "JobSet".into(),
                    name: js.name_any(),
                    uid: js.metadata.uid.clone().unwrap_or_default(),
                    controller: Some(true),
                    block_owner_deletion: None,
                });
            }
        }
        let gang = GangGroup {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(namespace.into()),
                owner_references: owner.map(|o| vec![o]),
                ..ObjectMeta::default()
            },
            spec: GangGroupSpec {
                min_member: snapshot.min_member,
                timeout_seconds: 180,
                highest_tier: Tier::NetworkPod,
                job_set: snapshot.job_set.clone(),
            },
            status: None,
        };
        let api: Api<GangGroup> = Api::namespaced(self.client.clone(), namespace);
        match api
            .create(
                &PostParams {
                    field_manager: Some(FIELD_MANAGER.into()),
                    ..PostParams::default()
                },
                &gang,
            )
            .await
        {
            Ok(created) => self.shared.lock().apply_gang(&created),
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(error) => {
                tracing::warn!(gang = name, %namespace, %error, "could not create the GangGroup")
            }
        }
    }

    /// For a gang from a JobSet, the contract's message when min-member differs from the number
    /// of pods the JobSet runs carrying the label.
    async fn check_size(&self, namespace: &str, gang: &GangGroup) -> Option<String> {
        let job_set = gang.spec.job_set.as_ref()?;
        let api: Api<JobSet> = Api::namespaced(self.client.clone(), namespace);
        let js = api.get(job_set).await.ok()?;
        let names = self.shared.lock().config.names();
        let parallelism = js.gang_parallelism(&names.min_member_label);
        let membership = runtimekit_contract::GangMembership {
            name: gang.name_any(),
            job_set: Some(job_set.clone()),
            min_member: gang.spec.min_member,
        };
        runtimekit_contract::check_gang_size(
            &names,
            &membership,
            &format!("JobSet {job_set:?}"),
            parallelism,
        )
        .err()
        .map(|v| v.to_string())
    }

    fn place(
        &self,
        namespace: &str,
        name: &str,
        highest_tier: Tier,
    ) -> Result<GangBinding, String> {
        self.shared
            .lock()
            .reserve_gang(namespace, name, highest_tier)
    }

    /// Writes the slices of every member (marked Reserved), then the Bindings; any failure rolls
    /// the whole gang back. Returns whether every member was bound.
    async fn bind(&self, namespace: &str, name: &str, binding: GangBinding) -> bool {
        let uids: Vec<String> = binding
            .members
            .iter()
            .map(|(_, d)| d.pod_uid.clone())
            .collect();
        let slices: Api<GpuSlice> = Api::namespaced(self.client.clone(), namespace);
        let mut all_slices = Vec::new();
        for (pod, decision) in &binding.members {
            let (pod_slices, _) = scheduler::slices_and_allocation(pod, decision);
            all_slices.extend(pod_slices);
        }
        let created = join_all(all_slices.iter().map(|slice| async {
            scheduler::create_slice(&slices, slice).await?;
            mark_reserved(&slices, &slice.name_any()).await;
            Ok::<(), scheduler::BindError>(())
        }))
        .await;
        self.shared
            .lock()
            .slices_created(all_slices.iter().zip(created.iter().map(Result::is_ok)));
        let mut ok = created.iter().all(Result::is_ok);
        if ok {
            let annotation = binding.annotation.as_str();
            let bindings =
                join_all(binding.members.iter().map(|(pod, decision)| {
                    let allocation = scheduler::allocation_of(pod, decision);
                    async move {
                        scheduler::post_binding(&self.client, pod, annotation, &allocation).await
                    }
                }))
                .await;
            ok = bindings.iter().all(Result::is_ok);
            for error in bindings.iter().filter_map(|r| r.as_ref().err()) {
                tracing::warn!(gang = name, %namespace, %error, "binding a gang member failed");
            }
        } else {
            for error in created.iter().filter_map(|r| r.as_ref().err()) {
                tracing::warn!(gang = name, %namespace, %error, "reserving a gang member failed");
            }
        }
        if ok {
            self.shared.lock().gang_bound(namespace, name, &uids);
        } else {
            self.shared.lock().gang_rolled_back(namespace, name, &uids);
            let names: Vec<String> = binding
                .members
                .iter()
                .map(|(pod, _)| pod.name_any())
                .collect();
            self.delete_members(namespace, &names).await;
        }
        self.shared.wake();
        ok
    }

    /// Releases every reservation of the attempt: members that are bound are deleted (their
    /// controller recreates them), and their slices go with them.
    async fn roll_back(&self, namespace: &str, name: &str, snapshot: &Snapshot) {
        let uids: Vec<String> = snapshot.members.iter().map(|m| m.uid.clone()).collect();
        self.shared.lock().gang_rolled_back(namespace, name, &uids);
        let bound: Vec<String> = snapshot
            .members
            .iter()
            .filter(|m| m.bound)
            .map(|m| m.name.clone())
            .collect();
        self.delete_members(namespace, &bound).await;
        tracing::info!(gang = name, %namespace, "gang timed out and was rolled back");
    }

    /// Deletes members of a rolled-back attempt (their controller recreates them). A member
    /// whose delete fails stays bound, and the gang's next timeout rolls it back again.
    async fn delete_members(&self, namespace: &str, names: &[String]) {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let params = DeleteParams::background();
        let deleted = join_all(names.iter().map(|name| pods.delete(name, &params))).await;
        for (name, result) in names.iter().zip(deleted) {
            match result {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(error) => {
                    tracing::warn!(pod = %name, %namespace, %error, "could not delete a gang member on rollback");
                }
            }
        }
    }

    async fn report_members(
        &mut self,
        namespace: &str,
        name: &str,
        snapshot: &Snapshot,
        reason: &str,
        message: &str,
    ) {
        let key = (namespace.to_owned(), name.to_owned());
        let (last, told) = self.reported.entry(key).or_default();
        if last != message {
            *last = message.to_owned();
            told.clear();
        }
        let text = format!("gang {name}: {message}");
        let untold: Vec<&Arc<Pod>> = snapshot
            .members
            .iter()
            .filter_map(|m| m.pod.as_ref().filter(|_| told.insert(m.uid.clone())))
            .collect();
        join_all(
            untold
                .into_iter()
                .map(|pod| self.reports.unschedulable(pod, reason, &text)),
        )
        .await;
    }

    async fn write_status(&self, gang: &GangGroup, status: GangGroupStatus) {
        if gang.status.as_ref() == Some(&status) {
            return;
        }
        let api: Api<GangGroup> =
            Api::namespaced(self.client.clone(), &gang.namespace().unwrap_or_default());
        let patch = serde_json::json!({"apiVersion": "runtimekit.aliyun.com/v1alpha1", "kind": "GangGroup", "status": status});
        match api
            .patch_status(
                &gang.name_any(),
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await
        {
            Ok(updated) => self.shared.lock().apply_gang(&updated),
            Err(error) => {
                tracing::warn!(gang = %gang.name_any(), %error, "could not write the GangGroup status")
            }
        }
    }
}

async fn mark_reserved(api: &Api<GpuSlice>, name: &str) {
    let patch = serde_json::json!({"apiVersion": "runtimekit.aliyun.com/v1alpha1", "kind": "GpuSlice", "status": {"phase": SlicePhase::Reserved}});
    if let Err(error) = api
        .patch_status(
            name,
            &PatchParams::apply(FIELD_MANAGER),
            &Patch::Apply(&patch),
        )
        .await
    {
        tracing::debug!(slice = name, %error, "could not mark a slice Reserved");
    }
}

fn condition(
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time: Time(Timestamp::now()),
        observed_generation: None,
    }
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}
