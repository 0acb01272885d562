//! The operator process against a mocked apiserver on which one watched kind never lists (the
//! GangGroup CRD is missing), so the first sync never completes. A leader waiting for that sync
//! still hears a shutdown, then releases its Lease so a standby takes over at once; and it still
//! hears its Lease being taken, then ends with an error instead of waiting on.

mod mock_apiserver;

use http::Method;
use mock_apiserver::{Apiserver, Reply, Sent};
use runtimekit_operator::leader::Timing;
use runtimekit_operator::run::{RunOptions, run_with};
use serde_json::{Value, json};
use std::time::Duration;
use tokio::net::TcpListener;

const LEASES_PATH: &str = "/apis/coordination.k8s.io/v1/namespaces/runtimekit/leases";
const LEASE_PATH: &str = "/apis/coordination.k8s.io/v1/namespaces/runtimekit/leases/operator";
const IDENTITY: &str = "operator-0";

/// How long the operator may take to react; its election retries every 50 ms.
const BOUND: Duration = Duration::from_secs(10);

fn options() -> RunOptions {
    RunOptions {
        config: None,
        listen: ([127, 0, 0, 1], 0).into(),
        identity: IDENTITY.into(),
        namespace: "runtimekit".into(),
        lease: "operator".into(),
        timing: Timing {
            lease_duration: Duration::from_secs(5),
            renew_deadline: Duration::from_secs(3),
            retry_period: Duration::from_millis(50),
        },
    }
}

async fn listener() -> TcpListener {
    TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a free port on the loopback")
}

/// A cluster whose GangGroup CRD is missing and that keeps one Lease.
struct Cluster {
    lease: Option<Value>,
    /// Once this replica has created the Lease, a standby holds it.
    taken_by: Option<&'static str>,
}

impl Cluster {
    fn answer(&mut self, sent: &Sent) -> Reply {
        if sent.path.starts_with(LEASES_PATH) {
            return self.answer_lease(sent);
        }
        if sent.path.ends_with("/ganggroups") {
            return Reply::Status(404);
        }
        if sent.query.split('&').any(|pair| pair == "watch=true") {
            // The other kinds list empty and their watches stay open.
            return Reply::Never;
        }
        Reply::ok(json!({
            "apiVersion": "v1", "kind": "List",
            "metadata": {"resourceVersion": "1"},
            "items": [],
        }))
    }

    fn answer_lease(&mut self, sent: &Sent) -> Reply {
        match (&sent.method, sent.path.as_str(), &self.lease) {
            (&Method::GET, LEASE_PATH, Some(lease)) => Reply::ok(lease.clone()),
            (&Method::GET, LEASE_PATH, None) => Reply::Status(404),
            (&Method::POST, LEASES_PATH, None) => {
                let mut lease = sent.body.clone();
                lease["metadata"]["resourceVersion"] = json!("1");
                let created = lease.clone();
                if let Some(standby) = self.taken_by {
                    lease["spec"]["holderIdentity"] = json!(standby);
                }
                self.lease = Some(lease);
                Reply::created(created)
            }
            (&Method::PUT, LEASE_PATH, Some(_)) => {
                self.lease = Some(sent.body.clone());
                Reply::ok(sent.body.clone())
            }
            _ => Reply::Status(409),
        }
    }
}

fn cluster(taken_by: Option<&'static str>) -> (kube::Client, Apiserver) {
    let mut cluster = Cluster {
        lease: None,
        taken_by,
    };
    mock_apiserver::start(move |sent| cluster.answer(sent))
}

fn is_lease_write(sent: &Sent) -> bool {
    sent.route() == (Method::PUT, LEASE_PATH)
}

fn asked_for_ganggroups(apiserver: &Apiserver) -> bool {
    apiserver
        .sent()
        .iter()
        .any(|sent| sent.method == Method::GET && sent.path.ends_with("/ganggroups"))
}

#[tokio::test]
async fn a_leader_waiting_for_the_first_sync_releases_the_lease_on_shutdown() {
    let (client, apiserver) = cluster(None);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async {
        let _ = stopped.await;
    };
    let operator = run_with(client, options(), listener().await, shutdown);
    let stop_once_leading = async {
        // A renewal comes a retry period after the Lease was acquired, long after the main loop
        // saw leadership and began waiting for the GangGroups that never list.
        apiserver.wait_for(is_lease_write).await;
        stop.send(()).expect("the operator is running");
    };
    let (result, ()) =
        tokio::time::timeout(BOUND, async { tokio::join!(operator, stop_once_leading) })
            .await
            .expect("the operator returns within the bound after shutdown");
    result.expect("a shutdown is a clean exit");

    assert!(asked_for_ganggroups(&apiserver));
    let sent = apiserver.sent();
    let acquired = sent
        .iter()
        .find(|s| s.route() == (Method::POST, LEASES_PATH))
        .expect("the Lease was created");
    assert_eq!(acquired.body["spec"]["holderIdentity"], IDENTITY);
    let released = sent
        .iter()
        .rev()
        .find(|s| is_lease_write(s))
        .expect("the Lease was written");
    assert_eq!(released.body["metadata"]["name"], "operator");
    assert_eq!(
        released.body["spec"]["holderIdentity"],
        Value::Null,
        "the last write gives the Lease up: {:?}",
        released.body
    );
    assert_eq!(released.body["spec"]["renewTime"], Value::Null);
}

#[tokio::test]
async fn a_leader_waiting_for_the_first_sync_that_loses_the_lease_ends_with_an_error() {
    let (client, apiserver) = cluster(Some("operator-1"));
    let never = std::future::pending::<()>();
    let result = tokio::time::timeout(BOUND, run_with(client, options(), listener().await, never))
        .await
        .expect("the operator ends within the bound once the Lease is taken");
    let error = result.expect_err("a lost Lease is an error");
    let chain = format!("{error:#}");
    assert!(chain.contains("taken by operator-1"), "{chain}");

    assert!(asked_for_ganggroups(&apiserver));
    let sent = apiserver.sent();
    assert!(
        !sent.iter().any(is_lease_write),
        "a replica that lost the Lease leaves it alone: {sent:?}"
    );
}
