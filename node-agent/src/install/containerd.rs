//! The `lj-runtime` handler in containerd's configuration, as edits of its text: no I/O.
//!
//! containerd 2.x merges an imported file into the main configuration key by key, so the
//! handler goes into a drop-in of its own and the main file is touched only when its `imports`
//! do not already reach the drop-in. containerd 1.6 and 1.7 replace a whole plugin section
//! with an imported one (containerd/containerd#5837), so a drop-in would hide every other CRI
//! setting: there the handler's table is merged into the main file, marked as ours. Either way
//! uninstalling gives back the text the node had, and installing twice changes nothing the
//! second time (so containerd is restarted only when something changed).

use std::path::{Path, PathBuf};
use thiserror::Error;
use toml_edit::{Array, DocumentMut, Item, Table, value};

/// The comment that marks the handler table the installer merged into a main configuration.
const MARK: &str = "# Managed by the runtimekit node agent (removed when it is uninstalled).\n";

/// The handler containerd is given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handler {
    /// Its name, the RuntimeClass's `handler` (`lj-runtime`).
    pub name: String,
    /// The `lj-runtime` binary on the host.
    pub binary: PathBuf,
    /// The pod annotations passed into the OCI spec (`<prefix>/*`).
    pub pod_annotations: Vec<String>,
}

/// Where the handler lives for a containerd major version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// A drop-in file of its own (containerd 2.x).
    DropIn(PathBuf),
    /// A table merged into the main configuration (containerd 1.x).
    Merged,
}

/// Why a configuration is left untouched.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error(
        "containerd's configuration {path} cannot be read as TOML ({message}); it is left untouched"
    )]
    Unparsable { path: PathBuf, message: String },
    #[error(
        "containerd's configuration {path} has config version {found}, which containerd {major}.x does not read as the installer knows (it writes version 2 for containerd 1.6 and 1.7, 2 or 3 for containerd 2.x); it is left untouched"
    )]
    UnknownVersion {
        path: PathBuf,
        found: i64,
        major: u32,
    },
    #[error(
        "containerd {major}.x is not one the installer knows (1.6, 1.7 and 2.x); its configuration {path} is left untouched"
    )]
    UnknownContainerd { path: PathBuf, major: u32 },
    #[error("containerd's configuration {path}: {what}; it is left untouched")]
    Unexpected { path: PathBuf, what: String },
}

/// What to write: each field is the new text of a file, or `None` where it stays as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Edits {
    /// The main configuration's new text.
    pub main: Option<String>,
    /// The drop-in's new text (install).
    pub drop_in: Option<String>,
    /// Whether the drop-in file is to be removed.
    pub remove_drop_in: bool,
}

impl Edits {
    /// Whether anything changes (and containerd must be restarted to see it).
    pub fn changes(&self) -> bool {
        self.main.is_some() || self.drop_in.is_some() || self.remove_drop_in
    }
}

/// The files as they are on the node.
#[derive(Debug, Clone, Copy)]
pub struct Current<'a> {
    /// The main configuration's path (imports resolve against its folder).
    pub main_path: &'a Path,
    /// Its text.
    pub main: &'a str,
    /// The drop-in's text, if the file exists.
    pub drop_in: Option<&'a str>,
}

/// The layout the installer uses for containerd `major` with its drop-in at `drop_in`.
pub fn layout(major: u32, drop_in: &Path) -> Layout {
    if major >= 2 {
        Layout::DropIn(drop_in.to_owned())
    } else {
        Layout::Merged
    }
}

/// The edits that give containerd `major` the handler.
pub fn install(
    current: Current<'_>,
    major: u32,
    layout: &Layout,
    handler: &Handler,
) -> Result<Edits, ConfigError> {
    let mut document = parse(current.main_path, current.main)?;
    let version = config_version(current.main_path, &document, major)?;
    match layout {
        Layout::DropIn(path) => {
            let text = drop_in_text(version, handler, default_options(&document, version));
            let mut edits = Edits {
                drop_in: (current.drop_in != Some(text.as_str())).then_some(text),
                ..Edits::default()
            };
            if !imported(current.main_path, &document, path)? {
                let imports = imports_mut(current.main_path, &mut document)?;
                imports.push(path.display().to_string());
                edits.main = Some(document.to_string());
            }
            Ok(edits)
        }
        Layout::Merged => {
            let wanted = handler_table(handler, default_options(&document, version));
            let runtimes = runtimes_mut(current.main_path, &mut document, version)?;
            let same = runtimes
                .get(&handler.name)
                .and_then(Item::as_table)
                .is_some_and(|t| same_handler(t, &wanted));
            if same {
                return Ok(Edits::default());
            }
            runtimes.insert(&handler.name, Item::Table(wanted));
            Ok(Edits {
                main: Some(document.to_string()),
                ..Edits::default()
            })
        }
    }
}

/// The edits that take the handler away again: the drop-in and the import the installer added,
/// or the table it merged. What the installer did not write stays.
pub fn uninstall(
    current: Current<'_>,
    layout: &Layout,
    handler: &Handler,
) -> Result<Edits, ConfigError> {
    let mut document = parse(current.main_path, current.main)?;
    let mut edits = Edits {
        remove_drop_in: current.drop_in.is_some(),
        ..Edits::default()
    };
    match layout {
        Layout::DropIn(path) => {
            let ours = path.display().to_string();
            let Some(imports) = document.get_mut("imports").and_then(Item::as_array_mut) else {
                return Ok(edits);
            };
            let before = imports.len();
            imports.retain(|v| v.as_str() != Some(ours.as_str()));
            if imports.len() != before {
                if imports.is_empty() {
                    document.remove("imports");
                }
                edits.main = Some(document.to_string());
            }
        }
        Layout::Merged => {
            let Some(version) = declared_version(&document) else {
                return Ok(edits);
            };
            let runtimes = runtimes_path(version)
                .iter()
                .try_fold(document.as_item_mut(), |item, key| item.get_mut(key))
                .and_then(Item::as_table_like_mut);
            if let Some(runtimes) = runtimes {
                let ours = runtimes
                    .get(&handler.name)
                    .and_then(Item::as_table)
                    .is_some_and(marked);
                if ours {
                    runtimes.remove(&handler.name);
                    edits.main = Some(document.to_string());
                }
            }
        }
    }
    Ok(edits)
}

fn parse(path: &Path, text: &str) -> Result<DocumentMut, ConfigError> {
    text.parse()
        .map_err(|e: toml_edit::TomlError| ConfigError::Unparsable {
            path: path.to_owned(),
            message: e.message().trim().to_owned(),
        })
}

/// The configuration's `version`, checked against what containerd `major` reads. A file with
/// none is version 1 (containerd 1.4 and older), which the installer does not write.
fn config_version(path: &Path, document: &DocumentMut, major: u32) -> Result<i64, ConfigError> {
    let found = declared_version(document).ok_or_else(|| ConfigError::Unexpected {
        path: path.to_owned(),
        what: "its `version` is not a number".into(),
    })?;
    let known: &[i64] = match major {
        1 => &[2],
        2 => &[2, 3],
        _ => {
            return Err(ConfigError::UnknownContainerd {
                path: path.to_owned(),
                major,
            });
        }
    };
    if known.contains(&found) {
        Ok(found)
    } else {
        Err(ConfigError::UnknownVersion {
            path: path.to_owned(),
            found,
            major,
        })
    }
}

/// The `version` a configuration declares (1 when it declares none); `None` when it is not a
/// number.
fn declared_version(document: &DocumentMut) -> Option<i64> {
    document.get("version").map_or(Some(1), Item::as_integer)
}

/// The keys of the CRI plugin's `containerd.runtimes` table in a config version.
fn runtimes_path(version: i64) -> [&'static str; 4] {
    ["plugins", cri_plugin(version), "containerd", "runtimes"]
}

/// The CRI plugin whose runtimes a config version lists.
fn cri_plugin(version: i64) -> &'static str {
    if version >= 3 {
        "io.containerd.cri.v1.runtime"
    } else {
        "io.containerd.grpc.v1.cri"
    }
}

/// The options of the configuration's default runtime (`default_runtime_name`, runc when
/// unset), which the handler shares: a node whose kubelet uses the systemd cgroup driver has
/// `SystemdCgroup = true` there, and containers of the handler must match it.
fn default_options(document: &DocumentMut, version: i64) -> Option<Table> {
    let runtimes = runtimes_path(version);
    let containerd = runtimes[..3]
        .iter()
        .try_fold(document.as_item(), |item, key| item.get(key))?;
    let default = containerd
        .get("default_runtime_name")
        .and_then(Item::as_str)
        .unwrap_or("runc");
    let options = containerd.get("runtimes")?.get(default)?.get("options")?;
    let mut table = Table::new();
    for (key, item) in options.as_table_like()?.iter() {
        if key != "BinaryName" {
            table.insert(key, item.clone());
        }
    }
    Some(table)
}

/// The handler's table: `runtime_type`, `pod_annotations`, and the default runtime's
/// `options` with `BinaryName` set to lj-runtime.
fn handler_table(handler: &Handler, options: Option<Table>) -> Table {
    let mut table = Table::new();
    table.decor_mut().set_prefix(MARK);
    table.insert("runtime_type", value("io.containerd.runc.v2"));
    let annotations: Array = handler.pod_annotations.iter().map(String::as_str).collect();
    table.insert("pod_annotations", value(annotations));
    let mut options = options.unwrap_or_default();
    for (_, item) in options.iter_mut() {
        if let Some(value) = item.as_value_mut() {
            value.decor_mut().clear();
        }
    }
    options.decor_mut().clear();
    options.insert("BinaryName", value(handler.binary.display().to_string()));
    table.insert("options", Item::Table(options));
    table
}

fn marked(table: &Table) -> bool {
    table
        .decor()
        .prefix()
        .and_then(|p| p.as_str())
        .is_some_and(|p| p.contains(MARK.trim()))
}

/// Whether an existing table is ours and says what `wanted` says, key by key (its layout and
/// comments aside).
fn same_handler(existing: &Table, wanted: &Table) -> bool {
    marked(existing) && same_table(existing, wanted)
}

fn same_table(a: &dyn toml_edit::TableLike, b: &dyn toml_edit::TableLike) -> bool {
    a.len() == b.len()
        && a.iter().all(|(key, item)| {
            b.get(key).is_some_and(|other| match (item, other) {
                (Item::Value(x), Item::Value(y)) => same_value(x, y),
                _ => match (item.as_table_like(), other.as_table_like()) {
                    (Some(x), Some(y)) => same_table(x, y),
                    _ => false,
                },
            })
        })
}

fn same_value(a: &toml_edit::Value, b: &toml_edit::Value) -> bool {
    use toml_edit::Value;
    match (a, b) {
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y.iter()).all(|(x, y)| same_value(x, y))
        }
        (Value::InlineTable(x), Value::InlineTable(y)) => same_table(x, y),
        (Value::String(x), Value::String(y)) => x.value() == y.value(),
        (Value::Integer(x), Value::Integer(y)) => x.value() == y.value(),
        (Value::Boolean(x), Value::Boolean(y)) => x.value() == y.value(),
        (Value::Float(x), Value::Float(y)) => x.value().to_bits() == y.value().to_bits(),
        (Value::Datetime(x), Value::Datetime(y)) => x.value() == y.value(),
        _ => false,
    }
}

/// The drop-in for config `version`: the handler's table alone.
fn drop_in_text(version: i64, handler: &Handler, options: Option<Table>) -> String {
    let mut document = DocumentMut::new();
    document.decor_mut().set_prefix(
        "# Written by the runtimekit node agent: containerd's lj-runtime handler. The agent\n# rewrites it when it changes and removes it when the kit is uninstalled.\n",
    );
    document.insert("version", value(version));
    let mut runtimes = Table::new();
    runtimes.set_implicit(true);
    let mut table = handler_table(handler, options);
    table.decor_mut().clear();
    runtimes.insert(&handler.name, Item::Table(table));
    let mut containerd = Table::new();
    containerd.set_implicit(true);
    containerd.insert("runtimes", Item::Table(runtimes));
    let mut plugin = Table::new();
    plugin.set_implicit(true);
    plugin.insert("containerd", Item::Table(containerd));
    let mut plugins = Table::new();
    plugins.set_implicit(true);
    plugins.insert(cri_plugin(version), Item::Table(plugin));
    document.insert("plugins", Item::Table(plugins));
    document.to_string()
}

/// Whether the main configuration's `imports` reach `drop_in` (by its path or a glob).
fn imported(main_path: &Path, document: &DocumentMut, drop_in: &Path) -> Result<bool, ConfigError> {
    let Some(item) = document.get("imports") else {
        return Ok(false);
    };
    let imports = item.as_array().ok_or_else(|| ConfigError::Unexpected {
        path: main_path.to_owned(),
        what: "its `imports` is not a list".into(),
    })?;
    let parent = main_path.parent().unwrap_or(Path::new("/"));
    Ok(imports.iter().filter_map(|v| v.as_str()).any(|import| {
        let resolved = parent.join(import);
        let options = glob::MatchOptions {
            require_literal_separator: true,
            ..glob::MatchOptions::default()
        };
        resolved == drop_in
            || glob::Pattern::new(&resolved.display().to_string())
                .is_ok_and(|p| p.matches_path_with(drop_in, options))
    }))
}

/// The main configuration's `imports` list, made when missing.
fn imports_mut<'d>(
    path: &Path,
    document: &'d mut DocumentMut,
) -> Result<&'d mut Array, ConfigError> {
    let item = document
        .entry("imports")
        .or_insert_with(|| value(Array::new()));
    item.as_array_mut().ok_or_else(|| ConfigError::Unexpected {
        path: path.to_owned(),
        what: "its `imports` is not a list".into(),
    })
}

/// The CRI plugin's `containerd.runtimes` table of the main configuration, made when missing.
fn runtimes_mut<'d>(
    path: &Path,
    document: &'d mut DocumentMut,
    version: i64,
) -> Result<&'d mut dyn toml_edit::TableLike, ConfigError> {
    let mut item = document.as_item_mut();
    for key in runtimes_path(version) {
        let table = item
            .as_table_like_mut()
            .ok_or_else(|| ConfigError::Unexpected {
                path: path.to_owned(),
                what: format!("`{key}` sits under a value that is not a table"),
            })?;
        item = table.entry(key).or_insert_with(|| {
            let mut table = Table::new();
            table.set_implicit(true);
            Item::Table(table)
        });
    }
    item.as_table_like_mut()
        .ok_or_else(|| ConfigError::Unexpected {
            path: path.to_owned(),
            what: "the CRI plugin's `containerd.runtimes` is not a table".into(),
        })
}

#[cfg(test)]
mod tests;
