//! Property tests: arbitrary quantities, labels and container shapes never panic the parser, and
//! whatever it accepts obeys the contract.

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use proptest::prelude::*;
use runtimekit_contract::quantity::parse_whole;
use runtimekit_contract::{CardRequest, MemoryUnit, RuntimeKitConfig, parse_pod};
use std::collections::BTreeMap;

const RESOURCES: &[&str] = &[
    "aliyun.com/gpu-core",
    "aliyun.com/gpu-memory",
    "aliyun.com/gpu-slice",
    "aliyun.com/gpu",
    "aliyun.com/rdma",
    "nvidia.com/gpu",
    "aliyun.com/gpu-typo",
    "cpu",
    "memory",
];

const LABELS: &[&str] = &[
    "replica",
    "aliyun.com/min-member",
    "aliyun.com/gang-name",
    "jobset.sigs.k8s.io/jobset-name",
    "app",
];

/// Quantity-like text: mostly near-valid numbers with suffixes, sometimes anything at all.
fn quantity() -> impl Strategy<Value = String> {
    prop_oneof![
        (-5i64..200).prop_map(|n| n.to_string()),
        (0u64..u64::MAX).prop_map(|n| n.to_string()),
        (
            "[-+]?[0-9]{0,4}(\\.[0-9]{0,3})?",
            "(|m|k|M|G|Ki|Mi|Gi|Ei|e[-+]?[0-9]{1,3}|E[0-9]{1,2}|x)"
        )
            .prop_map(|(n, s)| format!("{n}{s}")),
        any::<String>(),
    ]
}

fn resource_map() -> impl Strategy<Value = BTreeMap<String, Quantity>> {
    prop::collection::btree_map(
        prop::sample::select(RESOURCES).prop_map(String::from),
        quantity().prop_map(Quantity),
        0..6,
    )
}

fn container() -> impl Strategy<Value = Container> {
    (
        "[a-z]{1,6}",
        prop::option::of(resource_map()),
        prop::option::of(resource_map()),
    )
        .prop_map(|(name, limits, requests)| Container {
            name,
            resources: Some(ResourceRequirements {
                limits,
                requests,
                ..Default::default()
            }),
            ..Default::default()
        })
}

fn pod() -> impl Strategy<Value = Pod> {
    (
        prop::collection::vec(container(), 0..4),
        prop::collection::vec(container(), 0..2),
        prop::collection::btree_map(
            prop::sample::select(LABELS).prop_map(String::from),
            prop_oneof![quantity(), "[a-z0-9-]{0,8}"],
            0..5,
        ),
        prop::option::of(prop::sample::select(
            &["lj-runtimekit-scheduler", "default-scheduler", ""][..],
        )),
        prop::option::of(prop::sample::select(&["lj-runtime", "runc"][..])),
        prop::option::of(any::<bool>()),
    )
        .prop_map(
            |(containers, init, labels, scheduler, runtime, host_network)| Pod {
                metadata: ObjectMeta {
                    labels: Some(labels),
                    ..Default::default()
                },
                spec: Some(PodSpec {
                    containers,
                    init_containers: Some(init),
                    scheduler_name: scheduler.map(String::from),
                    runtime_class_name: runtime.map(String::from),
                    host_network,
                    ..Default::default()
                }),
                status: None,
            },
        )
}

fn config() -> impl Strategy<Value = RuntimeKitConfig> {
    prop::sample::select(&[MemoryUnit::GiB, MemoryUnit::MiB][..]).prop_map(|memory_unit| {
        RuntimeKitConfig {
            memory_unit,
            ..Default::default()
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn quantities_never_panic(text in quantity()) {
        let _ = parse_whole(&text);
    }

    #[test]
    fn accepted_requests_obey_the_contract(pod in pod(), config in config()) {
        let first = parse_pod(&pod, &config);
        // The same input always gives the same answer.
        prop_assert_eq!(&first, &parse_pod(&pod, &config));
        let Ok(request) = first else { return Ok(()) };
        for container in &request.containers {
            let cards = container.cards.cards();
            prop_assert!((1..=64).contains(&cards));
            match container.cards {
                CardRequest::Whole { .. } => {}
                CardRequest::Tdm { core, memory_mib, .. } => {
                    prop_assert!(core.is_none_or(|c| (1..=100).contains(&c)));
                    prop_assert!(core.is_some() || memory_mib.is_some() || request.warnings.iter().any(|w| w.reason() == "GpuCoreZero"));
                    prop_assert!(memory_mib.is_none_or(|m| m > 0 && m % config.memory_unit.mib() == 0 && (config.memory_unit == MemoryUnit::GiB || m % 128 == 0)));
                }
                CardRequest::Mig { slices, memory_mib, .. } => {
                    prop_assert!([1, 2, 3, 4, 7].contains(&slices));
                    prop_assert!(memory_mib.is_none_or(|m| m > 0));
                }
            }
        }
        if request.wants_cards() && request.ours {
            prop_assert_eq!(pod.spec.as_ref().and_then(|s| s.runtime_class_name.as_deref()), Some("lj-runtime"));
        }
    }
}
