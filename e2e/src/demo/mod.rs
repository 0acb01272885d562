//! `./just demo`: the whole product on this machine. A control plane (etcd, kube-apiserver,
//! kube-controller-manager, JobSet, kwok); a real node (containerd, runc, the kubelet) where the
//! operator and the node agent run as `config/` deploys them; simulated nodes of every shipped
//! profile over two network pods, each with its node agent; then the usage guide's examples of
//! sections 3 and 4, and what became of them. The cluster is left running for `./just down`.
//!
//! `fleet` says which nodes and where, `examples` what is applied, `show` what is printed.

pub mod examples;
pub mod fleet;
mod show;

use crate::cluster::real_node::{REAL_NODE, Setup, offers_cards};
use crate::cluster::{Cluster, ClusterOptions, stop_recorded};
use crate::tools::repo_root;
use anyhow::{Context, Result, bail};
use examples::Example;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use runtimekit_contract::RuntimeKitConfig;
use runtimekit_contract::config::SWITCHED_OFF;
use runtimekit_crds::TopologyGroup;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long one wait of the demo may take before it says what it was waiting for.
const WAIT: Duration = Duration::from_secs(180);
/// The steps [`run`] announces.
const STEPS: usize = 9;
/// The images the demo's real node runs: the kit's two (what the chart deploys), the demo's
/// workload, and the pod sandbox and test image every real node has.
const IMAGES: [&str; 5] = ["operator", "node-agent", "demo-app", "pause", "busybox"];

/// What `./just demo` leaves running, for the caller to print or check.
#[derive(Debug)]
pub struct Demo {
    /// The administrator's kubeconfig.
    pub kubeconfig: PathBuf,
    /// The folder holding `kubectl` and `kubectl-gpu`.
    pub bin: PathBuf,
    /// How long building took (the control plane's tools, the images, `kubectl gpu`): minutes
    /// on a machine's first run, seconds after.
    pub built_in: Duration,
    /// From the cluster's start (after the build) until every example was placed.
    pub ready_after: Duration,
    /// One member of the usage guide's gang, to explain.
    pub gang_member: Option<String>,
}

/// Numbered steps, with the time since the start (since the build, once it is done).
struct Progress {
    started: Instant,
    step: usize,
}

impl Progress {
    fn step(&mut self, what: &str) {
        self.step += 1;
        println!(
            "[{}/{STEPS}] {what} ({:.0} s)",
            self.step,
            self.started.elapsed().as_secs_f64()
        );
    }
}

/// Starts the demo cluster in `dir` (stopping one left running there) and shows the examples
/// placed. On failure, stops what it started.
pub async fn run(dir: &Path) -> Result<Demo> {
    let mut progress = Progress {
        started: Instant::now(),
        step: 0,
    };
    if stop_recorded(dir)? > 0 {
        println!("stopped the cluster left running in {}", dir.display());
    }
    // Say what this machine lacks before anything starts.
    crate::cluster::real_node::check_host()?;
    crate::cluster::real_node::check_socket_room(dir)?;
    progress.step(
        "building what runs: the control plane's tools, the kit's images, kubectl gpu (the first run on a machine takes minutes)",
    );
    build()?;
    let built_in = progress.started.elapsed();
    progress.started = Instant::now();
    progress.step("control plane: etcd, kube-apiserver, kube-controller-manager, JobSet, kwok");
    let mut cluster = Cluster::start(ClusterOptions {
        dir: dir.to_owned(),
        detached: true,
        kube_scheduler: false,
        profiling: false,
        jobs_keep_running: true,
        node_lease_seconds: crate::cluster::NODE_LEASE_SECONDS,
    })
    .await?;
    match bring_up(&mut cluster, &mut progress, built_in).await {
        Ok(demo) => Ok(demo),
        Err(e) => {
            let tails = cluster.log_tails(5);
            let _ = stop_recorded(dir);
            Err(e.context(format!(
                "the demo stopped; the last lines of its logs:\n{tails}"
            )))
        }
    }
}

/// Builds (or finds cached) everything the later steps run, so their times are the product's.
fn build() -> Result<()> {
    crate::tools::Tools::ensure()?;
    crate::tools::Tools::helm()?;
    crate::cluster::real_node::build_images(&IMAGES)?;
    crate::workspace_binary::workspace_binary("runtimekit-kubectl-gpu", "kubectl-gpu")?;
    Ok(())
}

async fn bring_up(
    cluster: &mut Cluster,
    progress: &mut Progress,
    built_in: Duration,
) -> Result<Demo> {
    let client = cluster.client().await?;
    let config = RuntimeKitConfig::default();
    let names = config.names();

    progress.step("real node as a user's is before the kit: containerd, runc, CNI and the kubelet");
    let node = cluster.start_real_node_as(REAL_NODE, Setup::Bare)?;
    node.wait_ready(&client).await?;
    let mut labels = fleet::REAL_NODE_POSITION.labels(&config.topology_labels);
    labels.extend(fleet::accelerator_labels(
        crate::cluster::real_node::PROFILE,
    ));
    label(&client, REAL_NODE, serde_json::to_value(labels)?).await?;

    progress.step(
        "simulated nodes: H800, A100, MI300X, PPU 810E and PPU M890P over two network pods, each with its node agent",
    );
    let mut simulated = fleet::simulated_nodes(&config.topology_labels);
    // Time-division pods go to the real node, where their containers really run: the per-node
    // switch keeps them off the simulated nodes until they are placed.
    for node in &mut simulated {
        node.labels
            .insert(names.tdm_switch_label.clone(), SWITCHED_OFF.into());
    }
    cluster.start_simulated_nodes(&simulated).await?;

    progress.step(
        "the kit installed with its Helm chart; the agent's installer sets the real node up (lj-runtime, containerd's handler)",
    );
    cluster.deploy_chart(&node, &[])?;
    node.import_images(&["demo-app"])?;
    wait_deployed(&client).await?;
    let mut nodes: Vec<String> = simulated.iter().map(|n| n.name.clone()).collect();
    nodes.push(REAL_NODE.to_owned());
    wait_reported(&client, &nodes).await?;
    wait_offered(&client, &nodes, &names.gpu).await?;
    // The deployed agent (not the node's own, stopped) answers on the DaemonSet's port.
    show::wait_exporter().await?;

    // kubectl and kubectl-gpu ready before the examples, so what is shown follows their placing.
    let bin = cluster.dir.join("bin");
    install_tools(cluster, &bin)?;

    progress.step("the usage guide's examples (sections 3 and 4), time-division first");
    let examples = examples::read(&repo_root().join("contract/tests/seeds"))?;
    let (tdm, rest): (Vec<&Example>, Vec<&Example>) =
        examples.iter().partition(|e| e.asks_for(&names.gpu_core));
    apply(cluster, &tdm)?;
    wait_placed(&client, &tdm).await?;
    for node in &simulated {
        let on = serde_json::json!({&names.tdm_switch_label: null});
        label(&client, &node.name, on).await?;
    }
    apply(cluster, &rest)?;
    wait_placed(&client, &rest).await?;
    let ready_after = progress.started.elapsed();
    let mut gang = Vec::new();
    for example in rest.iter().filter(|e| e.kind == "JobSet") {
        gang.extend(pods_of(&client, example).await?);
    }
    let gang_member = gang.iter().map(ResourceExt::name_any).min();

    progress.step("what the cluster holds, where each pod landed and why");
    show::ledger(cluster)?;
    show::placements(&client, &bin, &cluster.kubeconfig, &examples).await?;

    progress.step("what the time-division pod's container sees");
    show::container(cluster, &node, &client).await?;

    progress.step("the real node's exporter (:9501), a few lines of one scrape");
    show::scrape().await?;
    Ok(Demo {
        kubeconfig: cluster.kubeconfig.clone(),
        bin,
        built_in,
        ready_after,
        gang_member,
    })
}

/// Sets labels on a node (a `null` value removes one).
async fn label(client: &Client, node: &str, labels: serde_json::Value) -> Result<()> {
    let patch = serde_json::json!({"metadata": {"labels": labels}});
    Api::<Node>::all(client.clone())
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("labelling node {node}"))?;
    Ok(())
}

/// [`crate::tools::wait_for`] for at most [`WAIT`].
async fn wait<T, F, Fut>(what: &str, check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    crate::tools::wait_for(what, WAIT, check).await
}

/// Waits until the deployed operator and node agent pods are Ready.
async fn wait_deployed(client: &Client) -> Result<()> {
    crate::cluster::deploy::wait_kit_running(client, None, WAIT).await
}

/// Waits until every node's agent reported its cards and the group is Ready.
async fn wait_reported(client: &Client, nodes: &[String]) -> Result<()> {
    let groups: Api<TopologyGroup> = Api::all(client.clone());
    wait("every node agent's first report", || async {
        let listed = groups.list(&ListParams::default()).await?.items;
        let reported = |node: &String| {
            listed.iter().any(|g| {
                g.name_any() == *node
                    && g.status.as_ref().is_some_and(|s| {
                        !s.cards.is_empty()
                            && s.conditions
                                .iter()
                                .any(|c| c.type_ == "Ready" && c.status == "True")
                    })
            })
        };
        Ok(nodes.iter().all(reported).then_some(()))
    })
    .await
}

/// Waits until every node's kubelet offers the agent's cards as `resource` (its device plugins
/// registered).
async fn wait_offered(client: &Client, nodes: &[String], resource: &str) -> Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    wait(
        "every node's device plugins registered with its kubelet",
        || async {
            let listed = api.list(&ListParams::default()).await?.items;
            let offers = |name: &String| {
                listed
                    .iter()
                    .any(|n| n.name_any() == *name && offers_cards(n, resource))
            };
            Ok(nodes.iter().all(offers).then_some(()))
        },
    )
    .await
}

/// Applies the examples, as a user would with `kubectl apply -f`.
fn apply(cluster: &Cluster, examples: &[&Example]) -> Result<()> {
    for example in examples {
        let mut child = cluster
            .kubectl()
            .args(["apply", "-n", "default", "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        use std::io::Write;
        child
            .stdin
            .take()
            .context("kubectl's stdin")?
            .write_all(example.yaml.as_bytes())?;
        let output = child.wait_with_output()?;
        if !output.status.success() {
            bail!(
                "kubectl apply of {}: {}",
                example.file,
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let selected: Vec<String> = example
            .node_selector
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        print!(
            "  {:<28} {}",
            example.file,
            String::from_utf8_lossy(&output.stdout)
        );
        if !selected.is_empty() {
            println!(
                "  {:<28} (with the nodeSelector {} the guide advises for a vendor's cards)",
                "",
                selected.join(",")
            );
        }
    }
    Ok(())
}

/// The pods an example made: the Pod itself, or a JobSet's members.
async fn pods_of(client: &Client, example: &Example) -> Result<Vec<Pod>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    Ok(if example.kind == "JobSet" {
        let selector = format!(
            "{}={}",
            runtimekit_contract::config::JOBSET_NAME_LABEL,
            example.name
        );
        pods.list(&ListParams::default().labels(&selector))
            .await?
            .items
    } else {
        pods.get_opt(&example.name).await?.into_iter().collect()
    })
}

/// How many pods an example makes (a JobSet: its replicated jobs' parallelism).
fn expected_pods(example: &Example) -> usize {
    if example.kind != "JobSet" {
        return 1;
    }
    example.object["spec"]["replicatedJobs"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|job| {
            let replicas = job["replicas"].as_u64().unwrap_or(1);
            let parallelism = job["template"]["spec"]["parallelism"].as_u64().unwrap_or(1);
            usize::try_from(replicas * parallelism).unwrap_or(usize::MAX)
        })
        .sum()
}

/// Waits until every pod of the examples is bound to a node.
async fn wait_placed(client: &Client, examples: &[&Example]) -> Result<()> {
    for example in examples {
        let expected = expected_pods(example);
        wait(
            &format!("the pods of {} to be placed", example.file),
            || async {
                let pods = pods_of(client, example).await?;
                let placed = pods
                    .iter()
                    .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some())
                    .count();
                Ok((placed >= expected).then_some(()))
            },
        )
        .await?;
    }
    Ok(())
}

/// Puts `kubectl` (the control plane's own) and `kubectl-gpu` into `bin`.
fn install_tools(cluster: &Cluster, bin: &Path) -> Result<()> {
    std::fs::create_dir_all(bin)?;
    let plugin =
        crate::workspace_binary::workspace_binary("runtimekit-kubectl-gpu", "kubectl-gpu")?;
    for (source, name) in [
        (cluster.tools.kubectl(), "kubectl"),
        (plugin, "kubectl-gpu"),
    ] {
        let target = bin.join(name);
        let _ = std::fs::remove_file(&target);
        std::os::unix::fs::symlink(&source, &target)
            .with_context(|| format!("linking {}", target.display()))?;
    }
    Ok(())
}

impl Demo {
    /// The closing words: the kubeconfig, three commands worth trying and how to stop.
    pub fn closing(&self) -> String {
        let gang = self.gang_member.as_deref().unwrap_or("POD");
        format!(
            "\nThe demo cluster is ready ({:.0} s from its start until every example was placed, after {:.0} s of building) and keeps running.\n\
             Use it from this shell:\n\
             \n  export KUBECONFIG={kubeconfig}\n  export PATH={bin}:$PATH\n\
             \nThree commands worth trying next:\n\
             \n  kubectl gpu nodes                 # every card: mode, free share, MIG, health, network position\
             \n  kubectl gpu explain {gang}   # why this gang member is where it is\
             \n  kubectl gpu fit -f contract/tests/seeds/3.3-mig.yaml   # where a MIG pod would land now, without creating it\n\
             \nStop it with: ./just down\n",
            self.ready_after.as_secs_f64(),
            self.built_in.as_secs_f64(),
            kubeconfig = self.kubeconfig.display(),
            bin = self.bin.display(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jobset_makes_as_many_pods_as_its_jobs_run_at_once() {
        let seeds = repo_root().join("contract/tests/seeds");
        let all = examples::read(&seeds).unwrap();
        let counts: Vec<(String, usize)> = all
            .iter()
            .map(|e| (e.name.clone(), expected_pods(e)))
            .collect();
        assert!(counts.contains(&("gang-nccl-test".into(), 7)), "{counts:?}");
        assert!(counts.contains(&("tdm-demo".into(), 1)), "{counts:?}");
    }
}
