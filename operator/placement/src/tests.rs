//! The indexes against the reference: for random clusters, allocations and pods, every
//! decision equals the one a scan of every node makes.

use crate::model::*;
use crate::{Cluster, Settings};
use proptest::prelude::*;
use runtimekit_contract::{CardRequest, ContainerRequest, WholeCardName};
use std::collections::BTreeMap;

fn card(index: u32, kind: u8, group: u32) -> CardInfo {
    let (vendor, model, mib, mig) = match kind {
        0 => (Vendor::Nvidia, "NVIDIA H800", 80 * 1024, false),
        1 => (Vendor::Nvidia, "NVIDIA H800", 80 * 1024, true),
        2 => (Vendor::Nvidia, "NVIDIA A100-SXM4-40GB", 40 * 1024, true),
        3 => (Vendor::Ppu, "PPU-810E", 96 * 1024, false),
        _ => (Vendor::Amd, "AMD Instinct MI300X", 192 * 1024, false),
    };
    CardInfo {
        index,
        uuid: format!("u{index}"),
        vendor,
        model: model.into(),
        memory_mib: mib,
        mig_enabled: mig,
        healthy: true,
        pcie_switch: Some(format!("sw{}", index / 2)),
        numa_node: Some(index / 4),
        socket: Some(index / 4),
        interconnect_group: (kind == 3).then(|| format!("g{group}")),
        nvlink_peers: if vendor == Vendor::Nvidia {
            vec![index ^ 1, index ^ 1, index ^ 2]
        } else {
            Vec::new()
        },
        mig_instances: Vec::new(),
    }
}

#[derive(Debug, Clone)]
struct Spec {
    kinds: Vec<u8>,
    nics: u8,
    tainted: bool,
    ppu_label: bool,
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        prop::collection::vec(0u8..5, 1..=8),
        0u8..3,
        prop::bool::weighted(0.2),
        any::<bool>(),
    )
        .prop_map(|(kinds, nics, tainted, ppu_label)| Spec {
            kinds,
            nics,
            tainted,
            ppu_label,
        })
}

/// One or two containers asking for cards, whether they want RDMA, whether the pod selects
/// PPU nodes.
fn request() -> impl Strategy<Value = (Vec<CardRequest>, bool, bool)> {
    let req = prop_oneof![
        (
            1u32..=3,
            prop::option::of(1u8..=100),
            prop::option::of(1u64..=60)
        )
            .prop_map(|(cards, core, gib)| CardRequest::Tdm {
                cards,
                core,
                memory_mib: gib.map(|g| g * 1024),
            }),
        (
            prop::sample::select(vec![1u8, 2, 3, 4, 7]),
            prop::option::of(1u64..=40)
        )
            .prop_map(|(slices, gib)| CardRequest::Mig {
                cards: 1,
                slices,
                memory_mib: gib.map(|g| g * 1024),
            }),
        (1u32..=8, prop::bool::weighted(0.3)).prop_map(|(cards, nvidia)| CardRequest::Whole {
            cards,
            name: if nvidia {
                WholeCardName::Nvidia
            } else {
                WholeCardName::AnyVendor
            },
        }),
    ];
    (
        prop::collection::vec(req, 1..=2),
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.2),
    )
}

fn build(specs: &[Spec], scoring: Scoring) -> Cluster {
    let mut c = Cluster::new(Settings::default().with_scoring(scoring));
    for (i, s) in specs.iter().enumerate() {
        let name = format!("n{i:02}");
        let mut labels = BTreeMap::from([("lj_runtimekit_enable".to_owned(), "true".to_owned())]);
        if s.ppu_label {
            labels.insert("vendor".into(), "ppu".into());
        }
        c.upsert_node(NodeInfo {
            name: name.clone(),
            labels,
            taints: if s.tainted {
                vec![Taint {
                    key: "t".into(),
                    value: String::new(),
                    effect: TaintEffect::NoSchedule,
                }]
            } else {
                Vec::new()
            },
            allocatable: Resources {
                cpu_milli: 16_000,
                memory_bytes: 64 << 30,
                scalar: BTreeMap::new(),
            },
            max_pods: 20,
            ready: true,
            gpu_enabled: true,
            ..NodeInfo::default()
        });
        let cards: Vec<CardInfo> = s
            .kinds
            .iter()
            .enumerate()
            .map(|(j, &k)| card(j as u32, k, j as u32 / 4))
            .collect();
        let nics: Vec<NicInfo> = (0..s.nics)
            .map(|n| NicInfo {
                name: format!("nic{n}"),
                pcie_switch: Some(format!("sw{n}")),
                numa_node: Some(u32::from(n)),
                socket: Some(0),
            })
            .collect();
        c.set_devices(&name, &cards, &nics);
        c.set_agent_reporting(&name, true);
    }
    c
}

fn pod(uid: usize, (cards, rdma, select): (Vec<CardRequest>, bool, bool)) -> PodInput {
    PodInput {
        uid: format!("p{uid}"),
        containers: cards
            .into_iter()
            .enumerate()
            .map(|(i, cards)| ContainerRequest {
                container: format!("c{i}"),
                cards,
                rdma,
            })
            .collect(),
        resources: Resources {
            cpu_milli: 2000,
            ..Resources::default()
        },
        node_selector: if select {
            BTreeMap::from([("vendor".to_owned(), "ppu".to_owned())])
        } else {
            BTreeMap::new()
        },
        ..PodInput::default()
    }
}

fn same_as_scan(
    specs: &[Spec],
    pods: &[(Vec<CardRequest>, bool, bool)],
    scoring: Scoring,
) -> Result<(), TestCaseError> {
    let mut c = build(specs, scoring);
    for (uid, r) in pods.iter().enumerate() {
        let p = pod(uid, r.clone());
        let fast = c.decide(&p).ok();
        prop_assert_eq!(
            &fast,
            &c.decide_by_scan(&p),
            "index and scan disagree on {:?}",
            p
        );
        if let Some(d) = fast {
            prop_assert_eq!(c.commit(&d), Ok(()));
        }
    }
    for uid in 0..pods.len() {
        c.release(&format!("p{uid}"));
    }
    prop_assert!(c.is_idle());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn binpack_index_matches_scan(
        specs in prop::collection::vec(spec(), 1..=10),
        pods in prop::collection::vec(request(), 1..=60),
    ) {
        same_as_scan(&specs, &pods, Scoring::Binpack)?;
    }

    #[test]
    fn spread_index_matches_scan(
        specs in prop::collection::vec(spec(), 1..=10),
        pods in prop::collection::vec(request(), 1..=60),
    ) {
        same_as_scan(&specs, &pods, Scoring::Spread)?;
    }
}

#[test]
fn removing_every_node_empties_the_indexes() {
    let specs = vec![
        Spec {
            kinds: vec![0, 1, 3, 4],
            nics: 1,
            tainted: false,
            ppu_label: true,
        };
        3
    ];
    let mut c = build(&specs, Scoring::Binpack);
    assert!(!c.indexes.is_empty());
    for i in 0..3 {
        assert!(c.remove_node(&format!("n{i:02}")));
    }
    assert!(c.indexes.is_empty());
    assert_eq!(c.interner.len(), 0, "every string is released");
}
