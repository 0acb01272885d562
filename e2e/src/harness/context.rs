//! What one test works with: its namespace, API handles, kubectl, waiting with a timeout, a
//! scratch folder and the processes it started; and what is shown and cleaned up when it ends.

use super::process::TestProcess;
use crate::cluster::Cluster;
use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::api::DeleteParams;
use kube::{Api, Client};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What one test works with.
#[derive(Clone)]
pub struct TestContext {
    /// An admin client.
    pub client: Client,
    /// The test's own namespace.
    pub namespace: String,
    pub(super) kubeconfig: PathBuf,
    pub(super) kubectl: PathBuf,
    pub(super) nodes: Arc<Mutex<Vec<String>>>,
    pub(super) cluster: Arc<Mutex<Option<Cluster>>>,
    pub(super) scratch: PathBuf,
    pub(super) processes_dir: PathBuf,
    pub(super) processes: Arc<Mutex<Vec<TestProcess>>>,
}

impl std::fmt::Debug for TestContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestContext")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl TestContext {
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

    /// Waits until `check` returns `Some`, for at most `timeout` ([`crate::tools::wait_for`]).
    pub async fn wait_for<T, F, Fut>(&self, what: &str, timeout: Duration, check: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Option<T>>>,
    {
        crate::tools::wait_for(what, timeout, check).await
    }

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
        let dir = self.scratch_dir()?;
        let mut processes = self
            .processes
            .lock()
            .map_err(|_| anyhow::anyhow!("process list poisoned"))?;
        let earlier = processes.iter().filter(|p| p.name() == name).count();
        let log = if earlier == 0 {
            dir.join(format!("{name}.log"))
        } else {
            dir.join(format!("{name}-{}.log", earlier + 1))
        };
        let process = TestProcess::start(name, program, args, env, log, &self.processes_dir)?;
        processes.push(process.clone());
        Ok(process)
    }

    /// The objects a failure report should show.
    pub(super) async fn dump(&self) -> String {
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
                process.log_tail(60)
            ));
        }
        out
    }

    /// Stops the test's processes and deletes its nodes and namespace.
    pub(super) async fn cleanup(&self) {
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
