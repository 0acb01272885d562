use super::*;
use proptest::prelude::*;

const MAIN: &str = "/etc/containerd/config.toml";
const DROP_IN: &str = "/etc/containerd/conf.d/lj-runtime.toml";

/// A containerd 2.x configuration as a user's node has it: its own settings and comments.
const V3: &str = r#"# The node's own settings.
version = 3
root = "/var/lib/containerd"

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins."io.containerd.cri.v1.runtime"]
  enable_cdi = true
  [plugins."io.containerd.cri.v1.runtime".cni]
    conf_dir = "/etc/cni/net.d"
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
"#;

/// A containerd 1.7 configuration.
const V2: &str = r#"version = 2

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.10"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = true
"#;

fn handler() -> Handler {
    Handler {
        name: "lj-runtime".into(),
        binary: "/usr/local/bin/lj-runtime".into(),
        pod_annotations: vec!["aliyun.com/*".into()],
    }
}

fn current<'a>(main: &'a str, drop_in: Option<&'a str>) -> Current<'a> {
    Current {
        main_path: Path::new(MAIN),
        main,
        drop_in,
    }
}

fn drop_in() -> Layout {
    Layout::DropIn(DROP_IN.into())
}

/// The files after `edits` were written over `main` and `drop_in`.
fn applied(main: &str, drop_in: Option<&str>, edits: &Edits) -> (String, Option<String>) {
    let main = edits.main.clone().unwrap_or_else(|| main.to_owned());
    let drop_in = if edits.remove_drop_in {
        None
    } else {
        edits.drop_in.clone().or(drop_in.map(str::to_owned))
    };
    (main, drop_in)
}

/// The value at a dotted path of keys in a TOML text.
fn at<'d>(document: &'d DocumentMut, keys: &[&str]) -> Option<&'d Item> {
    keys.iter()
        .try_fold(document.as_item(), |item, key| item.get(key))
}

#[test]
fn containerd_2_gets_a_drop_in_and_an_import() {
    let edits = install(current(V3, None), 2, &drop_in(), &handler()).unwrap();
    let text = edits.drop_in.as_deref().expect("a drop-in");
    let document: DocumentMut = text.parse().unwrap();
    let table = [
        "plugins",
        "io.containerd.cri.v1.runtime",
        "containerd",
        "runtimes",
        "lj-runtime",
    ];
    let handler = at(&document, &table).expect("the handler's table");
    assert_eq!(
        handler["runtime_type"].as_str(),
        Some("io.containerd.runc.v2")
    );
    assert_eq!(
        handler["options"]["BinaryName"].as_str(),
        Some("/usr/local/bin/lj-runtime")
    );
    assert_eq!(
        handler["pod_annotations"]
            .as_array()
            .unwrap()
            .get(0)
            .unwrap()
            .as_str(),
        Some("aliyun.com/*")
    );
    assert_eq!(document["version"].as_integer(), Some(3));
    let main: DocumentMut = edits.main.as_deref().expect("the import").parse().unwrap();
    let imports: Vec<_> = main["imports"].as_array().unwrap().iter().collect();
    assert_eq!(imports.len(), 1);
    assert_eq!(imports[0].as_str(), Some(DROP_IN));
    // Every setting the node had stays, comments included.
    let edited = edits.main.unwrap();
    for line in V3.lines() {
        assert!(edited.contains(line), "{line:?} kept in:\n{edited}");
    }
}

#[test]
fn a_version_2_file_on_containerd_2_gets_a_version_2_drop_in() {
    let edits = install(current(V2, None), 2, &drop_in(), &handler()).unwrap();
    let document: DocumentMut = edits.drop_in.unwrap().parse().unwrap();
    assert_eq!(document["version"].as_integer(), Some(2));
    let keys = [
        "plugins",
        "io.containerd.grpc.v1.cri",
        "containerd",
        "runtimes",
        "lj-runtime",
    ];
    assert!(at(&document, &keys).is_some());
}

#[test]
fn imports_that_reach_the_drop_in_are_left_alone() {
    for imports in [
        r#"imports = ["/etc/containerd/conf.d/*.toml"]"#,
        r#"imports = ["conf.d/*.toml"]"#,
        r#"imports = ["/etc/containerd/conf.d/lj-runtime.toml", "/other.toml"]"#,
    ] {
        let main = format!("{imports}\n{V3}");
        let edits = install(current(&main, None), 2, &drop_in(), &handler()).unwrap();
        assert_eq!(edits.main, None, "{imports}");
        assert!(edits.drop_in.is_some());
    }
    // A glob does not reach into a deeper folder, as Go's filepath.Glob does not.
    let main = format!("imports = [\"/etc/*.toml\"]\n{V3}");
    let edits = install(current(&main, None), 2, &drop_in(), &handler()).unwrap();
    assert!(edits.main.is_some());
}

#[test]
fn a_second_install_changes_nothing() {
    for (main, major, layout) in [
        (V3, 2, drop_in()),
        (V2, 2, drop_in()),
        (V2, 1, Layout::Merged),
    ] {
        let first = install(current(main, None), major, &layout, &handler()).unwrap();
        assert!(first.changes());
        let (main, drop) = applied(main, None, &first);
        let second = install(current(&main, drop.as_deref()), major, &layout, &handler()).unwrap();
        assert_eq!(second, Edits::default(), "{main}");
    }
}

#[test]
fn a_changed_handler_is_rewritten() {
    let first = install(current(V2, None), 1, &Layout::Merged, &handler()).unwrap();
    let (main, _) = applied(V2, None, &first);
    let moved = Handler {
        binary: "/opt/runtimekit/lj-runtime".into(),
        ..handler()
    };
    let second = install(current(&main, None), 1, &Layout::Merged, &moved).unwrap();
    let text = second.main.expect("rewritten");
    assert!(text.contains("/opt/runtimekit/lj-runtime") && !text.contains("/usr/local/bin"));
    let first = install(current(V3, None), 2, &drop_in(), &handler()).unwrap();
    let (main, drop) = applied(V3, None, &first);
    let second = install(current(&main, drop.as_deref()), 2, &drop_in(), &moved).unwrap();
    assert_eq!(second.main, None);
    assert!(
        second
            .drop_in
            .unwrap()
            .contains("/opt/runtimekit/lj-runtime")
    );
}

#[test]
fn containerd_1_gets_the_table_merged_into_the_main_file() {
    let edits = install(current(V2, None), 1, &Layout::Merged, &handler()).unwrap();
    assert_eq!(edits.drop_in, None);
    let text = edits.main.unwrap();
    let document: DocumentMut = text.parse().unwrap();
    let keys = [
        "plugins",
        "io.containerd.grpc.v1.cri",
        "containerd",
        "runtimes",
    ];
    let runtimes = at(&document, &keys).unwrap();
    assert!(runtimes.get("runc").is_some() && runtimes.get("lj-runtime").is_some());
    assert_eq!(
        at(
            &document,
            &["plugins", "io.containerd.grpc.v1.cri", "sandbox_image"]
        )
        .and_then(Item::as_str),
        Some("registry.k8s.io/pause:3.10")
    );
    assert!(text.contains(MARK.trim()));
}

#[test]
fn uninstall_gives_back_the_text_the_node_had() {
    for (main, major, layout) in [(V3, 2, drop_in()), (V2, 1, Layout::Merged)] {
        let installed = install(current(main, None), major, &layout, &handler()).unwrap();
        let (edited, drop) = applied(main, None, &installed);
        let removed = uninstall(current(&edited, drop.as_deref()), &layout, &handler()).unwrap();
        assert_eq!(removed.remove_drop_in, drop.is_some());
        let (restored, left) = applied(&edited, drop.as_deref(), &removed);
        assert_eq!(restored, main);
        assert_eq!(left, None);
    }
}

#[test]
fn uninstall_leaves_what_the_installer_did_not_write() {
    // A handler the user wrote by hand (the manual setup of earlier releases) is theirs.
    let own = format!(
        "{V2}    [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.lj-runtime]\n      runtime_type = \"io.containerd.runc.v2\"\n"
    );
    let edits = uninstall(current(&own, None), &Layout::Merged, &handler()).unwrap();
    assert_eq!(edits, Edits::default());
    let main = format!("imports = [\"/etc/containerd/conf.d/*.toml\"]\n{V3}");
    let edits = uninstall(current(&main, Some("x")), &drop_in(), &handler()).unwrap();
    assert_eq!(edits.main, None);
    assert!(edits.remove_drop_in);
}

#[test]
fn what_it_cannot_read_is_left_untouched_with_the_reason() {
    let error = install(
        current("version = 3\n[plugins\n", None),
        2,
        &drop_in(),
        &handler(),
    )
    .unwrap_err();
    assert!(matches!(error, ConfigError::Unparsable { .. }), "{error}");
    assert!(error.to_string().contains("left untouched"));
    let error = install(current("root = \"/x\"\n", None), 2, &drop_in(), &handler()).unwrap_err();
    assert_eq!(
        error,
        ConfigError::UnknownVersion {
            path: MAIN.into(),
            found: 1,
            major: 2
        }
    );
    let error = install(current(V3, None), 1, &Layout::Merged, &handler()).unwrap_err();
    assert!(matches!(
        error,
        ConfigError::UnknownVersion {
            found: 3,
            major: 1,
            ..
        }
    ));
    let error = install(current(V3, None), 3, &drop_in(), &handler()).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("containerd 3.x is not one the installer knows")
    );
    let error = install(
        current("version = 3\nimports = \"x\"\n", None),
        2,
        &drop_in(),
        &handler(),
    )
    .unwrap_err();
    assert!(error.to_string().contains("`imports` is not a list"));
    let error = install(
        current("version = 2\nplugins = 1\n", None),
        1,
        &Layout::Merged,
        &handler(),
    )
    .unwrap_err();
    assert!(error.to_string().contains("not a table"), "{error}");
}

#[test]
fn the_layout_follows_the_major_version() {
    assert_eq!(layout(2, Path::new(DROP_IN)), drop_in());
    assert_eq!(layout(1, Path::new(DROP_IN)), Layout::Merged);
}

/// A user's configuration of one of the versions, from fragments a node may have.
fn configuration() -> impl Strategy<Value = (String, i64)> {
    let fragment = prop::sample::select(vec![
        "root = \"/var/lib/containerd\"\n",
        "# a comment of the user's\n",
        "oom_score = -999\n",
        "imports = [\"/etc/containerd/other.toml\"]\n",
        "imports = [ \"/a.toml\",  \"/b.toml\" ]   # two\n",
    ]);
    let section = prop::sample::select(vec![
        "[grpc]\n  address = \"/run/containerd/containerd.sock\"\n",
        "[debug]\n  level = \"info\"\n",
        "[plugins.\"{cri}\".containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n",
        "[plugins.\"{cri}\".containerd]\n  default_runtime_name = \"runc\"\n",
        "[plugins.\"{cri}\"]\n  enable_cdi = true\n",
    ]);
    (
        prop::collection::vec(fragment, 0..3),
        prop::collection::btree_set(section, 0..4),
        prop::sample::select(vec![2i64, 3]),
    )
        .prop_map(|(fragments, sections, version)| {
            let mut seen_imports = false;
            let mut text = format!("version = {version}\n");
            for fragment in fragments {
                let imports = fragment.starts_with("imports");
                if !(imports && seen_imports) {
                    text.push_str(fragment);
                }
                seen_imports |= imports;
            }
            for section in sections {
                text.push('\n');
                text.push_str(&section.replace("{cri}", cri_plugin(version)));
            }
            (text, version)
        })
        .prop_filter("valid TOML", |(text, _)| {
            text.parse::<DocumentMut>().is_ok()
        })
}

proptest! {
    /// On every configuration: install once changes something, twice nothing more, and
    /// uninstall gives the node back its text, on both layouts containerd's version allows.
    #[test]
    fn install_is_idempotent_and_uninstall_undoes_it((main, version) in configuration()) {
        let mut cases = vec![(2u32, drop_in())];
        if version == 2 {
            cases.push((1, Layout::Merged));
        }
        for (major, layout) in cases {
            let first = install(current(&main, None), major, &layout, &handler()).unwrap();
            prop_assert!(first.changes());
            let (edited, drop) = applied(&main, None, &first);
            prop_assert!(edited.parse::<DocumentMut>().is_ok());
            let again = install(current(&edited, drop.as_deref()), major, &layout, &handler())
                .unwrap();
            prop_assert_eq!(again, Edits::default());
            let removed = uninstall(current(&edited, drop.as_deref()), &layout, &handler())
                .unwrap();
            let (restored, left) = applied(&edited, drop.as_deref(), &removed);
            prop_assert_eq!(&restored, &main);
            prop_assert_eq!(left, None);
        }
    }
}

#[test]
fn the_handler_shares_the_default_runtimes_options() {
    // V2's default runtime, runc, uses the systemd cgroup driver: lj-runtime's containers must too.
    let edits = install(current(V2, None), 1, &Layout::Merged, &handler()).unwrap();
    let document: DocumentMut = edits.main.unwrap().parse().unwrap();
    let options = [
        "plugins",
        "io.containerd.grpc.v1.cri",
        "containerd",
        "runtimes",
        "lj-runtime",
        "options",
    ];
    let mut keys = options.to_vec();
    keys.push("SystemdCgroup");
    assert_eq!(at(&document, &keys).and_then(Item::as_bool), Some(true));
    keys.pop();
    keys.push("BinaryName");
    assert_eq!(
        at(&document, &keys).and_then(Item::as_str),
        Some("/usr/local/bin/lj-runtime")
    );
    // A default runtime named otherwise is the one followed; its BinaryName is not copied.
    let named = r#"version = 3
[plugins."io.containerd.cri.v1.runtime".containerd]
  default_runtime_name = "crun"
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.crun.options]
  BinaryName = "/usr/bin/crun"
  Root = "/run/crun"
"#;
    let edits = install(current(named, None), 2, &drop_in(), &handler()).unwrap();
    let document: DocumentMut = edits.drop_in.unwrap().parse().unwrap();
    let keys = [
        "plugins",
        "io.containerd.cri.v1.runtime",
        "containerd",
        "runtimes",
        "lj-runtime",
        "options",
    ];
    let options = at(&document, &keys).and_then(Item::as_table).unwrap();
    assert_eq!(
        options.get("Root").and_then(Item::as_str),
        Some("/run/crun")
    );
    assert_eq!(
        options.get("BinaryName").and_then(Item::as_str),
        Some("/usr/local/bin/lj-runtime")
    );
}

#[test]
fn a_reformatted_handler_table_of_ours_is_the_same() {
    let first = install(current(V2, None), 1, &Layout::Merged, &handler()).unwrap();
    let (main, _) = applied(V2, None, &first);
    // An administrator's tool re-indented the file and wrote the list on several lines.
    let reformatted = main
        .replace("  runtime_type", "runtime_type")
        .replace("[\"aliyun.com/*\"]", "[\n  \"aliyun.com/*\",\n]");
    assert_ne!(reformatted, main);
    let again = install(current(&reformatted, None), 1, &Layout::Merged, &handler()).unwrap();
    assert!(!again.changes(), "{again:?}");
}
