//! End-to-end tests against a real control plane (etcd, kube-apiserver, kube-controller-manager,
//! JobSet, kwok, and a real node with containerd and the kubelet once a test asks for it) that
//! this binary starts once for the whole run and stops at the end, also when a test fails or the
//! run is interrupted.

mod contract_policy;
mod control_plane;
mod dra;
mod exporter;
mod faults;
mod gangs;
mod guides;
mod health;
mod node_agent;
mod node_installer;
mod nvml_node;
mod operator;
mod plugin;
mod preemption;
mod quotas;
mod real_node;
mod real_node_dra;
mod real_node_isolation;
mod real_node_upgrade;
mod switches;
mod trust;

use libtest_mimic::Arguments;
use runtimekit_e2e::Harness;
use runtimekit_e2e::harness::Test;
use std::process::ExitCode;

/// Every test of the suite.
fn tests() -> Vec<Test> {
    [
        control_plane::TESTS,
        operator::TESTS,
        gangs::TESTS,
        quotas::TESTS,
        preemption::TESTS,
        trust::TESTS,
        contract_policy::TESTS,
        faults::TESTS,
        health::TESTS,
        node_agent::TESTS,
        node_installer::TESTS,
        nvml_node::TESTS,
        exporter::TESTS,
        switches::TESTS,
        guides::TESTS,
        plugin::TESTS,
        dra::TESTS,
        // Last: the real node stays once started, and no other test should see its cards.
        real_node_isolation::TESTS,
        real_node_dra::TESTS,
        real_node::TESTS,
        // After the chart's own test: it installs the previous release on the bare node.
        real_node_upgrade::TESTS,
    ]
    .concat()
}

fn main() -> ExitCode {
    let mut args = Arguments::from_args();
    // Tests share one control plane and schedulers see every node, so they run one at a time.
    args.test_threads.get_or_insert(1);
    if args.list {
        return libtest_mimic::run(&args, Harness::trials(None, &tests())).exit_code();
    }
    let harness = match Harness::start() {
        Ok(h) => h,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let conclusion = libtest_mimic::run(&args, Harness::trials(Some(&harness), &tests()));
    harness.finish();
    conclusion.exit_code()
}
