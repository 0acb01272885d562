//! The scheduler's two writes against a mocked apiserver, for the branches an end-to-end run
//! cannot force. `post_binding`: a Binding that lands is done; a plain rejection fails without
//! a second request; a conflict, a server error or a lost request reads the pod back, and only a
//! pod bound to the same node with the same allocation annotation counts as bound. `create_slice`:
//! a created slice is done; a conflict is fine only against an identical slice that is not being
//! deleted; any other failure is the slice's error. Each test asserts the exact requests sent.

mod mock_apiserver;

use http::Method;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use mock_apiserver::{Reply, Sent};
use runtimekit_contract::allocation::{AllocatedCard, Allocation, ContainerAllocation, annotation};
use runtimekit_crds::{GpuSlice, GpuSliceSpec};
use runtimekit_operator::writes::SCHEDULER as FIELD_MANAGER;
use runtimekit_operator::writes::binding::{BindError, create_slice, post_binding};
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::time::Duration;

const POD_PATH: &str = "/api/v1/namespaces/team/pods/train-0";
const BINDING_PATH: &str = "/api/v1/namespaces/team/pods/train-0/binding";
const SLICES_PATH: &str = "/apis/runtimekit.aliyun.com/v1alpha1/namespaces/team/gpuslices";
const SLICE_PATH: &str =
    "/apis/runtimekit.aliyun.com/v1alpha1/namespaces/team/gpuslices/train-0-abc-0-0";

/// Every call is bounded: a write that hangs fails its test rather than the suite.
const BOUND: Duration = Duration::from_secs(10);

/// Answers the requests in order with `replies`; a request past the script gets a 500, and the
/// exact-request assertions catch it.
fn scripted(replies: Vec<Reply>) -> impl FnMut(&Sent) -> Reply {
    let mut replies = VecDeque::from(replies);
    move |_| replies.pop_front().unwrap_or(Reply::Status(500))
}

fn routes(sent: &[Sent]) -> Vec<(Method, &str)> {
    sent.iter().map(Sent::route).collect()
}

fn annotation_key() -> String {
    annotation("aliyun.com")
}

/// The decision being written: one whole card on node-a.
fn allocation() -> Allocation {
    Allocation {
        node: "node-a".into(),
        containers: vec![ContainerAllocation {
            name: "main".into(),
            cards: vec![AllocatedCard {
                index: 0,
                uuid: "GPU-node-a-0".into(),
                mode: "Whole".into(),
                slice: "train-0-abc-0-0".into(),
                ..AllocatedCard::default()
            }],
            nics: vec![],
        }],
    }
}

fn recorded(allocation: &Allocation) -> String {
    serde_json::to_string(allocation).expect("an allocation encodes")
}

fn pending_pod() -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "train-0", "namespace": "team", "uid": "abc-123"},
        "spec": {"containers": [{"name": "main"}]},
    }))
    .expect("pod")
}

/// The pod as the read-back sees it: on `node` (or unbound) with `allocation` recorded (or none).
fn pod_as_read(node: Option<&str>, allocation: Option<&Allocation>) -> Value {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "train-0", "namespace": "team", "uid": "abc-123"},
        "spec": {"containers": [{"name": "main"}]},
    });
    if let Some(node) = node {
        pod["spec"]["nodeName"] = json!(node);
    }
    if let Some(allocation) = allocation {
        pod["metadata"]["annotations"] = json!({annotation_key(): recorded(allocation)});
    }
    pod
}

/// Posts the Binding of `allocation()` against a mock answering with `replies`; returns the
/// result and the requests sent.
async fn bind_with(replies: Vec<Reply>) -> (Result<(), BindError>, Vec<Sent>) {
    let (client, apiserver) = mock_apiserver::start(scripted(replies));
    let result = tokio::time::timeout(
        BOUND,
        post_binding(&client, &pending_pod(), &annotation_key(), &allocation()),
    )
    .await
    .expect("post_binding returns in time");
    (result, apiserver.sent())
}

/// The one Binding every post_binding test sends first: to node-a, carrying the allocation.
fn assert_binding_request(sent: &Sent) {
    assert_eq!(sent.route(), (Method::POST, BINDING_PATH));
    assert_eq!(sent.body["kind"], "Binding");
    assert_eq!(sent.body["metadata"]["name"], "train-0");
    assert_eq!(sent.body["target"]["kind"], "Node");
    assert_eq!(sent.body["target"]["name"], "node-a");
    let carried = sent.body["metadata"]["annotations"][annotation_key()]
        .as_str()
        .expect("the Binding carries the allocation annotation");
    let carried: Allocation = serde_json::from_str(carried).expect("the annotation is JSON");
    assert_eq!(carried, allocation());
}

fn api_code(error: &BindError) -> Option<u16> {
    match error {
        BindError::Binding(kube::Error::Api(status))
        | BindError::Slice {
            source: kube::Error::Api(status),
            ..
        } => Some(status.code),
        _ => None,
    }
}

#[tokio::test]
async fn a_binding_that_lands_is_done_without_a_read_back() {
    let (result, sent) = bind_with(vec![Reply::created(json!({"kind": "Status"}))]).await;
    result.expect("bound");
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_binding_request(&sent[0]);
}

#[tokio::test]
async fn a_conflict_with_the_pod_bound_exactly_so_is_an_earlier_try_that_landed() {
    let read = pod_as_read(Some("node-a"), Some(&allocation()));
    let (result, sent) = bind_with(vec![Reply::Status(409), Reply::ok(read)]).await;
    result.expect("the earlier Binding holds");
    assert_binding_request(&sent[0]);
    assert_eq!(
        routes(&sent),
        [(Method::POST, BINDING_PATH), (Method::GET, POD_PATH)]
    );
}

#[tokio::test]
async fn a_conflict_with_the_pod_on_another_node_is_bound_elsewhere() {
    let read = pod_as_read(Some("node-b"), Some(&allocation()));
    let (result, sent) = bind_with(vec![Reply::Status(409), Reply::ok(read)]).await;
    match result {
        Err(BindError::BoundElsewhere { node }) => assert_eq!(node, "node-b"),
        other => panic!("expected BoundElsewhere, got {other:?}"),
    }
    assert_eq!(
        routes(&sent),
        [(Method::POST, BINDING_PATH), (Method::GET, POD_PATH)]
    );
}

#[tokio::test]
async fn a_conflict_with_the_pod_on_this_node_with_another_allocation_is_bound_elsewhere() {
    let mut other = allocation();
    other.containers[0].cards[0].index = 1;
    let read = pod_as_read(Some("node-a"), Some(&other));
    let (result, sent) = bind_with(vec![Reply::Status(409), Reply::ok(read)]).await;
    match result {
        Err(BindError::BoundElsewhere { node }) => assert_eq!(node, "node-a"),
        other => panic!("expected BoundElsewhere, got {other:?}"),
    }
    assert_eq!(sent.len(), 2, "{sent:?}");
}

#[tokio::test]
async fn a_conflict_with_the_pod_still_unbound_is_the_bindings_error() {
    let (result, sent) =
        bind_with(vec![Reply::Status(409), Reply::ok(pod_as_read(None, None))]).await;
    let error = result.expect_err("not bound");
    assert!(matches!(error, BindError::Binding(_)), "{error:?}");
    assert_eq!(
        api_code(&error),
        Some(409),
        "the error is the Binding's own"
    );
    assert_eq!(
        routes(&sent),
        [(Method::POST, BINDING_PATH), (Method::GET, POD_PATH)]
    );
}

#[tokio::test]
async fn a_server_error_after_the_write_was_applied_is_done() {
    let read = pod_as_read(Some("node-a"), Some(&allocation()));
    let (result, sent) = bind_with(vec![Reply::Status(500), Reply::ok(read)]).await;
    result.expect("the Binding was applied before the 500");
    assert_eq!(
        routes(&sent),
        [(Method::POST, BINDING_PATH), (Method::GET, POD_PATH)]
    );
}

#[tokio::test]
async fn a_server_error_with_the_pod_still_unbound_is_the_bindings_error() {
    let (result, sent) =
        bind_with(vec![Reply::Status(503), Reply::ok(pod_as_read(None, None))]).await;
    let error = result.expect_err("not bound");
    assert_eq!(api_code(&error), Some(503), "{error:?}");
    assert_eq!(sent.len(), 2, "{sent:?}");
}

#[tokio::test]
async fn a_plain_rejection_fails_without_a_read_back() {
    let (result, sent) = bind_with(vec![Reply::Status(422)]).await;
    let error = result.expect_err("rejected");
    assert_eq!(api_code(&error), Some(422), "{error:?}");
    assert_eq!(routes(&sent), [(Method::POST, BINDING_PATH)]);
}

#[tokio::test]
async fn a_lost_binding_request_that_landed_is_done() {
    let read = pod_as_read(Some("node-a"), Some(&allocation()));
    let (result, sent) = bind_with(vec![Reply::Lost, Reply::ok(read)]).await;
    result.expect("the read-back shows the Binding landed");
    assert_binding_request(&sent[0]);
    assert_eq!(
        routes(&sent),
        [(Method::POST, BINDING_PATH), (Method::GET, POD_PATH)]
    );
}

#[tokio::test]
async fn a_lost_binding_request_that_did_not_land_is_the_bindings_error() {
    let (result, sent) = bind_with(vec![Reply::Lost, Reply::ok(pod_as_read(None, None))]).await;
    let error = result.expect_err("not bound");
    assert!(matches!(error, BindError::Binding(_)), "{error:?}");
    assert_eq!(
        api_code(&error),
        None,
        "the error is the lost request, not an answer"
    );
    assert_eq!(sent.len(), 2, "{sent:?}");
}

#[tokio::test]
async fn a_failed_read_back_is_the_bindings_error() {
    let (result, sent) = bind_with(vec![Reply::Status(409), Reply::Status(500)]).await;
    let error = result.expect_err("fate unknown");
    assert_eq!(api_code(&error), Some(500), "{error:?}");
    assert_eq!(
        routes(&sent),
        [(Method::POST, BINDING_PATH), (Method::GET, POD_PATH)]
    );
}

/// The slice the scheduler writes for card 0 of node-a.
fn slice() -> GpuSlice {
    let spec: GpuSliceSpec = serde_json::from_value(json!({
        "nodeName": "node-a",
        "card": {"index": 0, "uuid": "GPU-node-a-0"},
        "mode": "Whole",
        "pod": {"namespace": "team", "name": "train-0", "uid": "abc-123", "container": "main"},
    }))
    .expect("spec");
    let mut slice = GpuSlice::new("train-0-abc-0-0", spec);
    slice.metadata.namespace = Some("team".into());
    slice
}

fn as_json(slice: &GpuSlice) -> Value {
    serde_json::to_value(slice).expect("a slice encodes")
}

/// Creates `slice()` against a mock answering with `replies`.
async fn create_with(replies: Vec<Reply>) -> (Result<(), BindError>, Vec<Sent>) {
    let (client, apiserver) = mock_apiserver::start(scripted(replies));
    let api: Api<GpuSlice> = Api::namespaced(client, "team");
    let result = tokio::time::timeout(BOUND, create_slice(&api, &slice(), FIELD_MANAGER))
        .await
        .expect("create_slice returns in time");
    (result, apiserver.sent())
}

/// The create every create_slice test sends first: the slice as given, under the scheduler's
/// field manager.
fn assert_create_request(sent: &Sent) {
    assert_eq!(sent.route(), (Method::POST, SLICES_PATH));
    assert!(
        sent.query
            .split('&')
            .any(|pair| pair == format!("fieldManager={FIELD_MANAGER}")),
        "{}",
        sent.query
    );
    let body: GpuSlice = serde_json::from_value(sent.body.clone()).expect("a GpuSlice");
    assert_eq!(body, slice());
}

#[tokio::test]
async fn a_created_slice_is_done() {
    let (result, sent) = create_with(vec![Reply::created(as_json(&slice()))]).await;
    result.expect("created");
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_create_request(&sent[0]);
}

#[tokio::test]
async fn a_conflict_with_an_identical_slice_is_an_earlier_try_that_landed() {
    let (result, sent) = create_with(vec![Reply::Status(409), Reply::ok(as_json(&slice()))]).await;
    result.expect("the identical slice holds");
    assert_create_request(&sent[0]);
    assert_eq!(
        routes(&sent),
        [(Method::POST, SLICES_PATH), (Method::GET, SLICE_PATH)]
    );
}

#[tokio::test]
async fn a_conflict_with_a_slice_of_another_spec_is_taken() {
    let mut other = slice();
    other.spec.pod.uid = "def-456".into();
    let (result, sent) = create_with(vec![Reply::Status(409), Reply::ok(as_json(&other))]).await;
    match result {
        Err(BindError::SliceTaken { name }) => assert_eq!(name, "train-0-abc-0-0"),
        other => panic!("expected SliceTaken, got {other:?}"),
    }
    assert_eq!(
        routes(&sent),
        [(Method::POST, SLICES_PATH), (Method::GET, SLICE_PATH)]
    );
}

#[tokio::test]
async fn a_conflict_with_an_identical_slice_being_deleted_is_taken() {
    let mut deleting = as_json(&slice());
    deleting["metadata"]["deletionTimestamp"] = json!("2025-01-01T00:00:00Z");
    let (result, sent) = create_with(vec![Reply::Status(409), Reply::ok(deleting)]).await;
    assert!(
        matches!(result, Err(BindError::SliceTaken { .. })),
        "{result:?}"
    );
    assert_eq!(sent.len(), 2, "{sent:?}");
}

#[tokio::test]
async fn a_server_error_is_the_slices_error_without_a_read_back() {
    let (result, sent) = create_with(vec![Reply::Status(500)]).await;
    let error = result.expect_err("failed");
    assert!(matches!(error, BindError::Slice { .. }), "{error:?}");
    assert_eq!(api_code(&error), Some(500));
    assert_eq!(routes(&sent), [(Method::POST, SLICES_PATH)]);
}

#[tokio::test]
async fn a_create_that_times_out_is_the_slices_error() {
    let (result, sent) = create_with(vec![Reply::Lost]).await;
    let error = result.expect_err("failed");
    match &error {
        BindError::Slice { name, source } => {
            assert_eq!(name, "train-0-abc-0-0");
            assert!(!matches!(source, kube::Error::Api(_)), "{source:?}");
        }
        other => panic!("expected a Slice error, got {other:?}"),
    }
    assert_eq!(routes(&sent), [(Method::POST, SLICES_PATH)]);
}

#[tokio::test]
async fn a_conflict_whose_read_back_fails_is_the_slices_error() {
    let (result, sent) = create_with(vec![Reply::Status(409), Reply::Lost]).await;
    assert!(matches!(result, Err(BindError::Slice { .. })), "{result:?}");
    assert_eq!(
        routes(&sent),
        [(Method::POST, SLICES_PATH), (Method::GET, SLICE_PATH)]
    );
}
