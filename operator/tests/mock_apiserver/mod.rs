//! A mocked apiserver for the tests that drive the operator's writes: a `kube::Client` whose
//! requests go to a tower-test mock instead of the network. Each test answers every request with
//! a function of its own, and every request is recorded, so a test can assert on exactly what
//! was sent (method, path, body) as well as on what the operator made of the answers.

// Each test binary that includes this module uses a part of it.
#![allow(dead_code)]

use http::{Method, StatusCode};
use kube::client::Body;
use serde_json::{Value, json};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tower_test::mock::{self, SendResponse};

/// One request the client sent.
#[derive(Debug, Clone)]
pub struct Sent {
    pub method: Method,
    /// The path without the query.
    pub path: String,
    /// The query, without the `?` (empty when there is none).
    pub query: String,
    /// The JSON body, or `Value::Null` when there was none.
    pub body: Value,
}

impl Sent {
    /// Method and path, the shape most assertions compare.
    pub fn route(&self) -> (Method, &str) {
        (self.method.clone(), self.path.as_str())
    }
}

/// How the mock answers one request.
#[derive(Debug)]
pub enum Reply {
    /// A success with a JSON body.
    Ok(StatusCode, Value),
    /// A failure carrying a Kubernetes `Status` of this code, as the apiserver sends one.
    Status(u16),
    /// The call fails without a response (a timeout, a dropped connection): the client cannot
    /// tell whether the request was applied.
    Lost,
    /// No answer ever (a watch that stays open until the client goes away).
    Never,
}

impl Reply {
    /// A `200 OK` carrying `body`.
    pub fn ok(body: Value) -> Reply {
        Reply::Ok(StatusCode::OK, body)
    }

    /// A `201 Created` carrying `body`.
    pub fn created(body: Value) -> Reply {
        Reply::Ok(StatusCode::CREATED, body)
    }
}

/// The mocked apiserver: it records every request and answers it with the test's function.
#[derive(Debug)]
pub struct Apiserver {
    sent: Arc<Mutex<Vec<Sent>>>,
    count: watch::Receiver<usize>,
    serving: JoinHandle<()>,
}

type Handle = mock::Handle<http::Request<Body>, http::Response<Body>>;

/// A client talking to a mocked apiserver that answers each request with `answer`.
pub fn start(answer: impl FnMut(&Sent) -> Reply + Send + 'static) -> (kube::Client, Apiserver) {
    let (service, handle) = mock::pair::<http::Request<Body>, http::Response<Body>>();
    let client = kube::Client::new(service, "default");
    let sent = Arc::new(Mutex::new(Vec::new()));
    let (count_tx, count) = watch::channel(0);
    let serving = tokio::spawn(serve(handle, answer, Arc::clone(&sent), count_tx));
    (
        client,
        Apiserver {
            sent,
            count,
            serving,
        },
    )
}

async fn serve(
    mut handle: Handle,
    mut answer: impl FnMut(&Sent) -> Reply,
    sent: Arc<Mutex<Vec<Sent>>>,
    count: watch::Sender<usize>,
) {
    // Answers that never come are kept here: dropping one would fail the request at once.
    let mut open = Vec::<SendResponse<http::Response<Body>>>::new();
    while let Some((request, respond)) = handle.next_request().await {
        let (parts, body) = request.into_parts();
        let bytes = body
            .collect_bytes()
            .await
            .expect("the request body is readable");
        let request = Sent {
            method: parts.method,
            path: parts.uri.path().to_owned(),
            query: parts.uri.query().unwrap_or_default().to_owned(),
            body: if bytes.is_empty() {
                Value::Null
            } else {
                serde_json::from_slice(&bytes).expect("the request body is JSON")
            },
        };
        let reply = answer(&request);
        lock(&sent).push(request);
        count.send_modify(|n| *n += 1);
        match reply {
            Reply::Ok(code, body) => respond.send_response(response(code, &body)),
            Reply::Status(code) => respond.send_response(status(code)),
            Reply::Lost => respond.send_error(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the mocked apiserver did not answer",
            )),
            Reply::Never => open.push(respond),
        }
    }
}

impl Apiserver {
    /// Every request so far, in the order they arrived.
    pub fn sent(&self) -> Vec<Sent> {
        lock(&self.sent).clone()
    }

    /// Waits until some request so far satisfies `matches`, and returns it (the caller bounds
    /// the wait).
    pub async fn wait_for(&self, matches: impl Fn(&Sent) -> bool) -> Sent {
        let mut count = self.count.clone();
        let mut found = None;
        count
            .wait_for(|_| {
                found = lock(&self.sent).iter().find(|r| matches(r)).cloned();
                found.is_some()
            })
            .await
            .expect("the mocked apiserver is running");
        found.expect("wait_for returned on a match")
    }
}

impl Drop for Apiserver {
    fn drop(&mut self) {
        self.serving.abort();
    }
}

fn lock(sent: &Mutex<Vec<Sent>>) -> MutexGuard<'_, Vec<Sent>> {
    sent.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn response(code: StatusCode, body: &Value) -> http::Response<Body> {
    http::Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Body::from(
            serde_json::to_vec(body).expect("a JSON value serializes"),
        ))
        .expect("a valid response")
}

/// A failure as the apiserver words it: a `Status` object with the code.
fn status(code: u16) -> http::Response<Body> {
    let reason = match code {
        404 => "NotFound",
        409 => "AlreadyExists",
        422 => "Invalid",
        _ => "InternalError",
    };
    let body = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": format!("mocked failure {code}"),
        "reason": reason,
        "code": code,
    });
    response(
        StatusCode::from_u16(code).expect("a valid status code"),
        &body,
    )
}
