//! Compiles the protos in pure Rust (protox), so no system `protoc` is needed.
//!
//! Each package goes to its own output folder and Rust module: the kubelet's device-plugin
//! (`v1beta1`), pod-resources (`v1`), DRA and plugin-registration packages have names that
//! must not meet.

use std::error::Error;
use std::path::{Path, PathBuf};

/// (output folder under OUT_DIR, proto file, include root)
const PACKAGES: [(&str, &str, &str); 5] = [
    (
        "resource",
        "runtimekit/resource/v1alpha1/resource.proto",
        ".",
    ),
    ("deviceplugin", "api.proto", "kubelet/deviceplugin/v1beta1"),
    ("podresources", "api.proto", "kubelet/podresources/v1"),
    ("dra", "api.proto", "kubelet/dra/v1"),
    (
        "pluginregistration",
        "api.proto",
        "kubelet/pluginregistration/v1",
    ),
];

fn main() -> Result<(), Box<dyn Error>> {
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    for (folder, file, include) in PACKAGES {
        println!(
            "cargo:rerun-if-changed={}",
            Path::new(include).join(file).display()
        );
        let fds = protox::compile([file], [include])?;
        let out = out_dir.join(folder);
        std::fs::create_dir_all(&out)?;
        tonic_prost_build::configure()
            .build_client(true)
            .build_server(true)
            .out_dir(&out)
            .compile_fds(fds)?;
    }
    Ok(())
}
