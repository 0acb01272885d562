//! The upstream binaries, built from the pinned Go tools modules by `e2e/scripts/build-tools.sh`.

use anyhow::{Context, Result, bail};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Where each family of upstream binaries lives.
#[derive(Debug, Clone)]
pub struct Tools {
    /// etcd.
    pub etcd: PathBuf,
    /// kube-apiserver, kube-controller-manager, kube-scheduler, kubectl.
    pub k8s: PathBuf,
    /// The JobSet controller and its CRD.
    pub jobset: PathBuf,
    /// kwok.
    pub kwok: PathBuf,
    /// containerd, its runc shim and ctr (the real node's runtime).
    pub containerd: PathBuf,
}

/// The variable that picks the Kubernetes release the harness runs (`1.35`, the oldest
/// supported); unset, it runs the current one, `e2e/tools/k8s`.
pub const RELEASE_VARIABLE: &str = "RUNTIMEKIT_K8S";

/// The tools family of the Kubernetes release `RUNTIMEKIT_K8S` names: `k8s` when unset, else
/// `k8s-<release>`, which must have its tools module under `e2e/tools/`.
fn k8s_family() -> Result<String> {
    let Some(release) = std::env::var(RELEASE_VARIABLE)
        .ok()
        .filter(|r| !r.is_empty())
    else {
        return Ok("k8s".into());
    };
    let family = format!("k8s-{release}");
    let tools = repo_root().join("e2e/tools");
    if !tools.join(&family).join("go.mod").exists() {
        let known: Vec<String> = std::fs::read_dir(&tools)
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .filter_map(|n| n.strip_prefix("k8s-").map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        bail!(
            "{RELEASE_VARIABLE}={release}: no tools module e2e/tools/{family}; the releases besides the current one are: {}",
            known.join(", ")
        );
    }
    Ok(family)
}

/// The DRA features the kit uses that are beta (on by default) from 1.36 and alpha on 1.35:
/// partitionable devices (MIG placements on counters), consumable capacity (time-division
/// shares), extended resources backed by DeviceClasses, and device taints (faulted cards).
const ALPHA_ON_1_35: [&str; 4] = [
    "DRAPartitionableDevices",
    "DRAConsumableCapacity",
    "DRAExtendedResource",
    "DRADeviceTaints",
];

/// The feature gates every component of the release `RUNTIMEKIT_K8S` names turns on (none:
/// the release's defaults).
pub fn enabled_gates() -> &'static [&'static str] {
    match std::env::var(RELEASE_VARIABLE).ok().as_deref() {
        Some("1.35") => &ALPHA_ON_1_35,
        _ => &[],
    }
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

impl Tools {
    /// Builds the binaries if the cache lacks them (minutes on a fresh machine, with progress on
    /// stderr) and returns where they are.
    pub fn ensure() -> Result<Tools> {
        let k8s = k8s_family()?;
        let dirs = build_tools(&["etcd", "kwok", "jobset", &k8s, "containerd"])?;
        let family = |prefix: &str| {
            dirs.iter()
                .find(|d| {
                    d.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with(prefix))
                })
                .cloned()
                .with_context(|| format!("build-tools.sh printed no {prefix} directory"))
        };
        Ok(Tools {
            etcd: family("etcd-")?,
            k8s: family("k8s-")?,
            jobset: family("jobset-")?,
            kwok: family("kwok-")?,
            containerd: family("containerd-")?,
        })
    }

    /// The scheduler benchmark's peer, Volcano's vc-scheduler, and its CRDs: built on first use
    /// (minutes), not with the rest, since only the benchmark needs it.
    pub fn volcano() -> Result<PathBuf> {
        build_tools(&["volcano"])?
            .pop()
            .context("build-tools.sh printed no volcano directory")
    }

    /// The `helm` binary (helm.sh/helm/v4 built from e2e/tools/helm), built on first use.
    pub fn helm() -> Result<PathBuf> {
        Ok(build_tools(&["helm"])?
            .pop()
            .context("build-tools.sh printed no helm directory")?
            .join("helm"))
    }

    /// The kubectl built with the control plane (same version, so no skew warnings).
    pub fn kubectl(&self) -> PathBuf {
        self.k8s.join("kubectl")
    }
}

/// Runs `e2e/scripts/build-tools.sh` for `families`; returns the directories it printed, one
/// per family.
fn build_tools(families: &[&str]) -> Result<Vec<PathBuf>> {
    let script = repo_root().join("e2e/scripts/build-tools.sh");
    let output = Command::new(&script)
        .args(families)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !output.status.success() {
        bail!("{} failed ({})", script.display(), output.status);
    }
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(PathBuf::from)
        .collect())
}

/// A TCP port free on 127.0.0.1 now.
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// `text` percent-encoded for a URL's query (every byte but unreserved ones).
pub fn url_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The body of an HTTP response (after the blank line ending its headers).
pub fn http_body(response: &str) -> &str {
    response.split_once("\r\n\r\n").map_or("", |(_, body)| body)
}

/// GETs `path` from a plain-HTTP endpoint on `addr` (the operator's /metrics, /healthz,
/// /readyz) and returns the whole response, status line and headers included.
pub fn http_get(addr: std::net::SocketAddr, path: &str) -> std::io::Result<String> {
    use std::io::{Read, Write};
    // Bounded, so a stuck server fails the caller's wait instead of hanging it.
    let timeout = std::time::Duration::from_secs(10);
    let mut stream = std::net::TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    Ok(response)
}

/// Runs `command` to its end: its standard output, or an error saying what it was and its
/// standard error.
pub fn run(mut command: Command) -> Result<String> {
    let output = command
        .output()
        .with_context(|| format!("starting {command:?}"))?;
    if !output.status.success() {
        bail!(
            "{command:?} failed ({}): {}{}",
            output.status,
            String::from_utf8_lossy(&output.stderr),
            String::from_utf8_lossy(&output.stdout)
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Waits until `check` returns `Some`, polling every 100 ms, for at most `timeout`; an error is
/// remembered and tried again (the apiserver may be busy), and said if time runs out.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: std::time::Duration, check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    wait_for_every(what, timeout, std::time::Duration::from_millis(100), check).await
}

/// [`wait_for`], polling every `every`: for checks that read much (thousands of nodes).
pub async fn wait_for_every<T, F, Fut>(
    what: &str,
    timeout: std::time::Duration,
    every: std::time::Duration,
    mut check: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let deadline = std::time::Instant::now() + timeout;
    let mut last_error = None;
    loop {
        match check().await {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => {}
            Err(e) => last_error = Some(e),
        }
        if std::time::Instant::now() > deadline {
            let detail = last_error
                .map(|e| format!(" (last error: {e:#})"))
                .unwrap_or_default();
            bail!("timed out after {timeout:?} waiting for {what}{detail}");
        }
        tokio::time::sleep(every).await;
    }
}
