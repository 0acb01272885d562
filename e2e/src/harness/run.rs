//! One test run: the control plane every test shares, a namespace and a context per test, a
//! failure report when a test fails, and the processes of earlier runs stopped when their
//! harness died.

use super::context::TestContext;
use crate::cluster::{Cluster, ClusterOptions, stop_recorded};
use anyhow::{Context, Result};
use futures::FutureExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::PostParams;
use kube::{Api, Client};
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The prefix of every harness run directory under the temp dir.
const RUN_DIR_PREFIX: &str = "runtimekit-e2e-";
/// The folder of a run directory whose PID file names the processes tests started.
const PROCESSES_DIR: &str = "processes";

/// One test run: the control plane every test shares, and the runtime tests run on.
pub struct Harness {
    cluster: Arc<Mutex<Option<Cluster>>>,
    client: Client,
    kubeconfig: PathBuf,
    kubectl: PathBuf,
    dir: PathBuf,
    runtime: tokio::runtime::Runtime,
    failures: AtomicUsize,
    counter: AtomicUsize,
}

impl Harness {
    /// Starts the control plane for this run, after stopping what killed earlier runs left
    /// behind. The processes are stopped by [`Harness::finish`], or by the signal handler when
    /// the run is interrupted.
    pub fn start() -> Result<Arc<Harness>> {
        reap_abandoned_runs();
        let dir = std::env::temp_dir().join(format!("{RUN_DIR_PREFIX}{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("owner"), std::process::id().to_string())?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?;
        let started = Instant::now();
        let cluster_dir = dir.join("cluster");
        // Installed before anything starts: every component is recorded as it is spawned, so an
        // interrupt during the start (or a first build of the tools) stops what is up so far.
        let (processes_dir, recorded) = (dir.join(PROCESSES_DIR), cluster_dir.clone());
        ctrlc::set_handler(move || {
            eprintln!("interrupted: stopping the control plane");
            let _ = stop_recorded(&processes_dir);
            let _ = stop_recorded(&recorded);
            std::process::exit(130);
        })?;
        let cluster = runtime.block_on(Cluster::start(ClusterOptions {
            dir: cluster_dir.clone(),
            detached: false,
            // kube-scheduler places the pods that carry ResourceClaims or name no scheduler
            // (pods of the kit's own scheduler, or of "none", it leaves alone).
            kube_scheduler: true,
            profiling: false,
            jobs_keep_running: false,
            node_lease_seconds: crate::cluster::NODE_LEASE_SECONDS,
        }))?;
        eprintln!(
            "control plane ready in {:.1} s ({})",
            started.elapsed().as_secs_f64(),
            dir.display()
        );
        let client = runtime.block_on(cluster.client())?;
        Ok(Arc::new(Harness {
            kubeconfig: cluster.kubeconfig.clone(),
            kubectl: cluster.tools.kubectl(),
            cluster: Arc::new(Mutex::new(Some(cluster))),
            client,
            dir,
            runtime,
            failures: AtomicUsize::new(0),
            counter: AtomicUsize::new(0),
        }))
    }

    /// Makes trials of `tests`: each gets its own namespace, and on failure the namespace's
    /// objects and the components' logs are printed. Without a harness (`--list`), the trials
    /// only carry their names.
    pub fn trials(harness: Option<&Arc<Self>>, tests: &[Test]) -> Vec<libtest_mimic::Trial> {
        tests
            .iter()
            .map(|test| {
                let (name, run) = (test.name, test.run);
                let harness = harness.cloned();
                libtest_mimic::Trial::test(name, move || match &harness {
                    Some(h) => h.run(name, run).map_err(|e| format!("{e:#}").into()),
                    None => Ok(()),
                })
            })
            .collect()
    }

    fn run(&self, name: &str, test: TestFn) -> Result<()> {
        self.runtime.block_on(async {
            let n = self.counter.fetch_add(1, Ordering::Relaxed);
            let namespace = format!("e2e-{n}-{}", name.replace('_', "-"))
                .chars()
                .take(63)
                .collect::<String>();
            let namespace = namespace.trim_end_matches('-').to_owned();
            let ctx = self
                .create_context(&namespace, self.dir.join(format!("t{n}")))
                .await?;
            let outcome = AssertUnwindSafe(test(ctx.clone())).catch_unwind().await;
            let result = match outcome {
                Ok(result) => result,
                Err(panic) => Err(anyhow::anyhow!("panicked: {}", panic_message(&panic))),
            };
            if result.is_err() {
                self.failures.fetch_add(1, Ordering::Relaxed);
                eprintln!("{}", ctx.dump().await);
                if let Some(cluster) = self.cluster.lock().ok().as_ref().and_then(|c| c.as_ref()) {
                    eprintln!("{}", cluster.log_tails(20));
                }
            }
            ctx.cleanup().await;
            result
        })
    }

    /// The admin client.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// Stops the control plane; keeps its directory (logs) when a test failed.
    pub fn finish(&self) {
        if let Some(mut cluster) = self.cluster.lock().ok().and_then(|mut c| c.take()) {
            cluster.stop();
        }
        if self.failures.load(Ordering::Relaxed) == 0 {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!(
                "the control plane's logs are kept in {}",
                self.dir.join("cluster/logs").display()
            );
        }
    }

    /// Creates a test's namespace and its context.
    async fn create_context(&self, namespace: &str, scratch: PathBuf) -> Result<TestContext> {
        let ns: Namespace =
            serde_json::from_value(serde_json::json!({"metadata": {"name": namespace}}))?;
        Api::<Namespace>::all(self.client())
            .create(&PostParams::default(), &ns)
            .await
            .context("creating the test namespace")?;
        Ok(TestContext {
            client: self.client(),
            namespace: namespace.into(),
            kubeconfig: self.kubeconfig.clone(),
            kubectl: self.kubectl.clone(),
            nodes: Arc::default(),
            cluster: self.cluster.clone(),
            scratch,
            processes_dir: self.dir.join(PROCESSES_DIR),
            processes: Arc::default(),
        })
    }
}

impl std::fmt::Debug for Harness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Harness")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

/// An end-to-end test: an async function of its context.
pub type TestFn = fn(TestContext) -> futures::future::BoxFuture<'static, Result<()>>;

/// A named end-to-end test; build a list of them with [`tests!`](crate::tests).
#[derive(Debug, Clone, Copy)]
pub struct Test {
    /// The test's name.
    pub name: &'static str,
    /// The test.
    pub run: TestFn,
}

/// A `&[Test]` of async test functions, each named after its function.
#[macro_export]
macro_rules! tests {
    ($($test:ident),* $(,)?) => {
        &[$($crate::harness::Test { name: stringify!($test), run: |ctx| Box::pin($test(ctx)) }),*]
    };
}

/// Stops the processes of earlier runs whose harness died without stopping them.
fn reap_abandoned_runs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let is_run = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(RUN_DIR_PREFIX));
        let owner = std::fs::read_to_string(path.join("owner"))
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok());
        let Some(owner) = owner.filter(|_| is_run) else {
            continue;
        };
        if !Path::new(&format!("/proc/{owner}")).exists() {
            let _ = stop_recorded(&path.join(PROCESSES_DIR));
            match stop_recorded(&path.join("cluster")) {
                Ok(n) if n > 0 => eprintln!(
                    "stopped {n} processes left by an earlier run in {}",
                    path.display()
                ),
                _ => {}
            }
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "unknown panic".into())
}
