//! The NVML backend against the fake NVML (`runtimekit-fake-nvml`): discovery, MIG instances,
//! metrics and health as a real card would answer, and the card faults a real node shows.

mod common;

use common::mig as mig_request;
use runtimekit_fake_nvml::world::{CallFault, Card, Event, Process};
use runtimekit_fake_nvml::{FakeNvml, World};
use runtimekit_proto::resource::v1alpha1 as pb;
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

/// The ID of the first GPU instance on card 0 of the fake.
fn first_gpu_instance(fake: &FakeNvml) -> u32 {
    fake.world().expect("world").cards[0]
        .mig
        .as_ref()
        .expect("mig")
        .instances[0]
        .id
}

/// One H100 card in MIG mode, with a 3g.40gb instance keyed `pod-a` at 0.
fn one_mig_instance() -> (FakeNvml, NvmlBackend) {
    let mut world = World::h100(1);
    world.cards[0] = Card::h100(0).mig_on();
    let (fake, backend) = backend(&world);
    backend
        .create_instance(mig_request("pod-a", 0, "3g.40gb", 0))
        .expect("create");
    (fake, backend)
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
    let listed = backend.list_instances(&[1]).expect("list").instances;
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

    // What the compute meter reads every second: the processes and busy time, nothing else.
    let metered = backend.process_metrics().expect("process metrics");
    let p = &metered.devices[0];
    assert_eq!(p.device_uuid, m.device_uuid);
    assert_eq!(
        (p.gpu_temp_c, p.power_usage_w, p.fb_used_mib),
        (None, None, None)
    );
    assert_eq!(p.gpu_util_percent, m.gpu_util_percent);
    assert_eq!(p.processes, m.processes);
}

/// The errors of a listing, as (card, reason).
fn reasons(errors: &[pb::DeviceError]) -> Vec<(u32, String)> {
    errors
        .iter()
        .map(|e| (e.device_index, e.reason.clone()))
        .collect()
}

#[test]
fn mig_queries_refused_on_one_card_lose_no_other_card() {
    // A non-root agent, or a container without the MIG monitor capability, gets NO_PERMISSION
    // for every GPU-instance query of a MIG card.
    let mut world = World::h100(3);
    world.cards[1] = Card::h100(1).mig_on();
    world.faults.push(CallFault::error(
        "nvmlDeviceGetGpuInstances",
        Some(1),
        "NO_PERMISSION",
    ));
    let (_fake, backend) = backend(&world);
    let listed = backend.list_devices(&[]).expect("the listing survives");
    assert_eq!(listed.devices.len(), 3);
    let states: Vec<pb::DeviceState> = listed.devices.iter().map(|d| d.state()).collect();
    assert_eq!(
        states,
        [
            pb::DeviceState::Ok,
            pb::DeviceState::Partial,
            pb::DeviceState::Ok
        ]
    );
    // What could be read of the MIG card is there.
    assert_eq!(listed.devices[1].model, "NVIDIA H100 80GB HBM3");
    assert_eq!(reasons(&listed.errors).len(), 1);
    assert_eq!(listed.errors[0].device_index, 1);
    assert!(
        listed.errors[0]
            .message
            .contains("nvmlDeviceGetGpuInstances"),
        "{:?}",
        listed.errors
    );
    let instances = backend.list_instances(&[]).expect("the listing survives");
    assert_eq!(reasons(&instances.errors).len(), 1);
    assert_eq!(instances.errors[0].device_index, 1);
    // The probe goes on and says what it could not read.
    let report = runtimekit_resource_layer::probe::report(&backend, true).expect("probe");
    assert!(report.contains("card 1: not read in full"), "{report}");
    assert!(
        report.contains("card 2: VENDOR_NVIDIA NVIDIA H100"),
        "{report}"
    );
}

#[test]
fn a_card_answering_unknown_is_listed_unreadable_and_the_others_whole() {
    // A card fallen off the bus may answer UNKNOWN rather than GPU_IS_LOST.
    let mut world = World::h100(4);
    world
        .faults
        .push(CallFault::error("nvmlDeviceGetName", Some(2), "UNKNOWN"));
    let (_fake, backend) = backend(&world);
    let listed = backend.list_devices(&[]).expect("the listing survives");
    assert_eq!(listed.devices.len(), 4);
    let card = &listed.devices[2];
    assert_eq!(card.state(), pb::DeviceState::Partial);
    assert_eq!(card.uuid, Card::h100(2).uuid, "its UUID from discovery");
    assert!(card.model.is_empty());
    assert_eq!(reasons(&listed.errors), [(2, "NvmlError".to_string())]);
    for i in [0, 1, 3] {
        assert_eq!(listed.devices[i].state(), pb::DeviceState::Ok, "card {i}");
    }
    // Paths are given between the cards that answer.
    assert!(listed.paths.iter().all(|p| p.a != 2 && p.b != 2));
    assert_eq!(listed.paths.len(), 3);
}

/// Waits up to 10 s for `done`.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn has_fault(backend: &NvmlBackend, card: u32, kind: pb::FaultKind) -> bool {
    backend
        .health()
        .faults_of(card)
        .iter()
        .any(|f| f.kind() == kind)
}

/// A backend whose periodic poll never comes during a test: only events and calls act.
fn backend_without_polls(world: &World) -> (FakeNvml, NvmlBackend) {
    let fake = FakeNvml::install(world).expect("install the fake NVML");
    let backend = NvmlBackend::new(NvmlOptions {
        poll_interval: Duration::from_secs(3600),
        ..options(&fake)
    })
    .expect("the backend starts on the fake");
    (fake, backend)
}

#[test]
fn a_lost_card_stays_lost_while_its_handle_still_resolves() {
    // A card fallen off the bus: its handle lookup succeeds, every real call is GPU_IS_LOST.
    let mut world = World::h100(2);
    world.cards[1].lost = true;
    let (fake, backend) = backend(&world);
    assert!(
        has_fault(&backend, 1, pb::FaultKind::GpuLost),
        "lost at the first poll"
    );
    // Polls every 50 ms: it never flaps back.
    for _ in 0..10 {
        std::thread::sleep(Duration::from_millis(30));
        assert!(
            !backend.health().healthy(1),
            "card 1 flapped back to healthy"
        );
    }
    let listed = backend.list_devices(&[]).expect("list");
    assert_eq!(listed.devices[1].state(), pb::DeviceState::Lost);
    assert!(!listed.devices[1].healthy);
    assert!(backend.health().healthy(0));
    // Back on the bus: the next real query clears it.
    fake.edit(|w| w.cards[1].lost = false).expect("edit");
    wait_until("card 1 to answer again", || backend.health().healthy(1));
}

#[test]
fn gpu_is_lost_from_the_event_wait_finds_the_lost_card() {
    let (fake, backend) = backend_without_polls(&World::h100(3));
    assert!(backend.health().healthy(2));
    fake.edit(|w| {
        w.cards[2].lost = true;
        let mut lost = CallFault::error("nvmlEventSetWait_v2", None, "GPU_IS_LOST");
        lost.times = Some(1);
        w.faults.push(lost);
    })
    .expect("edit");
    wait_until("card 2 to be marked lost", || {
        has_fault(&backend, 2, pb::FaultKind::GpuLost)
    });
    assert!(backend.health().healthy(0) && backend.health().healthy(1));
}

#[test]
fn an_xid_of_a_card_whose_uuid_cannot_be_read_is_not_dropped() {
    // XID 79: the card fell off the bus; its UUID cannot be read from the event's handle.
    let (fake, backend) = backend_without_polls(&World::h100(4));
    fake.edit(|w| {
        w.faults.push(CallFault::error(
            "nvmlDeviceGetUUID",
            Some(3),
            "GPU_IS_LOST",
        ));
        w.events.push(Event::xid(3, 79));
    })
    .expect("edit");
    wait_until("XID 79 on card 3", || {
        backend
            .health()
            .faults_of(3)
            .iter()
            .any(|f| f.kind() == pb::FaultKind::Xid && f.xid == 79)
    });
}

#[test]
fn xid_999_stays_999() {
    let (fake, backend) = backend_without_polls(&World::h100(1));
    fake.edit(|w| w.events.push(Event::xid(0, 999)))
        .expect("edit");
    wait_until("XID 999 on card 0", || {
        backend
            .health()
            .faults_of(0)
            .iter()
            .any(|f| f.kind() == pb::FaultKind::Xid && f.xid == 999)
    });
}

#[test]
fn nvlink_throughput_and_errors_count_every_link() {
    let mut world = World::h100(1);
    for (i, link) in world.cards[0].links.iter_mut().enumerate() {
        let i = i as u64;
        link.tx_kib = 1_000 + i;
        link.rx_kib = 2_000 + i;
    }
    // Errors on links 3 and 17, none on link 0.
    world.cards[0].links[3].crc_flit_errors = 5;
    world.cards[0].links[17].crc_flit_errors = 2;
    world.cards[0].links[3].replay_errors = 4;
    world.cards[0].links[17].recovery_errors = 1;
    let (_fake, backend) = backend(&world);
    let m = &backend
        .device_metrics(&[0], false)
        .expect("metrics")
        .devices[0];
    let links = 18u64;
    let sum = |base: u64| (0..links).map(|i| base + i).sum::<u64>() * 1024;
    assert_eq!(m.nvlink_tx_bytes, Some(sum(1_000)), "every link's traffic");
    assert_eq!(m.nvlink_rx_bytes, Some(sum(2_000)));
    assert_eq!(m.nvlink_crc_flit_errors, Some(7));
    assert_eq!(m.nvlink_replay_errors, Some(4));
    assert_eq!(m.nvlink_recovery_errors, Some(1));
    assert_eq!(m.memory_temp_c, Some(40));
}

/// A PID-namespace link in the fake's folder, pointing at `target`.
fn pid_namespace(fake: &FakeNvml, target: &str) -> std::path::PathBuf {
    let link = fake.dir().join(format!("ns-{}", target.len()));
    std::os::unix::fs::symlink(target, &link).expect("link");
    link
}

/// A backend seeing one card whose memory is held by a PID that no process has here, in the
/// PID namespace `namespace`.
fn held_by_a_gone_process(namespace: &str) -> (FakeNvml, NvmlBackend) {
    let mut world = World::h100(1);
    world.cards[0].processes = vec![Process {
        pid: u32::MAX - 7,
        used_mib: Some(2_048),
        ..Process::default()
    }];
    let fake = FakeNvml::install(&world).expect("install");
    let backend = NvmlBackend::new(NvmlOptions {
        pid_namespace: pid_namespace(&fake, namespace),
        ..options(&fake)
    })
    .expect("start");
    (fake, backend)
}

#[test]
fn dead_processes_are_not_judged_outside_the_host_pid_namespace() {
    let (_fake, backend) = held_by_a_gone_process("pid:[4026532271]");
    let info = backend.info();
    assert!(
        info.process_liveness_unavailable.contains("PID namespace"),
        "{info:?}"
    );
    // Many polls: a PID that means nothing here is never taken for a dead process.
    std::thread::sleep(Duration::from_millis(300));
    assert!(!has_fault(&backend, 0, pb::FaultKind::DeadProcessMemory));
    let m = backend.device_metrics(&[0], true).expect("metrics");
    assert_eq!(
        m.devices[0].processes[0].alive, None,
        "liveness unknown here"
    );
    let report = runtimekit_resource_layer::probe::report(&backend, false).expect("probe");
    assert!(
        report.contains("memory held by dead processes: not watched"),
        "{report}"
    );
}

#[test]
fn dead_processes_are_found_in_the_host_pid_namespace() {
    let (_fake, backend) = held_by_a_gone_process("pid:[4026531836]");
    assert!(backend.info().process_liveness_unavailable.is_empty());
    wait_until("the dead process's memory to be a fault", || {
        has_fault(&backend, 0, pb::FaultKind::DeadProcessMemory)
    });
}

/// A GPU instance made on card `card` by hand (nvidia-smi), with compute instances of the
/// given profile IDs.
fn by_hand(world: &mut World, card: usize, id: u32, profile_id: u32, start: u32, cis: &[u32]) {
    let mig = world.cards[card].mig.as_mut().expect("a MIG card");
    let size = mig
        .profiles
        .iter()
        .find(|p| p.id == profile_id)
        .expect("the profile")
        .memory_slices;
    mig.instances
        .push(runtimekit_fake_nvml::world::GpuInstance {
            id,
            profile_id,
            start,
            size,
            uuid: format!("MIG-hand-{id}"),
            compute_instances: cis
                .iter()
                .enumerate()
                .map(|(i, &p)| runtimekit_fake_nvml::world::ComputeInstance {
                    id: i as u32,
                    profile_id: p,
                })
                .collect(),
            ..Default::default()
        });
}

#[test]
fn instances_of_profiles_past_the_crates_constants_are_listed() {
    let mut world = World::h100(1);
    world.cards[0] = Card::h100(0).mig_on();
    let mig = world.cards[0].mig.as_mut().expect("mig");
    // A newer driver's 1g.10gb without media engines (profile index 13, ID 21), and a 7-slice
    // compute-instance profile at index 8, past NVML_COMPUTE_INSTANCE_PROFILE_COUNT.
    let mut no_me = mig.profiles[0].clone();
    (no_me.index, no_me.id, no_me.name) = (13, 21, "1g.10gb-me".into());
    mig.profiles.push(no_me);
    mig.compute_profile_count = 9;
    let full = mig.profiles.iter_mut().find(|p| p.id == 0).expect("7g");
    full.compute_profiles
        .push(runtimekit_fake_nvml::world::CiProfile {
            index: 8,
            id: 8,
            slices: 7,
        });
    let mut two = World::h100(2);
    two.cards[0] = world.cards[0].clone();
    two.cards[1] = world.cards[0].clone();
    by_hand(&mut two, 0, 11, 21, 2, &[0]);
    by_hand(&mut two, 1, 1, 0, 0, &[8]);
    let (_fake, backend) = backend(&two);
    let listed = backend.list_instances(&[]).expect("list");
    assert!(listed.errors.is_empty(), "{:?}", listed.errors);
    let on = |card: u32| {
        listed
            .instances
            .iter()
            .filter(|i| i.spec.as_ref().is_some_and(|s| s.device_index == card))
            .collect::<Vec<_>>()
    };
    assert_eq!(on(0).len(), 1, "the 1g.10gb-me instance occupies slice 2");
    let full = on(1);
    assert_eq!(full.len(), 1);
    let ids = full[0].mig.as_ref().expect("ids");
    assert!(
        !ids.no_compute_instance,
        "its compute instance is found: {ids:?}"
    );
}

#[test]
fn a_failed_profile_query_forgets_no_key() {
    let (fake, backend) = one_mig_instance();
    fake.edit(|w| {
        let mut flaky = CallFault::error("nvmlDeviceGetGpuInstanceProfileInfo", Some(0), "UNKNOWN");
        flaky.times = Some(1);
        w.faults.push(flaky);
    })
    .expect("edit");
    let during = backend.list_instances(&[0]).expect("list");
    assert_eq!(during.errors.len(), 1, "the card's error is said");
    assert_eq!(
        during.instances[0].key, "pod-a",
        "what the ledger knows is listed"
    );
    let after = backend.list_instances(&[0]).expect("list");
    assert!(after.errors.is_empty());
    assert_eq!(after.instances.len(), 1);
    assert_eq!(after.instances[0].key, "pod-a", "the key is kept");
}

#[test]
fn a_gpu_instance_without_compute_instance_is_completed_before_it_is_adopted() {
    let mut world = World::h100(1);
    world.cards[0] = Card::h100(0).mig_on();
    by_hand(&mut world, 0, 1, 9, 4, &[]);
    let (fake, backend) = backend(&world);
    let listed = backend.list_instances(&[0]).expect("list").instances;
    assert_eq!(listed.len(), 1);
    assert!(
        listed[0]
            .mig
            .as_ref()
            .is_some_and(|m| m.no_compute_instance),
        "{listed:?}"
    );
    let adopted = backend
        .create_instance(mig_request("pod-a", 0, "3g.40gb", 4))
        .expect("adopt");
    assert!(adopted.adopted);
    let ids = adopted.instance.and_then(|i| i.mig).expect("ids");
    assert!(!ids.no_compute_instance);
    assert!(!ids.device_uuid.is_empty(), "a MIG device now: {ids:?}");
    let card = &fake.world().expect("world").cards[0];
    let gi = &card.mig.as_ref().expect("mig").instances[0];
    assert_eq!(
        gi.compute_instances.len(),
        1,
        "its full compute instance was made"
    );
}

#[test]
fn process_utilisation_is_seen_by_every_reader_and_idle_processes_read_zero() {
    let mut world = World::h100(1);
    // The driver's newest sample, held still: every read below sees the same one.
    world.sample_at_us = Some(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_micros() as u64,
    );
    world.cards[0].processes = vec![
        Process {
            pid: 100,
            used_mib: Some(1_024),
            sm_util: 40,
            ..Process::default()
        },
        Process {
            pid: 200,
            used_mib: Some(512),
            ..Process::default()
        },
    ];
    let (_fake, backend) = backend(&world);
    let util = |m: &pb::GetDeviceMetricsResponse| -> Vec<(u32, Option<u32>)> {
        m.devices[0]
            .processes
            .iter()
            .map(|p| (p.pid, p.sm_util_percent))
            .collect()
    };
    let first = backend.device_metrics(&[0], true).expect("metrics");
    let second = backend.device_metrics(&[0], true).expect("metrics");
    assert_eq!(util(&first), [(100, Some(40)), (200, Some(0))]);
    assert_eq!(
        util(&second),
        util(&first),
        "the second reader sees the sample too"
    );
}

#[test]
fn gpm_ratios_come_from_one_sample_per_read_over_the_time_between_reads() {
    let mut world = World::h100(1);
    world.cards[0].readings.gpm_percent = [50.0, 40.0, 30.0, 20.0, 10.0];
    let (fake, backend) = backend(&world);
    let first = backend.device_metrics(&[0], false).expect("metrics");
    assert_eq!(
        first.devices[0].sm_active, None,
        "one sample says nothing yet"
    );
    // GPM ratios are computed over at least a second.
    std::thread::sleep(Duration::from_millis(1_100));
    let second = backend.device_metrics(&[0], false).expect("metrics");
    let m = &second.devices[0];
    assert_eq!(
        (
            m.gr_engine_active,
            m.sm_active,
            m.sm_occupancy,
            m.pipe_tensor_active,
            m.dram_active
        ),
        (Some(0.5), Some(0.4), Some(0.3), Some(0.2), Some(0.1))
    );
    // A read soon after repeats them without a sample of its own.
    let third = backend.device_metrics(&[0], false).expect("metrics");
    assert_eq!(third.devices[0].sm_active, Some(0.4));
    let taken = fake.world().expect("world").cards[0].gpm_samples;
    assert_eq!(
        taken, 2,
        "one sample per read that needed one, none to wait between"
    );
}

#[test]
fn a_hung_create_holds_up_only_its_own_card() {
    let mut world = World::h100(2);
    world.cards[0] = Card::h100(0).mig_on();
    world.cards[1] = Card::h100(1).mig_on();
    world.faults.push(CallFault::hang(
        "nvmlDeviceCreateGpuInstanceWithPlacement",
        Some(0),
        4_000,
    ));
    let (_fake, backend) = backend(&world);
    let backend = std::sync::Arc::new(backend);
    let finished = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hung = {
        let (backend, finished) = (backend.clone(), finished.clone());
        std::thread::spawn(move || {
            let created = backend.create_instance(mig_request("pod-0", 0, "3g.40gb", 0));
            finished.store(true, std::sync::atomic::Ordering::SeqCst);
            created
        })
    };
    wait_until("the hung create to be reported", || {
        has_fault(&backend, 0, pb::FaultKind::CallHang)
    });
    backend
        .create_instance(mig_request("pod-1", 1, "3g.40gb", 0))
        .expect("card 1 is not held up");
    assert!(
        !finished.load(std::sync::atomic::Ordering::SeqCst),
        "card 1's create returned while card 0's was still hung"
    );
    hung.join()
        .expect("join")
        .expect("card 0's create finishes once the call returns");
    wait_until("the hang to clear", || {
        !has_fault(&backend, 0, pb::FaultKind::CallHang)
    });
}

#[test]
fn a_hung_poll_of_one_card_blinds_no_xid_watch() {
    let (fake, backend) = backend(&World::h100(2));
    fake.edit(|w| {
        let mut hang = CallFault::hang("nvmlDeviceGetMemoryInfo_v2", Some(0), 30_000);
        hang.times = Some(1);
        w.faults.push(hang);
    })
    .expect("edit");
    wait_until("card 0's poll to hang", || {
        has_fault(&backend, 0, pb::FaultKind::CallHang)
    });
    fake.edit(|w| w.events.push(Event::xid(1, 48)))
        .expect("edit");
    wait_until("card 1's XID while card 0 hangs", || {
        backend
            .health()
            .faults_of(1)
            .iter()
            .any(|f| f.kind() == pb::FaultKind::Xid && f.xid == 48)
    });
    // Card 1's own poll goes on too.
    fake.edit(|w| w.cards[1].readings.ecc_dbe_volatile = 2)
        .expect("edit");
    wait_until("card 1's ECC errors", || {
        has_fault(&backend, 1, pb::FaultKind::EccDbe)
    });
}

#[test]
fn a_hung_destroy_is_reported() {
    let (fake, backend) = one_mig_instance();
    fake.edit(|w| {
        let mut hang = CallFault::hang("nvmlGpuInstanceDestroy", Some(0), 1_500);
        hang.times = Some(1);
        w.faults.push(hang);
    })
    .expect("edit");
    let backend = std::sync::Arc::new(backend);
    let destroying = {
        let backend = backend.clone();
        std::thread::spawn(move || backend.destroy_instance(DestroyTarget::Key("pod-a".into())))
    };
    wait_until("the hung destroy to be reported", || {
        has_fault(&backend, 0, pb::FaultKind::CallHang)
    });
    assert!(destroying.join().expect("join").expect("destroyed").existed);
}

#[test]
fn a_hung_init_fails_clearly() {
    let mut world = World::h100(1);
    world
        .faults
        .push(CallFault::hang("nvmlInit_v2", None, 5_000));
    let fake = FakeNvml::install(&world).expect("install");
    let error = NvmlBackend::new(NvmlOptions {
        init_timeout: Duration::from_millis(300),
        ..options(&fake)
    })
    .expect_err("init hangs");
    assert!(error.to_string().contains("did not initialise"), "{error}");
}

#[test]
fn a_card_whose_event_types_cannot_be_read_is_marked() {
    let mut world = World::h100(2);
    world.faults.push(CallFault::error(
        "nvmlDeviceGetSupportedEventTypes",
        Some(1),
        "UNKNOWN",
    ));
    let (_fake, backend) = backend(&world);
    wait_until("card 1 to be marked", || {
        has_fault(&backend, 1, pb::FaultKind::EventsUnwatched)
    });
    assert!(
        backend.health().healthy(1),
        "a warning: the card stays usable"
    );
    assert!(!has_fault(&backend, 0, pb::FaultKind::EventsUnwatched));
}

#[test]
fn an_xid_the_driver_gives_a_mig_instance_faults_only_that_instance() {
    let mut world = World::h100(1);
    world.cards[0] = Card::h100(0).mig_on();
    let (fake, backend) = backend_without_polls(&world);
    backend
        .create_instance(mig_request("pod-a", 0, "3g.40gb", 0))
        .expect("create");
    let gi = first_gpu_instance(&fake);
    fake.edit(|w| {
        w.events.push(Event {
            gpu_instance_id: gi,
            compute_instance_id: 0,
            ..Event::xid(0, 94)
        });
    })
    .expect("edit");
    wait_until("the instance's XID", || {
        has_fault(&backend, 0, pb::FaultKind::Xid)
    });
    let fault = backend.health().faults_of(0)[0].clone();
    assert_eq!(fault.gpu_instance_id, Some(gi));
    assert_eq!(fault.compute_instance_id, Some(0));
    assert!(
        backend.health().healthy(0),
        "the card and its other instances are fine"
    );
    // The same XID outside any instance is the card's.
    fake.edit(|w| w.events.push(Event::xid(0, 94)))
        .expect("edit");
    wait_until("the card's XID", || !backend.health().healthy(0));
}

#[test]
fn an_instance_a_process_uses_is_not_destroyed() {
    let (fake, backend) = one_mig_instance();
    let gi = first_gpu_instance(&fake);
    fake.edit(|w| {
        w.cards[0].processes = vec![Process {
            pid: 77,
            used_mib: Some(100),
            gpu_instance_id: Some(gi),
            compute_instance_id: Some(0),
            ..Process::default()
        }];
    })
    .expect("edit");
    let refused = backend
        .destroy_instance(DestroyTarget::Key("pod-a".into()))
        .expect_err("in use");
    assert_eq!(refused.reason().as_str(), "InstanceInUse", "{refused}");
    let listed = backend.list_instances(&[0]).expect("list").instances;
    assert_eq!(listed[0].key, "pod-a", "still there, still keyed");
    fake.edit(|w| w.cards[0].processes.clear()).expect("edit");
    assert!(
        backend
            .destroy_instance(DestroyTarget::Key("pod-a".into()))
            .expect("destroyed once free")
            .existed
    );
}

#[test]
fn gpu_is_lost_from_a_create_marks_the_card_lost() {
    let mut world = World::h100(1);
    world.cards[0] = Card::h100(0).mig_on();
    let (fake, backend) = backend_without_polls(&world);
    fake.edit(|w| {
        w.faults.push(CallFault::error(
            "nvmlDeviceCreateGpuInstanceWithPlacement",
            Some(0),
            "GPU_IS_LOST",
        ));
    })
    .expect("edit");
    let error = backend
        .create_instance(mig_request("pod-a", 0, "3g.40gb", 0))
        .expect_err("lost");
    assert_eq!(error.reason().as_str(), "DeviceLost", "{error}");
    assert!(has_fault(&backend, 0, pb::FaultKind::GpuLost));
}

#[test]
fn an_xid_clears_after_a_quiet_window_on_a_card_that_answers() {
    let fake = FakeNvml::install(&World::h100(2)).expect("install");
    let backend = NvmlBackend::new(NvmlOptions {
        xid_clear_after: Duration::from_millis(400),
        ..options(&fake)
    })
    .expect("start");
    fake.edit(|w| {
        w.events.push(Event::xid(0, 48));
        w.events.push(Event::xid(1, 48));
    })
    .expect("edit");
    wait_until("the XIDs", || {
        has_fault(&backend, 0, pb::FaultKind::Xid) && has_fault(&backend, 1, pb::FaultKind::Xid)
    });
    // Card 1 stops answering: its XID stays.
    fake.edit(|w| w.cards[1].lost = true).expect("edit");
    wait_until("card 0's XID to clear", || {
        !has_fault(&backend, 0, pb::FaultKind::Xid)
    });
    assert!(backend.health().healthy(0));
    assert!(
        has_fault(&backend, 1, pb::FaultKind::Xid),
        "a lost card's XID stays"
    );
}

#[test]
fn an_nvlink_link_down_fails_the_card_until_it_is_back_and_error_bursts_warn() {
    let (fake, backend) = backend(&World::h100(2));
    fake.edit(|w| w.cards[1].links[3].active = false)
        .expect("edit");
    wait_until("link 3 of card 1 down", || {
        has_fault(&backend, 1, pb::FaultKind::NvlinkDown)
    });
    assert!(!backend.health().healthy(1));
    assert!(backend.health().healthy(0));
    fake.edit(|w| w.cards[1].links[3].active = true)
        .expect("edit");
    wait_until("the link back", || backend.health().healthy(1));

    fake.edit(|w| w.cards[0].links[5].replay_errors += 1_000)
        .expect("edit");
    wait_until("an error burst on card 0", || {
        has_fault(&backend, 0, pb::FaultKind::NvlinkErrors)
    });
    assert!(backend.health().healthy(0), "a burst is a warning");
    wait_until("the burst to pass", || {
        !has_fault(&backend, 0, pb::FaultKind::NvlinkErrors)
    });
}

#[test]
fn a_compute_mode_that_keeps_work_off_a_card_is_a_fault() {
    let (fake, backend) = backend(&World::h100(2));
    // PROHIBITED: nothing may run there.
    fake.edit(|w| w.cards[0].compute_mode = 2).expect("edit");
    wait_until("card 0 prohibited", || {
        has_fault(&backend, 0, pb::FaultKind::ComputeMode)
    });
    assert!(!backend.health().healthy(0));
    // EXCLUSIVE_PROCESS: usable whole, not shared; a warning.
    fake.edit(|w| {
        w.cards[0].compute_mode = 0;
        w.cards[1].compute_mode = 3;
    })
    .expect("edit");
    wait_until("card 0 back, card 1 exclusive", || {
        backend.health().healthy(0)
            && !has_fault(&backend, 0, pb::FaultKind::ComputeMode)
            && has_fault(&backend, 1, pb::FaultKind::ComputeMode)
    });
    assert!(backend.health().healthy(1), "a warning");
}
