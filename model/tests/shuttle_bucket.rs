//! shuttle: the SM-limit bucket (core/src/bucket.rs) with more processes and longer runs than
//! loom can explore, under shuttle's random scheduler.
//!
//! - Tokens: 4 processes refill at their own advancing times and launch; no token is created or
//!   lost.
//! - The controller lease: 4 processes call `take_lease` in turns while a shared clock runs
//!   across the 32-bit wrap of its milliseconds. A ghost log of the grants, kept in the order of
//!   their CASes (shuttle switches threads only at its own atomics, and `take_lease` returns
//!   right after its CAS), checks that nobody takes a lease that is still running, and that a
//!   caller who saw no change during its call is refused only by a running lease of another.
//!
//! Mutations: the rule that judged expiry by "before now" across the wrap, and a clock read
//! before the lease is loaded, each fail.
//!
//! Run: `RUSTFLAGS="--cfg shuttle" cargo test -p hami-model --release --target-dir
//! target/shuttle --test shuttle_bucket`
#![cfg(shuttle)]

use std::sync::atomic::{AtomicU64 as PlainU64, Ordering as Plain};
use std::sync::Mutex;

use hami_model::rt::{random, thread, Arc};
use hami_model::{Sim, SimProc};
use hami_shm::bucket::{self, LEASE_MS};
use hami_shm::layout::SmBucket;
use hami_shm::sync::{AtomicU64, Ordering};

const PROCS: u32 = 4;
const ROUNDS: usize = 6;
const ITERATIONS: usize = 3_000;
/// One token per nanosecond.
const RATE: u64 = 1_000_000_000;
const T0: u64 = 1_000;
const START: i64 = 1_000;

fn fresh() -> SmBucket {
    let b = SmBucket::zeroed();
    b.raw_tokens().store(START as u64, Ordering::Relaxed);
    b.raw_rate().store(RATE, Ordering::Relaxed);
    b.raw_refilled_ns().store(T0, Ordering::Relaxed);
    b.raw_lease().store(0, Ordering::Relaxed);
    b
}

#[test]
fn bucket_four_processes_conserve_tokens() {
    shuttle::check_random(
        || {
            let b = Arc::new(fresh());
            let sim = Sim::<1, 1>::shared();
            let handles: Vec<_> = (0..PROCS as usize)
                .map(|i| {
                    let (b, sim) = (b.clone(), sim.clone());
                    thread::spawn(move || {
                        let p = SimProc::spawn(&sim, i);
                        let (mut now, mut taken) = (T0, 0);
                        for _ in 0..ROUNDS {
                            now += random(2_000);
                            bucket::refill(&b, now);
                            let cost = 1 + random(50);
                            bucket::consume(&b, &p, cost);
                            taken += cost;
                        }
                        taken
                    })
                })
                .collect();
            let taken: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
            let credited = b.raw_refilled_ns().load(Ordering::Relaxed) - T0;
            assert_eq!(b.raw_spent().load(Ordering::Relaxed), taken);
            assert_eq!(
                b.raw_tokens().load(Ordering::Relaxed) as i64,
                START + credited as i64 - taken as i64,
                "tokens not conserved"
            );
        },
        ITERATIONS,
    );
}

/// One grant of the lease: to whom, until when (unwrapped milliseconds).
#[derive(Clone, Copy, Debug)]
struct Grant {
    holder: u32,
    until: u64,
}

type TakeLease = fn(&SmBucket, u32, &dyn Fn() -> u64) -> bool;

fn core_take(b: &SmBucket, me: u32, clock: &dyn Fn() -> u64) -> bool {
    bucket::take_lease(b, me, clock)
}

/// The clock starts 1.5 s before milliseconds wrap at 2^32 and advances by up to 0.7 s a step.
/// Returns how many takeovers (a grant to another holder than the last) and refusals the runs
/// saw, so the caller can tell the checks were exercised.
fn lease_scenario(take: TakeLease) -> (u64, u64) {
    static TAKEOVERS: PlainU64 = PlainU64::new(0);
    static REFUSALS: PlainU64 = PlainU64::new(0);
    TAKEOVERS.store(0, Plain::Relaxed);
    REFUSALS.store(0, Plain::Relaxed);
    shuttle::check_random(
        move || {
            let b = Arc::new(fresh());
            let clock = Arc::new(AtomicU64::new((1 << 32) - 1_500));
            let log = Arc::new(Mutex::new(Vec::<Grant>::new()));
            let handles: Vec<_> = (1..=PROCS)
                .map(|me| {
                    let (b, clock, log) = (b.clone(), clock.clone(), log.clone());
                    thread::spawn(move || {
                        for _ in 0..ROUNDS {
                            clock.fetch_add(random(700), Ordering::Relaxed);
                            let grants_before = log.lock().unwrap().len();
                            let seen = std::cell::Cell::new(0);
                            let read = || {
                                let t = clock.load(Ordering::Relaxed);
                                seen.set(t);
                                t
                            };
                            let won = take(&b, me, &read);
                            let now = seen.get();
                            let mut log = log.lock().unwrap();
                            let last = log.last().copied();
                            if won {
                                if let Some(g) = last.filter(|g| g.holder != me) {
                                    TAKEOVERS.fetch_add(1, Plain::Relaxed);
                                    assert!(
                                        now >= g.until,
                                        "{me} took at {now} the lease {g:?}, still running"
                                    );
                                }
                                log.push(Grant {
                                    holder: me,
                                    until: now + LEASE_MS,
                                });
                            } else if log.len() == grants_before {
                                REFUSALS.fetch_add(1, Plain::Relaxed);
                                assert!(
                                    last.is_some_and(|g| g.holder != me && now < g.until),
                                    "{me} was refused at {now}; the last grant: {last:?}"
                                );
                            }
                        }
                    })
                })
                .collect();
            for h in handles {
                h.join().unwrap();
            }
        },
        ITERATIONS,
    );
    (
        TAKEOVERS.load(Plain::Relaxed),
        REFUSALS.load(Plain::Relaxed),
    )
}

#[test]
fn lease_is_exclusive_and_free_when_it_runs_out_across_the_wrap() {
    let (takeovers, refusals) = lease_scenario(core_take);
    eprintln!("lease: {takeovers} takeovers, {refusals} refusals checked");
    assert!(
        takeovers > 0 && refusals > 0,
        "the scenario never contended"
    );
}

/// The rule before the fix: a lease runs while "now is before its expiry", compared as a signed
/// 32-bit difference. The fresh lease (holder 0, expiry 0) then looks running while the clock's
/// milliseconds lie in [2^31, 2^32), which is where the scenario starts. Mutation test.
#[test]
#[should_panic(expected = "was refused")]
fn mutation_lease_judged_by_before_now() {
    fn before_now(b: &SmBucket, me: u32, clock: &dyn Fn() -> u64) -> bool {
        let cur = b.raw_lease().load(Ordering::Acquire);
        let now = clock();
        let (holder, expiry) = ((cur >> 32) as u32, cur as u32);
        if holder != me && ((now as u32).wrapping_sub(expiry) as i32) < 0 {
            return false;
        }
        let next = (u64::from(me) << 32) | u64::from((now + LEASE_MS) as u32);
        b.raw_lease()
            .compare_exchange(cur, next, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }
    let _ = lease_scenario(before_now);
}

/// The clock read before the lease is loaded: a process that read it, then lost the CPU while
/// another took the lease at a later time, judges that fresh lease by its older time, finds it
/// more than a lease ahead, calls it stale and takes it. Mutation test.
#[test]
#[should_panic(expected = "still running")]
fn mutation_lease_clock_read_before_the_lease() {
    fn clock_first(b: &SmBucket, me: u32, clock: &dyn Fn() -> u64) -> bool {
        let now = clock();
        bucket::take_lease(b, me, || now)
    }
    let _ = lease_scenario(clock_first);
}
