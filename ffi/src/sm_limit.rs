//! The SM-utilisation limit: kernel launches draw from the device's region-wide token bucket
//! (`hami_shm::bucket`), and one controller per device, elected by a lease in the region, sets
//! the refill rate from NVML utilisation samples and the region's exact count of blocks launched
//! (the bucket's `spent`; see `hami_shm::sm_controller::Controller`). No lock is held across an NVML call
//! (the lease is a CAS, not a lock), and a process without a limit pays one relaxed load per
//! launch.
//!
//! Switches, as HAMi's monitor expects: `GPU_CORE_UTILIZATION_POLICY=force` limits always,
//! `disable` never, otherwise the region's `utilization_switch` (1 = limit) decides; a negative
//! `recent_kernel` (the monitor's priority gate) pauses launches until it is non-negative again.
//! Every launch on a device with a limit marks the container active (`recent_kernel` = 2), whatever
//! the switch, so that the monitor sees it and can turn the switch on when another container
//! joins (upstream HEAD marks only while the switch is on, so a container once alone is never
//! counted again; docs/monitor-contract.md).
//!
//! Only devices that this process launches on are controlled: a limit set for all 16 devices
//! takes no lease, writes no bucket and warns about nothing on devices that do not exist.
//!
//! Each metered launch also marks its kernel in a process-local set per device
//! (`hami_shm::workload`), which the controller takes every period to notice new work: so a
//! change of kernels is seen in the process that holds the device's lease, not in the others.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;

use hami_shm::bucket;
use hami_shm::layout::ABI_DEVS;
use hami_shm::platform::Platform;
use hami_shm::sm_controller::{Controller, Sample, PERIOD_NS};
use hami_shm::workload::{KernelSet, WORDS};

use crate::config::UtilPolicy;
use crate::log::{self, log_debug, log_warn};
use crate::runtime::{self, Runtime};

/// Bit `d` set: region device `d` has an SM limit below 100 (the one relaxed load of the
/// unlimited path).
static LIMITED: AtomicU32 = AtomicU32::new(0);
/// Said once: NVML gives no utilisation for a limited device.
static NO_UTILISATION: log::Once = log::Once::new();
/// Longest the priority gate holds one launch; the monitor lifts it within a tick (5 s) of the
/// higher-priority work ending. Past it the launch goes on and the monitor's -1 stays.
const GATE_MAX_NS: u64 = 10_000_000_000;
/// Said once: a launch went on through a closed priority gate.
static GATE_TIMEOUT: log::Once = log::Once::new();
/// `recent_kernel` of a container that launched in the monitor's last two ticks.
const ACTIVE: i32 = 2;
/// Bit `d` set: this process has launched on region device `d` (the controller steers those).
static USED: AtomicU32 = AtomicU32::new(0);
/// The kernels this process launched on each region device this period (see `note_kernel`).
static KERNELS: [[AtomicU64; WORDS]; ABI_DEVS] =
    [const { [const { AtomicU64::new(0) }; WORDS] }; ABI_DEVS];

/// What NVML tells the controller about region device `dev` over the last period.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct NvmlView {
    /// Percent of the device used by this container's processes, if NVML can tell.
    pub util: Option<f64>,
    /// Percent of the device used by everyone, from NVML's timestamped device samples.
    pub device_util: Option<f64>,
    /// Whether processes outside the container hold the device.
    pub others_present: bool,
}

/// Where the controller gets its NVML readings; registered by the NVML hooks, which own the
/// real NVML.
pub(crate) type UtilSource = fn(dev: usize) -> NvmlView;
static SOURCE: OnceLock<UtilSource> = OnceLock::new();
static STARTED: AtomicBool = AtomicBool::new(false);

/// Registers the utilisation source and starts the controller thread if any device is limited.
pub fn start(rt: &'static Runtime, source: UtilSource) {
    let _ = SOURCE.set(source);
    let mut mask = 0u32;
    for d in 0..ABI_DEVS {
        let l = rt.region.sm_limit(d);
        if l > 0 && l < 100 && rt.config.util_policy != UtilPolicy::Disable {
            mask |= 1 << d;
        }
    }
    LIMITED.store(mask, Ordering::Relaxed);
    if mask != 0 && !STARTED.swap(true, Ordering::AcqRel) {
        let _ = std::thread::Builder::new()
            .name("hami-sm-limit".into())
            .spawn(move || controller_loop(rt, mask));
    }
}

/// Whether any device of this process has an SM limit (after [`start`]).
pub fn any_limited() -> bool {
    LIMITED.load(Ordering::Relaxed) != 0
}

/// Called before every kernel launch on region device `dev` with the launch's block count and
/// what it runs (a function or graph handle).
pub fn before_launch(dev: usize, blocks: u64, kernel: usize) {
    if dev >= 32 || LIMITED.load(Ordering::Relaxed) & (1 << dev) == 0 {
        return;
    }
    let Some(rt) = runtime::existing() else {
        return;
    };
    if USED.load(Ordering::Relaxed) & (1 << dev) == 0 {
        USED.fetch_or(1 << dev, Ordering::Relaxed);
    }
    priority_gate(rt);
    if !switch_on(rt) {
        return;
    }
    note_kernel(dev, kernel);
    if let Some(b) = rt.ext.bucket(dev) {
        bucket::consume(b, &rt.platform, blocks.max(1));
    }
}

/// Marks `kernel` among this period's kernels on `dev`: one relaxed load, and an atomic OR only
/// the first time its bucket is hit in a period.
fn note_kernel(dev: usize, kernel: usize) {
    let (word, bit) = KernelSet::bucket(kernel);
    if let Some(w) = KERNELS.get(dev).map(|k| &k[word]) {
        if w.load(Ordering::Relaxed) & bit == 0 {
            w.fetch_or(bit, Ordering::Relaxed);
        }
    }
}

/// This period's kernels on `dev`, emptied for the next.
fn take_kernels(dev: usize) -> KernelSet {
    KernelSet(std::array::from_fn(|i| {
        KERNELS[dev][i].swap(0, Ordering::Relaxed)
    }))
}

fn switch_on(rt: &Runtime) -> bool {
    match rt.config.util_policy {
        UtilPolicy::Force => true,
        UtilPolicy::Disable => false,
        UtilPolicy::Default => rt.region.utilization_switch() != 0,
    }
}

/// Waits (bounded) while HAMi's monitor holds `recent_kernel` negative, then marks the container
/// active. Never stores over a -1: the mark is a CAS from the value seen, and a launch that waited
/// [`GATE_MAX_NS`] goes on without it. One relaxed load when already marked.
fn priority_gate(rt: &Runtime) {
    let mut seen = rt.region.kernel_gate();
    if seen == ACTIVE {
        return;
    }
    if seen < 0 {
        let start = rt.platform.now_ns();
        while seen < 0 {
            if rt.platform.now_ns().saturating_sub(start) >= GATE_MAX_NS {
                if GATE_TIMEOUT.first() {
                    log_warn!(
                        "a kernel launch waited {} s for HAMi's monitor to lift the priority gate \
                         (recent_kernel -1: a higher-priority task uses the GPU); letting it run",
                        GATE_MAX_NS / 1_000_000_000
                    );
                }
                return;
            }
            rt.platform.sleep_ns(10_000_000);
            seen = rt.region.kernel_gate();
        }
    }
    let _ = rt.region.mark_kernel_active(seen, ACTIVE);
}

/// Marks the container active while its launches wait on the limit: they are work, and a
/// pause before a re-measurement launches nothing for 0.6 s or more. HAMi's monitor counts a
/// container that marked nothing since its last tick as idle and turns every container's limit
/// off, so the re-measurement counted no launch (t_monitor's port ticks every 0.5 s; in one run
/// in four a container kept its halved first measurement). Never over a -1 (as the gate).
fn keep_active(rt: &Runtime) {
    let seen = rt.region.kernel_gate();
    if (0..ACTIVE).contains(&seen) {
        let _ = rt.region.mark_kernel_active(seen, ACTIVE);
    }
}

fn controller_loop(rt: &'static Runtime, mask: u32) {
    let mut controllers: [Option<Controller>; ABI_DEVS] = [None; ABI_DEVS];
    let mut last_spent = [0u64; ABI_DEVS];
    // Devices whose `last_spent` is set: those launched on before the previous period.
    let mut counted = 0u32;
    let mut last_ns = rt.platform.now_ns();
    loop {
        rt.platform.sleep_ns(PERIOD_NS);
        let now = rt.platform.now_ns();
        let period_ns = now.saturating_sub(last_ns);
        last_ns = now;
        let id = rt.platform.self_id();
        let me = id.pid() as u32;
        let used = mask & USED.load(Ordering::Relaxed);
        for dev in (0..ABI_DEVS).filter(|d| used & (1 << d) != 0) {
            let Some(b) = rt.ext.bucket(dev) else {
                continue;
            };
            let spent = b.spent();
            let consumed = spent.wrapping_sub(last_spent[dev]);
            last_spent[dev] = spent;
            let kernels = take_kernels(dev);
            if counted & (1 << dev) == 0 {
                // First period with launches here: start counting from now.
                counted |= 1 << dev;
                continue;
            }
            if !bucket::take_lease(b, me, || rt.platform.now_ns() / 1_000_000) {
                controllers[dev] = None;
                continue;
            }
            let view = SOURCE.get().map_or(NvmlView::default(), |f| f(dev));
            if view.util.is_none() && NO_UTILISATION.first() {
                log_warn!(
                    "SM limit of device {dev}: NVML reports no utilisation, so the limit holds \
                     on the rate of launched blocks alone (NVML's view of the GPU's time is not \
                     checked). Fix: make NVML usable in the container (check that nvidia-smi \
                     works)"
                );
            }
            let starved = bucket::held_back(b, now);
            if starved {
                keep_active(rt);
            }
            let limit = rt.region.sm_limit(dev);
            // Containers have their own pid namespaces, so equal pids are common: the process's
            // start tag (in its id) and the moment set their random streams apart.
            let seed = id.0 ^ now;
            let c =
                controllers[dev].get_or_insert_with(|| Controller::resume(limit, b.rate(), seed));
            let set = c.step(Sample {
                util: view.util,
                consumed,
                period_ns,
                starved,
                device_util: view.device_util,
                others_present: view.others_present,
                kernels,
            });
            bucket::set_rate(b, set.rate, set.forgive_debt);
            log_debug!(
                "sm-limit device {dev}: utilisation {}% (device {}%{}, limit {limit}%), {consumed} blocks in {} ms{}, rate {}/s, {} (solo {}/s)",
                view.util.map_or(-1.0, f64::round),
                view.device_util.map_or(-1.0, f64::round),
                if view.others_present { ", others present" } else { "" },
                period_ns / 1_000_000,
                if starved { " (held back)" } else { "" },
                set.rate,
                c.phase_name(),
                c.full_rate().map_or(-1.0, f64::round)
            );
        }
    }
}
