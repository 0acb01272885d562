//! One real node on this machine: containerd with its CRI plugin, runc, CNI and the `lj-runtime`
//! handler, images built here (no registry), the kubelet at the control plane's version, and the
//! kit's node side: a simulated resource layer (its cards' device files are stand-ins, so
//! injection can be seen) and the node agent serving the kubelet its device plugins. Everything
//! lives in the cluster's folder, binds to 127.0.0.1 and is started and stopped by PID with the
//! rest of the cluster; stopping also kills the node's containers and unmounts what it mounted.
//!
//! The launcher plays the cloud controller: the kubelet runs with `--cloud-provider=external`,
//! and the launcher gives the Node its one address, 127.0.0.1 (the kubelet refuses a loopback
//! `--node-ip`), so `kubectl logs` and `exec` reach the kubelet on loopback.

use crate::cluster::Cluster;
use crate::cluster::node_side::{AGENT_GROUP, agent_dra_args, agent_user, wait_for_socket};
use crate::supervise::supervised;
use crate::tools::{repo_root, run};
use crate::workspace_binary::{workspace_binary, workspace_library};
use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The real node's name (in the tests and the demo).
pub const REAL_NODE: &str = "real-node";
/// The label every GPU node of the kit carries.
pub const ENABLE_LABEL: &str = "lj_runtimekit_enable";
/// Where the node's files live, under the cluster's folder.
const NODE_DIR: &str = "node";
/// lj-runtime's `isolationStateDir` under the node's folder.
pub const ISOLATION_DIR: &str = "isolation";
/// Where the installer puts the isolation library, under the node's folder.
const ISOLATION_LIBRARY: &str = "lib/libruntimekit_isolation.so";
/// Where the installer puts `lj-runtime`, under the node's folder.
const LJ_RUNTIME: &str = "bin/lj-runtime";
/// The administrator's lj-runtime settings the installer starts from, in the node's folder.
pub(crate) const LJ_RUNTIME_SETTINGS: &str = "lj-runtime-settings.json";

/// How the real node is set up when it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setup {
    /// As the tests use it: the node installer run once on the host (as a user without the
    /// DaemonSet would), then the resource layer and the node agent as host processes.
    Installed,
    /// As a user's node is before the kit: containerd, runc and the kubelet only; the
    /// DaemonSet's installer sets it up ([`Cluster::deploy_chart`]).
    Bare,
}
/// The taint a kubelet with an external cloud provider registers with.
const UNINITIALIZED: &str = "node.cloudprovider.kubernetes.io/uninitialized";
/// The resource the agent offers a node's whole cards as, under the default prefix.
const WHOLE_CARDS: &str = "aliyun.com/gpu";
/// The kubelet's device-plugin folder: fixed in the kubelet, so one real node per machine.
const DEVICE_PLUGINS: &str = "/var/lib/kubelet/device-plugins";
/// How long containerd and the kubelet may take to come up.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// The hardware profile the real node simulates: NVIDIA cards (MIG on card 7) and RDMA NICs.
pub const PROFILE: &str = "h800-8";
/// The deployed node agent's exporter port, on 127.0.0.1 (the DaemonSet's port).
pub const METRICS_PORT: u16 = 9501;

/// A real node that was started.
#[derive(Debug, Clone)]
pub struct RealNode {
    /// The Node's name.
    pub name: String,
    /// Its folder.
    pub dir: PathBuf,
    /// containerd's socket.
    pub containerd_socket: PathBuf,
    /// The `ctr` built with that containerd.
    pub ctr: PathBuf,
    /// Where the kubelet writes containers' logs.
    pub pod_logs: PathBuf,
    /// The kubelet's healthz port on 127.0.0.1.
    pub healthz_port: u16,
    /// The resource layer's socket.
    pub layer_socket: PathBuf,
    /// How it was set up: a bare node offers no cards until the chart's agent runs.
    pub setup: Setup,
}

/// The longest unix socket path the node makes under the cluster's folder (the DRA driver's
/// registration socket), past which binding fails: the folder must leave room for it.
const LONGEST_SOCKET: &str = "node/kubelet/plugins_registry/gpu.runtimekit.aliyun.com-reg.sock";
/// The most bytes a unix socket's path may have.
const SOCKET_PATH_MAX: usize = 107;

/// Whether the node's sockets fit under the cluster's folder `dir`, with what to do if not.
pub(crate) fn check_socket_room(dir: &Path) -> Result<()> {
    let longest = dir.join(LONGEST_SOCKET);
    let length = longest.as_os_str().len();
    if length > SOCKET_PATH_MAX {
        bail!(
            "the cluster's folder {} is too deep for the real node: its socket {} would be {length} bytes, past the {SOCKET_PATH_MAX} a unix socket allows; give a shorter folder with --dir",
            dir.display(),
            longest.display()
        );
    }
    Ok(())
}

/// What the node's processes need from the host, with how to get it.
pub(crate) fn check_host() -> Result<()> {
    let missing: Vec<&str> = ["runc", "umoci", "busybox"]
        .into_iter()
        .filter(|tool| find_command(tool).is_none())
        .chain(
            [
                "/usr/lib/cni/ptp",
                "/usr/lib/cni/host-local",
                "/usr/lib/cni/loopback",
            ]
            .into_iter()
            .filter(|p| !Path::new(p).exists()),
        )
        .collect();
    if !missing.is_empty() {
        bail!(
            "the real node needs {} (install with e2e/scripts/install-node-packages.sh)",
            missing.join(", ")
        );
    }
    if !nix::unistd::geteuid().is_root() {
        bail!("the real node runs containerd and the kubelet, which need root");
    }
    let socket = Path::new(DEVICE_PLUGINS).join("kubelet.sock");
    if std::os::unix::net::UnixStream::connect(&socket).is_ok() {
        bail!(
            "another kubelet serves {} on this machine; the kubelet fixes that folder, so only one real node can run here",
            socket.display()
        );
    }
    Ok(())
}

/// Where `name` is on PATH.
fn find_command(name: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

impl Cluster {
    /// Starts the real node `name`: the resource layer, containerd and its images, the kubelet
    /// and the node agent. Returns once they run; [`RealNode::wait_ready`] waits for the Node to
    /// be Ready.
    pub fn start_real_node(&mut self, name: &str) -> Result<RealNode> {
        self.start_real_node_as(name, Setup::Installed)
    }

    /// [`Cluster::start_real_node`], the node set up as `setup` says.
    pub fn start_real_node_as(&mut self, name: &str, setup: Setup) -> Result<RealNode> {
        check_host()?;
        check_socket_room(&self.dir)?;
        let dir = self.dir.join(NODE_DIR);
        for sub in [
            "containerd",
            "cni/net.d",
            "cdi",
            "kubelet",
            "pod-logs",
            "gpu",
        ] {
            std::fs::create_dir_all(dir.join(sub))?;
        }
        let ctrd = dir.join("containerd");
        let socket = ctrd.join("containerd.sock");
        let gpu = dir.join("gpu");
        let layer_socket = gpu.join("resource-layer.sock");
        let runtime_config = dir.join("lj-runtime.json");
        // What the administrator gives the installer (the ConfigMap's lj-runtime.json).
        std::fs::write(
            dir.join(LJ_RUNTIME_SETTINGS),
            serde_json::json!({
                "runc": find_command("runc").context("runc is not on PATH")?,
                "resourceLayerSocket": layer_socket,
                "instanceWaitSeconds": 60,
                "isolationLibrary": dir.join(ISOLATION_LIBRARY),
                "isolationStateDir": dir.join(ISOLATION_DIR),
            })
            .to_string(),
        )?;
        let images = build_images(&["pause", "busybox"])?;
        let pause = images
            .iter()
            .map(|(r, _)| r.clone())
            .find(|r| r.contains("/pause:"))
            .context("build-images.sh printed no pause image")?;
        std::fs::write(
            ctrd.join("config.toml"),
            containerd_config(&ctrd, &dir.join("cni"), &dir.join("cdi"), &pause),
        )?;
        // A subnet per run, so a second cluster's pods do not take the same addresses.
        let subnet = 1 + std::process::id() % 250;
        std::fs::write(
            dir.join("cni/net.d/10-runtimekit.conflist"),
            serde_json::json!({
                "cniVersion": "1.0.0", "name": "runtimekit",
                "plugins": [
                    {"type": "ptp", "ipMasq": false, "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": format!("10.244.{subnet}.0/24")}]],
                        "dataDir": dir.join("cni/ipam"),
                    }},
                    {"type": "loopback"},
                ],
            })
            .to_string(),
        )?;
        let containerd = self.tools.containerd.join("containerd");
        // containerd finds its runc shim on PATH, ours before any other; the shims, and
        // lj-runtime under them, inherit its environment. Kept running as systemd keeps it on a
        // user's node, so the installer restarts it by ending it.
        let path = std::env::var("PATH").unwrap_or_default();
        let (supervisor, args) = supervised(
            &containerd,
            &[format!("--config={}", ctrd.join("config.toml").display())],
        );
        self.spawn_with_env(
            "containerd",
            supervisor,
            &args,
            &[
                (
                    "LJ_RUNTIME_CONFIG".into(),
                    runtime_config.display().to_string(),
                ),
                (
                    "PATH".into(),
                    format!("{}:{path}", self.tools.containerd.display()),
                ),
            ],
        )?;
        let node = RealNode {
            name: name.to_owned(),
            dir: dir.clone(),
            containerd_socket: socket,
            ctr: self.tools.containerd.join("ctr"),
            pod_logs: dir.join("pod-logs"),
            healthz_port: crate::tools::free_port()?,
            layer_socket: layer_socket.clone(),
            setup,
        };
        node.wait_for_containerd()?;
        for (reference, tar) in &images {
            node.import(reference, tar)?;
        }
        if setup == Setup::Bare {
            // Only what a user's node has: the kubelet, and later the DaemonSet.
            self.start_kubelet(&node)?;
            self.install_node_config()?;
            return Ok(node);
        }
        let install = node.installer_command("install")?;
        run(install).context("the node installer failed on the real node")?;
        let layer = workspace_binary("runtimekit-resource-layer", "runtimekit-resource-layer")?;
        std::fs::create_dir_all(gpu.join(PROFILE))?;
        self.spawn("resource-layer", &layer, &layer_args(name, &dir, PROFILE))?;
        wait_for_socket(&layer_socket)?;
        self.start_kubelet(&node)?;
        let agent_identity = self.pki.client(&agent_user(name), &[AGENT_GROUP])?;
        let agent_kubeconfig = gpu.join("agent.kubeconfig");
        std::fs::write(
            &agent_kubeconfig,
            self.pki
                .kubeconfig(&self.server, "node-agent", &agent_identity),
        )?;
        self.install_node_config()?;
        let agent = workspace_binary("runtimekit-node-agent", "runtimekit-node-agent")?;
        self.spawn("node-agent", &agent, &agent_args(name, &dir, PROFILE))?;
        Ok(node)
    }

    /// Starts the real node's kubelet.
    fn start_kubelet(&mut self, node: &RealNode) -> Result<()> {
        let name = &node.name;
        let dir = &node.dir;
        let identity = self
            .pki
            .client(&format!("system:node:{name}"), &["system:nodes"])?;
        let kubeconfig = dir.join("kubelet.kubeconfig");
        std::fs::write(
            &kubeconfig,
            self.pki.kubeconfig(&self.server, "kubelet", &identity),
        )?;
        let config = dir.join("kubelet.yaml");
        std::fs::write(&config, kubelet_config(node, crate::tools::free_port()?))?;
        let kubelet = self.tools.k8s.join("kubelet");
        self.spawn(
            "kubelet",
            &kubelet,
            &[
                format!("--config={}", config.display()),
                format!("--kubeconfig={}", kubeconfig.display()),
                format!("--root-dir={}", dir.join("kubelet").display()),
                format!("--cert-dir={}", dir.join("kubelet-pki").display()),
                format!("--hostname-override={name}"),
                "--cloud-provider=external".into(),
                format!("--node-labels={ENABLE_LABEL}=true"),
            ],
        )?;

        Ok(())
    }

    /// Restarts the real node's resource layer and node agent simulating `profile` instead, as
    /// if the node's cards had been swapped. Each profile keeps its own device stand-ins and
    /// state; the socket and the kubelet stay.
    pub fn switch_real_node_profile(&mut self, node: &RealNode, profile: &str) -> Result<()> {
        let gpu = node.dir.join("gpu");
        std::fs::create_dir_all(gpu.join(profile))?;
        let mut agent = self.stop_component("node-agent")?;
        let mut layer = self.stop_component("resource-layer")?;
        layer.args = layer_args(&node.name, &node.dir, profile);
        agent.args = agent_args(&node.name, &node.dir, profile);
        self.start_again(layer)?;
        wait_for_socket(&node.layer_socket)?;
        self.start_again(agent)
    }
}

/// The simulated resource layer's arguments for `profile`, on the socket of the node whose
/// folder is `dir`, with the profile's own stand-in devices and instance state.
fn layer_args(node: &str, dir: &Path, profile: &str) -> Vec<String> {
    let gpu = dir.join("gpu");
    let own = gpu.join(profile);
    vec![
        "serve".into(),
        "--backend=simulated".into(),
        format!("--profile={profile}"),
        format!("--node-name={node}"),
        format!("--socket={}", gpu.join("resource-layer.sock").display()),
        format!("--state-file={}", own.join("instances.json").display()),
        format!("--device-dir={}", own.join("devices").display()),
        // lj-runtime's isolationStateDir, where the compute meter writes.
        format!(
            "--isolation-state-dir={}",
            dir.join(ISOLATION_DIR).display()
        ),
    ]
}

/// The node agent's arguments, with a state folder of `profile`'s own.
fn agent_args(node: &str, dir: &Path, profile: &str) -> Vec<String> {
    let gpu = dir.join("gpu");
    let mut args = vec![
        format!("--node-name={node}"),
        format!("--kubeconfig={}", gpu.join("agent.kubeconfig").display()),
        format!(
            "--resource-layer-socket={}",
            gpu.join("resource-layer.sock").display()
        ),
        format!("--state-dir={}", gpu.join(profile).join("agent").display()),
        format!("--kubelet-dir={DEVICE_PLUGINS}"),
        format!(
            "--pod-resources-socket={}",
            dir.join("kubelet/pod-resources/kubelet.sock").display()
        ),
        "--metrics-address=127.0.0.1:0".into(),
    ];
    // The kubelet's folders are under its --root-dir; containerd reads CDI specs from `cdi`.
    args.extend(agent_dra_args(
        &dir.join("kubelet"),
        &dir.join("cdi"),
        &dir.join("lj-runtime.json"),
    ));
    args
}

impl Cluster {
    /// Applies what `config/` says a GPU node needs from the cluster: the node agent's
    /// namespace, RBAC and admission policies, and the RuntimeClass.
    pub(crate) fn install_node_config(&self) -> Result<()> {
        let config = repo_root().join("config");
        for file in [
            "namespace.yaml",
            "node-agent/rbac.yaml",
            "node-agent/admission-policy.yaml",
            "runtime/runtimeclass.yaml",
        ] {
            let mut apply = self.kubectl();
            apply
                .args(["apply", "--server-side", "--force-conflicts", "-f"])
                .arg(config.join(file));
            run(apply)?;
        }
        Ok(())
    }
}

impl RealNode {
    /// The node installer's options for this node's folder (host paths, the host's `/` at
    /// `root`), before its command.
    pub fn installer_args(&self, root: &Path) -> Vec<String> {
        let host = |p: &Path| p.display().to_string();
        let ctrd = self.dir.join("containerd");
        vec![
            format!("--node-name={}", self.name),
            format!("--host-root={}", root.display()),
            format!("--containerd-config={}", host(&ctrd.join("config.toml"))),
            format!(
                "--containerd-drop-in={}",
                host(&ctrd.join("conf.d/lj-runtime.toml"))
            ),
            format!("--containerd-socket={}", host(&self.containerd_socket)),
            format!("--lj-runtime={}", host(&self.dir.join(LJ_RUNTIME))),
            format!(
                "--lj-runtime-config={}",
                host(&self.dir.join("lj-runtime.json"))
            ),
        ]
    }

    /// The node installer run on this host, as a user without the DaemonSet runs it:
    /// `command` is `install` or `uninstall`.
    pub fn installer_command(&self, command: &str) -> Result<Command> {
        let installer = workspace_binary("runtimekit-node-agent", "runtimekit-node-installer")?;
        let lj_runtime = workspace_binary("runtimekit-lj-runtime", "lj-runtime")?;
        let library = workspace_library("runtimekit-isolation", "libruntimekit_isolation.so")?;
        let mut install = Command::new(installer);
        install
            .args(self.installer_args(Path::new("/")))
            .arg(format!(
                "--lj-runtime-settings={}",
                self.dir.join(LJ_RUNTIME_SETTINGS).display()
            ))
            .arg(format!("--lj-runtime-source={}", lj_runtime.display()))
            .arg(format!("--isolation-library-source={}", library.display()))
            .arg(command);
        Ok(install)
    }

    /// A `ctr` command against this node's containerd, in the CRI namespace.
    pub fn ctr(&self) -> Command {
        let mut command = Command::new(&self.ctr);
        command
            .arg("--address")
            .arg(&self.containerd_socket)
            .args(["--namespace", "k8s.io"]);
        command
    }

    fn wait_for_containerd(&self) -> Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let version = self.ctr().arg("version").output()?;
            if version.status.success() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "containerd did not answer on {} within {READY_TIMEOUT:?}: {}",
                    self.containerd_socket.display(),
                    String::from_utf8_lossy(&version.stderr)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Imports an OCI-layout tar into the node's containerd as `reference`
    /// (`docker.io/local/<name>:<tag>`, the name CRI looks up).
    pub fn import(&self, reference: &str, tar: &Path) -> Result<()> {
        let base = reference.rsplit_once(':').map_or(reference, |(b, _)| b);
        let mut import = self.ctr();
        import
            .args(["images", "import", "--base-name", base])
            .arg(tar);
        run(import).map(|_| ())
    }

    /// Builds (or finds cached) the images `names` and imports them; returns their references.
    pub fn import_images(&self, names: &[&str]) -> Result<Vec<String>> {
        let mut references = Vec::new();
        for (reference, tar) in build_images(names)? {
            self.import(&reference, &tar)?;
            references.push(reference);
        }
        Ok(references)
    }

    /// Whether the kubelet answers its health check.
    pub fn kubelet_healthy(&self) -> bool {
        let healthz = std::net::SocketAddr::from(([127, 0, 0, 1], self.healthz_port));
        crate::tools::http_get(healthz, "/healthz")
            .is_ok_and(|r| r.starts_with("HTTP/1.1 200") || r.starts_with("HTTP/1.0 200"))
    }

    /// Waits until the kubelet is healthy, gives the Node its address and removes the taint a
    /// cloud controller would, then waits until the Node is Ready (and, set up by the installer
    /// on the host, offers the agent's cards).
    pub async fn wait_ready(&self, client: &kube::Client) -> Result<()> {
        let nodes: Api<Node> = Api::all(client.clone());
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let healthy = self.kubelet_healthy();
            if let Some(node) = nodes.get_opt(&self.name).await?.filter(|_| healthy) {
                let addressed = addresses(&node) == ["127.0.0.1"];
                if !addressed {
                    let addresses = serde_json::json!({"status": {"addresses": [
                        {"type": "InternalIP", "address": "127.0.0.1"},
                    ]}});
                    nodes
                        .patch_status(
                            &self.name,
                            &PatchParams::default(),
                            &Patch::Merge(&addresses),
                        )
                        .await
                        .context("giving the real node its address")?;
                } else if tainted(&node) {
                    self.untaint(&nodes, &node).await?;
                } else if super::node_ready(&node)
                    && (self.setup == Setup::Bare || offers_cards(&node, WHOLE_CARDS))
                {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "node {} was not Ready{} within {READY_TIMEOUT:?}; see the logs of the kubelet, containerd, the resource layer and the node agent in {}",
                    self.name,
                    if self.setup == Setup::Bare {
                        ""
                    } else {
                        " with the node agent's cards"
                    },
                    self.dir
                        .parent()
                        .unwrap_or(&self.dir)
                        .join("logs")
                        .display()
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Removes the uninitialized taint, guarded by the resourceVersion read (a conflict is
    /// tried again by the caller's next look).
    async fn untaint(&self, nodes: &Api<Node>, node: &Node) -> Result<()> {
        let taints: Vec<_> = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default()
            .into_iter()
            .filter(|t| t.key != UNINITIALIZED)
            .collect();
        let version = node.metadata.resource_version.clone().unwrap_or_default();
        let untaint = serde_json::json!({
            "metadata": {"resourceVersion": version},
            "spec": {"taints": taints},
        });
        match nodes
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(&untaint))
            .await
        {
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
            result => result
                .map(|_| ())
                .context("removing the real node's uninitialized taint"),
        }
    }
}

fn addresses(node: &Node) -> Vec<&str> {
    node.status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .map(|a| a.iter().map(|a| a.address.as_str()).collect())
        .unwrap_or_default()
}

/// Whether the kubelet counts the node agent's cards as `resource` (its device plugins
/// registered).
pub(crate) fn offers_cards(node: &Node, resource: &str) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .and_then(|a| a.get(resource))
        .is_some_and(|q| q.0 != "0")
}

fn tainted(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == UNINITIALIZED))
}

/// Builds (or finds cached) the images `names` with e2e/scripts/build-images.sh; returns each
/// as (reference, tar).
pub fn build_images(names: &[&str]) -> Result<Vec<(String, PathBuf)>> {
    build_images_of(&repo_root(), names)
}

/// [`build_images`] of the kit's tree at `root` (another release's), by its own script.
pub fn build_images_of(root: &Path, names: &[&str]) -> Result<Vec<(String, PathBuf)>> {
    // Built once per process, as `workspace_binary` builds binaries: the demo asks for the
    // images it builds up front again when it deploys, and the script's cargo runs cost seconds.
    static BUILT: std::sync::Mutex<BTreeMap<(PathBuf, String), (String, PathBuf)>> =
        std::sync::Mutex::new(BTreeMap::new());
    let key = |name: &str| (root.to_owned(), name.to_owned());
    let mut built = BUILT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(found) = names
        .iter()
        .map(|name| built.get(&key(name)).cloned())
        .collect::<Option<Vec<_>>>()
    {
        return Ok(found);
    }
    let script = root.join("e2e/scripts/build-images.sh");
    let mut command = Command::new(&script);
    // In its own tree: the script's cargo builds the workspace it is run in.
    command.current_dir(root);
    crate::workspace_binary::plain_cargo_env(&mut command);
    // Its progress goes to the terminal; its output is the list, one line per name in order.
    command.args(names).stderr(std::process::Stdio::inherit());
    let images: Vec<(String, PathBuf)> = run(command)?
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(r, t)| (r.to_owned(), PathBuf::from(t)))
        .collect();
    if images.len() == names.len() {
        for (name, image) in names.iter().zip(&images) {
            built.insert(key(name), image.clone());
        }
    }
    Ok(images)
}

/// containerd 2's configuration (version 3), as a user's node has it before the kit: everything
/// under `dir`, runc as the default handler, CDI specs read from `cdi`, and `oom_score_adj` left
/// alone (root here lacks CAP_SYS_RESOURCE to lower it). The node installer adds `lj-runtime`
/// with runc's options.
fn containerd_config(dir: &Path, cni: &Path, cdi: &Path, pause: &str) -> String {
    let d = dir.display();
    let runtime = r#"plugins."io.containerd.cri.v1.runtime""#;
    format!(
        r#"version = 3
root = "{d}/root"
state = "{d}/state"
[grpc]
  address = "{d}/containerd.sock"
[ttrpc]
  address = "{d}/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"
[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "{pause}"
[{runtime}]
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  cdi_spec_dirs = ["{cdi}"]
[{runtime}.containerd]
  default_runtime_name = "runc"
[{runtime}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{runtime}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  Root = "{d}/runc"
[{runtime}.cni]
  bin_dirs = ["/usr/lib/cni"]
  conf_dir = "{cni}/net.d"
"#,
        cni = cni.display(),
        cdi = cdi.display(),
    )
}

/// The kubelet's configuration for cgroup v1 on this kind of machine, serving on 127.0.0.1 only.
fn kubelet_config(node: &RealNode, port: u16) -> String {
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://{socket}
address: 127.0.0.1
port: {port}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz}
authentication: {{anonymous: {{enabled: true}}, webhook: {{enabled: false}}}}
authorization: {{mode: AlwaysAllow}}
oomScoreAdj: 0
maxOpenFiles: 20000
makeIPTablesUtilChains: false
imageGCHighThresholdPercent: 100
evictionHard: {{nodefs.available: "0%", nodefs.inodesFree: "0%", imagefs.available: "0%"}}
# Device plugins' resources reach capacity at the next status computation (10 s by default);
# only changes are posted, the Lease being the heartbeat.
nodeStatusUpdateFrequency: 2s
podLogsDir: {logs}
volumePluginDir: {plugins}
{gates}"#,
        socket = node.containerd_socket.display(),
        healthz = node.healthz_port,
        logs = node.pod_logs.display(),
        plugins = node.dir.join("volume-plugins").display(),
        gates = kubelet_gates(),
    )
}

/// The release's feature gates (`crate::tools::enabled_gates`) as the kubelet's configuration
/// writes them.
fn kubelet_gates() -> String {
    let gates = crate::tools::enabled_gates();
    if gates.is_empty() {
        return String::new();
    }
    let entries: Vec<String> = gates.iter().map(|g| format!("{g}: true")).collect();
    format!("featureGates: {{{}}}\n", entries.join(", "))
}

/// Kills the containers of the real node under `cluster_dir` with the `ctr` beside its
/// `containerd`, while that still runs: its shims and containers do not stop with it.
pub fn kill_containers(cluster_dir: &Path, containerd: &Path) {
    let socket = cluster_dir
        .join(NODE_DIR)
        .join("containerd/containerd.sock");
    if !socket.exists() {
        return;
    }
    let ctr = |args: &[&str]| {
        Command::new("timeout")
            .arg("10")
            .arg(containerd.with_file_name("ctr"))
            .arg("--address")
            .arg(&socket)
            .args(["--namespace", "k8s.io"])
            .args(args)
            .output()
    };
    let Ok(listed) = ctr(&["tasks", "ls", "--quiet"]) else {
        return;
    };
    for task in String::from_utf8_lossy(&listed.stdout).lines() {
        let _ = ctr(&["tasks", "kill", "--all", "--signal", "SIGKILL", task]);
        let _ = ctr(&["tasks", "delete", "--force", task]);
    }
}

/// Removes the sockets the stopped kubelet and node agent left in the kubelet's fixed
/// device-plugin folder, if `cluster_dir` ran a real node; a socket something still answers on
/// (another kubelet's) stays.
pub fn remove_stale_sockets(cluster_dir: &Path) {
    if !cluster_dir.join(NODE_DIR).exists() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(DEVICE_PLUGINS) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let path = entry.path();
        let ours = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n == "kubelet.sock" || n.starts_with("runtimekit-"));
        if ours && std::os::unix::net::UnixStream::connect(&path).is_err() {
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// Unmounts everything mounted under `cluster_dir` (the kubelet's root folder, volumes,
/// containerd's snapshots and network namespaces), deepest first, so the folder can go.
pub fn unmount_all(cluster_dir: &Path) {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut points: Vec<PathBuf> = mounts
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(p.replace("\\040", " ")))
        .filter(|p| p.starts_with(cluster_dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    points.dedup();
    for point in points {
        let _ = nix::mount::umount2(&point, nix::mount::MntFlags::MNT_DETACH);
    }
}
