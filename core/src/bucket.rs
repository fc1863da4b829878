//! The SM limit: one token bucket per device for the whole region, and the controller that sets
//! its refill rate from utilisation samples.
//!
//! Upstream keeps one bucket per process, sized from core counts, and nudges it by a fixed step
//! per 120 ms; on an H200 a 25% limit still left 89% of the throughput. Here every process of the
//! region draws from the device's shared bucket ([`crate::layout::SmBucket`]) with a launch's
//! block count as its cost, so N processes share one budget, and the controller is multiplicative
//! (the refill rate is scaled by target/measured, with a small gain), so it converges whatever a
//! token is worth on the GPU at hand. A rate of 0 means "not yet calibrated": launches pass, and
//! the first controller step sets the rate to the limit's share of the consumption it observed.

use crate::layout::SmBucket;
use crate::platform::Platform;
use crate::sync::Ordering;

/// Burst the bucket holds, in seconds of refill.
const BURST_NS: u64 = 50_000_000;
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

/// Sets the refill rate. Going from 0 (unmetered) to a rate also forgives the debt that the
/// unmetered launches ran up: the limit starts now, not after that debt is repaid, which at a
/// low rate stalls launches for seconds. Returns whether it did.
pub fn set_rate(b: &SmBucket, rate: u64) -> bool {
    let starts = b.rate.swap(rate, Ordering::Relaxed) == 0 && rate != 0;
    if starts {
        b.tokens.store(0, Ordering::Relaxed);
    }
    starts
}

/// Adds the tokens earned since the last refill (one process wins each refill by CAS), capped
/// at the burst size.
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
    let earned = tokens_in(rate, now_ns - last);
    let cap = tokens_in(rate, BURST_NS);
    let mut cur = tokens(b);
    loop {
        let next = cur.saturating_add(earned).min(cap.max(cur));
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

/// Whether launches are held back by the rate: the bucket (refilled to `now_ns`) holds less
/// than half its burst. A program that launches less than the rate lets it fill up to the burst;
/// one that wants more keeps it near zero or in debt. (Reading the debt at one instant misses
/// the moments between a repaid wait and the next launch.)
pub fn held_back(b: &SmBucket, now_ns: u64) -> bool {
    refill(b, now_ns);
    let rate = b.rate.load(Ordering::Relaxed);
    rate != 0 && tokens(b) < tokens_in(rate, BURST_NS) / 2
}

/// Takes `cost` tokens for a launch, waiting (sleeping, bounded) while the bucket is in debt.
/// Returns the nanoseconds waited.
pub fn consume<P: Platform>(b: &SmBucket, platform: &P, cost: u64) -> u64 {
    let start = platform.now_ns();
    refill(b, start);
    let cost = cost.min(i64::MAX as u64) as i64;
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

/// What the controller saw over one period.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    /// Utilisation of the limited work, in percent (0..=100).
    pub util: f64,
    /// Tokens consumed during the period.
    pub consumed: u64,
    /// Length of the period in nanoseconds.
    pub period_ns: u64,
    /// Whether launches ran short of tokens (demand exceeded the rate).
    pub starved: bool,
}

/// Share of the measured error corrected per step.
pub const GAIN: f64 = 0.2;

/// The refill rate's controller: multiplicative, with a small gain, and no wind-up while demand
/// is below the rate.
///
/// NVML's utilisation trails the launches by one or more of its sample periods (1/6 s to 1 s),
/// so each step corrects only [`GAIN`] of the ratio it sees: a controller that moves half-way
/// per 200 ms step overshoots a lagging measurement and oscillates around the target (the
/// `lagging_gpu` test shows it).
///
/// After [`IDLE_STEPS_TO_RECALIBRATE`] steps without a launch the controller starts over
/// uncalibrated: a program's start-up launches (a few small kernels, then a pause) would otherwise
/// calibrate the rate far below what its real work needs, and the small gain would take many
/// seconds to climb back.
///
/// A limit is a share of what the program gets unthrottled, but NVML need not read 100% for a
/// GPU that runs flat out: on an H200 a saturating bf16 matmul reads about 82% (docs/
/// gpu-results.md, run 2), so steering NVML to the limit itself left 1.2 times the throughput.
/// So the first calibration lets the program run unthrottled for [`PROBE_STEPS`] steps, takes
/// the highest utilisation seen as "flat out", and steers to the limit's share of that.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Controller {
    /// Target utilisation in percent.
    pub target: f64,
    rate: f64,
    idle_steps: u32,
    /// NVML's utilisation of the unthrottled program, once probed.
    full_util: Option<f64>,
    probe_steps: u32,
    probe_max: f64,
}

/// Steps the first calibration runs unthrottled to see NVML's reading of a busy GPU.
pub const PROBE_STEPS: u32 = 4;
/// Lowest "flat out" reading believed: below it the program was not busy during the probe.
const MIN_FULL_UTIL: f64 = 50.0;

/// Steps without any launch after which the controller recalibrates (1 s at 200 ms a step).
pub const IDLE_STEPS_TO_RECALIBRATE: u32 = 5;

impl Controller {
    /// A controller aiming at `target_percent`, not yet calibrated.
    pub fn new(target_percent: u64) -> Self {
        Controller {
            target: target_percent.clamp(1, 100) as f64,
            rate: 0.0,
            idle_steps: 0,
            full_util: None,
            probe_steps: 0,
            probe_max: 0.0,
        }
    }

    /// A controller taking over a device whose bucket already refills at `rate` (another
    /// process held the lease before).
    pub fn resume(target_percent: u64, rate: u64) -> Self {
        Controller {
            rate: rate as f64,
            ..Controller::new(target_percent)
        }
    }

    /// The next refill rate (tokens per second) after `s`; 0 while nothing has run yet.
    pub fn step(&mut self, s: Sample) -> u64 {
        let util = s.util.clamp(0.0, 100.0);
        if s.consumed == 0 {
            self.probe_steps = 0;
            self.probe_max = 0.0;
            self.idle_steps = self.idle_steps.saturating_add(1);
            if self.idle_steps >= IDLE_STEPS_TO_RECALIBRATE {
                self.rate = 0.0;
            }
        } else {
            self.idle_steps = 0;
        }
        if self.rate == 0.0 {
            if s.consumed == 0 || s.period_ns == 0 {
                return 0;
            }
            if self.full_util.is_none() {
                // Consecutive busy steps only (an idle step above returned already and reset).
                self.probe_steps += 1;
                self.probe_max = self.probe_max.max(util);
                if self.probe_steps < PROBE_STEPS {
                    return 0;
                }
                self.full_util = Some(self.probe_max.clamp(MIN_FULL_UTIL, 100.0));
            }
            // As if the unthrottled program kept the GPU busy: the limit holds from the first
            // step, and a program that did not is given more by the steps that follow. (Scaling
            // by the measured utilisation instead trusts NVML's first sample, which still
            // describes the time before the program started and overestimates the rate.)
            let consumed_rate = s.consumed as f64 * 1e9 / s.period_ns as f64;
            self.rate = (consumed_rate * self.target / 100.0).max(1.0);
            return self.rate as u64;
        }
        // A controller resumed from another lease holder has not probed: 100 as before.
        let full = self.full_util.unwrap_or(100.0);
        let mut factor = self.target * full / 100.0 / util.max(1.0);
        factor = factor.clamp(0.25, 2.0);
        if factor > 1.0 && !s.starved {
            // Below target because the program asks for less than the rate: do not wind up.
            factor = 1.0;
        }
        self.rate = (self.rate * (1.0 + GAIN * (factor - 1.0))).max(1.0);
        self.rate as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GPU whose utilisation grows with the admitted work, but not in proportion (small
    /// kernels overlap; NVML counts a partly busy GPU as busy), with a little noise, and a
    /// program that always wants more than the limit (compute-bound).
    struct SimGpu {
        capacity: f64,
        demand: f64,
        seed: u64,
        /// Utilisation is reported this many periods late (NVML's sample window).
        lag: usize,
        reported: Vec<f64>,
        /// NVML's reading of a flat-out GPU (100, or about 82 for a matmul on an H200), and
        /// the exponent of its curve (below 1: a partly busy GPU reads busier than it is).
        full_reading: f64,
        exponent: f64,
        /// Throughput per period as a share of the unthrottled program's, in percent.
        shares: Vec<f64>,
    }

    impl SimGpu {
        /// A GPU that reads 100% flat out on a curve of exponent 0.7, reporting `lag` late.
        fn new(capacity: f64, demand: f64, seed: u64, lag: usize) -> Self {
            SimGpu {
                capacity,
                demand,
                seed,
                lag,
                reported: Vec::new(),
                full_reading: 100.0,
                exponent: 0.7,
                shares: Vec::new(),
            }
        }

        fn run(&mut self, rate: u64, period_s: f64) -> Sample {
            // The program synchronises, so it cannot launch ahead of the GPU.
            let wanted = self.demand.min(self.capacity);
            let done = if rate == 0 {
                wanted
            } else {
                wanted.min(rate as f64)
            };
            self.seed = self
                .seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let noise = ((self.seed >> 33) % 200) as f64 / 100.0 - 1.0; // ±1 point
            let share = done / self.capacity;
            self.shares.push(100.0 * share);
            self.reported.push(
                (self.full_reading * libm_pow(share, self.exponent) + noise).clamp(0.0, 100.0),
            );
            let seen = self.reported.len().saturating_sub(1 + self.lag);
            Sample {
                util: self.reported[seen],
                consumed: (done * period_s) as u64,
                period_ns: (period_s * 1e9) as u64,
                starved: rate != 0 && wanted > rate as f64,
            }
        }
    }

    /// The true utilisation the controller settles at over steps 40..80 (8 s after the start
    /// of 16 s at 200 ms a step).
    fn converge(target: u64, capacity: f64, demand: f64, lag: usize) -> f64 {
        let mut gpu = SimGpu::new(capacity, demand, target, lag);
        let mut c = Controller::new(target);
        let mut rate = 0;
        for _ in 0..80 {
            let s = gpu.run(rate, 0.2);
            rate = c.step(s);
        }
        let settled = &gpu.reported[40..80];
        settled.iter().sum::<f64>() / settled.len() as f64
    }

    extern crate std;
    use std::vec::Vec;

    fn libm_pow(x: f64, y: f64) -> f64 {
        std::primitive::f64::powf(x, y)
    }

    #[test]
    fn converges_within_three_points_of_each_target() {
        for target in [25, 50, 75] {
            for (capacity, demand) in [(1e6, 5e6), (3e4, 1e5), (1e9, 1.2e9)] {
                let util = converge(target, capacity, demand, 0);
                assert!(
                    (util - target as f64).abs() <= 3.0,
                    "target {target}, capacity {capacity}: settled at {util:.1}"
                );
            }
        }
    }

    /// Utilisation reported 1 to 5 periods (0.2 to 1 s) late, as NVML's is. With a gain of 0.5
    /// (half-way per step) the longer lags oscillate outside the band.
    #[test]
    fn lagging_gpu_converges_within_three_points() {
        for lag in 1..=5 {
            for target in [25, 50, 75] {
                let util = converge(target, 1e6, 5e6, lag);
                assert!(
                    (util - target as f64).abs() <= 3.0,
                    "target {target}, lag {lag}: settled at {util:.1}"
                );
            }
        }
    }

    /// A program that launches a few small kernels at start-up, pauses for 2 s (loading data,
    /// waiting for its peers), then runs compute-bound: the work settles at the target within
    /// 4 s of starting. Without the recalibration after idling, the rate calibrated on the
    /// start-up launches is 1/100 of what the work needs, and the work runs far below its share.
    #[test]
    fn startup_launches_do_not_miscalibrate_the_real_work() {
        for target in [25, 50, 75] {
            let mut gpu = SimGpu::new(1e6, 1e4, target, 2);
            let mut c = Controller::new(target);
            let mut rate = c.step(gpu.run(0, 0.2));
            gpu.demand = 0.0;
            for _ in 0..10 {
                rate = c.step(gpu.run(rate, 0.2));
            }
            gpu.demand = 5e6;
            let start = gpu.reported.len();
            for _ in 0..40 {
                rate = c.step(gpu.run(rate, 0.2));
            }
            let settled = &gpu.reported[start + 20..];
            let util = settled.iter().sum::<f64>() / settled.len() as f64;
            assert!(
                (util - target as f64).abs() <= 3.0,
                "target {target}: the work settled at {util:.1}"
            );
        }
    }

    fn bucket(rate: u64, tokens: i64) -> SmBucket {
        SmBucket {
            tokens: crate::sync::AtomicU64::new(tokens as u64),
            rate: crate::sync::AtomicU64::new(rate),
            refilled_ns: crate::sync::AtomicU64::new(1_000),
            lease: crate::sync::AtomicU64::new(0),
        }
    }

    #[test]
    fn starting_the_rate_forgives_unmetered_debt_once() {
        let b = bucket(0, -800_000);
        assert!(set_rate(&b, 1000), "0 -> 1000 starts metering");
        assert_eq!(tokens(&b), 0);
        b.tokens.store((-50i64) as u64, Ordering::Relaxed);
        assert!(!set_rate(&b, 2000), "a change of rate keeps the debt");
        assert_eq!(tokens(&b), -50);
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

    /// A GPU whose NVML reading is proportional to the work but reads 82% flat out, as the
    /// H200 did: the throughput settles at the limit's share of the unthrottled throughput, not
    /// at 1/0.82 of it. Without the probe (a "flat out" of 100) 25 becomes about 30.
    #[test]
    fn throughput_share_holds_when_nvml_reads_below_100_flat_out() {
        for target in [25, 50, 75] {
            let mut gpu = SimGpu {
                full_reading: 82.0,
                exponent: 1.0,
                ..SimGpu::new(1e6, 5e6, target, 1)
            };
            let mut c = Controller::new(target);
            let mut rate = 0;
            for _ in 0..80 {
                rate = c.step(gpu.run(rate, 0.2));
            }
            let settled = &gpu.shares[40..80];
            let share = settled.iter().sum::<f64>() / settled.len() as f64;
            assert!(
                (share - target as f64).abs() <= 3.0,
                "target {target}: throughput settled at {share:.1}% of unthrottled"
            );
        }
    }

    #[test]
    fn idle_program_does_not_wind_the_rate_up() {
        let mut c = Controller::new(50);
        let busy = Sample {
            util: 100.0,
            consumed: 1000,
            period_ns: 1_000_000_000,
            starved: false,
        };
        let mut first = 0;
        for _ in 0..PROBE_STEPS {
            first = c.step(busy);
        }
        assert_ne!(first, 0, "calibrated after the probe");
        for _ in 0..20 {
            let r = c.step(Sample {
                util: 5.0,
                consumed: 10,
                period_ns: 1_000_000_000,
                starved: false,
            });
            assert!(r <= first, "rate grew to {r} while the program was idle");
        }
    }
}
