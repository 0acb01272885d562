//! Small shared helpers: the clock, a stable hash, poison-tolerant locking.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

/// Where the backends read the time: the system clock, or a manual one for tests.
#[derive(Debug, Clone, Default)]
pub enum Clock {
    /// Wall-clock time.
    #[default]
    System,
    /// A clock that moves only when told, in Unix milliseconds.
    Manual(Arc<AtomicU64>),
}

impl Clock {
    /// A manual clock starting at `unix_ms`.
    pub fn manual(unix_ms: u64) -> Self {
        Self::Manual(Arc::new(AtomicU64::new(unix_ms)))
    }

    /// Now, in Unix milliseconds.
    pub fn now_ms(&self) -> u64 {
        match self {
            Self::System => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
                .unwrap_or(0),
            Self::Manual(ms) => ms.load(Ordering::SeqCst),
        }
    }

    /// Moves a manual clock forward; the system clock ignores it.
    pub fn advance_ms(&self, ms: u64) {
        if let Self::Manual(now) = self {
            now.fetch_add(ms, Ordering::SeqCst);
        }
    }
}

/// Locks a mutex, taking the data even if a thread panicked while holding it (every critical
/// section here leaves the data consistent).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A stable 64-bit hash (FNV-1a then a splitmix64 finaliser) of some parts, the same on every
/// platform and Rust version, for UUIDs and simulated values.
pub(crate) fn stable_hash(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in *part {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        // Separate the parts, so ("ab", "c") and ("a", "bc") differ.
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    splitmix(h)
}

/// The splitmix64 finaliser.
pub(crate) fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A UUID-formatted string (`xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`) derived from some parts.
pub(crate) fn derived_uuid(parts: &[&[u8]]) -> String {
    let hi = stable_hash(parts);
    let lo = splitmix(hi ^ 0x5555_5555_5555_5555);
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        hi >> 32,
        (hi >> 16) & 0xffff,
        hi & 0xffff,
        lo >> 48,
        lo & 0xffff_ffff_ffff
    )
}

/// A temporary directory removed on drop, for tests.
#[cfg(test)]
pub(crate) mod testdir {
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicU32, Ordering};

    #[derive(Debug)]
    pub struct TestDir(PathBuf);

    impl TestDir {
        pub fn new(name: &str) -> Self {
            static NEXT: AtomicU32 = AtomicU32::new(0);
            let dir = std::env::temp_dir().join(format!(
                "rl-{name}-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::SeqCst)
            ));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("create test dir");
            Self(dir)
        }

        pub fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TestDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_is_stable_and_separates_parts() {
        assert_eq!(
            stable_hash(&[b"node-1", b"0"]),
            stable_hash(&[b"node-1", b"0"])
        );
        assert_ne!(stable_hash(&[b"ab", b"c"]), stable_hash(&[b"a", b"bc"]));
        assert_ne!(stable_hash(&[b"node-1"]), stable_hash(&[b"node-2"]));
    }

    #[test]
    fn derived_uuid_has_uuid_shape() {
        let uuid = derived_uuid(&[b"x"]);
        let groups: Vec<usize> = uuid.split('-').map(str::len).collect();
        assert_eq!(groups, [8, 4, 4, 4, 12], "{uuid}");
        assert!(uuid.chars().all(|c| c == '-' || c.is_ascii_hexdigit()));
    }

    #[test]
    fn manual_clock_moves_only_when_told() {
        let clock = Clock::manual(1_000);
        assert_eq!(clock.now_ms(), 1_000);
        clock.advance_ms(500);
        assert_eq!(clock.now_ms(), 1_500);
        let system = Clock::System;
        assert!(system.now_ms() > 1_600_000_000_000);
    }
}
