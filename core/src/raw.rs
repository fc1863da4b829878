//! The region's fields, raw, for white-box tests and the models alone (the `raw-fields`
//! feature): a model checks a protocol's words, and a test forges what another process, an older
//! library or a crash left behind. No library crate enables the feature (`ffi/tests/hygiene.rs`
//! checks the manifests), so everywhere else the fields are core's and reached only through
//! core's named operations ([`crate::fields`] and the protocol modules).
//!
//! Each accessor is the field's name with `raw_` before it and returns the field itself.

use core::mem::offset_of;

use crate::layout::{
    DeviceMemory, DeviceUtil, DeviceUuid, Ext, ProcSlot, RawSem, Region, SharedProcSlot,
    SharedRegion, SmBucket, EXT_RESERVED_WORDS, UUID_LEN,
};
use crate::sync::{AtomicI32, AtomicU32, AtomicU64, DataAtomicU64, DataAtomicU8};

/// Declares `raw_<field>(&self) -> &Type` for each listed field of a struct.
macro_rules! raw_fields {
    (impl($($g:tt)*) $ty:ty { $($field:ident $raw:ident: $t:ty,)* }) => {
        impl<$($g)*> $ty {
            $(
                #[doc = concat!("The `", stringify!($field), "` field, raw.")]
                pub fn $raw(&self) -> &$t {
                    &self.$field
                }
            )*
        }
    };
}

raw_fields!(impl(const SLOTS: usize, const DEVS: usize) Region<SLOTS, DEVS> {
    initialized_flag raw_initialized_flag: AtomicI32,
    major_version raw_major_version: AtomicU32,
    minor_version raw_minor_version: AtomicU32,
    sm_init_flag raw_sm_init_flag: AtomicI32,
    owner_pid raw_owner_pid: AtomicU64,
    sem raw_sem: RawSem,
    device_num raw_device_num: AtomicU64,
    uuids raw_uuids: [DeviceUuid; DEVS],
    limit raw_limit: [AtomicU64; DEVS],
    sm_limit raw_sm_limit: [AtomicU64; DEVS],
    procs raw_procs: [ProcSlot<DEVS>; SLOTS],
    proc_num raw_proc_num: AtomicI32,
    utilization_switch raw_utilization_switch: AtomicI32,
    recent_kernel raw_recent_kernel: AtomicI32,
    priority raw_priority: AtomicI32,
    last_kernel_time raw_last_kernel_time: AtomicU64,
    sem_postinit raw_sem_postinit: RawSem,
});

raw_fields!(impl(const DEVS: usize) ProcSlot<DEVS> {
    pid raw_pid: AtomicI32,
    hostpid raw_hostpid: AtomicI32,
    used raw_used: [DeviceMemory; DEVS],
    monitorused raw_monitorused: [DataAtomicU64; DEVS],
    device_util raw_device_util: [DeviceUtil; DEVS],
    status raw_status: AtomicI32,
    padding raw_padding: AtomicI32,
    seqlock raw_seqlock: AtomicU64,
    unused raw_unused: [AtomicU64; 2],
});

raw_fields!(impl() DeviceMemory {
    context_size raw_context_size: AtomicU64,
    module_size raw_module_size: AtomicU64,
    data_size raw_data_size: AtomicU64,
    offset raw_offset: AtomicU64,
    total raw_total: AtomicU64,
    unused raw_unused: [DataAtomicU64; 3],
});

raw_fields!(impl() DeviceUtil {
    dec_util raw_dec_util: DataAtomicU64,
    enc_util raw_enc_util: DataAtomicU64,
    sm_util raw_sm_util: DataAtomicU64,
    unused raw_unused: [DataAtomicU64; 3],
});

raw_fields!(impl() DeviceUuid {
    text raw_text: [DataAtomicU8; UUID_LEN],
});

raw_fields!(impl() RawSem {
    words raw_words: [DataAtomicU64; 4],
});

raw_fields!(impl() SmBucket {
    tokens raw_tokens: AtomicU64,
    rate raw_rate: AtomicU64,
    refilled_ns raw_refilled_ns: AtomicU64,
    lease raw_lease: AtomicU64,
    spent raw_spent: AtomicU64,
});

raw_fields!(impl() Ext {
    magic raw_magic: AtomicU64,
    version raw_version: AtomicU32,
    devs raw_devs: AtomicU32,
    buckets raw_buckets: [SmBucket; crate::layout::ABI_DEVS],
    context_cost raw_context_cost: [AtomicU64; crate::layout::ABI_DEVS],
    context_probe raw_context_probe: [AtomicU64; crate::layout::ABI_DEVS],
    reserved raw_reserved: [AtomicU64; EXT_RESERVED_WORDS],
});

/// Byte offsets in the region file, for tests that read or write the file's bytes as a C peer
/// would.
pub mod offsets {
    use super::*;

    /// `proc_num`.
    pub const PROC_NUM: usize = offset_of!(SharedRegion, proc_num);
    /// The first slot, `procs[0]`.
    pub const PROCS: usize = offset_of!(SharedRegion, procs);
    /// `sem`.
    pub const SEM: usize = offset_of!(SharedRegion, sem);
    /// `sem_postinit`.
    pub const SEM_POSTINIT: usize = offset_of!(SharedRegion, sem_postinit);
    /// A slot's `pid`, from the slot's start.
    pub const SLOT_PID: usize = offset_of!(SharedProcSlot, pid);
}
