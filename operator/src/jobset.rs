//! The part of JobSet (`jobset.x-k8s.io/v1alpha2`) the gang controller reads: each replicated
//! job's name and parallelism, to check `aliyun.com/min-member` against it.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The fields of a JobSet's spec this project reads; everything else is ignored.
#[derive(CustomResource, Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "jobset.x-k8s.io",
    version = "v1alpha2",
    kind = "JobSet",
    namespaced,
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct JobSetSpec {
    /// The replicated jobs.
    #[serde(default)]
    pub replicated_jobs: Vec<ReplicatedJob>,
}

/// One replicated job of a JobSet.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ReplicatedJob {
    /// Its name (the pods' `jobset.sigs.k8s.io/replicatedjob-name` label).
    pub name: String,
    /// How many copies of the job run.
    #[serde(default = "one")]
    pub replicas: i32,
    /// The job template.
    #[serde(default)]
    pub template: JobTemplate,
}

/// A job template, reduced to its spec.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
pub struct JobTemplate {
    /// The job's spec.
    #[serde(default)]
    pub spec: JobSpec,
}

/// A job spec, reduced to its parallelism and its pods' labels.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
pub struct JobSpec {
    /// How many pods run at once (Kubernetes defaults it to 1).
    #[serde(default)]
    pub parallelism: Option<i32>,
    /// The pod template, reduced to its labels.
    #[serde(default)]
    pub template: PodTemplate,
}

/// A pod template, reduced to its labels.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
pub struct PodTemplate {
    /// The template's metadata.
    #[serde(default)]
    pub metadata: TemplateMetadata,
}

/// Pod template metadata, reduced to its labels.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
pub struct TemplateMetadata {
    /// The labels every pod of the job gets.
    #[serde(default)]
    pub labels: std::collections::BTreeMap<String, String>,
}

fn one() -> i32 {
    1
}

impl JobSet {
    /// How many pods of this JobSet run at once carrying `label` (the gang members): the
    /// parallelism times the replicas of every replicated job whose pods carry it.
    pub fn gang_parallelism(&self, label: &str) -> i32 {
        self.spec
            .replicated_jobs
            .iter()
            .filter(|j| j.template.spec.template.metadata.labels.contains_key(label))
            .map(|j| {
                j.template
                    .spec
                    .parallelism
                    .unwrap_or(1)
                    .saturating_mul(j.replicas)
            })
            .fold(0, i32::saturating_add)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gang_parallelism_counts_labelled_jobs_across_replicas() {
        let jobset: JobSet = serde_json::from_value(serde_json::json!({
            "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "j"},
            "spec": {"replicatedJobs": [
                {"name": "launcher", "template": {"spec": {"parallelism": 1, "template": {"metadata": {"labels": {}}}}}},
                {"name": "worker", "replicas": 2, "template": {"spec": {"parallelism": 7, "template": {"metadata": {"labels": {"aliyun.com/min-member": "14"}}}}}},
            ]}
        }))
        .expect("valid JobSet");
        assert_eq!(jobset.gang_parallelism("aliyun.com/min-member"), 14);
        assert_eq!(jobset.gang_parallelism("other"), 0);
    }
}
