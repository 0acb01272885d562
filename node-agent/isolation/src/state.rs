//! The library's state in a process: the limits, the shared ledger, which driver device is which
//! of the container's cards, what each live allocation of this process took, and the compute
//! gate of each capped card with the thread that feeds it the measured shares.

use crate::ledger::{CARDS, Process};
use crate::limits::Limits;
use crate::real::function;
use crate::shared::{self, Ledger};
use crate::throttle::Throttle;
use runtimekit_cuda_abi::{self as abi, CuDevice, CuResult, CuUuid};
use runtimekit_isolation_files as files;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// What an allocation is known by, per kind (the kinds' values may coincide).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Key {
    /// A device pointer (`cuMemAlloc*`), 64-bit.
    Pointer(u64),
    /// A device pointer of the 32-bit entry points.
    PointerV1(u32),
    /// An array or mipmapped array handle.
    Array(usize),
    /// A physical allocation of the virtual-memory API (`cuMemCreate`).
    Physical(u64),
}

/// The library's state.
#[derive(Debug)]
pub struct Isolation {
    limits: Result<Limits, String>,
    ledger: Ledger,
    /// Driver device ordinal to the container's card position (`None`: not capped).
    cards: Mutex<HashMap<CuDevice, Option<usize>>>,
    /// This process's live allocations: card position and bytes.
    live: Mutex<HashMap<Key, (usize, u64)>>,
    /// This process's slot, with the PID it was claimed for (a forked child claims anew).
    slot: Mutex<Option<(Process, usize)>>,
    /// The compute gate of each card position with a compute cap, made at its first launch.
    gates: Mutex<HashMap<usize, Throttle>>,
    /// Whether any card has a compute cap: without one a launch asks the driver nothing.
    any_core_cap: bool,
}

/// The rate a gate starts at, in blocks a second: high enough to hold nothing back until the
/// first measurement says where the share is.
const INITIAL_RATE: f64 = 1e9;
/// How often the shares file is looked at.
const WATCH_EVERY: std::time::Duration = std::time::Duration::from_millis(50);

/// Seconds on a monotonic clock, for the gates.
fn seconds() -> f64 {
    static START: OnceLock<std::time::Instant> = OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_secs_f64()
}

/// The watcher thread: reads the shares file in the measurements folder whenever it changes.
fn watch_shares() {
    let state = isolation();
    let Some(file) = state
        .limits
        .as_ref()
        .ok()
        .and_then(|l| l.measured_dir.as_ref())
        .map(|d| d.join(files::SHARES))
    else {
        return;
    };
    let mut seen = HashMap::new();
    let mut modified = None;
    loop {
        let now = std::fs::metadata(&file).and_then(|m| m.modified()).ok();
        if now.is_some() && now != modified {
            modified = now;
            if let Ok(text) = std::fs::read_to_string(&file) {
                state.observe(&text, &mut seen);
            }
        }
        std::thread::sleep(WATCH_EVERY);
    }
}

thread_local! {
    /// Whether this thread is inside a hook: a driver that calls its own exported entry points
    /// (which this library interposes) would otherwise reach the hooks twice for one call.
    static INSIDE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Marks the thread as inside a hook until dropped; `None` when it already is (the call is
/// the driver's own, and passes through unaccounted).
#[derive(Debug)]
pub struct Outermost(());

impl Outermost {
    /// Enters a hook.
    pub fn enter() -> Option<Outermost> {
        INSIDE.with(|inside| (!inside.replace(true)).then_some(Outermost(())))
    }
}

impl Drop for Outermost {
    fn drop(&mut self) {
        INSIDE.with(|inside| inside.set(false));
    }
}

/// The state, read from the environment at first use.
pub fn isolation() -> &'static Isolation {
    static STATE: OnceLock<Isolation> = OnceLock::new();
    STATE.get_or_init(|| {
        let limits = Limits::read(|name| std::env::var(name).ok());
        if let Err(error) = &limits {
            eprintln!(
                "runtimekit-isolation: the container's limits cannot be read ({error}); every GPU allocation is refused"
            );
        }
        let dir = limits.as_ref().ok().and_then(|l| l.ledger_dir.clone());
        let any_core_cap = limits
            .as_ref()
            .is_ok_and(|l| l.cards.iter().any(|c| c.core.is_some()));
        Isolation {
            any_core_cap,
            ledger: Ledger::open(dir.as_deref()),
            limits,
            cards: Mutex::new(HashMap::new()),
            live: Mutex::new(HashMap::new()),
            slot: Mutex::new(None),
            gates: Mutex::new(HashMap::new()),
        }
    })
}

/// How a capped allocation went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capped {
    /// The device is not capped: allocate as asked.
    Free,
    /// The bytes are reserved on this card.
    Reserved(usize),
}

impl Isolation {
    /// The card position of driver device `device`, by its UUID, if the container's limits cap
    /// it; `Err` when limits could not be read (everything is refused).
    pub fn card(&self, device: CuDevice) -> Result<Option<usize>, CuResult> {
        let limits = self.limits.as_ref().map_err(|_| abi::ERROR_OUT_OF_MEMORY)?;
        Ok(self
            .position(device)
            .filter(|&card| card < CARDS && limits.cards[card].memory.is_some()))
    }

    /// The container's card position of driver device `device`, by its UUID.
    fn position(&self, device: CuDevice) -> Option<usize> {
        let limits = self.limits.as_ref().ok()?;
        let mut cards = self.cards.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(card) = cards.get(&device) {
            return *card;
        }
        let card = device_uuid(device).and_then(|uuid| limits.card(&uuid.card_name()));
        cards.insert(device, card);
        card
    }

    /// Passes a launch of `blocks` on the current context's card through its compute gate:
    /// waits as long as the gate says (nothing when the card has no compute cap).
    pub fn gate(&self, blocks: u64) {
        if !self.any_core_cap {
            return;
        }
        let Some(device) = current_device() else {
            return;
        };
        let Some((card, core, policy)) = self.position(device).and_then(|card| {
            let limits = self.limits.as_ref().ok()?;
            Some((card, limits.cards[card].core?, limits.policy))
        }) else {
            return;
        };
        self.start_watching();
        let wait = self
            .gates
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(card)
            .or_insert_with(|| Throttle::new(core, policy, INITIAL_RATE, seconds()))
            .admit(blocks, seconds());
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
    }

    /// Starts, once, the thread that feeds the gates the container's measured shares.
    fn start_watching(&self) {
        static STARTED: std::sync::Once = std::sync::Once::new();
        STARTED.call_once(|| {
            let started = std::thread::Builder::new()
                .name("runtimekit-isolation-shares".into())
                .spawn(watch_shares);
            if let Err(error) = started {
                eprintln!(
                    "runtimekit-isolation: cannot watch the measured shares ({error}); launches pass unthrottled"
                );
            }
        });
    }

    /// Gives each gate the newest measurement of its card, from the shares file's `text`.
    fn observe(&self, text: &str, seen: &mut HashMap<usize, u64>) {
        let Ok(limits) = self.limits.as_ref() else {
            return;
        };
        let mut gates = self.gates.lock().unwrap_or_else(|e| e.into_inner());
        for share in files::parse(text) {
            let Some(card) = limits.card(&share.uuid) else {
                continue;
            };
            if seen.insert(card, share.sequence) == Some(share.sequence) {
                continue;
            }
            if let Some(gate) = gates.get_mut(&card) {
                gate.observe(share.mine, share.others, seconds());
            }
        }
    }

    /// The cap of card position `card`.
    pub fn cap(&self, card: usize) -> u64 {
        self.limits
            .as_ref()
            .ok()
            .and_then(|l| l.cards.get(card))
            .and_then(|c| c.memory)
            .unwrap_or(u64::MAX)
    }

    /// This process's slot, claimed at first use (and again in a forked child).
    fn my_slot(&self, table: &crate::ledger::Table) -> Option<usize> {
        let mut slot = self.slot.lock().unwrap_or_else(|e| e.into_inner());
        // The PID tells a forked child from its parent; the start time (a read of /proc) is
        // needed only when a slot is claimed.
        let pid = i32::try_from(std::process::id()).unwrap_or(i32::MAX);
        match *slot {
            Some((owner, index)) if owner.pid == pid => Some(index),
            _ => {
                let me = shared::me();
                let index = table.claim(me).or_else(|| {
                    table.reap(shared::alive);
                    table.claim(me)
                })?;
                *slot = Some((me, index));
                Some(index)
            }
        }
    }

    /// Reserves `bytes` on driver device `device` before the driver is asked for them.
    pub fn reserve(&self, device: CuDevice, bytes: u64) -> Result<Capped, CuResult> {
        let Some(card) = self.card(device)? else {
            return Ok(Capped::Free);
        };
        self.reserve_on(card, bytes)
            .map(|()| Capped::Reserved(card))
    }

    /// Reserves `bytes` more on card position `card`.
    pub fn reserve_on(&self, card: usize, bytes: u64) -> Result<(), CuResult> {
        let locked = self.ledger.locked();
        let slot = self.my_slot(locked.table).ok_or(abi::ERROR_OUT_OF_MEMORY)?;
        let cap = self.cap(card);
        if locked.table.reserve(slot, card, bytes, cap) {
            return Ok(());
        }
        // Memory of processes that died without freeing is free again: the driver took it back.
        if locked.table.reap(shared::alive) > 0 && locked.table.reserve(slot, card, bytes, cap) {
            return Ok(());
        }
        Err(abi::ERROR_OUT_OF_MEMORY)
    }

    /// Gives back `bytes` reserved on card position `card`.
    pub fn release(&self, card: usize, bytes: u64) {
        let locked = self.ledger.locked();
        if let Some(slot) = self.my_slot(locked.table) {
            locked.table.release(slot, card, bytes);
        }
    }

    /// Records a live allocation.
    pub fn record(&self, key: Key, card: usize, bytes: u64) {
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, (card, bytes));
    }

    /// Forgets a freed allocation, giving its bytes back.
    pub fn forget(&self, key: Key) {
        let taken = self
            .live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key);
        if let Some((card, bytes)) = taken {
            self.release(card, bytes);
        }
    }

    /// The container's use and cap of driver device `device`, if capped.
    pub fn usage(&self, device: CuDevice) -> Option<(u64, u64)> {
        self.card_usage(self.card(device).ok()??)
    }

    /// The container's use and cap of the card whose UUID is `uuid` (as NVML names it), if
    /// capped.
    pub fn card_usage_by_uuid(&self, uuid: &str) -> Option<(u64, u64)> {
        let limits = self.limits.as_ref().ok()?;
        let card = limits.card(uuid).filter(|&c| c < CARDS)?;
        limits.cards[card].memory?;
        self.card_usage(card)
    }

    /// The container's use and cap of card position `card`.
    fn card_usage(&self, card: usize) -> Option<(u64, u64)> {
        let locked = self.ledger.locked();
        locked.table.reap(shared::alive);
        Some((locked.table.used(card), self.cap(card)))
    }
}

/// The UUID of driver device `device`, from the real driver.
fn device_uuid(device: CuDevice) -> Option<CuUuid> {
    type GetUuid = unsafe extern "C" fn(*mut CuUuid, CuDevice) -> CuResult;
    let get = function!(cuda, "cuDeviceGetUuid_v2", GetUuid)
        .or_else(|| function!(cuda, "cuDeviceGetUuid", GetUuid))?;
    let mut uuid = CuUuid::default();
    // SAFETY: a valid out-pointer.
    (unsafe { get(&mut uuid, device) } == abi::SUCCESS).then_some(uuid)
}

/// The current context's device, from the real driver.
pub fn current_device() -> Option<CuDevice> {
    type GetDevice = unsafe extern "C" fn(*mut CuDevice) -> CuResult;
    let get = function!(cuda, "cuCtxGetDevice", GetDevice)?;
    let mut device: CuDevice = 0;
    // SAFETY: a valid out-pointer.
    (unsafe { get(&mut device) } == abi::SUCCESS).then_some(device)
}
