//! Restarting containerd so it reads a changed configuration. containerd cannot reload one:
//! it must exit and be started again. Its running containers do not notice, since each runs
//! under a shim of its own that outlives containerd.
//!
//! `Signal` ends the process that serves containerd's socket with SIGTERM and leaves starting
//! it again to its supervisor: containerd's own systemd unit, and Debian's, say
//! `Restart=always`. `None` restarts nothing; the installer then waits until someone has.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// How containerd is restarted after its configuration changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Restart {
    /// SIGTERM to the process serving containerd's socket; its supervisor starts it again.
    Signal,
    /// Nothing: the administrator restarts containerd, and the installer waits for it.
    None,
}

/// How long containerd may take to exit after SIGTERM.
const EXIT_TIMEOUT: Duration = Duration::from_secs(60);

/// Ends the containerd serving `socket` (a path as the host names it), found through the host's
/// `/proc` at `proc_root`; returns its PID once it has exited.
pub async fn signal(proc_root: &Path, socket: &Path) -> Result<i32, String> {
    let pid = socket_owner(proc_root, socket)?;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTERM,
    )
    .map_err(|e| format!("cannot signal containerd (PID {pid}): {e}"))?;
    let process = proc_root.join(pid.to_string());
    let deadline = tokio::time::Instant::now() + EXIT_TIMEOUT;
    while process.exists() {
        if tokio::time::Instant::now() > deadline {
            return Err(format!(
                "containerd (PID {pid}) did not exit within {} s of SIGTERM",
                EXIT_TIMEOUT.as_secs()
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(pid)
}

/// The PID of the process listening on the unix socket `socket`: the socket's inode from the
/// host network namespace's table (PID 1's), then the process holding it open.
pub fn socket_owner(proc_root: &Path, socket: &Path) -> Result<i32, String> {
    let table_path = proc_root.join("1/net/unix");
    let table = std::fs::read_to_string(&table_path)
        .map_err(|e| format!("cannot read {}: {e}", table_path.display()))?;
    let inodes = listening_inodes(&table, socket);
    if inodes.is_empty() {
        return Err(format!(
            "no process listens on {} (is containerd running?)",
            socket.display()
        ));
    }
    let processes = std::fs::read_dir(proc_root)
        .map_err(|e| format!("cannot read {}: {e}", proc_root.display()))?;
    for process in processes.filter_map(Result::ok) {
        let Some(pid) = process.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(process.path().join("fd")) else {
            continue;
        };
        let holds = fds.filter_map(Result::ok).any(|fd| {
            std::fs::read_link(fd.path())
                .ok()
                .and_then(|link| socket_inode(&link))
                .is_some_and(|inode| inodes.contains(&inode))
        });
        if holds {
            return Ok(pid);
        }
    }
    Err(format!(
        "cannot tell which process serves {}: its socket is listed, but no process readable here holds it (the installer needs the host's PID namespace and CAP_SYS_PTRACE)",
        socket.display()
    ))
}

/// The inodes of the listening sockets bound to `path` in a `/proc/net/unix` table.
pub fn listening_inodes(table: &str, path: &Path) -> Vec<u64> {
    /// `__SO_ACCEPTCON`: the socket listens.
    const ACCEPTING: u32 = 0x0001_0000;
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let flags = u32::from_str_radix(fields.get(3)?, 16).ok()?;
            let inode = fields.get(6)?.parse().ok()?;
            let bound = PathBuf::from(fields.get(7)?);
            (flags & ACCEPTING != 0 && bound == path).then_some(inode)
        })
        .collect()
}

/// The inode of a file descriptor's link target `socket:[12345]`.
pub fn socket_inode(link: &Path) -> Option<u64> {
    link.to_str()?
        .strip_prefix("socket:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "\
Num       RefCount Protocol Flags    Type St Inode Path
0000000000000000: 00000002 00000000 00010000 0001 01 4242 /run/containerd/containerd.sock
0000000000000000: 00000003 00000000 00000000 0001 03 4343 /run/containerd/containerd.sock
0000000000000000: 00000002 00000000 00010000 0001 01 4444 /run/containerd/containerd.sock.ttrpc
0000000000000000: 00000003 00000000 00000000 0001 03 4545
";

    #[test]
    fn the_listening_socket_is_found_by_its_path() {
        assert_eq!(
            listening_inodes(TABLE, Path::new("/run/containerd/containerd.sock")),
            vec![4242]
        );
        assert!(listening_inodes(TABLE, Path::new("/run/other.sock")).is_empty());
        assert!(listening_inodes("", Path::new("/run/containerd/containerd.sock")).is_empty());
    }

    #[test]
    fn socket_links_give_their_inode() {
        assert_eq!(socket_inode(Path::new("socket:[4242]")), Some(4242));
        assert_eq!(socket_inode(Path::new("pipe:[4242]")), None);
        assert_eq!(socket_inode(Path::new("/dev/null")), None);
    }

    #[test]
    fn the_owner_of_a_socket_this_process_listens_on_is_this_process() {
        let dir = std::env::temp_dir().join(format!("runtimekit-restart-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("listening.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        assert_eq!(
            socket_owner(Path::new("/proc"), &socket),
            Ok(i32::try_from(std::process::id()).unwrap())
        );
        assert!(socket_owner(Path::new("/proc"), &dir.join("nothing.sock")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
