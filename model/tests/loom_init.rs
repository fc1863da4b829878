//! loom: region initialisation (core/src/init.rs): exactly one initialiser, everyone sees the
//! initialiser's values once `ensure_initialised` returns, a crashed initialiser wedges no one.
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p hami-model --release
//! --target-dir target/loom --test loom_init`
#![cfg(loom)]

use hami_model::rt::{thread, Arc};
use hami_model::{Sim, SimProc, GLIBC_SEM_SHARED};
use hami_shm::init::{self, InitError, InitOutcome};
use hami_shm::layout::{MAGIC, MAJOR_VERSION, MINOR_VERSION};
use hami_shm::sync::Ordering;

const LIMIT: u64 = 1 << 30;

/// What every process must see after `ensure_initialised` returned Ok.
fn assert_ready<const S: usize>(p: &SimProc<S, 1>) {
    let r = p.region();
    assert!(init::is_initialised(r));
    assert_eq!(
        r.raw_limit()[0].load(Ordering::Relaxed),
        LIMIT,
        "limit not visible after init"
    );
    assert_eq!(r.raw_sm_limit()[0].load(Ordering::Relaxed), 100);
    assert_eq!(r.raw_major_version().load(Ordering::Relaxed), MAJOR_VERSION);
    assert_eq!(r.raw_minor_version().load(Ordering::Relaxed), MINOR_VERSION);
    assert_eq!(
        r.raw_sem().raw_words()[1].load(Ordering::Relaxed),
        GLIBC_SEM_SHARED
    );
    assert_eq!(
        r.raw_sem_postinit().raw_words()[1].load(Ordering::Relaxed),
        GLIBC_SEM_SHARED
    );
}

/// `n` processes call `ensure_initialised` at once, waiting at most `timeout` (logical ns) for
/// the init lock. A waiter may time out only in schedules where the holder is starved that
/// long (a defined outcome: it runs degraded); everyone else returns Ok and sees the
/// initialiser's values, and exactly one of all is the initialiser.
fn race<const S: usize>(n: usize, timeout: u64) {
    let sim = Arc::new(Sim::<S, 1>::new());
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let p = SimProc::spawn(&sim, i);
            thread::spawn(move || {
                let out = p.ensure_initialised([LIMIT], timeout);
                match out {
                    Ok(_) => assert_ready(&p),
                    Err(e) => assert_eq!(e, InitError::LockTimeout),
                }
                p.exit();
                out
            })
        })
        .collect();
    let outs: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let inits = outs
        .iter()
        .filter(|o| **o == Ok(InitOutcome::Initialised))
        .count();
    assert_eq!(inits, 1, "outcomes {outs:?}: not exactly one initialiser");
    assert_eq!(sim.world.sem_value(), 1);
    assert_eq!(sim.world.sem_postinit_value(), 1);
    assert_eq!(sim.world.init_lock_holder(), 0);
}

/// Two processes initialise a zeroed region at once.
#[test]
fn init_two_processes_one_initialiser() {
    loom::model(|| race::<2>(2, u64::MAX));
}

/// Three processes initialise a zeroed region at once (bounded waits: two waiters spinning on
/// the init lock could otherwise yield to each other forever in loom's schedules).
#[test]
fn init_three_processes_one_initialiser() {
    loom::model(|| race::<3>(3, 6));
}

/// Process 0 dies at each of its init steps in turn (init lock, both sem_inits, unlock, each
/// before and after its effect) while process 1 initialises too: process 1 always returns Ok
/// with the region ready; if process 0 died before publishing the magic, process 1 is the
/// initialiser (the work is redone under the lock, never skipped).
#[test]
fn init_survives_a_crashed_initialiser() {
    for k in 0..=8 {
        loom::model(move || {
            let sim = Arc::new(Sim::<2, 1>::new());
            let victim = SimProc::spawn(&sim, 0);
            let other = SimProc::spawn(&sim, 1);
            let v = thread::spawn(move || {
                victim.crash_at_step(k);
                let out = victim.run(|p| p.ensure_initialised([LIMIT], u64::MAX));
                if !victim.is_dead() {
                    victim.exit();
                }
                out
            });
            let o = thread::spawn(move || {
                let out = other
                    .ensure_initialised([LIMIT], u64::MAX)
                    .expect("init failed");
                assert_ready(&other);
                other.exit();
                out
            });
            let victim_out = v.join().unwrap();
            let other_out = o.join().unwrap();
            let victim_inited = victim_out == Some(Ok(InitOutcome::Initialised));
            assert!(
                !(victim_inited && other_out == InitOutcome::Initialised),
                "two initialisers"
            );
            if victim_out.is_none() && other_out == InitOutcome::AlreadyReady {
                // Only possible if the victim published the magic before dying.
                assert_eq!(
                    sim.region.raw_initialized_flag().load(Ordering::Relaxed),
                    MAGIC
                );
            }
            assert_eq!(
                sim.region.raw_initialized_flag().load(Ordering::Relaxed),
                MAGIC
            );
            assert_eq!(sim.world.sem_value(), 1);
            assert_eq!(
                sim.world.init_lock_holder(),
                0,
                "a dead holder kept the init lock"
            );
        });
    }
}
