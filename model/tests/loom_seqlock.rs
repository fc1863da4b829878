//! loom: the per-slot seqlock (core/src/seqlock.rs) and its writer exclusion.
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p hami-model --release
//! --target-dir target/loom --test loom_seqlock`
#![cfg(loom)]

use hami_model::rt::{thread, Arc};
use hami_model::{model_lock_cfg, ProblemKind, Sim, SimProc};
use hami_shm::admission;
use hami_shm::layout::ProcSlot;
use hami_shm::seqlock::{self, Kind, SlotWriter, Usage};
use hami_shm::slots;
use hami_shm::sync::Ordering;

type S = Sim<2, 1>;

fn consistent(u: &Usage) -> bool {
    u.total == u.context + u.module + u.data
}

/// One writer (add context, then data, in one write; then move data to module in a second)
/// and one reader: every read the reader calls consistent has `total == context + module + data`.
#[test]
fn seqlock_reader_sees_consistent_snapshots() {
    loom::model(|| {
        let sim = Arc::new(S::new());
        let writer = {
            let sim = sim.clone();
            thread::spawn(move || {
                let slot = &sim.region.raw_procs()[0];
                {
                    let s = SlotWriter::begin(slot);
                    s.add(0, Kind::Context, 10);
                    s.add(0, Kind::Data, 5);
                };
                {
                    let s = SlotWriter::begin(slot);
                    assert!(s.sub(0, Kind::Data, 5));
                    s.add(0, Kind::Module, 5);
                };
            })
        };
        let (u, ok) = seqlock::read(&sim.region.raw_procs()[0], 0);
        if ok {
            assert!(consistent(&u), "torn consistent read: {u:?}");
            assert!(
                u == Usage::default()
                    || u == Usage {
                        context: 10,
                        module: 0,
                        data: 5,
                        total: 15
                    }
                    || u == Usage {
                        context: 10,
                        module: 5,
                        data: 0,
                        total: 15
                    },
                "read a state no write produced: {u:?}"
            );
        }
        writer.join().unwrap();
        let (u, ok) = seqlock::read(&sim.region.raw_procs()[0], 0);
        assert!(ok);
        assert_eq!(
            u,
            Usage {
                context: 10,
                module: 5,
                data: 0,
                total: 15
            }
        );
    });
}

/// Two threads of one process write the same slot: the writer CAS (even to odd) lets one in at
/// a time, so a non-atomic read-modify-write inside the write loses no update and the counters
/// are exact afterwards.
#[test]
fn seqlock_two_writers_are_exclusive() {
    loom::model(|| {
        let sim = Arc::new(S::new());
        let spawn_writer = |ctx: u64, data: u64| {
            let sim = sim.clone();
            thread::spawn(move || {
                {
                    let s = SlotWriter::begin(&sim.region.raw_procs()[0]);
                    s.add(0, Kind::Context, ctx);
                    // Unprotected load + store: lost if the other writer is inside too.
                    let unused = sim.region.raw_procs()[0].raw_unused();
                    let v = unused[1].load(Ordering::Relaxed);
                    unused[1].store(v + 1, Ordering::Relaxed);
                    s.add(0, Kind::Data, data);
                };
            })
        };
        let a = spawn_writer(1, 2);
        let b = spawn_writer(10, 20);
        a.join().unwrap();
        b.join().unwrap();
        let slot = &sim.region.raw_procs()[0];
        assert_eq!(
            slot.raw_unused()[1].load(Ordering::Relaxed),
            2,
            "a write was lost"
        );
        assert_eq!(slot.raw_seqlock().load(Ordering::Relaxed), 4);
        let (u, ok) = seqlock::read(slot, 0);
        assert!(ok);
        assert_eq!(
            u,
            Usage {
                context: 11,
                module: 0,
                data: 22,
                total: 33
            }
        );
    });
}

/// Two threads of one process (one slot, two platform handles of the same identity) reserve
/// through `admission::try_reserve` at once, one context and one data: both are admitted under
/// a roomy limit and the slot's counters are exact (no lost update between the two writers).
#[test]
fn admission_two_threads_of_one_process() {
    loom::model(|| {
        let sim = Sim::<2, 1>::initialised([100]);
        let p = SimProc::spawn(&sim, 0);
        let slot = p
            .with_owner_lock(&model_lock_cfg(), |g| slots::claim(p.region(), &p, g))
            .unwrap()
            .unwrap();
        let q = p.same_process();
        let t = thread::spawn(move || {
            admission::try_reserve(q.region(), &q, slot, 0, Kind::Context, 10).unwrap();
        });
        admission::try_reserve(p.region(), &p, slot, 0, Kind::Data, 20).unwrap();
        t.join().unwrap();
        let s = &sim.region.raw_procs()[slot];
        let (u, ok) = seqlock::read(s, 0);
        assert!(ok);
        assert_eq!(
            u,
            Usage {
                context: 10,
                module: 0,
                data: 20,
                total: 30
            }
        );
        assert_eq!(s.raw_seqlock().load(Ordering::Relaxed), 4);
        assert_eq!(sim.world.problems(ProblemKind::StuckSeqlock), 0);
    });
}

/// A writer that died with the sequence odd: the reader gives up after its retries (no hang),
/// says so, and force_zero (the reaper's path) makes the slot readable and zero again.
#[test]
fn seqlock_dead_writer_does_not_hang_readers() {
    loom::model(|| {
        let sim = Arc::new(S::new());
        let slot = &sim.region.raw_procs()[0];
        SlotWriter::begin(slot).add(0, Kind::Data, 7);
        // The writer dies inside its next write: odd sequence, half-written counters.
        slot.raw_seqlock().store(3, Ordering::Relaxed);
        slot.raw_used()[0].raw_total().store(9, Ordering::Relaxed);
        let reaper = {
            let sim = sim.clone();
            thread::spawn(move || seqlock::force_zero(&sim.region.raw_procs()[0]))
        };
        let (u, ok) = seqlock::read(slot, 0);
        if ok {
            assert_eq!(
                u,
                Usage::default(),
                "only the reaper's zero is a consistent state"
            );
        }
        reaper.join().unwrap();
        let (u, ok) = seqlock::read(slot, 0);
        assert!(ok);
        assert_eq!(u, Usage::default());
    });
}

/// The writer of the first test, with a reader that drops the acquire fence and the acquire
/// load (a plausible "optimisation"): loom must find a torn read that passes the sequence
/// check. Mutation test: passing means the bug was caught.
#[test]
#[should_panic(expected = "torn")]
fn mutation_seqlock_reader_without_acquire() {
    fn bad_read(slot: &ProcSlot<1>) -> Option<Usage> {
        let s1 = slot.raw_seqlock().load(Ordering::Relaxed);
        if s1 & 1 == 1 {
            return None;
        }
        let m = &slot.raw_used()[0];
        let u = Usage {
            context: m.raw_context_size().load(Ordering::Relaxed),
            module: m.raw_module_size().load(Ordering::Relaxed),
            data: m.raw_data_size().load(Ordering::Relaxed),
            total: m.raw_total().load(Ordering::Relaxed),
        };
        let s2 = slot.raw_seqlock().load(Ordering::Relaxed);
        (s1 == s2).then_some(u)
    }
    loom::model(|| {
        let sim = Arc::new(S::new());
        let writer = {
            let sim = sim.clone();
            thread::spawn(move || {
                {
                    let s = SlotWriter::begin(&sim.region.raw_procs()[0]);
                    s.add(0, Kind::Context, 10);
                    s.add(0, Kind::Data, 5);
                };
            })
        };
        if let Some(u) = bad_read(&sim.region.raw_procs()[0]) {
            assert!(consistent(&u), "torn read passed the check: {u:?}");
        }
        writer.join().unwrap();
    });
}
