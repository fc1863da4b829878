//! The SM limit's controller: chooses the refill rate of a device's token bucket
//! ([`crate::bucket`]) each period from what the period showed.
//!
//! A GPU shared with other containers needs one more reading. Contexts of different containers
//! are time-sliced, so a rate measured unthrottled beside another container's work is a share of
//! the solo rate, and NVML's per-process utilisation on an H200 reads the whole device's
//! (docs/gpu-results.md, run 10). So before re-measuring, the controller pauses its own
//! container for [`PAUSE_STEPS`] and reads the device's utilisation from NVML's timestamped
//! device samples: what remains is the other containers' time. The unthrottled rate measured
//! next is then scaled up by the time those others took ([`Controller`]).

use core::ops::ControlFlow;

use crate::bucket::tokens_in;
use crate::workload::{KernelSet, Watch};

/// What the controller saw over one period.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    /// Utilisation of the limited work, in percent (0..=100); `None` where NVML gives none
    /// (no NVML in the container, or a device that does not report it): the limit then holds
    /// on the work reading alone.
    pub util: Option<f64>,
    /// Tokens consumed during the period.
    pub consumed: u64,
    /// Length of the period in nanoseconds.
    pub period_ns: u64,
    /// Whether launches ran short of tokens (demand exceeded the rate).
    pub starved: bool,
    /// The whole device's utilisation over the period in percent, every container's work
    /// included, from NVML samples stamped within the period; `None` where there are none.
    pub device_util: Option<f64>,
    /// Whether processes outside the container hold the device (NVML lists them, or the
    /// device's memory in use exceeds the container's): only then can a pause tell anything.
    pub others_present: bool,
    /// The kernels launched during the period ([`crate::workload`]); empty where unknown.
    pub kernels: KernelSet,
}

/// What the controller sets: the refill rate (0 = unmetered) and whether starting to meter
/// forgives the debt run up meanwhile ([`crate::bucket::set_rate`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Setting {
    /// Tokens per second; 0 lets launches pass unmetered.
    pub rate: u64,
    /// See [`crate::bucket::set_rate`].
    pub forgive_debt: bool,
}

/// Share of NVML's error corrected per step.
pub const GAIN: f64 = 0.2;
/// Busy steps the first measurement runs at least (1.2 s at 200 ms a step): two sets of three,
/// whose medians must agree within `PROBE_DRIFT` and `PROBE_FALL`; for a program in bursts,
/// busy steps since it first went idle.
pub const PROBE_MIN_STEPS: u32 = 6;
/// Busy steps after which the measurement is taken even if the program never ran steadily.
pub const PROBE_MAX_STEPS: u32 = 15;
/// The last steps of a measurement must lie within this fraction of their mean.
const PROBE_SPREAD: f64 = 0.25;
/// The median of a measurement's last three busy steps may exceed the median of the three
/// before them by at most this fraction: a program still warming up (PyTorch's small kernels
/// rose by a fifth over their first seconds on an H200, run 14) is measured once its rate
/// stops rising. (Cycling counts, below, rise by 3% between the medians now and then.)
const PROBE_DRIFT: f64 = 0.05;
/// ... and fall short of it by at most this fraction. Launch counts cycle about the work's rate
/// (one H100 matmul process: 17,424, 17,424, 17,952, then 15,312, 15,312, 17,160 blocks a
/// step), so two sets of three agreed within 3% only by chance: 1-process matmuls and graphs
/// were measured for 12 to 15 steps, and settled 3 to 6 s after their start (run 25). A
/// program that slows faster than this (set-up, then lighter work) is measured once it stops;
/// one that slows less is measured up to half of it high until its re-measurement.
const PROBE_FALL: f64 = 0.15;
/// A busy step launching more than this many times the most of any step before it starts the
/// first measurement afresh: the work started, and the steps before were set-up launches (4
/// H100 processes launched 660 to 3432 blocks a step, idle between, then 15840; counting those
/// as bursts took a first full step, which queues launches ahead, for the rate: 79.4% for 75,
/// run 23).
const WORK_STARTS: f64 = 2.0;
/// Metered steps after which a program that is held back is measured again (20 s), unthrottled,
/// alone on the GPU.
pub const REMEASURE_EVERY: u32 = 100;
/// Metered steps after the first measurement before the start's second measurement (2 s), where
/// the start is in doubt (`Controller::start_in_doubt`).
pub const FIRST_REMEASURE: u32 = 10;
/// On a shared GPU, a paused re-measurement after a random number of metered steps between
/// this and [`SHARED_EVERY_MAX`] (30 to 60 s), so that containers started together do not
/// measure in step. Rarer than alone: a pause and its frame keep the container off its rate
/// for seven steps, which are made up after at [`REPAY_POINTS`] a step.
pub const SHARED_EVERY_MIN: u32 = 150;
/// See [`SHARED_EVERY_MIN`].
pub const SHARED_EVERY_MAX: u32 = 300;
/// Metered steps before the first paused re-measurement: a random number up to this (at least
/// [`FIRST_CHECK_MIN`]). A measurement taken at start beside another container's is half the
/// solo rate; this corrects it within 8 s. Paused checks go on, at the same spacing, until
/// [`QUIET_PAUSES`] in a row find the device quiet: two containers that pause at the same
/// moment see each other's pause, and take the GPU for their own.
pub const FIRST_CHECK_MAX: u32 = 25;
/// See [`FIRST_CHECK_MAX`].
pub const FIRST_CHECK_MIN: u32 = 6;
/// Steps of the pause before a re-measurement, during which the container launches (almost)
/// nothing and the device's utilisation is the other containers'.
pub const PAUSE_STEPS: u32 = 3;
/// Steps of the pause after it.
pub const PAUSE_AFTER_STEPS: u32 = 2;
/// The controller's period, which the repayment is spread over.
pub const PERIOD_NS: u64 = 200_000_000;
/// The pause's first steps, not read: the container's queued kernels drain (milliseconds), and
/// an NVML sample stamped in step k covers the 200 ms before its stamp.
pub const PAUSE_DRAIN_STEPS: u32 = 1;
/// Rate of a pause (tokens per second): almost nothing passes, and 0 would mean unmetered.
const PAUSE_RATE: u64 = 1;
/// Other containers' time share (0..1) above which the GPU counts as shared: re-measurements are
/// then paused, and spread at random.
const SHARED_ABOVE: f64 = 0.03;
/// Other containers' time share above which a paused reading is not used to correct the rate:
/// they take all that is free (unlimited), so it says nothing about the solo rate.
const OTHERS_MAX: f64 = 0.9;
/// The most of the device's time one other container keeps beside a context that runs
/// unthrottled (equal time slices).
const FAIR_SHARE: f64 = 0.5;
/// Pause readings further apart than this (a share of the device's time) are not used: another
/// container started or ended a measurement meanwhile.
const UNSTEADY: f64 = 0.1;
/// See [`FIRST_CHECK_MAX`]. Three, not two: two containers whose limits HAMi's monitor turns on
/// at one tick start measuring together, and now and then draw the same spacing twice running;
/// with two, both then kept their halved first measurements for good (`t_monitor`: one run in
/// 42).
pub const QUIET_PAUSES: u32 = 3;
/// Pause readings kept: the largest of them stands for the other containers' share (one pause
/// may have fallen on another container's own pause).
const OTHERS_KEPT: usize = 3;
/// Points of the limit by which what a re-measurement took beyond the limit's share of its time
/// (or fell short of it) is paid back each step: spread thin, so that the work stays near the
/// limit, and other containers' pauses see a steady neighbour, not seconds of nothing.
pub const REPAY_POINTS: f64 = 1.5;
/// Metered steps whose device readings must agree within [`STEADY_POINTS`] before a pause
/// starts: longer than another container's pause, so that one is seen.
const RECENT: usize = 5;
/// See [`RECENT`].
const STEADY_POINTS: f64 = 5.0;
/// Points of the limit by which the container's own time at its cap may raise a paused
/// re-measurement's solo rate at most ([`Controller::solo_rate`]): where that reading errs
/// high, the limit stays within these points above what the unthrottled rate gives (25 at 28
/// or under, 12% more).
const OWN_TIME_RAISE_POINTS: f64 = 3.0;
/// The least share of the device's time the container's own work must add to the others' for
/// its reading to be used (a point of NVML's noise is then an eighth of it at most).
const OWN_TIME_MIN: f64 = 0.08;
/// A point of the device's reading, by which the container's own time is taken high: NVML's
/// readings move by a point at a steady rate, and the higher of two estimates would otherwise
/// take that noise for a higher solo rate.
const NOISE_SHARE: f64 = 0.01;
/// Device readings at or above this share say nothing of the container's own time: the device
/// is saturated, and its work squeezed.
const SATURATED: f64 = 0.9;
/// Steps a due pause waits for a steady device at most: a random number from
/// [`DEFER_MIN_STEPS`] (2 s) to this (8 s). A wait is bounded: a device whose readings never
/// settle (bursty neighbours) must not keep the container at a first measurement taken beside
/// them; the readings around the measurement still guard it.
const DEFER_MAX_STEPS: u32 = 40;
/// See [`DEFER_MAX_STEPS`].
const DEFER_MIN_STEPS: u32 = 10;
/// Points by which NVML's reading may exceed its bound before the time check lowers the rate
/// (its readings move by a point or two at a steady rate).
const TIME_SLACK: f64 = 3.0;
/// Metered steps before retrying a measurement that was not used: a random number up to this
/// (at least [`RETRY_MIN`]).
const RETRY_MAX: u32 = 10;
/// See [`RETRY_MAX`].
const RETRY_MIN: u32 = 3;
/// Readings of NVML at the cap after a measurement that make the time check's reference
/// ([`TimeRef`]): 2 s of them.
const TIME_REF_READINGS: u32 = 10;
/// Latest readings whose mean, above the reference by more than [`TIME_SLACK`] and the reference
/// readings' spread, has the work measured again: its blocks came to cost more (the same kernels
/// on more data).
const COSTLIER_READINGS: usize = 3;
/// Metered steps during which NVML is not acted on: its readings still describe the
/// unthrottled moments before (NVML trails by up to a second).
const NVML_LAG_STEPS: u32 = 5;
/// Unthrottled steps of a re-measurement; the last one counts (the first loses the moments
/// that waiting launches take to notice, and a throttled GPU's pipeline takes to fill: 6% of
/// a 200-ms step for a matmul on an H100, run 19).
pub const REMEASURE_STEPS: u32 = 2;

/// A re-measurement within this fraction of the solo rate taken before is of the same work, and
/// is averaged in ([`Controller::take_rate`]): it counts one step, whose count moves by up to 8%
/// about the work's rate (an H100 matmul: 15,312 to 17,952 blocks), so taken alone it moved a
/// limit of 75 to between 68 and 81 for the next 20 s (simulated from run 25's counts).
/// Further apart, the work changed (a process joined, a measurement beside another
/// container's was halved): taken as it is.
const SAME_WORK: f64 = 0.12;
/// The most weight the measurements before carry against a re-measurement of the same work:
/// the newest always moves the rate by a quarter of its difference at least, so that a drift
/// of the work's own rate is followed within a few re-measurements.
const WEIGHT_MAX: f64 = 3.0;
/// The weight of the first measurement (the mean of up to six full steps) against a
/// re-measurement's one step; none where the start is in doubt (`Controller::start_in_doubt`).
const FIRST_WEIGHT: f64 = 2.0;

/// The last `N` readings in a row, newest last, and how many of them are in.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Latest<const N: usize> {
    values: [f64; N],
    count: usize,
}

impl<const N: usize> Latest<N> {
    const NONE: Latest<N> = Latest {
        values: [0.0; N],
        count: 0,
    };

    fn push(&mut self, reading: f64) {
        self.values.rotate_left(1);
        self.values[N - 1] = reading;
        self.count = (self.count + 1).min(N);
    }

    /// Whether all `N` are in.
    fn full(&self) -> bool {
        self.count == N
    }

    /// The mean of all `N` (the empty places read 0 until [`Latest::full`]).
    fn mean(&self) -> f64 {
        self.values.iter().sum::<f64>() / N as f64
    }
}

/// What NVML read of the work held at the cap after a measurement, against which the time
/// check tells blocks that came to cost more from NVML's noise: the mean and spread of its
/// first [`TIME_REF_READINGS`] readings there, and the latest readings since. Two processes of
/// the graph/kernel mix read 39 to 46% at one cap on an H100; with a single reading (41) for
/// reference, two readings of 45 passed for costlier blocks and brought on a re-measurement
/// (run 28: 31% for 25).
#[derive(Clone, Copy, Debug, PartialEq)]
struct TimeRef {
    sum: f64,
    lowest: f64,
    highest: f64,
    readings: u32,
    latest: Latest<COSTLIER_READINGS>,
}

impl TimeRef {
    /// No reading yet (after each measurement).
    const NONE: TimeRef = TimeRef {
        sum: 0.0,
        lowest: f64::MAX,
        highest: f64::MIN,
        readings: 0,
        latest: Latest::NONE,
    };

    /// Takes a reading of the work held at the cap into the reference, until it is complete.
    fn take_at_cap(&mut self, util: f64) {
        if !self.complete() {
            self.sum += util;
            self.lowest = self.lowest.min(util);
            self.highest = self.highest.max(util);
            self.readings += 1;
        }
    }

    /// Notes a reading (any, once NVML reads the metered work) among the latest.
    fn note(&mut self, util: f64) {
        self.latest.push(util);
    }

    fn complete(&self) -> bool {
        self.readings >= TIME_REF_READINGS
    }

    /// The mean of the reference readings so far, if any.
    fn level(&self) -> Option<f64> {
        (self.readings > 0).then(|| self.sum / f64::from(self.readings))
    }

    /// Whether the latest readings' mean lies above the complete reference by more than
    /// [`TIME_SLACK`] and the spread of its readings: more than NVML's noise (the spread of 10
    /// readings alone, as the slack, still took noise of ± 4 points for a rise now and then).
    fn costlier(&self) -> bool {
        let latest = self.latest.mean();
        let slack = TIME_SLACK + (self.highest - self.lowest);
        self.complete()
            && self.latest.full()
            && self.level().is_some_and(|level| latest > level + slack)
    }
}

/// A non-zero state for the random step counts from any seed, different for seeds that differ
/// in any bit (splitmix64's finaliser, a bijection; the one seed it maps to 0 takes 1).
fn mix(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)).max(1)
}

/// The median of three rates.
fn median([a, b, c]: [f64; 3]) -> f64 {
    a.min(b).max(a.max(b).min(c))
}

/// The first measurement: the busy steps so far. The rate taken is the mean of the full steps
/// among the last six ([`FULL_STEP`]; of a program in bursts, the highest of six): a
/// step in which the work started or ended reads low, while the full steps' counts move about
/// the work's rate and are all kept, so that what one step queued and the next ran is counted
/// once.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Probe {
    /// Busy steps so far.
    steps: u32,
    /// The last six busy steps' rates, newest last.
    last: [f64; 6],
    /// Busy steps in a row up to now.
    run: u32,
    /// Whether the program went idle after two busy steps in a row: it works in bursts, whose
    /// edges move a step's rate by more than [`PROBE_DRIFT`] (a 0.6-s burst's steps on an H100:
    /// 4752, 17952, 16896, 12672 blocks), so the medians rarely agree.
    bursty: bool,
    /// Busy steps since the program first went idle after two busy ones.
    bursty_steps: u32,
}

/// A step of the first measurement that read below this fraction of the median of six, or
/// above its inverse, was not one of the work's full steps: one in which the work started or
/// ended (the start's partial steps read 4 to 87% of the work's rate on an H100, its full steps
/// 87 to 107%, runs 23 to 29), or a set-up step at another rate before the work.
const FULL_STEP: f64 = 0.8;

/// The mean of the `steps` within [`FULL_STEP`] of their `median`: the full ones.
fn full_steps_mean(steps: &[f64], median: f64) -> f64 {
    let (sum, n) = steps
        .iter()
        .filter(|&&r| r >= FULL_STEP * median && FULL_STEP * r <= median)
        .fold((0.0, 0.0), |(sum, n), &r| (sum + r, n + 1.0));
    sum / n
}

/// How a first measurement ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ProbeEnd {
    /// Two sets of three busy steps agreed (the later not higher, nor much lower).
    Settled,
    /// Six busy steps of a program that works in bursts.
    Bursts,
    /// [`PROBE_MAX_STEPS`] busy steps without either: the start is in doubt.
    RanOut,
}

impl Probe {
    const START: Probe = Probe {
        steps: 0,
        last: [0.0; 6],
        run: 0,
        bursty: false,
        bursty_steps: 0,
    };

    fn idle(self) -> Probe {
        Probe {
            run: 0,
            bursty: self.bursty || self.run >= 2,
            ..self
        }
    }

    /// Adds a busy step's rate: the probe going on, or the rate measured and how. A steady
    /// program's is taken once the last three busy steps have stopped rising above the three
    /// before them ([`PROBE_DRIFT`], [`PROBE_FALL`]), so that a program still warming up is
    /// measured warm, as the mean of the six's full steps: launches are counted as they queue,
    /// and a step's count moves by up to 8% about the work's rate (15312 to 17952 blocks for one
    /// matmul process on an H100, run 24), where the median of three read 4% high and the mean
    /// without the highest and lowest of six read 4.1% low (run 29's matmul at 75: 71.9). Over
    /// the 24 H100 starts of runs 26 and 29, the mean of the full steps read 98.3 to 101.3% of
    /// the rate the limit then held (standard deviation 0.9%), that trimmed mean 95.9 to 102.2%
    /// (1.6%). A program in bursts is measured over six busy steps since it first went idle,
    /// as the highest of them: a burst's edges read low, and its full steps read below its
    /// mean rate (an H100's 0.6-s bursts: 52,272 blocks each, 87.1k a second, in full steps of
    /// 16896 to 17952 blocks, 82.8k to 88.0k a second; perhaps clocks, as a GPU idle between
    /// bursts starts each at its highest). The second highest read 95% of it (run 31: 71.2 for
    /// a limit of 75; runs 25-30: 73.1-74.6), the highest 98%.
    fn busy(mut self, launched: f64) -> ControlFlow<(f64, ProbeEnd), Probe> {
        if launched > WORK_STARTS * self.last.iter().copied().fold(0.0, f64::max) {
            // The work started: what came before were set-up launches, whose idle gaps
            // would otherwise pass for bursts.
            self = Probe::START;
        }
        self.last.rotate_left(1);
        self.last[5] = launched;
        self.steps += 1;
        self.run += 1;
        self.bursty_steps += u32::from(self.bursty);
        let [a, b, c, d, e, f] = self.last;
        let recent = median([d, e, f]);
        let mean = (d + e + f) / 3.0;
        let steady = [d, e, f]
            .iter()
            .all(|r| (r - mean).abs() <= PROBE_SPREAD * mean);
        let rise = recent - median([a, b, c]);
        let settled = steady && rise <= PROBE_DRIFT * recent && -rise <= PROBE_FALL * recent;
        let mut sorted = self.last;
        sorted.sort_unstable_by(f64::total_cmp);
        let full = full_steps_mean(&self.last, (sorted[2] + sorted[3]) / 2.0);
        if settled && self.steps >= PROBE_MIN_STEPS {
            ControlFlow::Break((full, ProbeEnd::Settled))
        } else if self.bursty_steps >= PROBE_MIN_STEPS {
            ControlFlow::Break((sorted[5], ProbeEnd::Bursts))
        } else if self.steps >= PROBE_MAX_STEPS {
            ControlFlow::Break((full, ProbeEnd::RanOut))
        } else {
            ControlFlow::Continue(self)
        }
    }
}

/// Where the controller is.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Phase {
    /// Unmetered, measuring the program's unthrottled block rate.
    Measuring(Probe),
    /// Metered, for this many steps since the last measurement.
    Metered { steps: u32 },
    /// Nearly stopped before a re-measurement, reading the other containers' share of the
    /// device.
    PausedBefore {
        steps: u32,
        readings: Readings,
        away: Away,
    },
    /// Unmetered again for a fresh measurement of a program that is held back, with what the
    /// pause before read of the other containers (unknown: no pause), and the rate of its first
    /// step.
    Remeasuring {
        steps: u32,
        before: Others,
        away: Away,
        first: f64,
    },
    /// Nearly stopped after the re-measurement (which launched `launched` blocks per second),
    /// reading the others again: a share that moved since `before` means one of them started
    /// or ended a measurement meanwhile, and the re-measurement is not used.
    PausedAfter {
        steps: u32,
        before: Others,
        launched: f64,
        readings: Readings,
        away: Away,
    },
}

/// The time a re-measurement kept the container off its metered rate (paused or unmetered),
/// and the tokens it launched meanwhile: what exceeds the limit's share of that time, or falls
/// short of it, is paid back after.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Away {
    ns: u64,
    spent: u64,
}

impl Away {
    const NONE: Away = Away { ns: 0, spent: 0 };

    fn plus(self, s: &Sample) -> Away {
        Away {
            ns: self.ns.saturating_add(s.period_ns),
            spent: self.spent.saturating_add(s.consumed),
        }
    }
}

/// The device readings of a pause (shares of the device's time).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Readings {
    sum: f64,
    count: u32,
    lo: f64,
    hi: f64,
}

impl Readings {
    const NONE: Readings = Readings {
        sum: 0.0,
        count: 0,
        lo: f64::MAX,
        hi: f64::MIN,
    };

    /// Adds the device's reading of step `step` of a pause, if past the drain.
    fn read(mut self, step: u32, s: &Sample) -> Readings {
        if let (true, Some(u)) = (step >= PAUSE_DRAIN_STEPS, s.device_util) {
            let share = u.clamp(0.0, 100.0) / 100.0;
            self.sum += share;
            self.count += 1;
            self.lo = self.lo.min(share);
            self.hi = self.hi.max(share);
        }
        self
    }

    /// What the readings say of the other containers.
    fn others(&self) -> Others {
        if self.count == 0 {
            Others::Unknown
        } else if self.hi - self.lo > UNSTEADY {
            Others::Unsteady
        } else {
            Others::Share(self.sum / f64::from(self.count))
        }
    }
}

/// The other containers' use of the device, as pauses read it.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Others {
    /// No reading (no pause, or NVML gave no device sample).
    Unknown,
    /// Readings further apart than [`UNSTEADY`]: another container started or ended a
    /// measurement meanwhile.
    Unsteady,
    /// Their share of the device's time (0..=1).
    Share(f64),
}

impl Others {
    /// Before and after a re-measurement together: a share only if both agree.
    fn and_after(self, after: Others) -> Others {
        match (self, after) {
            (Others::Share(b), Others::Share(a)) if (a - b).abs() <= UNSTEADY => {
                Others::Share((a + b) / 2.0)
            }
            (Others::Share(_), Others::Share(_)) | (_, Others::Unsteady) => Others::Unsteady,
            (before, _) => before,
        }
    }
}

/// The refill rate's controller. A limit of L% holds on two readings at once, and the rate is the
/// lower of the two:
///
/// - **Work**: at most L% of the blocks per second the program launches with the GPU to itself.
///   The controller measures that rate, unmetered, from the bucket's exact count of tokens
///   spent: at the start (once the program's rate stops moving, `Probe`), and again
///   while the limit holds the program back (a process may have joined; the measurement at
///   start may have been taken beside another container). An idle program keeps its
///   measurement: measuring again after each pause let work in bursts shorter than a
///   measurement run unthrottled for good. Where NVML has device
///   samples, a re-measurement is framed by two pauses that read the other containers' time
///   share `o`, and the rate measured between them is divided by `1 - o`. What a
///   re-measurement launched beyond the limit's share of its time (or short of it) is paid back
///   over the following steps, so the average stays at L; the start's (the first measurement,
///   and the one 2 s after where the start is in doubt) are not: the limit starts after them.
/// - **Time**: NVML's utilisation of the container's processes at most L%, or at most what it
///   read once the work was held at the cap after a measurement (`TimeRef`), whichever is
///   higher. Above it the rate falls by [`GAIN`] of the ratio per step, a small step since NVML
///   trails the launches by up to a second (the cost test runs lags of 1 to 5 periods), and
///   the latest readings' mean above that reference by more than its noise brings on a
///   re-measurement (once between two scheduled ones). Off where pauses found other containers
///   at work (see `own_time`).
///
/// The limit is a share of the work (what the GPU gets done), and the work cap holds it. NVML's
/// reading is not that share: an H200 flat out reads 99%, yet at 25% of its work it reads less
/// than 25 (higher clocks, we suppose; runs 2 and 3), and two processes of small kernels on an
/// H100 read 96% at 25% of their work (contexts time-sliced; run 19, where holding the reading
/// at 25 took the work to 2%). So the time check guards only what the block rate cannot see, a
/// block that comes to cost more (the same kernels on more data): the reading rising past what
/// the work at the cap read.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Controller {
    /// The limit in percent.
    pub target: f64,
    rate: f64,
    /// Blocks per second the program launches with the GPU to itself, once measured, and the
    /// weight of that average against a re-measurement ([`Controller::take_rate`]).
    full_rate: Option<f64>,
    weight: f64,
    /// NVML's readings of the container once the work was held at the cap after the last
    /// measurement (see the time check above); cleared by each re-measurement (the first
    /// measurement starts from a new controller).
    time_ref: TimeRef,
    phase: Phase,
    /// Whether the next re-measurement is paused (where others hold the device): until
    /// [`QUIET_PAUSES`] in a row found it quiet, and while it is shared.
    pause_next: bool,
    /// Metered steps until the next paused re-measurement (while held back).
    next_check: u32,
    /// Metered steps left before a program held back is measured again, unthrottled: 2 s after
    /// the first measurement if the start is in doubt, then every 20 s of work. After the start,
    /// idle steps do not count: a program working in short bursts was measured more often than
    /// it paid back.
    plain_in: u32,
    /// Whether the start's measurements are done.
    started: bool,
    /// Whether the start needs a second measurement 2 s after the first: the first ran out of
    /// steps before the program's rate stopped moving, or the program went idle since (the
    /// first may have measured set-up launches, not the work; a program in bursts always
    /// does). Otherwise the limit holds from the first measurement on: a second one is 0.4 s
    /// unthrottled, which puts a second of the work far above a limit of 25 (runs 19 and 20
    /// settled at 3-4 s for it).
    start_in_doubt: bool,
    /// Whether the program works in bursts: the first measurement found it so, or it went idle
    /// since. Its re-measurements may take a burst's edges.
    bursty: bool,
    /// The device's last readings in metered steps, and the blocks per second the container
    /// launched in them.
    recent: Latest<RECENT>,
    recent_launched: Latest<RECENT>,
    /// The device's mean reading (0..=1) and the container's launches per second over the
    /// steady metered steps before the current pause, if it followed such steps.
    before_pause: Option<(f64, f64)>,
    /// Metered steps a due pause has waited for the device to read steadily, and how many it
    /// waits at most this time (random: two containers that both wait must not go together).
    deferred_steps: u32,
    defer_limit: u32,
    /// The other containers' time shares read by the last [`OTHERS_KEPT`] usable pauses,
    /// newest last, and how many pauses in a row found the device quiet.
    others: [f64; OTHERS_KEPT],
    quiet_pauses: u32,
    /// What re-measurements took beyond the limit's share of their time (negative: fell short
    /// of it), in points of the limit times steps, still to be paid back.
    owed: f64,
    /// The kernels launched lately, and whether the work changed since the last measurement that
    /// was used (new kernels, or the time reading showed its blocks cost more): the work cap is
    /// in blocks, and the new work's blocks may cost more or less.
    watch: Watch,
    work_changed: bool,
    /// Whether NVML reading the work above what it read at the cap may bring on a
    /// re-measurement: once between two scheduled ones, since a work whose blocks' cost keeps
    /// moving would otherwise be measured (unthrottled) faster than it is paid back.
    cost_check_armed: bool,
    /// State of the generator of random step counts.
    seed: u64,
}

const UNMETERED: Setting = Setting {
    rate: 0,
    forgive_debt: false,
};

const PAUSED: Setting = Setting {
    rate: PAUSE_RATE,
    ..UNMETERED
};

impl Controller {
    /// A controller for a limit of `target_percent`, measuring first. `seed` spreads the
    /// re-measurements of containers that start together: any value unique to the process and
    /// the moment will do, since it is mixed first (two containers' processes 11350 and 11351
    /// drew the same spacings when `seed | 1` was the state, and paused in step on an H100).
    pub fn new(target_percent: u64, seed: u64) -> Self {
        let mut c = Controller {
            target: target_percent.clamp(1, 100) as f64,
            rate: 0.0,
            full_rate: None,
            weight: FIRST_WEIGHT,
            time_ref: TimeRef::NONE,
            phase: Phase::Measuring(Probe::START),
            pause_next: true,
            next_check: 0,
            plain_in: FIRST_REMEASURE,
            started: false,
            start_in_doubt: false,
            bursty: false,
            recent: Latest::NONE,
            recent_launched: Latest::NONE,
            before_pause: None,
            deferred_steps: 0,
            defer_limit: DEFER_MAX_STEPS,
            others: [0.0; OTHERS_KEPT],
            quiet_pauses: 0,
            owed: 0.0,
            watch: Watch::default(),
            work_changed: false,
            cost_check_armed: true,
            seed: mix(seed),
        };
        c.next_check = c.random_steps(FIRST_CHECK_MIN, FIRST_CHECK_MAX);
        c.defer_limit = c.random_steps(DEFER_MIN_STEPS, DEFER_MAX_STEPS);
        c
    }

    /// A controller taking over a device whose bucket already refills at `rate` (another
    /// process held the lease before, so `rate` is about the limit's share of the work).
    pub fn resume(target_percent: u64, rate: u64, seed: u64) -> Self {
        let mut c = Controller::new(target_percent, seed);
        if rate > 0 {
            c.rate = rate as f64;
            c.full_rate = Some(c.rate * 100.0 / c.target);
            c.phase = Phase::Metered { steps: 0 };
        }
        c
    }

    /// A number of steps in `lo..=hi` (xorshift: the spread matters, not the quality).
    fn random_steps(&mut self, lo: u32, hi: u32) -> u32 {
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        lo + (self.seed % u64::from(hi - lo + 1)) as u32
    }

    /// Where the controller is, in a word (for the trace).
    pub fn phase_name(&self) -> &'static str {
        match self.phase {
            Phase::Measuring { .. } => "measuring",
            Phase::Metered { .. } => "metered",
            Phase::PausedBefore { .. } => "paused-before",
            Phase::Remeasuring { .. } => "remeasuring",
            Phase::PausedAfter { .. } => "paused-after",
        }
    }

    /// The measured solo rate in blocks per second, once measured (for the trace).
    pub fn full_rate(&self) -> Option<f64> {
        self.full_rate
    }

    /// The work cap: the limit's share of the measured solo rate.
    fn cap(&self) -> f64 {
        self.full_rate
            .map_or(f64::MAX, |f| (f * self.limit_now() / 100.0).max(1.0))
    }

    /// The limit in force: the target, less what is paid back this step.
    fn limit_now(&self) -> f64 {
        (self.target - self.repayment()).clamp(1.0, 100.0)
    }

    /// The points of the limit paid back this step (negative: made up).
    fn repayment(&self) -> f64 {
        self.owed.clamp(-REPAY_POINTS, REPAY_POINTS)
    }

    fn meter_at_cap(&mut self, forgive_debt: bool) -> Setting {
        self.rate = self.cap();
        self.phase = Phase::Metered { steps: 0 };
        Setting {
            rate: self.rate as u64,
            forgive_debt,
        }
    }

    /// Ends a re-measurement of `launched` blocks per second, taken beside `others`, after
    /// `away` off the
    /// metered rate: meters again, paying back what `away` took beyond the limit's share. The
    /// debt in the bucket is forgiven, since the repayment is spread here instead.
    fn remeasured(&mut self, launched: f64, others: Others, away: Away) -> Setting {
        // The start's second measurement (2 s after the first, where the start is in doubt) is
        // part of the start, whose unthrottled moments are not paid back (the limit starts
        // after it): paying back 0.4 s unthrottled at 1.5 points a step held a limit of 25 at
        // 23.5 for the next 20 s.
        let start_up = !self.started && others == Others::Unknown && !self.work_changed;
        self.started = true;
        self.next_check = REMEASURE_EVERY;
        self.plain_in = REMEASURE_EVERY;
        self.time_ref = TimeRef::NONE;
        match others {
            Others::Unknown if launched > 0.0 => self.take_rate(launched),
            Others::Unknown => {}
            Others::Unsteady => {}
            Others::Share(others) => self.take_solo_rate(launched, others),
        }
        // Not used, or nothing counted while unthrottled (the limit was off meanwhile: HAMi's
        // monitor turns it off while it counts fewer than two containers active): checked
        // again soon.
        let used = others != Others::Unsteady && launched > 0.0;
        if used {
            self.work_changed = false;
        } else {
            self.next_check = self.random_steps(RETRY_MIN, RETRY_MAX);
        }
        // Against the cap of the new measurement: the old one may be far off (a block that
        // came to cost more, a process that joined), and with it a shortfall read as excess.
        let excess = away.spent as f64 - tokens_in(self.cap() as u64, away.ns) as f64;
        if let (Some(f), false) = (self.full_rate, start_up) {
            self.owed += 100.0 * excess / (f * PERIOD_NS as f64 / 1e9);
        }
        self.rate = self.cap();
        self.pause_next =
            self.shared() || self.quiet_pauses < QUIET_PAUSES || others == Others::Unsteady;
        if self.work_changed && !used {
            // Not metered meanwhile at a cap known to be wrong.
            return match others {
                Others::Unknown => self.remeasure_plain(),
                _ => self.pause_before(None),
            };
        }
        self.phase = Phase::Metered { steps: 0 };
        Setting {
            rate: self.rate as u64,
            forgive_debt: true,
        }
    }

    /// The other containers' share of the device's time, as the recent pauses read it.
    fn others_share(&self) -> f64 {
        self.others.iter().fold(0.0, |a, &b| a.max(b))
    }

    fn shared(&self) -> bool {
        self.others_share() > SHARED_ABOVE
    }

    /// Takes the solo rate a re-measurement gave: averaged with the rate before where it is of
    /// the same work ([`SAME_WORK`]; the newest weighs at least 1 / ([`WEIGHT_MAX`] + 1)), as it
    /// is where the work changed or the rate is further off.
    fn take_rate(&mut self, solo: f64) {
        match self.full_rate {
            Some(old) if !self.work_changed && (solo - old).abs() <= SAME_WORK * old => {
                self.full_rate = Some((self.weight * old + solo) / (self.weight + 1.0));
                self.weight = (self.weight + 1.0).min(WEIGHT_MAX);
            }
            _ => {
                self.full_rate = Some(solo);
                self.weight = 1.0;
            }
        }
    }

    /// Takes a solo rate from a paused re-measurement (`others` of the device's time was the
    /// other containers').
    fn take_solo_rate(&mut self, launched: f64, others: f64) {
        self.others.rotate_left(1);
        self.others[OTHERS_KEPT - 1] = others;
        self.quiet_pauses = if others > SHARED_ABOVE {
            0
        } else {
            self.quiet_pauses + 1
        };
        // A quiet pause after busy ones may have fallen on another container's pause, and the
        // rate measured after it on that container's measurement: checked again soon.
        if others > SHARED_ABOVE {
            self.next_check = self.random_steps(SHARED_EVERY_MIN, SHARED_EVERY_MAX);
        } else if self.quiet_pauses < QUIET_PAUSES {
            self.next_check = self.random_steps(FIRST_CHECK_MIN, FIRST_CHECK_MAX);
        }
        if others > OTHERS_MAX || launched <= 0.0 {
            return;
        }
        // Time slices are shared equally among contexts that have work, so while this one ran
        // unthrottled the others kept at most half the time, whatever they took while it paused.
        let unthrottled = launched / (1.0 - others.min(FAIR_SHARE));
        self.take_rate(self.solo_rate(others, unthrottled));
    }

    /// The solo rate of a paused re-measurement whose unthrottled rate, scaled by the others'
    /// share `others`, came to `unthrottled`: raised to what the container's own time gives,
    /// where that is higher. The own time is what it launched in the steady metered steps
    /// before the pause over its share of the device's time then (the device's reading less
    /// the others'). Beside a neighbour at its cap the unthrottled rate reads 4 to 15% low on
    /// an H100 (runs 25 to 33: the neighbour's contexts take more time beside unthrottled work
    /// than the pause reads), while the own time came within 4% there (run 33: 18.5k blocks/s
    /// at the cap, the device at 43% and the neighbour alone at about 21%, so 84k against a
    /// solo 81.2k; runs 34 and 35 in docs/gpu-results.md). It is used only where the
    /// container's share is large enough to read and the device not saturated, and raises the
    /// rate by [`OWN_TIME_RAISE_POINTS`] of the limit at most: on a GPU whose reading curves up
    /// more steeply at low load, or beside a neighbour whose rate moved between the metered
    /// steps and the pause, it reads high.
    fn solo_rate(&self, others: f64, unthrottled: f64) -> f64 {
        match self.before_pause {
            Some((device, launched)) if device < SATURATED && device - others >= OWN_TIME_MIN => {
                let own = launched / (device - others + NOISE_SHARE);
                own.clamp(
                    unthrottled,
                    unthrottled * (1.0 + OWN_TIME_RAISE_POINTS / self.target),
                )
            }
            _ => unthrottled,
        }
    }

    /// Ends the start on the first measurement alone: what follows is as after a second one.
    fn start_done(&mut self) {
        self.started = true;
        self.plain_in = REMEASURE_EVERY;
        self.next_check = REMEASURE_EVERY;
    }

    /// Starts a paused re-measurement, after metered steps that read `steady` (see
    /// [`Controller::steady_reading`]; `None`: unsteady, or not metered at a known cap).
    fn pause_before(&mut self, steady: Option<(f64, f64)>) -> Setting {
        self.before_pause = steady;
        self.phase = Phase::PausedBefore {
            steps: 0,
            readings: Readings::NONE,
            away: Away::NONE,
        };
        PAUSED
    }

    /// Starts an unpaused re-measurement.
    fn remeasure_plain(&mut self) -> Setting {
        self.phase = Phase::Remeasuring {
            steps: 0,
            before: Others::Unknown,
            away: Away::NONE,
            first: 0.0,
        };
        UNMETERED
    }

    /// Measures again at once work whose kernels changed ([`crate::workload`]), paused where a
    /// paused check would be: without waiting for a steady device (the change moved it) or for
    /// the program to be held back (a cap now too high holds nothing back). What the time
    /// reading held the rate to described the old work.
    fn measure_new_work(&mut self, plain: bool) -> Setting {
        self.deferred_steps = 0;
        self.rate = self.cap();
        if plain {
            self.remeasure_plain()
        } else {
            self.pause_before(None)
        }
    }

    /// Whether a paused re-measurement starts now: it is due and `worth` it (others hold the
    /// device, which has samples), the program is held back, and the device reads steadily, or
    /// has been waited for [`Controller::defer_limit`] steps. Every container that waited sees the
    /// device settle at the same moment, so then each waits a random few steps more.
    fn pause_due(&mut self, worth: bool, starved: bool) -> bool {
        if !(self.pause_next && worth && self.next_check == 0) {
            self.deferred_steps = 0;
            return false;
        }
        let steady = self.device_steady();
        if steady && self.deferred_steps > 0 {
            self.deferred_steps = 0;
            self.next_check = self.random_steps(1, RETRY_MAX);
            return false;
        }
        self.deferred_steps = if steady { 0 } else { self.deferred_steps + 1 };
        if !(starved && (steady || self.deferred_steps > self.defer_limit)) {
            return false;
        }
        self.deferred_steps = 0;
        self.defer_limit = self.random_steps(DEFER_MIN_STEPS, DEFER_MAX_STEPS);
        true
    }

    /// Whether the device read steadily over the last [`RECENT`] metered steps: no other
    /// container is pausing or measuring just now (a pause would collide with theirs).
    fn device_steady(&self) -> bool {
        let (lo, hi) = self
            .recent
            .values
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), &r| (lo.min(r), hi.max(r)));
        self.recent.full() && hi - lo <= STEADY_POINTS
    }

    /// Keeps the device's last readings for [`Controller::device_steady`], and what the
    /// container launched meanwhile for [`Controller::steady_reading`].
    fn watch_device(&mut self, steps: u32, s: &Sample, launched: f64) {
        if steps == 0 || s.device_util.is_none() {
            self.recent = Latest::NONE;
            self.recent_launched = Latest::NONE;
        }
        if let Some(d) = s.device_util {
            self.recent.push(d);
            self.recent_launched.push(launched);
        }
    }

    /// The device's mean reading (0..=1) over the last metered steps, and the container's
    /// launches per second in them, if the device read steadily.
    fn steady_reading(&self) -> Option<(f64, f64)> {
        self.device_steady()
            .then(|| (self.recent.mean() / 100.0, self.recent_launched.mean()))
    }

    /// The container's own share of the device's time in percent: NVML's reading of its
    /// processes, but never more than the device's. None on a GPU that is or may be shared
    /// (others hold it, and pauses have not yet shown them idle):
    /// there NVML's reading of a process is the device's (H200, run 10), and the others' share
    /// is known only at pauses, while theirs moves too.
    fn own_time(&self, s: &Sample) -> Option<f64> {
        let unproven = s.others_present && self.quiet_pauses < QUIET_PAUSES;
        if self.shared() || unproven {
            return None;
        }
        match (s.util, s.device_util) {
            (Some(u), Some(d)) => Some(u.min(d)),
            (u, d) => u.or(d),
        }
    }

    /// The setting for the next period, after `s`.
    pub fn step(&mut self, s: Sample) -> Setting {
        self.work_changed |= self.watch.changed(s.kernels);
        let launched = if s.period_ns == 0 {
            0.0
        } else {
            s.consumed as f64 * 1e9 / s.period_ns as f64
        };
        match self.phase {
            Phase::Measuring(probe) => {
                if s.consumed == 0 {
                    // Only busy steps measure the program's work; an idle one is passed over
                    // (work in bursts shorter than a measurement is measured across them).
                    self.phase = Phase::Measuring(probe.idle());
                    return UNMETERED;
                }
                match probe.busy(launched) {
                    ControlFlow::Continue(probe) => {
                        self.phase = Phase::Measuring(probe);
                        UNMETERED
                    }
                    ControlFlow::Break((rate, end)) => {
                        self.full_rate = Some(rate);
                        self.weight = FIRST_WEIGHT;
                        self.start_in_doubt = end == ProbeEnd::RanOut;
                        self.bursty = end == ProbeEnd::Bursts;
                        self.meter_at_cap(true)
                    }
                }
            }
            Phase::PausedBefore {
                steps,
                readings,
                away,
            } => {
                let (readings, away) = (readings.read(steps, &s), away.plus(&s));
                if steps + 1 < PAUSE_STEPS {
                    self.phase = Phase::PausedBefore {
                        steps: steps + 1,
                        readings,
                        away,
                    };
                    return PAUSED;
                }
                self.phase = Phase::Remeasuring {
                    steps: 0,
                    before: readings.others(),
                    away,
                    first: 0.0,
                };
                UNMETERED
            }
            Phase::Remeasuring {
                steps,
                before,
                away,
                first,
            } => {
                let away = away.plus(&s);
                let first = if steps == 0 { launched } else { first };
                if steps + 1 < REMEASURE_STEPS {
                    self.phase = Phase::Remeasuring {
                        steps: steps + 1,
                        before,
                        away,
                        first,
                    };
                    return UNMETERED;
                }
                // A program in bursts may start or stop during either step, which then reads
                // low: the higher counts, and steps further apart than a probe's spread count as
                // nothing counted (4092 then 6732 blocks on an H100, where a full step has
                // 16896).
                let launched = match (self.bursty, first.max(launched)) {
                    (false, _) => launched,
                    (true, high) if high - first.min(launched) > PROBE_SPREAD * high => 0.0,
                    (true, high) => high,
                };
                if before == Others::Unknown {
                    return self.remeasured(launched, before, away);
                }
                self.phase = Phase::PausedAfter {
                    steps: 0,
                    before,
                    launched,
                    readings: Readings::NONE,
                    away,
                };
                PAUSED
            }
            Phase::PausedAfter {
                steps,
                before,
                launched,
                readings,
                away,
            } => {
                let (readings, away) = (readings.read(steps, &s), away.plus(&s));
                if steps + 1 < PAUSE_AFTER_STEPS {
                    self.phase = Phase::PausedAfter {
                        steps: steps + 1,
                        before,
                        launched,
                        readings,
                        away,
                    };
                    return PAUSED;
                }
                self.remeasured(launched, before.and_after(readings.others()), away)
            }
            Phase::Metered { steps } => {
                match self.own_time(&s) {
                    Some(util) => {
                        let at_cap = self.rate >= 0.99 * self.cap();
                        let acting = steps >= NVML_LAG_STEPS;
                        if acting {
                            if s.starved && at_cap {
                                self.time_ref.take_at_cap(util);
                            }
                            self.time_ref.note(util);
                        }
                        let bound = self.limit_now().max(self.time_ref.level().unwrap_or(0.0));
                        let factor = (bound / util.clamp(1.0, 100.0)).clamp(0.25, 2.0);
                        let over = util > bound + TIME_SLACK;
                        if acting && self.time_ref.costlier() && self.cost_check_armed {
                            self.cost_check_armed = false;
                            self.work_changed = true;
                        }
                        if acting && (over || (s.starved && factor > 1.0)) {
                            // Over the bound in NVML: down. Held back below it: back up (to the
                            // cap). Below it because the program asks for less: no wind-up.
                            self.rate *= 1.0 + GAIN * (factor - 1.0);
                        }
                    }
                    // No time reading: the work cap alone.
                    None => self.rate = self.cap(),
                }
                self.rate = self.rate.min(self.cap()).max(1.0);
                self.watch_device(steps, &s, launched);
                self.next_check = self.next_check.saturating_sub(1);
                if s.consumed > 0 || !self.started {
                    self.plain_in = self.plain_in.saturating_sub(1);
                }
                let worth = s.others_present && s.device_util.is_some();
                let plain = !(self.pause_next && worth);
                self.bursty |= s.consumed == 0;
                if !self.started {
                    self.start_in_doubt |= s.consumed == 0;
                    if self.start_in_doubt {
                        // The first measurement may be of set-up launches or a burst's edges.
                        self.weight = 0.0;
                    }
                    if plain && self.plain_in == 0 && !self.start_in_doubt {
                        self.start_done();
                    }
                }
                if self.work_changed {
                    return self.measure_new_work(plain);
                }
                if self.pause_due(worth, s.starved) {
                    self.cost_check_armed = true;
                    return self.pause_before(self.steady_reading());
                }
                if s.starved && plain && self.plain_in == 0 {
                    self.cost_check_armed = true;
                    return self.remeasure_plain();
                }
                self.phase = Phase::Metered { steps: steps + 1 };
                self.owed -= self.repayment();
                Setting {
                    rate: self.rate as u64,
                    forgive_debt: false,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    extern crate std;
    use std::vec::Vec;

    struct SimGpu {
        capacity: f64,
        demand: f64,
        seed: u64,
        lag: usize,
        full_reading: f64,
        exponent: f64,
        debt: f64,
        reported: Vec<f64>,
        /// Whether NVML reports utilisation at all.
        nvml: bool,
        /// Points by which NVML's readings move either way, independently from reading to
        /// reading (splitmix's finaliser over the generator: its raw bits cluster).
        noise: f64,
        /// Throughput per period as a share of the capacity, in percent.
        shares: Vec<f64>,
        /// The kernels the program launches.
        kernels: KernelSet,
    }

    impl SimGpu {
        /// A GPU that reads 100% flat out on a curve of exponent 0.7, reporting `lag` late.
        fn new(capacity: f64, demand: f64, seed: u64, lag: usize) -> Self {
            SimGpu {
                capacity,
                demand,
                seed,
                lag,
                full_reading: 100.0,
                exponent: 0.7,
                debt: 0.0,
                reported: Vec::new(),
                nvml: true,
                noise: 1.0,
                shares: Vec::new(),
                kernels: KernelSet::of(1),
            }
        }

        /// An H200 running a bf16 matmul: 99% flat out, 25% of the time doing 30% of the work.
        fn h200(demand: f64, seed: u64) -> Self {
            SimGpu {
                full_reading: 99.0,
                exponent: 1.15,
                ..SimGpu::new(1e6, demand, seed, 2)
            }
        }

        fn run(&mut self, set: Setting, period_s: f64) -> Sample {
            let wanted = self.demand.min(self.capacity) * period_s;
            if set.forgive_debt {
                self.debt = 0.0;
            }
            let (done, starved) = if set.rate == 0 {
                self.debt += wanted;
                (wanted, false)
            } else {
                let available = set.rate as f64 * period_s - self.debt;
                let done = wanted.min(available.max(0.0));
                self.debt = (self.debt + done - set.rate as f64 * period_s).max(0.0);
                (done, wanted > available)
            };
            self.seed = self
                .seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let noise = self.noise * ((mix(self.seed) % 2001) as f64 / 1000.0 - 1.0);
            let share = done / period_s / self.capacity;
            self.shares.push(100.0 * share);
            self.reported.push(
                (self.full_reading * libm_pow(share, self.exponent) + noise).clamp(0.0, 100.0),
            );
            let seen = self.reported.len().saturating_sub(1 + self.lag);
            Sample {
                util: self.nvml.then(|| self.reported[seen]),
                consumed: done as u64,
                period_ns: (period_s * 1e9) as u64,
                starved,
                device_util: self.nvml.then(|| self.reported[self.reported.len() - 1]),
                others_present: false,
                kernels: if done >= 1.0 {
                    self.kernels
                } else {
                    KernelSet::EMPTY
                },
            }
        }

        /// Runs `steps` controller steps of 200 ms.
        fn drive(&mut self, c: &mut Controller, set: &mut Setting, steps: usize) {
            for _ in 0..steps {
                *set = c.step(self.run(*set, 0.2));
            }
        }
    }

    fn mean(v: &[f64]) -> f64 {
        v.iter().sum::<f64>() / v.len() as f64
    }

    fn libm_pow(x: f64, y: f64) -> f64 {
        std::primitive::f64::powf(x, y)
    }

    /// Runs `gpu` for 16 s under a fresh controller; the mean NVML reading and throughput share
    /// over the last 8 s.
    fn settle(mut gpu: SimGpu, target: u64) -> (f64, f64) {
        let mut c = Controller::new(target, 1);
        let mut set = UNMETERED;
        gpu.drive(&mut c, &mut set, 80);
        (mean(&gpu.reported[40..80]), mean(&gpu.shares[40..80]))
    }

    /// A GPU that reads busier than its work (100% flat out, 38% at a quarter of its work): the
    /// work settles within 3 points of the limit, and NVML's reading is left where that work
    /// puts it. Mutation: holding NVML's reading at the limit (the time check before run 19)
    /// settles 25 at about 14% of the work.
    #[test]
    fn a_gpu_that_reads_busier_than_its_work_keeps_the_work_at_the_limit() {
        for (capacity, demand) in [(1e6, 5e6), (3e4, 1e5), (1e9, 1.2e9)] {
            work_settles_at_each_limit(&std::format!("capacity {capacity}"), |target| {
                SimGpu::new(capacity, demand, target, 0)
            });
        }
    }

    /// Settles a fresh `gpu(limit)` under each limit: the work within 3 points of it.
    fn work_settles_at_each_limit(what: &str, gpu: impl Fn(u64) -> SimGpu) {
        for target in [25, 50, 75] {
            let (util, share) = settle(gpu(target), target);
            assert!(
                (share - target as f64).abs() <= 3.0,
                "{what}, target {target}: work settled at {share:.1}% (NVML {util:.1}%)"
            );
        }
    }

    /// Two processes of small kernels sharing a limit, as on an H100 in run 19: NVML reads the
    /// GPU 96-98% busy at any share of their work (their contexts take turns), so a reading held
    /// at the limit took their work from 25% to 2% within 5 s. The work settles within 3 points
    /// of the limit. Mutation: the time check's bound without what the work at the cap read
    /// (the limit alone) settles them below 1%.
    #[test]
    fn a_gpu_that_reads_busy_at_any_work_keeps_the_work_at_the_limit() {
        work_settles_at_each_limit("reading busy", |target| SimGpu {
            full_reading: 98.0,
            exponent: 0.02,
            ..SimGpu::new(1e6, 5e6, target, 1)
        });
    }

    /// What the time check is for: blocks that come to cost twice as much without a change of
    /// kernels (the same kernels on more data), which the work cap in blocks cannot see, on a
    /// GPU whose reading trails by 1 to 5 periods: the reading rises past what it read at the
    /// cap, and the work is measured again, so from 2 s after the change every second's work is
    /// within 3 points below the limit and not above it (that re-measurement is paid back) until
    /// the next scheduled one (20 s). Mutations: without the re-measurement the time check
    /// alone brings the work down in 5 s (28.8% for 25 in second 2); paying back what the
    /// re-measurement took beyond the old cap (2 times too high) instead of the new one raises
    /// the limit by 1.5 points (76.5 for 75).
    #[test]
    fn a_block_that_comes_to_cost_more_is_caught_by_the_time_reading() {
        for lag in 1..=5 {
            for target in [25, 50, 75] {
                let mut gpu = SimGpu::new(1e6, 5e6, target, lag);
                let mut c = Controller::new(target, 1);
                let mut set = UNMETERED;
                gpu.drive(&mut c, &mut set, 40);
                gpu.capacity /= 2.0;
                gpu.drive(&mut c, &mut set, 100);
                // Shares are of the new capacity.
                let t = target as f64;
                let what = std::format!("target {target}, lag {lag}, after the change");
                each_second_within(&gpu.shares[50..140], 2, (t - 3.0, t + 0.5), &what);
            }
        }
    }

    /// NVML's noise at a steady cap, as two processes of the graph/kernel mix read on an H100
    /// (39 to 46% at one cap, run 28), is not taken for blocks that came to cost more: in the
    /// 56 s after the first measurement only the two scheduled re-measurements run (each
    /// followed by a reference taken while it is paid back), and the work holds within 3 points
    /// of the limit, over 200 seeds of noise of ± 4 points, at each limit and NVML lags of 0, 2
    /// and 5 periods. Mutations: the reference's spread as the slack instead of added to
    /// [`TIME_SLACK`] re-measures; so does a reference of one reading (as before), or a single
    /// latest reading against it.
    #[test]
    fn noise_at_the_cap_is_not_taken_for_costlier_blocks() {
        for lag in [0, 2, 5] {
            for seed in 1..=200 {
                for target in [25, 50, 75] {
                    let mut gpu = SimGpu::new(1e6, 5e6, seed * 100 + target, lag);
                    gpu.noise = 4.0;
                    let mut c = Controller::new(target, seed);
                    let mut set = UNMETERED;
                    gpu.drive(&mut c, &mut set, 20);
                    let mut unmetered = 0;
                    for step in 20..300 {
                        gpu.drive(&mut c, &mut set, 1);
                        unmetered += u32::from(set.rate == 0);
                        assert!(
                            unmetered <= 2 * REMEASURE_STEPS,
                            "lag {lag}, seed {seed}, target {target}: measured again at step {step}"
                        );
                    }
                    let work = mean(&gpu.shares[20..300]);
                    assert!(
                        (work - target as f64).abs() <= 3.0,
                        "lag {lag}, seed {seed}, target {target}: work at {work:.1}%"
                    );
                }
            }
        }
    }

    /// Asserts that the work of every second (5 steps) of `shares`, the first being second
    /// `first`, lies within `lo..=hi`.
    fn each_second_within(shares: &[f64], first: usize, (lo, hi): (f64, f64), what: &str) {
        for (k, second) in shares.chunks(5).enumerate() {
            let work = mean(second);
            assert!(
                (lo..=hi).contains(&work),
                "{what}: second {} at {work:.1}",
                k + first
            );
        }
    }

    /// Blocks whose cost keeps moving (the same kernels on data of two sizes, alternating every
    /// second): the time reading brings on one extra re-measurement between two scheduled ones,
    /// not one per rise, so the unthrottled steps stay near what is paid back (at most two
    /// measurements of 2 steps per 20 s). Mutation: re-measuring at every rise ran unthrottled
    /// for 100 steps of the 500.
    #[test]
    fn a_cost_that_keeps_moving_is_measured_again_once_between_scheduled_measurements() {
        for target in [25, 50, 75] {
            let mut gpu = SimGpu::new(1e6, 5e6, target, 2);
            let mut c = Controller::new(target, 1);
            let mut set = UNMETERED;
            gpu.drive(&mut c, &mut set, 40);
            let mut unthrottled = 0;
            for step in 0..500 {
                gpu.capacity = if (step / 5) % 2 == 0 { 1e6 } else { 0.6e6 };
                gpu.drive(&mut c, &mut set, 1);
                unthrottled += usize::from(set.rate == 0);
            }
            assert!(
                unthrottled <= 20,
                "target {target}: {unthrottled} unthrottled steps in 100 s"
            );
        }
    }

    /// The H200 case: NVML reads below the work's share when throttled. The throughput settles
    /// within 3 points of the limit's share; steering by NVML alone (no work cap) gives about 30
    /// for 25, as the H200 did in run 2.
    #[test]
    fn throughput_share_holds_on_a_gpu_that_boosts_when_throttled() {
        for target in [25, 50, 75] {
            let (util, share) = settle(SimGpu::h200(5e6, target), target);
            assert!(
                (share - target as f64).abs() <= 3.0,
                "target {target}: throughput settled at {share:.1}% (NVML {util:.1}%)"
            );
            assert!(util <= target as f64 + 3.0, "NVML {util:.1} above {target}");
        }
    }

    /// Without NVML utilisation (no NVML in the container, or a device that reports none) the
    /// limit still holds, on the work reading alone. The controller used to skip such periods,
    /// which left the bucket unmetered and the program at 100% (mutation: returning
    /// `UNMETERED` for `util: None` fails this).
    #[test]
    fn without_nvml_the_work_reading_holds_the_limit() {
        work_settles_at_each_limit("without NVML", |target| SimGpu {
            nvml: false,
            ..SimGpu::h200(5e6, target)
        });
    }

    /// A program that pauses for a step after its first measurement, so that the start is in
    /// doubt and measured again 2 s later: neither of the start's two measurements is paid
    /// back, so after them the work is at the limit, not below it. Mutation: paying back the
    /// second one (as every later re-measurement is) holds the work 1.5 points under the limit
    /// for the next 15 s.
    #[test]
    fn the_start_is_not_paid_back() {
        for target in [25, 50, 75] {
            let mut gpu = SimGpu::h200(5e6, target);
            let mut c = Controller::new(target, 1);
            let mut set = UNMETERED;
            gpu.drive(&mut c, &mut set, 8);
            gpu.demand = 0.0;
            gpu.drive(&mut c, &mut set, 1);
            gpu.demand = 5e6;
            gpu.drive(&mut c, &mut set, 92);
            let share = mean(&gpu.shares[26..101]);
            assert!(
                (share - target as f64).abs() <= 0.5,
                "target {target}: {share:.2}% from 5.2 s to 20.2 s"
            );
        }
    }

    /// A program that launches a few small kernels at start-up, pauses for 2 s (loading data,
    /// waiting for its peers), then runs compute-bound: the work settles at the target within
    /// 4 s of starting. The pause puts the start in doubt, and the start's second measurement
    /// is of the work. Mutation: an idle step not putting the start in doubt leaves the work at
    /// the rate measured on the start-up launches (0.2% for 25).
    #[test]
    fn startup_launches_do_not_miscalibrate_the_real_work() {
        for target in [25, 50, 75] {
            let mut gpu = SimGpu::h200(1e4, target);
            let mut c = Controller::new(target, 1);
            let mut set = UNMETERED;
            gpu.drive(&mut c, &mut set, 6);
            gpu.demand = 0.0;
            gpu.drive(&mut c, &mut set, 10);
            gpu.demand = 5e6;
            let start = gpu.shares.len();
            gpu.drive(&mut c, &mut set, 60);
            let share = mean(&gpu.shares[start + 20..]);
            assert!(
                (share - target as f64).abs() <= 3.0,
                "target {target}: the work settled at {share:.1}%"
            );
        }
    }

    /// Set-up launches, a wait, then work that starts a quarter into a step, as 4 processes did
    /// on an H100 (run 20: the set-up steps counted towards the measurement's 4, and it ended on
    /// the first two full steps): the measurement is of the full steps. Mutation: the mean of
    /// the three read 91.7% of the solo rate.
    #[test]
    fn a_measurement_passes_over_a_step_the_work_started_in() {
        let mut gpu = SimGpu::h200(2e4, 1);
        let mut c = Controller::new(25, 1);
        let mut set = UNMETERED;
        for demand in [2e4, 0.0, 2e4, 0.0, 0.0, 7.5e5] {
            gpu.demand = demand;
            gpu.drive(&mut c, &mut set, 1);
        }
        gpu.demand = 5e6;
        while c.full_rate().is_none() {
            gpu.drive(&mut c, &mut set, 1);
        }
        let measured = c.full_rate().unwrap_or(0.0) / gpu.capacity;
        assert!(
            (measured - 1.0).abs() <= 0.03,
            "measured {:.1}% of the solo rate",
            100.0 * measured
        );
    }

    /// Set-up launches with idle steps between, then work whose first full steps read 7% high
    /// (launches queueing ahead), step by step as 4 processes of a matmul ran on an H100 (run
    /// 23): the measurement starts afresh when the work starts, so the set-up's idle steps do
    /// not make it a program in bursts, and it is of the full steps, within 2 s of the start.
    /// Mutation: without the fresh start the set-up counts as bursts, and the bursts' rule read
    /// 107.0% of the solo rate (the H100 held 79.4% for 75).
    #[test]
    fn set_up_launches_before_the_work_are_not_taken_for_bursts() {
        let mut gpu = SimGpu::h200(0.0, 1);
        let mut c = Controller::new(75, 1);
        let mut set = UNMETERED;
        for demand in [0.23, 0.045, 0.0, 0.0, 0.0, 0.143, 0.045, 0.0, 0.143] {
            gpu.demand = demand * 1e6;
            gpu.drive(&mut c, &mut set, 1);
        }
        gpu.demand = 5e6;
        let mut steps = 0;
        for capacity in [1.07, 1.0, 1.07].into_iter().chain(core::iter::repeat(1.0)) {
            if c.full_rate().is_some() || steps == 15 {
                break;
            }
            gpu.capacity = capacity * 1e6;
            gpu.drive(&mut c, &mut set, 1);
            steps += 1;
        }
        let measured = c.full_rate().unwrap_or(0.0) / 1e6;
        assert!(
            (measured - 1.0).abs() <= 0.03 && steps <= 10,
            "measured {:.1}% of the solo rate after {steps} steps of work",
            100.0 * measured
        );
    }

    /// Runs a fresh controller over steps whose counts are `counts` (the GPU at 1e6 a step for
    /// their mean), starting `offset` into them, until it has measured (at most 15 steps): the
    /// measurement in the counts' unit, and the busy steps it took.
    fn measure_counts(counts: &[f64], offset: usize) -> (f64, usize) {
        let scale = 1e6 / mean(counts);
        let mut gpu = SimGpu::h200(5e6, 1);
        let mut c = Controller::new(75, 1);
        let mut set = UNMETERED;
        let mut steps = 0;
        for count in counts.iter().cycle().skip(offset).take(15) {
            if c.full_rate().is_some() {
                break;
            }
            gpu.capacity = scale * count;
            gpu.drive(&mut c, &mut set, 1);
            steps += 1;
        }
        (c.full_rate().unwrap_or(0.0) / scale, steps)
    }

    /// Blocks a step of one H100 matmul process, unthrottled (run 25): they cycle about the
    /// work's rate, as launches are counted when they queue.
    const RUN25_MATMUL: [f64; 11] = [
        17424.0, 17424.0, 17952.0, 15312.0, 15312.0, 17160.0, 16632.0, 17424.0, 15840.0, 15840.0,
        16896.0,
    ];

    /// Counts that cycle about the work's rate, as an H100's 1-process matmul and graph did
    /// (launches are counted as they queue; run 24: 16896, 17952, 17424, 15312, 15840 and 17424
    /// blocks over and over; run 25's below, where the medians of two sets of three steps differ
    /// by up to 12%), from each point of their cycle: measured within 8 busy steps (1.6 s: the
    /// first steps of a run are a partial one and these, so the work is metered before 2 s and
    /// settles within 2 s of its start), and within 2% of the mean for run 24's cycle (which
    /// leaves the rest of the band, 4% at 75, to the GPU's own drift) and 3% for run 25's.
    /// Mutations: the median of the last three steps read 94.2% to 103.7% of run 24's mean; the
    /// medians held to agree within 3% both ways took 12 to 15 steps (the H100 settled in 3 to
    /// 6 s).
    #[test]
    fn counts_that_cycle_are_measured_within_2_s() {
        let run24 = [16896.0, 17952.0, 17424.0, 15312.0, 15840.0, 17424.0];
        let graph = [
            134640.0, 139920.0, 139920.0, 132000.0, 116160.0, 134640.0, 139920.0, 139920.0,
            129360.0, 121440.0,
        ];
        for (what, counts, within) in [
            ("run 24's matmul", &run24[..], 0.02),
            ("matmul", &RUN25_MATMUL[..], 0.03),
            ("graph", &graph[..], 0.03),
        ] {
            for offset in 0..counts.len() {
                let (measured, steps) = measure_counts(counts, offset);
                let measured = measured / mean(counts);
                assert!(
                    (measured - 1.0).abs() <= within && steps <= 8,
                    "{what} from step {offset}: {:.1}% of the mean after {steps} steps",
                    100.0 * measured
                );
            }
        }
    }

    /// The busy steps of the first measurements an H100 took under the present rule for when a
    /// measurement ends (runs 26 and 29: the graph/kernel mix with 1, 2 and 4 processes, matmul
    /// and graph with 1), each as a fraction of the rate the limit then held (the measured rate
    /// over the share of the unlimited work that held), up to the step the measurement ended on.
    const H100_STARTS: [&[f64]; 24] = [
        // graph/1p/25 (run 29)
        &[0.436, 1.026, 1.045, 1.045, 0.966, 0.888, 1.006],
        // graph/1p/50 (run 29)
        &[0.539, 1.028, 1.048, 1.048, 0.929, 0.890],
        // graph/1p/75 (run 29)
        &[0.476, 1.007, 1.046, 1.046, 0.967, 0.888, 1.026],
        // matmul/1p/25 (run 29)
        &[0.505, 1.005, 1.032, 1.032, 0.938, 0.907],
        // matmul/1p/50 (run 29)
        &[0.503, 1.032, 1.032, 1.058, 0.939, 0.872, 1.027],
        // matmul/1p/75 (run 29)
        &[0.505, 0.973, 1.067, 1.030, 0.968, 0.874],
        // mix/1p/25 (run 26)
        &[0.014, 0.052, 1.049, 1.029, 1.029, 1.018, 0.945, 0.997],
        // mix/1p/50 (run 26)
        &[0.014, 0.078, 1.044, 1.028, 1.018, 1.013, 0.939, 1.007],
        // mix/1p/75 (run 26)
        &[0.014, 0.971, 1.018, 1.018, 1.018, 0.945, 0.997],
        // mix/2p/25 (run 26)
        &[
            0.010, 0.001, 0.014, 0.952, 1.023, 1.034, 1.023, 0.894, 1.012,
        ],
        // mix/2p/50 (run 26)
        &[0.638, 1.023, 1.023, 1.023, 0.937, 1.012],
        // mix/2p/75 (run 26)
        &[0.014, 0.015, 0.614, 1.026, 1.023, 1.023, 0.937, 1.001],
        // mix/4p/25 (run 26)
        &[
            0.045, 0.013, 0.205, 1.043, 1.032, 1.032, 1.000, 0.924, 1.010,
        ],
        // mix/4p/50 (run 26)
        &[
            0.013, 0.001, 0.020, 0.024, 0.248, 1.053, 1.021, 1.021, 1.021, 0.913, 1.000,
        ],
        // mix/4p/75 (run 26)
        &[
            0.028, 0.001, 0.019, 0.010, 0.378, 1.021, 1.021, 1.021, 1.010, 0.935, 1.000,
        ],
        // mix/1p/25 (run 29)
        &[0.397, 1.019, 1.029, 1.019, 0.988, 0.957, 1.009],
        // mix/1p/50 (run 29)
        &[0.011, 0.335, 1.031, 1.031, 1.021, 1.000, 0.959, 1.011],
        // mix/1p/75 (run 29)
        &[0.523, 1.021, 1.025, 1.027, 0.979, 0.979],
        // mix/2p/25 (run 29)
        &[0.028, 1.063, 1.025, 1.030, 1.025, 0.907, 1.004],
        // mix/2p/50 (run 29)
        &[0.957, 1.023, 1.039, 1.023, 0.905, 1.002],
        // mix/2p/75 (run 29)
        &[0.028, 0.076, 1.045, 1.024, 1.029, 1.023, 0.894, 1.002],
        // mix/4p/25 (run 29)
        &[0.057, 0.163, 1.049, 1.027, 1.027, 1.025, 0.900, 1.006],
        // mix/4p/50 (run 29)
        &[0.057, 0.130, 1.047, 1.036, 1.026, 1.026, 0.939, 1.004],
        // mix/4p/75 (run 29)
        &[0.057, 1.073, 1.035, 1.025, 1.025, 0.917, 0.982],
    ];

    /// Each of the H100's first measurements above, measured again from its counts, is within
    /// 3% of the rate the limit held (2.25 points at 75), and ends on the step the H100's did.
    /// Mutations: the mean of the six without their highest and lowest (before run 30) read
    /// 96.1% of run 29's matmul at 75 (which held 71.9 for 75); the partial start step kept,
    /// 91.4% of its graph at 50.
    #[test]
    fn h100_starts_are_measured_within_3_percent() {
        for (i, counts) in H100_STARTS.iter().enumerate() {
            let (measured, steps) = measure_counts(counts, 0);
            assert!(
                (measured - 1.0).abs() <= 0.03 && steps == counts.len(),
                "start {i} ({counts:?}): {:.1}% of the rate held, after {steps} steps",
                100.0 * measured
            );
        }
    }

    /// Blocks a 204-ms step launched at the start of run 31's three rows of bursts on an H100
    /// (0.6 s of matmul, then 1.2 s idle), until each was first measured.
    const RUN31_BURSTS: [&[f64]; 3] = [
        &[
            0.0, 0.0, 7392.0, 17424.0, 17424.0, 10032.0, 0.0, 0.0, 0.0, 0.0, 0.0, 9504.0, 17424.0,
            17424.0, 7392.0, 0.0, 0.0, 0.0, 0.0, 0.0, 12144.0, 17424.0,
        ],
        &[
            660.0, 0.0, 4224.0, 17424.0, 17424.0, 13200.0, 0.0, 0.0, 0.0, 0.0, 0.0, 6864.0,
            16896.0, 17424.0, 10032.0, 0.0, 0.0, 0.0, 0.0, 0.0, 9504.0, 16896.0,
        ],
        &[
            0.0, 0.0, 7392.0, 17424.0, 17952.0, 9504.0, 0.0, 0.0, 0.0, 0.0, 0.0, 10032.0, 16896.0,
            17424.0, 6864.0, 0.0, 0.0, 0.0, 0.0, 0.0, 12672.0, 16896.0,
        ],
    ];

    /// Each of those bursts launched 52,272 blocks in its 0.6 s (at most 87.1k a second, the
    /// work the benchmark counts): each start, replayed, is measured within 3% of that, on the
    /// step the H100's was. Mutation: the second highest of the six busy steps (before run 32)
    /// read 95.1% of it for the rows of 50 and 75 (which held 47.7 and 71.2).
    #[test]
    fn bursts_are_measured_at_their_mean_rate() {
        let burst_rate = 52272.0 / 0.6;
        for (i, counts) in RUN31_BURSTS.iter().enumerate() {
            let mut c = Controller::new(75, 1);
            let mut steps = 0;
            for &count in counts.iter() {
                c.step(Sample {
                    util: None,
                    consumed: count as u64,
                    period_ns: 204_000_000,
                    starved: false,
                    device_util: None,
                    others_present: false,
                    kernels: KernelSet::EMPTY,
                });
                steps += 1;
                if c.full_rate().is_some() {
                    break;
                }
            }
            let measured = c.full_rate().unwrap_or(0.0) / burst_rate;
            assert!(
                (measured - 1.0).abs() <= 0.03 && steps == counts.len(),
                "row {i}: {:.1}% of the bursts' rate, after {steps} steps",
                100.0 * measured
            );
        }
    }

    /// The device reads steadily only over [`RECENT`] readings since the last measurement: the
    /// empty places of the window are not readings, though of a device near idle they would
    /// read as steady ones. Mutation: without the check that the window is full, one reading of
    /// 2% passes for a steady device.
    #[test]
    fn the_device_is_steady_only_over_a_full_window_of_readings() {
        let mut c = Controller::new(50, 1);
        for _ in 0..RECENT {
            assert!(!c.device_steady(), "{:?}", c.recent);
            c.recent.push(2.0);
        }
        assert!(c.device_steady());
    }

    /// Set-up launches at full speed, then work that launches 30% less: the measurement waits
    /// until the rate stops falling, and takes the work's. Mutation: a fall of any size accepted
    /// measures 132.1% of the work's rate. (Without the bound on a rise, a program that warms up
    /// is measured cold: 21.2% for 25.)
    #[test]
    fn a_start_that_slows_fast_is_measured_once_slow() {
        let mut counts = [0.7; 15];
        counts[..4].fill(1.0);
        let measured = measure_counts(&counts, 0).0 / 0.7;
        assert!(
            (measured - 1.0).abs() <= 0.03,
            "{:.1}% of the work's rate",
            100.0 * measured
        );
    }

    /// A program that warms up, launching faster each step for its first 2 s (from 80% of its
    /// rate), as PyTorch's small kernels did on an H200: the measurement goes on until the last
    /// three steps stop rising above the three before, so the work is within 3 points from 3 s
    /// on. Mutation: without that check (three steady steps, as before) 50 gives 44 (the H200
    /// gave 34 for 50 and 50 for 75 with a measurement that short, run 14).
    #[test]
    fn a_program_that_warms_up_is_measured_once_warm() {
        for target in [25, 50, 75] {
            let mut gpu = SimGpu::h200(5e6, target);
            let mut c = Controller::new(target, 1);
            let mut set = UNMETERED;
            for step in 0..40 {
                gpu.capacity = 1e6 * (0.8 + 0.02 * f64::from(step)).min(1.0);
                gpu.drive(&mut c, &mut set, 1);
            }
            let share = mean(&gpu.shares[15..40]);
            assert!(
                (share - target as f64).abs() <= 3.0,
                "target {target}: {share:.1}% once warm"
            );
        }
    }

    /// A steady program, on GPUs that read NVML late by 0 to 5 periods: from 2 s after its
    /// start every second of its work is within 3 points of the limit, until the first
    /// scheduled re-measurement (20 s). Mutation: the start's second measurement taken whatever
    /// the first showed (as before) puts the second that holds it at 55% for 25.
    #[test]
    fn a_steady_program_settles_within_2_s_of_start() {
        for lag in 0..=5 {
            for target in [25, 50, 75] {
                let mut gpu = SimGpu::new(1e6, 5e6, target, lag);
                let mut c = Controller::new(target, 1);
                let mut set = UNMETERED;
                gpu.drive(&mut c, &mut set, 100);
                let t = target as f64;
                let what = std::format!("target {target}, lag {lag}");
                each_second_within(&gpu.shares[10..100], 2, (t - 3.0, t + 3.0), &what);
            }
        }
    }

    /// Start-up launches that vary from step to step and run straight into the real work (4
    /// processes starting one after another, as in the H200's 4-process run): the measurement
    /// waits for a steady rate instead of taking the start-up's.
    #[test]
    fn an_unsteady_start_is_not_taken_for_the_work() {
        let mut gpu = SimGpu::h200(2e4, 25);
        let mut c = Controller::new(25, 1);
        let mut set = UNMETERED;
        for demand in [2e4, 1e4, 1e5, 5e3, 3e5, 5e6] {
            gpu.demand = demand;
            gpu.drive(&mut c, &mut set, 1);
        }
        gpu.drive(&mut c, &mut set, 40);
        let share = mean(&gpu.shares[26..]);
        assert!(
            (share - 25.0).abs() <= 3.0,
            "settled at {share:.1}% of the GPU"
        );
    }

    /// A program that ran at 40% of the GPU when measured and then wants all of it (a second
    /// process joined): the re-measurement while it is held back gives it the limit's share of
    /// the GPU within 25 s, and the unthrottled moments are paid back: over 100 s (five
    /// re-measurements) the average is the limit (forgiving their debt instead makes it 26.5).
    #[test]
    fn a_program_that_grows_is_measured_again() {
        let mut gpu = SimGpu::h200(4e5, 25);
        let mut c = Controller::new(25, 1);
        let mut set = UNMETERED;
        gpu.drive(&mut c, &mut set, 40);
        let before = mean(&gpu.shares[30..40]);
        assert!((before - 10.0).abs() <= 1.5, "25% of 40%: {before:.1}");
        gpu.demand = 5e6;
        gpu.drive(&mut c, &mut set, 125);
        let after = mean(&gpu.shares[135..165]);
        assert!((after - 25.0).abs() <= 3.0, "after growing: {after:.1}%");
        gpu.drive(&mut c, &mut set, 510);
        let across = mean(&gpu.shares[165..675]);
        assert!(
            (across - 25.0).abs() <= 0.5,
            "over 100 s with re-measurements: {across:.2}%"
        );
    }

    /// Containers whose seeds differ only in the lowest bit (processes 11350 and 11351, as in
    /// an H100 run where two containers then paused in step, each measuring beside the other,
    /// and held 11.8% for 25) draw different spacings for their paused checks. Mutation: the
    /// seed with its lowest bit set as the state draws the same 20 of 20.
    #[test]
    fn neighbouring_seeds_draw_different_spacings() {
        for pid in [11350, 2, 1000] {
            let (mut a, mut b) = (Controller::new(25, pid), Controller::new(25, pid + 1));
            let same = (0..20)
                .filter(|_| {
                    a.random_steps(FIRST_CHECK_MIN, FIRST_CHECK_MAX)
                        == b.random_steps(FIRST_CHECK_MIN, FIRST_CHECK_MAX)
                })
                .count();
            assert!(
                same <= 4,
                "seeds {pid} and {}: {same} of 20 draws alike",
                pid + 1
            );
        }
    }

    /// Settings that meter (not a pause, not a measurement) whose limit, the rate as a share of
    /// the solo rate, is more than 3 points from `target`: (step, limit).
    fn off_limit(settings: &[(u64, f64)], target: f64) -> Vec<(usize, f64)> {
        settings
            .iter()
            .enumerate()
            .filter(|(_, &(rate, limit))| rate > PAUSE_RATE && (limit - target).abs() > 3.0)
            .map(|(k, &(_, limit))| (k, limit))
            .collect()
    }

    /// A program whose blocks come to cost 4 times as much (elementwise kernels giving way to
    /// matmuls), or a quarter, with other kernels: the change is noticed after 3 periods and
    /// the program measured again at once, so from 2 s after the change every metered period's
    /// limit is within 3 points of the target's share of the new solo rate, for the next 20 s
    /// (no oscillation). Mutation: without the watch (the kernels never seen to change) the old
    /// cap in blocks stands until the periodic re-measurement 20 s later: 5.9% for a limit of
    /// 25 after the quarter; after the four times the time check alone takes it from 100% to
    /// 38% by 2 s, then swings below (18% at 13 s).
    #[test]
    fn a_change_of_kernels_alone_is_measured_again_within_2_s() {
        for target in [25, 50, 75] {
            for factor in [4.0, 0.25] {
                let mut gpu = SimGpu::h200(5e6, target);
                let mut c = Controller::new(target, 1);
                let mut set = UNMETERED;
                gpu.drive(&mut c, &mut set, 60);
                gpu.capacity /= factor;
                gpu.kernels = KernelSet::of(2);
                let mut settings = Vec::new();
                for _ in 0..110 {
                    gpu.drive(&mut c, &mut set, 1);
                    settings.push((set.rate, 100.0 * set.rate as f64 / gpu.capacity));
                }
                // Settings for the periods from 2 s after the change on.
                let off = off_limit(&settings[9..], target as f64);
                assert!(
                    off.is_empty(),
                    "target {target}, cost x{factor}: (period, limit) off by more than 3: \
                     {off:?}"
                );
            }
        }
    }

    /// The same beside another container (each with a limit of 25, 60 seeds, the change after
    /// 40 s): the re-measurement is framed by pauses at once, and from 2 s after the change both
    /// containers' metered limits stay within 3 points for 20 s. Where the change fell on the
    /// other's own re-measurement (seed 20) the pauses' readings disagree, and the work is
    /// measured again at once, not metered meanwhile at the old cap (the limit is back 3.4 s
    /// after the change; metering one period at it fails that seed). Mutation: without the
    /// watch 55 of the 60 seeds fail each way, the changed container at about 6% or 100% of its
    /// new solo rate until its next paused check (30 to 60 s).
    #[test]
    fn a_change_of_kernels_beside_another_container_is_measured_again_within_2_s() {
        for factor in [4.0, 0.25] {
            for seed in SEEDS {
                let mut gpu = SharedGpu::new(&[Some(25), Some(25)], seed);
                gpu.run(200);
                gpu.tenants[0].solo /= factor;
                gpu.tenants[0].kernels = KernelSet::of(99);
                let mut settings = [Vec::new(), Vec::new()];
                for _ in 0..110 {
                    gpu.run(1);
                    for (i, t) in gpu.tenants.iter().enumerate() {
                        settings[i].push((t.set.rate, 100.0 * t.set.rate as f64 / t.solo));
                    }
                }
                for (i, s) in settings.iter().enumerate() {
                    let off = off_limit(&s[9..], 25.0);
                    assert!(
                        off.is_empty(),
                        "cost x{factor}, seed {seed}: container {i}'s (period, limit) off by \
                         more than 3: {off:?}"
                    );
                }
            }
        }
    }

    /// Containers time-sliced on one GPU, each with its own bucket and controller (or none: an
    /// unlimited neighbour). Each wants `demand` of its solo rate (compute-bound, > 1); a period's
    /// time goes to each container as it asks, and where the asks exceed the period, in equal
    /// shares (round-robin time slices), each container keeping to what its tokens allow. NVML's
    /// per-process readings are the device's (as on the H200, run 10), ± 1 point, two periods
    /// late; the device samples are prompt.
    struct SharedGpu {
        tenants: Vec<Tenant>,
        seed: u64,
        device: Vec<f64>,
        /// Points of noise on the device's reading, either way.
        noise: f64,
        /// HAMi's monitor, ticking every this many milliseconds (0: none). At a tick it counts
        /// the tenants active since the tick before (launched, or had launches held back, which
        /// libvgpu marks as activity), and turns every tenant's limit on if two or more were,
        /// off otherwise. While off, the library meters and counts no launch.
        monitor_tick_ms: u64,
        limits_on: bool,
        /// NVML reads a busy share `b` of the device's time as `b` to this power (1: as it is;
        /// an H100 running matmuls read 20% for 24% of its work, 42% for 46%, run 23: 1.14).
        nvml_curve: f64,
        /// Share of the time lost to context switches per unit of the time the other
        /// containers take, where the device is saturated; taken from those held by the time
        /// slicing (an H100: an unthrottled matmul beside one at 24% of its work got 70%, two
        /// unthrottled ones 44.5% each, run 23: about 0.22).
        switch_cost: f64,
    }

    struct Tenant {
        ctl: Option<Controller>,
        set: Setting,
        /// Solo rate in blocks per second.
        solo: f64,
        demand: f64,
        debt: f64,
        /// Work per period as a share of the solo rate, in percent.
        shares: Vec<f64>,
        /// When it was last active (the end of the last step with launches or held back), in
        /// milliseconds.
        active_ms: u64,
        /// The kernels it launches.
        kernels: KernelSet,
    }

    impl SharedGpu {
        /// Tenants with these limits (`None`: unlimited); `seed` varies their controllers'
        /// random steps.
        fn new(limits: &[Option<u64>], seed: u64) -> Self {
            let tenants = limits
                .iter()
                .enumerate()
                .map(|(i, l)| Tenant {
                    ctl: l.map(|t| Controller::new(t, seed * 104_729 + i as u64 * 7919)),
                    set: UNMETERED,
                    solo: 1e6 * (i as f64 + 1.0),
                    demand: 5.0,
                    debt: 0.0,
                    shares: Vec::new(),
                    active_ms: 0,
                    kernels: KernelSet::of(i + 1),
                })
                .collect();
            SharedGpu {
                tenants,
                seed: 42,
                device: Vec::new(),
                noise: 1.0,
                monitor_tick_ms: 0,
                limits_on: true,
                nvml_curve: 1.0,
                switch_cost: 0.0,
            }
        }

        fn step(&mut self, dt: f64) {
            // Each tenant's ask as a share of the period, as its tokens allow.
            let asks: Vec<(f64, bool)> = self
                .tenants
                .iter_mut()
                .map(|t| {
                    if t.set.forgive_debt {
                        t.debt = 0.0;
                    }
                    let wanted = t.demand * t.solo * dt;
                    if t.set.rate == 0 || !self.limits_on {
                        return (wanted / (t.solo * dt), false);
                    }
                    let available = (t.set.rate as f64 * dt - t.debt).max(0.0);
                    (wanted.min(available) / (t.solo * dt), wanted > available)
                })
                .collect();
            // Equal time slices among those that ask more than their share.
            let mut order: Vec<usize> = (0..asks.len()).collect();
            order.sort_by(|a, b| asks[*a].0.partial_cmp(&asks[*b].0).unwrap());
            let mut left = 1.0;
            let mut time = std::vec![0.0; asks.len()];
            for (k, &i) in order.iter().enumerate() {
                time[i] = asks[i].0.min(left / (asks.len() - k) as f64);
                left -= time[i];
            }
            let sliced: Vec<usize> = (0..time.len()).filter(|&i| asks[i].0 > time[i]).collect();
            if !sliced.is_empty() {
                let most = time.iter().copied().fold(0.0, f64::max);
                let lost = self.switch_cost * (time.iter().sum::<f64>() - most);
                for &i in &sliced {
                    time[i] -= lost / sliced.len() as f64;
                }
            }
            self.seed = self
                .seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let noise = self.noise * (((self.seed >> 33) % 200) as f64 / 100.0 - 1.0);
            let busy: f64 = time.iter().sum();
            self.device
                .push((100.0 * libm_pow(busy, self.nvml_curve) + noise).clamp(0.0, 100.0));
            let lagged = self.device[self.device.len().saturating_sub(3)];
            let device_now = self.device[self.device.len() - 1];
            let active: Vec<bool> = self.tenants.iter().map(|t| t.demand > 0.0).collect();
            for (i, t) in self.tenants.iter_mut().enumerate() {
                let others_present = active.iter().enumerate().any(|(j, &a)| a && j != i);
                let mut done = time[i] * t.solo * dt;
                t.shares.push(100.0 * time[i]);
                if !self.limits_on {
                    done = 0.0;
                } else if t.set.rate == 0 {
                    t.debt += done;
                } else {
                    t.debt = (t.debt + done - t.set.rate as f64 * dt).max(0.0);
                }
                let sample = Sample {
                    util: Some(lagged),
                    consumed: done as u64,
                    period_ns: (dt * 1e9) as u64,
                    starved: asks[i].1,
                    device_util: Some(device_now),
                    others_present,
                    kernels: if done >= 1.0 {
                        t.kernels
                    } else {
                        KernelSet::EMPTY
                    },
                };
                if let Some(c) = t.ctl.as_mut() {
                    t.set = c.step(sample);
                }
            }
            let step_ms = (dt * 1e3) as u64;
            let end = self.device.len() as u64 * step_ms;
            for (i, t) in self.tenants.iter_mut().enumerate() {
                if time[i] * t.solo * dt >= 1.0 || asks[i].1 {
                    t.active_ms = end;
                }
            }
            self.monitor_ticks(end - step_ms, end);
        }

        /// The monitor's ticks in `(from, to]` (milliseconds).
        fn monitor_ticks(&mut self, from: u64, to: u64) {
            let tick = self.monitor_tick_ms;
            if tick == 0 {
                return;
            }
            for at in (from / tick + 1..=to / tick).map(|n| n * tick) {
                let active = self.tenants.iter().filter(|t| t.active_ms + tick > at);
                self.limits_on = active.count() >= 2;
            }
        }

        fn run(&mut self, steps: usize) {
            for _ in 0..steps {
                self.step(0.2);
            }
        }

        /// Tenant `i`'s mean share of its solo rate over steps `from..`.
        fn share(&self, i: usize, from: usize) -> f64 {
            mean(&self.tenants[i].shares[from..])
        }
    }

    /// Seeds of the controllers' random steps: each scenario runs with each, so that their
    /// re-measurements fall at different moments (and sometimes on each other).
    const SEEDS: std::ops::Range<u64> = 1..61;

    /// Two containers at 25 each on a GPU that behaves as the H100 did (run 23): NVML reads a
    /// busy share on a curve (20% for 24% of the work), and context switches cost an
    /// unthrottled re-measurement beside a neighbour at its cap 5 points of the GPU's time. The
    /// pauses then read the neighbour low and the re-measurement reads low, so the unthrottled
    /// solo estimate comes out about 12% low (the H100: 4 to 15%, runs 25 to 33); the
    /// container's own time at its cap raises it. Over the 60 seeds each container gets 21.5 to
    /// 26.5% (here 21.8 to 26.0) and all together 24% or more on average (here 24.3).
    /// Mutation: without the own time (the unthrottled estimate alone, as before) they got
    /// 21.9 to 23.5%, 22.7 on average. Where that reading errs high the raise is bounded
    /// (`a_noisy_device_does_not_hold_the_pauses_off`: unbounded, 101 of its 1000 seeds
    /// settle at 29 to 33%), and a point of noise is taken off it
    /// (`two_containers_each_get_their_own_share`: without, a seed settles at 28.0%).
    #[test]
    fn two_containers_on_a_gpu_with_switch_costs_get_about_their_share() {
        let mut all = Vec::new();
        for seed in SEEDS {
            let mut gpu = SharedGpu::new(&[Some(25), Some(25)], seed);
            gpu.nvml_curve = 1.14;
            gpu.switch_cost = 0.22;
            gpu.run(400);
            for i in 0..2 {
                let share = gpu.share(i, 75);
                assert!(
                    (21.5..=26.5).contains(&share),
                    "seed {seed}: container {i} got {share:.1}% of its solo rate"
                );
                all.push(share);
            }
        }
        let average = mean(&all);
        assert!(average >= 24.0, "{average:.2}% of the solo rate on average");
    }

    /// Two containers with their own limits, started together on one GPU: each gets its own
    /// share of its solo rate, within 3 points over the 65 s from 15 s on (most settle by 8 s:
    /// two pauses at the same moment cost a second round). Measured unthrottled beside each
    /// other at start they see half the GPU; mutations: taking the rate measured beside the
    /// others as the solo rate settles 25 + 25 at 12.5 each; keeping the time check on a
    /// shared GPU at 2-13% (the H200 gave 10-18%, run 9); without the reading after the
    /// re-measurement, or without the fair-share bound, some seeds settle far above the limit.
    #[test]
    fn two_containers_each_get_their_own_share() {
        for limits in [[25, 25], [50, 25], [25, 75], [50, 50]] {
            for seed in SEEDS {
                let mut gpu = SharedGpu::new(&[Some(limits[0]), Some(limits[1])], seed);
                gpu.run(400);
                for (i, l) in limits.iter().enumerate() {
                    let share = gpu.share(i, 75);
                    assert!(
                        (share - *l as f64).abs() <= 3.0,
                        "limits {limits:?}, seed {seed}: container {i} got {share:.1}% of its \
                         solo rate"
                    );
                }
            }
        }
    }

    /// A container that joins a GPU where another has run alone for 10 s: both hold their
    /// shares within 3 points over the 20 s after the newcomer's first 5 s (the first one
    /// notices the device getting busier and measures again, paused).
    #[test]
    fn a_container_joining_later_gets_its_share() {
        for seed in SEEDS {
            let mut gpu = SharedGpu::new(&[Some(25), Some(25)], seed);
            gpu.tenants[1].demand = 0.0;
            gpu.run(50);
            gpu.tenants[1].demand = 5.0;
            gpu.run(125);
            for i in 0..2 {
                let share = gpu.share(i, 75);
                assert!(
                    (share - 25.0).abs() <= 3.0,
                    "seed {seed}: container {i} got {share:.1}% after the second joined"
                );
            }
        }
    }

    /// The same under HAMi's monitor ticking every 0.5 s (t_monitor's port): the first
    /// container runs unlimited alone (the monitor turns its limit off, and its controller sees
    /// no launch), then both are limited from the monitor's first tick with two active. Both
    /// hold their shares within 3 points over the 14 s from 14 s after the second joined, as
    /// t_monitor asks. A pause launches nothing for 0.6 s, long enough for a tick to find the
    /// container idle and turn both limits off, so that its re-measurement counts nothing:
    /// counting only launches as active here (what libvgpu gave the monitor before it marked
    /// launches held back as activity) fails 4 of the 60 seeds, and 35 (most at the halved first
    /// measurement, 13.2%) with the controller's rules before the retry of a re-measurement that
    /// counted nothing, the re-check after a quiet pause and the third quiet pause.
    #[test]
    fn a_container_joining_later_under_hamis_monitor_gets_its_share() {
        for seed in SEEDS {
            let gpu = joining_later_under_hamis_monitor(seed);
            let alone = mean(&gpu.tenants[0].shares[10..50]);
            assert!(alone >= 99.0, "seed {seed}: {alone:.1}% alone, unlimited");
            for i in 0..2 {
                let share = gpu.share(i, 120);
                assert!(
                    (share - 25.0).abs() <= 3.0,
                    "seed {seed}: container {i} got {share:.1}% under the monitor"
                );
            }
        }
    }

    /// Container 0 alone for 10 s, then both for 28 s, under HAMi's monitor.
    fn joining_later_under_hamis_monitor(seed: u64) -> SharedGpu {
        let mut gpu = SharedGpu::new(&[Some(25), Some(25)], seed);
        gpu.monitor_tick_ms = 500;
        gpu.tenants[1].demand = 0.0;
        gpu.run(50);
        gpu.tenants[1].demand = 5.0;
        gpu.run(140);
        gpu
    }

    /// Two containers whose limits the monitor turns on at one tick measure together, and their
    /// first paused checks draw their spacing from their own random streams; now and then both
    /// draw the same twice running, so that both pairs of checks fall together and read the
    /// other's pause as a quiet device. At most 5 of 20,000 seeds stay at their halved first
    /// measurement (below 15% over the 14 s from 14 s after the second joined): it takes three
    /// such draws in a row, and 2 of the 20,000 (1541 and 3454) draw them. Mutation: ending
    /// the checks after two quiet pauses (not three) leaves 21 of the 20,000 at 12.5% for good,
    /// as t_monitor did once in 42 runs.
    #[test]
    fn checks_that_fall_together_twice_go_on() {
        let stuck: Vec<u64> = (1..20_001)
            .filter(|&seed| {
                let gpu = joining_later_under_hamis_monitor(seed);
                (0..2).any(|i| gpu.share(i, 120) < 15.0)
            })
            .collect();
        assert!(stuck.len() <= 5, "stuck at half: seeds {stuck:?}");
    }

    /// Two containers whose periodic paused checks fall together: each reads the other's pause
    /// as a quiet device and measures beside the other's measurement, half the GPU. A quiet
    /// pause after busy ones is checked again soon, so over 10 minutes no 20 s from 15 s on
    /// falls below 18% (the halved rate is 12.5%). Mutation: spacing the next check by every kept reading (30 to
    /// 60 s while any of the last three pauses read the other busy) keeps 5 of the 60 seeds at
    /// 12.5% for 20 s or more.
    #[test]
    fn pauses_that_fall_together_are_checked_again_soon() {
        for seed in SEEDS {
            let mut gpu = SharedGpu::new(&[Some(25), Some(25)], seed);
            gpu.run(3000);
            for i in 0..2 {
                for from in (75..2900).step_by(25) {
                    let share = mean(&gpu.tenants[i].shares[from..from + 100]);
                    assert!(
                        share >= 18.0,
                        "seed {seed}: container {i} got {share:.1}% over the 20 s from step \
                         {from}"
                    );
                }
            }
        }
    }

    /// A re-measurement that counted no launch (the limit was off meanwhile: HAMi's monitor turns
    /// every container's off while it counts fewer than two active) learned nothing, so the
    /// next paused check comes within a few seconds. Mutation: scheduling it as after a used
    /// re-measurement pauses next 150 steps later or more.
    #[test]
    fn a_remeasurement_that_counted_nothing_is_retried_soon() {
        let mut c = Controller::new(25, 5);
        let sample = |consumed, device| Sample {
            util: Some(device),
            consumed,
            period_ns: PERIOD_NS,
            starved: true,
            device_util: Some(device),
            others_present: true,
            kernels: KernelSet::EMPTY,
        };
        let mut set = UNMETERED;
        let mut pauses = Vec::new();
        for step in 0..400 {
            // Paused: the other container's 25%. Unmetered after a pause: nothing counted.
            let s = match set.rate {
                PAUSE_RATE => sample(0, 25.0),
                0 if !pauses.is_empty() => sample(0, 100.0),
                _ => sample(100_000, 50.0),
            };
            let next = c.step(s);
            if next.rate == PAUSE_RATE && set.rate != PAUSE_RATE {
                pauses.push(step);
            }
            set = next;
        }
        // Before and after the first re-measurement, then the retry.
        assert!(pauses.len() >= 3, "pauses at steps {pauses:?}");
        let waited = pauses[2] - pauses[1] - PAUSE_AFTER_STEPS;
        assert!(
            waited <= 20,
            "the retry came {waited} steps after the re-measurement"
        );
    }

    /// Neighbours that never let the device read steadily: a due pause waits for them a bounded
    /// time (at most 8 s), then goes. Mutation: waiting for a steady device for ever never
    /// pauses, and the container keeps a first measurement taken beside them.
    #[test]
    fn a_pause_waits_for_a_steady_device_but_not_for_ever() {
        let mut c = Controller::new(25, 3);
        let busy = |device: f64| Sample {
            util: Some(device),
            consumed: 100_000,
            period_ns: PERIOD_NS,
            starved: true,
            device_util: Some(device),
            others_present: true,
            kernels: KernelSet::EMPTY,
        };
        let mut paused_at = None;
        for step in 0..200u32 {
            // Two neighbours that never settle: the device reads 20, 40, 20, 40, ...
            let set = c.step(busy(if step % 2 == 0 { 20.0 } else { 40.0 }));
            if set.rate == PAUSE_RATE {
                paused_at = Some(step);
                break;
            }
        }
        let at = paused_at.expect("a due pause waits at most DEFER_MAX_STEPS for a steady device");
        let bound = PROBE_MAX_STEPS + FIRST_CHECK_MAX + DEFER_MAX_STEPS + 2;
        assert!(at <= bound, "paused at step {at}, later than {bound}");
    }

    /// A device whose readings are noisy (± 4 points): a due pause waits for 5 steps within 5
    /// points, which every container waiting sees at the same moment, so each then waits a
    /// random few steps more; the two containers get their shares within 4 points from 25 s on,
    /// in all but 3 of 1000 seeds (at most 8 allowed). Mutation: going at the first steady
    /// moment, they pause and measure together, and 20 of the 1000 stay at the halved first
    /// measurement. With ± 5 points of noise the pauses' readings no longer agree and the
    /// containers stay there too: the H200's readings were within ± 2.
    #[test]
    fn a_noisy_device_does_not_hold_the_pauses_off() {
        let off: Vec<(u64, f64)> = (1..1001)
            .filter_map(|seed| {
                let mut gpu = SharedGpu::new(&[Some(25), Some(25)], seed);
                gpu.noise = 4.0;
                gpu.run(400);
                let worst = (0..2)
                    .map(|i| gpu.share(i, 125))
                    .max_by(|a, b| (a - 25.0).abs().total_cmp(&(b - 25.0).abs()))?;
                ((worst - 25.0).abs() > 4.0).then_some((seed, worst))
            })
            .collect();
        assert!(
            off.len() <= 8,
            "off by more than 4 points (seed, share): {off:?}"
        );
    }

    /// Beside an unlimited neighbour that takes all the time it can, a limited container never
    /// gets more than its limit (the neighbour's time is not "others at rest", so the paused
    /// reading is not used to scale the measurement up).
    #[test]
    fn an_unlimited_neighbour_never_lifts_the_limit() {
        for limit in [25, 50, 75] {
            for seed in SEEDS {
                let mut gpu = SharedGpu::new(&[Some(limit), None], seed);
                gpu.run(300);
                let share = gpu.share(0, 25);
                assert!(
                    share <= limit as f64 + 3.0,
                    "limit {limit}, seed {seed}: {share:.1}% of the solo rate beside an \
                     unlimited neighbour"
                );
            }
        }
    }

    /// A neighbour that stops while this container runs unthrottled: the pause after the
    /// re-measurement reads the device quiet where the one before read the neighbour, so the
    /// rate measured then (the whole GPU) is not scaled up as if the neighbour had been there.
    /// Mutation: without the second reading the container takes about 40% of its solo rate
    /// for its limit of 25.
    #[test]
    fn a_neighbour_that_stops_mid_measurement_is_not_counted() {
        for seed in SEEDS {
            let mut gpu = SharedGpu::new(&[Some(25), Some(40)], seed);
            gpu.run(30);
            // Until the first container runs unthrottled beside the other (its share jumps).
            let mut steps = 0;
            while gpu.tenants[0].shares.last().is_some_and(|&s| s < 55.0) && steps < 300 {
                gpu.run(1);
                steps += 1;
            }
            gpu.tenants[1].demand = 0.0;
            let from = gpu.tenants[0].shares.len();
            gpu.run(100);
            let share = gpu.share(0, from + 10);
            assert!(
                share <= 28.0,
                "seed {seed}: {share:.1}% of the solo rate after the neighbour stopped"
            );
        }
    }

    #[test]
    fn idle_program_does_not_wind_the_rate_up() {
        let mut c = Controller::new(50, 1);
        let busy = Sample {
            util: Some(100.0),
            consumed: 1000,
            period_ns: 1_000_000_000,
            starved: false,
            device_util: None,
            others_present: false,
            kernels: KernelSet::EMPTY,
        };
        let mut first = UNMETERED;
        for _ in 0..PROBE_MIN_STEPS {
            first = c.step(busy);
        }
        assert_eq!(first.rate, 500, "measured, then half of it");
        assert!(first.forgive_debt);
        for _ in 0..20 {
            let r = c.step(Sample {
                util: Some(5.0),
                consumed: 10,
                period_ns: 1_000_000_000,
                starved: false,
                device_util: None,
                others_present: false,
                kernels: KernelSet::EMPTY,
            });
            assert!(r.rate <= first.rate, "rate grew to {} while idle", r.rate);
        }
    }

    /// A program that works in bursts with idle seconds between (a server between requests),
    /// each burst starting and ending three quarters into a step as on an H100: after the first
    /// few bursts, each is held to the limit from its first step, and the re-measurements are
    /// paid back. Mutations (this session's, 3-step bursts unless named): a first measurement
    /// that does not treat bursts apart (the median of its last three) gave 29.0% for 25;
    /// re-measurements taking their last step (as a steady program's do) 18.8% (4-step
    /// bursts), their higher step even where the two are far apart 21.3%, and a controller
    /// that does not learn from idle steps that the program works in bursts 22.0% (6-step
    /// bursts). Earlier (db5f6f2): measuring again after an idle second left bursts of 0.6 s
    /// unthrottled for good (100% for 25); restarting a measurement at an idle step never
    /// measured them (100%); counting idle steps towards the next re-measurement gave 28.2%.
    #[test]
    fn a_program_that_works_in_bursts_is_held_from_each_bursts_start() {
        for (busy, idle) in [(3, 6), (4, 6), (6, 5), (16, 10), (50, 10)] {
            for target in [25, 50, 75] {
                let mut gpu = SimGpu::h200(5e6, target);
                let mut c = Controller::new(target, 1);
                let mut set = UNMETERED;
                let mut busy_shares = Vec::new();
                for burst in 0..40 {
                    // A burst starts three quarters into a step and ends three quarters into
                    // one (an H100's 0.6-s bursts: 4752, 17952, 16896, 12672 blocks).
                    for (demand, steps) in [(0.25e6, 1), (5e6, busy - 2), (0.75e6, 1)] {
                        gpu.demand = demand;
                        let from = gpu.shares.len();
                        gpu.drive(&mut c, &mut set, steps);
                        if burst > 3 && demand > 1e6 {
                            busy_shares.extend_from_slice(&gpu.shares[from..]);
                        }
                    }
                    gpu.demand = 0.0;
                    gpu.drive(&mut c, &mut set, idle);
                }
                let share = mean(&busy_shares);
                assert!(
                    (share - target as f64).abs() <= 3.0,
                    "bursts of {busy} steps, {idle} idle, target {target}: {share:.1}% while busy"
                );
            }
        }
    }

    /// Steps whose counts cycle as one H100 matmul process's did (run 25), for 2 minutes with a
    /// re-measurement every 20 s, from each point of the cycle: every 20 s (each holding one
    /// re-measurement and what the one before is paid back by) holds the limit within 3 points
    /// of the work's mean rate. Mutation: each re-measurement's one step taken as it is (as
    /// before) put 20 s of a limit of 75 at 68.3 and others at 80.8.
    #[test]
    fn cycling_counts_hold_the_limit_across_re_measurements() {
        let counts = RUN25_MATMUL;
        let mean_count = mean(&counts);
        for target in [25, 50, 75] {
            for offset in 0..counts.len() {
                let mut gpu = SimGpu::h200(5e6, 1);
                let mut c = Controller::new(target, 1);
                let mut set = UNMETERED;
                for count in counts.iter().cycle().skip(offset).take(620) {
                    gpu.capacity = 1e6 * count / mean_count;
                    gpu.drive(&mut c, &mut set, 1);
                }
                // The work done against the work's mean rate, not the step's.
                let work: Vec<f64> = gpu
                    .shares
                    .iter()
                    .zip(counts.iter().cycle().skip(offset))
                    .map(|(share, count)| share * count / mean_count)
                    .collect();
                for (k, window) in work[20..].chunks(100).enumerate() {
                    let share = mean(window);
                    assert!(
                        (share - target as f64).abs() <= 3.0,
                        "target {target}, from step {offset} of the cycle: {share:.1}% in the \
                         20 s from {} s",
                        4 + 20 * k
                    );
                }
            }
        }
    }
}
