//! Links the fake driver with `-Bsymbolic-functions`, as the real one behaves: its own calls and
//! the addresses its `cuGetProcAddress` hands out are its own functions, never the definitions a
//! preloaded library puts in front of its exported names.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic-functions");
}
