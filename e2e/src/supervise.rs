//! A process kept running as systemd's `Restart=always` keeps containerd: started again
//! whenever it exits, until the supervisor itself is stopped (it then stops the process and
//! waits for it). The node installer restarts containerd by ending it, as on a user's node.

use std::path::{Path, PathBuf};

/// The argument before the supervised program's path.
const MARK: &str = "supervise";

/// The supervisor: `sh -c SCRIPT supervise PROGRAM ARGS...`.
const SCRIPT: &str = r#"trap 'kill -TERM "$child" 2>/dev/null; wait "$child"; exit 0' TERM INT
while :; do "$@" & child=$!; wait "$child"; sleep 0.5; done"#;

/// The program (`/bin/sh`) and arguments that run `program` with `args` under the supervisor.
pub fn supervised(program: &Path, args: &[String]) -> (&'static Path, Vec<String>) {
    let mut all = vec![
        "-c".to_owned(),
        SCRIPT.to_owned(),
        MARK.to_owned(),
        program.display().to_string(),
    ];
    all.extend(args.iter().cloned());
    (Path::new("/bin/sh"), all)
}

/// The program the supervisor `pid` keeps running, from its command line.
pub fn program_of(pid: i32) -> Option<PathBuf> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    program_in(&args)
}

/// The supervised program in a supervisor's arguments (`sh -c SCRIPT supervise PROGRAM ...`).
fn program_in(args: &[String]) -> Option<PathBuf> {
    let at = args.iter().position(|a| a == MARK)?;
    args.get(at + 1).map(PathBuf::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_supervised_program_is_read_back_from_the_arguments() {
        let (shell, args) = supervised(Path::new("/opt/containerd"), &["--config=c".into()]);
        let mut all = vec![shell.display().to_string()];
        all.extend(args);
        assert_eq!(program_in(&all), Some(PathBuf::from("/opt/containerd")));
        assert_eq!(program_in(&["sh".into(), "-c".into()]), None);
    }
}
