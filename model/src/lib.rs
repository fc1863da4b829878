//! hami-model: model platforms and scenarios that drive hami-shm's protocols under loom
//! (`RUSTFLAGS="--cfg loom"`), shuttle (`--cfg shuttle`) and proptest. Tests only.
//!
//! # The simulated world
//!
//! A [`Sim`] is one shared region plus a [`World`]: the kernel state the protocols reach through
//! [`Platform`]. Every simulated process is an index `0..MAX_PROCS` (pid `BASE_PID + index`)
//! with a sequence of *incarnations*: a killed process may be restarted with the same pid and a
//! new start tag (PID reuse). A [`SimProc`] is one incarnation's platform handle, used by one
//! thread (std, loom or shuttle: see [`rt`]); [`SimProc::same_process`] gives a second thread of
//! the same process its own handle.
//!
//! State that the protocols race on (the semaphores, the init lock, the window, liveness, the kill
//! switches) is held in `hami_shm::sync` atomics, so loom and shuttle see every access. State
//! that only the *checkers* read (the critical-section mask, the problem counters, mirrors of the
//! semaphore values and of liveness) is held in plain `core` atomics: loom and shuttle run one
//! thread at a time, so those reads see the real-time state, add no scheduling points and create
//! no happens-before edges that could hide an ordering bug.
//!
//! # Crashes
//!
//! Every platform call that has an effect is two *crash points* (before and after its effect);
//! reads are one; [`SimProc::crash_point`] adds explicit ones (e.g. inside a seqlock write). A
//! process dies at a crash point when
//! - its step counter reaches the step chosen with [`SimProc::crash_at_step`] (loom tests loop
//!   over every step), or
//! - its kill switch is set ([`World::kill`], from a killer thread; armed with
//!   [`World::arm_killer`]).
//!
//! Dying is what the kernel does for a SIGKILLed process: the window and the init lock are
//! released, the process leaves the critical section, it turns dead for [`Platform::liveness`];
//! then the thread unwinds with a private payload (via `resume_unwind`, so no panic hook runs)
//! that [`SimProc::run`] catches. Nothing of the dead process touches the region again. An
//! [`lock::OwnerGuard`] must therefore never be dropped by the unwinding: hold it through
//! [`SimProc::with_owner_lock`], which keeps it in a `ManuallyDrop`. Likewise `context::admit`
//! gives the probe lease back when it unwinds (for a real panic): a model that killed a prober
//! inside it would see the lease freed, as no real death frees it. The context model kills
//! nobody.
//!
//! # Time
//!
//! Each handle has a logical clock: [`Platform::now_ns`] reads it, [`Platform::sleep_ns`] adds its
//! argument and yields to the checker's scheduler. Deadlines and grace periods are therefore
//! counted in the caller's own sleeps, and every wait terminates in a model.
#![warn(missing_docs)]

use core::cell::Cell;
use core::mem::ManuallyDrop;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{
    AtomicBool as PlainBool, AtomicU32 as PlainU32, AtomicU64 as PlainU64, Ordering as Plain,
};

use hami_shm::init::{self, InitError, InitOutcome, InitParams};
use hami_shm::layout::{RawSem, Region};
use hami_shm::lock::{self, LockConfig, LockError, OwnerGuard};
use hami_shm::platform::{Liveness, Platform, Problem, ProcId, SemWait};
use hami_shm::sync::{AtomicU32, Ordering};

pub mod scenario;

/// The checker's runtime: threads, `Arc` and randomness of loom, shuttle or std, matching the
/// atomics `hami_shm::sync` was built with.
pub mod rt {
    #[cfg(loom)]
    pub use loom::{sync::Arc, thread};
    #[cfg(all(shuttle, not(loom)))]
    pub use shuttle::{sync::Arc, thread};
    #[cfg(not(any(loom, shuttle)))]
    pub use std::{sync::Arc, thread};

    /// Yields to the scheduler (loom and shuttle need it in every spin loop).
    pub fn yield_now() {
        thread::yield_now()
    }

    /// A random number in `0..bound` (`bound > 0`). Under shuttle it comes from shuttle's
    /// generator, so failing schedules replay; elsewhere from a process-wide xorshift.
    pub fn random(bound: u64) -> u64 {
        assert!(bound > 0);
        #[cfg(all(shuttle, not(loom)))]
        {
            use shuttle::rand::RngCore;
            shuttle::rand::thread_rng().next_u64() % bound
        }
        #[cfg(not(all(shuttle, not(loom))))]
        {
            use std::sync::atomic::{AtomicU64, Ordering};
            static STATE: AtomicU64 = AtomicU64::new(0x9e37_79b9_7f4a_7c15);
            let mut x = STATE.load(Ordering::Relaxed);
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            STATE.store(x, Ordering::Relaxed);
            x % bound
        }
    }
}

/// Simulated processes (indices) a world holds.
pub const MAX_PROCS: usize = 8;
/// Pid of process index 0; index `i` has pid `BASE_PID + i`.
pub const BASE_PID: i32 = 4000;
/// `private` word glibc writes into a process-shared `sem_t`.
pub const GLIBC_SEM_SHARED: u64 = 0x80;

/// The kinds of [`Problem`], for counting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProblemKind {
    /// [`Problem::StuckSeqlock`].
    StuckSeqlock,
    /// [`Problem::Underflow`].
    Underflow,
    /// [`Problem::ProcNumOutOfRange`].
    ProcNumOutOfRange,
    /// [`Problem::RecoveredDeadOwner`].
    RecoveredDeadOwner,
    /// [`Problem::RecoveredLostToken`].
    RecoveredLostToken,
    /// [`Problem::LockStolen`].
    LockStolen,
}

/// Number of [`ProblemKind`]s.
pub const PROBLEM_KINDS: usize = 6;

impl ProblemKind {
    /// The kind of `p`.
    pub fn of(p: &Problem) -> ProblemKind {
        match p {
            Problem::StuckSeqlock { .. } => ProblemKind::StuckSeqlock,
            Problem::Underflow { .. } => ProblemKind::Underflow,
            Problem::ProcNumOutOfRange { .. } => ProblemKind::ProcNumOutOfRange,
            Problem::RecoveredDeadOwner { .. } => ProblemKind::RecoveredDeadOwner,
            Problem::RecoveredLostToken => ProblemKind::RecoveredLostToken,
            Problem::LockStolen => ProblemKind::LockStolen,
        }
    }
}

/// The payload a dying process unwinds with.
struct Crashed;

fn plain_u32s<const N: usize>() -> [PlainU32; N] {
    core::array::from_fn(|_| PlainU32::new(0))
}

/// The simulated kernel: liveness, semaphores, the init lock, the window, kill switches, and the
/// checkers' records.
pub struct World {
    /// Per process: `incarnation << 1 | alive`. Incarnation 0 never ran.
    life: [AtomicU32; MAX_PROCS],
    /// Per process: nonzero once a killer asked it to die (checked only if armed).
    kill: [AtomicU32; MAX_PROCS],
    killer_armed: PlainBool,
    /// Value of the region's `sem`.
    sem: AtomicU32,
    /// Value of the region's `sem_postinit`.
    sem_postinit: AtomicU32,
    /// Holder of the init lock: process index + 1, or 0.
    init_lock: AtomicU32,
    /// Bit `i`: process `i` is inside the owner lock's window.
    window: AtomicU32,

    // Checker state: plain atomics, real-time order (see the crate docs).
    /// Checker mirror of `sem` and `sem_postinit`, updated with every operation.
    sem_mirror: [PlainU32; 2],
    /// Checker mirror of `life`, updated before a death is visible and after a birth.
    life_mirror: [PlainU32; MAX_PROCS],
    /// Bit `i`: process `i` is inside a critical section of the owner lock.
    cs: PlainU32,
    /// Reports per [`ProblemKind`].
    problems: [PlainU64; PROBLEM_KINDS],
    /// How many times a `sem_post` took a semaphore above 1.
    sem_overflows: PlainU64,
    /// How many processes died at a crash point.
    crashes: PlainU64,
    /// Per process: the crash step its next incarnation gets (`u64::MAX`: none).
    scheduled_crash: [PlainU64; MAX_PROCS],
}

impl Default for World {
    fn default() -> Self {
        Self::new()
    }
}

impl World {
    /// A world in which no process has started. Under loom, create it inside `loom::model`.
    pub fn new() -> World {
        World {
            life: core::array::from_fn(|_| AtomicU32::new(0)),
            kill: core::array::from_fn(|_| AtomicU32::new(0)),
            killer_armed: PlainBool::new(false),
            sem: AtomicU32::new(0),
            sem_postinit: AtomicU32::new(0),
            init_lock: AtomicU32::new(0),
            window: AtomicU32::new(0),
            sem_mirror: plain_u32s(),
            life_mirror: plain_u32s(),
            cs: PlainU32::new(0),
            problems: core::array::from_fn(|_| PlainU64::new(0)),
            sem_overflows: PlainU64::new(0),
            crashes: PlainU64::new(0),
            scheduled_crash: core::array::from_fn(|_| PlainU64::new(u64::MAX)),
        }
    }

    /// Makes the next incarnation of process `idx` die at crash point `step` (as
    /// [`SimProc::crash_at_step`]); later incarnations are not affected. A killer that needs no
    /// thread of its own (for real threads, where a killer thread would usually come too late).
    pub fn schedule_crash(&self, idx: usize, step: u64) {
        self.scheduled_crash[idx].store(step, Plain::Relaxed);
    }

    /// Makes every crash point also check the process's kill switch (a killer thread).
    pub fn arm_killer(&self) {
        self.killer_armed.store(true, Plain::Relaxed);
    }

    /// Asks process `idx` to die at its next crash point (if the killer is armed).
    pub fn kill(&self, idx: usize) {
        self.kill[idx].store(1, Ordering::SeqCst);
    }

    /// Whether process `idx`'s current incarnation runs (checker view, real time).
    pub fn alive(&self, idx: usize) -> bool {
        self.life_mirror[idx].load(Plain::Relaxed) & 1 == 1
    }

    /// The current incarnation of process `idx` (0: never started).
    pub fn incarnation(&self, idx: usize) -> u32 {
        self.life_mirror[idx].load(Plain::Relaxed) >> 1
    }

    /// Whether the incarnation `id` names (a pid of this world and a start tag) is dead for sure
    /// (checker view). Unknown pids and C-style identities (tag 0) are not "known dead".
    pub fn known_dead(&self, id: ProcId) -> bool {
        let Some(idx) = index_of(id.pid()) else {
            return false;
        };
        if id.tag() == 0 {
            return false;
        }
        let life = self.life_mirror[idx].load(Plain::Relaxed);
        let inc = id.tag() & 0x7fff_ffff;
        inc < life >> 1 || (inc == life >> 1 && life & 1 == 0)
    }

    /// Whether incarnation `id` is dead as [`Platform::liveness`] would answer now (reads the
    /// protocol-visible state: a scheduling point under loom and shuttle). Use it for
    /// snapshots that a protocol step taken afterwards must agree with.
    pub fn dead_now(&self, id: ProcId) -> bool {
        let Some(idx) = index_of(id.pid()) else {
            return true;
        };
        let life = self.life[idx].load(Ordering::SeqCst);
        life & 1 == 0 || (id.tag() != 0 && id.tag() != tag_of(life >> 1))
    }

    /// The owner semaphore's value (checker view).
    pub fn sem_value(&self) -> u32 {
        self.sem_mirror[0].load(Plain::Relaxed)
    }

    /// `sem_postinit`'s value (checker view).
    pub fn sem_postinit_value(&self) -> u32 {
        self.sem_mirror[1].load(Plain::Relaxed)
    }

    /// Sets the owner semaphore's value directly, as a process that died between its
    /// `sem_wait` and anything else would leave it (scenario set-up).
    pub fn force_sem(&self, value: u32) {
        self.sem.store(value, Ordering::SeqCst);
        self.sem_mirror[0].store(value, Plain::Relaxed);
    }

    /// Holder of the init lock (process index + 1), or 0 (checker view; not for models'
    /// protocol decisions).
    pub fn init_lock_holder(&self) -> u32 {
        self.init_lock.load(Ordering::SeqCst)
    }

    /// Reports of kind `k` so far.
    pub fn problems(&self, k: ProblemKind) -> u64 {
        self.problems[k as usize].load(Plain::Relaxed)
    }

    /// How many `sem_post`s took a semaphore above 1 (non-strict use; strict panics).
    pub fn sem_overflows(&self) -> u64 {
        self.sem_overflows.load(Plain::Relaxed)
    }

    /// How many processes died at a crash point.
    pub fn crashes(&self) -> u64 {
        self.crashes.load(Plain::Relaxed)
    }

    /// Records that process `idx` entered a critical section of the owner lock; panics if
    /// another process is inside one.
    pub fn cs_enter(&self, idx: usize) {
        let prev = self.cs.fetch_or(1 << idx, Plain::Relaxed);
        assert!(
            prev & !(1 << idx) == 0,
            "mutual exclusion violated: process {idx} entered the owner lock's critical section \
             while processes {:#b} are inside",
            prev
        );
    }

    /// Records that process `idx` left its critical section.
    pub fn cs_exit(&self, idx: usize) {
        self.cs.fetch_and(!(1 << idx), Plain::Relaxed);
    }
}

fn index_of(pid: i32) -> Option<usize> {
    let i = pid.checked_sub(BASE_PID)?;
    (0..MAX_PROCS as i32).contains(&i).then_some(i as usize)
}

/// The start tag of incarnation `inc`.
pub fn tag_of(inc: u32) -> u32 {
    ProcId::start_tag(u64::from(inc))
}

/// The identity of incarnation `inc` of process `idx`.
pub fn id_of(idx: usize, inc: u32) -> ProcId {
    ProcId::new(BASE_PID + idx as i32, tag_of(inc))
}

/// One region and its world.
pub struct Sim<const S: usize, const D: usize> {
    /// The shared region, all zero to begin with.
    pub region: Region<S, D>,
    /// The simulated kernel.
    pub world: World,
}

impl<const S: usize, const D: usize> Default for Sim<S, D> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const S: usize, const D: usize> Sim<S, D> {
    /// A zeroed region in a fresh world. Under loom, create it inside `loom::model`.
    pub fn new() -> Self {
        Sim {
            region: Region::zeroed(),
            world: World::new(),
        }
    }

    /// A new `Arc`'d simulation (boxed on the heap, as loom models should keep it).
    pub fn shared() -> rt::Arc<Self> {
        rt::Arc::new(Self::new())
    }

    /// A simulation whose region was initialised by a process (index `MAX_PROCS - 1`, which
    /// then exits) with `limits` per device.
    pub fn initialised(limits: [u64; D]) -> rt::Arc<Self> {
        let sim = Self::shared();
        let setup = SimProc::spawn(&sim, MAX_PROCS - 1);
        let out = init::ensure_initialised(&sim.region, &setup, &params(limits), u64::MAX);
        assert_eq!(out, Ok(InitOutcome::Initialised));
        setup.exit();
        sim
    }
}

/// Init parameters with memory `limits`, SM limit 100 and priority 1.
pub fn params<const D: usize>(limits: [u64; D]) -> InitParams<D> {
    InitParams {
        limits,
        sm_limits: [100; D],
        priority: 1,
    }
}

/// A lock configuration for models: short logical deadlines in units of the handle's sleeps.
pub fn model_lock_cfg() -> LockConfig {
    LockConfig {
        deadline_ns: 1 << 20,
        orphan_grace_ns: 8,
        max_backoff_ns: 4,
    }
}

/// The platform of one incarnation of one simulated process, for one thread.
pub struct SimProc<const S: usize, const D: usize> {
    sim: rt::Arc<Sim<S, D>>,
    idx: usize,
    id: ProcId,
    /// Crash points passed so far.
    steps: Cell<u64>,
    /// The step at which to die (`u64::MAX`: none).
    crash_at: Cell<u64>,
    /// Logical clock.
    clock: Cell<u64>,
    dead: Cell<bool>,
}

impl<const S: usize, const D: usize> SimProc<S, D> {
    /// Starts a new incarnation of process `idx` (which must not be running): same pid, new
    /// start tag. Its kill switch is cleared.
    pub fn spawn(sim: &rt::Arc<Sim<S, D>>, idx: usize) -> Self {
        assert!(idx < MAX_PROCS);
        let w = &sim.world;
        let life = w.life[idx].load(Ordering::SeqCst);
        assert_eq!(life & 1, 0, "process {idx} is already running");
        let inc = (life >> 1) + 1;
        w.kill[idx].store(0, Ordering::SeqCst);
        w.life[idx].store(inc << 1 | 1, Ordering::SeqCst);
        w.life_mirror[idx].store(inc << 1 | 1, Plain::Relaxed);
        SimProc {
            sim: sim.clone(),
            idx,
            id: id_of(idx, inc),
            steps: Cell::new(0),
            crash_at: Cell::new(w.scheduled_crash[idx].swap(u64::MAX, Plain::Relaxed)),
            clock: Cell::new(0),
            dead: Cell::new(false),
        }
    }

    /// A handle for another thread of the same process (same identity, own clock and steps).
    pub fn same_process(&self) -> Self {
        SimProc {
            sim: self.sim.clone(),
            idx: self.idx,
            id: self.id,
            steps: Cell::new(0),
            crash_at: Cell::new(u64::MAX),
            clock: Cell::new(0),
            dead: Cell::new(false),
        }
    }

    /// The simulation.
    pub fn sim(&self) -> &Sim<S, D> {
        &self.sim
    }

    /// The shared region.
    pub fn region(&self) -> &Region<S, D> {
        &self.sim.region
    }

    /// The world.
    pub fn world(&self) -> &World {
        &self.sim.world
    }

    /// The process index.
    pub fn idx(&self) -> usize {
        self.idx
    }

    /// This incarnation's identity.
    pub fn id(&self) -> ProcId {
        self.id
    }

    /// Crash points passed so far.
    pub fn steps(&self) -> u64 {
        self.steps.get()
    }

    /// Dies at crash point number `step` (counting from 0, from now on as from the start).
    pub fn crash_at_step(&self, step: u64) {
        self.crash_at.set(step);
    }

    /// An explicit crash point.
    pub fn crash_point(&self) {
        assert!(
            !self.dead.get(),
            "process {} used the platform after its death (was an OwnerGuard dropped while \
             unwinding? hold it through with_owner_lock)",
            self.idx
        );
        let n = self.steps.get();
        self.steps.set(n + 1);
        let w = &self.sim.world;
        let killed = n == self.crash_at.get()
            || (w.killer_armed.load(Plain::Relaxed)
                && w.kill[self.idx].load(Ordering::SeqCst) != 0);
        if killed {
            w.crashes.fetch_add(1, Plain::Relaxed);
            self.die();
            panic::resume_unwind(Box::new(Crashed));
        }
    }

    /// What the kernel does when this process ends (normally or not): the window and the init
    /// lock are released, the critical section is left, and the process turns dead.
    fn die(&self) {
        let w = &self.sim.world;
        let bit = 1u32 << self.idx;
        self.dead.set(true);
        // Checker views first: a dead process stops counting before anyone can act on its death.
        w.life_mirror[self.idx].fetch_and(!1, Plain::Relaxed);
        w.cs.fetch_and(!bit, Plain::Relaxed);
        w.window.fetch_and(!bit, Ordering::SeqCst);
        let me = self.idx as u32 + 1;
        let _ = w
            .init_lock
            .compare_exchange(me, 0, Ordering::SeqCst, Ordering::SeqCst);
        w.life[self.idx].fetch_and(!1, Ordering::SeqCst);
    }

    /// Ends this incarnation normally (after `release_on_exit`, or without a slot).
    pub fn exit(self) {
        assert!(!self.dead.get(), "process {} exits twice", self.idx);
        self.die();
    }

    /// Ends this incarnation as SIGKILL would, here and now, without unwinding (the caller
    /// returns and touches nothing of the region afterwards).
    pub fn kill_now(&self) {
        self.sim.world.crashes.fetch_add(1, Plain::Relaxed);
        self.die();
    }

    /// Ends this incarnation while it holds `guard` (which is forgotten, not released).
    pub fn die_holding(&self, guard: OwnerGuard<'_, Self, S, D>) {
        core::mem::forget(guard);
        self.sim.world.crashes.fetch_add(1, Plain::Relaxed);
        self.die();
    }

    /// Runs `f` as this process; `None` if the process died at a crash point meanwhile. Any other
    /// panic propagates.
    pub fn run<R>(&self, f: impl FnOnce(&Self) -> R) -> Option<R> {
        match panic::catch_unwind(AssertUnwindSafe(|| f(self))) {
            Ok(r) => Some(r),
            Err(payload) if payload.is::<Crashed>() => None,
            Err(payload) => panic::resume_unwind(payload),
        }
    }

    /// Whether this incarnation died.
    pub fn is_dead(&self) -> bool {
        self.dead.get()
    }

    /// Acquires the owner lock, runs `f` inside the critical section (checking mutual exclusion
    /// and that the holder owns the token: semaphore 0, `owner_pid` ours), and releases. The
    /// guard is kept from unwinding, so a crash inside `f` leaves the lock held by a dead owner.
    pub fn with_owner_lock<R>(
        &self,
        cfg: &LockConfig,
        f: impl FnOnce(&OwnerGuard<'_, Self, S, D>) -> R,
    ) -> Result<R, LockError> {
        let guard = ManuallyDrop::new(lock::acquire(self.region(), self, cfg)?);
        self.check_holder();
        self.sim.world.cs_enter(self.idx);
        let r = f(&guard);
        self.check_holder();
        self.sim.world.cs_exit(self.idx);
        ManuallyDrop::into_inner(guard).release();
        Ok(r)
    }

    /// Panics unless this process holds the owner lock's token: the semaphore at 0 and
    /// `owner_pid` this identity.
    pub fn check_holder(&self) {
        let sem = self.sim.world.sem_value();
        let owner = self.region().raw_owner_pid().load(Ordering::Relaxed);
        assert!(
            sem == 0 && owner == self.id.0,
            "owner-lock holder invariant violated: process {} ({:#x}) holds the lock but the \
             semaphore is {sem} and owner_pid is {owner:#x}",
            self.idx,
            self.id.0
        );
    }

    /// [`init::ensure_initialised`] with this platform.
    pub fn ensure_initialised(
        &self,
        limits: [u64; D],
        timeout_ns: u64,
    ) -> Result<InitOutcome, InitError> {
        init::ensure_initialised(self.region(), self, &params(limits), timeout_ns)
    }

    fn sem_of(&self, sem: &RawSem) -> (&AtomicU32, usize) {
        let r = self.region();
        let w = &self.sim.world;
        if core::ptr::eq(sem, r.sem()) {
            (&w.sem, 0)
        } else if core::ptr::eq(sem, r.sem_postinit()) {
            (&w.sem_postinit, 1)
        } else {
            panic!("sem_t at {sem:p} is neither the region's sem nor its sem_postinit")
        }
    }

    fn try_sem_wait(&self, sem: &RawSem) -> bool {
        let (cell, i) = self.sem_of(sem);
        let v = cell.load(Ordering::Acquire);
        if v == 0 {
            return false;
        }
        let ok = cell
            .compare_exchange(v, v - 1, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if ok {
            self.sim.world.sem_mirror[i].fetch_sub(1, Plain::Relaxed);
        }
        ok
    }
}

impl<const S: usize, const D: usize> Platform for SimProc<S, D> {
    fn self_id(&self) -> ProcId {
        self.id
    }

    fn liveness(&self, id: ProcId) -> Liveness {
        self.crash_point();
        let Some(idx) = index_of(id.pid()) else {
            return Liveness::Dead;
        };
        let life = self.sim.world.life[idx].load(Ordering::Acquire);
        if life & 1 == 0 {
            Liveness::Dead
        } else if id.tag() == 0 || id.tag() == tag_of(life >> 1) {
            Liveness::Alive
        } else {
            Liveness::Dead
        }
    }

    fn now_ns(&self) -> u64 {
        self.clock.get()
    }

    fn sleep_ns(&self, ns: u64) {
        self.crash_point();
        self.clock.set(self.clock.get().saturating_add(ns.max(1)));
        rt::yield_now();
    }

    fn report(&self, problem: Problem) {
        self.sim.world.problems[ProblemKind::of(&problem) as usize].fetch_add(1, Plain::Relaxed);
    }

    fn sem_init(&self, sem: &RawSem, value: u32) -> bool {
        self.crash_point();
        let (cell, i) = self.sem_of(sem);
        cell.store(value, Ordering::Release);
        self.sim.world.sem_mirror[i].store(value, Plain::Relaxed);
        sem.raw_words()[0].store(u64::from(value), Ordering::Relaxed);
        sem.raw_words()[1].store(GLIBC_SEM_SHARED, Ordering::Relaxed);
        self.crash_point();
        true
    }

    fn sem_wait(&self, sem: &RawSem, timeout_ns: u64) -> SemWait {
        self.crash_point();
        let start = self.clock.get();
        let got = loop {
            if self.try_sem_wait(sem) {
                break true;
            }
            if self.clock.get().saturating_sub(start) >= timeout_ns {
                break false;
            }
            self.sleep_ns(1);
        };
        self.crash_point();
        if got {
            SemWait::Acquired
        } else {
            SemWait::TimedOut
        }
    }

    fn sem_post(&self, sem: &RawSem) {
        self.crash_point();
        let (cell, i) = self.sem_of(sem);
        // The mirror goes up before the semaphore (and, in `try_sem_wait`, down after it), so
        // on real threads it never reads below the semaphore: a taker's check cannot see a
        // post that is still in flight as a negative value.
        self.sim.world.sem_mirror[i].fetch_add(1, Plain::Relaxed);
        let prev = cell.fetch_add(1, Ordering::AcqRel);
        if prev >= 1 {
            self.sim.world.sem_overflows.fetch_add(1, Plain::Relaxed);
            panic!(
                "semaphore value exceeded 1: process {} posted a semaphore whose value was {prev}",
                self.idx
            );
        }
        self.crash_point();
    }

    fn sem_value(&self, sem: &RawSem) -> u32 {
        self.crash_point();
        self.sem_of(sem).0.load(Ordering::Acquire)
    }

    fn init_lock(&self, timeout_ns: u64) -> bool {
        self.crash_point();
        let me = self.idx as u32 + 1;
        let start = self.clock.get();
        let lock = &self.sim.world.init_lock;
        let got = loop {
            if lock
                .compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                break true;
            }
            if self.clock.get().saturating_sub(start) >= timeout_ns {
                break false;
            }
            self.sleep_ns(1);
        };
        self.crash_point();
        got
    }

    fn init_unlock(&self) {
        self.crash_point();
        let me = self.idx as u32 + 1;
        let was = self.sim.world.init_lock.swap(0, Ordering::Release);
        assert_eq!(
            was, me,
            "process {} released an init lock it did not hold",
            self.idx
        );
        self.crash_point();
    }

    fn window_enter(&self) {
        self.crash_point();
        self.sim
            .world
            .window
            .fetch_or(1 << self.idx, Ordering::SeqCst);
        self.crash_point();
    }

    fn window_exit(&self) {
        self.crash_point();
        self.sim
            .world
            .window
            .fetch_and(!(1 << self.idx), Ordering::SeqCst);
        self.crash_point();
    }

    fn window_held_by_other(&self) -> bool {
        self.crash_point();
        self.sim.world.window.load(Ordering::SeqCst) & !(1 << self.idx) != 0
    }
}
