//! The GPU checks (`e2e/gpu-check.sh`, `e2e/gpu-check-isolation.sh`) up to the hardware: they
//! build nothing, and on a machine without an NVIDIA GPU they fail plainly.

use runtimekit_e2e::workspace_binary::{workspace_binary, workspace_library};
use std::path::Path;
use std::process::Command;

/// The two checks.
const SCRIPTS: [&str; 2] = ["gpu-check.sh", "gpu-check-isolation.sh"];

fn script(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(name)
}

/// A folder of its own under the system's temporary folder, removed at the end.
struct Folder(std::path::PathBuf);

impl Folder {
    fn new(name: &str) -> Folder {
        let path = std::env::temp_dir().join(format!("gpu-check-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("folder");
        Folder(path)
    }
}

impl Drop for Folder {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn it_builds_nothing_and_says_what_to_build() {
    let empty = Folder::new("empty");
    for name in SCRIPTS {
        let out = Command::new("bash")
            .arg(script(name))
            .arg(&empty.0)
            .output()
            .expect("run");
        assert_eq!(out.status.code(), Some(2));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("./just gpu-check-build"), "{stderr}");
        assert!(
            std::fs::read_dir(&empty.0).expect("read").next().is_none(),
            "nothing built"
        );
    }
}

#[test]
fn without_a_gpu_it_fails_plainly() {
    let bins = Folder::new("bins");
    let layer = workspace_binary("runtimekit-resource-layer", "runtimekit-resource-layer")
        .expect("the resource layer");
    std::fs::copy(layer, bins.0.join("runtimekit-resource-layer")).expect("copy");
    let probe =
        workspace_binary("runtimekit-isolation", "runtimekit-cuda-probe").expect("the probe");
    std::fs::copy(probe, bins.0.join("runtimekit-cuda-probe")).expect("copy");
    let library = workspace_library("runtimekit-isolation", "libruntimekit_isolation.so")
        .expect("the isolation library");
    std::fs::copy(library, bins.0.join("libruntimekit_isolation.so")).expect("copy");
    if Path::new("/usr/bin/nvidia-smi").exists() {
        return;
    }
    for name in SCRIPTS {
        // No nvidia-smi on the path (none on this machine either).
        let out = Command::new("bash")
            .arg(script(name))
            .arg(&bins.0)
            .env("PATH", "/usr/bin:/bin")
            .output()
            .expect("run");
        assert_eq!(out.status.code(), Some(1), "{name}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("no NVIDIA GPU answers here"),
            "{name}: {stderr}"
        );
    }
}
