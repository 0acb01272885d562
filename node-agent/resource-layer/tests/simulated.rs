//! The simulated backend through the Backend trait: MIG rules, idempotent creation by key,
//! destruction, state across restarts, faults with health events, hangs, metrics.

mod common;

use common::{A30, TempDir, mig};
use runtimekit_proto::resource::v1alpha1 as pb;
use runtimekit_resource_layer::instances::{CreateRequest, ShareSpec};
use runtimekit_resource_layer::{
    Backend, Clock, DestroyTarget, FaultInjector, LayerError, SimOptions, SimProfile,
    SimulatedBackend,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn backend(profile: &str) -> SimulatedBackend {
    SimulatedBackend::from_profile(profile, SimOptions::default()).expect("profile loads")
}

fn tdm(key: &str, card: u32, core_percent: u32, memory_mib: u64) -> CreateRequest {
    CreateRequest {
        key: key.into(),
        device_index: card,
        device_uuid: None,
        spec: ShareSpec::Tdm {
            core_percent,
            memory_mib,
        },
    }
}

fn reason(result: Result<pb::CreateInstanceResponse, LayerError>) -> &'static str {
    result.expect_err("the create must fail").reason().as_str()
}

fn inject(b: &SimulatedBackend, card: u32, kind: pb::FaultKind, xid: u32) -> pb::DeviceFault {
    b.inject(&pb::InjectFaultRequest {
        device_index: card,
        kind: kind.into(),
        xid,
        ..Default::default()
    })
    .expect("inject")
}

// --- MIG rules -------------------------------------------------------------------------------

#[test]
fn legal_mig_instances_are_created_with_hardware_identity() {
    let b = backend("h800-8");
    let made = b
        .create_instance(mig("pod-a", 6, "3g.40gb", 4))
        .expect("legal");
    assert!(made.created && !made.adopted);
    let instance = made.instance.expect("instance");
    assert_eq!(instance.key, "pod-a");
    assert_eq!(instance.kind(), pb::InstanceKind::Mig);
    let ids = instance.mig.expect("MIG identity");
    assert!(ids.device_uuid.starts_with("MIG-"), "{}", ids.device_uuid);
    assert_eq!(ids.compute_slices, 3);
    assert_eq!(ids.memory_slices, 4);
    assert!(ids.memory_mib > 38 * 1024 && ids.memory_mib < 40 * 1024);
    let spec = instance.spec.expect("spec");
    assert_eq!(spec.device_uuid, b.uuid(6).expect("uuid"));
    // The documented layout 3g@4 + 2g@0 + 1g@2 + 1g@3 fills the card.
    b.create_instance(mig("pod-b", 6, "2g.20gb", 0))
        .expect("2g@0");
    b.create_instance(mig("pod-c", 6, "1g.10gb", 2))
        .expect("1g@2");
    b.create_instance(mig("pod-d", 6, "1g.10gb", 3))
        .expect("1g@3");
    let on_card = b.list_instances(&[6]).expect("list").instances;
    assert_eq!(on_card.len(), 4);
    let mut gis: Vec<u32> = on_card
        .iter()
        .filter_map(|i| i.mig.as_ref().map(|m| m.gpu_instance_id))
        .collect();
    gis.sort_unstable();
    gis.dedup();
    assert_eq!(gis.len(), 4, "distinct GPU-instance IDs");
    assert_eq!(
        reason(b.create_instance(mig("pod-e", 6, "1g.10gb", 6))),
        "InstanceOverlap"
    );
}

#[test]
fn illegal_starts_overlaps_and_unknown_profiles_are_refused() {
    let b = backend("h800-8");
    assert_eq!(
        reason(b.create_instance(mig("a", 7, "4g.40gb", 4))),
        "IllegalPlacement"
    );
    assert_eq!(
        reason(b.create_instance(mig("a", 7, "2g.20gb", 1))),
        "IllegalPlacement"
    );
    assert_eq!(
        reason(b.create_instance(mig("a", 7, "1g.20gb", 3))),
        "IllegalPlacement"
    );
    assert_eq!(
        reason(b.create_instance(mig("a", 7, "3g.20gb", 0))),
        "UnknownMigProfile"
    );
    b.create_instance(mig("a", 7, "4g.40gb", 0)).expect("4g@0");
    let err = b
        .create_instance(mig("b", 7, "3g.40gb", 0))
        .expect_err("overlap");
    assert_eq!(err.reason().as_str(), "InstanceOverlap");
    assert!(
        err.to_string()
            .contains("overlaps instance a (MIG 4g.40gb at 0)"),
        "{err}"
    );
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    // The other half of the card is free.
    b.create_instance(mig("b", 7, "3g.40gb", 4)).expect("3g@4");
    assert_eq!(
        reason(b.create_instance(mig("c", 7, "7g.80gb", 0))),
        "InstanceOverlap"
    );
}

#[test]
fn a_card_holds_at_most_its_profile_capacity() {
    let b = backend("h800-8");
    for start in 0..7 {
        b.create_instance(mig(&format!("g{start}"), 7, "1g.10gb", start))
            .expect("seven 1g instances fit");
    }
    // The eighth memory slice is free, but no 1g instance may start there.
    assert_eq!(
        reason(b.create_instance(mig("g7", 7, "1g.10gb", 7))),
        "IllegalPlacement"
    );
    for start in 0..7 {
        assert_eq!(
            reason(b.create_instance(mig("more", 7, "1g.10gb", start))),
            "InstanceOverlap"
        );
    }
    for start in [0, 2, 4, 6] {
        b.create_instance(mig(&format!("d{start}"), 6, "1g.20gb", start))
            .expect("four 1g.20gb instances fit");
    }
    assert_eq!(b.list_instances(&[6, 7]).expect("list").instances.len(), 11);
}

#[test]
fn mig_needs_mig_mode_and_a_mig_model_and_tdm_needs_its_absence() {
    let b = backend("h800-8");
    let err = b
        .create_instance(mig("a", 0, "1g.10gb", 0))
        .expect_err("MIG off");
    assert_eq!(err.reason().as_str(), "MigModeDisabled");
    assert!(err.to_string().contains("never changes"), "{err}");
    assert_eq!(
        reason(b.create_instance(tdm("t", 6, 50, 1024))),
        "MigModeEnabled"
    );
    b.create_instance(tdm("t", 0, 50, 1024))
        .expect("TDM on a TDM card");
    // The card's MIG mode is what the profile says, before and after.
    let devices = b.list_devices(&[]).expect("list").devices;
    let modes: Vec<bool> = devices
        .iter()
        .map(|d| d.mig.as_ref().is_some_and(|m| m.enabled))
        .collect();
    assert_eq!(
        modes,
        [false, false, false, false, false, false, true, true]
    );

    let ppu = backend("ppu-810e-8");
    assert_eq!(
        reason(ppu.create_instance(mig("a", 0, "1g.10gb", 0))),
        "MigUnsupported"
    );
    ppu.create_instance(tdm("t", 0, 30, 8192))
        .expect("PPU shares by TDM");
    let amd = backend("mi300x-8");
    assert_eq!(
        reason(amd.create_instance(tdm("t", 0, 30, 8192))),
        "SharingUnsupported"
    );
    assert_eq!(
        reason(amd.create_instance(mig("m", 0, "1g.10gb", 0))),
        "MigUnsupported"
    );
}

#[test]
fn a30_has_the_four_slice_geometry() {
    let b = SimulatedBackend::new(
        SimProfile::from_yaml(A30).expect("A30"),
        SimOptions::default(),
    )
    .expect("backend");
    let device = &b.list_devices(&[]).expect("list").devices[0];
    let state = device.mig.as_ref().expect("MIG");
    assert_eq!((state.compute_slices, state.memory_slices), (4, 4));
    assert_eq!(state.table, "A30-24GB");
    let names: Vec<&str> = state.profiles.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["1g.6gb", "2g.12gb", "4g.24gb"]);
    // Slices 0 and 1 hold the two hand-made instances.
    assert_eq!(
        reason(b.create_instance(mig("a", 0, "1g.6gb", 4))),
        "IllegalPlacement"
    );
    assert_eq!(
        reason(b.create_instance(mig("a", 0, "4g.24gb", 0))),
        "InstanceOverlap"
    );
    assert_eq!(
        reason(b.create_instance(mig("a", 0, "2g.12gb", 0))),
        "InstanceOverlap"
    );
    assert_eq!(
        reason(b.create_instance(mig("a", 0, "3g.12gb", 0))),
        "UnknownMigProfile"
    );
    b.create_instance(mig("a", 0, "2g.12gb", 2)).expect("2g@2");
}

// --- keys, adoption, destruction -----------------------------------------------------------

#[test]
fn same_key_twice_returns_the_same_instance_and_another_spec_conflicts() {
    let b = backend("h800-8");
    let first = b
        .create_instance(mig("slice-1", 6, "1g.10gb", 6))
        .expect("first");
    let again = b
        .create_instance(mig("slice-1", 6, "1g.10gb", 6))
        .expect("retry");
    assert!(first.created);
    assert!(!again.created && !again.adopted);
    assert_eq!(first.instance, again.instance);
    let err = b
        .create_instance(mig("slice-1", 6, "1g.10gb", 5))
        .expect_err("other spec");
    assert_eq!(err.reason().as_str(), "InstanceKeyConflict");
    assert_eq!(err.code(), tonic::Code::AlreadyExists);
    assert_eq!(
        reason(b.create_instance(mig("slice-1", 7, "1g.10gb", 6))),
        "InstanceKeyConflict"
    );
    assert_eq!(
        reason(b.create_instance(tdm("slice-1", 0, 10, 0))),
        "InstanceKeyConflict"
    );
    // TDM shares are idempotent too.
    let s1 = b.create_instance(tdm("share", 1, 25, 4096)).expect("share");
    let s2 = b.create_instance(tdm("share", 1, 25, 4096)).expect("retry");
    assert_eq!(s1.instance, s2.instance);
    assert!(!s2.created);
    // A UUID that is not the card's is refused.
    let mut wrong = tdm("other", 1, 25, 4096);
    wrong.device_uuid = Some("GPU-00000000-0000-0000-0000-000000000000".into());
    assert_eq!(reason(b.create_instance(wrong)), "DeviceUuidMismatch");
    let mut right = tdm("other", 1, 25, 4096);
    right.device_uuid = b.uuid(1).map(str::to_string);
    b.create_instance(right).expect("matching UUID");
    assert_eq!(
        reason(b.create_instance(tdm("x", 8, 25, 0))),
        "NoSuchDevice"
    );
}

#[test]
fn destroy_is_idempotent_and_frees_the_slices() {
    let b = backend("h800-8");
    b.create_instance(mig("a", 6, "7g.80gb", 0)).expect("7g");
    assert_eq!(
        reason(b.create_instance(mig("b", 6, "1g.10gb", 0))),
        "InstanceOverlap"
    );
    let gone = b
        .destroy_instance(DestroyTarget::Key("a".into()))
        .expect("destroy");
    assert!(gone.existed);
    assert_eq!(gone.instance.map(|i| i.key), Some("a".into()));
    let again = b
        .destroy_instance(DestroyTarget::Key("a".into()))
        .expect("destroy again");
    assert!(!again.existed);
    b.create_instance(mig("b", 6, "1g.10gb", 0))
        .expect("room again");
    let gi = b.list_instances(&[6]).expect("list").instances[0]
        .mig
        .as_ref()
        .map(|m| m.gpu_instance_id)
        .expect("gi");
    let by_ref = b
        .destroy_instance(DestroyTarget::Mig {
            device_index: 6,
            gpu_instance_id: gi,
        })
        .expect("by GPU instance");
    assert!(by_ref.existed);
    assert!(b.list_instances(&[]).expect("list").instances.is_empty());
}

#[test]
fn instances_survive_a_restart_with_a_state_file() {
    let dir = TempDir::new("restart");
    let options = SimOptions {
        node_name: "node-7".into(),
        state_file: Some(dir.path().join("state.json")),
        ..SimOptions::default()
    };
    let before = {
        let b = SimulatedBackend::from_profile("h800-8", options.clone()).expect("first start");
        b.create_instance(mig("mig-a", 7, "3g.40gb", 4))
            .expect("mig");
        b.create_instance(tdm("tdm-b", 2, 40, 10_240)).expect("tdm");
        b.list_instances(&[]).expect("list").instances
    };
    let b = SimulatedBackend::from_profile("h800-8", options.clone()).expect("restart");
    assert_eq!(b.list_instances(&[]).expect("list").instances, before);
    // The key still names its instance after the restart.
    let retry = b
        .create_instance(mig("mig-a", 7, "3g.40gb", 4))
        .expect("retry");
    assert!(!retry.created);
    // The same state file for another node is an error, not a silent reset.
    let other = SimOptions {
        node_name: "node-8".into(),
        ..options
    };
    let err = SimulatedBackend::from_profile("h800-8", other).expect_err("foreign state");
    assert_eq!(err.reason().as_str(), "StateFile");
    // Without a state file a restart starts empty.
    let fresh = backend("h800-8");
    assert!(
        fresh
            .list_instances(&[])
            .expect("list")
            .instances
            .is_empty()
    );
}

#[test]
fn unkeyed_instances_are_listed_and_adopted_by_key() {
    let dir = TempDir::new("adopt");
    let options = SimOptions {
        state_file: Some(dir.path().join("state.json")),
        ..SimOptions::default()
    };
    let profile = SimProfile::from_yaml(A30).expect("A30");
    let b = SimulatedBackend::new(profile.clone(), options.clone()).expect("backend");
    let listed = b.list_instances(&[]).expect("list").instances;
    assert_eq!(listed.len(), 2);
    assert!(listed.iter().all(|i| i.key.is_empty()));
    let adopted = b
        .create_instance(mig("owner", 0, "1g.6gb", 1))
        .expect("adopt");
    assert!(adopted.adopted && !adopted.created);
    let instance = adopted.instance.expect("instance");
    assert_eq!(instance.key, "owner");
    assert_eq!(instance.mig, listed[1].mig, "the same hardware instance");
    let again = b
        .create_instance(mig("owner", 0, "1g.6gb", 1))
        .expect("retry");
    assert!(!again.adopted && !again.created);
    // The adoption is remembered across a restart; the other instance stays unkeyed.
    drop(b);
    let b = SimulatedBackend::new(profile, options).expect("restart");
    let keys: Vec<String> = b
        .list_instances(&[])
        .expect("list")
        .instances
        .into_iter()
        .map(|i| i.key)
        .collect();
    assert_eq!(keys, ["", "owner"]);
}

// --- faults and health ---------------------------------------------------------------------

#[test]
fn xid_and_ecc_faults_raise_and_clear_with_events() {
    let b = backend("h800-8");
    let (snapshot, mut events) = b.health().subscribe();
    assert!(snapshot.faults.is_empty());
    inject(&b, 1, pb::FaultKind::Xid, 79);
    let event = events.try_recv().expect("XID event");
    assert!(event.active && !event.device_healthy);
    assert_eq!(event.device_index, 1);
    let fault = event.fault.expect("fault");
    assert_eq!(fault.kind(), pb::FaultKind::Xid);
    assert_eq!(fault.xid, 79);
    assert_eq!(fault.health_watch, "ALL");
    let card = &b.list_devices(&[1]).expect("list").devices[0];
    assert!(!card.healthy);
    assert_eq!(card.faults.len(), 1);
    let metrics = b.device_metrics(&[1], false).expect("metrics").devices;
    assert_eq!(metrics[0].xid_last, Some(79));

    inject(&b, 1, pb::FaultKind::EccDbe, 0);
    inject(&b, 1, pb::FaultKind::EccDbe, 0);
    let m = &b.device_metrics(&[1], false).expect("metrics").devices[0];
    assert_eq!(
        (m.ecc_dbe_volatile, m.ecc_dbe_aggregate),
        (Some(2), Some(2))
    );
    assert_eq!(b.list().len(), 2, "XID and ECC are in force");

    assert_eq!(
        b.clear(1, Some(pb::FaultKind::Xid), Some(79))
            .expect("clear"),
        1
    );
    let cleared = events.try_recv().expect("ECC raise");
    assert_eq!(cleared.fault.map(|f| f.kind()), Some(pb::FaultKind::EccDbe));
    let cleared = events.try_recv().expect("XID clear");
    assert!(
        !cleared.active && !cleared.device_healthy,
        "ECC still active"
    );
    assert_eq!(b.clear(1, None, None).expect("clear all"), 1);
    let last = events.try_recv().expect("ECC clear");
    assert!(!last.active && last.device_healthy);
    let m = &b.device_metrics(&[1], false).expect("metrics").devices[0];
    assert_eq!(
        (m.ecc_dbe_volatile, m.ecc_dbe_aggregate),
        (Some(0), Some(2))
    );
    assert!(b.list_devices(&[1]).expect("list").devices[0].healthy);
    assert!(b.list().is_empty());
}

#[test]
fn application_xids_warn_without_taking_the_card_out() {
    let b = backend("a100-40gb-8");
    let fault = inject(&b, 0, pb::FaultKind::Xid, 13).fault.expect("fault");
    assert_eq!(fault.severity(), pb::Severity::Warning);
    assert!(b.list_devices(&[0]).expect("list").devices[0].healthy);
    let err = b
        .inject(&pb::InjectFaultRequest {
            device_index: 0,
            kind: pb::FaultKind::Xid.into(),
            ..Default::default()
        })
        .expect_err("an XID needs a code");
    assert_eq!(err.reason().as_str(), "InvalidArgument");
    let err = b
        .inject(&pb::InjectFaultRequest {
            device_index: 0,
            kind: pb::FaultKind::RowRemapFailure.into(),
            ..Default::default()
        })
        .expect_err("not injectable");
    assert!(err.to_string().contains("cannot be injected"), "{err}");
}

#[test]
fn a_lost_card_is_listed_as_lost_and_refuses_work_until_cleared() {
    let b = backend("h800-8");
    b.create_instance(mig("m", 7, "1g.10gb", 0))
        .expect("before");
    inject(&b, 7, pb::FaultKind::GpuLost, 0);
    let listing = b.list_devices(&[]).expect("list");
    let lost = &listing.devices[7];
    assert_eq!(lost.state(), pb::DeviceState::Lost);
    assert!(!lost.healthy);
    assert!(
        lost.model.is_empty(),
        "a lost card answers nothing but its identity"
    );
    assert_eq!(listing.paths.len(), 21, "no paths to a lost card");
    let err = b
        .create_instance(mig("n", 7, "1g.10gb", 1))
        .expect_err("lost");
    assert_eq!(err.reason().as_str(), "DeviceLost");
    assert_eq!(err.code(), tonic::Code::Unavailable);
    let err = b
        .destroy_instance(DestroyTarget::Key("m".into()))
        .expect_err("lost");
    assert_eq!(err.reason().as_str(), "DeviceLost");
    let metrics = b.device_metrics(&[], false).expect("metrics");
    assert_eq!(metrics.devices.len(), 7);
    assert_eq!(metrics.errors.len(), 1);
    assert_eq!(metrics.errors[0].reason, "DeviceLost");
    b.clear(7, Some(pb::FaultKind::GpuLost), None)
        .expect("clear");
    assert_eq!(
        b.list_devices(&[7]).expect("list").devices[0].state(),
        pb::DeviceState::Ok
    );
    assert!(
        b.destroy_instance(DestroyTarget::Key("m".into()))
            .expect("destroy")
            .existed
    );
}

#[test]
fn a_hanging_card_blocks_its_calls_raises_call_hang_and_recovers() {
    let b = Arc::new(
        SimulatedBackend::from_profile(
            "h800-8",
            SimOptions {
                hang_threshold: Duration::from_millis(100),
                ..SimOptions::default()
            },
        )
        .expect("backend"),
    );
    let (_, mut events) = b.health().subscribe();
    inject(&b, 2, pb::FaultKind::CallHang, 0);
    let blocked = {
        let b = b.clone();
        std::thread::spawn(move || b.device_metrics(&[2], false))
    };
    // Other cards answer at once.
    let started = Instant::now();
    b.list_devices(&[0, 1, 3]).expect("other cards");
    assert!(started.elapsed() < Duration::from_secs(1));
    // The watch notices the hang.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !b.health().is_active(2, pb::FaultKind::CallHang, 0) {
        assert!(Instant::now() < deadline, "CALL_HANG was not raised");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!blocked.is_finished(), "the call still blocks");
    let raised = events.try_recv().expect("event");
    assert!(raised.active);
    assert_eq!(
        raised.fault.map(|f| f.kind()),
        Some(pb::FaultKind::CallHang)
    );
    // Faults can be listed and cleared while the card hangs.
    assert_eq!(b.list().len(), 1);
    b.clear(2, Some(pb::FaultKind::CallHang), None)
        .expect("clear");
    let metrics = blocked.join().expect("thread").expect("the call completes");
    assert_eq!(metrics.devices.len(), 1);
    let deadline = Instant::now() + Duration::from_secs(10);
    while b.health().is_active(2, pb::FaultKind::CallHang, 0) {
        assert!(Instant::now() < deadline, "CALL_HANG was not cleared");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_hang_gives_up_at_the_hang_limit() {
    let b = SimulatedBackend::from_profile(
        "ppu-m890p-8",
        SimOptions {
            hang_limit: Duration::from_millis(150),
            ..SimOptions::default()
        },
    )
    .expect("backend");
    inject(&b, 0, pb::FaultKind::CallHang, 0);
    let started = Instant::now();
    let err = b.list_instances(&[0]).expect_err("times out");
    assert_eq!(err.reason().as_str(), "CallHang");
    assert!(started.elapsed() >= Duration::from_millis(150));
    assert!(started.elapsed() < Duration::from_secs(5));
    b.clear(0, None, None).expect("clear");
    assert!(b.list_instances(&[0]).is_ok());
}

#[test]
fn memory_held_by_a_dead_process_shows_in_processes_and_health() {
    let b = backend("h800-8");
    b.create_instance(tdm("share", 3, 30, 8192)).expect("share");
    let fault = b
        .inject(&pb::InjectFaultRequest {
            device_index: 3,
            kind: pb::FaultKind::DeadProcessMemory.into(),
            memory_mib: 2048,
            pid: 4242,
            ..Default::default()
        })
        .expect("inject")
        .fault
        .expect("fault");
    assert_eq!(
        fault.reason,
        "2048 MiB held by process 4242, which no longer exists"
    );
    let m = &b.device_metrics(&[3], true).expect("metrics").devices[0];
    let dead = m
        .processes
        .iter()
        .find(|p| p.pid == 4242)
        .expect("dead process listed");
    assert_eq!(
        (dead.alive, dead.used_memory_mib),
        (Some(false), Some(2048))
    );
    let live = m
        .processes
        .iter()
        .find(|p| p.alive == Some(true))
        .expect("workload");
    assert_eq!(live.instance_key, "share");
    let live_mib = live.used_memory_mib.expect("memory");
    assert!(live_mib <= 8192);
    assert_eq!(m.fb_used_mib, Some(live_mib + 2048));
    assert!(!b.list_devices(&[3]).expect("list").devices[0].healthy);
    b.clear(3, Some(pb::FaultKind::DeadProcessMemory), None)
        .expect("clear");
    let m = &b.device_metrics(&[3], true).expect("metrics").devices[0];
    assert!(m.processes.iter().all(|p| p.alive == Some(true)));
    assert!(b.list_devices(&[3]).expect("list").devices[0].healthy);
}

// --- metrics -------------------------------------------------------------------------------

fn manual(profile: &str, node: &str, clock: &Clock) -> SimulatedBackend {
    SimulatedBackend::from_profile(
        profile,
        SimOptions {
            node_name: node.into(),
            seed: 7,
            clock: clock.clone(),
            ..SimOptions::default()
        },
    )
    .expect("backend")
}

#[test]
fn metrics_vary_over_time_and_stay_in_range() {
    let clock = Clock::manual(1_700_000_000_000);
    let b = manual("h800-8", "n1", &clock);
    b.create_instance(tdm("a", 0, 60, 20_480)).expect("a");
    b.create_instance(tdm("b", 0, 30, 0)).expect("b");
    b.create_instance(mig("c", 6, "3g.40gb", 0)).expect("c");
    let mut utils = Vec::new();
    let mut last_energy = 0;
    let mut last_link = 0;
    for _ in 0..60 {
        clock.advance_ms(15_000);
        for m in b.device_metrics(&[], true).expect("metrics").devices {
            let util = m.gpu_util_percent.expect("util");
            assert!(util <= 100);
            let temp = m.gpu_temp_c.expect("temp");
            assert!((25..=90).contains(&temp), "{temp}");
            let power = m.power_usage_w.expect("power");
            assert!((60.0..=710.0).contains(&power), "{power}");
            let total = 81_559;
            assert_eq!(
                m.fb_used_mib.expect("used")
                    + m.fb_free_mib.expect("free")
                    + m.fb_reserved_mib.expect("reserved"),
                total
            );
            for ratio in [
                m.gr_engine_active,
                m.sm_active,
                m.pipe_tensor_active,
                m.dram_active,
            ] {
                let r = ratio.expect("Hopper has DCP ratios");
                assert!((0.0..=1.0).contains(&r));
            }
            if m.device_index == 0 {
                utils.push(util);
                let energy = m.total_energy_mj.expect("energy");
                assert!(energy > last_energy, "energy grows");
                last_energy = energy;
                let link = m.nvlink_tx_bytes.expect("NVLink");
                assert!(link >= last_link);
                last_link = link;
                assert_eq!(m.processes.len(), 2);
            }
            if m.device_index == 5 {
                assert!(util <= 5, "an idle card is nearly idle: {util}");
                assert!(m.processes.is_empty());
            }
        }
    }
    // Two shares at most 90% of the card, so the card is busy but varies.
    let (min, max) = (utils.iter().min().copied(), utils.iter().max().copied());
    assert!(min.zip(max).is_some_and(|(a, b)| b > a), "{utils:?}");
    assert!(utils.iter().all(|u| (10..=92).contains(u)), "{utils:?}");
}

#[test]
fn metrics_are_deterministic_for_seed_node_and_time() {
    let clock = Clock::manual(1_700_000_000_000);
    let read = |node: &str| {
        let b = manual("mi300x-8", node, &clock);
        b.device_metrics(&[0, 1], true).expect("metrics").devices
    };
    assert_eq!(read("n1"), read("n1"));
    assert_ne!(read("n1"), read("n2"));
    let amd = &read("n1")[0];
    assert_eq!(amd.gr_engine_active, None, "no GPM on AMD");
    assert_eq!(amd.remapped_rows_correctable, None);
    assert!(amd.nvlink_tx_bytes.is_some(), "xGMI traffic is counted");
}

#[test]
fn instance_metrics_respect_caps_and_report_mig_memory() {
    let clock = Clock::manual(1_700_000_000_000);
    let b = manual("a100-40gb-8", "n1", &clock);
    b.create_instance(tdm("small", 0, 20, 4096)).expect("tdm");
    b.create_instance(mig("slice", 4, "2g.10gb", 2))
        .expect("mig");
    for _ in 0..20 {
        clock.advance_ms(30_000);
        let all = b.instance_metrics(&[]).expect("metrics").instances;
        assert_eq!(all.len(), 2);
        let small = all.iter().find(|m| m.key == "small").expect("small");
        assert_eq!(small.kind(), pb::InstanceKind::Tdm);
        assert!(small.sm_util_percent.expect("util") <= 20);
        assert!(small.memory_used_mib.expect("memory") <= 4096);
        assert_eq!(
            (small.memory_limit_mib, small.core_limit_percent),
            (4096, 20)
        );
        let slice = all.iter().find(|m| m.key == "slice").expect("slice");
        assert_eq!(slice.kind(), pb::InstanceKind::Mig);
        assert_eq!(slice.profile, "2g.10gb");
        assert!(slice.memory_limit_mib > 9 * 1024 && slice.memory_limit_mib <= 10 * 1024);
        assert!(slice.memory_used_mib.expect("memory") <= slice.memory_limit_mib);
        assert_eq!(slice.processes[0].gpu_instance_id, slice.gpu_instance_id);
    }
    let only = b
        .instance_metrics(&["slice".into()])
        .expect("one")
        .instances;
    assert_eq!(only.len(), 1);
}

// --- process loads ---------------------------------------------------------------------------

#[test]
fn a_process_load_is_listed_on_its_card_until_set_to_zero() {
    let b = backend("h800-8");
    b.set_process_load(2, 4321, 85).expect("set");
    let read = |card: u32| {
        b.device_metrics(&[card], true)
            .expect("metrics")
            .devices
            .remove(0)
    };
    let card = read(2);
    let load = card
        .processes
        .iter()
        .find(|p| p.pid == 4321)
        .expect("listed");
    assert_eq!((load.sm_util_percent, load.alive), (Some(85), Some(true)));
    assert!(
        card.gpu_util_percent >= Some(85),
        "{:?}",
        card.gpu_util_percent
    );
    assert!(
        read(3).processes.iter().all(|p| p.pid != 4321),
        "only on its card"
    );
    b.set_process_load(2, 4321, 0).expect("remove");
    assert!(read(2).processes.iter().all(|p| p.pid != 4321));
    for (device, pid, percent) in [(2, 0, 50), (2, 4321, 101), (8, 4321, 50)] {
        assert!(
            b.set_process_load(device, pid, percent).is_err(),
            "card {device}, PID {pid}, {percent} %"
        );
    }
}
