//! The allocation a pod receives, as the scheduler writes it into the pod's annotations (through
//! the Binding) and the node agent and lj-runtime read it back.

use serde::{Deserialize, Serialize};

/// The annotation holding a pod's [`Allocation`] as JSON, under the resource prefix.
pub fn annotation(prefix: &str) -> String {
    format!("{prefix}/allocation")
}

/// Everything a pod was given.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Allocation {
    /// The node the pod is bound to.
    pub node: String,
    /// What each container that asked for cards got.
    pub containers: Vec<ContainerAllocation>,
}

/// What one container was given.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ContainerAllocation {
    /// The container's name.
    pub name: String,
    /// Its cards, by replica index.
    pub cards: Vec<AllocatedCard>,
    /// The RDMA NICs attached to it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nics: Vec<String>,
}

/// One card given to a container.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AllocatedCard {
    /// The card's index on the node.
    pub index: u32,
    /// The card's UUID.
    pub uuid: String,
    /// `Whole`, `TDM` or `MIG`.
    pub mode: String,
    /// Compute share in percent (TDM with a cap).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub core: Option<u8>,
    /// Memory the container may use on the card, in MiB (TDM and MIG with a cap).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u64>,
    /// MIG profile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// MIG compute slices of the profile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slices: Option<u8>,
    /// MIG placement start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<u8>,
    /// The GpuSlice that records this card.
    pub slice: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_as_camel_case_json() {
        let allocation = Allocation {
            node: "n1".into(),
            containers: vec![ContainerAllocation {
                name: "app".into(),
                cards: vec![AllocatedCard {
                    index: 3,
                    uuid: "GPU-3".into(),
                    mode: "MIG".into(),
                    memory_mib: Some(4096),
                    profile: Some("3g.40gb".into()),
                    slices: Some(3),
                    start: Some(4),
                    slice: "p-0".into(),
                    core: None,
                }],
                nics: vec![],
            }],
        };
        let json = serde_json::to_string(&allocation).expect("serializes");
        assert_eq!(
            json,
            r#"{"node":"n1","containers":[{"name":"app","cards":[{"index":3,"uuid":"GPU-3","mode":"MIG","memoryMib":4096,"profile":"3g.40gb","slices":3,"start":4,"slice":"p-0"}]}]}"#
        );
        assert_eq!(
            serde_json::from_str::<Allocation>(&json).expect("parses"),
            allocation
        );
        assert_eq!(annotation("aliyun.com"), "aliyun.com/allocation");
    }
}
