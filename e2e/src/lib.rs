//! A real Kubernetes control plane for the end-to-end tests and the demo, built from upstream Go
//! modules (`e2e/tools/`), and the support the tests share.

pub mod chart;
pub mod cluster;
pub mod demo;
pub mod harness;
pub mod load;
pub mod pki;
pub mod prometheus;
pub mod supervise;
pub mod tools;
pub mod workspace_binary;

pub use cluster::{Cluster, ClusterOptions, real_node};
pub use harness::{FakeNode, Harness, TestContext, parse_table};
