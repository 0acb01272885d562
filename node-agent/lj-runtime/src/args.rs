//! runc's command line as the shim passes it: global options, the command, its options and the
//! container ID. Only what lj-runtime needs is read; the line is handed on to runc unchanged.

/// Global options of runc that take a value.
const GLOBAL_WITH_VALUE: [&str; 4] = ["--root", "--log", "--log-format", "--criu"];

/// What lj-runtime reads from runc's command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuncArgs {
    /// The command (`create`, `start`, `delete`, ...), if there is one.
    pub command: Option<String>,
    /// `--bundle` of `create`/`run` (the working folder when absent).
    pub bundle: Option<String>,
    /// The global `--log` file, where runc and the shim keep the error a create fails with.
    pub log: Option<String>,
    /// The global `--log-format` (`json` from containerd's shim).
    pub log_format: Option<String>,
    /// The container ID: the command's last argument that is not an option or its value.
    pub id: Option<String>,
}

/// Options of `create`, `run` and `exec` that take a value (`--bundle` is read on its own).
const COMMAND_WITH_VALUE: [&str; 5] = [
    "--console-socket",
    "--pid-file",
    "--preserve-fds",
    "--process",
    "--cwd",
];

/// The value of `--name VALUE` or `--name=VALUE` at `args[i]`, with how many items it took.
fn value_of<'a>(args: &'a [String], i: usize, names: &[&str]) -> Option<(&'a str, usize)> {
    let arg = args.get(i)?;
    names.iter().find_map(|name| {
        if arg == name {
            args.get(i + 1).map(|v| (v.as_str(), 2))
        } else {
            arg.strip_prefix(name)
                .and_then(|rest| rest.strip_prefix('='))
                .map(|v| (v, 1))
        }
    })
}

impl RuncArgs {
    /// Reads runc's arguments (without the program name).
    pub fn parse(args: &[String]) -> RuncArgs {
        let mut parsed = RuncArgs {
            command: None,
            bundle: None,
            log: None,
            log_format: None,
            id: None,
        };
        let mut i = 0;
        while i < args.len() {
            if parsed.command.is_none() {
                if let Some((value, used)) = value_of(args, i, &GLOBAL_WITH_VALUE) {
                    if args[i].starts_with("--log-format") {
                        parsed.log_format = Some(value.to_owned());
                    } else if args[i].starts_with("--log") {
                        parsed.log = Some(value.to_owned());
                    }
                    i += used;
                    continue;
                }
                if !args[i].starts_with('-') {
                    parsed.command = Some(args[i].clone());
                }
                i += 1;
                continue;
            }
            if let Some((value, used)) = value_of(args, i, &["--bundle", "-b"]) {
                parsed.bundle = Some(value.to_owned());
                i += used;
                continue;
            }
            if let Some((_, used)) = value_of(args, i, &COMMAND_WITH_VALUE) {
                i += used;
                continue;
            }
            if !args[i].starts_with('-') {
                parsed.id = Some(args[i].clone());
            }
            i += 1;
        }
        parsed
    }

    /// Whether this command creates a container from a bundle (`create`, or `run`).
    pub fn creates(&self) -> bool {
        matches!(self.command.as_deref(), Some("create" | "run"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> RuncArgs {
        let args: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
        RuncArgs::parse(&args)
    }

    #[test]
    fn reads_the_shims_create_line() {
        let args = parse(
            "--root /run/runc/k8s.io --log /run/x/log.json --log-format json create --bundle /run/b --pid-file /run/b/init.pid abc",
        );
        assert_eq!(args.command.as_deref(), Some("create"));
        assert!(args.creates());
        assert_eq!(args.bundle.as_deref(), Some("/run/b"));
        assert_eq!(args.log.as_deref(), Some("/run/x/log.json"));
        assert_eq!(args.log_format.as_deref(), Some("json"));
        assert_eq!(args.id.as_deref(), Some("abc"));
        let delete = parse("--root /r --log /l delete --force abc");
        assert_eq!(
            (delete.command.as_deref(), delete.id.as_deref()),
            (Some("delete"), Some("abc"))
        );
        let piped = parse("create --console-socket /s --pid-file /p -b /b --preserve-fds 2 xyz");
        assert_eq!(piped.id.as_deref(), Some("xyz"));
    }

    #[test]
    fn reads_equals_forms_and_short_bundle_and_leaves_other_commands() {
        let args = parse("--log=/l --systemd-cgroup create -b=/b id");
        assert_eq!(args.bundle.as_deref(), Some("/b"));
        assert_eq!(args.log.as_deref(), Some("/l"));
        let start = parse("--root /r start id");
        assert_eq!(start.command.as_deref(), Some("start"));
        assert!(!start.creates());
        assert_eq!(parse("--version").command, None);
    }
}
