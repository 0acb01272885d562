//! Writes the CRD YAML of every resource into `crds/`.
//!
//! `cargo run -p runtimekit-crds --bin crdgen` regenerates the files; the crate's tests fail when
//! the committed files differ from what this would write.

use std::path::Path;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    for crd in runtimekit_crds::all() {
        let path = dir.join(runtimekit_crds::file_name(&crd));
        std::fs::write(&path, runtimekit_crds::render(&crd)?)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
