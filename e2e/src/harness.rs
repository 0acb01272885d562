//! Test support: one control plane per test run, a namespace per test, fake GPU nodes, waiting
//! with timeouts, and a dump of the relevant objects and logs when a test fails.

use crate::cluster::{Cluster, ClusterOptions, stop_recorded};
use anyhow::{Context, Result, bail};
use futures::FutureExt;
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use std::collections::BTreeMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The annotation kwok manages nodes by.
pub const KWOK_ANNOTATION: &str = "kwok.x-k8s.io/node";
/// The prefix of every harness run directory under the temp dir.
const RUN_DIR_PREFIX: &str = "runtimekit-e2e-";
/// The folder of a run directory whose PID file names the processes tests started.
const PROCESSES_DIR: &str = "processes";
/// How long a test's process may take to exit after SIGTERM before it is killed.
const PROCESS_STOP_TIMEOUT: Duration = Duration::from_secs(10);

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
            kube_scheduler: false,
            profiling: false,
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
            let ctx = TestContext::create(self, &namespace, self.dir.join(format!("t{n}"))).await?;
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

/// What one test works with.
#[derive(Clone)]
pub struct TestContext {
    /// An admin client.
    pub client: Client,
    /// The test's own namespace.
    pub namespace: String,
    kubeconfig: PathBuf,
    kubectl: PathBuf,
    nodes: Arc<Mutex<Vec<String>>>,
    cluster: Arc<Mutex<Option<Cluster>>>,
    scratch: PathBuf,
    processes_dir: PathBuf,
    processes: Arc<Mutex<Vec<TestProcess>>>,
}

impl std::fmt::Debug for TestContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestContext")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl TestContext {
    async fn create(harness: &Harness, namespace: &str, scratch: PathBuf) -> Result<TestContext> {
        let ns: Namespace =
            serde_json::from_value(serde_json::json!({"metadata": {"name": namespace}}))?;
        Api::<Namespace>::all(harness.client())
            .create(&PostParams::default(), &ns)
            .await
            .context("creating the test namespace")?;
        Ok(TestContext {
            client: harness.client(),
            namespace: namespace.into(),
            kubeconfig: harness.kubeconfig.clone(),
            kubectl: harness.kubectl.clone(),
            nodes: Arc::default(),
            cluster: harness.cluster.clone(),
            scratch,
            processes_dir: harness.dir.join(PROCESSES_DIR),
            processes: Arc::default(),
        })
    }

    /// The API of a namespaced kind in the test's namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
        K::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// The API of a cluster-scoped kind.
    pub fn cluster_api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::ClusterResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
        K::DynamicType: Default,
    {
        Api::all(self.client.clone())
    }

    /// Runs kubectl with `args` (in the test's namespace unless `args` names one) and returns
    /// its output, whatever the exit status.
    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Result<Output> {
        use std::io::Write;
        let mut command = std::process::Command::new(&self.kubectl);
        command.env("KUBECONFIG", &self.kubeconfig).args(args);
        if !args
            .iter()
            .any(|a| *a == "-A" || a.starts_with("--namespace") || *a == "-n")
        {
            command.arg(format!("--namespace={}", self.namespace));
        }
        command
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = command.spawn().context("starting kubectl")?;
        if let Some(mut pipe) = child.stdin.take() {
            pipe.write_all(stdin.unwrap_or_default().as_bytes())?;
        }
        Ok(child.wait_with_output()?)
    }

    /// Runs kubectl and returns its stdout, failing with its stderr when it fails.
    pub fn kubectl_ok(&self, args: &[&str], stdin: Option<&str>) -> Result<String> {
        let output = self.kubectl(args, stdin)?;
        if !output.status.success() {
            bail!(
                "kubectl {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// Creates a kwok-managed (or [hung](FakeNode::hung)) node for this test; its name is
    /// prefixed with the namespace and it is deleted when the test ends.
    pub async fn fake_node(&self, node: FakeNode) -> Result<Node> {
        let name = format!("{}-{}", self.namespace, node.name);
        // A node may be created with its status; a hung node's Ready condition is never renewed,
        // and no node-lifecycle controller runs here to notice.
        let (annotations, conditions) = if node.hung {
            (
                serde_json::json!({}),
                serde_json::json!([{"type": "Ready", "status": "True", "reason": "KubeletReady"}]),
            )
        } else {
            (
                serde_json::json!({KWOK_ANNOTATION: "fake"}),
                serde_json::json!([]),
            )
        };
        let node_object: Node = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": node.labels_with_defaults(&name),
                "annotations": annotations,
            },
            "spec": {"taints": node.taints},
            "status": {"capacity": node.capacity, "allocatable": node.capacity, "conditions": conditions},
        }))?;
        self.nodes
            .lock()
            .map_err(|_| anyhow::anyhow!("node list poisoned"))?
            .push(name.clone());
        Ok(self
            .cluster_api::<Node>()
            .create(&PostParams::default(), &node_object)
            .await?)
    }

    /// Waits until `check` returns `Some`, polling every 100 ms, for at most `timeout`.
    pub async fn wait_for<T, F, Fut>(
        &self,
        what: &str,
        timeout: Duration,
        mut check: F,
    ) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Option<T>>>,
    {
        let deadline = Instant::now() + timeout;
        let mut last_error = None;
        loop {
            match check().await {
                Ok(Some(value)) => return Ok(value),
                Ok(None) => {}
                Err(e) => last_error = Some(e),
            }
            if Instant::now() > deadline {
                let detail = last_error
                    .map(|e| format!(" (last error: {e:#})"))
                    .unwrap_or_default();
                bail!("timed out after {timeout:?} waiting for {what}{detail}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The objects a failure report should show.
    async fn dump(&self) -> String {
        let mut out = format!("=== objects in namespace {} ===\n", self.namespace);
        for args in [
            &[
                "get",
                "pods,jobs,jobsets,gpuslices,ganggroups",
                "-o",
                "wide",
            ][..],
            &["get", "events", "--sort-by=.lastTimestamp"][..],
            &["get", "nodes,topologygroups", "-o", "wide"][..],
        ] {
            match self.kubectl(args, None) {
                Ok(o) => {
                    out.push_str(&String::from_utf8_lossy(&o.stdout));
                    out.push_str(&String::from_utf8_lossy(&o.stderr));
                }
                Err(e) => out.push_str(&format!("kubectl {}: {e}\n", args.join(" "))),
            }
        }
        let processes: Vec<TestProcess> =
            self.processes.lock().map(|p| p.clone()).unwrap_or_default();
        for process in processes {
            out.push_str(&format!(
                "=== {} (pid {}, log {}) ===\n{}\n",
                process.name(),
                process.pid(),
                process.log().display(),
                tail_of(&process.log(), 60)
            ));
        }
        out
    }

    async fn cleanup(&self) {
        let processes: Vec<TestProcess> =
            self.processes.lock().map(|p| p.clone()).unwrap_or_default();
        for process in processes {
            process.stop();
        }
        let nodes: Vec<String> = self.nodes.lock().map(|n| n.clone()).unwrap_or_default();
        for node in nodes {
            let _ = self
                .cluster_api::<Node>()
                .delete(&node, &DeleteParams::default())
                .await;
            // A node agent names its node's TopologyGroup after the node.
            let _ = self
                .cluster_api::<runtimekit_crds::TopologyGroup>()
                .delete(&node, &DeleteParams::default())
                .await;
        }
        let _ = Api::<Namespace>::all(self.client.clone())
            .delete(&self.namespace, &DeleteParams::background())
            .await;
    }
}

/// The rows of a `kubectl get` table, each a map from column header to cell, cut at the
/// headers' positions (cells may be blank, so splitting on whitespace would misalign them).
pub fn parse_table(text: &str) -> Vec<BTreeMap<String, String>> {
    let mut lines = text.lines();
    let Some(header) = lines.next() else {
        return Vec::new();
    };
    let mut starts: Vec<(usize, &str)> = Vec::new();
    let mut offset = 0;
    for word in header.split_whitespace() {
        let at = header[offset..].find(word).map_or(offset, |i| offset + i);
        starts.push((at, word));
        offset = at + word.len();
    }
    lines
        .map(|line| {
            starts
                .iter()
                .enumerate()
                .map(|(i, &(start, name))| {
                    let end = starts
                        .get(i + 1)
                        .map_or(line.len(), |&(next, _)| next.min(line.len()));
                    let cell = line
                        .get(start.min(line.len())..end)
                        .unwrap_or_default()
                        .trim();
                    (name.to_owned(), cell.to_owned())
                })
                .collect()
        })
        .collect()
}

/// A kwok-managed node to create.
#[derive(Debug, Clone)]
pub struct FakeNode {
    name: String,
    labels: BTreeMap<String, String>,
    capacity: BTreeMap<String, String>,
    taints: Vec<serde_json::Value>,
    hung: bool,
}

impl FakeNode {
    /// A node with 64 CPUs, 512 GiB and 110 pods, and no GPUs yet.
    pub fn new(name: &str) -> FakeNode {
        let capacity = [("cpu", "64"), ("memory", "512Gi"), ("pods", "110")]
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        FakeNode {
            name: name.into(),
            labels: BTreeMap::new(),
            capacity,
            taints: Vec::new(),
            hung: false,
        }
    }

    /// A node that reports Ready but whose kubelet never acts: kwok does not manage it, so pods
    /// bound to it never start and pods deleted there stay Terminating.
    pub fn hung(mut self) -> FakeNode {
        self.hung = true;
        self
    }

    /// Adds a label.
    pub fn label(mut self, key: &str, value: &str) -> FakeNode {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// Sets a capacity (and allocatable) entry, such as `nvidia.com/gpu: 8`.
    pub fn capacity(mut self, resource: &str, quantity: &str) -> FakeNode {
        self.capacity.insert(resource.into(), quantity.into());
        self
    }

    /// Adds a taint.
    pub fn taint(mut self, key: &str, value: &str, effect: &str) -> FakeNode {
        self.taints
            .push(serde_json::json!({"key": key, "value": value, "effect": effect}));
        self
    }

    fn labels_with_defaults(&self, name: &str) -> BTreeMap<String, String> {
        let mut labels = self.labels.clone();
        labels
            .entry("kubernetes.io/hostname".into())
            .or_insert_with(|| name.into());
        labels.entry("type".into()).or_insert_with(|| "kwok".into());
        labels
    }
}

/// A process a test started: stopped by PID when the test ends, its log printed when the test
/// fails, and recorded in the run's PID file so an interrupted or killed run stops it too.
#[derive(Clone)]
pub struct TestProcess {
    name: String,
    pid: i32,
    log: PathBuf,
    child: Arc<Mutex<std::process::Child>>,
}

impl std::fmt::Debug for TestProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestProcess")
            .field("name", &self.name)
            .field("pid", &self.pid)
            .field("log", &self.log)
            .finish_non_exhaustive()
    }
}

impl TestProcess {
    /// The name it was started under.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its PID.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Its log (stdout and stderr).
    pub fn log(&self) -> PathBuf {
        self.log.clone()
    }

    /// Whether it still runs.
    pub fn running(&self) -> bool {
        self.child
            .lock()
            .map(|mut c| matches!(c.try_wait(), Ok(None)))
            .unwrap_or(false)
    }

    /// Stops it: SIGTERM, then SIGKILL after a grace period. Stopping a stopped process does
    /// nothing.
    pub fn stop(&self) {
        self.signal(nix::sys::signal::Signal::SIGTERM);
    }

    /// Kills it at once with SIGKILL, as a crash would.
    pub fn kill(&self) {
        self.signal(nix::sys::signal::Signal::SIGKILL);
    }

    fn signal(&self, signal: nix::sys::signal::Signal) {
        use nix::sys::signal::{Signal, kill};
        use nix::unistd::Pid;
        let Ok(mut child) = self.child.lock() else {
            return;
        };
        if !matches!(child.try_wait(), Ok(None)) {
            return;
        }
        let _ = kill(Pid::from_raw(self.pid), signal);
        let deadline = Instant::now() + PROCESS_STOP_TIMEOUT;
        loop {
            if !matches!(child.try_wait(), Ok(None)) {
                return;
            }
            if Instant::now() > deadline {
                let _ = kill(Pid::from_raw(self.pid), Signal::SIGKILL);
                let _ = child.wait();
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The last `lines` lines of a file.
fn tail_of(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

impl TestContext {
    /// A folder for this test's files (short, so unix sockets fit in it), created on first use
    /// and kept with the run's logs when a test fails.
    pub fn scratch_dir(&self) -> Result<PathBuf> {
        std::fs::create_dir_all(&self.scratch)?;
        Ok(self.scratch.clone())
    }

    /// Starts `program` with `args` and `env`, its output in `<scratch>/<name>.log`; it is
    /// stopped when the test ends.
    pub fn spawn(
        &self,
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(&str, &str)],
    ) -> Result<TestProcess> {
        use std::io::Write;
        let dir = self.scratch_dir()?;
        let mut processes = self
            .processes
            .lock()
            .map_err(|_| anyhow::anyhow!("process list poisoned"))?;
        let earlier = processes.iter().filter(|p| p.name == name).count();
        let log = if earlier == 0 {
            dir.join(format!("{name}.log"))
        } else {
            dir.join(format!("{name}-{}.log", earlier + 1))
        };
        let file = std::fs::File::create(&log)?;
        let child = std::process::Command::new(program)
            .args(args)
            .envs(env.iter().copied())
            .stdin(std::process::Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .with_context(|| format!("starting {}", program.display()))?;
        let pid = i32::try_from(child.id()).context("pid out of range")?;
        std::fs::create_dir_all(&self.processes_dir)?;
        let mut pids = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.processes_dir.join(crate::cluster::PID_FILE))?;
        let exe = std::fs::canonicalize(program).unwrap_or_else(|_| program.to_owned());
        writeln!(pids, "{name} {pid} {}", exe.display())?;
        let process = TestProcess {
            name: name.to_owned(),
            pid,
            log,
            child: Arc::new(Mutex::new(child)),
        };
        processes.push(process.clone());
        Ok(process)
    }

    /// Runs `f` on the running control plane.
    fn with_cluster<T>(&self, f: impl FnOnce(&mut Cluster) -> Result<T>) -> Result<T> {
        let mut cluster = self
            .cluster
            .lock()
            .map_err(|_| anyhow::anyhow!("cluster poisoned"))?;
        f(cluster.as_mut().context("the control plane is stopped")?)
    }

    /// Stops the kube-apiserver for `down_for`, starts it again and waits until it is ready.
    pub async fn restart_apiserver(&self, down_for: Duration) -> Result<()> {
        let stopped = self.with_cluster(|cluster| cluster.stop_component("kube-apiserver"))?;
        tokio::time::sleep(down_for).await;
        self.with_cluster(|cluster| cluster.start_again(stopped))?;
        self.wait_for(
            "the kube-apiserver to be ready again",
            Duration::from_secs(60),
            || async {
                let ready = self
                    .client
                    .request_text(http::Request::get("/readyz").body(Vec::new())?)
                    .await;
                Ok(ready.ok().filter(|body| body.contains("ok")).map(|_| ()))
            },
        )
        .await
    }

    /// A kubeconfig file for `user` in `groups`, with a client certificate from the cluster's
    /// PKI (the apiserver reads the user from the CN and the groups from O).
    pub fn kubeconfig_for(&self, user: &str, groups: &[&str]) -> Result<PathBuf> {
        let text = {
            let cluster = self
                .cluster
                .lock()
                .map_err(|_| anyhow::anyhow!("cluster poisoned"))?;
            let cluster = cluster.as_ref().context("the control plane is stopped")?;
            let identity = cluster.pki.client(user, groups)?;
            cluster.pki.kubeconfig(&cluster.server, user, &identity)
        };
        let file: String = user
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let path = self.scratch_dir()?.join(format!("kubeconfig-{file}"));
        std::fs::write(&path, text)?;
        Ok(path)
    }

    /// A client that authenticates as `user` in `groups` with a client certificate.
    pub async fn client_for(&self, user: &str, groups: &[&str]) -> Result<Client> {
        client_from(&self.kubeconfig_for(user, groups)?).await
    }

    /// A client that authenticates with a bearer token (a ServiceAccount token).
    pub async fn client_with_token(&self, token: &str) -> Result<Client> {
        use base64::Engine;
        let (server, ca) = {
            let cluster = self
                .cluster
                .lock()
                .map_err(|_| anyhow::anyhow!("cluster poisoned"))?;
            let cluster = cluster.as_ref().context("the control plane is stopped")?;
            (cluster.server.clone(), cluster.pki.ca_pem.clone())
        };
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\nusers:\n- name: u\n  user:\n    token: {token}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n",
            ca = base64::engine::general_purpose::STANDARD.encode(ca),
        );
        let kubeconfig: kube::config::Kubeconfig = serde_yaml::from_str(&text)?;
        let config = kube::Config::from_custom_kubeconfig(
            kubeconfig,
            &kube::config::KubeConfigOptions::default(),
        )
        .await?;
        Ok(Client::try_from(config)?)
    }
}

async fn client_from(path: &Path) -> Result<Client> {
    let kubeconfig = kube::config::Kubeconfig::read_from(path)?;
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;
    Ok(Client::try_from(config)?)
}

/// The path of a binary of this workspace, built with cargo on first use in a run (a no-op
/// when it is up to date), in the same profile as the tests. `RUNTIMEKIT_BIN_<NAME>` (the
/// binary's name in upper case, `-` as `_`) names a prebuilt one instead.
pub fn workspace_binary(package: &str, binary: &str) -> Result<PathBuf> {
    static BUILT: Mutex<BTreeMap<String, PathBuf>> = Mutex::new(BTreeMap::new());
    let variable = format!("RUNTIMEKIT_BIN_{}", binary.to_uppercase().replace('-', "_"));
    if let Some(path) = std::env::var_os(&variable) {
        return Ok(PathBuf::from(path));
    }
    let mut built = BUILT
        .lock()
        .map_err(|_| anyhow::anyhow!("build list poisoned"))?;
    if let Some(path) = built.get(binary) {
        return Ok(path.clone());
    }
    let cargo = std::env::var_os("CARGO")
        .or_else(|| option_env!("CARGO").map(Into::into))
        .unwrap_or_else(|| "cargo".into());
    let mut command = std::process::Command::new(cargo);
    // The variables cargo sets for the test itself would make this build differ from a plain
    // one (build scripts watch some), and rebuild dependencies for nothing.
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if name.starts_with("CARGO_PKG_")
            || [
                "CARGO_MANIFEST_DIR",
                "CARGO_MANIFEST_PATH",
                "CARGO_MANIFEST_LINKS",
                "CARGO_CRATE_NAME",
                "CARGO_BIN_NAME",
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_TARGET_TMPDIR",
                "OUT_DIR",
            ]
            .contains(&name.as_ref())
        {
            command.env_remove(name.as_ref());
        }
    }
    command
        .current_dir(crate::tools::repo_root())
        .args(["build", "-p", package, "--bin", binary])
        .arg("--message-format=json-render-diagnostics")
        .stderr(std::process::Stdio::inherit());
    if !cfg!(debug_assertions) {
        command.arg("--release");
    }
    let output = command
        .output()
        .with_context(|| format!("building {binary} with cargo"))?;
    if !output.status.success() {
        bail!("cargo could not build {binary} ({})", output.status);
    }
    let path = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == binary)
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .with_context(|| format!("cargo built no executable named {binary}"))?;
    built.insert(binary.to_owned(), path.clone());
    Ok(path)
}
