//! Part `dra` (issue 32): kube-scheduler allocating whole-card ResourceClaims from the
//! ResourceSlices of 100 kwok nodes of 10 cards, against ours placing the same pods through the
//! extended resource (`nvidia.com/gpu: 1`) on the same nodes. The slices are what the node
//! agents publish, built by the agents' own pool code (a whole device and a share device per
//! card, both consuming the card's counter), and `config/dra` is applied as users apply it
//! (DeviceClasses and the share-claim policy). Each run is a backlog drain of 1,000 pods, in
//! pairs whose order alternates; reported are bound pods/s from the scheduler's start and the
//! apiserver requests per pod (the pods' creates, the claims the resource-claim controller
//! makes for them, the schedulers' writes).

use crate::measure::{Processes, Run, median};
use crate::runs::{Operator, kube_backlog};
use crate::workload::Workload;
use crate::{CONCURRENCY, HEARTBEAT, OURS};
use anyhow::Result;
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use runtimekit_contract::RuntimeKitConfig;
use runtimekit_e2e::cluster::Cluster;
use runtimekit_e2e::load::{Fleet, apply_config};
use runtimekit_node_agent::dra::pool::{PoolInput, slices};
use runtimekit_node_agent::model::{Inventory, NodeState};
use runtimekit_proto::resource::v1alpha1 as pb;
use serde_json::json;
use std::collections::BTreeMap;

/// Cards on each node of the DRA fleet.
pub const CARDS: u32 = 10;
/// The kit's driver.
const DRIVER: &str = "gpu.runtimekit.aliyun.com";
/// The fleet's name prefix, which the runs' pods keep to.
const FLEET: &str = "dra";

/// Every drain of each scheduler, in pair order, on `nodes` nodes.
#[derive(Debug, Default)]
pub struct Dra {
    pub nodes: usize,
    pub kube: Vec<Run>,
    pub ours: Vec<Run>,
}

/// How big the part is.
#[derive(Debug, Clone, Copy)]
pub struct DraSizes {
    pub nodes: usize,
    pub pods: usize,
    pub pairs: usize,
}

/// Makes the DRA fleet and runs the pairs of drains.
pub async fn compare(
    cluster: &mut Cluster,
    client: &Client,
    operator: &mut Operator,
    processes: &mut Processes,
    DraSizes { nodes, pods, pairs }: DraSizes,
) -> Result<Dra> {
    let fleet = Fleet {
        prefix: FLEET.into(),
        nodes,
        cards: CARDS,
        mig_cards: 0,
        heartbeat: HEARTBEAT,
    };
    eprintln!("creating {nodes} DRA nodes of {CARDS} cards with their ResourceSlices");
    let heartbeats = fleet.create(client).await?;
    let outcome = async {
        publish(client, &fleet).await?;
        apply_config(cluster, &["-k", "config/dra"])?;
        let claims = Workload::new("default-scheduler", json!({}))
            .through_claims("card")
            .on_fleet(FLEET);
        let extended = Workload::new(OURS, json!({"nvidia.com/gpu": "1"})).on_fleet(FLEET);
        let mut dra = Dra {
            nodes,
            ..Dra::default()
        };
        for pair in 1..=pairs {
            let kube_first = pair % 2 == 1;
            for kube_turn in [kube_first, !kube_first] {
                if kube_turn {
                    let ns = format!("bench-dra-kube-{pair}");
                    let pending = (ns.as_str(), &claims, pods);
                    let run =
                        kube_backlog(cluster, client, processes, &operator.child, pending).await?;
                    dra.kube.push(run);
                } else {
                    let ns = format!("bench-dra-ours-{pair}");
                    let pending = (ns.as_str(), &extended, pods);
                    dra.ours.push(
                        operator
                            .backlog(cluster, client, processes, pending)
                            .await?,
                    );
                }
            }
        }
        Ok(dra)
    }
    .await;
    heartbeats.abort();
    outcome
}

/// Publishes each fleet node's pool as its agent would.
async fn publish(client: &Client, fleet: &Fleet) -> Result<()> {
    let api: Api<ResourceSlice> = Api::all(client.clone());
    let config = RuntimeKitConfig::default();
    stream::iter(0..fleet.nodes)
        .map(|i| {
            let (api, config, name) = (api.clone(), &config, fleet.node(i));
            async move {
                let state = NodeState {
                    inventory: Some(inventory(&name, fleet.cards)),
                    ..NodeState::default()
                };
                let labels = BTreeMap::new();
                let specs = slices(&PoolInput {
                    node: &name,
                    driver: DRIVER,
                    config,
                    state: &state,
                    labels: &labels,
                    taints: true,
                });
                for (k, spec) in specs.into_iter().enumerate() {
                    let slice = ResourceSlice {
                        metadata: ObjectMeta {
                            name: Some(format!("{name}-{DRIVER}-{k}")),
                            ..ObjectMeta::default()
                        },
                        spec,
                    };
                    api.create(&PostParams::default(), &slice).await?;
                }
                Ok::<(), anyhow::Error>(())
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// A node of `cards` H800 cards as the resource layer lists them: two to a PCIe switch, four to
/// a NUMA node, as the fleet's TopologyGroups say.
fn inventory(node: &str, cards: u32) -> Inventory {
    let devices = (0..cards)
        .map(|index| {
            let device = pb::Device {
                index,
                uuid: format!("GPU-{node}-{index}"),
                vendor: pb::Vendor::Nvidia.into(),
                model: "NVIDIA H800".into(),
                memory_mib: 81920,
                state: pb::DeviceState::Ok.into(),
                healthy: true,
                mig: Some(pb::MigState {
                    capable: true,
                    ..Default::default()
                }),
                topology: Some(pb::Topology {
                    pcie_switch: format!("sw{}", index / 2),
                    numa_node: Some(index / 4),
                    socket: Some(index / 4),
                    ..Default::default()
                }),
                ..Default::default()
            };
            (index, device)
        })
        .collect();
    Inventory {
        devices,
        ..Inventory::default()
    }
}

/// The median and range of one figure over runs.
fn spread(runs: &[Run], figure: impl Fn(&Run) -> f64) -> (f64, f64, f64) {
    let values: Vec<f64> = runs.iter().map(figure).collect();
    let low = values.iter().copied().fold(f64::NAN, f64::min);
    let high = values.iter().copied().fold(f64::NAN, f64::max);
    (median(values.into_iter()), low, high)
}

fn pods_per_sec(run: &Run) -> f64 {
    run.pods_per_sec
}

fn requests_per_pod(run: &Run) -> f64 {
    run.requests_per_pod.unwrap_or(f64::NAN)
}

/// The part's table.
pub fn print(dra: &Dra) {
    if dra.kube.is_empty() && dra.ours.is_empty() {
        return;
    }
    println!(
        "\nDRA: {} kwok nodes x {CARDS} cards published as ResourceSlices; kube-scheduler allocates a whole-card claim per pod, ours places the same pods by nvidia.com/gpu: 1. Backlog drains, {} pairs, order alternating; median (range).\n",
        dra.nodes,
        dra.kube.len().max(dra.ours.len())
    );
    println!(
        "| scheduler | pods per drain | bound pods/s | apiserver requests per pod | apiserver CPU ms per pod until settled |"
    );
    println!("| --- | --- | --- | --- | --- |");
    for (who, runs) in [
        ("kube-scheduler, ResourceClaims", &dra.kube),
        ("ours, extended resource", &dra.ours),
    ] {
        let shown = |(m, lo, hi): (f64, f64, f64)| format!("{m:.1} ({lo:.1} to {hi:.1})");
        println!(
            "| {who} | {} | {} | {} | {} |",
            runs.first().map_or(0, |r| r.pods),
            shown(spread(runs, pods_per_sec)),
            shown(spread(runs, requests_per_pod)),
            shown(spread(runs, |r| r.apiserver_settled_ms.unwrap_or(f64::NAN))),
        );
    }
}

/// The part's keys of the closing JSON line: medians, and ours over kube-scheduler's as the
/// ratio of the medians.
pub fn json(dra: &Dra) -> serde_json::Value {
    let (kube_rate, _, _) = spread(&dra.kube, pods_per_sec);
    let (ours_rate, _, _) = spread(&dra.ours, pods_per_sec);
    let (kube_requests, _, _) = spread(&dra.kube, requests_per_pod);
    let (ours_requests, _, _) = spread(&dra.ours, requests_per_pod);
    let round2 = |x: f64| (x * 100.0).round() / 100.0;
    json!({
        "dra_kube_scheduler_pods_per_sec": round2(kube_rate),
        "dra_ours_pods_per_sec": round2(ours_rate),
        "dra_kube_scheduler_requests_per_pod": round2(kube_requests),
        "dra_ours_requests_per_pod": round2(ours_requests),
        "dra_pods_per_sec_ratio": round2(ours_rate / kube_rate),
        "dra_requests_ratio": round2(ours_requests / kube_requests),
    })
}
