//! The user guides' YAML (`docs/user-guide.md` and its Chinese twin `docs/user-guide.zh.md`): the
//! two hold the same objects block by block (only comments and prose differ), every block is a
//! Kubernetes object or a Prometheus configuration, and every pod in them, a JobSet's template
//! too, is read by the resource contract without a finding. The e2e suite creates the same
//! objects with a server-side dry run.

#![allow(clippy::panic)] // failing loudly is the tests' job

use k8s_openapi::api::core::v1::Pod;
use runtimekit_contract::config::JOBSET_NAME_LABEL;
use runtimekit_contract::{RuntimeKitConfig, parse_pod};
use serde_yaml::Value;

/// The fenced `yaml` blocks of a guide, parsed.
fn blocks(file: &str) -> Vec<Value> {
    let path = format!("{}/../docs/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    text.split("```yaml\n")
        .skip(1)
        .map(|rest| {
            let block = rest.split("```").next().unwrap_or_default();
            serde_yaml::from_str(block).unwrap_or_else(|e| panic!("{file}: {e}:\n{block}"))
        })
        .collect()
}

/// The pods an object holds: itself, or a JobSet's pod templates as its pods have them.
fn pods(object: &Value) -> Vec<Pod> {
    let as_pod = |value: Value| -> Pod {
        serde_yaml::from_value(value).unwrap_or_else(|e| panic!("{e}: {object:?}"))
    };
    match object["kind"].as_str() {
        Some("Pod") => vec![as_pod(object.clone())],
        // With the label the JobSet controller gives its pods.
        Some("JobSet") => object["spec"]["replicatedJobs"]
            .as_sequence()
            .into_iter()
            .flatten()
            .map(|job| {
                let mut template = job["template"]["spec"]["template"].clone();
                template["metadata"]["labels"][JOBSET_NAME_LABEL] =
                    object["metadata"]["name"].clone();
                as_pod(template)
            })
            .collect(),
        _ => Vec::new(),
    }
}

#[test]
fn both_guides_hold_the_same_objects() {
    let english = blocks("user-guide.md");
    assert!(english.len() >= 10, "{} blocks", english.len());
    assert_eq!(english, blocks("user-guide.zh.md"));
}

#[test]
fn every_block_is_an_object_or_a_prometheus_configuration() {
    for block in blocks("user-guide.md") {
        let object = block["apiVersion"].is_string() && block["kind"].is_string();
        assert!(object || block["scrape_configs"].is_sequence(), "{block:?}");
    }
}

#[test]
fn every_pod_in_the_guides_meets_the_contract() {
    let config = RuntimeKitConfig::default();
    let mut read = 0;
    for object in blocks("user-guide.md") {
        for pod in pods(&object) {
            match parse_pod(&pod, &config) {
                Ok(request) => {
                    assert!(request.ours, "{pod:?}");
                    assert!(request.warnings.is_empty(), "{:?}", request.warnings);
                    read += 1;
                }
                Err(error) => panic!("{error}: {pod:?}"),
            }
        }
    }
    assert!(read >= 9, "{read} pods read");
}
