//! Prints the Helm chart's configuration reference (docs/helm-values.md) from its values schema
//! and values.yaml: `helm-values-reference <chart folder>`.

use anyhow::{Context, Result};

fn main() -> Result<()> {
    let chart = std::env::args()
        .nth(1)
        .context("usage: helm-values-reference <chart folder>")?;
    let chart = std::path::Path::new(&chart);
    let schema = serde_json::from_str(&std::fs::read_to_string(chart.join("values.schema.json"))?)?;
    let values = serde_yaml::from_str(&std::fs::read_to_string(chart.join("values.yaml"))?)?;
    print!(
        "{}",
        runtimekit_e2e::chart::values_reference(&schema, &values)
    );
    Ok(())
}
