//! What a container holding a time-division card is given so the isolation library
//! (`node-agent/isolation`) holds it to its caps: the library, listed in the container's
//! `/etc/ld.so.preload` (which the dynamic linker reads for every process, also one started
//! with a cleared environment), a folder of its own for the memory ledger its processes
//! share, and a read-only one for the measured shares of SM time its launch gates steer by.
//! The files live on the host under the container's ID; this module says where they go
//! in the container, without I/O.

use runtimekit_contract::allocation::ContainerAllocation;
use serde_json::{Value, json};

/// Where the library is in the container.
pub const LIBRARY: &str = "/usr/local/lib/runtimekit/libruntimekit_isolation.so";
/// Where the preload list is in the container.
pub const PRELOAD: &str = "/etc/ld.so.preload";
/// Where the ledger's folder is in the container (`RUNTIMEKIT_ISOLATION_DIR`).
pub const LEDGER: &str = "/run/runtimekit/isolation";
/// Where the measurements' folder is in the container (`RUNTIMEKIT_MEASURED_DIR`).
pub const MEASURED: &str = "/run/runtimekit/measured";

/// Host paths of what the container is given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Enforcement {
    /// The library.
    pub library: String,
    /// The container's preload list.
    pub preload: String,
    /// The container's ledger folder.
    pub ledger: String,
    /// The container's measurements folder.
    pub measured: String,
    /// `RUNTIMEKIT_GPU_CORE_POLICY`: the node's setting, never the pod's.
    pub core_policy: &'static str,
}

/// Whether a container's part of the allocation needs enforcing: it holds a time-division
/// share (whole cards and MIG instances are bounded by the hardware).
pub fn needed(part: &ContainerAllocation) -> bool {
    part.cards.iter().any(|c| c.mode == "TDM")
}

/// The container's preload list: the image's own entries (`image`, its `/etc/ld.so.preload`),
/// then the library, once.
pub fn preload_list(image: &str) -> String {
    let mut entries: Vec<&str> = image
        .split(|c: char| c.is_whitespace() || c == ':')
        .filter(|e| !e.is_empty() && *e != LIBRARY)
        .collect();
    entries.push(LIBRARY);
    entries.join("\n") + "\n"
}

/// The bind mounts that give the container what `enforcement` names.
pub fn mounts(enforcement: &Enforcement) -> Vec<Value> {
    let read_only = json!(["rbind", "ro", "nosuid", "nodev"]);
    vec![
        json!({"destination": LIBRARY, "type": "bind", "source": enforcement.library, "options": read_only}),
        json!({"destination": PRELOAD, "type": "bind", "source": enforcement.preload, "options": read_only}),
        json!({"destination": LEDGER, "type": "bind", "source": enforcement.ledger,
               "options": ["rbind", "rw", "nosuid", "nodev", "noexec"]}),
        json!({"destination": MEASURED, "type": "bind", "source": enforcement.measured,
               "options": ["rbind", "ro", "nosuid", "nodev", "noexec"]}),
    ]
}

/// Whether a container ID can name a folder (containerd's are hex; nothing with a path in it).
pub fn usable_id(id: &str) -> bool {
    !id.is_empty()
        && id != "."
        && id != ".."
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use runtimekit_contract::allocation::AllocatedCard;

    fn card(mode: &str) -> AllocatedCard {
        AllocatedCard {
            mode: mode.into(),
            ..AllocatedCard::default()
        }
    }

    #[test]
    fn only_time_division_shares_are_enforced() {
        let part = |modes: &[&str]| ContainerAllocation {
            name: "app".into(),
            cards: modes.iter().map(|m| card(m)).collect(),
            nics: vec![],
        };
        assert!(needed(&part(&["TDM"])));
        assert!(needed(&part(&["Whole", "TDM"])));
        assert!(!needed(&part(&["Whole", "MIG"])));
        assert!(!needed(&part(&[])));
    }

    #[test]
    fn the_images_preloads_stay_and_the_library_is_listed_once() {
        assert_eq!(preload_list(""), format!("{LIBRARY}\n"));
        assert_eq!(
            preload_list(&format!("/lib/a.so:{LIBRARY} /lib/b.so\n")),
            format!("/lib/a.so\n/lib/b.so\n{LIBRARY}\n")
        );
    }

    #[test]
    fn ids_with_paths_in_them_are_refused() {
        assert!(usable_id("3f9a0c1e77"));
        for id in ["", ".", "..", "a/b", "../x"] {
            assert!(!usable_id(id), "{id}");
        }
    }
}
