//! `lj-runtime`: see the library. Called by containerd's runc shim with runc's command line; a
//! create that cannot give the container what its pod was allocated fails with a message the
//! shim reports (the runtime log's last error), which `kubectl describe pod` then shows.

use runtimekit_injection::hardware::Hardware;
use runtimekit_injection::host::{self, IsolationFolder};
use runtimekit_injection::isolation::{self, Enforcement};
use runtimekit_lj_runtime::args::RuncArgs;
use runtimekit_lj_runtime::config::{DEFAULT_PATH, RuntimeConfig};
use runtimekit_lj_runtime::hardware;
use runtimekit_lj_runtime::inject::{self, Plan};
use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // Its own version first, then runc's: which release a node runs is one command away.
    if args.first().map(String::as_str) == Some("--version") {
        println!("lj-runtime version {}", env!("CARGO_PKG_VERSION"));
    }
    let runc = RuncArgs::parse(&args);
    let path = std::env::var_os("LJ_RUNTIME_CONFIG")
        .map_or_else(|| PathBuf::from(DEFAULT_PATH), PathBuf::from);
    let config = match RuntimeConfig::load(&path) {
        Ok(c) => c,
        Err(message) => return fail(&runc, &message),
    };
    if runc.creates()
        && let Err(message) = prepare(&runc, &config)
    {
        return fail(&runc, &message);
    }
    if runc.command.as_deref() == Some("delete") {
        forget(&runc, &config);
    }
    let program = match CString::new(config.runc.as_os_str().as_encoded_bytes()) {
        Ok(p) => p,
        Err(e) => return fail(&runc, &format!("runc path: {e}")),
    };
    let mut argv = vec![program.clone()];
    for arg in &args {
        match CString::new(arg.as_bytes()) {
            Ok(a) => argv.push(a),
            Err(e) => return fail(&runc, &format!("argument {arg:?}: {e}")),
        }
    }
    let error = nix::unistd::execvp(&program, &argv);
    fail(
        &runc,
        &format!("cannot run {}: {error:?}", config.runc.display()),
    )
}

/// Rewrites the bundle's `config.json` for the container being created.
fn prepare(runc: &RuncArgs, config: &RuntimeConfig) -> Result<(), String> {
    let bundle = runc.bundle.as_ref().map_or_else(
        || std::env::current_dir().map_err(|e| e.to_string()),
        |b| Ok(PathBuf::from(b)),
    )?;
    let file = bundle.join("config.json");
    let text =
        std::fs::read_to_string(&file).map_err(|e| format!("reading {}: {e}", file.display()))?;
    let mut spec: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", file.display()))?;
    let plan = inject::plan(&spec, config).map_err(|e| e.to_string())?;
    let mut given = match &plan {
        Plan::Leave => return Ok(()),
        Plan::Nothing => inject::given(&plan, &Hardware::default()),
        Plan::Give { .. } => inject::given(&plan, &hardware_for(&plan, config)?),
    }
    .map_err(|e| e.to_string())?;
    if plan
        .grant()
        .map_err(|e| e.to_string())?
        .is_some_and(|g| g.needs_enforcing())
    {
        given.enforcement = Some(enforcement(runc, config, &bundle, &spec)?);
    }
    inject::apply(&mut spec, &given, &host::stat).map_err(|e| e.to_string())?;
    let written = bundle.join("config.json.lj-runtime");
    std::fs::write(&written, spec.to_string())
        .and_then(|()| std::fs::rename(&written, &file))
        .map_err(|e| format!("writing {}: {e}", file.display()))
}

/// The container's folder under the isolation state folder.
fn state_folder(runc: &RuncArgs, config: &RuntimeConfig) -> Result<PathBuf, String> {
    match runc.id.as_deref() {
        Some(id) if isolation::usable_id(id) => Ok(config.isolation_state_dir.join(id)),
        other => Err(format!(
            "runc's command line names no usable container ID ({other:?})"
        )),
    }
}

/// Makes the container's isolation folder (the image's own preload entries kept) on the host.
fn enforcement(
    runc: &RuncArgs,
    config: &RuntimeConfig,
    bundle: &Path,
    spec: &serde_json::Value,
) -> Result<Enforcement, String> {
    let root = spec
        .get("root")
        .and_then(|r| r.get("path"))
        .and_then(serde_json::Value::as_str)
        .unwrap_or("rootfs");
    let image_preload =
        std::fs::read_to_string(bundle.join(root).join("etc/ld.so.preload")).unwrap_or_default();
    host::make_isolation_folder(&IsolationFolder {
        library: &config.isolation_library,
        folder: state_folder(runc, config)?,
        image_preload: &image_preload,
        core_policy: config.core_policy.variable(),
    })
}

/// Removes a deleted container's isolation folder, if it had one.
fn forget(runc: &RuncArgs, config: &RuntimeConfig) {
    if let Ok(folder) = state_folder(runc, config)
        && folder.exists()
        && let Err(error) = std::fs::remove_dir_all(&folder)
    {
        eprintln!("lj-runtime: removing {}: {error}", folder.display());
    }
}

/// The node's hardware once every MIG instance the plan needs exists, or as it is when the
/// wait is over.
fn hardware_for(plan: &Plan, config: &RuntimeConfig) -> Result<Hardware, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let keys = plan.instance_keys();
    let deadline = Instant::now() + config.instance_wait();
    loop {
        let hardware = runtime.block_on(hardware::query(&config.resource_layer_socket))?;
        if keys.iter().all(|k| hardware.instances.contains_key(k)) || Instant::now() > deadline {
            return Ok(hardware);
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Reports `message` where the shim looks (the runtime log, as runc writes its errors) and on
/// stderr, and fails.
fn fail(runc: &RuncArgs, message: &str) -> ExitCode {
    eprintln!("lj-runtime: {message}");
    if let Some(log) = &runc.log {
        use std::io::Write;
        let line = if runc.log_format.as_deref() == Some("json") {
            serde_json::json!({"level": "error", "msg": format!("lj-runtime: {message}")})
                .to_string()
        } else {
            format!("lj-runtime: {message}")
        };
        if let Ok(mut file) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
        {
            let _ = writeln!(file, "{line}");
        }
    }
    ExitCode::FAILURE
}
