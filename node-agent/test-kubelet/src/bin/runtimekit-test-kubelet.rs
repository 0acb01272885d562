//! The test kubelet as a process of its own, for the demo cluster's kwok nodes (kwok plays their
//! pods' lifecycle but has no device manager): for each `--node NAME=ROOT` it serves the
//! device-plugin registration and pod resources under ROOT, keeps the Node's capacity for the
//! registered resources and admits the pods bound to it, until it is stopped.

use clap::Parser;
use runtimekit_test_kubelet::TestKubelet;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(about = "Play the kubelet's device manager for kwok nodes")]
struct Cli {
    /// The kubeconfig to write Node status and read pods with.
    #[arg(long)]
    kubeconfig: PathBuf,
    /// A node and the folder that stands for its `/var/lib/kubelet`, as NAME=ROOT (repeatable).
    #[arg(long = "node", value_name = "NAME=ROOT", required = true, value_parser = node_and_root)]
    nodes: Vec<(String, PathBuf)>,
}

fn node_and_root(text: &str) -> Result<(String, PathBuf), String> {
    match text.split_once('=') {
        Some((name, root)) if !name.is_empty() && !root.is_empty() => {
            Ok((name.to_owned(), PathBuf::from(root)))
        }
        _ => Err(format!("expected NAME=ROOT, got {text:?}")),
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let cli = Cli::parse();
    match serve(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(cli: Cli) -> Result<(), Box<dyn std::error::Error>> {
    let kubeconfig = kube::config::Kubeconfig::read_from(&cli.kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    let client = kube::Client::try_from(config)?;
    let mut kubelets = Vec::new();
    for (node, root) in &cli.nodes {
        let mut kubelet = TestKubelet::start(root).await?;
        kubelet.sync_node(client.clone(), node);
        kubelet.admit_pods(client.clone(), node);
        kubelets.push(kubelet);
    }
    println!("serving {} nodes", kubelets.len());
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = terminate.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(())
}
