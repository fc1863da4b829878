//! Region initialisation: exactly one initialiser, safe beside C peers, tolerant of crashes.
//!
//! The C original initialises under `lockf` on the region's bytes and publishes the magic last;
//! PR 155 elected its initialiser by CAS on the flag without the lock, so a crashed CAS winner left
//! the flag at "in progress" and everyone after it ran on an uninitialised region (bug B20). Here
//! both mechanisms are used together: the initialiser holds the same `lockf`
//! as C peers (they never see a half-written region, because they either hold the lock or check the
//! magic first) and moves the flag by CAS from what it observed to [`INIT_IN_PROGRESS`], then to
//! [`MAGIC`] with release ordering. A flag found at [`INIT_IN_PROGRESS`] while holding the lock
//! can only belong to an initialiser that died (the kernel released its lock), so the work is
//! redone. An initialised region costs one acquire load.

use crate::layout::{Region, INIT_IN_PROGRESS, MAGIC, MAJOR_VERSION, MINOR_VERSION};
use crate::platform::Platform;
use crate::sync::Ordering;

/// The values an initialiser writes, taken from its environment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InitParams<const DEVS: usize> {
    /// Memory limit per device in bytes (0 = unlimited).
    pub limits: [u64; DEVS],
    /// SM limit per device in percent (100 = unlimited).
    pub sm_limits: [u64; DEVS],
    /// `CUDA_TASK_PRIORITY` (default 1).
    pub priority: i32,
}

/// How [`ensure_initialised`] found the region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InitOutcome {
    /// Someone else had initialised it; their limits apply.
    AlreadyReady,
    /// This process initialised it (first, or after a crashed initialiser).
    Initialised,
}

/// Why the region could not be initialised; the caller runs degraded (limits enforced within
/// the process only) and says so.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InitError {
    /// The init lock stayed held past the deadline (a peer hung inside its initialisation).
    LockTimeout,
    /// `sem_init` failed on the region's semaphores.
    SemInit,
}

/// Whether the region is ready: the one acquire load of the fast path.
pub fn is_initialised<const S: usize, const D: usize>(region: &Region<S, D>) -> bool {
    region.initialized_flag.load(Ordering::Acquire) == MAGIC
}

/// Makes sure the region is initialised, initialising it from `params` if nobody has.
pub fn ensure_initialised<P: Platform, const S: usize, const D: usize>(
    region: &Region<S, D>,
    platform: &P,
    params: &InitParams<D>,
    lock_timeout_ns: u64,
) -> Result<InitOutcome, InitError> {
    if is_initialised(region) {
        return Ok(InitOutcome::AlreadyReady);
    }
    if !platform.init_lock(lock_timeout_ns) {
        return Err(InitError::LockTimeout);
    }
    let result = initialise_locked(region, platform, params);
    platform.init_unlock();
    result
}

/// The initialiser's work, with the init lock held.
fn initialise_locked<P: Platform, const S: usize, const D: usize>(
    region: &Region<S, D>,
    platform: &P,
    params: &InitParams<D>,
) -> Result<InitOutcome, InitError> {
    let flag = &region.initialized_flag;
    let mut observed = flag.load(Ordering::Acquire);
    loop {
        if observed == MAGIC {
            return Ok(InitOutcome::AlreadyReady);
        }
        // Anything else (0, a crashed initialiser's INIT_IN_PROGRESS) is ours to redo. The CAS
        // keeps out an initialiser that does not take the lock (PR 155 builds).
        match flag.compare_exchange(
            observed,
            INIT_IN_PROGRESS,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => break,
            Err(now) => observed = now,
        }
    }
    region.major_version.store(MAJOR_VERSION, Ordering::Relaxed);
    region.minor_version.store(MINOR_VERSION, Ordering::Relaxed);
    region.sm_init_flag.store(0, Ordering::Relaxed);
    for d in 0..D {
        region.limit[d].store(params.limits[d], Ordering::Relaxed);
        region.sm_limit[d].store(params.sm_limits[d], Ordering::Relaxed);
    }
    region.priority.store(params.priority, Ordering::Relaxed);
    region.utilization_switch.store(1, Ordering::Relaxed);
    region.recent_kernel.store(2, Ordering::Relaxed);
    region.proc_num.store(0, Ordering::Relaxed);
    region.owner_pid.store(0, Ordering::Relaxed);
    let sems_ok = platform.sem_init(&region.sem, 1) && platform.sem_init(&region.sem_postinit, 1);
    if !sems_ok {
        // Leave INIT_IN_PROGRESS: the next opener (under the lock) retries.
        return Err(InitError::SemInit);
    }
    flag.store(MAGIC, Ordering::Release);
    Ok(InitOutcome::Initialised)
}

/// Gives a v1.1 (L0) region the `sem_postinit` it never had (bug B1): v1.1 left those bytes
/// zero, and a zeroed glibc `sem_t` has value 0 and a process-private futex, so every waiter
/// would sleep its whole timeout. Done under the init lock; returns whether a repair was made.
pub fn repair_legacy_postinit<P: Platform, const S: usize, const D: usize>(
    region: &Region<S, D>,
    platform: &P,
    lock_timeout_ns: u64,
) -> Result<bool, InitError> {
    if region.sem_postinit.glibc_private() != 0 {
        return Ok(false);
    }
    if !platform.init_lock(lock_timeout_ns) {
        return Err(InitError::LockTimeout);
    }
    let repaired = region.sem_postinit.glibc_private() == 0;
    let ok = !repaired || platform.sem_init(&region.sem_postinit, 1);
    platform.init_unlock();
    if ok {
        Ok(repaired)
    } else {
        Err(InitError::SemInit)
    }
}

/// Devices whose limits in the region differ from what this process's environment asks for.
/// The region's values apply (only the initialiser's environment counts, as upstream); the
/// caller warns once per device so the mismatch is not silent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LimitMismatch {
    /// Bit `d` set: the memory limit of device `d` differs.
    pub memory: u32,
    /// Bit `d` set: the SM limit of device `d` differs.
    pub sm: u32,
}

/// Compares the region's limits with `params`.
pub fn limit_mismatch<const S: usize, const D: usize>(
    region: &Region<S, D>,
    params: &InitParams<D>,
) -> LimitMismatch {
    let mut m = LimitMismatch::default();
    for d in 0..D.min(32) {
        if region.limit[d].load(Ordering::Relaxed) != params.limits[d] {
            m.memory |= 1 << d;
        }
        if region.sm_limit[d].load(Ordering::Relaxed) != params.sm_limits[d] {
            m.sm |= 1 << d;
        }
    }
    m
}
