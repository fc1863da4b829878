//! NVML: the memory views `nvidia-smi` and monitoring agents read, and the utilisation source
//! of the SM limiter.
//!
//! `nvmlDeviceGetMemoryInfo` and `_v2`, for a device whose region index (its NVML index) has a
//! limit, report `total = min(limit, real total)`, `used` = the container's usage of that device
//! (every live process in the region), and `free = total − used` (never below 0; `_v2` also
//! subtracts the driver's `reserved`, which it leaves as it is, capped at `total`). Without a
//! limit, or for a handle that has no NVML index (a MIG device), the real values pass through.

use std::collections::{HashMap, HashSet};
use std::ffi::{c_int, c_uint};
use std::sync::atomic::{AtomicU64, Ordering};

use hami_shm::layout::ABI_DEVS;

use crate::runtime::Runtime;

use super::hook::hook;
use super::types::*;
use super::{active, devices, real};

/// The region index of an NVML handle (its NVML index), if the region has it.
pub(super) fn region_of(device: NvmlDevice) -> Option<usize> {
    let f = real::nvmlDeviceGetIndex.get()?;
    let mut idx: c_uint = 0;
    // SAFETY: the real NVML call writing one index into a local.
    if !unsafe { f(device, &mut idx) }.ok() {
        return None;
    }
    let idx = idx as usize;
    (idx < ABI_DEVS).then_some(idx)
}

/// `(total, used)` of the limited view of `dev`, or `None` without a limit.
fn view(rt: &Runtime, dev: usize, real_total: u64) -> Option<(u64, u64)> {
    let limit = rt.limit(dev)?;
    Some((
        super::memory::reported_total(rt, limit, real_total),
        rt.usage(dev),
    ))
}

/// The two layouts of NVML's memory answer, as the limited view rewrites them.
trait MemoryAnswer {
    /// The real total the driver filled in.
    fn total(&self) -> u64;
    /// Rewrites the answer as `total` bytes of which `used` are in use.
    fn limit_to(&mut self, total: u64, used: u64);
}

impl MemoryAnswer for NvmlMemory {
    fn total(&self) -> u64 {
        self.total
    }
    fn limit_to(&mut self, total: u64, used: u64) {
        self.total = total;
        self.used = used;
        self.free = total.saturating_sub(used);
    }
}

impl MemoryAnswer for NvmlMemoryV2 {
    fn total(&self) -> u64 {
        self.total
    }
    fn limit_to(&mut self, total: u64, used: u64) {
        self.total = total;
        self.used = used;
        self.reserved = self.reserved.min(total);
        self.free = total.saturating_sub(used).saturating_sub(self.reserved);
    }
}

/// Calls the real memory query `call` for `device`, then, if it filled `*memory` and the device
/// is limited, rewrites it from the limited view `(total, used)`.
fn memory_info<M: MemoryAnswer>(
    device: NvmlDevice,
    memory: *mut M,
    call: impl FnOnce() -> NvmlReturn,
) -> NvmlReturn {
    let r = call();
    if !r.ok() || memory.is_null() {
        return r;
    }
    let Some(a) = active() else {
        return r;
    };
    let Some(dev) = region_of(device) else {
        return r;
    };
    // SAFETY: non-null, and the driver just filled it.
    let m = unsafe { &mut *memory };
    if let Some((total, used)) = view(a.rt, dev, m.total()) {
        m.limit_to(total, used);
    }
    r
}

hook! {
    fn nvmlDeviceGetMemoryInfo(device: NvmlDevice, memory: *mut NvmlMemory) -> NvmlReturn;
    |real_fn| {
        // SAFETY: forwarding the caller's arguments unchanged.
        memory_info(device, memory, || unsafe { real_fn(device, memory) })
    }
}

hook! {
    fn nvmlDeviceGetMemoryInfo_v2(device: NvmlDevice, memory: *mut NvmlMemoryV2) -> NvmlReturn;
    |real_fn| {
        // SAFETY: forwarding the caller's arguments unchanged.
        memory_info(device, memory, || unsafe { real_fn(device, memory) })
    }
}

// ---- Utilisation source of the SM limiter ------------------------------------------------------

/// `nvmlUtilization_t`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Utilization {
    gpu: c_uint,
    memory: c_uint,
}

/// The real `nvmlDeviceGetProcessUtilization`.
pub(super) type ProcUtilFn =
    unsafe extern "C" fn(NvmlDevice, *mut NvmlProcessUtilSample, *mut c_uint, u64) -> NvmlReturn;
type UtilRatesFn = unsafe extern "C" fn(NvmlDevice, *mut Utilization) -> NvmlReturn;

static UTILIZATION_RATES: real::Real<UtilRatesFn> =
    real::Real::new(&real::NVML, c"nvmlDeviceGetUtilizationRates");

/// Newest sample timestamp seen per device (microseconds), the next query's `lastSeenTimeStamp`.
static LAST_SEEN: [AtomicU64; ABI_DEVS] = [const { AtomicU64::new(0) }; ABI_DEVS];

fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// Pids that belong to this container: every live slot's pid and host pid.
fn container_pids(rt: &Runtime) -> HashSet<u32> {
    let mut s = HashSet::new();
    for slot in rt.region.live_range() {
        let pid = slot.pid();
        if pid != 0 {
            s.insert(pid as u32);
            let host = slot.hostpid();
            if host != 0 {
                s.insert(host as u32);
            }
        }
    }
    s
}

/// Each of the container's processes' SM utilisation in `samples`: the mean over its samples (a
/// query can return several per process), by pid as NVML reports it.
fn per_process(samples: &[NvmlProcessUtilSample], ours: &HashSet<u32>) -> HashMap<u32, f64> {
    let mut per_pid: HashMap<u32, (u64, u64)> = HashMap::new();
    for s in samples.iter().filter(|s| ours.contains(&s.pid)) {
        let e = per_pid.entry(s.pid).or_default();
        e.0 += u64::from(s.sm_util.min(100));
        e.1 += 1;
    }
    per_pid
        .into_iter()
        .map(|(pid, (u, n))| (pid, u as f64 / n as f64))
        .collect()
}

/// The container's SM utilisation: its processes' shares summed. `None` if none of them is in
/// the samples.
fn container_share(per_pid: &HashMap<u32, f64>) -> Option<f64> {
    (!per_pid.is_empty()).then(|| per_pid.values().sum::<f64>().min(100.0))
}

/// Writes each live slot's `device_util[dev].sm_util` (percent, what HAMi's monitor sums into
/// its container metric) from the samples: the slot's host pid's share, else its pid's, else 0.
fn publish_sm_util(rt: &Runtime, dev: usize, per_pid: &HashMap<u32, f64>) {
    for slot in rt.region.live_range() {
        let pid = slot.pid();
        if pid == 0 {
            continue;
        }
        let host = slot.hostpid();
        let util = [host, pid]
            .iter()
            .filter(|&&p| p != 0)
            .find_map(|&p| per_pid.get(&(p as u32)))
            .copied()
            .unwrap_or(0.0);
        slot.set_sm_util(dev, util.round() as u64);
    }
}

/// NVML's process samples for `h` newer than `since` (microseconds) from the real query `f`.
/// `Err` is NVML's answer when it has none.
pub(super) fn process_samples(
    h: NvmlDevice,
    f: ProcUtilFn,
    since: u64,
) -> Result<Vec<NvmlProcessUtilSample>, NvmlReturn> {
    // SAFETY: the real query writes at most `*n` samples into `buf`, which `growing` sizes to
    // `*n`.
    super::nvml_procs::growing(4096, |buf, n| unsafe { f(h, buf, n, since) })
}

/// What the SM limiter reads from NVML for region device `dev` each period.
pub(crate) fn limiter_view(dev: usize) -> crate::sm_limit::NvmlView {
    // The container's pids (none without a runtime: then nothing is ours and others count as
    // present, so that a pause finds out).
    let rt = crate::runtime::existing();
    let ours = rt.map(container_pids);
    crate::sm_limit::NvmlView {
        util: rt
            .zip(ours.as_ref())
            .and_then(|(rt, ours)| container_sm_util(rt, dev, ours)),
        device_util: device_util(dev),
        others_present: ours.as_ref().is_none_or(|ours| others_present(dev, ours)),
    }
}

/// `nvmlSample_t`: a CPU timestamp (microseconds) and an 8-byte value union; utilisation
/// samples are unsigned ints in its low bytes.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct NvmlSample {
    time_stamp: u64,
    value: u64,
}

type SamplesFn = unsafe extern "C" fn(
    NvmlDevice,
    c_int,
    u64,
    *mut c_int,
    *mut c_uint,
    *mut NvmlSample,
) -> NvmlReturn;

static SAMPLES: real::Real<SamplesFn> = real::Real::new(&real::NVML, c"nvmlDeviceGetSamples");
/// `NVML_GPU_UTILIZATION_SAMPLES`.
const GPU_UTILIZATION_SAMPLES: c_int = 1;
/// Newest device sample seen per device (microseconds).
static LAST_DEVICE_SAMPLE: [AtomicU64; ABI_DEVS] = [const { AtomicU64::new(0) }; ABI_DEVS];

/// The device's utilisation (percent, every process's) since the last call: the mean of NVML's
/// device samples stamped since. An H200 keeps one per 200 ms, each over the 200 ms before its
/// stamp, within milliseconds of the work (docs/gpu-results.md, run 12). `None` if there is no
/// new sample or no such query.
fn device_util(dev: usize) -> Option<f64> {
    let h = devices::nvml_handle(dev)?;
    let f = SAMPLES.get()?;
    let last = LAST_DEVICE_SAMPLE.get(dev)?;
    let since = match last.load(Ordering::Relaxed) {
        0 => now_us().saturating_sub(1_000_000),
        t => t,
    };
    let mut kind: c_int = 0;
    let mut n: c_uint = 0;
    // SAFETY: a null buffer asks only for the number of samples, written into a local.
    let sized = unsafe {
        f(
            h,
            GPU_UTILIZATION_SAMPLES,
            since,
            &mut kind,
            &mut n,
            std::ptr::null_mut(),
        )
    };
    if !sized.ok() || n == 0 {
        return None;
    }
    let mut buf = vec![NvmlSample::default(); n.min(4096) as usize];
    let mut n = buf.len() as c_uint;
    // SAFETY: the query writes at most `n` samples into `buf`, which holds `n`.
    if !unsafe {
        f(
            h,
            GPU_UTILIZATION_SAMPLES,
            since,
            &mut kind,
            &mut n,
            buf.as_mut_ptr(),
        )
    }
    .ok()
    {
        return None;
    }
    buf.truncate(n as usize);
    // Unused entries of the driver's ring come back stamped 0.
    let fresh: Vec<f64> = buf
        .iter()
        .filter(|s| s.time_stamp > since)
        .map(|s| f64::from((s.value as u32).min(100)))
        .collect();
    let newest = buf.iter().map(|s| s.time_stamp).max().unwrap_or(0);
    if newest > since {
        last.store(newest, Ordering::Relaxed);
    }
    (!fresh.is_empty()).then(|| fresh.iter().sum::<f64>() / fresh.len() as f64)
}

/// Whether NVML lists a process on region device `dev` that is not one of `ours` (another
/// container's, in any pid namespace: unknown pids count). True where NVML cannot list: a
/// pause then finds out.
fn others_present(dev: usize, ours: &HashSet<u32>) -> bool {
    let Some(list) = super::host_pid::processes(dev) else {
        return true;
    };
    list.iter().any(|(pid, _)| !ours.contains(pid))
}

/// SM utilisation (percent) of region device `dev` by this container's processes (`ours`) since
/// the last call, from `nvmlDeviceGetProcessUtilization`. If there is no new sample, or none can
/// be attributed to the container (its processes run in another pid namespace and their host
/// pids are not known), the device's overall utilisation stands in. `None` if NVML cannot tell.
fn container_sm_util(rt: &Runtime, dev: usize, ours: &HashSet<u32>) -> Option<f64> {
    let h = devices::nvml_handle(dev)?;
    let last = LAST_SEEN.get(dev)?;
    if let Some(f) = super::nvml_procs::nvmlDeviceGetProcessUtilization::REAL.get() {
        let since = match last.load(Ordering::Relaxed) {
            0 => now_us().saturating_sub(1_000_000),
            t => t,
        };
        if let Ok(samples) = process_samples(h, f, since) {
            if let Some(newest) = samples.iter().map(|s| s.time_stamp).max() {
                last.store(newest, Ordering::Relaxed);
            }
            // No sample newer than the last one: nothing new, not an idle GPU. The device-wide
            // rate below answers instead.
            if !samples.is_empty() {
                let per_pid = per_process(&samples, ours);
                publish_sm_util(rt, dev, &per_pid);
                if let Some(util) = container_share(&per_pid) {
                    return Some(util);
                }
            }
        }
    }
    let f = UTILIZATION_RATES.get()?;
    let mut u = Utilization::default();
    // SAFETY: the real query writing one struct into a local.
    unsafe { f(h, &mut u) }
        .ok()
        .then_some(f64::from(u.gpu.min(100)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(pid: u32, sm_util: u32) -> NvmlProcessUtilSample {
        NvmlProcessUtilSample {
            pid,
            sm_util,
            ..NvmlProcessUtilSample::default()
        }
    }

    #[test]
    fn container_share_averages_per_process_and_sums_processes() {
        let ours: HashSet<u32> = [10, 11].into_iter().collect();
        let samples = [
            sample(10, 20),
            sample(10, 40),
            sample(11, 15),
            sample(99, 80),
        ];
        let per_pid = per_process(&samples, &ours);
        assert_eq!(per_pid.get(&10), Some(&30.0));
        assert_eq!(per_pid.get(&11), Some(&15.0));
        assert_eq!(per_pid.get(&99), None);
        assert_eq!(container_share(&per_pid), Some(45.0));
        assert_eq!(
            container_share(&per_process(&[sample(99, 80)], &ours)),
            None
        );
        assert_eq!(
            container_share(&per_process(&[sample(10, 90), sample(11, 90)], &ours)),
            Some(100.0)
        );
    }
}
