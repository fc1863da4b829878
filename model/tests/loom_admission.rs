//! loom: admission across processes (core/src/admission.rs): reserve in your own slot, SeqCst
//! fence, read the aggregate, roll back on excess. Of two concurrent reservers at least one sees
//! the other (Dekker), so the admitted sum never exceeds the limit.
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p hami-model --release
//! --target-dir target/loom --test loom_admission`
#![cfg(loom)]

use hami_model::rt::{thread, Arc};
use hami_model::{model_lock_cfg, Sim, SimProc};
use hami_shm::admission;
use hami_shm::layout::Region;
use hami_shm::seqlock::{Kind, SlotWriter};
use hami_shm::slots;
use hami_shm::sync::{fence, Ordering};

const LIMIT: u64 = 100;

/// Processes `0..n` with a slot each (claimed before the model's threads start).
fn setup<const S: usize>(n: usize) -> (Arc<Sim<S, 1>>, Vec<(SimProc<S, 1>, usize)>) {
    let sim = Sim::<S, 1>::initialised([LIMIT]);
    let procs = (0..n)
        .map(|i| {
            let p = SimProc::spawn(&sim, i);
            let slot = p
                .with_owner_lock(&model_lock_cfg(), |g| slots::claim(p.region(), &p, g))
                .unwrap()
                .unwrap();
            (p, slot)
        })
        .collect();
    (sim, procs)
}

/// Runs `reserve(process, slot, bytes)` for each process concurrently with its amount and
/// returns what each admitted. Asserts: admitted sum ≤ limit, and the region's usage is exactly
/// the admitted sum (every rollback complete).
fn race<const S: usize>(amounts: &'static [u64], reserve: fn(&SimProc<S, 1>, usize, u64) -> bool) {
    let (sim, procs) = setup::<S>(amounts.len());
    let handles: Vec<_> = procs
        .into_iter()
        .zip(amounts)
        .map(|((p, slot), &bytes)| {
            thread::spawn(move || if reserve(&p, slot, bytes) { bytes } else { 0 })
        })
        .collect();
    let admitted: Vec<u64> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let sum: u64 = admitted.iter().sum();
    assert!(
        sum <= LIMIT,
        "admitted {admitted:?} = {sum} bytes, over the limit of {LIMIT}"
    );
    assert_eq!(
        admission::device_usage(&sim.region, 0),
        sum,
        "a rollback was lost"
    );
}

fn core_reserve<const S: usize>(p: &SimProc<S, 1>, slot: usize, bytes: u64) -> bool {
    admission::try_reserve(p.region(), p, slot, 0, Kind::Data, bytes).is_ok()
}

/// Two processes reserve 60 each against a limit of 100: at most one is admitted.
#[test]
fn admission_two_processes_never_overshoot() {
    loom::model(|| race::<2>(&[60, 60], core_reserve::<2>));
}

/// Three processes reserve 40 each against 100: at most two are admitted.
#[test]
fn admission_three_processes_never_overshoot() {
    loom::model(|| race::<3>(&[40, 40, 40], core_reserve::<3>));
}

/// Upstream's check-then-act (bug B20): read the aggregate, then add. Two processes both see
/// room and both allocate. Mutation test: loom must find the overshoot.
#[test]
#[should_panic(expected = "over the limit")]
fn mutation_admission_check_then_act() {
    fn check_then_act(p: &SimProc<2, 1>, slot: usize, bytes: u64) -> bool {
        let r: &Region<2, 1> = p.region();
        if admission::device_usage(r, 0) + bytes > r.raw_limit()[0].load(Ordering::Relaxed) {
            return false;
        }
        {
            let s = SlotWriter::begin(&r.raw_procs()[slot]);
            s.add(0, Kind::Data, bytes)
        };
        true
    }
    loom::model(|| race::<2>(&[60, 60], check_then_act));
}

/// Core's reserve-validate-rollback with the SeqCst fences removed: the store-buffering
/// outcome (each reserver reads the other's slot as 0) admits both. Shuttle cannot see this
/// (it runs every access SeqCst); loom must. Mutation test.
#[test]
#[should_panic(expected = "over the limit")]
fn mutation_admission_without_seqcst_fence() {
    fn no_fence(p: &SimProc<2, 1>, slot: usize, bytes: u64) -> bool {
        let r: &Region<2, 1> = p.region();
        let limit = r.raw_limit()[0].load(Ordering::Relaxed);
        {
            let s = SlotWriter::begin(&r.raw_procs()[slot]);
            s.add(0, Kind::Data, bytes)
        };
        if admission::device_usage(r, 0) <= limit {
            return true;
        }
        {
            let s = SlotWriter::begin(&r.raw_procs()[slot]);
            s.sub(0, Kind::Data, bytes)
        };
        false
    }
    loom::model(|| race::<2>(&[60, 60], no_fence));
}

/// The same without the fence but with the fence restored: a control for the mutation above
/// (the local copy is otherwise faithful), so the mutation fails for the fence alone.
#[test]
fn admission_local_copy_with_fence_passes() {
    fn with_fence(p: &SimProc<2, 1>, slot: usize, bytes: u64) -> bool {
        let r: &Region<2, 1> = p.region();
        let limit = r.raw_limit()[0].load(Ordering::Relaxed);
        {
            let s = SlotWriter::begin(&r.raw_procs()[slot]);
            s.add(0, Kind::Data, bytes)
        };
        fence(Ordering::SeqCst);
        if admission::device_usage(r, 0) <= limit {
            return true;
        }
        {
            let s = SlotWriter::begin(&r.raw_procs()[slot]);
            s.sub(0, Kind::Data, bytes)
        };
        false
    }
    loom::model(|| race::<2>(&[60, 60], with_fence));
}
