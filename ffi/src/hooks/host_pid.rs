//! Host pid discovery: which entry of NVML's process list is this process.
//!
//! In a container a process's pid differs from the pid NVML reports (the host's). HAMi's monitor
//! and our NVML hooks match NVML's entries to slots by the slot's `hostpid`, so each process
//! finds its own once, at its first counted context, and writes it into its slot. HAMi-core
//! serialises this with a region-wide semaphore around a ~165 ms probe; here processes run it in
//! parallel, with no lock at all, in a bounded time:
//!
//! 1. **Cheap answers.** Our own pid, or the outermost pid of `/proc/self/status`'s `NSpid:`
//!    (when it names more than one namespace), is in NVML's list and appeared or grew with our
//!    context: the same pid namespace as the driver, or a host `/proc`.
//! 2. **Candidates.** The pids that are new in the list since the snapshot before our context was
//!    created, less those another live slot of the region has already claimed. If exactly one and
//!    no other process of the region is still looking, it is ours.
//! 3. **Probe.** Otherwise (several candidates, or peers looking at the same time, which could
//!    make a lone candidate theirs while NVML has not listed us yet) we allocate, through the real
//!    driver and uncounted, a size unique to our slot (`(slot mod 64 + 1)` × 2 MiB or the device's
//!    granularity), and watch which candidate's usage grows by exactly that much; the probe is
//!    freed at once. Peers probe at the same time with other sizes.
//! 4. **Claim.** [`hami_shm::host_pid::claim`]: our slot's `hostpid` goes 0 → pid, then the other
//!    slots are read for the same value; of two processes claiming one pid at least one sees the
//!    other. Whoever sees a conflict withdraws, waits a time set by its slot index and settles the
//!    next round by probe. No pid stays claimed twice.
//!
//! A driver that translates pids reports a container's processes with the pids of the container's
//! own namespace. Our own pid in NVML's list while we run outside the initial pid namespace is
//! such a case: it is the right pid for our own NVML queries, but not the host pid HAMi's monitor
//! matches against the host's list (there it names some other process). It is kept for our
//! queries and `hostpid` stays 0 for the monitor to fill in, with one line at info level.
//!
//! Everything polls NVML (whose lists lag the driver) until 2 s have passed. On failure one
//! warning names the problem and the fix, `hostpid` stays 0 and accounting uses the container pid,
//! as HAMi-core does. A forked child has a new pid, so it forgets the result and looks again.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use hami_shm::host_pid::{claim, claimed_by_others, peers_looking, Claim};
use hami_shm::platform::Platform;

use crate::log::{log_debug, log_info, log_warn};
use crate::one_time::OneTime;
use crate::platform::{monotonic_ns, ms_between};
use crate::runtime::Runtime;

use super::real;
use super::types::*;
use super::{devices, nvml_procs};

/// One entry of NVML's compute-process list: `(pid, used bytes)`.
pub type Proc = (u32, u64);

/// How long discovery may hold up the context creation that triggers it.
const DEADLINE_NS: u64 = 2_000_000_000;
/// How long one probe allocation is held while NVML is polled for it.
const PROBE_WINDOW_NS: u64 = 300_000_000;
/// Longest pause between two polls of NVML.
const MAX_PAUSE_MS: u64 = 20;
/// Consecutive failed NVML queries after which discovery gives up early.
const MAX_NVML_ERRORS: u32 = 3;
/// Probe sizes cycle through this many multiples of the step, bounding the probe to 128 MiB.
const PROBE_SIZES: u64 = 64;

/// This process's search for its host pid, once (again in a forked child).
static SEARCH: OneTime = OneTime::new();
/// The host pid found (0 = unknown).
static FOUND: AtomicU32 = AtomicU32::new(0);

/// The host pid this process found, if any.
pub fn known() -> Option<u32> {
    match FOUND.load(Ordering::Acquire) {
        0 => None,
        p => Some(p),
    }
}

/// In a forked child (atomics only): the child has its own pid, so it looks again.
pub(crate) fn after_fork() {
    FOUND.store(0, Ordering::Relaxed);
    SEARCH.reset();
}

/// NVML's process list for region device `dev`.
pub fn processes(dev: usize) -> Option<Vec<Proc>> {
    let h = devices::nvml_handle(dev)?;
    let v2 = nvml_procs::nvmlDeviceGetComputeRunningProcesses_v3::REAL
        .get()
        .or_else(|| nvml_procs::nvmlDeviceGetComputeRunningProcesses_v2::REAL.get());
    match v2 {
        Some(f) => nvml_procs::pids_and_bytes(h, f),
        None => nvml_procs::pids_and_bytes(
            h,
            nvml_procs::nvmlDeviceGetComputeRunningProcesses::REAL.get()?,
        ),
    }
}

/// Usage of `pid` in `list`, if listed with a known value.
pub fn usage_of(list: &[Proc], pid: u32) -> Option<u64> {
    if pid == 0 {
        return None;
    }
    list.iter()
        .find(|(p, _)| *p == pid)
        .map(|&(_, u)| u)
        .filter(|&u| u != u64::MAX)
}

// ---- Pure decisions ----------------------------------------------------------------------------

/// The outermost pid of the `NSpid:` line of a `/proc/<pid>/status` text, when the line lists
/// more than one namespace (the first entry is the pid in the namespace of that `/proc`'s
/// mounter). Malformed lines give `None`.
fn outer_nspid(status: &str) -> Option<u32> {
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    let mut pids = line.split_whitespace().map(|w| w.parse::<u32>().ok());
    let first = pids.next()??;
    let mut more = false;
    for p in pids {
        p?;
        more = true;
    }
    (more && first != 0).then_some(first)
}

/// What one look at NVML's list decided.
#[derive(Debug, PartialEq, Eq)]
enum Choice {
    /// This pid is ours.
    Take(u32),
    /// One of these is ours: probe.
    Probe(Vec<u32>),
    /// Nothing to choose from yet (NVML may lag).
    Wait,
}

/// Decides from the list `before` our context and the list `after` it. `own`: pids that are ours
/// if they appeared or grew (our pid, the outer NSpid); `claimed`: host pids of other live slots;
/// `careful`: a lone candidate must be confirmed by probe (peers are looking too, or `before` is
/// unknown).
fn choose(before: &[Proc], after: &[Proc], own: &[u32], claimed: &[u32], careful: bool) -> Choice {
    let was = |p: u32| usage_of(before, p);
    let is_new = |p: u32| !before.iter().any(|&(q, _)| q == p);
    for &p in own {
        if p == 0 || claimed.contains(&p) {
            continue;
        }
        if let Some(now) = usage_of(after, p) {
            if is_new(p) || was(p).is_some_and(|b| now > b) {
                return Choice::Take(p);
            }
        }
    }
    let mut cands: Vec<u32> = after
        .iter()
        .map(|&(p, _)| p)
        .filter(|&p| p != 0 && is_new(p) && !claimed.contains(&p))
        .collect();
    cands.dedup();
    match cands.len() {
        0 => Choice::Wait,
        1 if !careful => Choice::Take(cands[0]),
        _ => Choice::Probe(cands),
    }
}

/// The probe size for slot `slot` in round `round`: multiples of `step`, distinct for distinct
/// slots below [`PROBE_SIZES`] in round 0; later rounds mix in the pid, so two processes whose
/// sizes collided (slots 64 apart, or another container's) part.
fn probe_size(slot: usize, round: u64, pid: u32, step: u64) -> u64 {
    let mix = round.wrapping_mul(1 + u64::from(pid) % 31);
    ((slot as u64).wrapping_add(mix) % PROBE_SIZES + 1) * step
}

/// The one candidate whose usage grew from `a` to `b` by `size` (within one `step`, so other
/// probe sizes never match), if exactly one did.
fn probe_match(cands: &[u32], a: &[Proc], b: &[Proc], size: u64, step: u64) -> Option<u32> {
    let mut hits = cands
        .iter()
        .copied()
        .filter(|&p| match (usage_of(a, p), usage_of(b, p)) {
            (Some(x), Some(y)) => y
                .checked_sub(x)
                .is_some_and(|d| d >= size && d < size + step),
            _ => false,
        });
    let hit = hits.next()?;
    hits.next().is_none().then_some(hit)
}

// ---- Discovery ---------------------------------------------------------------------------------

/// Why discovery failed, for the one warning.
#[derive(Clone, Copy)]
enum Failure {
    NoNvml,
    NvmlQuery,
    NotListed,
    Ambiguous(usize),
    ProbeFailed(CUresult),
    NoSlot,
}

impl Failure {
    /// The problem and its fix, for the log line.
    fn describe(self) -> (String, &'static str) {
        let nvml_fix = "make NVML usable in the container (libnvidia-ml.so.1 and /dev/nvidiactl; \
                        check that nvidia-smi works)";
        match self {
            Failure::NoNvml => ("NVML cannot be initialised".into(), nvml_fix),
            Failure::NvmlQuery => ("NVML's process list query fails".into(), nvml_fix),
            Failure::NotListed => (
                "this process did not appear in NVML's process list within 2 s".into(),
                "check that `nvidia-smi --query-compute-apps=pid --format=csv` lists processes \
                 of this container",
            ),
            Failure::Ambiguous(n) => (
                format!("{n} new processes in NVML's list and the probe allocation could not tell which is this one"),
                "retry; if it persists, report it with LIBCUDA_LOG_LEVEL=4",
            ),
            Failure::ProbeFailed(r) => (
                format!("the probe allocation failed (CUresult {})", r.0),
                "leave some GPU memory free when processes start",
            ),
            Failure::NoSlot => (
                "this process has no slot in the shared region".into(),
                "see the earlier message about the shared region",
            ),
        }
    }
}

/// What [`discover`] needs to know about the context just created.
pub struct NewContext {
    /// Region device of the context.
    pub dev: usize,
    /// Its CUDA ordinal.
    pub ordinal: CUdevice,
    /// The context, for the probe allocation.
    pub ctx: CUcontext,
}

/// Finds this process's host pid after its first counted context (module docs), once per
/// process; `before` is NVML's list taken just before the context was created. Returns the last
/// list NVML gave without a probe allocation in it (to measure the context's cost), or `None` if
/// discovery did not run.
pub fn discover(rt: &Runtime, new: &NewContext, before: Option<&[Proc]>) -> Option<Vec<Proc>> {
    let mut list = None;
    SEARCH.start(|| {
        list = search_once(rt, new, before);
        true
    });
    list
}

/// The search itself (module docs), logging what it found.
fn search_once(rt: &Runtime, new: &NewContext, before: Option<&[Proc]>) -> Option<Vec<Proc>> {
    let start = monotonic_ns();
    let (outcome, list) = search(rt, new, before, start + DEADLINE_NS);
    let ms = ms_between(start, monotonic_ns());
    match outcome {
        Ok((pid, NAMESPACE_PID)) => {
            FOUND.store(pid, Ordering::Release);
            log_info!(
                "NVML lists this process as pid {pid}, its pid in the container's namespace (the \
                 driver translates pids): used for our own NVML queries; hostpid stays 0 for \
                 HAMi's monitor to set (after {ms} ms)"
            );
        }
        Ok((pid, how)) => {
            FOUND.store(pid, Ordering::Release);
            if let Some(slot) = rt.own_slot().and_then(|s| rt.region.slot(s)) {
                crate::capi::host_pid_recorded(slot, pid as i32);
            }
            log_debug!("host pid {pid} found in {ms} ms (by {how})");
        }
        Err(why) => {
            let (problem, fix) = why.describe();
            log_warn!(
                "SET_TASK_PID FAILED - using container PID for accounting: {problem} (after \
                 {ms} ms); HAMi's monitor cannot attribute this process's GPU usage. Fix: {fix}"
            );
        }
    }
    list
}

/// A host pid and how it was found (for the debug log), or why none was.
type Found = Result<(u32, &'static str), Failure>;

/// How [`search`] names a pid that is ours in NVML's list but not a host pid (module docs).
const NAMESPACE_PID: &str = "own pid in a translated pid namespace";

/// The inode of the initial pid namespace (the kernel's `PROC_PID_INIT_INO`).
const INITIAL_PID_NS: &str = "pid:[4026531836]";

/// Whether the list NVML gives before the first context can be skipped when NVML is not ready
/// yet, rather than waited for: in the initial pid namespace discovery takes the cheap path
/// (our own pid), which needs no list from before, and the first context's cost is all of our
/// usage after it. Elsewhere the list tells new pids from old ones, so it is waited for.
pub fn list_before_optional() -> bool {
    SEARCH.is_idle() && in_initial_pid_ns()
}

/// Whether this process runs in the initial (host) pid namespace; true if it cannot tell.
fn in_initial_pid_ns() -> bool {
    std::fs::read_link("/proc/self/ns/pid").map_or(true, |l| l.as_os_str() == INITIAL_PID_NS)
}

/// The search loop of [`discover`]: the host pid and how it was found, or why not; and the last
/// probe-free list.
fn search(
    rt: &Runtime,
    new: &NewContext,
    before: Option<&[Proc]>,
    deadline: u64,
) -> (Found, Option<Vec<Proc>>) {
    let me = rt.platform.self_id().pid() as u32;
    let own = [
        me,
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| outer_nspid(&s))
            .unwrap_or(0),
    ];
    let step = devices::granularity(new.ordinal).max(devices::DEFAULT_GRANULE);
    let mut last: Option<Vec<Proc>> = None;
    let mut why = Failure::NotListed;
    let mut errors = 0;
    let mut careful = before.is_none();
    let mut round = 0u64;
    let mut pause_ms = 1;
    loop {
        let Some(mine) = rt.own_slot() else {
            return (Err(Failure::NoSlot), last);
        };
        if let Some(h) = rt.region.slot(mine).map(|s| s.hostpid_acquire()) {
            if h > 0 {
                return (Ok((h as u32, "preset")), last);
            }
        }
        match processes(new.dev) {
            None => {
                if !devices::nvml_init() {
                    return (Err(Failure::NoNvml), last);
                }
                errors += 1;
                why = Failure::NvmlQuery;
                if errors >= MAX_NVML_ERRORS {
                    return (Err(why), last);
                }
            }
            Some(after) => {
                errors = 0;
                let claimed: Vec<u32> = claimed_by_others(rt.region, mine).collect();
                let careful_now = careful || peers_looking(rt.region, mine);
                let pick = match choose(before.unwrap_or(&[]), &after, &own, &claimed, careful_now)
                {
                    Choice::Take(p) if p == own[0] && !in_initial_pid_ns() => {
                        return (Ok((p, NAMESPACE_PID)), Some(after));
                    }
                    Choice::Take(p) if p == own[0] => Some((p, "own pid")),
                    Choice::Take(p) if p == own[1] => Some((p, "NSpid")),
                    Choice::Take(p) => Some((p, "lone candidate")),
                    Choice::Wait => {
                        why = Failure::NotListed;
                        None
                    }
                    Choice::Probe(cands) => {
                        let size = probe_size(mine, round, me, step);
                        round += 1;
                        match probe(new, &cands, &after, size, step, deadline) {
                            Ok(Some(p)) => Some((p, "probe")),
                            Ok(None) => {
                                why = Failure::Ambiguous(cands.len());
                                None
                            }
                            Err(r) => {
                                why = Failure::ProbeFailed(r);
                                None
                            }
                        }
                    }
                };
                last = Some(after);
                if let Some((p, how)) = pick {
                    match claim(rt.region, mine, p) {
                        Claim::Won => return (Ok((p, how)), last),
                        Claim::Preset(h) => return (Ok((h, "preset")), last),
                        Claim::Impossible => return (Err(Failure::NoSlot), last),
                        Claim::Conflict => {
                            // Settle it by probe, after a pause that differs between the two.
                            careful = true;
                            why = Failure::Ambiguous(2);
                            pause_ms = 1 + (mine as u64 % 8);
                        }
                    }
                }
            }
        }
        let now = monotonic_ns();
        if now >= deadline {
            return (Err(why), last);
        }
        let pause = (pause_ms * 1_000_000).min(deadline - now);
        std::thread::sleep(Duration::from_nanos(pause));
        pause_ms = (pause_ms * 2).min(MAX_PAUSE_MS);
    }
}

/// Holds an uncounted allocation of `size` bytes in `new.ctx` while polling NVML for the one
/// candidate whose usage grew by it since `a` (module docs, step 3). `Err` if the allocation
/// failed.
fn probe(
    new: &NewContext,
    cands: &[u32],
    a: &[Proc],
    size: u64,
    step: u64,
    deadline: u64,
) -> Result<Option<u32>, CUresult> {
    let (Some(push), Some(pop), Some(alloc), Some(free)) = (
        real::cuCtxPushCurrent_v2.get(),
        real::cuCtxPopCurrent_v2.get(),
        super::memory::cuMemAlloc_v2::REAL.get(),
        super::memory::cuMemFree_v2::REAL.get(),
    ) else {
        return Err(CUresult::NOT_FOUND);
    };
    // SAFETY: making the context the driver just created for us current on this thread; popped
    // below before returning.
    let r = unsafe { push(new.ctx) };
    if !r.ok() {
        return Err(r);
    }
    let mut ptr: CUdeviceptr = 0;
    // SAFETY: the real allocation writing one device pointer into a local; freed below.
    let r = unsafe { alloc(&mut ptr, size as usize) };
    let result = if r.ok() {
        let until = deadline.min(monotonic_ns() + PROBE_WINDOW_NS);
        let mut found = None;
        let mut pause_us = 200;
        loop {
            if let Some(b) = processes(new.dev) {
                found = probe_match(cands, a, &b, size, step);
            }
            if found.is_some() || monotonic_ns() >= until {
                break;
            }
            std::thread::sleep(Duration::from_micros(pause_us));
            pause_us = (pause_us * 2).min(5_000);
        }
        // SAFETY: freeing the allocation made just above, in the same (current) context.
        let _ = unsafe { free(ptr) };
        Ok(found)
    } else {
        Err(r)
    };
    let mut popped: CUcontext = std::ptr::null_mut();
    // SAFETY: popping the context pushed above, into a local.
    let _ = unsafe { pop(&mut popped) };
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: u64 = 1 << 20;

    #[test]
    fn nspid_outer_entry() {
        let s = "Name:\tx\nPid:\t7\nNSpid:\t4711\t7\nNSpgid:\t1\n";
        assert_eq!(outer_nspid(s), Some(4711));
        assert_eq!(outer_nspid("NSpid:\t9\t8\t7\n"), Some(9));
    }

    #[test]
    fn nspid_single_or_malformed_is_none() {
        for s in [
            "NSpid:\t7\n",
            "NSpid:\n",
            "NSpid:",
            "Pid:\t7\n",
            "",
            "NSpid:\tx\t7\n",
            "NSpid:\t12\t-3\n",
            "NSpid:\t99999999999999999999\t1\n",
            "NSpid:\t0\t5\n",
            "NSpid:\t1\t\u{fffd}\n",
            "NSpid 5 6\n",
        ] {
            assert_eq!(outer_nspid(s), None, "{s:?}");
        }
    }

    #[test]
    fn own_pid_that_appeared_or_grew_is_taken() {
        let before = [(10, 5 * M)];
        assert_eq!(
            choose(&before, &[(10, 5 * M), (7, 300 * M)], &[7, 0], &[], true),
            Choice::Take(7)
        );
        // Already listed before and grew: ours (a context made before counting began).
        assert_eq!(
            choose(&[(7, M)], &[(7, 9 * M), (8, M)], &[7], &[], true),
            Choice::Take(7)
        );
        // Listed before and unchanged: another process that happens to have our number.
        assert_eq!(choose(&[(7, M)], &[(7, M)], &[7], &[], false), Choice::Wait);
        // The outer NSpid counts as ours too; a claimed one does not.
        assert_eq!(
            choose(&[], &[(4711, M)], &[7, 4711], &[], true),
            Choice::Take(4711)
        );
        assert_eq!(choose(&[], &[(7, M)], &[7], &[7], true), Choice::Wait);
    }

    #[test]
    fn candidates_are_new_and_unclaimed() {
        let before = [(100, M)];
        let after = [(100, 2 * M), (200, M), (300, M), (400, M)];
        assert_eq!(
            choose(&before, &after, &[7], &[200, 300], false),
            Choice::Take(400)
        );
        assert_eq!(
            choose(&before, &after, &[7], &[200, 300], true),
            Choice::Probe(vec![400])
        );
        assert_eq!(
            choose(&before, &after, &[7], &[200], false),
            Choice::Probe(vec![300, 400])
        );
        assert_eq!(
            choose(&before, &after, &[7], &[200, 300, 400], false),
            Choice::Wait
        );
        assert_eq!(choose(&before, &before, &[7], &[], false), Choice::Wait);
        assert_eq!(choose(&[], &[], &[], &[], false), Choice::Wait);
    }

    #[test]
    fn probe_sizes_are_distinct_per_slot_and_bounded() {
        let sizes: Vec<u64> = (0..64).map(|s| probe_size(s, 0, 1234, 2 * M)).collect();
        let mut sorted = sizes.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 64);
        assert_eq!(sizes[0], 2 * M);
        for slot in [0, 63, 64, 1023, usize::MAX] {
            for round in [0, 1, 7, u64::MAX] {
                let s = probe_size(slot, round, u32::MAX, 2 * M);
                assert!((2 * M..=128 * M).contains(&s) && s & (2 * M - 1) == 0);
            }
        }
        // Slots 64 apart collide in round 0 and part later when their pids differ.
        assert_eq!(probe_size(1, 0, 10, 2 * M), probe_size(65, 0, 11, 2 * M));
        assert_ne!(probe_size(1, 1, 10, 2 * M), probe_size(65, 1, 11, 2 * M));
    }

    #[test]
    fn probe_matches_exactly_one_growth() {
        let a = [(1, 300 * M), (2, 300 * M), (3, 300 * M)];
        // 1 grew by our 4 MiB, 2 by a peer's 6 MiB, 3 shrank (a peer freed its probe).
        let b = [(1, 304 * M), (2, 306 * M), (3, 290 * M)];
        assert_eq!(probe_match(&[1, 2, 3], &a, &b, 4 * M, 2 * M), Some(1));
        assert_eq!(probe_match(&[2, 3], &a, &b, 4 * M, 2 * M), None);
        assert_eq!(probe_match(&[1, 2, 3], &a, &b, 6 * M, 2 * M), Some(2));
        // Two growths of our size: undecided.
        let b2 = [(1, 304 * M), (2, 304 * M)];
        assert_eq!(probe_match(&[1, 2], &a, &b2, 4 * M, 2 * M), None);
        // Unlisted or unavailable usage never matches.
        assert_eq!(probe_match(&[1], &a, &[(1, u64::MAX)], 4 * M, 2 * M), None);
        assert_eq!(probe_match(&[9], &a, &[(9, 4 * M)], 4 * M, 2 * M), None);
    }
}
