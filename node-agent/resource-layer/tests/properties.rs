//! Property test: any sequence of MIG creates and destroys on a simulated card agrees with the
//! contract's placement rules, and the instances on the card never overlap.

use proptest::prelude::*;
use runtimekit_contract::mig::H800_80GB;
use runtimekit_resource_layer::instances::{CreateRequest, ShareSpec};
use runtimekit_resource_layer::{Backend, DestroyTarget, SimOptions, SimulatedBackend};

#[derive(Debug, Clone)]
enum Op {
    Create { profile: usize, start: u8 },
    Destroy { nth: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..H800_80GB.profiles.len(), 0u8..8).prop_map(|(profile, start)| Op::Create { profile, start }),
        1 => (0usize..8).prop_map(|nth| Op::Destroy { nth }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn creates_and_destroys_follow_the_placement_rules(ops in prop::collection::vec(op(), 1..30)) {
        let backend = SimulatedBackend::from_profile("h800-8", SimOptions::default()).expect("backend");
        let table = &H800_80GB;
        // The model: key -> memory-slice mask.
        let mut live: Vec<(String, u8)> = Vec::new();
        for (n, op) in ops.into_iter().enumerate() {
            match op {
                Op::Create { profile, start } => {
                    let p = &table.profiles[profile];
                    let occupied = live.iter().fold(0u8, |m, (_, x)| m | x);
                    let legal = table.legal_starts(p, occupied).contains(&start);
                    let key = format!("k{n}");
                    let result = backend.create_instance(CreateRequest {
                        key: key.clone(),
                        device_index: 6,
                        device_uuid: None,
                        spec: ShareSpec::Mig { profile: p.name.into(), start },
                    });
                    prop_assert_eq!(result.is_ok(), legal, "{}@{} on {:08b}: {:?}", p.name, start, occupied, result);
                    if legal {
                        live.push((key, p.mask_at(start)));
                    }
                }
                Op::Destroy { nth } => {
                    if live.is_empty() {
                        continue;
                    }
                    let (key, _) = live.remove(nth % live.len());
                    let gone = backend.destroy_instance(DestroyTarget::Key(key)).expect("destroy");
                    prop_assert!(gone.existed);
                }
            }
            // The card holds exactly the model's instances, without overlap.
            let instances = backend.list_instances(&[6]).expect("list").instances;
            prop_assert_eq!(instances.len(), live.len());
            let mut seen = 0u8;
            for instance in &instances {
                let Some(runtimekit_proto::resource::v1alpha1::instance_spec::Kind::Mig(m)) =
                    instance.spec.as_ref().and_then(|s| s.kind.clone())
                else {
                    return Err(TestCaseError::fail("not a MIG instance"));
                };
                let profile = table.profile(&m.profile).expect("known profile");
                let mask = profile.mask_at(u8::try_from(m.placement_start).expect("slice"));
                prop_assert_eq!(seen & mask, 0);
                seen |= mask;
            }
            prop_assert_eq!(seen, live.iter().fold(0u8, |m, (_, x)| m | x));
        }
    }
}
