//! Wires the agent's tasks together and runs them until a signal.

use crate::deviceplugin::DevicePlugins;
use crate::dra;
use crate::enactor::Enactor;
use crate::exporter::{self, Exporter, Snapshot};
use crate::layer::{InventoryRefresher, Layer, LayerError, Source, watch_health};
use crate::model::NodeState;
use crate::node_watch;
use crate::podresources;
use crate::process::{client, signal};
use crate::reporter::Reporter;
use crate::resources::{advertised, summary};
use kube::Client;
use kube::runtime::events::{Recorder, Reporter as EventReporter};
use runtimekit_contract::RuntimeKitConfig;
use runtimekit_lj_runtime::config::RuntimeConfig;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

/// The controller name the agent's Events carry.
pub const EVENT_CONTROLLER: &str = "runtimekit-node-agent";
/// How often the kubelet's pod resources are read.
const POD_RESOURCES_INTERVAL: Duration = Duration::from_secs(2);
/// How often the node installer's status is read.
const INSTALL_STATUS_INTERVAL: Duration = Duration::from_secs(2);

/// How the agent runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// This node.
    pub node_name: String,
    /// A kubeconfig; the in-cluster configuration without one.
    pub kubeconfig: Option<PathBuf>,
    /// The shared configuration.
    pub config: RuntimeKitConfig,
    /// Where the resource layer is.
    pub layer: Source,
    /// How long to wait at start for the resource layer's socket to appear.
    pub layer_wait: Duration,
    /// The kubelet's device-plugin folder.
    pub kubelet_dir: PathBuf,
    /// The kubelet's pod-resources socket.
    pub pod_resources_socket: PathBuf,
    /// How often the TopologyGroup heartbeat is written.
    pub heartbeat: Duration,
    /// How often everything is looked at without a change.
    pub resync: Duration,
    /// Whether the device plugin is served.
    pub device_plugin: bool,
    /// Where the exporter serves `/metrics`; not served when `None`.
    pub metrics: Option<std::net::SocketAddr>,
    /// How often the exporter samples the node.
    pub metrics_interval: Duration,
    /// Where processes' cgroups are read.
    pub proc_root: PathBuf,
    /// The node installer's status file; the node is taken as set up by hand without one.
    pub runtime_status: Option<PathBuf>,
    /// Where the DRA driver keeps its files (used when the node is moved to DRA).
    pub dra: DraPaths,
}

/// Where the DRA driver's files go.
#[derive(Debug, Clone)]
pub struct DraPaths {
    /// The kubelet's plugin-registration folder.
    pub registry_dir: PathBuf,
    /// The kubelet's plugins folder (the driver's socket goes in `<driver>/` under it).
    pub plugins_dir: PathBuf,
    /// The container runtime's CDI folder.
    pub cdi_dir: PathBuf,
    /// The checkpoint of prepared claims.
    pub checkpoint: PathBuf,
    /// lj-runtime's settings, whose isolation library, state folder and core policy claims'
    /// shares get too.
    pub lj_runtime_config: PathBuf,
}

/// Why the agent stopped.
#[derive(Debug, Error)]
pub enum AgentError {
    /// The resource layer cannot be used.
    #[error(transparent)]
    Layer(#[from] LayerError),
    /// No client for the apiserver.
    #[error("cannot build the Kubernetes client: {0}")]
    Kube(String),
    /// The exporter cannot serve.
    #[error("exporter: {0}")]
    Metrics(String),
    /// A task ended, which none should.
    #[error("the {0} task ended unexpectedly")]
    TaskEnded(&'static str),
    /// The DRA driver cannot start.
    #[error("DRA driver: {0}")]
    Dra(String),
    /// The node's device-API label changed: the agent starts again serving the other API.
    #[error("the node's device-API label changed; restart to serve the other")]
    DeviceApiChanged,
}

fn spawn(
    tasks: &mut JoinSet<&'static str>,
    name: &'static str,
    task: impl Future<Output = ()> + Send + 'static,
) {
    tasks.spawn(async move {
        task.await;
        name
    });
}

/// Starts the DRA side of a node moved to DRA: the ResourceSlice publisher and the kubelet
/// plugin.
fn start_dra(
    tasks: &mut JoinSet<&'static str>,
    options: &Options,
    client: &Client,
    layer: &Layer,
    state: &watch::Sender<NodeState>,
    inventory: &InventoryRefresher,
    facts: &node_watch::Facts,
) -> Result<(), AgentError> {
    let driver = runtimekit_contract::dra::driver_name(&options.config.resource_prefix);
    let runtime = RuntimeConfig::load(&options.dra.lj_runtime_config).map_err(AgentError::Dra)?;
    let paths = dra::plugin::Paths {
        registry_dir: options.dra.registry_dir.clone(),
        plugin_dir: options.dra.plugins_dir.join(&driver),
        cdi_dir: options.dra.cdi_dir.clone(),
        checkpoint: options.dra.checkpoint.clone(),
        isolation_library: runtime.isolation_library,
        isolation_state_dir: runtime.isolation_state_dir,
        core_policy: runtime.core_policy,
    };
    let plugin = dra::plugin::Driver::new(dra::plugin::Settings {
        client: client.clone(),
        node: options.node_name.clone(),
        driver: driver.clone(),
        paths,
        layer: layer.client.clone(),
        state: state.clone(),
        inventory: inventory.clone(),
    })
    .map_err(AgentError::Dra)?;
    tracing::info!(%driver, "the node's cards are given through DRA");
    spawn(
        tasks,
        "dra-publisher",
        dra::publisher::Publisher {
            client: client.clone(),
            node: options.node_name.clone(),
            driver,
            config: options.config.clone(),
            state: state.subscribe(),
            facts: facts.clone(),
            resync: options.resync,
        }
        .run(),
    );
    spawn(tasks, "dra-plugin", plugin.run());
    Ok(())
}

/// Runs the agent until SIGTERM or SIGINT.
pub async fn run(options: Options) -> Result<(), AgentError> {
    let layer = Layer::open(&options.layer, options.layer_wait).await?;
    tracing::info!(
        socket = %layer.socket.display(),
        backend = ?layer.info.backend(),
        profile = %layer.info.profile,
        cards = layer.info.device_count,
        "reached the resource layer"
    );
    let client = client(options.kubeconfig.as_deref())
        .await
        .map_err(AgentError::Kube)?;
    let node = options.node_name.clone();
    let (state, state_rx) = watch::channel(NodeState::default());
    let inventory =
        InventoryRefresher::new(layer.client.clone(), state.clone(), layer.info.device_count);
    let (transitions, transitions_rx) = mpsc::channel(256);
    let recorder = Recorder::new(
        client.clone(),
        EventReporter {
            controller: EVENT_CONTROLLER.into(),
            instance: Some(node.clone()),
        },
    );
    let resources = advertised(&options.config);
    let mut tasks = JoinSet::new();
    spawn(
        &mut tasks,
        "inventory",
        inventory.clone().run(options.resync),
    );
    spawn(
        &mut tasks,
        "health",
        watch_health(
            layer.client.clone(),
            state.clone(),
            transitions,
            inventory.clone(),
        ),
    );
    spawn(
        &mut tasks,
        "enactor",
        Enactor {
            client: client.clone(),
            node: node.clone(),
            layer: layer.client.clone(),
            state: state.clone(),
            inventory: inventory.clone(),
            recorder: recorder.clone(),
            resync: options.resync,
        }
        .run(),
    );
    let (facts_tx, mut facts) = node_watch::channel();
    spawn(
        &mut tasks,
        "node-watch",
        node_watch::follow(client.clone(), node.clone(), facts_tx),
    );
    spawn(
        &mut tasks,
        "reporter",
        Reporter {
            client: client.clone(),
            node: node.clone(),
            config: options.config.clone(),
            state: state_rx.clone(),
            transitions: transitions_rx,
            recorder,
            heartbeat: options.heartbeat,
            node_facts: facts.clone(),
        }
        .run(),
    );
    if let Some(path) = &options.runtime_status {
        spawn(
            &mut tasks,
            "install-status",
            crate::runtime_status::follow(path.clone(), state.clone(), INSTALL_STATUS_INTERVAL),
        );
        // The cards are offered to the kubelet only once containerd runs the handler.
        tokio::select! {
            () = signal() => {
                tracing::info!("stopping");
                tasks.abort_all();
                layer.close().await;
                return Ok(());
            }
            () = crate::runtime_status::ready(state_rx.clone()) => {}
        }
    }
    let names = options.config.names();
    if facts.borrow().is_none() {
        tracing::info!(%node, "waiting to see the node to learn its device API");
    }
    let Some(dra) = dra::mode::read(&mut facts, &names.device_api_label).await else {
        return Err(AgentError::TaskEnded("node-watch"));
    };
    if dra {
        start_dra(
            &mut tasks, &options, &client, &layer, &state, &inventory, &facts,
        )?;
    }
    spawn(
        &mut tasks,
        "device-api",
        dra::mode::until_changed(facts.clone(), names.device_api_label, dra),
    );
    // On a DRA node whole cards are claimed, never requested by count. (Cards pods already
    // hold whole through the device plugin are still read from the kubelet, below.)
    let served: Vec<_> = resources
        .iter()
        .filter(|r| !(dra && r.kind.whole()))
        .cloned()
        .collect();
    let whole: Vec<String> = resources
        .iter()
        .filter(|r| r.kind.whole())
        .map(|r| r.name.clone())
        .collect();
    if options.device_plugin {
        spawn(
            &mut tasks,
            "pod-resources",
            podresources::poll(
                options.pod_resources_socket.clone(),
                state.clone(),
                whole.clone(),
                POD_RESOURCES_INTERVAL,
            ),
        );
        spawn(
            &mut tasks,
            "device-plugin",
            DevicePlugins {
                dir: options.kubelet_dir.clone(),
                resources: served.clone(),
                state: state_rx.clone(),
                pod_resources: Some(options.pod_resources_socket.clone()),
            }
            .run(),
        );
    }
    if let Some(address) = options.metrics {
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .map_err(|e| AgentError::Metrics(format!("cannot listen on {address}: {e}")))?;
        tracing::info!(address = %listener.local_addr().unwrap_or(address), "serving /metrics");
        let snapshot = Arc::new(Snapshot::default());
        spawn(
            &mut tasks,
            "exporter-collector",
            exporter::collect::Collector {
                node: node.clone(),
                driver_version: layer.info.driver_version.clone(),
                layer: layer.client.clone(),
                state: state_rx.clone(),
                snapshot: snapshot.clone(),
                interval: options.metrics_interval,
                proc_root: options.proc_root.clone(),
            }
            .run(),
        );
        spawn(
            &mut tasks,
            "exporter-switch",
            exporter::switch::follow(
                facts.clone(),
                names.exporter_switch_label.clone(),
                snapshot.clone(),
            ),
        );
        let exporter = Arc::new(Exporter::new(snapshot));
        spawn(&mut tasks, "exporter", async move {
            if let Err(error) = exporter::serve(listener, exporter).await {
                tracing::error!(%error, "the exporter stopped");
            }
        });
    }
    let config = options.config.clone();
    let mut first = state_rx.clone();
    tokio::spawn(async move {
        if let Ok(state) = first.wait_for(|s| s.inventory.is_some()).await {
            for (resource, (capacity, allocatable)) in summary(&config, &state) {
                if dra && whole.contains(&resource) {
                    continue;
                }
                tracing::info!(%resource, capacity, allocatable, "advertising");
            }
        }
    });
    let outcome = tokio::select! {
        () = signal() => {
            tracing::info!("stopping");
            Ok(())
        }
        ended = tasks.join_next() => match ended {
            Some(Ok("device-api")) => Err(AgentError::DeviceApiChanged),
            Some(Ok(name)) => Err(AgentError::TaskEnded(name)),
            Some(Err(join)) => {
                tracing::error!(%join, "a task failed");
                Err(AgentError::TaskEnded("agent"))
            }
            None => Ok(()),
        },
    };
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    layer.close().await;
    outcome
}
