//! HAMi-compatible logging to stderr, safe to call from anywhere in a preload library.
//!
//! Scripts and people grep HAMi-core's log lines, so the prefixes are HAMi-core's:
//!
//! ```text
//! [HAMI-core ERROR (pid:<pid> thread=<pthread_self> <file>:<line>)]: <message>
//! [HAMI-core Warn(<pid>:<pthread_self>:<file>:<line>)]: <message>
//! [HAMI-core Msg(<pid>:<pthread_self>:<file>:<line>)]: <message>
//! [HAMI-core Info(<pid>:<pthread_self>:<file>:<line>)]: <message>
//! [HAMI-core Debug(<pid>:<pthread_self>:<file>:<line>)]: <message>
//! ```
//!
//! The level comes from `LIBCUDA_LOG_LEVEL` (read once, lazily, then cached), with HAMi-core's
//! thresholds: errors always print; `Warn` and `Msg` at 2 or more (the default); `Info` at 3 or
//! more; `Debug` at 4. So 0 and 1 both mean "errors only". Unlike HAMi-core's `atoi`, a value that
//! is not a whole number (`debug`, `3x`) does not silently mean 0: the default 2 is used and one
//! warning says so. Values above 4 act as 4, negative ones as 0.
//!
//! Why it looks like this: a hook may log before `main`, from any thread, inside our own
//! initialisation or while the application holds stdio or allocator locks. So a record is formatted
//! into a fixed 512-byte buffer on the stack (longer messages are cut and end in `...`), written
//! with one `write(2)` to fd 2 (one line, never interleaved with another thread's, since it is
//! below `PIPE_BUF`), and nothing here allocates, takes a lock, or touches `std::io` or
//! `std::env` (the variable is read with `libc::getenv`).

use core::fmt::{self, Write as _};
use core::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::ffi::CStr;

/// The size of one formatted record, newline included; longer records are truncated.
pub const RECORD_MAX: usize = 512;

/// The level used when `LIBCUDA_LOG_LEVEL` is unset or malformed, as in HAMi-core.
pub const DEFAULT_LEVEL: i32 = 2;

/// A record's kind; its threshold decides whether it prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// Always printed.
    Error,
    /// Printed at level 2 or more.
    Warn,
    /// HAMi-core's `LOG_MSG` (lines like `Initializing.....`): printed at level 2 or more.
    Msg,
    /// Printed at level 3 or more.
    Info,
    /// Printed at level 4.
    Debug,
}

impl Level {
    /// The lowest `LIBCUDA_LOG_LEVEL` at which this kind prints.
    pub fn threshold(self) -> i32 {
        match self {
            Level::Error => 0,
            Level::Warn | Level::Msg => 2,
            Level::Info => 3,
            Level::Debug => 4,
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Level::Error => "ERROR",
            Level::Warn => "Warn",
            Level::Msg => "Msg",
            Level::Info => "Info",
            Level::Debug => "Debug",
        }
    }
}

/// Sentinel for "not read yet".
const UNREAD: i32 = i32::MIN;
static LEVEL: AtomicI32 = AtomicI32::new(UNREAD);

/// A malformed `LIBCUDA_LOG_LEVEL` is reported once.
static BAD_LOG_LEVEL: Once = Once::new();

/// Interprets a `LIBCUDA_LOG_LEVEL` value (`None` = unset): `Some(level)` clamped to 0..=4, or
/// `None` when it is not a whole decimal number (the caller then uses [`DEFAULT_LEVEL`] and
/// warns). Pure, for tests.
pub fn level_from_value(value: Option<&str>) -> Option<i32> {
    match value {
        None => Some(DEFAULT_LEVEL),
        Some(v) => hami_shm::envparse::parse_priority(v)
            .ok()
            .map(|l| l.clamp(0, 4)),
    }
}

/// The current level: `LIBCUDA_LOG_LEVEL` on first use (cached), or what [`set_level`] stored.
pub fn level() -> i32 {
    let cached = LEVEL.load(Ordering::Relaxed);
    if cached != UNREAD {
        return cached;
    }
    with_getenv(c"LIBCUDA_LOG_LEVEL", |raw| {
        let (lvl, bad) = match level_from_value(raw) {
            Some(l) => (l, false),
            None => (DEFAULT_LEVEL, true),
        };
        // Two threads may both get here; they store the same value. Store before warning, so
        // the warning's own level check does not come back here.
        LEVEL.store(lvl, Ordering::Relaxed);
        if bad && BAD_LOG_LEVEL.first() {
            emit(
                Level::Warn,
                file!(),
                line!(),
                format_args!(
                    "LIBCUDA_LOG_LEVEL={:?} is not a level: write 0 (errors only) to 4 (debug); \
                     using {}",
                    raw.unwrap_or(""),
                    DEFAULT_LEVEL
                ),
            );
        }
        lvl
    })
}

/// Overrides the level (clamped to 0..=4), e.g. for a tool that wants `Info` output whatever the
/// environment says.
pub fn set_level(level: i32) {
    LEVEL.store(level.clamp(0, 4), Ordering::Relaxed);
}

/// Whether a record of this kind would print now; lets callers skip expensive arguments.
pub fn enabled(level_kind: Level) -> bool {
    level() >= level_kind.threshold()
}

/// A message that must not repeat: `static BAD: Once = Once::new();` at the call site, then
/// `if BAD.first() { log_warn!(...) }`. One per kind of message, so no two kinds can share one
/// (a forked child inherits what its parent said).
#[derive(Default)]
pub struct Once(AtomicBool);

impl Once {
    /// Not said yet.
    pub const fn new() -> Self {
        Once(AtomicBool::new(false))
    }

    /// True the first time it is called in this process, false afterwards.
    pub fn first(&self) -> bool {
        !self.0.swap(true, Ordering::Relaxed)
    }
}

/// Calls `f` with the value of `name` read by `getenv`, without std's environment lock. A value
/// that is not UTF-8 counts as unset. The borrow ends with `f`, before anyone could `setenv`
/// through us.
fn with_getenv<R>(name: &CStr, f: impl FnOnce(Option<&str>) -> R) -> R {
    // SAFETY: `name` is NUL-terminated; `getenv` only reads it.
    let p = unsafe { libc::getenv(name.as_ptr()) };
    let value = if p.is_null() {
        None
    } else {
        // SAFETY: `getenv` returned a non-null, NUL-terminated string owned by the environment;
        // it stays valid until the environment is modified, and the borrow handed to `f` ends
        // when `f` returns (the same exposure any C caller of getenv has).
        unsafe { CStr::from_ptr(p) }.to_str().ok()
    };
    f(value)
}

/// A fixed buffer that formats without allocating and cuts (at a character boundary) what does
/// not fit, keeping room for `...\n`.
pub struct RecordBuf {
    buf: [u8; RECORD_MAX],
    len: usize,
    truncated: bool,
}

impl Default for RecordBuf {
    fn default() -> Self {
        Self::new()
    }
}

impl RecordBuf {
    const ROOM: usize = RECORD_MAX - 4; // for "...\n"

    /// An empty buffer.
    pub const fn new() -> Self {
        Self {
            buf: [0; RECORD_MAX],
            len: 0,
            truncated: false,
        }
    }

    /// Ends the record with a newline (after `...` if it was cut) and returns its bytes.
    pub fn finish(&mut self) -> &[u8] {
        if self.truncated {
            self.buf[self.len..self.len + 3].copy_from_slice(b"...");
            self.len += 3;
        }
        self.buf[self.len] = b'\n';
        self.len += 1;
        &self.buf[..self.len]
    }
}

impl fmt::Write for RecordBuf {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        if self.truncated {
            return Ok(());
        }
        let room = Self::ROOM - self.len;
        let mut n = s.len().min(room);
        while !s.is_char_boundary(n) {
            n -= 1;
        }
        // A newline inside a message would split the record; show it as a space.
        for (dst, &b) in self.buf[self.len..self.len + n]
            .iter_mut()
            .zip(&s.as_bytes()[..n])
        {
            *dst = if b == b'\n' { b' ' } else { b };
        }
        self.len += n;
        if n < s.len() {
            self.truncated = true;
        }
        Ok(())
    }
}

/// Formats one record, prefix and newline included, into `out`. Pure, for tests.
pub fn format_record(
    out: &mut RecordBuf,
    kind: Level,
    pid: i32,
    thread: libc::pthread_t,
    file: &str,
    line: u32,
    args: fmt::Arguments<'_>,
) {
    // Writing to a RecordBuf never fails.
    let _ = match kind {
        Level::Error => write!(
            out,
            "[HAMI-core ERROR (pid:{pid} thread={thread} {file}:{line})]: "
        ),
        _ => write!(
            out,
            "[HAMI-core {}({pid}:{thread}:{file}:{line})]: ",
            kind.tag()
        ),
    };
    let _ = out.write_fmt(args);
}

/// Writes one record if its level is enabled: the function behind the `log_*!` macros.
pub fn emit(kind: Level, file: &str, line: u32, args: fmt::Arguments<'_>) {
    if !enabled(kind) {
        return;
    }
    // SAFETY: getpid has no preconditions and cannot fail.
    let pid = unsafe { libc::getpid() };
    // SAFETY: pthread_self has no preconditions and cannot fail.
    let thread = unsafe { libc::pthread_self() };
    let mut rec = RecordBuf::new();
    // HAMi-core prints pthread_self() as %ld; printed unsigned, real thread handles (user-space
    // addresses) show the same digits.
    format_record(&mut rec, kind, pid, thread, file, line, args);
    let bytes = rec.finish();
    loop {
        // SAFETY: `bytes` is a valid, initialised buffer of `bytes.len()` bytes; fd 2 may be
        // closed, in which case write fails with EBADF and we drop the record.
        let r = unsafe { libc::write(2, bytes.as_ptr().cast(), bytes.len()) };
        if r >= 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            break;
        }
    }
}

/// Logs an error record (always printed) with the caller's file and line.
#[macro_export]
macro_rules! log_error {
    ($($arg:tt)*) => {
        $crate::log::emit($crate::log::Level::Error, file!(), line!(), format_args!($($arg)*))
    };
}
/// Logs a warning record (level 2 or more).
#[macro_export]
macro_rules! log_warn {
    ($($arg:tt)*) => {
        $crate::log::emit($crate::log::Level::Warn, file!(), line!(), format_args!($($arg)*))
    };
}
/// Logs an info record (level 3 or more).
#[macro_export]
macro_rules! log_info {
    ($($arg:tt)*) => {
        $crate::log::emit($crate::log::Level::Info, file!(), line!(), format_args!($($arg)*))
    };
}
/// Logs a debug record (level 4).
#[macro_export]
macro_rules! log_debug {
    ($($arg:tt)*) => {
        $crate::log::emit($crate::log::Level::Debug, file!(), line!(), format_args!($($arg)*))
    };
}
// Also by this module's path (`log::log_warn!`), as the callers name them.
pub use crate::{log_debug, log_error, log_info, log_warn};

#[cfg(test)]
mod tests {
    use super::*;

    fn record(kind: Level, args: fmt::Arguments<'_>) -> String {
        let mut b = RecordBuf::new();
        format_record(&mut b, kind, 42, 139_872_001, "src/x.rs", 7, args);
        String::from_utf8(b.finish().to_vec()).unwrap()
    }

    #[test]
    fn prefixes_match_hami() {
        assert_eq!(
            record(Level::Error, format_args!("boom {}", 1)),
            "[HAMI-core ERROR (pid:42 thread=139872001 src/x.rs:7)]: boom 1\n"
        );
        assert_eq!(
            record(Level::Warn, format_args!("w")),
            "[HAMI-core Warn(42:139872001:src/x.rs:7)]: w\n"
        );
        assert_eq!(
            record(Level::Msg, format_args!("Initializing.....")),
            "[HAMI-core Msg(42:139872001:src/x.rs:7)]: Initializing.....\n"
        );
        assert_eq!(
            record(Level::Info, format_args!("i")),
            "[HAMI-core Info(42:139872001:src/x.rs:7)]: i\n"
        );
        assert_eq!(
            record(Level::Debug, format_args!("d")),
            "[HAMI-core Debug(42:139872001:src/x.rs:7)]: d\n"
        );
    }

    #[test]
    fn long_records_are_cut_to_one_line() {
        let long = "é".repeat(600);
        let r = record(Level::Warn, format_args!("{long}\nsecond"));
        assert_eq!(r.len(), r.trim_end_matches('\n').len() + 1);
        assert!(r.len() <= RECORD_MAX);
        assert!(r.ends_with("...\n"));
        assert_eq!(r.matches('\n').count(), 1);
        let r = record(Level::Warn, format_args!("a\nb"));
        assert!(r.ends_with("]: a b\n"));
    }

    #[test]
    fn thresholds() {
        assert_eq!(level_from_value(None), Some(2));
        assert_eq!(level_from_value(Some("0")), Some(0));
        assert_eq!(level_from_value(Some(" 4 ")), Some(4));
        assert_eq!(level_from_value(Some("9")), Some(4));
        assert_eq!(level_from_value(Some("-1")), Some(0));
        assert_eq!(level_from_value(Some("debug")), None);
        assert_eq!(level_from_value(Some("")), None);
        let shows = |lvl: i32, k: Level| lvl >= k.threshold();
        assert!(shows(0, Level::Error) && !shows(1, Level::Warn));
        assert!(shows(2, Level::Warn) && shows(2, Level::Msg) && !shows(2, Level::Info));
        assert!(shows(3, Level::Info) && !shows(3, Level::Debug) && shows(4, Level::Debug));
    }

    #[test]
    fn once_is_first_once_per_kind() {
        static A: Once = Once::new();
        static B: Once = Once::new();
        assert!(A.first());
        assert!(!A.first() && !A.first());
        assert!(B.first(), "another kind is its own");
    }

    #[test]
    fn emit_does_not_panic() {
        set_level(4);
        log_debug!("debug line from the test, {}", 1);
        log_error!("error line from the test");
        assert_eq!(level(), 4);
    }
}
