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
use crate::seqlock::{self, Kind};
use crate::sync::{fence, Ordering};

/// Re-checks after a rollback, for reservations that failed only because of a concurrent one.
pub const RETRIES: usize = 2;

/// The request does not fit under the limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutOfMemory {
    /// Bytes in use on the device (all live slots) when the request was refused.
    pub used: u64,
    /// The device's limit.
    pub limit: u64,
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
    let (Some(own), true) = (region.procs.get(slot), dev < D) else {
        return Err(OutOfMemory { used: 0, limit: 0 });
    };
    let limit = region.limit[dev].load(Ordering::Relaxed);
    for _ in 0..=RETRIES {
        write_reporting(platform, own, slot, |s| seqlock::add(s, dev, kind, bytes));
        if limit == 0 {
            return Ok(());
        }
        fence(Ordering::SeqCst);
        let used = device_usage(region, dev);
        if used <= limit {
            return Ok(());
        }
        write_reporting(platform, own, slot, |s| seqlock::sub(s, dev, kind, bytes));
        fence(Ordering::SeqCst);
        // `others` may include other processes' in-flight reservations, so it can exceed the
        // limit for an instant without anyone having overshot.
        let others = device_usage(region, dev);
        // Retry only if what stood in the way may have been someone's in-flight reservation.
        if others.saturating_add(bytes) > limit {
            return Err(OutOfMemory {
                used: others,
                limit,
            });
        }
    }
    Err(OutOfMemory {
        used: device_usage(region, dev),
        limit,
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
    let (Some(own), true) = (region.procs.get(slot), dev < D) else {
        return;
    };
    let exact = write_reporting(platform, own, slot, |s| seqlock::sub(s, dev, kind, bytes));
    if !exact {
        platform.report(Problem::Underflow { dev });
    }
}

/// [`seqlock::write`], reporting a sequence that a vanished writer left odd.
fn write_reporting<P: Platform, const D: usize, R>(
    platform: &P,
    own: &ProcSlot<D>,
    slot: usize,
    f: impl FnOnce(&ProcSlot<D>) -> R,
) -> R {
    let (result, took_over) = seqlock::write(own, f);
    if took_over {
        platform.report(Problem::StuckSeqlock { slot });
    }
    result
}
