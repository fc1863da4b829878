//! The host-pid claim: how a process makes a pid of NVML's process list its own, in its slot's
//! `hostpid`, so that no pid is claimed by two live slots (HAMi's monitor and the NVML hooks
//! match NVML's entries to slots by it). Finding the candidate pid (NVML, a probe allocation) is
//! the caller's; this is only the shared-memory step.
//!
//! The slot's `hostpid` goes 0 → pid (CAS), then the other live slots are read for the same
//! value; whoever sees it there withdraws (CAS back to 0) and tries again later. Every access is
//! seq-cst: each claimant stores, then reads the others' (the store-buffering pattern), so of two
//! processes claiming one pid at once at least one sees the other. Both may withdraw; two never
//! both win (`model/tests/shuttle_host_pid.rs`).

use crate::layout::Region;

/// How a claim ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claim {
    /// The pid is ours, and no other live slot holds it.
    Won,
    /// Another live slot holds it too; ours is back to 0.
    Conflict,
    /// Our slot already had a host pid (set by HAMi's monitor or the C API): keep it.
    Preset(u32),
    /// No such slot, or the pid does not fit the field (0, or beyond `i32`).
    Impossible,
}

/// Claims host pid `pid` for slot `mine`.
pub fn claim<const S: usize, const D: usize>(
    region: &Region<S, D>,
    mine: usize,
    pid: u32,
) -> Claim {
    let (Some(slot), Ok(v)) = (region.slot(mine), i32::try_from(pid)) else {
        return Claim::Impossible;
    };
    if v == 0 {
        return Claim::Impossible;
    }
    if let Err(cur) = slot.claim_hostpid(v) {
        return Claim::Preset(cur as u32);
    }
    if claimed_by_others(region, mine).any(|h| h == pid) {
        slot.withdraw_hostpid(v);
        return Claim::Conflict;
    }
    Claim::Won
}

/// Host pids claimed by live slots other than `mine` (seq-cst reads, see the module docs).
pub fn claimed_by_others<const S: usize, const D: usize>(
    region: &Region<S, D>,
    mine: usize,
) -> impl Iterator<Item = u32> + '_ {
    region
        .live_range()
        .iter()
        .enumerate()
        .filter(move |&(i, _)| i != mine)
        .filter_map(|(_, s)| s.claimed_hostpid())
        .filter(|&h| h > 0)
        .map(|h| h as u32)
}

/// Whether another live slot has no host pid yet: a peer that may be looking right now, which
/// could make a lone new pid in NVML's list its own (relaxed glances; a hint).
pub fn peers_looking<const S: usize, const D: usize>(region: &Region<S, D>, mine: usize) -> bool {
    region
        .live_range()
        .iter()
        .enumerate()
        .any(|(i, s)| i != mine && s.pid() != 0 && s.hostpid() == 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::Ordering;
    extern crate std;
    use std::vec::Vec;

    fn region() -> Region<4, 1> {
        let r = Region::<4, 1>::zeroed();
        r.proc_num.store(3, Ordering::Relaxed);
        for (i, pid) in [(0, 11), (1, 12), (2, 13)] {
            r.procs[i].pid.store(pid, Ordering::Relaxed);
        }
        r
    }

    #[test]
    fn claim_wins_conflicts_and_respects_a_preset() {
        let r = region();
        assert_eq!(claim(&r, 0, 500), Claim::Won);
        assert_eq!(r.procs[0].hostpid.load(Ordering::Relaxed), 500);
        assert!(peers_looking(&r, 0));
        assert_eq!(claimed_by_others(&r, 1).collect::<Vec<_>>(), [500]);
        // Slot 1 claims the same pid: it sees slot 0's and withdraws.
        assert_eq!(claim(&r, 1, 500), Claim::Conflict);
        assert_eq!(r.procs[1].hostpid.load(Ordering::Relaxed), 0);
        assert_eq!(r.procs[0].hostpid.load(Ordering::Relaxed), 500);
        // A freed slot's stale host pid does not count.
        r.procs[0].pid.store(0, Ordering::Relaxed);
        assert_eq!(claim(&r, 1, 500), Claim::Won);
        // A host pid already set by someone else stays.
        r.procs[2].hostpid.store(77, Ordering::Relaxed);
        assert_eq!(claim(&r, 2, 600), Claim::Preset(77));
        assert_eq!(claim(&r, 2, 77), Claim::Won);
        assert!(!peers_looking(&r, 1));
        assert_eq!(claim(&r, 9, 600), Claim::Impossible);
        assert_eq!(claim(&r, 1, 0), Claim::Impossible);
        assert_eq!(claim(&r, 1, u32::MAX), Claim::Impossible);
    }
}
