//! Tests of the parent module.

use super::*;
use crate::fixtures::{four_cards, slice};
use runtimekit_crds::SlicePhase;
use serde_json::json;

const DRIVER: &str = "gpu.runtimekit.aliyun.com";

fn claim(uid: &str, results: serde_json::Value) -> ResourceClaim {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"namespace": "team", "name": format!("claim-{uid}"), "uid": uid},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {"results": results}}},
    }))
    .expect("claim")
}

fn result(request: &str, device: &str) -> serde_json::Value {
    json!({"request": request, "driver": DRIVER, "pool": "n1", "device": device})
}

fn share(core: &str, memory: &str) -> serde_json::Value {
    json!({"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-1-share",
           "shareID": "00000000-0000-0000-0000-000000000001",
           "consumedCapacity": {"core": core, "memory": memory}})
}

fn state() -> NodeState {
    let mut state = four_cards();
    let mig = state
        .inventory
        .as_mut()
        .and_then(|i| i.devices.get_mut(&3))
        .and_then(|d| d.mig.as_mut())
        .expect("mig");
    mig.profiles = vec![
        pb::MigProfileInfo {
            name: "1g.10gb".into(),
            slices: 1,
            memory_slices: 1,
            starts: (0..7).collect(),
            ..Default::default()
        },
        pb::MigProfileInfo {
            name: "3g.40gb".into(),
            slices: 3,
            memory_slices: 4,
            starts: vec![0, 4],
            ..Default::default()
        },
    ];
    state
}

fn other_claim(card: u32, mode: SliceMode, core: Option<u32>) -> PreparedDevice {
    PreparedDevice {
        claim: "team/other".into(),
        claim_uid: "other".into(),
        request: "gpu".into(),
        device: "x".into(),
        card: Some(card),
        mode: Some(mode),
        instance_key: None,
        core,
        memory_mib: core.map(|_| 1024),
        pods: Vec::new(),
    }
}

#[test]
fn a_free_card_a_share_a_placement_and_a_nic_are_planned() {
    let claim = claim(
        "u1",
        json!([result("gpu/first", "gpu-0"), share("50", "4Gi"),
               result("mig", "gpu-3-mig-1g10gb-2"), result("nic", "nic-mlx5-0"),
               {"request": "other", "driver": "other.example.com", "pool": "n1", "device": "dev-0"}]),
    );
    let planned = plan(&claim, "n1", DRIVER, &state()).expect("planned");
    let parts: Vec<(&str, &Part)> = planned
        .iter()
        .map(|p| (p.request.as_str(), &p.part))
        .collect();
    assert_eq!(
        parts,
        [
            (
                "gpu",
                &Part::Whole {
                    card: 0,
                    uuid: "GPU-0".into()
                }
            ),
            (
                "gpu",
                &Part::Share {
                    card: 1,
                    uuid: "GPU-1".into(),
                    core: Some(50),
                    memory_mib: Some(4096)
                }
            ),
            (
                "mig",
                &Part::Mig {
                    card: 3,
                    uuid: "GPU-3".into(),
                    profile: "1g.10gb".into(),
                    start: 2
                }
            ),
            (
                "nic",
                &Part::Nic {
                    name: "mlx5_0".into()
                }
            ),
        ],
        "another driver's result is not this node's to prepare"
    );
    let record = prepared("team/claim-u1", "u1", &planned[1], &[]);
    assert_eq!(
        record.instance_key.as_deref(),
        Some("dra:u1:gpu:gpu-1-share")
    );
    assert!(is_claim_key(
        record.instance_key.as_deref().unwrap_or_default()
    ));
    assert_eq!(
        prepared("team/claim-u1", "u1", &planned[0], &[]).instance_key,
        None
    );
    let (key, spec) = instance("u1", &planned[2]).expect("a MIG placement is made");
    assert_eq!(key, "dra:u1:mig:gpu-3-mig-1g10gb-2");
    assert_eq!(spec.device_index, 3);
    assert!(instance("u1", &planned[0]).is_none() && instance("u1", &planned[3]).is_none());
    let grants = grants("u1", &planned);
    let requests: Vec<&str> = grants.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(requests, ["gpu", "mig", "nic"]);
    let gpu = &grants[0].1;
    assert_eq!(
        gpu.cards.iter().map(|c| c.mode).collect::<Vec<_>>(),
        [Mode::Whole, Mode::Tdm]
    );
    assert_eq!(
        (gpu.cards[1].core, gpu.cards[1].memory_mib),
        (Some(50), Some(4096))
    );
    assert_eq!(
        grants[1].1.instance_keys(),
        ["dra:u1:mig:gpu-3-mig-1g10gb-2"]
    );
    assert_eq!(grants[2].1.nics, ["mlx5_0"]);
    let mut monitoring = planned[1].clone();
    monitoring.admin = true;
    assert!(
        instance("u1", &monitoring).is_none(),
        "nothing is made for admin access"
    );
    assert_eq!(grants_of(&monitoring)[0].mode, Mode::Whole);
}

fn grants_of(planned: &Planned) -> Vec<GrantedCard> {
    grants("u", std::slice::from_ref(planned))
        .into_iter()
        .flat_map(|(_, g)| g.cards)
        .collect()
}

#[test]
fn a_card_held_elsewhere_is_never_given_a_second_tenant() {
    let mut state = state();
    state.slices = vec![slice("t", 1, SliceMode::Tdm, SlicePhase::Ready)];
    state.prepared = vec![other_claim(0, SliceMode::Whole, None)];
    let error = plan(
        &claim("u1", json!([result("gpu", "gpu-0")])),
        "n1",
        DRIVER,
        &state,
    )
    .expect_err("held");
    assert_eq!(
        error,
        "device gpu-0 (card 0): the card is already held by ResourceClaim team/other"
    );
    let error = plan(
        &claim("u1", json!([result("gpu", "gpu-1")])),
        "n1",
        DRIVER,
        &state,
    )
    .expect_err("sliced");
    assert!(error.contains("GpuSlice ns/t"), "{error}");
    // Two requests of one claim cannot take one card whole twice either.
    let twice = claim("u1", json!([result("a", "gpu-2"), result("b", "gpu-2")]));
    let error = plan(&twice, "n1", DRIVER, &state).expect_err("twice");
    assert!(error.contains("request a of this claim"), "{error}");
    // The claim's own earlier preparation is not another tenant.
    state.prepared = vec![PreparedDevice {
        claim_uid: "u1".into(),
        ..other_claim(0, SliceMode::Whole, None)
    }];
    assert!(
        plan(
            &claim("u1", json!([result("gpu", "gpu-0")])),
            "n1",
            DRIVER,
            &state
        )
        .is_ok()
    );
}

#[test]
fn shares_beyond_a_cards_capacity_are_refused() {
    let mut state = state();
    state.slices = vec![slice("t", 1, SliceMode::Tdm, SlicePhase::Ready)];
    state.prepared = vec![other_claim(1, SliceMode::Tdm, Some(30))];
    assert!(
        plan(
            &claim("u1", json!([share("20", "1Gi")])),
            "n1",
            DRIVER,
            &state
        )
        .is_ok()
    );
    let error = plan(
        &claim("u1", json!([share("21", "1Gi")])),
        "n1",
        DRIVER,
        &state,
    )
    .expect_err("over");
    assert_eq!(
        error,
        "device gpu-1-share (card 1): 21% core asked, but the card's shares already hold 80% of 100%"
    );
    let error = plan(
        &claim("u1", json!([share("0", "80Gi")])),
        "n1",
        DRIVER,
        &state,
    )
    .expect_err("memory");
    assert!(
        error.contains("81920 MiB asked, but the card's shares already hold 5120 of its 81559 MiB"),
        "{error}"
    );
    state.prepared = vec![other_claim(1, SliceMode::Whole, None)];
    let error = plan(
        &claim("u1", json!([share("10", "1Gi")])),
        "n1",
        DRIVER,
        &state,
    )
    .expect_err("whole");
    assert!(
        error.contains("held whole by ResourceClaim team/other"),
        "{error}"
    );
}

#[test]
fn a_placement_overlapping_an_instance_is_refused() {
    // Card 3 holds a 3g.40gb at 4 (slice ns/a) and an unclaimed 1g.10gb at 0.
    let state = state();
    let error = plan(
        &claim("u1", json!([result("mig", "gpu-3-mig-1g10gb-5")])),
        "n1",
        DRIVER,
        &state,
    )
    .expect_err("overlap");
    assert_eq!(
        error,
        "device gpu-3-mig-1g10gb-5 (card 3): 1g.10gb at 5 overlaps the card's instances 3g.40gb at 4"
    );
    let error = plan(
        &claim("u1", json!([result("mig", "gpu-3-mig-3g40gb-0")])),
        "n1",
        DRIVER,
        &state,
    )
    .expect_err("overlap");
    assert!(error.contains("1g.10gb at 0"), "{error}");
    let error = plan(
        &claim("u1", json!([result("gpu", "gpu-3")])),
        "n1",
        DRIVER,
        &state,
    )
    .expect_err("mig mode");
    assert!(error.contains("in MIG mode"), "{error}");
}

#[test]
fn foreign_unknown_and_unallocated_claims_say_why() {
    let state = state();
    let elsewhere = claim(
        "u1",
        json!([{"request": "gpu", "driver": DRIVER, "pool": "n2", "device": "gpu-0"}]),
    );
    assert_eq!(
        plan(&elsewhere, "n1", DRIVER, &state).expect_err("pool"),
        "ResourceClaim team/claim-u1: device gpu-0 was allocated from pool n2, not from this node n1"
    );
    for device in [
        "gpu-9",
        "gpu-0-mig-1g10gb-0",
        "gpu-3-mig-7g80gb-0",
        "nic-mlx5-9",
        "fpga-0",
    ] {
        let error = plan(
            &claim("u1", json!([result("gpu", device)])),
            "n1",
            DRIVER,
            &state,
        )
        .expect_err(device);
        assert!(
            error.contains("is not a device this node offers"),
            "{device}: {error}"
        );
    }
    let mut pending = claim("u1", json!([]));
    pending.status = None;
    assert_eq!(
        plan(&pending, "n1", DRIVER, &state).expect_err("pending"),
        "ResourceClaim team/claim-u1 is not allocated"
    );
    let admin = claim(
        "u1",
        json!([{"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-3-mig-1g10gb-5", "adminAccess": true}]),
    );
    assert!(
        plan(&admin, "n1", DRIVER, &state).is_ok(),
        "admin access watches, it does not hold"
    );
}
