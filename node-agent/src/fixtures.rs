//! The test node shared by the unit tests of several modules: four H800 cards (the last in MIG
//! mode with two instances), one NIC, slices on them, faults and times.

use crate::model::{Inventory, NodeState, SliceInfo};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use runtimekit_crds::{SliceMode, SlicePhase};
use runtimekit_proto::resource::v1alpha1 as pb;

/// A fault as the health stream reports it (`xid` names XID faults).
pub(crate) fn fault(kind: pb::FaultKind, xid: u32, severity: pb::Severity) -> pb::Fault {
    pb::Fault {
        kind: kind.into(),
        severity: severity.into(),
        reason: match kind {
            pb::FaultKind::Xid => format!("XID {xid}"),
            other => format!("{other:?}"),
        },
        xid,
        ..Default::default()
    }
}

/// The time `second` seconds after the epoch.
pub(crate) fn at(second: i64) -> Time {
    Time(Timestamp::from_second(second).expect("valid time"))
}

/// An H800 card; cards share a PCIe switch by two and a NUMA node by four.
fn h800(index: u32, mig: bool) -> pb::Device {
    pb::Device {
        index,
        uuid: format!("GPU-{index}"),
        vendor: pb::Vendor::Nvidia.into(),
        model: "NVIDIA H800".into(),
        memory_mib: 81559,
        state: pb::DeviceState::Ok.into(),
        healthy: true,
        mig: Some(pb::MigState {
            capable: true,
            enabled: mig,
            compute_slices: 7,
            memory_slices: 8,
            ..Default::default()
        }),
        topology: Some(pb::Topology {
            pcie_switch: format!("pex{}", index / 2),
            numa_node: Some(index / 4),
            socket: Some(index / 4),
            interconnect_group: "nvswitch".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A MIG instance of `profile` at `start` on `card`, held by the slice `key` (none when empty).
fn mig_instance(card: u32, profile: &str, start: u32, gi: u32, key: &str) -> pb::Instance {
    pb::Instance {
        key: key.into(),
        spec: Some(pb::InstanceSpec {
            device_index: card,
            device_uuid: format!("GPU-{card}"),
            kind: Some(pb::instance_spec::Kind::Mig(pb::MigSpec {
                profile: profile.into(),
                placement_start: start,
            })),
        }),
        kind: pb::InstanceKind::Mig.into(),
        mig: Some(pb::MigInstance {
            gpu_instance_id: gi,
            device_uuid: format!("MIG-{gi}"),
            ..Default::default()
        }),
        created_unix_ms: 0,
    }
}

/// Cards 0-2 whole, card 3 in MIG mode holding a 3g.40gb for `ns/a` and an unclaimed
/// 1g.10gb; NVLink between all, one NIC on card 0's switch.
pub(crate) fn four_cards() -> NodeState {
    let mut devices = vec![
        h800(0, false),
        h800(1, false),
        h800(2, false),
        h800(3, true),
    ];
    devices[3].instances = vec![
        mig_instance(3, "3g.40gb", 4, 2, "ns/a"),
        mig_instance(3, "1g.10gb", 0, 9, ""),
    ];
    let mut paths = Vec::new();
    for a in 0..4 {
        for b in a + 1..4 {
            paths.push(pb::DevicePath {
                a,
                b,
                pcie: pb::PathLevel::Sys.into(),
                links: if b == 3 { 2 } else { 8 },
                link_kind: pb::LinkKind::Nvlink.into(),
                via_switch: true,
            });
        }
    }
    let mut inventory = Inventory::default();
    inventory.merge(
        pb::ListDevicesResponse {
            control_nodes: Vec::new(),
            device_root: String::new(),
            errors: Vec::new(),
            devices,
            nics: vec![pb::Nic {
                name: "mlx5_0".into(),
                pcie_switch: "pex0".into(),
                numa_node: Some(0),
                socket: Some(0),
                ..Default::default()
            }],
            paths,
        },
        &[],
    );
    NodeState {
        inventory: Some(inventory),
        ..NodeState::default()
    }
}

/// A slice named `name` on `card` of its pod `pod-<name>`, bound here, in `phase`.
pub(crate) fn slice(name: &str, card: u32, mode: SliceMode, phase: SlicePhase) -> SliceInfo {
    SliceInfo {
        namespace: "ns".into(),
        name: name.into(),
        card,
        card_uuid: format!("GPU-{card}"),
        mode,
        core: (mode == SliceMode::Tdm).then_some(50),
        memory_mib: (mode != SliceMode::Whole).then_some(4096),
        slices: (mode == SliceMode::Mig).then_some(3),
        mig_profile: (mode == SliceMode::Mig).then(|| "3g.40gb".into()),
        mig_start: (mode == SliceMode::Mig).then_some(4),
        pod_uid: format!("uid-{name}"),
        pod_namespace: "ns".into(),
        pod_name: format!("pod-{name}"),
        container: "app".into(),
        phase: Some(phase),
        deleting: false,
        created: Some(at(100)),
    }
}
