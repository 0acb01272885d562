//! The usage guide's examples of sections 3 and 4, as the demo applies them: the verbatim copies
//! in `contract/tests/seeds/`, with only the image placeholder replaced by the demo's image; the
//! two examples the guide gives as a bare `spec:` get the Pod header a user would write around
//! them. The two PPU examples of section 4.1 get the vendor nodeSelector the guide (section 2)
//! advises, since `aliyun.com/gpu` names any vendor's cards. No I/O beyond reading the files.

use super::fleet::{MODEL_LABEL, VENDOR_LABEL};
use anyhow::{Context, Result, bail};
use std::collections::BTreeMap;
use std::path::Path;

/// The image the demo's pods run (e2e/scripts/build-images.sh demo-app).
pub const DEMO_IMAGE: &str = "docker.io/local/demo-app:1";
/// The placeholders the usage guide writes for the user's image.
const PLACEHOLDERS: [&str; 2] = ["<your-image>", "<your-training-image>"];
/// The examples written for one card model, and that model's label value (see
/// [`super::fleet::accelerator_labels`]).
const FOR_MODEL: [(&str, &str); 2] = [
    ("4.1-ppu-810e.yaml", "ppu-810e"),
    ("4.1-ppu-m890p-rdma.yaml", "ppu-m890p"),
];

/// One example, ready to apply.
#[derive(Debug, Clone, PartialEq)]
pub struct Example {
    /// Its file under `contract/tests/seeds/`.
    pub file: String,
    /// The object's kind (`Pod` or `JobSet`).
    pub kind: String,
    /// The object's name.
    pub name: String,
    /// The YAML to apply.
    pub yaml: String,
    /// The object, parsed.
    pub object: serde_json::Value,
    /// The nodeSelector the demo added (empty: the example as the guide gives it).
    pub node_selector: BTreeMap<String, String>,
}

impl Example {
    /// Whether any container asks for a time-division share (`resource`, the gpu-core name).
    pub fn asks_for(&self, resource: &str) -> bool {
        let spec = if self.kind == "JobSet" {
            &self.object["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        } else {
            &self.object["spec"]
        };
        spec["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["resources"]["limits"].get(resource).is_some())
    }
}

/// The examples of sections 3 and 4 in `seeds` (files named `3.*` and `4.*`), in file order.
pub fn read(seeds: &Path) -> Result<Vec<Example>> {
    let mut files: Vec<String> = std::fs::read_dir(seeds)
        .with_context(|| format!("reading {}", seeds.display()))?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| (n.starts_with("3.") || n.starts_with("4.")) && n.ends_with(".yaml"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|file| {
            let text = std::fs::read_to_string(seeds.join(&file))?;
            example(&file, &text).with_context(|| format!("example {file}"))
        })
        .collect()
}

/// One example from its file name and text.
pub fn example(file: &str, text: &str) -> Result<Example> {
    let mut yaml = PLACEHOLDERS
        .iter()
        .fold(text.to_owned(), |t, p| t.replace(p, DEMO_IMAGE));
    let mut object: serde_json::Value = serde_yaml::from_str(&yaml)?;
    if object.get("kind").is_none() {
        // A bare `spec:`: the Pod a user would write around it, named after the file.
        let name = format!(
            "{}-demo",
            file.trim_end_matches(".yaml")
                .trim_start_matches(|c: char| c.is_ascii_digit() || c == '.' || c == '-')
        );
        yaml = format!("apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n{yaml}");
        object = serde_yaml::from_str(&yaml)?;
    }
    let mut node_selector = BTreeMap::new();
    if let Some((_, model)) = FOR_MODEL.iter().find(|(f, _)| *f == file) {
        node_selector.insert(VENDOR_LABEL.to_owned(), "ppu".to_owned());
        node_selector.insert(MODEL_LABEL.to_owned(), (*model).to_owned());
        object["spec"]["nodeSelector"] = serde_json::to_value(&node_selector)?;
        yaml = serde_yaml::to_string(&object)?;
    }
    let kind = object["kind"].as_str().unwrap_or_default().to_owned();
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    if kind.is_empty() || name.is_empty() {
        bail!("{file} has no kind or name");
    }
    Ok(Example {
        file: file.to_owned(),
        kind,
        name,
        yaml,
        object,
        node_selector,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seeds() -> Vec<Example> {
        read(&crate::tools::repo_root().join("contract/tests/seeds")).unwrap()
    }

    #[test]
    fn every_example_of_sections_3_and_4_is_applied_as_written_but_its_image_and_the_ppu_selector()
    {
        let examples = seeds();
        let names: Vec<(&str, &str)> = examples
            .iter()
            .map(|e| (e.kind.as_str(), e.name.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("Pod", "whole-card-demo"),
                ("Pod", "tdm-demo"),
                ("Pod", "mig-demo"),
                ("Pod", "multi-gpu-demo"),
                ("Pod", "ppu-810e-demo"),
                ("Pod", "ppu-m890p-rdma-demo"),
                ("JobSet", "gang-nccl-test"),
            ]
        );
        let dir = crate::tools::repo_root().join("contract/tests/seeds");
        for example in &examples {
            let original = std::fs::read_to_string(dir.join(&example.file)).unwrap();
            let original: serde_json::Value = serde_yaml::from_str(&original).unwrap();
            let mut applied = example.object.clone();
            // Take away the vendor selector the PPU examples were given.
            let selected = applied["spec"]
                .as_object_mut()
                .and_then(|spec| spec.remove("nodeSelector"));
            assert_eq!(
                selected.is_some(),
                example.file.starts_with("4.1-"),
                "{}",
                example.file
            );
            // Put back the placeholder and drop the header the bare specs were given.
            let text = serde_json::to_string(&applied)
                .unwrap()
                .replace(DEMO_IMAGE, "<your-image>");
            applied = serde_json::from_str(&text).unwrap();
            let original = serde_json::from_str::<serde_json::Value>(
                &serde_json::to_string(&original)
                    .unwrap()
                    .replace("<your-training-image>", "<your-image>"),
            )
            .unwrap();
            if original.get("kind").is_none() {
                assert_eq!(applied["spec"], original["spec"], "{}", example.file);
            } else {
                assert_eq!(applied, original, "{}", example.file);
            }
            assert!(!example.yaml.contains("<your"), "{}", example.file);
        }
    }

    #[test]
    fn the_ppu_examples_select_their_model_s_nodes() {
        let examples = seeds();
        let selector = |name: &str| {
            let example = examples.iter().find(|e| e.name == name).unwrap();
            let parsed: serde_json::Value = serde_yaml::from_str(&example.yaml).unwrap();
            assert_eq!(parsed, example.object, "the YAML applied is the object");
            example.node_selector.clone()
        };
        let ppu = |model: &str| {
            BTreeMap::from([
                (VENDOR_LABEL.to_owned(), "ppu".to_owned()),
                (MODEL_LABEL.to_owned(), model.to_owned()),
            ])
        };
        assert_eq!(selector("ppu-810e-demo"), ppu("ppu-810e"));
        assert_eq!(selector("ppu-m890p-rdma-demo"), ppu("ppu-m890p"));
        assert!(selector("whole-card-demo").is_empty());
        // The selected labels are those the demo's nodes of that model carry.
        for model in ["ppu-810e", "ppu-m890p"] {
            let labels = super::super::fleet::accelerator_labels(&format!("{model}-8"));
            assert_eq!(labels, ppu(model));
        }
    }

    #[test]
    fn time_division_examples_are_told_apart() {
        let tdm: Vec<String> = seeds()
            .into_iter()
            .filter(|e| e.asks_for("aliyun.com/gpu-core"))
            .map(|e| e.name)
            .collect();
        assert_eq!(tdm, ["tdm-demo", "multi-gpu-demo"]);
        assert!(
            seeds()
                .iter()
                .any(|e| e.kind == "JobSet" && e.asks_for("aliyun.com/rdma"))
        );
    }

    #[test]
    fn an_example_without_kind_or_name_is_refused() {
        let error = example("3.9-x.yaml", "apiVersion: v1\nkind: Pod\nspec: {}\n").unwrap_err();
        assert!(error.to_string().contains("no kind or name"), "{error}");
    }
}
