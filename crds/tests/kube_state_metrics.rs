//! `config/kube-state-metrics/custom-resource-state.yaml` reads only fields the CRDs have: every
//! path it names (labels, gauges, infos) resolves in the schema of the resource it is about.

use serde_json::Value;

/// The schema of `kind`'s first version, as the committed CRD has it.
fn schema(kind: &str) -> Value {
    let crd = runtimekit_crds::all()
        .into_iter()
        .find(|c| c.spec.names.kind == kind)
        .expect("a CRD of each kind the configuration names");
    let version = &crd.spec.versions[0];
    let schema = version
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .expect("a schema");
    serde_json::to_value(schema).expect("schema as JSON")
}

/// Whether `path` resolves in `schema` (`metadata` fields are the API's own).
fn resolves(schema: &Value, path: &[String]) -> bool {
    if path.first().map(String::as_str) == Some("metadata") {
        return matches!(
            path.get(1).map(String::as_str),
            Some("name" | "namespace" | "labels" | "annotations" | "uid")
        );
    }
    let mut at = schema;
    for step in path {
        match at["properties"].get(step) {
            Some(next) => at = next,
            None => return false,
        }
    }
    true
}

/// Every path list under `value`: lists of strings that are values of `labelsFromPath` entries
/// or of a `path` key.
fn paths(value: &Value, out: &mut Vec<Vec<String>>) {
    match value {
        Value::Object(map) => {
            for (key, v) in map {
                if key == "path" {
                    out.push(strings(v));
                } else if key == "labelsFromPath" {
                    for p in v.as_object().into_iter().flat_map(|m| m.values()) {
                        out.push(strings(p));
                    }
                } else {
                    paths(v, out);
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|i| paths(i, out)),
        _ => {}
    }
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_owned))
        .collect()
}

#[test]
fn every_path_resolves_in_its_crd() {
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../config/kube-state-metrics/custom-resource-state.yaml");
    let text = std::fs::read_to_string(&file).expect("the configuration");
    let config: Value = serde_yaml::from_str(&text).expect("YAML");
    assert_eq!(config["kind"], "CustomResourceStateMetrics");
    let resources = config["spec"]["resources"].as_array().expect("resources");
    let mut kinds = Vec::new();
    for resource in resources {
        let gvk = &resource["groupVersionKind"];
        assert_eq!(gvk["group"], "runtimekit.aliyun.com");
        assert_eq!(gvk["version"], "v1alpha1");
        let kind = gvk["kind"].as_str().expect("kind");
        kinds.push(kind.to_owned());
        let schema = schema(kind);
        let mut found = Vec::new();
        paths(resource, &mut found);
        assert!(!found.is_empty(), "{kind} names no path");
        for path in found {
            assert!(
                resolves(&schema, &path),
                "{kind}: {path:?} is not in its CRD's schema"
            );
        }
    }
    kinds.sort();
    assert_eq!(kinds, ["GangGroup", "GpuSlice", "TopologyGroup"]);
}

#[test]
fn a_wrong_path_is_caught() {
    let schema = schema("GpuSlice");
    assert!(resolves(&schema, &["spec".into(), "nodeName".into()]));
    assert!(!resolves(&schema, &["spec".into(), "noSuchField".into()]));
    assert!(!resolves(&schema, &["metadata".into(), "nonsense".into()]));
}
