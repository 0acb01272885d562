//! The resource layer, the agent's only way to the hardware: reaching it (a socket, or a
//! simulated server the agent starts in-process on a socket of its own), keeping the card
//! inventory fresh, and following the health stream.

use crate::health::{FaultState, Transition};
use crate::model::NodeState;
use runtimekit_proto::resource::v1alpha1 as pb;
use runtimekit_proto::resource::v1alpha1::resource_layer_client::ResourceLayerClient;
use runtimekit_resource_layer::{
    ServeOptions, ServerHandle, SimOptions, SimulatedBackend, connect, connect_lazy, serve,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;
use tokio::sync::{Mutex, Notify, mpsc, watch};
use tonic::transport::Channel;

/// How long one listing may take before it is abandoned.
const LIST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the agent waits for the resource layer to answer at start.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the resource layer is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// A resource-layer server listening on this socket.
    Socket(PathBuf),
    /// A simulated resource layer the agent serves itself on `<state_dir>/resource-layer.sock`,
    /// with its instances kept in a state file there, so they survive an agent restart.
    Simulate {
        /// A shipped profile name or a profile file.
        profile: String,
        /// Where the socket and the state file go.
        state_dir: PathBuf,
        /// The node (simulated card UUIDs derive from it).
        node_name: String,
    },
}

/// Why the resource layer cannot be used.
#[derive(Debug, Error)]
pub enum LayerError {
    /// Nothing is at the socket.
    #[error(
        "no resource layer at {0}: the socket does not exist (start `runtimekit-resource-layer serve`, or pass --simulate <profile>)"
    )]
    Missing(String),
    /// The socket does not answer.
    #[error("cannot reach the resource layer at {path}: {message}")]
    Unreachable {
        /// The socket.
        path: String,
        /// What went wrong.
        message: String,
    },
    /// The simulated backend cannot start.
    #[error("cannot start the simulated resource layer: {0}")]
    Simulate(String),
}

/// A reachable resource layer.
#[derive(Debug)]
pub struct Layer {
    /// A client that reconnects when the server restarts.
    pub client: ResourceLayerClient<Channel>,
    /// Its socket.
    pub socket: PathBuf,
    /// What it said about itself.
    pub info: pb::GetInfoResponse,
    server: Option<ServerHandle>,
}

impl Layer {
    /// Reaches the resource layer, starting the simulated one first when asked to; a socket
    /// that does not exist yet is waited for up to `wait` (the resource layer may start a moment
    /// after the agent).
    pub async fn open(source: &Source, wait: Duration) -> Result<Layer, LayerError> {
        let (socket, server) = match source {
            Source::Socket(path) => {
                let deadline = tokio::time::Instant::now() + wait;
                while !path.exists() {
                    if tokio::time::Instant::now() >= deadline {
                        return Err(LayerError::Missing(path.display().to_string()));
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                (path.clone(), None)
            }
            Source::Simulate {
                profile,
                state_dir,
                node_name,
            } => {
                let (socket, server) = simulate(profile, state_dir, node_name).await?;
                (socket, Some(server))
            }
        };
        let unreachable = |message: String| LayerError::Unreachable {
            path: socket.display().to_string(),
            message,
        };
        let channel = tokio::time::timeout(CONNECT_TIMEOUT, connect(&socket))
            .await
            .map_err(|_| unreachable(format!("no answer within {CONNECT_TIMEOUT:?}")))?
            .map_err(|e| unreachable(error_chain(&e)))?;
        let mut probe = ResourceLayerClient::new(channel);
        let info = tokio::time::timeout(CONNECT_TIMEOUT, probe.get_info(pb::GetInfoRequest {}))
            .await
            .map_err(|_| unreachable(format!("GetInfo did not answer within {CONNECT_TIMEOUT:?}")))?
            .map_err(|s| unreachable(s.message().to_owned()))?
            .into_inner();
        Ok(Layer {
            client: ResourceLayerClient::new(connect_lazy(&socket)),
            socket,
            info,
            server,
        })
    }

    /// Stops the in-process simulated server, if there is one.
    pub async fn close(self) {
        if let Some(server) = self.server {
            // Streams of clients still connected would keep a graceful stop waiting.
            let _ = tokio::time::timeout(Duration::from_secs(2), server.shutdown()).await;
        }
    }
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        message.push_str(": ");
        message.push_str(&e.to_string());
        source = e.source();
    }
    message
}

async fn simulate(
    profile: &str,
    state_dir: &Path,
    node_name: &str,
) -> Result<(PathBuf, ServerHandle), LayerError> {
    std::fs::create_dir_all(state_dir)
        .map_err(|e| LayerError::Simulate(format!("cannot create {}: {e}", state_dir.display())))?;
    let loaded = runtimekit_resource_layer::SimProfile::load(profile)
        .map_err(|e| LayerError::Simulate(e.to_string()))?;
    let state_file = state_dir.join(format!("simulated-{}.json", loaded.name));
    let backend = SimulatedBackend::new(
        loaded,
        SimOptions {
            node_name: node_name.to_owned(),
            state_file: Some(state_file),
            ..SimOptions::default()
        },
    )
    .map_err(|e| LayerError::Simulate(e.to_string()))?;
    let socket = state_dir.join("resource-layer.sock");
    let server = serve(Arc::new(backend), &socket, ServeOptions::default())
        .await
        .map_err(|e| LayerError::Simulate(e.to_string()))?;
    Ok((socket, server))
}

/// Keeps the inventory in the node state fresh. Listings are serialised, so an older answer
/// never lands after a newer one; cards whose calls hang are left out (their listing would hang
/// too) and keep their last known state.
#[derive(Debug, Clone)]
pub struct InventoryRefresher {
    client: ResourceLayerClient<Channel>,
    state: watch::Sender<NodeState>,
    count: u32,
    lock: Arc<Mutex<()>>,
    wake: Arc<Notify>,
}

impl InventoryRefresher {
    /// An inventory refresher for a resource layer with `count` cards.
    pub fn new(
        client: ResourceLayerClient<Channel>,
        state: watch::Sender<NodeState>,
        count: u32,
    ) -> Self {
        Self {
            client,
            state,
            count,
            lock: Arc::default(),
            wake: Arc::default(),
        }
    }

    /// Lists the cards now; returns whether the listing succeeded.
    pub async fn refresh(&self) -> bool {
        let _serial = self.lock.lock().await;
        let hanging: Vec<u32> = {
            let state = self.state.borrow();
            (0..self.count)
                .filter(|&i| state.faults.hanging(i))
                .collect()
        };
        let listed: Vec<u32> = if hanging.is_empty() {
            Vec::new()
        } else {
            (0..self.count).filter(|i| !hanging.contains(i)).collect()
        };
        if !hanging.is_empty() && listed.is_empty() {
            return false;
        }
        let mut request = tonic::Request::new(pb::ListDevicesRequest {
            device_indexes: listed.clone(),
        });
        request.set_timeout(LIST_TIMEOUT);
        let mut client = self.client.clone();
        match client.list_devices(request).await {
            Ok(response) => {
                let response = response.into_inner();
                for error in &response.errors {
                    tracing::warn!(card = error.device_index, reason = %error.reason, "{}", error.message);
                }
                self.state.send_if_modified(|state| {
                    let mut inventory = state.inventory.clone().unwrap_or_default();
                    inventory.merge(response, &listed);
                    let changed = state.inventory.as_ref() != Some(&inventory);
                    state.inventory = Some(inventory);
                    changed
                });
                true
            }
            Err(status) => {
                tracing::warn!(error = %status.message(), code = ?status.code(), "listing the cards failed");
                false
            }
        }
    }

    /// Asks the background task to list the cards soon.
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Lists the cards every `interval`, and whenever woken.
    pub async fn run(self, interval: Duration) {
        loop {
            self.refresh().await;
            tokio::select! {
                () = tokio::time::sleep(interval) => {}
                () = self.wake.notified() => {}
            }
        }
    }
}

/// Follows the resource layer's health stream into the node state, resubscribing when it ends;
/// sends every card that turns unhealthy or healthy to `transitions`, and wakes the
/// inventory refresher on every change.
pub async fn watch_health(
    client: ResourceLayerClient<Channel>,
    state: watch::Sender<NodeState>,
    transitions: mpsc::Sender<Transition>,
    inventory: InventoryRefresher,
) {
    let apply = |next: FaultState| {
        let before = state.borrow().faults.clone();
        let turned = next.transitions_from(&before);
        state.send_if_modified(|s| {
            let changed = s.faults != next;
            s.faults = next;
            changed
        });
        turned
    };
    let mut delay = Duration::from_millis(200);
    loop {
        let mut client = client.clone();
        match client.watch_health(pb::WatchHealthRequest {}).await {
            Ok(response) => {
                let mut stream = response.into_inner();
                loop {
                    match stream.message().await {
                        Ok(Some(message)) => {
                            delay = Duration::from_millis(200);
                            let mut next = state.borrow().faults.clone();
                            match message.message {
                                Some(pb::watch_health_response::Message::Snapshot(s)) => {
                                    next = FaultState::from_snapshot(&s);
                                }
                                Some(pb::watch_health_response::Message::Event(e)) => {
                                    next.apply(&e);
                                }
                                None => continue,
                            }
                            for transition in apply(next) {
                                let _ = transitions.send(transition).await;
                            }
                            inventory.wake();
                        }
                        Ok(None) => {
                            tracing::info!("the health stream ended; subscribing again");
                            break;
                        }
                        Err(status) => {
                            tracing::warn!(error = %status.message(), "the health stream failed; subscribing again");
                            break;
                        }
                    }
                }
            }
            Err(status) => {
                tracing::warn!(error = %status.message(), "cannot subscribe to the health stream");
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(10));
    }
}
