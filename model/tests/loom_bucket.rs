//! loom: the SM-limit token bucket that every process of the region shares (core/src/bucket.rs),
//! with atomics only. Refills race (each wins an interval by CAS on `refilled_ns`, then adds to
//! `tokens` by CAS), launches take tokens with `fetch_sub`, and controllers race for the lease.
//! Checked: no token is created or lost, whatever the interleaving, and a lease has one winner.
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p hami-model --release
//! --target-dir target/loom --test loom_bucket`
#![cfg(loom)]

use hami_model::rt::{thread, Arc};
use hami_model::{Sim, SimProc};
use hami_shm::bucket::{self, tokens_in};
use hami_shm::layout::SmBucket;
use hami_shm::sync::Ordering;

/// One token per nanosecond: `tokens_in(RATE, ns) == ns`, so no rounding hides a double credit.
const RATE: u64 = 1_000_000_000;
/// When the bucket was last refilled at the start.
const T0: u64 = 1_000;
/// Tokens at the start: enough that no launch waits.
const START: i64 = 100;

fn fresh(lease: u64) -> SmBucket {
    let b = SmBucket::zeroed();
    b.raw_tokens().store(START as u64, Ordering::Relaxed);
    b.raw_rate().store(RATE, Ordering::Relaxed);
    b.raw_refilled_ns().store(T0, Ordering::Relaxed);
    b.raw_lease().store(lease, Ordering::Relaxed);
    b
}

type Refill = fn(&SmBucket, u64);

/// Each `(now, cost)` is a process that refills at `now` and then launches work of `cost`
/// (`bucket::consume`, which also refills, at its own clock's 0: a no-op). Afterwards the bucket
/// holds what it started with, plus one token per nanosecond that the refills covered
/// (`refilled_ns - T0`), minus what the launches took.
fn conservation(refill: Refill, work: &'static [(u64, u64)]) {
    let b = Arc::new(fresh(0));
    let sim = Sim::<1, 1>::shared();
    let handles: Vec<_> = work
        .iter()
        .enumerate()
        .map(|(i, &(now, cost))| {
            let (b, sim) = (b.clone(), sim.clone());
            thread::spawn(move || {
                refill(&b, now);
                let p = SimProc::spawn(&sim, i);
                bucket::consume(&b, &p, cost);
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let taken: u64 = work.iter().map(|&(_, c)| c).sum();
    let credited = b.raw_refilled_ns().load(Ordering::Relaxed) - T0;
    let tokens = b.raw_tokens().load(Ordering::Relaxed) as i64;
    assert_eq!(
        b.raw_spent().load(Ordering::Relaxed),
        taken,
        "spent miscounted"
    );
    assert_eq!(
        tokens,
        START + credited as i64 - taken as i64,
        "tokens not conserved: {tokens} after crediting {credited} and taking {taken}"
    );
}

/// Two processes refill over overlapping intervals and launch.
#[test]
fn bucket_two_processes_conserve_tokens() {
    loom::model(|| conservation(bucket::refill, &[(2_000, 10), (3_000, 20)]));
}

/// Three processes, two of them at the same instant.
#[test]
fn bucket_three_processes_conserve_tokens() {
    loom::model(|| conservation(bucket::refill, &[(2_000, 10), (2_000, 20), (2_500, 5)]));
}

/// Refill that moves `refilled_ns` by a plain store instead of a CAS: two processes that read
/// the same last refill both credit the interval. Mutation test.
#[test]
#[should_panic(expected = "tokens not conserved")]
fn mutation_refill_without_cas_credits_twice() {
    fn no_cas(b: &SmBucket, now: u64) {
        let rate = b.raw_rate().load(Ordering::Relaxed);
        let last = b.raw_refilled_ns().load(Ordering::Relaxed);
        if now <= last {
            return;
        }
        b.raw_refilled_ns().store(now, Ordering::Relaxed);
        b.raw_tokens()
            .fetch_add(tokens_in(rate, now - last) as u64, Ordering::AcqRel);
    }
    loom::model(|| conservation(no_cas, &[(2_000, 10), (3_000, 20)]));
}

/// Refill that adds its tokens by load and store instead of a CAS loop: a launch's `fetch_sub`
/// between the two is lost. Mutation test.
#[test]
#[should_panic(expected = "tokens not conserved")]
fn mutation_refill_storing_tokens_loses_a_launch() {
    fn store_tokens(b: &SmBucket, now: u64) {
        let rate = b.raw_rate().load(Ordering::Relaxed);
        let last = b.raw_refilled_ns().load(Ordering::Relaxed);
        if now <= last
            || b.raw_refilled_ns()
                .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let cur = b.raw_tokens().load(Ordering::Relaxed);
        b.raw_tokens().store(
            cur.wrapping_add(tokens_in(rate, now - last) as u64),
            Ordering::Release,
        );
    }
    loom::model(|| conservation(store_tokens, &[(2_000, 10), (3_000, 20)]));
}

type TakeLease = fn(&SmBucket, u32, u64) -> bool;

fn core_take(b: &SmBucket, me: u32, now_ms: u64) -> bool {
    bucket::take_lease(b, me, || now_ms)
}

/// Processes 1 and 2 try to take the lease at the same instant, from `lease`: exactly one wins.
fn lease_race(take: TakeLease, lease: u64, now_ms: u64) {
    let b = Arc::new(fresh(lease));
    let handles: Vec<_> = [1u32, 2]
        .into_iter()
        .map(|me| {
            let b = b.clone();
            thread::spawn(move || take(&b, me, now_ms))
        })
        .collect();
    let won: Vec<bool> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(
        won.iter().filter(|&&w| w).count(),
        1,
        "lease winners: {won:?}"
    );
    let holder = (b.raw_lease().load(Ordering::Relaxed) >> 32) as u32;
    assert!(won[holder as usize - 1], "the lease names the winner");
}

/// A fresh bucket's lease (holder 0), and one whose holder (9) expired, have one taker each.
#[test]
fn lease_has_one_winner() {
    loom::model(|| lease_race(core_take, 0, 5_000));
    loom::model(|| lease_race(core_take, (9 << 32) | 4_000, 5_000));
}

/// A lease taken by load and store instead of a CAS: both contenders win. Mutation test.
#[test]
#[should_panic(expected = "lease winners")]
fn mutation_lease_without_cas_has_two_winners() {
    fn store(b: &SmBucket, me: u32, now_ms: u64) -> bool {
        let cur = b.raw_lease().load(Ordering::Relaxed);
        let (holder, expiry) = ((cur >> 32) as u32, cur as u32);
        if holder != me && holder != 0 && u64::from(expiry) > now_ms {
            return false;
        }
        let next = (u64::from(me) << 32) | (now_ms + bucket::LEASE_MS);
        b.raw_lease().store(next, Ordering::Release);
        true
    }
    loom::model(|| lease_race(store, 0, 5_000));
}
