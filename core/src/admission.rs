//! Admission: reserving memory against the limit so that it holds across processes that allocate
//! at the same instant.
//!
//! The C original checks the aggregate and then adds (B11, check-then-act), so two processes
//! that both see room both allocate and the limit is overshot. Here a process first *reserves*
//! in its own slot, then reads the aggregate, and rolls back on excess. Both the reservation and
//! the aggregate's loads are separated by a SeqCst fence, so of two concurrent reservers at least
//! one sees the other's reservation: the admitted sum never exceeds the limit (Dekker's argument;
//! spec/Accounting.tla checks it, model/ tests it under loom).
//!
//! A process whose reservation was rolled back because of another's in-flight reservation may
//! retry; it does so [`RETRIES`] times before reporting out of memory.

use crate::layout::{ProcSlot, Region};
use crate::platform::{Platform, Problem};
use crate::seqlock::{Kind, SlotWriter};
use crate::sync::{fence, Ordering};

/// Re-checks after a rollback, for reservations that failed only because of a concurrent one.
pub const RETRIES: usize = 2;

/// Why a reservation was refused. Every refusal leaves what was already counted unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutOfMemory {
    /// The device's usage would pass the limit.
    OverLimit {
        /// Bytes in use on the device (all live slots) when the request was refused.
        used: u64,
        /// The limit that applied (the stricter of the region's and the process's own).
        limit: u64,
    },
    /// The request, added to what the slot already holds, does not fit in 64 bits: counting
    /// it would wrap the counter and erase the process's usage.
    TooLarge,
    /// The process holds no slot in the region (its lock could not be had in time, or every
    /// slot belongs to a live process), so nothing it allocates could be counted by the others.
    Unregistered,
    /// The process has no usable region at all (a file it may not open, a layout it refuses,
    /// a malformed limit), so a limit it should enforce together with its peers cannot be.
    NoRegion,
}

/// The limit that applies when the region says `region` and the process was configured with
/// `own` (both 0 for none): the stricter one. A process that joins a region created with a
/// looser (or no) limit keeps its own, and the region's looser value cannot loosen it.
pub fn stricter_limit(region: u64, own: u64) -> u64 {
    match (region, own) {
        (0, l) | (l, 0) => l,
        (a, b) => a.min(b),
    }
}

/// The admission decision for a process that may hold no slot: with a slot, [`try_reserve`]
/// under the stricter of the two limits; without one, refused whenever a limit applies, since
/// usage that no peer can see would let the device pass the limit (the private fallback this
/// replaces let each such process take the whole limit again). With no limit at all there is
/// nothing to enforce and the request passes uncounted.
#[allow(clippy::too_many_arguments)]
pub fn admit<P: Platform, const S: usize, const D: usize>(
    region: &Region<S, D>,
    platform: &P,
    slot: Option<usize>,
    dev: usize,
    kind: Kind,
    bytes: u64,
    own_limit: u64,
) -> Result<(), OutOfMemory> {
    match slot {
        Some(slot) => try_reserve_within(region, platform, slot, dev, kind, bytes, own_limit),
        None if dev < D
            && stricter_limit(region.limit[dev].load(Ordering::Relaxed), own_limit) == 0 =>
        {
            Ok(())
        }
        None => Err(OutOfMemory::Unregistered),
    }
}

/// Sum of `total` on `dev` over slots that belong to a process (pid ≠ 0). Slots freed by C peers'
/// exit handlers still carry usage; they no longer count.
pub fn device_usage<const S: usize, const D: usize>(region: &Region<S, D>, dev: usize) -> u64 {
    if dev >= D {
        return 0;
    }
    region
        .live_range()
        .iter()
        .filter(|s| s.pid.load(Ordering::Relaxed) != 0)
        .map(|s| s.used[dev].total.load(Ordering::Relaxed))
        .fold(0u64, u64::saturating_add)
}

/// Reserves `bytes` of `kind` on `dev` in slot `slot`, or refuses it if the device's usage would
/// exceed its limit. A limit of 0 is no limit.
pub fn try_reserve<P: Platform, const S: usize, const D: usize>(
    region: &Region<S, D>,
    platform: &P,
    slot: usize,
    dev: usize,
    kind: Kind,
    bytes: u64,
) -> Result<(), OutOfMemory> {
    try_reserve_within(region, platform, slot, dev, kind, bytes, 0)
}

/// [`try_reserve`] under the stricter of the region's limit and `own_limit` (0 for none).
///
/// Sizes are checked before anything is counted: a request larger than the limit, or one that
/// would carry the slot's counters past `u64::MAX`, is refused with nothing changed (a wrapped
/// counter would read as almost nothing, and its release would erase the process's usage).
/// The slot's counters have one writer (the caller), so the check cannot be overtaken.
pub fn try_reserve_within<P: Platform, const S: usize, const D: usize>(
    region: &Region<S, D>,
    platform: &P,
    slot: usize,
    dev: usize,
    kind: Kind,
    bytes: u64,
    own_limit: u64,
) -> Result<(), OutOfMemory> {
    let own = own_slot(region, slot, dev)?;
    let limit = stricter_limit(region.limit[dev].load(Ordering::Relaxed), own_limit);
    if limit != 0 && bytes > limit {
        return Err(OutOfMemory::OverLimit {
            used: device_usage(region, dev),
            limit,
        });
    }
    if !representable(own, dev, kind, bytes) {
        return Err(OutOfMemory::TooLarge);
    }
    for _ in 0..=RETRIES {
        write_reporting(platform, own, slot, |w| w.add(dev, kind, bytes));
        if limit == 0 {
            return Ok(());
        }
        fence(Ordering::SeqCst);
        let used = device_usage(region, dev);
        if used <= limit {
            return Ok(());
        }
        write_reporting(platform, own, slot, |w| w.sub(dev, kind, bytes));
        fence(Ordering::SeqCst);
        // `others` may include other processes' in-flight reservations, so it can exceed the
        // limit for an instant without anyone having overshot.
        let others = device_usage(region, dev);
        // Retry only if what stood in the way may have been someone's in-flight reservation.
        if others.saturating_add(bytes) > limit {
            return Err(OutOfMemory::OverLimit {
                used: others,
                limit,
            });
        }
    }
    Err(OutOfMemory::OverLimit {
        used: device_usage(region, dev),
        limit,
    })
}

/// Slot `slot`, whose counters of device `dev` the caller writes; `Unregistered` if the region
/// has no such slot or device.
fn own_slot<const S: usize, const D: usize>(
    region: &Region<S, D>,
    slot: usize,
    dev: usize,
) -> Result<&ProcSlot<D>, OutOfMemory> {
    region
        .procs
        .get(slot)
        .filter(|_| dev < D)
        .ok_or(OutOfMemory::Unregistered)
}

/// Whether `bytes` more of `kind` on `dev` fit in the slot's 64-bit counters. Only the slot's
/// writer adds to them, so for the writer the answer holds until it adds.
fn representable<const D: usize>(slot: &ProcSlot<D>, dev: usize, kind: Kind, bytes: u64) -> bool {
    let mem = &slot.used[dev];
    let fits = |c: &crate::sync::AtomicU64| c.load(Ordering::Relaxed).checked_add(bytes).is_some();
    fits(&mem.total) && fits(kind.counter(mem))
}

/// Adds `bytes` of `kind` on `dev` to slot `slot` without checking the limit (the C API's
/// `add_gpu_device_memory_usage`, which records what a caller already allocated). Refused,
/// changing nothing, if the counters cannot represent the sum.
pub fn record<P: Platform, const S: usize, const D: usize>(
    region: &Region<S, D>,
    platform: &P,
    slot: usize,
    dev: usize,
    kind: Kind,
    bytes: u64,
) -> Result<(), OutOfMemory> {
    let own = own_slot(region, slot, dev)?;
    write_reporting(platform, own, slot, |w| {
        if representable(own, dev, kind, bytes) {
            w.add(dev, kind, bytes);
            Ok(())
        } else {
            Err(OutOfMemory::TooLarge)
        }
    })
}

/// Returns `bytes` of `kind` on `dev` to slot `slot`. A release of more than was reserved
/// saturates at 0 and is reported.
pub fn release<P: Platform, const S: usize, const D: usize>(
    region: &Region<S, D>,
    platform: &P,
    slot: usize,
    dev: usize,
    kind: Kind,
    bytes: u64,
) {
    let Ok(own) = own_slot(region, slot, dev) else {
        return;
    };
    let exact = write_reporting(platform, own, slot, |w| w.sub(dev, kind, bytes));
    if !exact {
        platform.report(Problem::Underflow { dev });
    }
}

/// Runs `f` as the slot's writer ([`SlotWriter`]), reporting a sequence that a vanished writer
/// left odd.
fn write_reporting<P: Platform, const D: usize, R>(
    platform: &P,
    own: &ProcSlot<D>,
    slot: usize,
    f: impl FnOnce(&SlotWriter<'_, D>) -> R,
) -> R {
    let writer = SlotWriter::begin(own);
    if writer.took_over() {
        platform.report(Problem::StuckSeqlock { slot });
    }
    f(&writer)
}
