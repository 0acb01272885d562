//! The Dockerfiles users build with and e2e/scripts/build-images.sh, which builds the same
//! images here without a container engine, must ship the same binaries at the same paths, from
//! the same kind of build (static or not), as the same user.

use std::collections::BTreeSet;
use std::path::Path;

fn read(path: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    // A file that cannot be read reads as empty, which the test then reports.
    std::fs::read_to_string(root.join(path)).unwrap_or_default()
}

/// (binary, image path, static) of every binary a Dockerfile's last stage copies in.
fn dockerfile_binaries(text: &str) -> BTreeSet<(String, String, bool)> {
    text.lines()
        .filter(|l| l.starts_with("COPY --from=build /src/target/"))
        .map(|l| {
            let mut words = l.split_whitespace().skip(2);
            let from = words.next().unwrap_or_default();
            let to = words.next().unwrap_or_default();
            let binary = from.rsplit('/').next().unwrap_or_default();
            (
                binary.to_owned(),
                to.to_owned(),
                from.contains("x86_64-unknown-linux-gnu"),
            )
        })
        .collect()
}

/// The same, from the script's `product` call for `image`.
fn script_binaries(script: &str, image: &str) -> BTreeSet<(String, String, bool)> {
    let case = script
        .split(&format!("    {image})"))
        .nth(1)
        .and_then(|rest| rest.split(";;").next())
        .unwrap_or_default();
    case.split('"')
        .filter(|w| w.contains(":/usr/local/bin/") || w.contains(":/usr/local/lib/runtimekit/"))
        .map(|w| {
            let (from, to) = w.split_once(':').unwrap_or_default();
            let binary = from.rsplit('/').next().unwrap_or_default();
            (
                binary.to_owned(),
                to.to_owned(),
                from.starts_with("$release/"),
            )
        })
        .collect()
}

#[test]
fn dockerfiles_ship_what_the_script_ships() {
    let script = read("e2e/scripts/build-images.sh");
    assert!(
        script.contains("product "),
        "the script defines the product images"
    );
    for (image, dockerfile, user) in [
        ("operator", "operator/Dockerfile", "65532:65532"),
        ("node-agent", "node-agent/Dockerfile", "0:0"),
    ] {
        let text = read(dockerfile);
        let ours = dockerfile_binaries(&text);
        assert!(!ours.is_empty(), "{dockerfile} copies no binary");
        assert_eq!(
            ours,
            script_binaries(&script, image),
            "{dockerfile} against the script"
        );
        assert!(
            text.contains(&format!("USER {user}")),
            "{dockerfile} runs as {user}"
        );
        assert!(
            script.contains(&format!("product {image} {user} ")),
            "the script's {image} runs as {user}"
        );
    }
}
