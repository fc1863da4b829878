//! The slot table: claim, release on exit, lazy reaping, finding our slot again.
//!
//! What the C original gets wrong, and how this rules it out:
//! - B3, B4, B5, B6: removing a slot compacts the table (the last slot moves into the hole, with
//!   or without the lock), so other processes' cached slots go stale, usage is counted twice or
//!   lost, and an odd seqlock is copied. Here no slot ever moves: a claim reuses a hole (pid 0) or
//!   appends; reaping makes holes.
//! - B30: the table-full check runs before dead slots are cleared, so a table full of dead
//!   processes refuses everyone (then `exit`). Here a full table is reaped, then retried, and a
//!   still-full table is an error the caller survives.
//! - B7: the exit handler leaves the usage counted. Here release zeroes the usage before freeing
//!   the slot; reaping does the same for SIGKILLed processes and for slots C peers freed.
//! - B21, B22: a dead process's slot whose pid now belongs to an unrelated process is dead by its
//!   start tag, and is reaped; a reused slot has every field reset, `hostpid` included.
//! - A C peer may still move our slot. [`find_own`] re-validates the cached index (pid and tag)
//!   and searches again when it no longer matches.
//!
//! Claims and reaps run under the owner lock ([`crate::lock::OwnerGuard`]); release on exit runs
//! without it, with atomics only, so it is async-signal-safe.

use crate::layout::{ProcSlot, Region, STATUS_EXITED, STATUS_RUNNING};
use crate::lock::OwnerGuard;
use crate::platform::{Liveness, Platform, ProcId};
use crate::seqlock;
use crate::sync::Ordering;

/// Dead slots one [`reap`] call examines and frees at most, so the work per call is bounded.
pub const REAP_BATCH: usize = 16;

/// Why no slot could be claimed; the process runs without a slot (its usage is then enforced
/// within the process only) and says so.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClaimError {
    /// All slots belong to live processes.
    TableFull,
}

/// The identity recorded in a slot: its pid and the start tag in `unused[0]`, which holds the
/// pid beside the tag. A tag stored for another pid is not this slot's: a C peer's compaction
/// can copy one of our slots over a vacated one and later append there with its own pid,
/// leaving our old tag, which would make its live process look dead (found by spec/Slots.tla).
/// Such a slot is judged by pid only, as C peers' slots are.
pub fn slot_owner<const D: usize>(slot: &ProcSlot<D>) -> ProcId {
    let pid = slot.pid.load(Ordering::Acquire);
    let word = slot.unused[0].load(Ordering::Relaxed);
    let tag = if (word >> 32) as u32 == pid as u32 {
        word as u32
    } else {
        0
    };
    ProcId::new(pid, tag)
}

/// A process of the region as the container's process views list it (`nvidia-smi` inside the
/// container): its pid in the container, its host pid (0 while unknown) and the bytes the region
/// counts for it on one device, its context included.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Listed {
    /// Pid in the container's namespace.
    pub pid: u32,
    /// Pid as the driver reports it; 0 while unknown.
    pub hostpid: u32,
    /// Bytes counted on the device.
    pub bytes: u64,
}

impl Listed {
    /// The pid NVML reports for it: its host pid, or its own pid while the host pid is unknown
    /// (a driver that reports the container's pids).
    pub fn nvml_pid(&self) -> u32 {
        if self.hostpid != 0 {
            self.hostpid
        } else {
            self.pid
        }
    }
}

/// The region's processes that still run, with what each holds on device `dev`, in slot order.
/// A process that is certainly dead is left out even before its slot is reaped.
pub fn listed<'a, P: Platform, const S: usize, const D: usize>(
    region: &'a Region<S, D>,
    platform: &'a P,
    dev: usize,
) -> impl Iterator<Item = Listed> + 'a {
    region
        .live_range()
        .iter()
        .filter(move |s| dev < D && s.pid.load(Ordering::Relaxed) > 0)
        .filter(move |s| platform.liveness(slot_owner(s)) != Liveness::Dead)
        .map(move |s| Listed {
            pid: s.pid.load(Ordering::Relaxed) as u32,
            hostpid: s.hostpid.load(Ordering::Relaxed).max(0) as u32,
            bytes: seqlock::read(s, dev).0.total,
        })
}

/// The `unused[0]` word for `me`: pid above, tag below.
fn identity_word(me: ProcId) -> u64 {
    (u64::from(me.pid() as u32) << 32) | u64::from(me.tag())
}

/// Whether `slot` belongs to `me`. A slot written by a C peer carries tag 0 and matches by pid.
fn owned_by<const D: usize>(slot: &ProcSlot<D>, me: ProcId) -> bool {
    let owner = slot_owner(slot);
    owner.pid() == me.pid() && (owner.tag() == me.tag() || owner.tag() == 0)
}

/// Resets every field of a slot and gives it to `me`; the pid is stored last, with release.
fn occupy<const D: usize>(slot: &ProcSlot<D>, me: ProcId) {
    slot.pid.store(0, Ordering::Release);
    seqlock::force_zero(slot);
    slot.seqlock.store(0, Ordering::Relaxed);
    slot.hostpid.store(0, Ordering::Relaxed);
    for m in &slot.monitorused {
        m.store(0, Ordering::Relaxed);
    }
    for u in &slot.device_util {
        u.sm_util.store(0, Ordering::Relaxed);
    }
    slot.status.store(STATUS_RUNNING, Ordering::Relaxed);
    slot.unused[0].store(identity_word(me), Ordering::Relaxed);
    slot.pid.store(me.pid(), Ordering::Release);
}

/// Claims a slot for `guard`'s owner: its own slot from a previous incarnation or an earlier
/// claim, else a hole, else a new slot at the end; if the table is full, reaps and retries once.
/// Returns the slot index.
pub fn claim<P: Platform, const S: usize, const D: usize>(
    region: &Region<S, D>,
    platform: &P,
    guard: &OwnerGuard<'_, P, S, D>,
) -> Result<usize, ClaimError> {
    let me = guard.owner();
    for attempt in 0..2 {
        let n = region.proc_num_bounded();
        let live = &region.procs[..n];
        let reuse = live
            .iter()
            .position(|s| s.pid.load(Ordering::Acquire) == me.pid())
            .or_else(|| live.iter().position(|s| s.pid.load(Ordering::Acquire) == 0));
        if let Some(i) = reuse {
            occupy(&region.procs[i], me);
            return Ok(i);
        }
        if n < S {
            occupy(&region.procs[n], me);
            region.proc_num.store(n as i32 + 1, Ordering::Release);
            return Ok(n);
        }
        if attempt == 0 && reap(region, platform, guard) == 0 {
            break;
        }
    }
    Err(ClaimError::TableFull)
}

/// Frees the slot of an exiting process: zero its usage, mark it exited, then pid 0. Atomics
/// only, no lock, no waiting, so it may run in a signal handler that interrupted our own writer.
/// Does nothing unless the slot is still `me`'s.
pub fn release_on_exit<const S: usize, const D: usize>(
    region: &Region<S, D>,
    index: usize,
    me: ProcId,
) {
    let Some(slot) = region.procs.get(index) else {
        return;
    };
    if !owned_by(slot, me) {
        return;
    }
    free(slot);
}

/// What an exiting process does with its slot: frees it ([`release_on_exit`]) if it counts no
/// memory, else leaves it as a crash would, for a reaper to free once the process is dead. The
/// driver gives a process's memory back only as the process ends, after every exit handler
/// (its device files close before it turns zombie): zeroing the count here would let a peer be
/// admitted into memory still in use (on an H200, 32 processes exiting while others waited for
/// room put the GPU 1.8 GiB past an 8 GiB limit). Returns whether the slot was freed.
pub fn release_on_exit_if_idle<const S: usize, const D: usize>(
    region: &Region<S, D>,
    index: usize,
    me: ProcId,
) -> bool {
    let Some(slot) = region.procs.get(index) else {
        return false;
    };
    let idle = slot
        .used
        .iter()
        .all(|m| m.total.load(Ordering::Relaxed) == 0);
    if idle {
        release_on_exit(region, index, me);
    }
    idle
}

/// Zeroes a slot's usage and marks it free.
fn free<const D: usize>(slot: &ProcSlot<D>) {
    seqlock::force_zero(slot);
    slot.status.store(STATUS_EXITED, Ordering::Relaxed);
    slot.unused[0].store(0, Ordering::Relaxed);
    slot.pid.store(0, Ordering::Release);
}

/// Frees up to [`REAP_BATCH`] slots whose processes are dead, and zeroes the usage that C peers'
/// exit handlers leave in freed slots. Returns how many slots it freed.
pub fn reap<P: Platform, const S: usize, const D: usize>(
    region: &Region<S, D>,
    platform: &P,
    guard: &OwnerGuard<'_, P, S, D>,
) -> usize {
    reap_released(region, platform, guard, &mut |_| false)
}

/// [`reap`], leaving a dead process's slot while `on_gpu` says the driver still holds memory
/// for it (its teardown outlives the process): freeing the count earlier would admit others
/// into memory that is still in use.
pub fn reap_released<P: Platform, const S: usize, const D: usize>(
    region: &Region<S, D>,
    platform: &P,
    guard: &OwnerGuard<'_, P, S, D>,
    on_gpu: &mut dyn FnMut(&ProcSlot<D>) -> bool,
) -> usize {
    let me = guard.owner();
    let mut freed = 0;
    for slot in region.live_range() {
        if freed == REAP_BATCH {
            break;
        }
        let owner = slot_owner(slot);
        if owner.pid() == 0 {
            if slot
                .used
                .iter()
                .any(|m| m.total.load(Ordering::Relaxed) != 0)
            {
                seqlock::force_zero(slot);
            }
            continue;
        }
        if owner == me {
            continue;
        }
        if platform.liveness(owner) == Liveness::Dead && !on_gpu(slot) {
            free(slot);
            freed += 1;
        }
    }
    freed
}

/// Finds `me`'s slot: `cached` if it still holds our pid and tag, else a search of the table
/// (a C peer may have moved it). `None` if we have no slot.
pub fn find_own<const S: usize, const D: usize>(
    region: &Region<S, D>,
    cached: usize,
    me: ProcId,
) -> Option<usize> {
    if let Some(slot) = region.procs.get(cached) {
        if cached < region.proc_num_bounded() && owned_by(slot, me) {
            return Some(cached);
        }
    }
    region.live_range().iter().position(|s| owned_by(s, me))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tag_left_beside_another_pid_is_not_the_slots() {
        let r = crate::layout::Region::<1, 1>::zeroed();
        let s = &r.procs[0];
        let ours = ProcId::new(100, ProcId::start_tag(5));
        s.unused[0].store(identity_word(ours), Ordering::Relaxed);
        s.pid.store(100, Ordering::Relaxed);
        assert_eq!(slot_owner(s), ours);
        // A C peer's compaction moved the slot and a C peer appended here with its own pid:
        // unused[0] still holds our word, which must not make pid 200 look like a dead process.
        s.pid.store(200, Ordering::Relaxed);
        assert_eq!(slot_owner(s), ProcId::new(200, 0));
    }
}
