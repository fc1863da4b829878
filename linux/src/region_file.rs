//! Opening the shared region file safely, and mapping it.
//!
//! Unlike the C original (which calls `umask(0)` for the whole process, follows a symlink at a
//! fixed path in /tmp, maps whatever it finds and `exit`s on any failure):
//! - the file is opened with `O_NOFOLLOW | O_CLOEXEC` (and `O_NONBLOCK`, so a FIFO planted at the
//!   path cannot block us; cleared again once the file is known to be regular);
//! - it is created with `O_EXCL`, and only a file we created gets `fchmod(0666)`, so every user of
//!   the container may attach whatever the umask, and the umask is never touched. An existing
//!   file is opened without `O_CREAT` (which also keeps `fs.protected_regular` from refusing a
//!   peer's file in a sticky /tmp);
//! - it must be a regular file whose size and header [`classify`] accepts; a file shorter than
//!   our extension tail ([`Ext`], at [`EXT_OFFSET`]) is extended in read-write mode (one zero byte
//!   at offset [`EXT_END`], beyond every mapped byte, as C peers write one at `SIZE`), and no file
//!   is ever shrunk;
//! - every failure is a [`RegionFileError`] whose text is one line: `<path>: <what was found>;
//!   <how to fix it>`.
//!
//! The descriptor is also where the platform takes its record locks
//! ([`crate::platform::LinuxPlatform`]). Closing it (dropping the [`RegionFile`]) releases every
//! record lock this *process* holds on the file, which is why the preload library leaks it.

use std::ffi::CString;
use std::fmt;
use std::mem::ManuallyDrop;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use hami_shm::layout::{Ext, SharedRegion, EXT_END, EXT_OFFSET};
use hami_shm::validate::{check_body, classify, Refusal, Verdict, HEADER_LEN};

use crate::region_guard;

/// Mode of a region file we create: every user of the container may attach, as with the C
/// original.
pub const CREATE_MODE: libc::mode_t = 0o666;

/// Bytes of the region C peers and HAMi's monitor share.
const SIZE: usize = SharedRegion::SIZE;

/// How a region file is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    /// Read and write, creating (and extending) the file if missing. For the library.
    ReadWrite,
    /// Read only, mapped `PROT_READ`; never creates or changes anything. For inspection tools.
    ReadOnly,
}

/// Why a region file cannot be used. Each variant names the path; [`fmt::Display`] writes one
/// line: the path, what was found, and how to fix it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegionFileError {
    /// The path cannot be passed to the kernel (it holds a NUL byte).
    InvalidPath {
        /// The path.
        path: PathBuf,
    },
    /// `open` failed.
    Open {
        /// The path.
        path: PathBuf,
        /// `errno` of the failed `open`.
        errno: i32,
        /// How we tried to open it.
        mode: OpenMode,
    },
    /// Something other than a regular file is at the path.
    NotRegular {
        /// The path.
        path: PathBuf,
        /// What is there ("directory", "FIFO", ...).
        kind: &'static str,
    },
    /// The file is empty, so there is nothing to inspect ([`OpenMode::ReadOnly`] only).
    Empty {
        /// The path.
        path: PathBuf,
    },
    /// The file's size or header is not a region this library may share.
    Layout {
        /// The path.
        path: PathBuf,
        /// What [`classify`] found.
        refusal: Refusal,
    },
    /// `mmap` failed.
    Map {
        /// The path.
        path: PathBuf,
        /// `errno` of the failed `mmap`.
        errno: i32,
    },
    /// Permission was refused (`EACCES`, `EPERM`) opening or creating the file.
    Denied {
        /// The path.
        path: PathBuf,
        /// `errno` of the failed `open`.
        errno: i32,
        /// How we tried to open it.
        mode: OpenMode,
        /// The file's owner and permission bits, when it exists (else it could not be created).
        file: Option<FileOwner>,
        /// This process's effective uid.
        uid: u32,
    },
    /// A directory on the path is a symlink that another user could have planted or could
    /// change.
    SymlinkedParent {
        /// The path.
        path: PathBuf,
        /// The symlink.
        link: PathBuf,
        /// Why it is not trusted.
        why: &'static str,
    },
    /// The file's length changed while it was read ([`snapshot`]).
    Changed {
        /// The path.
        path: PathBuf,
        /// Bytes before the read.
        before: u64,
        /// Bytes after it.
        after: u64,
    },
    /// Reading or extending the file failed.
    Io {
        /// The path.
        path: PathBuf,
        /// What we were doing ("fstat", "read the header", ...).
        op: &'static str,
        /// `errno` of the failed call.
        errno: i32,
    },
}

/// Who owns an existing region file, and its permission bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileOwner {
    /// Owner uid.
    pub uid: u32,
    /// Permission bits (`st_mode & 0o7777`).
    pub perm: u32,
}

impl FileOwner {
    /// Whether the permission bits let `uid` read (and, for `write`, write) the file.
    fn allows(&self, uid: u32, write: bool) -> bool {
        let shift = if uid == self.uid { 6 } else { 0 };
        let need = if write { 0o6 } else { 0o4 };
        uid == 0 || (self.perm >> shift) & need == need
    }
}

impl RegionFileError {
    /// The path the error is about.
    pub fn path(&self) -> &Path {
        match self {
            RegionFileError::InvalidPath { path }
            | RegionFileError::Open { path, .. }
            | RegionFileError::NotRegular { path, .. }
            | RegionFileError::Empty { path }
            | RegionFileError::Layout { path, .. }
            | RegionFileError::Map { path, .. }
            | RegionFileError::Denied { path, .. }
            | RegionFileError::SymlinkedParent { path, .. }
            | RegionFileError::Changed { path, .. }
            | RegionFileError::Io { path, .. } => path,
        }
    }

    /// The `errno` behind the error, if a system call failed.
    pub fn errno(&self) -> Option<i32> {
        match *self {
            RegionFileError::Open { errno, .. }
            | RegionFileError::Denied { errno, .. }
            | RegionFileError::Map { errno, .. }
            | RegionFileError::Io { errno, .. } => Some(errno),
            _ => None,
        }
    }
}

/// A path written on one line: control characters (a newline in a file name) are escaped.
struct OneLine<'a>(&'a Path);

impl fmt::Display for OneLine<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use fmt::Write as _;
        for ch in self.0.to_string_lossy().chars() {
            if ch.is_control() {
                for e in ch.escape_default() {
                    f.write_char(e)?;
                }
            } else {
                f.write_char(ch)?;
            }
        }
        Ok(())
    }
}

const ELSEWHERE: &str = "set CUDA_DEVICE_MEMORY_SHARED_CACHE to a writable regular file's path";

impl fmt::Display for RegionFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = OneLine(self.path());
        let os = |errno: i32| std::io::Error::from_raw_os_error(errno);
        match *self {
            RegionFileError::InvalidPath { .. } => {
                write!(f, "{p}: the path contains a NUL byte; {ELSEWHERE}")
            }
            RegionFileError::Open { errno, mode, .. } => match errno {
                libc::ELOOP => write!(
                    f,
                    "{p}: is a symlink; refusing to follow it at a shared path (another user \
                     could point it at any file): remove the link or {ELSEWHERE}"
                ),
                libc::EROFS => write!(
                    f,
                    "{p}: cannot create or write the shared region: the file system is \
                     read-only ({}); set CUDA_DEVICE_MEMORY_SHARED_CACHE to a path on a writable \
                     file system (such as an emptyDir volume or a writable /tmp)",
                    os(errno)
                ),
                libc::ENOENT if mode == OpenMode::ReadOnly => write!(
                    f,
                    "{p}: no such file: no process has created a shared region here yet; check \
                     CUDA_DEVICE_MEMORY_SHARED_CACHE, or start a GPU process under the library"
                ),
                libc::ENOENT | libc::ENOTDIR => write!(
                    f,
                    "{p}: cannot create the shared region: its directory does not exist ({}); \
                     create the directory or {ELSEWHERE}",
                    os(errno)
                ),
                _ => write!(
                    f,
                    "{p}: cannot open the shared region ({}); {ELSEWHERE}",
                    os(errno)
                ),
            },
            RegionFileError::Denied {
                errno,
                mode,
                file,
                uid,
                ..
            } => {
                let how = match mode {
                    OpenMode::ReadWrite => "for reading and writing",
                    OpenMode::ReadOnly => "for reading",
                };
                match file {
                    Some(o) if !o.allows(uid, mode == OpenMode::ReadWrite) => write!(
                        f,
                        "{p}: cannot open the shared region {how} ({}): the file has mode {:04o} \
                         and belongs to uid {}, and this process runs as uid {uid}; let every \
                         user of the container read and write it (chmod 0666 {p}), or remove it \
                         (it is created again), or {ELSEWHERE}",
                        os(errno),
                        o.perm,
                        o.uid
                    ),
                    Some(o) => write!(
                        f,
                        "{p}: cannot open the shared region {how} ({}) although its mode {:04o} \
                         (owner uid {}) allows uid {uid}: a security policy (SELinux, AppArmor) \
                         or fs.protected_regular in a sticky directory refuses it; remove the \
                         file (it is created again) or {ELSEWHERE}",
                        os(errno),
                        o.perm,
                        o.uid
                    ),
                    None => write!(
                        f,
                        "{p}: cannot create the shared region ({}): the directory is not \
                         writable (or not searchable) by uid {uid}; make it writable by the \
                         container's users or {ELSEWHERE}",
                        os(errno)
                    ),
                }
            }
            RegionFileError::SymlinkedParent { ref link, why, .. } => write!(
                f,
                "{p}: the directory {} on the path is a symlink {why}; refusing to follow it at a \
                 shared path (another user could point it anywhere): use the directory's real \
                 path or {ELSEWHERE}",
                OneLine(link)
            ),
            RegionFileError::Changed { before, after, .. } => write!(
                f,
                "{p}: the file changed while it was read ({before} bytes, then {after}): another \
                 process truncated or rewrote it; read it again, and never truncate or rewrite \
                 the region file while GPU processes use it"
            ),
            RegionFileError::NotRegular { kind, .. } => write!(
                f,
                "{p}: is a {kind}, not a regular file; remove it (if it is stale) or {ELSEWHERE}"
            ),
            RegionFileError::Empty { .. } => write!(
                f,
                "{p}: file is empty: no process has initialised the shared region yet; start a \
                 GPU process under the library first"
            ),
            RegionFileError::Layout { refusal, .. } => write!(f, "{p}: {refusal}"),
            RegionFileError::Map { errno, .. } => write!(
                f,
                "{p}: cannot map the shared region ({}); check the address-space limit \
                 (ulimit -v) and that the file system supports shared mappings, or {ELSEWHERE}",
                os(errno)
            ),
            RegionFileError::Io { op, errno, .. } => write!(
                f,
                "{p}: {op} failed ({}); check the file system (free space, quota, I/O errors) \
                 or {ELSEWHERE}",
                os(errno)
            ),
        }
    }
}

impl std::error::Error for RegionFileError {}

fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// An open, validated, mapped region file. Unmapped and closed on drop, unless
/// [`leak`](RegionFile::leak)ed.
pub struct RegionFile {
    fd: OwnedFd,
    map: NonNull<SharedRegion>,
    /// Bytes mapped: [`EXT_END`] with the tail, `SIZE` for a read-only file a C peer made.
    len: usize,
    path: PathBuf,
    verdict: Verdict,
    mode: OpenMode,
    created: bool,
    /// The SIGBUS guard of the mapping (see [`crate::region_guard`]); dropped before the unmap.
    guard: Option<region_guard::Registration>,
}

// SAFETY: `RegionFile` owns a descriptor and a MAP_SHARED mapping; the mapping holds only atomics
// (see `region`), which any thread may access through shared references, and the raw pointer is
// the only reason the type is not automatically Send/Sync.
unsafe impl Send for RegionFile {}
// SAFETY: as above; only `&SharedRegion` is ever handed out, and `SharedRegion` is Sync.
unsafe impl Sync for RegionFile {}

impl RegionFile {
    /// The mapped region.
    ///
    /// In [`OpenMode::ReadOnly`] the pages are `PROT_READ`: only load from them (a store faults).
    pub fn region(&self) -> &SharedRegion {
        // SAFETY: `map` is a live MAP_SHARED mapping of `SharedRegion::SIZE` bytes of a file at
        // least that long, unmapped only in Drop (so it outlives `&self`). mmap returns a
        // page-aligned address, more than the region's alignment of 8. Every field of the region
        // is an atomic (interior mutability), so a shared reference stays sound while other
        // threads and processes store to the bytes; no `&mut` to the mapping is ever created.
        unsafe { self.map.as_ref() }
    }

    /// Our extension tail, `None` only for a file opened read-only that no process of ours has
    /// extended (a C peer's).
    pub fn ext(&self) -> Option<&Ext> {
        (self.len >= EXT_END).then(|| {
            // SAFETY: `EXT_OFFSET` < `EXT_END` <= `len`: the offset stays inside the mapping.
            let tail = unsafe { self.map.as_ptr().cast::<u8>().add(EXT_OFFSET) };
            // SAFETY: as in `region`; the mapping is `len` bytes long, and `EXT_OFFSET` (a
            // multiple of 4096) + `size_of::<Ext>()` = `EXT_END` <= `len`, so the tail lies
            // inside it, aligned.
            unsafe { &*tail.cast::<Ext>() }
        })
    }

    /// The file's descriptor, for [`crate::platform::LinuxPlatform::new`] (borrowed: it stays
    /// open as long as this value, or forever after [`RegionFile::leak`]).
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The path the file was opened at.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What validation found when the file was opened.
    pub fn verdict(&self) -> Verdict {
        self.verdict
    }

    /// How the file was opened.
    pub fn mode(&self) -> OpenMode {
        self.mode
    }

    /// Whether this call created the file.
    pub fn created(&self) -> bool {
        self.created
    }

    /// Bytes mapped ([`EXT_END`], or `SharedRegion::SIZE` without the tail).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a region is never empty (for clippy's `len_without_is_empty`).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Keeps the mapping and the descriptor for the rest of the process (the preload library):
    /// never unmapped, never closed. Read [`RegionFile::fd`] first if the platform needs it.
    pub fn leak(self) -> (&'static SharedRegion, &'static Ext) {
        region_guard::set_library_region(self.fd(), &self.path);
        let this = ManuallyDrop::new(self);
        let ext = this.ext().map(|e| e as *const Ext);
        // SAFETY: as in `region` and `ext`; and since Drop will never run, the mapping lives (and
        // the descriptor stays open) until the process ends, so the references may be 'static.
        let region = unsafe { this.map.as_ref() };
        // SAFETY: as above.
        let ext = ext.map(|e| unsafe { &*e });
        (region, ext.unwrap_or_else(private_ext))
    }
}

impl Drop for RegionFile {
    fn drop(&mut self) {
        // The handler must stop repairing the range before it is unmapped (and maybe reused).
        drop(self.guard.take());
        // SAFETY: `map`/`len` are the mapping made in `open`, unmapped only here; no reference
        // from `region` outlives `self`. (The descriptor is closed by OwnedFd afterwards.)
        unsafe { libc::munmap(self.map.as_ptr().cast(), self.len) };
    }
}

fn kind_of(st_mode: libc::mode_t) -> Option<&'static str> {
    match st_mode & libc::S_IFMT {
        libc::S_IFREG => None,
        libc::S_IFDIR => Some("directory"),
        libc::S_IFIFO => Some("FIFO"),
        libc::S_IFCHR => Some("character device"),
        libc::S_IFBLK => Some("block device"),
        libc::S_IFSOCK => Some("socket"),
        libc::S_IFLNK => Some("symlink"),
        _ => Some("non-regular file"),
    }
}

fn open_raw(path: &CString, flags: libc::c_int) -> Result<OwnedFd, i32> {
    // SAFETY: `path` is NUL-terminated; the mode argument is read only with O_CREAT.
    let fd = unsafe { libc::open(path.as_ptr(), flags, libc::c_uint::from(CREATE_MODE)) };
    if fd < 0 {
        Err(errno())
    } else {
        // SAFETY: `fd` was just opened and nothing else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }
}

/// Refuses a symlink among the path's directories that another user could have planted or could
/// change: one in a directory that group or others may write (such as /tmp), or owned by a user
/// other than root and us. (`O_NOFOLLOW` covers only the last component.) Links that only root
/// or we control, such as /var/run -> /run, are followed.
fn check_parents(path: &Path) -> Result<(), RegionFileError> {
    let Some(parent) = path.parent() else {
        return Ok(());
    };
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    let mut prefix = PathBuf::new();
    for comp in parent.components() {
        let container = if prefix.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            prefix.clone()
        };
        prefix.push(comp);
        let Ok(c) = CString::new(prefix.as_os_str().as_bytes()) else {
            continue;
        };
        let Ok(st) = lstat(&c) else {
            // Missing or unreadable: open says what is wrong.
            return Ok(());
        };
        if st.st_mode & libc::S_IFMT != libc::S_IFLNK {
            continue;
        }
        let why = if st.st_uid != 0 && st.st_uid != me {
            Some("owned by another user")
        } else {
            CString::new(container.as_os_str().as_bytes())
                .ok()
                .and_then(|d| {
                    // SAFETY: as in `lstat`; stat follows links to the real directory.
                    let mut dst: libc::stat = unsafe { std::mem::zeroed() };
                    // SAFETY: as above.
                    (unsafe { libc::stat(d.as_ptr(), &mut dst) } == 0).then_some(dst)
                })
                .filter(|d| d.st_mode & 0o022 != 0 || (d.st_uid != 0 && d.st_uid != me))
                .map(|_| "in a directory that other users may write")
        };
        if let Some(why) = why {
            return Err(RegionFileError::SymlinkedParent {
                path: path.to_path_buf(),
                link: prefix,
                why,
            });
        }
    }
    Ok(())
}

/// Names what stands at the path when `open` failed with `errno`: something that is not a
/// regular file (a socket gives only ENXIO), or whose permission bits refuse us.
fn open_failure(path: &Path, c_path: &CString, errno: i32, mode: OpenMode) -> RegionFileError {
    let found = lstat(c_path).ok();
    if let Some(kind) = found.and_then(|st| kind_of(st.st_mode)) {
        // A symlink keeps the ELOOP line, which says why it is refused.
        if kind != "symlink" {
            return RegionFileError::NotRegular {
                path: path.to_path_buf(),
                kind,
            };
        }
    }
    match errno {
        libc::EACCES | libc::EPERM => RegionFileError::Denied {
            path: path.to_path_buf(),
            errno,
            mode,
            file: found.map(|st| FileOwner {
                uid: st.st_uid,
                perm: st.st_mode & 0o7777,
            }),
            // SAFETY: geteuid has no preconditions and cannot fail.
            uid: unsafe { libc::geteuid() },
        },
        _ => RegionFileError::Open {
            path: path.to_path_buf(),
            errno,
            mode,
        },
    }
}

/// Opens the path, creating it (mode 0666 whatever the umask) in [`OpenMode::ReadWrite`].
/// Returns the descriptor and whether we created the file.
fn open_fd(
    path: &Path,
    c_path: &CString,
    mode: OpenMode,
) -> Result<(OwnedFd, bool), RegionFileError> {
    let base = libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK;
    let fail = |errno: i32| open_failure(path, c_path, errno, mode);
    if mode == OpenMode::ReadOnly {
        return open_raw(c_path, base | libc::O_RDONLY)
            .map(|fd| (fd, false))
            .map_err(fail);
    }
    // O_EXCL tells us whether we created it. If it exists, open it without O_CREAT; if it was
    // deleted in between, try again (a few times: a loop of deletions is someone's bug).
    let mut last = libc::ENOENT;
    for _ in 0..4 {
        match open_raw(c_path, base | libc::O_RDWR | libc::O_CREAT | libc::O_EXCL) {
            Ok(fd) => {
                // Only the file we created gets its mode set; a failure here leaves the umask's
                // mode, which still works for us (peers of other users then get EACCES).
                // SAFETY: `fd` is an open descriptor we own.
                unsafe { libc::fchmod(fd.as_raw_fd(), CREATE_MODE) };
                return Ok((fd, true));
            }
            Err(libc::EEXIST) => {}
            Err(e) => return Err(fail(e)),
        }
        match open_raw(c_path, base | libc::O_RDWR) {
            Ok(fd) => return Ok((fd, false)),
            Err(libc::ENOENT) => last = libc::ENOENT,
            Err(e) => return Err(fail(e)),
        }
    }
    Err(fail(last))
}

/// Fills `buf` from offset `at` of `fd` (fewer bytes only at end of file); returns the count.
fn read_at(fd: RawFd, buf: &mut [u8], at: u64) -> Result<usize, i32> {
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: the destination is the unfilled tail of `buf`, `buf.len() - got` bytes.
        let n = unsafe {
            libc::pread(
                fd,
                buf[got..].as_mut_ptr().cast(),
                buf.len() - got,
                (at + got as u64) as libc::off_t,
            )
        };
        match n {
            0 => break,
            n if n > 0 => got += n as usize,
            _ => match errno() {
                libc::EINTR => {}
                e => return Err(e),
            },
        }
    }
    Ok(got)
}

fn fstat(fd: RawFd) -> Result<libc::stat, i32> {
    // SAFETY: an all-zero `struct stat` is a valid buffer for fstat to fill.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid `struct stat` to write; a bad `fd` only makes fstat fail.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(errno());
    }
    Ok(st)
}

fn lstat(path: &CString) -> Result<libc::stat, i32> {
    // SAFETY: as in `fstat`; `path` is NUL-terminated.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::lstat(path.as_ptr(), &mut st) } != 0 {
        return Err(errno());
    }
    Ok(st)
}

/// A file opened and checked, not yet mapped or read.
struct Checked {
    fd: OwnedFd,
    created: bool,
    /// The file's length after any extension.
    len: u64,
    /// Bytes to map: [`EXT_END`] with the tail, `SIZE` for a read-only file a C peer made.
    map_len: usize,
    verdict: Verdict,
}

/// Opens `path` and checks it: a regular file whose size and header [`classify`] accepts;
/// extends a fresh file in [`OpenMode::ReadWrite`].
fn open_checked(path: &Path, mode: OpenMode) -> Result<Checked, RegionFileError> {
    let owned = || path.to_path_buf();
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| RegionFileError::InvalidPath { path: owned() })?;
    check_parents(path)?;
    let (fd, created) = open_fd(path, &c_path, mode)?;
    let raw = fd.as_raw_fd();
    let io = |op: &'static str, errno: i32| RegionFileError::Io {
        path: owned(),
        op,
        errno,
    };

    let st = fstat(raw).map_err(|e| io("fstat", e))?;
    if let Some(kind) = kind_of(st.st_mode) {
        return Err(RegionFileError::NotRegular {
            path: owned(),
            kind,
        });
    }
    // O_NONBLOCK only guarded the open against FIFOs; a regular file does not need it.
    // SAFETY: F_GETFL on an open descriptor takes no argument and returns plain flags.
    let flags = unsafe { libc::fcntl(raw, libc::F_GETFL) };
    if flags >= 0 {
        // SAFETY: F_SETFL on an open descriptor takes plain flags (an int), no pointer.
        unsafe { libc::fcntl(raw, libc::F_SETFL, flags & !libc::O_NONBLOCK) };
    }

    let mut len = st.st_size.max(0) as u64;
    if mode == OpenMode::ReadOnly && len == 0 {
        return Err(RegionFileError::Empty { path: owned() });
    }
    let mut header = [0u8; HEADER_LEN];
    let got = read_at(raw, &mut header, 0).map_err(|e| io("reading the header", e))?;
    let verdict =
        classify(&header[..got], len, SIZE).map_err(|refusal| RegionFileError::Layout {
            path: owned(),
            refusal,
        })?;
    let map_len = match mode {
        OpenMode::ReadWrite => {
            if len < EXT_END as u64 + 1 {
                extend(raw).map_err(|e| io("extending the file to the region's size", e))?;
                len = EXT_END as u64 + 1;
            }
            EXT_END
        }
        // A read-only mapping beyond end of file would fault on access.
        OpenMode::ReadOnly if verdict == Verdict::Fresh && len < SIZE as u64 => {
            return Err(RegionFileError::Layout {
                path: owned(),
                refusal: Refusal::Truncated { len },
            })
        }
        OpenMode::ReadOnly if len >= EXT_END as u64 => EXT_END,
        OpenMode::ReadOnly => SIZE,
    };
    Ok(Checked {
        fd,
        created,
        len,
        map_len,
        verdict,
    })
}

/// Opens, validates and maps the region file at `path`. See the module docs for what is checked;
/// nothing here panics, whatever is at the path. The mapping is guarded against a truncation of
/// the file ([`crate::region_guard`]). In [`OpenMode::ReadWrite`] an initialised region whose
/// fields are garbage ([`check_body`]) is refused too: glibc aborts in `sem_wait` on a garbage
/// semaphore.
pub fn open(path: &Path, mode: OpenMode) -> Result<RegionFile, RegionFileError> {
    let file = map(path, mode)?;
    if mode == OpenMode::ReadWrite && matches!(file.verdict, Verdict::Ready | Verdict::LegacyV11) {
        check_body(file.region()).map_err(|fault| RegionFileError::Layout {
            path: path.to_path_buf(),
            refusal: Refusal::CorruptBody(fault),
        })?;
    }
    Ok(file)
}

/// [`open`] read-write without judging the region's fields, for re-initialising a corrupt one
/// (`shrreg-tool --create-new`).
pub fn open_to_reinitialise(path: &Path) -> Result<RegionFile, RegionFileError> {
    map(path, OpenMode::ReadWrite)
}

fn map(path: &Path, mode: OpenMode) -> Result<RegionFile, RegionFileError> {
    let Checked {
        fd,
        created,
        len,
        map_len,
        verdict,
    } = open_checked(path, mode)?;
    let raw = fd.as_raw_fd();
    let prot = match mode {
        OpenMode::ReadWrite => libc::PROT_READ | libc::PROT_WRITE,
        OpenMode::ReadOnly => libc::PROT_READ,
    };
    // SAFETY: a new shared mapping of `map_len` bytes of a file at least that long (checked or
    // extended above), at an address of the kernel's choosing; the result is checked below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            map_len,
            prot,
            libc::MAP_SHARED,
            raw,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(RegionFileError::Map {
            path: path.to_path_buf(),
            errno: errno(),
        });
    }
    let Some(map) = NonNull::new(p.cast::<SharedRegion>()) else {
        // Address 0 is never chosen without MAP_FIXED; refuse rather than trust it.
        return Err(RegionFileError::Map {
            path: path.to_path_buf(),
            errno: libc::EINVAL,
        });
    };
    let writable = mode == OpenMode::ReadWrite;
    let restore = writable.then_some(len.max(EXT_END as u64 + 1));
    let guard = region_guard::register(p.cast(), map_len, raw, restore, writable, path);
    let file = RegionFile {
        fd,
        map,
        len: map_len,
        path: path.to_path_buf(),
        verdict,
        mode,
        created,
        guard,
    };
    if writable {
        if let Some(ext) = file.ext() {
            ext.mark();
        }
    }
    Ok(file)
}

/// A private copy of a region file, read with `pread` rather than mapped: a file truncated or
/// rewritten while it is read cannot fault, it only gives a copy that says so. For inspection.
pub struct Snapshot {
    region: Box<SharedRegion>,
    /// Our extension tail, where the file has one.
    ext: Option<Box<Ext>>,
    len: u64,
    verdict: Verdict,
}

impl Snapshot {
    /// The zeroed region that an empty file becomes (length 0, [`Verdict::Fresh`]).
    pub fn zeroed() -> Snapshot {
        Snapshot {
            region: zeroed_region(),
            ext: None,
            len: 0,
            verdict: Verdict::Fresh,
        }
    }

    /// The copied region (its atomics are private to this copy).
    pub fn region(&self) -> &SharedRegion {
        &self.region
    }

    /// The copied extension tail; `None` for a file without one (a C peer's).
    pub fn ext(&self) -> Option<&Ext> {
        self.ext.as_deref()
    }

    /// The file's length when the copy was taken.
    pub fn file_len(&self) -> u64 {
        self.len
    }

    /// What validation made of the copy.
    pub fn verdict(&self) -> Verdict {
        self.verdict
    }
}

/// Reads the region file at `path` into a private copy, with the checks of [`open`] in
/// [`OpenMode::ReadOnly`] (nothing is created or changed). The header is judged again on the
/// copy and the file's length after the read, so a file that changed under the read is refused
/// ([`RegionFileError::Changed`]) or judged as it now is, never half of each.
pub fn snapshot(path: &Path) -> Result<Snapshot, RegionFileError> {
    let checked = open_checked(path, OpenMode::ReadOnly)?;
    let raw = checked.fd.as_raw_fd();
    let mut region = zeroed_region();
    let dst = std::ptr::addr_of_mut!(*region).cast::<u8>();
    // SAFETY: `dst` points to the SIZE bytes of the box we own, which nothing else references
    // while pread fills them; any bytes are a valid value of the region's atomics.
    let buf = unsafe { std::slice::from_raw_parts_mut(dst, SIZE) };
    let got = read_at(raw, buf, 0).map_err(|e| RegionFileError::Io {
        path: path.to_path_buf(),
        op: "reading the region",
        errno: e,
    })?;
    let ext = if checked.len >= EXT_END as u64 {
        // SAFETY: all-zero bytes are a valid tail (atomics only).
        let mut tail = unsafe { zeroed_box::<Ext>() };
        let dst = std::ptr::addr_of_mut!(*tail).cast::<u8>();
        // SAFETY: `dst` points to the tail's bytes in the box we own, which nothing else
        // references while pread fills them; any bytes are a valid value of its atomics.
        let buf = unsafe { std::slice::from_raw_parts_mut(dst, EXT_END - EXT_OFFSET) };
        let got = read_at(raw, buf, EXT_OFFSET as u64).map_err(|e| RegionFileError::Io {
            path: path.to_path_buf(),
            op: "reading the extension tail",
            errno: e,
        })?;
        (got == buf.len()).then_some(tail)
    } else {
        None
    };
    let len_after = fstat(raw).map(|st| st.st_size.max(0) as u64).unwrap_or(0);
    if got < SIZE || len_after != checked.len {
        return Err(RegionFileError::Changed {
            path: path.to_path_buf(),
            before: checked.len,
            after: len_after,
        });
    }
    let verdict = classify(&buf[..HEADER_LEN], len_after, SIZE).map_err(|refusal| {
        RegionFileError::Layout {
            path: path.to_path_buf(),
            refusal,
        }
    })?;
    Ok(Snapshot {
        region,
        ext,
        len: len_after,
        verdict,
    })
}

/// A heap region of zero bytes (2 MB: never built on the stack).
fn zeroed_region() -> Box<SharedRegion> {
    // SAFETY: all-zero bytes are a valid value of every field (atomics and sem_t storage).
    unsafe { zeroed_box::<SharedRegion>() }
}

/// A zeroed `T` on the heap.
///
/// # Safety
/// All-zero bytes must be a valid value of `T`, and `T` must not be zero-sized.
unsafe fn zeroed_box<T>() -> Box<T> {
    let layout = std::alloc::Layout::new::<T>();
    // SAFETY: the caller guarantees a non-zero size.
    let p = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<T>();
    if p.is_null() {
        std::alloc::handle_alloc_error(layout);
    }
    // SAFETY: allocated with T's layout by the global allocator, as Box expects, and zeroed (a
    // valid T, by the caller's guarantee).
    unsafe { Box::from_raw(p) }
}

/// Extends the file to `EXT_END + 1` bytes with one zero byte at offset `EXT_END`: beyond every
/// mapped byte, so it races harmlessly with a peer doing the same, and never shrinks the file.
fn extend(raw: RawFd) -> Result<(), i32> {
    let zero = [0u8; 1];
    let n = loop {
        // SAFETY: writes one byte from `zero` at offset EXT_END of our descriptor.
        let n = unsafe { libc::pwrite(raw, zero.as_ptr().cast(), 1, EXT_END as libc::off_t) };
        if n >= 0 || errno() != libc::EINTR {
            break n;
        }
    };
    match n {
        1 => Ok(()),
        n if n < 0 => Err(errno()),
        _ => Err(libc::EIO),
    }
}

/// A private, zeroed region and tail for a process that cannot share one (degraded mode), kept for
/// the rest of the process. It is a MAP_SHARED anonymous mapping, so a forked child shares it with
/// its parent as it would share the file. Use it with
/// [`crate::platform::LinuxPlatform::private`].
pub fn anonymous() -> (&'static SharedRegion, &'static Ext) {
    // SAFETY: a new anonymous shared mapping of EXT_END bytes at an address of the kernel's
    // choosing; the result is checked before use.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            EXT_END,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p != libc::MAP_FAILED {
        if let Some(map) = NonNull::new(p.cast::<u8>()) {
            // SAFETY: page-aligned, EXT_END zero bytes (all-zero is a valid value of every field:
            // atomics and sem_t storage), never unmapped, so a 'static shared reference is sound.
            let region = unsafe { &*map.as_ptr().cast::<SharedRegion>() };
            // SAFETY: EXT_OFFSET < EXT_END: the offset stays inside the mapping.
            let tail = unsafe { map.as_ptr().add(EXT_OFFSET) };
            // SAFETY: as for `region`; the tail starts at EXT_OFFSET (page-aligned) and ends at
            // EXT_END, inside the mapping.
            let ext = unsafe { &*tail.cast::<Ext>() };
            return (region, ext);
        }
    }
    // Out of address space for 2 MB: fall back to the heap (private to this process).
    (Box::leak(zeroed_region()), private_ext())
}

/// A zeroed tail on the heap, never freed: the fallback where no file tail can be had.
fn private_ext() -> &'static Ext {
    // SAFETY: all-zero bytes are a valid tail (atomics only).
    Box::leak(unsafe { zeroed_box::<Ext>() })
}
