//! Conversions from Kubernetes objects and the project's custom resources.

use k8s_openapi::api::core::v1::{Node, Pod};
use proptest::prelude::*;
use runtimekit_contract::{RuntimeKitConfig, TopologyLabels, parse_pod};
use runtimekit_crds as crds;
use runtimekit_placement::*;
use serde_json::json;

fn names() -> runtimekit_contract::ResourceNames {
    RuntimeKitConfig::default().names()
}

fn node_object() -> Node {
    serde_json::from_value(json!({
        "metadata": {
            "name": "gpu-1",
            "labels": {
                "lj_runtimekit_enable": "true",
                "runtimekit.aliyun.com/hypernode": "hn-1",
                "runtimekit.aliyun.com/leaf-switch": "leaf-1",
                "runtimekit.aliyun.com/network-pod": "np-1"
            }
        },
        "spec": {
            "unschedulable": true,
            "taints": [{"key": "dedicated", "value": "train", "effect": "NoSchedule"},
                       {"key": "soft", "effect": "PreferNoSchedule"}]
        },
        "status": {
            "allocatable": {
                "cpu": "95500m", "memory": "1Ti", "pods": "110",
                "ephemeral-storage": "100Gi", "hugepages-2Mi": "0",
                "aliyun.com/gpu-core": "800", "aliyun.com/gpu": "8", "nvidia.com/gpu": "8",
                "example.com/fpga": "2"
            },
            "conditions": [{"type": "MemoryPressure", "status": "False"},
                           {"type": "Ready", "status": "True"}]
        }
    }))
    .expect("node")
}

#[test]
fn nodes_convert_with_resources_taints_and_position() {
    let keys = TopologyLabels::default();
    let info = NodeInfo::from_node(&node_object(), &names(), &keys).expect("converts");
    assert_eq!(info.name, "gpu-1");
    assert!(info.ready && info.unschedulable && info.gpu_enabled);
    assert_eq!(info.max_pods, 110);
    assert_eq!(info.allocatable.cpu_milli, 95_500);
    assert_eq!(info.allocatable.memory_bytes, 1 << 40);
    let scalars: Vec<&str> = info.allocatable.scalar.keys().map(String::as_str).collect();
    assert_eq!(
        scalars,
        ["ephemeral-storage", "example.com/fpga", "hugepages-2Mi"],
        "GPU resources are accounted per card, not as scalars"
    );
    assert_eq!(
        info.taints,
        [
            Taint {
                key: "dedicated".into(),
                value: "train".into(),
                effect: TaintEffect::NoSchedule
            },
            Taint {
                key: "soft".into(),
                value: String::new(),
                effect: TaintEffect::PreferNoSchedule
            }
        ]
    );
    assert_eq!(
        info.position,
        NetworkPosition {
            hyper_node: Some("hn-1".into()),
            leaf_switch: Some("leaf-1".into()),
            network_pod: Some("np-1".into()),
        }
    );
    let mut bad = node_object();
    bad.metadata.name = None;
    assert!(NodeInfo::from_node(&bad, &names(), &keys).is_err());
    let mut not_ready = node_object();
    if let Some(status) = not_ready.status.as_mut() {
        status.conditions = None;
    }
    assert!(
        !NodeInfo::from_node(&not_ready, &names(), &keys)
            .expect("converts")
            .ready
    );
}

#[test]
fn node_labels_switch_functions_off_only_with_false() {
    let keys = TopologyLabels::default();
    assert_eq!(
        NodeInfo::from_node(&node_object(), &names(), &keys)
            .expect("converts")
            .switches,
        Switches::default()
    );
    for (tdm, mig, want) in [
        ("false", "true", (false, true)),
        ("true", "false", (true, false)),
        ("off", "no", (true, true)),
    ] {
        let mut object = node_object();
        let labels = object.metadata.labels.get_or_insert_default();
        labels.insert("aliyun.com/tdm-enabled".into(), tdm.into());
        labels.insert("aliyun.com/mig-enabled".into(), mig.into());
        let switches = NodeInfo::from_node(&object, &names(), &keys)
            .expect("converts")
            .switches;
        assert_eq!((switches.tdm, switches.mig), want, "{tdm} {mig}");
    }
    // Whole cards leave the extended resources only with the device-API label's `dra`.
    for (value, whole_cards) in [("dra", false), ("device-plugin", true), ("DRA", true)] {
        let mut object = node_object();
        let labels = object.metadata.labels.get_or_insert_default();
        labels.insert("aliyun.com/device-api".into(), value.into());
        let switches = NodeInfo::from_node(&object, &names(), &keys)
            .expect("converts")
            .switches;
        assert_eq!(switches.whole_cards, whole_cards, "{value}");
    }
}

fn pod_object() -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "w-0", "namespace": "ml", "uid": "uid-1",
                     "labels": {"aliyun.com/min-member": "2", "aliyun.com/gang-name": "g"}},
        "spec": {
            "schedulerName": "lj-runtimekit-scheduler",
            "runtimeClassName": "lj-runtime",
            "nodeSelector": {"accelerator/vendor": "ppu"},
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "train",
                             "effect": "NoSchedule"},
                            {"operator": "Exists"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "zone", "operator": "NotIn", "values": ["z9"]}]}]}}},
            "overhead": {"cpu": "250m"},
            "initContainers": [
                {"name": "sidecar", "restartPolicy": "Always",
                 "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}},
                {"name": "setup", "resources": {"requests": {"cpu": "8", "memory": "1Gi"}}}
            ],
            "containers": [
                {"name": "train", "resources": {
                    "requests": {"cpu": "2", "memory": "8Gi", "example.com/fpga": "1"},
                    "limits": {"aliyun.com/gpu-core": "50", "aliyun.com/gpu-memory": "8",
                               "cpu": "4"}}},
                {"name": "log", "resources": {"limits": {"cpu": "100m", "memory": "128Mi"}}}
            ]
        }
    }))
    .expect("pod")
}

#[test]
fn pods_convert_with_effective_requests_and_constraints() {
    let pod = pod_object();
    let request = parse_pod(&pod, &RuntimeKitConfig::default()).expect("valid");
    let input = PodInput::from_pod(&pod, &request, &names()).expect("converts");
    assert_eq!(input.uid, "uid-1");
    assert_eq!(input.containers.len(), 1);
    assert_eq!(input.gang.as_deref(), Some("g"));
    // max(2 + 0.1 + 0.5 sidecar, 8 + 0.5 init) + 0.25 overhead.
    assert_eq!(input.resources.cpu_milli, 8_750);
    assert_eq!(input.resources.memory_bytes, (9 << 30) + (128 << 20));
    assert_eq!(input.resources.scalar.get("example.com/fpga"), Some(&1));
    assert!(!input.resources.scalar.contains_key("aliyun.com/gpu-core"));
    assert_eq!(
        input
            .node_selector
            .get("accelerator/vendor")
            .map(String::as_str),
        Some("ppu")
    );
    assert_eq!(input.tolerations.len(), 2);
    assert_eq!(input.tolerations[1].operator, TolerationOperator::Exists);
    let terms = input.required_affinity.expect("affinity");
    assert_eq!(
        terms[0].match_expressions[0].operator,
        SelectorOperator::NotIn
    );
    assert!(input.unsupported.is_empty());
}

#[test]
fn any_bound_pod_reports_its_requests_besides_cards() {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"nodeName": "gpu-1", "containers": [
            {"name": "web", "resources": {"requests": {"cpu": "1500m", "memory": "2Gi",
                                                       "nvidia.com/gpu": "1"}}}]}
    }))
    .expect("pod");
    let r = Resources::from_pod(&pod, &names()).expect("converts");
    assert_eq!((r.cpu_milli, r.memory_bytes), (1500, 2 << 30));
    assert!(r.scalar.is_empty(), "cards are counted per card: {r:?}");
    let bad: Pod = serde_json::from_value(json!({
        "metadata": {"name": "bad", "namespace": "default"},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "lots"}}}]}
    }))
    .expect("pod");
    assert_eq!(
        Resources::from_pod(&bad, &names())
            .expect_err("bad quantity")
            .to_string(),
        "pod default/bad: cpu quantity \"lots\" is not a non-negative number"
    );
}

#[test]
fn unsupported_pod_constraints_are_listed() {
    let mut pod = pod_object();
    let spec = pod.spec.as_mut().expect("spec");
    spec.affinity = Some(
        serde_json::from_value(json!({"podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"topologyKey": "kubernetes.io/hostname"}]}}))
        .expect("affinity"),
    );
    spec.topology_spread_constraints = Some(vec![
        serde_json::from_value(json!({"maxSkew": 1, "topologyKey": "zone",
                                      "whenUnsatisfiable": "DoNotSchedule"}))
        .expect("constraint"),
    ]);
    let request = parse_pod(&pod, &RuntimeKitConfig::default()).expect("valid");
    let input = PodInput::from_pod(&pod, &request, &names()).expect("converts");
    assert_eq!(
        input.unsupported,
        ["required pod anti-affinity", "topology spread constraints"]
    );
}

fn topology_group() -> crds::TopologyGroup {
    serde_json::from_value(json!({
        "apiVersion": "runtimekit.aliyun.com/v1alpha1", "kind": "TopologyGroup",
        "metadata": {"name": "gpu-1"},
        "spec": {"tier": "Node", "nodeName": "gpu-1"},
        "status": {
            "cards": [{"index": 0, "uuid": "GPU-a", "vendor": "Nvidia", "model": "NVIDIA H800",
                       "memoryMib": 81920, "migCapable": true, "migEnabled": true,
                       "health": "Healthy", "pcieSwitch": "sw0", "numaNode": 0, "socket": 0,
                       "nvlinkPeers": [1, 1],
                       "migInstances": [{"profile": "3g.40gb", "placementStart": 4,
                                         "gpuInstanceId": 2}]},
                      {"index": 1, "uuid": "GPU-b", "vendor": "PPU", "model": "PPU-810E",
                       "memoryMib": 98304, "health": "Unhealthy",
                       "interconnectGroup": "g0"}],
            "nics": [{"name": "mlx5_0", "pcieSwitch": "sw0", "numaNode": 0}],
            "conditions": [{"type": "Ready", "status": "True", "reason": "Reporting",
                            "message": "", "lastTransitionTime": "2025-01-01T00:00:00Z"}]
        }
    }))
    .expect("topology group")
}

#[test]
fn topology_groups_convert_to_devices() {
    let devices = NodeDevices::from_topology_group(&topology_group()).expect("node tier");
    assert_eq!(devices.node, "gpu-1");
    assert!(devices.ready);
    let [a, b] = devices.cards.as_slice() else {
        panic!("two cards");
    };
    assert_eq!(
        (a.vendor, a.mig_enabled, a.healthy),
        (Vendor::Nvidia, true, true)
    );
    assert_eq!(a.nvlink_peers, [1, 1]);
    assert_eq!(
        a.mig_instances,
        [MigInstance {
            profile: "3g.40gb".into(),
            start: 4
        }]
    );
    assert_eq!((b.vendor, b.healthy), (Vendor::Ppu, false));
    assert_eq!(b.interconnect_group.as_deref(), Some("g0"));
    assert_eq!(devices.nics[0].pcie_switch.as_deref(), Some("sw0"));
    let mut higher = topology_group();
    higher.spec.tier = Tier::LeafSwitch;
    assert!(NodeDevices::from_topology_group(&higher).is_none());
}

fn gpu_slice(spec: serde_json::Value) -> crds::GpuSlice {
    serde_json::from_value(json!({
        "apiVersion": "runtimekit.aliyun.com/v1alpha1", "kind": "GpuSlice",
        "metadata": {"name": "w-0-train-0", "namespace": "ml"},
        "spec": spec
    }))
    .expect("gpu slice")
}

fn pod_ref() -> serde_json::Value {
    json!({"namespace": "ml", "name": "w-0", "uid": "uid-1", "container": "train"})
}

#[test]
fn gpu_slices_convert_to_allocations() {
    let tdm = gpu_slice(
        json!({"nodeName": "gpu-1", "card": {"index": 2, "uuid": "GPU-c"},
                               "mode": "TDM", "core": 30, "memory": "512Mi", "pod": pod_ref(),
                               "replicaIndex": 1}),
    );
    let s = SliceInput::from_gpu_slice(&tdm)
        .expect("valid")
        .expect("placed");
    assert_eq!(
        s,
        SliceInput {
            pod_uid: "uid-1".into(),
            container: "train".into(),
            replica: 1,
            node: "gpu-1".into(),
            card_index: 2,
            card_uuid: "GPU-c".into(),
            share: Share::Tdm {
                core: Some(30),
                memory_mib: Some(512)
            },
        }
    );
    let mig = gpu_slice(
        json!({"nodeName": "gpu-1", "card": {"index": 0, "uuid": "GPU-a"},
                               "mode": "MIG", "slices": 3, "migProfile": "3g.40gb",
                               "migPlacementStart": 4, "pod": pod_ref()}),
    );
    let s = SliceInput::from_gpu_slice(&mig)
        .expect("valid")
        .expect("placed");
    assert_eq!(
        s.share,
        Share::Mig {
            profile: "3g.40gb".into(),
            slices: 3,
            start: 4,
            memory_mib: 40 * 1024
        }
    );
    let unplaced = gpu_slice(json!({"mode": "Whole", "pod": pod_ref()}));
    assert_eq!(SliceInput::from_gpu_slice(&unplaced), Ok(None));
    let bad = gpu_slice(
        json!({"nodeName": "gpu-1", "card": {"index": 0, "uuid": "x"},
                               "mode": "TDM", "memory": "4G", "pod": pod_ref()}),
    );
    assert_eq!(
        SliceInput::from_gpu_slice(&bad)
            .expect_err("bad memory")
            .to_string(),
        "gpuslice ml/w-0-train-0: memory \"4G\" is not valid"
    );
}

#[test]
fn decisions_become_gpu_slices_that_convert_back() {
    let mut cluster = Cluster::new(Settings::default());
    let keys = TopologyLabels::default();
    let mut node = NodeInfo::from_node(&node_object(), &names(), &keys).expect("node");
    node.unschedulable = false;
    node.taints.clear();
    cluster.upsert_node(node);
    let devices = NodeDevices::from_topology_group(&topology_group()).expect("devices");
    cluster.set_devices(&devices.node, &devices.cards, &devices.nics);
    cluster.set_agent_reporting(&devices.node, devices.ready);
    let pod = pod_object();
    let mut request = parse_pod(&pod, &RuntimeKitConfig::default()).expect("valid");
    request.containers[0].cards = runtimekit_contract::CardRequest::Mig {
        cards: 1,
        slices: 4,
        memory_mib: None,
    };
    let mut input = PodInput::from_pod(&pod, &request, &names()).expect("pod");
    input.node_selector.clear();
    input.resources.scalar.clear();
    input.resources.cpu_milli = 1000;
    // The hardware already holds a 3g at slice 4: the 4g goes to 0.
    let decision = cluster.decide(&input).expect("fits");
    let specs = decision.gpu_slices("ml", "w-0");
    assert_eq!(specs.len(), 1);
    let spec = &specs[0];
    assert_eq!(spec.mode, crds::SliceMode::Mig);
    assert_eq!(spec.mig_profile.as_deref(), Some("4g.40gb"));
    assert_eq!(spec.mig_placement_start, Some(0));
    assert_eq!(spec.memory.as_deref(), Some("40Gi"));
    assert_eq!(spec.gang.as_deref(), Some("g"));
    let slice = crds::GpuSlice::new("w-0-train-0", spec.clone());
    let back = SliceInput::from_gpu_slice(&slice)
        .expect("valid")
        .expect("placed");
    cluster.commit(&decision).expect("commit");
    // Upserting the slice the operator wrote changes nothing: same key as the commit.
    let before = cluster.cards("gpu-1");
    cluster.upsert_slice(back);
    assert_eq!(cluster.cards("gpu-1"), before);
}

#[test]
fn nics_are_recorded_on_the_first_card_slice() {
    let card = |index: u32, replica: u32| CardPlacement {
        index,
        uuid: format!("GPU-{index}"),
        replica,
        share: Share::Whole,
    };
    let decision = Decision {
        pod_uid: "uid-1".into(),
        node: "gpu-1".into(),
        containers: vec![ContainerPlacement {
            container: "train".into(),
            cards: vec![card(2, 0), card(3, 1)],
            nics: vec!["mlx5_1".into()],
            locality: Some(Locality::PcieSwitch),
        }],
        resources: Resources::default(),
        gang: None,
    };
    let specs = decision.gpu_slices("ml", "w-0");
    assert_eq!(specs[0].nics, ["mlx5_1"]);
    assert!(specs[1].nics.is_empty());
    assert_eq!(specs[1].replica_index, 1);
    assert_eq!(specs[1].card.as_ref().map(|c| c.index), Some(3));
}

#[test]
fn gangs_and_tiers_convert() {
    let group: crds::GangGroup = serde_json::from_value(json!({
        "apiVersion": "runtimekit.aliyun.com/v1alpha1", "kind": "GangGroup",
        "metadata": {"name": "gang-nccl-test", "namespace": "ml"},
        "spec": {"minMember": 7, "highestTier": "LeafSwitch"}
    }))
    .expect("gang group");
    assert_eq!(
        GangConstraint::from_gang_group(&group).expect("named"),
        GangConstraint {
            name: "gang-nccl-test".into(),
            highest_tier: Tier::LeafSwitch
        }
    );
}

fn share_strategy() -> impl Strategy<Value = Share> {
    prop_oneof![
        Just(Share::Whole),
        (
            proptest::option::of(0u8..=100),
            proptest::option::of(1u64..100_000)
        )
            .prop_map(|(core, memory_mib)| Share::Tdm { core, memory_mib }),
        (1u8..=7, 0u8..8, 1u64..100_000).prop_map(|(slices, start, memory_mib)| Share::Mig {
            profile: format!("{slices}g.{}gb", slices * 10),
            slices,
            start,
            memory_mib,
        }),
    ]
}

fn decision_strategy() -> impl Strategy<Value = Decision> {
    let container = (
        "[a-z]{1,8}",
        proptest::collection::vec((0u32..8, share_strategy()), 1..4),
        proptest::collection::vec("mlx5_[0-3]", 0..2),
    )
        .prop_map(|(name, cards, nics)| ContainerPlacement {
            container: name,
            cards: cards
                .into_iter()
                .zip(0u32..)
                .map(|((index, share), replica)| CardPlacement {
                    index,
                    uuid: format!("GPU-{index}"),
                    replica,
                    share,
                })
                .collect(),
            nics,
            locality: None,
        });
    (
        proptest::collection::vec(container, 1..3),
        proptest::option::of("[a-z]{1,8}"),
    )
        .prop_map(|(containers, gang)| Decision {
            pod_uid: "uid-1".into(),
            node: "gpu-1".into(),
            containers,
            resources: Resources::default(),
            gang,
        })
}

proptest! {
    /// What a restarted scheduler reads back from a pod's allocation annotation is the decision
    /// that wrote it, and it accounts the same cards as the GpuSlices the decision wrote.
    #[test]
    fn allocations_round_trip_to_the_decision_and_its_slices(decision in decision_strategy()) {
        let allocation = decision.allocation(|c, r| format!("w-0-{c}-{r}"));
        let json = serde_json::to_string(&allocation).expect("serializes");
        let read: runtimekit_contract::allocation::Allocation =
            serde_json::from_str(&json).expect("parses");
        let back = Decision::from_allocation("uid-1", decision.gang.clone(), &read)
            .expect("readable");
        prop_assert_eq!(&back, &decision);
        let from_slices: Vec<SliceInput> = decision
            .gpu_slices("ml", "w-0")
            .into_iter()
            .map(|spec| {
                SliceInput::from_gpu_slice(&crds::GpuSlice::new("s", spec))
                    .expect("valid")
                    .expect("placed")
            })
            .collect();
        prop_assert_eq!(back.slice_inputs(), from_slices);
        let names: Vec<String> = read
            .containers
            .iter()
            .flat_map(|c| c.cards.iter().map(|card| card.slice.clone()))
            .collect();
        let expected: Vec<String> = decision
            .containers
            .iter()
            .flat_map(|c| c.cards.iter().map(|card| format!("w-0-{}-{}", c.container, card.replica)))
            .collect();
        prop_assert_eq!(names, expected);
    }
}

#[test]
fn unreadable_allocations_say_what_is_wrong() {
    let read = |card: serde_json::Value| {
        let allocation: runtimekit_contract::allocation::Allocation = serde_json::from_value(
            json!({"node": "gpu-1", "containers": [{"name": "train", "cards": [card]}]}),
        )
        .expect("allocation");
        Decision::from_allocation("uid-1", None, &allocation)
            .expect_err("unreadable")
            .to_string()
    };
    assert_eq!(
        read(json!({"index": 0, "uuid": "GPU-0", "mode": "Shared", "slice": "s"})),
        "the allocation of pod uid-1: mode \"Shared\" is not valid"
    );
    assert_eq!(
        read(
            json!({"index": 0, "uuid": "GPU-0", "mode": "MIG", "profile": "3g.40gb",
                    "start": 4, "slice": "s"})
        ),
        "the allocation of pod uid-1 has no slices"
    );
    assert_eq!(
        read(json!({"index": 0, "uuid": "GPU-0", "mode": "TDM", "core": 120, "slice": "s"})),
        "the allocation of pod uid-1: core \"120\" is not valid"
    );
}
