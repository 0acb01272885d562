//! The ledger's home: the table mapped from `<dir>/ledger` (shared by the container's
//! processes), or one of this process's own when there is no folder or it cannot be used.
//! Every change happens under [`Ledger::locked`]: a mutex for this process's threads and an
//! exclusive `flock` of the file for the other processes.

use crate::ledger::{Process, Table};
use std::ffi::CString;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

/// The table and what guards it.
#[derive(Debug)]
pub struct Ledger {
    table: &'static Table,
    /// The mapped file's descriptor, locked for every change; `None` for a private table.
    file: Option<i32>,
    threads: Mutex<()>,
}

/// The ledger held locked.
#[derive(Debug)]
pub struct Locked<'a> {
    /// The table.
    pub table: &'static Table,
    file: Option<i32>,
    _threads: MutexGuard<'a, ()>,
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        if let Some(fd) = self.file {
            // SAFETY: the descriptor stays open for the life of the process.
            unsafe { libc::flock(fd, libc::LOCK_UN) };
        }
    }
}

impl Ledger {
    /// The shared ledger in `dir`, or a private one (with the reason on stderr) when `dir` is
    /// `None` or its file cannot be mapped.
    pub fn open(dir: Option<&Path>) -> Ledger {
        if let Some(dir) = dir {
            match map(&dir.join(runtimekit_isolation_files::LEDGER)) {
                Ok((table, fd)) if table.adopt() => {
                    return Ledger {
                        table,
                        file: Some(fd),
                        threads: Mutex::new(()),
                    };
                }
                Ok(_) => eprintln!(
                    "runtimekit-isolation: {}/ledger has another layout; this process keeps its own accounts",
                    dir.display()
                ),
                Err(error) => eprintln!(
                    "runtimekit-isolation: cannot share {}/ledger ({error}); this process keeps its own accounts",
                    dir.display()
                ),
            }
        }
        // SAFETY: every field of a table is an atomic integer, valid when zero.
        let table: &'static Table = Box::leak(unsafe { Box::<Table>::new_zeroed().assume_init() });
        table.adopt();
        Ledger {
            table,
            file: None,
            threads: Mutex::new(()),
        }
    }

    /// The table, locked against every other thread and process of the container.
    pub fn locked(&self) -> Locked<'_> {
        let guard = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(fd) = self.file {
            // SAFETY: an open descriptor; EINTR is retried.
            while unsafe { libc::flock(fd, libc::LOCK_EX) } != 0
                && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
            {
            }
        }
        Locked {
            table: self.table,
            file: self.file,
            _threads: guard,
        }
    }
}

/// Maps `path` (created, and sized for a table, if needed).
fn map(path: &Path) -> std::io::Result<(&'static Table, i32)> {
    let name = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| std::io::Error::other("a NUL in the path"))?;
    let size = size_of::<Table>();
    // SAFETY: a NUL-terminated path; the descriptor is kept for the mapping's life.
    let fd = unsafe {
        libc::open(
            name.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC,
            0o666,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // Growing a file another process is mapping only adds zeros, which it sees as free slots.
    // SAFETY: `stat` is plain data, filled by fstat.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: an open descriptor and a valid out-pointer.
    let sized = unsafe { libc::fstat(fd, &mut stat) } == 0
        && (usize::try_from(stat.st_size).unwrap_or(0) >= size
            // SAFETY: an open descriptor.
            || unsafe { libc::ftruncate(fd, i64::try_from(size).unwrap_or(i64::MAX)) } == 0);
    if !sized {
        let error = std::io::Error::last_os_error();
        // SAFETY: our descriptor.
        unsafe { libc::close(fd) };
        return Err(error);
    }
    // SAFETY: a shared mapping of `size` bytes of a file at least that long.
    let address = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if address == libc::MAP_FAILED {
        let error = std::io::Error::last_os_error();
        // SAFETY: our descriptor.
        unsafe { libc::close(fd) };
        return Err(error);
    }
    // SAFETY: the mapping is page-aligned, as large as a table, never unmapped, and every
    // field of a table is an atomic integer (valid for any bytes).
    Ok((unsafe { &*address.cast::<Table>() }, fd))
}

/// This process as the ledger knows it.
pub fn me() -> Process {
    let pid = i32::try_from(std::process::id()).unwrap_or(i32::MAX);
    Process {
        pid,
        start: started(pid).unwrap_or(0),
    }
}

/// Whether `process` still runs: its PID exists and started when the slot says.
pub fn alive(process: Process) -> bool {
    started(process.pid) == Some(process.start)
}

/// When the process `pid` started (field 22 of `/proc/<pid>/stat`), if it exists.
fn started(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; the fields after it start past its `)`.
    let rest = &stat[stat.rfind(')')? + 1..];
    let state = rest.split_whitespace().next()?;
    if state == "Z" || state == "X" {
        return None;
    }
    rest.split_whitespace().nth(19)?.parse().ok()
}
