//! A real Kubernetes control plane for the end-to-end tests and the demo, built from upstream Go
//! modules (`e2e/tools/`), and the support the tests share.

pub mod cluster;
pub mod harness;
pub mod load;
pub mod pki;
pub mod real_node;
pub mod tools;

pub use cluster::{Cluster, ClusterOptions};
pub use harness::{FakeNode, Harness, TestContext, parse_table};
