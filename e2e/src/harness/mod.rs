//! Test support: one control plane per test run, a namespace per test, fake GPU nodes, waiting
//! with timeouts, and a dump of the relevant objects and logs when a test fails.
//!
//! `run` holds the run ([`Harness`]) and what a test is ([`Test`], [`tests!`](crate::tests));
//! `context` what one test works with ([`TestContext`]); `fake_node`, `process` and
//! `control_plane` what a test does with nodes, processes and the control plane itself;
//! `kubectl_table` a helper the tests share; `workspace_binary` (beside the harness, since the
//! cluster's real node uses it too) builds this workspace's binaries.

mod context;
mod control_plane;
mod fake_node;
mod kubectl_table;
mod process;
mod run;

pub use crate::cluster::KWOK_ANNOTATION;
pub use crate::workspace_binary::{plain_cargo_env, workspace_binary};
pub use context::TestContext;
pub use fake_node::FakeNode;
pub use kubectl_table::parse_table;
pub use process::TestProcess;
pub use run::{Harness, Test, TestFn};
