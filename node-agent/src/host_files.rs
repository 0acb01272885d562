//! Files the agent writes on the host, whole or not at all: a reader (containerd, the kubelet,
//! a container being created) sees the old content or the new one, never a half-written file.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Writes `content` to `path` through a temporary file beside it, flushed to disk and renamed
/// over the old one, with the permission bits `mode`; makes the folder when missing.
pub fn write_atomically(path: &Path, content: &[u8], mode: u32) -> Result<(), String> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| format!("making {}: {e}", dir.display()))?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let temporary = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let written = (|| {
        let mut file = std::fs::File::create(&temporary)?;
        file.write_all(content)?;
        file.set_permissions(std::fs::Permissions::from_mode(mode))?;
        file.sync_all()?;
        std::fs::rename(&temporary, path)
    })();
    written.map_err(|e| {
        let _ = std::fs::remove_file(&temporary);
        format!("writing {}: {e}", path.display())
    })
}

/// Removes `path`; one already gone is fine.
pub fn remove(path: &Path) -> Result<(), String> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(format!("removing {}: {e}", path.display()))
        }
        _ => Ok(()),
    }
}

/// Puts `content` at `path` unless it already holds exactly that; whether it wrote.
pub fn place(path: &Path, content: &[u8], mode: u32) -> Result<bool, String> {
    let same = std::fs::read(path).is_ok_and(|old| old == content)
        && std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o7777 == mode);
    if same {
        return Ok(false);
    }
    write_atomically(path, content, mode)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_placed_once_replaced_when_it_differs_and_removed() {
        let dir = std::env::temp_dir().join(format!("rk-host-files-{}", std::process::id()));
        let path = dir.join("bin/lj-runtime");
        assert_eq!(place(&path, b"one", 0o755), Ok(true));
        assert_eq!(place(&path, b"one", 0o755), Ok(false));
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o755
        );
        assert_eq!(place(&path, b"one", 0o644), Ok(true), "the mode counts too");
        assert_eq!(place(&path, b"two", 0o755), Ok(true));
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        // Nothing temporary is left beside it.
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["lj-runtime"]);
        assert_eq!(remove(&path), Ok(()));
        assert_eq!(remove(&path), Ok(()));
        assert!(!path.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_write_that_fails_leaves_the_old_file_and_says_where() {
        let dir = std::env::temp_dir().join(format!("rk-host-files-ro-{}", std::process::id()));
        // A folder where the file should be: the rename cannot replace it.
        let path = dir.join("taken");
        std::fs::create_dir_all(path.join("inside")).unwrap();
        let error = write_atomically(&path, b"x", 0o644).unwrap_err();
        assert!(error.contains(&path.display().to_string()), "{error}");
        assert!(path.join("inside").is_dir());
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["taken"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
