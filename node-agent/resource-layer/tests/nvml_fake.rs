//! The NVML backend against the fake NVML (`runtimekit-fake-nvml`): discovery, MIG instances,
//! metrics and health as a real card would answer, and the card faults a real node shows.

use runtimekit_fake_nvml::world::{CallFault, Card, Process};
use runtimekit_fake_nvml::{FakeNvml, World};
use runtimekit_proto::resource::v1alpha1 as pb;
use runtimekit_resource_layer::instances::{CreateRequest, ShareSpec};
use runtimekit_resource_layer::{Backend, DestroyTarget, NvmlBackend, NvmlOptions};
use std::time::Duration;

/// A backend over a fresh fake with `world`; the fake goes when both are dropped.
fn backend(world: &World) -> (FakeNvml, NvmlBackend) {
    let fake = FakeNvml::install(world).expect("install the fake NVML");
    let backend = NvmlBackend::new(options(&fake)).expect("the backend starts on the fake");
    (fake, backend)
}

fn options(fake: &FakeNvml) -> NvmlOptions {
    NvmlOptions {
        lib_path: Some(fake.library()),
        node_name: "fake".into(),
        // No sysfs entries for the fake's PCI addresses: topology comes from NVML alone.
        sysfs_root: fake.dir().join("sys"),
        hang_threshold: Duration::from_millis(300),
        poll_interval: Duration::from_millis(50),
        ..NvmlOptions::default()
    }
}

fn mig_request(key: &str, card: u32, profile: &str, start: u8) -> CreateRequest {
    CreateRequest {
        key: key.into(),
        device_index: card,
        device_uuid: None,
        spec: ShareSpec::Mig {
            profile: profile.into(),
            start,
        },
    }
}

#[test]
fn discovers_cards_as_nvml_reports_them() {
    let (_fake, backend) = backend(&World::h100(8));
    let info = backend.info();
    assert_eq!(info.device_count, 8);
    assert_eq!(info.driver_version, "550.90.07");
    let listed = backend.list_devices(&[]).expect("list");
    assert_eq!(listed.devices.len(), 8);
    let card = &listed.devices[3];
    assert_eq!(card.uuid, Card::h100(3).uuid);
    assert_eq!(card.model, "NVIDIA H100 80GB HBM3");
    assert_eq!(card.memory_mib, 81_559);
    assert_eq!(card.pci_bus_id, "00000000:5D:00.0");
    assert_eq!(card.state(), pb::DeviceState::Ok);
    let mig = card.mig.as_ref().expect("MIG state");
    assert!(mig.capable && !mig.enabled);
    let links = &card.topology.as_ref().expect("topology").links;
    assert_eq!(links.len(), 18, "every NVLink link");
    // Cards 0 and 1 share a PCIe switch; 0 and 7 are on different NUMA nodes.
    let level = |a: u32, b: u32| {
        listed
            .paths
            .iter()
            .find(|p| p.a == a && p.b == b)
            .map(|p| p.pcie())
    };
    assert_eq!(level(0, 1), Some(pb::PathLevel::Pix));
    assert_eq!(level(0, 7), Some(pb::PathLevel::Sys));
}

#[test]
fn mig_instances_are_created_listed_and_destroyed_on_the_card() {
    let mut world = World::h100(2);
    world.cards[1] = Card::h100(1).mig_on();
    let (fake, backend) = backend(&world);
    let created = backend
        .create_instance(mig_request("pod-a", 1, "3g.40gb", 4))
        .expect("create 3g.40gb at 4");
    assert!(created.created);
    let instance = created.instance.expect("instance");
    let ids = instance.mig.expect("MIG IDs");
    assert!(ids.device_uuid.starts_with("MIG-"), "{ids:?}");
    // The fake holds it: one GPU instance with its full compute instance.
    let card = &fake.world().expect("world").cards[1];
    let gis = &card.mig.as_ref().expect("mig").instances;
    assert_eq!(gis.len(), 1);
    assert_eq!((gis[0].start, gis[0].size), (4, 4));
    assert_eq!(gis[0].compute_instances.len(), 1);
    // A 7g.80gb needs every memory slice, 4..8 among them.
    let overlap = backend
        .create_instance(mig_request("pod-b", 1, "7g.80gb", 0))
        .expect_err("7g.80gb overlaps the 3g.40gb");
    assert_eq!(overlap.reason().as_str(), "InstanceOverlap", "{overlap}");
    let listed = backend.list_instances(&[1]).expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].key, "pod-a");
    let destroyed = backend
        .destroy_instance(DestroyTarget::Key("pod-a".into()))
        .expect("destroy");
    assert!(destroyed.existed);
    let card = &fake.world().expect("world").cards[1];
    assert!(card.mig.as_ref().expect("mig").instances.is_empty());
}

#[test]
fn metrics_read_the_card_and_its_processes() {
    let mut world = World::h100(1);
    world.cards[0].readings.gpu_temp_c = 55;
    world.cards[0].readings.power_mw = 312_000;
    world.cards[0].memory_used_mib = 4_096;
    world.cards[0].processes = vec![Process {
        pid: 4242,
        used_mib: Some(4_096),
        sm_util: 37,
        ..Process::default()
    }];
    world.process_names.insert(4242, "python".into());
    let (_fake, backend) = backend(&world);
    let metrics = backend.device_metrics(&[0], true).expect("metrics");
    let m = &metrics.devices[0];
    assert_eq!(m.gpu_temp_c, Some(55));
    assert_eq!(m.power_usage_w, Some(312.0));
    assert_eq!(m.fb_used_mib, Some(4_096));
    assert_eq!(m.processes.len(), 1);
    assert_eq!(m.processes[0].name, "python");
    assert_eq!(m.processes[0].used_memory_mib, Some(4_096));
    assert_eq!(m.processes[0].sm_util_percent, Some(37));
}

#[test]
fn a_scripted_error_reaches_the_caller_as_the_drivers() {
    let mut world = World::h100(1);
    world.faults.push(CallFault::error(
        "nvmlDeviceGetName",
        Some(0),
        "NO_PERMISSION",
    ));
    let (_fake, backend) = backend(&world);
    let error = backend.list_devices(&[0]).expect_err("no permission");
    assert!(error.to_string().contains("nvmlDeviceGetName"), "{error}");
}
