//! Telling apart the region layouts that exist in the field, before a file is mapped and used.
//!
//! Three layouts carry the same magic: L0 (v1.1 before PR 155), L1 (PR 155's v1.1, every field
//! after `sem` shifted by 32 bytes) and L2 (v1.2, ours). L0 and L2 are offset-compatible; L1 is
//! compatible with neither yet claims the same version as L0, so the file size and the bytes where
//! the two disagree decide (bug B2: the C code never checks either). A file is read with `pread`
//! of [`HEADER_LEN`] bytes and classified here; only [`Verdict`]s other than refusals are mapped.

use core::fmt;

use crate::layout::{
    Ext, RawSem, Region, ABI_DEVS, INIT_IN_PROGRESS, MAGIC, MAJOR_VERSION, MINOR_VERSION,
};
use crate::sync::Ordering;

/// Bytes of the file's start that [`classify`] looks at.
pub const HEADER_LEN: usize = 72;
/// How much bigger than ours an L1 (PR 155 shifted) file is: its extra `sem_postinit`.
pub const L1_SHIFT: usize = 32;
/// glibc's `private` word of a process-shared `sem_t`.
const GLIBC_SEM_SHARED: u32 = 0x80;

/// Byte counts above this (64 PiB) are garbage: no GPU has that much memory, and an unguarded
/// subtraction that wrapped (bug B3) lands near 2^64.
pub const SANE_BYTES_MAX: u64 = 1 << 56;
/// SM limits above this are garbage (percentages; C peers store what the variable said).
pub const SANE_SM_LIMIT_MAX: u64 = 0xffff;
/// A semaphore value or waiter count above this is garbage (the owner lock is a mutex).
const SANE_SEM_COUNT_MAX: u32 = 1 << 20;

/// What [`check_body`] found wrong in an initialised region's fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyFault {
    /// The owner lock's `sem_t` is not a process-shared semaphore (glibc's futex calls on it
    /// fail, and glibc aborts the process).
    OwnerSem {
        /// Its `private` word.
        private: u32,
        /// Its value.
        value: u32,
    },
    /// `sem_postinit` is neither zero (v1.1 left it so) nor a process-shared semaphore.
    PostInitSem {
        /// Its `private` word.
        private: u32,
    },
    /// `device_num` is more than the region has devices.
    DeviceNum(u64),
    /// A memory limit no GPU has.
    Limit {
        /// Device index.
        dev: usize,
        /// The value.
        value: u64,
    },
    /// An SM limit that is no percentage.
    SmLimit {
        /// Device index.
        dev: usize,
        /// The value.
        value: u64,
    },
    /// `proc_num` outside the slot table.
    ProcNum(i32),
    /// `owner_pid` holds a negative pid.
    OwnerPid(u64),
}

impl fmt::Display for BodyFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            BodyFault::OwnerSem { private, value } => write!(
                f,
                "the owner lock's semaphore is not a process-shared semaphore (private word \
                 {private:#x}, value {value})"
            ),
            BodyFault::PostInitSem { private } => write!(
                f,
                "sem_postinit is not a process-shared semaphore (private word {private:#x})"
            ),
            BodyFault::DeviceNum(n) => write!(f, "device_num is {n}"),
            BodyFault::Limit { dev, value } => {
                write!(f, "device {dev}'s memory limit is {value} bytes")
            }
            BodyFault::SmLimit { dev, value } => write!(f, "device {dev}'s SM limit is {value}%"),
            BodyFault::ProcNum(n) => write!(f, "proc_num is {n}"),
            BodyFault::OwnerPid(raw) => write!(f, "owner_pid is {raw:#x}"),
        }
    }
}

fn sem_is_shared(sem: &RawSem) -> bool {
    let first = sem.words[0].load(Ordering::Relaxed);
    sem.glibc_private() == GLIBC_SEM_SHARED
        && (first as u32) <= SANE_SEM_COUNT_MAX
        && ((first >> 32) as u32) <= SANE_SEM_COUNT_MAX
}

/// Checks the fields of an initialised region ([`Verdict::Ready`] or [`Verdict::LegacyV11`])
/// that every process relies on before it may be used: a header that validates over a body of
/// garbage (a stray write, a file copied over) made glibc abort in `sem_wait`, or set limits no
/// GPU has. The slots are not checked here: their pids are judged by liveness and reaped, and a
/// counter that wrapped (a C peer's bug B3) is one slot's problem, not the region's. Only loads.
pub fn check_body<const S: usize, const D: usize>(region: &Region<S, D>) -> Result<(), BodyFault> {
    if !sem_is_shared(&region.sem) {
        let first = region.sem.words[0].load(Ordering::Relaxed);
        return Err(BodyFault::OwnerSem {
            private: region.sem.glibc_private(),
            value: first as u32,
        });
    }
    let post = region.sem_postinit.glibc_private();
    if post != 0 && !sem_is_shared(&region.sem_postinit) {
        return Err(BodyFault::PostInitSem { private: post });
    }
    let devices = region.device_num.load(Ordering::Relaxed);
    if devices > D as u64 {
        return Err(BodyFault::DeviceNum(devices));
    }
    for (dev, (limit, sm)) in region.limit.iter().zip(&region.sm_limit).enumerate() {
        let value = limit.load(Ordering::Relaxed);
        if value > SANE_BYTES_MAX {
            return Err(BodyFault::Limit { dev, value });
        }
        let value = sm.load(Ordering::Relaxed);
        if value > SANE_SM_LIMIT_MAX {
            return Err(BodyFault::SmLimit { dev, value });
        }
    }
    let procs = region.proc_num.load(Ordering::Relaxed);
    if procs < 0 || procs as usize > S {
        return Err(BodyFault::ProcNum(procs));
    }
    let owner = region.owner_pid.load(Ordering::Relaxed);
    if (owner as u32 as i32) < 0 {
        return Err(BodyFault::OwnerPid(owner));
    }
    Ok(())
}

/// What a usable file holds, and so what the opener must do with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Empty or never initialised: extend it to `size + 1` bytes and initialise it.
    Fresh,
    /// An initialiser marked the region [`INIT_IN_PROGRESS`] and did not finish; since
    /// initialisers hold the init lock, whoever takes the lock next redoes the work.
    InitInterrupted,
    /// A v1.2 region: use it as is.
    Ready,
    /// A v1.1 region of the L0 layout (offset-compatible): use it, after initialising its
    /// `sem_postinit`, which v1.1 never did (bug B1: a zeroed `sem_t` stalls every waiter).
    LegacyV11,
}

/// Why a file must not be used. Each names what was found; [`fmt::Display`] adds the fix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Shorter than a region: a writer died while creating it, or it is not a region.
    Truncated {
        /// Bytes in the file.
        len: u64,
    },
    /// A size that no known layout has.
    WrongSize {
        /// Bytes in the file.
        len: u64,
    },
    /// PR 155's v1.1 layout, whose fields sit 32 bytes later than ours.
    ShiftedV11,
    /// The magic is right but the version is not one we know.
    UnknownVersion {
        /// `major_version` found.
        major: u32,
        /// `minor_version` found.
        minor: u32,
    },
    /// The first word is neither 0, [`INIT_IN_PROGRESS`] nor [`MAGIC`].
    WrongMagic {
        /// `initialized_flag` found.
        flag: i32,
    },
    /// The header is valid but the fields behind it are garbage ([`check_body`]).
    CorruptBody(BodyFault),
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const STALE: &str = "stop the container's GPU processes and delete the file";
        match *self {
            Refusal::Truncated { len } => write!(
                f,
                "file is {len} bytes, shorter than a shared region; {STALE} (or point \
                 CUDA_DEVICE_MEMORY_SHARED_CACHE elsewhere)"
            ),
            Refusal::WrongSize { len } => write!(
                f,
                "file is {len} bytes, which no known region layout has; {STALE} (or point \
                 CUDA_DEVICE_MEMORY_SHARED_CACHE elsewhere)"
            ),
            Refusal::ShiftedV11 => write!(
                f,
                "region was written by HAMi-core's PR 155 build (v1.1 with fields shifted by 32 \
                 bytes), which no other version can share; {STALE}, or upgrade all processes"
            ),
            Refusal::UnknownVersion { major, minor } => write!(
                f,
                "region version {major}.{minor} is not one this library knows \
                 ({MAJOR_VERSION}.{MINOR_VERSION} or 1.1); upgrade the library or {STALE}"
            ),
            Refusal::WrongMagic { flag } => write!(
                f,
                "first word is {flag:#x}, not a shared region's magic; the file is not a region: \
                 {STALE}"
            ),
            Refusal::CorruptBody(fault) => write!(
                f,
                "the region's header is valid but {fault}: the file is corrupt (a stray write or \
                 a file copied over it); {STALE} (it is created again), or run shrreg-tool \
                 --create-new"
            ),
        }
    }
}

fn u32_at(header: &[u8], offset: usize) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&header[offset..offset + 4]);
    u32::from_le_bytes(word)
}

fn u64_at(header: &[u8], offset: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&header[offset..offset + 8]);
    u64::from_le_bytes(word)
}

/// Classifies a region file from its first bytes and its length. `region_size` is
/// `Region::SIZE` of the layout the caller maps (the file is one byte longer where the C original
/// made it, as it writes a byte at offset `size`, and at least as long as our tail, the
/// [`Ext`] page at [`crate::layout::ext_offset`], once one of our processes extended it). Never
/// panics, whatever the bytes.
pub fn classify(header: &[u8], file_len: u64, region_size: usize) -> Result<Verdict, Refusal> {
    let size = region_size as u64;
    let shifted = size + L1_SHIFT as u64;
    let ext_end =
        crate::layout::ext_offset(region_size) as u64 + core::mem::size_of::<Ext>() as u64;
    if file_len == 0 {
        return Ok(Verdict::Fresh);
    }
    if file_len < size || header.len() < HEADER_LEN {
        return Err(Refusal::Truncated { len: file_len });
    }
    let ours = file_len == size || file_len == size + 1 || file_len >= ext_end;
    let l1_sized = file_len == shifted || file_len == shifted + 1;
    if !ours && !l1_sized {
        return Err(Refusal::WrongSize { len: file_len });
    }
    let flag = u32_at(header, 0) as i32;
    let (major, minor) = (u32_at(header, 4), u32_at(header, 8));
    match flag {
        0 => return Ok(Verdict::Fresh),
        INIT_IN_PROGRESS => return Ok(Verdict::InitInterrupted),
        MAGIC => {}
        _ => return Err(Refusal::WrongMagic { flag }),
    }
    match (major, minor) {
        (MAJOR_VERSION, MINOR_VERSION) => Ok(Verdict::Ready),
        (1, 1) if ours => Ok(Verdict::LegacyV11),
        (1, 1) => {
            // An L1-sized v1.1 file is either L1 itself, or L0 that an L1 process opened (which
            // extends the file but writes nothing). L1 keeps a live `sem_postinit` at offset 56,
            // whose `private` word (offset 64) is 0x80; L0 keeps `device_num` (at most 16) there.
            if u32_at(header, 64) == GLIBC_SEM_SHARED {
                Err(Refusal::ShiftedV11)
            } else if u64_at(header, 56) <= ABI_DEVS as u64 {
                Ok(Verdict::LegacyV11)
            } else {
                Err(Refusal::ShiftedV11)
            }
        }
        _ => Err(Refusal::UnknownVersion { major, minor }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{SharedRegion, EXT_END};

    const SIZE: usize = SharedRegion::SIZE;

    /// A header as a C process of the given layout writes it.
    fn header(flag: i32, major: u32, minor: u32) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[0..4].copy_from_slice(&flag.to_le_bytes());
        h[4..8].copy_from_slice(&major.to_le_bytes());
        h[8..12].copy_from_slice(&minor.to_le_bytes());
        h
    }

    /// L1 puts an initialised `sem_postinit` at 56: value 1, then `private` = 0x80 at 64.
    fn l1_header() -> [u8; HEADER_LEN] {
        let mut h = header(MAGIC, 1, 1);
        h[56..64].copy_from_slice(&1u64.to_le_bytes());
        h[64..68].copy_from_slice(&GLIBC_SEM_SHARED.to_le_bytes());
        h
    }

    /// L0 keeps `device_num` at 56 and the first UUID's bytes from 64.
    fn l0_header(devices: u64) -> [u8; HEADER_LEN] {
        let mut h = header(MAGIC, 1, 1);
        h[56..64].copy_from_slice(&devices.to_le_bytes());
        h[64..68].copy_from_slice(b"GPU-");
        h
    }

    fn file(len: usize) -> u64 {
        len as u64
    }

    #[test]
    fn empty_and_zeroed_files_are_fresh() {
        assert_eq!(classify(&[], 0, SIZE), Ok(Verdict::Fresh));
        let zero = [0u8; HEADER_LEN];
        assert_eq!(classify(&zero, file(SIZE + 1), SIZE), Ok(Verdict::Fresh));
        assert_eq!(classify(&zero, file(SIZE), SIZE), Ok(Verdict::Fresh));
    }

    #[test]
    fn our_layout_is_ready_at_both_lengths() {
        let h = header(MAGIC, 1, 2);
        assert_eq!(classify(&h, file(SIZE + 1), SIZE), Ok(Verdict::Ready));
        assert_eq!(classify(&h, file(SIZE), SIZE), Ok(Verdict::Ready));
        // Extended with our tail (and anything longer: the monitor, too, accepts a longer file).
        assert_eq!(classify(&h, file(EXT_END + 1), SIZE), Ok(Verdict::Ready));
        assert_eq!(classify(&h, file(EXT_END), SIZE), Ok(Verdict::Ready));
        assert_eq!(
            classify(&h, file(EXT_END - 1), SIZE),
            Err(Refusal::WrongSize {
                len: (EXT_END - 1) as u64
            })
        );
        // A v1.2 file that an L1 process extended is still ours.
        assert_eq!(
            classify(&h, file(SIZE + L1_SHIFT + 1), SIZE),
            Ok(Verdict::Ready)
        );
    }

    #[test]
    fn interrupted_init_is_recognised() {
        let h = header(INIT_IN_PROGRESS, 1, 2);
        assert_eq!(
            classify(&h, file(SIZE + 1), SIZE),
            Ok(Verdict::InitInterrupted)
        );
    }

    #[test]
    fn l0_is_legacy_at_its_own_size_and_when_extended_by_l1() {
        assert_eq!(
            classify(&l0_header(2), file(SIZE + 1), SIZE),
            Ok(Verdict::LegacyV11)
        );
        assert_eq!(
            classify(&l0_header(16), file(SIZE + L1_SHIFT + 1), SIZE),
            Ok(Verdict::LegacyV11)
        );
    }

    #[test]
    fn l1_is_refused() {
        assert_eq!(
            classify(&l1_header(), file(SIZE + L1_SHIFT + 1), SIZE),
            Err(Refusal::ShiftedV11)
        );
        assert_eq!(
            classify(&l1_header(), file(SIZE + L1_SHIFT), SIZE),
            Err(Refusal::ShiftedV11)
        );
        // An L1-sized v1.1 file whose offset 56 is no plausible device count is refused too.
        assert_eq!(
            classify(&l0_header(17), file(SIZE + L1_SHIFT + 1), SIZE),
            Err(Refusal::ShiftedV11)
        );
    }

    #[test]
    fn other_sizes_versions_and_magics_are_refused() {
        let h = header(MAGIC, 1, 2);
        assert_eq!(
            classify(&h, file(100), SIZE),
            Err(Refusal::Truncated { len: 100 })
        );
        assert_eq!(
            classify(&h, file(SIZE + 2), SIZE),
            Err(Refusal::WrongSize {
                len: (SIZE + 2) as u64
            })
        );
        assert_eq!(
            classify(&header(MAGIC, 2, 0), file(SIZE + 1), SIZE),
            Err(Refusal::UnknownVersion { major: 2, minor: 0 })
        );
        assert_eq!(
            classify(&header(0x1234, 1, 2), file(SIZE + 1), SIZE),
            Err(Refusal::WrongMagic { flag: 0x1234 })
        );
        // A short header with a plausible length cannot be judged.
        assert_eq!(
            classify(&h[..10], file(SIZE + 1), SIZE),
            Err(Refusal::Truncated {
                len: (SIZE + 1) as u64
            })
        );
    }

    #[test]
    fn every_refusal_names_a_fix() {
        extern crate std;
        use std::string::ToString;
        for r in [
            Refusal::Truncated { len: 1 },
            Refusal::WrongSize { len: 1 },
            Refusal::ShiftedV11,
            Refusal::UnknownVersion { major: 9, minor: 9 },
            Refusal::WrongMagic { flag: 7 },
            Refusal::CorruptBody(BodyFault::DeviceNum(99)),
        ] {
            let text = r.to_string();
            assert!(text.contains("delete the file"), "{text}");
        }
    }

    /// A small region as an initialiser leaves it: both semaphores process-shared.
    fn initialised() -> Region<3, 2> {
        let r = Region::<3, 2>::zeroed();
        for sem in [&r.sem, &r.sem_postinit] {
            sem.words[0].store(1, Ordering::Relaxed);
            sem.words[1].store(u64::from(GLIBC_SEM_SHARED), Ordering::Relaxed);
        }
        r.device_num.store(2, Ordering::Relaxed);
        r.limit[0].store(1 << 30, Ordering::Relaxed);
        r.sm_limit[1].store(100, Ordering::Relaxed);
        r.proc_num.store(3, Ordering::Relaxed);
        r.owner_pid.store(0x0000_0007_0000_1234, Ordering::Relaxed);
        r
    }

    #[test]
    fn an_initialised_body_passes_and_a_v11_zeroed_postinit_too() {
        let r = initialised();
        assert_eq!(check_body(&r), Ok(()));
        r.sem_postinit.words[0].store(0, Ordering::Relaxed);
        r.sem_postinit.words[1].store(0, Ordering::Relaxed);
        assert_eq!(check_body(&r), Ok(()));
    }

    #[test]
    fn each_garbage_field_is_named() {
        type Spoil = dyn Fn(&Region<3, 2>);
        let cases: [(&Spoil, BodyFault); 8] = [
            (
                &|r| r.sem.words[1].store(0x1234_5678, Ordering::Relaxed),
                BodyFault::OwnerSem {
                    private: 0x1234_5678,
                    value: 1,
                },
            ),
            (
                &|r| r.sem.words[0].store(0xdead_beef_0000_0001, Ordering::Relaxed),
                BodyFault::OwnerSem {
                    private: GLIBC_SEM_SHARED,
                    value: 1,
                },
            ),
            (
                &|r| r.sem_postinit.words[1].store(0x7, Ordering::Relaxed),
                BodyFault::PostInitSem { private: 7 },
            ),
            (
                &|r| r.device_num.store(3, Ordering::Relaxed),
                BodyFault::DeviceNum(3),
            ),
            (
                &|r| r.limit[1].store(u64::MAX - 5, Ordering::Relaxed),
                BodyFault::Limit {
                    dev: 1,
                    value: u64::MAX - 5,
                },
            ),
            (
                &|r| r.sm_limit[0].store(1 << 40, Ordering::Relaxed),
                BodyFault::SmLimit {
                    dev: 0,
                    value: 1 << 40,
                },
            ),
            (
                &|r| r.proc_num.store(4, Ordering::Relaxed),
                BodyFault::ProcNum(4),
            ),
            (
                &|r| r.owner_pid.store(0xffff_fff0, Ordering::Relaxed),
                BodyFault::OwnerPid(0xffff_fff0),
            ),
        ];
        for (spoil, want) in cases {
            let r = initialised();
            spoil(&r);
            assert_eq!(check_body(&r), Err(want));
        }
        // The largest sane values pass.
        let r = initialised();
        r.limit[1].store(SANE_BYTES_MAX, Ordering::Relaxed);
        r.sm_limit[1].store(SANE_SM_LIMIT_MAX, Ordering::Relaxed);
        r.device_num.store(2, Ordering::Relaxed);
        assert_eq!(check_body(&r), Ok(()));
    }
}
