//! The shared region of HAMi-core v1.2, byte for byte (x86_64, glibc).
//!
//! Every field that any process may touch is an atomic of the C field's size, so no Rust code ever
//! holds a `&mut` to mapped memory and a peer's concurrent store is never undefined behaviour. The
//! sizes are const generics: the ABI is `Region<1024, 16>`, models use `Region<3, 1>`.
//!
//! Extensions (bytes that upstream leaves unused and zero, documented in docs/protocols.md):
//! - `ProcSlot::unused[0]` holds the owner's pid and start tag (see [`crate::platform::ProcId`]), so a
//!   slot whose pid was reused by an unrelated process is recognised as dead.
//!
//! Everything else of ours lives in the [`Ext`] tail of the file, at [`EXT_OFFSET`], beyond every
//! byte that C peers and HAMi's monitor map. The monitor keys containers by the whole 96-byte UUID
//! entry (`string(uuid[:])` in HAMi's `pkg/monitor/nvidia/v1/spec.go`), so an entry holds the UUID
//! text and zeros, nothing else (docs/monitor-contract.md has the map and why).

use crate::sync::{AtomicI32, AtomicU32, AtomicU64, DataAtomicU64, DataAtomicU8, Ordering};

/// `initialized_flag` value of a fully initialised region (`MULTIPROCESS_SHARED_REGION_MAGIC_FLAG`).
pub const MAGIC: i32 = 19_920_718;
/// `initialized_flag` while an initialiser is writing the region (as PR 155's CAS init used).
pub const INIT_IN_PROGRESS: i32 = 1;
/// Region version written by this library (HAMi-core v1.2 layout).
pub const MAJOR_VERSION: u32 = 1;
/// See [`MAJOR_VERSION`].
pub const MINOR_VERSION: u32 = 2;
/// Process slots of the ABI region (`SHARED_REGION_MAX_PROCESS_NUM`).
pub const ABI_SLOTS: usize = 1024;
/// Devices of the ABI region (`CUDA_DEVICE_MAX_COUNT`).
pub const ABI_DEVS: usize = 16;
/// Bytes of one device UUID string.
pub const UUID_LEN: usize = 96;

/// Slot status values (`status` field).
pub const STATUS_EXITED: i32 = 0;
/// The slot's process runs.
pub const STATUS_RUNNING: i32 = 1;
/// The slot's process was asked to suspend (SIGUSR2 from `shrreg-tool --suspend`).
pub const STATUS_SUSPENDED: i32 = 2;

/// Storage of a glibc `sem_t` (32 bytes, align 8). Only the platform operates on it; the model
/// platform identifies the semaphore by address.
/// cbindgen:ignore
#[repr(C, align(8))]
pub struct RawSem {
    /// The raw words; glibc keeps value and waiter count in `words[0]` and `private` in `words[1]`.
    pub(crate) words: [DataAtomicU64; 4],
}

impl RawSem {
    /// The `private` field of glibc's `sem_t`: 0x80 (shared futex) after `sem_init(s, 1, _)`,
    /// 0 when the semaphore was never initialised for sharing (an all-zero `sem_t`).
    pub fn glibc_private(&self) -> u32 {
        self.words[1].load(Ordering::Relaxed) as u32
    }

    fn zeroed() -> Self {
        RawSem {
            words: core::array::from_fn(|_| DataAtomicU64::new(0)),
        }
    }
}

/// The SM-limit token bucket of one device, shared by every process of the region (our
/// extension, read through [`Ext::bucket`]).
#[repr(C)]
pub struct SmBucket {
    /// Tokens available (an `i64` stored as bits: negative is debt).
    pub(crate) tokens: AtomicU64,
    /// Refill rate in tokens per second, set by the controller.
    pub(crate) rate: AtomicU64,
    /// Monotonic nanoseconds of the last refill.
    pub(crate) refilled_ns: AtomicU64,
    /// Controller lease: holder pid in the high 32 bits, expiry in monotonic milliseconds
    /// (wrapping) in the low 32.
    pub(crate) lease: AtomicU64,
    /// Tokens ever taken by launches (wrapping): the controller's exact count of the work
    /// launched in a period, whatever the burst cap did to `tokens`.
    pub(crate) spent: AtomicU64,
}

/// One device's UUID entry (96 bytes, as upstream's `char uuid[96]`): the string and zeros after
/// it, as the C library leaves it; HAMi's monitor compares all 96 bytes.
#[repr(C)]
pub struct DeviceUuid {
    /// NUL-terminated UUID string, zero-padded.
    pub(crate) text: [DataAtomicU8; UUID_LEN],
}

impl DeviceUuid {
    /// Stores `uuid` (up to its first NUL, at most 95 bytes) and zeros in every byte after it, so
    /// that two processes naming one GPU leave identical entries.
    pub fn store(&self, uuid: &[u8]) {
        let len = uuid
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(uuid.len())
            .min(UUID_LEN - 1);
        for (i, cell) in self.text.iter().enumerate() {
            cell.store(if i < len { uuid[i] } else { 0 }, Ordering::Relaxed);
        }
    }
}

/// Magic of an initialised [`Ext`] (`"HAMIRSX1"`, little-endian).
pub const EXT_MAGIC: u64 = u64::from_le_bytes(*b"HAMIRSX1");
/// Version of the [`Ext`] layout.
pub const EXT_VERSION: u32 = 1;
/// Where the [`Ext`] tail starts in the file: the first page boundary after the v1.2 region and
/// the byte C peers write at offset `SIZE` (2,011,136).
pub const EXT_OFFSET: usize = ext_offset(SharedRegion::SIZE);
/// Bytes of the region file that this library maps: the region, a gap, and the [`Ext`] tail.
pub const EXT_END: usize = EXT_OFFSET + core::mem::size_of::<Ext>();

/// Where the tail of a region of `region_size` bytes starts (the ABI's is [`EXT_OFFSET`]).
pub const fn ext_offset(region_size: usize) -> usize {
    (region_size + 1).next_multiple_of(4096)
}
/// 64-bit words reserved at the end of [`Ext`]: the tail fills one page.
pub const EXT_RESERVED_WORDS: usize = 398;

/// Our extension of the region file: a page after the v1.2 region that neither C peers (which map
/// `SIZE` bytes) nor HAMi's monitor (which reads `sizeof(sharedRegionT)` bytes) touch. All zero is
/// a valid state of every field (unmetered buckets, free leases, no cost recorded), so a file
/// that a C peer created works as soon as it is extended.
#[repr(C)]
pub struct Ext {
    /// [`EXT_MAGIC`] once one of our processes has mapped the tail (informative: zero is valid).
    pub(crate) magic: AtomicU64,
    /// [`EXT_VERSION`].
    pub(crate) version: AtomicU32,
    /// Devices described ([`ABI_DEVS`]).
    pub(crate) devs: AtomicU32,
    /// SM token bucket per region device.
    pub(crate) buckets: [SmBucket; ABI_DEVS],
    /// Bytes one context takes on each region device, as measured by the first process that
    /// created one there; 0 until measured ([`crate::context`]).
    pub(crate) context_cost: [AtomicU64; ABI_DEVS],
    /// The context probe lease per region device: 0, or the [`crate::platform::ProcId`] of the
    /// process measuring the first context there ([`crate::context`]).
    pub(crate) context_probe: [AtomicU64; ABI_DEVS],
    /// Zero; later extensions take words from here, and bump [`EXT_VERSION`].
    pub(crate) reserved: [AtomicU64; EXT_RESERVED_WORDS],
}

impl Ext {
    /// An all-zero tail, as a freshly extended file maps.
    pub fn zeroed() -> Self {
        Ext {
            magic: AtomicU64::new(0),
            version: AtomicU32::new(0),
            devs: AtomicU32::new(0),
            buckets: core::array::from_fn(|_| SmBucket::zeroed()),
            context_cost: zeroed_u64s(),
            context_probe: zeroed_u64s(),
            reserved: zeroed_u64s(),
        }
    }

    /// Marks the tail as ours (idempotent; racing callers store the same values).
    pub fn mark(&self) {
        self.version.store(EXT_VERSION, Ordering::Relaxed);
        self.devs.store(ABI_DEVS as u32, Ordering::Relaxed);
        self.magic.store(EXT_MAGIC, Ordering::Release);
    }
}

impl SmBucket {
    /// A fresh bucket: no tokens, unmetered (rate 0), lease free.
    pub fn zeroed() -> Self {
        SmBucket {
            tokens: AtomicU64::new(0),
            rate: AtomicU64::new(0),
            refilled_ns: AtomicU64::new(0),
            lease: AtomicU64::new(0),
            spent: AtomicU64::new(0),
        }
    }
}

/// Per-device memory usage of one process (`device_memory_t`, 64 bytes).
#[repr(C)]
pub struct DeviceMemory {
    /// Bytes of context memory (type 0).
    pub(crate) context_size: AtomicU64,
    /// Bytes of module memory (type 1).
    pub(crate) module_size: AtomicU64,
    /// Bytes of data allocations (type 2).
    pub(crate) data_size: AtomicU64,
    /// Upstream's `offset`; kept for layout, never written by us.
    pub(crate) offset: AtomicU64,
    /// Sum of the three kinds: what admission and every reader count.
    pub(crate) total: AtomicU64,
    /// Padding.
    pub(crate) unused: [DataAtomicU64; 3],
}

/// Per-device utilisation of one process (`device_util_t`, 48 bytes).
#[repr(C)]
pub struct DeviceUtil {
    /// Decoder utilisation (never written upstream).
    pub(crate) dec_util: DataAtomicU64,
    /// Encoder utilisation (never written upstream).
    pub(crate) enc_util: DataAtomicU64,
    /// SM utilisation in percent, from NVML.
    pub(crate) sm_util: DataAtomicU64,
    /// Padding.
    pub(crate) unused: [DataAtomicU64; 3],
}

/// One process's slot (`shrreg_proc_slot_t`, 1960 bytes for 16 devices).
#[repr(C)]
pub struct ProcSlot<const DEVS: usize> {
    /// Container-namespace pid of the owner; 0 for a free slot.
    pub(crate) pid: AtomicI32,
    /// Host pid (as NVML reports it); 0 while unknown.
    pub(crate) hostpid: AtomicI32,
    /// Memory usage per device (region device index).
    pub(crate) used: [DeviceMemory; DEVS],
    /// NVML-reported usage per device, written by the watcher.
    pub(crate) monitorused: [DataAtomicU64; DEVS],
    /// Utilisation per device.
    pub(crate) device_util: [DeviceUtil; DEVS],
    /// [`STATUS_EXITED`], [`STATUS_RUNNING`] or [`STATUS_SUSPENDED`].
    pub(crate) status: AtomicI32,
    /// C struct padding.
    pub(crate) padding: AtomicI32,
    /// Per-slot sequence lock: odd while the owner writes `used`.
    pub(crate) seqlock: AtomicU64,
    /// `unused[0]`: the owner's pid (high 32 bits) and start tag (low 32), our extension;
    /// `unused[1]`: free.
    pub(crate) unused: [AtomicU64; 2],
}

/// The whole shared region (`shared_region_t`, 2,008,952 bytes for 1024 slots and 16 devices).
#[repr(C)]
pub struct Region<const SLOTS: usize, const DEVS: usize> {
    /// [`MAGIC`] once initialised.
    pub(crate) initialized_flag: AtomicI32,
    /// [`MAJOR_VERSION`] of the initialiser.
    pub(crate) major_version: AtomicU32,
    /// [`MINOR_VERSION`] of the initialiser.
    pub(crate) minor_version: AtomicU32,
    /// Upstream's SM-limit-scale flag (used by no caller).
    pub(crate) sm_init_flag: AtomicI32,
    /// Holder of `sem`: pid in the low 32 bits, start tag above (0 for C peers).
    pub(crate) owner_pid: AtomicU64,
    /// Process-shared semaphore guarding slot-table changes.
    pub(crate) sem: RawSem,
    /// Number of devices whose UUIDs are recorded.
    pub(crate) device_num: AtomicU64,
    /// Device UUID strings, NUL-terminated and zero-padded.
    pub(crate) uuids: [DeviceUuid; DEVS],
    /// Memory limit per device in bytes; 0 means unlimited.
    pub(crate) limit: [AtomicU64; DEVS],
    /// SM limit per device in percent.
    pub(crate) sm_limit: [AtomicU64; DEVS],
    /// The process slots; `[0, proc_num)` are in use or holes.
    pub(crate) procs: [ProcSlot<DEVS>; SLOTS],
    /// High-water mark of the slot table.
    pub(crate) proc_num: AtomicI32,
    /// Whether the SM limiter is active (toggled by HAMi's monitor).
    pub(crate) utilization_switch: AtomicI32,
    /// Priority gate: the monitor sets -1 to block lower-priority tasks.
    pub(crate) recent_kernel: AtomicI32,
    /// `CUDA_TASK_PRIORITY` of the initialiser.
    pub(crate) priority: AtomicI32,
    /// Epoch seconds of the last kernel launch.
    pub(crate) last_kernel_time: AtomicU64,
    /// Semaphore upstream uses to serialise host-pid discovery.
    pub(crate) sem_postinit: RawSem,
}

/// The ABI instance: exactly HAMi-core v1.2's `shared_region_t`.
pub type SharedRegion = Region<ABI_SLOTS, ABI_DEVS>;
/// The ABI slot: exactly HAMi-core v1.2's `shrreg_proc_slot_t`.
pub type SharedProcSlot = ProcSlot<ABI_DEVS>;

fn zeroed_u64s<const N: usize>() -> [AtomicU64; N] {
    core::array::from_fn(|_| AtomicU64::new(0))
}

fn zeroed_data<const N: usize>() -> [DataAtomicU64; N] {
    core::array::from_fn(|_| DataAtomicU64::new(0))
}

impl DeviceMemory {
    fn zeroed() -> Self {
        DeviceMemory {
            context_size: AtomicU64::new(0),
            module_size: AtomicU64::new(0),
            data_size: AtomicU64::new(0),
            offset: AtomicU64::new(0),
            total: AtomicU64::new(0),
            unused: zeroed_data(),
        }
    }
}

impl DeviceUtil {
    fn zeroed() -> Self {
        DeviceUtil {
            dec_util: DataAtomicU64::new(0),
            enc_util: DataAtomicU64::new(0),
            sm_util: DataAtomicU64::new(0),
            unused: zeroed_data(),
        }
    }
}

impl<const DEVS: usize> ProcSlot<DEVS> {
    /// Zeroes the slot's NVML-reported usage (`monitorused`), as HAMi-core's `set_host_pid` does
    /// when the slot gets a host pid: samples taken under another pid do not belong to it.
    pub fn clear_monitor_usage(&self) {
        for m in &self.monitorused {
            m.store(0, Ordering::Relaxed);
        }
    }

    fn zeroed() -> Self {
        ProcSlot {
            pid: AtomicI32::new(0),
            hostpid: AtomicI32::new(0),
            used: core::array::from_fn(|_| DeviceMemory::zeroed()),
            monitorused: zeroed_data(),
            device_util: core::array::from_fn(|_| DeviceUtil::zeroed()),
            status: AtomicI32::new(0),
            padding: AtomicI32::new(0),
            seqlock: AtomicU64::new(0),
            unused: zeroed_u64s(),
        }
    }
}

impl<const SLOTS: usize, const DEVS: usize> Region<SLOTS, DEVS> {
    /// Size of the region in bytes (the mmap length; the file is one byte longer).
    pub const SIZE: usize = core::mem::size_of::<Self>();

    /// An all-zero region, as a freshly created file maps. For models and small tests; the ABI
    /// region is only ever a mapping, never a value.
    pub fn zeroed() -> Self {
        Region {
            initialized_flag: AtomicI32::new(0),
            major_version: AtomicU32::new(0),
            minor_version: AtomicU32::new(0),
            sm_init_flag: AtomicI32::new(0),
            owner_pid: AtomicU64::new(0),
            sem: RawSem::zeroed(),
            device_num: AtomicU64::new(0),
            uuids: core::array::from_fn(|_| DeviceUuid {
                text: core::array::from_fn(|_| DataAtomicU8::new(0)),
            }),
            limit: zeroed_u64s(),
            sm_limit: zeroed_u64s(),
            procs: core::array::from_fn(|_| ProcSlot::zeroed()),
            proc_num: AtomicI32::new(0),
            utilization_switch: AtomicI32::new(0),
            recent_kernel: AtomicI32::new(0),
            priority: AtomicI32::new(0),
            last_kernel_time: AtomicU64::new(0),
            sem_postinit: RawSem::zeroed(),
        }
    }

    /// `proc_num` clamped to `[0, SLOTS]`: a peer may have written garbage there.
    pub fn proc_num_bounded(&self) -> usize {
        let n = self.proc_num.load(Ordering::Acquire);
        (n.max(0) as usize).min(SLOTS)
    }

    /// The slots that may be in use, `[0, proc_num)`, bounded.
    pub fn live_range(&self) -> &[ProcSlot<DEVS>] {
        &self.procs[..self.proc_num_bounded()]
    }

    /// Records the GPUs' UUIDs as HAMi-core's `init_device_info` does: each `(index, uuid)` into
    /// its entry (text, then zeros to the end of the 96 bytes; an index the region does not have
    /// is skipped), then `device_num = count` (at most `DEVS`) with release, so that a reader of
    /// `device_num` sees the entries. Every process naming the same GPUs writes the same bytes.
    pub fn record_devices<'a>(
        &self,
        uuids: impl IntoIterator<Item = (usize, &'a [u8])>,
        count: usize,
    ) {
        for (index, uuid) in uuids {
            if let Some(entry) = self.uuids.get(index) {
                entry.store(uuid);
            }
        }
        self.device_num
            .store(count.min(DEVS) as u64, Ordering::Release);
    }
}

/// The byte layout, pinned. A second, independent statement of these numbers lives in
/// `c-tests/layout.c`, which checks the generated C header against them.
#[cfg(not(any(loom, shuttle)))]
mod pinned {
    use super::*;
    use core::mem::{align_of, offset_of, size_of};
    use static_assertions::const_assert_eq;

    const_assert_eq!(size_of::<RawSem>(), 32);
    const_assert_eq!(align_of::<RawSem>(), 8);

    const_assert_eq!(size_of::<DeviceUuid>(), UUID_LEN);
    const_assert_eq!(size_of::<SmBucket>(), 40);

    // The tail: one page, at the first page boundary past the region and C's byte at SIZE.
    const_assert_eq!(EXT_OFFSET, 2_011_136);
    const_assert_eq!(size_of::<Ext>(), 4096);
    const_assert_eq!(EXT_END, 2_015_232);
    const_assert_eq!(offset_of!(Ext, magic), 0);
    const_assert_eq!(offset_of!(Ext, version), 8);
    const_assert_eq!(offset_of!(Ext, devs), 12);
    const_assert_eq!(offset_of!(Ext, buckets), 16);
    const_assert_eq!(offset_of!(Ext, context_cost), 656);
    const_assert_eq!(offset_of!(Ext, context_probe), 784);
    const_assert_eq!(offset_of!(Ext, reserved), 912);

    const_assert_eq!(size_of::<DeviceMemory>(), 64);
    const_assert_eq!(align_of::<DeviceMemory>(), 8);
    const_assert_eq!(offset_of!(DeviceMemory, context_size), 0);
    const_assert_eq!(offset_of!(DeviceMemory, module_size), 8);
    const_assert_eq!(offset_of!(DeviceMemory, data_size), 16);
    const_assert_eq!(offset_of!(DeviceMemory, offset), 24);
    const_assert_eq!(offset_of!(DeviceMemory, total), 32);
    const_assert_eq!(offset_of!(DeviceMemory, unused), 40);

    const_assert_eq!(size_of::<DeviceUtil>(), 48);
    const_assert_eq!(offset_of!(DeviceUtil, dec_util), 0);
    const_assert_eq!(offset_of!(DeviceUtil, enc_util), 8);
    const_assert_eq!(offset_of!(DeviceUtil, sm_util), 16);
    const_assert_eq!(offset_of!(DeviceUtil, unused), 24);

    const_assert_eq!(size_of::<SharedProcSlot>(), 1960);
    const_assert_eq!(align_of::<SharedProcSlot>(), 8);
    const_assert_eq!(offset_of!(SharedProcSlot, pid), 0);
    const_assert_eq!(offset_of!(SharedProcSlot, hostpid), 4);
    const_assert_eq!(offset_of!(SharedProcSlot, used), 8);
    const_assert_eq!(offset_of!(SharedProcSlot, monitorused), 1032);
    const_assert_eq!(offset_of!(SharedProcSlot, device_util), 1160);
    const_assert_eq!(offset_of!(SharedProcSlot, status), 1928);
    const_assert_eq!(offset_of!(SharedProcSlot, padding), 1932);
    const_assert_eq!(offset_of!(SharedProcSlot, seqlock), 1936);
    const_assert_eq!(offset_of!(SharedProcSlot, unused), 1944);

    const_assert_eq!(size_of::<SharedRegion>(), 2_008_952);
    const_assert_eq!(align_of::<SharedRegion>(), 8);
    const_assert_eq!(offset_of!(SharedRegion, initialized_flag), 0);
    const_assert_eq!(offset_of!(SharedRegion, major_version), 4);
    const_assert_eq!(offset_of!(SharedRegion, minor_version), 8);
    const_assert_eq!(offset_of!(SharedRegion, sm_init_flag), 12);
    const_assert_eq!(offset_of!(SharedRegion, owner_pid), 16);
    const_assert_eq!(offset_of!(SharedRegion, sem), 24);
    const_assert_eq!(offset_of!(SharedRegion, device_num), 56);
    const_assert_eq!(offset_of!(SharedRegion, uuids), 64);
    const_assert_eq!(offset_of!(SharedRegion, limit), 1600);
    const_assert_eq!(offset_of!(SharedRegion, sm_limit), 1728);
    const_assert_eq!(offset_of!(SharedRegion, procs), 1856);
    const_assert_eq!(offset_of!(SharedRegion, proc_num), 2_008_896);
    const_assert_eq!(offset_of!(SharedRegion, utilization_switch), 2_008_900);
    const_assert_eq!(offset_of!(SharedRegion, recent_kernel), 2_008_904);
    const_assert_eq!(offset_of!(SharedRegion, priority), 2_008_908);
    const_assert_eq!(offset_of!(SharedRegion, last_kernel_time), 2_008_912);
    const_assert_eq!(offset_of!(SharedRegion, sem_postinit), 2_008_920);
}

#[cfg(all(test, not(any(loom, shuttle))))]
mod tests {
    use super::*;

    fn bytes(u: &DeviceUuid) -> [u8; UUID_LEN] {
        core::array::from_fn(|i| u.text[i].load(Ordering::Relaxed))
    }

    /// An entry is the text and zeros, whatever was there before, so two processes naming one GPU
    /// leave the 96 bytes HAMi's monitor compares identical.
    #[test]
    fn a_uuid_entry_is_its_text_and_zeros() {
        let u = DeviceUuid {
            text: core::array::from_fn(|_| DataAtomicU8::new(0xAA)),
        };
        u.store(b"GPU-1234\0garbage");
        let mut want = [0u8; UUID_LEN];
        want[..8].copy_from_slice(b"GPU-1234");
        assert_eq!(bytes(&u), want);
        // At most 95 bytes of text: the entry stays NUL-terminated.
        u.store(&[b'x'; 200]);
        let b = bytes(&u);
        assert!(b[..UUID_LEN - 1].iter().all(|&c| c == b'x'));
        assert_eq!(b[UUID_LEN - 1], 0);
    }

    #[test]
    fn recorded_devices_skip_indices_beyond_the_region() {
        let r = Region::<1, 2>::zeroed();
        r.uuids[1].text[50].store(0xAA, Ordering::Relaxed);
        r.record_devices(
            [(1, &b"GPU-b"[..]), (0, &b"GPU-a"[..]), (2, &b"GPU-c"[..])],
            3,
        );
        assert_eq!(r.device_num.load(Ordering::Relaxed), 2);
        let mut want = [0u8; UUID_LEN];
        want[..5].copy_from_slice(b"GPU-a");
        assert_eq!(bytes(&r.uuids[0]), want);
        want[4] = b'b';
        assert_eq!(bytes(&r.uuids[1]), want);
    }

    #[test]
    fn a_zeroed_tail_is_unmetered_and_unleased() {
        let e = Ext::zeroed();
        assert!(e
            .buckets
            .iter()
            .all(|b| b.rate.load(Ordering::Relaxed) == 0 && b.lease.load(Ordering::Relaxed) == 0));
        e.mark();
        assert_eq!(e.magic.load(Ordering::Relaxed), EXT_MAGIC);
        assert_eq!(e.version.load(Ordering::Relaxed), EXT_VERSION);
        assert_eq!(e.devs.load(Ordering::Relaxed), ABI_DEVS as u32);
    }
}
