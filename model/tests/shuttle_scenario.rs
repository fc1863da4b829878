//! shuttle: whole scenarios (hami_model::scenario) on a `Region<8, 1>` with 4–6 worker
//! processes, a reaper, a killer and PID reuse, under shuttle's random scheduler; plus
//! mutation tests showing the checks catch a wrong recovery and a check-then-act admission.
//!
//! shuttle runs every atomic as SeqCst, so it finds interleaving bugs, not ordering bugs
//! (loom_*.rs covers those). A failure prints a schedule to replay with `shuttle::replay`.
//!
//! Run: `RUSTFLAGS="--cfg shuttle" cargo test -p hami-model --release --target-dir target/shuttle`
//! (`SCENARIO_ITERATIONS` overrides the iteration counts' base.)
#![cfg(shuttle)]

use std::sync::Arc as StdArc;

use hami_model::rt::{thread, Arc};
use hami_model::scenario::{self, Config, Stats, LIMIT, P, S};
use hami_model::{model_lock_cfg, SimProc};
use hami_shm::admission;
use hami_shm::lock;
use hami_shm::seqlock::{Kind, SlotWriter};
use hami_shm::sync::Ordering;

mod mutant_lock;

fn iterations(default: usize) -> usize {
    std::env::var("SCENARIO_ITERATIONS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .map_or(default, |base| base * default / 1000)
        .max(1)
}

fn check(name: &str, n: usize, cfg: impl Fn() -> Config + Send + Sync + 'static) {
    let stats = StdArc::new(Stats::default());
    let s = stats.clone();
    shuttle::check_random(move || scenario::run(&cfg(), &s), iterations(n));
    eprintln!("{name}: {}", stats.summary());
}

/// No killer: the protocols without crashes, 4–6 workers.
#[test]
fn scenario_without_crashes() {
    check("scenario_without_crashes", 3000, || Config {
        workers: 4 + hami_model::rt::random(3) as usize,
        kill: false,
        ..Config::default()
    });
}

/// One process (a worker or the reaper) is killed at a random crash point; a killed worker
/// restarts with the same pid.
#[test]
fn scenario_with_a_crash_and_pid_reuse() {
    check("scenario_with_a_crash_and_pid_reuse", 10000, || Config {
        workers: 4 + hami_model::rt::random(3) as usize,
        ..Config::default()
    });
}

/// The victim dies at a crash step chosen uniformly (every crash point of a worker's life is
/// as likely, deep ones included); a killed worker restarts.
#[test]
fn scenario_with_a_crash_at_a_random_step() {
    check("scenario_with_a_crash_at_a_random_step", 6000, || Config {
        workers: 4 + hami_model::rt::random(3) as usize,
        crash_step_below: 90,
        ..Config::default()
    });
}

/// Kills early: mostly during initialisation and the first lock acquisitions.
#[test]
fn scenario_with_an_early_crash() {
    check("scenario_with_an_early_crash", 4000, || Config {
        workers: 4,
        killer_max_delay: 40,
        ..Config::default()
    });
}

/// Upstream's recovery without CAS (B9, `mutant_lock`), three waiters of a dead holder: two can
/// both post, and the sim's `sem_post` check (semaphore ≤ 1) must catch it. Mutation test.
#[test]
#[should_panic(expected = "semaphore value exceeded 1")]
fn mutation_recovery_post_without_cas() {
    shuttle::check_random(
        || {
            let sim: Arc<S> = S::initialised([LIMIT]);
            let victim = SimProc::spawn(&sim, 0);
            let g = lock::acquire(&sim.region, &victim, &model_lock_cfg()).unwrap();
            victim.die_holding(g);
            let handles: Vec<_> = (1..4)
                .map(|i| {
                    let p = P::spawn(&sim, i);
                    thread::spawn(move || {
                        mutant_lock::take_and_release_recovering_without_cas(&p, &model_lock_cfg());
                        p.exit();
                    })
                })
                .collect();
            for h in handles {
                h.join().unwrap();
            }
        },
        iterations(2000),
    );
}

/// The scenario with upstream's check-then-act admission (B20) in place of core's: the
/// admission invariant check must catch an overshoot. Mutation test.
#[test]
#[should_panic(expected = "admission invariant violated")]
fn mutation_scenario_check_then_act_admission() {
    fn check_then_act(p: &P, slot: usize, bytes: u64) -> bool {
        let r = p.region();
        if admission::device_usage(r, 0) + bytes > r.raw_limit()[0].load(Ordering::Relaxed) {
            return false;
        }
        {
            let s = SlotWriter::begin(&r.raw_procs()[slot]);
            s.add(0, Kind::Data, bytes)
        };
        true
    }
    shuttle::check_random(
        || {
            let cfg = Config {
                workers: 5,
                kill: false,
                reserve: check_then_act,
                ..Config::default()
            };
            scenario::run(&cfg, &Stats::default())
        },
        iterations(3000),
    );
}

/// A token lost with `owner_pid == 0` (its holder died between `sem_wait` and storing
/// `owner_pid`), then three processes that take the lock twice each: each acquisition must
/// succeed or time out, the holder invariant and mutual exclusion must hold throughout, and
/// the lock must end free with one token. (This found the takeover race of an earlier core, as
/// `loom_lock.rs`'s `lock_lost_token_is_taken_over_once` did.)
#[test]
fn lock_lost_token_with_contention() {
    lost_token_contention("core", 3, 2, 5000, |p| {
        p.with_owner_lock(&model_lock_cfg(), |_| ()).is_ok()
    });
}

/// The same model with the takeover's re-check after its CAS removed: two holders. Mutation.
#[test]
#[should_panic]
fn mutation_lost_token_without_revalidation() {
    lost_token_contention("no re-validation", 3, 2, 5000, |p| {
        mutant_lock::with_lock(p, &model_lock_cfg(), || ()).is_ok()
    });
}

/// Liveness after a lost token, five processes taking the lock once each: every acquisition
/// succeeds within its deadline (64 grace periods).
#[test]
fn lost_token_liveness() {
    let timeouts = lost_token_contention("core", 5, 1, 2000, |p| {
        p.with_owner_lock(&model_lock_cfg(), |_| ()).is_ok()
    });
    assert_eq!(timeouts, 0, "acquisitions timed out after a lost token");
}

/// A token lost with `owner_pid == 0`, then `n` processes that take the lock `times` times;
/// `take` takes, checks (holder, mutual exclusion) and releases, returning false on timeout.
/// Checks the lock ends free; returns the number of timeouts over all runs.
fn lost_token_contention(
    what: &str,
    n: usize,
    times: usize,
    runs: usize,
    take: fn(&P) -> bool,
) -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering as O};
    let timeouts = StdArc::new(AtomicU64::new(0));
    let t = timeouts.clone();
    let runs = iterations(runs);
    shuttle::check_random(
        move || {
            let sim: Arc<S> = S::initialised([LIMIT]);
            sim.world.force_sem(0);
            let handles: Vec<_> = (0..n)
                .map(|i| {
                    let p = P::spawn(&sim, i);
                    let t = t.clone();
                    thread::spawn(move || {
                        for _ in 0..times {
                            if !take(&p) {
                                t.fetch_add(1, O::Relaxed);
                            }
                        }
                        p.exit();
                    })
                })
                .collect();
            for h in handles {
                h.join().unwrap();
            }
            let fin = P::spawn(&sim, 6);
            assert!(take(&fin), "the lock is wedged");
            fin.exit();
            assert_eq!(sim.world.sem_value(), 1);
            assert_eq!(sim.region.raw_owner_pid().load(Ordering::Relaxed), 0);
        },
        runs,
    );
    let t = timeouts.load(O::Relaxed);
    eprintln!("lost token, {what}, {n} processes x {times}: {t} timeouts in {runs} runs");
    t
}
