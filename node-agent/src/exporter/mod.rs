//! The exporter: `/metrics` in Prometheus text format on its own listener (`:9501` by default),
//! with dcgm-exporter's card families, each slice's container families and the health families
//! (see `families`). A collector samples the node on an interval (`collect`) and a scrape
//! serves the last sample: no scrape calls the resource layer, NVML or the apiserver.

pub mod collect;
pub mod families;
pub mod holdings;
mod pids;
pub mod switch;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use families::Family;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::family::Family as LabelledFamily;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::{Arc, RwLock};

/// The last sample of the node, as metric families, or why the exporter is switched off.
#[derive(Debug, Default)]
pub struct Snapshot {
    families: RwLock<Vec<Family>>,
    switched_off: RwLock<Option<String>>,
}

impl Snapshot {
    /// Replaces the sample a scrape serves.
    pub fn set(&self, families: Vec<Family>) {
        match self.families.write() {
            Ok(mut now) => *now = families,
            Err(poisoned) => *poisoned.into_inner() = families,
        }
    }

    /// Switches the exporter off (`Some(why)`: the sample is dropped and a scrape is told why)
    /// or on again.
    pub fn switch_off(&self, why: Option<String>) {
        if why.is_some() {
            self.set(Vec::new());
        }
        match self.switched_off.write() {
            Ok(mut now) => *now = why,
            Err(poisoned) => *poisoned.into_inner() = why,
        }
    }

    /// Why the exporter is switched off, if it is.
    pub fn off(&self) -> Option<String> {
        match self.switched_off.read() {
            Ok(why) => why.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }
}

/// The snapshot as a prometheus-client collector.
#[derive(Debug)]
struct View(Arc<Snapshot>);

impl Collector for View {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let families = match self.0.families.read() {
            Ok(f) => f,
            Err(poisoned) => poisoned.into_inner(),
        };
        for family in families.iter().filter(|f| !f.samples.is_empty()) {
            let mut metric =
                encoder.encode_descriptor(family.name, family.help, None, MetricType::Gauge)?;
            for sample in &family.samples {
                metric
                    .encode_family(&sample.labels)?
                    .encode_gauge(&sample.value)?;
            }
        }
        Ok(())
    }
}

/// What `/metrics` renders.
#[derive(Debug)]
pub struct Exporter {
    registry: Registry,
    snapshot: Arc<Snapshot>,
}

impl Exporter {
    /// An exporter serving `snapshot`.
    pub fn new(snapshot: Arc<Snapshot>) -> Exporter {
        let mut registry = Registry::default();
        // A gauge of 1, not an OpenMetrics info: the classic text format (what promtool and
        // DCGM's users read) has no `info` type, and promtool refuses the whole scrape.
        let build = LabelledFamily::<Vec<(String, String)>, Gauge>::default();
        build
            .get_or_create(&vec![
                ("version".to_owned(), env!("CARGO_PKG_VERSION").to_owned()),
                ("component".to_owned(), "node-agent".to_owned()),
            ])
            .set(1);
        registry.register(
            "runtimekit_build_info",
            "The kit's version and this component",
            build,
        );
        registry.register_collector(Box::new(View(snapshot.clone())));
        Exporter { registry, snapshot }
    }

    /// The text a scrape gets.
    pub fn render(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

/// Serves `/metrics` on `listener` until the task is dropped.
pub async fn serve(
    listener: tokio::net::TcpListener,
    exporter: Arc<Exporter>,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .with_state(exporter);
    axum::serve(listener, app).await
}

async fn metrics(State(exporter): State<Arc<Exporter>>) -> impl IntoResponse {
    if let Some(why) = exporter.snapshot.off() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            format!("the exporter is switched off on this node: {why}\n"),
        );
    }
    match exporter.render() {
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

#[cfg(test)]
mod tests {
    use super::*;
    use families::Sample;

    fn snapshot() -> Arc<Snapshot> {
        let snapshot = Arc::new(Snapshot::default());
        let labels = |gpu: &str| {
            vec![
                ("gpu", gpu.to_owned()),
                ("UUID", format!("GPU-{gpu}")),
                ("modelName", "NVIDIA H800".to_owned()),
                ("Hostname", "n1".to_owned()),
            ]
        };
        snapshot.set(vec![
            Family {
                name: "DCGM_FI_DEV_GPU_TEMP",
                help: "GPU temperature (in C).",
                samples: vec![
                    Sample {
                        labels: labels("0"),
                        value: 41.0,
                    },
                    Sample {
                        labels: labels("1"),
                        value: 39.5,
                    },
                ],
            },
            Family {
                name: "DCGM_FI_CONTAINER_FB_USED",
                help: "Card memory the container's processes use (in MiB).",
                samples: Vec::new(),
            },
        ]);
        snapshot
    }

    #[test]
    fn a_scrape_renders_the_last_sample() {
        let snapshot = snapshot();
        let exporter = Exporter::new(snapshot.clone());
        let text = exporter.render().expect("render");
        assert!(text.contains("# TYPE DCGM_FI_DEV_GPU_TEMP gauge"), "{text}");
        assert!(
            text.contains(r#"DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-0",modelName="NVIDIA H800",Hostname="n1"} 41.0"#),
            "{text}"
        );
        assert!(
            !text.contains("DCGM_FI_CONTAINER_FB_USED"),
            "an empty family is left out"
        );
        snapshot.set(Vec::new());
        assert!(
            !exporter
                .render()
                .expect("render")
                .contains("DCGM_FI_DEV_GPU_TEMP")
        );
    }

    #[test]
    fn the_build_is_named_beside_the_card_metrics() {
        let text = Exporter::new(snapshot()).render().expect("render");
        let line = format!(
            r#"runtimekit_build_info{{version="{}",component="node-agent"}} 1"#,
            env!("CARGO_PKG_VERSION")
        );
        assert!(text.contains(&line), "{text}");
    }

    #[test]
    fn switching_off_drops_the_sample_and_says_why() {
        let snapshot = snapshot();
        let exporter = Exporter::new(snapshot.clone());
        snapshot.switch_off(Some("the node is labelled x=false".into()));
        assert_eq!(
            snapshot.off().as_deref(),
            Some("the node is labelled x=false")
        );
        assert!(!exporter.render().expect("render").contains("DCGM_"));
        snapshot.switch_off(None);
        assert_eq!(snapshot.off(), None);
    }
}
