//! The kit's previous release, which the upgrade test installs first: its tree taken from this
//! repository's history at the release's commit, kept under the tools cache (so its build is
//! done once per machine), and its images built by that tree's own build-images.sh.

use super::real_node::build_images_of;
use crate::tools::{repo_root, run};
use anyhow::{Context, Result, bail, ensure};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The previous release's version, as its workspace, images and chart carry it.
pub const PREVIOUS_VERSION: &str = "0.1.0";

/// The commit of the previous release on main.
pub const PREVIOUS_COMMIT: &str = "fb7b0bd30661c8f7527be57fa09c6fde44f02336";

/// The previous release, ready to install.
#[derive(Debug)]
pub struct PreviousRelease {
    /// Its tree (its chart is `config/helm/runtimekit` there).
    pub tree: PathBuf,
    /// Its operator and node-agent images, as (reference, tar).
    pub images: Vec<(String, PathBuf)>,
}

impl PreviousRelease {
    /// Its chart.
    pub fn chart(&self) -> PathBuf {
        self.tree.join("config/helm/runtimekit")
    }
}

/// Takes the previous release's tree out of git (once) and builds its images.
pub fn previous_release() -> Result<PreviousRelease> {
    let cache = std::env::var_os("RUNTIMEKIT_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/runtimekit")))
        .context("neither RUNTIMEKIT_CACHE nor HOME is set")?;
    let tree = cache.join("previous-release").join(PREVIOUS_COMMIT);
    if !tree.join("Cargo.toml").exists() {
        extract(&tree)?;
    }
    // Its build shares this checkout's target folder: the versions differ, so cargo keeps the
    // two releases' crates apart and builds only the kit's own crates again, not their
    // dependencies.
    let target = tree.join("target");
    if target.symlink_metadata().is_ok() {
        std::fs::remove_file(&target)
            .with_context(|| format!("replacing the link {}", target.display()))?;
    }
    std::os::unix::fs::symlink(repo_root().join("target"), &target)?;
    let images = build_images_of(&tree, &["operator", "node-agent"])?;
    // The binaries in its images are its own: the operator says its version.
    let operator = target.join("x86_64-unknown-linux-gnu/release/runtimekit-operator");
    let said = Command::new(&operator)
        .arg("--version")
        .output()
        .with_context(|| format!("running {}", operator.display()))?;
    let said = String::from_utf8_lossy(&said.stdout);
    ensure!(
        said.contains(PREVIOUS_VERSION),
        "the previous release's operator says {said:?}, not version {PREVIOUS_VERSION}"
    );
    for (reference, _) in &images {
        ensure!(
            reference.ends_with(&format!(":{PREVIOUS_VERSION}")),
            "the previous release's tree built {reference}, not version {PREVIOUS_VERSION}"
        );
    }
    Ok(PreviousRelease { tree, images })
}

/// Writes the tree of [`PREVIOUS_COMMIT`] to `tree` (whole or not at all).
fn extract(tree: &Path) -> Result<()> {
    let mut known = Command::new("git");
    known.arg("-C").arg(repo_root()).args([
        "cat-file",
        "-e",
        &format!("{PREVIOUS_COMMIT}^{{commit}}"),
    ]);
    if !known.status()?.success() {
        bail!(
            "the previous release's commit {PREVIOUS_COMMIT} is not in this checkout's history (a shallow clone?): fetch it (git fetch --unshallow) to run the upgrade test"
        );
    }
    let partial = tree.with_extension("partial");
    if partial.exists() {
        std::fs::remove_dir_all(&partial)?;
    }
    std::fs::create_dir_all(&partial)?;
    let mut archive = Command::new("bash");
    archive
        .arg("-c")
        .arg("set -o pipefail; git -C \"$1\" archive --format=tar \"$2\" | tar -x -C \"$3\"")
        .arg("sh")
        .arg(repo_root())
        .arg(PREVIOUS_COMMIT)
        .arg(&partial);
    run(archive)?;
    std::fs::rename(&partial, tree)?;
    Ok(())
}
