//! A real control plane on 127.0.0.1: etcd, kube-apiserver, kube-controller-manager, the JobSet
//! controller and kwok (plus kube-scheduler on request), each started by PID, waited for until
//! ready, and stopped by the PIDs it recorded.

pub mod deploy;
pub mod node_side;
pub mod previous;
pub mod real_node;
pub mod simulated;

use crate::pki::Pki;
use crate::tools::Tools;
use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use std::fs::File;
use std::io::Write;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long each component may take to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a component may take to exit after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// The field manager of everything the harness applies.
const FIELD_MANAGER: &str = "runtimekit-e2e";
/// The annotation kwok manages nodes by: the cluster starts kwok with it, and fake nodes carry it.
pub const KWOK_ANNOTATION: &str = "kwok.x-k8s.io/node";

/// What to start.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Where the PKI, data, logs, kubeconfig and PID file go.
    pub dir: PathBuf,
    /// Start the components in their own process group, so they outlive the starting process
    /// (`just up`); otherwise they are stopped when the [`Cluster`] is dropped.
    pub detached: bool,
    /// Also start kube-scheduler (the comparison peer of the scheduler benchmark).
    pub kube_scheduler: bool,
    /// Serve the apiserver's `/debug/pprof` (the scheduler benchmark's BENCH_PROFILE).
    pub profiling: bool,
    /// kwok keeps the pods of Jobs running, as it does other pods, instead of completing them
    /// the moment they run (kwok's default), so a gang stays up (the demo).
    pub jobs_keep_running: bool,
    /// How long kwok's node leases last; kwok renews each at a quarter of it, so a longer lease
    /// is a lighter heartbeat for a large fleet (nothing here marks a node NotReady).
    pub node_lease_seconds: u32,
}

/// kwok's node lease unless a run asks for another.
pub const NODE_LEASE_SECONDS: u32 = 40;

/// One started process.
#[derive(Debug)]
struct Component {
    name: String,
    pid: i32,
    log: PathBuf,
    child: Option<Child>,
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

/// A component stopped by [`Cluster::stop_component`], to be started again.
#[derive(Debug)]
pub struct StoppedComponent {
    name: String,
    program: PathBuf,
    pub(crate) args: Vec<String>,
    env: Vec<(String, String)>,
    index: usize,
}

/// A running control plane.
#[derive(Debug)]
pub struct Cluster {
    /// Where its files live.
    pub dir: PathBuf,
    /// The apiserver's URL.
    pub server: String,
    /// An admin (`system:masters`) kubeconfig.
    pub kubeconfig: PathBuf,
    /// The binaries it runs.
    pub tools: Tools,
    /// Its certificate authority.
    pub pki: Pki,
    components: Vec<Component>,
    detached: bool,
}

/// The ports of one cluster, all free when chosen, so two clusters on one machine never collide.
#[derive(Debug, Clone, Copy)]
struct Ports {
    etcd_client: u16,
    etcd_peer: u16,
    apiserver: u16,
    controller_manager: u16,
    scheduler: u16,
    jobset_webhook: u16,
    jobset_health: u16,
    kwok: u16,
}

impl Ports {
    fn pick() -> Result<Ports> {
        // Hold every listener until all are chosen, so no port is handed out twice.
        let listeners = (0..8)
            .map(|_| TcpListener::bind("127.0.0.1:0"))
            .collect::<std::io::Result<Vec<_>>>()?;
        let p = listeners
            .iter()
            .map(|l| l.local_addr().map(|a| a.port()))
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(Ports {
            etcd_client: p[0],
            etcd_peer: p[1],
            apiserver: p[2],
            controller_manager: p[3],
            scheduler: p[4],
            jobset_webhook: p[5],
            jobset_health: p[6],
            kwok: p[7],
        })
    }
}

impl Cluster {
    /// Starts every component and waits until each is ready; on failure, stops what it started
    /// and says which log to read.
    pub async fn start(options: ClusterOptions) -> Result<Cluster> {
        let tools = Tools::ensure()?;
        let dir = options.dir.clone();
        if dir.join(PID_FILE).exists() {
            bail!(
                "{} already holds a running cluster; stop it first",
                dir.display()
            );
        }
        // A stopped cluster's state is not reused: every start is a fresh cluster.
        if dir.exists() {
            real_node::unmount_all(&dir);
            std::fs::remove_dir_all(&dir).with_context(|| format!("clearing {}", dir.display()))?;
        }
        std::fs::create_dir_all(dir.join("logs"))?;
        let pki = Pki::create(&dir.join("pki"))?;
        let ports = Ports::pick()?;
        let server = format!("https://127.0.0.1:{}", ports.apiserver);
        let admin = pki.client("runtimekit-e2e-admin", &["system:masters"])?;
        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(&kubeconfig, pki.kubeconfig(&server, "admin", &admin))?;
        let mut cluster = Cluster {
            dir,
            server,
            kubeconfig,
            tools,
            pki,
            components: Vec::new(),
            detached: options.detached,
        };
        if let Err(e) = cluster.start_components(ports, &options).await {
            cluster.stop();
            return Err(e.context(format!(
                "starting the control plane in {}",
                cluster.dir.display()
            )));
        }
        Ok(cluster)
    }

    async fn start_components(&mut self, ports: Ports, options: &ClusterOptions) -> Result<()> {
        let dir = self.dir.clone();
        let file = |name: &str| self.pki.file(name).display().to_string();
        let (serving_crt, serving_key, ca) =
            (file("serving.crt"), file("serving.key"), file("ca.crt"));
        let (sa_key, sa_pub) = (file("service-account.key"), file("service-account.pub"));
        let kubeconfig = self.kubeconfig.display().to_string();
        // Empty on the current release; a flag the binaries accept either way.
        let feature_gates = format!(
            "--feature-gates={}",
            crate::tools::enabled_gates()
                .iter()
                .map(|g| format!("{g}=true"))
                .collect::<Vec<_>>()
                .join(",")
        );

        let etcd_url = format!("http://127.0.0.1:{}", ports.etcd_client);
        let peer_url = format!("http://127.0.0.1:{}", ports.etcd_peer);
        self.spawn(
            "etcd",
            &self.tools.etcd.join("etcd"),
            &[
                "--name=e2e".into(),
                format!("--data-dir={}", dir.join("etcd").display()),
                format!("--listen-client-urls={etcd_url}"),
                format!("--advertise-client-urls={etcd_url}"),
                format!("--listen-peer-urls={peer_url}"),
                format!("--initial-advertise-peer-urls={peer_url}"),
                format!("--initial-cluster=e2e={peer_url}"),
                // Test data is disposable; fsync would dominate the run time.
                "--unsafe-no-fsync".into(),
                "--log-level=warn".into(),
            ],
        )?;
        self.wait_ready("etcd", &format!("{etcd_url}/health"), "\"health\":\"true\"")
            .await?;

        self.spawn(
            "kube-apiserver",
            &self.tools.k8s.join("kube-apiserver"),
            &[
                format!("--etcd-servers={etcd_url}"),
                "--advertise-address=127.0.0.1".into(),
                // Since 1.37 a loopback address may not be written into the `kubernetes`
                // Endpoints, which nothing here routes to anyway.
                "--endpoint-reconciler-type=none".into(),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={}", ports.apiserver),
                format!("--cert-dir={}", dir.join("apiserver").display()),
                format!("--tls-cert-file={serving_crt}"),
                format!("--tls-private-key-file={serving_key}"),
                format!("--client-ca-file={ca}"),
                format!(
                    "--service-account-issuer=https://127.0.0.1:{}",
                    ports.apiserver
                ),
                format!("--service-account-key-file={sa_pub}"),
                format!("--service-account-signing-key-file={sa_key}"),
                "--service-cluster-ip-range=10.0.0.0/24".into(),
                "--authorization-mode=Node,RBAC".into(),
                "--allow-privileged=true".into(),
                // No token controller runs, and no node-lifecycle controller clears the not-ready taint.
                "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition".into(),
                // Load tests would otherwise be throttled by the apiserver itself.
                "--enable-priority-and-fairness=false".into(),
                "--max-requests-inflight=3000".into(),
                "--max-mutating-requests-inflight=1500".into(),
                format!("--profiling={}", options.profiling),
                feature_gates.clone(),
            ],
        )?;
        self.wait_ready("kube-apiserver", &format!("{}/readyz", self.server), "ok")
            .await?;
        let client = self.client().await?;

        install_crds(&client, &self.tools).await?;

        self.spawn("kube-controller-manager", &self.tools.k8s.join("kube-controller-manager"), &[
            format!("--kubeconfig={kubeconfig}"),
            // The Job controller for JobSets; the Deployment, ReplicaSet and DaemonSet
            // controllers and the kube-root-ca.crt publisher for the kit deployed from config/.
            // The ResourceClaim controller makes pods' claims (DRA); quotas and budgets are counted.
            "--controllers=resourcequota-controller,disruption-controller,job-controller,garbage-collector-controller,namespace-controller,pod-garbage-collector-controller,ttl-after-finished-controller,clusterrole-aggregation-controller,deployment-controller,replicaset-controller,daemonset-controller,root-ca-certificate-publisher-controller,resourceclaim-controller".into(),
            feature_gates.clone(),
            format!("--root-ca-file={ca}"),
            "--leader-elect=false".into(),
            "--use-service-account-credentials=false".into(),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={}", ports.controller_manager),
            format!("--tls-cert-file={serving_crt}"),
            format!("--tls-private-key-file={serving_key}"),
            "--kube-api-qps=1000".into(),
            "--kube-api-burst=2000".into(),
            "--concurrent-job-syncs=20".into(),
        ])?;
        let kcm_health = format!("https://127.0.0.1:{}/healthz", ports.controller_manager);
        self.wait_ready("kube-controller-manager", &kcm_health, "ok")
            .await?;

        let jobset_certs = dir.join("jobset-certs");
        std::fs::create_dir_all(&jobset_certs)?;
        std::fs::copy(self.pki.file("serving.crt"), jobset_certs.join("tls.crt"))?;
        std::fs::copy(self.pki.file("serving.key"), jobset_certs.join("tls.key"))?;
        let jobset_config = dir.join("jobset-config.yaml");
        std::fs::write(
            &jobset_config,
            format!(
                "apiVersion: config.jobset.x-k8s.io/v1alpha1\nkind: Configuration\nleaderElection:\n  leaderElect: false\ninternalCertManagement:\n  enable: false\nwebhook:\n  host: 127.0.0.1\n  port: {}\n  certDir: {}\nmetrics:\n  bindAddress: \"0\"\nhealth:\n  healthProbeBindAddress: 127.0.0.1:{}\nclientConnection:\n  qps: 500\n  burst: 1000\n",
                ports.jobset_webhook,
                jobset_certs.display(),
                ports.jobset_health
            ),
        )?;
        self.spawn(
            "jobset",
            &self.tools.jobset.join("jobset"),
            &[
                format!("--kubeconfig={kubeconfig}"),
                format!("--config={}", jobset_config.display()),
                "--metrics-bind-address=0".into(),
                format!(
                    "--health-probe-bind-address=127.0.0.1:{}",
                    ports.jobset_health
                ),
                "--zap-devel=false".into(),
            ],
        )?;
        self.wait_ready(
            "jobset",
            &format!("http://127.0.0.1:{}/readyz", ports.jobset_health),
            "ok",
        )
        .await?;
        register_jobset_webhooks(&client, ports.jobset_webhook, &self.pki.ca_pem).await?;

        self.spawn(
            "kwok",
            &self.tools.kwok.join("kwok"),
            &[
                format!("--kubeconfig={kubeconfig}"),
                "--manage-all-nodes=false".into(),
                format!(
                    "--manage-nodes-with-annotation-selector={}=fake",
                    KWOK_ANNOTATION
                ),
                format!("--server-address=127.0.0.1:{}", ports.kwok),
                format!(
                    "--node-lease-duration-seconds={}",
                    options.node_lease_seconds
                ),
                "--cidr=10.128.0.1/12".into(),
                // Node stages that heartbeat through the lease (build-tools.sh says why).
                format!(
                    "--config={}",
                    self.tools.kwok.join("node-stages-lease.yaml").display()
                ),
            ]
            .into_iter()
            .chain([format!(
                "--config={}",
                self.tools
                    .kwok
                    .join(if options.jobs_keep_running {
                        "pod-stages-running.yaml"
                    } else {
                        "pod-stages.yaml"
                    })
                    .display()
            )])
            .collect::<Vec<_>>(),
        )?;
        self.wait_ready(
            "kwok",
            &format!("http://127.0.0.1:{}/healthz", ports.kwok),
            "ok",
        )
        .await?;

        if options.kube_scheduler {
            let config = dir.join("kube-scheduler.yaml");
            std::fs::write(
                &config,
                format!(
                    "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nleaderElection:\n  leaderElect: false\nclientConnection:\n  kubeconfig: {kubeconfig}\n  qps: 5000\n  burst: 10000\nprofiles:\n- schedulerName: default-scheduler\n"
                ),
            )?;
            self.spawn(
                "kube-scheduler",
                &self.tools.k8s.join("kube-scheduler"),
                &[
                    format!("--config={}", config.display()),
                    "--bind-address=127.0.0.1".into(),
                    format!("--secure-port={}", ports.scheduler),
                    format!("--tls-cert-file={serving_crt}"),
                    format!("--tls-private-key-file={serving_key}"),
                    feature_gates.clone(),
                ],
            )?;
            self.wait_ready(
                "kube-scheduler",
                &format!("https://127.0.0.1:{}/healthz", ports.scheduler),
                "ok",
            )
            .await?;
        }
        Ok(())
    }

    /// An admin client.
    pub async fn client(&self) -> Result<Client> {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig)?;
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
        Ok(Client::try_from(config)?)
    }

    /// A kubectl command against this cluster.
    pub fn kubectl(&self) -> Command {
        let mut command = Command::new(self.tools.kubectl());
        command.env("KUBECONFIG", &self.kubeconfig);
        command
    }

    /// The PID of a component, if it was started.
    pub fn pid(&self, component: &str) -> Option<i32> {
        self.components
            .iter()
            .find(|c| c.name == component)
            .map(|c| c.pid)
    }

    /// The log file of a component, if it was started.
    pub fn log(&self, component: &str) -> Option<&Path> {
        self.components
            .iter()
            .find(|c| c.name == component)
            .map(|c| c.log.as_path())
    }

    /// The last `lines` lines of every component's log, for failure reports.
    pub fn log_tails(&self, lines: usize) -> String {
        let mut out = String::new();
        for component in &self.components {
            out.push_str(&format!(
                "--- {} ({}) ---\n{}\n",
                component.name,
                component.log.display(),
                tail(&component.log, lines)
            ));
        }
        out
    }

    /// Stops every component, newest first: SIGTERM, then SIGKILL after a grace period.
    pub fn stop(&mut self) {
        while let Some(mut component) = self.components.pop() {
            if component.name == "containerd" {
                real_node::kill_containers(&self.dir, &component.program);
            }
            stop_pid(component.pid, component.child.as_mut());
        }
        real_node::unmount_all(&self.dir);
        real_node::remove_stale_sockets(&self.dir);
        simulated::remove_simulated(&self.dir);
        let _ = std::fs::remove_file(self.dir.join(PID_FILE));
    }

    pub(crate) fn spawn(&mut self, name: &str, program: &Path, args: &[String]) -> Result<()> {
        self.spawn_with_env(name, program, args, &[])
    }

    /// [`Cluster::spawn`], with variables added to the environment.
    pub(crate) fn spawn_with_env(
        &mut self,
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(String, String)],
    ) -> Result<()> {
        // Held until the process is recorded, so an interrupt stops it too (see `interrupt`).
        let interrupted = SPAWNING
            .lock()
            .map_err(|_| anyhow!("spawn lock poisoned"))?;
        if *interrupted {
            bail!("interrupted");
        }
        let log = self.dir.join("logs").join(format!("{name}.log"));
        let file = File::options().create(true).append(true).open(&log)?;
        let mut command = Command::new(program);
        command
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file);
        if self.detached {
            command.process_group(0);
        }
        let child = command
            .spawn()
            .with_context(|| format!("starting {}", program.display()))?;
        let pid = i32::try_from(child.id()).context("pid out of range")?;
        let mut pids = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(PID_FILE))?;
        // The file /proc/PID/exe names, which `stop_recorded` checks: `/bin/sh` is a link to
        // dash on Debian, and a supervisor recorded as `/bin/sh` was never stopped.
        let exe = std::fs::canonicalize(program).unwrap_or_else(|_| program.to_owned());
        writeln!(pids, "{name} {pid} {}", exe.display())?;
        self.components.push(Component {
            name: name.to_owned(),
            pid,
            log,
            child: (!self.detached).then_some(child),
            program: program.to_owned(),
            args: args.to_vec(),
            env: env.to_vec(),
        });
        Ok(())
    }

    /// Stops one component, to test what happens while it is away. It leaves the list of
    /// running components (so no stale PID is ever signalled); [`Cluster::start_again`] brings
    /// it back from the returned record, with the same arguments (its log continues).
    pub fn stop_component(&mut self, name: &str) -> Result<StoppedComponent> {
        let index = self
            .components
            .iter()
            .position(|c| c.name == name)
            .with_context(|| format!("{name} is not running"))?;
        let mut component = self.components.remove(index);
        stop_pid(component.pid, component.child.as_mut());
        Ok(StoppedComponent {
            name: component.name,
            program: component.program,
            args: component.args,
            env: component.env,
            index,
        })
    }

    /// Starts a component stopped by [`Cluster::stop_component`] again, in its place in the
    /// start order (so stopping newest-first still stops it before what it needs).
    pub fn start_again(&mut self, stopped: StoppedComponent) -> Result<()> {
        self.spawn_with_env(&stopped.name, &stopped.program, &stopped.args, &stopped.env)?;
        let restarted = self.components.pop().context("respawned component")?;
        let index = stopped.index.min(self.components.len());
        self.components.insert(index, restarted);
        Ok(())
    }

    /// Polls `url` until its body contains `expect`, failing early when the component exits.
    async fn wait_ready(&mut self, name: &str, url: &str, expect: &str) -> Result<()> {
        let client = probe_client(url, &self.pki.ca_pem)?;
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let component = self
                .components
                .iter_mut()
                .find(|c| c.name == name)
                .ok_or_else(|| anyhow!("{name} was not started"))?;
            let exited = match component.child.as_mut() {
                Some(child) => child.try_wait()?.map(|s| s.to_string()),
                None => (!alive(component.pid)).then(|| "exited".to_owned()),
            };
            if let Some(status) = exited {
                bail!(
                    "{name} {status} before it was ready; its log {}:\n{}",
                    component.log.display(),
                    tail(&component.log, 30)
                );
            }
            let last = match client.request_text(http_get(url)?).await {
                Ok(body) if body.contains(expect) => return Ok(()),
                Ok(body) => body,
                Err(e) => e.to_string(),
            };
            if Instant::now() > deadline {
                bail!(
                    "{name} was not ready after {READY_TIMEOUT:?} ({last}); its log: {}",
                    component.log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if !self.detached {
            self.stop();
        }
    }
}

/// Whether `node` says it is Ready (its kubelet, or kwok playing one, has initialised it).
pub fn node_ready(node: &k8s_openapi::api::core::v1::Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The file naming every process a cluster started: `name pid program` per line.
pub const PID_FILE: &str = "pids";

/// Whether the start was interrupted; held while a process is started and recorded.
static SPAWNING: std::sync::Mutex<bool> = std::sync::Mutex::new(false);

/// Stops the processes of the cluster in `dir` from a signal handler while another thread may
/// be starting more: no process starts after this, and one being started is recorded first.
pub fn interrupt(dir: &Path) -> Result<usize> {
    let mut interrupted = SPAWNING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    *interrupted = true;
    stop_recorded(dir)
}

/// Stops the processes recorded in `dir`'s PID file, checking that each PID still runs the
/// recorded program (a reused PID is left alone). Returns how many were stopped.
pub fn stop_recorded(dir: &Path) -> Result<usize> {
    let path = dir.join(PID_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let mut stopped = 0;
    for line in text.lines().rev() {
        let mut fields = line.splitn(3, ' ');
        let (Some(name), Some(pid), Some(program)) = (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let Ok(pid) = pid.parse::<i32>() else {
            continue;
        };
        // A binary rebuilt since (cargo replaces the file) reads as `<path> (deleted)`.
        let running = std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| {
            let exe = exe.to_string_lossy();
            exe.strip_suffix(" (deleted)").unwrap_or(exe.as_ref()) == program
        });
        if running {
            if name == "containerd" {
                // containerd runs under its supervisor, the recorded process.
                let containerd = crate::supervise::program_of(pid)
                    .unwrap_or_else(|| Path::new(program).to_owned());
                real_node::kill_containers(dir, &containerd);
            }
            stop_pid(pid, None);
            stopped += 1;
        }
    }
    real_node::unmount_all(dir);
    real_node::remove_stale_sockets(dir);
    simulated::remove_simulated(dir);
    std::fs::remove_file(&path)?;
    Ok(stopped)
}

fn stop_pid(pid: i32, child: Option<&mut Child>) {
    let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
    let deadline = Instant::now() + STOP_TIMEOUT;
    let mut child = child;
    loop {
        let gone = match child.as_deref_mut() {
            Some(c) => c.try_wait().map(|s| s.is_some()).unwrap_or(true),
            None => !alive(pid),
        };
        if gone {
            return;
        }
        if Instant::now() > deadline {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            if let Some(c) = child {
                let _ = c.wait();
            }
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn alive(pid: i32) -> bool {
    kill(Pid::from_raw(pid), None).is_ok()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| s.split(") ").nth(1).is_some_and(|r| r.starts_with('Z')))
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn http_get(url: &str) -> Result<http::Request<Vec<u8>>> {
    let uri: http::Uri = url.parse()?;
    let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
    Ok(http::Request::get(path).body(Vec::new())?)
}

/// A client for one component's health endpoint, trusting the cluster CA.
fn probe_client(url: &str, ca_pem: &str) -> Result<Client> {
    let uri: http::Uri = url.parse()?;
    let base: http::Uri = format!(
        "{}://{}",
        uri.scheme_str().unwrap_or("http"),
        uri.authority().map_or("", |a| a.as_str())
    )
    .parse()?;
    let mut config = kube::Config::new(base);
    config.root_cert = Some(vec![pem_to_der(ca_pem)?]);
    config.connect_timeout = Some(Duration::from_secs(2));
    config.read_timeout = Some(Duration::from_secs(5));
    Ok(Client::try_from(config)?)
}

fn pem_to_der(pem: &str) -> Result<Vec<u8>> {
    use base64::Engine;
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    Ok(base64::engine::general_purpose::STANDARD.decode(body)?)
}

/// Installs this project's CRDs and JobSet's, and waits until all are Established.
async fn install_crds(client: &Client, tools: &Tools) -> Result<()> {
    let jobset_yaml = std::fs::read_to_string(tools.jobset.join("jobset-crd.yaml"))
        .context("reading the JobSet CRD")?;
    let jobset: CustomResourceDefinition = serde_yaml::from_str(&jobset_yaml)?;
    let mut crds = runtimekit_crds::all();
    crds.push(jobset);
    apply_crds(client, &crds).await
}

/// Applies `crds` and waits until each is Established.
pub async fn apply_crds(client: &Client, crds: &[CustomResourceDefinition]) -> Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    for crd in crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &params, &Patch::Apply(crd))
            .await
            .with_context(|| format!("applying CRD {name}"))?;
    }
    for crd in crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let established = kube::runtime::wait::conditions::is_crd_established();
        tokio::time::timeout(
            READY_TIMEOUT,
            kube::runtime::wait::await_condition(api.clone(), &name, established),
        )
        .await
        .with_context(|| format!("CRD {name} not Established"))??;
    }
    Ok(())
}

/// Registers JobSet's admission webhooks by URL with the cluster CA, exactly as its manifests
/// do in-cluster (defaulting and validation of JobSets, and of the pods they create).
async fn register_jobset_webhooks(client: &Client, port: u16, ca_pem: &str) -> Result<()> {
    use base64::Engine;
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let hook = |name: &str,
                path: &str,
                resource: &str,
                group: &str,
                version: &str,
                operations: &[&str],
                pods_of_jobsets: bool| {
        let mut hook = serde_json::json!({
            "name": name,
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Fail",
            "clientConfig": {"url": format!("https://127.0.0.1:{port}{path}"), "caBundle": ca},
            "rules": [{"apiGroups": [group], "apiVersions": [version], "operations": operations, "resources": [resource]}],
        });
        if pods_of_jobsets {
            hook["objectSelector"] = serde_json::json!({"matchExpressions": [{"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"}]});
        }
        hook
    };
    let mutating: MutatingWebhookConfiguration = serde_json::from_value(serde_json::json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "jobset-mutating-webhook-configuration"},
        "webhooks": [
            hook("mjobset.kb.io", "/mutate-jobset-x-k8s-io-v1alpha2-jobset", "jobsets", "jobset.x-k8s.io", "v1alpha2", &["CREATE"], false),
            hook("mpod.kb.io", "/mutate--v1-pod", "pods", "", "v1", &["CREATE"], true),
        ],
    }))?;
    let validating: ValidatingWebhookConfiguration = serde_json::from_value(serde_json::json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "jobset-validating-webhook-configuration"},
        "webhooks": [
            hook("vjobset.kb.io", "/validate-jobset-x-k8s-io-v1alpha2-jobset", "jobsets", "jobset.x-k8s.io", "v1alpha2", &["CREATE", "UPDATE"], false),
            hook("vpod.kb.io", "/validate--v1-pod", "pods", "", "v1", &["CREATE"], true),
        ],
    }))?;
    let params = PatchParams::apply(FIELD_MANAGER).force();
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .patch(
            "jobset-mutating-webhook-configuration",
            &params,
            &Patch::Apply(&mutating),
        )
        .await?;
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .patch(
            "jobset-validating-webhook-configuration",
            &params,
            &Patch::Apply(&validating),
        )
        .await?;
    Ok(())
}
