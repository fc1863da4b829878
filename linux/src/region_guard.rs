//! Surviving a region file that is truncated or replaced under the processes that map it.
//!
//! The region file is mode 0666 so that every user of a container can attach, so any process of
//! the container can also truncate it. A load or store to a `MAP_SHARED` page that now lies
//! beyond the end of its file raises SIGBUS, whose default action kills the process: one
//! `truncate -s 0` killed every attached process. So every mapping made by
//! [`crate::region_file::open`] is registered here, and one SIGBUS handler (installed the first
//! time, with `SA_SIGINFO`) repairs a fault whose address lies inside a registered mapping:
//! - it re-extends the file to the region's size with `ftruncate` (the cut pages come back as
//!   zeros, in the same inode, so every attached process and every newcomer keeps sharing it);
//! - where that cannot work (a read-only descriptor; or the file already has its size and the
//!   access still faults, as on a full tmpfs, more than [`MAX_RETRIES`] times) it maps zero
//!   pages over the mapping (`MAP_FIXED`), so this process goes on with a private region;
//!
//! then returns, and the faulting access runs again and succeeds. It also logs one line (once per
//! process; `log::emit` formats on the stack and makes one `write(2)`, and the level is read
//! before the handler can run) and raises the event that [`take_truncation_event`] reports.
//!
//! Any other SIGBUS (another mapping, `kill -BUS`) goes to the handler that was installed before
//! ours; where there was none, the default action is restored and the signal takes effect as it
//! would have without us. The handler touches only atomics and makes only async-signal-safe
//! system calls (`fstat`, `ftruncate`, `mmap`, `write`, `sigaction`, `raise`), and saves `errno`.
//!
//! A file *replaced* under us (a rename over the path, or a removal) cannot fault: attached
//! processes keep the old inode and newcomers use the new one. [`check_replaced`] notices that
//! cheaply (a `stat` of the path against an `fstat` of our descriptor, at most once a second).

use std::ffi::CString;
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicU8, AtomicUsize};
use std::sync::{Mutex, Once, OnceLock};

use crate::log::{self, Level};

/// Mappings that can be registered at once (a process maps one; tools and tests a few).
const SLOTS: usize = 16;
/// Bytes of a registered path kept for the log line.
const PATH_MAX_LOGGED: usize = 200;
/// Faults inside a mapping whose file already has its size, before the handler gives up on the
/// file and maps zero pages (a peer's handler may have re-extended the file first: those
/// faults are retried; a full file system would fault forever).
pub const MAX_RETRIES: u32 = 64;
/// Least time between two [`check_replaced`] looks at the path.
const REPLACED_INTERVAL_NS: u64 = 1_000_000_000;

/// `base` of a free entry, and of one being filled in.
const FREE: usize = 0;
const FILLING: usize = usize::MAX;

/// One registered mapping. `base` is published last (release) and cleared first, so the
/// handler sees either a whole entry or none.
struct Entry {
    base: AtomicUsize,
    len: AtomicUsize,
    fd: AtomicI32,
    /// The file length to restore (`SIZE + 1`, as created), or 0 when the descriptor is read-only.
    restore_len: AtomicU64,
    /// Whether the mapping may be written (for the zero pages mapped over it).
    writable: AtomicBool,
    /// Faults retried because the file already had its size.
    retries: AtomicU32,
    path_len: AtomicUsize,
    path: [AtomicU8; PATH_MAX_LOGGED],
}

impl Entry {
    const fn new() -> Entry {
        Entry {
            base: AtomicUsize::new(FREE),
            len: AtomicUsize::new(0),
            fd: AtomicI32::new(-1),
            restore_len: AtomicU64::new(0),
            writable: AtomicBool::new(false),
            retries: AtomicU32::new(0),
            path_len: AtomicUsize::new(0),
            path: [const { AtomicU8::new(0) }; PATH_MAX_LOGGED],
        }
    }
}

static ENTRIES: [Entry; SLOTS] = [const { Entry::new() }; SLOTS];
/// The disposition of SIGBUS before ours, for chaining.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();
/// Truncations repaired, ever (for tests and tools).
static REPAIRED: AtomicU64 = AtomicU64::new(0);
/// A repair not yet taken by [`take_truncation_event`].
static PENDING: AtomicBool = AtomicBool::new(false);
/// Whether the one line about a truncation was logged.
static LOGGED_TRUNCATION: log::Once = log::Once::new();
/// Whether the one line about zero pages mapped over a region was logged.
static LOGGED_DETACHED: log::Once = log::Once::new();

/// A registered mapping; unregistered on drop (before the caller unmaps it).
#[derive(Debug)]
pub struct Registration(usize);

impl Drop for Registration {
    fn drop(&mut self) {
        ENTRIES[self.0].base.store(FREE, Ordering::Release);
    }
}

/// Guards `len` bytes mapped at `base` from file descriptor `fd` (kept open by the caller for as
/// long as the registration lives). `restore_len` is the length to give the file back after a
/// truncation, `None` where the descriptor may not change it. Installs the SIGBUS handler the
/// first time. `None` when every entry is taken (the mapping is then unguarded, as before).
pub(crate) fn register(
    base: *const u8,
    len: usize,
    fd: RawFd,
    restore_len: Option<u64>,
    writable: bool,
    path: &Path,
) -> Option<Registration> {
    // Read the log level now: the handler must not be the first to read the environment.
    let _ = log::level();
    install();
    let (i, e) = ENTRIES.iter().enumerate().find(|(_, e)| {
        e.base
            .compare_exchange(FREE, FILLING, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    })?;
    e.len.store(len, Ordering::Relaxed);
    e.fd.store(fd, Ordering::Relaxed);
    e.restore_len
        .store(restore_len.unwrap_or(0), Ordering::Relaxed);
    e.writable.store(writable, Ordering::Relaxed);
    e.retries.store(0, Ordering::Relaxed);
    let bytes = path.as_os_str().as_bytes();
    let n = bytes.len().min(PATH_MAX_LOGGED);
    for (dst, &b) in e.path.iter().zip(&bytes[..n]) {
        // Keep the log line one line and printable.
        let b = if b.is_ascii_control() { b'?' } else { b };
        dst.store(b, Ordering::Relaxed);
    }
    e.path_len.store(n, Ordering::Relaxed);
    e.base.store(base as usize, Ordering::Release);
    Some(Registration(i))
}

/// Truncations of a guarded region file repaired by this process so far.
pub fn repaired_count() -> u64 {
    REPAIRED.load(Ordering::Relaxed)
}

/// True once after each repaired truncation: the region's bytes (or some of them) were zeroed
/// under this process. The runtime calls it on its slow paths and re-initialises the region
/// (`init::ensure_initialised` redoes a zeroed header) and re-registers its slot.
pub fn take_truncation_event() -> bool {
    PENDING.swap(false, Ordering::AcqRel)
}

fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: all-zero bytes are a valid `sigaction` (integers, a handler address, a mask).
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: a query (act = null) changes nothing; it only fills `old`, ours and writable.
        if unsafe { libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) } != 0 {
            return;
        }
        let _ = PREVIOUS.set(old);
        // SAFETY: as for `old`, all-zero bytes are a valid `sigaction`.
        let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
        act.sa_sigaction = on_sigbus
            as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void)
            as usize;
        act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART;
        // SAFETY: `act.sa_mask` is a valid, writable `sigset_t` of ours.
        unsafe { libc::sigemptyset(&mut act.sa_mask) };
        // SAFETY: `act` is filled in, its handler has the SA_SIGINFO signature, and `PREVIOUS`
        // is set before our handler can run, so it can chain.
        unsafe { libc::sigaction(libc::SIGBUS, &act, std::ptr::null_mut()) };
    });
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: `__errno_location` has no preconditions; it returns this thread's `errno`.
    let errno_p = unsafe { libc::__errno_location() };
    // SAFETY: `errno_p` points at this thread's `errno`, valid for the thread's life; we restore
    // what the interrupted code had.
    let errno = unsafe { *errno_p };
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler; a null one (a caller
    // that invoked us directly) is treated as a signal not about our mappings.
    let (code, addr) = match unsafe { info.as_ref() } {
        // SAFETY: `i` is a whole, initialised `siginfo_t`; `si_addr` reads a pointer from its
        // union, used only when `si_code > 0` (a fault, for which the kernel fills `si_addr`).
        Some(i) => (i.si_code, unsafe { i.si_addr() } as usize),
        None => (0, 0),
    };
    // si_code > 0: the kernel raised it for a memory access (not kill/tgkill/sigqueue).
    let ours = if code > 0 { find(addr) } else { None };
    match ours {
        Some(e) => repair(e),
        None => chain(sig, info, ctx, code),
    }
    // SAFETY: as above, `errno_p` is this thread's `errno`; we restore the interrupted value.
    unsafe { *errno_p = errno };
}

/// The registered entry whose mapping holds `addr`.
fn find(addr: usize) -> Option<&'static Entry> {
    ENTRIES.iter().find(|e| {
        let base = e.base.load(Ordering::Acquire);
        base != FREE
            && base != FILLING
            && addr >= base
            && addr - base < e.len.load(Ordering::Relaxed)
    })
}

/// Makes the faulting access work again (see the module docs). Async-signal-safe.
fn repair(e: &'static Entry) {
    let fd = e.fd.load(Ordering::Relaxed);
    let want = e.restore_len.load(Ordering::Relaxed);
    let mut fixed = false;
    if want != 0 {
        // SAFETY: an all-zero `stat` is a valid buffer (integers only).
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstat on a descriptor the registration keeps open is async-signal-safe and
        // writes only `st`, ours and writable.
        if unsafe { libc::fstat(fd, &mut st) } == 0 {
            if (st.st_size.max(0) as u64) < want {
                // SAFETY: ftruncate on that descriptor is async-signal-safe and touches no
                // memory; it gives the file back the length it was created with.
                fixed = unsafe { libc::ftruncate(fd, want as libc::off_t) } == 0;
            } else {
                // A peer re-extended it first: retry, a bounded number of times.
                fixed = e.retries.fetch_add(1, Ordering::Relaxed) < MAX_RETRIES;
            }
        }
    }
    REPAIRED.fetch_add(1, Ordering::Relaxed);
    PENDING.store(true, Ordering::Release);
    if !fixed {
        detach(e);
    } else if LOGGED_TRUNCATION.first() {
        with_path(e, |p| {
            log::emit(
                Level::Warn,
                file!(),
                line!(),
                format_args!(
                    "{p}: the shared region file was truncated under this process (by another \
                     process of the container); it was extended again with zeros, so the usage \
                     recorded in the cut part is lost, and this process keeps enforcing its own \
                     limit; never truncate or rewrite the region file while GPU processes run"
                ),
            )
        });
    }
}

/// Maps zero pages over the whole mapping: this process then keeps a private region.
fn detach(e: &'static Entry) {
    let base = e.base.load(Ordering::Acquire);
    if base == FREE || base == FILLING {
        // Unregistered meanwhile (its owner is unmapping it): nothing of ours to replace.
        return;
    }
    let len = e.len.load(Ordering::Relaxed);
    let prot = if e.writable.load(Ordering::Relaxed) {
        libc::PROT_READ | libc::PROT_WRITE
    } else {
        libc::PROT_READ
    };
    // SAFETY: replaces exactly the registered mapping (`base`, `len` as mapped by region_file,
    // never unmapped while registered) with anonymous zero pages at the same address. The
    // region holds only atomics, so to every reference into it this is as if a peer had stored
    // zeros; all-zero bytes are a valid value of every field.
    let p = unsafe {
        libc::mmap(
            base as *mut libc::c_void,
            len,
            prot,
            libc::MAP_FIXED | libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p != libc::MAP_FAILED && LOGGED_DETACHED.first() {
        with_path(e, |path| {
            log::emit(
                Level::Warn,
                file!(),
                line!(),
                format_args!(
                    "{path}: the shared region file was truncated under this process and \
                     cannot be extended again (a read-only descriptor, or a full file system); \
                     this process goes on with a private, zeroed copy of the region and no \
                     longer shares usage with the others: restart it"
                ),
            )
        });
    }
}

/// Runs `f` with the entry's path as text, from a stack copy (no allocation).
fn with_path(e: &Entry, f: impl FnOnce(&str)) {
    let mut buf = [0u8; PATH_MAX_LOGGED];
    let n = e.path_len.load(Ordering::Relaxed).min(PATH_MAX_LOGGED);
    for (dst, src) in buf.iter_mut().zip(&e.path[..n]) {
        *dst = src.load(Ordering::Relaxed);
    }
    f(std::str::from_utf8(&buf[..n]).unwrap_or("the shared region file"))
}

/// Passes a SIGBUS that is not about our mappings to the previous disposition.
fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void, code: i32) {
    if let Some(old) = PREVIOUS.get() {
        let h = old.sa_sigaction;
        if h == libc::SIG_IGN && code <= 0 {
            // Ignored, and sent by a process: nothing to do. (A fault cannot be ignored: the
            // kernel would deliver it again forever; it gets the default action below.)
            return;
        }
        if h != libc::SIG_DFL && h != libc::SIG_IGN {
            // `h` is the handler the application installed (neither SIG_DFL nor SIG_IGN), called
            // with the signature its flags declare, with the arguments the kernel gave us.
            if old.sa_flags & libc::SA_SIGINFO != 0 {
                // SAFETY: with SA_SIGINFO, `h` is the address of a three-argument handler.
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    unsafe { std::mem::transmute(h) };
                f(sig, info, ctx);
            } else {
                // SAFETY: without SA_SIGINFO, `h` is the address of a one-argument handler.
                let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(h) };
                f(sig);
            }
            return;
        }
    }
    // No handler before ours: the default action, as without us. A fault re-runs the access on
    // return and dies of it; a signal sent by a process is raised again (delivered on return).
    // SAFETY: all-zero bytes are a valid `sigaction` (integers, a handler address, a mask).
    let mut dfl: libc::sigaction = unsafe { std::mem::zeroed() };
    dfl.sa_sigaction = libc::SIG_DFL;
    // SAFETY: async-signal-safe; `dfl.sa_mask` is a valid, writable `sigset_t` of ours.
    unsafe { libc::sigemptyset(&mut dfl.sa_mask) };
    // SAFETY: sigaction is async-signal-safe; `dfl` (the default action) is filled in.
    unsafe { libc::sigaction(sig, &dfl, std::ptr::null_mut()) };
    if code <= 0 {
        // SAFETY: raise is async-signal-safe and takes no pointers.
        unsafe { libc::raise(sig) };
    }
}

/// Whether `fd` is still the file at `path`: `Some(false)` when the path names another file or
/// nothing, `None` when either cannot be examined.
pub fn same_file(fd: RawFd, path: &Path) -> Option<bool> {
    let c = CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: an all-zero `stat` is a valid buffer to fill (integers only).
    let mut ours: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as for `ours`.
    let mut there: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes only `ours`, a valid, writable buffer; a bad `fd` fails with EBADF.
    if unsafe { libc::fstat(fd, &mut ours) } != 0 {
        return None;
    }
    // SAFETY: `c` is NUL-terminated and outlives the call; lstat writes only `there`.
    if unsafe { libc::lstat(c.as_ptr(), &mut there) } != 0 {
        // SAFETY: `__errno_location` has no preconditions; it returns this thread's `errno`.
        let errno_p = unsafe { libc::__errno_location() };
        // SAFETY: `errno_p` points at this thread's `errno`, valid for the thread's life.
        return match unsafe { *errno_p } {
            libc::ENOENT | libc::ENOTDIR => Some(false),
            _ => None,
        };
    }
    Some(ours.st_dev == there.st_dev && ours.st_ino == there.st_ino)
}

/// The library's own region: its descriptor and path, for [`check_replaced`] (the last one
/// leaked; the library leaks one).
static LIBRARY_REGION: Mutex<Option<(RawFd, PathBuf)>> = Mutex::new(None);
static LAST_REPLACED_CHECK_NS: AtomicU64 = AtomicU64::new(0);
static LOGGED_REPLACED: log::Once = log::Once::new();

/// Records the region the process keeps for its life (`RegionFile::leak`).
pub(crate) fn set_library_region(fd: RawFd, path: &Path) {
    *LIBRARY_REGION.lock().unwrap_or_else(|p| p.into_inner()) = Some((fd, path.to_path_buf()));
}

/// Whether the library's region file was replaced or removed at its path, looked at most once a
/// second (`now_ns` is the monotonic clock); logs one line the first time. For the runtime's slow
/// paths (reaping, the memory views): attached processes keep the old file, newcomers use the
/// new one, so their usage is no longer counted together.
pub fn check_replaced(now_ns: u64) -> bool {
    let Some((fd, path)) = LIBRARY_REGION
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
    else {
        return false;
    };
    let last = LAST_REPLACED_CHECK_NS.load(Ordering::Relaxed);
    if last != 0 && now_ns.saturating_sub(last) < REPLACED_INTERVAL_NS
        || LAST_REPLACED_CHECK_NS
            .compare_exchange(last, now_ns.max(1), Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
    {
        return false;
    }
    if same_file(fd, &path) != Some(false) {
        return false;
    }
    if LOGGED_REPLACED.first() {
        crate::log::log_warn!(
            "{}: the shared region file was replaced or removed after this process attached; \
             it keeps using (and enforcing its limit in) the file it opened, but processes \
             started from now on use another one, so their usage is not counted together: \
             restart the container's GPU processes",
            path.display()
        );
    }
    true
}
