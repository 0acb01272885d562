//! This workspace's binaries, for the tests that run them: built with cargo on first use.

use anyhow::{Context, Result, bail};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

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
    plain_cargo_env(&mut command);
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
