//! shuttle: a process stopped (SIGSTOP, a debugger) while it holds the region lock, and
//! newcomers that cannot register meanwhile. The limit must hold anyway: a process without a
//! slot is refused on a limited device (`admission::admit`), and once the holder resumes the
//! newcomers register and are admitted against the region like everyone else.
//!
//! Processes on a `Region<4, 1>` with limit 1000: an early process holds 900 in its slot; the
//! holder takes the lock and stops; two newcomers each try to register with a short logical
//! deadline, then ask for 400 (which does not fit) and 100 (which does). The checker sums what
//! every live process really holds (what its allocation calls returned) and asserts it never
//! passes the limit. After the holder resumes, each newcomer registers (progress) and its
//! requests are decided against the region.
//!
//! Mutation: the private fallback this replaced (a process that cannot register counts in a
//! region of its own, initialised with the same limit) admits 400 to each newcomer: 1700 held
//! under a limit of 1000, which the checker catches.
//!
//! Run: `RUSTFLAGS="--cfg shuttle" cargo test -p hami-model --release --target-dir target/shuttle`
#![cfg(shuttle)]

use std::sync::atomic::{AtomicU64 as PlainU64, Ordering as Plain};
use std::sync::Arc as StdArc;

use hami_model::rt::{thread, Arc};
use hami_model::{model_lock_cfg, Sim, SimProc};
use hami_shm::admission::{self, OutOfMemory};
use hami_shm::layout::Region;
use hami_shm::lock::LockConfig;
use hami_shm::platform::Platform;
use hami_shm::seqlock::Kind;
use hami_shm::slots;
use hami_shm::sync::{AtomicU64, Ordering};

const LIMIT: u64 = 1000;
type S = Sim<4, 1>;
type P = SimProc<4, 1>;

/// How a process reserves, given the slot it may hold: core's decision or a mutant.
type Admit = fn(&P, Option<usize>, u64) -> Result<(), OutOfMemory>;

fn core_admit(p: &P, slot: Option<usize>, bytes: u64) -> Result<(), OutOfMemory> {
    admission::admit(p.region(), p, slot, 0, Kind::Data, bytes, LIMIT)
}

/// What every live process really holds, and the check that it fits under the limit.
struct Held {
    by: [PlainU64; 4],
    lock: std::sync::Mutex<()>,
}

impl Held {
    fn add(&self, sim: &S, idx: usize, bytes: u64) {
        let _g = self.lock.lock().unwrap();
        self.by[idx].fetch_add(bytes, Plain::Relaxed);
        let sum: u64 = (0..4)
            .filter(|&j| sim.world.alive(j))
            .map(|j| self.by[j].load(Plain::Relaxed))
            .sum();
        assert!(
            sum <= LIMIT,
            "limit violated: live processes hold {sum} bytes under a limit of {LIMIT}"
        );
    }
}

/// A short registration deadline, as the runtime's retry at an allocation uses.
fn short() -> LockConfig {
    LockConfig {
        deadline_ns: 64,
        ..model_lock_cfg()
    }
}

/// Registers (claims a slot) if the lock can be had within `cfg`.
fn register(p: &P, cfg: &LockConfig) -> Option<usize> {
    p.with_owner_lock(cfg, |g| slots::claim(p.region(), p, g).ok())
        .ok()
        .flatten()
}

/// One run; returns how many newcomers were refused while unregistered.
fn run(admit: Admit) -> u64 {
    let sim: Arc<S> = S::initialised([LIMIT]);
    let held = StdArc::new(Held {
        by: Default::default(),
        lock: std::sync::Mutex::new(()),
    });

    // An early process holds 900 in its own slot.
    let early = P::spawn(&sim, 0);
    let slot = register(&early, &model_lock_cfg()).expect("early process registers");
    admit(&early, Some(slot), 900).expect("900 fits under 1000");
    held.add(&sim, 0, 900);

    // The holder takes the lock and stops until both newcomers have tried while it is held.
    let tried = Arc::new(AtomicU64::new(0));
    let took_lock = Arc::new(AtomicU64::new(0));
    let holder = {
        let (p, tried, took) = (P::spawn(&sim, 1), tried.clone(), took_lock.clone());
        thread::spawn(move || {
            p.with_owner_lock(&model_lock_cfg(), |_| {
                took.store(1, Ordering::SeqCst);
                while tried.load(Ordering::SeqCst) < 2 {
                    thread::yield_now();
                }
            })
            .expect("the holder takes the free lock");
            p.exit();
        })
    };
    while took_lock.load(Ordering::SeqCst) == 0 {
        thread::yield_now();
    }

    let refused = StdArc::new(PlainU64::new(0));
    let newcomers: Vec<_> = (2..4)
        .map(|idx| {
            let (p, held, tried, refused) = (
                P::spawn(&sim, idx),
                held.clone(),
                tried.clone(),
                refused.clone(),
            );
            let sim = sim.clone();
            thread::spawn(move || {
                // Start-up: the lock stays held by the stopped process past the deadline.
                let slot = register(&p, &short());
                assert_eq!(
                    slot, None,
                    "registered while the lock was held by a stopped process"
                );
                for bytes in [400, 100] {
                    match admit(&p, None, bytes) {
                        Ok(()) => held.add(&sim, idx, bytes),
                        Err(_) => {
                            refused.fetch_add(1, Plain::Relaxed);
                        }
                    }
                }
                tried.fetch_add(1, Ordering::SeqCst);
                // The holder resumes; each allocation tries to register again.
                let mut slot = None;
                for _ in 0..64 {
                    slot = register(&p, &short());
                    if slot.is_some() {
                        break;
                    }
                    p.sleep_ns(1);
                }
                let slot = slot.expect("a newcomer registers once the holder has resumed");
                for bytes in [400, 50] {
                    if admit(&p, Some(slot), bytes).is_ok() {
                        held.add(&sim, idx, bytes);
                    }
                }
            })
        })
        .collect();
    holder.join().unwrap();
    for h in newcomers {
        h.join().unwrap();
    }
    refused.load(Plain::Relaxed)
}

/// Core's decision: every request of an unregistered process on a limited device is refused,
/// and the newcomers register after the holder resumes.
#[test]
fn a_stopped_lock_holder_lets_nobody_past_the_limit() {
    let refused = StdArc::new(PlainU64::new(0));
    let r = refused.clone();
    shuttle::check_random(
        move || {
            r.fetch_add(run(core_admit), Plain::Relaxed);
        },
        2000,
    );
    assert_eq!(
        refused.load(Plain::Relaxed),
        2000 * 4,
        "every request of an unregistered newcomer is refused"
    );
}

/// The private fallback that was replaced: a newcomer without a slot counts in a region of its
/// own. The checker must see the limit pass. Mutation test.
#[test]
#[should_panic(expected = "limit violated")]
fn mutation_private_fallback() {
    fn private_fallback(p: &P, slot: Option<usize>, bytes: u64) -> Result<(), OutOfMemory> {
        match slot {
            Some(_) => core_admit(p, slot, bytes),
            None => {
                let own: Region<1, 1> = Region::zeroed();
                own.raw_procs()[0]
                    .raw_pid()
                    .store(p.id().pid(), Ordering::Relaxed);
                own.raw_proc_num().store(1, Ordering::Relaxed);
                own.raw_limit()[0].store(LIMIT, Ordering::Relaxed);
                admission::try_reserve(&own, p, 0, 0, Kind::Data, bytes)
            }
        }
    }
    shuttle::check_random(
        || {
            run(private_fallback);
        },
        200,
    );
}
