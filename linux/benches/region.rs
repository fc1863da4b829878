//! `cargo bench -p hami-linux --bench region`: the shared region's hot operations on the real
//! Linux platform (a region file mmap'd from a temp dir, glibc's `sem_t`, `fcntl` record locks,
//! forked processes), against the plain operation they replace where one exists. The platform
//! and the region file are libvgpu.so's own (this crate's), not copies.
//!
//! A plain harness (`harness = false`, `std::time::Instant`) rather than criterion: the workspace
//! builds offline and `--locked`, and median/min over many samples of many iterations is all these
//! numbers need. Each sample times `iters` back-to-back calls; a row reports the median and the
//! minimum over the samples, in nanoseconds per call. Rows with several workers report, per run,
//! the median over workers of each worker's ns/op (timed from a common start), then the median and
//! minimum over runs; the `all` column is the run's wall time divided by every worker's calls.
//! Nothing here asserts on speed: a benchmark is not a timed test.
//!
//! `HAMI_BENCH_QUICK=1` (or running it without `--bench`, as `cargo test --benches` does) cuts
//! the iterations tenfold: a smoke run.

use std::fs::File;
use std::hint::black_box;
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Barrier, Mutex};
use std::time::Instant;

use hami_linux::platform::LinuxPlatform;
use hami_linux::region_file::{self, OpenMode, RegionFile};
use hami_shm::admission;
use hami_shm::init::{self, InitParams};
use hami_shm::layout::{SharedRegion, ABI_DEVS, ABI_SLOTS};
use hami_shm::lock::{self, LockConfig};
use hami_shm::platform::{Platform, SemWait};
use hami_shm::seqlock::Kind;
use hami_shm::slots;

/// One allocation of the GPU benchmark's size.
const BYTES: u64 = 2 << 20;
/// The limit every region gets: large enough that no reservation is refused.
const LIMIT: u64 = 40 << 30;
const DEV: usize = 0;
/// Runs of each multi-worker row.
const RUNS: usize = 5;

// ---------------------------------------------------------------------------------------------
// Measuring and printing.

#[derive(Clone, Copy)]
struct Stats {
    median: f64,
    min: f64,
}

fn stats(mut v: Vec<f64>) -> Stats {
    v.sort_by(f64::total_cmp);
    Stats {
        median: v[v.len() / 2],
        min: v[0],
    }
}

/// ns per call of `op`: `samples` samples of `iters` calls each, after a warm-up of `iters / 4`.
fn time_op(iters: u64, samples: usize, mut op: impl FnMut()) -> Stats {
    for _ in 0..iters / 4 {
        op();
    }
    let v = (0..samples)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..iters {
                op();
            }
            t.elapsed().as_nanos() as f64 / iters as f64
        })
        .collect();
    stats(v)
}

struct Row {
    name: String,
    s: Stats,
    /// ns/op over all workers of a run (wall ÷ total calls), for multi-worker rows.
    all: Option<f64>,
    /// The plain operation's median, for the ratio.
    plain: Option<f64>,
    /// Target median, ns.
    target: Option<f64>,
}

struct Table(Vec<Row>);

impl Table {
    fn add(&mut self, name: &str, s: Stats, plain: Option<&Stats>, target: Option<f64>) -> f64 {
        let m = s.median;
        self.0.push(Row {
            name: name.to_string(),
            s,
            all: None,
            plain: plain.map(|p| p.median),
            target,
        });
        self.print_last();
        m
    }

    fn add_multi(&mut self, name: &str, runs: Vec<(f64, f64)>) {
        let all = stats(runs.iter().map(|r| r.1).collect()).median;
        self.0.push(Row {
            name: name.to_string(),
            s: stats(runs.iter().map(|r| r.0).collect()),
            all: Some(all),
            plain: None,
            target: None,
        });
        self.print_last();
    }

    fn header() {
        println!(
            "\n| {:<58} | {:>9} | {:>9} | {:>8} | {:>8} | {:>6} | {:>12} |",
            "operation", "median ns", "min ns", "all ns", "plain ns", "ratio", "target"
        );
        println!(
            "|{:-<60}|{:->11}|{:->11}|{:->10}|{:->10}|{:->8}|{:->14}|",
            "", "", "", "", "", "", ""
        );
    }

    /// Prints the row just added (rows are printed as they finish, so that a warning the
    /// library logs on stderr shows up next to the row that caused it).
    fn print_last(&self) {
        let Some(r) = self.0.last() else { return };
        let opt = |v: Option<f64>| v.map_or_else(String::new, |v| format!("{v:.1}"));
        let ratio = r
            .plain
            .map_or_else(String::new, |p| format!("{:.2}", r.s.median / p));
        let target = r.target.map_or_else(String::new, |t| {
            let ok = if r.s.median < t { "ok" } else { "MISSED" };
            format!("< {t:.0} {ok}")
        });
        println!(
            "| {:<58} | {:>9.1} | {:>9.1} | {:>8} | {:>8} | {:>6} | {:>12} |",
            r.name,
            r.s.median,
            r.s.min,
            opt(r.all),
            opt(r.plain),
            ratio,
            target
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Regions on real files.

struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        let dir = std::env::temp_dir().join(format!("hami-bench-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).expect("create temp dir");
        TempDir(dir)
    }

    fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn params() -> InitParams<ABI_DEVS> {
    let mut limits = [0; ABI_DEVS];
    limits[DEV] = LIMIT;
    InitParams {
        limits,
        sm_limits: [100; ABI_DEVS],
        priority: 1,
    }
}

/// A fresh region file at `path`, opened, mapped and initialised as the library does it.
fn open_region(path: &Path) -> (RegionFile, LinuxPlatform) {
    let file = region_file::open(path, OpenMode::ReadWrite).expect("open region file");
    let platform = LinuxPlatform::new(file.fd(), SharedRegion::SIZE);
    init::ensure_initialised(file.region(), &platform, &params(), 1_000_000_000)
        .expect("initialise region");
    (file, platform)
}

/// Claims a slot for the platform's process, under the owner lock, as the library does.
fn claim(region: &SharedRegion, platform: &LinuxPlatform) -> usize {
    let guard = lock::acquire(region, platform, &LockConfig::default()).expect("owner lock");
    let slot = slots::claim(region, platform, &guard).expect("claim a slot");
    guard.release();
    slot
}

/// One reservation and its release on `slot`: an allocation's whole accounting.
fn reserve_release(region: &SharedRegion, platform: &LinuxPlatform, slot: usize) {
    admission::try_reserve(region, platform, slot, DEV, Kind::Data, black_box(BYTES))
        .expect("under the limit");
    admission::release(region, platform, slot, DEV, Kind::Data, black_box(BYTES));
}

/// Makes slots `0..n` live (our pid, some usage), as `n` processes of a full container would.
fn fill_slots(region: &SharedRegion, n: usize) {
    let pid = std::process::id() as i32;
    for s in &region.raw_procs()[..n] {
        s.raw_pid().store(pid, Ordering::Relaxed);
        s.raw_used()[DEV]
            .raw_total()
            .store(1 << 20, Ordering::Relaxed);
    }
    region.raw_proc_num().store(n as i32, Ordering::Release);
}

// ---------------------------------------------------------------------------------------------
// Several workers: threads, and forked processes.

/// Runs `op(worker)` `iters` times in each of `n` threads released together; returns (median
/// worker ns/op, wall ns ÷ all calls).
fn across_threads(n: usize, iters: u64, op: impl Fn(usize) + Sync) -> (f64, f64) {
    let barrier = Barrier::new(n + 1);
    let (per, wall) = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..n)
            .map(|w| {
                let (barrier, op) = (&barrier, &op);
                sc.spawn(move || {
                    barrier.wait();
                    let t = Instant::now();
                    for _ in 0..iters {
                        op(w);
                    }
                    t.elapsed().as_nanos() as f64 / iters as f64
                })
            })
            .collect();
        barrier.wait();
        let t = Instant::now();
        let per: Vec<f64> = handles
            .into_iter()
            .map(|h| h.join().expect("worker"))
            .collect();
        (per, t.elapsed().as_nanos() as f64)
    });
    (stats(per).median, wall / (n as f64 * iters as f64))
}

fn pipe() -> (File, File) {
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid array of two ints for pipe to fill.
    let rc = unsafe { libc::pipe(fds.as_mut_ptr()) };
    assert_eq!(rc, 0, "pipe: {}", std::io::Error::last_os_error());
    // SAFETY: the read end was just created by pipe and is owned by nothing else.
    let r = unsafe { OwnedFd::from_raw_fd(fds[0]) };
    // SAFETY: likewise the write end.
    let w = unsafe { OwnedFd::from_raw_fd(fds[1]) };
    (File::from(r), File::from(w))
}

/// Forks `n` processes (the caller must be single-threaded). Each runs `child(barrier)`: its
/// set-up, then `barrier()`, which returns once all `n` are ready, then its timed loop, returning
/// its ns/op. Returns (median worker ns/op, wall ns from release to the last result ÷ `calls`).
fn across_processes(n: usize, calls: u64, child: impl Fn(&dyn Fn()) -> f64) -> (f64, f64) {
    let (mut ready_r, ready_w) = pipe();
    let (go_r, go_w) = pipe();
    let (mut res_r, res_w) = pipe();
    let mut pids = Vec::with_capacity(n);
    for _ in 0..n {
        // SAFETY: the bench is single-threaded here (the thread rows have joined); the child
        // runs `child` on inherited state and leaves with `_exit`, never returning into main.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            drop((ready_r, go_w, res_r));
            let barrier = || {
                let _ = (&ready_w).write_all(b"r");
                // EOF once the parent closes the write end: everyone starts at once.
                let _ = (&go_r).read(&mut [0u8; 1]);
            };
            let ns = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| child(&barrier)))
                .unwrap_or(f64::NAN);
            let _ = (&res_w).write_all(&ns.to_bits().to_ne_bytes());
            // SAFETY: ends the child without running the parent's exit handlers or destructors
            // (the temp dir belongs to the parent).
            unsafe { libc::_exit(0) };
        }
        pids.push(pid);
    }
    drop((ready_w, go_r, res_w));
    let mut ready = vec![0u8; n];
    ready_r.read_exact(&mut ready).expect("children ready");
    let t = Instant::now();
    drop(go_w);
    let mut per = Vec::with_capacity(n);
    for _ in 0..n {
        let mut b = [0u8; 8];
        res_r.read_exact(&mut b).expect("child result");
        per.push(f64::from_bits(u64::from_ne_bytes(b)));
    }
    let wall = t.elapsed().as_nanos() as f64;
    for pid in pids {
        let mut status = 0;
        // SAFETY: waits for our own child; `status` is a valid int to write.
        unsafe { libc::waitpid(pid, &mut status, 0) };
    }
    (stats(per).median, wall / calls as f64)
}

/// In a forked child: a platform with the child's own identity over the inherited mapping.
fn child_platform(file: &RegionFile) -> LinuxPlatform {
    LinuxPlatform::new(file.fd(), SharedRegion::SIZE)
}

// ---------------------------------------------------------------------------------------------

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

fn main() {
    // `cargo bench` passes `--bench`; without it (`cargo test --benches`) this is a smoke run.
    let quick = std::env::var_os("HAMI_BENCH_QUICK").is_some_and(|v| v == "1")
        || !std::env::args().any(|a| a == "--bench");
    let scale = if quick { 10 } else { 1 };
    let n = |iters: u64| (iters / scale).max(10);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "hami-shm region benchmarks, hami-linux's platform: {} ({} CPUs), {} KiB region",
        cpu_model(),
        cpus,
        SharedRegion::SIZE / 1024
    );
    let dir = TempDir::new();
    let mut t = Table(Vec::new());
    Table::header();

    // -- reserve + release on one's own slot, uncontended ------------------------------------
    let (one, p1) = open_region(&dir.file("one.region"));
    let r1 = one.region();
    let slot = claim(r1, &p1);
    let plain_counter = &r1.raw_procs()[slot].raw_used()[DEV].raw_data_size();
    let plain_rmw = time_op(n(1_000_000), 31, || {
        plain_counter.fetch_add(black_box(BYTES), Ordering::SeqCst);
        plain_counter.fetch_sub(black_box(BYTES), Ordering::SeqCst);
    });
    t.add(
        "plain: fetch_add + fetch_sub on own slot",
        plain_rmw,
        None,
        None,
    );
    let s = time_op(n(1_000_000), 31, || reserve_release(r1, &p1, slot));
    t.add(
        "reserve + release, own slot, 1 live slot",
        s,
        Some(&plain_rmw),
        Some(100.0),
    );
    r1.raw_limit()[DEV].store(0, Ordering::Relaxed);
    let s = time_op(n(1_000_000), 31, || reserve_release(r1, &p1, slot));
    t.add(
        "reserve + release, own slot, no limit (no aggregate read)",
        s,
        Some(&plain_rmw),
        None,
    );
    r1.raw_limit()[DEV].store(LIMIT, Ordering::Relaxed);

    // -- init on an initialised region ---------------------------------------------------------
    let plain_load = time_op(n(2_000_000), 31, || {
        black_box(r1.raw_initialized_flag().load(Ordering::Acquire));
    });
    t.add("plain: one acquire load", plain_load, None, None);
    let prm = params();
    let s = time_op(n(2_000_000), 31, || {
        let _ = black_box(init::ensure_initialised(r1, &p1, &prm, 1_000_000_000));
    });
    t.add(
        "init::ensure_initialised, region initialised",
        s,
        Some(&plain_load),
        None,
    );
    let path = dir.file("one.region");
    let s = time_op(n(2_000), 21, || {
        // What a process pays at start-up on an existing file: open, validate, map, init check.
        let f = region_file::open(&path, OpenMode::ReadWrite).expect("reopen");
        let p = LinuxPlatform::new(f.fd(), SharedRegion::SIZE);
        let _ = black_box(init::ensure_initialised(
            f.region(),
            &p,
            &prm,
            1_000_000_000,
        ));
        // Dropping `f` would close the file and with it this process's record locks; none are
        // held here (benches hold the owner lock only inside `claim`).
        drop(f);
    });
    t.add(
        "open + validate + mmap + init of an initialised file",
        s,
        None,
        None,
    );

    // -- the owner lock ------------------------------------------------------------------------
    let plain_sem = time_op(n(200_000), 21, || {
        assert_eq!(p1.sem_wait(r1.sem_postinit(), 0), SemWait::Acquired);
        p1.sem_post(r1.sem_postinit());
    });
    t.add("plain: sem_trywait + sem_post", plain_sem, None, None);
    let cfg = LockConfig::default();
    let s = time_op(n(100_000), 21, || {
        lock::acquire(r1, &p1, &cfg).expect("lock").release();
    });
    t.add(
        "owner lock acquire + release, uncontended",
        s,
        Some(&plain_sem),
        None,
    );

    // -- aggregate over 1024 slots -------------------------------------------------------------
    let (full, pf) = open_region(&dir.file("full.region"));
    let rf = full.region();
    fill_slots(rf, ABI_SLOTS);
    let contiguous: Vec<u64> = vec![1 << 20; ABI_SLOTS];
    let plain_sum = time_op(n(50_000), 31, || {
        black_box(
            black_box(&contiguous)
                .iter()
                .fold(0u64, |a, &b| a.saturating_add(b)),
        );
    });
    t.add("plain: sum of 1024 contiguous u64", plain_sum, None, None);
    let s = time_op(n(50_000), 31, || {
        black_box(admission::device_usage(rf, black_box(DEV)));
    });
    t.add(
        "aggregate (device_usage) over 1024 live slots",
        s,
        Some(&plain_sum),
        Some(2000.0),
    );
    let s = time_op(n(50_000), 31, || reserve_release(rf, &pf, 0));
    t.add(
        "reserve + release, own slot, 1024 live slots",
        s,
        Some(&plain_rmw),
        None,
    );
    drop(full);

    // -- several threads -----------------------------------------------------------------------
    let mut workers = vec![cpus.clamp(2, 8), 8];
    workers.dedup();
    let (thr, pt) = open_region(&dir.file("threads.region"));
    let rt = thr.region();
    fill_slots(rt, 8);
    let iters = n(200_000);
    for &w in &workers {
        let runs = (0..RUNS)
            .map(|_| across_threads(w, iters, |i| reserve_release(rt, &pt, i)))
            .collect();
        t.add_multi(
            &format!("reserve + release, {w} threads, each its own slot"),
            runs,
        );
        let runs = (0..RUNS)
            .map(|_| across_threads(w, iters, |_| reserve_release(rt, &pt, 0)))
            .collect();
        t.add_multi(
            &format!("reserve + release, {w} threads of one process, one slot"),
            runs,
        );
        // Record locks belong to processes, so the library serialises its threads with a mutex
        // before the owner lock (Runtime::with_owner_lock); so does this row.
        let serial = Mutex::new(());
        let runs = (0..RUNS)
            .map(|_| {
                across_threads(w, n(20_000), |_| {
                    let _g = serial.lock().expect("mutex");
                    lock::acquire(rt, &pt, &cfg).expect("lock").release();
                })
            })
            .collect();
        t.add_multi(&format!("owner lock acquire + release, {w} threads"), runs);
    }
    drop(thr);

    // -- several processes (forked after every thread above has joined) -----------------------
    let (procs, _pp) = open_region(&dir.file("procs.region"));
    let rp = procs.region();
    for &w in &workers {
        let runs = (0..RUNS)
            .map(|_| {
                across_processes(w, w as u64 * iters, |barrier| {
                    let p = child_platform(&procs);
                    let slot = claim(rp, &p);
                    barrier();
                    let t = Instant::now();
                    for _ in 0..iters {
                        reserve_release(rp, &p, slot);
                    }
                    let ns = t.elapsed().as_nanos() as f64 / iters as f64;
                    slots::release_on_exit(rp, slot, p.self_id());
                    ns
                })
            })
            .collect();
        t.add_multi(
            &format!("reserve + release, {w} processes, each its own slot"),
            runs,
        );
        let lock_iters = n(5_000);
        let runs = (0..RUNS)
            .map(|_| {
                across_processes(w, w as u64 * lock_iters, |barrier| {
                    let p = child_platform(&procs);
                    barrier();
                    let t = Instant::now();
                    for _ in 0..lock_iters {
                        lock::acquire(rp, &p, &cfg).expect("lock").release();
                    }
                    t.elapsed().as_nanos() as f64 / lock_iters as f64
                })
            })
            .collect();
        t.add_multi(
            &format!("owner lock acquire + release, {w} processes"),
            runs,
        );
    }
    drop(procs);

    println!(
        "\nmedian/min: ns per call; 'all': wall time of a run / all workers' calls; ratio: \
         median / plain median. {} CPUs: rows with more workers than CPUs are oversubscribed.",
        cpus
    );
}
