//! The Linux implementation of [`hami_shm::platform::Platform`]: `/proc` liveness, glibc `sem_t`
//! operations on the region's bytes, and POSIX record locks on the region file.
//!
//! # The file descriptor
//!
//! [`LinuxPlatform::new`] takes the region file's descriptor and only borrows it: whoever opened
//! the file (normally [`crate::region_file::RegionFile`], which the preload library leaks for the
//! life of the process) keeps it open for as long as the platform is used, and closes it.
//!
//! # Record locks belong to processes
//!
//! The init lock and the window are POSIX record locks (`fcntl`), the same kind as C peers'
//! `lockf(fd, F_LOCK, size)`. Such locks belong to the *process*, not to a thread or a
//! descriptor:
//! - two threads of one process never exclude each other, and one thread's unlock releases the
//!   other's lock: callers serialise the init-lock and window methods among their threads (the
//!   [`Platform`] contract says so);
//! - closing *any* descriptor of the region file in this process releases all of this process's
//!   locks on it, so nothing else in the process may open and close the file while a lock is held;
//! - a forked child does not inherit them; the kernel drops them when the process dies, which is
//!   what makes both locks crash-safe;
//! - the init lock is a write lock, so it needs a descriptor opened read-write (a read-only one
//!   gets EBADF: `init_lock` returns false and warns once).

use core::fmt::{self, Write as _};
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::os::fd::RawFd;

use hami_shm::layout::{RawSem, SharedRegion};
use hami_shm::platform::{Liveness, Platform, Problem, ProcId, SemWait};

use crate::log::log_warn;

/// Bytes past the region's end where the owner lock's window byte lies (beyond the file's bytes:
/// record locks may lie past end of file, and C peers lock only `[0, size)`).
pub const WINDOW_OFFSET: u64 = 64;
/// The window byte of the ABI region: `SharedRegion::SIZE + 64`.
pub const WINDOW_BYTE: u64 = SharedRegion::SIZE as u64 + WINDOW_OFFSET;

/// How often [`Platform::init_lock`] retries a held lock.
const LOCK_POLL_NS: u64 = 1_000_000;
/// How long [`Platform::window_enter`] retries before giving up (only a write lock on the window
/// byte, which no process of ours takes, could make it wait at all).
const WINDOW_ENTER_LIMIT_NS: u64 = 1_000_000_000;

/// One bit per [`Problem`] kind (and the platform's own failures) already logged.
static REPORTED: AtomicU32 = AtomicU32::new(0);
/// Bit of [`REPORTED`] for a failed window lock.
const BIT_WINDOW_FAILED: u32 = 1 << 30;
/// Bit of [`REPORTED`] for a failed init lock call (not a timeout).
const BIT_INIT_LOCK_FAILED: u32 = 1 << 29;

/// The Linux platform over one region file (or over none: [`LinuxPlatform::private`]).
pub struct LinuxPlatform {
    /// The region file's descriptor; -1 for a private platform.
    fd: RawFd,
    region_size: usize,
    /// No file and no peers: the init lock and the window are no-ops.
    private: bool,
    /// This process's [`ProcId`], cached so [`Platform::self_id`] makes no syscall.
    identity: AtomicU64,
}

impl LinuxPlatform {
    /// A platform over the region file `fd` (borrowed, not closed: see the module docs) whose
    /// region is `region_size` bytes (`SharedRegion::SIZE` for the ABI region; the init lock
    /// covers `[0, region_size)` as C peers' `lockf` does). Reads this process's identity once.
    pub fn new(fd: RawFd, region_size: usize) -> LinuxPlatform {
        LinuxPlatform {
            fd,
            region_size,
            private: false,
            identity: AtomicU64::new(current_identity().0),
        }
    }

    /// A platform for a private region that no other process maps (degraded mode): there is no
    /// file, so the init lock is always granted at once and the window is a no-op that nobody
    /// else holds. Identity, liveness, clocks and semaphores are the real ones.
    pub fn private() -> LinuxPlatform {
        LinuxPlatform {
            fd: -1,
            region_size: 0,
            private: true,
            identity: AtomicU64::new(current_identity().0),
        }
    }

    /// Re-reads this process's identity (pid and start tag). Call it in a forked child before
    /// using the platform: the child has a new pid, the cached one is its parent's.
    pub fn refresh_identity(&self) {
        self.identity.store(current_identity().0, Ordering::Relaxed);
    }

    /// The region file's descriptor (-1 for [`LinuxPlatform::private`]).
    pub fn fd(&self) -> RawFd {
        self.fd
    }

    /// The byte the window lock covers: `region_size + WINDOW_OFFSET`.
    pub fn window_byte(&self) -> u64 {
        self.region_size as u64 + WINDOW_OFFSET
    }

    /// One `fcntl` record-lock command on `[start, start + len)`; returns the `struct flock`
    /// (which `F_GETLK` fills in) or the errno.
    fn fcntl_lock(
        &self,
        cmd: libc::c_int,
        kind: libc::c_int,
        start: u64,
        len: u64,
    ) -> Result<libc::flock, i32> {
        let mut fl = flock(kind, start, len);
        // SAFETY: `fl` is a valid, initialised `struct flock` that lives across the call; fcntl
        // with F_SETLK/F_GETLK reads (and for F_GETLK writes) only that struct. A bad
        // descriptor is reported as EBADF, not undefined behaviour.
        let rc = unsafe { libc::fcntl(self.fd, cmd, &mut fl as *mut libc::flock) };
        if rc == -1 {
            Err(errno())
        } else {
            Ok(fl)
        }
    }

    fn window_range(&self) -> (u64, u64) {
        (self.window_byte(), 1)
    }
}

/// A `struct flock` for `[start, start + len)` from the file's start (`len` 0 would mean "to
/// the end and beyond", which we never want, so callers pass at least 1).
fn flock(kind: libc::c_int, start: u64, len: u64) -> libc::flock {
    // SAFETY: `struct flock` is plain integers (and padding); all-zero is a valid value.
    let mut fl: libc::flock = unsafe { core::mem::zeroed() };
    fl.l_type = kind as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = start.min(i64::MAX as u64) as libc::off_t;
    fl.l_len = len.min(i64::MAX as u64) as libc::off_t;
    fl
}

/// `CLOCK_MONOTONIC` in nanoseconds (what [`Platform::now_ns`] returns), for callers that have
/// no platform at hand.
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// Whole milliseconds from `from_ns` to `to_ns` (0 if `to_ns` is earlier), for the debug log's
/// timings.
pub fn ms_between(from_ns: u64, to_ns: u64) -> u64 {
    to_ns.saturating_sub(from_ns) / 1_000_000
}

fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

fn getpid() -> i32 {
    // SAFETY: getpid has no preconditions and cannot fail.
    unsafe { libc::getpid() }
}

/// This process's identity, from `getpid` and `/proc/self/stat`; tag 0 (pid only, as C peers
/// write) when `/proc` cannot be read.
fn current_identity() -> ProcId {
    let pid = getpid();
    match probe(pid) {
        Probe::Running { start_time } => ProcId::new(pid, ProcId::start_tag(start_time)),
        _ => ProcId::new(pid, 0),
    }
}

/// The identity of the process `pid` as this platform would record it (pid and start tag), or
/// `None` if it is not running (gone or a zombie) or `/proc/<pid>/stat` cannot be read.
pub fn proc_id_of(pid: i32) -> Option<ProcId> {
    if pid <= 0 {
        return None;
    }
    match probe(pid) {
        Probe::Running { start_time } => Some(ProcId::new(pid, ProcId::start_tag(start_time))),
        _ => None,
    }
}

/// What `/proc/<pid>/stat` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Probe {
    /// No such process (ENOENT/ESRCH).
    Missing,
    /// State Z, X or x.
    Exited,
    /// It runs; `start_time` is field 22 (clock ticks since boot).
    Running { start_time: u64 },
    /// Cannot tell (EMFILE, EACCES, parse failure...).
    Unknown,
}

/// A tiny formatter into a stack buffer; silently truncates.
struct StackBuf<const N: usize> {
    buf: [u8; N],
    len: usize,
}

impl<const N: usize> StackBuf<N> {
    fn new() -> Self {
        StackBuf {
            buf: [0; N],
            len: 0,
        }
    }

    fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl<const N: usize> fmt::Write for StackBuf<N> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let room = N - self.len;
        let n = s.len().min(room);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

/// Reads `/proc/<pid>/stat` into a stack buffer (no allocation: this may run in a forked child
/// or an exit path) and parses the state and the start time.
fn probe(pid: i32) -> Probe {
    let mut path = StackBuf::<32>::new();
    // "/proc/-2147483648/stat" is 22 bytes; the buffer holds it and the NUL.
    let _ = write!(path, "/proc/{pid}/stat\0");
    let mut stat = [0u8; 1024];
    // SAFETY: `path` holds a NUL-terminated string (written above, shorter than the buffer).
    let fd = unsafe {
        libc::open(
            path.bytes().as_ptr() as *const libc::c_char,
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return match errno() {
            libc::ENOENT | libc::ESRCH => Probe::Missing,
            _ => Probe::Unknown,
        };
    }
    let mut len = 0usize;
    let mut failed = 0;
    while len < stat.len() {
        // SAFETY: the destination is the unfilled tail of `stat`, `stat.len() - len` bytes.
        let n = unsafe {
            libc::read(
                fd,
                stat[len..].as_mut_ptr() as *mut libc::c_void,
                stat.len() - len,
            )
        };
        if n < 0 {
            let e = errno();
            if e == libc::EINTR {
                continue;
            }
            failed = e;
            break;
        }
        if n == 0 {
            break;
        }
        len += n as usize;
    }
    // SAFETY: `fd` was opened above and is closed exactly once.
    unsafe { libc::close(fd) };
    match failed {
        0 => parse_stat(&stat[..len]),
        // The process went away between open and read.
        libc::ESRCH | libc::ENOENT => Probe::Missing,
        _ => Probe::Unknown,
    }
}

/// Parses `pid (comm) S ppid ... starttime ...`: everything after the *last* ')' (comm may hold
/// spaces and parentheses) is space-separated; the state is field 3, the start time field 22.
fn parse_stat(text: &[u8]) -> Probe {
    let Some(close) = text.iter().rposition(|&b| b == b')') else {
        return Probe::Unknown;
    };
    let mut fields = text[close + 1..]
        .split(|&b| b == b' ' || b == b'\n')
        .filter(|f| !f.is_empty());
    let state = match fields.next() {
        Some([s]) => *s,
        _ => return Probe::Unknown,
    };
    if matches!(state, b'Z' | b'X' | b'x') {
        return Probe::Exited;
    }
    // Field 3 was the state; field 22 is 19 further on.
    let Some(start) = fields.nth(18) else {
        return Probe::Unknown;
    };
    match parse_u64(start) {
        Some(start_time) => Probe::Running { start_time },
        None => Probe::Unknown,
    }
}

fn parse_u64(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |acc, &d| {
        if d.is_ascii_digit() {
            acc.checked_mul(10)?.checked_add(u64::from(d - b'0'))
        } else {
            None
        }
    })
}

/// True the first time it is called with `bit` in this process.
fn first_time(bit: u32) -> bool {
    REPORTED.fetch_or(bit, Ordering::Relaxed) & bit == 0
}

fn problem_bit(problem: &Problem) -> u32 {
    1 << match problem {
        Problem::StuckSeqlock { .. } => 0,
        Problem::Underflow { .. } => 1,
        Problem::ProcNumOutOfRange { .. } => 2,
        Problem::RecoveredDeadOwner { .. } => 3,
        Problem::RecoveredLostToken => 4,
        Problem::LockStolen => 5,
    }
}

/// The warning text for a problem: what happened, what was done, and what to do.
fn describe(problem: &Problem, f: &mut dyn fmt::Write) -> fmt::Result {
    const REGION: &str = "shared region (CUDA_DEVICE_MEMORY_SHARED_CACHE)";
    match *problem {
        Problem::StuckSeqlock { slot } => write!(
            f,
            "{REGION}: slot {slot}'s usage stayed mid-update (its writer died or a peer corrupted \
             it); using the last value read. If it persists, restart the container's GPU processes"
        ),
        Problem::Underflow { dev } => write!(
            f,
            "{REGION}: a release on device {dev} would take usage below zero (a peer freed more \
             than it recorded); clamped at zero. Check that all processes run the same library"
        ),
        Problem::ProcNumOutOfRange { found } => write!(
            f,
            "{REGION}: proc_num is {found}, outside the slot table; clamped. A peer corrupted \
             the region: stop the container's GPU processes and delete the file"
        ),
        Problem::RecoveredDeadOwner { pid } => write!(
            f,
            "{REGION}: process {pid} died holding the region lock; recovered its lock. No action \
             needed unless processes are being killed unexpectedly"
        ),
        Problem::RecoveredLostToken => write!(
            f,
            "{REGION}: the region lock's token was lost (its holder died mid-release); taken \
             over. No action needed unless processes are being killed unexpectedly"
        ),
        Problem::LockStolen => write!(
            f,
            "{REGION}: this process held the region lock so long that another process recovered \
             it; not releasing it twice. Check for a stalled (stopped, swapping) process"
        ),
    }
}

struct Args<'a>(&'a Problem);

impl fmt::Display for Args<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        describe(self.0, f)
    }
}

/// A `timespec` of `ns` nanoseconds.
fn timespec(ns: u64) -> libc::timespec {
    libc::timespec {
        tv_sec: (ns / 1_000_000_000).min(i64::MAX as u64) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    }
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write; the clocks used are always supported on Linux.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    (ts.tv_sec.max(0) as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec.max(0) as u64)
}

fn sem_ptr(sem: &RawSem) -> *mut libc::sem_t {
    // SAFETY (of every use of this pointer): `RawSem` is 32 bytes with align 8, the size and
    // alignment of glibc's `sem_t` on x86_64 (pinned in hami_shm::layout). Its storage is atomics,
    // i.e. interior-mutable, so writing through a pointer derived from `&RawSem` is allowed. It
    // lies in the region's MAP_SHARED mapping (or a test's shared mapping), which outlives the
    // platform; glibc's sem operations update it with atomic instructions, the same way the C
    // peers sharing the mapping do.
    sem as *const RawSem as *mut libc::sem_t
}

impl Platform for LinuxPlatform {
    fn self_id(&self) -> ProcId {
        ProcId(self.identity.load(Ordering::Relaxed))
    }

    fn liveness(&self, id: ProcId) -> Liveness {
        let pid = id.pid();
        if pid <= 0 {
            return Liveness::Dead;
        }
        let me = self.self_id();
        if pid == me.pid() {
            // Our own pid: a tagged identity is either us or an earlier incarnation of our pid (a
            // container restart kept the file; bug B13), which cannot be running while we are.
            // Tag 0 is checked by pid only, as the trait says: it may be our own slot after a C
            // peer moved it without the tag.
            return if id.tag() == 0 || id.tag() == me.tag() {
                Liveness::Alive
            } else {
                Liveness::Dead
            };
        }
        match probe(pid) {
            Probe::Missing | Probe::Exited => Liveness::Dead,
            Probe::Unknown => Liveness::Unknown,
            Probe::Running { start_time } => {
                if id.tag() != 0 && id.tag() != ProcId::start_tag(start_time) {
                    Liveness::Dead
                } else {
                    Liveness::Alive
                }
            }
        }
    }

    fn now_ns(&self) -> u64 {
        monotonic_ns()
    }

    fn sleep_ns(&self, ns: u64) {
        let mut req = timespec(ns);
        loop {
            let mut rem = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: both pointers are to valid timespecs that live across the call.
            let rc = unsafe { libc::nanosleep(&req, &mut rem) };
            if rc == 0 || errno() != libc::EINTR {
                return;
            }
            req = rem;
        }
    }

    fn report(&self, problem: Problem) {
        if first_time(problem_bit(&problem)) {
            log_warn!("{}", Args(&problem));
        }
    }

    fn sem_init(&self, sem: &RawSem, value: u32) -> bool {
        // SAFETY: see `sem_ptr`; pshared = 1 because the semaphore is shared between processes.
        unsafe { libc::sem_init(sem_ptr(sem), 1, value) == 0 }
    }

    fn sem_wait(&self, sem: &RawSem, timeout_ns: u64) -> SemWait {
        // SAFETY: see `sem_ptr`.
        if unsafe { libc::sem_trywait(sem_ptr(sem)) } == 0 {
            return SemWait::Acquired;
        }
        match errno() {
            libc::EAGAIN | libc::EINTR => {}
            _ => return SemWait::Failed,
        }
        if timeout_ns == 0 {
            return SemWait::TimedOut;
        }
        // The libc crate has no sem_clockwait, so the deadline is on CLOCK_REALTIME; the
        // monotonic clock decides when the timeout has really passed (a forward jump of the wall
        // clock ends a wait early; then we wait again for the rest).
        let deadline = self.now_ns().saturating_add(timeout_ns);
        loop {
            let left = deadline.saturating_sub(self.now_ns());
            if left == 0 {
                return SemWait::TimedOut;
            }
            let abs = timespec(clock_ns(libc::CLOCK_REALTIME).saturating_add(left));
            // SAFETY: see `sem_ptr`; `abs` is a valid timespec that lives across the call.
            if unsafe { libc::sem_timedwait(sem_ptr(sem), &abs) } == 0 {
                return SemWait::Acquired;
            }
            match errno() {
                libc::ETIMEDOUT => continue,
                libc::EINTR => return SemWait::TimedOut,
                _ => return SemWait::Failed,
            }
        }
    }

    fn sem_post(&self, sem: &RawSem) {
        // SAFETY: see `sem_ptr`. EOVERFLOW (value at SEM_VALUE_MAX) leaves it unchanged.
        unsafe { libc::sem_post(sem_ptr(sem)) };
    }

    fn sem_value(&self, sem: &RawSem) -> u32 {
        let mut value: libc::c_int = 0;
        // SAFETY: see `sem_ptr`; `value` is a valid int to write.
        if unsafe { libc::sem_getvalue(sem_ptr(sem), &mut value) } != 0 {
            return 0;
        }
        value.max(0) as u32
    }

    fn init_lock(&self, timeout_ns: u64) -> bool {
        // F_SETLK with F_WRLCK on [0, size) from the file's start: the lock `lockf(fd, F_TLOCK,
        // size)` takes at offset 0, so it excludes C peers' `lockf(fd, F_LOCK, size)`.
        if self.private {
            return true;
        }
        let start = self.now_ns();
        let len = (self.region_size as u64).max(1);
        loop {
            match self.fcntl_lock(libc::F_SETLK, libc::F_WRLCK, 0, len) {
                Ok(_) => return true,
                Err(libc::EACCES | libc::EAGAIN | libc::EINTR) => {}
                Err(e) => {
                    if first_time(BIT_INIT_LOCK_FAILED) {
                        log_warn!(
                            "shared region: cannot take the init lock (fcntl F_SETLK: {}); \
                             the region's descriptor is unusable or its file system lacks \
                             POSIX record locks: put CUDA_DEVICE_MEMORY_SHARED_CACHE on a local \
                             file system",
                            std::io::Error::from_raw_os_error(e)
                        );
                    }
                    return false;
                }
            }
            let elapsed = self.now_ns().saturating_sub(start);
            if elapsed >= timeout_ns {
                return false;
            }
            self.sleep_ns(LOCK_POLL_NS.min(timeout_ns - elapsed));
        }
    }

    fn init_unlock(&self) {
        if self.private {
            return;
        }
        let len = (self.region_size as u64).max(1);
        let _ = self.fcntl_lock(libc::F_SETLK, libc::F_UNLCK, 0, len);
    }

    fn window_enter(&self) {
        // A read lock conflicts only with write locks, which no process takes on this byte, so
        // this succeeds at once. It polls with F_SETLK rather than blocking in F_SETLKW so that
        // a stranger's write lock there cannot hang us: after a second we go on outside the
        // window (the protocol then only loses its protection against a premature takeover).
        if self.private {
            return;
        }
        let (byte, len) = self.window_range();
        let start = self.now_ns();
        loop {
            match self.fcntl_lock(libc::F_SETLK, libc::F_RDLCK, byte, len) {
                Ok(_) => return,
                Err(libc::EACCES | libc::EAGAIN | libc::EINTR)
                    if self.now_ns().saturating_sub(start) < WINDOW_ENTER_LIMIT_NS =>
                {
                    self.sleep_ns(LOCK_POLL_NS);
                }
                Err(e) => {
                    if first_time(BIT_WINDOW_FAILED) {
                        log_warn!(
                            "shared region: cannot take the owner-lock window (fcntl F_SETLK at \
                             byte {byte}: {}); continuing without it. The region's descriptor \
                             is unusable or its file system lacks POSIX record locks: put \
                             CUDA_DEVICE_MEMORY_SHARED_CACHE on a local file system",
                            std::io::Error::from_raw_os_error(e)
                        );
                    }
                    return;
                }
            }
        }
    }

    fn window_exit(&self) {
        if self.private {
            return;
        }
        let (byte, len) = self.window_range();
        let _ = self.fcntl_lock(libc::F_SETLK, libc::F_UNLCK, byte, len);
    }

    fn window_held_by_other(&self) -> bool {
        // F_GETLK reports a lock that would conflict with a write lock; our own locks never
        // conflict with ourselves, so anything reported belongs to another process. If we cannot
        // tell, say "held": a takeover needs certainty that nobody is inside.
        if self.private {
            return false;
        }
        let (byte, len) = self.window_range();
        match self.fcntl_lock(libc::F_GETLK, libc::F_WRLCK, byte, len) {
            Ok(fl) => libc::c_int::from(fl.l_type) != libc::F_UNLCK,
            Err(_) => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_awkward_comm() {
        let line = b"42 (a b) c)) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 98765 1000 \
                     10 18446744073709551615\n";
        assert_eq!(parse_stat(line), Probe::Running { start_time: 98765 });
        assert_eq!(parse_stat(b"42 (x) Z 1 42"), Probe::Exited);
        assert_eq!(parse_stat(b"42 (x) X"), Probe::Exited);
        assert_eq!(parse_stat(b"42 (x) S 1 2"), Probe::Unknown);
        assert_eq!(parse_stat(b"garbage"), Probe::Unknown);
        assert_eq!(parse_stat(b""), Probe::Unknown);
    }

    #[test]
    fn parse_u64_rejects_junk() {
        assert_eq!(parse_u64(b"123"), Some(123));
        assert_eq!(parse_u64(b"12a"), None);
        assert_eq!(parse_u64(b""), None);
        assert_eq!(parse_u64(b"99999999999999999999999"), None);
    }

    #[test]
    fn every_problem_has_its_own_bit_and_a_line() {
        let all = [
            Problem::StuckSeqlock { slot: 1 },
            Problem::Underflow { dev: 0 },
            Problem::ProcNumOutOfRange { found: -3 },
            Problem::RecoveredDeadOwner { pid: 7 },
            Problem::RecoveredLostToken,
            Problem::LockStolen,
        ];
        let mut bits = 0;
        for p in &all {
            let b = problem_bit(p);
            assert_eq!(bits & b, 0);
            assert_eq!(b & (BIT_WINDOW_FAILED | BIT_INIT_LOCK_FAILED), 0);
            bits |= b;
            let text = Args(p).to_string();
            assert!(!text.contains('\n') && text.len() < 400, "{text}");
        }
    }
}
