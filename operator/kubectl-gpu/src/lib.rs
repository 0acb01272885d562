//! `kubectl gpu`, a kubectl plugin reading the GPU ledger the custom resources keep:
//!
//! - [`cards`]: each node's cards with their mode, free compute and memory, MIG instances and
//!   free placements, health and network position (`kubectl gpu nodes`);
//! - [`slices`]: the slices each pod holds (`kubectl gpu pods`);
//! - [`claims`]: what DRA ResourceClaims of the kit's driver hold, read as the ledger's slices;
//! - [`explain`]: why a pod is where it is, or why it is Pending, in plain words
//!   (`kubectl gpu explain POD`);
//! - [`layout`]: where a pod's cards and NICs sit inside their node (interconnect groups, PCIe
//!   switches), as `explain` says it;
//! - [`fit`]: where a pod would land now and why, or why nowhere, without creating it
//!   (`kubectl gpu fit -f POD.yaml`: the placement engine over the cluster as listed);
//! - [`quota`]: each namespace's quotas on the card resources, every replica counted
//!   (`kubectl gpu quota`);
//! - [`table`]: kubectl-style tables;
//! - [`usage`]: what each slice's container uses now, from a Prometheus scraping the exporters.
//!
//! Everything here is pure: `main` lists the objects and prints what these functions return.

pub mod cards;
pub mod claims;
pub mod explain;
pub mod fit;
pub mod layout;
pub mod quota;
pub mod slices;
pub mod table;
pub mod usage;

#[cfg(test)]
mod tests {
    /// The krew manifest names this binary and this crate's version, so it cannot drift.
    #[test]
    fn the_krew_manifest_matches_the_crate() {
        let text = include_str!("../krew.yaml");
        let manifest: serde_yaml::Value = serde_yaml::from_str(text).expect("YAML");
        assert_eq!(manifest["kind"], "Plugin");
        assert_eq!(manifest["metadata"]["name"], "gpu");
        let version = format!("v{}", env!("CARGO_PKG_VERSION"));
        assert_eq!(manifest["spec"]["version"].as_str(), Some(version.as_str()));
        let platform = &manifest["spec"]["platforms"][0];
        assert_eq!(platform["bin"], "kubectl-gpu");
        assert!(
            platform["uri"]
                .as_str()
                .is_some_and(|u| u.contains(&version) && u.ends_with(".tar.gz")),
            "{platform:?}"
        );
    }
}
