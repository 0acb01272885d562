//! This workspace's binaries and shared libraries, for the tests that run them: built with cargo on first use.

use anyhow::{Context, Result, bail};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

/// The path of a binary of this workspace, built with cargo on first use in a run (a no-op
/// when it is up to date), in the same profile as the tests. `RUNTIMEKIT_BIN_<NAME>` (the
/// binary's name in upper case, `-` as `_`) names a prebuilt one instead.
pub fn workspace_binary(package: &str, binary: &str) -> Result<PathBuf> {
    build_once(package, Artifact::Binary(binary))
}

/// The path of a shared library (`cdylib`) of this workspace, built like
/// [`workspace_binary`]; `file` is its file name (`libruntimekit_isolation.so`). Building a
/// package's binary does not build its `cdylib`, so a test needing both asks for each.
pub fn workspace_library(package: &str, file: &str) -> Result<PathBuf> {
    build_once(package, Artifact::Library(file))
}

enum Artifact<'a> {
    Binary(&'a str),
    Library(&'a str),
}

impl Artifact<'_> {
    fn name(&self) -> &str {
        match self {
            Artifact::Binary(name) | Artifact::Library(name) => name,
        }
    }

    /// The file this artifact is in cargo's `compiler-artifact` message, if it is there.
    fn find_in(&self, message: &serde_json::Value) -> Option<PathBuf> {
        match self {
            Artifact::Binary(name) => (message["target"]["name"] == *name)
                .then(|| message["executable"].as_str().map(PathBuf::from))
                .flatten(),
            Artifact::Library(file) => message["filenames"]
                .as_array()?
                .iter()
                .filter_map(|f| f.as_str().map(PathBuf::from))
                .find(|f| f.file_name().is_some_and(|n| n == *file)),
        }
    }
}

fn build_once(package: &str, artifact: Artifact) -> Result<PathBuf> {
    static BUILT: Mutex<BTreeMap<String, PathBuf>> = Mutex::new(BTreeMap::new());
    let name = artifact.name();
    let variable = format!(
        "RUNTIMEKIT_BIN_{}",
        name.to_uppercase().replace(['-', '.'], "_")
    );
    if let Some(path) = std::env::var_os(&variable) {
        return Ok(PathBuf::from(path));
    }
    let mut built = BUILT
        .lock()
        .map_err(|_| anyhow::anyhow!("build list poisoned"))?;
    if let Some(path) = built.get(name) {
        return Ok(path.clone());
    }
    let cargo = std::env::var_os("CARGO")
        .or_else(|| option_env!("CARGO").map(Into::into))
        .unwrap_or_else(|| "cargo".into());
    let mut command = std::process::Command::new(cargo);
    plain_cargo_env(&mut command);
    command
        .current_dir(crate::tools::repo_root())
        .args(["build", "-p", package])
        .args(match artifact {
            Artifact::Binary(binary) => vec!["--bin", binary],
            Artifact::Library(_) => vec!["--lib"],
        })
        .arg("--message-format=json-render-diagnostics")
        .stderr(std::process::Stdio::inherit());
    if !cfg!(debug_assertions) {
        command.arg("--release");
    }
    let output = command
        .output()
        .with_context(|| format!("building {name} with cargo"))?;
    if !output.status.success() {
        bail!("cargo could not build {name} ({})", output.status);
    }
    let path = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact")
        .find_map(|m| artifact.find_in(&m))
        .with_context(|| format!("cargo built no file named {name}"))?;
    built.insert(name.to_owned(), path.clone());
    Ok(path)
}

/// Removes from `command`'s environment the variables cargo sets for the test itself: they would
/// make a cargo build it runs differ from a plain one (build scripts watch some), and rebuild
/// dependencies for nothing.
pub fn plain_cargo_env(command: &mut std::process::Command) {
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
}
