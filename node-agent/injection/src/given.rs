//! What a grant gives a container on this node's hardware, without I/O: for each card its
//! device files (a MIG instance's: its card's files and the instance's capability files), once
//! the driver's control files, each NIC's files, and the environment below; for a grant with a
//! time-division share also the isolation library's mounts and variables. A container that
//! holds nothing gets no device and `NVIDIA_VISIBLE_DEVICES=void`.
//!
//! | variable | value |
//! | --- | --- |
//! | `NVIDIA_VISIBLE_DEVICES`, `RUNTIMEKIT_VISIBLE_DEVICES` | card UUIDs (MIG device UUIDs for MIG cards), comma-separated in grant order |
//! | `RUNTIMEKIT_SLICE_MODES` | `Whole`, `TDM` or `MIG` per card |
//! | `RUNTIMEKIT_GPU_CORE_LIMIT` | compute share in percent per card; `0` means no cap |
//! | `RUNTIMEKIT_GPU_MEMORY_LIMIT_MIB` | memory cap in MiB per card; `0` means no cap |
//! | `RUNTIMEKIT_RDMA_DEVICES` | the RDMA NICs' names |
//! | `RUNTIMEKIT_ISOLATION_DIR` | the ledger folder, when the grant holds a TDM share |
//! | `RUNTIMEKIT_MEASURED_DIR` | the read-only folder of measured shares, when it holds a TDM share |
//! | `RUNTIMEKIT_GPU_CORE_POLICY` | `enforce` or `yield-idle`, the node's setting |

use crate::grant::{Grant, Mode};
use crate::hardware::Hardware;
use crate::isolation::{self, Enforcement, Mount};

/// Every variable a grant sets: whatever the container had under these names is replaced.
pub const VARIABLES: [&str; 9] = [
    "RUNTIMEKIT_ISOLATION_DIR",
    "RUNTIMEKIT_MEASURED_DIR",
    "RUNTIMEKIT_GPU_CORE_POLICY",
    "NVIDIA_VISIBLE_DEVICES",
    "RUNTIMEKIT_VISIBLE_DEVICES",
    "RUNTIMEKIT_SLICE_MODES",
    "RUNTIMEKIT_GPU_CORE_LIMIT",
    "RUNTIMEKIT_GPU_MEMORY_LIMIT_MIB",
    "RUNTIMEKIT_RDMA_DEVICES",
];

/// Why a grant cannot be given on this node: something it names is not here as it says.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NotHere(pub String);

/// What a grant gives, read from the hardware: device files and environment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Given {
    /// Host paths of the device files, in order, without repeats.
    pub files: Vec<String>,
    /// The folder they live under on the host (`/dev` in the container).
    pub device_root: String,
    /// Every device file of the node's cards, instances and NICs (what a spec that already has
    /// some of them, the device plugin's, must give up first).
    pub known: Vec<String>,
    /// The devices' environment variables.
    pub env: Vec<(String, String)>,
    /// The isolation library and ledger, for a grant holding a TDM share.
    pub enforcement: Option<Enforcement>,
}

impl Given {
    /// Every variable the container gets: the devices', then the isolation library's.
    pub fn environment(&self) -> Vec<(String, String)> {
        let mut env = self.env.clone();
        if let Some(enforcement) = &self.enforcement {
            env.extend(isolation::environment(enforcement));
        }
        env
    }

    /// The bind mounts the container gets (the isolation library's, when enforced).
    pub fn mounts(&self) -> Vec<Mount> {
        self.enforcement
            .as_ref()
            .map(isolation::mounts)
            .unwrap_or_default()
    }

    /// Where a host device file appears in the container.
    pub fn container_path(&self, file: &str) -> String {
        runtimekit_resource_layer::device_nodes::container_path(file, &self.device_root)
    }
}

/// What `grant` gives on this hardware (`None`: a container that holds nothing).
pub fn given(grant: Option<&Grant>, hardware: &Hardware) -> Result<Given, NotHere> {
    let mut given = Given {
        device_root: hardware.device_root.clone(),
        known: hardware.all_files(),
        ..Given::default()
    };
    let Some(grant) = grant.filter(|g| !g.cards.is_empty() || !g.nics.is_empty()) else {
        given
            .env
            .push(("NVIDIA_VISIBLE_DEVICES".into(), "void".into()));
        return Ok(given);
    };
    let mut add = |files: &[String]| {
        for file in files {
            if !given.files.contains(file) {
                given.files.push(file.clone());
            }
        }
    };
    let (mut visible, mut modes, mut cores, mut memory) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for card in &grant.cards {
        let files = hardware
            .cards
            .get(&card.uuid)
            .ok_or_else(|| {
                NotHere(format!(
                    "card {} ({}) of the allocation is not on this node",
                    card.index, card.uuid
                ))
            })?
            .clone();
        if files.is_empty() {
            return Err(NotHere(format!(
                "the resource layer reports no device file for card {} ({})",
                card.index, card.uuid
            )));
        }
        add(&files);
        match card.mode {
            Mode::Mig => {
                let key = card.instance.as_deref().unwrap_or_default();
                let mig = hardware.instances.get(key).ok_or_else(|| {
                    NotHere(format!(
                        "MIG instance {key} on card {} does not exist (the node agent makes it)",
                        card.index
                    ))
                })?;
                add(&mig.nodes);
                visible.push(mig.uuid.clone());
            }
            Mode::Tdm | Mode::Whole => visible.push(card.uuid.clone()),
        }
        modes.push(card.mode.name().to_owned());
        cores.push(card.core.map_or(0, u64::from).to_string());
        memory.push(card.memory_mib.unwrap_or(0).to_string());
    }
    if !grant.cards.is_empty() {
        add(&hardware.control);
    }
    for nic in &grant.nics {
        match hardware.nics.get(nic) {
            Some(files) if !files.is_empty() => add(files),
            _ => {
                return Err(NotHere(format!(
                    "RDMA NIC {nic} of the allocation has no device file on this node"
                )));
            }
        }
    }
    let list = |v: &[String]| v.join(",");
    if !grant.cards.is_empty() {
        given.env = vec![
            ("NVIDIA_VISIBLE_DEVICES".into(), list(&visible)),
            ("RUNTIMEKIT_VISIBLE_DEVICES".into(), list(&visible)),
            ("RUNTIMEKIT_SLICE_MODES".into(), list(&modes)),
            ("RUNTIMEKIT_GPU_CORE_LIMIT".into(), list(&cores)),
            ("RUNTIMEKIT_GPU_MEMORY_LIMIT_MIB".into(), list(&memory)),
        ];
    }
    if !grant.nics.is_empty() {
        given
            .env
            .push(("RUNTIMEKIT_RDMA_DEVICES".into(), list(&grant.nics)));
    }
    Ok(given)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grant::GrantedCard;

    fn hardware() -> Hardware {
        let mut hardware = Hardware {
            control: vec!["/sim/dev/nvidiactl".into()],
            device_root: "/sim/dev".into(),
            ..Hardware::default()
        };
        hardware
            .cards
            .insert("GPU-0".into(), vec!["/sim/dev/nvidia0".into()]);
        hardware
            .nics
            .insert("mlx5_0".into(), vec!["/sim/dev/infiniband/uverbs0".into()]);
        hardware
    }

    #[test]
    fn a_nic_alone_sets_only_its_own_variable() {
        let grant = Grant {
            cards: vec![],
            nics: vec!["mlx5_0".into()],
        };
        let given = given(Some(&grant), &hardware()).expect("given");
        assert_eq!(given.files, ["/sim/dev/infiniband/uverbs0"]);
        assert_eq!(
            given.env,
            [("RUNTIMEKIT_RDMA_DEVICES".into(), "mlx5_0".into())],
            "so a card given beside it in another device keeps its variables"
        );
        assert_eq!(
            given.container_path(&given.files[0]),
            "/dev/infiniband/uverbs0"
        );
    }

    #[test]
    fn a_share_gets_its_limits_and_the_library_its_variables() {
        let grant = Grant {
            cards: vec![GrantedCard {
                index: 0,
                uuid: "GPU-0".into(),
                mode: Mode::Tdm,
                core: Some(50),
                memory_mib: Some(4096),
                instance: None,
            }],
            nics: vec![],
        };
        let mut given = given(Some(&grant), &hardware()).expect("given");
        given.enforcement = Some(Enforcement {
            library: "/opt/lib.so".into(),
            preload: "/run/iso/c/ld.so.preload".into(),
            ledger: "/run/iso/c/ledger".into(),
            measured: "/run/iso/c/measured".into(),
            core_policy: "enforce",
        });
        let env = given.environment();
        assert!(env.contains(&("RUNTIMEKIT_GPU_CORE_LIMIT".into(), "50".into())));
        assert!(env.contains(&("RUNTIMEKIT_GPU_MEMORY_LIMIT_MIB".into(), "4096".into())));
        assert!(env.contains(&("RUNTIMEKIT_ISOLATION_DIR".into(), isolation::LEDGER.into())));
        assert_eq!(given.mounts().len(), 4);
        assert_eq!(given.files, ["/sim/dev/nvidia0", "/sim/dev/nvidiactl"]);
    }
}
