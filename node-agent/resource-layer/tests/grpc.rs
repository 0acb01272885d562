//! The gRPC API end to end over a real unix socket in a temporary directory: server and client
//! in one test process, with the fault-injection service.

mod common;

use common::TempDir;
use futures::StreamExt;
use runtimekit_proto::resource::v1alpha1 as pb;
use runtimekit_proto::resource::v1alpha1::fault_injection_client::FaultInjectionClient;
use runtimekit_proto::resource::v1alpha1::resource_layer_client::ResourceLayerClient;
use runtimekit_resource_layer::{
    Backend, ServeError, ServeOptions, SimOptions, SimulatedBackend, connect_lazy, fault_client,
    reason_of, resource_client, serve,
};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::{Code, Request};

/// Every test is bounded in time.
async fn bounded<F: Future<Output = ()>>(test: F) {
    tokio::time::timeout(Duration::from_secs(60), test)
        .await
        .expect("the test finished in time");
}

fn simulated(profile: &str, node: &str) -> Arc<dyn Backend> {
    Arc::new(
        SimulatedBackend::from_profile(
            profile,
            SimOptions {
                node_name: node.into(),
                hang_threshold: Duration::from_millis(100),
                ..SimOptions::default()
            },
        )
        .expect("backend"),
    )
}

fn mig(key: &str, card: u32, profile: &str, start: u32) -> pb::CreateInstanceRequest {
    pb::CreateInstanceRequest {
        key: key.into(),
        spec: Some(pb::InstanceSpec {
            device_index: card,
            device_uuid: String::new(),
            kind: Some(pb::instance_spec::Kind::Mig(pb::MigSpec {
                profile: profile.into(),
                placement_start: start,
            })),
        }),
    }
}

fn fault(card: u32, kind: pb::FaultKind, xid: u32) -> pb::InjectFaultRequest {
    pb::InjectFaultRequest {
        device_index: card,
        kind: kind.into(),
        xid,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_instances_and_errors_over_a_socket() {
    bounded(async {
        let dir = TempDir::new("grpc");
        let socket = dir.path().join("rl.sock");
        let server = serve(
            simulated("h800-8", "node-a"),
            &socket,
            ServeOptions::default(),
        )
        .await
        .expect("serve");
        let mut client = resource_client(&socket).await.expect("connect");

        let info = client
            .get_info(pb::GetInfoRequest {})
            .await
            .expect("info")
            .into_inner();
        assert_eq!(info.backend(), pb::BackendKind::Simulated);
        assert_eq!((info.device_count, info.profile.as_str()), (8, "h800-8"));
        assert!(info.fault_injection);

        let listing = client
            .list_devices(pb::ListDevicesRequest::default())
            .await
            .expect("list")
            .into_inner();
        assert_eq!(listing.devices.len(), 8);
        assert_eq!(listing.nics.len(), 4);
        assert_eq!(listing.paths.len(), 28);
        let card = &listing.devices[6];
        assert!(card.mig.as_ref().is_some_and(|m| m.enabled));
        let topology = card.topology.as_ref().expect("topology");
        assert_eq!((topology.numa_node, topology.socket), (Some(1), Some(1)));
        assert_eq!(topology.links.len(), 8);

        let made = client
            .create_instance(mig("slice-1", 6, "3g.40gb", 4))
            .await
            .expect("create")
            .into_inner();
        assert!(made.created);
        let again = client
            .create_instance(mig("slice-1", 6, "3g.40gb", 4))
            .await
            .expect("retry")
            .into_inner();
        assert!(!again.created);
        assert_eq!(made.instance, again.instance);

        // Errors carry their code and stable reason.
        for (request, code, reason) in [
            (
                mig("x", 6, "4g.40gb", 4),
                Code::InvalidArgument,
                "IllegalPlacement",
            ),
            (
                mig("x", 0, "1g.10gb", 0),
                Code::FailedPrecondition,
                "MigModeDisabled",
            ),
            (
                mig("x", 6, "3g.40gb", 4),
                Code::FailedPrecondition,
                "InstanceOverlap",
            ),
            (
                mig("slice-1", 6, "1g.10gb", 0),
                Code::AlreadyExists,
                "InstanceKeyConflict",
            ),
            (mig("x", 9, "1g.10gb", 0), Code::NotFound, "NoSuchDevice"),
            (
                mig("", 6, "1g.10gb", 0),
                Code::InvalidArgument,
                "InvalidArgument",
            ),
        ] {
            let status = client.create_instance(request).await.expect_err(reason);
            assert_eq!(status.code(), code, "{status:?}");
            assert_eq!(reason_of(&status), Some(reason), "{status:?}");
        }

        let listed = client
            .list_instances(pb::ListInstancesRequest {
                device_indexes: vec![6],
            })
            .await
            .expect("list")
            .into_inner();
        assert_eq!(listed.instances.len(), 1);
        let metrics = client
            .get_device_metrics(pb::GetDeviceMetricsRequest {
                device_indexes: vec![6],
                include_processes: true,
            })
            .await
            .expect("metrics")
            .into_inner();
        assert_eq!(metrics.devices[0].processes.len(), 1);
        assert_eq!(metrics.devices[0].processes[0].instance_key, "slice-1");
        let per_instance = client
            .get_instance_metrics(pb::GetInstanceMetricsRequest::default())
            .await
            .expect("instance metrics")
            .into_inner();
        assert_eq!(per_instance.instances.len(), 1);

        let destroyed = client
            .destroy_instance(pb::DestroyInstanceRequest {
                target: Some(pb::destroy_instance_request::Target::Key("slice-1".into())),
            })
            .await
            .expect("destroy")
            .into_inner();
        assert!(destroyed.existed);
        let again = client
            .destroy_instance(pb::DestroyInstanceRequest {
                target: Some(pb::destroy_instance_request::Target::Key("slice-1".into())),
            })
            .await
            .expect("destroy again")
            .into_inner();
        assert!(!again.existed);

        server.shutdown().await.expect("shutdown");
        assert!(!socket.exists(), "the socket is removed");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_stream_follows_injected_faults() {
    bounded(async {
        let dir = TempDir::new("health");
        let socket = dir.path().join("rl.sock");
        let _server = serve(
            simulated("ppu-810e-8", "node-b"),
            &socket,
            ServeOptions::default(),
        )
        .await
        .expect("serve");
        let mut faults: FaultInjectionClient<_> = fault_client(&socket).await.expect("connect");
        faults
            .inject_fault(fault(0, pb::FaultKind::EccDbe, 0))
            .await
            .expect("inject before subscribing");
        let mut client = resource_client(&socket).await.expect("connect");
        let mut stream = client
            .watch_health(pb::WatchHealthRequest {})
            .await
            .expect("watch")
            .into_inner();
        let first = stream.next().await.expect("snapshot").expect("ok");
        let Some(pb::watch_health_response::Message::Snapshot(snapshot)) = first.message else {
            panic!("the first message is a snapshot: {first:?}");
        };
        assert_eq!(snapshot.faults.len(), 1);
        assert_eq!(snapshot.faults[0].device_index, 0);

        let injected = faults
            .inject_fault(fault(5, pb::FaultKind::Xid, 48))
            .await
            .expect("inject")
            .into_inner();
        assert_eq!(injected.fault.expect("fault").device_index, 5);
        let next = stream.next().await.expect("event").expect("ok");
        let Some(pb::watch_health_response::Message::Event(event)) = next.message else {
            panic!("an event: {next:?}");
        };
        assert!(event.active && !event.device_healthy);
        assert_eq!(event.device_index, 5);
        assert!(event.sequence > snapshot.sequence);

        let listed = faults
            .list_faults(pb::ListFaultsRequest {})
            .await
            .expect("list")
            .into_inner();
        assert_eq!(listed.faults.len(), 2);
        let cleared = faults
            .clear_fault(pb::ClearFaultRequest {
                device_index: 5,
                ..Default::default()
            })
            .await
            .expect("clear")
            .into_inner();
        assert_eq!(cleared.cleared, 1);
        let next = stream.next().await.expect("event").expect("ok");
        let Some(pb::watch_health_response::Message::Event(event)) = next.message else {
            panic!("an event: {next:?}");
        };
        assert!(!event.active && event.device_healthy);

        let status = faults
            .inject_fault(fault(0, pb::FaultKind::Xid, 0))
            .await
            .expect_err("XID needs a code");
        assert_eq!(status.code(), Code::InvalidArgument);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_card_makes_calls_fail_at_their_deadline() {
    bounded(async {
        let dir = TempDir::new("hang");
        let socket = dir.path().join("rl.sock");
        let _server = serve(
            simulated("h800-8", "node-c"),
            &socket,
            ServeOptions::default(),
        )
        .await
        .expect("serve");
        let mut client = resource_client(&socket).await.expect("connect");
        let mut faults = fault_client(&socket).await.expect("connect");
        let mut stream = client
            .watch_health(pb::WatchHealthRequest {})
            .await
            .expect("watch")
            .into_inner();
        stream.next().await.expect("snapshot").expect("ok");
        faults
            .inject_fault(fault(1, pb::FaultKind::CallHang, 0))
            .await
            .expect("inject");

        let mut request = Request::new(pb::ListDevicesRequest {
            device_indexes: vec![1],
        });
        request.set_timeout(Duration::from_millis(400));
        let started = Instant::now();
        let status = client.list_devices(request).await.expect_err("hangs");
        let waited = started.elapsed();
        assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
        assert_eq!(reason_of(&status), Some("DeadlineExceeded"));
        assert!(waited >= Duration::from_millis(300), "{waited:?}");
        assert!(waited < Duration::from_secs(3), "{waited:?}");

        // The card gets a CALL_HANG fault while the call is stuck.
        let next = stream.next().await.expect("event").expect("ok");
        let Some(pb::watch_health_response::Message::Event(event)) = next.message else {
            panic!("an event: {next:?}");
        };
        assert!(event.active);
        assert_eq!(event.device_index, 1);
        assert_eq!(event.fault.map(|f| f.kind()), Some(pb::FaultKind::CallHang));

        // Other cards answer.
        let mut request = Request::new(pb::ListDevicesRequest {
            device_indexes: vec![0, 2],
        });
        request.set_timeout(Duration::from_secs(5));
        let others = client
            .list_devices(request)
            .await
            .expect("others")
            .into_inner();
        assert_eq!(others.devices.len(), 2);

        faults
            .clear_fault(pb::ClearFaultRequest {
                device_index: 1,
                kind: pb::FaultKind::CallHang.into(),
                xid: 0,
            })
            .await
            .expect("clear");
        let next = stream.next().await.expect("event").expect("ok");
        let Some(pb::watch_health_response::Message::Event(event)) = next.message else {
            panic!("an event: {next:?}");
        };
        assert!(
            !event.active,
            "the stuck call returned and CALL_HANG cleared"
        );
        let listing = client
            .list_devices(pb::ListDevicesRequest {
                device_indexes: vec![1],
            })
            .await
            .expect("answers again")
            .into_inner();
        assert!(listing.devices[0].healthy);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_servers_in_one_process_and_socket_hygiene() {
    bounded(async {
        let dir = TempDir::new("many");
        let mut servers = Vec::new();
        for n in 0..12 {
            let socket = dir.path().join(format!("node-{n}/rl.sock"));
            let server = serve(
                simulated("mi300x-8", &format!("node-{n}")),
                &socket,
                ServeOptions::default(),
            )
            .await
            .expect("serve");
            servers.push(server);
        }
        // Every node has its own cards.
        let mut uuids = Vec::new();
        for server in &servers {
            let mut client = ResourceLayerClient::new(connect_lazy(server.socket_path()));
            let listing = client
                .list_devices(pb::ListDevicesRequest::default())
                .await
                .expect("list")
                .into_inner();
            uuids.extend(listing.devices.into_iter().map(|d| d.uuid));
        }
        let total = uuids.len();
        uuids.sort();
        uuids.dedup();
        assert_eq!((total, uuids.len()), (96, 96));
        // Only the socket's owner may connect: whoever reaches it can create instances.
        for server in &servers {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(server.socket_path())
                .expect("socket")
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{mode:o}");
        }

        // A live socket is not taken over.
        let taken = servers[0].socket_path().to_path_buf();
        let err = serve(simulated("mi300x-8", "x"), &taken, ServeOptions::default())
            .await
            .expect_err("in use");
        assert!(matches!(err, ServeError::InUse(_)), "{err}");
        // A file that is not a socket is not removed.
        let file = dir.path().join("not-a-socket");
        std::fs::write(&file, "x").expect("write");
        let err = serve(simulated("mi300x-8", "x"), &file, ServeOptions::default())
            .await
            .expect_err("not a socket");
        assert!(err.to_string().contains("not a socket"), "{err}");
        // A stale socket (its server gone without cleaning up) is replaced.
        let stale = dir.path().join("stale.sock");
        drop(std::os::unix::net::UnixListener::bind(&stale).expect("bind"));
        assert!(stale.exists());
        let server = serve(simulated("mi300x-8", "x"), &stale, ServeOptions::default())
            .await
            .expect("replaces a stale socket");
        let mut client = resource_client(&stale).await.expect("connect");
        client
            .get_info(pb::GetInfoRequest {})
            .await
            .expect("answers");
        server.shutdown().await.expect("shutdown");
        for server in servers {
            server.shutdown().await.expect("shutdown");
        }
    })
    .await;
}
