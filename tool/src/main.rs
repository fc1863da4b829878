//! shrreg-tool: inspect, check, repair and control a HAMi-core shared region file.
//!
//! Unlike upstream's tool, it maps the file read-only unless an action must write, never
//! registers itself as a slot (it never calls `runtime::get()`), never truncates the live file,
//! and never signals pid 0 (which `kill` would take for our own process group, bug B28). See
//! `--help` for the actions and exit statuses.

mod metrics;
mod term;
mod top;

use std::io::Read as _;
use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use hami_linux::config::{self, Config};
use hami_linux::platform::LinuxPlatform;
use hami_linux::region_file::{self, OpenMode, RegionFile, RegionFileError, Snapshot};
use hami_shm::init::{self, InitOutcome, InitParams};
use hami_shm::layout::{
    SharedProcSlot, SharedRegion, ABI_DEVS, ABI_SLOTS, STATUS_RUNNING, STATUS_SUSPENDED,
};
use hami_shm::lock::{self, LockConfig, LockError};
use hami_shm::platform::{Liveness, Platform, ProcId};
use hami_shm::slots;
use hami_shm::validate::{self, Verdict, HEADER_LEN};
use hami_tool::inspect::{self, FileInfo, Finding, Report, SemState};

const USAGE: &str = "\
usage: shrreg-tool [--file PATH] ACTION [--force]
       shrreg-tool [--file PATH] top [--interval SECS] [--iterations N]

Inspects, checks, repairs and controls the shared region that HAMi-core (libvgpu.so) processes
use to share a GPU memory limit. The file is mapped read-only except by --reap, --create-new and
(where processes of this library hold slots) --suspend/--resume, and the tool never registers
itself as a slot.

  --file PATH    the region file (default: CUDA_DEVICE_MEMORY_SHARED_CACHE from the environment
                 or /overrideEnv, else /tmp/cudevshr.cache)

actions (exactly one):
  --print        human table: layout, versions, limits, owner lock, every slot, findings
  --json         the same as one JSON object
  --metrics      the container's metrics in the Prometheus text format, with the names, help
                 texts and labels of HAMi's vGPUmonitor (hami_container_*, hami_vgpu_*; label
                 zone=\"vGPU\"), from the region as it is now. Labels the file cannot give are
                 empty: namespace and pod always; container unless the file's directory is
                 named <pod-uid>_<container> as HAMi names it on the node
  top            (also --top, --watch) a live view, redrawn every --interval seconds (default
                 1): per device the memory limit and usage, SM limit and utilisation; per
                 process pid, host pid, status and usage (the region keeps one last-kernel
                 time, not one per process). q or Ctrl-C quits; --iterations N stops after N
                 frames. Without a terminal, frames follow each other after a blank line
  --check        validate the file and report stale slots, a dead lock owner, odd seqlocks,
                 usage over the limit and garbage counters; exit status 0 healthy, 1 problems
  --version      library version, region layout version and size, the file's size and version
  --reap         take the owner lock and free the slots of dead processes (read-write)
  --suspend      set the status of this library's live processes to 2 (their launches and
                 allocations wait, up to 60 s per call), and send SIGUSR2 to every other slot's
                 live process that handles it (HAMi-core C peers, as upstream)
  --resume       status 1 likewise, and SIGUSR1
  --create-new   re-initialise the region in place with the limits of this environment
                 (CUDA_DEVICE_MEMORY_LIMIT, CUDA_DEVICE_SM_LIMIT, ...); refuses while a live
                 process holds a slot unless --force is given (their usage is then forgotten)
  --help         this text

Process liveness is judged in this tool's PID namespace: run it inside the container whose
processes use the file, or every verdict about a pid (and so --reap) is wrong.

exit status: 0 success (healthy for --check), 1 --check found problems, 2 error: the file cannot
be read, its layout is refused, or the action was refused.
";

/// Exit status of a problem-free run.
const EXIT_OK: u8 = 0;
/// Exit status of `--check` when it found problems.
const EXIT_PROBLEMS: u8 = 1;
/// Exit status of an error (unreadable file, refused layout, refused action, bad arguments).
const EXIT_ERROR: u8 = 2;

/// How long `--reap` and `--create-new` wait for the owner lock and the init lock.
const LOCK_DEADLINE_NS: u64 = 10_000_000_000;
/// Pause before the second snapshot that confirms transient findings.
const CONFIRM_DELAY_MS: u64 = 200;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    Print,
    Json,
    Metrics,
    Top,
    Check,
    Version,
    Reap,
    Suspend,
    Resume,
    CreateNew,
    Help,
}

#[derive(Debug)]
struct Args {
    action: Action,
    file: Option<PathBuf>,
    force: bool,
    /// `top`'s refresh interval.
    interval: Option<Duration>,
    /// `top`'s number of frames (unbounded without).
    iterations: Option<u64>,
}

/// The value of option `name` (`what` names it in the error): `--name=VALUE` in `arg`, or the
/// next argument; `None` if `arg` is another argument.
fn value_of(
    (name, what): (&str, &str),
    arg: &str,
    argv: &mut impl Iterator<Item = String>,
) -> Option<Result<String, String>> {
    let v = if arg == name {
        argv.next()
    } else {
        Some(arg.strip_prefix(name)?.strip_prefix('=')?.to_owned())
    };
    Some(match v {
        Some(v) if !v.is_empty() => Ok(v),
        _ => Err(format!("{name} needs {what}")),
    })
}

fn parse_args(mut argv: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut action = None;
    let mut file = None;
    let mut force = false;
    let (mut interval, mut iterations) = (None, None);
    while let Some(arg) = argv.next() {
        if let Some(path) = value_of(("--file", "a path"), &arg, &mut argv) {
            file = Some(PathBuf::from(path?));
            continue;
        }
        if let Some(v) = value_of(("--interval", "seconds"), &arg, &mut argv) {
            let secs = v?
                .parse::<f64>()
                .ok()
                .filter(|s| (0.05..=3600.0).contains(s))
                .ok_or("--interval needs seconds between 0.05 and 3600")?;
            interval = Some(Duration::from_secs_f64(secs));
            continue;
        }
        if let Some(v) = value_of(("--iterations", "a number"), &arg, &mut argv) {
            let n = v?
                .parse::<u64>()
                .ok()
                .filter(|&n| n > 0)
                .ok_or("--iterations needs a whole number above 0")?;
            iterations = Some(n);
            continue;
        }
        let a = match arg.as_str() {
            "--print" => Action::Print,
            "--json" => Action::Json,
            "--metrics" => Action::Metrics,
            "top" | "--top" | "--watch" => Action::Top,
            "--check" => Action::Check,
            "--version" => Action::Version,
            "--reap" => Action::Reap,
            "--suspend" => Action::Suspend,
            "--resume" => Action::Resume,
            "--create-new" | "--create_new" => Action::CreateNew,
            "--help" | "-h" => Action::Help,
            "--force" => {
                force = true;
                continue;
            }
            other => return Err(format!("unknown argument {other:?}")),
        };
        if action.is_some_and(|prev| prev != a) {
            return Err(format!("{arg}: give exactly one action"));
        }
        action = Some(a);
    }
    let action = action.ok_or("no action given")?;
    if force && action != Action::CreateNew {
        return Err("--force only applies to --create-new".into());
    }
    if (interval.is_some() || iterations.is_some()) && action != Action::Top {
        return Err("--interval and --iterations only apply to top".into());
    }
    Ok(Args {
        action,
        file,
        force,
        interval,
        iterations,
    })
}

/// A failure: one line for stderr, exit status 2.
struct Fail(String);

impl From<String> for Fail {
    fn from(s: String) -> Self {
        Fail(s)
    }
}

fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(why) => {
            eprintln!("shrreg-tool: {why}; see shrreg-tool --help");
            return ExitCode::from(EXIT_ERROR);
        }
    };
    if args.action == Action::Help {
        print!("{USAGE}");
        return ExitCode::from(EXIT_OK);
    }
    let path = args.file.clone().unwrap_or_else(default_path);
    let result = match args.action {
        Action::Print | Action::Json | Action::Check => inspect_cmd(&path, args.action),
        Action::Metrics => metrics_cmd(&path),
        Action::Top => top_cmd(&path, args.interval, args.iterations),
        Action::Version => Ok(version_cmd(&path)),
        Action::Reap => reap_cmd(&path),
        Action::Suspend => signal_cmd(&path, libc::SIGUSR2, "SIGUSR2"),
        Action::Resume => signal_cmd(&path, libc::SIGUSR1, "SIGUSR1"),
        Action::CreateNew => create_new_cmd(&path, args.force),
        Action::Help => unreachable!(),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(Fail(msg)) => {
            eprintln!("shrreg-tool: {msg}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}

/// The file libvgpu would use: `CUDA_DEVICE_MEMORY_SHARED_CACHE` from the environment or
/// `/overrideEnv`, else the default.
fn default_path() -> PathBuf {
    Config::from_process_env().0.cache_path
}

fn tool_pid() -> i32 {
    // SAFETY: getpid has no preconditions and cannot fail.
    unsafe { libc::getpid() }
}

/// What the path holds before anything maps it.
enum Found {
    /// An empty regular file: never initialised.
    Empty,
    /// Something to open (or an error region_file will name).
    Other,
}

fn look(path: &Path) -> Result<Found, Fail> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_file() && m.len() == 0 => Ok(Found::Empty),
        Ok(m) if m.file_type().is_block_device() || m.file_type().is_char_device() => {
            Err(Fail(format!(
                "{}: is a device, not a region file; point --file at the region",
                path.display()
            )))
        }
        Ok(_) => Ok(Found::Other),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Fail(format!(
            "{}: no such file: no process has created the shared region yet, or the path is \
             wrong; give it with --file or CUDA_DEVICE_MEMORY_SHARED_CACHE",
            path.display()
        ))),
        Err(e) => Err(Fail(format!(
            "{}: cannot inspect the file ({e}); check the path and its permissions",
            path.display()
        ))),
    }
}

fn open_error(e: RegionFileError, mode: OpenMode) -> Fail {
    if let RegionFileError::Denied { errno, .. } = e {
        let what = match mode {
            OpenMode::ReadOnly => "reading",
            OpenMode::ReadWrite => "writing",
        };
        // The library's line says what the file's mode and owner are; the tool's fix differs.
        return Fail(format!(
            "{e} (for this tool: {}: permission denied {what} the shared region; run as the \
             file's owner or as root)",
            std::io::Error::from_raw_os_error(errno)
        ));
    }
    Fail(e.to_string())
}

/// A report of the region at `path` as it is now, taken from a private copy (nothing the
/// file's owners do, truncating it included, can fault the tool).
fn report_now(path: &Path) -> Result<Report, Fail> {
    let (copy, info) = copy_of(path)?;
    let platform = LinuxPlatform::private();
    let live = |id: ProcId| platform.liveness(id);
    let mut r = inspect::snapshot(copy.region(), info, &live, tool_pid());
    r.ext = copy.ext().map(inspect::ext_snapshot);
    Ok(r)
}

/// Takes a report of the region, confirming transient findings on a second snapshot.
fn report_of(path: &Path) -> Result<(Report, Vec<Finding>), Fail> {
    let first = report_now(path)?;
    let found = inspect::findings(&first);
    if !found.iter().any(Finding::transient) {
        return Ok((first, found));
    }
    std::thread::sleep(Duration::from_millis(CONFIRM_DELAY_MS));
    let second = report_now(path)?;
    let again = inspect::findings(&second);
    Ok((second, inspect::confirm(&found, again)))
}

/// Now, in epoch seconds (0 on a clock before 1970).
fn epoch_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

fn metrics_cmd(path: &Path) -> Result<u8, Fail> {
    let report = report_now(path)?;
    print!(
        "{}",
        metrics::render(&report, &metrics::container_of(path), epoch_now())
    );
    Ok(EXIT_OK)
}

/// `top`: frames until `q`, a signal or `iterations`. A file that cannot be read (removed,
/// truncated, being rewritten) gives a frame that says so, and the next frame tries again; only
/// a file unreadable at the start is an error.
fn top_cmd(path: &Path, interval: Option<Duration>, iterations: Option<u64>) -> Result<u8, Fail> {
    let interval = interval.unwrap_or(Duration::from_secs(1));
    let mut reading = Ok(report_now(path)?);
    let shown = path.display().to_string();
    let mut session = term::Session::start();
    for n in 1.. {
        let frame = top::frame(
            &shown,
            reading.as_ref().map_err(|Fail(why)| why.as_str()),
            epoch_now(),
            interval.as_secs_f64(),
            session.height(),
        );
        if session.show(&frame).is_err()
            || iterations.is_some_and(|max| n >= max)
            || session.wait(interval) == term::Wake::Quit
        {
            break;
        }
        reading = report_now(path);
    }
    Ok(EXIT_OK)
}

/// A private copy of the region file at `path` (see `region_file::snapshot`), or of the zeroed
/// region an empty file will become.
fn copy_of(path: &Path) -> Result<(Snapshot, FileInfo), Fail> {
    let shown = path.display().to_string();
    if let Found::Empty = look(path)? {
        let info = FileInfo {
            path: shown,
            len: 0,
            verdict: Verdict::Fresh,
        };
        return Ok((Snapshot::zeroed(), info));
    }
    let snap = region_file::snapshot(path).map_err(|e| open_error(e, OpenMode::ReadOnly))?;
    let info = FileInfo {
        path: shown,
        len: snap.file_len(),
        verdict: snap.verdict(),
    };
    Ok((snap, info))
}

fn inspect_cmd(path: &Path, action: Action) -> Result<u8, Fail> {
    let shown = path.display().to_string();
    let (report, findings) = report_of(path)?;
    let problems = inspect::has_problems(&findings);
    match action {
        Action::Print => print!("{}", inspect::render_text(&report, &findings)),
        Action::Json => print!("{}", inspect::render_json(&report, &findings)),
        _ => {
            for f in &findings {
                let sev = match f.severity() {
                    inspect::Severity::Problem => "PROBLEM",
                    inspect::Severity::Note => "note",
                };
                println!("{sev}: {f}");
            }
            let n = findings
                .iter()
                .filter(|f| f.severity() == inspect::Severity::Problem)
                .count();
            if problems {
                println!(
                    "{shown}: {n} problem{} found (layout {})",
                    if n == 1 { "" } else { "s" },
                    inspect::verdict_text(report.file.verdict)
                );
            } else {
                println!(
                    "{shown}: healthy (layout {}, {} slot{} in use)",
                    inspect::verdict_text(report.file.verdict),
                    report.slots.iter().filter(|s| s.pid != 0).count(),
                    if report.slots.iter().filter(|s| s.pid != 0).count() == 1 {
                        ""
                    } else {
                        "s"
                    }
                );
            }
        }
    }
    Ok(if action == Action::Check && problems {
        EXIT_PROBLEMS
    } else {
        EXIT_OK
    })
}

fn version_cmd(path: &Path) -> u8 {
    println!("shrreg-tool {} (hami-vgpu)", env!("CARGO_PKG_VERSION"));
    println!(
        "region layout {} (HAMi-core v1.2; v1.1 files of the pre-PR155 layout are read too)",
        inspect::layout_version()
    );
    println!(
        "region size {} bytes, file size {} bytes, {} slots, {} devices",
        SharedRegion::SIZE,
        SharedRegion::SIZE + 1,
        ABI_SLOTS,
        ABI_DEVS
    );
    let shown = path.display();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path);
    let mut file = match file {
        Ok(f) => f,
        Err(e) => {
            println!("file {shown}: cannot open ({e})");
            return EXIT_OK;
        }
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut header = Vec::with_capacity(HEADER_LEN);
    let _ = (&mut file).take(HEADER_LEN as u64).read_to_end(&mut header);
    let version = if header.len() >= 12 {
        let word =
            |o: usize| u32::from_le_bytes([header[o], header[o + 1], header[o + 2], header[o + 3]]);
        format!("version {}.{}", word(4), word(8))
    } else {
        "no version (too short)".to_owned()
    };
    match validate::classify(&header, len, SharedRegion::SIZE) {
        Ok(v) => println!(
            "file {shown}: {len} bytes, {version} ({})",
            inspect::verdict_name(v)
        ),
        Err(refusal) => println!("file {shown}: {len} bytes, {version}, refused: {refusal}"),
    }
    EXIT_OK
}

/// Opens the file read-write for an action that must write, refusing layouts that are not
/// initialised (nothing to act on) or refused by validation.
fn open_rw(path: &Path) -> Result<RegionFile, Fail> {
    region_file::open(path, OpenMode::ReadWrite).map_err(|e| open_error(e, OpenMode::ReadWrite))
}

fn reap_cmd(path: &Path) -> Result<u8, Fail> {
    let shown = path.display().to_string();
    if let Found::Empty = look(path)? {
        println!("{shown}: the region is not initialised (empty file); nothing to reap");
        return Ok(EXIT_OK);
    }
    let file = open_rw(path)?;
    let region = file.region();
    match file.verdict() {
        Verdict::Fresh => {
            println!("{shown}: the region is not initialised; nothing to reap");
            return Ok(EXIT_OK);
        }
        Verdict::InitInterrupted => {
            return Err(Fail(format!(
                "{shown}: the region's initialisation was interrupted, so its lock cannot be \
                 trusted; stop the container's GPU processes and run shrreg-tool --create-new"
            )))
        }
        Verdict::Ready | Verdict::LegacyV11 => {}
    }
    let sem = SemState::read(region.sem());
    if !sem.shared() {
        return Err(Fail(format!(
            "{shown}: the owner lock's semaphore is not process-shared (private word {:#x}); \
             stop the container's GPU processes and run shrreg-tool --create-new",
            sem.private
        )));
    }
    let platform = LinuxPlatform::new(file.fd(), SharedRegion::SIZE);
    let owner_before = region.owner();
    let owner_was_dead =
        owner_before.pid() > 0 && platform.liveness(owner_before) == Liveness::Dead;
    let before: Vec<ProcId> = region.live_range().iter().map(slots::slot_owner).collect();
    let leftovers_before = region
        .live_range()
        .iter()
        .filter(|s| s.pid() == 0 && s.has_recorded_usage())
        .count();
    let cfg = LockConfig {
        deadline_ns: LOCK_DEADLINE_NS,
        ..LockConfig::default()
    };
    let guard =
        lock::acquire(region, &platform, &cfg).map_err(|e| lock_error(&shown, region, e))?;
    let mut freed = 0;
    // Each call frees at most REAP_BATCH slots; the bound keeps a pathological table finite.
    for _ in 0..=ABI_SLOTS / slots::REAP_BATCH + 1 {
        let n = slots::reap(region, &platform, &guard);
        freed += n;
        if n == 0 {
            break;
        }
    }
    guard.release();
    let pids: Vec<String> = region
        .live_range()
        .iter()
        .zip(&before)
        .filter(|(s, was)| was.pid() != 0 && s.pid() == 0)
        .map(|(_, was)| was.pid().to_string())
        .collect();
    if owner_was_dead {
        println!(
            "{shown}: recovered the owner lock from dead pid {}",
            owner_before.pid()
        );
    }
    if freed == 0 {
        println!("{shown}: reaped 0 slots: no slot belongs to a dead process");
    } else {
        println!(
            "{shown}: reaped {freed} slot{} of dead processes (pids {}); their usage is zeroed",
            if freed == 1 { "" } else { "s" },
            pids.join(", ")
        );
    }
    if leftovers_before > 0 {
        println!(
            "{shown}: zeroed the usage left in {leftovers_before} free slot{}",
            if leftovers_before == 1 { "" } else { "s" }
        );
    }
    Ok(EXIT_OK)
}

fn lock_error(shown: &str, region: &SharedRegion, e: LockError) -> Fail {
    match e {
        LockError::Timeout => {
            let owner = region.owner();
            let holder = if owner.pid() > 0 {
                format!("pid {}", owner.pid())
            } else {
                "a process that has not recorded itself".to_owned()
            };
            Fail(format!(
                "{shown}: the owner lock stayed held by {holder} for {} s; try again, or find \
                 that process (it may be stopped or hung)",
                LOCK_DEADLINE_NS / 1_000_000_000
            ))
        }
        LockError::SemFailed => Fail(format!(
            "{shown}: the owner lock's semaphore is unusable (sem_wait failed); stop the \
             container's GPU processes and run shrreg-tool --create-new"
        )),
    }
}

/// How a process reacts to `sig`, from `/proc/<pid>/status`.
enum Disposition {
    Caught,
    Ignored,
    Default,
    Unknown,
}

fn disposition(pid: i32, sig: libc::c_int) -> Disposition {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return Disposition::Unknown;
    };
    let mask = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
    };
    let bit = 1u64 << (sig - 1);
    match (mask("SigCgt:"), mask("SigIgn:")) {
        (Some(c), _) if c & bit != 0 => Disposition::Caught,
        (_, Some(i)) if i & bit != 0 => Disposition::Ignored,
        (Some(_), Some(_)) => Disposition::Default,
        _ => Disposition::Unknown,
    }
}

/// A process pinned by a pidfd, so the pid cannot be reused between checking and signalling.
struct PidFd(libc::c_int);

impl PidFd {
    /// `None` where the kernel has no pidfd_open (before 5.3); the caller then uses `kill`.
    fn open(pid: i32) -> Result<Option<PidFd>, i32> {
        // SAFETY: pidfd_open takes a pid and flags and returns a descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd >= 0 {
            return Ok(Some(PidFd(fd as libc::c_int)));
        }
        match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::ENOSYS) => Ok(None),
            Some(e) => Err(e),
            None => Err(libc::EIO),
        }
    }

    fn signal(&self, sig: libc::c_int) -> Result<(), i32> {
        // SAFETY: pidfd_send_signal with our descriptor, a signal number, no siginfo, flags 0.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.0,
                sig,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO))
        }
    }
}

impl Drop for PidFd {
    fn drop(&mut self) {
        // SAFETY: our descriptor, closed once.
        unsafe { libc::close(self.0) };
    }
}

/// Signals one slot's process if it is safe: returns what happened, as a line's tail.
fn signal_one(
    platform: &LinuxPlatform,
    id: ProcId,
    sig: libc::c_int,
    name: &str,
) -> Result<String, String> {
    let pid = id.pid();
    // Pin the process first, so that every check below is about the process we signal.
    let pinned = match PidFd::open(pid) {
        Ok(p) => p,
        Err(libc::ESRCH) => return Ok("skipped: dead in this PID namespace".into()),
        Err(e) => {
            return Err(format!(
                "cannot open pid {pid} ({})",
                std::io::Error::from_raw_os_error(e)
            ))
        }
    };
    match platform.liveness(id) {
        Liveness::Alive => {}
        Liveness::Dead => {
            return Ok("skipped: dead in this PID namespace (or its pid was reused)".into())
        }
        Liveness::Unknown => {
            return Ok("skipped: cannot tell whether it runs (/proc unreadable)".into())
        }
    }
    match disposition(pid, sig) {
        Disposition::Caught => {}
        Disposition::Ignored => return Ok(format!("skipped: it ignores {name}")),
        Disposition::Default => {
            return Ok(format!(
                "skipped: it does not handle {name}, whose default action would terminate it"
            ))
        }
        Disposition::Unknown => {
            return Ok(format!(
                "skipped: cannot read whether it handles {name} (/proc/{pid}/status)"
            ))
        }
    }
    let sent = match &pinned {
        Some(p) => p.signal(sig),
        None => {
            // SAFETY: kill with a positive pid (checked by the caller) signals that process only.
            if unsafe { libc::kill(pid, sig) } == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EIO))
            }
        }
    };
    match sent {
        Ok(()) => Ok(format!("sent {name}")),
        Err(libc::ESRCH) => Ok("skipped: it exited just now".into()),
        Err(e) => Err(format!(
            "cannot send {name} to pid {pid} ({})",
            std::io::Error::from_raw_os_error(e)
        )),
    }
}

fn signal_cmd(path: &Path, sig: libc::c_int, name: &str) -> Result<u8, Fail> {
    let shown = path.display().to_string();
    // A private copy: a file truncated meanwhile cannot fault the tool, and the pids read are
    // pinned (pidfd) and checked again before each signal anyway.
    let (snap, _) = copy_of(path)?;
    let region = snap.region();
    let platform = LinuxPlatform::private();
    if snap.verdict() == Verdict::Fresh {
        println!("{shown}: the region is not initialised; no process to signal");
        return Ok(EXIT_OK);
    }
    let me = tool_pid();
    let (mut sent, mut free, mut failed) = (0usize, 0usize, 0usize);
    for (i, slot) in region.live_range().iter().enumerate() {
        let id = slots::slot_owner(slot);
        let pid = id.pid();
        let outcome = if pid == 0 {
            free += 1;
            continue;
        } else if pid < 0 {
            Ok("skipped: negative pid (garbage)".to_owned())
        } else if pid == me {
            Ok("skipped: that is this tool".to_owned())
        } else {
            signal_one(&platform, id, sig, name)
        };
        match outcome {
            Ok(text) => {
                if text.starts_with("sent") {
                    sent += 1;
                }
                println!("slot {i}: pid {pid}: {text}");
            }
            Err(text) => {
                failed += 1;
                println!("slot {i}: pid {pid}: FAILED: {text}");
            }
        }
    }
    if free > 0 {
        println!(
            "skipped {free} free slot{} (pid 0: never signalled, kill(0) would hit this tool's \
             own process group)",
            if free == 1 { "" } else { "s" }
        );
    }
    println!(
        "{shown}: sent {name} to {sent} process{}; processes that handle it (HAMi-core C peers) \
         set their slot's status themselves",
        if sent == 1 { "" } else { "es" }
    );
    if failed > 0 {
        return Err(Fail(format!(
            "{shown}: {failed} signal{} could not be sent (see above); run as the processes' \
             user or as root",
            if failed == 1 { "" } else { "s" }
        )));
    }
    let (from, to) = if sig == libc::SIGUSR2 {
        (STATUS_RUNNING, STATUS_SUSPENDED)
    } else {
        (STATUS_SUSPENDED, STATUS_RUNNING)
    };
    set_status_of_ours(path, region, &platform, (from, to))?;
    Ok(EXIT_OK)
}

/// Sets the status of every live slot of this library's processes (those with a start tag; they
/// install no signal handler, and read their status instead) from `from` to `to`. Maps the file
/// read-write only if there is such a slot.
fn set_status_of_ours(
    path: &Path,
    seen: &SharedRegion,
    platform: &LinuxPlatform,
    (from, to): (i32, i32),
) -> Result<(), Fail> {
    let me = tool_pid();
    let ours = |slot: &SharedProcSlot| {
        let id = slots::slot_owner(slot);
        id.pid() > 0 && id.pid() != me && id.tag() != 0 && platform.liveness(id) == Liveness::Alive
    };
    if !seen.live_range().iter().any(ours) {
        return Ok(());
    }
    let file = open_rw(path)?;
    for (i, slot) in file.region().live_range().iter().enumerate() {
        if ours(slot) && slot.change_status(from, to) {
            println!("slot {i}: pid {}: status {from} -> {to}", slot.pid());
        }
    }
    Ok(())
}

/// The values the region is initialised with, from this process's environment, as libvgpu's
/// initialiser computes them.
fn init_params(config: &Config) -> InitParams<ABI_DEVS> {
    InitParams {
        limits: config.mem_limit.map(|l| l.unwrap_or(0)),
        sm_limits: config.sm_limit,
        priority: config.priority,
    }
}

fn create_new_cmd(path: &Path, force: bool) -> Result<u8, Fail> {
    let shown = path.display().to_string();
    // A missing or empty file is created / extended by the read-write open.
    if let Err(e) = std::fs::symlink_metadata(path) {
        if e.kind() != std::io::ErrorKind::NotFound {
            return Err(Fail(format!(
                "{shown}: cannot inspect the file ({e}); check the path and its permissions"
            )));
        }
    }
    let (config, errors) = Config::from_process_env();
    config::log_diagnostics(&errors);
    let params = init_params(&config);
    // A region whose fields are garbage is what --create-new repairs: do not judge them.
    let file =
        region_file::open_to_reinitialise(path).map_err(|e| open_error(e, OpenMode::ReadWrite))?;
    let region = file.region();
    let platform = LinuxPlatform::new(file.fd(), SharedRegion::SIZE);
    let verdict = file.verdict();
    let initialised = matches!(verdict, Verdict::Ready | Verdict::LegacyV11);

    // Who is attached.
    let live: Vec<i32> = if initialised {
        region
            .live_range()
            .iter()
            .map(slots::slot_owner)
            .filter(|id| id.pid() > 0 && platform.liveness(*id) != Liveness::Dead)
            .map(ProcId::pid)
            .collect()
    } else {
        Vec::new()
    };
    if !live.is_empty() && !force {
        let pids: Vec<String> = live.iter().map(i32::to_string).collect();
        return Err(Fail(format!(
            "{shown}: refusing to re-initialise: {} live process{} hold{} a slot (pid{} {}); \
             stop {} first, or pass --force (their recorded usage is then forgotten and they \
             register again)",
            live.len(),
            if live.len() == 1 { "" } else { "es" },
            if live.len() == 1 { "s" } else { "" },
            if live.len() == 1 { "" } else { "s" },
            pids.join(", "),
            if live.len() == 1 { "it" } else { "them" }
        )));
    }

    // The owner lock first (so no slot-table change is half done), then the init lock, the
    // order in which both are only ever nested here.
    let guard = if initialised && SemState::read(region.sem()).shared() {
        let cfg = LockConfig {
            deadline_ns: LOCK_DEADLINE_NS,
            ..LockConfig::default()
        };
        match lock::acquire(region, &platform, &cfg) {
            Ok(g) => Some(g),
            Err(e) if force => {
                eprintln!(
                    "shrreg-tool: {}; going on without it (--force)",
                    lock_error(&shown, region, e).0
                );
                None
            }
            Err(e) => return Err(lock_error(&shown, region, e)),
        }
    } else {
        None
    };
    if !platform.init_lock(LOCK_DEADLINE_NS) {
        return Err(Fail(format!(
            "{shown}: the init lock stayed held for {} s (a process hangs inside its \
             initialisation); find it, or try again",
            LOCK_DEADLINE_NS / 1_000_000_000
        )));
    }
    // Under the init lock nobody initialises or validates the region concurrently (C peers and
    // libvgpu both take it before they look at a flag that is not the magic). Clearing the flag
    // makes ensure_initialised redo everything: versions, limits, priority, proc_num = 0,
    // owner_pid = 0 and sem_init of both semaphores. The record lock is the process's, so
    // ensure_initialised taking it again succeeds at once; its unlock ends our hold, after
    // which nothing more is written.
    region.mark_uninitialised();
    region.clear_slots();
    let outcome = init::ensure_initialised(region, &platform, &params, LOCK_DEADLINE_NS);
    platform.init_unlock();
    if let Some(g) = guard {
        // sem_init reset the semaphore to 1 and owner_pid to 0: our hold ended with it, and a
        // release now would find owner_pid not ours (and complain) or post a second token.
        std::mem::forget(g);
    }
    match outcome {
        Ok(InitOutcome::Initialised) => {}
        Ok(InitOutcome::AlreadyReady) => {
            return Err(Fail(format!(
                "{shown}: another process initialised the region at the same moment; its limits \
                 apply; run shrreg-tool --print to see them"
            )))
        }
        Err(init::InitError::LockTimeout) => {
            return Err(Fail(format!(
                "{shown}: the init lock was taken by another process; try again"
            )))
        }
        Err(init::InitError::SemInit) => {
            return Err(Fail(format!(
                "{shown}: sem_init failed on the region; it stays marked as interrupted, and the \
                 next libvgpu process retries"
            )))
        }
    }
    let limits: Vec<String> = params
        .limits
        .iter()
        .enumerate()
        .filter(|(_, &l)| l != 0)
        .map(|(d, &l)| format!("device {d}: {l} bytes ({})", inspect::human(l)))
        .collect();
    let limits = if limits.is_empty() {
        "no memory limit".to_owned()
    } else {
        limits.join(", ")
    };
    println!(
        "{shown}: re-initialised as v{} (was {}): {limits}; slot table cleared",
        inspect::layout_version(),
        inspect::verdict_text(verdict)
    );
    if !live.is_empty() {
        println!(
            "{shown}: {} live process{} lost {} slot{} (--force) and will register again",
            live.len(),
            if live.len() == 1 { "" } else { "es" },
            if live.len() == 1 { "its" } else { "their" },
            if live.len() == 1 { "" } else { "s" }
        );
    }
    Ok(EXIT_OK)
}
