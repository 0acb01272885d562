//! What the node agent installs on its node so the user does not: `lj-runtime` and the
//! isolation library on the host, and the `lj-runtime` handler in containerd's configuration.

pub mod containerd;
