//! Opening and mapping region files: real files in a temp dir, every kind of wrong thing at the
//! path, and (as root, as CI runs) other users' files and read-only file systems in forked
//! children.
//!
//! Every test takes one process-wide mutex: tests change the umask and fork.

use std::fs::{self, File};
use std::io::Read as _;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};

use hami_linux::platform::LinuxPlatform;
use hami_linux::region_file::{self, OpenMode, RegionFileError};
use hami_shm::layout::{SharedRegion, EXT_END, EXT_MAGIC, MAGIC};
use hami_shm::platform::Platform;
use hami_shm::validate::{Refusal, Verdict, L1_SHIFT};

const SIZE: usize = SharedRegion::SIZE;
/// Length of a file opened read-write: the region, the gap, our tail, one byte past it.
const FILE_LEN: u64 = EXT_END as u64 + 1;
const NOBODY: u32 = 65534;

// ---------------------------------------------------------------------------------------------
// Helpers.

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = std::env::temp_dir().join(format!(
            "hami-rf-{}-{}-{nanos}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_dir(&dir).expect("create temp dir");
        // Traversable by the unprivileged children of the root-only tests.
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        TempDir(dir)
    }

    fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        // Make read-only subdirectories removable again.
        if let Ok(entries) = fs::read_dir(&self.0) {
            for e in entries.flatten() {
                if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    let _ = fs::set_permissions(e.path(), fs::Permissions::from_mode(0o755));
                }
            }
        }
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn umask(mask: libc::mode_t) -> libc::mode_t {
    // SAFETY: umask has no preconditions (it is process-wide; tests are serialised).
    unsafe { libc::umask(mask) }
}

/// A header as a C process writes it: the flag, the version, and the owner lock's semaphore
/// (value 1, process-shared).
fn header(flag: i32, major: u32, minor: u32) -> Vec<u8> {
    let mut h = vec![0u8; 72];
    h[0..4].copy_from_slice(&flag.to_le_bytes());
    h[4..8].copy_from_slice(&major.to_le_bytes());
    h[8..12].copy_from_slice(&minor.to_le_bytes());
    h[24..28].copy_from_slice(&1u32.to_le_bytes());
    h[32..36].copy_from_slice(&0x80u32.to_le_bytes());
    h
}

/// Writes a file of `len` bytes: `head` then a recognisable pattern (so "unchanged" means
/// something).
fn write_file(path: &Path, head: &[u8], len: usize) -> Vec<u8> {
    let mut bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    let n = head.len().min(len);
    bytes[..n].copy_from_slice(&head[..n]);
    fs::write(path, &bytes).unwrap();
    bytes
}

/// Asserts the error's text is one line that names the path, and returns it.
fn one_line(err: &RegionFileError, path: &Path) -> String {
    let text = err.to_string();
    assert!(
        !text.contains('\n') && !text.contains('\r'),
        "not one line: {text:?}"
    );
    let shown = path.display().to_string();
    assert!(
        text.starts_with(&format!("{shown}: ")),
        "path not first: {text}"
    );
    assert_eq!(err.path(), path);
    text
}

fn open_err(path: &Path, mode: OpenMode) -> RegionFileError {
    match region_file::open(path, mode) {
        Ok(f) => panic!(
            "{} opened ({:?}), expected an error",
            path.display(),
            f.verdict()
        ),
        Err(e) => e,
    }
}

/// Forks a child that becomes uid/gid 65534 and runs `f`; returns what `f` returned (None when
/// not root, so the caller can skip).
fn as_nobody(f: impl FnOnce() -> String) -> Option<String> {
    if !is_root() {
        return None;
    }
    Some(
        in_child(|| {
            // SAFETY: a plain credential call in the (single-threaded) child; an empty list
            // (size 0, NULL) reads no memory.
            if unsafe { libc::setgroups(0, std::ptr::null()) } != 0 {
                return Err(70);
            }
            // SAFETY: a plain credential call in the child, no pointers.
            if unsafe { libc::setgid(NOBODY) } != 0 {
                return Err(70);
            }
            // SAFETY: as for setgid.
            if unsafe { libc::setuid(NOBODY) } != 0 {
                return Err(70);
            }
            Ok(f())
        })
        .unwrap_or_else(|code| panic!("child failed with {code}")),
    )
}

/// Runs `f` in a forked child; returns its string (sent through a pipe) or its exit code.
fn in_child(f: impl FnOnce() -> Result<String, i32>) -> Result<String, i32> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for two descriptors.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: the read end was just created and is owned by nothing else.
    let r = unsafe { OwnedFd::from_raw_fd(fds[0]) };
    // SAFETY: likewise the write end.
    let w = unsafe { OwnedFd::from_raw_fd(fds[1]) };
    let wfd: RawFd = w.as_raw_fd();
    // SAFETY: fork has no memory-safety preconditions; the child runs `f` and `_exit`s.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let code = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
            Ok(Ok(text)) => {
                let b = text.as_bytes();
                // SAFETY: writes `b` (short: below PIPE_BUF, so one write) to the pipe.
                let n = unsafe { libc::write(wfd, b.as_ptr().cast(), b.len()) };
                if n == b.len() as isize {
                    0
                } else {
                    71
                }
            }
            Ok(Err(code)) => code,
            Err(_) => 101,
        };
        // SAFETY: ends the child without returning into the harness.
        unsafe { libc::_exit(code) };
    }
    drop(w);
    let mut text = String::new();
    File::from(r).read_to_string(&mut text).unwrap();
    let mut status = 0;
    // SAFETY: `status` is valid to write; `pid` is our child.
    while unsafe { libc::waitpid(pid, &mut status, 0) } != pid {}
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        128 + libc::WTERMSIG(status)
    };
    if code == 0 {
        Ok(text)
    } else {
        Err(code)
    }
}

/// Opens `path` read-write as uid 65534 and expects EACCES: the error's one line, which names
/// the path first. `None` when not root (the caller skips, saying `what`).
fn denied_as_nobody(path: &Path, what: &str) -> Option<String> {
    let p = path.to_path_buf();
    let Some(got) = as_nobody(move || error_text(region_file::open(&p, OpenMode::ReadWrite)))
    else {
        eprintln!("note: not root, skipping the {what} test");
        return None;
    };
    let (errno, text) = got.split_once('|').expect(&got);
    assert_eq!(errno, libc::EACCES.to_string(), "{got}");
    assert!(text.starts_with(&format!("{}: ", path.display())), "{text}");
    assert!(!text.contains('\n'), "{text}");
    Some(text.to_string())
}

fn error_text(r: Result<region_file::RegionFile, RegionFileError>) -> String {
    match r {
        Ok(_) => "OPENED".to_string(),
        Err(e) => format!("{}|{}", e.errno().unwrap_or(0), e),
    }
}

// ---------------------------------------------------------------------------------------------
// Creating and reopening.

#[test]
fn creates_a_fresh_file_with_the_tail_mode_0666_whatever_the_umask() {
    let _g = serial();
    let dir = TempDir::new();
    let path = dir.join("cudevshr.cache");
    let old = umask(0o022);
    let file = region_file::open(&path, OpenMode::ReadWrite).expect("create");
    let now = umask(0o022);
    umask(old);
    assert_eq!(now, 0o022, "the umask is left alone");
    assert!(file.created());
    assert_eq!(file.verdict(), Verdict::Fresh);
    assert_eq!(file.mode(), OpenMode::ReadWrite);
    assert_eq!(file.len(), EXT_END);
    assert!(!file.is_empty());
    assert_eq!(file.path(), path);
    assert_eq!(
        file.ext().unwrap().raw_magic().load(Ordering::Relaxed),
        EXT_MAGIC
    );
    let meta = fs::metadata(&path).unwrap();
    assert_eq!(meta.len(), FILE_LEN);
    assert_eq!(meta.mode() & 0o777, 0o666);
    assert!(meta.is_file());
    let region = file.region();
    assert_eq!(region.raw_initialized_flag().load(Ordering::Relaxed), 0);
    assert_eq!(region.raw_sem_postinit().glibc_private(), 0);
    // The descriptor is close-on-exec.
    // SAFETY: F_GETFD on an open descriptor.
    let flags = unsafe { libc::fcntl(file.fd(), libc::F_GETFD) };
    assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
}

#[test]
fn reopening_an_initialised_file_is_ready_and_changes_nothing() {
    let _g = serial();
    let dir = TempDir::new();
    let path = dir.join("region");
    {
        let file = region_file::open(&path, OpenMode::ReadWrite).unwrap();
        let r = file.region();
        r.raw_major_version().store(1, Ordering::Relaxed);
        r.raw_minor_version().store(2, Ordering::Relaxed);
        r.raw_limit()[0].store(12345, Ordering::Relaxed);
        // The owner lock's semaphore as sem_init(1, 1) leaves it.
        r.raw_sem().raw_words()[0].store(1, Ordering::Relaxed);
        r.raw_sem().raw_words()[1].store(0x80, Ordering::Relaxed);
        r.raw_initialized_flag().store(MAGIC, Ordering::Release);
    }
    // Someone else's mode is left as it is.
    fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
    let file = region_file::open(&path, OpenMode::ReadWrite).unwrap();
    assert!(!file.created());
    assert_eq!(file.verdict(), Verdict::Ready);
    assert_eq!(file.region().raw_limit()[0].load(Ordering::Relaxed), 12345);
    let meta = fs::metadata(&path).unwrap();
    assert_eq!(meta.len(), FILE_LEN);
    assert_eq!(meta.mode() & 0o777, 0o644);
    drop(file);

    let ro = region_file::open(&path, OpenMode::ReadOnly).unwrap();
    assert_eq!(ro.verdict(), Verdict::Ready);
    assert_eq!(ro.mode(), OpenMode::ReadOnly);
    assert_eq!(
        ro.region().raw_initialized_flag().load(Ordering::Acquire),
        MAGIC
    );
    assert_eq!(ro.region().raw_limit()[0].load(Ordering::Relaxed), 12345);
}

#[test]
fn a_fresh_file_of_exactly_size_bytes_is_extended_to_the_tail() {
    let _g = serial();
    let dir = TempDir::new();
    let path = dir.join("region");
    fs::write(&path, vec![0u8; SIZE]).unwrap();
    let file = region_file::open(&path, OpenMode::ReadWrite).unwrap();
    assert_eq!(file.verdict(), Verdict::Fresh);
    assert_eq!(fs::metadata(&path).unwrap().len(), FILE_LEN);
}

/// A file a C peer made (`SIZE + 1` bytes): read-only it maps without a tail and is left as it
/// is; read-write it gets the tail, and the region's bytes stay as they were.
#[test]
fn a_c_peers_file_gets_the_tail_only_when_opened_read_write() {
    let _g = serial();
    let dir = TempDir::new();
    let path = dir.join("region");
    // An initialised region as a C peer leaves it: both semaphores process-shared, one token.
    let mut bytes = vec![0u8; SIZE + 1];
    let head = header(MAGIC, 1, 2);
    bytes[..head.len()].copy_from_slice(&head);
    let sem = hami_shm::raw::offsets::SEM;
    let post = hami_shm::raw::offsets::SEM_POSTINIT;
    bytes[sem..sem + 8].copy_from_slice(&1u64.to_le_bytes());
    bytes[sem + 8..sem + 16].copy_from_slice(&0x80u64.to_le_bytes());
    bytes[post..post + 8].copy_from_slice(&1u64.to_le_bytes());
    bytes[post + 8..post + 16].copy_from_slice(&0x80u64.to_le_bytes());
    fs::write(&path, &bytes).unwrap();
    let ro = region_file::open(&path, OpenMode::ReadOnly).unwrap();
    assert_eq!((ro.verdict(), ro.len()), (Verdict::Ready, SIZE));
    assert!(ro.ext().is_none());
    drop(ro);
    assert_eq!(fs::read(&path).unwrap(), bytes);
    let rw = region_file::open(&path, OpenMode::ReadWrite).unwrap();
    assert!(rw.ext().is_some());
    drop(rw);
    let after = fs::read(&path).unwrap();
    assert_eq!(after.len() as u64, FILE_LEN);
    assert_eq!(
        &after[..SIZE + 1],
        &bytes[..],
        "the region's bytes are untouched"
    );
    let ro = region_file::open(&path, OpenMode::ReadOnly).unwrap();
    assert_eq!(
        ro.ext().unwrap().raw_magic().load(Ordering::Relaxed),
        EXT_MAGIC
    );
}

#[test]
fn a_zeroed_file_of_another_valid_length_keeps_its_bytes_and_gets_the_tail() {
    let _g = serial();
    let dir = TempDir::new();
    let path = dir.join("region");
    let len = SIZE + L1_SHIFT + 1;
    fs::write(&path, vec![0u8; len]).unwrap();
    let file = region_file::open(&path, OpenMode::ReadWrite).unwrap();
    assert_eq!(file.verdict(), Verdict::Fresh);
    drop(file);
    let after = fs::read(&path).unwrap();
    assert_eq!(after.len() as u64, FILE_LEN);
    assert!(after[..EXT_END - 4096].iter().all(|&b| b == 0));
}

#[test]
fn legacy_and_interrupted_files_are_recognised() {
    let _g = serial();
    let dir = TempDir::new();
    let path = dir.join("region");
    let mut l0 = header(MAGIC, 1, 1);
    l0[56..64].copy_from_slice(&2u64.to_le_bytes());
    let mut bytes = vec![0u8; SIZE + 1];
    bytes[..72].copy_from_slice(&l0);
    fs::write(&path, &bytes).unwrap();
    let file = region_file::open(&path, OpenMode::ReadWrite).unwrap();
    assert_eq!(file.verdict(), Verdict::LegacyV11);
    drop(file);
    let after = fs::read(&path).unwrap();
    assert_eq!(
        &after[..SIZE + 1],
        &bytes[..],
        "opening changes none of the region's bytes"
    );
    let mut bytes = after;

    bytes[..72].copy_from_slice(&header(1, 1, 2));
    fs::write(&path, &bytes).unwrap();
    let file = region_file::open(&path, OpenMode::ReadWrite).unwrap();
    assert_eq!(file.verdict(), Verdict::InitInterrupted);
}

#[test]
fn the_region_works_with_the_platform() {
    let _g = serial();
    let dir = TempDir::new();
    let path = dir.join("region");
    let file = region_file::open(&path, OpenMode::ReadWrite).unwrap();
    let p = LinuxPlatform::new(file.fd(), SIZE);
    assert!(p.init_lock(100_000_000));
    assert!(p.sem_init(file.region().sem(), 1));
    assert_eq!(p.sem_value(file.region().sem()), 1);
    p.init_unlock();
    drop(file);
    let again = region_file::open(&path, OpenMode::ReadOnly).unwrap();
    assert_eq!(
        again.region().raw_sem().glibc_private(),
        0x80,
        "written through the mapping"
    );
}

#[test]
fn leak_keeps_the_mapping_and_drop_closes_the_descriptor() {
    let _g = serial();
    let dir = TempDir::new();
    let path = dir.join("region");
    let file = region_file::open(&path, OpenMode::ReadWrite).unwrap();
    let fd = file.fd();
    let (region, ext): (&'static SharedRegion, _) = file.leak();
    ext.raw_buckets()[0].raw_rate().store(7, Ordering::Relaxed);
    region.raw_proc_num().store(3, Ordering::Relaxed);
    // SAFETY: F_GETFD on a descriptor number takes no pointers (a closed one gives EBADF).
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    assert!(flags >= 0, "leaked fd stays open");
    assert_eq!(region.raw_proc_num().load(Ordering::Relaxed), 3);

    let other = dir.join("other");
    let file = region_file::open(&other, OpenMode::ReadWrite).unwrap();
    let fd = file.fd();
    drop(file);
    // SAFETY: as above; the number is not reused meanwhile (tests are serialised).
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    assert_eq!(flags, -1, "dropped fd is closed");
}

// ---------------------------------------------------------------------------------------------
// Wrong things at the path.

#[test]
fn a_symlink_is_refused_and_its_target_untouched() {
    let _g = serial();
    let dir = TempDir::new();
    let target = dir.join("victim");
    fs::write(&target, b"precious").unwrap();
    fs::set_permissions(&target, fs::Permissions::from_mode(0o600)).unwrap();
    let link = dir.join("cudevshr.cache");
    symlink(&target, &link).unwrap();
    for mode in [OpenMode::ReadWrite, OpenMode::ReadOnly] {
        let err = open_err(&link, mode);
        assert!(
            matches!(
                err,
                RegionFileError::Open {
                    errno: libc::ELOOP,
                    ..
                }
            ),
            "{err:?}"
        );
        let text = one_line(&err, &link);
        assert!(text.contains("symlink"), "{text}");
    }
    assert_eq!(fs::read(&target).unwrap(), b"precious");
    assert_eq!(fs::metadata(&target).unwrap().mode() & 0o777, 0o600);

    // A dangling link creates nothing at its target.
    let nowhere = dir.join("nowhere");
    let dangling = dir.join("dangling");
    symlink(&nowhere, &dangling).unwrap();
    let err = open_err(&dangling, OpenMode::ReadWrite);
    assert!(one_line(&err, &dangling).contains("symlink"));
    assert!(!nowhere.exists());
}

#[test]
fn a_directory_is_not_regular() {
    let _g = serial();
    let dir = TempDir::new();
    let path = dir.join("adir");
    fs::create_dir(&path).unwrap();
    for mode in [OpenMode::ReadWrite, OpenMode::ReadOnly] {
        let err = open_err(&path, mode);
        assert!(
            matches!(
                err,
                RegionFileError::NotRegular {
                    kind: "directory",
                    ..
                }
            ),
            "{mode:?}: {err:?}"
        );
        let text = one_line(&err, &path);
        assert!(text.contains("directory"), "{text}");
    }
}

#[test]
fn a_fifo_is_not_regular_and_does_not_block() {
    let _g = serial();
    let dir = TempDir::new();
    let path = dir.join("fifo");
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
    for mode in [OpenMode::ReadOnly, OpenMode::ReadWrite] {
        let err = open_err(&path, mode);
        assert!(
            matches!(err, RegionFileError::NotRegular { kind: "FIFO", .. }),
            "{err:?}"
        );
        one_line(&err, &path);
    }
}

#[test]
fn files_of_wrong_sizes_are_refused_and_left_unchanged() {
    let _g = serial();
    let dir = TempDir::new();
    for (len, want) in [
        (100usize, Refusal::Truncated { len: 100 }),
        (
            SIZE - 1,
            Refusal::Truncated {
                len: SIZE as u64 - 1,
            },
        ),
        (
            SIZE + 7,
            Refusal::WrongSize {
                len: SIZE as u64 + 7,
            },
        ),
        (
            EXT_END - 1,
            Refusal::WrongSize {
                len: EXT_END as u64 - 1,
            },
        ),
    ] {
        let path = dir.join(&format!("len{len}"));
        let bytes = write_file(&path, &header(MAGIC, 1, 2), len);
        for mode in [OpenMode::ReadWrite, OpenMode::ReadOnly] {
            let err = open_err(&path, mode);
            match &err {
                RegionFileError::Layout { refusal, .. } => assert_eq!(*refusal, want),
                other => panic!("{other:?}"),
            }
            let text = one_line(&err, &path);
            assert!(text.contains("delete the file"), "{text}");
        }
        assert_eq!(
            fs::read(&path).unwrap(),
            bytes,
            "a refused file is not touched"
        );
    }
}

#[test]
fn a_pr155_shifted_file_is_refused() {
    let _g = serial();
    let dir = TempDir::new();
    let path = dir.join("region");
    let mut h = header(MAGIC, 1, 1);
    h[56..64].copy_from_slice(&1u64.to_le_bytes());
    h[64..68].copy_from_slice(&0x80u32.to_le_bytes());
    let bytes = write_file(&path, &h, SIZE + L1_SHIFT + 1);
    let err = open_err(&path, OpenMode::ReadWrite);
    assert!(
        matches!(
            err,
            RegionFileError::Layout {
                refusal: Refusal::ShiftedV11,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(one_line(&err, &path).contains("PR 155"));
    assert_eq!(fs::read(&path).unwrap(), bytes);
}

#[test]
fn foreign_magic_and_unknown_versions_are_refused() {
    let _g = serial();
    let dir = TempDir::new();
    let path = dir.join("region");
    let bytes = write_file(&path, &header(0x4d5a, 1, 2), SIZE + 1);
    let err = open_err(&path, OpenMode::ReadWrite);
    assert!(matches!(
        err,
        RegionFileError::Layout {
            refusal: Refusal::WrongMagic { flag: 0x4d5a },
            ..
        }
    ));
    one_line(&err, &path);
    assert_eq!(fs::read(&path).unwrap(), bytes);

    write_file(&path, &header(MAGIC, 2, 0), SIZE + 1);
    let err = open_err(&path, OpenMode::ReadOnly);
    assert!(matches!(
        err,
        RegionFileError::Layout {
            refusal: Refusal::UnknownVersion { major: 2, minor: 0 },
            ..
        }
    ));
    one_line(&err, &path);
}

#[test]
fn read_only_never_creates_extends_or_maps_an_empty_file() {
    let _g = serial();
    let dir = TempDir::new();
    let missing = dir.join("missing");
    let err = open_err(&missing, OpenMode::ReadOnly);
    assert!(matches!(
        err,
        RegionFileError::Open {
            errno: libc::ENOENT,
            ..
        }
    ));
    assert!(one_line(&err, &missing).contains("no process has created"));
    assert!(!missing.exists());

    let empty = dir.join("empty");
    fs::write(&empty, b"").unwrap();
    let err = open_err(&empty, OpenMode::ReadOnly);
    assert!(matches!(err, RegionFileError::Empty { .. }), "{err:?}");
    one_line(&err, &empty);
    assert_eq!(fs::metadata(&empty).unwrap().len(), 0);

    let exact = dir.join("exact");
    fs::write(&exact, vec![0u8; SIZE]).unwrap();
    let ro = region_file::open(&exact, OpenMode::ReadOnly).unwrap();
    assert_eq!(ro.verdict(), Verdict::Fresh);
    assert_eq!(ro.region().raw_proc_num().load(Ordering::Relaxed), 0);
    drop(ro);
    assert_eq!(fs::metadata(&exact).unwrap().len(), SIZE as u64);
}

#[test]
fn a_missing_directory_and_a_nul_byte_are_clear_errors() {
    let _g = serial();
    let dir = TempDir::new();
    let path = dir.join("no/such/dir/region");
    let err = open_err(&path, OpenMode::ReadWrite);
    assert!(matches!(
        err,
        RegionFileError::Open {
            errno: libc::ENOENT,
            ..
        }
    ));
    assert!(one_line(&err, &path).contains("directory does not exist"));

    let bad = PathBuf::from(std::ffi::OsStr::from_bytes(b"/tmp/a\0b"));
    let err = open_err(&bad, OpenMode::ReadWrite);
    assert!(matches!(err, RegionFileError::InvalidPath { .. }));
    let text = err.to_string();
    assert!(!text.contains('\n') && text.contains("NUL"), "{text}");
}

#[test]
fn a_newline_in_the_path_stays_on_one_line() {
    let _g = serial();
    let dir = TempDir::new();
    let path = dir.join("bad\nname");
    fs::create_dir(&path).unwrap();
    let err = open_err(&path, OpenMode::ReadWrite);
    let text = err.to_string();
    assert!(!text.contains('\n'), "{text:?}");
    assert!(text.contains("bad\\nname"), "{text}");
}

// ---------------------------------------------------------------------------------------------
// Other users and read-only file systems (need root to arrange; CI runs as root).

#[test]
fn another_users_0600_file_gives_eacces_with_the_fix() {
    let _g = serial();
    let dir = TempDir::new();
    let path = dir.join("cudevshr.cache");
    {
        let file = region_file::open(&path, OpenMode::ReadWrite).unwrap();
        file.region()
            .raw_initialized_flag()
            .store(MAGIC, Ordering::Release);
    }
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
    let before = fs::read(&path).unwrap();
    let Some(text) = denied_as_nobody(&path, "other-user") else {
        return;
    };
    assert!(text.contains("mode 0600"), "{text}");
    assert!(text.contains("CUDA_DEVICE_MEMORY_SHARED_CACHE"), "{text}");
    assert_eq!(fs::read(&path).unwrap(), before);

    // Read-only inspection is refused the same way.
    let p = path.clone();
    let got = as_nobody(move || error_text(region_file::open(&p, OpenMode::ReadOnly))).unwrap();
    assert!(got.starts_with(&format!("{}|", libc::EACCES)), "{got}");
}

#[test]
fn an_unwritable_directory_gives_eacces_with_the_fix() {
    let _g = serial();
    let dir = TempDir::new();
    let sub = dir.join("ro");
    fs::create_dir(&sub).unwrap();
    fs::set_permissions(&sub, fs::Permissions::from_mode(0o555)).unwrap();
    let path = sub.join("cudevshr.cache");
    let Some(text) = denied_as_nobody(&path, "unwritable-directory") else {
        return;
    };
    assert!(text.contains("directory is not writable"), "{text}");
    assert!(!path.exists());

    // A 0666 file that already exists in that directory opens fine (no O_CREAT needed).
    fs::set_permissions(&sub, fs::Permissions::from_mode(0o755)).unwrap();
    region_file::open(&path, OpenMode::ReadWrite).unwrap();
    fs::set_permissions(&sub, fs::Permissions::from_mode(0o555)).unwrap();
    let p = path.clone();
    let got = as_nobody(move || match region_file::open(&p, OpenMode::ReadWrite) {
        Ok(f) => format!("OK {:?}", f.verdict()),
        Err(e) => e.to_string(),
    })
    .unwrap();
    assert_eq!(got, "OK Fresh");
}

#[test]
fn a_read_only_file_system_gives_erofs_with_the_fix() {
    let _g = serial();
    let dir = TempDir::new();
    let mnt = dir.join("mnt");
    fs::create_dir(&mnt).unwrap();
    let path = mnt.join("cudevshr.cache");
    let (m, p) = (mnt.clone(), path.clone());
    // In a child with its own mount namespace: mount an empty read-only tmpfs and open in it.
    let got = in_child(move || {
        let cm = std::ffi::CString::new(m.as_os_str().as_bytes()).unwrap();
        // SAFETY: a plain call, no pointers, in the child only.
        if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
            return Err(77);
        }
        let root = c"/";
        // SAFETY: NUL-terminated target, NULL source, type and data (allowed for a propagation
        // change), in the child's own mount namespace only.
        let rc = unsafe {
            libc::mount(
                std::ptr::null(),
                root.as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            )
        };
        if rc != 0 {
            return Err(77);
        }
        let tmpfs = c"tmpfs";
        // SAFETY: NUL-terminated source, target and type, NULL data, in the child's own mount
        // namespace only.
        let rc = unsafe {
            libc::mount(
                tmpfs.as_ptr(),
                cm.as_ptr(),
                tmpfs.as_ptr(),
                libc::MS_RDONLY,
                std::ptr::null(),
            )
        };
        if rc != 0 {
            return Err(77);
        }
        Ok(error_text(region_file::open(&p, OpenMode::ReadWrite)))
    });
    match got {
        Ok(got) => {
            let (errno, text) = got.split_once('|').expect(&got);
            assert_eq!(errno, libc::EROFS.to_string(), "{got}");
            assert!(text.starts_with(&format!("{}: ", path.display())), "{text}");
            assert!(text.contains("read-only"), "{text}");
            assert!(text.contains("CUDA_DEVICE_MEMORY_SHARED_CACHE"), "{text}");
            assert!(!text.contains('\n'));
        }
        Err(77) => {
            // No mount namespace here: check the EROFS text, which is the same Open code path
            // as EACCES (tested above against a real kernel refusal).
            eprintln!("note: cannot mount a read-only tmpfs here; checking the EROFS text only");
            let err = RegionFileError::Open {
                path: path.clone(),
                errno: libc::EROFS,
                mode: OpenMode::ReadWrite,
            };
            assert!(one_line(&err, &path).contains("read-only"));
        }
        Err(code) => panic!("child failed with {code}"),
    }
    assert!(!path.exists(), "nothing was created outside the namespace");
}

#[test]
fn every_error_variant_writes_one_line_with_the_path() {
    let _g = serial();
    let path = PathBuf::from("/some/where/cudevshr.cache");
    let p = || path.clone();
    let mut all = vec![
        RegionFileError::InvalidPath { path: p() },
        RegionFileError::NotRegular {
            path: p(),
            kind: "socket",
        },
        RegionFileError::Empty { path: p() },
        RegionFileError::Layout {
            path: p(),
            refusal: Refusal::ShiftedV11,
        },
        RegionFileError::Map {
            path: p(),
            errno: libc::ENOMEM,
        },
        RegionFileError::Io {
            path: p(),
            op: "fstat",
            errno: libc::EIO,
        },
    ];
    for errno in [
        libc::EACCES,
        libc::EPERM,
        libc::ELOOP,
        libc::EROFS,
        libc::ENOENT,
        libc::EMFILE,
    ] {
        for mode in [OpenMode::ReadWrite, OpenMode::ReadOnly] {
            all.push(RegionFileError::Open {
                path: p(),
                errno,
                mode,
            });
        }
    }
    for e in &all {
        let text = one_line(e, &path);
        assert!(text.len() > path.as_os_str().len() + 20, "{text}");
        assert!(text.contains(';') || text.contains(':'), "{text}");
    }
}

// ---------------------------------------------------------------------------------------------
// Truncation and replacement under a live mapping, and the smaller refusals of issue 16.

/// The child's exit code, or 128 + the signal that ended it.
fn child_code(r: Result<String, i32>) -> i32 {
    match r {
        Ok(_) => 0,
        Err(code) => code,
    }
}

fn truncate_file(path: &Path, len: u64) {
    fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

#[test]
fn a_truncated_region_is_extended_again_and_the_process_survives() {
    let _g = serial();
    let dir = TempDir::new();
    let path = dir.join("cudevshr.cache");
    let p = path.clone();
    // In a child: without the guard the first access after the truncation kills it (SIGBUS).
    let got = in_child(move || {
        let file = region_file::open(&p, OpenMode::ReadWrite).map_err(|_| 60)?;
        let region = file.region();
        region.raw_initialized_flag().store(MAGIC, Ordering::SeqCst);
        region.raw_procs()[1000]
            .raw_pid()
            .store(42, Ordering::SeqCst);
        let before = hami_linux::region_guard::repaired_count();
        truncate_file(&p, 0);
        // A load and a store in the cut pages, then the last field of the region.
        let pid = region.raw_procs()[1000].raw_pid().load(Ordering::SeqCst);
        region.raw_procs()[1000]
            .raw_pid()
            .store(7, Ordering::SeqCst);
        let post = region.raw_sem_postinit().glibc_private();
        let len = fs::metadata(&p).map_err(|_| 61)?.len();
        // The store reached the file: the same inode was extended, not a private copy.
        let bytes = fs::read(&p).map_err(|_| 62)?;
        let off = hami_shm::raw::offsets::PROCS + 1000 * 1960;
        let in_file = i32::from_le_bytes(bytes[off..off + 4].try_into().unwrap());
        Ok(format!(
            "pid {pid} post {post} len {len} file {in_file} repaired {} event {} {}",
            hami_linux::region_guard::repaired_count() - before,
            hami_linux::region_guard::take_truncation_event(),
            hami_linux::region_guard::take_truncation_event(),
        ))
    });
    let text = got.unwrap_or_else(|code| panic!("the child died or failed: {code}"));
    assert_eq!(
        text,
        format!(
            "pid 0 post 0 len {} file 7 repaired 1 event true false",
            FILE_LEN
        )
    );
}

#[test]
fn a_read_only_mapping_of_a_truncated_file_reads_zeros() {
    let _g = serial();
    let dir = TempDir::new();
    let path = dir.join("cudevshr.cache");
    {
        let f = region_file::open(&path, OpenMode::ReadWrite).unwrap();
        f.region().raw_major_version().store(1, Ordering::SeqCst);
        f.region().raw_minor_version().store(2, Ordering::SeqCst);
        f.region()
            .raw_initialized_flag()
            .store(MAGIC, Ordering::SeqCst);
        f.region().raw_proc_num().store(3, Ordering::SeqCst);
    }
    let p = path.clone();
    let got = in_child(move || {
        let file = region_file::open(&p, OpenMode::ReadOnly).map_err(|_| 60)?;
        truncate_file(&p, 4096);
        // The last page is cut (a fault); the header page is still in the file, but read after
        // the fault it is one of the zero pages mapped over the whole region.
        let n = file.region().raw_proc_num().load(Ordering::SeqCst);
        let flag = file.region().raw_initialized_flag().load(Ordering::SeqCst);
        Ok(format!("{flag} {n}"))
    });
    // The read-only descriptor cannot extend the file: zero pages replace the whole mapping.
    assert_eq!(got, Ok("0 0".to_string()));
    assert_eq!(fs::metadata(&path).unwrap().len(), 4096, "never written");
}

#[test]
fn a_sigbus_elsewhere_still_kills_as_before() {
    let _g = serial();
    let dir = TempDir::new();
    let path = dir.join("cudevshr.cache");
    let other = dir.join("other");
    fs::write(&other, vec![1u8; 8192]).unwrap();
    let (p, o) = (path.clone(), other.clone());
    // A mapping that is not a region: the guard (installed by the open) must not save it.
    let code = child_code(in_child(move || {
        let _file = region_file::open(&p, OpenMode::ReadWrite).map_err(|_| 60)?;
        let f = File::open(&o).map_err(|_| 61)?;
        // SAFETY: a private read-only mapping of an 8 KiB file, read after it is cut.
        let m = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                8192,
                libc::PROT_READ,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        if m == libc::MAP_FAILED {
            return Err(62);
        }
        truncate_file(&o, 0);
        // SAFETY: reads the mapped (now cut) page: a SIGBUS by design.
        let v = unsafe { std::ptr::read_volatile(m.cast::<u8>()) };
        Ok(v.to_string())
    }));
    assert_eq!(code, 128 + libc::SIGBUS);
    // (A SIGBUS sent by kill is checked in c-tests/hooks/t_truncate.c: here the test
    // harness's own SIGBUS handler, which ours chains to, would swallow it.)
}

#[test]
fn a_replaced_file_is_noticed() {
    let _g = serial();
    let dir = TempDir::new();
    let path = dir.join("cudevshr.cache");
    let file = region_file::open(&path, OpenMode::ReadWrite).unwrap();
    assert_eq!(
        hami_linux::region_guard::same_file(file.fd(), &path),
        Some(true)
    );
    let tmp = dir.join("new");
    fs::write(&tmp, b"").unwrap();
    fs::rename(&tmp, &path).unwrap();
    assert_eq!(
        hami_linux::region_guard::same_file(file.fd(), &path),
        Some(false)
    );
    fs::remove_file(&path).unwrap();
    assert_eq!(
        hami_linux::region_guard::same_file(file.fd(), &path),
        Some(false)
    );
}

#[test]
fn the_library_region_replaced_at_its_path_is_reported_at_most_once_a_second() {
    let _g = serial();
    let dir = TempDir::new();
    let path = dir.join("cudevshr.cache");
    let p = path.clone();
    let t = dir.join("new");
    // In a child: the library's region is recorded once per process (`leak`).
    let got = in_child(move || {
        use hami_linux::region_guard::check_replaced;
        let _region = region_file::open(&p, OpenMode::ReadWrite)
            .map_err(|_| 60)?
            .leak();
        let s = 1_000_000_000u64;
        let before = check_replaced(10 * s);
        fs::write(&t, b"").map_err(|_| 61)?;
        fs::rename(&t, &p).map_err(|_| 62)?;
        let too_soon = check_replaced(10 * s + s / 2);
        let seen = check_replaced(11 * s + 1);
        Ok(format!("{before} {too_soon} {seen}"))
    });
    assert_eq!(got, Ok("false false true".to_string()));
}

#[test]
fn a_0444_file_is_described_as_it_is() {
    let _g = serial();
    let dir = TempDir::new();
    let path = dir.join("cudevshr.cache");
    drop(region_file::open(&path, OpenMode::ReadWrite).unwrap());
    fs::set_permissions(&path, fs::Permissions::from_mode(0o444)).unwrap();
    let Some(text) = denied_as_nobody(&path, "0444") else {
        return;
    };
    assert!(
        !text.contains("0600") && !text.contains("another user"),
        "{text}"
    );
    assert!(text.contains("mode 0444"), "{text}");
    assert!(text.contains("belongs to uid 0"), "{text}");
    assert!(text.contains(&format!("runs as uid {NOBODY}")), "{text}");
    assert!(text.contains("chmod 0666"), "{text}");
}

#[test]
fn a_socket_at_the_path_is_named() {
    let _g = serial();
    let dir = TempDir::new();
    let path = dir.join("cudevshr.cache");
    let _sock = std::os::unix::net::UnixListener::bind(&path).unwrap();
    for mode in [OpenMode::ReadWrite, OpenMode::ReadOnly] {
        let err = open_err(&path, mode);
        assert_eq!(
            err,
            RegionFileError::NotRegular {
                path: path.clone(),
                kind: "socket"
            }
        );
        let text = one_line(&err, &path);
        assert!(text.contains("is a socket"), "{text}");
        assert!(text.contains("remove it"), "{text}");
    }
}

#[test]
fn a_symlinked_parent_that_others_may_change_is_refused() {
    let _g = serial();
    let dir = TempDir::new();
    let real = dir.join("real");
    fs::create_dir(&real).unwrap();
    symlink(&real, dir.join("link")).unwrap();
    let path = dir.join("link").join("cudevshr.cache");
    // In a directory every user may write (as /tmp is): refused, nothing created.
    fs::set_permissions(&dir.0, fs::Permissions::from_mode(0o1777)).unwrap();
    for mode in [OpenMode::ReadWrite, OpenMode::ReadOnly] {
        let err = open_err(&path, mode);
        assert!(
            matches!(&err, RegionFileError::SymlinkedParent { link, .. } if *link == dir.join("link")),
            "{err:?}"
        );
        let text = one_line(&err, &path);
        assert!(text.contains("is a symlink"), "{text}");
        assert!(text.contains("CUDA_DEVICE_MEMORY_SHARED_CACHE"), "{text}");
    }
    assert!(!real.join("cudevshr.cache").exists());
    // A link that only root (or we) could have made or changed is followed, as /var/run -> /run.
    fs::set_permissions(&dir.0, fs::Permissions::from_mode(0o755)).unwrap();
    region_file::open(&path, OpenMode::ReadWrite).unwrap();
    assert!(real.join("cudevshr.cache").exists());
}

#[test]
fn a_valid_header_over_a_garbage_body_is_refused_and_create_new_can_open_it() {
    let _g = serial();
    let dir = TempDir::new();
    let path = dir.join("cudevshr.cache");
    // A real initialised region, then pseudo-random bytes after its version words.
    {
        let f = region_file::open(&path, OpenMode::ReadWrite).unwrap();
        let platform = LinuxPlatform::new(f.fd(), SIZE);
        let params = hami_shm::init::InitParams::<16> {
            limits: [1 << 30; 16],
            sm_limits: [100; 16],
            priority: 1,
        };
        hami_shm::init::ensure_initialised(f.region(), &platform, &params, 1_000_000_000).unwrap();
    }
    region_file::open(&path, OpenMode::ReadWrite).unwrap();
    let mut bytes = fs::read(&path).unwrap();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for b in &mut bytes[12..SIZE] {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    fs::write(&path, &bytes).unwrap();
    let err = open_err(&path, OpenMode::ReadWrite);
    assert!(
        matches!(
            err,
            RegionFileError::Layout {
                refusal: Refusal::CorruptBody(_),
                ..
            }
        ),
        "{err:?}"
    );
    let text = one_line(&err, &path);
    assert!(text.contains("corrupt"), "{text}");
    assert!(text.contains("delete the file"), "{text}");
    assert_eq!(fs::read(&path).unwrap(), bytes, "left unchanged");
    // Inspection still reads it (its findings say what is wrong), and --create-new may open it.
    region_file::open(&path, OpenMode::ReadOnly).unwrap();
    region_file::snapshot(&path).unwrap();
    region_file::open_to_reinitialise(&path).unwrap();
}
