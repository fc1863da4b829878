//! proptest: the slot table and the accounting over random single-threaded histories, checked
//! against an independent model after every operation; and layout validation on arbitrary
//! headers and lengths.
//!
//! Operations on a `Region<4, 2>` with six simulated processes (so the table fills and claims
//! must reap): claim (under the owner lock; a dead process is restarted with the same pid and a
//! new start tag first), reserve, release (sometimes more than held), crash (dead, nothing
//! released), crash while holding the owner lock, reap (by a reaper process, under the lock),
//! exit (`release_on_exit`). After each: per device the region's usage equals the model's
//! (live slots plus dead, unreaped ones; reaped and exited usage gone), never above the limit
//! (only `try_reserve` adds), every slot's owner, counters and seqlock match the model, the
//! problem counters match (underflows clamped and reported, dead owners recovered).
//!
//! Run: `cargo test -p hami-model --test accounting_prop`
#![cfg(not(any(loom, shuttle)))]

use hami_model::{model_lock_cfg, ProblemKind, Sim, SimProc, MAX_PROCS};
use hami_shm::admission;
use hami_shm::layout::{Region, SharedRegion, MAGIC, STATUS_RUNNING};
use hami_shm::lock;
use hami_shm::platform::ProcId;
use hami_shm::seqlock::{self, Kind, Usage};
use hami_shm::slots::{self, ClaimError, REAP_BATCH};
use hami_shm::sync::Ordering;
use hami_shm::validate::{self, Verdict, HEADER_LEN};
use proptest::prelude::*;

const SLOTS: usize = 4;
const DEVS: usize = 3;
const WORKERS: usize = 6;
const REAPER: usize = MAX_PROCS - 2;
/// Device 2 has no limit, so sizes near `u64::MAX` reach the counters' overflow check there.
const LIMITS: [u64; DEVS] = [1000, 600, 0];

type R = Sim<SLOTS, DEVS>;
type P = SimProc<SLOTS, DEVS>;

#[derive(Clone, Debug)]
enum Op {
    Claim(usize),
    Reserve {
        p: usize,
        dev: usize,
        kind: usize,
        bytes: u64,
    },
    /// Releases `per_mille`/1000 of what `p` holds of that kind, or, above 1000, that much more
    /// than it holds (an over-release, clamped).
    Release {
        p: usize,
        dev: usize,
        kind: usize,
        per_mille: u64,
    },
    Crash(usize),
    CrashHoldingLock(usize),
    Reap,
    Exit(usize),
}

/// Request sizes: mostly ordinary, sometimes near `u64::MAX` (a wrapped counter once erased a
/// process's usage).
fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        8 => 1..700u64,
        1 => (u64::MAX - 1000)..=u64::MAX,
        1 => (1u64 << 62)..(1u64 << 63),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let p = 0..WORKERS;
    prop_oneof![
        3 => p.clone().prop_map(Op::Claim),
        6 => (p.clone(), 0..DEVS, 0..3usize, size())
            .prop_map(|(p, dev, kind, bytes)| Op::Reserve { p, dev, kind, bytes }),
        4 => (p.clone(), 0..DEVS, 0..3usize, 0..1300u64)
            .prop_map(|(p, dev, kind, per_mille)| Op::Release { p, dev, kind, per_mille }),
        1 => p.clone().prop_map(Op::Crash),
        1 => p.clone().prop_map(Op::CrashHoldingLock),
        1 => Just(Op::Reap),
        2 => p.prop_map(Op::Exit),
    ]
}

const KINDS: [Kind; 3] = [Kind::Context, Kind::Module, Kind::Data];

/// The model's view of one slot's owner.
#[derive(Clone, Debug)]
struct Owner {
    id: ProcId,
    alive: bool,
    /// Bytes per device and kind.
    usage: [[u64; 3]; DEVS],
    /// `total` per device, kept apart from the kinds so that a drift between them shows (see
    /// `over_release_keeps_total_equal_to_the_kinds`).
    total: [u64; DEVS],
}

impl Owner {
    fn total(&self, dev: usize) -> u64 {
        self.total[dev]
    }
}

struct Harness {
    sim: hami_model::rt::Arc<R>,
    /// Live handle per worker.
    procs: Vec<Option<P>>,
    /// Model slot table: `[0, proc_num)`, `None` = hole.
    table: Vec<Option<Owner>>,
    /// A dead process holds the owner lock.
    lock_held_by_dead: Option<ProcId>,
    underflows: u64,
    recoveries: u64,
}

impl Harness {
    fn new() -> Self {
        Harness {
            sim: R::initialised(LIMITS),
            procs: (0..WORKERS).map(|_| None).collect(),
            table: Vec::new(),
            lock_held_by_dead: None,
            underflows: 0,
            recoveries: 0,
        }
    }

    fn region(&self) -> &Region<SLOTS, DEVS> {
        &self.sim.region
    }

    fn slot_of(&self, id: ProcId) -> Option<usize> {
        self.table
            .iter()
            .position(|o| o.as_ref().is_some_and(|o| o.id == id && o.alive))
    }

    fn model_usage(&self, dev: usize) -> u64 {
        self.table
            .iter()
            .flatten()
            .map(|o| o.total(dev))
            .fold(0, u64::saturating_add)
    }

    /// The next acquire will recover a dead owner.
    fn note_acquire(&mut self) {
        if self.lock_held_by_dead.take().is_some() {
            self.recoveries += 1;
        }
    }

    /// What `slots::reap` by `me` frees.
    fn model_reap(&mut self) -> usize {
        let mut freed = 0;
        for o in self.table.iter_mut() {
            if freed == REAP_BATCH {
                break;
            }
            if o.as_ref().is_some_and(|o| !o.alive) {
                *o = None;
                freed += 1;
            }
        }
        freed
    }

    /// What `slots::claim` does for `me` (pid `pid`): the slot index, or TableFull.
    fn model_claim(&mut self, me: ProcId) -> Result<usize, ClaimError> {
        for attempt in 0..2 {
            let reuse = self
                .table
                .iter()
                .position(|o| o.as_ref().is_some_and(|o| o.id.pid() == me.pid()))
                .or_else(|| self.table.iter().position(|o| o.is_none()));
            let owner = Owner {
                id: me,
                alive: true,
                usage: [[0; 3]; DEVS],
                total: [0; DEVS],
            };
            if let Some(i) = reuse {
                self.table[i] = Some(owner);
                return Ok(i);
            }
            if self.table.len() < SLOTS {
                self.table.push(Some(owner));
                return Ok(self.table.len() - 1);
            }
            if attempt == 0 && self.model_reap() == 0 {
                break;
            }
        }
        Err(ClaimError::TableFull)
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Claim(i) => {
                if self.procs[i].is_none() {
                    self.procs[i] = Some(SimProc::spawn(&self.sim, i));
                }
                self.note_acquire();
                let p = self.procs[i].take().unwrap();
                let got = p
                    .with_owner_lock(&model_lock_cfg(), |g| slots::claim(p.region(), &p, g))
                    .expect("single-threaded acquire cannot time out");
                let want = self.model_claim(p.id());
                assert_eq!(got, want, "claim chose a different slot than the model");
                self.procs[i] = Some(p);
            }
            Op::Reserve {
                p: i,
                dev,
                kind,
                bytes,
            } => {
                let Some(p) = &self.procs[i] else { return };
                let Some(slot) = self.slot_of(p.id()) else {
                    return;
                };
                let before = self.model_usage(dev);
                let mine = self.table[slot].as_ref().unwrap();
                let representable = mine.total(dev).checked_add(bytes).is_some()
                    && mine.usage[dev][kind].checked_add(bytes).is_some();
                let limit = LIMITS[dev];
                let under_limit =
                    limit == 0 || u128::from(before) + u128::from(bytes) <= u128::from(limit);
                let got = admission::try_reserve(p.region(), p, slot, dev, KINDS[kind], bytes);
                assert_eq!(
                    got.is_ok(),
                    representable && under_limit,
                    "reserve {bytes} at {before}/{limit}: {got:?}",
                );
                if let Err(oom) = got {
                    let want = if limit != 0 && !under_limit {
                        admission::OutOfMemory::OverLimit {
                            used: before,
                            limit,
                        }
                    } else {
                        admission::OutOfMemory::TooLarge
                    };
                    assert_eq!(oom, want);
                } else {
                    let o = self.table[slot].as_mut().unwrap();
                    o.usage[dev][kind] += bytes;
                    o.total[dev] += bytes;
                }
            }
            Op::Release {
                p: i,
                dev,
                kind,
                per_mille,
            } => {
                let Some(p) = &self.procs[i] else { return };
                let Some(slot) = self.slot_of(p.id()) else {
                    return;
                };
                let owner = self.table[slot].as_mut().unwrap();
                let held = owner.usage[dev][kind];
                let total = owner.total(dev);
                let bytes = if per_mille <= 1000 {
                    (u128::from(held) * u128::from(per_mille) / 1000) as u64
                } else {
                    held.saturating_add(per_mille - 1000)
                };
                admission::release(p.region(), p, slot, dev, KINDS[kind], bytes);
                // Only what the kind held comes off, from the kind and from the total.
                let removed = bytes.min(held);
                owner.usage[dev][kind] = held - removed;
                owner.total[dev] = total.saturating_sub(removed);
                if bytes > held || removed > total {
                    self.underflows += 1;
                }
            }
            Op::Crash(i) => {
                if let Some(p) = self.procs[i].take() {
                    let id = p.id();
                    p.kill_now();
                    self.mark_dead(id);
                }
            }
            Op::CrashHoldingLock(i) => {
                if let Some(p) = self.procs[i].take() {
                    self.note_acquire();
                    let id = p.id();
                    let g = lock::acquire(p.region(), &p, &model_lock_cfg()).unwrap();
                    p.die_holding(g);
                    self.mark_dead(id);
                    self.lock_held_by_dead = Some(id);
                }
            }
            Op::Reap => {
                self.note_acquire();
                let r = SimProc::spawn(&self.sim, REAPER);
                let freed = r
                    .with_owner_lock(&model_lock_cfg(), |g| slots::reap(r.region(), &r, g))
                    .unwrap();
                r.exit();
                assert_eq!(
                    freed,
                    self.model_reap(),
                    "reap freed a different number of slots"
                );
            }
            Op::Exit(i) => {
                if let Some(p) = self.procs[i].take() {
                    if let Some(slot) = self.slot_of(p.id()) {
                        slots::release_on_exit(p.region(), slot, p.id());
                        self.table[slot] = None;
                    }
                    p.exit();
                }
            }
        }
    }

    fn mark_dead(&mut self, id: ProcId) {
        for o in self.table.iter_mut().flatten() {
            if o.id == id {
                o.alive = false;
            }
        }
    }

    fn check(&self, step: usize, op: &Op) {
        let r = self.region();
        let ctx = || format!("after step {step} ({op:?})");
        assert_eq!(
            r.raw_proc_num().load(Ordering::Relaxed) as usize,
            self.table.len(),
            "{}",
            ctx()
        );
        for (dev, limit) in LIMITS.iter().enumerate() {
            let used = admission::device_usage(r, dev);
            assert_eq!(used, self.model_usage(dev), "device {dev} usage {}", ctx());
            assert!(
                *limit == 0 || used <= *limit,
                "device {dev} over its limit {}",
                ctx()
            );
        }
        for (i, o) in self.table.iter().enumerate() {
            let slot = &r.raw_procs()[i];
            assert_eq!(
                slot.raw_seqlock().load(Ordering::Relaxed) & 1,
                0,
                "slot {i} odd {}",
                ctx()
            );
            match o {
                None => {
                    assert_eq!(
                        slot.raw_pid().load(Ordering::Relaxed),
                        0,
                        "slot {i} {}",
                        ctx()
                    );
                    for dev in 0..DEVS {
                        let (u, ok) = seqlock::read(slot, dev);
                        assert!(ok);
                        assert_eq!(u, Usage::default(), "free slot {i} not zero {}", ctx());
                    }
                }
                Some(o) => {
                    assert_eq!(slots::slot_owner(slot), o.id, "slot {i} owner {}", ctx());
                    assert_eq!(slot.raw_status().load(Ordering::Relaxed), STATUS_RUNNING);
                    for dev in 0..DEVS {
                        let (u, ok) = seqlock::read(slot, dev);
                        assert!(ok);
                        let want = Usage {
                            context: o.usage[dev][0],
                            module: o.usage[dev][1],
                            data: o.usage[dev][2],
                            total: o.total(dev),
                        };
                        assert_eq!(u, want, "slot {i} device {dev} {}", ctx());
                    }
                    if o.alive {
                        assert_eq!(slots::find_own(r, i, o.id), Some(i));
                        assert_eq!(slots::find_own(r, 0, o.id), Some(i));
                    }
                }
            }
        }
        let w = &self.sim.world;
        assert_eq!(
            w.problems(ProblemKind::Underflow),
            self.underflows,
            "{}",
            ctx()
        );
        assert_eq!(
            w.problems(ProblemKind::RecoveredDeadOwner),
            self.recoveries,
            "{}",
            ctx()
        );
        assert_eq!(w.problems(ProblemKind::LockStolen), 0);
        assert_eq!(w.problems(ProblemKind::StuckSeqlock), 0);
        match self.lock_held_by_dead {
            Some(id) => {
                assert_eq!(w.sem_value(), 0);
                assert_eq!(r.raw_owner_pid().load(Ordering::Relaxed), id.0);
            }
            None => {
                assert_eq!(w.sem_value(), 1, "{}", ctx());
                assert_eq!(r.raw_owner_pid().load(Ordering::Relaxed), 0);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn accounting_matches_the_model(ops in prop::collection::vec(op(), 1..80)) {
        let mut h = Harness::new();
        for (step, op) in ops.iter().enumerate() {
            h.apply(op);
            h.check(step, op);
        }
        // Everyone alive exits, a reaper cleans the dead: the device is empty.
        for i in 0..WORKERS {
            h.apply(&Op::Exit(i));
        }
        h.apply(&Op::Reap);
        h.check(ops.len(), &Op::Reap);
        for dev in 0..DEVS {
            prop_assert_eq!(admission::device_usage(h.region(), dev), 0);
        }
        prop_assert!(h.table.iter().all(|o| o.is_none()));
    }
}

/// A file length near one of the interesting sizes, or anything.
fn file_len(size: usize) -> impl Strategy<Value = u64> {
    let s = size as u64;
    prop_oneof![
        Just(0u64),
        (0u64..4).prop_map(move |d| s - 1 + d),
        (0u64..4).prop_map(move |d| s + validate::L1_SHIFT as u64 - 1 + d),
        0u64..(s * 2),
        any::<u64>(),
    ]
}

/// A header: random bytes, sometimes with the magic and a plausible version written in.
fn header() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::collection::vec(any::<u8>(), 0..(HEADER_LEN + 16)),
        prop_oneof![
            Just(None),
            Just(Some(MAGIC)),
            Just(Some(1)),
            Just(Some(0)),
            any::<i32>().prop_map(Some)
        ],
        prop_oneof![
            Just(None),
            Just(Some((1u32, 2u32))),
            Just(Some((1, 1))),
            any::<(u32, u32)>().prop_map(Some)
        ],
        prop_oneof![Just(None), Just(Some(0x80u32)), any::<u32>().prop_map(Some)],
    )
        .prop_map(|(mut h, flag, version, word64)| {
            let mut put = |at: usize, bytes: &[u8]| {
                if h.len() >= at + bytes.len() {
                    h[at..at + bytes.len()].copy_from_slice(bytes);
                }
            };
            if let Some(f) = flag {
                put(0, &f.to_le_bytes());
            }
            if let Some((major, minor)) = version {
                put(4, &major.to_le_bytes());
                put(8, &minor.to_le_bytes());
            }
            if let Some(w) = word64 {
                put(64, &w.to_le_bytes());
            }
            h
        })
}

fn has_magic(h: &[u8]) -> bool {
    h.len() >= 4 && i32::from_le_bytes([h[0], h[1], h[2], h[3]]) == MAGIC
}

fn check_classify(h: &[u8], len: u64, size: usize) {
    let v = validate::classify(h, len, size);
    if matches!(v, Ok(Verdict::Ready) | Ok(Verdict::LegacyV11)) {
        assert!(has_magic(h), "{v:?} for a header without the magic");
        assert!(h.len() >= HEADER_LEN);
    }
    if let Err(e) = v {
        // Every refusal can be displayed.
        assert!(!e.to_string().is_empty());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

    #[test]
    fn classify_abi_size_never_panics(h in header(), len in file_len(SharedRegion::SIZE)) {
        check_classify(&h, len, SharedRegion::SIZE);
    }

    #[test]
    fn classify_model_size_never_panics(h in header(), len in file_len(Region::<4, 2>::SIZE)) {
        check_classify(&h, len, Region::<4, 2>::SIZE);
    }

    #[test]
    fn classify_any_plausible_region_size_never_panics(
        h in header(),
        size in 1usize..(1 << 40),
        len in any::<u64>(),
    ) {
        check_classify(&h, len, size);
        check_classify(&h, size as u64 + 1, size);
    }
}

/// A release of more of one kind than the slot holds, while it holds other kinds: core clamps
/// the kind's counter at 0 but subtracts the whole amount from `total`, so afterwards `total`
/// is less than the sum of the kinds, a seqlock read that calls itself consistent returns a
/// snapshot with `total != context + module + data`, and admission (which counts `total`)
/// undercounts the other kinds' memory by the excess: the limit can then be overshot by it.
///
/// This failed against an earlier core/src/seqlock.rs `sub`, which saturated the two counters
/// independently; `total` now loses only what the kind really had.
#[test]
fn over_release_keeps_total_equal_to_the_kinds() {
    let sim = Sim::<1, 1>::initialised([1000]);
    let p = SimProc::spawn(&sim, 0);
    let slot = p
        .with_owner_lock(&model_lock_cfg(), |g| slots::claim(p.region(), &p, g))
        .unwrap()
        .unwrap();
    admission::try_reserve(p.region(), &p, slot, 0, Kind::Context, 600).unwrap();
    admission::try_reserve(p.region(), &p, slot, 0, Kind::Data, 100).unwrap();
    // A double free of the 100-byte data allocation.
    admission::release(p.region(), &p, slot, 0, Kind::Data, 100);
    admission::release(p.region(), &p, slot, 0, Kind::Data, 100);
    assert_eq!(
        sim.world.problems(ProblemKind::Underflow),
        1,
        "the over-release is reported"
    );
    let (u, ok) = seqlock::read(&p.region().raw_procs()[slot], 0);
    assert!(ok);
    assert_eq!(u.context, 600);
    assert_eq!(u.data, 0);
    assert_eq!(
        u.total,
        u.context + u.module + u.data,
        "total undercounts the context memory still held: {u:?}"
    );
}
