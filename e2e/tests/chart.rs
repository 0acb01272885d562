//! The Helm chart (config/helm/runtimekit) against the kustomize tree it renders: config/'s
//! manifests are the chart rendered with every optional part on (e2e/scripts/render-config.sh),
//! `helm template` with the defaults gives the same objects as `kubectl kustomize config/`, the
//! chart lints clean, and its schema refuses bad values with the value's path. Uses the real
//! `helm` and `kubectl` (built into the tools cache).

use anyhow::{Context, Result, bail, ensure};
use runtimekit_e2e::tools::{Tools, repo_root};
use serde_yaml::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn chart() -> PathBuf {
    repo_root().join("config/helm/runtimekit")
}

fn output(mut command: Command) -> Result<std::process::Output> {
    command
        .output()
        .with_context(|| format!("running {command:?}"))
}

fn helm(args: &[&str]) -> Result<std::process::Output> {
    let mut command = Command::new(Tools::helm()?);
    command.args(args);
    output(command)
}

fn helm_ok(args: &[&str]) -> Result<String> {
    let mut command = Command::new(Tools::helm()?);
    command.args(args);
    runtimekit_e2e::tools::run(command)
}

/// The objects of a multi-document YAML stream, by `kind/name`, without the namespace kustomize
/// sets (helm leaves it to the release).
fn objects(text: &str) -> Result<BTreeMap<String, Value>> {
    let mut objects = BTreeMap::new();
    for document in serde_yaml::Deserializer::from_str(text) {
        let mut value = Value::deserialize(document)?;
        if value.is_null() {
            continue;
        }
        if let Some(metadata) = value.get_mut("metadata").and_then(Value::as_mapping_mut) {
            metadata.remove("namespace");
        }
        let key = format!(
            "{}/{}",
            value["kind"].as_str().unwrap_or_default(),
            value["metadata"]["name"].as_str().unwrap_or_default()
        );
        if objects.insert(key.clone(), value).is_some() {
            bail!("{key} twice");
        }
    }
    Ok(objects)
}

use serde::Deserialize;

/// What kustomize's re-serialisation changes, undone: whole floats are integers (`minimum: 0.0`
/// in a CRD comes out as `0`), and runs of whitespace in strings are one space (a folded CEL
/// expression's more-indented lines come out with an extra line break).
fn normalise(value: &mut Value) {
    match value {
        Value::String(s) => *s = s.split_whitespace().collect::<Vec<_>>().join(" "),
        Value::Number(n) => {
            if let Some(f) = n.as_f64().filter(|f| f.fract() == 0.0 && n.is_f64()) {
                #[allow(clippy::cast_possible_truncation)]
                let whole = f as i64;
                *value = Value::Number(whole.into());
            }
        }
        Value::Sequence(items) => items.iter_mut().for_each(normalise),
        Value::Mapping(map) => map.values_mut().for_each(normalise),
        _ => {}
    }
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

#[test]
fn config_is_the_chart_rendered() -> Result<()> {
    let out = tempdir()?;
    let mut render = Command::new(repo_root().join("e2e/scripts/render-config.sh"));
    render.arg(&out);
    let rendered = output(render)?;
    ensure!(
        rendered.status.success(),
        "render-config.sh: {}",
        String::from_utf8_lossy(&rendered.stderr)
    );
    let files = files_under(&out);
    ensure!(files.len() >= 12, "rendered only {files:?}");
    for file in files {
        let relative = file.strip_prefix(&out)?;
        let committed =
            std::fs::read_to_string(repo_root().join("config").join(relative)).unwrap_or_default();
        ensure!(
            std::fs::read_to_string(&file)? == committed,
            "config/{} is not what the chart renders: run e2e/scripts/render-config.sh",
            relative.display()
        );
    }
    // What goes the other way: the CRDs and kube-state-metrics' configuration, copied in.
    for crd in std::fs::read_dir(repo_root().join("crds"))? {
        let crd = crd?.path();
        if crd.extension().is_some_and(|e| e == "yaml")
            && crd.file_name().is_some_and(|n| n != "kustomization.yaml")
        {
            let name = crd.file_name().context("name")?;
            ensure!(
                std::fs::read(&crd)? == std::fs::read(chart().join("crds").join(name))?,
                "the chart's copy of {} differs: run e2e/scripts/render-config.sh",
                crd.display()
            );
        }
    }
    ensure!(
        std::fs::read(repo_root().join("config/kube-state-metrics/custom-resource-state.yaml"))?
            == std::fs::read(chart().join("files/custom-resource-state.yaml"))?,
        "the chart's kube-state-metrics configuration differs: run e2e/scripts/render-config.sh"
    );
    std::fs::remove_dir_all(&out)?;
    Ok(())
}

fn tempdir() -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!(
        "runtimekit-chart-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

#[test]
fn helm_defaults_are_the_objects_kustomize_gives() -> Result<()> {
    let chart = chart();
    let chart = chart.to_str().context("path")?;
    let mut helm = objects(&helm_ok(&[
        "template",
        "runtimekit",
        chart,
        "--namespace",
        "runtimekit-system",
        "--include-crds",
        // Hooks are Helm's alone: config/ has none.
        "--no-hooks",
    ])?)?;
    let mut kustomize = Command::new(Tools::ensure()?.kubectl());
    kustomize.arg("kustomize").arg(repo_root().join("config"));
    let built = output(kustomize)?;
    ensure!(
        built.status.success(),
        "kubectl kustomize: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let mut kustomize = objects(&String::from_utf8_lossy(&built.stdout))?;
    // helm install --create-namespace makes the namespace.
    kustomize.remove("Namespace/runtimekit-system");
    let names = |m: &BTreeMap<String, Value>| m.keys().cloned().collect::<Vec<_>>();
    ensure!(
        names(&helm) == names(&kustomize),
        "helm gives {:?}\nkustomize gives {:?}",
        names(&helm),
        names(&kustomize)
    );
    for map in [&mut helm, &mut kustomize] {
        map.values_mut().for_each(normalise);
    }
    for (key, object) in &helm {
        ensure!(
            Some(object) == kustomize.get(key),
            "{key} differs:\nhelm: {}\nkustomize: {}",
            serde_yaml::to_string(object)?,
            serde_yaml::to_string(&kustomize[key])?
        );
    }
    Ok(())
}

#[test]
fn the_chart_lints_clean_and_follows_the_workspace_version() -> Result<()> {
    let chart = chart();
    let lint = helm_ok(&["lint", "--strict", chart.to_str().context("path")?])?;
    ensure!(lint.contains("0 chart(s) failed"), "{lint}");
    let manifest: Value =
        serde_yaml::from_str(&std::fs::read_to_string(chart.join("Chart.yaml"))?)?;
    let version = env!("CARGO_PKG_VERSION");
    ensure!(
        manifest["version"].as_str() == Some(version)
            && manifest["appVersion"].as_str() == Some(version),
        "Chart.yaml's version and appVersion must be the workspace's {version}"
    );
    Ok(())
}

#[test]
fn bad_values_are_refused_with_their_path() -> Result<()> {
    let chart = chart();
    let chart = chart.to_str().context("path")?;
    for (set, expected) in [
        (
            "config.memoryUnit=TiB",
            "at '/config/memoryUnit': value must be one of 'GiB', 'MiB'",
        ),
        (
            "config.resourcePrefix=Bad_Prefix",
            "at '/config/resourcePrefix'",
        ),
        (
            "config.features.turbo=true",
            "at '/config/features': additional properties 'turbo' not allowed",
        ),
        (
            "installer.containerd.restart=reboot",
            "at '/installer/containerd/restart'",
        ),
        (
            "ljRuntime.settings.corepolicy=YieldIdle",
            "'corepolicy' not allowed",
        ),
        ("operator.replicas=0", "at '/operator/replicas'"),
    ] {
        let out = helm(&["template", "runtimekit", chart, "--set", set])?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        ensure!(!out.status.success(), "--set {set} was accepted");
        ensure!(stderr.contains(expected), "--set {set}: {stderr}");
    }
    Ok(())
}

#[test]
fn values_reach_the_objects() -> Result<()> {
    let chart = chart();
    let chart = chart.to_str().context("path")?;
    let rendered = objects(&helm_ok(&[
        "template",
        "runtimekit",
        chart,
        "--namespace",
        "gpu-system",
        "--set",
        "config.memoryUnit=MiB",
        "--set",
        "config.resourcePrefix=example.org",
        "--set",
        "installer.enabled=false",
        "--set",
        "images.nodeAgent.tag=9.9.9",
        "--set",
        "images.pullSecrets={regcred}",
        "--set",
        "admissionPolicies.enabled=false",
    ])?)?;
    let config: Value = serde_yaml::from_str(
        rendered["ConfigMap/runtimekit-config"]["data"]["config.yaml"]
            .as_str()
            .context("config.yaml")?,
    )?;
    ensure!(config["memoryUnit"] == "MiB" && config["resourcePrefix"] == "example.org");
    let agent = &rendered["DaemonSet/runtimekit-node-agent"]["spec"]["template"]["spec"];
    let containers: Vec<&str> = agent["containers"]
        .as_sequence()
        .context("containers")?
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    ensure!(
        containers == ["resource-layer", "node-agent"],
        "{containers:?}"
    );
    ensure!(agent["imagePullSecrets"][0]["name"] == "regcred");
    ensure!(agent["containers"][0]["image"] == "lj-runtimekit/node-agent:9.9.9");
    let args = serde_yaml::to_string(&agent["containers"][1]["args"])?;
    ensure!(!args.contains("--runtime-status"), "{args}");
    ensure!(
        !rendered
            .keys()
            .any(|k| k.starts_with("ValidatingAdmissionPolicy")),
        "policies rendered while switched off"
    );
    let binding = &rendered["ClusterRoleBinding/runtimekit-node-agent"]["subjects"][1];
    ensure!(binding["namespace"] == "gpu-system", "{binding:?}");
    let check = &rendered["Job/runtimekit-pre-uninstall"];
    ensure!(
        check["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
            && check["spec"]["template"]["spec"]["containers"][0]["args"][0] == "pre-uninstall",
        "the uninstall check: {check:?}"
    );
    let without = objects(&helm_ok(&[
        "template",
        "runtimekit",
        chart,
        "--set",
        "preUninstall.enabled=false",
    ])?)?;
    ensure!(
        !without
            .keys()
            .any(|k| k.contains("runtimekit-pre-uninstall")),
        "the uninstall check rendered while switched off"
    );
    Ok(())
}

#[test]
fn the_values_reference_is_the_schema_s() -> Result<()> {
    let chart = chart();
    let schema = serde_json::from_str(&std::fs::read_to_string(chart.join("values.schema.json"))?)?;
    let values = serde_yaml::from_str(&std::fs::read_to_string(chart.join("values.yaml"))?)?;
    let committed =
        std::fs::read_to_string(repo_root().join("docs/helm-values.md")).unwrap_or_default();
    ensure!(
        committed == runtimekit_e2e::chart::values_reference(&schema, &values),
        "docs/helm-values.md is not the schema's reference: run e2e/scripts/render-config.sh"
    );
    Ok(())
}
