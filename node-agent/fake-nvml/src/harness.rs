//! The tests' side: a copy of the library in a folder of its own, with its world file.

use crate::state::WORLD_FILE;
use crate::world::World;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// The file cargo builds (`crate-type = ["cdylib"]`).
const BUILT: &str = "libruntimekit_fake_nvml.so";
/// The name the copy takes: the one NVML has.
const NAME: &str = "libnvidia-ml.so.1";

/// A fake NVML installed in a folder of its own; removed when dropped.
#[derive(Debug)]
pub struct FakeNvml {
    dir: PathBuf,
}

/// The fake library cargo built: `RUNTIMEKIT_FAKE_NVML` when set, else beside the running
/// test binary (`target/<profile>/deps`) or one folder up.
fn built_library() -> io::Result<PathBuf> {
    if let Some(path) = std::env::var_os("RUNTIMEKIT_FAKE_NVML") {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe()?;
    exe.ancestors()
        .skip(1)
        .take(2)
        .map(|dir| dir.join(BUILT))
        .find(|p| p.exists())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "{BUILT} is not beside {}: build runtimekit-fake-nvml (a dev-dependency does)",
                    exe.display()
                ),
            )
        })
}

impl FakeNvml {
    /// Copies the fake library into a new folder as `libnvidia-ml.so.1`, with `world`.
    pub fn install(world: &World) -> io::Result<FakeNvml> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "runtimekit-fake-nvml-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&dir)?;
        std::fs::copy(built_library()?, dir.join(NAME))?;
        let fake = FakeNvml { dir };
        fake.write(world)?;
        Ok(fake)
    }

    /// The library to load.
    pub fn library(&self) -> PathBuf {
        self.dir.join(NAME)
    }

    /// The folder it lives in (for `LD_LIBRARY_PATH`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The world as the library last left it.
    pub fn world(&self) -> io::Result<World> {
        let text = std::fs::read(self.dir.join(WORLD_FILE))?;
        serde_json::from_slice(&text).map_err(io::Error::other)
    }

    /// Changes the world; the library sees the change at its next call.
    pub fn edit(&self, change: impl FnOnce(&mut World)) -> io::Result<()> {
        let mut world = self.world()?;
        change(&mut world);
        self.write(&world)
    }

    fn write(&self, world: &World) -> io::Result<()> {
        let text = serde_json::to_vec_pretty(world).map_err(io::Error::other)?;
        let temp = self.dir.join(format!("{WORLD_FILE}.edit"));
        std::fs::write(&temp, text)?;
        std::fs::rename(&temp, self.dir.join(WORLD_FILE))
    }
}

impl Drop for FakeNvml {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
