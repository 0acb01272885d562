//! Properties over random clusters and random sequences of decisions, commits, releases and
//! device changes: no card is ever over-committed (checked on a ledger of the committed
//! decisions kept by the test, which the engine's own counters must match), TDM and MIG never share a card, MIG
//! instances sit at legal, non-overlapping starts, the same state and input give the same
//! decision whatever order the cluster was built in, and releasing everything empties it.

mod common;

use common::*;
use proptest::prelude::*;
use runtimekit_contract::mig::table_for;
use runtimekit_contract::{CardRequest, ContainerRequest, WholeCardName};
use runtimekit_placement::*;
use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy)]
enum Kind {
    Tdm,
    H800Mig,
    A30Mig,
    Ppu810e,
    Amd,
}

fn card_of(kind: Kind, index: u32, healthy: bool) -> CardInfo {
    let mut c = match kind {
        Kind::Tdm => h800(index),
        Kind::H800Mig => h800_mig(index),
        Kind::A30Mig => CardInfo {
            mig_enabled: true,
            ..card(index, Vendor::Nvidia, "NVIDIA A30", 24)
        },
        Kind::Ppu810e => ppu_810e(index, if index < 2 { "g0" } else { "g1" }),
        Kind::Amd => card(index, Vendor::Amd, "AMD Instinct MI300X", 192),
    };
    c.healthy = healthy;
    c.pcie_switch = Some(format!("sw{}", index / 2));
    c.numa_node = Some(index / 2);
    c
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        3 => Just(Kind::Tdm),
        2 => Just(Kind::H800Mig),
        1 => Just(Kind::A30Mig),
        2 => Just(Kind::Ppu810e),
        1 => Just(Kind::Amd),
    ]
}

#[derive(Debug, Clone)]
struct NodeSpec {
    cards: Vec<(Kind, bool)>,
    nics: bool,
}

fn node_spec() -> impl Strategy<Value = NodeSpec> {
    (
        prop::collection::vec((kind(), prop::bool::weighted(0.9)), 1..=6),
        any::<bool>(),
    )
        .prop_map(|(cards, nics)| NodeSpec { cards, nics })
}

fn request() -> impl Strategy<Value = CardRequest> {
    prop_oneof![
        4 => (
            1u32..=3,
            prop::option::weighted(0.8, prop::sample::select(vec![5u8, 10, 25, 30, 50, 70, 100])),
            prop::option::weighted(0.7, 1u64..=30),
        )
            .prop_map(|(cards, core, gib)| CardRequest::Tdm {
                cards,
                core,
                memory_mib: gib.map(|g| g * GIB),
            }),
        3 => (
            1u32..=2,
            prop::sample::select(vec![1u8, 2, 3, 4, 7]),
            prop::option::weighted(0.3, 1u64..=50),
        )
            .prop_map(|(cards, slices, gib)| CardRequest::Mig {
                cards,
                slices,
                memory_mib: gib.map(|g| g * GIB),
            }),
        3 => (1u32..=3, prop::bool::weighted(0.3)).prop_map(|(cards, nvidia)| CardRequest::Whole {
            cards,
            name: if nvidia { WholeCardName::Nvidia } else { WholeCardName::AnyVendor },
        }),
    ]
}

#[derive(Debug, Clone)]
enum Op {
    Place {
        containers: Vec<(CardRequest, bool)>,
        cpu: u64,
    },
    Release(usize),
    ToggleHealth(usize, usize),
    ToggleAgent(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (prop::collection::vec((request(), prop::bool::weighted(0.2)), 1..=2), 0u64..=8_000)
            .prop_map(|(containers, cpu)| Op::Place { containers, cpu }),
        3 => any::<usize>().prop_map(Op::Release),
        1 => (any::<usize>(), any::<usize>()).prop_map(|(n, c)| Op::ToggleHealth(n, c)),
        1 => any::<usize>().prop_map(Op::ToggleAgent),
    ]
}

/// The same cluster, built twice in opposite orders, driven by the same operations.
struct Twin {
    specs: Vec<NodeSpec>,
    health: Vec<Vec<bool>>,
    agents: Vec<bool>,
    pair: [Cluster; 2],
    /// The committed decisions still live: the test's own ledger.
    live: Vec<Decision>,
}

/// What the ledger says one card holds.
#[derive(Debug, Default, PartialEq)]
struct Tally {
    tdm_shares: u32,
    core: u32,
    memory_mib: u64,
    whole: u32,
    mig: Vec<(String, u8)>,
}

/// Sums the live decisions per (node, card index), independently of the engine.
fn ledger(live: &[Decision]) -> BTreeMap<(String, u32), Tally> {
    let mut tallies: BTreeMap<(String, u32), Tally> = BTreeMap::new();
    for decision in live {
        for card in decision.containers.iter().flat_map(|c| &c.cards) {
            let tally = tallies
                .entry((decision.node.clone(), card.index))
                .or_default();
            match &card.share {
                Share::Whole => tally.whole += 1,
                Share::Tdm { core, memory_mib } => {
                    tally.tdm_shares += 1;
                    tally.core += u32::from(core.unwrap_or(0));
                    tally.memory_mib += memory_mib.unwrap_or(0);
                }
                Share::Mig { profile, start, .. } => tally.mig.push((profile.clone(), *start)),
            }
        }
    }
    for tally in tallies.values_mut() {
        tally.mig.sort();
    }
    tallies
}

fn devices(spec: &NodeSpec, health: &[bool]) -> (Vec<CardInfo>, Vec<NicInfo>) {
    let cards = spec
        .cards
        .iter()
        .zip(health)
        .enumerate()
        .map(|(i, (&(k, _), &h))| card_of(k, i as u32, h))
        .collect();
    let nics = if spec.nics {
        vec![nic("mlx5_0", "sw0", 0, 0)]
    } else {
        Vec::new()
    };
    (cards, nics)
}

impl Twin {
    fn new(specs: Vec<NodeSpec>, scoring: Scoring) -> Self {
        let health: Vec<Vec<bool>> = specs
            .iter()
            .map(|s| s.cards.iter().map(|c| c.1).collect())
            .collect();
        let mut pair = [
            Cluster::new(Settings::default().with_scoring(scoring)),
            Cluster::new(Settings::default().with_scoring(scoring)),
        ];
        let order: Vec<usize> = (0..specs.len()).collect();
        for (c, ids) in pair
            .iter_mut()
            .zip([order.clone(), order.into_iter().rev().collect()])
        {
            for i in ids {
                let (cards, nics) = devices(&specs[i], &health[i]);
                add(c, node(&format!("node-{i}")), &cards, &nics);
            }
        }
        Twin {
            agents: vec![true; specs.len()],
            specs,
            health,
            pair,
            live: Vec::new(),
        }
    }

    fn apply(&mut self, op: &Op, uid: usize) -> Result<(), TestCaseError> {
        match op {
            Op::Place { containers, cpu } => {
                let p = PodInput {
                    uid: format!("pod-{uid}"),
                    containers: containers
                        .iter()
                        .enumerate()
                        .map(|(i, (cards, rdma))| ContainerRequest {
                            container: format!("c{i}"),
                            cards: cards.clone(),
                            rdma: *rdma,
                        })
                        .collect(),
                    resources: Resources {
                        cpu_milli: *cpu,
                        ..Resources::default()
                    },
                    ..PodInput::default()
                };
                let first = self.pair[0].decide(&p);
                prop_assert_eq!(&first, &self.pair[0].decide(&p), "same state, same input");
                prop_assert_eq!(
                    &first,
                    &self.pair[1].decide(&p),
                    "order of construction leaked"
                );
                if let Ok(d) = first {
                    for c in &mut self.pair {
                        prop_assert_eq!(c.commit(&d), Ok(()));
                    }
                    self.live.push(d);
                }
            }
            Op::Release(k) => {
                if !self.live.is_empty() {
                    let gone = self.live.remove(k % self.live.len());
                    for c in &mut self.pair {
                        prop_assert!(c.release(&gone.pod_uid));
                    }
                }
            }
            Op::ToggleHealth(n, k) => {
                let n = n % self.specs.len();
                let k = k % self.health[n].len();
                self.health[n][k] = !self.health[n][k];
                let (cards, nics) = devices(&self.specs[n], &self.health[n]);
                for c in &mut self.pair {
                    c.set_devices(&format!("node-{n}"), &cards, &nics);
                }
            }
            Op::ToggleAgent(n) => {
                let n = n % self.specs.len();
                self.agents[n] = !self.agents[n];
                for c in &mut self.pair {
                    c.set_agent_reporting(&format!("node-{n}"), self.agents[n]);
                }
            }
        }
        Ok(())
    }

    fn check(&self) -> Result<(), TestCaseError> {
        let mut tallies = ledger(&self.live);
        for (n, spec) in self.specs.iter().enumerate() {
            let views = self.pair[0].cards(&format!("node-{n}")).expect("node");
            prop_assert_eq!(
                &views,
                &self.pair[1].cards(&format!("node-{n}")).expect("node")
            );
            for (v, &(kind, _)) in views.iter().zip(&spec.cards) {
                let info = card_of(kind, v.index, true);
                let held = tallies
                    .remove(&(format!("node-{n}"), v.index))
                    .unwrap_or_default();
                prop_assert_eq!(
                    &held,
                    &Tally {
                        tdm_shares: v.tdm_shares,
                        core: v.core_used,
                        memory_mib: v.memory_used_mib,
                        whole: v.whole,
                        mig: v.mig.clone(),
                    },
                    "the engine's counters differ from the committed decisions on {:?}",
                    v
                );
                prop_assert!(held.core <= 100, "core over-committed: {:?}", held);
                prop_assert!(
                    held.memory_mib <= info.memory_mib,
                    "memory over-committed: {:?} of {} MiB",
                    held,
                    info.memory_mib
                );
                prop_assert!(v.whole <= 1, "given whole twice: {:?}", v);
                if v.whole == 1 {
                    prop_assert!(
                        v.tdm_shares == 0 && v.mig.is_empty(),
                        "whole and more: {:?}",
                        v
                    );
                }
                prop_assert!(
                    v.tdm_shares == 0 || v.mig.is_empty(),
                    "TDM and MIG mixed: {:?}",
                    v
                );
                if v.tdm_shares > 0 {
                    prop_assert!(!info.mig_enabled && info.vendor != Vendor::Amd, "{:?}", v);
                }
                if !v.mig.is_empty() {
                    prop_assert!(info.mig_enabled, "MIG on a card not in MIG mode: {:?}", v);
                    let table = table_for(&info.model, info.memory_mib).expect("table");
                    let mut occupied = 0u8;
                    for (name, start) in &v.mig {
                        let p = table.profile(name).expect("profile of the model");
                        prop_assert!(p.starts.contains(start), "illegal start: {:?}", v);
                        prop_assert!(start + p.memory_slices <= table.memory_slices);
                        prop_assert_eq!(occupied & p.mask_at(*start), 0, "overlap: {:?}", v);
                        occupied |= p.mask_at(*start);
                    }
                }
            }
        }
        prop_assert!(
            tallies.is_empty(),
            "decisions on unknown cards: {:?}",
            tallies
        );
        Ok(())
    }
}

fn run(specs: Vec<NodeSpec>, ops: Vec<Op>, scoring: Scoring) -> Result<(), TestCaseError> {
    let mut twin = Twin::new(specs, scoring);
    for (uid, op) in ops.iter().enumerate() {
        twin.apply(op, uid)?;
        twin.check()?;
    }
    for gone in std::mem::take(&mut twin.live) {
        for c in &mut twin.pair {
            prop_assert!(c.release(&gone.pod_uid));
        }
    }
    for c in &twin.pair {
        prop_assert!(c.is_idle());
        for n in 0..twin.specs.len() {
            for v in c.cards(&format!("node-{n}")).expect("node") {
                prop_assert!(
                    v.tdm_shares == 0 && v.whole == 0 && v.mig.is_empty() && v.core_used == 0,
                    "left behind: {:?}",
                    v
                );
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn binpack_sequences_keep_every_invariant(
        specs in prop::collection::vec(node_spec(), 1..=4),
        ops in prop::collection::vec(op(), 1..=40),
    ) {
        run(specs, ops, Scoring::Binpack)?;
    }

    #[test]
    fn spread_sequences_keep_every_invariant(
        specs in prop::collection::vec(node_spec(), 1..=4),
        ops in prop::collection::vec(op(), 1..=40),
    ) {
        run(specs, ops, Scoring::Spread)?;
    }

    #[test]
    fn failures_count_every_node(
        specs in prop::collection::vec(node_spec(), 1..=4),
        req in request(),
    ) {
        let twin = Twin::new(specs, Scoring::Binpack);
        let p = PodInput {
            resources: Resources { cpu_milli: 1_000_000, ..Resources::default() },
            ..pod("huge", req)
        };
        let e = twin.pair[0].decide(&p).expect_err("no node has that much cpu");
        prop_assert_eq!(e.nodes, twin.specs.len());
        prop_assert_eq!(e.count(&Reason::Insufficient { resource: "cpu".into() }), e.nodes);
    }
}
