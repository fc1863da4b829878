//! The SM limit: one token bucket per device for the whole region, and the controller that sets
//! its refill rate.
//!
//! Upstream keeps one bucket per process, sized from core counts, and nudges it by a fixed step
//! per 120 ms; on an H200 a 25% limit still left 89% of the throughput. Here every process of the
//! region draws from the device's shared bucket ([`crate::layout::SmBucket`]) with a launch's
//! block count as its cost, so N processes share one budget. A rate of 0 means "unmetered":
//! launches pass (and run up debt), which is how the controller measures what the program does
//! unthrottled. [`crate::sm_controller`] chooses the rate.

use crate::layout::SmBucket;
use crate::platform::Platform;
use crate::sync::Ordering;

/// Burst the bucket holds, in seconds of refill.
const BURST_NS: u64 = 50_000_000;
/// A bucket no launch drew from for longer than this (a controller period) was idle, and its
/// program starts again without credit ([`refilled`]).
const IDLE_NS: u64 = crate::sm_controller::PERIOD_NS;
/// Longest a single launch waits for tokens (a stalled controller must not stall the program).
const MAX_WAIT_NS: u64 = 2_000_000_000;
/// Longest single sleep while waiting.
const MAX_SLEEP_NS: u64 = 20_000_000;

fn tokens(b: &SmBucket) -> i64 {
    b.tokens.load(Ordering::Relaxed) as i64
}

/// The tokens a bucket refilling at `rate` per second earns in `ns` nanoseconds.
pub fn tokens_in(rate: u64, ns: u64) -> i64 {
    (u128::from(rate) * u128::from(ns) / 1_000_000_000) as i64
}

/// Sets the refill rate; with `forgive_debt`, also forgives the debt run up so far. A limit that
/// starts should not first stall launches until the unmetered ones are repaid (at a low rate,
/// seconds), and after a re-measurement the controller spreads the repayment itself
/// ([`crate::sm_controller`]): the bucket repaying it too would count it twice (on an H200 a
/// container launched nothing for 1.6 s after each re-measurement, and got 21% for 25).
pub fn set_rate(b: &SmBucket, rate: u64, forgive_debt: bool) {
    b.rate.store(rate, Ordering::Relaxed);
    if forgive_debt {
        b.tokens.store(0, Ordering::Relaxed);
    }
}

/// The tokens a bucket holding `cur` holds `gap_ns` after its last refill, at `rate`: what it
/// earned meanwhile, capped at the burst. After an idle gap ([`IDLE_NS`] without launches: a
/// refill comes only with a launch) the program starts again without credit: the burst absorbs
/// launches that jitter about the rate, and kept over an idle second it let every burst of a
/// server's work start 50 ms unthrottled (an H100's 0.6-s bursts got 54% for a limit of 50,
/// run 24: 650 ms of tokens in 600 ms).
fn refilled(cur: i64, rate: u64, gap_ns: u64) -> i64 {
    let earned = tokens_in(rate, gap_ns);
    let cap = if gap_ns > IDLE_NS {
        0
    } else {
        tokens_in(rate, BURST_NS).max(cur)
    };
    cur.saturating_add(earned).min(cap)
}

/// Adds the tokens earned since the last refill (one process wins each refill by CAS), as
/// `refilled` says. Only launches refill, so `refilled_ns` is the last launch's time.
pub fn refill(b: &SmBucket, now_ns: u64) {
    let rate = b.rate.load(Ordering::Relaxed);
    let last = b.refilled_ns.load(Ordering::Relaxed);
    if now_ns <= last
        || b.refilled_ns
            .compare_exchange(last, now_ns, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
    {
        return;
    }
    if rate == 0 {
        return;
    }
    let mut cur = tokens(b);
    loop {
        let next = refilled(cur, rate, now_ns - last);
        match b.tokens.compare_exchange_weak(
            cur as u64,
            next as u64,
            Ordering::AcqRel,
            Ordering::Relaxed,
        ) {
            Ok(_) => return,
            Err(now) => cur = now as i64,
        }
    }
}

/// Whether launches are held back by the rate: the program is not idle (`IDLE_NS`), and
/// the bucket (as a launch now would find it) holds less than half its burst. A program that
/// launches less than the rate lets it fill up to the burst; one that wants more keeps it near
/// zero or in debt; an idle one is not held back. (Reading the debt at one instant misses the
/// moments between a repaid wait and the next launch.) Reads only: a refill here would hide
/// the gap since the last launch.
pub fn held_back(b: &SmBucket, now_ns: u64) -> bool {
    let rate = b.rate.load(Ordering::Relaxed);
    let gap = now_ns.saturating_sub(b.refilled_ns.load(Ordering::Relaxed));
    rate != 0 && gap <= IDLE_NS && refilled(tokens(b), rate, gap) < tokens_in(rate, BURST_NS) / 2
}

/// Takes `cost` tokens for a launch, waiting (sleeping, bounded) while the bucket is in debt.
/// Returns the nanoseconds waited.
pub fn consume<P: Platform>(b: &SmBucket, platform: &P, cost: u64) -> u64 {
    let start = platform.now_ns();
    refill(b, start);
    let cost = cost.min(i64::MAX as u64) as i64;
    b.spent.fetch_add(cost as u64, Ordering::Relaxed);
    let after = (b.tokens.fetch_sub(cost as u64, Ordering::AcqRel) as i64).wrapping_sub(cost);
    if after >= 0 {
        return 0;
    }
    loop {
        let rate = b.rate.load(Ordering::Relaxed);
        let now = platform.now_ns();
        let waited = now.saturating_sub(start);
        let debt = tokens(b);
        if rate == 0 || debt >= 0 || waited >= MAX_WAIT_NS {
            return waited;
        }
        let need_ns = (u128::from(debt.unsigned_abs()) * 1_000_000_000 / u128::from(rate)) as u64;
        platform.sleep_ns(need_ns.clamp(100_000, MAX_SLEEP_NS));
        refill(b, platform.now_ns());
    }
}

/// How long a controller lease lasts unless renewed: a holder that dies or hangs is replaced
/// after this.
pub const LEASE_MS: u64 = 1_000;

/// Whether a lease whose expiry is `expiry` (monotonic milliseconds, wrapping at 32 bits) still
/// runs at `now_ms`: it expires within the next [`LEASE_MS`]. Anything else is stale, whatever
/// the wrap: a fresh bucket's 0 (holder 0) once the clock has passed 2^31 ms (24.8 days of
/// uptime), or a holder that died weeks ago. Comparing only "expiry before now" across the
/// wrap would leave such a lease unexpired for 24.8 days, and the device without a controller.
fn lease_runs(expiry: u32, now_ms: u64) -> bool {
    let ahead = expiry.wrapping_sub(now_ms as u32);
    ahead != 0 && u64::from(ahead) <= LEASE_MS
}

/// Takes or renews the device's controller lease for process `me` (nonzero); true if `me` holds
/// it now. `clock_ms` reads the monotonic clock in milliseconds; it is read after the lease, so
/// a lease that a faster process took meanwhile is never judged by an older time (and taken
/// from it as if stale). The lease is one CAS on a 64-bit word (holder in the high 32 bits,
/// expiry in the low 32), so of processes that race for a free lease exactly one wins, and
/// nobody holds a lock while the winner reads NVML. A holder that stalls past its expiry may be
/// replaced and then steer one more period beside its successor: two controllers briefly,
/// never none.
pub fn take_lease(b: &SmBucket, me: u32, clock_ms: impl FnOnce() -> u64) -> bool {
    let cur = b.lease.load(Ordering::Acquire);
    let now_ms = clock_ms();
    let holder = (cur >> 32) as u32;
    if holder != me && holder != 0 && lease_runs(cur as u32, now_ms) {
        return false;
    }
    let next = (u64::from(me) << 32) | u64::from((now_ms + LEASE_MS) as u32);
    b.lease
        .compare_exchange(cur, next, Ordering::AcqRel, Ordering::Relaxed)
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(rate: u64, tokens: i64) -> SmBucket {
        SmBucket {
            tokens: crate::sync::AtomicU64::new(tokens as u64),
            rate: crate::sync::AtomicU64::new(rate),
            refilled_ns: crate::sync::AtomicU64::new(1_000),
            lease: crate::sync::AtomicU64::new(0),
            spent: crate::sync::AtomicU64::new(0),
        }
    }

    #[test]
    fn a_lease_is_held_until_it_expires_then_taken_over() {
        let b = bucket(0, 0);
        let t = 5_000;
        assert!(take_lease(&b, 7, || t), "a fresh bucket's lease is free");
        assert!(!take_lease(&b, 8, || t + 1), "held by 7");
        assert!(take_lease(&b, 7, || t + 500), "7 renews");
        assert!(
            !take_lease(&b, 8, || t + 500 + LEASE_MS - 1),
            "renewed at +500"
        );
        assert!(
            take_lease(&b, 8, || t + 500 + LEASE_MS),
            "expired: 8 takes over"
        );
        assert!(!take_lease(&b, 7, || t + 500 + LEASE_MS), "7 has lost it");
    }

    /// Monotonic milliseconds pass 2^31 after 24.8 days of uptime and wrap at 49.7 days. Judged
    /// by "expiry before now" alone, a fresh bucket's lease (0) looked unexpired from then on, so
    /// no process ever controlled the device (mutation: that rule fails this test).
    #[test]
    fn a_lease_works_at_any_uptime() {
        let day = 86_400_000u64;
        for now in [
            1,
            24 * day,
            25 * day,
            40 * day,
            (1 << 32) - 1,
            1 << 32,
            60 * day,
            400 * day,
        ] {
            let b = bucket(0, 0);
            assert!(
                take_lease(&b, 7, || now),
                "fresh lease at {} days",
                now / day
            );
            assert!(
                !take_lease(&b, 8, || now + 999),
                "held at {} days",
                now / day
            );
            assert!(
                take_lease(&b, 8, || now + 1000),
                "expired at {} days",
                now / day
            );
        }
        // A holder that died 30 days ago: its expiry is 30 days behind, which the wrap makes
        // look 19.7 days ahead; it is stale.
        let b = bucket(0, 0);
        assert!(take_lease(&b, 7, || day));
        assert!(take_lease(&b, 8, || 31 * day), "a month-old lease is stale");
    }

    /// The debt goes when asked, whatever the rate before (a re-measurement ends at the rate
    /// of its pause, not at 0: with forgiveness only from 0 the debt stayed, and was paid twice).
    #[test]
    fn setting_the_rate_forgives_the_debt_only_when_asked() {
        let b = bucket(0, -800_000);
        set_rate(&b, 1000, true);
        assert_eq!(tokens(&b), 0, "0 -> 1000, forgiven");
        b.tokens.store((-50i64) as u64, Ordering::Relaxed);
        set_rate(&b, 2000, false);
        assert_eq!(tokens(&b), -50, "kept when not asked");
        set_rate(&b, 1, false);
        set_rate(&b, 1000, true);
        assert_eq!(tokens(&b), 0, "1 -> 1000, forgiven");
    }

    #[test]
    fn held_back_tells_a_full_bucket_from_a_drained_one() {
        // 1000 tokens/s: a burst of 50 tokens.
        assert!(
            !held_back(&bucket(1000, 50), 1_000),
            "full: the program is slower"
        );
        assert!(held_back(&bucket(1000, 0), 1_000), "empty: launches wait");
        assert!(held_back(&bucket(1000, -400), 1_000), "in debt");
        // Refilled first: 40 ms after an empty bucket, 40 tokens are back (above half).
        assert!(!held_back(&bucket(1000, 0), 40_001_000));
        assert!(
            !held_back(&bucket(0, -400), 1_000),
            "no rate yet: nothing is held back"
        );
    }
}
