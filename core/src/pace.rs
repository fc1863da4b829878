//! Follows the solo rate of a launch-bound program while the SM limit holds it back, from the
//! time its launching thread spends outside the waits for tokens.
//!
//! A program of small kernels is bound by the host thread that launches them, so its solo rate
//! is the host's speed, and that moves: one process of small kernels on an H100 sped up by a
//! quarter to a third 4 s after its start, after the controller had measured it, and was then
//! held at 21, 36 and 60% of its later rate for limits of 25, 50 and 75 (docs/gpu-results.md,
//! run 26). Held back, the program cannot show its rate in launches, but its thread's time
//! can: outside the waits it launches, so the blocks per second of that time (its pace) are
//! its solo rate. On an H100 the pace of such a process read 91.5% of its measured solo rate at
//! a limit of 25 and 98% at 75, within 1% from step to step (run 27). A GPU-bound program's
//! thread mostly waits on the GPU, and its pace reads several times its solo rate.
//!
//! So after each measurement [`PaceTrack`] calibrates the pace against the measured rate; where
//! the two agree within [`HOST_BOUND`] the program is host-bound, and the solo rate then moves
//! with the pace once it has moved by more than [`MOVE`] for [`STEPS`] steps in a row, by the
//! least of those steps' moves, and never beyond [`MAX_DRIFT`] of the measurement.

/// The controller's own process over one period, where exactly one of its threads launched on
/// the device: the blocks it launched and the nanoseconds that thread spent outside waits for
/// tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pace {
    /// Blocks the process's launches took.
    pub blocks: u64,
    /// The period less the time its launching thread waited for tokens.
    pub busy_ns: u64,
}

impl Pace {
    /// Blocks per second of the thread's time outside waits; `None` for a thread that never
    /// ran or launched nothing.
    pub fn rate(&self) -> Option<f64> {
        (self.busy_ns > 0 && self.blocks > 0)
            .then(|| self.blocks as f64 * 1e9 / self.busy_ns as f64)
    }
}

/// Calibration's pace may read this factor above or below the measured solo rate for the
/// program to count as host-bound (H100, small kernels: 0.915 to 0.98).
pub const HOST_BOUND: f64 = 1.25;
/// A move of the pace smaller than this share of the calibrated pace is noise.
pub const MOVE: f64 = 0.06;
/// Steps in a row the pace must have moved by more than [`MOVE`], the same way.
pub const STEPS: u32 = 3;
/// The solo rate followed stays within this factor of the rate last measured: a pace that
/// misleads (its thread's waits counted wrongly) moves the limit by at most this much until
/// the next measurement (20 s).
pub const MAX_DRIFT: f64 = 1.5;
/// Steps after a measurement not used for calibration: the first metered step's waits started
/// while the program still ran unthrottled.
const CALIBRATE_SKIP: u32 = 1;
/// Steps averaged for the calibration.
const CALIBRATE_STEPS: u32 = 5;
/// Calibration's steps must read within this share of their mean, or the pace is too unsteady
/// to follow.
const CALIBRATE_SPREAD: f64 = 0.05;

/// Where the follower is since the last measurement.
#[derive(Clone, Copy, Debug, PartialEq)]
enum State {
    /// Reading the pace of the first steps after a measurement of `measured` blocks per second.
    Calibrating {
        measured: f64,
        seen: u32,
        sum: f64,
        lo: f64,
        hi: f64,
    },
    /// Host-bound: `ratio` is the calibrated pace per block of solo rate. `streak` counts the
    /// steps in a row above (positive) or below (negative) it by more than [`MOVE`], and
    /// `least` is the smallest of their moves (a factor).
    Following {
        measured: f64,
        ratio: f64,
        streak: i32,
        least: f64,
    },
    /// Not host-bound, or no measurement yet: the solo rate is left alone.
    Off,
}

/// Follows a host-bound program's solo rate between measurements (see the module).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PaceTrack {
    state: State,
}

impl Default for PaceTrack {
    fn default() -> Self {
        PaceTrack { state: State::Off }
    }
}

impl PaceTrack {
    /// Starts over after a measurement of `solo` blocks per second.
    pub fn measured(&mut self, solo: f64) {
        self.state = State::Calibrating {
            measured: solo,
            seen: 0,
            sum: 0.0,
            lo: f64::MAX,
            hi: f64::MIN,
        };
    }

    /// Whether the program was found host-bound and is followed.
    pub fn following(&self) -> bool {
        matches!(self.state, State::Following { .. })
    }

    /// A step that tells nothing of the pace (not held back, other processes launched, the GPU
    /// is shared): a streak ends there.
    pub fn skip(&mut self) {
        if let State::Following { streak, least, .. } = &mut self.state {
            *streak = 0;
            *least = 1.0;
        }
    }

    /// A step held back at a pace of `pace` blocks per second while the solo rate is `solo`:
    /// the solo rate it should move to, if it should.
    pub fn step(&mut self, pace: f64, solo: f64) -> Option<f64> {
        match self.state {
            State::Off => None,
            State::Calibrating {
                measured,
                seen,
                sum,
                lo,
                hi,
            } => {
                self.state = Self::calibrated(measured, seen + 1, pace, (sum, lo, hi));
                None
            }
            State::Following {
                measured,
                ratio,
                streak,
                least,
            } => {
                let moved = pace / (ratio * solo);
                let way = if moved > 1.0 + MOVE {
                    1
                } else if moved < 1.0 - MOVE {
                    -1
                } else {
                    0
                };
                let streak = if way == 0 || way * streak < 0 {
                    way
                } else {
                    streak + way
                };
                // The least move of the streak: its smallest rise, or its smallest fall.
                let least = match streak {
                    0 => 1.0,
                    1 | -1 => moved,
                    s if s > 0 => least.min(moved),
                    _ => least.max(moved),
                };
                if streak.unsigned_abs() < STEPS {
                    self.state = State::Following {
                        measured,
                        ratio,
                        streak,
                        least,
                    };
                    return None;
                }
                self.state = State::Following {
                    measured,
                    ratio,
                    streak: 0,
                    least: 1.0,
                };
                Some((solo * least).clamp(measured / MAX_DRIFT, measured * MAX_DRIFT))
            }
        }
    }

    /// Calibration after its `seen`th step, which read `pace` (the first [`CALIBRATE_SKIP`] are
    /// passed over); `(sum, lo, hi)` of the steps before.
    fn calibrated(measured: f64, seen: u32, pace: f64, (sum, lo, hi): (f64, f64, f64)) -> State {
        let (sum, lo, hi) = if seen > CALIBRATE_SKIP {
            (sum + pace, lo.min(pace), hi.max(pace))
        } else {
            (sum, lo, hi)
        };
        if seen < CALIBRATE_SKIP + CALIBRATE_STEPS {
            return State::Calibrating {
                measured,
                seen,
                sum,
                lo,
                hi,
            };
        }
        let mean = sum / f64::from(CALIBRATE_STEPS);
        let ratio = mean / measured;
        let steady = hi - lo <= 2.0 * CALIBRATE_SPREAD * mean;
        if steady && (1.0 / HOST_BOUND..=HOST_BOUND).contains(&ratio) {
            State::Following {
                measured,
                ratio,
                streak: 0,
                least: 1.0,
            }
        } else {
            State::Off
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Calibrates at `pace` for a measured rate of 100.
    fn calibrated_at(pace: f64) -> PaceTrack {
        let mut t = PaceTrack::default();
        t.measured(100.0);
        for _ in 0..CALIBRATE_SKIP + CALIBRATE_STEPS {
            assert_eq!(t.step(pace, 100.0), None, "calibrating");
        }
        t
    }

    #[test]
    fn a_pace_near_the_measured_rate_is_followed_and_one_far_from_it_is_not() {
        assert!(calibrated_at(91.5).following(), "H100, small kernels at 25");
        assert!(calibrated_at(120.0).following());
        assert!(
            !calibrated_at(400.0).following(),
            "GPU-bound: waits on the GPU"
        );
        assert!(!calibrated_at(60.0).following());
        assert!(!PaceTrack::default().following(), "nothing measured");
    }

    /// Run 26's program: its pace rises by 30% and stays. The solo rate follows after STEPS
    /// steps, by the least rise of them. Mutation: the largest rise instead takes the one
    /// high step (1.4) and fails.
    #[test]
    fn a_lasting_rise_moves_the_solo_rate_by_its_least_step() {
        let mut t = calibrated_at(90.0);
        assert_eq!(t.step(90.0 * 1.4, 100.0), None);
        assert_eq!(t.step(90.0 * 1.3, 100.0), None);
        let moved = t.step(90.0 * 1.32, 100.0).expect("three steps up");
        assert!((moved - 130.0).abs() < 1e-9, "{moved}");
        // Followed: the new rate's pace is no move.
        for _ in 0..10 {
            assert_eq!(t.step(90.0 * 1.3, moved), None);
        }
    }

    #[test]
    fn a_fall_is_followed_and_noise_or_a_broken_streak_is_not() {
        let mut t = calibrated_at(100.0);
        for pace in [104.0, 95.0, 105.0, 97.0, 110.0, 110.0, 90.0, 110.0, 80.0] {
            assert_eq!(
                t.step(pace, 100.0),
                None,
                "{pace}: noise or a broken streak"
            );
        }
        t.skip();
        assert_eq!(t.step(80.0, 100.0), None);
        assert_eq!(t.step(75.0, 100.0), None);
        assert_eq!(t.step(85.0, 100.0), Some(85.0), "the least fall");
    }

    /// A skipped step (not held back) ends a streak. Mutation: `skip` doing nothing moves the
    /// rate on the third step.
    #[test]
    fn a_skipped_step_ends_a_streak() {
        let mut t = calibrated_at(100.0);
        assert_eq!(t.step(130.0, 100.0), None);
        assert_eq!(t.step(130.0, 100.0), None);
        t.skip();
        assert_eq!(t.step(130.0, 100.0), None);
    }

    #[test]
    fn the_solo_rate_drifts_at_most_max_drift_from_the_measurement() {
        let mut t = calibrated_at(100.0);
        let mut solo = 100.0;
        for _ in 0..30 {
            if let Some(s) = t.step(300.0, solo) {
                solo = s;
            }
        }
        assert!((solo - 100.0 * MAX_DRIFT).abs() < 1e-9, "{solo}");
        for _ in 0..30 {
            if let Some(s) = t.step(10.0, solo) {
                solo = s;
            }
        }
        assert!((solo - 100.0 / MAX_DRIFT).abs() < 1e-9, "{solo}");
    }

    #[test]
    fn an_unsteady_calibration_turns_following_off() {
        let mut t = PaceTrack::default();
        t.measured(100.0);
        for pace in [100.0, 90.0, 110.0, 100.0, 100.0, 100.0] {
            t.step(pace, 100.0);
        }
        assert!(!t.following());
    }

    #[test]
    fn pace_is_blocks_per_busy_second() {
        let p = Pace {
            blocks: 7_372_800,
            busy_ns: 55_000_000,
        };
        assert!((p.rate().unwrap() - 134_050_909.09).abs() < 1.0);
        assert_eq!(
            Pace {
                blocks: 5,
                busy_ns: 0
            }
            .rate(),
            None
        );
        assert_eq!(
            Pace {
                blocks: 0,
                busy_ns: 5
            }
            .rate(),
            None
        );
    }
}
