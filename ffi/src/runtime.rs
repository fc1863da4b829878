//! The process's one view of the shared region: opened on first use, then one acquire load per
//! call.
//!
//! Initialisation is a once-cell whose in-progress state makes hooks pass through: a hook that
//! runs inside our own initialisation (the driver calling back into an exported symbol, std
//! calling `dlsym`) on the same thread gets `None` and calls the real function, and other threads
//! wait a bounded time. No lock is ever held that the initialising thread could wait on.
//!
//! Fail closed. When the region cannot be used (a file we may not open, a layout we refuse, an
//! init lock held past its deadline), or the memory limit is malformed, the process has no way to count its memory where its peers
//! see it, so every allocation on a limited device is refused (`CUDA_ERROR_OUT_OF_MEMORY`) and
//! one line says why and what to fix; devices without a limit work as usual. When the region is
//! fine but the process cannot register in it (the lock is held by a stopped or hung process
//! past the start-up deadline, or every slot belongs to a live process), it stays unregistered:
//! allocations on limited devices are refused, and each one first tries to register again with a
//! short deadline. The private region the runtime keeps for those cases holds only the SM bucket
//! and never admits memory that a limit applies to: a private account lets every such process
//! take the whole limit again (3× the limit was measured).
//!
//! Registered processes never wait on the region lock while allocating: reaping dead slots
//! (on a refusal, at start-up and in the usage views) takes the lock only if it is free.

use std::cell::Cell;
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use hami_shm::admission::{self, OutOfMemory};
use hami_shm::init::{self, InitOutcome, InitParams};
use hami_shm::layout::{Ext, SharedRegion, ABI_DEVS};
use hami_shm::lock::{self, LockConfig, LockError, OwnerGuard};
use hami_shm::platform::Platform;
use hami_shm::seqlock::Kind;
use hami_shm::slots;
use hami_shm::validate::Verdict;

use crate::config::Config;
use crate::log::{log_error, log_info, log_warn};
use crate::one_time::{OneTime, RunningHere, Started};
use crate::platform::LinuxPlatform;
use crate::process;
use crate::region_file::{self, OpenMode, RegionFile};

/// No slot claimed (yet, or since a fork).
const NO_SLOT: usize = usize::MAX;
/// Least time between two reaps (on refused reservations and in the usage views).
const REAP_INTERVAL_NS: u64 = 100_000_000;
/// How long registration waits for the region lock at start-up: critical sections take
/// microseconds, so only a stopped or hung holder makes it run out.
const REGISTER_AT_START: LockConfig = LockConfig {
    deadline_ns: 5_000_000_000,
    ..LOCK_DEFAULTS
};
/// How long an unregistered process waits for the lock when it tries again at an allocation.
const REGISTER_AGAIN: LockConfig = LockConfig {
    deadline_ns: 20_000_000,
    ..LOCK_DEFAULTS
};
/// One attempt: reaping never waits.
const TRY_ONCE: LockConfig = LockConfig {
    deadline_ns: 0,
    ..LOCK_DEFAULTS
};
const LOCK_DEFAULTS: LockConfig = LockConfig::DEFAULT;
/// How long to wait for the init lock (a C peer initialises in microseconds).
const INIT_LOCK_TIMEOUT_NS: u64 = 10_000_000_000;
/// How long another thread waits for the initialising thread before passing through.
const INIT_WAIT_NS: u64 = 30_000_000_000;

/// The region this process uses, the platform under it, and its slot.
pub struct Runtime {
    /// The mapped region (shared, or private when degraded).
    pub region: &'static SharedRegion,
    /// Our extension tail of the same file (SM buckets).
    pub ext: &'static Ext,
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
    /// When a refused reservation or a view last reaped.
    last_reap_ns: AtomicU64,
    /// Whether the last registration attempt failed (so the next success is said once, and a
    /// failure is said once per spell).
    unregistered: AtomicBool,
    /// Serialises this process's threads around the owner lock (record locks are per process).
    lock_serial: Mutex<()>,
    /// Serialises this process's writers of slot counters: a slot's seqlock admits one writer,
    /// and a sibling thread preempted mid-write must be waited for (asleep), not spun on until
    /// it is taken over as if its process had died. An atomic flag rather than a mutex so that
    /// a forked child, which inherits it as it was, can clear it.
    slot_writer_busy: AtomicBool,
}

static RUNTIME: OnceLock<Runtime> = OnceLock::new();
/// The runtime's construction, once per process.
static INIT: OneTime = OneTime::new();

/// Takes a lock that is one flag (so a forked child can clear it): spins briefly, then yields.
/// The lock is held until the guard drops, also when a panic unwinds through its holder (a hook
/// catches it and the process goes on; the flag must not stay set).
pub(crate) fn spin_lock(flag: &AtomicBool) -> FlagGuard<'_> {
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
    FlagGuard(flag)
}

/// A held [`spin_lock`]; dropping it releases the flag.
pub(crate) struct FlagGuard<'a>(&'a AtomicBool);

impl Drop for FlagGuard<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
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
    if RunningHere::is_set(&IN_INIT) {
        return None;
    }
    let started = INIT.start(|| {
        let _here = RunningHere::set(&IN_INIT);
        let _ = RUNTIME.set(build());
        true
    });
    match started {
        Started::Ran(_) => {
            let rt = RUNTIME.get()?;
            process::install(rt);
            Some(rt)
        }
        Started::Done => RUNTIME.get(),
        Started::Running => {
            INIT.wait(INIT_WAIT_NS);
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
    if config.mem_limit_malformed {
        // The configuration's own line said why; such a process must not create the region
        // with limits it does not have.
        return Runtime::private(config, &params);
    }
    match open_shared(&config, &params) {
        Ok((file, outcome)) => {
            let fd = file.fd();
            let (region, ext) = file.leak();
            let rt = Runtime::new(
                (region, ext),
                LinuxPlatform::new(fd, SharedRegion::SIZE),
                config,
                true,
            );
            if outcome == InitOutcome::AlreadyReady {
                warn_limit_mismatch(region, &params);
            }
            if rt.register(&REGISTER_AT_START).is_some() {
                rt.reap_if_due();
            }
            rt
        }
        Err(why) => {
            let limited = config.mem_limit.iter().any(Option::is_some);
            if limited {
                log_error!(
                    "{why}; GPU memory is refused on every device with a limit until this is \
                     fixed (counting it privately would let each process take the whole limit)"
                );
            } else {
                log_error!("{why}; no memory limit is set, so nothing is refused");
            }
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

/// Says once, in one line, where this process's limits differ from the region's: the stricter
/// memory limit applies (see [`admission::stricter_limit`]); the region's SM limit applies.
fn warn_limit_mismatch(region: &SharedRegion, params: &InitParams<ABI_DEVS>) {
    let m = init::limit_mismatch(region, params);
    // One entry per run of devices with the same values (usually all of them).
    let mut runs: Vec<(usize, usize, String)> = Vec::new();
    for d in 0..ABI_DEVS {
        let theirs = region.limit(d).map_or(0, NonZeroU64::get);
        let mut what = Vec::new();
        if m.memory & (1 << d) != 0 {
            let applied = admission::stricter_limit(theirs, params.limits[d]);
            what.push(format!(
                "memory {} here, {} in the region, {} applies",
                limit_text(params.limits[d]),
                limit_text(theirs),
                limit_text(applied)
            ));
        }
        if m.sm & (1 << d) != 0 {
            what.push(format!(
                "SM {}% here, {}% in the region, the region's applies",
                params.sm_limits[d],
                region.sm_limit(d)
            ));
        }
        let what = what.join(", ");
        match runs.last_mut() {
            Some((_, last, w)) if *last + 1 == d && *w == what => *last = d,
            _ if what.is_empty() => {}
            _ => runs.push((d, d, what)),
        }
    }
    if runs.is_empty() {
        return;
    }
    let diffs: Vec<String> = runs
        .iter()
        .map(|(a, b, w)| match a == b {
            true => format!("device {a}: {w}"),
            false => format!("devices {a}-{b}: {w}"),
        })
        .collect();
    log_warn!(
        "this process's limits differ from the shared region's ({}); give every process of \
         the container the same CUDA_DEVICE_MEMORY_LIMIT and CUDA_DEVICE_SM_LIMIT",
        diffs.join("; ")
    );
}

/// A memory limit for a log line: bytes, or "none" for 0.
fn limit_text(limit: u64) -> String {
    if limit == 0 {
        "none".to_string()
    } else {
        format!("{limit} bytes")
    }
}

impl Runtime {
    fn new(
        (region, ext): (&'static SharedRegion, &'static Ext),
        platform: LinuxPlatform,
        config: Config,
        shared: bool,
    ) -> Self {
        Runtime {
            region,
            ext,
            platform,
            config,
            shared,
            slot: AtomicUsize::new(NO_SLOT),
            forked: AtomicBool::new(false),
            last_reap_ns: AtomicU64::new(0),
            unregistered: AtomicBool::new(false),
            lock_serial: Mutex::new(()),
            slot_writer_busy: AtomicBool::new(false),
        }
    }

    /// A runtime over a private, anonymous region initialised from `params`.
    fn private(config: Config, params: &InitParams<ABI_DEVS>) -> Self {
        let mapped = region_file::anonymous();
        let platform = LinuxPlatform::private();
        // A private region has no peers: initialisation cannot contend or time out.
        let _ = init::ensure_initialised(mapped.0, &platform, params, INIT_LOCK_TIMEOUT_NS);
        Runtime::new(mapped, platform, config, false)
    }

    /// Called in a forked child (async-signal-safe: atomics only).
    pub(crate) fn mark_forked(&self) {
        self.slot.store(NO_SLOT, Ordering::Relaxed);
        self.forked.store(true, Ordering::Relaxed);
        // A thread that was writing at the fork does not exist in the child.
        self.slot_writer_busy.store(false, Ordering::Relaxed);
    }

    /// Our slot, re-validated: the cached index if it still holds our pid (one relaxed load),
    /// else found again, else claimed with a short lock deadline ([`REGISTER_AGAIN`]). `None`
    /// if no slot can be had now.
    pub fn own_slot(&self) -> Option<usize> {
        let cached = self.slot.load(Ordering::Relaxed);
        if let Some(s) = self.region.slot(cached) {
            if s.pid() == self.platform.self_id().pid() {
                return Some(cached);
            }
        }
        self.register(&REGISTER_AGAIN)
    }

    /// Finds or claims our slot, waiting for the region lock at most `cfg.deadline_ns`. A
    /// failure is logged once per spell, in a line that says which obstacle it was; the
    /// success that ends a spell is logged too.
    #[cold]
    fn register(&self, cfg: &LockConfig) -> Option<usize> {
        let cached = self.slot.load(Ordering::Relaxed);
        if self.forked.swap(false, Ordering::AcqRel) {
            self.platform.refresh_identity();
        }
        let me = self.platform.self_id();
        if crate::region_guard::take_truncation_event() {
            // The file was cut under us (the guard extended it again, with zeros): redo a zeroed
            // header with our limits before registering in the slots that are now empty.
            let _ = init::ensure_initialised(
                self.region,
                &self.platform,
                &init_params(&self.config),
                INIT_LOCK_TIMEOUT_NS,
            );
        }
        if let Some(i) = slots::find_own(self.region, cached, me) {
            self.slot.store(i, Ordering::Relaxed);
            process::set_exit_slot(self.region, i, me);
            return Some(i);
        }
        let claimed = self.with_owner_lock(cfg, |guard| {
            slots::claim(self.region, &self.platform, guard)
        });
        let path = self.config.cache_path.display();
        match claimed {
            Ok(Ok(i)) => {
                self.slot.store(i, Ordering::Relaxed);
                process::set_exit_slot(self.region, i, me);
                if self.unregistered.swap(false, Ordering::Relaxed) {
                    log_warn!("registered in {path} (slot {i}); allocations are admitted again");
                }
                return Some(i);
            }
            _ if self.unregistered.swap(true, Ordering::Relaxed) => {}
            Ok(Err(slots::ClaimError::TableFull)) => log_warn!(
                "cannot register in {path}: all {} slots belong to live processes; GPU memory \
                 on devices with a limit is refused until one frees (tried again at each \
                 allocation)",
                hami_shm::layout::ABI_SLOTS
            ),
            Err(LockError::Timeout) => log_warn!(
                "cannot register in {path}: its lock stayed held by pid {} for {} ms (a stopped \
                 or hung process; `shrreg-tool --print` shows it); GPU memory on devices with a \
                 limit is refused until the lock frees (tried again at each allocation)",
                self.region.owner().pid(),
                cfg.deadline_ns / 1_000_000
            ),
            Err(LockError::SemFailed) => log_error!(
                "cannot register in {path}: its lock is unusable (the file is corrupt; remove \
                 it and restart the container's GPU processes); GPU memory on devices with a \
                 limit is refused"
            ),
        }
        None
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

    /// Reserves `bytes` on region device `dev` under the stricter of the region's limit and
    /// this process's own, or says why not ([`admission::admit`]). On refusal over the limit,
    /// reaps dead slots if the lock is free and tries once more: usage of SIGKILLed processes
    /// is reclaimed exactly when it stands in the way, and nobody waits for it.
    pub fn reserve(&self, dev: usize, kind: Kind, bytes: u64) -> Result<(), OutOfMemory> {
        if !self.shared && (self.config.mem_limit_malformed || self.own_limit(dev) != 0) {
            return Err(OutOfMemory::NoRegion);
        }
        let slot = self.own_slot();
        let attempt = || {
            self.as_slot_writer(|| {
                admission::admit(
                    self.region,
                    &self.platform,
                    slot,
                    dev,
                    kind,
                    bytes,
                    self.own_limit(dev),
                )
            })
        };
        match attempt() {
            Err(OutOfMemory::OverLimit { .. }) if self.reap_due() && self.reap_now() > 0 => {
                attempt()
            }
            r => r,
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

    /// This process's configured memory limit on region device `dev` (0: none).
    fn own_limit(&self, dev: usize) -> u64 {
        self.config
            .mem_limit
            .get(dev)
            .copied()
            .flatten()
            .unwrap_or(0)
    }

    /// Runs `f`, which writes slot counters, as this process's one slot writer. Waiters spin
    /// briefly (writes take nanoseconds), then yield the CPU.
    pub fn as_slot_writer<R>(&self, f: impl FnOnce() -> R) -> R {
        let _writer = spin_lock(&self.slot_writer_busy);
        f()
    }

    /// Usage of region device `dev` by every live process, as the views (cuMemGetInfo, NVML,
    /// the C API) report it: dead processes' slots are reaped first, at most once per
    /// [`REAP_INTERVAL_NS`] and only if the lock is free, so a process that died holding memory
    /// stops counting without anyone being refused first.
    pub fn usage(&self, dev: usize) -> u64 {
        self.reap_if_due();
        admission::device_usage(self.region, dev)
    }

    /// The memory limit that applies on region device `dev`: the stricter of the region's and
    /// this process's own; `None` if neither sets one.
    pub fn limit(&self, dev: usize) -> Option<u64> {
        if dev >= ABI_DEVS {
            return None;
        }
        let region = self.region.limit(dev).map_or(0, NonZeroU64::get);
        let l = admission::stricter_limit(region, self.own_limit(dev));
        (l != 0).then_some(l)
    }

    /// Whether a reap may run now: at most once per [`REAP_INTERVAL_NS`], so a program that
    /// keeps hitting its limit or polling free memory does not read /proc on every call.
    fn reap_due(&self) -> bool {
        let now = self.platform.now_ns();
        let last = self.last_reap_ns.load(Ordering::Relaxed);
        now.saturating_sub(last) >= REAP_INTERVAL_NS
            && self
                .last_reap_ns
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// Reaps if one is due (see [`Runtime::reap_due`]).
    fn reap_if_due(&self) {
        if self.shared && self.reap_due() {
            crate::region_guard::check_replaced(self.platform.now_ns());
            self.reap_now();
        }
    }

    /// Reaps every dead slot now if the region lock is free (never waits); returns how many
    /// were freed. The work is bounded by the table: each [`slots::reap`] round frees at most
    /// its batch, and rounds stop at the first that frees less.
    pub fn reap_now(&self) -> usize {
        let mut on_gpu = GpuHolders::default();
        self.with_owner_lock(&TRY_ONCE, |g| {
            let mut freed = 0;
            loop {
                let n = slots::reap_released(self.region, &self.platform, g, &mut |slot| {
                    on_gpu.still_holds(slot)
                });
                freed += n;
                if n < slots::REAP_BATCH {
                    return freed;
                }
            }
        })
        .unwrap_or(0)
    }
}

/// Whether the driver still holds memory for a dead process, by NVML's process list (asked once
/// per device per reap, only when a dead slot with usage there is found). A process's memory
/// outlives it: the driver tears its contexts down after the process is gone (on an H200,
/// slots reaped at zombie time let the GPU run 0.6 GiB past an 8 GiB limit while 32 processes
/// exited). Without NVML nothing can be told, and the slot is reaped.
#[derive(Default)]
struct GpuHolders {
    lists: [Option<Option<Vec<u32>>>; ABI_DEVS],
}

impl GpuHolders {
    fn still_holds(&mut self, slot: &hami_shm::layout::SharedProcSlot) -> bool {
        let host = slot.hostpid();
        let pid = slot.pid();
        (0..ABI_DEVS)
            .filter(|&d| slot.recorded_total(d) != 0)
            .any(|d| {
                let listed = self.lists[d].get_or_insert_with(|| {
                    crate::hooks::host_pid::processes(d)
                        .map(|l| l.iter().filter(|p| p.1 != 0).map(|p| p.0).collect())
                });
                listed.as_ref().is_some_and(|pids| {
                    pids.iter()
                        .any(|&p| (host > 0 && p == host as u32) || p == pid as u32)
                })
            })
    }
}
