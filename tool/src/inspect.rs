//! The report behind `shrreg-tool`: a snapshot of a shared region, and what is made of it (a human
//! table, one JSON object, a list of findings for `--check`).
//!
//! Everything here only *loads* from the region, so it works on a read-only mapping (a store or a
//! read-modify-write there would fault) and never changes a byte. The snapshot is not atomic as a
//! whole: live processes keep writing while it is taken. So findings that a running process can
//! produce for a moment (an odd seqlock, an owner lock between its semaphore and `owner_pid`,
//! counters between two stores) are marked [`Finding::transient`], and the tool confirms them on
//! a second snapshot ([`confirm`]) before it reports them.
//!
//! Liveness (is the process of a slot, or of the lock owner, still running) comes from the
//! caller, normally `LinuxPlatform::liveness`, which reads `/proc` of the *caller's* PID
//! namespace. Slots hold container-namespace pids, so the tool must run in the namespace of the
//! processes that use the region; from the host every verdict about a pid is meaningless.
//!
//! The glibc `sem_t` (x86-64) is read from its bytes: the first 64-bit word holds the value in
//! its low 32 bits and the number of waiters in its high 32 bits; the low 32 bits of the second
//! word are the `private` field, 0x80 after `sem_init(s, 1, _)` (process-shared) and 0 in a
//! semaphore that was never initialised (all-zero bytes).

use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::num::NonZeroU64;

use hami_shm::admission;
use hami_shm::layout::{
    Ext, RawSem, Region, ABI_DEVS, INIT_IN_PROGRESS, MAGIC, MAJOR_VERSION, MINOR_VERSION,
    STATUS_EXITED, STATUS_RUNNING, STATUS_SUSPENDED,
};
use hami_shm::platform::{Liveness, ProcId};
use hami_shm::seqlock::{self, Usage};
use hami_shm::slots;
use hami_shm::validate::Verdict;

/// glibc's `private` word of a process-shared `sem_t` (`sem_init(s, 1, _)`).
pub const GLIBC_SEM_SHARED: u32 = 0x80;
/// Counters or limits above this (64 PiB) are garbage (see the validation's bound).
pub const COUNTER_SANE_MAX: u64 = hami_shm::validate::SANE_BYTES_MAX;

/// The file a report is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileInfo {
    /// The path as given.
    pub path: String,
    /// Its length in bytes.
    pub len: u64,
    /// What [`hami_shm::validate::classify`] made of it.
    pub verdict: Verdict,
}

/// A glibc `sem_t`, as its bytes read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SemState {
    /// The value: low 32 bits of the first 64-bit word.
    pub value: u32,
    /// Threads waiting: high 32 bits of the first word.
    pub waiters: u32,
    /// The `private` field: [`GLIBC_SEM_SHARED`] when process-shared, 0 if never initialised.
    pub private: u32,
}

impl SemState {
    /// Reads the semaphore's bytes (plain loads; the mapping may be read-only).
    pub fn read(sem: &RawSem) -> SemState {
        let data = sem.data_word();
        SemState {
            value: data as u32,
            waiters: (data >> 32) as u32,
            private: sem.glibc_private(),
        }
    }

    /// Initialised with `pshared = 1`, as every peer must.
    pub fn shared(&self) -> bool {
        self.private == GLIBC_SEM_SHARED
    }

    /// All zero: `sem_init` never ran on it.
    pub fn never_initialised(&self) -> bool {
        *self == SemState::default()
    }

    fn describe(&self) -> String {
        let kind = if self.shared() {
            "process-shared".to_owned()
        } else if self.never_initialised() {
            "never initialised (all zero)".to_owned()
        } else {
            format!("NOT process-shared (private word {:#x})", self.private)
        };
        format!("value {}, waiters {}, {kind}", self.value, self.waiters)
    }
}

/// One device of the region.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Device {
    /// Region device index.
    pub index: usize,
    /// The UUID string (up to the first NUL; bytes that are not UTF-8 become U+FFFD).
    pub uuid: String,
    /// The same text as stored, for labels that must be HAMi's byte for byte.
    pub uuid_bytes: Vec<u8>,
    /// Memory limit in bytes; 0 means none.
    pub limit: u64,
    /// SM limit in percent; 0 and 100 mean none.
    pub sm_limit: u64,
    /// Usage summed over slots that belong to a process, as admission counts it.
    pub used: u64,
}

impl Device {
    /// Whether the human table lists it: anything but an untouched device with no limit.
    pub fn notable(&self, device_num: u64) -> bool {
        (self.index as u64) < device_num
            || self.limit != 0
            || self.used != 0
            || !self.uuid.is_empty()
            || !matches!(self.sm_limit, 0 | 100)
    }
}

/// One device's counters of one slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceUsage {
    /// Region device index.
    pub device: usize,
    /// The counters.
    pub usage: Usage,
    /// False if the seqlock stayed odd or kept moving while they were read.
    pub consistent: bool,
    /// `device_util[].sm_util`: the process's SM utilisation in percent, from NVML.
    pub sm_util: u64,
}

impl DeviceUsage {
    fn is_zero(&self) -> bool {
        let u = &self.usage;
        u.total == 0 && u.context == 0 && u.module == 0 && u.data == 0 && self.sm_util == 0
    }
}

/// One device as HAMi's monitor reads it for its container metrics: sums over the slots in
/// `[0, proc_num)` whose status is not 0, whatever their pid (`Spec.DeviceMemoryTotal` and its
/// siblings, HAMi 4707fb02 pkg/monitor/nvidia/v1/spec.go).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MonitorView {
    /// The counters, summed (saturating; garbage counters must not wrap into small numbers).
    pub usage: Usage,
    /// `sm_util`, summed.
    pub sm_util: u64,
}

/// One slot in `[0, proc_num)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slot {
    /// Index in the table.
    pub index: usize,
    /// Container-namespace pid; 0 for a free slot.
    pub pid: i32,
    /// Start tag of the owner (our extension in `unused[0]`, valid when stored beside the
    /// slot's pid); 0 from C peers: match by pid.
    pub tag: u32,
    /// Host pid found through NVML; 0 while unknown.
    pub hostpid: i32,
    /// `status` (0 exited, 1 running, 2 suspended).
    pub status: i32,
    /// The seqlock's value (odd while its writer updates the counters).
    pub seqlock: u64,
    /// Whether the slot's process runs (in the tool's PID namespace); `None` for pid ≤ 0.
    pub liveness: Option<Liveness>,
    /// Devices with nonzero counters, or with a memory limit.
    pub usage: Vec<DeviceUsage>,
}

impl Slot {
    /// A free slot with nothing in it (collapsed in the human table).
    pub fn is_empty(&self) -> bool {
        self.pid == 0
            && self.hostpid == 0
            && self.status == STATUS_EXITED
            && self.seqlock & 1 == 0
            && self.usage.iter().all(DeviceUsage::is_zero)
    }
}

/// The owner lock: `owner_pid` and `sem`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner {
    /// `owner_pid` as stored: pid in the low 32 bits, start tag above (0 from C peers).
    pub raw: u64,
    /// Whether the owner runs; `None` when there is no owner (or its pid is not positive).
    pub liveness: Option<Liveness>,
    /// The semaphore.
    pub sem: SemState,
}

impl Owner {
    /// The owner's pid (low 32 bits).
    pub fn pid(&self) -> i32 {
        ProcId(self.raw).pid()
    }

    /// The owner's start tag (high 32 bits).
    pub fn tag(&self) -> u32 {
        ProcId(self.raw).tag()
    }
}

/// Everything the tool shows about a region.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// The file.
    pub file: FileInfo,
    /// Bytes of the region (the mapping; the file is one byte longer).
    pub region_size: usize,
    /// Slots in the table.
    pub slot_capacity: usize,
    /// The tool's own pid (the namespace that liveness is judged in).
    pub tool_pid: i32,
    /// `initialized_flag`.
    pub initialized_flag: i32,
    /// `major_version`.
    pub major: u32,
    /// `minor_version`.
    pub minor: u32,
    /// `sm_init_flag`.
    pub sm_init_flag: i32,
    /// `device_num`.
    pub device_num: u64,
    /// Every device of the region.
    pub devices: Vec<Device>,
    /// `proc_num`, raw (may be garbage; the slots listed are clamped to the table).
    pub proc_num: i32,
    /// The owner lock.
    pub owner: Owner,
    /// `sem_postinit`.
    pub sem_postinit: SemState,
    /// `utilization_switch`.
    pub utilization_switch: i32,
    /// `recent_kernel`.
    pub recent_kernel: i32,
    /// `priority`.
    pub priority: i32,
    /// `last_kernel_time` (epoch seconds).
    pub last_kernel_time: u64,
    /// Slots `[0, proc_num)`, clamped to the table.
    pub slots: Vec<Slot>,
    /// Our extension page, if the file has it (set by the caller: [`ext_snapshot`]).
    pub ext: Option<ExtReport>,
}

/// The extension page after the region (docs/monitor-contract.md).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExtReport {
    /// `magic` is [`EXT_MAGIC`](hami_shm::layout::EXT_MAGIC) (one of our processes mapped the page).
    pub marked: bool,
    /// `version`.
    pub version: u32,
    /// The SM buckets that are not all zero (devices that were limited and launched on).
    pub buckets: Vec<BucketReport>,
}

/// One device's SM bucket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BucketReport {
    /// Region device index.
    pub device: usize,
    /// Tokens (negative: debt).
    pub tokens: i64,
    /// Refill rate, blocks per second (0: unmetered).
    pub rate: u64,
    /// Blocks ever launched through it.
    pub spent: u64,
    /// Pid of the controller's lease (0: none taken yet).
    pub lease_pid: u32,
}

/// Reads the extension page. Loads only.
pub fn ext_snapshot(ext: &Ext) -> ExtReport {
    let buckets = (0..ABI_DEVS)
        .filter_map(|device| Some((device, ext.bucket(device)?)))
        .map(|(device, b)| {
            let s = b.state();
            BucketReport {
                device,
                tokens: s.tokens as i64,
                rate: s.rate,
                spent: s.spent,
                lease_pid: (s.lease >> 32) as u32,
            }
        })
        .filter(|b| b.tokens != 0 || b.rate != 0 || b.spent != 0 || b.lease_pid != 0)
        .collect();
    ExtReport {
        marked: ext.marked(),
        version: ext.version(),
        buckets,
    }
}

/// The bytes of a region UUID entry's NUL-terminated text (without the NUL).
fn uuid_bytes<const S: usize, const D: usize>(region: &Region<S, D>, dev: usize) -> Vec<u8> {
    region
        .uuid(dev)
        .map_or_else(Vec::new, |(text, len)| text[..len].to_vec())
}

/// Takes a snapshot of `region`. `liveness` judges a process (normally `LinuxPlatform`'s, in the
/// tool's PID namespace); `tool_pid` is recorded for the report. Loads only.
pub fn snapshot<const S: usize, const D: usize>(
    region: &Region<S, D>,
    file: FileInfo,
    liveness: &dyn Fn(ProcId) -> Liveness,
    tool_pid: i32,
) -> Report {
    let h = region.header();
    let limits: Vec<u64> = (0..D)
        .map(|d| region.limit(d).map_or(0, NonZeroU64::get))
        .collect();
    let devices = (0..D)
        .map(|d| Device {
            index: d,
            uuid: String::from_utf8_lossy(&uuid_bytes(region, d)).into_owned(),
            uuid_bytes: uuid_bytes(region, d),
            limit: limits[d],
            sm_limit: region.sm_limit(d),
            used: admission::device_usage(region, d),
        })
        .collect();
    let owner_raw = h.owner_pid;
    let owner_id = ProcId(owner_raw);
    let owner = Owner {
        raw: owner_raw,
        liveness: (owner_id.pid() > 0).then(|| liveness(owner_id)),
        sem: SemState::read(region.sem()),
    };
    let slots = region
        .live_range()
        .iter()
        .enumerate()
        .map(|(index, slot)| {
            let id = slots::slot_owner(slot);
            let usage = (0..D)
                .filter_map(|d| {
                    let (usage, consistent) = seqlock::read(slot, d);
                    let du = DeviceUsage {
                        device: d,
                        usage,
                        consistent,
                        sm_util: slot.sm_util(d),
                    };
                    (!du.is_zero() || limits[d] != 0).then_some(du)
                })
                .collect();
            Slot {
                index,
                pid: id.pid(),
                tag: id.tag(),
                hostpid: slot.hostpid(),
                status: slot.status(),
                seqlock: slot.seqlock_word(),
                liveness: (id.pid() > 0).then(|| liveness(id)),
                usage,
            }
        })
        .collect();
    Report {
        file,
        region_size: Region::<S, D>::SIZE,
        slot_capacity: S,
        tool_pid,
        initialized_flag: h.initialized_flag,
        major: h.major,
        minor: h.minor,
        sm_init_flag: h.sm_init_flag,
        device_num: h.device_num,
        devices,
        proc_num: h.proc_num,
        owner,
        sem_postinit: SemState::read(region.sem_postinit()),
        utilization_switch: h.utilization_switch,
        recent_kernel: h.recent_kernel,
        priority: h.priority,
        last_kernel_time: h.last_kernel_time,
        slots,
        ext: None,
    }
}

impl Report {
    /// Device `dev` as HAMi's monitor reads it (see [`MonitorView`]).
    pub fn monitor_view(&self, dev: usize) -> MonitorView {
        let mut v = MonitorView::default();
        let rows = self.slots.iter().filter(|s| s.status != STATUS_EXITED);
        for du in rows.flat_map(|s| &s.usage).filter(|du| du.device == dev) {
            let (a, b) = (&mut v.usage, du.usage);
            a.context = a.context.saturating_add(b.context);
            a.module = a.module.saturating_add(b.module);
            a.data = a.data.saturating_add(b.data);
            a.total = a.total.saturating_add(b.total);
            v.sm_util = v.sm_util.saturating_add(du.sm_util);
        }
        v
    }
}

/// How bad a finding is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    /// Something is wrong: `--check` exits 1.
    Problem,
    /// Worth knowing, not wrong.
    Note,
}

/// Something `--check` found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finding {
    /// `initialized_flag` is 0: nobody initialised the region yet.
    NotInitialised,
    /// `initialized_flag` is [`INIT_IN_PROGRESS`]: an initialiser died half-way.
    InitInterrupted,
    /// A v1.1 region whose `sem_postinit` v1.1 never initialised (bug B1).
    LegacyPostinit,
    /// A semaphore that is not process-shared in an initialised region.
    SemNotShared {
        /// `"sem"` or `"sem_postinit"`.
        which: &'static str,
        /// What its bytes hold.
        sem: SemState,
    },
    /// The owner lock's semaphore holds more than one token: two holders are possible.
    SemOverCount {
        /// The value.
        value: u32,
    },
    /// `owner_pid` holds a non-positive pid in its low 32 bits but is not 0.
    BadOwner {
        /// `owner_pid` as stored.
        raw: u64,
    },
    /// The owner lock is held by a dead process.
    DeadOwner {
        /// Its pid.
        pid: i32,
        /// Its start tag.
        tag: u32,
    },
    /// No owner and no token: a holder died between the semaphore and `owner_pid` (B12).
    LostToken,
    /// An owner is recorded but the semaphore holds a token too.
    OwnerWithToken {
        /// The recorded owner's pid.
        pid: i32,
    },
    /// `proc_num` outside `[0, capacity]`.
    ProcNumOutOfRange {
        /// The value found.
        found: i32,
        /// Slots in the table.
        capacity: usize,
    },
    /// `device_num` above the region's device count.
    DeviceNumOutOfRange {
        /// The value found.
        found: u64,
        /// Devices in the region.
        capacity: usize,
    },
    /// A slot whose process is dead.
    StaleSlot {
        /// Slot index.
        slot: usize,
        /// Its pid.
        pid: i32,
        /// Its start tag.
        tag: u32,
    },
    /// A slot whose process could not be judged.
    UnknownLiveness {
        /// Slot index.
        slot: usize,
        /// Its pid.
        pid: i32,
    },
    /// A free slot still carrying usage (a C peer's exit handler leaves it, B7).
    FreedSlotUsage {
        /// Slot index.
        slot: usize,
        /// Region device index.
        dev: usize,
        /// Bytes left.
        total: u64,
    },
    /// Two slots hold the same pid.
    DuplicatePid {
        /// The later slot.
        slot: usize,
        /// The earlier slot.
        first: usize,
        /// The pid.
        pid: i32,
    },
    /// A negative pid.
    BadPid {
        /// Slot index.
        slot: usize,
        /// The pid.
        pid: i32,
    },
    /// A status that is none of 0, 1, 2.
    BadStatus {
        /// Slot index.
        slot: usize,
        /// The status.
        status: i32,
    },
    /// A seqlock left odd (its writer is mid-update or died mid-update, B8).
    OddSeqlock {
        /// Slot index.
        slot: usize,
        /// The value.
        value: u64,
    },
    /// A device's usage over its limit.
    OverLimit {
        /// Region device index.
        dev: usize,
        /// Usage of all live slots.
        used: u64,
        /// The limit.
        limit: u64,
    },
    /// `total` is not `context + module + data`.
    CounterMismatch {
        /// Slot index.
        slot: usize,
        /// Region device index.
        dev: usize,
        /// The counters.
        usage: Usage,
    },
    /// A counter above [`COUNTER_SANE_MAX`].
    CounterHuge {
        /// Slot index.
        slot: usize,
        /// Region device index.
        dev: usize,
        /// `"total"`, `"context"`, `"module"` or `"data"`.
        field: &'static str,
        /// The value.
        value: u64,
    },
    /// A memory limit above [`COUNTER_SANE_MAX`].
    LimitHuge {
        /// Region device index.
        dev: usize,
        /// The value.
        value: u64,
    },
}

impl Finding {
    /// Problems make `--check` exit 1; notes do not.
    pub fn severity(&self) -> Severity {
        match self {
            Finding::NotInitialised | Finding::LegacyPostinit | Finding::UnknownLiveness { .. } => {
                Severity::Note
            }
            _ => Severity::Problem,
        }
    }

    /// Whether a running, healthy process can produce this for a moment, so that it must be seen
    /// on two snapshots before it is reported.
    pub fn transient(&self) -> bool {
        matches!(
            self,
            Finding::LostToken
                | Finding::OwnerWithToken { .. }
                | Finding::OddSeqlock { .. }
                | Finding::CounterMismatch { .. }
        )
    }

    /// A stable name for scripts (the `kind` of the JSON object).
    pub fn kind(&self) -> &'static str {
        match self {
            Finding::NotInitialised => "not_initialised",
            Finding::InitInterrupted => "init_interrupted",
            Finding::LegacyPostinit => "legacy_sem_postinit",
            Finding::SemNotShared { .. } => "sem_not_shared",
            Finding::SemOverCount { .. } => "sem_over_count",
            Finding::BadOwner { .. } => "bad_owner",
            Finding::DeadOwner { .. } => "dead_owner",
            Finding::LostToken => "lost_token",
            Finding::OwnerWithToken { .. } => "owner_with_token",
            Finding::ProcNumOutOfRange { .. } => "proc_num_out_of_range",
            Finding::DeviceNumOutOfRange { .. } => "device_num_out_of_range",
            Finding::StaleSlot { .. } => "stale_slot",
            Finding::UnknownLiveness { .. } => "unknown_liveness",
            Finding::FreedSlotUsage { .. } => "freed_slot_usage",
            Finding::DuplicatePid { .. } => "duplicate_pid",
            Finding::BadPid { .. } => "bad_pid",
            Finding::BadStatus { .. } => "bad_status",
            Finding::OddSeqlock { .. } => "odd_seqlock",
            Finding::OverLimit { .. } => "over_limit",
            Finding::CounterMismatch { .. } => "counter_mismatch",
            Finding::CounterHuge { .. } => "counter_garbage",
            Finding::LimitHuge { .. } => "limit_garbage",
        }
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const RECREATE: &str = "stop the container's GPU processes and run shrreg-tool \
                                --create-new (or delete the file)";
        match self {
            Finding::NotInitialised => write!(
                f,
                "the region is not initialised yet; the first process that uses the GPU does it"
            ),
            Finding::InitInterrupted => write!(
                f,
                "an initialiser died half-way (initialized_flag is {INIT_IN_PROGRESS}); libvgpu \
                 processes redo the initialisation, C HAMi-core processes do not: {RECREATE}"
            ),
            Finding::LegacyPostinit => write!(
                f,
                "v1.1 region: sem_postinit was never initialised (v1.1 did not have it); libvgpu \
                 initialises it when it opens the file, a HAMi-core v1.2 C process would stall \
                 330 s in cuInit (bug B1)"
            ),
            Finding::SemNotShared { which, sem } => write!(
                f,
                "{which} is not a process-shared semaphore ({}): waiters in other processes are \
                 never woken; {RECREATE}",
                sem.describe()
            ),
            Finding::SemOverCount { value } => write!(
                f,
                "the owner lock's semaphore has value {value}: more than one process can hold the \
                 lock at once (a token was posted twice); {RECREATE}"
            ),
            Finding::BadOwner { raw } => write!(
                f,
                "owner_pid is {raw:#x}, whose pid (low 32 bits) is not positive: garbage; {RECREATE}"
            ),
            Finding::DeadOwner { pid, tag } => write!(
                f,
                "the owner lock is held by pid {pid} (tag {tag:#x}), which is dead in this PID \
                 namespace; libvgpu processes recover it when they next need it, C processes may \
                 wait for it; run shrreg-tool --reap to recover it now"
            ),
            Finding::LostToken => write!(
                f,
                "the owner lock has no owner and no token (a holder died between sem_wait and \
                 recording itself, bug B12); libvgpu processes take it over after a grace \
                 period, C HAMi-core processes exit after 310 s; run shrreg-tool --reap"
            ),
            Finding::OwnerWithToken { pid } => write!(
                f,
                "owner_pid records pid {pid} but the semaphore holds a token too: a second \
                 process can enter; {RECREATE}"
            ),
            Finding::ProcNumOutOfRange { found, capacity } => write!(
                f,
                "proc_num is {found}, outside 0..={capacity}: garbage (readers clamp it to the \
                 table); {RECREATE}"
            ),
            Finding::DeviceNumOutOfRange { found, capacity } => write!(
                f,
                "device_num is {found}, more than the region's {capacity} devices: garbage; \
                 {RECREATE}"
            ),
            Finding::StaleSlot { slot, pid, tag } => {
                let by = if *tag == 0 {
                    String::new()
                } else {
                    format!(" (start tag {tag:#x})")
                };
                write!(
                    f,
                    "slot {slot}: pid {pid}{by} is dead in this PID namespace but still holds the \
                     slot; run shrreg-tool --reap"
                )
            }
            Finding::UnknownLiveness { slot, pid } => write!(
                f,
                "slot {slot}: cannot tell whether pid {pid} runs (/proc unreadable); it is \
                 treated as alive"
            ),
            Finding::FreedSlotUsage { slot, dev, total } => write!(
                f,
                "slot {slot} is free but still carries {total} bytes on device {dev} (a C \
                 process's exit leaves them, bug B7; C processes still count them); run \
                 shrreg-tool --reap"
            ),
            Finding::DuplicatePid {
                slot,
                first,
                pid,
            } => write!(
                f,
                "slots {first} and {slot} both hold pid {pid}: its usage may count twice \
                 (a C process's unlocked compaction, bug B4); run shrreg-tool --reap once it has \
                 exited"
            ),
            Finding::BadPid { slot, pid } => write!(
                f,
                "slot {slot}: pid {pid} is negative: garbage; {RECREATE}"
            ),
            Finding::BadStatus { slot, status } => write!(
                f,
                "slot {slot}: status {status} is none of 0 (exited), 1 (running), 2 (suspended): \
                 garbage"
            ),
            Finding::OddSeqlock { slot, value } => write!(
                f,
                "slot {slot}: seqlock {value} stays odd (its writer died mid-update, bug B8); \
                 libvgpu readers give up after a bounded wait, C HAMi-core v1.2 readers spin \
                 forever; run shrreg-tool --reap once the process is dead"
            ),
            Finding::OverLimit { dev, used, limit } => write!(
                f,
                "device {dev}: usage {used} bytes ({}) is over the limit {limit} bytes ({})",
                human(*used),
                human(*limit)
            ),
            Finding::CounterMismatch { slot, dev, usage } => write!(
                f,
                "slot {slot} device {dev}: total {} is not context {} + module {} + data {}: \
                 the counters are corrupt",
                usage.total, usage.context, usage.module, usage.data
            ),
            Finding::CounterHuge {
                slot,
                dev,
                field,
                value,
            } => write!(
                f,
                "slot {slot} device {dev}: {field} is {value} (over 2^56): garbage, probably an \
                 underflow (bug B3); run shrreg-tool --reap once the process is dead, or \
                 {RECREATE}"
            ),
            Finding::LimitHuge { dev, value } => write!(
                f,
                "device {dev}: limit {value} is over 2^56 bytes: garbage; {RECREATE}"
            ),
        }
    }
}

/// What a region's snapshot shows to be wrong (and worth noting), in a stable order.
pub fn findings(report: &Report) -> Vec<Finding> {
    let mut out = Vec::new();
    match report.initialized_flag {
        0 => {
            out.push(Finding::NotInitialised);
            return out;
        }
        INIT_IN_PROGRESS => {
            out.push(Finding::InitInterrupted);
            return out;
        }
        _ => {}
    }
    let capacity = report.slot_capacity;
    let legacy = report.file.verdict == Verdict::LegacyV11;

    // The owner lock.
    let owner = &report.owner;
    if !owner.sem.shared() {
        out.push(Finding::SemNotShared {
            which: "sem",
            sem: owner.sem,
        });
    } else if owner.sem.value > 1 {
        out.push(Finding::SemOverCount {
            value: owner.sem.value,
        });
    }
    if owner.raw != 0 && owner.pid() <= 0 {
        out.push(Finding::BadOwner { raw: owner.raw });
    } else if owner.liveness == Some(Liveness::Dead) {
        out.push(Finding::DeadOwner {
            pid: owner.pid(),
            tag: owner.tag(),
        });
    } else if owner.raw == 0 && owner.sem.shared() && owner.sem.value == 0 {
        out.push(Finding::LostToken);
    } else if owner.raw != 0 && owner.sem.shared() && owner.sem.value >= 1 {
        out.push(Finding::OwnerWithToken { pid: owner.pid() });
    }
    if legacy && report.sem_postinit.never_initialised() {
        out.push(Finding::LegacyPostinit);
    } else if !report.sem_postinit.shared() {
        out.push(Finding::SemNotShared {
            which: "sem_postinit",
            sem: report.sem_postinit,
        });
    }

    // Header values.
    if report.proc_num < 0 || report.proc_num as usize > capacity {
        out.push(Finding::ProcNumOutOfRange {
            found: report.proc_num,
            capacity,
        });
    }
    if report.device_num > report.devices.len() as u64 {
        out.push(Finding::DeviceNumOutOfRange {
            found: report.device_num,
            capacity: report.devices.len(),
        });
    }
    for d in &report.devices {
        if d.limit > COUNTER_SANE_MAX {
            out.push(Finding::LimitHuge {
                dev: d.index,
                value: d.limit,
            });
        }
    }

    // Slots.
    let mut seen: HashMap<i32, usize> = HashMap::new();
    for s in &report.slots {
        if s.pid < 0 {
            out.push(Finding::BadPid {
                slot: s.index,
                pid: s.pid,
            });
        }
        if s.pid > 0 {
            match s.liveness {
                Some(Liveness::Dead) => out.push(Finding::StaleSlot {
                    slot: s.index,
                    pid: s.pid,
                    tag: s.tag,
                }),
                Some(Liveness::Unknown) => out.push(Finding::UnknownLiveness {
                    slot: s.index,
                    pid: s.pid,
                }),
                _ => {}
            }
            if let Some(&first) = seen.get(&s.pid) {
                out.push(Finding::DuplicatePid {
                    slot: s.index,
                    first,
                    pid: s.pid,
                });
            } else {
                seen.insert(s.pid, s.index);
            }
        }
        if !matches!(s.status, STATUS_EXITED | STATUS_RUNNING | STATUS_SUSPENDED) {
            out.push(Finding::BadStatus {
                slot: s.index,
                status: s.status,
            });
        }
        if s.seqlock & 1 == 1 {
            out.push(Finding::OddSeqlock {
                slot: s.index,
                value: s.seqlock,
            });
        }
        for du in &s.usage {
            let u = du.usage;
            let fields = [
                ("total", u.total),
                ("context", u.context),
                ("module", u.module),
                ("data", u.data),
            ];
            let mut huge = false;
            for (field, value) in fields {
                if value > COUNTER_SANE_MAX {
                    huge = true;
                    out.push(Finding::CounterHuge {
                        slot: s.index,
                        dev: du.device,
                        field,
                        value,
                    });
                }
            }
            let sum = u
                .context
                .checked_add(u.module)
                .and_then(|x| x.checked_add(u.data));
            if !huge && sum != Some(u.total) {
                out.push(Finding::CounterMismatch {
                    slot: s.index,
                    dev: du.device,
                    usage: u,
                });
            }
            if s.pid == 0 && u.total != 0 {
                out.push(Finding::FreedSlotUsage {
                    slot: s.index,
                    dev: du.device,
                    total: u.total,
                });
            }
        }
    }

    // Limits.
    for d in &report.devices {
        if d.limit != 0 && d.used > d.limit {
            out.push(Finding::OverLimit {
                dev: d.index,
                used: d.used,
                limit: d.limit,
            });
        }
    }
    out
}

/// Keeps what a second snapshot confirms: every lasting finding of `second`, and its transient
/// findings only if `first` had them too (a live writer's odd seqlock moves on; a dead one's
/// stays put).
pub fn confirm(first: &[Finding], second: Vec<Finding>) -> Vec<Finding> {
    second
        .into_iter()
        .filter(|f| !f.transient() || first.contains(f))
        .collect()
}

/// Whether any finding is a problem.
pub fn has_problems(findings: &[Finding]) -> bool {
    findings.iter().any(|f| f.severity() == Severity::Problem)
}

/// `n` bytes in binary units, e.g. `3.00 MiB`.
pub fn human(n: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.2} {}", UNITS[unit])
}

/// The name of a [`Verdict`] for scripts.
pub fn verdict_name(v: Verdict) -> &'static str {
    match v {
        Verdict::Fresh => "fresh",
        Verdict::InitInterrupted => "init_interrupted",
        Verdict::Ready => "ready",
        Verdict::LegacyV11 => "legacy_v1.1",
    }
}

/// What a [`Verdict`] means, for people.
pub fn verdict_text(v: Verdict) -> &'static str {
    match v {
        Verdict::Fresh => "not initialised (fresh)",
        Verdict::InitInterrupted => "initialisation interrupted",
        Verdict::Ready => "v1.2, ready",
        Verdict::LegacyV11 => "v1.1 (pre-PR155 layout, read at v1.2's offsets)",
    }
}

/// The name of a [`Liveness`] for scripts and people.
pub fn liveness_name(l: Liveness) -> &'static str {
    match l {
        Liveness::Alive => "alive",
        Liveness::Dead => "dead",
        Liveness::Unknown => "unknown",
    }
}

/// The name of a slot status.
pub fn status_name(status: i32) -> String {
    match status {
        STATUS_EXITED => "exited".to_owned(),
        STATUS_RUNNING => "running".to_owned(),
        STATUS_SUSPENDED => "suspended".to_owned(),
        other => format!("invalid({other})"),
    }
}

fn flag_text(flag: i32) -> &'static str {
    match flag {
        MAGIC => "initialised",
        INIT_IN_PROGRESS => "initialisation in progress or interrupted",
        0 => "not initialised",
        _ => "garbage",
    }
}

/// The human table of `--print`.
pub fn render_text(report: &Report, findings: &[Finding]) -> String {
    let mut o = String::new();
    let r = report;
    let _ = writeln!(o, "shared region {}", r.file.path);
    let _ = writeln!(
        o,
        "  file          {} bytes (region {} bytes + 1), layout {}",
        r.file.len,
        r.region_size,
        verdict_text(r.file.verdict)
    );
    let _ = writeln!(
        o,
        "  header        initialized_flag {:#010x} ({}), version {}.{}, sm_init_flag {}",
        r.initialized_flag,
        flag_text(r.initialized_flag),
        r.major,
        r.minor,
        r.sm_init_flag
    );
    let owner = &r.owner;
    let holder = if owner.raw == 0 {
        "free (owner_pid 0)".to_owned()
    } else {
        let live = owner.liveness.map_or("-", liveness_name);
        format!(
            "held by pid {} (tag {:#010x}, owner_pid {:#x}), owner {live}",
            owner.pid(),
            owner.tag(),
            owner.raw
        )
    };
    let _ = writeln!(o, "  owner lock    {holder}");
    let _ = writeln!(o, "  sem           {}", owner.sem.describe());
    let _ = writeln!(o, "  sem_postinit  {}", r.sem_postinit.describe());
    let _ = writeln!(
        o,
        "  scheduler     utilization_switch {}, recent_kernel {}, priority {}, \
         last_kernel_time {}",
        r.utilization_switch, r.recent_kernel, r.priority, r.last_kernel_time
    );
    match &r.ext {
        None => {
            let _ = writeln!(
                o,
                "  extension     none (a file no process of this library opened)"
            );
        }
        Some(e) => {
            let _ = writeln!(
                o,
                "  extension     version {}{}, {} SM bucket{} in use",
                e.version,
                if e.marked { "" } else { " (not marked)" },
                e.buckets.len(),
                if e.buckets.len() == 1 { "" } else { "s" }
            );
            for b in &e.buckets {
                let _ = writeln!(
                    o,
                    "    device {:>2}   rate {}/s, tokens {}, spent {}, controller pid {}",
                    b.device, b.rate, b.tokens, b.spent, b.lease_pid
                );
            }
        }
    }
    let _ = writeln!(
        o,
        "devices: device_num {} (the region has {})",
        r.device_num,
        r.devices.len()
    );
    let shown: Vec<&Device> = r
        .devices
        .iter()
        .filter(|d| d.notable(r.device_num))
        .collect();
    if shown.is_empty() {
        let _ = writeln!(o, "  (no device has a limit, a UUID or usage)");
    } else {
        let _ = writeln!(
            o,
            "  {:<4} {:<40} {:>24} {:>8} {:>24}",
            "dev", "uuid", "memory limit", "sm limit", "used"
        );
        for d in shown {
            let limit = if d.limit == 0 {
                "none".to_owned()
            } else {
                format!("{} ({})", d.limit, human(d.limit))
            };
            let sm = if matches!(d.sm_limit, 0 | 100) {
                "none".to_owned()
            } else {
                format!("{}%", d.sm_limit)
            };
            let uuid = if d.uuid.is_empty() { "-" } else { &d.uuid };
            let _ = writeln!(
                o,
                "  {:<4} {:<40} {:>24} {:>8} {:>24}",
                d.index,
                uuid,
                limit,
                sm,
                format!("{} ({})", d.used, human(d.used))
            );
        }
    }
    let _ = writeln!(
        o,
        "slots: proc_num {} (table of {}); process liveness is judged in this tool's PID \
         namespace (tool pid {})",
        r.proc_num, r.slot_capacity, r.tool_pid
    );
    if r.slots.is_empty() {
        let _ = writeln!(o, "  (none)");
    } else {
        let _ = writeln!(
            o,
            "  {:<5} {:>8} {:>10} {:>8} {:<10} {:>12} {:<8} {:>3} {:>14} {:>14} {:>14} {:>14}",
            "slot",
            "pid",
            "tag",
            "hostpid",
            "status",
            "seqlock",
            "process",
            "dev",
            "total",
            "context",
            "module",
            "data"
        );
    }
    let mut i = 0;
    while i < r.slots.len() {
        let s = &r.slots[i];
        if s.is_empty() {
            let start = i;
            while i < r.slots.len() && r.slots[i].is_empty() {
                i += 1;
            }
            let range = if i - start == 1 {
                format!("{start}")
            } else {
                format!("{start}-{}", i - 1)
            };
            let _ = writeln!(
                o,
                "  {range:<5} free ({} slot{})",
                i - start,
                plural(i - start)
            );
            continue;
        }
        let seq = format!(
            "{}{}",
            s.seqlock,
            if s.seqlock & 1 == 1 { " ODD" } else { "" }
        );
        let live = s.liveness.map_or("-", liveness_name);
        let head = format!(
            "  {:<5} {:>8} {:>10} {:>8} {:<10} {:>12} {:<8}",
            s.index,
            s.pid,
            format!("{:#010x}", s.tag),
            s.hostpid,
            status_name(s.status),
            seq,
            live
        );
        let rows: Vec<&DeviceUsage> = s
            .usage
            .iter()
            .filter(|u| !u.is_zero() || s.pid != 0)
            .collect();
        if rows.is_empty() {
            let _ = writeln!(o, "{head}   -");
        }
        for (n, du) in rows.iter().enumerate() {
            let lead = if n == 0 {
                head.clone()
            } else {
                " ".repeat(head.len())
            };
            let u = du.usage;
            let mark = if du.consistent {
                ""
            } else {
                " (inconsistent read)"
            };
            let _ = writeln!(
                o,
                "{lead} {:>3} {:>14} {:>14} {:>14} {:>14}{mark}",
                du.device, u.total, u.context, u.module, u.data
            );
        }
        i += 1;
    }
    let _ = writeln!(o, "findings:");
    if findings.is_empty() {
        let _ = writeln!(o, "  healthy: nothing wrong found");
    }
    for f in findings {
        let sev = match f.severity() {
            Severity::Problem => "PROBLEM",
            Severity::Note => "note",
        };
        let _ = writeln!(o, "  {sev}: {f}");
    }
    o
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// A string as a JSON string literal: quotes, backslashes and control characters escaped.
pub fn json_string(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            '\r' => o.push_str("\\r"),
            '\t' => o.push_str("\\t"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// A JSON object being written: `key` adds the separator and the key, the caller the value.
struct Obj<'a> {
    out: &'a mut String,
    first: bool,
}

impl<'a> Obj<'a> {
    fn new(out: &'a mut String) -> Self {
        out.push('{');
        Obj { out, first: true }
    }

    fn key(&mut self, k: &str) -> &mut String {
        if !self.first {
            self.out.push(',');
        }
        self.first = false;
        self.out.push_str(&json_string(k));
        self.out.push(':');
        self.out
    }

    fn num(&mut self, k: &str, v: impl fmt::Display) {
        let _ = write!(self.key(k), "{v}");
    }

    fn str(&mut self, k: &str, v: &str) {
        let s = json_string(v);
        self.key(k).push_str(&s);
    }

    fn bool(&mut self, k: &str, v: bool) {
        self.key(k).push_str(if v { "true" } else { "false" });
    }

    fn opt_str(&mut self, k: &str, v: Option<&str>) {
        match v {
            Some(s) => self.str(k, s),
            None => self.key(k).push_str("null"),
        }
    }

    fn end(self) {
        self.out.push('}');
    }
}

fn json_sem(out: &mut String, sem: &SemState) {
    let mut o = Obj::new(out);
    o.num("value", sem.value);
    o.num("waiters", sem.waiters);
    o.num("private", sem.private);
    o.bool("process_shared", sem.shared());
    o.bool("never_initialised", sem.never_initialised());
    o.end();
}

fn json_array<T>(out: &mut String, items: &[T], mut each: impl FnMut(&mut String, &T)) {
    out.push('[');
    for (n, item) in items.iter().enumerate() {
        if n > 0 {
            out.push(',');
        }
        each(out, item);
    }
    out.push(']');
}

/// The JSON object of `--json`: the same as [`render_text`], every number exact.
pub fn render_json(report: &Report, findings: &[Finding]) -> String {
    let r = report;
    let mut out = String::new();
    let mut o = Obj::new(&mut out);
    o.str("tool_version", env!("CARGO_PKG_VERSION"));
    o.str("file", &r.file.path);
    o.num("file_size", r.file.len);
    o.num("region_size", r.region_size);
    o.str("verdict", verdict_name(r.file.verdict));
    o.num("initialized_flag", r.initialized_flag);
    o.num("major_version", r.major);
    o.num("minor_version", r.minor);
    o.num("sm_init_flag", r.sm_init_flag);
    o.num("tool_pid", r.tool_pid);
    o.str(
        "liveness_namespace",
        "liveness is judged in the PID namespace of the tool",
    );
    {
        let k = o.key("owner_lock");
        let mut ol = Obj::new(k);
        ol.num("owner_pid", r.owner.raw);
        ol.num("pid", r.owner.pid());
        ol.num("tag", r.owner.tag());
        ol.opt_str("liveness", r.owner.liveness.map(liveness_name));
        json_sem(ol.key("sem"), &r.owner.sem);
        ol.end();
    }
    json_sem(o.key("sem_postinit"), &r.sem_postinit);
    o.num("utilization_switch", r.utilization_switch);
    o.num("recent_kernel", r.recent_kernel);
    o.num("priority", r.priority);
    o.num("last_kernel_time", r.last_kernel_time);
    o.num("device_num", r.device_num);
    json_array(o.key("devices"), &r.devices, |out, d| {
        let mut od = Obj::new(out);
        od.num("index", d.index);
        od.str("uuid", &d.uuid);
        od.num("limit", d.limit);
        od.num("sm_limit", d.sm_limit);
        od.num("used", d.used);
        od.end();
    });
    o.num("proc_num", r.proc_num);
    o.num("slot_capacity", r.slot_capacity);
    json_array(o.key("slots"), &r.slots, |out, s| {
        let mut os = Obj::new(out);
        os.num("index", s.index);
        os.num("pid", s.pid);
        os.num("tag", s.tag);
        os.num("hostpid", s.hostpid);
        os.num("status", s.status);
        os.str("status_name", &status_name(s.status));
        os.num("seqlock", s.seqlock);
        os.bool("seqlock_odd", s.seqlock & 1 == 1);
        os.opt_str("liveness", s.liveness.map(liveness_name));
        json_array(os.key("usage"), &s.usage, |out, du| {
            let mut ou = Obj::new(out);
            ou.num("device", du.device);
            ou.num("total", du.usage.total);
            ou.num("context", du.usage.context);
            ou.num("module", du.usage.module);
            ou.num("data", du.usage.data);
            ou.bool("consistent", du.consistent);
            ou.num("sm_util", du.sm_util);
            ou.end();
        });
        os.end();
    });
    match &r.ext {
        None => o.key("ext").push_str("null"),
        Some(e) => {
            let mut oe = Obj::new(o.key("ext"));
            oe.bool("marked", e.marked);
            oe.num("version", e.version);
            json_array(oe.key("sm_buckets"), &e.buckets, |out, b| {
                let mut ob = Obj::new(out);
                ob.num("device", b.device);
                ob.num("rate", b.rate);
                ob.num("tokens", b.tokens);
                ob.num("spent", b.spent);
                ob.num("lease_pid", b.lease_pid);
                ob.end();
            });
            oe.end();
        }
    }
    o.bool("healthy", !has_problems(findings));
    json_array(o.key("findings"), findings, |out, f| {
        let mut of = Obj::new(out);
        of.str("kind", f.kind());
        of.str(
            "severity",
            match f.severity() {
                Severity::Problem => "problem",
                Severity::Note => "note",
            },
        );
        of.str("message", &f.to_string());
        of.end();
    });
    o.end();
    out.push('\n');
    out
}

/// The layout version this library writes and reads, `major.minor`.
pub fn layout_version() -> String {
    format!("{MAJOR_VERSION}.{MINOR_VERSION}")
}
