//! The node installer against real containerd releases, each kept running by a supervisor as
//! systemd keeps it on a user's node: containerd 2.4 (the drop-in and one import) and Debian's
//! containerd 1.6 (the table merged into the main file, with a backup). A container started
//! before must keep running through every restart; a second install restarts nothing;
//! uninstall gives back the exact configuration and removes every file; a configuration that
//! is not TOML is left untouched with the reason.

use anyhow::{Context, Result, bail, ensure};
use runtimekit_e2e::harness::Test;
use runtimekit_e2e::real_node::build_images;
use runtimekit_e2e::supervise::supervised;
use runtimekit_e2e::tools::Tools;
use runtimekit_e2e::workspace_binary::{workspace_binary, workspace_library};
use runtimekit_e2e::{TestContext, tests};
use runtimekit_node_agent::install::cri;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

pub const TESTS: &[Test] = tests![
    node_installer_sets_up_containerd_2_with_a_drop_in_and_undoes_it,
    node_installer_sets_up_containerd_1_6_by_a_marked_merge_and_undoes_it,
];

const WAIT: Duration = Duration::from_secs(60);

/// One containerd release to install on.
struct Release {
    /// Its folder (containerd, its runc shim and ctr).
    bin: PathBuf,
    /// Its configuration's text for a node folder.
    config: fn(&Path) -> String,
    /// Whether the installer writes a drop-in (2.x) or merges into the main file (1.x).
    drop_in: bool,
}

/// A containerd 2.x configuration (version 3), everything under `dir`.
fn config_v3(dir: &Path) -> String {
    let d = dir.display();
    format!(
        r#"# The node's own settings.
version = 3
root = "{d}/root"
state = "{d}/state"

[grpc]
  address = "{d}/containerd.sock"
[ttrpc]
  address = "{d}/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"
[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
  SystemdCgroup = false
"#
    )
}

/// A containerd 1.6 configuration (version 2), everything under `dir`.
fn config_v2(dir: &Path) -> String {
    let d = dir.display();
    format!(
        r#"version = 2
root = "{d}/root"
state = "{d}/state"

[grpc]
  address = "{d}/containerd.sock"
[ttrpc]
  address = "{d}/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"
[plugins."io.containerd.grpc.v1.cri"]
  restrict_oom_score_adj = true
  # The runc handler, as the node's administrator wrote it.
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = false
"#
    )
}

async fn node_installer_sets_up_containerd_2_with_a_drop_in_and_undoes_it(
    ctx: TestContext,
) -> Result<()> {
    let bin = Tools::ensure()?.containerd;
    round_trip(
        &ctx,
        &Release {
            bin,
            config: config_v3,
            drop_in: true,
        },
    )
    .await
}

async fn node_installer_sets_up_containerd_1_6_by_a_marked_merge_and_undoes_it(
    ctx: TestContext,
) -> Result<()> {
    let bin = PathBuf::from("/usr/bin");
    if !bin.join("containerd").exists() || !bin.join("containerd-shim-runc-v2").exists() {
        bail!("Debian's containerd 1.6 is missing: run e2e/scripts/install-node-packages.sh");
    }
    round_trip(
        &ctx,
        &Release {
            bin,
            config: config_v2,
            drop_in: false,
        },
    )
    .await
}

/// The node folder's paths.
struct Node {
    dir: PathBuf,
    socket: PathBuf,
    ctr: PathBuf,
}

impl Node {
    fn config(&self) -> PathBuf {
        self.dir.join("config.toml")
    }

    fn drop_in(&self) -> PathBuf {
        self.dir.join("conf.d/lj-runtime.toml")
    }

    fn lj_runtime(&self) -> PathBuf {
        self.dir.join("bin/lj-runtime")
    }

    fn library(&self) -> PathBuf {
        self.dir.join("lib/libruntimekit_isolation.so")
    }

    fn settings(&self) -> PathBuf {
        self.dir.join("lj-runtime.json")
    }

    fn ctr(&self, args: &[&str]) -> Result<String> {
        let mut ctr = Command::new("timeout");
        ctr.arg("30")
            .arg(&self.ctr)
            .arg("--address")
            .arg(&self.socket)
            .args(["--namespace", "installer-test"])
            .args(args);
        runtimekit_e2e::tools::run(ctr)
    }

    /// The PID of the process serving containerd's socket.
    fn containerd_pid(&self) -> Result<i32> {
        crate::real_node::containerd_pid(&self.socket)
    }

    /// The binary containerd's live configuration gives the handler, once it answers.
    async fn live(&self, ctx: &TestContext) -> Result<Option<String>> {
        ctx.wait_for("containerd answering over CRI", WAIT, || async {
            let Ok(mut client) = cri::connect(&self.socket).await else {
                return Ok(None);
            };
            Ok(cri::live_binary(&mut client, "lj-runtime").await.ok())
        })
        .await
    }

    /// The keeper container's task: `(pid, status)`.
    fn keeper(&self) -> Result<(String, String)> {
        let listed = self.ctr(&["tasks", "ls"])?;
        listed
            .lines()
            .find_map(|l| {
                let fields: Vec<&str> = l.split_whitespace().collect();
                (fields.first() == Some(&"keeper"))
                    .then(|| (fields[1].to_owned(), fields[2].to_owned()))
            })
            .context("the keeper container's task is gone")
    }
}

/// Runs the installer with `command` on `node`.
fn installer(node: &Node, command: &str) -> Result<Output> {
    let binary = workspace_binary("runtimekit-node-agent", "runtimekit-node-installer")?;
    let lj_runtime = workspace_binary("runtimekit-lj-runtime", "lj-runtime")?;
    let library = workspace_library("runtimekit-isolation", "libruntimekit_isolation.so")?;
    let path = |p: &Path| p.display().to_string();
    Ok(Command::new("timeout")
        .arg("180")
        .arg(binary)
        .args([
            "--node-name=installer-test",
            "--host-root=/",
            &format!("--containerd-config={}", path(&node.config())),
            &format!("--containerd-drop-in={}", path(&node.drop_in())),
            &format!("--containerd-socket={}", path(&node.socket)),
            &format!("--lj-runtime={}", path(&node.lj_runtime())),
            &format!("--lj-runtime-config={}", path(&node.settings())),
            &format!(
                "--lj-runtime-settings={}",
                path(&node.dir.join("settings.json"))
            ),
            &format!("--lj-runtime-source={}", path(&lj_runtime)),
            &format!("--isolation-library-source={}", path(&library)),
            "--restart-timeout=60s",
            command,
        ])
        .output()?)
}

fn succeeded(output: &Output, what: &str) -> Result<()> {
    ensure!(
        output.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}

fn mode(path: &Path) -> Result<u32> {
    Ok(std::fs::metadata(path)?.permissions().mode() & 0o777)
}

async fn round_trip(ctx: &TestContext, release: &Release) -> Result<()> {
    let dir = ctx.scratch_dir()?.join("node");
    std::fs::create_dir_all(&dir)?;
    let node = Node {
        socket: dir.join("containerd.sock"),
        ctr: release.bin.join("ctr"),
        dir,
    };
    let original = (release.config)(&node.dir);
    std::fs::write(node.config(), &original)?;
    std::fs::write(
        node.dir.join("settings.json"),
        serde_json::json!({"isolationLibrary": node.library()}).to_string(),
    )?;
    let (sh, args) = supervised(
        &release.bin.join("containerd"),
        &[format!("--config={}", node.config().display())],
    );
    let path = format!(
        "{}:{}",
        release.bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let _containerd = ctx.spawn("containerd", sh, &args, &[("PATH", &path)])?;
    ensure!(
        node.live(ctx).await?.is_none(),
        "containerd knows lj-runtime before the installer ran"
    );

    // A container that must run on through every restart.
    let (reference, tar) = build_images(&["busybox"])?
        .pop()
        .context("build-images.sh printed no busybox image")?;
    let base = reference
        .rsplit_once(':')
        .map_or(reference.as_str(), |(b, _)| b);
    node.ctr(&[
        "images",
        "import",
        "--base-name",
        base,
        &tar.display().to_string(),
    ])?;
    node.ctr(&["run", "-d", &reference, "keeper", "sleep", "3600"])?;
    let keeper = node.keeper()?;
    ensure!(keeper.1 == "RUNNING", "keeper: {keeper:?}");

    let before = node.containerd_pid()?;
    succeeded(&installer(&node, "install")?, "install")?;
    let lj_runtime = node.lj_runtime().display().to_string();
    ensure!(
        node.live(ctx).await?.as_deref() == Some(lj_runtime.as_str()),
        "containerd does not run lj-runtime after the install"
    );
    let after = node.containerd_pid()?;
    ensure!(
        after != before,
        "containerd was not restarted (PID {before})"
    );
    ensure!(
        node.keeper()? == keeper,
        "the keeper container did not run on through the restart"
    );
    ensure!(mode(&node.lj_runtime())? == 0o755 && mode(&node.library())? == 0o644);
    let settings: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(node.settings())?)?;
    ensure!(settings["nodeName"] == "installer-test", "{settings}");
    let main = std::fs::read_to_string(node.config())?;
    let backup = node.dir.join("config.toml.runtimekit-backup");
    if release.drop_in {
        ensure!(node.drop_in().exists(), "no drop-in");
        let without_import: String = main
            .lines()
            .filter(|l| !l.starts_with("imports = "))
            .map(|l| format!("{l}\n"))
            .collect();
        ensure!(
            without_import == original && main.contains(&node.drop_in().display().to_string()),
            "the main file changed beyond one import of the drop-in:\n{main}"
        );
    } else {
        ensure!(!node.drop_in().exists(), "a drop-in on containerd 1.6");
        ensure!(
            main.contains("Managed by the runtimekit node agent"),
            "no marked table:\n{main}"
        );
        ensure!(main.contains("SystemdCgroup = false"));
    }
    ensure!(
        std::fs::read_to_string(&backup)? == original,
        "the backup is not the node's configuration"
    );

    // Twice: nothing changes, nothing restarts.
    succeeded(&installer(&node, "install")?, "the second install")?;
    ensure!(
        node.containerd_pid()? == after,
        "the second install restarted containerd"
    );
    ensure!(std::fs::read_to_string(node.config())? == main);

    succeeded(&installer(&node, "uninstall")?, "uninstall")?;
    ensure!(
        node.live(ctx).await?.is_none(),
        "containerd still knows lj-runtime after the uninstall"
    );
    ensure!(
        std::fs::read_to_string(node.config())? == original,
        "uninstall did not give back the node's configuration"
    );
    for path in [
        node.drop_in(),
        node.lj_runtime(),
        node.library(),
        node.settings(),
        backup,
    ] {
        ensure!(!path.exists(), "{} is left on the node", path.display());
    }
    ensure!(
        node.keeper()? == keeper,
        "the keeper container did not run on through the uninstall's restart"
    );

    // Not TOML: untouched, with the reason, and no restart.
    let broken = format!("{original}\n[plugins\n");
    std::fs::write(node.config(), &broken)?;
    let pid = node.containerd_pid()?;
    let refused = installer(&node, "install")?;
    let stderr = String::from_utf8_lossy(&refused.stderr);
    ensure!(!refused.status.success(), "installed over a broken file");
    ensure!(
        stderr.contains("cannot be read as TOML") && stderr.contains("left untouched"),
        "{stderr}"
    );
    ensure!(std::fs::read_to_string(node.config())? == broken);
    ensure!(node.containerd_pid()? == pid, "containerd was restarted");
    ensure!(!node.lj_runtime().exists(), "lj-runtime was copied anyway");

    node.ctr(&["tasks", "kill", "--signal", "SIGKILL", "keeper"])?;
    ctx.wait_for("the keeper stopped", WAIT, || async {
        Ok(node
            .keeper()
            .map_or(Some(()), |(_, s)| (s == "STOPPED").then_some(())))
    })
    .await?;
    node.ctr(&["containers", "delete", "keeper"])?;
    Ok(())
}
