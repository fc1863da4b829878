//! Telling apart the region layouts that exist in the field, before a file is mapped and used.
//!
//! Three layouts carry the same magic: L0 (v1.1 before PR 155), L1 (PR 155's v1.1, every field
//! after `sem` shifted by 32 bytes) and L2 (v1.2, ours). L0 and L2 are offset-compatible; L1 is
//! compatible with neither yet claims the same version as L0, so the file size and the bytes where
//! the two disagree decide (bug B2: the C code never checks either). A file is read with `pread`
//! of [`HEADER_LEN`] bytes and classified here; only [`Verdict`]s other than refusals are mapped.

use core::fmt;

use crate::layout::{ABI_DEVS, INIT_IN_PROGRESS, MAGIC, MAJOR_VERSION, MINOR_VERSION};

/// Bytes of the file's start that [`classify`] looks at.
pub const HEADER_LEN: usize = 72;
/// How much bigger than ours an L1 (PR 155 shifted) file is: its extra `sem_postinit`.
pub const L1_SHIFT: usize = 32;
/// glibc's `private` word of a process-shared `sem_t`.
const GLIBC_SEM_SHARED: u32 = 0x80;

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
/// `Region::SIZE` of the layout the caller maps (the file is normally one byte longer, as the C
/// original writes a byte at offset `size`). Never panics, whatever the bytes.
pub fn classify(header: &[u8], file_len: u64, region_size: usize) -> Result<Verdict, Refusal> {
    let size = region_size as u64;
    let shifted = size + L1_SHIFT as u64;
    if file_len == 0 {
        return Ok(Verdict::Fresh);
    }
    if file_len < size || header.len() < HEADER_LEN {
        return Err(Refusal::Truncated { len: file_len });
    }
    let ours = file_len == size || file_len == size + 1;
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
    use crate::layout::SharedRegion;

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
        ] {
            let text = r.to_string();
            assert!(text.contains("delete the file"), "{text}");
        }
    }
}
