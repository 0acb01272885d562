//! The library's state in a process: the limits, the shared ledger, which driver device is which
//! of the container's cards, and what each live allocation of this process took.

use crate::ledger::{CARDS, Process};
use crate::limits::Limits;
use crate::real::function;
use crate::shared::{self, Ledger};
use runtimekit_cuda_abi::{self as abi, CuDevice, CuResult, CuUuid};
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
        Isolation {
            ledger: Ledger::open(dir.as_deref()),
            limits,
            cards: Mutex::new(HashMap::new()),
            live: Mutex::new(HashMap::new()),
            slot: Mutex::new(None),
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
        let mut cards = self.cards.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(card) = cards.get(&device) {
            return Ok(*card);
        }
        let card = device_uuid(device)
            .and_then(|uuid| limits.card(&uuid.card_name()))
            .filter(|&card| card < CARDS && limits.cards[card].memory.is_some());
        cards.insert(device, card);
        Ok(card)
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
        let me = shared::me();
        let mut slot = self.slot.lock().unwrap_or_else(|e| e.into_inner());
        match *slot {
            Some((owner, index)) if owner == me => Some(index),
            _ => {
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
