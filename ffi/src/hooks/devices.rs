//! Which region device a CUDA device is: the one index used everywhere (reserve, release, the
//! limit check, the views), so usage can never be added on one index and checked on another
//! (HAMi's B25).
//!
//! The region is indexed like NVML (the monitor and `nvidia-smi` see NVML devices, and NVML
//! ignores `CUDA_VISIBLE_DEVICES`). A CUDA ordinal is mapped, once, lazily, off the hot path:
//!
//! 1. by UUID: `cuDeviceGetUuid` of the ordinal against `nvmlDeviceGetUUID` of every NVML device
//!    (and of every MIG device under it, which maps to its parent's index);
//! 2. else by `CUDA_VISIBLE_DEVICES`: entry *k* (an index, or a UUID or unique UUID prefix looked
//!    up among NVML's UUIDs) is ordinal *k*;
//! 3. else identity.
//!
//! A device that maps to an index the region does not have (16 and up) is not accounted (one
//! warning). A per-device limit variable set for an index above every one this process's devices
//! map to (`CUDA_DEVICE_MEMORY_LIMIT_3` on a one-GPU machine) is named in one warning when the
//! map is computed. The map is computed by the first thread that needs it after `cuInit`; other threads
//! wait for it (bounded); a nested call on the computing thread gets the fallback (steps 2–3).
//! If the driver is not initialised yet the fallback is used for that call and the map is
//! computed on a later one.

use std::cell::Cell;
use std::ffi::{c_char, c_int, CStr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::OnceLock;

use hami_shm::layout::ABI_DEVS;

use crate::config::VisibleDevice;
use crate::log::{log_info, log_warn};
use crate::one_time::{OneTime, RunningHere, Started};
use crate::runtime::Runtime;

use super::real;
use super::types::*;

/// CUDA ordinals we map (more than any machine has).
pub const MAX_ORDINALS: usize = 64;
const UNMAPPED: u8 = u8::MAX;

/// The map's computation, once per process (again after a run that could not finish).
static MAP_STATE: OneTime = OneTime::new();
static MAP: [AtomicU8; MAX_ORDINALS] = [const { AtomicU8::new(UNMAPPED) }; MAX_ORDINALS];
/// Said once: a CUDA device has no region index.
static UNMAPPED_DEVICE: crate::log::Once = crate::log::Once::new();

thread_local! {
    static COMPUTING_HERE: Cell<bool> = const { Cell::new(false) };
}

/// How long another thread waits for the map (NVML's first init can take a second).
const WAIT_NS: u64 = 20_000_000_000;

/// The region device of CUDA ordinal `ordinal`, or `None` if it is not accounted.
pub fn region_index(rt: &Runtime, ordinal: CUdevice) -> Option<usize> {
    let idx = nvml_index(rt, ordinal);
    if idx.is_none() && UNMAPPED_DEVICE.first() {
        log_warn!(
            "CUDA device {ordinal} has no device index below {ABI_DEVS} in the shared region; \
             its memory is not accounted"
        );
    }
    idx
}

/// [`region_index`] without its warning, for queries (`cuda_to_nvml_map`).
pub fn nvml_index(rt: &Runtime, ordinal: CUdevice) -> Option<usize> {
    let o = usize::try_from(ordinal).ok()?;
    Some(usize::from(mapped(rt, o))).filter(|&i| i < ABI_DEVS)
}

/// The map's entry for CUDA ordinal `o` (computing the map if the driver is ready, else the
/// fallback), [`UNMAPPED`] or an index that may be beyond the region; no warning.
fn mapped(rt: &Runtime, o: usize) -> u8 {
    if !MAP_STATE.is_done() {
        ensure_map(rt);
    }
    if MAP_STATE.is_done() {
        MAP.get(o)
            .map(|m| m.load(Ordering::Relaxed))
            .unwrap_or(UNMAPPED)
    } else {
        fallback(rt, o, None).unwrap_or(UNMAPPED)
    }
}

/// The lowest CUDA ordinal that maps to region (NVML) device `idx`, or `None` if none does
/// (the GPU is not visible to CUDA in this process). The ordinals searched are the driver's
/// count once it answers, else as many as `CUDA_VISIBLE_DEVICES` lists, else as many as NVML
/// has devices, else the region's 16.
pub fn ordinal_of(rt: &Runtime, idx: usize) -> Option<usize> {
    (0..ordinal_count(rt)).find(|&o| usize::from(mapped(rt, o)) == idx)
}

/// How many CUDA ordinals there are, as far as this process can tell (see [`ordinal_of`]).
fn ordinal_count(rt: &Runtime) -> usize {
    let mut n: c_int = 0;
    // SAFETY: the real cuDeviceGetCount writing one int into a local.
    let driver = real::cuDeviceGetCount
        .get()
        .filter(|f| unsafe { f(&mut n) }.ok());
    let count = match (driver, &rt.config.visible_devices) {
        (Some(_), _) => usize::try_from(n).unwrap_or(0),
        (None, Some(list)) => list.len(),
        (None, None) => match nvml_uuids().len() {
            0 => ABI_DEVS,
            n => n,
        },
    };
    count.min(MAX_ORDINALS)
}

/// Records every NVML device's UUID in the region (HAMi-core's `init_device_info`), whether or
/// not a process did before; returns how many devices NVML has, or `None` (nothing written)
/// when NVML is not available.
pub fn record_uuids(rt: &Runtime) -> Option<usize> {
    let nvml = nvml_uuids();
    if nvml.is_empty() {
        return None;
    }
    Some(write_uuids(rt, nvml))
}

/// The region device of the current context's device.
pub fn current(rt: &Runtime) -> Option<(CUdevice, usize)> {
    let f = real::cuCtxGetDevice.get()?;
    let mut dev: CUdevice = 0;
    // SAFETY: the real cuCtxGetDevice writing one CUdevice into a local.
    if !unsafe { f(&mut dev) }.ok() {
        return None;
    }
    Some((dev, region_index(rt, dev)?))
}

/// The current context handle (0 if none).
pub fn current_ctx() -> usize {
    let Some(f) = real::cuCtxGetCurrent.get() else {
        return 0;
    };
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: the real cuCtxGetCurrent writing one handle into a local.
    if unsafe { f(&mut ctx) }.ok() {
        ctx as usize
    } else {
        0
    }
}

/// The NVML handle of region device `idx` (NVML is initialised on first use).
pub fn nvml_handle(idx: usize) -> Option<NvmlDevice> {
    if !nvml_init() {
        return None;
    }
    let f = real::nvmlDeviceGetHandleByIndex_v2.get()?;
    let mut h: NvmlDevice = std::ptr::null_mut();
    // SAFETY: the real NVML call writing one handle into a local.
    unsafe { f(idx as u32, &mut h) }.ok().then_some(h)
}

/// Whether NVML is initialised (by [`prepare_nvml`]'s thread or a query) and usable now.
pub fn nvml_ready() -> bool {
    NVML_STATE.load(Ordering::Acquire) == 1
}

/// Whether NVML is initialised for our queries: 0 unknown, 1 yes, 2 failed.
static NVML_STATE: AtomicU8 = AtomicU8::new(0);

/// In a forked child (atomics only): NVML is initialised again before our next query.
pub(crate) fn after_fork() {
    NVML_STATE.store(0, Ordering::Relaxed);
}

/// Initialises NVML for our own queries, once (its reference count keeps it alive whatever the
/// application does with its own `nvmlInit`/`nvmlShutdown` pairs).
pub fn nvml_init() -> bool {
    match NVML_STATE.load(Ordering::Acquire) {
        1 => true,
        2 => false,
        _ => {
            crate::fork::install();
            let t0 = crate::platform::monotonic_ns();
            let ok = real::nvmlInit_v2
                .get()
                // SAFETY: the real nvmlInit_v2, no arguments.
                .map(|f| unsafe { f() }.ok())
                .unwrap_or(false);
            NVML_STATE.store(if ok { 1 } else { 2 }, Ordering::Release);
            crate::log::log_debug!(
                "nvmlInit_v2: {} in {} ms",
                if ok { "ready" } else { "failed" },
                crate::platform::ms_between(t0, crate::platform::monotonic_ns())
            );
            ok
        }
    }
}

fn ensure_map(rt: &Runtime) {
    if RunningHere::is_set(&COMPUTING_HERE) {
        return;
    }
    let started = MAP_STATE.start(|| {
        let _here = RunningHere::set(&COMPUTING_HERE);
        let t0 = crate::platform::monotonic_ns();
        let done = compute(rt);
        crate::log::log_debug!(
            "device map computed in {} ms",
            crate::platform::ms_between(t0, crate::platform::monotonic_ns())
        );
        done
    });
    if started == Started::Running {
        MAP_STATE.wait(WAIT_NS);
    }
}

/// The hex digits of a UUID string, lower-cased, without `GPU-`/`MIG-` or dashes.
fn uuid_key(s: &str) -> String {
    let s = s
        .strip_prefix("GPU-")
        .or_else(|| s.strip_prefix("MIG-"))
        .unwrap_or(s);
    s.chars()
        .filter(char::is_ascii_hexdigit)
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` for 16 bytes.
pub fn format_uuid(b: &[u8; 16]) -> String {
    let mut s = String::from("GPU-");
    for (i, byte) in b.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        s.push_str(&format!("{byte:02x}"));
    }
    s
}

/// One NVML device: its index, UUID, and the UUIDs of its MIG devices.
struct NvmlDev {
    index: usize,
    uuid: String,
    mig: Vec<String>,
}

fn nvml_uuid_of(h: NvmlDevice) -> Option<String> {
    let f = real::nvmlDeviceGetUUID.get()?;
    let mut buf = [0 as c_char; NVML_UUID_BUFFER];
    // SAFETY: the real NVML call writing at most `len` bytes into our buffer.
    if !unsafe { f(h, buf.as_mut_ptr(), buf.len() as u32) }.ok() {
        return None;
    }
    buf[NVML_UUID_BUFFER - 1] = 0;
    // SAFETY: the buffer is NUL-terminated (forced above).
    let s = unsafe { CStr::from_ptr(buf.as_ptr()) };
    Some(s.to_string_lossy().into_owned())
}

/// Every NVML device's UUID, queried once (empty if NVML is unavailable).
fn nvml_uuids() -> &'static [NvmlDev] {
    static UUIDS: OnceLock<Vec<NvmlDev>> = OnceLock::new();
    UUIDS.get_or_init(query_nvml_uuids)
}

/// Starts NVML's initialisation and the UUID query on a thread of their own, so that they run
/// beside the driver's `cuInit` rather than before the first context: with many processes
/// starting at once `nvmlInit` alone took up to 170 ms on an H200. Whoever needs the UUIDs first
/// waits for that thread's answer.
pub fn prepare_nvml() {
    static STARTED: AtomicBool = AtomicBool::new(false);
    if !STARTED.swap(true, Ordering::AcqRel) {
        let _ = std::thread::Builder::new()
            .name("hami-nvml-init".into())
            .spawn(|| {
                let _ = nvml_uuids();
            });
    }
}

fn query_nvml_uuids() -> Vec<NvmlDev> {
    let mut out = Vec::new();
    if !nvml_init() {
        return out;
    }
    let (Some(count), Some(by_index)) = (
        real::nvmlDeviceGetCount_v2.get(),
        real::nvmlDeviceGetHandleByIndex_v2.get(),
    ) else {
        return out;
    };
    let mut n = 0u32;
    // SAFETY: the real NVML call writing one count into a local.
    if !unsafe { count(&mut n) }.ok() {
        return out;
    }
    for i in 0..n.min(MAX_ORDINALS as u32) {
        let mut h: NvmlDevice = std::ptr::null_mut();
        // SAFETY: as above, one handle.
        if !unsafe { by_index(i, &mut h) }.ok() {
            continue;
        }
        let Some(uuid) = nvml_uuid_of(h) else {
            continue;
        };
        let mut mig = Vec::new();
        if let (Some(max), Some(mig_by_index)) = (
            real::nvmlDeviceGetMaxMigDeviceCount.get(),
            real::nvmlDeviceGetMigDeviceHandleByIndex.get(),
        ) {
            let mut m = 0u32;
            // SAFETY: one count into a local; fails on GPUs without MIG, which is fine.
            if unsafe { max(h, &mut m) }.ok() {
                for j in 0..m.min(64) {
                    let mut mh: NvmlDevice = std::ptr::null_mut();
                    // SAFETY: one handle into a local.
                    if unsafe { mig_by_index(h, j, &mut mh) }.ok() {
                        if let Some(u) = nvml_uuid_of(mh) {
                            mig.push(u);
                        }
                    }
                }
            }
        }
        out.push(NvmlDev {
            index: i as usize,
            uuid,
            mig,
        });
    }
    out
}

/// Region index of a UUID (or unique UUID prefix) among NVML's devices.
fn by_uuid(nvml: &[NvmlDev], uuid: &str) -> Option<u8> {
    let key = uuid_key(uuid);
    if key.is_empty() {
        return None;
    }
    let mut hit = None;
    for d in nvml {
        let matches = uuid_key(&d.uuid).starts_with(&key)
            || d.mig.iter().any(|m| uuid_key(m).starts_with(&key));
        if matches {
            if hit.is_some() {
                return None; // ambiguous prefix
            }
            hit = Some(d.index as u8);
        }
    }
    hit
}

/// Steps 2 and 3 of the module docs (`nvml`: the NVML devices, queried here if `None` and
/// needed).
fn fallback(rt: &Runtime, ordinal: usize, nvml: Option<&[NvmlDev]>) -> Option<u8> {
    match &rt.config.visible_devices {
        Some(list) => match list.get(ordinal)? {
            VisibleDevice::Index(i) => u8::try_from(*i).ok(),
            VisibleDevice::Uuid(u) => match nvml {
                Some(n) => by_uuid(n, u),
                None => by_uuid(nvml_uuids(), u),
            },
        },
        None => u8::try_from(ordinal).ok(),
    }
}

/// Computes the map; false if the driver is not ready (try again later).
fn compute(rt: &Runtime) -> bool {
    let (Some(count), Some(get)) = (real::cuDeviceGetCount.get(), real::cuDeviceGet.get()) else {
        return false;
    };
    let mut n: c_int = 0;
    // SAFETY: the real cuDeviceGetCount writing one int into a local.
    if !unsafe { count(&mut n) }.ok() {
        return false;
    }
    let uuid_fn = real::cuDeviceGetUuid_v2
        .get()
        .or_else(|| real::cuDeviceGetUuid.get());
    // The UUIDs an earlier process published in the region map most devices without waiting
    // for NVML (which is slow to start while many processes start at once); NVML is asked only
    // for what they do not map (MIG devices, the first process).
    let published = published_uuids(rt);
    let mut queried: Option<&[NvmlDev]> = None;
    let mut how = [0usize; 3];
    for (o, slot) in MAP
        .iter()
        .enumerate()
        .take((n.max(0) as usize).min(MAX_ORDINALS))
    {
        let mut dev: CUdevice = 0;
        // SAFETY: one CUdevice into a local.
        let got = unsafe { get(&mut dev, o as c_int) }.ok();
        let mut idx = None;
        if let (true, Some(f)) = (got, uuid_fn) {
            let mut u = CUuuid::default();
            // SAFETY: 16 bytes into a local CUuuid.
            if unsafe { f(&mut u, dev) }.ok() {
                let uuid = format_uuid(&u.bytes);
                idx = by_uuid(&published, &uuid)
                    .or_else(|| by_uuid(queried.get_or_insert_with(nvml_uuids), &uuid));
            }
        }
        if idx.is_some() {
            how[0] += 1;
        } else {
            idx = fallback(rt, o, queried);
            how[if rt.config.visible_devices.is_some() {
                1
            } else {
                2
            }] += 1;
        }
        slot.store(idx.unwrap_or(UNMAPPED), Ordering::Relaxed);
    }
    if published.is_empty() {
        publish_uuids(rt, queried.unwrap_or_else(nvml_uuids));
    }
    report_indices_beyond(rt, (n.max(0) as usize).min(MAX_ORDINALS));
    if crate::log::enabled(crate::log::Level::Info) {
        let shown: Vec<String> = (0..(n.max(0) as usize).min(MAX_ORDINALS))
            .map(|o| match MAP[o].load(Ordering::Relaxed) {
                UNMAPPED => format!("{o}->none"),
                i => format!("{o}->{i}"),
            })
            .collect();
        log_info!(
            "CUDA devices map to region devices {} ({} by UUID, {} by CUDA_VISIBLE_DEVICES, {} \
             by position)",
            shown.join(" "),
            how[0],
            how[1],
            how[2]
        );
    }
    true
}

/// Names, in one line, the per-device limit variables set for a region index above every one
/// that this process's `count` CUDA devices map to (`_3` on a one-GPU machine): they limit
/// nothing here, which is likely a typo.
fn report_indices_beyond(rt: &Runtime, count: usize) {
    let mapped: Vec<u8> = MAP[..count]
        .iter()
        .map(|m| m.load(Ordering::Relaxed))
        .filter(|&i| i != UNMAPPED)
        .collect();
    let highest = mapped.iter().max().map(|&h| usize::from(h));
    let beyond: Vec<&str> = rt
        .config
        .per_device_vars
        .iter()
        .filter(|(_, i)| highest.is_none_or(|h| *i > h))
        .map(|(name, _)| name.as_str())
        .collect();
    if !beyond.is_empty() {
        let shown: Vec<String> = mapped.iter().map(u8::to_string).collect();
        log_warn!(
            "{} set for a device index beyond the {count} CUDA device(s) the driver reports \
             (region devices: {}); it limits nothing in this process",
            beyond.join(", "),
            if shown.is_empty() {
                "none".to_owned()
            } else {
                shown.join(", ")
            }
        );
    }
}

/// The device UUIDs published in the region, as region device index and text (none if no
/// process has published them yet).
fn published_uuids(rt: &Runtime) -> Vec<NvmlDev> {
    let region = rt.region;
    (0..region.device_count())
        .filter_map(|i| {
            let (text, len) = region.uuid(i)?;
            let uuid = String::from_utf8(text[..len].to_vec())
                .ok()
                .filter(|u| !u.is_empty())?;
            Some(NvmlDev {
                index: i,
                uuid,
                mig: Vec::new(),
            })
        })
        .collect()
}

/// Records the NVML devices' UUIDs in the region (HAMi's monitor reads them), if no process has
/// yet. Every process would write the same bytes.
fn publish_uuids(rt: &Runtime, nvml: &[NvmlDev]) {
    if nvml.is_empty() || rt.region.devices_recorded() {
        return;
    }
    write_uuids(rt, nvml);
}

/// Writes `nvml`'s UUIDs and device count into the region; returns the count (one past the
/// highest NVML index).
fn write_uuids(rt: &Runtime, nvml: &[NvmlDev]) -> usize {
    let count = nvml.iter().map(|d| d.index + 1).max().unwrap_or(0);
    rt.region
        .record_devices(nvml.iter().map(|d| (d.index, d.uuid.as_bytes())), count);
    count
}

/// Granularity cache per CUDA ordinal (0 = not known yet).
static GRANULE: [AtomicU64; MAX_ORDINALS] = [const { AtomicU64::new(0) }; MAX_ORDINALS];

/// What a driver rounds device allocations to when it cannot tell us (2 MiB on NVIDIA GPUs).
pub const DEFAULT_GRANULE: u64 = 2 << 20;

/// The allocation granularity of CUDA device `ordinal`: what `cuMemGetAllocationGranularity`
/// reports as the minimum for pinned device memory, or [`DEFAULT_GRANULE`].
pub fn granularity(ordinal: CUdevice) -> u64 {
    let slot = usize::try_from(ordinal).ok().and_then(|o| GRANULE.get(o));
    if let Some(g) = slot.map(|s| s.load(Ordering::Relaxed)).filter(|&g| g != 0) {
        return g;
    }
    let prop = device_prop(ordinal);
    let g = prop_granularity(&prop).unwrap_or(DEFAULT_GRANULE);
    if let Some(s) = slot {
        s.store(g, Ordering::Relaxed);
    }
    g
}

/// A pinned device allocation property for `ordinal`.
pub fn device_prop(ordinal: CUdevice) -> CUmemAllocationProp {
    CUmemAllocationProp {
        type_: CU_MEM_ALLOCATION_TYPE_PINNED,
        requested_handle_types: 0,
        location: CUmemLocation {
            type_: CU_MEM_LOCATION_TYPE_DEVICE,
            id: ordinal,
        },
        win32_handle_meta_data: std::ptr::null_mut(),
        alloc_flags: CUmemAllocFlags::default(),
    }
}

/// The minimum granularity the driver reports for `prop`.
pub fn prop_granularity(prop: &CUmemAllocationProp) -> Option<u64> {
    let f = real::cuMemGetAllocationGranularity.get()?;
    let mut g: usize = 0;
    // SAFETY: the real call reading `prop` and writing one size_t into a local.
    let r = unsafe { f(&mut g, prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) };
    (r.ok() && g.is_power_of_two()).then_some(g as u64)
}

/// `bytes` rounded up to a multiple of `granule` (a power of two), saturating.
pub fn round_up(bytes: u64, granule: u64) -> u64 {
    if granule <= 1 {
        return bytes;
    }
    match bytes.checked_add(granule - 1) {
        Some(b) => b & !(granule - 1),
        None => u64::MAX,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_formatting_and_keys() {
        let b = [
            0x8a, 0x3b, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c,
            0x0d, 0x0e,
        ];
        let s = format_uuid(&b);
        assert_eq!(s, "GPU-8a3b0102-0304-0506-0708-090a0b0c0d0e");
        assert_eq!(uuid_key(&s), "8a3b0102030405060708090a0b0c0d0e");
        assert_eq!(uuid_key("MIG-8A3B"), "8a3b");
    }

    #[test]
    fn prefixes_must_be_unique() {
        let devs = vec![
            NvmlDev {
                index: 0,
                uuid: "GPU-aa00".into(),
                mig: vec![],
            },
            NvmlDev {
                index: 1,
                uuid: "GPU-ab00".into(),
                mig: vec!["MIG-cc11".into()],
            },
        ];
        assert_eq!(by_uuid(&devs, "GPU-ab"), Some(1));
        assert_eq!(by_uuid(&devs, "GPU-a"), None);
        assert_eq!(by_uuid(&devs, "MIG-cc11"), Some(1));
        assert_eq!(by_uuid(&devs, "GPU-ff"), None);
    }

    #[test]
    fn rounding() {
        assert_eq!(round_up(1, 2 << 20), 2 << 20);
        assert_eq!(round_up(2 << 20, 2 << 20), 2 << 20);
        assert_eq!(round_up(0, 2 << 20), 0);
        assert_eq!(round_up(u64::MAX - 3, 4096), u64::MAX);
        assert_eq!(round_up(7, 1), 7);
    }
}
