//! Which pod a process runs in, from its cgroup (`/proc/<pid>/cgroup`): the kubelet names a
//! pod's cgroup after its UID, `pod<uid>` with the cgroupfs driver and
//! `kubepods-<qos>-pod<uid with _ for ->.slice` with the systemd one. NVML names processes by
//! host PID, so this needs the host PID namespace (the DaemonSet runs with `hostPID`).

use std::collections::BTreeMap;
use std::path::Path;

/// The pod UID in a process's cgroup file, if it runs in a pod.
pub fn pod_uid(cgroup: &str) -> Option<String> {
    cgroup.lines().find_map(|line| {
        let path = line.splitn(3, ':').nth(2)?;
        path.split('/').find_map(|part| {
            let at = part.rfind("pod")?;
            let rest = &part[at + 3..];
            let uid: String = rest
                .chars()
                .take_while(|c| c.is_ascii_hexdigit() || *c == '-' || *c == '_')
                .map(|c| if c == '_' { '-' } else { c })
                .collect();
            // A UID is 36 characters: 32 hex digits and 4 dashes.
            (uid.len() == 36 && uid.matches('-').count() == 4).then_some(uid)
        })
    })
}

/// The pod UID of each of `pids` that runs in a pod, read under `proc_root` (`/proc`).
pub fn pods_of(pids: impl IntoIterator<Item = u32>, proc_root: &Path) -> BTreeMap<u32, String> {
    pids.into_iter()
        .filter_map(|pid| {
            let text =
                std::fs::read_to_string(proc_root.join(pid.to_string()).join("cgroup")).ok()?;
            Some((pid, pod_uid(&text)?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0f5d4c3b-2a19-4e8f-9d7c-6b5a4f3e2d1c";

    #[test]
    fn the_pod_is_found_under_either_cgroup_driver() {
        let cgroupfs = format!(
            "12:memory:/kubepods/besteffort/pod{UID}/4c5a1b2c3d4e\n11:cpu:/kubepods/besteffort/pod{UID}/4c5a1b2c3d4e\n"
        );
        assert_eq!(pod_uid(&cgroupfs).as_deref(), Some(UID));
        let systemd = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-4c5a.scope\n",
            UID.replace('-', "_")
        );
        assert_eq!(pod_uid(&systemd).as_deref(), Some(UID));
        assert_eq!(pod_uid("0::/system.slice/containerd.service\n"), None);
        assert_eq!(
            pod_uid("0::/user.slice/podman-1234.scope\n"),
            None,
            "not a UID"
        );
    }

    #[test]
    fn processes_are_read_from_proc() {
        let dir = std::env::temp_dir().join(format!("agent-pids-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("10")).expect("dir");
        std::fs::create_dir_all(dir.join("11")).expect("dir");
        std::fs::write(
            dir.join("10/cgroup"),
            format!("0::/kubepods/pod{UID}/abc\n"),
        )
        .expect("write");
        std::fs::write(dir.join("11/cgroup"), "0::/system.slice/sshd.service\n").expect("write");
        let found = pods_of([10, 11, 12], &dir);
        assert_eq!(found, BTreeMap::from([(10, UID.to_owned())]));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
