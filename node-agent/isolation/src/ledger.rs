//! The memory ledger every process of one container shares: a fixed table of process slots in
//! a file mapped `MAP_SHARED` (in the folder `lj-runtime` gives the container), each slot
//! holding what one process has allocated per card. An allocation reserves its bytes here
//! before the driver is asked, under an exclusive `flock` of the file, so two processes can
//! never both pass the cap; the kernel drops a dead holder's lock. A process killed without
//! freeing leaves its slot behind, but the driver freed its memory, so the slot of a process
//! that is gone (its PID absent, or reused by a process started at another time) is cleared
//! before the cap is judged.

use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

/// Process slots in a ledger.
pub const SLOTS: usize = 1024;
/// Cards a ledger accounts for.
pub const CARDS: usize = 16;
/// Marks a ledger of this layout.
const MAGIC: u64 = 0x726b_6c65_6467_0001;

/// One process's allocations.
#[repr(C)]
#[derive(Debug)]
pub struct Slot {
    pid: AtomicI32,
    _pad: u32,
    /// When the process started (clock ticks after boot, `/proc/<pid>/stat`), so a reused PID
    /// is not taken for the process that held the slot.
    start: AtomicU64,
    used: [AtomicU64; CARDS],
}

/// The table as it lies in the shared file.
#[repr(C)]
#[derive(Debug)]
pub struct Table {
    magic: AtomicU64,
    slots: [Slot; SLOTS],
}

/// A process by PID and start time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Process {
    /// Its PID in the container's PID namespace.
    pub pid: i32,
    /// Its start time.
    pub start: u64,
}

impl Table {
    /// Takes a zero-filled table (a new file) into use; false if it holds another layout.
    pub fn adopt(&self) -> bool {
        match self
            .magic
            .compare_exchange(0, MAGIC, Ordering::SeqCst, Ordering::SeqCst)
        {
            Ok(_) => true,
            Err(found) => found == MAGIC,
        }
    }

    /// The slot of `me`, claimed if it has none; `None` when every slot is taken.
    pub fn claim(&self, me: Process) -> Option<usize> {
        let mine = self.slots.iter().position(|s| {
            s.pid.load(Ordering::SeqCst) == me.pid && s.start.load(Ordering::SeqCst) == me.start
        });
        mine.or_else(|| {
            let free = self
                .slots
                .iter()
                .position(|s| s.pid.load(Ordering::SeqCst) == 0)?;
            let slot = &self.slots[free];
            for used in &slot.used {
                used.store(0, Ordering::SeqCst);
            }
            slot.start.store(me.start, Ordering::SeqCst);
            slot.pid.store(me.pid, Ordering::SeqCst);
            Some(free)
        })
    }

    /// Clears the slots of processes `alive` says are gone; how many it cleared.
    pub fn reap(&self, alive: impl Fn(Process) -> bool) -> usize {
        let mut cleared = 0;
        for slot in &self.slots {
            let pid = slot.pid.load(Ordering::SeqCst);
            if pid == 0 {
                continue;
            }
            let process = Process {
                pid,
                start: slot.start.load(Ordering::SeqCst),
            };
            if !alive(process) {
                for used in &slot.used {
                    used.store(0, Ordering::SeqCst);
                }
                slot.pid.store(0, Ordering::SeqCst);
                cleared += 1;
            }
        }
        cleared
    }

    /// Bytes the container uses on `card`.
    pub fn used(&self, card: usize) -> u64 {
        self.slots
            .iter()
            .filter(|s| s.pid.load(Ordering::SeqCst) != 0)
            .map(|s| s.used.get(card).map_or(0, |u| u.load(Ordering::SeqCst)))
            .fold(0, u64::saturating_add)
    }

    /// Adds `bytes` to `slot`'s use of `card` if the container's use stays within `cap`.
    pub fn reserve(&self, slot: usize, card: usize, bytes: u64, cap: u64) -> bool {
        let (Some(slot), true) = (self.slots.get(slot), card < CARDS) else {
            return false;
        };
        if self.used(card).saturating_add(bytes) > cap {
            return false;
        }
        slot.used[card].fetch_add(bytes, Ordering::SeqCst);
        true
    }

    /// Takes `bytes` off `slot`'s use of `card`.
    pub fn release(&self, slot: usize, card: usize, bytes: u64) {
        if let Some(used) = self.slots.get(slot).and_then(|s| s.used.get(card)) {
            let _ = used.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |u| {
                Some(u.saturating_sub(bytes))
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A zero-filled table, as a new file maps.
    fn table() -> Box<Table> {
        // SAFETY: every field is an atomic integer, for which all-zero bytes are valid.
        unsafe { Box::<Table>::new_zeroed().assume_init() }
    }

    const A: Process = Process { pid: 10, start: 1 };
    const B: Process = Process { pid: 11, start: 5 };

    #[test]
    fn the_cap_holds_across_processes_and_frees_return() {
        let t = table();
        assert!(t.adopt());
        let (a, b) = (t.claim(A).expect("slot"), t.claim(B).expect("slot"));
        assert_ne!(a, b);
        assert_eq!(t.claim(A), Some(a), "a process keeps its slot");
        assert!(t.reserve(a, 0, 3 << 30, 4 << 30));
        assert!(
            !t.reserve(b, 0, 2 << 30, 4 << 30),
            "3 + 2 GiB passes a 4 GiB cap"
        );
        assert!(t.reserve(b, 0, 1 << 30, 4 << 30), "exactly at the cap fits");
        assert!(!t.reserve(b, 0, 1, 4 << 30));
        assert!(
            t.reserve(b, 1, 1 << 30, 1 << 30),
            "each card has its own cap"
        );
        t.release(a, 0, 3 << 30);
        assert_eq!(t.used(0), 1 << 30);
        assert!(t.reserve(b, 0, 3 << 30, 4 << 30));
        t.release(a, 0, u64::MAX);
        assert!(
            !t.reserve(a, CARDS, 1, u64::MAX),
            "a card past the table is refused"
        );
    }

    #[test]
    fn a_dead_process_leaves_nothing_behind() {
        let t = table();
        let a = t.claim(A).expect("slot");
        assert!(t.reserve(a, 0, 4 << 30, 4 << 30));
        // A reused PID with another start time is another process.
        let reused = Process {
            pid: A.pid,
            start: 99,
        };
        assert_eq!(t.reap(|p| p == reused || p == B), 1);
        assert_eq!(t.used(0), 0);
        let b = t.claim(B).expect("slot");
        assert!(t.reserve(b, 0, 4 << 30, 4 << 30));
    }

    #[test]
    fn a_full_table_refuses_new_processes_until_reaped() {
        let t = table();
        for pid in 1..=i32::try_from(SLOTS).expect("slots") {
            t.claim(Process { pid, start: 0 }).expect("slot");
        }
        assert_eq!(t.claim(Process { pid: -5, start: 0 }), None);
        t.reap(|p| p.pid != 7);
        assert!(t.claim(Process { pid: -5, start: 0 }).is_some());
    }

    #[test]
    fn another_layout_is_not_adopted() {
        let t = table();
        t.magic.store(42, Ordering::SeqCst);
        assert!(!t.adopt());
    }
}
