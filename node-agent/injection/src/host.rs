//! What both ways of giving cards do on the host: read a device file's type and numbers, and
//! make a time-division holder's isolation folder (its memory ledger, the measurements folder
//! and its preload list) so the container can be given the library.

use crate::isolation::{self, Enforcement};
use std::path::{Path, PathBuf};

/// How a device file's type and numbers are read: [`stat`] on the host, a stand-in in tests.
pub type Stat<'a> = &'a dyn Fn(&Path) -> Option<(char, u64, u64)>;

/// The type (`c` or `b`), major and minor of a device file; `None` for anything else.
pub fn stat(path: &Path) -> Option<(char, u64, u64)> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let metadata = std::fs::metadata(path).ok()?;
    let kind = metadata.file_type();
    let letter = if kind.is_char_device() {
        'c'
    } else if kind.is_block_device() {
        'b'
    } else {
        return None;
    };
    let rdev = metadata.rdev();
    Some((
        letter,
        nix::sys::stat::major(rdev),
        nix::sys::stat::minor(rdev),
    ))
}

/// Where a holder's isolation files go and what it is given.
#[derive(Debug, Clone)]
pub struct IsolationFolder<'a> {
    /// The library on the host.
    pub library: &'a Path,
    /// The holder's own folder (under the isolation state folder).
    pub folder: PathBuf,
    /// The image's own `/etc/ld.so.preload`, kept before the library (empty when unknown).
    pub image_preload: &'a str,
    /// `RUNTIMEKIT_GPU_CORE_POLICY`.
    pub core_policy: &'static str,
}

/// Makes the holder's ledger and measurements folders and preload list. A holder that must be
/// held to its caps is not given its card without the library.
pub fn make_isolation_folder(wanted: &IsolationFolder<'_>) -> Result<Enforcement, String> {
    use std::os::unix::fs::PermissionsExt;
    let library = wanted.library;
    if !library.is_file() {
        return Err(format!(
            "the isolation library {} is missing on this node, so the container's GPU memory cap could not be enforced (install it beside lj-runtime, or set isolationLibrary in the lj-runtime settings)",
            library.display()
        ));
    }
    let folder = &wanted.folder;
    let ledger = folder.join(runtimekit_isolation_files::LEDGER_FOLDER);
    std::fs::create_dir_all(&ledger)
        // The container's processes may run as any user: all of them share the ledger.
        .and_then(|()| std::fs::set_permissions(&ledger, std::fs::Permissions::from_mode(0o777)))
        .map_err(|e| format!("making {}: {e}", ledger.display()))?;
    // Root's, and read-only in the container: only the meter writes there.
    let measured = folder.join(runtimekit_isolation_files::MEASURED_FOLDER);
    std::fs::create_dir_all(&measured)
        .and_then(|()| std::fs::set_permissions(&measured, std::fs::Permissions::from_mode(0o755)))
        .map_err(|e| format!("making {}: {e}", measured.display()))?;
    let preload = folder.join("ld.so.preload");
    std::fs::write(&preload, isolation::preload_list(wanted.image_preload))
        .map_err(|e| format!("writing {}: {e}", preload.display()))?;
    Ok(Enforcement {
        library: library.display().to_string(),
        preload: preload.display().to_string(),
        ledger: ledger.display().to_string(),
        measured: measured.display().to_string(),
        core_policy: wanted.core_policy,
    })
}
