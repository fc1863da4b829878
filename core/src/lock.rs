//! The owner lock: the region's `sem` plus `owner_pid`, which C peers use too, guarding changes to
//! the slot table.
//!
//! What the C original gets wrong, and how this rules it out:
//! - A timeout with no recorded owner ends in `exit(-1)`, and a live owner is waited for forever
//!   (section 2.1 of the reference; B20). Here every acquisition has a deadline and returns
//!   [`LockError::Timeout`]; B17's stale deadline cannot happen since time is read every round.
//! - Recovery from a dead owner is a CAS of `owner_pid` from the dead identity to 0, and only the
//!   CAS winner posts the semaphore, so the dead owner's token comes back exactly once.
//! - Unlock posts unconditionally, even for a caller that does not own the lock. Here release
//!   posts only if its CAS from our identity to 0 succeeds; if someone recovered the lock from us
//!   (we stalled past the grace period), nothing is posted.
//! - B15: `exit_handler` posts the semaphore held by another thread. We never post from exit or
//!   signal paths; a lock held at death is recovered by the survivors.
//! - B13: a new process with the pid of a dead owner is not that owner: identities carry a start
//!   tag, and a same-pid, other-tag owner is dead.
//! - B16: an owner whose liveness cannot be read (EMFILE, no `/proc`) is [`Liveness::Unknown`],
//!   never dead, so a live owner's lock is not stolen.
//! - B19: an interrupted wait sleeps (back-off) instead of spinning.
//! - B12: a holder that dies between `sem_wait` and storing `owner_pid`, or between clearing it and
//!   `sem_post`, loses the token with `owner_pid == 0`: the original then exits after 310 s. Here a
//!   waiter that sees `owner_pid == 0` and the semaphore at 0 for a whole grace period, with
//!   nobody inside the *window*, takes the token over by CAS from 0 to itself, and undoes the
//!   CAS if a re-check after it shows the token was not lost after all.
//! - B14: `owner_pid` holds a start tag above the pid, so a dead owner whose pid was reused is
//!   still recognised as dead (C peers read the low 32 bits, which stay the pid).
//!
//! - A taker that dies in the middle of that takeover must not look like a dead owner whose
//!   token its recoverer may post: the token it was taking over may have been posted already.
//!   So the takeover first CASes [`TAKEOVER_MARKER`] into `owner_pid`, re-checks, and only then
//!   its identity. The marker's pid is 1, which C peers judge alive (they never post for it);
//!   ours judge a marker dead when nobody holds the window, since its creator holds the window
//!   for the marker's whole life, and clear it without posting (found by spec/OwnerLock.tla).
//!
//! The window is a kernel-released record lock (see [`Platform::window_enter`]) that our
//! processes hold while the semaphore and `owner_pid` disagree: around `sem_trywait` + store,
//! and around CAS + `sem_post`. Waiting happens outside it. C peers hold no window; the
//! assumption (stated in spec/OwnerLock.tla) is that none stalls longer than the grace period
//! between its `sem_timedwait` and its store of `owner_pid`.

use crate::layout::Region;
use crate::platform::{Liveness, Platform, Problem, ProcId, SemWait};
use crate::sync::Ordering;

/// What `owner_pid` holds while a lost token is being taken over: pid 1 (so C peers, which check
/// the pid, see a live owner) and a tag no process has ([`ProcId::start_tag`] never makes it).
pub const TAKEOVER_MARKER: ProcId = ProcId((u32::MAX as u64) << 32 | 1);

/// Timing of [`acquire`]. The defaults suit slot-table changes, which take microseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockConfig {
    /// How long to keep trying before [`LockError::Timeout`].
    pub deadline_ns: u64,
    /// How long `owner_pid == 0` with no token and nobody in the window must last before the
    /// token counts as lost.
    pub orphan_grace_ns: u64,
    /// Longest sleep between attempts (the back-off starts at 1/64 of it).
    pub max_backoff_ns: u64,
}

impl LockConfig {
    /// The defaults, usable in constants.
    pub const DEFAULT: LockConfig = LockConfig {
        deadline_ns: 5_000_000_000,
        orphan_grace_ns: 1_000_000_000,
        // Waiters poll (see `acquire`); critical sections take microseconds, so a short
        // ceiling hands the lock on quickly when many processes start at once.
        max_backoff_ns: 200_000,
    };
}

impl Default for LockConfig {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Why [`acquire`] gave up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockError {
    /// A live owner held the lock past the deadline.
    Timeout,
    /// The semaphore is unusable (the region is corrupt).
    SemFailed,
}

/// Proof of holding the owner lock; [`OwnerGuard::release`] (or drop) gives it back.
pub struct OwnerGuard<'a, P: Platform, const S: usize, const D: usize> {
    region: &'a Region<S, D>,
    platform: &'a P,
    me: ProcId,
}

impl<P: Platform, const S: usize, const D: usize> OwnerGuard<'_, P, S, D> {
    /// The identity stored in `owner_pid`.
    pub fn owner(&self) -> ProcId {
        self.me
    }

    /// Releases the lock: CAS `owner_pid` from us to 0, and post only if that succeeded.
    pub fn release(self) {
        // Drop does the work, so an early return or unwinding releases too.
    }
}

impl<P: Platform, const S: usize, const D: usize> Drop for OwnerGuard<'_, P, S, D> {
    fn drop(&mut self) {
        let (region, platform) = (self.region, self.platform);
        platform.window_enter();
        let ours = region
            .owner_pid
            .compare_exchange(self.me.0, 0, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok();
        if ours {
            platform.sem_post(&region.sem);
        } else {
            platform.report(Problem::LockStolen);
        }
        platform.window_exit();
    }
}

/// Takes the owner lock, recovering it from a dead owner or a lost token, within
/// `cfg.deadline_ns`.
pub fn acquire<'a, P: Platform, const S: usize, const D: usize>(
    region: &'a Region<S, D>,
    platform: &'a P,
    cfg: &LockConfig,
) -> Result<OwnerGuard<'a, P, S, D>, LockError> {
    let me = platform.self_id();
    let start = platform.now_ns();
    let mut backoff = (cfg.max_backoff_ns / 64).max(1);
    let mut orphan_since: Option<u64> = None;
    loop {
        match try_take(region, platform, me) {
            SemWait::Acquired => {
                return Ok(OwnerGuard {
                    region,
                    platform,
                    me,
                })
            }
            SemWait::Failed => return Err(LockError::SemFailed),
            SemWait::TimedOut => {}
        }
        let now = platform.now_ns();
        let owner = ProcId(region.owner_pid.load(Ordering::SeqCst));
        if owner == TAKEOVER_MARKER {
            orphan_since = None;
            clear_dead_marker(region, platform);
        } else if owner != ProcId::NONE {
            orphan_since = None;
            recover_dead_owner(region, platform, owner);
        } else if platform.sem_value(&region.sem) == 0 {
            // Another waiter seen in the window does not reset the timer: with the token lost,
            // every window is someone's failing try-take, and resetting on it would starve the
            // takeover under contention. The takeover itself still needs an empty window.
            let since = *orphan_since.get_or_insert(now);
            if now.saturating_sub(since) >= cfg.orphan_grace_ns {
                orphan_since = None;
                if take_over_lost_token(region, platform, me) {
                    return Ok(OwnerGuard {
                        region,
                        platform,
                        me,
                    });
                }
            }
        } else {
            orphan_since = None;
        }
        if now.saturating_sub(start) >= cfg.deadline_ns {
            return Err(LockError::Timeout);
        }
        platform.sleep_ns(backoff);
        backoff = (backoff * 2).min(cfg.max_backoff_ns);
    }
}

/// One non-blocking attempt, inside the window so the token and `owner_pid` never disagree
/// unseen.
fn try_take<P: Platform, const S: usize, const D: usize>(
    region: &Region<S, D>,
    platform: &P,
    me: ProcId,
) -> SemWait {
    platform.window_enter();
    let got = platform.sem_wait(&region.sem, 0);
    if got == SemWait::Acquired {
        region.owner_pid.store(me.0, Ordering::SeqCst);
    }
    platform.window_exit();
    got
}

/// If `owner` is dead, returns its token exactly once: only the CAS winner posts.
fn recover_dead_owner<P: Platform, const S: usize, const D: usize>(
    region: &Region<S, D>,
    platform: &P,
    owner: ProcId,
) {
    if platform.liveness(owner) != Liveness::Dead {
        return;
    }
    platform.window_enter();
    let won = region
        .owner_pid
        .compare_exchange(owner.0, 0, Ordering::SeqCst, Ordering::SeqCst)
        .is_ok();
    if won {
        platform.sem_post(&region.sem);
    }
    platform.window_exit();
    if won {
        platform.report(Problem::RecoveredDeadOwner { pid: owner.pid() });
    }
}

/// Clears a takeover marker whose creator died (nobody else holds the window, which a live
/// creator holds throughout), without posting: no token came with it.
fn clear_dead_marker<P: Platform, const S: usize, const D: usize>(
    region: &Region<S, D>,
    platform: &P,
) {
    platform.window_enter();
    let cleared = !platform.window_held_by_other()
        && region
            .owner_pid
            .compare_exchange(TAKEOVER_MARKER.0, 0, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok();
    platform.window_exit();
    if cleared {
        platform.report(Problem::RecoveredLostToken);
    }
}

/// No owner, no token, and nobody between the two.
fn token_looks_lost<P: Platform, const S: usize, const D: usize>(
    region: &Region<S, D>,
    platform: &P,
) -> bool {
    platform.sem_value(&region.sem) == 0 && !platform.window_held_by_other()
}

/// Inherits a lost token: CAS of `owner_pid` from 0 to [`TAKEOVER_MARKER`], re-validation, then
/// CAS from the marker to us.
///
/// The checks before the CAS are not atomic with it: a whole release (CAS to 0, post, leave the
/// window) can run between them, and the CAS would then win a lock whose token was just posted.
/// Once `owner_pid` holds the marker no release or recovery can succeed any more, so the checks
/// after the CAS see every transition that began before it: a release that cleared `owner_pid`
/// is still in its window or has posted. If anything moved, the marker is taken back. Dying
/// with the marker in place leaves nothing a recoverer would post for.
fn take_over_lost_token<P: Platform, const S: usize, const D: usize>(
    region: &Region<S, D>,
    platform: &P,
    me: ProcId,
) -> bool {
    platform.window_enter();
    let marker = TAKEOVER_MARKER.0;
    let mut won = token_looks_lost(region, platform)
        && region
            .owner_pid
            .compare_exchange(0, marker, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok();
    if won {
        let still_lost = !platform.window_held_by_other()
            && platform.sem_value(&region.sem) == 0
            && !platform.window_held_by_other();
        let next = if still_lost { me.0 } else { 0 };
        // Only we (alive, in the window) can move the marker.
        won = region
            .owner_pid
            .compare_exchange(marker, next, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
            && still_lost;
    }
    platform.window_exit();
    if won {
        platform.report(Problem::RecoveredLostToken);
    }
    won
}
