//! The state file: what the resource layer must remember across its own restarts (instance
//! keys, TDM shares, simulated MIG instances), as JSON written atomically (temp file + rename).

use crate::error::LayerError;
use crate::instances::InstanceRecord;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The version of the state file format.
const VERSION: u32 = 1;

/// What the state file holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StateFile {
    pub version: u32,
    /// Which backend wrote it (`simulated:<profile>` or `nvml`).
    pub backend: String,
    pub node_name: String,
    pub instances: Vec<InstanceRecord>,
}

/// A state file on disk.
#[derive(Debug, Clone)]
pub struct Store {
    path: PathBuf,
}

impl Store {
    /// The state file at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn error(&self, message: impl std::fmt::Display) -> LayerError {
        LayerError::State {
            path: self.path.display().to_string(),
            message: message.to_string(),
        }
    }

    /// Reads it; `None` when there is no file yet. A file written by another backend or for
    /// another node is an error rather than silently ignored.
    pub fn load(&self, backend: &str, node_name: &str) -> Result<Option<StateFile>, LayerError> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(self.error(e)),
        };
        let state: StateFile = serde_json::from_str(&text).map_err(|e| self.error(e))?;
        if state.version != VERSION {
            return Err(self.error(format!("format version {} is not {VERSION}", state.version)));
        }
        if state.backend != backend || state.node_name != node_name {
            return Err(self.error(format!(
                "it was written by {} for node {}, not by {backend} for node {node_name}",
                state.backend, state.node_name
            )));
        }
        Ok(Some(state))
    }

    /// Writes it atomically.
    pub fn save(
        &self,
        backend: &str,
        node_name: &str,
        instances: &[InstanceRecord],
    ) -> Result<(), LayerError> {
        let state = StateFile {
            version: VERSION,
            backend: backend.to_string(),
            node_name: node_name.to_string(),
            instances: instances.to_vec(),
        };
        let text = serde_json::to_string_pretty(&state).map_err(|e| self.error(e))?;
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| self.error(e))?;
        }
        let mut tmp = self.path.clone().into_os_string();
        tmp.push(".tmp");
        std::fs::write(&tmp, text).map_err(|e| self.error(e))?;
        std::fs::rename(&tmp, &self.path).map_err(|e| self.error(e))
    }
}

/// Changes the records and saves them; a failed save puts the records back, so memory never
/// holds what the state file does not. Nothing is saved when the change changed nothing.
pub fn change_and_save(
    records: &mut Vec<InstanceRecord>,
    change: impl FnOnce(&mut Vec<InstanceRecord>),
    save: impl FnOnce(&[InstanceRecord]) -> Result<(), LayerError>,
) -> Result<(), LayerError> {
    let before = records.clone();
    change(records);
    if *records == before {
        return Ok(());
    }
    if let Err(error) = save(records) {
        *records = before;
        return Err(error);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::instances::ShareSpec;
    use crate::util::testdir::TestDir;

    fn tdm_record() -> InstanceRecord {
        InstanceRecord {
            key: Some("a".into()),
            device_index: 0,
            device_uuid: "GPU-0".into(),
            spec: ShareSpec::Tdm {
                core_percent: 30,
                memory_mib: 1024,
            },
            mig: None,
            created_unix_ms: 5,
        }
    }

    #[test]
    fn save_then_load_and_refuse_a_foreign_file() {
        let dir = TestDir::new("store");
        let store = Store::new(dir.path().join("sub/state.json"));
        assert_eq!(store.load("nvml", "n1"), Ok(None));
        let record = tdm_record();
        store
            .save("nvml", "n1", std::slice::from_ref(&record))
            .expect("save");
        let loaded = store.load("nvml", "n1").expect("load").expect("present");
        assert_eq!(loaded.instances, [record]);
        let err = store.load("nvml", "n2").expect_err("other node");
        assert_eq!(err.reason().as_str(), "StateFile");
        assert!(err.to_string().contains("for node n1"), "{err}");
        std::fs::write(store.path(), "{").expect("corrupt");
        assert!(store.load("nvml", "n1").is_err());
    }

    #[test]
    fn a_failed_save_puts_the_records_back_and_no_change_saves_nothing() {
        let failing = |_: &[InstanceRecord]| Err(LayerError::Unsupported("no disk".into()));
        let mut records = vec![tdm_record()];
        let err = change_and_save(&mut records, Vec::clear, failing).expect_err("save fails");
        assert_eq!(err, LayerError::Unsupported("no disk".into()));
        assert_eq!(records, [tdm_record()]);
        assert_eq!(change_and_save(&mut records, |_| {}, failing), Ok(()));
        let mut saved = Vec::new();
        change_and_save(&mut records, Vec::clear, |r| {
            saved = r.to_vec();
            Ok(())
        })
        .expect("saved");
        assert!(records.is_empty() && saved.is_empty());
    }
}
