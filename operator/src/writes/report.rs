//! Telling users what happened: Events, and the PodScheduled condition kube-scheduler also sets.

use crate::state::SliceFailure;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Reporter};
use kube::{Client, Resource};
use std::collections::HashMap;
use tokio::sync::mpsc;

/// The longest Event note the API takes is 1 kB; longer messages are cut.
const MAX_NOTE: usize = 1000;
/// Events waiting to be published; beyond this, new ones are dropped (and logged) rather than
/// letting a burst of Events slow the bindings down.
const EVENT_QUEUE: usize = 20_000;
/// Background senders of Events. One sender, one write at a time, left the `Scheduled` Events
/// of a 5,000-pod backlog trailing its bindings by 25 s; a few keep them close without
/// competing with the bindings. An Event always goes to the same sender as its repeats, which
/// must find the Event they count.
const EVENT_SENDERS: usize = 4;

/// Publishes Events and pod conditions for the operator. Events go through a few background
/// senders, as kube-scheduler's event broadcaster does, so they never hold a binding up;
/// conditions are written at once.
#[derive(Clone)]
pub struct Reports {
    client: Client,
    events: Vec<mpsc::Sender<(u64, Event, ObjectReference)>>,
}

impl std::fmt::Debug for Reports {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reports").finish_non_exhaustive()
    }
}

/// A pod condition to set.
#[derive(Debug, Clone, Copy)]
pub struct Condition<'a> {
    /// Its type, for example `PodScheduled`.
    pub type_: &'a str,
    /// `True` or `False`.
    pub status: &'a str,
    /// A stable reason.
    pub reason: &'a str,
    /// What happened.
    pub message: &'a str,
}

/// The pod condition a slice failure sets: the pod's cards could not all be enacted.
pub const SLICES_READY: &str = "GpuSlicesReady";

impl Reports {
    /// Reports as `controller` (the scheduler name), from instance `identity`.
    /// Must be called inside a tokio runtime: it starts the Event sender.
    pub fn new(client: Client, controller: &str, identity: &str) -> Reports {
        let reporter = Reporter {
            controller: controller.into(),
            instance: Some(identity.into()),
        };
        let events = (0..EVENT_SENDERS)
            .map(|_| {
                let mut recorder = Correlator {
                    client: client.clone(),
                    reporter: reporter.clone(),
                    recent: HashMap::new(),
                    swept: Timestamp::now(),
                };
                let (events, mut queue) = mpsc::channel(EVENT_QUEUE / EVENT_SENDERS);
                tokio::spawn(async move {
                    while let Some((key, event, object)) = queue.recv().await {
                        if let Err(error) = recorder.publish(key, &event, &object).await {
                            tracing::warn!(%error, reason = %event.reason, "could not publish an event");
                        }
                    }
                });
                events
            })
            .collect();
        Reports { client, events }
    }

    /// Queues an Event about `object`; failures are logged, never fatal.
    pub async fn event(
        &self,
        object: &ObjectReference,
        warning: bool,
        reason: &str,
        action: &str,
        note: &str,
    ) {
        let event = Event {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.into(),
            note: Some(cut(note)),
            action: action.into(),
            secondary: None,
        };
        let key = series_key(&event, object);
        let sender = &self.events[(key % EVENT_SENDERS as u64) as usize];
        if sender.try_send((key, event, object.clone())).is_err() {
            tracing::warn!(reason, "too many events waiting; one was dropped");
        }
    }

    /// Reports that `pod` was bound to `node`: the `Scheduled` Event kube-scheduler writes.
    pub async fn scheduled(&self, pod: &Pod, node: &str) {
        let note = format!(
            "Successfully assigned {}/{} to {node}",
            pod.metadata.namespace.as_deref().unwrap_or_default(),
            pod.metadata.name.as_deref().unwrap_or_default(),
        );
        self.event(&pod.object_ref(&()), false, "Scheduled", "Binding", &note)
            .await;
    }

    /// Reports that `pod` cannot be scheduled: a FailedScheduling Event and the condition
    /// `PodScheduled=False` with `reason` and `message`.
    pub async fn unschedulable(&self, pod: &Pod, reason: &str, message: &str) {
        self.event(
            &pod.object_ref(&()),
            true,
            "FailedScheduling",
            "Scheduling",
            message,
        )
        .await;
        let (Some(namespace), Some(name)) = (
            pod.metadata.namespace.as_deref(),
            pod.metadata.name.as_deref(),
        ) else {
            return;
        };
        let uid = pod.metadata.uid.as_deref();
        self.condition_false(namespace, name, uid, "PodScheduled", reason, message)
            .await;
    }

    /// Tells the pod of a slice its node agent could not enact what happened and what to do: a
    /// Warning Event with the agent's reason, and the condition `GpuSlicesReady=False`.
    pub async fn slice_failed(&self, slice: &str, failure: &SliceFailure) {
        let pod = &failure.pod;
        let card = failure
            .card
            .map_or_else(String::new, |c| format!(" (card {c})"));
        let message = format!(
            "GpuSlice {slice}{card} cannot be enacted: {}. Container {} will not get this card. \
             Delete the pod: its owner recreates it and the scheduler places it again, away from \
             cards held outside it.",
            failure.message.trim_end_matches('.'),
            pod.container
        );
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            namespace: Some(pod.namespace.clone()),
            name: Some(pod.name.clone()),
            uid: Some(pod.uid.clone()),
            ..ObjectReference::default()
        };
        self.event(&reference, true, &failure.reason, "Enact", &message)
            .await;
        let uid = Some(pod.uid.as_str());
        self.condition_false(
            &pod.namespace,
            &pod.name,
            uid,
            SLICES_READY,
            &failure.reason,
            &message,
        )
        .await;
    }

    /// Sets the pod condition `type_=False` with `reason` and `message`, best effort; with
    /// `uid`, only on the pod of that UID (a pod recreated under the same name is left alone).
    async fn condition_false(
        &self,
        namespace: &str,
        name: &str,
        uid: Option<&str>,
        type_: &str,
        reason: &str,
        message: &str,
    ) {
        let condition = Condition {
            type_,
            status: "False",
            reason,
            message,
        };
        if let Err(error) = self.set_condition(namespace, name, uid, &condition).await {
            tracing::debug!(%error, pod = name, condition = type_, "could not set a pod condition");
        }
    }

    /// Sets a pod condition; with `uid`, only on the pod of that UID.
    pub async fn set_condition(
        &self,
        namespace: &str,
        name: &str,
        uid: Option<&str>,
        condition: &Condition<'_>,
    ) -> Result<(), kube::Error> {
        let mut patch = serde_json::json!({
            "status": {"conditions": [{
                "type": condition.type_,
                "status": condition.status,
                "reason": condition.reason,
                "message": cut(condition.message),
                "lastTransitionTime": Timestamp::now().to_string(),
            }]}
        });
        if let Some(uid) = uid {
            // A UID in the patch is a precondition: the apiserver refuses it for another pod.
            patch["metadata"] = serde_json::json!({ "uid": uid });
        }
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        api.patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch))
            .await
            .map(drop)
    }
}

/// How long a published Event counts repeats of itself (as kube-runtime's recorder does).
const SERIES_WINDOW: SignedDuration = SignedDuration::from_secs(6 * 60);

/// Publishes Events, counting a repeat of the same Event as a series of the first. Unlike
/// kube-runtime's recorder, whose key leaves the note out (so a new message for the same object
/// and reason only bumps the count of the old one, and users read a stale message), the note is
/// part of what makes two Events the same, as in client-go's correlator.
struct Correlator {
    client: Client,
    reporter: Reporter,
    /// The Event published last for each (object, type, reason, action, note), by a hash of
    /// that key: at a steady 50 pods/s the window holds tens of thousands of them.
    recent: HashMap<u64, Published>,
    /// When the window was last swept of Events older than it.
    swept: Timestamp,
}

/// What a repeat needs of the Event it counts.
struct Published {
    name: String,
    count: i32,
    last: Timestamp,
}

impl Correlator {
    /// Publishes `event`, whose [`series_key`] is `key`.
    async fn publish(
        &mut self,
        key: u64,
        event: &Event,
        object: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let now = Timestamp::now();
        if self.swept + SignedDuration::from_secs(1) < now {
            self.recent.retain(|_, e| e.last + SERIES_WINDOW > now);
            self.swept = now;
        }
        let namespace = object.namespace.clone().unwrap_or_else(|| "default".into());
        let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), &namespace);
        if let Some(first) = self.recent.get_mut(&key) {
            let count = first.count + 1;
            let series = serde_json::json!({"series": EventSeries {
                count,
                last_observed_time: MicroTime(now),
            }});
            api.patch(&first.name, &PatchParams::default(), &Patch::Merge(&series))
                .await?;
            first.count = count;
            first.last = now;
            return Ok(());
        }
        let object_name = object.name.clone().unwrap_or_default();
        let new = K8sEvent {
            action: Some(event.action.clone()),
            reason: Some(event.reason.clone()),
            event_time: Some(MicroTime(now)),
            regarding: Some(object.clone()),
            note: event.note.clone(),
            metadata: ObjectMeta {
                namespace: Some(namespace.clone()),
                name: Some(format!("{object_name}.{:x}", now.as_nanosecond())),
                ..ObjectMeta::default()
            },
            reporting_controller: Some(self.reporter.controller.clone()),
            reporting_instance: self.reporter.instance.clone(),
            type_: Some(type_name(&event.type_).to_owned()),
            ..K8sEvent::default()
        };
        let created = api.create(&PostParams::default(), &new).await?;
        self.recent.insert(
            key,
            Published {
                name: created.metadata.name.unwrap_or_default(),
                count: 1,
                last: now,
            },
        );
        Ok(())
    }
}

fn type_name(type_: &EventType) -> &'static str {
    match type_ {
        EventType::Normal => "Normal",
        EventType::Warning => "Warning",
    }
}

/// What makes two Events the same, so the second counts as a repeat of the first: a hash of the
/// object, type, reason, action and note.
fn series_key(event: &Event, object: &ObjectReference) -> u64 {
    use std::hash::{Hash, Hasher};
    // The object by identity: its reference also carries a resourceVersion, which moves.
    let identity = object
        .uid
        .clone()
        .unwrap_or_else(|| format!("{:?}/{:?}/{:?}", object.kind, object.namespace, object.name));
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    let type_ = type_name(&event.type_);
    (&identity, type_, &event.reason, &event.action, &event.note).hash(&mut hasher);
    hasher.finish()
}

fn cut(text: &str) -> String {
    if text.len() <= MAX_NOTE {
        return text.to_owned();
    }
    let mut end = MAX_NOTE - 3;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}
