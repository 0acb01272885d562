//! The operator binary: the lj-runtimekit-scheduler and the GpuSlice, GangGroup and
//! TopologyGroup controllers, plus `check`, which tests manifests against the resource contract
//! without a cluster.

mod check;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(version, about = "GPU runtime kit operator")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Check Pod, JobSet and workload manifests against the resource contract and print what
    /// each container asks for; exits 1 when any manifest breaks a rule.
    Check {
        /// YAML files (several documents per file are fine); directories are read for *.yaml.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// The shared configuration (resource prefix, memory unit) as YAML; defaults apply without it.
        #[arg(long, env = "RUNTIMEKIT_CONFIG")]
        config: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Check { paths, config } => check::run(&paths, config.as_deref()),
    }
}
