//! loom: the owner lock (core/src/lock.rs): mutual exclusion, dead-owner recovery exactly once,
//! lost-token takeover, the semaphore never above 1.
//!
//! The sim platform panics as soon as a `sem_post` takes the semaphore above 1, and
//! `SimProc::with_owner_lock` panics if two live processes are inside the critical section or if
//! the holder does not own the token (semaphore 0, `owner_pid` = holder).
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p hami-model --release
//! --target-dir target/loom --test loom_lock`
#![cfg(loom)]

use hami_model::rt::{thread, Arc};
use hami_model::{model_lock_cfg, ProblemKind, Sim, SimProc};
use hami_shm::lock::{self, LockConfig};
use hami_shm::slots;
use hami_shm::sync::Ordering;

mod mutant_lock;

type S = Sim<2, 1>;

/// The lock after everything settled: free, one token.
fn assert_free(sim: &S) {
    assert_eq!(sim.world.sem_value(), 1, "the token count is not 1 at rest");
    assert_eq!(sim.region.raw_owner_pid().load(Ordering::Relaxed), 0);
}

/// Takes and releases the lock as a fresh process (recovering whatever is left), then checks
/// the lock is free.
fn settle(sim: &Arc<S>, idx: usize) {
    let p = SimProc::spawn(sim, idx);
    p.with_owner_lock(&model_lock_cfg(), |_| ())
        .expect("an uncontended acquire after everyone finished must succeed");
    p.exit();
    assert_free(sim);
}

/// Two processes take the lock and claim a slot each inside it: mutual exclusion (checked on
/// entry), the critical sections are ordered (an unprotected counter in the region is exact),
/// and the slots are distinct.
#[test]
fn lock_mutual_exclusion_and_claims() {
    loom::model(|| {
        let sim = S::initialised([0]);
        let handles: Vec<_> = (0..2)
            .map(|i| {
                let p = SimProc::spawn(&sim, i);
                thread::spawn(move || {
                    let slot = p
                        .with_owner_lock(&model_lock_cfg(), |g| {
                            let c = &p.region().raw_procs()[1].raw_unused()[1];
                            let v = c.load(Ordering::Relaxed);
                            c.store(v + 1, Ordering::Relaxed);
                            slots::claim(p.region(), &p, g).expect("two slots for two")
                        })
                        .expect("no timeout without a crash");
                    p.exit();
                    slot
                })
            })
            .collect();
        let got: Vec<usize> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert_ne!(got[0], got[1], "two processes claimed one slot");
        assert_eq!(
            sim.region.raw_procs()[1].raw_unused()[1].load(Ordering::Relaxed),
            2
        );
        assert_eq!(sim.region.raw_proc_num().load(Ordering::Relaxed), 2);
        assert_free(&sim);
    });
}

/// Process 0 takes the lock, claims, releases, but dies at crash point `k` (each of its
/// steps in turn, in separate models); process 1 takes the lock concurrently. Process 1 must
/// get it within its deadline (waiting, recovering the dead owner, or taking over the lost
/// token), the semaphore never exceeds 1, and a final acquire finds the lock free.
#[test]
fn lock_recovers_from_a_crash_at_every_step() {
    // Steps of process 0's run without a crash: try_take (window, sem_wait, window: 6 points)
    // and release (window, sem_post, window: 6 points).
    for k in 0..=12 {
        loom::model(move || {
            let sim = S::initialised([0]);
            let victim = SimProc::spawn(&sim, 0);
            let waiter = SimProc::spawn(&sim, 1);
            let v = thread::spawn(move || {
                victim.crash_at_step(k);
                let out = victim.run(|p| {
                    p.with_owner_lock(&model_lock_cfg(), |g| {
                        slots::claim(p.region(), p, g).unwrap()
                    })
                });
                if !victim.is_dead() {
                    victim.exit();
                }
                out
            });
            let w = thread::spawn(move || {
                let got = waiter.with_owner_lock(&model_lock_cfg(), |_| ());
                waiter.exit();
                got
            });
            w.join()
                .unwrap()
                .expect("the survivor must get the lock within its deadline");
            v.join().unwrap();
            settle(&sim, 2);
            assert_eq!(sim.world.problems(ProblemKind::LockStolen), 0);
        });
    }
}

/// A process holds the lock and is killed; two others need it. Exactly one of them recovers
/// the token (only the CAS winner posts), both get the lock in turn.
#[test]
fn lock_dead_owner_recovered_exactly_once() {
    loom::model(|| {
        let sim = S::initialised([0]);
        let victim = SimProc::spawn(&sim, 0);
        let guard = lock::acquire(&sim.region, &victim, &model_lock_cfg()).unwrap();
        victim.die_holding(guard);
        let handles: Vec<_> = (1..3)
            .map(|i| {
                let p = SimProc::spawn(&sim, i);
                thread::spawn(move || {
                    p.with_owner_lock(&model_lock_cfg(), |_| ())
                        .expect("a dead owner must be recovered within the deadline");
                    p.exit();
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(sim.world.problems(ProblemKind::RecoveredDeadOwner), 1);
        assert_free(&sim);
    });
}

/// A token lost with `owner_pid == 0` (its holder died between `sem_wait` and storing
/// `owner_pid`: bug B12) and two processes that need the lock: each must get it, one at a
/// time, and the lock must end up free with one token.
///
/// This failed against an earlier core/src/lock.rs, whose takeover checked "semaphore 0 and
/// nobody in the window" and then CASed `owner_pid` from 0, as three separate steps: process
/// A takes the token over and, inside its critical section and release (CAS A→0, post, leave
/// window), runs entirely between B's reading of the semaphore (0: A held it) and B's reading
/// of the window (empty: A left it); B's CAS from 0 then succeeds and B "holds" a lock whose
/// semaphore is 1. Core now re-validates after the CAS; `mutation_takeover_without_revalidation`
/// plants the old code back and must fail.
///
/// The schedule needs three preemptions, so this model runs with a bound of at least 3.
#[test]
fn lock_lost_token_is_taken_over_once() {
    lost_token_model(|p| {
        p.with_owner_lock(&model_lock_cfg(), |_| ())
            .expect("a lost token must be taken over within the deadline");
    });
}

/// Builder with the preemption bound raised to at least `min`.
fn builder_with_bound(min: usize) -> loom::model::Builder {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(b.preemption_bound.unwrap_or(min).max(min));
    b
}

/// Two processes that each take the lock once, starting from a token lost with
/// `owner_pid == 0`; `take` takes, checks and releases the lock.
fn lost_token_model(take: fn(&SimProc<2, 1>)) {
    builder_with_bound(3).check(move || {
        let sim = S::initialised([0]);
        sim.world.force_sem(0);
        let handles: Vec<_> = (0..2)
            .map(|i| {
                let p = SimProc::spawn(&sim, i);
                thread::spawn(move || {
                    take(&p);
                    p.exit();
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_free(&sim);
    });
}

/// The takeover without its re-check after the CAS (the earlier core) in the same model: two
/// holders. Mutation test.
#[test]
#[should_panic]
fn mutation_takeover_without_revalidation() {
    lost_token_model(|p| {
        mutant_lock::with_lock(p, &model_lock_cfg(), || ())
            .expect("a lost token must be taken over within the deadline");
    });
}

/// Upstream's recovery without CAS (B9, `mutant_lock`): two waiters of a dead holder both
/// post; the sim's `sem_post` check must catch the semaphore going to 2. Mutation test.
#[test]
#[should_panic(expected = "semaphore value exceeded 1")]
fn mutation_recovery_without_cas() {
    loom::model(|| {
        let sim = S::initialised([0]);
        let victim = SimProc::spawn(&sim, 0);
        let guard = lock::acquire(&sim.region, &victim, &model_lock_cfg()).unwrap();
        victim.die_holding(guard);
        let handles: Vec<_> = (1..3)
            .map(|i| {
                let p = SimProc::spawn(&sim, i);
                thread::spawn(move || {
                    mutant_lock::take_and_release_recovering_without_cas(&p, &model_lock_cfg());
                    p.exit();
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    });
}

/// A live holder is waited for until the deadline, then `Timeout` (a logical deadline ends
/// every wait in a model); the lock is intact afterwards.
#[test]
fn lock_times_out_on_a_live_holder() {
    loom::model(|| {
        let sim = S::initialised([0]);
        let holder = SimProc::spawn(&sim, 0);
        let guard = lock::acquire(&sim.region, &holder, &model_lock_cfg()).unwrap();
        let p = SimProc::spawn(&sim, 1);
        let cfg = LockConfig {
            deadline_ns: 64,
            ..model_lock_cfg()
        };
        assert!(matches!(
            lock::acquire(&sim.region, &p, &cfg),
            Err(lock::LockError::Timeout)
        ));
        drop(guard);
        assert_free(&sim);
    });
}
