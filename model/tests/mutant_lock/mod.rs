//! The owner lock's acquire (core/src/lock.rs) as a test-local copy with a bug planted (core's
//! helpers are private, so the mutant is a copy): the lost-token takeover CASes `owner_pid`
//! from 0 after checking "semaphore 0, nobody in the window", and does not re-check after the
//! CAS, as an earlier core did. A whole release (CAS to 0, post, leave the window) can run
//! between the checks and the CAS, which then wins a lock whose token was just posted: two
//! holders.
//!
//! Also upstream's recovery without CAS ([`take_and_release_recovering_without_cas`]).
//!
//! Used by `loom_lock.rs` and `shuttle_scenario.rs` to show that their checks catch each bug.
#![allow(dead_code)]

use core::mem::ManuallyDrop;

use hami_model::SimProc;
use hami_shm::lock::LockConfig;
use hami_shm::platform::{Liveness, Platform, Problem, ProcId, SemWait};
use hami_shm::sync::Ordering;

/// Takes the lock with upstream's wrong recovery (B9), calling the platform directly: on
/// seeing a dead owner, clear `owner_pid` and post, without a CAS. Then releases as core does,
/// but posts unconditionally (the recoverer may have cleared `owner_pid` under us). Two
/// waiters of a dead holder can both post: the sim's `sem_post` check must catch it.
pub fn take_and_release_recovering_without_cas<const S: usize, const D: usize>(
    p: &SimProc<S, D>,
    cfg: &LockConfig,
) {
    let r = p.region();
    let start = p.now_ns();
    loop {
        p.window_enter();
        let got = p.sem_wait(r.sem(), 0) == SemWait::Acquired;
        if got {
            r.raw_owner_pid().store(p.self_id().0, Ordering::SeqCst);
        }
        p.window_exit();
        if got {
            break;
        }
        let owner = ProcId(r.raw_owner_pid().load(Ordering::SeqCst));
        if owner != ProcId::NONE && p.liveness(owner) == Liveness::Dead {
            r.raw_owner_pid().store(0, Ordering::SeqCst); // no CAS
            p.sem_post(r.sem());
        }
        assert!(p.now_ns() - start < cfg.deadline_ns, "timeout");
        p.sleep_ns(1);
    }
    let _ = r
        .raw_owner_pid()
        .compare_exchange(p.id().0, 0, Ordering::SeqCst, Ordering::SeqCst);
    p.sem_post(r.sem());
}

/// Holds the lock; dropping releases it as core's `OwnerGuard` does.
pub struct Guard<'a, const S: usize, const D: usize> {
    p: &'a SimProc<S, D>,
    me: ProcId,
}

impl<const S: usize, const D: usize> Drop for Guard<'_, S, D> {
    fn drop(&mut self) {
        let r = self.p.region();
        self.p.window_enter();
        let ours = r
            .raw_owner_pid()
            .compare_exchange(self.me.0, 0, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok();
        if ours {
            self.p.sem_post(r.sem());
        } else {
            self.p.report(Problem::LockStolen);
        }
        self.p.window_exit();
    }
}

/// Acquires, runs `f` in the critical section with the same checks as
/// `SimProc::with_owner_lock`, releases. `Err(())` on timeout.
pub fn with_lock<R, const S: usize, const D: usize>(
    p: &SimProc<S, D>,
    cfg: &LockConfig,
    f: impl FnOnce() -> R,
) -> Result<R, ()> {
    let guard = ManuallyDrop::new(acquire(p, cfg)?);
    p.check_holder();
    p.world().cs_enter(p.idx());
    let r = f();
    p.check_holder();
    p.world().cs_exit(p.idx());
    drop(ManuallyDrop::into_inner(guard));
    Ok(r)
}

/// Core's `lock::acquire` with the takeover's re-check removed.
pub fn acquire<'a, const S: usize, const D: usize>(
    p: &'a SimProc<S, D>,
    cfg: &LockConfig,
) -> Result<Guard<'a, S, D>, ()> {
    let r = p.region();
    let me = p.self_id();
    let start = p.now_ns();
    let mut backoff = (cfg.max_backoff_ns / 64).max(1);
    let mut orphan_since: Option<u64> = None;
    loop {
        p.window_enter();
        let got = p.sem_wait(r.sem(), 0);
        if got == SemWait::Acquired {
            r.raw_owner_pid().store(me.0, Ordering::SeqCst);
        }
        p.window_exit();
        if got == SemWait::Acquired {
            return Ok(Guard { p, me });
        }
        let now = p.now_ns();
        let owner = ProcId(r.raw_owner_pid().load(Ordering::SeqCst));
        if owner != ProcId::NONE {
            orphan_since = None;
            if p.liveness(owner) == Liveness::Dead {
                p.window_enter();
                let won = r
                    .raw_owner_pid()
                    .compare_exchange(owner.0, 0, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok();
                if won {
                    p.sem_post(r.sem());
                }
                p.window_exit();
                if won {
                    p.report(Problem::RecoveredDeadOwner { pid: owner.pid() });
                }
            }
        } else if p.sem_value(r.sem()) == 0 {
            let since = *orphan_since.get_or_insert(now);
            if now.saturating_sub(since) >= cfg.orphan_grace_ns && take_over(p, me) {
                return Ok(Guard { p, me });
            }
        } else {
            orphan_since = None;
        }
        if now.saturating_sub(start) >= cfg.deadline_ns {
            return Err(());
        }
        p.sleep_ns(backoff);
        backoff = (backoff * 2).min(cfg.max_backoff_ns);
    }
}

fn looks_lost<const S: usize, const D: usize>(p: &SimProc<S, D>) -> bool {
    p.sem_value(p.region().sem()) == 0 && !p.window_held_by_other()
}

fn take_over<const S: usize, const D: usize>(p: &SimProc<S, D>, me: ProcId) -> bool {
    let r = p.region();
    p.window_enter();
    let won = looks_lost(p)
        && r.raw_owner_pid()
            .compare_exchange(0, me.0, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok();
    p.window_exit();
    if won {
        p.report(Problem::RecoveredLostToken);
    }
    won
}
