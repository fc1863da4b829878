//! shuttle: the host-pid claim (core/src/host_pid.rs). Three registered processes each claim
//! host pids from a small shared pool, all at once, retrying after a conflict; one of them
//! later exits. The checker: a pid never counts as won by two live slots at once (what HAMi's
//! monitor and the NVML hooks would then mistake for one another), a winner's slot still holds
//! the pid it won, and a slot that withdrew holds nothing.
//!
//! shuttle explores interleavings under sequential consistency, which is what the claim's
//! seq-cst accesses give; loom models seq-cst as acquire-release and would report the
//! store-buffering outcome the seq-cst fence rules out, so the claim is not a loom test.
//!
//! Mutation: a claim that reads the other slots first and then takes the pid (check, then act)
//! lets two processes that look at the same moment both win.
//!
//! Run: `RUSTFLAGS="--cfg shuttle" cargo test -p hami-model --release --target-dir target/shuttle`
#![cfg(shuttle)]

use std::sync::Mutex;

use hami_model::rt::{random, thread, Arc};
use hami_model::{model_lock_cfg, Sim, SimProc};
use hami_shm::host_pid::{self, Claim};
use hami_shm::layout::Region;
use hami_shm::slots;

const PROCS: usize = 3;
const ITERATIONS: usize = 3_000;
type S = Sim<4, 1>;
type P = SimProc<4, 1>;

/// A claim: core's, or a mutant.
type ClaimFn = fn(&Region<4, 1>, usize, u32) -> Claim;

/// Who won which pid, as the processes report it: `(slot, pid)` of every live winner.
#[derive(Default)]
struct Winners(Mutex<Vec<(usize, u32)>>);

impl Winners {
    fn won(&self, region: &Region<4, 1>, slot: usize, pid: u32) {
        // Read before the lock: a shuttle step inside a std lock would block the scheduler.
        let held = region.slot(slot).unwrap().hostpid();
        assert_eq!(
            held, pid as i32,
            "slot {slot} won {pid} but does not hold it"
        );
        let mut w = self.0.lock().unwrap();
        for &(other, p) in w.iter() {
            assert!(
                p != pid || other == slot,
                "host pid {pid} won by slots {other} and {slot} at once"
            );
        }
        w.push((slot, pid));
    }

    fn gone(&self, slot: usize) {
        self.0.lock().unwrap().retain(|&(s, _)| s != slot);
    }
}

fn run(claim: ClaimFn) {
    let sim = S::initialised([0]);
    let winners = Arc::new(Winners::default());
    let procs: Vec<P> = (0..PROCS).map(|i| SimProc::spawn(&sim, i)).collect();
    let slots: Vec<usize> = procs
        .iter()
        .map(|p| {
            p.with_owner_lock(&model_lock_cfg(), |g| slots::claim(p.region(), p, g).ok())
                .ok()
                .flatten()
                .expect("a slot for every process")
        })
        .collect();
    let handles: Vec<_> = procs
        .into_iter()
        .zip(slots)
        .map(|(p, slot)| {
            let winners = winners.clone();
            thread::spawn(move || {
                // Candidates 100 or 101, as NVML's list might offer a process.
                for _ in 0..4 {
                    let pid = 100 + random(2) as u32;
                    match claim(p.region(), slot, pid) {
                        Claim::Won => {
                            winners.won(p.region(), slot, pid);
                            break;
                        }
                        Claim::Conflict => {
                            assert_eq!(p.region().slot(slot).unwrap().hostpid(), 0);
                        }
                        other => panic!("slot {slot}: unexpected {other:?}"),
                    }
                }
                if slot == 0 {
                    // The first exits: its slot is freed, its pid free to win.
                    winners.gone(slot);
                    slots::release_on_exit(p.region(), slot, p.id());
                    p.exit();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn a_host_pid_is_never_won_twice() {
    shuttle::check_random(|| run(host_pid::claim), ITERATIONS);
    shuttle::check_pct(|| run(host_pid::claim), ITERATIONS, 3);
}

/// Check, then act: read the others, then take the pid.
fn check_then_claim(region: &Region<4, 1>, mine: usize, pid: u32) -> Claim {
    if host_pid::claimed_by_others(region, mine).any(|h| h == pid) {
        return Claim::Conflict;
    }
    let slot = region.slot(mine).unwrap();
    match slot.claim_hostpid(pid as i32) {
        Ok(()) => Claim::Won,
        Err(cur) => Claim::Preset(cur as u32),
    }
}

#[test]
#[should_panic(expected = "won by slots")]
fn mutation_check_then_claim_lets_two_win() {
    shuttle::check_random(|| run(check_then_claim), ITERATIONS);
}
