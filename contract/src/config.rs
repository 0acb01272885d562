//! The configuration every component shares: the resource-name prefix and the memory unit.
//!
//! Operator, node agent and exporter all read the same [`RuntimeKitConfig`] (one ConfigMap in a
//! cluster), so changing the prefix renames every resource everywhere at once.

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The scheduler name pods set to be placed by this project.
pub const DEFAULT_SCHEDULER_NAME: &str = "lj-runtimekit-scheduler";
/// The RuntimeClass that injects the allocated devices into containers.
pub const DEFAULT_RUNTIME_CLASS: &str = "lj-runtime";
/// The default prefix of every resource name.
pub const DEFAULT_RESOURCE_PREFIX: &str = "aliyun.com";
/// The NVIDIA community name for whole cards; not affected by the prefix.
pub const NVIDIA_GPU: &str = "nvidia.com/gpu";
/// The pod label asking for N cards of one configuration.
pub const REPLICA_LABEL: &str = "replica";
/// The label JobSet puts on every pod of a JobSet.
pub const JOBSET_NAME_LABEL: &str = "jobset.sigs.k8s.io/jobset-name";
/// The node label that marks nodes this project manages.
pub const NODE_ENABLE_LABEL: &str = "lj_runtimekit_enable";

/// The unit of `gpu-memory` values.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MemoryUnit {
    /// Whole GiB (the default).
    #[default]
    GiB,
    /// MiB, in positive multiples of 128.
    MiB,
}

impl MemoryUnit {
    /// The step every MiB-mode value must be a multiple of.
    pub const MIB_STEP: u64 = 128;

    /// MiB in one unit.
    pub fn mib(self) -> u64 {
        match self {
            MemoryUnit::GiB => 1024,
            MemoryUnit::MiB => 1,
        }
    }
}

impl std::fmt::Display for MemoryUnit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            MemoryUnit::GiB => "GiB",
            MemoryUnit::MiB => "MiB",
        })
    }
}

/// Settings shared by the operator, the node agent and the exporter.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct RuntimeKitConfig {
    /// Prefix of every resource and label name, `aliyun.com` by default.
    pub resource_prefix: String,
    /// Unit of `gpu-memory` values.
    pub memory_unit: MemoryUnit,
    /// The scheduler name pods set to be placed by this project.
    pub scheduler_name: String,
    /// The RuntimeClass that GPU pods of this scheduler must use.
    pub runtime_class_name: String,
    /// The node labels that place a node in the network topology.
    pub topology_labels: TopologyLabels,
    /// Functions an administrator switches on or off for the whole cluster.
    pub features: Features,
}

/// Functions an administrator switches on or off for the whole cluster. Three of them can also
/// be switched off on one node with a label (`<prefix>/tdm-enabled`, `<prefix>/mig-enabled`,
/// `<prefix>/exporter-enabled` set to `false`, see [`ResourceNames`]); a node cannot switch on
/// what the cluster switched off. Switching a function off never touches what already runs:
/// existing slices and their pods stay, only new placements are refused.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct Features {
    /// Time-division shares (`gpu-core`, `gpu-memory`) are placed. On by default.
    pub tdm: bool,
    /// MIG instances (`gpu-slice`) are placed and created on demand. On by default.
    pub mig: bool,
    /// Pods with the gang label are placed all or nothing; off, each is placed on its own as
    /// kube-scheduler would, and no GangGroup is made. On by default.
    pub gangs: bool,
    /// The node agents serve their metrics. On by default.
    pub exporter: bool,
    /// Whether the operator taints the node of a faulted card, and with which effect.
    pub health_taint: HealthTaint,
}

impl Default for Features {
    fn default() -> Self {
        Features {
            tdm: true,
            mig: true,
            gangs: true,
            exporter: true,
            health_taint: HealthTaint::Off,
        }
    }
}

/// The taint the operator puts on a node while one of its cards is faulted (key
/// `<prefix>/gpu-unhealthy`). Off by default: a node taint keeps new pods off the node's healthy
/// cards too. `NoExecute` is not offered, since it would evict running pods behind their owners'
/// backs.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HealthTaint {
    /// No taint (the default); faulted cards are still withheld from placement.
    #[default]
    Off,
    /// New pods that do not tolerate the taint are not placed on the node.
    NoSchedule,
    /// Schedulers prefer other nodes; nothing is refused.
    PreferNoSchedule,
}

/// The node labels that name a node's HyperNode, leaf switch and network pod; the operator
/// derives the higher-tier TopologyGroups from them.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct TopologyLabels {
    /// The label naming the node's HyperNode.
    pub hyper_node: String,
    /// The label naming the node's leaf (access) switch.
    pub leaf_switch: String,
    /// The label naming the node's network pod.
    pub network_pod: String,
}

impl Default for TopologyLabels {
    fn default() -> Self {
        TopologyLabels {
            hyper_node: "runtimekit.aliyun.com/hypernode".into(),
            leaf_switch: "runtimekit.aliyun.com/leaf-switch".into(),
            network_pod: "runtimekit.aliyun.com/network-pod".into(),
        }
    }
}

impl Default for RuntimeKitConfig {
    fn default() -> Self {
        RuntimeKitConfig {
            resource_prefix: DEFAULT_RESOURCE_PREFIX.into(),
            memory_unit: MemoryUnit::GiB,
            scheduler_name: DEFAULT_SCHEDULER_NAME.into(),
            runtime_class_name: DEFAULT_RUNTIME_CLASS.into(),
            topology_labels: TopologyLabels::default(),
            features: Features::default(),
        }
    }
}

/// Why a configuration cannot be used.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ConfigError {
    /// The prefix would not make valid resource names.
    #[error("resourcePrefix {0:?} must be a DNS subdomain such as aliyun.com")]
    InvalidPrefix(String),
    /// A name that must be set is empty.
    #[error("{0} must not be empty")]
    Empty(&'static str),
}

impl RuntimeKitConfig {
    /// Checks that the settings make valid names.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !is_dns_subdomain(&self.resource_prefix) {
            return Err(ConfigError::InvalidPrefix(self.resource_prefix.clone()));
        }
        if self.scheduler_name.is_empty() {
            return Err(ConfigError::Empty("schedulerName"));
        }
        if self.runtime_class_name.is_empty() {
            return Err(ConfigError::Empty("runtimeClassName"));
        }
        Ok(())
    }

    /// The resource and label names under this configuration's prefix.
    pub fn names(&self) -> ResourceNames {
        let p = &self.resource_prefix;
        ResourceNames {
            prefix: p.clone(),
            gpu_core: format!("{p}/gpu-core"),
            gpu_memory: format!("{p}/gpu-memory"),
            gpu_slice: format!("{p}/gpu-slice"),
            gpu: format!("{p}/gpu"),
            rdma: format!("{p}/rdma"),
            min_member_label: format!("{p}/min-member"),
            gang_name_label: format!("{p}/gang-name"),
            health_taint: format!("{p}/gpu-unhealthy"),
            tdm_switch_label: format!("{p}/tdm-enabled"),
            mig_switch_label: format!("{p}/mig-enabled"),
            exporter_switch_label: format!("{p}/exporter-enabled"),
            device_api_label: format!("{p}/device-api"),
        }
    }
}

/// Every resource and label name, spelled out for one prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceNames {
    /// The prefix every name below starts with.
    pub prefix: String,
    /// Compute share of one card, TDM (`aliyun.com/gpu-core`).
    pub gpu_core: String,
    /// Memory of one card (`aliyun.com/gpu-memory`).
    pub gpu_memory: String,
    /// MIG instance size in compute slices (`aliyun.com/gpu-slice`).
    pub gpu_slice: String,
    /// Whole cards of any vendor (`aliyun.com/gpu`).
    pub gpu: String,
    /// The switch that attaches the RDMA NICs nearest the cards (`aliyun.com/rdma`).
    pub rdma: String,
    /// The pod label giving a gang's size (`aliyun.com/min-member`).
    pub min_member_label: String,
    /// The pod label naming a gang outside JobSet (`aliyun.com/gang-name`).
    pub gang_name_label: String,
    /// The node taint marking a faulted card, when the health taint is on
    /// (`aliyun.com/gpu-unhealthy`).
    pub health_taint: String,
    /// The node label that switches time-division shares off on the node when `false`
    /// (`aliyun.com/tdm-enabled`).
    pub tdm_switch_label: String,
    /// The node label that switches MIG instances off on the node when `false`
    /// (`aliyun.com/mig-enabled`).
    pub mig_switch_label: String,
    /// The node label that switches the node agent's exporter off when `false`
    /// (`aliyun.com/exporter-enabled`).
    pub exporter_switch_label: String,
    /// The node label that moves the node's whole cards from the device plugin to DRA when
    /// [`DEVICE_API_DRA`] (`aliyun.com/device-api`).
    pub device_api_label: String,
}

/// The value of the device-API label that has the node's cards published as ResourceSlices
/// and prepared by the DRA driver instead of the whole-card device plugin.
pub const DEVICE_API_DRA: &str = "dra";

/// The value of a node switch label that switches its function off on the node.
pub const SWITCHED_OFF: &str = "false";

impl ResourceNames {
    /// The resources this project defines under its prefix.
    pub fn own_resources(&self) -> [&str; 5] {
        [
            &self.gpu_core,
            &self.gpu_memory,
            &self.gpu_slice,
            &self.gpu,
            &self.rdma,
        ]
    }

    /// Whether `name` is a GPU resource the contract governs: `nvidia.com/gpu`, or a `gpu*` or
    /// `rdma` name under the prefix (so a typo such as `aliyun.com/gpu-mem` is caught rather than
    /// ignored; other resources under the prefix belong to other projects).
    pub fn is_gpu_resource(&self, name: &str) -> bool {
        name == NVIDIA_GPU
            || name
                .strip_prefix(self.prefix.as_str())
                .and_then(|rest| rest.strip_prefix('/'))
                .is_some_and(|rest| rest.starts_with("gpu") || rest == "rdma")
    }
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_renames_everything() {
        let config = RuntimeKitConfig {
            resource_prefix: "example.org".into(),
            ..Default::default()
        };
        let names = config.names();
        assert_eq!(names.gpu_core, "example.org/gpu-core");
        assert_eq!(names.min_member_label, "example.org/min-member");
        assert!(
            names
                .own_resources()
                .iter()
                .all(|n| n.starts_with("example.org/"))
        );
    }

    #[test]
    fn features_are_on_unless_switched_off_one_by_one() {
        let config: RuntimeKitConfig =
            serde_yaml::from_str("features:\n  mig: false\n").expect("parses");
        assert!(!config.features.mig);
        assert!(config.features.tdm && config.features.gangs && config.features.exporter);
        assert_eq!(config.features.health_taint, HealthTaint::Off);
        let names = RuntimeKitConfig {
            resource_prefix: "example.org".into(),
            ..Default::default()
        }
        .names();
        assert_eq!(names.tdm_switch_label, "example.org/tdm-enabled");
        assert_eq!(names.mig_switch_label, "example.org/mig-enabled");
        assert_eq!(names.exporter_switch_label, "example.org/exporter-enabled");
        assert_eq!(names.device_api_label, "example.org/device-api");
        assert!(serde_yaml::from_str::<RuntimeKitConfig>("features:\n  tdm: maybe\n").is_err());
        assert!(serde_yaml::from_str::<RuntimeKitConfig>("features:\n  topolgy: false\n").is_err());
    }

    #[test]
    fn invalid_prefixes_are_refused() {
        for prefix in ["", "Aliyun.com", "-a.com", "a..com", "a/b", &"x".repeat(64)] {
            let config = RuntimeKitConfig {
                resource_prefix: prefix.into(),
                ..Default::default()
            };
            assert_eq!(
                config.validate(),
                Err(ConfigError::InvalidPrefix(prefix.into())),
                "{prefix}"
            );
        }
        assert_eq!(RuntimeKitConfig::default().validate(), Ok(()));
    }

    #[test]
    fn the_health_taint_is_off_unless_set_and_never_evicts() {
        let parse = |text: &str| serde_yaml::from_str::<RuntimeKitConfig>(text);
        assert_eq!(
            parse("resourcePrefix: aliyun.com")
                .map(|c| c.features.health_taint)
                .ok(),
            Some(HealthTaint::Off)
        );
        assert_eq!(
            parse("features: {healthTaint: PreferNoSchedule}")
                .map(|c| c.features.health_taint)
                .ok(),
            Some(HealthTaint::PreferNoSchedule)
        );
        let refused = parse("features: {healthTaint: NoExecute}")
            .err()
            .map(|e| e.to_string());
        assert!(
            refused
                .as_deref()
                .is_some_and(|e| e.contains("unknown variant `NoExecute`")),
            "{refused:?}"
        );
        assert!(parse("features: {healthTaints: NoSchedule}").is_err());
    }
}
