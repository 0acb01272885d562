//! The processes a test starts: started with their output in a log, recorded in the run's PID
//! file, and stopped by PID.

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a test's process may take to exit after SIGTERM before it is killed.
const PROCESS_STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// A process a test started: stopped by PID when the test ends, its log printed when the test
/// fails, and recorded in the run's PID file so an interrupted or killed run stops it too.
#[derive(Clone)]
pub struct TestProcess {
    name: String,
    pid: i32,
    log: PathBuf,
    child: Arc<Mutex<std::process::Child>>,
}

impl std::fmt::Debug for TestProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestProcess")
            .field("name", &self.name)
            .field("pid", &self.pid)
            .field("log", &self.log)
            .finish_non_exhaustive()
    }
}

impl TestProcess {
    /// Starts `program` with `args` and `env`, its output in `log`, and records it in the PID
    /// file in `processes_dir`.
    pub(super) fn start(
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(&str, &str)],
        log: PathBuf,
        processes_dir: &Path,
    ) -> Result<TestProcess> {
        use std::io::Write;
        let file = std::fs::File::create(&log)?;
        let child = std::process::Command::new(program)
            .args(args)
            .envs(env.iter().copied())
            .stdin(std::process::Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .with_context(|| format!("starting {}", program.display()))?;
        let pid = i32::try_from(child.id()).context("pid out of range")?;
        std::fs::create_dir_all(processes_dir)?;
        let mut pids = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(processes_dir.join(crate::cluster::PID_FILE))?;
        let exe = std::fs::canonicalize(program).unwrap_or_else(|_| program.to_owned());
        writeln!(pids, "{name} {pid} {}", exe.display())?;
        Ok(TestProcess {
            name: name.to_owned(),
            pid,
            log,
            child: Arc::new(Mutex::new(child)),
        })
    }

    /// The name it was started under.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its PID.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Its log (stdout and stderr).
    pub fn log(&self) -> PathBuf {
        self.log.clone()
    }

    /// Whether it still runs.
    pub fn running(&self) -> bool {
        self.child
            .lock()
            .map(|mut c| matches!(c.try_wait(), Ok(None)))
            .unwrap_or(false)
    }

    /// Stops it: SIGTERM, then SIGKILL after a grace period. Stopping a stopped process does
    /// nothing.
    pub fn stop(&self) {
        self.signal(nix::sys::signal::Signal::SIGTERM);
    }

    /// Kills it at once with SIGKILL, as a crash would.
    pub fn kill(&self) {
        self.signal(nix::sys::signal::Signal::SIGKILL);
    }

    fn signal(&self, signal: nix::sys::signal::Signal) {
        use nix::sys::signal::{Signal, kill};
        use nix::unistd::Pid;
        let Ok(mut child) = self.child.lock() else {
            return;
        };
        if !matches!(child.try_wait(), Ok(None)) {
            return;
        }
        let _ = kill(Pid::from_raw(self.pid), signal);
        let deadline = Instant::now() + PROCESS_STOP_TIMEOUT;
        loop {
            if !matches!(child.try_wait(), Ok(None)) {
                return;
            }
            if Instant::now() > deadline {
                let _ = kill(Pid::from_raw(self.pid), Signal::SIGKILL);
                let _ = child.wait();
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The last `lines` lines of its log.
    pub(super) fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}
