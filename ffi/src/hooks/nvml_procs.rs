//! The container's processes in NVML's process lists, so that `nvidia-smi` inside the container
//! lists them.
//!
//! NVML reports the host's pids, which a container cannot see, and every container's processes
//! on the GPU. With a region in use, the process queries (`nvmlDeviceGet{Compute,Graphics,
//! MPSCompute}RunningProcesses` v1–v3 and `nvmlDeviceGetProcessUtilization`) answer with the
//! container's processes only: each under the pid the container knows, matched to NVML's entry
//! by the host pid its slot holds (or by its own pid where the driver reports the container's
//! pids), with the memory the region counts for it (its context included). The compute list also
//! names a process of the region that holds memory on the device but that NVML does not list
//! (its host pid is not known yet). `nvmlSystemGetProcessName` names the container's processes
//! from the container's `/proc`.
//! Without a region, or for a device the region does not have, NVML's answers pass through.

use std::ffi::{c_char, c_uint};

use hami_shm::slots::{self, Listed};

use super::hook::hook;
use super::types::*;
use super::{active, nvml};

/// One entry of a process list, whatever its version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pid: u32,
    bytes: u64,
    gpu_instance: u32,
    compute_instance: u32,
}

/// NVML's "not applicable" instance id (not a MIG device).
const NO_INSTANCE: u32 = u32::MAX;

/// A process-list entry layout of one NVML version.
pub(crate) trait ProcEntry: Copy + Default {
    fn entry(&self) -> Entry;
    fn from_entry(e: Entry) -> Self;
}

impl ProcEntry for NvmlProcessInfoV1 {
    fn entry(&self) -> Entry {
        Entry {
            pid: self.pid,
            bytes: self.used_gpu_memory,
            gpu_instance: NO_INSTANCE,
            compute_instance: NO_INSTANCE,
        }
    }
    fn from_entry(e: Entry) -> Self {
        NvmlProcessInfoV1 {
            pid: e.pid,
            used_gpu_memory: e.bytes,
        }
    }
}

impl ProcEntry for NvmlProcessInfo {
    fn entry(&self) -> Entry {
        Entry {
            pid: self.pid,
            bytes: self.used_gpu_memory,
            gpu_instance: self.gpu_instance_id,
            compute_instance: self.compute_instance_id,
        }
    }
    fn from_entry(e: Entry) -> Self {
        NvmlProcessInfo {
            pid: e.pid,
            used_gpu_memory: e.bytes,
            gpu_instance_id: e.gpu_instance,
            compute_instance_id: e.compute_instance,
        }
    }
}

/// A real NVML query that fills a caller's array of `E`, with its count in and out.
pub(crate) type ListFn<E> = unsafe extern "C" fn(NvmlDevice, *mut c_uint, *mut E) -> NvmlReturn;

/// NVML's whole list for `h` from the real query `f`. `Err` is NVML's answer when it has none.
fn list_all<E: Default + Clone>(h: NvmlDevice, f: ListFn<E>) -> Result<Vec<E>, NvmlReturn> {
    // SAFETY: the real query writes at most `*n` entries of its own layout `E` into `buf`, which
    // `growing` sizes to `*n`.
    growing(1 << 16, |buf: *mut E, n| unsafe { f(h, n, buf) })
}

/// NVML's whole list for `h` from the real query `f` of any version, as (pid, bytes) pairs.
pub(crate) fn pids_and_bytes<E: ProcEntry>(h: NvmlDevice, f: ListFn<E>) -> Option<Vec<(u32, u64)>> {
    let all = list_all(h, f).ok()?;
    Some(
        all.iter()
            .map(|p| (p.entry().pid, p.entry().bytes))
            .collect(),
    )
}

/// Runs an NVML query that fills an array of up to `*n` entries (with `*n` in and out), growing
/// the array while NVML says it is too small (up to `max` entries, four tries).
pub(crate) fn growing<E: Default + Clone>(
    max: u32,
    mut query: impl FnMut(*mut E, &mut c_uint) -> NvmlReturn,
) -> Result<Vec<E>, NvmlReturn> {
    let mut cap: c_uint = 64;
    for _ in 0..4 {
        let mut n = cap;
        let mut buf = vec![E::default(); cap as usize];
        let r = query(buf.as_mut_ptr(), &mut n);
        if r == NvmlReturn::INSUFFICIENT_SIZE {
            cap = n.max(cap.saturating_mul(2)).min(max);
            continue;
        }
        if !r.ok() {
            return Err(r);
        }
        buf.truncate(n.min(cap) as usize);
        return Ok(buf);
    }
    Err(NvmlReturn::INSUFFICIENT_SIZE)
}

/// The container's view of one device's list: its processes that NVML lists (and, with
/// `unlisted`, those that hold memory there although NVML does not list them), under the
/// container's pids, with the bytes the region counts.
fn container_view(
    nvml: &[Entry],
    ours: impl Iterator<Item = Listed>,
    unlisted: bool,
) -> Vec<Entry> {
    ours.filter_map(|p| {
        let listed = nvml.iter().find(|e| e.pid == p.nvml_pid());
        if listed.is_none() && !(unlisted && p.bytes > 0) {
            return None;
        }
        Some(Entry {
            pid: p.pid,
            bytes: p.bytes,
            gpu_instance: listed.map_or(NO_INSTANCE, |e| e.gpu_instance),
            compute_instance: listed.map_or(NO_INSTANCE, |e| e.compute_instance),
        })
    })
    .collect()
}

/// Copies `items` into the caller's array of `*count` entries as NVML does: the count needed
/// goes into `*count`, an array too small (or none) gets `NVML_ERROR_INSUFFICIENT_SIZE`, and no
/// items at all get `when_empty`.
///
/// # Safety
/// `count` is valid; `out` is null or has room for `*count` entries.
unsafe fn answer<T: Copy>(
    items: &[T],
    count: *mut c_uint,
    out: *mut T,
    when_empty: NvmlReturn,
) -> NvmlReturn {
    // SAFETY: valid per the contract.
    let room = unsafe { *count } as usize;
    // SAFETY: as above.
    unsafe { *count = items.len() as c_uint };
    if items.is_empty() {
        return when_empty;
    }
    if out.is_null() || room < items.len() {
        return NvmlReturn::INSUFFICIENT_SIZE;
    }
    for (i, item) in items.iter().enumerate() {
        // SAFETY: `i < items.len() <= room`, the caller's array length: in bounds.
        let slot = unsafe { out.add(i) };
        // SAFETY: `slot` lies in the caller's writable array (per the contract).
        unsafe { slot.write(*item) };
    }
    NvmlReturn::SUCCESS
}

/// `view` in the entry layout `E`.
fn out_entries<E: ProcEntry>(view: &[Entry]) -> Vec<E> {
    view.iter().map(|e| E::from_entry(*e)).collect()
}

/// A process-list hook: the real query `f` for `device`, rewritten to the container's view.
///
/// # Safety
/// The caller's arguments as NVML documents them.
unsafe fn list_hook<E: ProcEntry>(
    f: ListFn<E>,
    device: NvmlDevice,
    count: *mut c_uint,
    out: *mut E,
    unlisted: bool,
) -> NvmlReturn {
    let (Some(a), Some(dev), false) = (active(), nvml::region_of(device), count.is_null()) else {
        // SAFETY: forwarding the caller's arguments unchanged.
        return unsafe { f(device, count, out) };
    };
    let all = match list_all(device, f) {
        Ok(all) => all,
        Err(r) => return r,
    };
    let entries: Vec<Entry> = all.iter().map(ProcEntry::entry).collect();
    let view = container_view(
        &entries,
        slots::listed(a.rt.region, &a.rt.platform, dev),
        unlisted,
    );
    // SAFETY: `count` is non-null and, with `out`, the caller's per NVML's contract.
    unsafe { answer(&out_entries(&view), count, out, NvmlReturn::SUCCESS) }
}

macro_rules! list_hooks {
    ($( $name:ident: $entry:ty, unlisted = $unlisted:expr; )*) => {
        $(
            hook! {
                fn $name(device: NvmlDevice, count: *mut c_uint, infos: *mut $entry) -> NvmlReturn;
                |real_fn| {
                    // SAFETY: the caller's arguments, passed on.
                    unsafe { list_hook(real_fn, device, count, infos, $unlisted) }
                }
            }
        )*
    };
}

list_hooks! {
    nvmlDeviceGetComputeRunningProcesses: NvmlProcessInfoV1, unlisted = true;
    nvmlDeviceGetComputeRunningProcesses_v2: NvmlProcessInfo, unlisted = true;
    nvmlDeviceGetComputeRunningProcesses_v3: NvmlProcessInfo, unlisted = true;
    nvmlDeviceGetGraphicsRunningProcesses: NvmlProcessInfoV1, unlisted = false;
    nvmlDeviceGetGraphicsRunningProcesses_v2: NvmlProcessInfo, unlisted = false;
    nvmlDeviceGetGraphicsRunningProcesses_v3: NvmlProcessInfo, unlisted = false;
    nvmlDeviceGetMPSComputeRunningProcesses: NvmlProcessInfoV1, unlisted = false;
    nvmlDeviceGetMPSComputeRunningProcesses_v2: NvmlProcessInfo, unlisted = false;
    nvmlDeviceGetMPSComputeRunningProcesses_v3: NvmlProcessInfo, unlisted = false;
}

/// The container's samples among NVML's, under the container's pids.
fn container_samples(
    samples: &[NvmlProcessUtilSample],
    ours: impl Iterator<Item = Listed>,
) -> Vec<NvmlProcessUtilSample> {
    let ours: Vec<Listed> = ours.collect();
    samples
        .iter()
        .filter_map(|s| {
            let p = ours.iter().find(|p| p.nvml_pid() == s.pid)?;
            Some(NvmlProcessUtilSample { pid: p.pid, ..*s })
        })
        .collect()
}

hook! {
    fn nvmlDeviceGetProcessUtilization(
        device: NvmlDevice,
        utilization: *mut NvmlProcessUtilSample,
        count: *mut c_uint,
        last_seen: u64,
    ) -> NvmlReturn;
    |real_fn| {
        let (Some(a), Some(dev), false) = (active(), nvml::region_of(device), count.is_null())
        else {
            // SAFETY: forwarding the caller's arguments unchanged.
            return unsafe { real_fn(device, utilization, count, last_seen) };
        };
        let samples = match nvml::process_samples(device, real_fn, last_seen) {
            Ok(s) => s,
            Err(r) => return r,
        };
        let ours = container_samples(&samples, slots::listed(a.rt.region, &a.rt.platform, dev));
        // NVML answers NOT_FOUND when no process ran since `last_seen`.
        // SAFETY: `count` is non-null and, with `utilization`, the caller's per NVML's contract.
        unsafe { answer(&ours, count, utilization, NvmlReturn::NOT_FOUND) }
    }
}

hook! {
    fn nvmlSystemGetProcessName(pid: c_uint, name: *mut c_char, length: c_uint) -> NvmlReturn;
    |real_fn| {
        // One of the container's processes (a pid from the lists above): its name is in the
        // container's /proc; NVML would look the pid up among the host's.
        let ours = active()
            .is_some_and(|a| slots::listed(a.rt.region, &a.rt.platform, 0).any(|p| p.pid == pid));
        let own_name = ours.then(|| process_name(pid)).flatten();
        match own_name {
            Some(text) if !name.is_null() && length > 0 => {
                let n = text.len().min(length as usize - 1);
                // SAFETY: the caller's buffer of `length` bytes, `n + 1 <= length`, and `text`
                // (at least `n` bytes, our own Vec) cannot overlap it.
                unsafe { std::ptr::copy_nonoverlapping(text.as_ptr(), name.cast::<u8>(), n) };
                // SAFETY: `n < length`: still inside the caller's buffer.
                let end = unsafe { name.add(n) };
                // SAFETY: `end` lies in the caller's writable buffer.
                unsafe { *end = 0 };
                NvmlReturn::SUCCESS
            }
            // SAFETY: the caller's arguments, passed on.
            _ => unsafe { real_fn(pid, name, length) },
        }
    }
}

/// A process's name as NVML gives it: the first word of its command line, else its `comm`.
fn process_name(pid: u32) -> Option<Vec<u8>> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let first = cmdline.split(|&b| b == 0).next().unwrap_or_default();
    if !first.is_empty() {
        return Some(first.to_vec());
    }
    let comm = std::fs::read(format!("/proc/{pid}/comm")).ok()?;
    Some(comm.strip_suffix(b"\n").unwrap_or(&comm).to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nv(pid: u32, mib: u64) -> Entry {
        Entry {
            pid,
            bytes: mib << 20,
            gpu_instance: NO_INSTANCE,
            compute_instance: NO_INSTANCE,
        }
    }

    fn ours(pid: u32, hostpid: u32, mib: u64) -> Listed {
        Listed {
            pid,
            hostpid,
            bytes: mib << 20,
        }
    }

    /// NVML lists host pids 1007 and 1009 (ours, as 7 and 9) and 5000 (another container's).
    /// The container sees 7 and 9 with the region's counts, never 5000; a process whose host
    /// pid is unknown is matched by its own pid (a driver that reports the container's pids);
    /// a process that holds memory but is not listed appears only where `unlisted` asks.
    #[test]
    fn the_container_sees_its_processes_under_its_pids_with_the_regions_counts() {
        let nvml = [nv(1007, 600), nv(5000, 900), nv(1009, 300), nv(12, 100)];
        let region = [
            ours(7, 1007, 582),
            ours(9, 1009, 282),
            ours(12, 0, 64),
            ours(14, 0, 70),
            ours(15, 0, 0),
        ];
        let view = container_view(&nvml, region.iter().copied(), true);
        assert_eq!(
            view,
            [nv(7, 582), nv(9, 282), nv(12, 64), nv(14, 70)],
            "7, 9 and 12 matched, 14 holds memory unlisted, 15 holds none, 5000 is not ours"
        );
        let graphics = container_view(&nvml, region.iter().copied(), false);
        assert_eq!(graphics, [nv(7, 582), nv(9, 282), nv(12, 64)]);
        assert!(container_view(&[nv(5000, 900)], region[..2].iter().copied(), false).is_empty());
    }

    #[test]
    fn answers_follow_nvmls_size_contract() {
        let view: Vec<NvmlProcessInfo> = out_entries(&[nv(7, 1), nv(9, 2)]);
        let ok = NvmlReturn::SUCCESS;
        let mut count: c_uint = 1;
        let mut out = [NvmlProcessInfo::default(); 2];
        // SAFETY: a valid count and an array of 2 (1 announced).
        let r = unsafe { answer(&view, &mut count, out.as_mut_ptr(), ok) };
        assert_eq!((r, count), (NvmlReturn::INSUFFICIENT_SIZE, 2));
        // SAFETY: as above, 2 announced.
        let r = unsafe { answer(&view, &mut count, out.as_mut_ptr(), ok) };
        assert_eq!((r, count, out[1].pid), (ok, 2, 9));
        let mut zero: c_uint = 0;
        // SAFETY: a null array with a count of 0 asks for the size.
        let r = unsafe { answer(&view, &mut zero, std::ptr::null_mut(), ok) };
        assert_eq!((r, zero), (NvmlReturn::INSUFFICIENT_SIZE, 2));
        // SAFETY: nothing to write.
        let r = unsafe { answer::<NvmlProcessInfo>(&[], &mut zero, std::ptr::null_mut(), ok) };
        assert_eq!((r, zero), (ok, 0));
        let none = NvmlReturn::NOT_FOUND;
        // SAFETY: nothing to write.
        let r = unsafe { answer::<NvmlProcessInfo>(&[], &mut zero, std::ptr::null_mut(), none) };
        assert_eq!((r, zero), (none, 0), "samples: none since last_seen");
    }

    #[test]
    fn utilisation_samples_are_the_containers_under_its_pids() {
        let s = |pid, sm| NvmlProcessUtilSample {
            pid,
            sm_util: sm,
            ..NvmlProcessUtilSample::default()
        };
        let region = [ours(7, 1007, 1), ours(12, 0, 1)];
        let got = container_samples(&[s(1007, 40), s(5000, 50), s(12, 5)], region.into_iter());
        let pids: Vec<(u32, u32)> = got.iter().map(|x| (x.pid, x.sm_util)).collect();
        assert_eq!(pids, [(7, 40), (12, 5)]);
    }
}
