//! The DRA driver's record of the claims it prepared, kept in a file so a restarted agent
//! knows them before the kubelet asks again: which devices each claim holds (the cards the
//! enactor and the device plugin must then keep off), what the kubelet was answered, the CDI
//! spec written and the isolation folders made. Written through a temporary file and a rename
//! after every change; a file that cannot be read stops the agent rather than forget a claim.

use crate::model::PreparedDevice;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The format written; a file of another version is refused.
pub const VERSION: u32 = 1;

/// One device of a claim as the kubelet was told.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AnsweredDevice {
    /// The requests it was allocated for (as the allocation names them).
    pub requests: Vec<String>,
    /// The pool (this node).
    pub pool: String,
    /// The device.
    pub device: String,
    /// The CDI devices the container gets for it.
    pub cdi_ids: Vec<String>,
    /// The share's ID (a device allocated more than once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
}

/// A claim prepared on this node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedClaim {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// What it holds.
    pub devices: Vec<PreparedDevice>,
    /// What the kubelet was answered.
    pub answered: Vec<AnsweredDevice>,
    /// The CDI spec written for it (written again when missing).
    pub cdi_spec: serde_json::Value,
    /// The isolation folders made for its shares.
    #[serde(default)]
    pub folders: Vec<PathBuf>,
}

/// Every claim prepared on this node, by UID.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Checkpoint {
    /// The format.
    pub version: u32,
    /// The claims.
    pub claims: BTreeMap<String, PreparedClaim>,
}

impl Checkpoint {
    /// Every device every claim holds.
    pub fn devices(&self) -> Vec<PreparedDevice> {
        self.claims
            .values()
            .flat_map(|c| c.devices.iter().cloned())
            .collect()
    }

    /// Reads the file; a missing one is an empty record.
    pub fn load(path: &Path) -> Result<Checkpoint, String> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Checkpoint {
                    version: VERSION,
                    ..Checkpoint::default()
                });
            }
            Err(e) => return Err(format!("reading {}: {e}", path.display())),
        };
        let checkpoint: Checkpoint = serde_json::from_str(&text).map_err(|e| {
            format!(
                "{} is not a DRA checkpoint ({e}); the claims it records would be lost, so the agent stops (move the file away only once no claim is prepared on this node)",
                path.display()
            )
        })?;
        if checkpoint.version != VERSION {
            return Err(format!(
                "{} has format {}, this agent reads {VERSION}",
                path.display(),
                checkpoint.version
            ));
        }
        Ok(checkpoint)
    }

    /// Writes the file whole.
    pub fn save(&self, path: &Path) -> Result<(), String> {
        let text = serde_json::to_string_pretty(self).map_err(|e| e.to_string())?;
        crate::host_files::write_atomically(path, text.as_bytes(), 0o600)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ClaimPod;
    use runtimekit_crds::SliceMode;

    #[test]
    fn a_checkpoint_reads_back_and_a_broken_one_is_refused() {
        let dir = std::env::temp_dir().join(format!("rk-dra-checkpoint-{}", std::process::id()));
        let path = dir.join("checkpoint.json");
        let empty = Checkpoint::load(&path).expect("missing is empty");
        assert!(empty.claims.is_empty());
        let mut checkpoint = empty;
        checkpoint.claims.insert(
            "u1".into(),
            PreparedClaim {
                namespace: "team".into(),
                name: "train".into(),
                devices: vec![PreparedDevice {
                    claim: "team/train".into(),
                    claim_uid: "u1".into(),
                    request: "gpu".into(),
                    device: "gpu-0".into(),
                    card: Some(0),
                    mode: Some(SliceMode::Whole),
                    instance_key: None,
                    core: None,
                    memory_mib: None,
                    pods: vec![ClaimPod {
                        name: "p".into(),
                        uid: "pod-uid".into(),
                    }],
                }],
                answered: vec![],
                cdi_spec: serde_json::json!({}),
                folders: vec![],
            },
        );
        checkpoint.save(&path).expect("save");
        let read = Checkpoint::load(&path).expect("load");
        assert_eq!(read, checkpoint);
        assert_eq!(read.devices().len(), 1);
        std::fs::write(&path, "{not json").expect("write");
        let refused = Checkpoint::load(&path).expect_err("broken");
        assert!(refused.contains("would be lost"), "{refused}");
        std::fs::write(&path, r#"{"version": 9, "claims": {}}"#).expect("write");
        assert!(
            Checkpoint::load(&path)
                .expect_err("future")
                .contains("format 9")
        );
        std::fs::remove_dir_all(&dir).expect("clean");
    }
}
