//! What the installer tells the agent beside it: a small JSON file in a folder both containers
//! mount (the agent follows it: runtime_status.rs).

use serde::{Deserialize, Serialize};
use std::path::Path;

/// The installer's last word.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstallStatus {
    /// Whether containerd runs the handler with the installed `lj-runtime`.
    pub ready: bool,
    /// A CamelCase reason (`Installed`, `ContainerdConfigUnparsable`, ...).
    pub reason: String,
    /// What a person reads.
    pub message: String,
}

impl InstallStatus {
    /// Writes the status to `path`, whole.
    pub fn write(&self, path: &Path) -> Result<(), String> {
        let text = serde_json::to_vec(self).map_err(|e| e.to_string())?;
        crate::host_files::write_atomically(path, &text, 0o644)
    }

    /// The status at `path`; `None` while the installer has written none.
    pub fn read(path: &Path) -> Option<InstallStatus> {
        let text = std::fs::read(path).ok()?;
        Some(
            serde_json::from_slice(&text).unwrap_or_else(|e| InstallStatus {
                ready: false,
                reason: "InstallStatusUnreadable".into(),
                message: format!(
                    "the installer's status {} is not readable: {e}",
                    path.display()
                ),
            }),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_is_read_back_as_written() {
        let dir = std::env::temp_dir().join(format!("rk-install-status-{}", std::process::id()));
        let path = dir.join("status.json");
        assert_eq!(InstallStatus::read(&path), None);
        let status = InstallStatus {
            ready: true,
            reason: "Installed".into(),
            message: "containerd v2.4.2 runs lj-runtime".into(),
        };
        status.write(&path).unwrap();
        assert_eq!(InstallStatus::read(&path), Some(status));
        std::fs::write(&path, "{").unwrap();
        let broken = InstallStatus::read(&path).unwrap();
        assert!(!broken.ready);
        assert_eq!(broken.reason, "InstallStatusUnreadable");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
