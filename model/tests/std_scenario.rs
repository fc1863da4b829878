//! The whole scenario of `hami_model::scenario` on real std threads (normal build): the sim
//! platform under true parallelism, with the same invariant checks as the shuttle runs, a
//! victim that dies at a
//! random crash step, and PID reuse. Much weaker than shuttle at finding interleavings (the OS schedules),
//! but it runs in a plain `cargo test` and exercises the platform with real atomics.
//!
//! Run: `cargo test -p hami-model --test std_scenario`
#![cfg(not(any(loom, shuttle)))]

use hami_model::scenario::{self, Config, Stats};

#[test]
fn std_threads_scenario() {
    let stats = Stats::default();
    for i in 0..1000 {
        let cfg = Config {
            workers: 4 + i % 3,
            kill: i % 4 != 0,
            crash_step_below: 80,
            ..Config::default()
        };
        scenario::run(&cfg, &stats);
    }
    eprintln!("std_threads_scenario: {}", stats.summary());
}
