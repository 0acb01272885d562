//! `check`: reads manifests and reports what each pod asks for, or which rules it breaks.

use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use runtimekit_contract::config::JOBSET_NAME_LABEL;
use runtimekit_contract::{ContractError, RuntimeKitConfig, check_gang_size, parse_pod};
use serde::Deserialize;
use serde_yaml::Value;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Checks every manifest under `paths` and prints one block per pod or pod template.
pub fn run(paths: &[PathBuf], config: Option<&Path>) -> ExitCode {
    let config = match load_config(config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let mut broken = 0;
    for file in expand(paths) {
        let text = match std::fs::read_to_string(&file) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("error: cannot read {}: {e}", file.display());
                broken += 1;
                continue;
            }
        };
        for document in serde_yaml::Deserializer::from_str(&text) {
            match Value::deserialize(document) {
                Ok(Value::Null) => {}
                Ok(value) => broken += check_document(&file, &value, &config),
                Err(e) => {
                    println!("{}: not YAML: {e}", file.display());
                    broken += 1;
                }
            }
        }
    }
    if broken == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn load_config(path: Option<&Path>) -> Result<RuntimeKitConfig, String> {
    let Some(path) = path else {
        return Ok(RuntimeKitConfig::default());
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let config: RuntimeKitConfig =
        serde_yaml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    config
        .validate()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(config)
}

/// Files named on the command line, with directories replaced by their `*.yaml` files.
fn expand(paths: &[PathBuf]) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for path in paths {
        match std::fs::read_dir(path) {
            Ok(entries) => {
                let mut inside: Vec<PathBuf> = entries
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
                    .collect();
                inside.sort();
                files.extend(inside);
            }
            Err(_) => files.push(path.clone()),
        }
    }
    files
}

/// A pod to check and where it came from.
struct Candidate {
    what: String,
    pod: Pod,
    /// The replicated job and its parallelism, for JobSet pods.
    job: Option<(String, i32)>,
}

/// Checks one YAML document; returns how many of its pods break a rule.
fn check_document(file: &Path, doc: &Value, config: &RuntimeKitConfig) -> usize {
    let kind = doc["kind"].as_str().unwrap_or("Pod");
    let name = doc["metadata"]["name"].as_str().unwrap_or("(unnamed)");
    let candidates = match candidates(kind, name, doc) {
        Ok(c) => c,
        Err(e) => {
            println!("{}: {kind} {name}: {e}", file.display());
            return 1;
        }
    };
    let names = config.names();
    let mut broken = 0;
    for candidate in candidates {
        println!("{}: {}", file.display(), candidate.what);
        let result = parse_pod(&candidate.pod, config).and_then(|request| {
            if let (Some(gang), Some((job, parallelism))) = (&request.gang, &candidate.job) {
                check_gang_size(
                    &names,
                    gang,
                    &format!("replicated job {job:?}"),
                    *parallelism,
                )
                .map_err(|violation| ContractError {
                    findings: vec![runtimekit_contract::Finding {
                        container: None,
                        violation,
                    }],
                })?;
            }
            Ok(request)
        });
        match result {
            Ok(request) => {
                if !request.ours && request.wants_cards() {
                    println!(
                        "  left to the default scheduler (schedulerName is not {})",
                        config.scheduler_name
                    );
                }
                if !request.wants_cards() {
                    println!("  asks for no cards");
                }
                for container in &request.containers {
                    let rdma = if container.rdma {
                        ", with the nearest RDMA NICs"
                    } else {
                        ""
                    };
                    println!(
                        "  container {}: {}{rdma}",
                        container.container, container.cards
                    );
                }
                if let Some(gang) = &request.gang {
                    println!(
                        "  gang {}: placed together with {} members in all",
                        gang.name, gang.min_member
                    );
                }
                for warning in &request.warnings {
                    println!("  warning: {warning}");
                }
            }
            Err(error) => {
                broken += 1;
                for finding in &error.findings {
                    println!("  error [{}]: {finding}", finding.violation.reason());
                }
            }
        }
    }
    broken
}

/// The pods a document describes: a Pod (or a bare pod `spec:` fragment), each replicated job
/// of a JobSet, or the pod template of a workload (Deployment, Job, StatefulSet, ...).
fn candidates(kind: &str, name: &str, doc: &Value) -> Result<Vec<Candidate>, String> {
    let pod_from = |value: &Value| -> Result<Pod, String> {
        let mut value = value.clone();
        value["apiVersion"] = "v1".into();
        value["kind"] = "Pod".into();
        serde_yaml::from_value(value).map_err(|e| format!("not a pod: {e}"))
    };
    match kind {
        "Pod" => Ok(vec![Candidate {
            what: format!("Pod {name}"),
            pod: pod_from(doc)?,
            job: None,
        }]),
        "JobSet" => {
            let jobs = doc["spec"]["replicatedJobs"]
                .as_sequence()
                .ok_or("has no spec.replicatedJobs")?;
            jobs.iter()
                .map(|job| {
                    let job_name = job["name"].as_str().unwrap_or("(unnamed)");
                    let spec = &job["template"]["spec"];
                    let mut template: PodTemplateSpec =
                        serde_yaml::from_value(spec["template"].clone())
                            .map_err(|e| format!("replicated job {job_name}: {e}"))?;
                    // The JobSet controller labels every pod with the JobSet's name.
                    let mut metadata = template.metadata.take().unwrap_or_default();
                    metadata
                        .labels
                        .get_or_insert_default()
                        .insert(JOBSET_NAME_LABEL.into(), name.into());
                    let parallelism = spec["parallelism"]
                        .as_i64()
                        .and_then(|p| i32::try_from(p).ok())
                        .unwrap_or(1);
                    Ok(Candidate {
                        what: format!(
                            "JobSet {name}, replicated job {job_name} ({parallelism} in parallel)"
                        ),
                        pod: Pod {
                            metadata,
                            spec: template.spec,
                            status: None,
                        },
                        job: Some((job_name.into(), parallelism)),
                    })
                })
                .collect()
        }
        _ if doc["spec"]["template"].is_mapping() => {
            let template: PodTemplateSpec = serde_yaml::from_value(doc["spec"]["template"].clone())
                .map_err(|e| format!("pod template: {e}"))?;
            let pod = Pod {
                metadata: template.metadata.unwrap_or_default(),
                spec: template.spec,
                status: None,
            };
            Ok(vec![Candidate {
                what: format!("{kind} {name} (pod template)"),
                pod,
                job: None,
            }])
        }
        _ => Err("is not a Pod, a JobSet or a workload with a pod template".into()),
    }
}
