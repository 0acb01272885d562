//! `run`: the operator process. Every replica watches and keeps its state warm; only the Lease
//! holder schedules and reconciles. A holder that loses the Lease exits, so a standby that takes
//! over never races a stale leader.

use crate::leader::{Elector, Timing};
use crate::metrics::{self, Metrics};
use crate::shared::Shared;
use crate::state::{Feed, State};
use crate::watch::mirror;
use crate::writes::report::Reports;
use crate::{gangs, scheduler, slices, topology_sync};
use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Node, Pod, ResourceQuota};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Client;
use kube::api::Api;
use kube::runtime::watcher;
use runtimekit_contract::RuntimeKitConfig;
use runtimekit_crds::{GangGroup, GpuSlice, TopologyGroup};
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinSet;

/// How the operator runs.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The shared configuration file; defaults apply without it.
    pub config: Option<std::path::PathBuf>,
    /// Where [`run`] serves /metrics, /healthz and /readyz ([`run_with`] takes a bound listener).
    pub listen: SocketAddr,
    /// This replica's identity in the Lease (its pod name).
    pub identity: String,
    /// The namespace of the Lease.
    pub namespace: String,
    /// The Lease's name.
    pub lease: String,
    /// The election's timing.
    pub timing: Timing,
}

/// Loads the shared configuration, or the defaults.
pub fn load_config(path: Option<&Path>) -> Result<RuntimeKitConfig> {
    let Some(path) = path else {
        return Ok(RuntimeKitConfig::default());
    };
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let config: RuntimeKitConfig =
        serde_yaml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    config
        .validate()
        .with_context(|| format!("checking {}", path.display()))?;
    Ok(config)
}

/// Runs until SIGTERM or SIGINT, or a lost Lease.
pub async fn run(options: RunOptions) -> Result<()> {
    let client = Client::try_default()
        .await
        .context("connecting to the apiserver")?;
    let listener = tokio::net::TcpListener::bind(options.listen)
        .await
        .with_context(|| format!("listening on {}", options.listen))?;
    run_with(client, options, listener, shutdown_signal()).await
}

/// Runs with `client`, serving /metrics, /healthz and /readyz on `listener` (bound by the caller,
/// so tests can take a free port without racing for it), until `shutdown` completes (then
/// releases the Lease) or the Lease is lost.
pub async fn run_with(
    client: Client,
    options: RunOptions,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    let config = load_config(options.config.as_deref())?;
    let metrics = Arc::new(Metrics::new());
    let shared = Arc::new(Shared::new(
        State::new(config.clone()),
        Arc::clone(&metrics),
    ));
    let weak = Arc::downgrade(&shared);
    metrics.attach_ledger(Box::new(move || {
        weak.upgrade()
            .map(|shared| shared.lock().ledger())
            .unwrap_or_default()
    }));

    let mut tasks = JoinSet::new();
    tasks.spawn(async move {
        metrics::serve(listener, metrics)
            .await
            .context("serving metrics")
    });
    spawn_watchers(&mut tasks, &client, &shared);

    let (leading_tx, mut leading) = watch::channel(false);
    let elector = Elector::new(
        client.clone(),
        &options.namespace,
        &options.lease,
        &options.identity,
        options.timing,
    );
    let election = elector.clone();
    tasks.spawn(async move {
        Err(anyhow::Error::new(election.run(leading_tx).await).context("leadership lost"))
    });

    // Leading starts once both hold: this replica has the Lease and every kind has been listed.
    // Waiting for either is a state of this loop, so a shutdown, a dead task or a lost Lease
    // ends the wait as it ends everything else (a missing CRD must not pin the Lease).
    let first_sync = shared.wait_synced();
    tokio::pin!(shutdown, first_sync);
    let (mut synced, mut leader, mut leading_started) = (false, false, false);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            Some(ended) = tasks.join_next() => {
                let result = ended.context("a task panicked").and_then(|r| r);
                return result.context("a task of the operator ended");
            }
            // A closed channel means the election task ended: this arm then stays quiet, and
            // the task's own error (why leadership was lost) comes from the join_next arm.
            Ok(()) = leading.changed() => {
                leader = *leading.borrow();
                if leader && !synced {
                    tracing::info!("leading: waiting for every watched kind to be listed");
                }
            }
            () = &mut first_sync, if !synced => synced = true,
        }
        if leader && synced && !leading_started {
            leading_started = true;
            start_leading(&mut tasks, &client, &shared, &config, &options);
        }
    }
    // Stop deciding, let the writes already started finish (a pod bound without its slices
    // would be repaired by the next leader, but need not be), then hand the Lease over.
    tasks.abort_all();
    tracing::info!("shutting down: finishing the writes in flight");
    let deadline = tokio::time::Instant::now() + WRITES_DRAIN;
    while shared.lock().writes_running() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tracing::info!("releasing the lease");
    elector.release().await;
    Ok(())
}

/// How long a shutdown waits for the writes of decisions already made.
const WRITES_DRAIN: Duration = Duration::from_secs(5);

/// Starts one watch per kind the state is fed from (the kinds of [`crate::shared::WATCHED`]).
fn spawn_watchers(tasks: &mut JoinSet<Result<()>>, client: &Client, shared: &Arc<Shared>) {
    spawn_watcher::<Pod>(tasks, client, shared);
    spawn_watcher::<Node>(tasks, client, shared);
    spawn_watcher::<GpuSlice>(tasks, client, shared);
    spawn_watcher::<TopologyGroup>(tasks, client, shared);
    spawn_watcher::<GangGroup>(tasks, client, shared);
    spawn_watcher::<ResourceQuota>(tasks, client, shared);
    spawn_watcher::<PodDisruptionBudget>(tasks, client, shared);
}

/// Starts the watch that feeds the state with every `K` of the cluster.
fn spawn_watcher<K>(tasks: &mut JoinSet<Result<()>>, client: &Client, shared: &Arc<Shared>)
where
    K: Feed<DynamicType = ()>,
{
    let config = watcher::Config::default().any_semantic();
    let (api, shared) = (Api::<K>::all(client.clone()), Arc::clone(shared));
    tasks.spawn(async move {
        mirror(api, config, shared).await;
        Ok(())
    });
}

/// Starts the scheduler and controllers; called once every kind has been listed, so the first
/// decision sees every existing allocation.
fn start_leading(
    tasks: &mut JoinSet<Result<()>>,
    client: &Client,
    shared: &Arc<Shared>,
    config: &RuntimeKitConfig,
    options: &RunOptions,
) {
    tracing::info!("leading: state rebuilt from the API; scheduling");
    let reports = Reports::new(client.clone(), &config.scheduler_name, &options.identity);
    let (s, c, r) = (Arc::clone(shared), client.clone(), reports.clone());
    tasks.spawn(async move {
        scheduler::run(s, c, r).await;
        Ok(())
    });
    let (s, c, r) = (Arc::clone(shared), client.clone(), reports.clone());
    tasks.spawn(async move {
        slices::run(s, c, r).await;
        Ok(())
    });
    let (s, c, r) = (Arc::clone(shared), client.clone(), reports);
    tasks.spawn(async move {
        gangs::run(s, c, r).await;
        Ok(())
    });
    let (s, c) = (Arc::clone(shared), client.clone());
    tasks.spawn(async move {
        topology_sync::run(s, c).await;
        Ok(())
    });
}

async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
}
