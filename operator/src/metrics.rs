//! The operator's Prometheus metrics and its HTTP endpoints: `/metrics`, `/healthz` and `/readyz`
//! (ready after the first full sync of every watched kind). Besides its own work, it serves the
//! ledger the custom resources keep (`gpuslices`, `ganggroup_*`, `topologygroup_*`), summed
//! from the watched state at each scrape.

use crate::state::Ledger;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

/// Where the ledger comes from: the watched state, once the operator has one.
type LedgerSource = Box<dyn Fn() -> Ledger + Send + Sync>;

/// Where the ledger will come from, set once the state exists.
#[derive(Clone, Default)]
struct LedgerSlot(Arc<OnceLock<LedgerSource>>);

impl std::fmt::Debug for LedgerSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LedgerSlot")
    }
}

/// The ledger families, read from the source at each scrape.
#[derive(Debug)]
struct LedgerView(LedgerSlot);

impl Collector for LedgerView {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(source) = self.0.0.get() else {
            return Ok(());
        };
        let ledger = source();
        let mut slices = encoder.encode_descriptor(
            "gpuslices",
            "GpuSlices by node, mode, phase and MIG profile",
            None,
            MetricType::Gauge,
        )?;
        for ((node, mode, phase, profile), count) in &ledger.slices {
            let labels = [
                ("node", node.as_str()),
                ("mode", mode.as_str()),
                ("phase", phase.as_str()),
                ("profile", profile.as_str()),
            ];
            slices
                .encode_family(&labels)?
                .encode_gauge(&(*count as i64))?;
        }
        let mut members = encoder.encode_descriptor(
            "ganggroup_members",
            "GangGroup members by state (min is the gang's size)",
            None,
            MetricType::Gauge,
        )?;
        for gang in &ledger.gangs {
            let counts = [
                ("min", gang.min_member),
                ("seen", gang.members[0]),
                ("reserved", gang.members[1]),
                ("bound", gang.members[2]),
                ("running", gang.members[3]),
            ];
            for (state, count) in counts {
                let labels = [
                    ("namespace", gang.namespace.as_str()),
                    ("ganggroup", gang.name.as_str()),
                    ("phase", gang.phase.as_str()),
                    ("state", state),
                ];
                members
                    .encode_family(&labels)?
                    .encode_gauge(&i64::from(count))?;
            }
        }
        let mut attempts = encoder.encode_descriptor(
            "ganggroup_attempts",
            "Placement attempts of each GangGroup",
            None,
            MetricType::Gauge,
        )?;
        for gang in &ledger.gangs {
            let labels = [
                ("namespace", gang.namespace.as_str()),
                ("ganggroup", gang.name.as_str()),
            ];
            attempts
                .encode_family(&labels)?
                .encode_gauge(&i64::from(gang.attempts))?;
        }
        let mut cards = encoder.encode_descriptor(
            "topologygroup_cards",
            "Cards of each TopologyGroup and everything under it, by state (total, healthy, free, mig)",
            None,
            MetricType::Gauge,
        )?;
        for group in &ledger.groups {
            let c = &group.capacity;
            for (state, count) in [
                ("total", c.cards),
                ("healthy", c.healthy_cards),
                ("free", c.free_cards),
                ("mig", c.mig_cards),
            ] {
                let labels = [
                    ("topologygroup", group.name.as_str()),
                    ("tier", group.tier.as_str()),
                    ("state", state),
                ];
                cards
                    .encode_family(&labels)?
                    .encode_gauge(&i64::from(count))?;
            }
        }
        let mut nodes = encoder.encode_descriptor(
            "topologygroup_nodes",
            "Kubernetes nodes in each TopologyGroup",
            None,
            MetricType::Gauge,
        )?;
        for group in &ledger.groups {
            let labels = [
                ("topologygroup", group.name.as_str()),
                ("tier", group.tier.as_str()),
            ];
            nodes
                .encode_family(&labels)?
                .encode_gauge(&i64::from(group.capacity.nodes))?;
        }
        Ok(())
    }
}

/// How a scheduling attempt ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum AttemptResult {
    /// The pod was bound.
    Scheduled,
    /// No node fits; the pod waits.
    Unschedulable,
    /// The pod breaks the resource contract.
    Invalid,
    /// A write failed; the pod is retried.
    Error,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: AttemptResult,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    phase: String,
}

/// The GangGroup phases the `gangs` gauge counts.
pub const GANG_PHASES: [&str; 6] = [
    "Waiting", "Reserved", "Bound", "Running", "TimedOut", "Failed",
];

/// Every metric the operator exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    attempts: Family<ResultLabels, Counter>,
    /// Time the placement engine took per decision.
    pub decision_seconds: Histogram,
    /// Time from a pod's creation to its Binding being accepted.
    pub create_to_bound_seconds: Histogram,
    /// Time the writes of one binding (GpuSlices and the Binding) took.
    pub binding_seconds: Histogram,
    /// Pods waiting to be scheduled.
    pub queue_depth: Gauge,
    /// Pods the placement engine holds capacity for.
    pub holding_pods: Gauge,
    gangs: Family<PhaseLabels, Gauge>,
    preemptions: Counter,
    preemption_victims: Counter,
    ready: AtomicBool,
    ledger: LedgerSlot,
}

impl Metrics {
    /// A fresh set of metrics, registered under the `runtimekit_operator` prefix.
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        // A gauge of 1, not an OpenMetrics info: the classic text format (what promtool and
        // DCGM's users read) has no `info` type, and promtool refuses the whole scrape.
        let build = Family::<Vec<(String, String)>, Gauge>::default();
        build
            .get_or_create(&vec![
                ("version".to_owned(), env!("CARGO_PKG_VERSION").to_owned()),
                ("component".to_owned(), "operator".to_owned()),
            ])
            .set(1);
        registry.register(
            "runtimekit_build_info",
            "The kit's version and this component",
            build,
        );
        let operator = registry.sub_registry_with_prefix("runtimekit_operator");
        let attempts = Family::<ResultLabels, Counter>::default();
        operator.register(
            "scheduling_attempts",
            "Scheduling attempts by result",
            attempts.clone(),
        );
        let decision_seconds = Histogram::new(exponential_buckets(1e-6, 4.0, 12));
        operator.register(
            "decision_seconds",
            "Time the placement engine took per decision",
            decision_seconds.clone(),
        );
        let create_to_bound_seconds = Histogram::new(exponential_buckets(0.005, 2.0, 14));
        operator.register(
            "create_to_bound_seconds",
            "Time from pod creation to binding",
            create_to_bound_seconds.clone(),
        );
        let binding_seconds = Histogram::new(exponential_buckets(0.001, 2.0, 14));
        operator.register(
            "binding_seconds",
            "Time the GpuSlice and Binding writes of one pod took",
            binding_seconds.clone(),
        );
        let queue_depth = Gauge::default();
        operator.register(
            "queue_depth",
            "Pods waiting to be scheduled",
            queue_depth.clone(),
        );
        let holding_pods = Gauge::default();
        operator.register(
            "holding_pods",
            "Pods the placement engine holds capacity for (allocations, usage or reservations); 0 when nothing runs",
            holding_pods.clone(),
        );
        let gangs = Family::<PhaseLabels, Gauge>::default();
        operator.register("gangs", "GangGroups by phase", gangs.clone());
        // Every phase is served from the start, at 0 until the gang controller counts.
        for phase in GANG_PHASES {
            gangs
                .get_or_create(&PhaseLabels {
                    phase: phase.into(),
                })
                .set(0);
        }
        let preemptions = Counter::default();
        operator.register(
            "preemptions",
            "Preemptions decided: pods of lower priority evicted to make room for a pod",
            preemptions.clone(),
        );
        let preemption_victims = Counter::default();
        operator.register(
            "preemption_victims",
            "Pods evicted by preemption",
            preemption_victims.clone(),
        );
        let ledger = LedgerSlot::default();
        operator.register_collector(Box::new(LedgerView(ledger.clone())));
        Metrics {
            ledger,
            registry,
            attempts,
            decision_seconds,
            create_to_bound_seconds,
            binding_seconds,
            queue_depth,
            holding_pods,
            gangs,
            preemptions,
            preemption_victims,
            ready: AtomicBool::new(false),
        }
    }

    /// Counts one scheduling attempt.
    pub fn attempt(&self, result: AttemptResult) {
        self.attempts.get_or_create(&ResultLabels { result }).inc();
    }

    /// Counts one preemption and its victims.
    pub fn preemption(&self, victims: usize) {
        self.preemptions.inc();
        self.preemption_victims
            .inc_by(u64::try_from(victims).unwrap_or(u64::MAX));
    }

    /// Sets how many gangs are in `phase`.
    pub fn set_gangs(&self, phase: &str, count: i64) {
        self.gangs
            .get_or_create(&PhaseLabels {
                phase: phase.into(),
            })
            .set(count);
    }

    /// Serves the ledger from `source` (the watched state), read at each scrape.
    pub fn attach_ledger(&self, source: LedgerSource) {
        let _ = self.ledger.0.set(source);
    }

    /// Marks the operator ready (after the first full sync).
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Relaxed);
    }

    fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// Serves the endpoints on `listener` until the task is dropped.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready_handler))
        .with_state(metrics);
    axum::serve(listener, app).await
}

async fn metrics_handler(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    match metrics.encode() {
        Ok(text) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        ),
        Err(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain")],
            "encoding failed".into(),
        ),
    }
}

async fn ready_handler(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    if metrics.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not synced yet")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_build_is_named_beside_the_operator_s_families() {
        let text = Metrics::new().encode().expect("encodes");
        let build = format!(
            "runtimekit_build_info{{version=\"{}\",component=\"operator\"}} 1",
            env!("CARGO_PKG_VERSION")
        );
        assert!(text.contains(&build), "{text}");
        assert!(text.contains("runtimekit_operator_queue_depth 0"), "{text}");
        assert!(
            text.contains("runtimekit_operator_gangs{phase=\"Running\"} 0"),
            "{text}"
        );
    }
}
