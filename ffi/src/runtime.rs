//! The process's one view of the shared region: opened on first use, then one acquire load per
//! call.
//!
//! Initialisation is a once-cell whose in-progress state makes hooks pass through: a hook that
//! runs inside our own initialisation (the driver calling back into an exported symbol, std
//! calling `dlsym`) on the same thread gets `None` and calls the real function, and other threads
//! wait a bounded time. No lock is ever held that the initialising thread could wait on.
//!
//! When the region cannot be used (a file we may not open, a layout we refuse, a table full of
//! live processes, an init lock held past its deadline) the runtime runs *degraded*: it accounts
//! in a private region of its own, so the limit still holds within this process, and it says so
//! in one log line.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use hami_shm::admission::{self, OutOfMemory};
use hami_shm::init::{self, InitOutcome, InitParams};
use hami_shm::layout::{SharedRegion, ABI_DEVS};
use hami_shm::lock::{self, LockConfig, LockError, OwnerGuard};
use hami_shm::platform::Platform;
use hami_shm::seqlock::Kind;
use hami_shm::slots;
use hami_shm::validate::Verdict;

use crate::config::Config;
use crate::log::{log_error, log_info, log_warn};
use crate::platform::LinuxPlatform;
use crate::process;
use crate::region_file::{self, OpenMode, RegionFile};

/// No slot claimed (yet, or since a fork).
const NO_SLOT: usize = usize::MAX;
/// Least time between two reaps triggered by refused reservations.
const REAP_INTERVAL_NS: u64 = 100_000_000;
/// How long to wait for the init lock (a C peer initialises in microseconds).
const INIT_LOCK_TIMEOUT_NS: u64 = 10_000_000_000;
/// How long another thread waits for the initialising thread before passing through.
const INIT_WAIT_NS: u64 = 30_000_000_000;

/// The region this process uses, the platform under it, and its slot.
pub struct Runtime {
    /// The mapped region (shared, or private when degraded).
    pub region: &'static SharedRegion,
    /// The Linux platform over the region's file.
    pub platform: LinuxPlatform,
    /// The configuration read at start-up.
    pub config: Config,
    /// False when running on a private region (see the module docs).
    pub shared: bool,
    /// Our slot index, or [`NO_SLOT`].
    slot: AtomicUsize,
    /// Set in a forked child: identity and slot must be renewed on next use.
    forked: AtomicBool,
    /// When a refused reservation last reaped.
    last_reap_ns: AtomicU64,
    /// Serialises this process's threads around the owner lock (record locks are per process).
    lock_serial: Mutex<()>,
    /// Serialises this process's writers of slot counters: a slot's seqlock admits one writer,
    /// and a sibling thread preempted mid-write must be waited for (asleep), not spun on until
    /// it is taken over as if its process had died. An atomic flag rather than a mutex so that
    /// a forked child, which inherits it as it was, can clear it.
    slot_writer_busy: AtomicBool,
}

static RUNTIME: OnceLock<Runtime> = OnceLock::new();
static STATE: AtomicU8 = AtomicU8::new(UNINIT);
const UNINIT: u8 = 0;
const BUSY: u8 = 1;
const DONE: u8 = 2;

/// Takes a lock that is one flag (so a forked child can clear it): spins briefly, then yields.
pub(crate) fn spin_lock(flag: &AtomicBool) {
    let mut spins = 0u32;
    while flag
        .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        spins += 1;
        if spins < 64 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

thread_local! {
    /// This thread is running [`build`]: its nested hooks pass through.
    static IN_INIT: Cell<bool> = const { Cell::new(false) };
}

/// The runtime, initialising it on first use. `None` while this thread is inside the
/// initialisation (pass through to the real driver), or if another thread's initialisation did
/// not finish in time.
pub fn get() -> Option<&'static Runtime> {
    if let Some(rt) = RUNTIME.get() {
        return Some(rt);
    }
    init_slow()
}

/// The runtime if it already exists; never initialises (for exit paths and tools).
pub fn existing() -> Option<&'static Runtime> {
    RUNTIME.get()
}

#[cold]
fn init_slow() -> Option<&'static Runtime> {
    if IN_INIT.try_with(Cell::get).unwrap_or(true) {
        return None;
    }
    match STATE.compare_exchange(UNINIT, BUSY, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {
            let _ = IN_INIT.try_with(|f| f.set(true));
            let rt = build();
            let _ = RUNTIME.set(rt);
            STATE.store(DONE, Ordering::Release);
            let _ = IN_INIT.try_with(|f| f.set(false));
            let rt = RUNTIME.get()?;
            process::install(rt);
            Some(rt)
        }
        Err(_) => {
            let start = crate::platform::monotonic_ns();
            while STATE.load(Ordering::Acquire) != DONE {
                if crate::platform::monotonic_ns().saturating_sub(start) > INIT_WAIT_NS {
                    return None;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            RUNTIME.get()
        }
    }
}

/// The values this process would initialise the region with.
fn init_params(config: &Config) -> InitParams<ABI_DEVS> {
    InitParams {
        limits: config.mem_limit.map(|l| l.unwrap_or(0)),
        sm_limits: config.sm_limit,
        priority: config.priority,
    }
}

fn build() -> Runtime {
    let (config, errors) = Config::from_process_env();
    crate::config::log_diagnostics(&errors);
    let params = init_params(&config);
    match open_shared(&config, &params) {
        Ok((file, outcome)) => {
            let fd = file.fd();
            let region = file.leak();
            let rt = Runtime::new(
                region,
                LinuxPlatform::new(fd, SharedRegion::SIZE),
                config,
                true,
            );
            if outcome == InitOutcome::AlreadyReady {
                warn_limit_mismatch(region, &params);
            }
            if rt.own_slot().is_none() {
                log_warn!(
                    "no slot in the shared region {} (all {} belong to live processes); this \
                     process's usage is enforced within the process only",
                    rt.config.cache_path.display(),
                    hami_shm::layout::ABI_SLOTS
                );
                return rt.into_private(params);
            }
            rt
        }
        Err(why) => {
            log_error!("{why}; enforcing the memory limit within this process only");
            let rt = Runtime::private(config, &params);
            let _ = rt.own_slot();
            rt
        }
    }
}

/// Opens, validates, repairs and initialises the shared region file.
fn open_shared(
    config: &Config,
    params: &InitParams<ABI_DEVS>,
) -> Result<(RegionFile, InitOutcome), String> {
    let file =
        region_file::open(&config.cache_path, OpenMode::ReadWrite).map_err(|e| e.to_string())?;
    let platform = LinuxPlatform::new(file.fd(), SharedRegion::SIZE);
    let region = file.region();
    let path = config.cache_path.display();
    if file.verdict() == Verdict::LegacyV11 {
        match init::repair_legacy_postinit(region, &platform, INIT_LOCK_TIMEOUT_NS) {
            Ok(true) => log_info!("{path}: initialised the sem_postinit that v1.1 left zeroed"),
            Ok(false) => {}
            Err(e) => return Err(format!("{path}: cannot repair the v1.1 region ({e:?})")),
        }
    }
    let outcome = init::ensure_initialised(region, &platform, params, INIT_LOCK_TIMEOUT_NS)
        .map_err(|e| match e {
            init::InitError::LockTimeout => format!(
                "{path}: the init lock stayed held for 10 s (a process hung while initialising \
                 the region); restart the container's GPU processes"
            ),
            init::InitError::SemInit => format!("{path}: sem_init failed on the region"),
        })?;
    Ok((file, outcome))
}

fn warn_limit_mismatch(region: &SharedRegion, params: &InitParams<ABI_DEVS>) {
    let m = init::limit_mismatch(region, params);
    for d in 0..ABI_DEVS {
        if m.memory & (1 << d) != 0 {
            log_warn!(
                "device {d}: this process asks for a memory limit of {} bytes but the shared \
                 region holds {}, set by the process that created it; the region's limit applies \
                 (give every process of the container the same CUDA_DEVICE_MEMORY_LIMIT)",
                params.limits[d],
                region.limit[d].load(Ordering::Relaxed)
            );
        }
        if m.sm & (1 << d) != 0 {
            log_warn!(
                "device {d}: this process asks for an SM limit of {}% but the shared region holds \
                 {}%; the region's limit applies",
                params.sm_limits[d],
                region.sm_limit[d].load(Ordering::Relaxed)
            );
        }
    }
}

impl Runtime {
    fn new(
        region: &'static SharedRegion,
        platform: LinuxPlatform,
        config: Config,
        shared: bool,
    ) -> Self {
        Runtime {
            region,
            platform,
            config,
            shared,
            slot: AtomicUsize::new(NO_SLOT),
            forked: AtomicBool::new(false),
            last_reap_ns: AtomicU64::new(0),
            lock_serial: Mutex::new(()),
            slot_writer_busy: AtomicBool::new(false),
        }
    }

    /// A runtime over a private, anonymous region initialised from `params`.
    fn private(config: Config, params: &InitParams<ABI_DEVS>) -> Self {
        let region = region_file::anonymous();
        let platform = LinuxPlatform::private();
        // A private region has no peers: initialisation cannot contend or time out.
        let _ = init::ensure_initialised(region, &platform, params, INIT_LOCK_TIMEOUT_NS);
        Runtime::new(region, platform, config, false)
    }

    fn into_private(self, params: InitParams<ABI_DEVS>) -> Self {
        let rt = Runtime::private(self.config, &params);
        let _ = rt.own_slot();
        rt
    }

    /// Called in a forked child (async-signal-safe: atomics only).
    pub(crate) fn mark_forked(&self) {
        self.slot.store(NO_SLOT, Ordering::Relaxed);
        self.forked.store(true, Ordering::Relaxed);
        // A thread that was writing at the fork does not exist in the child.
        self.slot_writer_busy.store(false, Ordering::Relaxed);
    }

    /// Our slot, re-validated: the cached index if it still holds our pid (one relaxed load),
    /// else found again, else claimed under the owner lock. `None` if no slot can be had.
    pub fn own_slot(&self) -> Option<usize> {
        let cached = self.slot.load(Ordering::Relaxed);
        if let Some(s) = self.region.procs.get(cached) {
            if s.pid.load(Ordering::Relaxed) == self.platform.self_id().pid() {
                return Some(cached);
            }
        }
        self.own_slot_slow(cached)
    }

    #[cold]
    fn own_slot_slow(&self, cached: usize) -> Option<usize> {
        if self.forked.swap(false, Ordering::AcqRel) {
            self.platform.refresh_identity();
        }
        let me = self.platform.self_id();
        if let Some(i) = slots::find_own(self.region, cached, me) {
            self.slot.store(i, Ordering::Relaxed);
            process::set_exit_slot(self.region, i, me);
            return Some(i);
        }
        let claimed = self.with_owner_lock(&LockConfig::default(), |guard| {
            slots::claim(self.region, &self.platform, guard)
        });
        match claimed {
            Ok(Ok(i)) => {
                self.slot.store(i, Ordering::Relaxed);
                process::set_exit_slot(self.region, i, me);
                Some(i)
            }
            Ok(Err(slots::ClaimError::TableFull)) => None,
            Err(e) => {
                log_warn!(
                    "cannot take the shared region's lock to register this process ({e:?}); \
                     will retry on the next allocation"
                );
                None
            }
        }
    }

    /// Runs `f` holding the owner lock (this process's threads one at a time).
    pub fn with_owner_lock<R>(
        &self,
        cfg: &LockConfig,
        f: impl FnOnce(&OwnerGuard<'_, LinuxPlatform, { hami_shm::layout::ABI_SLOTS }, ABI_DEVS>) -> R,
    ) -> Result<R, LockError> {
        let _serial = self.lock_serial.lock().unwrap_or_else(|p| p.into_inner());
        let guard = lock::acquire(self.region, &self.platform, cfg)?;
        let result = f(&guard);
        guard.release();
        Ok(result)
    }

    /// Reserves `bytes` on region device `dev`, or says why not. On refusal, reaps dead slots
    /// (bounded, with a short lock deadline) and tries once more: usage of SIGKILLed processes
    /// is reclaimed exactly when it stands in the way.
    pub fn reserve(&self, dev: usize, kind: Kind, bytes: u64) -> Result<(), OutOfMemory> {
        let Some(slot) = self.own_slot() else {
            return Err(OutOfMemory { used: 0, limit: 0 });
        };
        let attempt = || {
            self.as_slot_writer(|| {
                admission::try_reserve(self.region, &self.platform, slot, dev, kind, bytes)
            })
        };
        match attempt() {
            Ok(()) => Ok(()),
            Err(oom) => {
                if !self.reap_due() || self.reap_now() == 0 {
                    return Err(oom);
                }
                attempt()
            }
        }
    }

    /// Returns `bytes` on region device `dev`.
    pub fn release(&self, dev: usize, kind: Kind, bytes: u64) {
        if let Some(slot) = self.own_slot() {
            self.as_slot_writer(|| {
                admission::release(self.region, &self.platform, slot, dev, kind, bytes)
            });
        }
    }

    /// Runs `f`, which writes slot counters, as this process's one slot writer. Waiters spin
    /// briefly (writes take nanoseconds), then yield the CPU.
    pub fn as_slot_writer<R>(&self, f: impl FnOnce() -> R) -> R {
        spin_lock(&self.slot_writer_busy);
        struct Done<'a>(&'a AtomicBool);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                self.0.store(false, Ordering::Release);
            }
        }
        let _done = Done(&self.slot_writer_busy);
        f()
    }

    /// Usage of region device `dev` by every live process.
    pub fn usage(&self, dev: usize) -> u64 {
        admission::device_usage(self.region, dev)
    }

    /// The memory limit of region device `dev`, `None` if unlimited.
    pub fn limit(&self, dev: usize) -> Option<u64> {
        let l = self.region.limit.get(dev)?.load(Ordering::Relaxed);
        (l != 0).then_some(l)
    }

    /// Whether a refused reservation may reap: at most once per [`REAP_INTERVAL_NS`], so a
    /// program that keeps hitting its limit does not read /proc on every refusal.
    fn reap_due(&self) -> bool {
        let now = self.platform.now_ns();
        let last = self.last_reap_ns.load(Ordering::Relaxed);
        now.saturating_sub(last) >= REAP_INTERVAL_NS
            && self
                .last_reap_ns
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// Reaps dead slots now, with a short lock deadline; returns how many were freed.
    pub fn reap_now(&self) -> usize {
        let cfg = LockConfig {
            deadline_ns: 200_000_000,
            ..LockConfig::default()
        };
        self.with_owner_lock(&cfg, |g| slots::reap(self.region, &self.platform, g))
            .unwrap_or(0)
    }
}
