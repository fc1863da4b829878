//! The named operations on the region's fields, one per thing a caller does with them, so that
//! no other crate (hami-vgpu, hami-linux, the tool) makes an atomic load or store on region
//! bytes itself (`ffi/tests/hygiene.rs` checks that). Each operation keeps the memory ordering its callers used; where one field is
//! read with two orderings, both are offered and the doc says which caller needs which.
//!
//! Loads named `*_acquire` pair with a release store by the writer of that field (the claim's
//! pid, `set_hostpid`, a status CAS) for callers that go on to read what it published; the plain
//! names are relaxed glances (logging, statistics, a hint re-checked later).

use core::num::NonZeroU64;

use crate::context::ContextCell;
use crate::layout::{DeviceUuid, Ext, ProcSlot, RawSem, Region, SmBucket, EXT_MAGIC, UUID_LEN};
use crate::platform::ProcId;
use crate::sync::Ordering;

// ---- Per-device view of the region ------------------------------------------------------------

impl<const SLOTS: usize, const DEVS: usize> Region<SLOTS, DEVS> {
    /// Slot `i` of the process table, for the operations on [`ProcSlot`]; `None` past the table.
    pub fn slot(&self, i: usize) -> Option<&ProcSlot<DEVS>> {
        self.procs.get(i)
    }

    /// Frees every slot of the table ([`ProcSlot::reset`] each): `shrreg-tool --reset`, under
    /// the init lock.
    pub fn clear_slots(&self) {
        for slot in &self.procs {
            slot.reset();
        }
    }

    /// The region's init-and-accounting semaphore, for the [`crate::platform::Platform`]'s
    /// semaphore operations.
    pub fn sem(&self) -> &RawSem {
        &self.sem
    }

    /// The semaphore HAMi-core's post-init steps (host-pid discovery) take.
    pub fn sem_postinit(&self) -> &RawSem {
        &self.sem_postinit
    }

    /// The memory limit of device `dev` (relaxed); `None`: unlimited, or no such device.
    pub fn limit(&self, dev: usize) -> Option<NonZeroU64> {
        NonZeroU64::new(self.limit.get(dev)?.load(Ordering::Relaxed))
    }

    /// Sets the memory limit of device `dev` for every process (relaxed; 0 = unlimited). A `dev`
    /// the region does not have is ignored.
    pub fn set_limit(&self, dev: usize, bytes: u64) {
        if let Some(l) = self.limit.get(dev) {
            l.store(bytes, Ordering::Relaxed);
        }
    }

    /// The SM limit of device `dev` in percent (relaxed); 0 for no such device.
    pub fn sm_limit(&self, dev: usize) -> u64 {
        self.sm_limit
            .get(dev)
            .map_or(0, |l| l.load(Ordering::Relaxed))
    }

    /// Multiplies the SM limit of device `dev` by `scale`, once per region: the first caller of
    /// any process wins the CAS of `sm_init_flag` from 0 to 1 (acq-rel) and scales (saturating,
    /// relaxed); later calls change nothing. Returns whether this call scaled.
    pub fn scale_sm_limit_once(&self, dev: usize, scale: u64) -> bool {
        let Some(l) = self.sm_limit.get(dev) else {
            return false;
        };
        let first = self
            .sm_init_flag
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if first {
            let _ = l.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_mul(scale))
            });
        }
        first
    }

    /// `device_num` with acquire, bounded by `DEVS`: the entries below it are published
    /// ([`Region::record_devices`] stores it with release).
    pub fn device_count(&self) -> usize {
        (self.device_num.load(Ordering::Acquire) as usize).min(DEVS)
    }

    /// Whether any process has recorded the devices (`device_num != 0`, relaxed: a glance before
    /// writing the same entries, which reads none of them).
    pub fn devices_recorded(&self) -> bool {
        self.device_num.load(Ordering::Relaxed) != 0
    }

    /// The UUID text of device `dev` (relaxed byte loads) and its length up to the first NUL;
    /// `None` for no such device.
    pub fn uuid(&self, dev: usize) -> Option<([u8; UUID_LEN], usize)> {
        self.uuids.get(dev).map(DeviceUuid::load)
    }
}

impl DeviceUuid {
    /// The entry's bytes (relaxed loads) and the length of its text (up to the first NUL).
    pub fn load(&self) -> ([u8; UUID_LEN], usize) {
        let mut out = [0u8; UUID_LEN];
        for (o, c) in out.iter_mut().zip(&self.text) {
            *o = c.load(Ordering::Relaxed);
        }
        let len = out.iter().position(|&b| b == 0).unwrap_or(UUID_LEN);
        (out, len)
    }
}

// ---- The monitor's fields and the kernel gate -------------------------------------------------

impl<const SLOTS: usize, const DEVS: usize> Region<SLOTS, DEVS> {
    /// `utilization_switch`, which HAMi's monitor toggles (relaxed: a hint read per launch).
    pub fn utilization_switch(&self) -> i32 {
        self.utilization_switch.load(Ordering::Relaxed)
    }

    /// `recent_kernel` as the C API reads it (seq-cst, as upstream's plain int read by C callers
    /// that order it against their own accesses).
    pub fn recent_kernel(&self) -> i32 {
        self.recent_kernel.load(Ordering::SeqCst)
    }

    /// Stores `recent_kernel` for the C API (seq-cst, as [`Region::recent_kernel`]).
    pub fn set_recent_kernel(&self, value: i32) {
        self.recent_kernel.store(value, Ordering::SeqCst);
    }

    /// `recent_kernel` as the launch path's priority gate polls it (relaxed: one load per launch
    /// once marked; nothing else is read on the strength of it).
    pub fn kernel_gate(&self) -> i32 {
        self.recent_kernel.load(Ordering::Relaxed)
    }

    /// Marks the container active: CAS of `recent_kernel` from `seen` (the gate's last relaxed
    /// load) to `active`, relaxed, so that a -1 the monitor stored since is never overwritten.
    pub fn mark_kernel_active(&self, seen: i32, active: i32) -> bool {
        self.recent_kernel
            .compare_exchange(seen, active, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }

    /// The region's task priority (relaxed).
    pub fn priority(&self) -> i32 {
        self.priority.load(Ordering::Relaxed)
    }

    /// Records a kernel launch at `now` (seconds): `last_kernel_time` only moves forward
    /// (`fetch_max`, acq-rel).
    pub fn note_kernel_time(&self, now: u64) {
        self.last_kernel_time.fetch_max(now, Ordering::AcqRel);
    }

    /// The owner lock's holder (`owner_pid`, seq-cst as [`crate::lock`] reads it), for messages
    /// and the inspector's checks around a repair.
    pub fn owner(&self) -> ProcId {
        ProcId(self.owner_pid.load(Ordering::SeqCst))
    }

    /// Marks the region uninitialised (`initialized_flag = 0`, seq-cst), so that the next
    /// [`crate::init::ensure_initialised`] redoes everything. Only under the init lock
    /// (`shrreg-tool --reset`).
    pub fn mark_uninitialised(&self) {
        self.initialized_flag.store(0, Ordering::SeqCst);
    }
}

// ---- A slot's fields ---------------------------------------------------------------------------

impl<const DEVS: usize> ProcSlot<DEVS> {
    /// The slot's pid (relaxed glance; 0 = free).
    pub fn pid(&self) -> i32 {
        self.pid.load(Ordering::Relaxed)
    }

    /// The slot's pid with acquire, for callers that then read the slot's other fields.
    pub fn pid_acquire(&self) -> i32 {
        self.pid.load(Ordering::Acquire)
    }

    /// The slot's host pid (relaxed glance; 0 = unknown).
    pub fn hostpid(&self) -> i32 {
        self.hostpid.load(Ordering::Relaxed)
    }

    /// The host pid with acquire (pairs with [`ProcSlot::set_hostpid`]).
    pub fn hostpid_acquire(&self) -> i32 {
        self.hostpid.load(Ordering::Acquire)
    }

    /// Records `hostpid` (release), as HAMi-core's `set_host_pid`.
    pub fn set_hostpid(&self, hostpid: i32) {
        self.hostpid.store(hostpid, Ordering::Release);
    }

    /// The host-pid claim, step one: CAS of `hostpid` from 0 to `v` (seq-cst, like every access
    /// of the claim: each claimant stores, then reads the others', so two claimants of one pid
    /// cannot both miss each other). `Err(current)` if the slot holds another value already.
    pub fn claim_hostpid(&self, v: i32) -> Result<(), i32> {
        match self
            .hostpid
            .compare_exchange(0, v, Ordering::SeqCst, Ordering::SeqCst)
        {
            Ok(_) => Ok(()),
            Err(cur) if cur == v => Ok(()),
            Err(cur) => Err(cur),
        }
    }

    /// Withdraws a conflicting claim: CAS of `hostpid` from `v` back to 0 (seq-cst).
    pub fn withdraw_hostpid(&self, v: i32) {
        let _ = self
            .hostpid
            .compare_exchange(v, 0, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// The host pid this slot claims, for a claimant's check of the others: `None` if the slot is
    /// free; pid, then host pid, both seq-cst (see [`ProcSlot::claim_hostpid`]).
    pub fn claimed_hostpid(&self) -> Option<i32> {
        (self.pid.load(Ordering::SeqCst) != 0).then(|| self.hostpid.load(Ordering::SeqCst))
    }

    /// The slot's status (relaxed glance).
    pub fn status(&self) -> i32 {
        self.status.load(Ordering::Relaxed)
    }

    /// The slot's status with acquire, for waiters (pairs with [`ProcSlot::change_status`]).
    pub fn status_acquire(&self) -> i32 {
        self.status.load(Ordering::Acquire)
    }

    /// Moves the status from `from` to `to` (CAS, acq-rel); whether it moved.
    pub fn change_status(&self, from: i32, to: i32) -> bool {
        self.status
            .compare_exchange(from, to, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }

    /// The seqlock word (acquire), for the inspector (odd: a writer is inside).
    pub fn seqlock_word(&self) -> u64 {
        self.seqlock.load(Ordering::Acquire)
    }

    /// The recorded total of device `dev` (relaxed glance, outside the seqlock; 0 for no such
    /// device). [`crate::seqlock::read`] is the consistent read.
    pub fn recorded_total(&self, dev: usize) -> u64 {
        self.used
            .get(dev)
            .map_or(0, |m| m.total.load(Ordering::Relaxed))
    }

    /// Whether any device's recorded total is non-zero (relaxed glance).
    pub fn has_recorded_usage(&self) -> bool {
        self.used
            .iter()
            .any(|m| m.total.load(Ordering::Relaxed) != 0)
    }

    /// NVML-reported usage of device `dev` (`monitorused`, relaxed; 0 for no such device).
    pub fn monitor_used(&self, dev: usize) -> u64 {
        self.monitorused
            .get(dev)
            .map_or(0, |m| m.load(Ordering::Relaxed))
    }

    /// Stores the NVML-reported usage of device `dev` (relaxed; no such device: ignored).
    pub fn set_monitor_used(&self, dev: usize, bytes: u64) {
        if let Some(m) = self.monitorused.get(dev) {
            m.store(bytes, Ordering::Relaxed);
        }
    }

    /// SM utilisation (percent) of device `dev` (relaxed; 0 for no such device).
    pub fn sm_util(&self, dev: usize) -> u64 {
        self.device_util
            .get(dev)
            .map_or(0, |u| u.sm_util.load(Ordering::Relaxed))
    }

    /// Stores the SM utilisation of device `dev` (relaxed; no such device: ignored).
    pub fn set_sm_util(&self, dev: usize, percent: u64) {
        if let Some(u) = self.device_util.get(dev) {
            u.sm_util.store(percent, Ordering::Relaxed);
        }
    }

    /// Zeroes the slot's NVML samples: `monitorused` and `sm_util` of every device (relaxed), as
    /// upstream's watcher does before each sampling round.
    pub fn clear_samples(&self) {
        self.clear_monitor_usage();
        for u in &self.device_util {
            u.sm_util.store(0, Ordering::Relaxed);
        }
    }

    /// Frees the slot outright (`shrreg-tool --reset`, under the init lock): pid 0 (release),
    /// usage zeroed through the seqlock, then seqlock word, host pid, status, identity and NVML
    /// samples zero (relaxed).
    pub fn reset(&self) {
        self.pid.store(0, Ordering::Release);
        crate::seqlock::force_zero(self);
        self.seqlock.store(0, Ordering::Relaxed);
        self.hostpid.store(0, Ordering::Relaxed);
        self.status
            .store(crate::layout::STATUS_EXITED, Ordering::Relaxed);
        self.unused[0].store(0, Ordering::Relaxed);
        self.clear_samples();
    }
}

// ---- The extension tail ------------------------------------------------------------------------

impl Ext {
    /// The SM token bucket of device `dev`; `None` for a device the tail does not have.
    pub fn bucket(&self, dev: usize) -> Option<&SmBucket> {
        self.buckets.get(dev)
    }

    /// The shared context state of device `dev` (cost and probe lease); `None` for a device
    /// the tail does not have.
    pub fn context_cell(&self, dev: usize) -> Option<ContextCell<'_>> {
        Some(ContextCell::new(
            self.context_cost.get(dev)?,
            self.context_probe.get(dev)?,
        ))
    }

    /// Whether one of our processes has marked the tail (acquire, pairs with [`Ext::mark`]).
    pub fn marked(&self) -> bool {
        self.magic.load(Ordering::Acquire) == EXT_MAGIC
    }

    /// The tail's layout version (relaxed).
    pub fn version(&self) -> u32 {
        self.version.load(Ordering::Relaxed)
    }

    /// Who holds the context probe lease of device `dev` (acquire; 0 = nobody or no such device).
    pub fn context_prober(&self, dev: usize) -> ProcId {
        ProcId(
            self.context_probe
                .get(dev)
                .map_or(0, |p| p.load(Ordering::Acquire)),
        )
    }
}

/// A bucket's words, read one by one (relaxed; not a consistent cut).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BucketState {
    /// Tokens (a signed quantity stored as `u64`).
    pub tokens: u64,
    /// Refill rate.
    pub rate: u64,
    /// Blocks launched, ever.
    pub spent: u64,
    /// The controller's lease word (pid in the high 32 bits).
    pub lease: u64,
}

impl SmBucket {
    /// The bucket's words (relaxed).
    pub fn state(&self) -> BucketState {
        BucketState {
            tokens: self.tokens.load(Ordering::Relaxed),
            rate: self.rate.load(Ordering::Relaxed),
            spent: self.spent.load(Ordering::Relaxed),
            lease: self.lease.load(Ordering::Relaxed),
        }
    }

    /// Blocks launched on the bucket's device, ever (relaxed; the controller's per-period delta).
    pub fn spent(&self) -> u64 {
        self.spent.load(Ordering::Relaxed)
    }

    /// The refill rate (relaxed; a resumed controller's starting point).
    pub fn rate(&self) -> u64 {
        self.rate.load(Ordering::Relaxed)
    }
}

impl RawSem {
    /// The first 64-bit word (relaxed): glibc's value in the low 32 bits, waiters in the high.
    pub fn data_word(&self) -> u64 {
        self.words[0].load(Ordering::Relaxed)
    }
}

// ---- The inspector's snapshot --------------------------------------------------------------------

/// The region's scalar fields as the inspector reports them (each one load, no consistent cut).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionHeader {
    /// `initialized_flag` (acquire).
    pub initialized_flag: i32,
    /// `major_version`.
    pub major: u32,
    /// `minor_version`.
    pub minor: u32,
    /// `sm_init_flag`.
    pub sm_init_flag: i32,
    /// `device_num`, unbounded.
    pub device_num: u64,
    /// `proc_num`, unbounded (acquire).
    pub proc_num: i32,
    /// `owner_pid` (acquire).
    pub owner_pid: u64,
    /// `utilization_switch`.
    pub utilization_switch: i32,
    /// `recent_kernel`.
    pub recent_kernel: i32,
    /// `priority`.
    pub priority: i32,
    /// `last_kernel_time`.
    pub last_kernel_time: u64,
}

impl<const SLOTS: usize, const DEVS: usize> Region<SLOTS, DEVS> {
    /// The scalar fields, read-only, for the inspector: relaxed loads except `initialized_flag`,
    /// `proc_num` and `owner_pid` (acquire).
    pub fn header(&self) -> RegionHeader {
        RegionHeader {
            initialized_flag: self.initialized_flag.load(Ordering::Acquire),
            major: self.major_version.load(Ordering::Relaxed),
            minor: self.minor_version.load(Ordering::Relaxed),
            sm_init_flag: self.sm_init_flag.load(Ordering::Relaxed),
            device_num: self.device_num.load(Ordering::Relaxed),
            proc_num: self.proc_num.load(Ordering::Acquire),
            owner_pid: self.owner_pid.load(Ordering::Acquire),
            utilization_switch: self.utilization_switch.load(Ordering::Relaxed),
            recent_kernel: self.recent_kernel.load(Ordering::Relaxed),
            priority: self.priority.load(Ordering::Relaxed),
            last_kernel_time: self.last_kernel_time.load(Ordering::Relaxed),
        }
    }
}
