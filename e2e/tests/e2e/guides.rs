//! The user guides' YAML against the real apiserver: every Kubernetes object of
//! `docs/user-guide.md` and `docs/user-guide.zh.md` is created with a server-side dry run in the
//! test's namespace (the image placeholder replaced), so schemas, the JobSet and GangGroup CRDs
//! and admission all see it, and the Prometheus configuration passes `promtool check config`.
//! (`contract/tests/guides.rs` checks that the two guides hold the same objects and that the
//! contract reads every pod.)

use anyhow::{Context, Result, ensure};
use runtimekit_e2e::harness::Test;
use runtimekit_e2e::prometheus::promtool_check_config;
use runtimekit_e2e::{TestContext, tests};

pub const TESTS: &[Test] = tests![every_object_in_the_guides_is_accepted];

/// The fenced `yaml` blocks of a guide, as text.
fn blocks(file: &str) -> Result<Vec<String>> {
    let path = runtimekit_e2e::tools::repo_root().join("docs").join(file);
    let text = std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
    Ok(text
        .split("```yaml\n")
        .skip(1)
        .filter_map(|rest| rest.split("```").next().map(str::to_owned))
        .collect())
}

async fn every_object_in_the_guides_is_accepted(ctx: TestContext) -> Result<()> {
    let scratch = ctx.scratch_dir()?;
    // Pods name the lj-runtime RuntimeClass, which admission requires to exist.
    let runtime_class = runtimekit_e2e::tools::repo_root().join("config/runtime/runtimeclass.yaml");
    ctx.kubectl_ok(&["apply", "-f", &runtime_class.to_string_lossy()], None)?;
    let mut objects = 0;
    for file in ["user-guide.md", "user-guide.zh.md"] {
        for block in blocks(file)? {
            if block.starts_with("# prometheus.yml") {
                promtool_check_config(&block.replace("<node-ip>", "127.0.0.1"), &scratch)
                    .with_context(|| format!("{file}:\n{block}"))?;
                continue;
            }
            let object = block.replace("<your-image>", "busybox");
            let output = ctx.kubectl(&["apply", "--dry-run=server", "-f", "-"], Some(&object))?;
            ensure!(
                output.status.success(),
                "{file}: the apiserver refuses\n{block}\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
            objects += 1;
        }
    }
    ensure!(objects >= 20, "only {objects} objects in the two guides");
    Ok(())
}
