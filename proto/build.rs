//! Compiles the protos in pure Rust (protox), so no system `protoc` is needed.
//!
//! Each package goes to its own output folder and Rust module: the kubelet's device-plugin
//! (`v1beta1`), pod-resources (`v1`), DRA, plugin-registration and CRI packages have names
//! that must not meet.

use std::error::Error;
use std::path::{Path, PathBuf};

/// (output folder under OUT_DIR, proto file, include root, whether a server is generated)
const PACKAGES: [(&str, &str, &str, bool); 6] = [
    (
        "resource",
        "runtimekit/resource/v1alpha1/resource.proto",
        ".",
        true,
    ),
    (
        "deviceplugin",
        "api.proto",
        "kubelet/deviceplugin/v1beta1",
        true,
    ),
    ("podresources", "api.proto", "kubelet/podresources/v1", true),
    ("dra", "api.proto", "kubelet/dra/v1", true),
    (
        "pluginregistration",
        "api.proto",
        "kubelet/pluginregistration/v1",
        true,
    ),
    // The node installer only asks the container runtime.
    ("cri", "api.proto", "cri/runtime/v1", false),
];

fn main() -> Result<(), Box<dyn Error>> {
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    for (folder, file, include, server) in PACKAGES {
        println!(
            "cargo:rerun-if-changed={}",
            Path::new(include).join(file).display()
        );
        let fds = protox::compile([file], [include])?;
        let out = out_dir.join(folder);
        std::fs::create_dir_all(&out)?;
        tonic_prost_build::configure()
            .build_client(true)
            .build_server(server)
            .out_dir(&out)
            .compile_fds(fds)?;
    }
    Ok(())
}
