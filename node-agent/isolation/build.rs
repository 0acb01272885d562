//! The library is preloaded into images it knows nothing of, and a glibc process whose preload
//! needs a library the image lacks does not start: so its arithmetic avoids libm, and the
//! unwinder's support code is linked in (`-static-libgcc`). `libgcc_s.so.1` itself, which Rust's
//! standard library names, stays a dependency; every image that runs CUDA code has it (libstdc++
//! needs it). `tests/dependencies.rs` holds the list.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-static-libgcc");
}
