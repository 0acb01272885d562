//! The placement engine: decides where GPU pods go, without I/O and without an apiserver.
//!
//! The operator feeds a [`Cluster`] from its watches and writes what it decides. Everything is
//! incremental: every update costs time proportional to what changed (one node, one pod, one
//! gang; times the logarithm of the cluster for the ordered indexes), and decisions read those
//! indexes instead of scanning nodes, except to explain a failure and for pods that ask for no
//! cards. `docs/benchmarks.md` has the figures.
//!
//! # Feeding the state
//!
//! | watch event | call |
//! | --- | --- |
//! | Node added or changed / deleted | [`Cluster::upsert_node`] with [`NodeInfo::from_node`] / [`Cluster::remove_node`] |
//! | node-tier TopologyGroup status | [`Cluster::set_devices`] and [`Cluster::set_agent_reporting`], from [`NodeDevices::from_topology_group`] |
//! | GpuSlice added or changed / deleted | [`Cluster::upsert_slice`] with [`SliceInput::from_gpu_slice`] / [`Cluster::remove_slice`] |
//! | any pod bound to a node / gone | [`Cluster::upsert_pod_usage`] with [`Resources::from_pod`] / [`Cluster::remove_pod_usage`] or [`Cluster::release`] |
//!
//! Allocations are keyed by pod UID, container and replica index, exactly as a GpuSlice names
//! them, so the slices the operator writes after a commit, or reads back after a restart, land
//! on the same entries and are never counted twice. Slices and usage that name a node or card
//! the engine does not know yet are kept and count as soon as it appears: a restarted operator
//! may see GpuSlices before Nodes and TopologyGroups.
//!
//! # Deciding
//!
//! - [`Cluster::decide`] places one pod ([`PodInput::from_pod`] builds it from the Pod and the
//!   resource contract's [`runtimekit_contract::PodRequest`]) and changes nothing.
//!   [`Cluster::commit`] applies the [`Decision`] (kube-scheduler's "assume"), checking it
//!   again so a stale decision can never over-commit a card; [`Cluster::release`] returns it.
//!   [`Decision::gpu_slices`] gives the GpuSlice specs to write.
//! - [`Cluster::decide_gang`] places every member of a gang at once, in the lowest network tier
//!   that holds them all, never across network pods; [`Cluster::reserve_gang`] holds the
//!   capacity until [`Cluster::confirm_gang`] (all bound) or [`Cluster::release_gang`]
//!   (rollback).
//! - [`Cluster::preempt`] finds the lower-priority pods to evict so that a pod that fits
//!   nowhere fits on one node (kube-scheduler's rules; a running gang goes whole or not at all),
//!   and where it then goes; it changes nothing.
//! - A failure is an [`Unschedulable`]: a reason per node, counted like kube-scheduler does
//!   (`0/120 nodes are available: 80 node(s) had no card with 50% aliyun.com/gpu-core free,
//!   40 node(s) had MIG not enabled on any card for aliyun.com/gpu-slice.`), each naming the
//!   resource and the card state that blocked it.
//!
//! # The rules
//!
//! - Nodes: Ready, not cordoned (unless tolerated), taints (NoSchedule and NoExecute) and
//!   tolerations, `nodeSelector`, required node affinity (every operator, `metadata.name`
//!   fields), CPU, memory, pods and scalar resources beside pods already bound. GPU pods also
//!   need `lj_runtimekit_enable=true` and a reporting agent. Pods using constraints the engine
//!   does not evaluate (required inter-pod affinity, topology spread, host ports, resource
//!   claims) are refused with that reason rather than placed as if they were not there.
//! - Cards: a card is free, TDM, MIG or given whole. MIG-enabled cards take only MIG instances
//!   (profile from `MigTable::pick_profile`, start from `MigTable::preferred_start`, never
//!   overlapping what is allocated or what the hardware reports); other healthy NVIDIA and PPU
//!   cards take TDM shares up to 100 % core and their memory (an absent core or memory reserves
//!   none); AMD cards are given whole only; `nvidia.com/gpu` takes NVIDIA cards only; a card
//!   is given whole only when nothing is allocated on it. Unhealthy cards are never offered.
//!   `replica: N` takes N distinct cards of one node; the containers of a pod are placed on one
//!   node in order, each seeing what the previous ones took.
//! - Scoring, [`Scoring::Binpack`] by default: the card with the least room that fits (core
//!   first, then memory; for MIG the fewest free memory slices left, then the most room for
//!   large profiles), then the node with the fewest free cards, then node name and card index.
//!   [`Scoring::Spread`] reverses the card and node preferences; ties still go to the lowest
//!   name and index. TDM `replica` requests compare nodes by the worst card they would get;
//!   MIG on several cards and pods with several containers asking for cards take the first
//!   node, by free cards then name, that holds them.
//! - Whole cards: PPU 810E requests of 2, 4 or 8 cards take one interconnect group when a node
//!   has one with enough free cards (the group with the fewest, on the node whose fullest group
//!   is smallest), else as few groups as possible; with `rdma` the cards and NICs form a joint
//!   set under one PCIe switch, else one NUMA node, else one socket, else across sockets (the
//!   M890P rule, applied to any node that reports its topology, and taking precedence over
//!   interconnect groups); shares with `rdma` get the NICs nearest their card; NVIDIA multi-card requests
//!   take the set with the most NVLink links. A better tier always wins over a fuller node.
//!   Other whole cards come from the interconnect group and PCIe switch with the fewest free
//!   cards, keeping large free units whole.
//! - Preferences that only score in kube-scheduler (preferred node affinity, PreferNoSchedule
//!   taints) do not change scores here.
//! - Determinism: decisions depend only on the state and the input, never on the order in
//!   which the state was built or on hash order; every tie breaks by name, then index.
//!
//! # Layout
//!
//! `cluster` keeps the state (`state` per node, `index` the ordered indexes over it); `decide/`
//! decides one pod (`prepare`, `predicates`, `lookup`, `score`, `explain`); `place` chooses cards
//! on one node; `gang` places gangs; `reason` words failures; `convert` reads the API objects;
//! `objects` builds the GpuSlices and allocation annotation a decision becomes; `quota` counts
//! what each namespace holds against its ResourceQuotas, replicas counted.

mod cluster;
mod convert;
mod decide;
mod gang;
mod index;
mod intern;
mod mig_cache;
mod model;
pub mod objects;
mod place;
mod preempt;
mod quantity;
pub mod quota;
mod reason;
pub mod snapshot;
mod state;
#[cfg(test)]
mod tests;

pub use cluster::{CardView, Cluster, CommitError};
pub use convert::{ConvertError, NodeDevices};
pub use model::*;
pub use preempt::{Candidate, Preemption};
pub use reason::{CardProblem, GangShortfall, GroupCapacity, Reason, ReasonCount, Unschedulable};
