//! What a container holding a time-division card is given so the isolation library
//! (`node-agent/isolation`) holds it to its caps: the library, listed in the container's
//! `/etc/ld.so.preload` (which the dynamic linker reads for every process, also one started
//! with a cleared environment), a folder of its own for the memory ledger its processes
//! share, and a read-only one for the measured shares of SM time its launch gates steer by.
//! The files live on the host (under the container's ID for `lj-runtime`, under the claim for
//! the DRA driver); this module says where they go in the container, without I/O.

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

/// A bind mount into the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// The host path.
    pub source: String,
    /// Where it appears in the container.
    pub destination: String,
    /// The mount options (`rbind` and the rest).
    pub options: Vec<&'static str>,
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
pub fn mounts(enforcement: &Enforcement) -> Vec<Mount> {
    let read_only = vec!["rbind", "ro", "nosuid", "nodev"];
    let mount = |source: &str, destination: &str, options: Vec<&'static str>| Mount {
        source: source.to_owned(),
        destination: destination.to_owned(),
        options,
    };
    vec![
        mount(&enforcement.library, LIBRARY, read_only.clone()),
        mount(&enforcement.preload, PRELOAD, read_only),
        mount(
            &enforcement.ledger,
            LEDGER,
            vec!["rbind", "rw", "nosuid", "nodev", "noexec"],
        ),
        mount(
            &enforcement.measured,
            MEASURED,
            vec!["rbind", "ro", "nosuid", "nodev", "noexec"],
        ),
    ]
}

/// The variables that point the library at its folders and the node's policy.
pub fn environment(enforcement: &Enforcement) -> Vec<(String, String)> {
    vec![
        ("RUNTIMEKIT_ISOLATION_DIR".into(), LEDGER.into()),
        ("RUNTIMEKIT_MEASURED_DIR".into(), MEASURED.into()),
        (
            "RUNTIMEKIT_GPU_CORE_POLICY".into(),
            enforcement.core_policy.into(),
        ),
    ]
}

/// Whether an ID can name a folder (containerd's are hex, claims' UIDs hex and dashes; nothing
/// with a path in it).
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
        assert!(usable_id("claim-0b1c-22"));
        for id in ["", ".", "..", "a/b", "../x"] {
            assert!(!usable_id(id), "{id}");
        }
    }

    #[test]
    fn the_measurements_are_read_only_and_the_ledger_writable() {
        let enforcement = Enforcement {
            library: "/opt/lib.so".into(),
            preload: "/run/iso/c1/ld.so.preload".into(),
            ledger: "/run/iso/c1/ledger".into(),
            measured: "/run/iso/c1/measured".into(),
            core_policy: "enforce",
        };
        let mounts = mounts(&enforcement);
        let options = |at: &str| {
            mounts
                .iter()
                .find(|m| m.destination == at)
                .map(|m| m.options.clone())
                .unwrap_or_default()
        };
        assert!(options(MEASURED).contains(&"ro"));
        assert!(options(LEDGER).contains(&"rw"));
        assert!(options(LIBRARY).contains(&"ro"));
    }
}
