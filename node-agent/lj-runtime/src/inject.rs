//! The rewrite of a container's OCI spec, without I/O: which part of the pod's allocation is
//! this container's, and what it is given. The allocation annotation is the only source: the
//! kubelet's device-plugin books may attribute devices to the wrong pod when two arrive
//! together, the scheduler's annotation never does, so what this sets replaces what the device
//! plugin set.
//!
//! What a container is given is `runtimekit_injection`'s description, the same the DRA driver
//! writes into CDI specs; this module finds the container's grant in the allocation and writes
//! what it gives into the OCI spec.

use crate::config::RuntimeConfig;
use runtimekit_contract::allocation::{Allocation, ContainerAllocation, annotation};
use runtimekit_injection::given::{Given, NotHere, VARIABLES};
use runtimekit_injection::grant::{Grant, GrantedCard, Mode};
use runtimekit_injection::hardware::Hardware;
use runtimekit_injection::host::Stat;
use serde_json::{Value, json};
use std::path::Path;

/// containerd's annotation saying whether a spec is a pod's sandbox or one of its containers.
const CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";
/// containerd's annotations naming the container and its pod.
const CONTAINER_NAME: &str = "io.kubernetes.cri.container-name";
const POD_NAMESPACE: &str = "io.kubernetes.cri.sandbox-namespace";
const POD_NAME: &str = "io.kubernetes.cri.sandbox-name";

/// Why a container cannot be given what its pod was allocated; the container fails with this.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InjectError {
    /// The pod was not placed by the scheduler.
    #[error(
        "pod {pod} has no {annotation} annotation: RuntimeClass lj-runtime is for pods placed by lj-runtimekit-scheduler (set schedulerName: lj-runtimekit-scheduler), and without it the container would be given no card"
    )]
    NoAllocation {
        /// `<namespace>/<name>`.
        pod: String,
        /// The annotation's name.
        annotation: String,
    },
    /// The annotation is not an allocation.
    #[error("the {annotation} annotation of pod {pod} cannot be read: {reason}")]
    Malformed {
        /// `<namespace>/<name>`.
        pod: String,
        /// The annotation's name.
        annotation: String,
        /// What is wrong.
        reason: String,
    },
    /// The allocation names another node.
    #[error("the allocation of pod {pod} was made for node {allocated}, but this is node {node}")]
    Foreign {
        /// `<namespace>/<name>`.
        pod: String,
        /// The node it names.
        allocated: String,
        /// This node.
        node: String,
    },
    /// Something the allocation names is not on this node as it says.
    #[error(transparent)]
    Hardware(#[from] NotHere),
    /// The spec is not an OCI spec this can rewrite.
    #[error("the container's OCI spec cannot be rewritten: {0}")]
    Spec(String),
}

/// What a create does to a spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Leave it as it is (a pod's sandbox).
    Leave,
    /// A container of the pod that was given no card: hide every card.
    Nothing,
    /// Give the container its part of the allocation.
    Give {
        /// The pod's namespace (MIG instances are keyed `<namespace>/<GpuSlice>`).
        namespace: String,
        /// The container's part.
        part: ContainerAllocation,
    },
}

impl Plan {
    /// What the container holds: its part of the allocation, MIG instances keyed
    /// `<namespace>/<GpuSlice>` as the node agent makes them; `None` when it holds nothing.
    pub fn grant(&self) -> Result<Option<Grant>, InjectError> {
        let Plan::Give { namespace, part } = self else {
            return Ok(None);
        };
        let cards = part
            .cards
            .iter()
            .map(|card| {
                let mode = Mode::from_name(&card.mode).ok_or_else(|| {
                    NotHere(format!(
                        "card {} has an unknown mode {:?}",
                        card.index, card.mode
                    ))
                })?;
                Ok(GrantedCard {
                    index: card.index,
                    uuid: card.uuid.clone(),
                    mode,
                    core: card.core.map(u32::from),
                    memory_mib: card.memory_mib,
                    instance: (mode == Mode::Mig).then(|| format!("{namespace}/{}", card.slice)),
                })
            })
            .collect::<Result<Vec<_>, NotHere>>()?;
        Ok(Some(Grant {
            cards,
            nics: part.nics.clone(),
        }))
    }

    /// The MIG instance keys the container needs.
    pub fn instance_keys(&self) -> Vec<String> {
        self.grant()
            .ok()
            .flatten()
            .map(|g| g.instance_keys())
            .unwrap_or_default()
    }
}

fn annotation_of<'a>(spec: &'a Value, key: &str) -> Option<&'a str> {
    spec.get("annotations")?.get(key)?.as_str()
}

/// Decides what a create gives the container of `spec`.
pub fn plan(spec: &Value, config: &RuntimeConfig) -> Result<Plan, InjectError> {
    if annotation_of(spec, CONTAINER_TYPE) != Some("container") {
        return Ok(Plan::Leave);
    }
    let namespace = annotation_of(spec, POD_NAMESPACE)
        .unwrap_or_default()
        .to_owned();
    let pod = format!(
        "{namespace}/{}",
        annotation_of(spec, POD_NAME).unwrap_or_default()
    );
    let key = annotation(&config.resource_prefix);
    let Some(text) = annotation_of(spec, &key) else {
        return Err(InjectError::NoAllocation {
            pod,
            annotation: key,
        });
    };
    let allocation: Allocation =
        serde_json::from_str(text).map_err(|e| InjectError::Malformed {
            pod: pod.clone(),
            annotation: key.clone(),
            reason: e.to_string(),
        })?;
    if !config.node_name.is_empty() && allocation.node != config.node_name {
        return Err(InjectError::Foreign {
            pod,
            allocated: allocation.node,
            node: config.node_name.clone(),
        });
    }
    let name = annotation_of(spec, CONTAINER_NAME).unwrap_or_default();
    Ok(
        match allocation.containers.into_iter().find(|c| c.name == name) {
            Some(part) if !part.cards.is_empty() || !part.nics.is_empty() => {
                Plan::Give { namespace, part }
            }
            _ => Plan::Nothing,
        },
    )
}

/// What `plan` gives on this hardware.
pub fn given(plan: &Plan, hardware: &Hardware) -> Result<Given, InjectError> {
    Ok(runtimekit_injection::given::given(
        plan.grant()?.as_ref(),
        hardware,
    )?)
}

/// Writes what is given into `spec`: the device files (created in the container and allowed
/// in its device cgroup) and the environment, replacing any earlier value of its variables and
/// any of the node's card, instance or NIC files the spec had.
pub fn apply(spec: &mut Value, given: &Given, stat: Stat<'_>) -> Result<(), InjectError> {
    let known: Vec<(String, u64, u64)> = given
        .known
        .iter()
        .filter_map(|file| {
            let (_, major, minor) = stat(Path::new(file))?;
            Some((given.container_path(file), major, minor))
        })
        .collect();
    if let Some(linux) = spec.get_mut("linux") {
        if let Some(devices) = linux.get_mut("devices").and_then(Value::as_array_mut) {
            devices.retain(|d| {
                let path = d.get("path").and_then(Value::as_str).unwrap_or_default();
                !known.iter().any(|(p, _, _)| p == path)
            });
        }
        if let Some(rules) = linux
            .get_mut("resources")
            .and_then(|r| r.get_mut("devices"))
            .and_then(Value::as_array_mut)
        {
            rules.retain(|r| {
                let allow = r.get("allow").and_then(Value::as_bool).unwrap_or(false);
                let major = r.get("major").and_then(Value::as_u64);
                let minor = r.get("minor").and_then(Value::as_u64);
                !(allow
                    && known
                        .iter()
                        .any(|(_, a, b)| Some(*a) == major && Some(*b) == minor))
            });
        }
    }
    let mut devices = Vec::new();
    let mut rules = Vec::new();
    for file in &given.files {
        let (kind, major, minor) = stat(Path::new(file)).ok_or_else(|| {
            InjectError::Hardware(NotHere(format!(
                "device file {file} is missing on this node"
            )))
        })?;
        devices.push(json!({
            "path": given.container_path(file), "type": kind.to_string(),
            "major": major, "minor": minor, "fileMode": 0o666, "uid": 0, "gid": 0,
        }));
        rules.push(json!({"allow": true, "type": kind.to_string(), "major": major, "minor": minor, "access": "rwm"}));
    }
    let object = spec
        .as_object_mut()
        .ok_or_else(|| InjectError::Spec("it is not a JSON object".into()))?;
    let process = object
        .entry("process")
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .ok_or_else(|| InjectError::Spec("process is not an object".into()))?;
    let env = process
        .entry("env")
        .or_insert_with(|| json!([]))
        .as_array_mut()
        .ok_or_else(|| InjectError::Spec("process.env is not a list".into()))?;
    env.retain(|e| {
        e.as_str()
            .and_then(|e| e.split_once('='))
            .is_none_or(|(name, _)| !VARIABLES.contains(&name))
    });
    env.extend(
        given
            .environment()
            .iter()
            .map(|(k, v)| json!(format!("{k}={v}"))),
    );
    let given_mounts: Vec<Value> = given
        .mounts()
        .into_iter()
        .map(|m| json!({"destination": m.destination, "type": "bind", "source": m.source, "options": m.options}))
        .collect();
    if !given_mounts.is_empty() {
        let mounts = object
            .entry("mounts")
            .or_insert_with(|| json!([]))
            .as_array_mut()
            .ok_or_else(|| InjectError::Spec("mounts is not a list".into()))?;
        // What the image or the pod put at these places gives way.
        mounts.retain(|m| {
            let at = m.get("destination").and_then(Value::as_str);
            !given_mounts
                .iter()
                .any(|g| g.get("destination").and_then(Value::as_str) == at)
        });
        mounts.extend(given_mounts);
    }
    let linux = object
        .entry("linux")
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .ok_or_else(|| InjectError::Spec("linux is not an object".into()))?;
    linux
        .entry("devices")
        .or_insert_with(|| json!([]))
        .as_array_mut()
        .ok_or_else(|| InjectError::Spec("linux.devices is not a list".into()))?
        .extend(devices);
    linux
        .entry("resources")
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .ok_or_else(|| InjectError::Spec("linux.resources is not an object".into()))?
        .entry("devices")
        .or_insert_with(|| json!([]))
        .as_array_mut()
        .ok_or_else(|| InjectError::Spec("linux.resources.devices is not a list".into()))?
        .extend(rules);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use runtimekit_injection::hardware::MigDevice;
    use runtimekit_injection::isolation::{self, Enforcement};

    fn spec(allocation: Option<&str>, container: &str) -> Value {
        let mut annotations = json!({
            CONTAINER_TYPE: "container", CONTAINER_NAME: container,
            POD_NAMESPACE: "team", POD_NAME: "trainer",
        });
        if let Some(a) = allocation {
            annotations["aliyun.com/allocation"] = json!(a);
        }
        // What the device plugin put there for the card the kubelet's books picked (card 0).
        json!({"process": {"env": ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all"]}, "annotations": annotations,
        "linux": {"devices": [
            {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0},
            {"path": "/dev/fuse", "type": "c", "major": 10, "minor": 229},
        ], "resources": {"devices": [
            {"allow": false, "access": "rwm"},
            {"allow": true, "type": "c", "major": 195, "minor": 0, "access": "rw"},
        ]}}})
    }

    fn hardware() -> Hardware {
        let mut h = Hardware {
            control: vec!["/sim/dev/nvidiactl".into()],
            device_root: "/sim/dev".into(),
            ..Hardware::default()
        };
        for i in 0..2 {
            h.cards
                .insert(format!("GPU-{i}"), vec![format!("/sim/dev/nvidia{i}")]);
        }
        h.instances.insert(
            "team/trainer-mig".into(),
            MigDevice {
                uuid: "MIG-1".into(),
                nodes: vec!["/sim/dev/nvidia-caps/nvidia-cap5".into()],
            },
        );
        h.nics
            .insert("mlx5_0".into(), vec!["/sim/dev/infiniband/uverbs0".into()]);
        h
    }

    fn config() -> RuntimeConfig {
        RuntimeConfig {
            node_name: "n1".into(),
            ..RuntimeConfig::default()
        }
    }

    const TDM: &str = r#"{"node": "n1", "containers": [{"name": "app", "nics": ["mlx5_0"], "cards": [
        {"index": 1, "uuid": "GPU-1", "mode": "TDM", "core": 50, "memoryMib": 4096, "slice": "trainer-tdm"}]}]}"#;

    fn stat(path: &Path) -> Option<(char, u64, u64)> {
        let name = path.file_name()?.to_str()?;
        let minor = name
            .trim_start_matches(|c: char| !c.is_ascii_digit())
            .parse()
            .unwrap_or(255);
        let major = if name.starts_with("uverbs") {
            231
        } else if name.starts_with("nvidia-cap") {
            511
        } else {
            195
        };
        Some(('c', major, minor))
    }

    #[test]
    fn a_tdm_card_gives_its_files_the_control_files_its_nic_and_its_limits() {
        let mut spec = spec(Some(TDM), "app");
        let plan = plan(&spec, &config()).expect("plan");
        let given = given(&plan, &hardware()).expect("given");
        assert_eq!(
            given.files,
            [
                "/sim/dev/nvidia1",
                "/sim/dev/nvidiactl",
                "/sim/dev/infiniband/uverbs0"
            ]
        );
        apply(&mut spec, &given, &stat).expect("apply");
        let env: Vec<&str> = spec["process"]["env"]
            .as_array()
            .expect("env")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert_eq!(
            env,
            [
                "PATH=/bin",
                "NVIDIA_VISIBLE_DEVICES=GPU-1",
                "RUNTIMEKIT_VISIBLE_DEVICES=GPU-1",
                "RUNTIMEKIT_SLICE_MODES=TDM",
                "RUNTIMEKIT_GPU_CORE_LIMIT=50",
                "RUNTIMEKIT_GPU_MEMORY_LIMIT_MIB=4096",
                "RUNTIMEKIT_RDMA_DEVICES=mlx5_0",
            ],
            "the device plugin's NVIDIA_VISIBLE_DEVICES is replaced"
        );
        let paths: Vec<&str> = spec["linux"]["devices"]
            .as_array()
            .expect("devices")
            .iter()
            .filter_map(|d| d["path"].as_str())
            .collect();
        assert_eq!(
            paths,
            [
                "/dev/fuse",
                "/dev/nvidia1",
                "/dev/nvidiactl",
                "/dev/infiniband/uverbs0"
            ],
            "the card the device plugin gave is replaced by the allocation's; others stay"
        );
        let rules = spec["linux"]["resources"]["devices"]
            .as_array()
            .expect("rules");
        assert_eq!(
            rules[0],
            json!({"allow": false, "access": "rwm"}),
            "deny-all stays first"
        );
        assert_eq!(
            rules[1],
            json!({"allow": true, "type": "c", "major": 195, "minor": 1, "access": "rwm"})
        );
        assert!(
            !rules.iter().any(|r| r["minor"] == 0 && r["major"] == 195),
            "{rules:?}"
        );
    }

    #[test]
    fn a_tdm_container_is_given_the_isolation_library_and_its_ledger() {
        let mut spec = spec(Some(TDM), "app");
        spec["mounts"] = json!([
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/etc/ld.so.preload", "type": "bind", "source": "/tmp/theirs"},
        ]);
        // A pod cannot choose its own policy: the node's replaces it.
        spec["process"]["env"] = json!([
            "PATH=/bin",
            "RUNTIMEKIT_GPU_CORE_POLICY=yield-idle",
            "RUNTIMEKIT_MEASURED_DIR=/tmp/mine"
        ]);
        let plan = plan(&spec, &config()).expect("plan");
        let grant = plan
            .grant()
            .expect("grant")
            .expect("a TDM container gets its part");
        assert!(grant.needs_enforcing());
        let mut given = given(&plan, &hardware()).expect("given");
        given.enforcement = Some(Enforcement {
            library: "/opt/lib.so".into(),
            preload: "/run/iso/c1/ld.so.preload".into(),
            ledger: "/run/iso/c1/ledger".into(),
            measured: "/run/iso/c1/measured".into(),
            core_policy: "enforce",
        });
        apply(&mut spec, &given, &stat).expect("apply");
        let mounts: Vec<(&str, &str)> = spec["mounts"]
            .as_array()
            .expect("mounts")
            .iter()
            .filter_map(|m| Some((m["destination"].as_str()?, m["source"].as_str()?)))
            .collect();
        assert_eq!(
            mounts,
            [
                ("/proc", "proc"),
                (isolation::LIBRARY, "/opt/lib.so"),
                ("/etc/ld.so.preload", "/run/iso/c1/ld.so.preload"),
                (isolation::LEDGER, "/run/iso/c1/ledger"),
                (isolation::MEASURED, "/run/iso/c1/measured"),
            ],
            "the pod's own preload mount gives way"
        );
        let env = spec["process"]["env"].as_array().expect("env");
        assert!(env.contains(&json!("RUNTIMEKIT_ISOLATION_DIR=/run/runtimekit/isolation")));
        assert!(env.contains(&json!("RUNTIMEKIT_GPU_CORE_POLICY=enforce")));
        assert!(!env.contains(&json!("RUNTIMEKIT_GPU_CORE_POLICY=yield-idle")));
        // Nor point the library at measurements it writes itself.
        assert!(env.contains(&json!("RUNTIMEKIT_MEASURED_DIR=/run/runtimekit/measured")));
        assert!(!env.contains(&json!("RUNTIMEKIT_MEASURED_DIR=/tmp/mine")));
        let measured = spec["mounts"]
            .as_array()
            .expect("mounts")
            .iter()
            .find(|m| m["destination"] == isolation::MEASURED)
            .expect("the measurements folder");
        assert!(
            measured["options"]
                .as_array()
                .expect("options")
                .contains(&json!("ro")),
            "{measured}"
        );
    }

    #[test]
    fn a_mig_card_gives_the_instance_and_waits_for_it() {
        let mig = r#"{"node": "n1", "containers": [{"name": "app", "cards": [
            {"index": 0, "uuid": "GPU-0", "mode": "MIG", "profile": "3g.40gb", "slices": 3, "start": 4, "memoryMib": 4096, "slice": "trainer-mig"}]}]}"#;
        let plan = plan(&spec(Some(mig), "app"), &config()).expect("plan");
        assert_eq!(plan.instance_keys(), ["team/trainer-mig"]);
        let given = given(&plan, &hardware()).expect("given");
        assert_eq!(
            given.files,
            [
                "/sim/dev/nvidia0",
                "/sim/dev/nvidia-caps/nvidia-cap5",
                "/sim/dev/nvidiactl"
            ]
        );
        assert!(
            given
                .env
                .contains(&("NVIDIA_VISIBLE_DEVICES".into(), "MIG-1".into()))
        );
        let mut missing = hardware();
        missing.instances.clear();
        let error = super::given(&plan, &missing).expect_err("no instance yet");
        assert!(
            error.to_string().contains("MIG instance team/trainer-mig"),
            "{error}"
        );
    }

    #[test]
    fn sandboxes_are_left_and_other_containers_see_no_card() {
        let mut sandbox = spec(None, "");
        sandbox["annotations"][CONTAINER_TYPE] = json!("sandbox");
        assert_eq!(plan(&sandbox, &config()), Ok(Plan::Leave));
        let sidecar = plan(&spec(Some(TDM), "sidecar"), &config()).expect("plan");
        assert_eq!(sidecar, Plan::Nothing);
        let given = given(&sidecar, &hardware()).expect("given");
        assert!(given.files.is_empty());
        assert_eq!(
            given.env,
            [("NVIDIA_VISIBLE_DEVICES".into(), "void".into())]
        );
    }

    #[test]
    fn missing_malformed_and_foreign_allocations_fail_the_container() {
        let missing = plan(&spec(None, "app"), &config()).expect_err("missing");
        assert!(
            missing
                .to_string()
                .contains("pod team/trainer has no aliyun.com/allocation"),
            "{missing}"
        );
        let broken = plan(&spec(Some("{not json"), "app"), &config()).expect_err("malformed");
        assert!(matches!(broken, InjectError::Malformed { .. }), "{broken}");
        let elsewhere = TDM.replace("\"n1\"", "\"n2\"");
        let foreign = plan(&spec(Some(&elsewhere), "app"), &config()).expect_err("foreign");
        assert!(
            foreign
                .to_string()
                .contains("made for node n2, but this is node n1"),
            "{foreign}"
        );
        let unknown = TDM.replace("GPU-1", "GPU-9");
        let plan = plan(&spec(Some(&unknown), "app"), &config()).expect("plan");
        let error = given(&plan, &hardware()).expect_err("unknown card");
        assert!(
            error
                .to_string()
                .contains("GPU-9) of the allocation is not on this node")
        );
    }
}
