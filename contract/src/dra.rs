//! The names the node agent's DRA driver publishes under: its driver name, its devices',
//! counters', attributes' and capacities', and the kinds of device it offers. Users select on
//! these in claims and DeviceClasses (`config/dra/`), and `kubectl gpu` reads allocations by
//! them, so they are part of the product's interface.

use k8s_openapi::api::resource::v1::{DeviceRequestAllocationResult, DeviceTaint, ResourceClaim};

/// The DRA driver's name under a resource prefix: `gpu.runtimekit.aliyun.com` by default.
pub fn driver_name(prefix: &str) -> String {
    format!("gpu.runtimekit.{prefix}")
}

/// How a claim holding a card is named among the card's holders in its TopologyGroup
/// (`resourceclaim/<namespace>/<name>`).
pub const CLAIM_HOLDER: &str = "resourceclaim/";

/// The longest driver name the API accepts.
pub const DRIVER_NAME_MAX: usize = 63;

/// What a device is, its `type` attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    /// A card given whole.
    Whole,
    /// Time-division shares of a card.
    Share,
    /// One MIG placement of a card in MIG mode.
    Mig,
    /// An RDMA NIC.
    Rdma,
}

impl DeviceKind {
    /// The `type` attribute's value.
    pub fn attribute(self) -> &'static str {
        match self {
            DeviceKind::Whole => "gpu",
            DeviceKind::Share => "share",
            DeviceKind::Mig => "mig",
            DeviceKind::Rdma => "rdma",
        }
    }
}

/// `type`: `gpu`, `share`, `mig` or `rdma`.
pub const ATTR_TYPE: &str = "type";
/// The card's UUID (on a MIG placement too: its instance's own UUID exists once prepared).
pub const ATTR_UUID: &str = "uuid";
/// The card's index on the node.
pub const ATTR_INDEX: &str = "index";
/// `nvidia`, `amd` or `ppu`.
pub const ATTR_VENDOR: &str = "vendor";
/// The card's model, as the driver names it.
pub const ATTR_PRODUCT_NAME: &str = "productName";
/// Whether the model can run MIG.
pub const ATTR_MIG_CAPABLE: &str = "migCapable";
/// Whether the card is healthy (a faulted card is also tainted, or withdrawn).
pub const ATTR_HEALTHY: &str = "healthy";
/// The PCIe switch the card or NIC sits under: a card and a NIC with the same value are the
/// pair the contract's GPU+RDMA rule picks first.
pub const ATTR_PCIE_SWITCH: &str = "pcieSwitch";
/// The NUMA node.
pub const ATTR_NUMA_NODE: &str = "numaNode";
/// The CPU socket.
pub const ATTR_SOCKET: &str = "socket";
/// The intra-node interconnect group (PPU 810E).
pub const ATTR_INTERCONNECT_GROUP: &str = "interconnectGroup";
/// The node's HyperNode.
pub const ATTR_HYPER_NODE: &str = "hyperNode";
/// The node's leaf switch.
pub const ATTR_LEAF_SWITCH: &str = "leafSwitch";
/// The node's network pod.
pub const ATTR_NETWORK_POD: &str = "networkPod";
/// A MIG placement's profile (`3g.40gb`).
pub const ATTR_PROFILE: &str = "profile";
/// A MIG placement's first memory slice.
pub const ATTR_PLACEMENT_START: &str = "placementStart";
/// A MIG placement's compute slices (what `gpu-slice` asks for).
pub const ATTR_COMPUTE_SLICES: &str = "computeSlices";
/// A MIG placement's memory slices.
pub const ATTR_MEMORY_SLICES: &str = "memorySlices";
/// A NIC's name (`mlx5_0`).
pub const ATTR_NAME: &str = "name";
/// The standard PCI address attribute.
pub const STANDARD_PCI_BUS_ID: &str = "resource.kubernetes.io/pciBusID";
/// The standard NUMA node attribute.
pub const STANDARD_NUMA_NODE: &str = "resource.kubernetes.io/numaNode";

/// A share's compute percent, 1-100 (0 or left out: no compute cap, none reserved).
pub const CAPACITY_CORE: &str = "core";
/// Memory: a card's or a MIG placement's whole, or what a share may use.
pub const CAPACITY_MEMORY: &str = "memory";

/// The counter whole cards and shares of one card both consume.
pub const CARD_COUNTER: &str = "card";
/// A MIG card's compute slices.
pub const COMPUTE_COUNTER: &str = "compute-slices";

/// A MIG card's memory slice `index`.
pub fn memory_slice_counter(index: u32) -> String {
    format!("memory-slice-{index}")
}

/// The counter set of card `index`.
pub fn counter_set(index: u32) -> String {
    format!("gpu-{index}")
}

/// The whole-card device of card `index`.
pub fn whole_device(index: u32) -> String {
    format!("gpu-{index}")
}

/// The share device of card `index`.
pub fn share_device(index: u32) -> String {
    format!("gpu-{index}-share")
}

/// The MIG placement of `profile` at `start` on card `index`: `gpu-7-mig-3g40gb-4`.
pub fn mig_device(index: u32, profile: &str, start: u32) -> String {
    format!("gpu-{index}-mig-{}-{start}", dns_label_part(profile))
}

/// The device of NIC `name`: `nic-mlx5-0`.
pub fn nic_device(name: &str) -> String {
    format!("nic-{}", dns_label_part(name))
}

/// `text` as part of a DNS label: lower case, letters and digits kept, `_` and `-` as `-`,
/// everything else dropped.
fn dns_label_part(text: &str) -> String {
    text.chars()
        .filter_map(|c| match c {
            'a'..='z' | '0'..='9' => Some(c),
            'A'..='Z' => Some(c.to_ascii_lowercase()),
            '_' | '-' => Some('-'),
            _ => None,
        })
        .collect()
}

/// What a device name says it is: the card's index and the kind, with a MIG placement's
/// profile part and start; a NIC's name part. `None` for a name this driver does not make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceName {
    /// `gpu-<index>`.
    Whole(u32),
    /// `gpu-<index>-share`.
    Share(u32),
    /// `gpu-<index>-mig-<profile without dots>-<start>`.
    Mig {
        /// The card.
        card: u32,
        /// The profile as it appears in the name (`3g40gb`).
        profile: String,
        /// The placement start.
        start: u32,
    },
    /// `nic-<name>`.
    Nic(String),
}

impl DeviceName {
    /// Reads a device name.
    pub fn parse(name: &str) -> Option<DeviceName> {
        if let Some(nic) = name.strip_prefix("nic-") {
            return Some(DeviceName::Nic(nic.to_owned()));
        }
        let rest = name.strip_prefix("gpu-")?;
        let (index, tail) = rest.split_once('-').unwrap_or((rest, ""));
        let card: u32 = index.parse().ok()?;
        match tail {
            "" => Some(DeviceName::Whole(card)),
            "share" => Some(DeviceName::Share(card)),
            _ => {
                let mig = tail.strip_prefix("mig-")?;
                let (profile, start) = mig.rsplit_once('-')?;
                Some(DeviceName::Mig {
                    card,
                    profile: profile.to_owned(),
                    start: start.parse().ok()?,
                })
            }
        }
    }

    /// Whether `profile` (`3g.40gb`) is the profile this MIG name names.
    pub fn names_profile(profile_part: &str, profile: &str) -> bool {
        dns_label_part(profile) == profile_part
    }
}

/// `request` without a subrequest (`gpu/first` is `gpu`): the name containers use.
pub fn base_request(request: &str) -> &str {
    request.split_once('/').map_or(request, |(base, _)| base)
}

/// The devices allocated to a claim from `driver` (none while it is not allocated).
pub fn allocated<'a>(
    claim: &'a ResourceClaim,
    driver: &'a str,
) -> impl Iterator<Item = &'a DeviceRequestAllocationResult> + 'a {
    claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
        .into_iter()
        .flatten()
        .filter(move |r| r.driver == driver)
}

/// The taint of a faulted card's devices: no new claim is allocated to them; running pods stay.
pub fn unhealthy_taint(driver: &str) -> DeviceTaint {
    DeviceTaint {
        key: format!("{driver}/unhealthy"),
        value: None,
        effect: "NoSchedule".into(),
        time_added: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names_read_back() {
        assert_eq!(
            DeviceName::parse(&whole_device(3)),
            Some(DeviceName::Whole(3))
        );
        assert_eq!(
            DeviceName::parse(&share_device(12)),
            Some(DeviceName::Share(12))
        );
        assert_eq!(mig_device(7, "3g.40gb", 4), "gpu-7-mig-3g40gb-4");
        assert_eq!(
            DeviceName::parse("gpu-7-mig-3g40gb-4"),
            Some(DeviceName::Mig {
                card: 7,
                profile: "3g40gb".into(),
                start: 4
            })
        );
        assert!(DeviceName::names_profile("3g40gb", "3g.40gb"));
        assert!(!DeviceName::names_profile("3g40gb", "3g.20gb"));
        assert_eq!(nic_device("mlx5_0"), "nic-mlx5-0");
        assert_eq!(
            DeviceName::parse("nic-mlx5-0"),
            Some(DeviceName::Nic("mlx5-0".into()))
        );
        for foreign in ["gpu", "gpu-x", "gpu-1-other", "gpu-1-mig-3g40gb", "tpu-0"] {
            assert_eq!(DeviceName::parse(foreign), None, "{foreign}");
        }
    }

    #[test]
    fn the_driver_is_named_after_the_prefix() {
        assert_eq!(driver_name("aliyun.com"), "gpu.runtimekit.aliyun.com");
        assert_eq!(driver_name("example.org"), "gpu.runtimekit.example.org");
    }
}
