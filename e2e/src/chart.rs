//! The Helm chart's configuration reference (docs/helm-values.md), written from its values
//! schema (each value's type, allowed values and description) and values.yaml (its default), so
//! the reference says what `helm install` checks.

use serde_json::Value as Json;
use serde_yaml::Value as Yaml;

/// The reference: one row per leaf value of `schema`, with its default from `values`.
pub fn values_reference(schema: &Json, values: &Yaml) -> String {
    let mut rows = Vec::new();
    collect(schema, values, "", &mut rows);
    let mut text = String::from(
        "# Helm values of the runtimekit chart\n\n\
         Generated from `config/helm/runtimekit/values.schema.json` and `values.yaml` by\n\
         `e2e/scripts/render-config.sh`; do not edit. `helm install` refuses a value the schema\n\
         does not allow, naming its path. Set values with `--set path=value` or `-f file.yaml`.\n\n\
         | Value | Type | Default | Description |\n| --- | --- | --- | --- |\n",
    );
    for (path, kind, default, description) in rows {
        text.push_str(&format!(
            "| `{path}` | {kind} | {default} | {} |\n",
            description.replace('|', "\\|")
        ));
    }
    text
}

fn collect(
    schema: &Json,
    values: &Yaml,
    path: &str,
    rows: &mut Vec<(String, String, String, String)>,
) {
    let properties = schema.get("properties").and_then(Json::as_object);
    match properties {
        Some(properties) if !properties.is_empty() => {
            for (name, child) in properties {
                if name == "global" {
                    continue;
                }
                let path = if path.is_empty() {
                    name.clone()
                } else {
                    format!("{path}.{name}")
                };
                collect(
                    child,
                    values.get(name.as_str()).unwrap_or(&Yaml::Null),
                    &path,
                    rows,
                );
            }
        }
        _ => rows.push((
            path.to_owned(),
            kind(schema),
            default(values),
            schema
                .get("description")
                .and_then(Json::as_str)
                .unwrap_or_default()
                .to_owned(),
        )),
    }
}

/// The value's type, with its allowed values or pattern.
fn kind(schema: &Json) -> String {
    let base = schema
        .get("type")
        .and_then(Json::as_str)
        .unwrap_or("any")
        .to_owned();
    if let Some(choices) = schema.get("enum").and_then(Json::as_array) {
        let choices: Vec<String> = choices
            .iter()
            .map(|c| {
                format!(
                    "`{}`",
                    c.as_str().map_or_else(|| c.to_string(), str::to_owned)
                )
            })
            .collect();
        return format!("one of {}", choices.join(", "));
    }
    if let Some(minimum) = schema.get("minimum") {
        return format!("{base} ≥ {minimum}");
    }
    base
}

fn default(value: &Yaml) -> String {
    match value {
        Yaml::Null => "(none)".into(),
        Yaml::String(s) if s.is_empty() => "`\"\"`".into(),
        other => {
            let text = serde_json::to_string(other).unwrap_or_default();
            format!("`{}`", text.replace('|', "\\|"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_leaf_gets_a_row_with_its_default() {
        let schema: Json = serde_json::json!({"type": "object", "properties": {
            "config": {"type": "object", "properties": {
                "memoryUnit": {"type": "string", "enum": ["GiB", "MiB"], "description": "The unit."},
                "replicas": {"type": "integer", "minimum": 1, "description": "How many | ever."}
            }},
            "pullSecrets": {"type": "array", "description": "Secrets."}
        }});
        let values: Yaml =
            serde_yaml::from_str("config: {memoryUnit: GiB, replicas: 2}\npullSecrets: []")
                .unwrap();
        let text = values_reference(&schema, &values);
        assert!(
            text.contains("| `config.memoryUnit` | one of `GiB`, `MiB` | `\"GiB\"` | The unit. |"),
            "{text}"
        );
        assert!(
            text.contains("| `config.replicas` | integer ≥ 1 | `2` | How many \\| ever. |"),
            "{text}"
        );
        assert!(
            text.contains("| `pullSecrets` | array | `[]` | Secrets. |"),
            "{text}"
        );
    }
}
