//! The CDI specs the DRA driver writes for prepared claims: one file per claim in the
//! container runtime's CDI folder, one CDI device per (claim, request) named
//! `<driver>/claim=<claim UID>-<request>`, whose edits give what `runtimekit-injection` says
//! the request's grant gives (device files, environment, the isolation library's mounts), so a
//! claim's container gets exactly what `lj-runtime` gives a pod of the kit's scheduler.
//!
//! Building a spec is pure; [`write`] and [`remove`] are the only I/O, and a spec is written
//! to a temporary name and renamed, so the runtime never reads half a file.

use runtimekit_injection::given::Given;
use runtimekit_injection::host::Stat;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

/// The CDI specification version written (the oldest that has every field used here).
pub const CDI_VERSION: &str = "0.6.0";
/// The CDI class of a claim's devices.
pub const CLASS: &str = "claim";

/// The CDI kind of the driver's devices: `<driver>/claim`.
pub fn kind(driver: &str) -> String {
    format!("{driver}/{CLASS}")
}

/// The CDI device name of a claim's request.
pub fn device_name(claim_uid: &str, request: &str) -> String {
    format!("{claim_uid}-{request}")
}

/// The fully qualified CDI device ID the kubelet hands the runtime.
pub fn device_id(driver: &str, claim_uid: &str, request: &str) -> String {
    format!("{}={}", kind(driver), device_name(claim_uid, request))
}

/// The spec file of a claim.
pub fn spec_path(dir: &Path, driver: &str, claim_uid: &str) -> PathBuf {
    dir.join(format!("{driver}-{claim_uid}.json"))
}

/// The claim UID a spec file of this driver belongs to, from its file name.
pub fn claim_of_spec(file_name: &str, driver: &str) -> Option<String> {
    file_name
        .strip_prefix(driver)?
        .strip_prefix('-')?
        .strip_suffix(".json")
        .filter(|uid| !uid.is_empty())
        .map(str::to_owned)
}

/// The CDI device of one request: what `given` gives.
pub fn device(name: &str, given: &Given, stat: Stat<'_>) -> Value {
    let mut nodes = Vec::new();
    for file in &given.files {
        let mut node = json!({
            "path": given.container_path(file),
            "hostPath": file,
            "permissions": "rwm",
        });
        // An agent in a container may not see the host's device files; the runtime then
        // reads the numbers from the host path itself, and refuses a path that is none.
        if let Some((kind, major, minor)) = stat(Path::new(file)) {
            node["type"] = json!(kind.to_string());
            node["major"] = json!(major);
            node["minor"] = json!(minor);
        }
        nodes.push(node);
    }
    let env: Vec<String> = given
        .environment()
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let mounts: Vec<Value> = given
        .mounts()
        .into_iter()
        .map(|m| {
            json!({
                "hostPath": m.source,
                "containerPath": m.destination,
                "type": "bind",
                "options": m.options,
            })
        })
        .collect();
    let mut edits = json!({ "env": env, "deviceNodes": nodes });
    if !mounts.is_empty() {
        edits["mounts"] = Value::Array(mounts);
    }
    json!({ "name": name, "containerEdits": edits })
}

/// A claim's spec holding its devices.
pub fn spec(driver: &str, devices: Vec<Value>) -> Value {
    json!({
        "cdiVersion": CDI_VERSION,
        "kind": kind(driver),
        "devices": devices,
    })
}

/// Writes a claim's spec (whole, through a temporary file and a rename).
pub fn write(path: &Path, spec: &Value) -> Result<(), String> {
    crate::host_files::write_atomically(path, spec.to_string().as_bytes(), 0o644)
}

/// Removes a claim's spec; one already gone is fine.
pub fn remove(path: &Path) -> Result<(), String> {
    crate::host_files::remove(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use runtimekit_injection::grant::{Grant, GrantedCard, Mode};
    use runtimekit_injection::hardware::Hardware;
    use runtimekit_injection::isolation::Enforcement;

    fn stat(path: &Path) -> Option<(char, u64, u64)> {
        let name = path.file_name()?.to_str()?;
        let minor = name.trim_start_matches(|c: char| !c.is_ascii_digit());
        Some(('c', 195, minor.parse().unwrap_or(255)))
    }

    fn given(mode: Mode) -> Given {
        let mut hardware = Hardware {
            control: vec!["/sim/dev/nvidiactl".into()],
            device_root: "/sim/dev".into(),
            ..Hardware::default()
        };
        hardware
            .cards
            .insert("GPU-1".into(), vec!["/sim/dev/nvidia1".into()]);
        let grant = Grant {
            cards: vec![GrantedCard {
                index: 1,
                uuid: "GPU-1".into(),
                mode,
                core: (mode == Mode::Tdm).then_some(30),
                memory_mib: (mode == Mode::Tdm).then_some(4096),
                instance: None,
            }],
            nics: vec![],
        };
        runtimekit_injection::given::given(Some(&grant), &hardware).expect("given")
    }

    #[test]
    fn names_follow_the_cdi_rules_and_read_back() {
        let driver = "gpu.runtimekit.aliyun.com";
        assert_eq!(
            device_id(driver, "0a1b-2c", "gpu"),
            "gpu.runtimekit.aliyun.com/claim=0a1b-2c-gpu"
        );
        let path = spec_path(Path::new("/var/run/cdi"), driver, "0a1b-2c");
        let file = path.file_name().and_then(|f| f.to_str()).expect("name");
        assert_eq!(claim_of_spec(file, driver).as_deref(), Some("0a1b-2c"));
        assert_eq!(claim_of_spec("other.vendor-0a1b.json", driver), None);
        assert_eq!(claim_of_spec(&format!("{driver}-.json"), driver), None);
    }

    #[test]
    fn a_whole_card_gives_its_files_and_variables() {
        let device = device("u-gpu", &given(Mode::Whole), &stat);
        let edits = &device["containerEdits"];
        assert_eq!(
            edits["deviceNodes"],
            json!([
                {"path": "/dev/nvidia1", "hostPath": "/sim/dev/nvidia1", "type": "c", "major": 195, "minor": 1, "permissions": "rwm"},
                {"path": "/dev/nvidiactl", "hostPath": "/sim/dev/nvidiactl", "type": "c", "major": 195, "minor": 255, "permissions": "rwm"},
            ])
        );
        let env: Vec<&str> = edits["env"]
            .as_array()
            .expect("env")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert!(env.contains(&"NVIDIA_VISIBLE_DEVICES=GPU-1"), "{env:?}");
        assert!(env.contains(&"RUNTIMEKIT_SLICE_MODES=Whole"), "{env:?}");
        assert!(edits.get("mounts").is_none(), "nothing to enforce");
    }

    #[test]
    fn a_share_gets_its_caps_and_the_isolation_library() {
        let mut given = given(Mode::Tdm);
        given.enforcement = Some(Enforcement {
            library: "/opt/lib.so".into(),
            preload: "/run/iso/claim-u-gpu/ld.so.preload".into(),
            ledger: "/run/iso/claim-u-gpu/ledger".into(),
            measured: "/run/iso/claim-u-gpu/measured".into(),
            core_policy: "enforce",
        });
        let device = device("u-gpu", &given, &stat);
        let edits = &device["containerEdits"];
        let env = edits["env"].to_string();
        assert!(env.contains("RUNTIMEKIT_GPU_CORE_LIMIT=30"), "{env}");
        assert!(
            env.contains("RUNTIMEKIT_GPU_MEMORY_LIMIT_MIB=4096"),
            "{env}"
        );
        assert!(env.contains("RUNTIMEKIT_ISOLATION_DIR="), "{env}");
        let mounts = edits["mounts"].as_array().expect("mounts");
        assert!(
            mounts
                .iter()
                .any(|m| m["containerPath"] == "/etc/ld.so.preload"
                    && m["hostPath"] == "/run/iso/claim-u-gpu/ld.so.preload")
        );
        let spec = spec("gpu.runtimekit.aliyun.com", vec![device]);
        assert_eq!(spec["kind"], "gpu.runtimekit.aliyun.com/claim");
        assert_eq!(spec["cdiVersion"], CDI_VERSION);
    }

    #[test]
    fn numbers_the_agent_cannot_read_are_left_to_the_runtime() {
        let device = device("u-gpu", &given(Mode::Whole), &|_| None);
        assert_eq!(
            device["containerEdits"]["deviceNodes"][0],
            json!({"path": "/dev/nvidia1", "hostPath": "/sim/dev/nvidia1", "permissions": "rwm"})
        );
    }

    #[test]
    fn specs_are_written_whole_and_removed_once() {
        let dir = std::env::temp_dir().join(format!("rk-cdi-{}", std::process::id()));
        let path = spec_path(&dir, "gpu.example.com", "u1");
        write(&path, &spec("gpu.example.com", vec![])).expect("write");
        let read: Value =
            serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("json");
        assert_eq!(read["kind"], "gpu.example.com/claim");
        remove(&path).expect("remove");
        remove(&path).expect("removing twice is fine");
        std::fs::remove_dir_all(&dir).expect("clean");
    }
}
