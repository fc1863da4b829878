//! The C API of HAMi-core's `multiprocess_memory_limit.h`, so that C code written against that
//! header (HAMi-core's own hooks, allocator and utilisation watcher, `shrreg_tool`) links against
//! this library instead, plus our own primitives under a `hami_` prefix.
//!
//! Every function here is `extern "C"`, with the C types of upstream's declarations, and:
//! - never unwinds into C: bodies use no indexing without a bound check, no `unwrap`, no
//!   overflowing arithmetic, and run inside the hooks' panic boundary (`hooks::guard`), where a
//!   panic becomes an error code;
//! - validates every argument: device indices against the region's 16 devices, pids against the
//!   slot table, pointers against NULL; a bad argument gives the documented error value, never an
//!   out-of-bounds access (upstream only logs and then indexes anyway, B25);
//! - never calls `exit`, and every wait has a deadline (upstream exits after ~310 s in
//!   `lock_shrreg` and waits forever for a live owner).
//!
//! Device numbering: `add_gpu_device_memory_usage`, `rm_gpu_device_memory_usage`,
//! `cuda_to_nvml_map` and the `hami_` memory functions take a CUDA ordinal and map it to the
//! region's (NVML) index with the hooks' own map ([`devices::region_index`]: by UUID once the
//! driver is initialised, else by `CUDA_VISIBLE_DEVICES` entry, an index or a UUID, else
//! identity), as upstream's add/rm do with its `cuda_to_nvml_map`. `nvml_to_cuda_map` is its
//! inverse. Every other function taking a `dev` indexes the region directly, as upstream's do.
//!
//! Where a function of upstream has a defect, ours keeps the signature and gives the defect a
//! defined outcome instead; each function's documentation (copied into `hami_shm.h`) says so.

use std::ffi::{c_char, c_int, c_uint, CStr, OsStr};
use std::num::NonZeroU64;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, TryLockError};

use hami_shm::admission;
use hami_shm::layout::{
    ProcSlot, SharedProcSlot, ABI_DEVS, ABI_SLOTS, MAJOR_VERSION, MINOR_VERSION, STATUS_RUNNING,
    STATUS_SUSPENDED,
};
use hami_shm::lock::{self, LockConfig, LockError, OwnerGuard};
use hami_shm::platform::{Liveness, Platform, SemWait};
use hami_shm::seqlock::{self, Kind};
use hami_shm::slots;

use crate::config::UtilPolicy;
use crate::hooks::{devices, guard as boundary};
use crate::log::{self, log_error, log_info, log_warn, Once};
use crate::platform::{monotonic_ns, LinuxPlatform};
use crate::runtime::{self, Runtime};

/// What the `hami_` functions return (as `int`): one value per meaning. These are our own
/// primitives (HAMi-core has no `hami_` functions and no named codes; its C API returns 0 or -1,
/// which the functions of its names here keep). -1, upstream's generic failure, stays with
/// `HAMI_REFUSED`, the refusal of `hami_reserve`, which is the analogue of upstream's failed
/// allocation; `HAMI_TIMEOUT` was -1 too until it got a value of its own, -5, so that a caller
/// can tell a refusal from a timeout by value.
#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum HamiStatus {
    /// Success.
    HAMI_OK = 0,
    /// `hami_reserve`: the request would take the device's usage over its limit; nothing
    /// reserved.
    HAMI_REFUSED = -1,
    /// An argument out of range (device, kind, timeout), no usable region, no slot for this
    /// process, or a corrupt semaphore; nothing was changed.
    HAMI_ERROR = -2,
    /// `hami_unlock_region`: this process does not hold the region lock; nothing was released.
    HAMI_NOT_HELD = -3,
    /// `hami_lock_region`: the calling thread already holds the region lock (it is not
    /// recursive).
    HAMI_ALREADY_HELD = -4,
    /// `hami_lock_region`: a live process held the region lock past the timeout.
    HAMI_TIMEOUT = -5,
}

use HamiStatus::{
    HAMI_ALREADY_HELD, HAMI_ERROR, HAMI_NOT_HELD, HAMI_OK, HAMI_REFUSED, HAMI_TIMEOUT,
};

impl From<HamiStatus> for c_int {
    fn from(s: HamiStatus) -> c_int {
        s as c_int
    }
}

/// What `cuda_to_nvml_map` and `nvml_to_cuda_map` return for a device with no counterpart
/// (`(unsigned)-1`, as upstream's `nvml_to_cuda_map`).
pub const HAMI_NO_DEVICE: u32 = u32::MAX;

/// How long `lock_shrreg` waits for the region lock before giving up (upstream: forever for a
/// live owner, `exit(-1)` after ~310 s otherwise).
pub const HAMI_LOCK_SHRREG_TIMEOUT_MS: i32 = 10_000;
/// How long `clear_proc_slot_nolock` waits for the region lock when the caller does not hold it.
pub const HAMI_CLEAR_LOCK_TIMEOUT_MS: i32 = 1_000;
/// How long `lock_postinit` waits for `sem_postinit` before returning 0 (upstream: 330 s).
pub const HAMI_POSTINIT_TIMEOUT_MS: i32 = 30_000;
/// How long `wait_status_all` polls for every other process to reach the status.
pub const HAMI_WAIT_STATUS_ALL_MS: i32 = 1_000;

/// The owner-lock guard of the ABI region.
type Guard = OwnerGuard<'static, LinuxPlatform, ABI_SLOTS, ABI_DEVS>;

// ---------------------------------------------------------------------------------------------
// Helpers.

/// Messages this module prints once per process.
static BAD_DEV: Once = Once::new();
static BAD_KIND: Once = Once::new();
static UNLOCK_NOT_HELD: Once = Once::new();
static POSTINIT_NOT_HELD: Once = Once::new();
static NO_NVML: Once = Once::new();
static NO_RUNTIME: Once = Once::new();
static NO_SLOT_FOR_PID: Once = Once::new();

/// The runtime (initialising it on first use). `None` inside our own initialisation, or if the
/// region could not be set up in time.
fn rt() -> Option<&'static Runtime> {
    let rt = runtime::get();
    if rt.is_none() && NO_RUNTIME.first() {
        log_warn!("the HAMi C API was called before the shared region could be set up; it returns its error values");
    }
    rt
}

fn getpid() -> i32 {
    // SAFETY: getpid has no preconditions and cannot fail.
    unsafe { libc::getpid() }
}

fn bad_dev(dev: c_int) {
    if BAD_DEV.first() {
        log_error!("device {dev} is out of range (0..{ABI_DEVS}); the call does nothing");
    }
}

/// A region device index given directly, validated.
fn region_dev(dev: c_int) -> Option<usize> {
    let d = usize::try_from(dev).ok().filter(|&d| d < ABI_DEVS);
    if d.is_none() {
        bad_dev(dev);
    }
    d
}

/// A CUDA ordinal mapped to the region's index as the hooks map it (validated there).
fn region_dev_of_cuda(rt: &Runtime, dev: c_int) -> Option<usize> {
    let d = devices::region_index(rt, dev);
    if d.is_none() {
        bad_dev(dev);
    }
    d
}

fn kind_of(kind: c_int) -> Option<Kind> {
    let k = Kind::from_c(kind);
    if k.is_none() && BAD_KIND.first() {
        log_error!(
            "memory type {kind} is not 0 (context), 1 (module) or 2 (data); the call does nothing"
        );
    }
    k
}

/// Our slot index (claimed on first use; re-validated, and renewed after fork).
fn own_index(rt: &'static Runtime) -> Option<usize> {
    rt.own_slot().filter(|&i| i < ABI_SLOTS)
}

fn own_slot(rt: &'static Runtime) -> Option<&'static SharedProcSlot> {
    own_index(rt).and_then(|i| rt.region.slot(i))
}

/// The slot of container pid `pid`: ours (claimed if need be) or the first in use with that pid.
fn slot_index_of_pid(rt: &'static Runtime, pid: i32) -> Option<usize> {
    if pid <= 0 {
        return None;
    }
    let own = own_index(rt);
    if pid == rt.platform.self_id().pid() {
        return own;
    }
    rt.region
        .live_range()
        .iter()
        .position(|s| s.pid_acquire() == pid)
}

/// Slots in use (pid set) whose owner is another process that is alive in our PID namespace.
fn live_peers(rt: &'static Runtime) -> impl Iterator<Item = (&'static SharedProcSlot, i32)> {
    let me = getpid();
    rt.region.live_range().iter().filter_map(move |s| {
        let owner = slots::slot_owner(s);
        let pid = owner.pid();
        (pid > 0 && pid != me && rt.platform.liveness(owner) == Liveness::Alive).then_some((s, pid))
    })
}

/// Renews the platform's cached identity in a forked child (the runtime does it when it next
/// looks for our slot; the lock and liveness paths must not wait for that, nor claim a slot,
/// which needs the lock).
fn fresh_identity(rt: &'static Runtime) {
    if rt.platform.self_id().pid() != getpid() {
        rt.platform.refresh_identity();
    }
}

fn ms_to_ns(ms: i32) -> u64 {
    u64::try_from(ms).unwrap_or(0).saturating_mul(1_000_000)
}

fn sleep_ms(ms: u64) {
    std::thread::sleep(std::time::Duration::from_millis(ms));
}

/// Epoch seconds from the coarse real-time clock (upstream's `last_kernel_time` unit).
fn epoch_seconds() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write; CLOCK_REALTIME_COARSE always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) };
    u64::try_from(ts.tv_sec).unwrap_or(0)
}

// ---------------------------------------------------------------------------------------------
// The region lock held across calls (lock_shrreg / unlock_shrreg).

/// The region lock as the C API holds it: not scoped, so the guard lives here between calls.
struct Held {
    guard: Guard,
    /// getpid() when acquired: a forked child inherits this value but not the lock.
    pid: i32,
    /// The thread that acquired it (to refuse a recursive acquisition instead of waiting on
    /// ourselves).
    thread: libc::pthread_t,
}

static HELD: Mutex<Option<Held>> = Mutex::new(None);
/// How long to wait for [`HELD`]'s mutex, which is held only for moments (it can stay locked
/// forever only in a child forked while another thread held it).
const HELD_MUTEX_WAIT_NS: u64 = 1_000_000_000;

/// [`HELD`], with a deadline; a guard inherited across fork is dropped without releasing (the
/// lock is the parent's, and a child does not inherit it).
fn held() -> Option<MutexGuard<'static, Option<Held>>> {
    let start = monotonic_ns();
    let mut slot = loop {
        match HELD.try_lock() {
            Ok(g) => break g,
            Err(TryLockError::Poisoned(p)) => break p.into_inner(),
            Err(TryLockError::WouldBlock) => {
                if monotonic_ns().saturating_sub(start) > HELD_MUTEX_WAIT_NS {
                    log_error!("the C API's lock state stayed busy for 1 s (a fork while another thread used it?); giving up");
                    return None;
                }
                std::thread::yield_now();
            }
        }
    };
    if slot.as_ref().is_some_and(|h| h.pid != getpid()) {
        if let Some(inherited) = slot.take() {
            // Dropping it would release the parent's lock (same identity in owner_pid until the
            // parent's release): forget it instead.
            std::mem::forget(inherited.guard);
        }
    }
    Some(slot)
}

fn lock_region(timeout_ns: u64) -> HamiStatus {
    let Some(rt) = rt() else {
        return HAMI_ERROR;
    };
    fresh_identity(rt);
    // SAFETY: pthread_self has no preconditions.
    let thread = unsafe { libc::pthread_self() };
    {
        let Some(slot) = held() else {
            return HAMI_ERROR;
        };
        if slot.as_ref().is_some_and(|h| {
            // SAFETY: pthread_equal compares two thread handles.
            let same = unsafe { libc::pthread_equal(h.thread, thread) };
            same != 0
        }) {
            return HAMI_ALREADY_HELD;
        }
    }
    let cfg = LockConfig {
        deadline_ns: timeout_ns,
        ..LockConfig::default()
    };
    match lock::acquire(rt.region, &rt.platform, &cfg) {
        Ok(guard) => {
            let Some(mut slot) = held() else {
                drop(guard);
                return HAMI_ERROR;
            };
            if let Some(stale) = slot.take() {
                // We hold the token now, so this entry no longer holds anything (the lock was
                // recovered from us while we stalled); releasing it would release ours.
                std::mem::forget(stale.guard);
            }
            *slot = Some(Held {
                guard,
                pid: getpid(),
                thread,
            });
            HAMI_OK
        }
        Err(LockError::Timeout) => HAMI_TIMEOUT,
        Err(LockError::SemFailed) => HAMI_ERROR,
    }
}

fn unlock_region() -> HamiStatus {
    let taken = match held() {
        Some(mut slot) => slot.take(),
        None => return HAMI_ERROR,
    };
    match taken {
        // Drop releases: CAS owner_pid from us to 0, and post only if that succeeded.
        Some(h) => {
            drop(h.guard);
            HAMI_OK
        }
        None => HAMI_NOT_HELD,
    }
}

// ---------------------------------------------------------------------------------------------
// Lifecycle.

/// Sets up this process's view of the shared region (open, validate, initialise if first) and
/// registers this process in a slot. Idempotent and cheap once done; in a forked child it
/// registers the child. Unlike upstream it never exits the process: if the region cannot be
/// used, the library logs why and accounts within the process only.
#[no_mangle]
pub extern "C" fn ensure_initialized() {
    boundary((), || {
        if let Some(rt) = rt() {
            let _ = rt.own_slot();
        }
    })
}

/// Takes the region lock (`sem` + `owner_pid`, compatible with C peers), recovering it from a
/// dead holder. Not scoped: held until `unlock_shrreg`, which any thread of this process may
/// call. Upstream waits forever for a live holder and calls `exit(-1)` after ~310 s otherwise;
/// this waits at most `HAMI_LOCK_SHRREG_TIMEOUT_MS`, then logs an error and returns **without
/// the lock** (use `hami_lock_region` to learn the outcome). A recursive call from the thread
/// that holds it returns at once (still held) with an error log.
#[no_mangle]
pub extern "C" fn lock_shrreg() {
    boundary((), || {
        match lock_region(ms_to_ns(HAMI_LOCK_SHRREG_TIMEOUT_MS)) {
            HAMI_OK => {}
            HAMI_ALREADY_HELD => log_error!(
                "lock_shrreg: this thread already holds the region lock; not waiting on itself"
            ),
            HAMI_TIMEOUT => log_error!(
                "lock_shrreg: the region lock stayed held by a live process for {} ms; \
                 continuing WITHOUT it (upstream would exit)",
                HAMI_LOCK_SHRREG_TIMEOUT_MS
            ),
            _ => log_error!("lock_shrreg: the region lock is unusable; continuing without it"),
        }
    })
}

/// Releases the region lock taken by `lock_shrreg`/`hami_lock_region` in this process. Upstream
/// posts the semaphore unconditionally, so an unlock without a lock lets two processes in; this
/// releases only a lock this process holds (otherwise it logs a warning and does nothing).
#[no_mangle]
pub extern "C" fn unlock_shrreg() {
    boundary((), || {
        if unlock_region() == HAMI_NOT_HELD && UNLOCK_NOT_HELD.first() {
            log_warn!(
                "unlock_shrreg: this process does not hold the region lock; nothing released"
            );
        }
    })
}

static POSTINIT_HOLDER: AtomicI32 = AtomicI32::new(0);

/// Takes `sem_postinit`, which serialises host-pid discovery among the region's processes.
/// Returns 1 when acquired, 0 when it gave up: after `HAMI_POSTINIT_TIMEOUT_MS` (upstream:
/// 330 s), or at once if there is no usable region. The semaphore has no owner record, so a
/// holder that died keeps it (B18): waiters then give up after the bound.
#[no_mangle]
pub extern "C" fn lock_postinit() -> c_int {
    boundary(0, || {
        let Some(rt) = rt() else {
            return 0;
        };
        let sem = rt.region.sem_postinit();
        let start = monotonic_ns();
        let bound = ms_to_ns(HAMI_POSTINIT_TIMEOUT_MS);
        loop {
            let before = monotonic_ns();
            let left = bound.saturating_sub(before.saturating_sub(start));
            if left == 0 {
                log_error!(
                    "lock_postinit: sem_postinit stayed taken for {} ms (its holder may have \
                     died); skipping host pid detection",
                    HAMI_POSTINIT_TIMEOUT_MS
                );
                return 0;
            }
            match rt.platform.sem_wait(sem, left.min(1_000_000_000)) {
                SemWait::Acquired => {
                    POSTINIT_HOLDER.store(getpid(), Ordering::Relaxed);
                    return 1;
                }
                SemWait::TimedOut => {
                    // An interrupted wait returns early: back off instead of spinning (B19).
                    if monotonic_ns().saturating_sub(before) < 1_000_000 {
                        sleep_ms(1);
                    }
                }
                SemWait::Failed => {
                    log_error!("lock_postinit: sem_postinit is unusable (corrupt region)");
                    return 0;
                }
            }
        }
    })
}

/// Releases `sem_postinit` if this process took it with `lock_postinit`; otherwise does nothing
/// (upstream posts unconditionally, which can let two processes in).
#[no_mangle]
pub extern "C" fn unlock_postinit() {
    boundary((), || {
        let me = getpid();
        let ours = POSTINIT_HOLDER
            .compare_exchange(me, 0, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok();
        match rt() {
            Some(rt) if ours => rt.platform.sem_post(rt.region.sem_postinit()),
            _ => {
                if !ours && POSTINIT_NOT_HELD.first() {
                    log_warn!("unlock_postinit: this process does not hold sem_postinit; nothing released");
                }
            }
        }
    })
}

/// Frees the slots of dead processes (at most 16 per call), zeroing their usage, and returns 1
/// if any was freed, else 0. With `do_clear == 0` it only zeroes usage that exited C peers left
/// in free slots (returning 1 if there was any). Upstream *compacts* the table, moving other
/// processes' slots under them (B3-B6), and is called without the lock (B4); ours never moves a
/// slot. The caller should hold the region lock (`lock_shrreg`); if this process does not, the
/// function takes it itself for at most `HAMI_CLEAR_LOCK_TIMEOUT_MS` (0 if it could not).
#[no_mangle]
pub extern "C" fn clear_proc_slot_nolock(do_clear: c_int) -> c_int {
    boundary(0, || {
        let Some(rt) = rt() else {
            return 0;
        };
        fresh_identity(rt);
        {
            let Some(slot) = held() else {
                return 0;
            };
            if let Some(h) = slot.as_ref() {
                return clear_with(rt, &h.guard, do_clear);
            }
        }
        let cfg = LockConfig {
            deadline_ns: ms_to_ns(HAMI_CLEAR_LOCK_TIMEOUT_MS),
            ..LockConfig::default()
        };
        match rt.with_owner_lock(&cfg, |g| clear_with(rt, g, do_clear)) {
            Ok(r) => r,
            Err(e) => {
                log_warn!("clear_proc_slot_nolock: could not take the region lock ({e:?}); nothing cleared");
                0
            }
        }
    })
}

fn clear_with(
    rt: &'static Runtime,
    guard: &OwnerGuard<'_, LinuxPlatform, ABI_SLOTS, ABI_DEVS>,
    do_clear: c_int,
) -> c_int {
    if do_clear != 0 {
        return c_int::from(slots::reap(rt.region, &rt.platform, guard) > 0);
    }
    let mut cleaned = false;
    for s in rt.region.live_range() {
        if s.pid_acquire() == 0 && s.has_recorded_usage() {
            seqlock::force_zero(s);
            cleaned = true;
        }
    }
    c_int::from(cleaned)
}

// ---------------------------------------------------------------------------------------------
// Memory accounting.

fn record(pid: i32, dev: c_int, usage: usize, kind: c_int, add: bool) -> c_int {
    let Some(rt) = rt() else {
        return -1;
    };
    let (Some(d), Some(k)) = (region_dev_of_cuda(rt, dev), kind_of(kind)) else {
        return -1;
    };
    let Some(i) = slot_index_of_pid(rt, pid) else {
        if NO_SLOT_FOR_PID.first() {
            log_warn!("no slot in the shared region for pid {pid}; usage not recorded (said once)");
        }
        return -1;
    };
    let bytes = usage as u64;
    if add {
        let recorded =
            rt.as_slot_writer(|| admission::record(rt.region, &rt.platform, i, d, k, bytes));
        if recorded.is_err() {
            log_warn!(
                "add_gpu_device_memory_usage of {bytes} bytes on device {dev} for pid {pid} \
                 refused: the sum with what the slot holds overflows 64 bits; nothing changed"
            );
            return -1;
        }
    } else {
        rt.as_slot_writer(|| admission::release(rt.region, &rt.platform, i, d, k, bytes));
    }
    0
}

/// Records `usage` bytes of `kind` (upstream's `type`: 0 context, 1 module, 2 data) on CUDA device `dev` in the slot
/// of container pid `pid` (ours, or another process's found by pid). Returns 0, or -1 if the pid
/// has no slot or an argument is out of range. As upstream it records without checking the
/// limit, so two callers can together exceed it (B11): use `hami_reserve` to admit.
#[no_mangle]
pub extern "C" fn add_gpu_device_memory_usage(
    pid: i32,
    dev: c_int,
    usage: usize,
    kind: c_int,
) -> c_int {
    boundary(-1, || record(pid, dev, usage, kind, true))
}

/// Removes `usage` bytes of `kind` on CUDA device `dev` from the slot of `pid`. Returns 0, or -1
/// as `add_gpu_device_memory_usage`. A removal of more than was recorded stops at 0 (logged
/// once) instead of wrapping around to 2^64 as upstream's does.
#[no_mangle]
pub extern "C" fn rm_gpu_device_memory_usage(
    pid: i32,
    dev: c_int,
    usage: usize,
    kind: c_int,
) -> c_int {
    boundary(-1, || record(pid, dev, usage, kind, false))
}

fn usage_of(dev: c_int) -> u64 {
    match (rt(), region_dev(dev)) {
        (Some(rt), Some(d)) => rt.usage(d),
        _ => 0,
    }
}

/// Bytes in use on region device `dev` by all processes that hold a slot; 0 for a bad `dev`.
/// Upstream also counts exited processes' leftovers and spins forever on a slot whose writer
/// died mid-update (B7, B8); ours does neither.
#[no_mangle]
pub extern "C" fn get_gpu_memory_usage(dev: c_int) -> usize {
    boundary(0, || usage_of(dev) as usize)
}

/// Same as `get_gpu_memory_usage`, as `uint64_t`.
#[no_mangle]
pub extern "C" fn get_current_device_memory_usage(dev: c_int) -> u64 {
    boundary(0, || usage_of(dev))
}

/// The memory limit of region device `dev` in bytes (0 = unlimited); 0 for a bad `dev`.
#[no_mangle]
pub extern "C" fn get_current_device_memory_limit(dev: c_int) -> u64 {
    boundary(0, || match (rt(), region_dev(dev)) {
        (Some(rt), Some(d)) => rt.region.limit(d).map_or(0, NonZeroU64::get),
        _ => 0,
    })
}

/// Sets the memory limit of region device `dev` for every process of the region. Returns 0, or
/// -1 for a bad `dev` (upstream writes out of bounds).
#[no_mangle]
pub extern "C" fn set_current_device_memory_limit(dev: c_int, newlimit: usize) -> c_int {
    boundary(-1, || match (rt(), region_dev(dev)) {
        (Some(rt), Some(d)) => {
            log_info!("device {d}: memory limit set to {newlimit} bytes");
            rt.region.set_limit(d, newlimit as u64);
            0
        }
        _ => -1,
    })
}

/// Sum of the NVML-reported usage (`monitorused`) of region device `dev` over the slots in use;
/// 0 for a bad `dev`.
#[no_mangle]
pub extern "C" fn get_current_device_memory_monitor(dev: c_int) -> u64 {
    boundary(0, || match (rt(), region_dev(dev)) {
        (Some(rt), Some(d)) => rt
            .region
            .live_range()
            .iter()
            .filter(|s| s.pid() != 0)
            .map(|s| s.monitor_used(d))
            .fold(0u64, u64::saturating_add),
        _ => 0,
    })
}

/// The slot in use whose host pid is `hostpid` (> 0).
fn slot_of_hostpid(rt: &'static Runtime, hostpid: i32) -> Option<&'static SharedProcSlot> {
    if hostpid <= 0 {
        return None;
    }
    rt.region
        .live_range()
        .iter()
        .find(|s| s.pid_acquire() != 0 && s.hostpid_acquire() == hostpid)
}

/// Stores the NVML-reported usage of region device `dev` into the slot whose host pid is
/// `hostpid`. Returns 1 if found, 0 otherwise (also for `hostpid <= 0`, which upstream would
/// match against every slot whose host pid is still unknown, and for a bad `dev`).
#[no_mangle]
pub extern "C" fn set_gpu_device_memory_monitor(hostpid: i32, dev: c_int, monitor: usize) -> c_int {
    boundary(0, || {
        let (Some(rt), Some(d)) = (rt(), region_dev(dev)) else {
            return 0;
        };
        match slot_of_hostpid(rt, hostpid) {
            Some(s) => {
                s.set_monitor_used(d, monitor as u64);
                1
            }
            None => 0,
        }
    })
}

/// Stores the SM utilisation (percent) of region device `dev` into the slot whose host pid is
/// `hostpid`. Returns 1 if found, 0 otherwise (as `set_gpu_device_memory_monitor`).
#[no_mangle]
pub extern "C" fn set_gpu_device_sm_utilization(
    hostpid: i32,
    dev: c_int,
    sm_util: c_uint,
) -> c_int {
    boundary(0, || {
        let (Some(rt), Some(d)) = (rt(), region_dev(dev)) else {
            return 0;
        };
        match slot_of_hostpid(rt, hostpid) {
            Some(s) => {
                s.set_sm_util(d, u64::from(sm_util));
                1
            }
            None => 0,
        }
    })
}

/// Zeroes `monitorused` and `sm_util` of every slot and device, as upstream's watcher does before
/// each sampling round (so every process's watcher erases the others' samples, B32: that is the
/// caller's algorithm, kept for compatibility). Returns 1 (0 without a region).
#[no_mangle]
pub extern "C" fn init_gpu_device_utilization() -> c_int {
    boundary(0, || {
        let Some(rt) = rt() else {
            return 0;
        };
        for s in rt.region.live_range() {
            s.clear_samples();
        }
        1
    })
}

// ---------------------------------------------------------------------------------------------
// SM limits.

/// The SM limit of region device `dev` in percent; -1 for a bad `dev` (upstream reads out of
/// bounds).
#[no_mangle]
pub extern "C" fn get_current_device_sm_limit(dev: c_int) -> c_int {
    boundary(-1, || match (rt(), region_dev(dev)) {
        (Some(rt), Some(d)) => c_int::try_from(rt.region.sm_limit(d)).unwrap_or(c_int::MAX),
        _ => -1,
    })
}

/// Multiplies the SM limit of region device `dev` by `scale`, once per region (the first call of
/// any process wins, by CAS on `sm_init_flag`; later calls return 0 and change nothing).
/// Returns 0, or -1 for a bad `dev` or a `scale` below 1.
#[no_mangle]
pub extern "C" fn set_current_device_sm_limit_scale(dev: c_int, scale: c_int) -> c_int {
    boundary(-1, || {
        let (Some(rt), Some(d)) = (rt(), region_dev(dev)) else {
            return -1;
        };
        let Ok(scale) = u64::try_from(scale) else {
            return -1;
        };
        if scale == 0 {
            return -1;
        }
        if rt.region.scale_sm_limit_once(d, scale) {
            log_info!("device {d}: SM limit multiplied by {scale}");
        }
        0
    })
}

// ---------------------------------------------------------------------------------------------
// Host pid.

/// Records `hostpid` (the pid NVML reports for this process; 0 = unknown) in this process's slot
/// and zeroes its NVML-reported usage. Returns 0, or -1 if this process has no slot or
/// `hostpid < 0`. Upstream then calls `setspec` to size its SM limiter; ours sizes itself from
/// measurement and needs no such step, so nothing else happens.
#[no_mangle]
pub extern "C" fn set_host_pid(hostpid: c_int) -> c_int {
    boundary(-1, || {
        let Some(rt) = rt() else {
            return -1;
        };
        if hostpid < 0 {
            return -1;
        }
        let Some(slot) = own_slot(rt) else {
            log_error!("set_host_pid: this process has no slot in the shared region");
            return -1;
        };
        slot.set_hostpid(hostpid);
        host_pid_recorded(slot, hostpid);
        0
    })
}

/// After `hostpid` was written into our `slot` (by `set_host_pid` or the hooks' discovery):
/// zeroes the slot's NVML-reported usage and logs it.
pub(crate) fn host_pid_recorded(slot: &SharedProcSlot, hostpid: i32) {
    slot.clear_monitor_usage();
    log_info!("host pid of this process: {hostpid}");
}

/// Returns 0 and does nothing else. Upstream sets its process-local `pidfound` here when the
/// slot carries a host pid, and its SM limiter waits for that flag; ours does not wait for a
/// host pid (it throttles from the first launch), so there is nothing to note. Kept so that C
/// callers link.
#[no_mangle]
pub extern "C" fn update_host_pid() -> c_int {
    0
}

/// The slot in use whose host pid is `hostpid` (a pointer into the shared region, valid for the
/// life of the process), or NULL if none or `hostpid <= 0`. The slot may be freed and reused by
/// another process at any time; hold the region lock while using it, as upstream's watcher does.
#[no_mangle]
pub extern "C" fn find_proc_by_hostpid(hostpid: c_int) -> *mut ProcSlot<ABI_DEVS> {
    boundary(std::ptr::null_mut(), || {
        match rt().and_then(|rt| slot_of_hostpid(rt, hostpid)) {
            // The region is atomics only: C writes through this pointer are like a peer's.
            Some(s) => s as *const SharedProcSlot as *mut SharedProcSlot,
            None => std::ptr::null_mut(),
        }
    })
}

// ---------------------------------------------------------------------------------------------
// Kernel launches, priority and the utilisation switch.

/// The last second this process wrote to `last_kernel_time`.
static LAST_KERNEL_SECOND: AtomicU64 = AtomicU64::new(0);
/// Records a kernel launch: raises the region's `last_kernel_time` (epoch seconds) to now, at
/// most once per `RECORD_KERNEL_INTERVAL` seconds per process. The region's value only grows
/// (upstream's initialiser stores a possibly older value unconditionally).
#[no_mangle]
pub extern "C" fn pre_launch_kernel() {
    boundary((), || {
        if let Some(rt) = rt() {
            record_kernel_launch(rt);
        }
    })
}

/// `pre_launch_kernel` for the launch hooks: the coarse real-time clock (read in the vDSO, no
/// system call), one relaxed load, and a store into the region at most once per interval.
pub(crate) fn record_kernel_launch(rt: &Runtime) {
    let now = epoch_seconds();
    let last = LAST_KERNEL_SECOND.load(Ordering::Relaxed);
    if now.saturating_sub(last) < rt.config.kernel_interval_s {
        return;
    }
    if LAST_KERNEL_SECOND
        .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
        .is_err()
    {
        return;
    }
    rt.region.note_kernel_time(now);
}

/// The region's `recent_kernel` (the priority gate HAMi's monitor also writes); 0 without a
/// region.
#[no_mangle]
pub extern "C" fn get_recent_kernel() -> c_int {
    boundary(0, || rt().map_or(0, |rt| rt.region.recent_kernel()))
}

/// Stores `value` into the region's `recent_kernel`. Returns 0 (-1 without a region).
#[no_mangle]
pub extern "C" fn set_recent_kernel(value: c_int) -> c_int {
    boundary(-1, || match rt() {
        Some(rt) => {
            rt.region.set_recent_kernel(value);
            0
        }
        None => -1,
    })
}

/// The region's task priority (`CUDA_TASK_PRIORITY` of the initialiser); 1 without a region.
#[no_mangle]
pub extern "C" fn get_current_priority() -> c_int {
    boundary(1, || rt().map_or(1, |rt| rt.region.priority()))
}

/// -1: not read yet; else what `set_env_utilization_switch` returned last (0, 1 or 2).
static ENV_UTIL_SWITCH: AtomicI32 = AtomicI32::new(-1);

fn env_util_switch(rt: Option<&'static Runtime>) -> i32 {
    let v = ENV_UTIL_SWITCH.load(Ordering::Relaxed);
    if v >= 0 {
        return v;
    }
    let v = match rt.map(|rt| rt.config.util_policy) {
        Some(UtilPolicy::Force) => 1,
        Some(UtilPolicy::Disable) => 2,
        _ => 0,
    };
    ENV_UTIL_SWITCH.store(v, Ordering::Relaxed);
    v
}

/// Whether the SM limiter is on: 1 if `GPU_CORE_UTILIZATION_POLICY` is force, 0 if disable,
/// otherwise the region's `utilization_switch` (toggled by HAMi's monitor).
#[no_mangle]
pub extern "C" fn get_utilization_switch() -> c_int {
    boundary(0, || {
        let rt = rt();
        match env_util_switch(rt) {
            1 => 1,
            2 => 0,
            _ => rt.map_or(0, |rt| rt.region.utilization_switch()),
        }
    })
}

/// Reads `GPU_CORE_UTILIZATION_POLICY` from the environment now: 1 for `force`/`FORCE`, 2 for
/// `disable`/`DISABLE`, 0 otherwise; `get_utilization_switch` follows the last value read.
#[no_mangle]
pub extern "C" fn set_env_utilization_switch() -> c_int {
    boundary(0, || {
        let v = match std::env::var_os(crate::config::UTIL_POLICY) {
            Some(s) if s == "force" || s == "FORCE" => 1,
            Some(s) if s == "disable" || s == "DISABLE" => 2,
            _ => 0,
        };
        ENV_UTIL_SWITCH.store(v, Ordering::Relaxed);
        v
    })
}

// ---------------------------------------------------------------------------------------------
// Suspend/resume and inspection.

/// Moves every other live process from status `from` to `to`; sends `sig` to the C peers among
/// them (slots without our start tag), whose handlers set the same status.
fn change_status_all(from: i32, to: i32, sig: c_int) {
    let Some(rt) = rt() else {
        return;
    };
    fresh_identity(rt);
    for (s, pid) in live_peers(rt) {
        let _ = s.change_status(from, to);
        if slots::slot_owner(s).tag() == 0 {
            log_info!("sending signal {sig} to {pid}");
            // SAFETY: kill with a positive pid signals that one process only.
            unsafe { libc::kill(pid, sig) };
        }
    }
}

/// Asks every other process of the region to suspend (status 2). Only processes alive in our
/// PID namespace are touched, never pid 0 (upstream's `kill(0, ..)` on a free slot signals the
/// caller's whole process group, B28), never this process. Our processes install no SIGUSR2
/// handler (it would replace the application's), so their status is set directly in their
/// slot; C HAMi-core peers also get SIGUSR2, as upstream sends.
#[no_mangle]
pub extern "C" fn suspend_all() {
    boundary((), || {
        change_status_all(STATUS_RUNNING, STATUS_SUSPENDED, libc::SIGUSR2)
    })
}

/// The reverse of `suspend_all` (status 1; SIGUSR1 to C peers), with the same safeguards.
#[no_mangle]
pub extern "C" fn resume_all() {
    boundary((), || {
        change_status_all(STATUS_SUSPENDED, STATUS_RUNNING, libc::SIGUSR1)
    })
}

/// 1 if this process's slot has status `status`, 0 if not, -1 if it has no slot. Does not wait
/// (callers loop with a sleep, as upstream's `ENSURE_RUNNING` does).
#[no_mangle]
pub extern "C" fn wait_status_self(status: c_int) -> c_int {
    boundary(-1, || match rt().and_then(own_slot) {
        Some(s) => c_int::from(s.status_acquire() == status),
        None => -1,
    })
}

/// 1 once every other live process of the region has status `status`, 0 if that did not happen
/// within `HAMI_WAIT_STATUS_ALL_MS` (polled every 10 ms). Free slots and dead processes do not
/// count (upstream's never converges on them, B3a).
#[no_mangle]
pub extern "C" fn wait_status_all(status: c_int) -> c_int {
    boundary(0, || {
        let Some(rt) = rt() else {
            return 0;
        };
        let start = monotonic_ns();
        loop {
            if live_peers(rt).all(|(s, _)| s.status_acquire() == status) {
                return 1;
            }
            if monotonic_ns().saturating_sub(start) >= ms_to_ns(HAMI_WAIT_STATUS_ALL_MS) {
                return 0;
            }
            sleep_ms(10);
        }
    })
}

/// Logs (at Info level, `LIBCUDA_LOG_LEVEL=3`) the region's processes: pid, host pid, status,
/// and per device with anything recorded the SM utilisation, NVML-reported and recorded usage.
#[no_mangle]
pub extern "C" fn print_all() {
    boundary((), || {
        let Some(rt) = rt() else {
            return;
        };
        if !log::enabled(log::Level::Info) {
            return;
        }
        let live = rt.region.live_range();
        log_info!("Total process: {}", live.len());
        for (i, s) in live.iter().enumerate() {
            let pid = s.pid();
            if pid == 0 {
                continue;
            }
            log_info!(
                "slot {i}: process {pid} hostPid: {}, status: {}",
                s.hostpid(),
                s.status()
            );
            for d in 0..ABI_DEVS {
                let (record, sm, monitor) = (s.recorded_total(d), s.sm_util(d), s.monitor_used(d));
                if record != 0 || sm != 0 || monitor != 0 {
                    log_info!("  device {d}: sm: {sm}, memory: {monitor}, record: {record}");
                }
            }
        }
    })
}

/// SIGKILLs every other process of the region that is alive in our PID namespace and returns how
/// many were signalled (upstream has no caller; it kills every slot's pid, including pid 0 =
/// its own process group, itself, and pids of other namespaces).
#[no_mangle]
pub extern "C" fn active_oom_killer() -> c_int {
    boundary(0, || {
        let Some(rt) = rt() else {
            return 0;
        };
        let mut n: c_int = 0;
        for (_, pid) in live_peers(rt) {
            log_warn!("active_oom_killer: killing {pid}");
            // SAFETY: kill with a positive pid signals that one process only.
            if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
                n = n.saturating_add(1);
            }
        }
        n
    })
}

// ---------------------------------------------------------------------------------------------
// Miscellaneous.

/// The region layout's major version this library writes (1).
#[no_mangle]
pub extern "C" fn shrreg_major_version() -> c_int {
    MAJOR_VERSION as c_int
}

/// The region layout's minor version this library writes (2).
#[no_mangle]
pub extern "C" fn shrreg_minor_version() -> c_int {
    MINOR_VERSION as c_int
}

/// Writes the device count (`device_num`) and every NVML device's UUID into the region, as the
/// hooks publish them: each 96-byte entry holds the UUID text (at most 95 bytes) and zeros after
/// it, which HAMi's monitor compares whole. Returns 0, or -1 without NVML, writing nothing
/// (upstream returns NVML's error code there, also non-zero; it is not kept here).
#[no_mangle]
pub extern "C" fn init_device_info() -> c_int {
    boundary(-1, || {
        let Some(rt) = rt() else {
            return -1;
        };
        match devices::record_uuids(rt) {
            Some(n) => {
                log_info!("init_device_info: {n} devices recorded");
                0
            }
            None => {
                if NO_NVML.first() {
                    log_warn!("init_device_info: NVML is not available; device UUIDs not recorded");
                }
                -1
            }
        }
    })
}

/// The region (NVML) index of CUDA device `cudadev`, mapped as the hooks map it (by UUID, else by
/// `CUDA_VISIBLE_DEVICES` entry, an index or a UUID, else identity), or `(unsigned)-1`
/// (`HAMI_NO_DEVICE`) when it has none below 16. Upstream indexes an array filled from
/// `CUDA_VISIBLE_DEVICES` indices only (a UUID entry became 0) and does not check `cudadev`.
#[no_mangle]
pub extern "C" fn cuda_to_nvml_map(cudadev: c_uint) -> c_uint {
    map_device(cudadev, |rt, d| {
        devices::nvml_index(rt, c_int::try_from(d).ok()?)
    })
}

/// The lowest CUDA device that `cuda_to_nvml_map` maps to NVML device `nvmldev`, or
/// `(unsigned)-1` (`HAMI_NO_DEVICE`) when none does (the GPU is not visible to CUDA here), as
/// upstream. The CUDA devices searched are the driver's count once it is initialised, else as
/// many as `CUDA_VISIBLE_DEVICES` lists, else as many as NVML has (upstream: NVML's count).
#[no_mangle]
pub extern "C" fn nvml_to_cuda_map(nvmldev: c_uint) -> c_uint {
    map_device(nvmldev, devices::ordinal_of)
}

/// `map` applied to device `dev`, or `HAMI_NO_DEVICE` (also without a region).
fn map_device(dev: c_uint, map: impl FnOnce(&'static Runtime, usize) -> Option<usize>) -> c_uint {
    boundary(HAMI_NO_DEVICE, || {
        rt().zip(usize::try_from(dev).ok())
            .and_then(|(rt, d)| map(rt, d))
            .and_then(|m| c_uint::try_from(m).ok())
            .unwrap_or(HAMI_NO_DEVICE)
    })
}

/// Reads `KEY=VALUE` lines from `filename` and **sets them in the process environment**
/// (`setenv(KEY, VALUE, 1)`), which is this function's documented purpose upstream (HAMi's
/// `/overrideEnv`); like any `setenv`, it must not race with other threads reading the
/// environment. Blank lines and `#` comments are skipped, and a line without `=` is skipped with
/// a warning (upstream stops reading there); entries with a NUL byte are skipped. Returns 0
/// (also for a missing file, as upstream), or -1 for a NULL `filename` or an unreadable file.
/// The library's own configuration is not affected: it layers `/overrideEnv` itself.
///
/// # Safety
///
/// `filename` must be NULL or point to a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn load_env_from_file(filename: *mut c_char) -> c_int {
    if filename.is_null() {
        return -1;
    }
    // SAFETY: the caller passes a NUL-terminated string (see # Safety).
    let path = unsafe { CStr::from_ptr(filename) };
    let path = Path::new(OsStr::from_bytes(path.to_bytes()));
    boundary(-1, || {
        let (pairs, errors) = crate::config::load_override_file(path);
        crate::config::log_diagnostics(&errors);
        if errors.iter().any(|e| {
            matches!(
                e.kind,
                crate::config::ConfigErrorKind::OverrideUnreadable { .. }
            )
        }) {
            return -1;
        }
        for (key, value) in pairs {
            if key.is_empty() || key.contains(['=', '\0']) || value.contains('\0') {
                continue;
            }
            log_info!("SET {key} to {value}");
            std::env::set_var(&key, &value);
        }
        0
    })
}

/// 0 if `s1` and `s2` are equal ignoring ASCII case, else 1 (also when either is NULL).
///
/// # Safety
///
/// Each pointer must be NULL or point to a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn comparelwr(s1: *const c_char, s2: *mut c_char) -> c_int {
    if s1.is_null() || s2.is_null() {
        return 1;
    }
    // SAFETY: `s1` is non-null, so a NUL-terminated string (see # Safety).
    let a = unsafe { CStr::from_ptr(s1) };
    // SAFETY: `s2` is non-null, so a NUL-terminated string (see # Safety).
    let b = unsafe { CStr::from_ptr(s2) };
    c_int::from(!a.to_bytes().eq_ignore_ascii_case(b.to_bytes()))
}

// ---------------------------------------------------------------------------------------------
// Our primitives.

/// Reserves `bytes` of `kind` (0 context, 1 module, 2 data) on CUDA device `dev` for this
/// process, atomically against the device's limit across all processes (reserve, check the
/// aggregate, roll back on excess; usage of dead processes is reclaimed when it stands in the
/// way). Returns `HAMI_OK` (0) when admitted, `HAMI_REFUSED` (-1) when it would exceed the
/// limit (nothing reserved), `HAMI_ERROR` (-2) for a bad argument or no slot. Call it *before*
/// allocating; upstream's check-then-add lets concurrent allocations overshoot (B11).
#[no_mangle]
pub extern "C" fn hami_reserve(dev: c_int, bytes: usize, kind: c_int) -> c_int {
    boundary(HAMI_ERROR, || {
        let Some(rt) = rt() else {
            return HAMI_ERROR;
        };
        let (Some(d), Some(k)) = (region_dev_of_cuda(rt, dev), kind_of(kind)) else {
            return HAMI_ERROR;
        };
        if own_index(rt).is_none() {
            return HAMI_ERROR;
        }
        match rt.reserve(d, k, bytes as u64) {
            Ok(()) => HAMI_OK,
            Err(_) => HAMI_REFUSED,
        }
    })
    .into()
}

/// Returns `bytes` of `kind` on CUDA device `dev` reserved by `hami_reserve` (or recorded by
/// `add_gpu_device_memory_usage`) in this process. Returns `HAMI_OK`, or `HAMI_ERROR` for a bad
/// argument or no slot. Releasing more than is held stops at 0 (logged once).
#[no_mangle]
pub extern "C" fn hami_release(dev: c_int, bytes: usize, kind: c_int) -> c_int {
    boundary(HAMI_ERROR, || {
        let Some(rt) = rt() else {
            return HAMI_ERROR;
        };
        let (Some(d), Some(k)) = (region_dev_of_cuda(rt, dev), kind_of(kind)) else {
            return HAMI_ERROR;
        };
        let Some(i) = own_index(rt) else {
            return HAMI_ERROR;
        };
        rt.as_slot_writer(|| admission::release(rt.region, &rt.platform, i, d, k, bytes as u64));
        HAMI_OK
    })
    .into()
}

/// Bytes in use on CUDA device `dev` by all live processes of the region (what `hami_reserve`
/// admits against); 0 for a bad `dev`.
#[no_mangle]
pub extern "C" fn hami_device_usage(dev: c_int) -> u64 {
    boundary(0, || {
        rt().and_then(|rt| Some(rt.usage(region_dev_of_cuda(rt, dev)?)))
            .unwrap_or(0)
    })
}

/// Takes the region lock, waiting at most `timeout_ms` (0: one attempt), recovering it from a
/// dead holder. Returns `HAMI_OK`; `HAMI_TIMEOUT` (-5) if a live process held it throughout;
/// `HAMI_ALREADY_HELD` (-4) if the calling thread holds it; `HAMI_ERROR` (-2) for a negative
/// timeout, no region, or a corrupt semaphore. Held until `hami_unlock_region` (or
/// `unlock_shrreg`), which any thread of this process may call; it is not inherited by fork.
#[no_mangle]
pub extern "C" fn hami_lock_region(timeout_ms: c_int) -> c_int {
    boundary(HAMI_ERROR, || {
        if timeout_ms < 0 {
            return HAMI_ERROR;
        }
        lock_region(ms_to_ns(timeout_ms))
    })
    .into()
}

/// Releases the region lock held by this process. Returns `HAMI_OK`, `HAMI_NOT_HELD` (-3) if
/// this process does not hold it, or `HAMI_ERROR`.
#[no_mangle]
pub extern "C" fn hami_unlock_region() -> c_int {
    boundary(HAMI_ERROR, unlock_region).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comparelwr_matches_upstream_meaning() {
        let a = c"Force";
        let mut b = *b"FORCE\0";
        let mut c = *b"forced\0";
        // SAFETY: a NUL-terminated literal and a NUL-terminated buffer.
        let same = unsafe { comparelwr(a.as_ptr(), b.as_mut_ptr().cast()) };
        assert_eq!(same, 0);
        // SAFETY: as above, with another NUL-terminated buffer.
        let longer = unsafe { comparelwr(a.as_ptr(), c.as_mut_ptr().cast()) };
        assert_eq!(longer, 1);
        // SAFETY: NULL and a NUL-terminated buffer; NULL is allowed.
        let null_first = unsafe { comparelwr(std::ptr::null(), b.as_mut_ptr().cast()) };
        assert_eq!(null_first, 1);
        // SAFETY: a NUL-terminated literal and NULL, which is allowed.
        let null_second = unsafe { comparelwr(a.as_ptr(), std::ptr::null_mut()) };
        assert_eq!(null_second, 1);
    }

    #[test]
    fn device_indices_are_validated() {
        assert_eq!(region_dev(-1), None);
        assert_eq!(region_dev(16), None);
        assert_eq!(region_dev(15), Some(15));
        assert_eq!(ms_to_ns(-5), 0);
        assert_eq!(ms_to_ns(2), 2_000_000);
    }

    #[test]
    fn versions() {
        assert_eq!(shrreg_major_version(), 1);
        assert_eq!(shrreg_minor_version(), 2);
    }
}
