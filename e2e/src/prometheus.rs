//! A real Prometheus server for a test (Debian's `prometheus` package): it scrapes the given
//! targets every second on 127.0.0.1, evaluates the given alerting rules, and answers PromQL
//! through its HTTP API. It stops with the test.

use crate::harness::{TestContext, TestProcess};
use crate::tools::{free_port, http_body, http_get, url_encode};
use anyhow::{Context, Result, bail};
use serde_json::Value;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Debian's Prometheus server.
const PROMETHEUS: &str = "/usr/bin/prometheus";

/// A running Prometheus.
#[derive(Debug)]
pub struct Prometheus {
    address: SocketAddr,
    _process: TestProcess,
}

impl Prometheus {
    /// Starts Prometheus scraping `targets` (job name, host:port; a job may have several) every
    /// second, with the alerting rules `rules` (a rules file's YAML; empty for none).
    pub async fn start(
        ctx: &TestContext,
        targets: &[(&str, SocketAddr)],
        rules: &str,
    ) -> Result<Prometheus> {
        if !std::path::Path::new(PROMETHEUS).exists() {
            bail!(
                "{PROMETHEUS} is missing: install Debian's prometheus package (./just node-packages)"
            );
        }
        let dir = ctx.scratch_dir()?.join("prometheus");
        std::fs::create_dir_all(&dir)?;
        let rules_file = dir.join("rules.yaml");
        std::fs::write(
            &rules_file,
            if rules.is_empty() {
                "groups: []\n"
            } else {
                rules
            },
        )?;
        // One job per name, with every target given under it (a job name may appear once).
        let mut by_job: std::collections::BTreeMap<&str, Vec<String>> = Default::default();
        for (job, address) in targets {
            by_job
                .entry(job)
                .or_default()
                .push(format!("\"{address}\""));
        }
        let jobs: String = by_job
            .iter()
            .map(|(job, addresses)| {
                format!(
                    "  - job_name: {job}\n    static_configs:\n      - targets: [{}]\n",
                    addresses.join(", ")
                )
            })
            .collect();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: [\"{}\"]\nscrape_configs:\n{jobs}",
                rules_file.display()
            ),
        )?;
        let address = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let data: PathBuf = dir.join("data");
        let process = ctx.spawn(
            "prometheus",
            std::path::Path::new(PROMETHEUS),
            &[
                format!("--config.file={}", config.display()),
                format!("--storage.tsdb.path={}", data.display()),
                format!("--web.listen-address={address}"),
            ],
            &[],
        )?;
        let prometheus = Prometheus {
            address,
            _process: process,
        };
        ctx.wait_for(
            "Prometheus to be ready",
            Duration::from_secs(60),
            || async {
                let ready = http_get(address, "/-/ready").is_ok_and(|r| r.contains(" 200 "));
                Ok(ready.then_some(()))
            },
        )
        .await?;
        Ok(prometheus)
    }

    /// GETs an API path and returns its `data`.
    fn api(&self, path: &str) -> Result<Value> {
        let response = http_get(self.address, path)?;
        let body: Value = serde_json::from_str(http_body(&response))
            .with_context(|| format!("Prometheus answered {path} with {response}"))?;
        if body["status"] != "success" {
            bail!("Prometheus answered {path} with {body}");
        }
        Ok(body["data"].clone())
    }

    /// Where it serves its HTTP API.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// The series an instant PromQL query returns.
    pub fn query(&self, promql: &str) -> Result<Vec<Value>> {
        let data = self.api(&format!("/api/v1/query?query={}", url_encode(promql)))?;
        Ok(data["result"].as_array().cloned().unwrap_or_default())
    }

    /// The alerts firing now, by name.
    pub fn firing(&self) -> Result<Vec<Value>> {
        let data = self.api("/api/v1/alerts")?;
        Ok(data["alerts"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|a| a["state"] == "firing")
            .collect())
    }
}

/// Debian's promtool, beside Prometheus.
const PROMTOOL: &str = "/usr/bin/promtool";

/// Runs `promtool check config` on a Prometheus configuration: its complaint when it refuses it.
pub fn promtool_check_config(text: &str, scratch: &std::path::Path) -> Result<()> {
    let file = scratch.join("prometheus.yml");
    std::fs::write(&file, text)?;
    let output = std::process::Command::new(PROMTOOL)
        .args(["check", "config", "--syntax-only"])
        .arg(&file)
        .output()
        .with_context(|| {
            format!("{PROMTOOL} (Debian's prometheus package: ./just node-packages)")
        })?;
    if !output.status.success() {
        bail!(
            "promtool refuses the configuration: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}

/// Runs `promtool check metrics` on a scrape's text: an error when it cannot parse it, otherwise
/// its lint findings, one per line.
pub fn promtool_findings(text: &str) -> Result<Vec<String>> {
    use std::io::Write;
    let mut child = std::process::Command::new(PROMTOOL)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .with_context(|| {
            format!("{PROMTOOL} (Debian's prometheus package: ./just node-packages)")
        })?;
    child
        .stdin
        .take()
        .context("promtool's stdin")?
        .write_all(text.as_bytes())?;
    let output = child.wait_with_output()?;
    let findings = String::from_utf8_lossy(&output.stderr).into_owned()
        + &String::from_utf8_lossy(&output.stdout);
    // Exit 1 is a parse error; 3 means lint findings only.
    if output.status.code() == Some(1) {
        bail!("promtool cannot parse the scrape: {findings}");
    }
    Ok(findings
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect())
}
