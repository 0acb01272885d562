//! What the preloaded library needs from the image it is preloaded into: only the C library,
//! the dynamic linker and libgcc_s (see build.rs). A new dependency (libm for a `powf`, say)
//! would stop every process of an image without it from starting.

use std::process::Command;

#[test]
fn the_library_needs_nothing_beyond_libc_and_libgcc_s() {
    let exe = std::env::current_exe().expect("test binary");
    let library = exe
        .ancestors()
        .skip(1)
        .take(2)
        .map(|dir| dir.join("libruntimekit_isolation.so"))
        .find(|p| p.exists())
        .expect("the library is built beside the test binary");
    let output = Command::new("readelf")
        .arg("-d")
        .arg(&library)
        .output()
        .expect("readelf (binutils, which the C compiler needs too)");
    let text = String::from_utf8_lossy(&output.stdout);
    let needed: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| l.split('[').nth(1)?.split(']').next())
        .collect();
    assert!(!needed.is_empty(), "{text}");
    for library in &needed {
        assert!(
            [
                "libc.so.6",
                "libgcc_s.so.1",
                "ld-linux-x86-64.so.2",
                "ld-linux-aarch64.so.1"
            ]
            .contains(library),
            "the preloaded library needs {library}: {needed:?}"
        );
    }
}
