//! Per-slot accounting under the slot's sequence lock.
//!
//! A slot's usage is written only by its own process and read by everyone (admission sums all
//! slots). The counters are atomics, so a single value is never torn; the seqlock makes a
//! snapshot of one device's counters (`total` and the per-kind fields) consistent.
//!
//! What the C original gets wrong, and how this rules it out:
//! - B9: several threads of one process write the same slot at once (the context path is not
//!   under the allocator mutex), so the sequence number can be even mid-write. Here a writer
//!   enters by CAS from even to odd, so one writer per slot at a time.
//! - B8, B6: the reader spins forever on a slot whose writer died with the sequence odd (or whose
//!   odd sequence a compaction copied). Here the reader gives up after [`READ_RETRIES`] and
//!   returns the value it sees, marked inconsistent, which the caller reports once; a writer that
//!   finds its own sequence stuck odd takes it over after [`WRITE_SPINS`].
//! - B3's underflow: `fetch_sub` without a guard wraps a counter to 2^64 - n. Here a release
//!   saturates at 0 and says so.
//!
//! Orderings (Boehm, "Can seqlocks get along with programming language memory models?"):
//! writer: CAS even→odd (acquire), release fence, data, store even (release); reader: load
//! (acquire), data (relaxed), acquire fence, load (relaxed), compare.

use crate::layout::{DeviceMemory, ProcSlot};
use crate::sync::{fence, spin_loop, AtomicU64, Ordering};

/// Attempts a reader makes before settling for a possibly inconsistent snapshot.
pub const READ_RETRIES: usize = 64;
/// Spins a writer waits for another writer of the same slot before taking over (the other writer
/// can only be stuck if a peer copied a mid-write sequence number into our slot).
pub const WRITE_SPINS: u32 = 1 << 22;

/// The three kinds of memory upstream accounts separately.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Context memory (type 0).
    Context,
    /// Module memory (type 1).
    Module,
    /// Data allocations (type 2).
    Data,
}

impl Kind {
    /// The per-kind counter of `mem`.
    pub(crate) fn counter(self, mem: &DeviceMemory) -> &AtomicU64 {
        match self {
            Kind::Context => &mem.context_size,
            Kind::Module => &mem.module_size,
            Kind::Data => &mem.data_size,
        }
    }

    /// Upstream's numeric type (0, 1, 2), as the C API passes it.
    pub fn from_c(kind: i32) -> Option<Kind> {
        match kind {
            0 => Some(Kind::Context),
            1 => Some(Kind::Module),
            2 => Some(Kind::Data),
            _ => None,
        }
    }
}

/// One device's counters of one slot, read together.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Context bytes.
    pub context: u64,
    /// Module bytes.
    pub module: u64,
    /// Data bytes.
    pub data: u64,
    /// The sum admission counts.
    pub total: u64,
}

/// The slot's one writer, as crossbeam-utils' `SeqLockWriteGuard`: the sequence is odd from
/// [`SlotWriter::begin`] until the guard is dropped, and the counters change only through the
/// guard's methods, so no write escapes a sequence.
pub struct SlotWriter<'a, const D: usize> {
    slot: &'a ProcSlot<D>,
    /// The even value the sequence takes when the guard is dropped.
    end: u64,
    took_over: bool,
}

impl<'a, const D: usize> SlotWriter<'a, D> {
    /// Makes the sequence odd (waiting for another writer of this slot, or taking over a
    /// sequence that stays odd past [`WRITE_SPINS`]: its writer is gone).
    pub fn begin(slot: &'a ProcSlot<D>) -> Self {
        let seq = &slot.seqlock;
        let mut spins = 0u32;
        let mut s = seq.load(Ordering::Relaxed);
        let (begin, took_over) = loop {
            if s & 1 == 1 {
                spins += 1;
                if spins >= WRITE_SPINS {
                    // Keep it odd, but ours: the stale writer is gone.
                    match seq.compare_exchange(s, s + 2, Ordering::Acquire, Ordering::Relaxed) {
                        Ok(_) => break (s + 2, true),
                        Err(now) => s = now,
                    }
                    continue;
                }
                spin_loop();
                s = seq.load(Ordering::Relaxed);
                continue;
            }
            match seq.compare_exchange_weak(s, s + 1, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => break (s + 1, false),
                Err(now) => s = now,
            }
        };
        fence(Ordering::Release);
        SlotWriter {
            slot,
            end: begin + 1,
            took_over,
        }
    }

    /// Whether this writer took over a sequence that a vanished writer left odd.
    pub fn took_over(&self) -> bool {
        self.took_over
    }

    /// Adds `bytes` of `kind` on `dev`.
    pub fn add(&self, dev: usize, kind: Kind, bytes: u64) {
        let mem = &self.slot.used[dev];
        mem.total.fetch_add(bytes, Ordering::SeqCst);
        kind.counter(mem).fetch_add(bytes, Ordering::Relaxed);
    }

    /// Subtracts `bytes` of `kind` on `dev`, saturating at 0; returns false if it had to
    /// saturate.
    pub fn sub(&self, dev: usize, kind: Kind, bytes: u64) -> bool {
        let mem = &self.slot.used[dev];
        // The total loses only what the kind really had, so an over-large release of one kind
        // cannot eat another kind's share of the total.
        let removed = take_up_to(kind.counter(mem), bytes);
        let total_removed = take_up_to(&mem.total, removed);
        removed == bytes && total_removed == removed
    }
}

impl<const D: usize> Drop for SlotWriter<'_, D> {
    fn drop(&mut self) {
        self.slot.seqlock.store(self.end, Ordering::Release);
    }
}

/// Subtracts up to `bytes` from `counter`, never below 0; returns what was subtracted.
fn take_up_to(counter: &AtomicU64, bytes: u64) -> u64 {
    let mut cur = counter.load(Ordering::Relaxed);
    loop {
        let next = cur.saturating_sub(bytes);
        match counter.compare_exchange_weak(cur, next, Ordering::SeqCst, Ordering::Relaxed) {
            Ok(_) => return cur - next,
            Err(now) => cur = now,
        }
    }
}

/// Zeroes every device's counters of the slot (inside [`force_zero`]'s odd sequence).
fn zero<const D: usize>(slot: &ProcSlot<D>) {
    for mem in &slot.used {
        mem.total.store(0, Ordering::Relaxed);
        mem.context_size.store(0, Ordering::Relaxed);
        mem.module_size.store(0, Ordering::Relaxed);
        mem.data_size.store(0, Ordering::Relaxed);
    }
}

/// Zeroes the slot's counters from a context that must not wait: an exit or signal handler
/// that may have interrupted this process's own writer, or a reaper cleaning a dead slot. The
/// sequence is forced odd, the counters zeroed, then made even past any value a writer held.
pub fn force_zero<const D: usize>(slot: &ProcSlot<D>) {
    let s = slot.seqlock.load(Ordering::Relaxed) | 1;
    slot.seqlock.store(s, Ordering::Relaxed);
    fence(Ordering::Release);
    zero(slot);
    slot.seqlock.store(s + 1, Ordering::Release);
}

/// Reads one device's counters of a slot. The flag is false if the sequence stayed odd or kept
/// changing through [`READ_RETRIES`] attempts (the values are then a best effort).
pub fn read<const D: usize>(slot: &ProcSlot<D>, dev: usize) -> (Usage, bool) {
    let seq = &slot.seqlock;
    let mem = &slot.used[dev];
    let load = || Usage {
        context: mem.context_size.load(Ordering::Relaxed),
        module: mem.module_size.load(Ordering::Relaxed),
        data: mem.data_size.load(Ordering::Relaxed),
        total: mem.total.load(Ordering::Relaxed),
    };
    for _ in 0..READ_RETRIES {
        let s1 = seq.load(Ordering::Acquire);
        if s1 & 1 == 1 {
            spin_loop();
            continue;
        }
        let usage = load();
        fence(Ordering::Acquire);
        if seq.load(Ordering::Relaxed) == s1 {
            return (usage, true);
        }
        spin_loop();
    }
    (load(), false)
}
