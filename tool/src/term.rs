//! The terminal of `top`: keys read as they are typed (no line buffering, no echo) so that `q`
//! quits at once, and SIGINT/SIGTERM/SIGHUP turned into a wake-up instead of a death, so that the
//! terminal settings and the cursor are always restored (by `Drop`).

use std::io::Write as _;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

/// The write end of the self-pipe that signal handlers wake `wait` through; -1 when none.
static WAKE_FD: AtomicI32 = AtomicI32::new(-1);

const SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

extern "C" fn on_signal(_: libc::c_int) {
    let fd = WAKE_FD.load(Ordering::Relaxed);
    if fd >= 0 {
        // SAFETY: write is async-signal-safe; one byte from a static to our pipe.
        unsafe { libc::write(fd, b"s".as_ptr().cast(), 1) };
    }
}

/// Why `wait` returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wake {
    /// The interval passed: draw the next frame.
    Tick,
    /// `q`, Ctrl-C or a signal: stop.
    Quit,
}

/// The terminal while `top` runs.
pub struct Session {
    /// stdin's settings before, where stdin is a terminal we changed.
    saved: Option<libc::termios>,
    /// Whether stdout is a terminal: frames then redraw in place.
    styled: bool,
    /// Whether stdin may still deliver keys (false after end of file).
    keys: bool,
    /// The self-pipe: read end, write end.
    pipe: [RawFd; 2],
    /// The signal dispositions we replaced.
    old: Vec<(libc::c_int, libc::sigaction)>,
    /// Frames shown so far.
    frames: u64,
}

fn is_tty(fd: RawFd) -> bool {
    // SAFETY: isatty only inspects the descriptor.
    unsafe { libc::isatty(fd) == 1 }
}

impl Session {
    /// Sets the terminal up. Nothing fails: without a pipe or a terminal, keys or signals are
    /// simply not seen (the default dispositions then stay).
    pub fn start() -> Session {
        let mut pipe = [-1; 2];
        // SAFETY: pipe2 writes two descriptors into the array we own.
        if unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            pipe = [-1, -1];
        }
        let mut old = Vec::new();
        if pipe[1] >= 0 {
            WAKE_FD.store(pipe[1], Ordering::Relaxed);
            for sig in SIGNALS {
                // SAFETY: all-zero bytes are a valid `sigaction` (integers, a handler, a mask).
                let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
                act.sa_sigaction = on_signal as *const () as usize;
                // SAFETY: `act.sa_mask` is a valid, writable `sigset_t` of ours.
                unsafe { libc::sigemptyset(&mut act.sa_mask) };
                // SAFETY: as for `act`, all-zero bytes are a valid `sigaction`.
                let mut prev: libc::sigaction = unsafe { std::mem::zeroed() };
                // SAFETY: `act` is filled in with a one-argument handler that only writes to a
                // pipe (async-signal-safe); `prev` is ours and writable.
                if unsafe { libc::sigaction(sig, &act, &mut prev) } == 0 {
                    old.push((sig, prev));
                }
            }
        }
        let saved = is_tty(0).then(|| {
            // SAFETY: tcgetattr fills the struct we own; a zeroed termios is a valid buffer.
            let mut t: libc::termios = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            if unsafe { libc::tcgetattr(0, &mut t) } != 0 {
                return None;
            }
            let mut raw = t;
            raw.c_lflag &= !(libc::ICANON | libc::ECHO);
            raw.c_cc[libc::VMIN] = 1;
            raw.c_cc[libc::VTIME] = 0;
            // SAFETY: sets stdin's attributes from a struct tcgetattr filled.
            (unsafe { libc::tcsetattr(0, libc::TCSANOW, &raw) } == 0).then_some(t)
        });
        let styled = is_tty(1);
        if styled {
            let _ = std::io::stdout().write_all(b"\x1b[?25l");
        }
        Session {
            saved: saved.flatten(),
            styled,
            keys: true,
            pipe,
            old,
            frames: 0,
        }
    }

    /// The terminal's rows, where stdout is one.
    pub fn height(&self) -> Option<usize> {
        if !self.styled {
            return None;
        }
        // SAFETY: a zeroed winsize is a valid buffer for TIOCGWINSZ to fill.
        let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
        // SAFETY: TIOCGWINSZ on stdout writes into `ws`.
        let ok = unsafe { libc::ioctl(1, libc::TIOCGWINSZ, &mut ws) } == 0;
        (ok && ws.ws_row > 0).then_some(usize::from(ws.ws_row))
    }

    /// Shows a frame: in place on a terminal (home, each line's rest erased, the rest of the
    /// screen erased), else after a blank line. An error means stdout is gone (a closed pipe).
    pub fn show(&mut self, frame: &str) -> std::io::Result<()> {
        let mut out = String::new();
        if self.styled {
            out.push_str("\x1b[H");
            for line in frame.lines() {
                out.push_str(line);
                out.push_str("\x1b[K\n");
            }
            out.push_str("\x1b[J");
        } else {
            if self.frames > 0 {
                out.push('\n');
            }
            out.push_str(frame);
        }
        self.frames += 1;
        let mut stdout = std::io::stdout().lock();
        stdout.write_all(out.as_bytes())?;
        stdout.flush()
    }

    /// Waits `interval` for `q`, Ctrl-C (a byte 3 where the terminal passes it) or a signal.
    pub fn wait(&mut self, interval: Duration) -> Wake {
        let end = Instant::now() + interval;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Wake::Tick;
            }
            let mut fds = [
                libc::pollfd {
                    fd: if self.keys { 0 } else { -1 },
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: self.pipe[0],
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            let ms = left.as_millis().clamp(1, i32::MAX as u128) as libc::c_int;
            // SAFETY: poll on two pollfd structs we own; negative fds are ignored.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
            if n <= 0 {
                continue; // timeout (checked above) or EINTR
            }
            if fds[1].revents != 0 {
                return Wake::Quit;
            }
            if fds[0].revents != 0 {
                let mut buf = [0u8; 64];
                // SAFETY: read into the buffer we own, at most its length.
                let got = unsafe { libc::read(0, buf.as_mut_ptr().cast(), buf.len()) };
                if got <= 0 {
                    self.keys = false; // end of file or an error: no more keys
                } else if buf[..got as usize]
                    .iter()
                    .any(|&b| matches!(b, b'q' | b'Q' | 3))
                {
                    return Wake::Quit;
                }
            }
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if self.styled {
            let _ = std::io::stdout().write_all(b"\x1b[?25h");
            let _ = std::io::stdout().flush();
        }
        if let Some(t) = &self.saved {
            // SAFETY: restores stdin's attributes as tcgetattr read them.
            unsafe { libc::tcsetattr(0, libc::TCSANOW, t) };
        }
        for (sig, prev) in &self.old {
            // SAFETY: puts back the disposition sigaction returned.
            unsafe { libc::sigaction(*sig, prev, std::ptr::null_mut()) };
        }
        WAKE_FD.store(-1, Ordering::Relaxed);
        for fd in self.pipe {
            if fd >= 0 {
                // SAFETY: our descriptors, closed once.
                unsafe { libc::close(fd) };
            }
        }
    }
}
