//! The Linux platform against real processes (fork), real files and real record locks.
//!
//! Every test takes one process-wide mutex: the tests fork, and a fork while another test thread
//! is in the middle of something (holding a pipe's write end, a record lock, a stdio lock) makes
//! children inherit it. Children do only simple system calls and leave with `_exit`.

use std::fs::{self, File, OpenOptions};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use hami_linux::platform::{proc_id_of, LinuxPlatform, WINDOW_BYTE, WINDOW_OFFSET};
use hami_shm::layout::{RawSem, SharedRegion};
use hami_shm::platform::{Liveness, Platform, Problem, ProcId, SemWait};

const SIZE: usize = SharedRegion::SIZE;
const MS: u64 = 1_000_000;

// ---------------------------------------------------------------------------------------------
// Helpers: serialisation, temp dirs, fork, pipes.

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = std::env::temp_dir().join(format!(
            "hami-{tag}-{}-{}-{nanos}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_dir(&dir).expect("create temp dir");
        TempDir(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A region-sized file opened read-write, for the record-lock tests.
fn lock_file(dir: &TempDir) -> File {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(dir.path().join("region"))
        .expect("open lock file");
    f.set_len(SIZE as u64 + 1).expect("size lock file");
    f
}

/// Forks; the child runs `child` and `_exit`s with its result (101 if it panicked).
fn fork(child: impl FnOnce() -> i32) -> libc::pid_t {
    // SAFETY: fork has no memory-safety preconditions; the child only runs `child` (simple
    // system calls) and leaves with `_exit`, never returning into the test harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)).unwrap_or(101);
        // SAFETY: ends the child without running the parent's atexit handlers or destructors.
        unsafe { libc::_exit(code) };
    }
    pid
}

/// Reaps `pid`; its exit code, or 128 + the signal that killed it.
fn reap(pid: libc::pid_t) -> i32 {
    let mut status = 0;
    loop {
        // SAFETY: `status` is a valid int to write.
        let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
        if rc == pid {
            break;
        }
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EINTR),
            "waitpid"
        );
    }
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        128 + libc::WTERMSIG(status)
    }
}

fn kill_and_reap(pid: libc::pid_t) -> i32 {
    // SAFETY: `pid` is our own child, not yet reaped.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    reap(pid)
}

/// Sleeps forever (until killed); for children that hold something.
fn park() -> ! {
    loop {
        // SAFETY: pause has no preconditions.
        unsafe { libc::pause() };
    }
}

struct Pipe {
    r: OwnedFd,
    w: OwnedFd,
}

fn pipe() -> Pipe {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: the read end was just created and is owned by nothing else.
    let r = unsafe { OwnedFd::from_raw_fd(fds[0]) };
    // SAFETY: likewise the write end.
    let w = unsafe { OwnedFd::from_raw_fd(fds[1]) };
    Pipe { r, w }
}

/// Child side: says "ready".
fn notify(w: RawFd) {
    let b = [1u8];
    // SAFETY: writes one byte from `b`.
    unsafe { libc::write(w, b.as_ptr().cast(), 1) };
}

/// Parent side: waits (bounded) for the child's "ready".
fn wait_ready(r: &OwnedFd) -> bool {
    let mut pfd = libc::pollfd {
        fd: r.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut pfd, 1, 10_000) };
    if n != 1 {
        return false;
    }
    let mut b = [0u8];
    // SAFETY: reads one byte into `b`.
    unsafe { libc::read(r.as_raw_fd(), b.as_mut_ptr().cast(), 1) == 1 }
}

/// A page of MAP_SHARED anonymous memory (shared with forked children) holding a `RawSem`.
struct SharedPage(*mut libc::c_void);

impl SharedPage {
    fn new() -> SharedPage {
        // SAFETY: a new anonymous shared mapping; checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        SharedPage(p)
    }

    fn sem(&self) -> &RawSem {
        // SAFETY: the page is zeroed, page-aligned (> align 8), 4096 >= 32 bytes, lives as long
        // as `self`; RawSem is atomics, so shared references to shared memory are sound.
        unsafe { &*(self.0 as *const RawSem) }
    }
}

impl Drop for SharedPage {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`; no reference from `sem` outlives `self`.
        unsafe { libc::munmap(self.0, 4096) };
    }
}

fn my_pid() -> i32 {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() }
}

fn platform() -> LinuxPlatform {
    LinuxPlatform::new(-1, SIZE)
}

// ---------------------------------------------------------------------------------------------
// Identity and liveness.

#[test]
fn self_is_alive_and_identity_is_cached() {
    let _g = serial();
    let p = platform();
    let me = p.self_id();
    assert_eq!(me.pid(), my_pid());
    assert_ne!(
        me.tag(),
        0,
        "/proc/self/stat is readable here, so we carry a start tag"
    );
    assert_eq!(p.self_id(), me);
    assert_eq!(proc_id_of(my_pid()), Some(me));
    p.refresh_identity();
    assert_eq!(
        p.self_id(),
        me,
        "refresh in the same process changes nothing"
    );
    assert_eq!(p.liveness(me), Liveness::Alive);
    assert_eq!(
        p.liveness(ProcId::new(my_pid(), 0)),
        Liveness::Alive,
        "tag 0: by pid only"
    );
}

#[test]
fn own_pid_with_another_tag_is_dead() {
    let _g = serial();
    let p = platform();
    let me = p.self_id();
    // A previous incarnation of our pid (bug B13): same pid, other start time.
    let older = ProcId::new(
        me.pid(),
        ProcId::start_tag(u64::from(me.tag() & 0x7fff_ffff) + 1),
    );
    assert_ne!(older.tag(), me.tag());
    assert_eq!(p.liveness(older), Liveness::Dead);
    assert_eq!(
        p.liveness(ProcId::new(me.pid(), me.tag() ^ 1)),
        Liveness::Dead
    );
}

#[test]
fn nonpositive_pids_are_dead() {
    let _g = serial();
    let p = platform();
    assert_eq!(p.liveness(ProcId::NONE), Liveness::Dead);
    assert_eq!(
        p.liveness(ProcId::new(0, ProcId::start_tag(5))),
        Liveness::Dead
    );
    assert_eq!(p.liveness(ProcId::new(-1, 0)), Liveness::Dead);
    assert_eq!(p.liveness(ProcId::new(i32::MIN, 0)), Liveness::Dead);
    assert_eq!(proc_id_of(0), None);
    assert_eq!(proc_id_of(-7), None);
}

#[test]
fn reaped_child_is_dead() {
    let _g = serial();
    let p = platform();
    let child = fork(|| 0);
    assert_eq!(reap(child), 0);
    assert_eq!(p.liveness(ProcId::new(child, 0)), Liveness::Dead);
    assert_eq!(
        p.liveness(ProcId::new(child, ProcId::start_tag(1))),
        Liveness::Dead
    );
    assert_eq!(proc_id_of(child), None);
}

#[test]
fn zombie_is_dead() {
    let _g = serial();
    let p = platform();
    let child = fork(|| 0);
    // Wait for the exit without reaping it (WNOWAIT): the child stays a zombie.
    // SAFETY: an all-zero siginfo_t is a valid buffer for waitid to fill.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is valid to write; `child` is our unreaped child.
    let rc = unsafe {
        libc::waitid(
            libc::P_PID,
            child as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOWAIT,
        )
    };
    assert_eq!(rc, 0);
    let stat = fs::read_to_string(format!("/proc/{child}/stat")).expect("zombie's stat");
    assert!(stat.contains(") Z "), "not a zombie: {stat}");
    assert_eq!(p.liveness(ProcId::new(child, 0)), Liveness::Dead);
    assert_eq!(proc_id_of(child), None);
    assert_eq!(reap(child), 0);
}

#[test]
fn live_child_is_alive_and_a_wrong_tag_is_dead() {
    let _g = serial();
    let p = platform();
    let child = fork(|| park());
    let id = proc_id_of(child).expect("child runs");
    assert_eq!(id.pid(), child);
    assert_ne!(id.tag(), 0);
    assert_eq!(p.liveness(id), Liveness::Alive);
    assert_eq!(p.liveness(ProcId::new(child, 0)), Liveness::Alive);
    // Same pid, another start time: the pid was reused by someone else.
    assert_eq!(p.liveness(ProcId::new(child, id.tag() ^ 1)), Liveness::Dead);
    assert_eq!(kill_and_reap(child), 128 + libc::SIGKILL);
    assert_eq!(p.liveness(id), Liveness::Dead);
}

#[test]
fn start_tag_is_stable_and_differs_between_children() {
    let _g = serial();
    let a = fork(|| park());
    // The start time counts clock ticks (10 ms at USER_HZ 100): let one pass.
    std::thread::sleep(Duration::from_millis(40));
    let b = fork(|| park());
    let ida = proc_id_of(a).expect("a runs");
    let idb = proc_id_of(b).expect("b runs");
    assert_eq!(proc_id_of(a), Some(ida));
    assert_eq!(proc_id_of(b), Some(idb));
    assert_ne!(ida.tag(), idb.tag());
    kill_and_reap(a);
    kill_and_reap(b);
}

#[test]
fn refresh_identity_after_fork_gives_the_child_its_own_id() {
    let _g = serial();
    let p = platform();
    let parent = p.self_id();
    let child = fork(|| {
        if p.self_id() != parent {
            return 1;
        }
        p.refresh_identity();
        let me = p.self_id();
        if me.pid() != my_pid() || me == parent || me.tag() == 0 {
            return 2;
        }
        // The parent is now checked through /proc, with its tag.
        if p.liveness(parent) != Liveness::Alive {
            return 3;
        }
        0
    });
    assert_eq!(reap(child), 0);
}

#[test]
fn unreadable_proc_is_unknown_not_dead() {
    let _g = serial();
    let p = platform();
    let child = fork(|| {
        p.refresh_identity();
        // No descriptor may be opened any more: /proc cannot be read (EMFILE).
        let none = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: a valid rlimit.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &none) } != 0 {
            return 1;
        }
        // SAFETY: getppid has no preconditions.
        let parent = unsafe { libc::getppid() };
        match p.liveness(ProcId::new(parent, 0)) {
            Liveness::Unknown => 0,
            Liveness::Alive => 2,
            Liveness::Dead => 3,
        }
    });
    assert_eq!(reap(child), 0);
}

// ---------------------------------------------------------------------------------------------
// Clocks and reports.

#[test]
fn clock_is_monotonic_and_sleep_sleeps() {
    let _g = serial();
    let p = platform();
    let t0 = p.now_ns();
    p.sleep_ns(20 * MS);
    let t1 = p.now_ns();
    assert!(t1 - t0 >= 20 * MS, "slept {} ns", t1 - t0);
    assert!(p.now_ns() >= t1);
    let t2 = hami_linux::platform::monotonic_ns();
    assert!(t2 >= t1);
    p.sleep_ns(0);
}

extern "C" fn ignore_signal(_: libc::c_int) {}

/// Installs a no-op SIGALRM handler without SA_RESTART and arms a one-shot timer (child only).
fn alarm_in(ms: i64) -> bool {
    // SAFETY: an all-zero sigaction is valid; the handler is a plain extern "C" fn.
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = ignore_signal as *const () as libc::sighandler_t;
    // SAFETY: valid sigaction pointers.
    if unsafe { libc::sigaction(libc::SIGALRM, &sa, std::ptr::null_mut()) } != 0 {
        return false;
    }
    let t = libc::itimerval {
        it_interval: libc::timeval {
            tv_sec: 0,
            tv_usec: 0,
        },
        it_value: libc::timeval {
            tv_sec: 0,
            tv_usec: (ms * 1000) as libc::suseconds_t,
        },
    };
    // SAFETY: a valid itimerval.
    unsafe { libc::setitimer(libc::ITIMER_REAL, &t, std::ptr::null_mut()) == 0 }
}

#[test]
fn sleep_resumes_after_a_signal() {
    let _g = serial();
    let p = platform();
    let child = fork(|| {
        if !alarm_in(10) {
            return 1;
        }
        let t0 = p.now_ns();
        p.sleep_ns(100 * MS);
        if p.now_ns() - t0 >= 100 * MS {
            0
        } else {
            2
        }
    });
    assert_eq!(reap(child), 0);
}

/// Runs `f` in a forked child whose stderr is a pipe; returns the child's exit status and what
/// it wrote there.
fn stderr_of(f: impl FnOnce() -> i32) -> (i32, String) {
    let out = pipe();
    let w = out.w.as_raw_fd();
    let child = fork(|| {
        // SAFETY: makes the pipe our stderr.
        if unsafe { libc::dup2(w, 2) } != 2 {
            return 1;
        }
        f()
    });
    drop(out.w);
    let mut text = String::new();
    use std::io::Read as _;
    File::from(out.r).read_to_string(&mut text).unwrap();
    (reap(child), text.replace(&format!("({child}:"), "(CHILD:"))
}

#[test]
fn each_problem_kind_is_reported_once() {
    let _g = serial();
    let p = platform();
    let (status, text) = stderr_of(|| {
        p.refresh_identity();
        p.report(Problem::StuckSeqlock { slot: 1 });
        p.report(Problem::StuckSeqlock { slot: 2 });
        p.report(Problem::LockStolen);
        p.report(Problem::LockStolen);
        p.report(Problem::Underflow { dev: 3 });
        0
    });
    assert_eq!(status, 0);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    for l in &lines {
        assert!(l.starts_with("[HAMI-core Warn(CHILD:"), "{l}");
    }
    assert!(lines[0].contains("slot 1"), "{}", lines[0]);
    assert!(lines[1].contains("recovered"), "{}", lines[1]);
    assert!(lines[2].contains("device 3"), "{}", lines[2]);
}

#[test]
fn problems_are_not_reported_below_the_warning_level() {
    let _g = serial();
    let p = platform();
    let (status, text) = stderr_of(|| {
        hami_linux::log::set_level(1);
        p.refresh_identity();
        p.report(Problem::LockStolen);
        0
    });
    assert_eq!(status, 0);
    assert_eq!(text, "", "LIBCUDA_LOG_LEVEL=1 means errors only");
}

// ---------------------------------------------------------------------------------------------
// Semaphores.

#[test]
fn semaphore_counts_times_out_and_wakes_across_processes() {
    let _g = serial();
    let p = platform();
    let page = SharedPage::new();
    let sem = page.sem();
    assert!(p.sem_init(sem, 1));
    assert_eq!(sem.glibc_private(), 0x80, "process-shared");
    assert_eq!(p.sem_value(sem), 1);
    assert_eq!(p.sem_wait(sem, 1_000 * MS), SemWait::Acquired);
    assert_eq!(p.sem_value(sem), 0);
    assert_eq!(
        p.sem_wait(sem, 0),
        SemWait::TimedOut,
        "zero timeout: one try"
    );

    let t0 = Instant::now();
    assert_eq!(p.sem_wait(sem, 50 * MS), SemWait::TimedOut);
    let waited = t0.elapsed();
    assert!(waited >= Duration::from_millis(40), "{waited:?}");
    assert!(waited < Duration::from_secs(5), "{waited:?}");

    // A post from another process wakes us.
    let child = fork(|| {
        p.sleep_ns(100 * MS);
        p.sem_post(sem);
        0
    });
    let t0 = Instant::now();
    assert_eq!(p.sem_wait(sem, 10_000 * MS), SemWait::Acquired);
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert_eq!(reap(child), 0);

    // And a post from us wakes another process.
    let child = fork(|| match p.sem_wait(sem, 10_000 * MS) {
        SemWait::Acquired => 0,
        SemWait::TimedOut => 1,
        SemWait::Failed => 2,
    });
    p.sleep_ns(50 * MS);
    p.sem_post(sem);
    assert_eq!(reap(child), 0);
    assert_eq!(p.sem_value(sem), 0);

    p.sem_post(sem);
    p.sem_post(sem);
    assert_eq!(p.sem_value(sem), 2);
}

#[test]
fn semaphore_wait_interrupted_by_a_signal_times_out() {
    let _g = serial();
    let p = platform();
    let page = SharedPage::new();
    let sem = page.sem();
    assert!(p.sem_init(sem, 0));
    let child = fork(|| {
        if !alarm_in(20) {
            return 1;
        }
        let t0 = p.now_ns();
        let r = p.sem_wait(sem, 5_000 * MS);
        match r {
            SemWait::TimedOut if p.now_ns() - t0 < 4_000 * MS => 0,
            SemWait::TimedOut => 2,
            _ => 3,
        }
    });
    assert_eq!(reap(child), 0);
}

// ---------------------------------------------------------------------------------------------
// The init lock.

#[test]
fn init_lock_excludes_another_process_until_released() {
    let _g = serial();
    let dir = TempDir::new("plat");
    let f = lock_file(&dir);
    let p = LinuxPlatform::new(f.as_raw_fd(), SIZE);
    assert!(p.init_lock(100 * MS));
    let child = fork(|| {
        let t0 = p.now_ns();
        let got = p.init_lock(50 * MS);
        if p.now_ns() - t0 > 5_000 * MS {
            return 2;
        }
        i32::from(got)
    });
    assert_eq!(reap(child), 0, "the child must not get the lock we hold");
    p.init_unlock();
    let child = fork(|| if p.init_lock(1_000 * MS) { 0 } else { 1 });
    assert_eq!(reap(child), 0, "released: the child gets it");
}

#[test]
fn init_lock_is_the_lock_c_peers_take_with_lockf() {
    let _g = serial();
    let dir = TempDir::new("plat");
    let f = lock_file(&dir);
    let fd = f.as_raw_fd();
    let p = LinuxPlatform::new(fd, SIZE);
    // We hold it: a C peer's lockf(F_TLOCK, size) at offset 0 fails.
    assert!(p.init_lock(100 * MS));
    let child = fork(|| {
        // SAFETY: a plain call on an inherited descriptor, no pointers.
        unsafe { libc::lseek(fd, 0, libc::SEEK_SET) };
        // SAFETY: as above.
        i32::from(unsafe { libc::lockf(fd, libc::F_TLOCK, SIZE as libc::off_t) } == 0)
    });
    assert_eq!(reap(child), 0);
    p.init_unlock();
    // A C peer holds it with lockf(F_LOCK, size): we time out.
    let ready = pipe();
    let w = ready.w.as_raw_fd();
    let child = fork(|| {
        // SAFETY: a plain call on an inherited descriptor, no pointers.
        unsafe { libc::lseek(fd, 0, libc::SEEK_SET) };
        // SAFETY: as above.
        let rc = unsafe { libc::lockf(fd, libc::F_LOCK, SIZE as libc::off_t) };
        if rc != 0 {
            return 1;
        }
        notify(w);
        park()
    });
    drop(ready.w);
    assert!(wait_ready(&ready.r));
    assert!(!p.init_lock(50 * MS));
    kill_and_reap(child);
    assert!(p.init_lock(1_000 * MS));
    p.init_unlock();
}

#[test]
fn init_lock_of_a_killed_holder_is_released_by_the_kernel() {
    let _g = serial();
    let dir = TempDir::new("plat");
    let f = lock_file(&dir);
    let p = LinuxPlatform::new(f.as_raw_fd(), SIZE);
    let ready = pipe();
    let w = ready.w.as_raw_fd();
    let child = fork(|| {
        if !p.init_lock(1_000 * MS) {
            return 1;
        }
        notify(w);
        park()
    });
    drop(ready.w);
    assert!(wait_ready(&ready.r), "child took the lock");
    assert!(!p.init_lock(20 * MS), "the child holds it");
    assert_eq!(kill_and_reap(child), 128 + libc::SIGKILL);
    assert!(
        p.init_lock(1_000 * MS),
        "the kernel released the dead holder's lock"
    );
    p.init_unlock();
}

// ---------------------------------------------------------------------------------------------
// The window.

#[test]
fn window_is_seen_only_from_another_process() {
    let _g = serial();
    let dir = TempDir::new("plat");
    let f = lock_file(&dir);
    let p = LinuxPlatform::new(f.as_raw_fd(), SIZE);
    assert_eq!(WINDOW_BYTE, SIZE as u64 + 64);
    assert_eq!(p.window_byte(), SIZE as u64 + WINDOW_OFFSET);

    assert!(!p.window_held_by_other());
    p.window_enter();
    assert!(!p.window_held_by_other(), "our own window is not another's");
    p.window_exit();

    let ready = pipe();
    let w = ready.w.as_raw_fd();
    let child = fork(|| {
        p.window_enter();
        notify(w);
        park()
    });
    drop(ready.w);
    assert!(wait_ready(&ready.r));
    assert!(p.window_held_by_other());
    // Two processes may be inside at once (read locks), and the window is not the init lock.
    p.window_enter();
    assert!(p.window_held_by_other());
    assert!(
        p.init_lock(50 * MS),
        "the window byte lies outside the init lock's range"
    );
    p.init_unlock();
    p.window_exit();
    assert!(p.window_held_by_other());

    assert_eq!(kill_and_reap(child), 128 + libc::SIGKILL);
    assert!(
        !p.window_held_by_other(),
        "the kernel released the dead process's window"
    );
}

#[test]
fn window_exit_in_another_process_ends_its_window() {
    let _g = serial();
    let dir = TempDir::new("plat");
    let f = lock_file(&dir);
    let p = LinuxPlatform::new(f.as_raw_fd(), SIZE);
    let ready = pipe();
    let w = ready.w.as_raw_fd();
    let child = fork(|| {
        p.window_enter();
        p.window_exit();
        notify(w);
        park()
    });
    drop(ready.w);
    assert!(wait_ready(&ready.r));
    assert!(!p.window_held_by_other());
    kill_and_reap(child);
}

#[test]
fn private_platform_needs_no_file() {
    let _g = serial();
    let p = LinuxPlatform::private();
    assert_eq!(p.fd(), -1);
    assert_eq!(p.self_id().pid(), my_pid());
    assert!(p.init_lock(0));
    p.init_unlock();
    p.window_enter();
    assert!(!p.window_held_by_other());
    p.window_exit();
}

#[test]
fn locks_on_a_bad_descriptor_fail_safe() {
    let _g = serial();
    let p = LinuxPlatform::new(-1, SIZE);
    assert!(!p.init_lock(10 * MS), "no lock without a file");
    p.init_unlock();
    p.window_enter();
    p.window_exit();
    assert!(
        p.window_held_by_other(),
        "unknown counts as held, so no token is taken over on a guess"
    );
}
