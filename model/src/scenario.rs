//! A whole-system scenario on a `Region<8, 1>`: worker processes initialise, claim a slot under
//! the owner lock, reserve and release random amounts, and exit; a reaper reaps under the lock;
//! a killer kills one process at a random crash point (inside the owner lock, mid-seqlock
//! write, mid-init, anywhere), and a killed worker's pid is restarted as a new incarnation.
//! Runs on whichever threads [`crate::rt`] provides (shuttle in `tests/shuttle_*.rs`, std in
//! `tests/std_scenario.rs`).
//!
//! Invariants, checked where they must hold (each panics with a message naming it):
//! - owner lock: at most one live process in the critical section, the holder owns the token
//!   (semaphore 0, `owner_pid` = holder), the semaphore never above 1 (the platform's
//!   `sem_post` check);
//! - slots: no two live processes own one slot; a restarted pid reuses its old slot if that
//!   slot still carries its pid;
//! - admission: after every admitted reservation, the sum of what live processes hold
//!   (admitted and not yet released, as the workers track it) is at most the limit;
//! - reaping: every slot whose owner was dead when a reap began is free afterwards, and every
//!   free slot's usage is 0; consistent seqlock reads have `total == context + module + data`;
//! - the end: every thread returns (lock and init waits end in success or a logical-deadline
//!   timeout), and after a final reap the device's usage is exactly 0, the lock is free with
//!   one token, and no lock was ever stolen.

use std::sync::atomic::{AtomicU64 as PlainU64, Ordering as Plain};

use hami_shm::admission;
use hami_shm::init::InitError;
use hami_shm::layout::{ProcSlot, MAGIC};
use hami_shm::lock::{LockConfig, LockError};
use hami_shm::platform::Platform;
use hami_shm::seqlock::{self, Kind, SlotWriter};
use hami_shm::slots;
use hami_shm::sync::Ordering;

use crate::rt::{self, thread, Arc};
use crate::{ProblemKind, Sim, SimProc, MAX_PROCS};

/// Slots of the scenario's region.
pub const SLOTS: usize = 8;
/// The scenario's simulation.
pub type S = Sim<SLOTS, 1>;
/// The scenario's process handles.
pub type P = SimProc<SLOTS, 1>;
/// The device limit.
pub const LIMIT: u64 = 1000;
/// Process index of the reaper.
pub const REAPER: usize = MAX_PROCS - 2;
/// Process index of the final checker.
pub const FINAL: usize = MAX_PROCS - 1;

/// How a worker reserves: core's `try_reserve`, or a mutation.
pub type Reserve = fn(&P, usize, u64) -> bool;

/// Core's admission.
pub fn core_reserve(p: &P, slot: usize, bytes: u64) -> bool {
    admission::try_reserve(p.region(), p, slot, 0, Kind::Data, bytes).is_ok()
}

/// What one run does.
#[derive(Clone, Copy)]
pub struct Config {
    /// Worker processes (indices `0..workers`, at most `REAPER`).
    pub workers: usize,
    /// Operations per worker incarnation.
    pub ops: usize,
    /// Whether a killer kills one process (a worker or the reaper).
    pub kill: bool,
    /// Whether a killed worker restarts with the same pid (PID reuse).
    pub restart: bool,
    /// Rounds of the reaper.
    pub reaper_rounds: usize,
    /// Yields the killer waits at most before killing.
    pub killer_max_delay: u64,
    /// Instead of a killer thread, the victim dies at a random crash step below this (for real
    /// threads, where a killer thread usually comes too late); 0: use the killer thread.
    pub crash_step_below: u64,
    /// Owner lock timing (logical).
    pub lock: LockConfig,
    /// Init lock timeout (logical).
    pub init_timeout: u64,
    /// How workers reserve.
    pub reserve: Reserve,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            workers: 5,
            ops: 6,
            kill: true,
            restart: true,
            reaper_rounds: 2,
            killer_max_delay: 400,
            crash_step_below: 0,
            lock: LockConfig {
                deadline_ns: 1 << 12,
                orphan_grace_ns: 32,
                max_backoff_ns: 8,
            },
            init_timeout: 1 << 12,
            reserve: core_reserve,
        }
    }
}

/// Counters over all runs of a test (for its summary line).
#[derive(Default)]
pub struct Stats {
    /// Runs.
    pub runs: PlainU64,
    /// Processes killed at a crash point.
    pub crashes: PlainU64,
    /// Incarnations started by PID reuse.
    pub restarts: PlainU64,
    /// Owner-lock acquisitions that timed out.
    pub lock_timeouts: PlainU64,
    /// Init-lock waits that timed out.
    pub init_timeouts: PlainU64,
    /// Dead owners recovered.
    pub dead_owners: PlainU64,
    /// Lost tokens taken over.
    pub lost_tokens: PlainU64,
    /// Admitted reservations.
    pub admitted: PlainU64,
    /// Refused reservations.
    pub refused: PlainU64,
}

impl Stats {
    /// A one-line summary.
    pub fn summary(&self) -> String {
        let g = |c: &PlainU64| c.load(Plain::Relaxed);
        format!(
            "runs {} crashes {} restarts {} lock timeouts {} init timeouts {} dead-owner \
             recoveries {} lost-token takeovers {} admitted {} refused {}",
            g(&self.runs),
            g(&self.crashes),
            g(&self.restarts),
            g(&self.lock_timeouts),
            g(&self.init_timeouts),
            g(&self.dead_owners),
            g(&self.lost_tokens),
            g(&self.admitted),
            g(&self.refused)
        )
    }
}

const NONE: u64 = u64::MAX;

/// Checker state of one run: plain atomics (see the crate docs).
struct Checks {
    /// Bytes each process holds (admitted, not yet released), as it tracks them.
    held: [PlainU64; MAX_PROCS],
    /// Slot each process owns, or NONE.
    slot_of: [PlainU64; MAX_PROCS],
    /// The slot the process's previous incarnation owned, or NONE.
    prev_slot: [PlainU64; MAX_PROCS],
    /// Serialises updates of `held` with the admission check, so the check reads a snapshot
    /// under real threads too (never held across a scheduling point of loom or shuttle).
    held_lock: std::sync::Mutex<()>,
    lock_timeouts: PlainU64,
    init_timeouts: PlainU64,
    admitted: PlainU64,
    refused: PlainU64,
}

impl Checks {
    fn new() -> Self {
        let n = |v| core::array::from_fn(|_| PlainU64::new(v));
        Checks {
            held: n(0),
            slot_of: n(NONE),
            prev_slot: n(NONE),
            held_lock: std::sync::Mutex::new(()),
            lock_timeouts: PlainU64::new(0),
            init_timeouts: PlainU64::new(0),
            admitted: PlainU64::new(0),
            refused: PlainU64::new(0),
        }
    }

    /// Records that `idx` holds `bytes` more (after its reservation was admitted) and checks
    /// the admission invariant.
    fn admitted(&self, sim: &S, idx: usize, bytes: u64) {
        {
            let _g = self.held_lock.lock().unwrap();
            self.held[idx].fetch_add(bytes, Plain::Relaxed);
        }
        self.check_admitted(sim);
    }

    /// Records that `idx` holds `bytes` less (before it releases them).
    fn releasing(&self, idx: usize, bytes: u64) {
        let _g = self.held_lock.lock().unwrap();
        self.held[idx].fetch_sub(bytes, Plain::Relaxed);
    }

    /// Admission invariant: what live processes hold fits under the limit. Plain atomics only,
    /// so no other thread runs during the sum.
    fn check_admitted(&self, sim: &S) {
        let _g = self.held_lock.lock().unwrap();
        let sum: u64 = (0..MAX_PROCS)
            .filter(|&j| sim.world.alive(j))
            .map(|j| self.held[j].load(Plain::Relaxed))
            .sum();
        assert!(
            sum <= LIMIT,
            "admission invariant violated: live processes hold {sum} bytes, over the limit of {LIMIT}"
        );
    }
}

fn assert_consistent_reads(sim: &S) {
    for (i, slot) in sim.region.live_range().iter().enumerate() {
        let (u, ok) = seqlock::read(slot, 0);
        if ok {
            assert_eq!(
                u.total,
                u.context + u.module + u.data,
                "seqlock: a consistent read of slot {i} is torn: {u:?}"
            );
        }
    }
}

/// Acquires the owner lock (retrying timeouts a few times) and runs `f` inside. `None` if every
/// attempt timed out.
fn locked<R>(
    p: &P,
    cfg: &Config,
    checks: &Checks,
    f: impl FnOnce(&hami_shm::lock::OwnerGuard<'_, P, SLOTS, 1>) -> R,
) -> Option<R> {
    let mut f = Some(f);
    for _ in 0..4 {
        match p.with_owner_lock(&cfg.lock, |g| (f.take().unwrap())(g)) {
            Ok(r) => return Some(r),
            Err(LockError::Timeout) => {
                checks.lock_timeouts.fetch_add(1, Plain::Relaxed);
            }
            Err(e) => panic!("owner lock failed: {e:?}"),
        }
    }
    None
}

fn worker(p: &P, cfg: &Config, checks: &Checks) {
    let sim = p.sim();
    let idx = p.idx();
    let mut inited = false;
    for _ in 0..4 {
        match p.ensure_initialised([LIMIT], cfg.init_timeout) {
            Ok(_) => {
                inited = true;
                break;
            }
            Err(InitError::LockTimeout) => {
                checks.init_timeouts.fetch_add(1, Plain::Relaxed);
            }
            Err(e) => panic!("init failed: {e:?}"),
        }
    }
    if !inited {
        return;
    }
    assert_eq!(
        sim.region.raw_limit()[0].load(Ordering::Relaxed),
        LIMIT,
        "limit not visible after init"
    );

    let prev = checks.prev_slot[idx].load(Plain::Relaxed);
    let claimed = locked(p, cfg, checks, |g| {
        let r = p.region();
        let reuse = prev != NONE
            && r.raw_procs()[prev as usize]
                .raw_pid()
                .load(Ordering::Relaxed)
                == p.id().pid();
        let slot = slots::claim(r, p, g).expect("8 slots for at most 7 claimants");
        if reuse {
            assert_eq!(
                slot as u64, prev,
                "a restarted pid did not reuse its old slot"
            );
        }
        for j in 0..MAX_PROCS {
            if j != idx
                && sim.world.alive(j)
                && checks.slot_of[j].load(Plain::Relaxed) == slot as u64
            {
                panic!("slot invariant violated: live processes {j} and {idx} own slot {slot}");
            }
        }
        assert_eq!(slots::slot_owner(&r.raw_procs()[slot]), p.id());
        checks.slot_of[idx].store(slot as u64, Plain::Relaxed);
        slot
    });
    let Some(slot) = claimed else { return };
    let own: &ProcSlot<1> = &sim.region.raw_procs()[slot];

    let mut held: Vec<(Kind, u64)> = Vec::new();
    let take = |held: &mut Vec<(Kind, u64)>, i: usize| {
        let (kind, bytes) = held.swap_remove(i);
        checks.releasing(idx, bytes);
        admission::release(p.region(), p, slot, 0, kind, bytes);
    };
    for _ in 0..cfg.ops {
        p.crash_point();
        match rt::random(4) {
            0 | 1 => {
                let bytes = 1 + rt::random(400);
                if (cfg.reserve)(p, slot, bytes) {
                    held.push((Kind::Data, bytes));
                    checks.admitted.fetch_add(1, Plain::Relaxed);
                    checks.admitted(sim, idx, bytes);
                } else {
                    checks.refused.fetch_add(1, Plain::Relaxed);
                }
            }
            2 if !held.is_empty() => {
                let i = rt::random(held.len() as u64) as usize;
                take(&mut held, i)
            }
            _ => {
                // Re-account a data reservation as context memory in one seqlock write, with a
                // crash point between the two halves. Add first: the total is transiently
                // higher, never lower (a lower total would let a concurrent reservation in
                // that the re-add then pushes over the limit).
                if let Some(i) = held.iter().position(|(k, _)| *k == Kind::Data) {
                    let bytes = held[i].1;
                    {
                        let s = SlotWriter::begin(own);
                        s.add(0, Kind::Context, bytes);
                        p.crash_point();
                        assert!(s.sub(0, Kind::Data, bytes));
                    };
                    held[i].0 = Kind::Context;
                }
            }
        }
    }
    while !held.is_empty() {
        take(&mut held, 0);
    }
    let (u, ok) = seqlock::read(own, 0);
    assert!(
        ok && u.total == 0,
        "slot {slot} not empty after releasing everything: {u:?}"
    );
    checks.slot_of[idx].store(NONE, Plain::Relaxed);
    slots::release_on_exit(p.region(), slot, p.id());
}

fn reaper(p: &P, cfg: &Config, checks: &Checks) {
    let sim = p.sim();
    for _ in 0..cfg.reaper_rounds {
        if !hami_shm::init::is_initialised(&sim.region) {
            p.sleep_ns(1);
            continue;
        }
        locked(p, cfg, checks, |g| {
            let r = p.region();
            let dead: Vec<(usize, hami_shm::platform::ProcId)> = r
                .live_range()
                .iter()
                .enumerate()
                .map(|(i, s)| (i, slots::slot_owner(s)))
                .filter(|(_, id)| id.pid() != 0 && sim.world.dead_now(*id))
                .collect();
            slots::reap(r, p, g);
            for (i, id) in dead {
                let s = &r.raw_procs()[i];
                assert_ne!(slots::slot_owner(s), id, "reap left dead slot {i} ({id:?})");
            }
            for (i, s) in r.live_range().iter().enumerate() {
                if s.raw_pid().load(Ordering::Relaxed) == 0 {
                    assert_eq!(
                        s.raw_used()[0].raw_total().load(Ordering::Relaxed),
                        0,
                        "free slot {i} still counts usage"
                    );
                }
            }
        });
        assert_consistent_reads(sim);
        p.sleep_ns(1);
    }
}

/// One run of the scenario. Panics on any violated invariant.
pub fn run(cfg: &Config, stats: &Stats) {
    assert!(cfg.workers <= REAPER);
    let sim = Arc::new(S::new());
    let checks = Arc::new(Checks::new());
    let victim = {
        let v = rt::random(cfg.workers as u64 + 1) as usize;
        if v == cfg.workers {
            REAPER
        } else {
            v
        }
    };
    if cfg.kill && cfg.crash_step_below > 0 {
        sim.world
            .schedule_crash(victim, rt::random(cfg.crash_step_below));
    } else if cfg.kill {
        sim.world.arm_killer();
    }
    let mut handles = Vec::new();
    for idx in 0..cfg.workers {
        let (sim, checks, cfg) = (sim.clone(), checks.clone(), *cfg);
        handles.push(thread::spawn(move || {
            let mut restarts = 0;
            loop {
                let p = P::spawn(&sim, idx);
                if p.run(|p| worker(p, &cfg, &checks)).is_some() {
                    p.exit();
                    break;
                }
                checks.prev_slot[idx]
                    .store(checks.slot_of[idx].load(Plain::Relaxed), Plain::Relaxed);
                checks.slot_of[idx].store(NONE, Plain::Relaxed);
                checks.held[idx].store(0, Plain::Relaxed);
                if !cfg.restart || restarts == 1 {
                    break;
                }
                restarts += 1;
            }
            restarts
        }));
    }
    {
        let (sim, checks, cfg) = (sim.clone(), checks.clone(), *cfg);
        handles.push(thread::spawn(move || {
            let p = P::spawn(&sim, REAPER);
            if p.run(|p| reaper(p, &cfg, &checks)).is_some() {
                p.exit();
            }
            0
        }));
    }
    if cfg.kill && cfg.crash_step_below == 0 {
        let (sim, cfg) = (sim.clone(), *cfg);
        handles.push(thread::spawn(move || {
            for _ in 0..rt::random(cfg.killer_max_delay + 1) {
                rt::yield_now();
            }
            sim.world.kill(victim);
            0
        }));
    }
    let restarts: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();

    // Everyone has returned: a final process initialises (if every initialiser died), takes
    // the lock uncontended (recovering a dead owner or a lost token), reaps, releases.
    let fin = P::spawn(&sim, FINAL);
    fin.ensure_initialised([LIMIT], u64::MAX)
        .expect("final init");
    assert_eq!(
        sim.region.raw_initialized_flag().load(Ordering::Relaxed),
        MAGIC
    );
    let cfg_final = LockConfig {
        deadline_ns: 1 << 16,
        ..cfg.lock
    };
    fin.with_owner_lock(&cfg_final, |g| slots::reap(&sim.region, &fin, g))
        .expect("an uncontended acquire at the end must succeed: the lock is wedged");
    fin.exit();
    for (i, s) in sim.region.live_range().iter().enumerate() {
        assert_eq!(
            s.raw_pid().load(Ordering::Relaxed),
            0,
            "slot {i} still owned at the end"
        );
    }
    assert_eq!(
        admission::device_usage(&sim.region, 0),
        0,
        "usage left at the end"
    );
    for s in sim.region.live_range() {
        assert_eq!(
            s.raw_used()[0].raw_total().load(Ordering::Relaxed),
            0,
            "a freed slot keeps usage"
        );
    }
    let w = &sim.world;
    assert_eq!(
        w.sem_value(),
        1,
        "the lock does not have exactly one token at rest"
    );
    assert_eq!(sim.region.raw_owner_pid().load(Ordering::Relaxed), 0);
    assert_eq!(w.problems(ProblemKind::LockStolen), 0, "a lock was stolen");
    assert_eq!(w.init_lock_holder(), 0);

    let add = |c: &PlainU64, v: u64| c.fetch_add(v, Plain::Relaxed);
    add(&stats.runs, 1);
    add(&stats.crashes, w.crashes());
    add(&stats.restarts, restarts);
    add(
        &stats.lock_timeouts,
        checks.lock_timeouts.load(Plain::Relaxed),
    );
    add(
        &stats.init_timeouts,
        checks.init_timeouts.load(Plain::Relaxed),
    );
    add(
        &stats.dead_owners,
        w.problems(ProblemKind::RecoveredDeadOwner),
    );
    add(
        &stats.lost_tokens,
        w.problems(ProblemKind::RecoveredLostToken),
    );
    add(&stats.admitted, checks.admitted.load(Plain::Relaxed));
    add(&stats.refused, checks.refused.load(Plain::Relaxed));
}
