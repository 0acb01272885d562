//! The device plugin against a test kubelet that speaks the real protocol, over unix sockets in
//! a temporary folder: the agent's inventory and health tasks follow a simulated resource layer
//! (h800-8: cards 0-5 serve TDM and whole cards, 6-7 are in MIG mode; 4 RDMA NICs).

use runtimekit_contract::{MemoryUnit, RuntimeKitConfig};
use runtimekit_crds::{SliceMode, SlicePhase};
use runtimekit_node_agent::deviceplugin::DevicePlugins;
use runtimekit_node_agent::layer::{InventoryRefresher, watch_health};
use runtimekit_node_agent::model::{NodeState, SliceInfo};
use runtimekit_node_agent::podresources;
use runtimekit_node_agent::resources::advertised;
use runtimekit_node_agent::task::AbortOnDrop;
use runtimekit_proto::deviceplugin::v1beta1 as dp;
use runtimekit_proto::deviceplugin::v1beta1::device_plugin_client::DevicePluginClient;
use runtimekit_proto::resource::v1alpha1 as pb;
use runtimekit_resource_layer::{
    ServeOptions, ServerHandle, SimOptions, SimulatedBackend, fault_client, serve,
};
use runtimekit_test_kubelet::{KubeletView, PodRef, TestKubelet};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use tokio::sync::{mpsc, watch};

const WAIT: Duration = Duration::from_secs(20);

/// Every test is bounded in time.
async fn bounded<F: Future<Output = ()>>(test: F) {
    tokio::time::timeout(Duration::from_secs(90), test)
        .await
        .expect("the test finished in time");
}

/// A temporary folder with a short path (unix socket paths are limited to 108 bytes).
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "na-dp-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A node: the simulated resource layer, the agent's state tasks, the device plugins and a
/// test kubelet.
struct Node {
    kubelet: TestKubelet,
    state: watch::Sender<NodeState>,
    layer_socket: PathBuf,
    uuids: Vec<String>,
    _server: ServerHandle,
    _tasks: Vec<AbortOnDrop<()>>,
    _dir: TempDir,
}

impl Node {
    async fn start(config: &RuntimeKitConfig) -> Node {
        let dir = TempDir::new();
        let backend = SimulatedBackend::from_profile(
            "h800-8",
            SimOptions {
                node_name: "dp-node".into(),
                // A hanging call must not outlive a failed test: the runtime waits for it.
                hang_limit: Duration::from_secs(30),
                ..SimOptions::default()
            },
        )
        .expect("profile");
        let uuids = (0..8)
            .map(|i| backend.uuid(i).expect("uuid").to_owned())
            .collect();
        let layer_socket = dir.path().join("rl.sock");
        let server = serve(Arc::new(backend), &layer_socket, ServeOptions::default())
            .await
            .expect("serve");
        let client = runtimekit_resource_layer::resource_client(&layer_socket)
            .await
            .expect("connect");
        let kubelet = TestKubelet::start(&dir.path().join("kubelet"))
            .await
            .expect("kubelet");
        let (state, state_rx) = watch::channel(NodeState::default());
        let inventory = InventoryRefresher::new(client.clone(), state.clone(), 8);
        let (transitions, mut transitions_rx) = mpsc::channel(64);
        let resources = advertised(config);
        let whole: Vec<String> = resources
            .iter()
            .filter(|r| r.kind.whole())
            .map(|r| r.name.clone())
            .collect();
        let tasks = vec![
            AbortOnDrop(tokio::spawn(inventory.clone().run(Duration::from_secs(1)))),
            AbortOnDrop(tokio::spawn(watch_health(
                client,
                state.clone(),
                transitions,
                inventory,
            ))),
            AbortOnDrop(tokio::spawn(async move {
                while transitions_rx.recv().await.is_some() {}
            })),
            AbortOnDrop(tokio::spawn(podresources::poll(
                kubelet.pod_resources_socket(),
                state.clone(),
                whole,
                Duration::from_millis(200),
            ))),
            AbortOnDrop(tokio::spawn(
                DevicePlugins {
                    dir: kubelet.device_plugin_dir(),
                    resources,
                    state: state_rx,
                    pod_resources: Some(kubelet.pod_resources_socket()),
                }
                .run(),
            )),
        ];
        Node {
            kubelet,
            state,
            layer_socket,
            uuids,
            _server: server,
            _tasks: tasks,
            _dir: dir,
        }
    }

    async fn wait<T>(&self, what: &str, check: impl FnMut(&KubeletView) -> Option<T>) -> T {
        let waited = self.kubelet.wait_until(WAIT, check).await;
        assert!(
            waited.is_ok(),
            "waiting for {what}: {:?}",
            waited.as_ref().err()
        );
        waited.expect("checked above")
    }

    async fn wait_registered(&self, resources: usize, registrations: u32) -> KubeletView {
        self.wait("every plugin registered and listing", |view| {
            let ready = view.plugins.len() == resources
                && view.plugins.values().all(|p| {
                    p.connected && p.registrations >= registrations && !p.devices.is_empty()
                });
            ready.then(|| view.clone())
        })
        .await
    }

    fn add_slice(&self, slice: SliceInfo) {
        self.state.send_modify(|s| s.slices.push(slice));
    }

    fn plugin_socket(&self, resource: &str) -> PathBuf {
        let name = advertised(&RuntimeKitConfig::default())
            .into_iter()
            .find(|r| r.name == resource)
            .expect("advertised")
            .socket_name();
        self.kubelet.device_plugin_dir().join(name)
    }
}

fn slice(name: &str, card: u32, uuid: &str, mode: SliceMode, pod_uid: &str) -> SliceInfo {
    SliceInfo {
        namespace: "ns".into(),
        name: name.into(),
        card,
        card_uuid: uuid.into(),
        mode,
        core: (mode == SliceMode::Tdm).then_some(50),
        memory_mib: (mode == SliceMode::Tdm).then_some(8192),
        slices: None,
        mig_profile: None,
        mig_start: None,
        pod_uid: pod_uid.into(),
        pod_namespace: "ns".into(),
        pod_name: format!("pod-{pod_uid}"),
        container: "app".into(),
        phase: Some(SlicePhase::Ready),
        deleting: false,
        created: None,
    }
}

fn pod(uid: &str) -> PodRef {
    PodRef {
        namespace: "ns".into(),
        name: format!("pod-{uid}"),
        uid: uid.into(),
    }
}

fn health_of(view: &KubeletView, resource: &str, id: &str) -> Option<String> {
    view.plugins
        .get(resource)?
        .devices
        .iter()
        .find(|d| d.id == id)
        .map(|d| d.health.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_resource_registers_with_its_devices() {
    bounded(async {
        let node = Node::start(&RuntimeKitConfig::default()).await;
        let view = node.wait_registered(6, 1).await;
        let capacity = view.capacity();
        let expected = [
            ("aliyun.com/gpu", (6, 6)),
            ("nvidia.com/gpu", (6, 6)),
            ("aliyun.com/gpu-core", (600, 600)),
            // 81559 MiB per H800, six TDM and two MIG cards: 79 whole GiB each.
            ("aliyun.com/gpu-memory", (632, 632)),
            ("aliyun.com/gpu-slice", (14, 14)),
            ("aliyun.com/rdma", (512, 512)),
        ];
        for (resource, counts) in expected {
            assert_eq!(
                capacity.get(resource),
                Some(&counts),
                "{resource}: {capacity:?}"
            );
        }
        let whole = &view.plugins["aliyun.com/gpu"];
        assert!(
            whole.options.pre_start_required && whole.options.get_preferred_allocation_available
        );
        assert!(
            !view.plugins["aliyun.com/rdma"]
                .options
                .get_preferred_allocation_available
        );
        assert_eq!(whole.devices[0].id, node.uuids[0]);
        assert_eq!(
            whole.devices[5].topology,
            Some(dp::TopologyInfo {
                nodes: vec![dp::NumaNode { id: 1 }]
            }),
            "card 5 is on NUMA node 1"
        );
        let slices = &view.plugins["aliyun.com/gpu-slice"];
        assert_eq!(slices.devices[0].id, format!("{}::0", node.uuids[6]));
        assert_eq!(slices.devices[13].id, format!("{}::6", node.uuids[7]));
        // Only the socket's owner (root on a node: the kubelet) may connect to a plugin.
        for (resource, _) in expected {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(node.plugin_socket(resource))
                .expect("socket")
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{resource}: {mode:o}");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mib_mode_registers_no_memory_devices() {
    bounded(async {
        let config = RuntimeKitConfig {
            memory_unit: MemoryUnit::MiB,
            resource_prefix: "example.org".into(),
            ..RuntimeKitConfig::default()
        };
        let node = Node::start(&config).await;
        let view = node.wait_registered(5, 1).await;
        let names: Vec<&String> = view.plugins.keys().collect();
        assert_eq!(
            names,
            [
                "example.org/gpu",
                "example.org/gpu-core",
                "example.org/gpu-slice",
                "example.org/rdma",
                "nvidia.com/gpu"
            ]
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_take_devices_out_until_they_clear() {
    bounded(async {
        let node = Node::start(&RuntimeKitConfig::default()).await;
        node.wait_registered(6, 1).await;
        let mut faults = fault_client(&node.layer_socket).await.expect("faults");
        // One fault of each kind the health watch knows, on cards 0-3 and the MIG card 7.
        for (card, kind, xid) in [
            (0, pb::FaultKind::Xid, 79),
            (1, pb::FaultKind::GpuLost, 0),
            (2, pb::FaultKind::DeadProcessMemory, 0),
            (3, pb::FaultKind::EccDbe, 0),
            (7, pb::FaultKind::CallHang, 0),
        ] {
            faults
                .inject_fault(pb::InjectFaultRequest {
                    device_index: card,
                    kind: kind.into(),
                    xid,
                    ..Default::default()
                })
                .await
                .expect("inject");
        }
        // Each resource is its own plugin stream, so they change one after another: wait for
        // all of them. Cards 4-5 stay for TDM and whole cards, card 6 for MIG; memory counts
        // the healthy TDM and MIG cards (3 x 79 GiB).
        let expected = [
            ("aliyun.com/gpu", (6, 2)),
            ("nvidia.com/gpu", (6, 2)),
            ("aliyun.com/gpu-core", (600, 200)),
            ("aliyun.com/gpu-memory", (632, 237)),
            ("aliyun.com/gpu-slice", (14, 7)),
        ];
        node.wait("the faulty cards out of allocatable", |view| {
            let c = view.capacity();
            expected
                .iter()
                .all(|(name, want)| c.get(*name) == Some(want))
                .then_some(())
        })
        .await;
        // An application XID is a warning only: the card stays.
        faults
            .inject_fault(pb::InjectFaultRequest {
                device_index: 4,
                kind: pb::FaultKind::Xid.into(),
                xid: 13,
                ..Default::default()
            })
            .await
            .expect("inject");
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(node.kubelet.view().capacity()["aliyun.com/gpu"], (6, 2));
        for card in [1, 2, 3, 4] {
            faults
                .clear_fault(pb::ClearFaultRequest {
                    device_index: card,
                    ..Default::default()
                })
                .await
                .expect("clear");
        }
        faults
            .clear_fault(pb::ClearFaultRequest {
                device_index: 0,
                ..Default::default()
            })
            .await
            .expect("clear");
        faults
            .clear_fault(pb::ClearFaultRequest {
                device_index: 7,
                ..Default::default()
            })
            .await
            .expect("clear");
        node.wait("every card back", |view| {
            let c = view.capacity();
            (c["aliyun.com/gpu"] == (6, 6) && c["aliyun.com/gpu-slice"] == (14, 14)).then_some(())
        })
        .await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocations_follow_the_slices_and_never_give_a_sliced_card_whole() {
    bounded(async {
        let node = Node::start(&RuntimeKitConfig::default()).await;
        node.wait_registered(6, 1).await;
        let u = node.uuids.clone();
        // Pod a holds a 50% share of card 0; pod b (our scheduler) is given card 2 whole.
        node.add_slice(slice("a-0", 0, &u[0], SliceMode::Tdm, "a"));
        node.add_slice(slice("b-0", 2, &u[2], SliceMode::Whole, "b"));
        node.wait("card 0 out of the whole-card devices", |view| {
            (health_of(view, "nvidia.com/gpu", &u[0]).as_deref() == Some(dp::UNHEALTHY))
                .then_some(())
        })
        .await;

        let (cards, answer) = node
            .kubelet
            .allocate(&pod("b"), "app", "aliyun.com/gpu", 1)
            .await
            .expect("pod b admitted");
        assert_eq!(
            cards,
            [u[2].clone()],
            "the kubelet took the suggestion: pod b's card"
        );
        assert_eq!(answer.envs["NVIDIA_VISIBLE_DEVICES"], u[2]);
        node.kubelet
            .start_container("b", "app")
            .await
            .expect("PreStartContainer");

        let (shares, _) = node
            .kubelet
            .allocate(&pod("a"), "app", "aliyun.com/gpu-core", 50)
            .await
            .expect("pod a admitted");
        assert!(
            shares
                .iter()
                .all(|id| id.starts_with(&format!("{}::", u[0]))),
            "pod a's compute replicas come from its card: {shares:?}"
        );

        // Card 2 is now the kubelet's under aliyun.com/gpu; nvidia.com/gpu stops offering it.
        node.wait("card 2 out of nvidia.com/gpu", |view| {
            (health_of(view, "nvidia.com/gpu", &u[2]).as_deref() == Some(dp::UNHEALTHY))
                .then_some(())
        })
        .await;
        // A pod of the default scheduler asks for five whole cards: only four may be given.
        let refused = node
            .kubelet
            .allocate(&pod("c"), "main", "nvidia.com/gpu", 5)
            .await
            .expect_err("only four cards are free");
        assert!(refused.contains("UnexpectedAdmissionError"), "{refused}");
        let (cards, _) = node
            .kubelet
            .allocate(&pod("c"), "main", "nvidia.com/gpu", 4)
            .await
            .expect("four free cards");
        let mut expected = vec![u[1].clone(), u[3].clone(), u[4].clone(), u[5].clone()];
        let mut got = cards.clone();
        expected.sort();
        got.sort();
        assert_eq!(got, expected, "never card 0 (sliced) nor card 2 (pod b's)");

        // Asked directly, the plugins refuse what the kubelet would not offer.
        let mut whole = DevicePluginClient::new(
            runtimekit_resource_layer::connect(node.plugin_socket("aliyun.com/gpu"))
                .await
                .expect("plugin"),
        );
        let error = whole
            .allocate(dp::AllocateRequest {
                container_requests: vec![dp::ContainerAllocateRequest {
                    devices_ids: vec![u[0].clone()],
                }],
            })
            .await
            .expect_err("card 0 holds a slice");
        assert!(
            error
                .message()
                .contains("cannot be given whole: it holds GPU slices (ns/a-0)"),
            "{}",
            error.message()
        );
        let error = whole
            .allocate(dp::AllocateRequest {
                container_requests: vec![dp::ContainerAllocateRequest {
                    devices_ids: vec![u[1].clone()],
                }],
            })
            .await
            .expect_err("card 1 is pod c's through nvidia.com/gpu");
        assert!(
            error
                .message()
                .contains("given whole to pod ns/pod-c through nvidia.com/gpu"),
            "{}",
            error.message()
        );

        // A slice placed on card 3 after the container was admitted: its start is refused.
        node.add_slice(slice("d-0", 3, &u[3], SliceMode::Tdm, "d"));
        node.wait("card 3 out", |view| {
            (health_of(view, "aliyun.com/gpu", &u[3]).as_deref() == Some(dp::UNHEALTHY))
                .then_some(())
        })
        .await;
        let error = node
            .kubelet
            .start_container("c", "main")
            .await
            .expect_err("card 3 is sliced now");
        assert!(error.contains("can no longer be used whole"), "{error}");

        // When pod b ends, its card is offered under nvidia.com/gpu again.
        node.kubelet.release("b");
        node.wait("card 2 back in nvidia.com/gpu", |view| {
            (health_of(view, "nvidia.com/gpu", &u[2]).as_deref() == Some(dp::HEALTHY)).then_some(())
        })
        .await;

        // When pod a's slice goes, card 0 is offered whole again.
        node.state
            .send_modify(|s| s.slices.retain(|x| x.name != "a-0"));
        node.wait("card 0 back", |view| {
            (health_of(view, "aliyun.com/gpu", &u[0]).as_deref() == Some(dp::HEALTHY)).then_some(())
        })
        .await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugins_register_again_when_the_kubelet_restarts() {
    bounded(async {
        let mut node = Node::start(&RuntimeKitConfig::default()).await;
        node.wait_registered(6, 1).await;
        node.kubelet.restart().await.expect("restart");
        let view = node.wait_registered(6, 2).await;
        assert!(view.plugins.values().all(|p| p.registrations == 2));
        assert_eq!(view.capacity()["aliyun.com/gpu"], (6, 6));
        // And once more, to be sure it is not a one-off.
        node.kubelet.restart().await.expect("restart");
        node.wait_registered(6, 3).await;
    })
    .await;
}
