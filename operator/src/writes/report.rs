//! Telling users what happened: Events, and the PodScheduled condition kube-scheduler also sets.

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Client, Resource};
use tokio::sync::mpsc;

/// The longest Event note the API takes is 1 kB; longer messages are cut.
const MAX_NOTE: usize = 1000;
/// Events waiting to be published; beyond this, new ones are dropped (and logged) rather than
/// letting a burst of Events slow the bindings down.
const EVENT_QUEUE: usize = 20_000;

/// Publishes Events and pod conditions for the operator. Events go through one background
/// sender, as kube-scheduler's event broadcaster does, so they never compete with bindings for
/// the apiserver's attention; conditions are written at once.
#[derive(Clone)]
pub struct Reports {
    client: Client,
    events: mpsc::Sender<(Event, ObjectReference)>,
}

impl std::fmt::Debug for Reports {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reports").finish_non_exhaustive()
    }
}

impl Reports {
    /// Reports as `controller` (the scheduler name), from instance `identity`.
    /// Must be called inside a tokio runtime: it starts the Event sender.
    pub fn new(client: Client, controller: &str, identity: &str) -> Reports {
        let reporter = Reporter {
            controller: controller.into(),
            instance: Some(identity.into()),
        };
        let recorder = Recorder::new(client.clone(), reporter);
        let (events, mut queue) = mpsc::channel::<(Event, ObjectReference)>(EVENT_QUEUE);
        tokio::spawn(async move {
            while let Some((event, object)) = queue.recv().await {
                if let Err(error) = recorder.publish(&event, &object).await {
                    tracing::warn!(%error, reason = %event.reason, "could not publish an event");
                }
            }
        });
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
        if self.events.try_send((event, object.clone())).is_err() {
            tracing::warn!(reason, "too many events waiting; one was dropped");
        }
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
        let patch = serde_json::json!({"status": {"conditions": [{
            "type": "PodScheduled",
            "status": "False",
            "reason": reason,
            "message": cut(message),
            "lastTransitionTime": k8s_openapi::jiff::Timestamp::now().to_string(),
        }]}});
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        if let Err(error) = api
            .patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch))
            .await
        {
            tracing::debug!(%error, pod = name, "could not set PodScheduled=False");
        }
    }
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
