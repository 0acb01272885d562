//! Every YAML example of the usage guide (sections 2 to 4), parsed verbatim into the request it
//! describes.

#![allow(clippy::panic)] // helpers fail the calling test by panicking

use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use runtimekit_contract::config::JOBSET_NAME_LABEL;
use runtimekit_contract::{
    CardRequest, ContainerRequest, GangMembership, PodRequest, RuntimeKitConfig, WholeCardName,
    parse_pod,
};
use serde_yaml::Value;

/// Reads a seed example as a Pod; the guide's fragments (a bare `spec:`) are completed with the
/// Pod's apiVersion and kind, their text otherwise untouched.
fn seed_pod(file: &str) -> Pod {
    let text =
        std::fs::read_to_string(format!("{}/tests/seeds/{file}", env!("CARGO_MANIFEST_DIR")))
            .expect("seed file");
    let mut value: Value = serde_yaml::from_str(&text).expect("seed is YAML");
    if value.get("kind").is_none() {
        value["apiVersion"] = "v1".into();
        value["kind"] = "Pod".into();
    }
    serde_yaml::from_value(value).expect("seed is a Pod")
}

fn parse(file: &str) -> PodRequest {
    parse_pod(&seed_pod(file), &RuntimeKitConfig::default())
        .unwrap_or_else(|e| panic!("{file}: {e}"))
}

fn one(container: &str, cards: CardRequest, rdma: bool) -> Vec<ContainerRequest> {
    vec![ContainerRequest {
        container: container.into(),
        cards,
        rdma,
    }]
}

#[test]
fn required_settings_alone_ask_for_nothing() {
    let request = parse("2-required-settings.yaml");
    assert!(request.ours);
    assert!(!request.wants_cards());
}

#[test]
fn whole_card() {
    let request = parse("3.1-whole-card.yaml");
    assert!(request.ours);
    assert_eq!(
        request.containers,
        one(
            "app",
            CardRequest::Whole {
                cards: 1,
                name: WholeCardName::Nvidia
            },
            false
        )
    );
    assert!(request.warnings.is_empty());
}

#[test]
fn tdm_half_a_card_and_4_gib() {
    let request = parse("3.2-tdm.yaml");
    assert_eq!(
        request.containers,
        one(
            "app",
            CardRequest::Tdm {
                cards: 1,
                core: Some(50),
                memory_mib: Some(4096)
            },
            false
        )
    );
}

#[test]
fn mig_3_slices_and_4_gib() {
    let request = parse("3.3-mig.yaml");
    assert_eq!(
        request.containers,
        one(
            "app",
            CardRequest::Mig {
                cards: 1,
                slices: 3,
                memory_mib: Some(4096)
            },
            false
        )
    );
}

#[test]
fn two_cards_of_one_configuration() {
    let request = parse("3.4-multi-card.yaml");
    assert_eq!(
        request.containers,
        one(
            "app",
            CardRequest::Tdm {
                cards: 2,
                core: Some(50),
                memory_mib: Some(4096)
            },
            false
        )
    );
}

#[test]
fn ppu_810e_four_whole_cards() {
    let request = parse("4.1-ppu-810e.yaml");
    assert_eq!(
        request.containers,
        one(
            "train",
            CardRequest::Whole {
                cards: 4,
                name: WholeCardName::AnyVendor
            },
            false
        )
    );
}

#[test]
fn ppu_m890p_four_cards_with_rdma() {
    let request = parse("4.1-ppu-m890p-rdma.yaml");
    assert!(request.host_network);
    assert_eq!(
        request.containers,
        one(
            "training",
            CardRequest::Whole {
                cards: 4,
                name: WholeCardName::AnyVendor
            },
            true
        )
    );
    assert!(
        request.warnings.is_empty(),
        "hostNetwork is set, so no RDMA warning"
    );
}

#[test]
fn seven_worker_gang_from_jobset() {
    let text = std::fs::read_to_string(format!(
        "{}/tests/seeds/4.2-gang-jobset.yaml",
        env!("CARGO_MANIFEST_DIR")
    ))
    .expect("seed");
    let jobset: Value = serde_yaml::from_str(&text).expect("YAML");
    let job = &jobset["spec"]["replicatedJobs"][0]["template"]["spec"];
    assert_eq!(job["parallelism"].as_i64(), Some(7));
    let template: PodTemplateSpec =
        serde_yaml::from_value(job["template"].clone()).expect("pod template");

    // The JobSet controller labels every pod with the JobSet's name.
    let mut metadata = template.metadata.unwrap_or_default();
    metadata
        .labels
        .get_or_insert_default()
        .insert(JOBSET_NAME_LABEL.into(), "gang-nccl-test".into());
    let pod = Pod {
        metadata,
        spec: template.spec,
        status: None,
    };

    let request = parse_pod(&pod, &RuntimeKitConfig::default()).expect("valid gang member");
    assert_eq!(
        request.gang,
        Some(GangMembership {
            name: "gang-nccl-test".into(),
            job_set: Some("gang-nccl-test".into()),
            min_member: 7
        })
    );
    assert!(request.host_network);
    assert_eq!(
        request.containers,
        one(
            "trainer",
            CardRequest::Whole {
                cards: 1,
                name: WholeCardName::AnyVendor
            },
            true
        )
    );
}
