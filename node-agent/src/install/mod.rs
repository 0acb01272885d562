//! What the node installer puts on its node so the user does not: `lj-runtime`, the isolation
//! library and lj-runtime's settings on the host, and the `lj-runtime` handler in containerd's
//! configuration ([`containerd`]), containerd restarted only when that changed ([`restart`]),
//! and the handler checked live over CRI ([`cri`]). Uninstalling takes all of it away again,
//! unless pods still run under the handler (they would be left unstoppable without
//! `lj-runtime`). Every path is the host's, reached under `root` (the host's `/` as the
//! installer's container mounts it).

pub mod cli;
pub mod containerd;
pub mod cri;
pub mod restart;
pub mod run;
pub mod status;

use containerd::{ConfigError, Current, Handler, Layout};
use restart::Restart;
use runtimekit_lj_runtime::config::RuntimeConfig;
use std::path::{Path, PathBuf};
use std::time::Duration;
use thiserror::Error;

/// How often the handler is looked for while containerd comes back.
const LIVE_POLL: Duration = Duration::from_millis(500);

/// Why the node is not (or no longer) set up.
#[derive(Debug, Error)]
pub enum InstallError {
    /// containerd cannot be asked.
    #[error("{0}")]
    Runtime(String),
    /// Its configuration is left untouched.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// lj-runtime's settings are not valid.
    #[error("{0}")]
    Settings(String),
    /// A host file cannot be read or written.
    #[error("{0}")]
    Files(String),
    /// containerd could not be restarted.
    #[error("{0}")]
    Restart(String),
    /// containerd has not read the handler (yet).
    #[error("{0}")]
    NotLive(String),
    /// Pods still run under the handler, so it stays.
    #[error(
        "pods still run under the {handler} handler ({}): the node keeps lj-runtime, its settings and the handler, since without lj-runtime containerd could not stop them; delete them and uninstall again",
        pods.join(", ")
    )]
    InUse { handler: String, pods: Vec<String> },
}

impl InstallError {
    /// The CamelCase reason the status and the condition carry.
    pub fn reason(&self) -> &'static str {
        match self {
            InstallError::Runtime(_) => "ContainerdUnreachable",
            InstallError::Config(ConfigError::Unparsable { .. }) => "ContainerdConfigUnparsable",
            InstallError::Config(ConfigError::UnknownVersion { .. }) => {
                "ContainerdConfigVersionUnknown"
            }
            InstallError::Config(ConfigError::UnknownContainerd { .. }) => {
                "ContainerdVersionUnknown"
            }
            InstallError::Config(ConfigError::Unexpected { .. }) => "ContainerdConfigUnexpected",
            InstallError::Settings(_) => "LjRuntimeSettingsInvalid",
            InstallError::Files(_) => "HostFilesNotWritten",
            InstallError::Restart(_) => "ContainerdRestartFailed",
            InstallError::NotLive(_) => "ContainerdNotRestarted",
            InstallError::InUse { .. } => "HandlerInUse",
        }
    }
}

/// containerd's files and socket, as the host names them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerdPaths {
    /// The main configuration.
    pub config: PathBuf,
    /// The installer's drop-in (containerd 2.x).
    pub drop_in: PathBuf,
    /// The CRI socket.
    pub socket: PathBuf,
}

/// A file the installer copies onto the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFile {
    /// Where it is in the installer's image.
    pub source: PathBuf,
    /// Where it goes on the host.
    pub destination: PathBuf,
    /// Its permission bits.
    pub mode: u32,
}

/// What to install where.
#[derive(Debug, Clone)]
pub struct Installer {
    /// The host's `/` as this process sees it.
    pub root: PathBuf,
    /// The host's `/proc` (the installer runs in the host's PID namespace).
    pub proc_root: PathBuf,
    /// containerd's files.
    pub containerd: ContainerdPaths,
    /// How containerd is restarted.
    pub restart: Restart,
    /// The handler containerd is given.
    pub handler: Handler,
    /// The files copied from the image: `lj-runtime` and the isolation library.
    pub files: Vec<HostFile>,
    /// lj-runtime's settings file on the host, and its text.
    pub settings: (PathBuf, String),
    /// How long containerd may take to come back with the handler.
    pub live_timeout: Duration,
}

/// What an install did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    /// containerd's version.
    pub runtime: cri::Runtime,
    /// The host files written (none when everything was in place).
    pub written: Vec<PathBuf>,
    /// Whether containerd was restarted.
    pub restarted: bool,
}

/// lj-runtime's settings: the administrator's (`base`, a JSON object, may be empty) with this
/// node's name and the resource prefix, checked as lj-runtime reads them.
pub fn lj_runtime_settings(
    base: &str,
    node: &str,
    prefix: &str,
) -> Result<(String, RuntimeConfig), String> {
    let mut settings: serde_json::Map<String, serde_json::Value> = if base.trim().is_empty() {
        serde_json::Map::new()
    } else {
        serde_json::from_str(base)
            .map_err(|e| format!("lj-runtime's settings are not a JSON object: {e}"))?
    };
    settings.insert("nodeName".into(), node.into());
    settings.insert("resourcePrefix".into(), prefix.into());
    let value = serde_json::Value::Object(settings);
    let config: RuntimeConfig =
        serde_json::from_value(value.clone()).map_err(|e| format!("lj-runtime's settings: {e}"))?;
    let mut text = serde_json::to_string_pretty(&value).map_err(|e| e.to_string())?;
    text.push('\n');
    Ok((text, config))
}

/// The backup of the main configuration, kept while the installer's edit is in it.
fn backup_of(config: &Path) -> PathBuf {
    let mut name = config.file_name().unwrap_or_default().to_os_string();
    name.push(".runtimekit-backup");
    config.with_file_name(name)
}

impl Installer {
    /// `path` (the host's) as this process reaches it.
    pub fn host(&self, path: &Path) -> PathBuf {
        self.root.join(path.strip_prefix("/").unwrap_or(path))
    }

    async fn client(
        &self,
    ) -> Result<
        runtimekit_proto::cri::v1::runtime_service_client::RuntimeServiceClient<
            tonic::transport::Channel,
        >,
        InstallError,
    > {
        cri::connect(&self.host(&self.containerd.socket))
            .await
            .map_err(InstallError::Runtime)
    }

    fn layout(&self, major: u32) -> Layout {
        containerd::layout(major, &self.containerd.drop_in)
    }

    /// The main configuration's and the drop-in's text.
    fn read_config(&self) -> Result<(String, Option<String>, u32), InstallError> {
        let main_path = self.host(&self.containerd.config);
        let main = std::fs::read_to_string(&main_path).map_err(|e| {
            InstallError::Config(ConfigError::Unexpected {
                path: self.containerd.config.clone(),
                what: if e.kind() == std::io::ErrorKind::NotFound {
                    "there is no such file (containerd runs on its defaults: write them with `containerd config default`, then the installer adds to them)".into()
                } else {
                    format!("it cannot be read ({e})")
                },
            })
        })?;
        let mode = std::fs::metadata(&main_path)
            .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o7777)
            .unwrap_or(0o644);
        let drop_in = std::fs::read_to_string(self.host(&self.containerd.drop_in)).ok();
        Ok((main, drop_in, mode))
    }

    /// Writes `edits`; returns the host paths written or removed.
    fn write_config(
        &self,
        main: &str,
        mode: u32,
        edits: &containerd::Edits,
    ) -> Result<Vec<PathBuf>, InstallError> {
        let mut written = Vec::new();
        let files = |e: String| InstallError::Files(e);
        if let Some(text) = &edits.drop_in {
            crate::host_files::write_atomically(
                &self.host(&self.containerd.drop_in),
                text.as_bytes(),
                0o644,
            )
            .map_err(files)?;
            written.push(self.containerd.drop_in.clone());
        }
        if let Some(text) = &edits.main {
            let backup = self.host(&backup_of(&self.containerd.config));
            if !backup.exists() {
                crate::host_files::write_atomically(&backup, main.as_bytes(), mode)
                    .map_err(files)?;
            }
            crate::host_files::write_atomically(
                &self.host(&self.containerd.config),
                text.as_bytes(),
                mode,
            )
            .map_err(files)?;
            written.push(self.containerd.config.clone());
        }
        if edits.remove_drop_in {
            crate::host_files::remove(&self.host(&self.containerd.drop_in)).map_err(files)?;
            written.push(self.containerd.drop_in.clone());
        }
        Ok(written)
    }

    /// Restarts containerd (by the configured mode) and waits until its live handler is
    /// `wanted` (`None`: gone).
    async fn restart_until(&self, wanted: Option<&str>) -> Result<bool, InstallError> {
        let restarted = match self.restart {
            Restart::Signal => {
                let pid = restart::signal(&self.proc_root, &self.containerd.socket)
                    .await
                    .map_err(InstallError::Restart)?;
                tracing::info!(pid, "containerd stopped to read its new configuration");
                true
            }
            Restart::None => false,
        };
        self.wait_live(wanted, restarted).await?;
        Ok(restarted)
    }

    /// Waits until containerd's live handler is `wanted`: while it comes back after a restart,
    /// up to the timeout; without one, a single look.
    async fn wait_live(&self, wanted: Option<&str>, restarted: bool) -> Result<(), InstallError> {
        let deadline = tokio::time::Instant::now() + self.live_timeout;
        loop {
            let seen = match self.client().await {
                Ok(mut client) => cri::live_binary(&mut client, &self.handler.name).await,
                Err(e) => Err(e.to_string()),
            };
            match &seen {
                Ok(binary) if binary.as_deref() == wanted => return Ok(()),
                _ if restarted && tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(LIVE_POLL).await;
                }
                Ok(binary) => {
                    let now = binary.as_deref().map_or_else(
                        || "has no such handler".to_owned(),
                        |b| format!("runs it with {b:?}"),
                    );
                    let needed = if restarted {
                        format!(
                            "after its restart, within {} s",
                            self.live_timeout.as_secs()
                        )
                    } else {
                        "(restart containerd to make it read its configuration: the installer runs with --containerd-restart=none)".to_owned()
                    };
                    return Err(InstallError::NotLive(format!(
                        "containerd {now} for {}, not {} {needed}",
                        self.handler.name,
                        wanted.map_or_else(|| "none".to_owned(), |w| format!("{w:?}")),
                    )));
                }
                Err(error) => return Err(InstallError::Runtime(error.clone())),
            }
        }
    }

    /// Sets the node up; changes nothing (and restarts nothing) when it already is.
    pub async fn install(&self) -> Result<Installed, InstallError> {
        let runtime = cri::runtime(&mut self.client().await?)
            .await
            .map_err(InstallError::Runtime)?;
        let (main, drop_in, mode) = self.read_config()?;
        let edits = containerd::install(
            Current {
                main_path: &self.containerd.config,
                main: &main,
                drop_in: drop_in.as_deref(),
            },
            runtime.major,
            &self.layout(runtime.major),
            &self.handler,
        )?;
        // The files first, so the handler never names a binary that is not there.
        let mut written = Vec::new();
        for file in &self.files {
            let content = std::fs::read(&file.source).map_err(|e| {
                InstallError::Files(format!("reading {}: {e}", file.source.display()))
            })?;
            if crate::host_files::place(&self.host(&file.destination), &content, file.mode)
                .map_err(InstallError::Files)?
            {
                written.push(file.destination.clone());
            }
        }
        let (settings_path, settings) = &self.settings;
        if crate::host_files::place(&self.host(settings_path), settings.as_bytes(), 0o644)
            .map_err(InstallError::Files)?
        {
            written.push(settings_path.clone());
        }
        written.extend(self.write_config(&main, mode, &edits)?);
        let binary = self.handler.binary.display().to_string();
        let live = match self.client().await {
            Ok(mut client) => cri::live_binary(&mut client, &self.handler.name)
                .await
                .is_ok_and(|b| b.as_deref() == Some(binary.as_str())),
            Err(_) => false,
        };
        // A configuration already in place that containerd has not read (an earlier install
        // stopped before the restart) still needs one.
        let restarted = if edits.changes() || !live {
            self.restart_until(Some(&binary)).await?
        } else {
            false
        };
        Ok(Installed {
            runtime,
            written,
            restarted,
        })
    }

    /// Takes away what [`Installer::install`] put on the node, unless pods still run under the
    /// handler; returns the host paths removed or rewritten.
    pub async fn uninstall(&self) -> Result<Vec<PathBuf>, InstallError> {
        let mut client = self.client().await?;
        let runtime = cri::runtime(&mut client)
            .await
            .map_err(InstallError::Runtime)?;
        let pods = cri::pods_using(&mut client, &self.handler.name)
            .await
            .map_err(InstallError::Runtime)?;
        if !pods.is_empty() {
            return Err(InstallError::InUse {
                handler: self.handler.name.clone(),
                pods,
            });
        }
        let (main, drop_in, mode) = self.read_config()?;
        let edits = containerd::uninstall(
            Current {
                main_path: &self.containerd.config,
                main: &main,
                drop_in: drop_in.as_deref(),
            },
            &self.layout(runtime.major),
            &self.handler,
        )?;
        let mut removed = self.write_config(&main, mode, &edits)?;
        if edits.changes() {
            self.restart_until(None).await?;
        }
        let backup = backup_of(&self.containerd.config);
        let settings = [backup, self.settings.0.clone()];
        for path in self.files.iter().map(|f| &f.destination).chain(&settings) {
            let host = self.host(path);
            if host.exists() {
                crate::host_files::remove(&host).map_err(InstallError::Files)?;
                removed.push(path.clone());
            }
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_get_the_node_and_prefix_and_typos_are_refused() {
        let (text, config) = lj_runtime_settings(
            r#"{"corePolicy": "YieldIdle", "nodeName": "elsewhere"}"#,
            "gpu-1",
            "example.com",
        )
        .unwrap();
        assert_eq!(config.node_name, "gpu-1");
        assert_eq!(config.resource_prefix, "example.com");
        assert!(text.contains("\"corePolicy\": \"YieldIdle\""), "{text}");
        let (_, defaults) = lj_runtime_settings("", "gpu-1", "aliyun.com").unwrap();
        assert_eq!(
            defaults.isolation_library,
            RuntimeConfig::default().isolation_library
        );
        let typo = lj_runtime_settings(r#"{"corepolicy": "YieldIdle"}"#, "gpu-1", "aliyun.com")
            .unwrap_err();
        assert!(typo.contains("corepolicy"), "{typo}");
        let not_object = lj_runtime_settings("[1]", "gpu-1", "aliyun.com").unwrap_err();
        assert!(not_object.contains("not a JSON object"), "{not_object}");
    }

    #[test]
    fn host_paths_are_reached_under_the_root() {
        let installer = Installer {
            root: "/host".into(),
            proc_root: "/proc".into(),
            containerd: ContainerdPaths {
                config: "/etc/containerd/config.toml".into(),
                drop_in: "/etc/containerd/conf.d/lj-runtime.toml".into(),
                socket: "/run/containerd/containerd.sock".into(),
            },
            restart: Restart::None,
            handler: Handler {
                name: "lj-runtime".into(),
                binary: "/usr/local/bin/lj-runtime".into(),
                pod_annotations: vec![],
            },
            files: vec![],
            settings: ("/etc/runtimekit/lj-runtime.json".into(), String::new()),
            live_timeout: Duration::from_secs(1),
        };
        assert_eq!(
            installer.host(Path::new("/etc/containerd/config.toml")),
            Path::new("/host/etc/containerd/config.toml")
        );
        assert_eq!(
            backup_of(Path::new("/etc/containerd/config.toml")),
            Path::new("/etc/containerd/config.toml.runtimekit-backup")
        );
    }
}
