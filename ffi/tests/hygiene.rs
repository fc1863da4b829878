//! The library changes no process-wide state it does not own: after initialisation the umask,
//! the working directory and the application's own signal handlers are what they were; only
//! signals left at their default get our slot-releasing handler.
//!
//! The library is driven through its C API, as a C program would: its Rust modules are private.

use std::sync::atomic::{AtomicBool, Ordering};

// Links the library, whose exported symbols the block below names.
use vgpu as _;

extern "C" {
    /// Sets up the shared region and this process's slot (`multiprocess_memory_limit.h`).
    fn ensure_initialized();
}

/// The little-endian `i32` at `at` in `bytes`.
fn i32_at(bytes: &[u8], at: usize) -> i32 {
    i32::from_le_bytes(bytes[at..at + 4].try_into().unwrap())
}

static APP_HANDLER_RAN: AtomicBool = AtomicBool::new(false);

extern "C" fn app_handler(_: libc::c_int) {
    APP_HANDLER_RAN.store(true, Ordering::Relaxed);
}

fn handler_of(sig: libc::c_int) -> usize {
    // SAFETY: all-zero bytes are a valid `sigaction` (integers, a handler, a mask).
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: a query (act = null) into a struct we own changes nothing.
    unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) };
    old.sa_sigaction
}

fn install(sig: libc::c_int) {
    // SAFETY: all-zero bytes are a valid `sigaction` (integers, a handler, a mask).
    let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
    act.sa_sigaction = app_handler as extern "C" fn(libc::c_int) as usize;
    // SAFETY: `act.sa_mask` is a valid, writable `sigset_t` of ours.
    unsafe { libc::sigemptyset(&mut act.sa_mask) };
    // SAFETY: installs a plain extern "C" one-argument handler that only stores to an atomic.
    unsafe { libc::sigaction(sig, &act, std::ptr::null_mut()) };
}

#[test]
fn initialisation_keeps_umask_cwd_and_application_handlers() {
    let dir = std::env::temp_dir().join(format!("hami-hygiene-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cache = dir.join("cache");
    std::env::set_var("CUDA_DEVICE_MEMORY_SHARED_CACHE", &cache);
    std::env::set_var("CUDA_DEVICE_MEMORY_LIMIT", "1g");

    install(libc::SIGTERM);
    install(libc::SIGUSR1);
    // SAFETY: umask has no preconditions.
    unsafe { libc::umask(0o027) };
    let cwd = std::env::current_dir().unwrap();
    let (term, usr1, usr2) = (
        handler_of(libc::SIGTERM),
        handler_of(libc::SIGUSR1),
        handler_of(libc::SIGUSR2),
    );
    assert_eq!(handler_of(libc::SIGINT), libc::SIG_DFL, "test precondition");

    // SAFETY: no arguments; callable at any time.
    unsafe { ensure_initialized() };
    // The region file in a temp dir is usable: this process holds its first slot there.
    let bytes = std::fs::read(&cache).unwrap();
    assert_eq!(i32_at(&bytes, hami_shm::raw::offsets::PROC_NUM), 1);
    let pid = hami_shm::raw::offsets::PROCS + hami_shm::raw::offsets::SLOT_PID;
    assert_eq!(i32_at(&bytes, pid), std::process::id() as i32);

    // Reading the umask by setting it and putting it back.
    // SAFETY: umask has no preconditions.
    let mask = unsafe { libc::umask(0o027) };
    // SAFETY: as above; puts the mask back.
    unsafe { libc::umask(mask) };
    assert_eq!(mask, 0o027, "umask changed");
    assert_eq!(
        std::env::current_dir().unwrap(),
        cwd,
        "working directory changed"
    );
    assert_eq!(
        handler_of(libc::SIGTERM),
        term,
        "the application's SIGTERM handler was replaced"
    );
    assert_eq!(
        handler_of(libc::SIGUSR1),
        usr1,
        "the application's SIGUSR1 handler was replaced"
    );
    assert_eq!(handler_of(libc::SIGUSR2), usr2, "SIGUSR2 was touched");
    assert_ne!(
        handler_of(libc::SIGINT),
        libc::SIG_DFL,
        "a default SIGINT gets the slot-releasing handler"
    );

    // The application's handler still runs.
    // SAFETY: raising a signal whose handler only stores an atomic.
    unsafe { libc::raise(libc::SIGUSR1) };
    assert!(APP_HANDLER_RAN.load(Ordering::Relaxed));

    // The file was created with its explicit mode, whatever the umask.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&cache).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o666);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The region's fields are `pub(crate)` in core; the `raw-fields` feature, which opens them to
/// white-box tests and the models, is enabled by no library crate: only under
/// `[dev-dependencies]`, or by hami-model (tests only). And no library source calls a `raw_`
/// accessor (a `cargo test` build unifies features, so the compiler alone would not notice).
#[test]
fn only_tests_and_models_reach_the_raw_region_fields() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for krate in ["ffi", "linux", "tool"] {
        let manifest = std::fs::read_to_string(root.join(krate).join("Cargo.toml")).unwrap();
        let mut section = "";
        for line in manifest.lines() {
            if line.starts_with('[') {
                section = line;
            }
            assert!(
                !line.contains("raw-fields") || section == "[dev-dependencies]",
                "{krate}/Cargo.toml enables raw-fields in {section}"
            );
        }
    }
    let mut files = Vec::new();
    for dir in ["ffi/src", "linux/src", "tool/src"] {
        let mut stack = vec![root.join(dir)];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    files.push(p);
                }
            }
        }
    }
    assert!(files.len() > 30, "the scan found the sources");
    // The accessors, as core/src/raw.rs declares them (`field raw_field: Type,`).
    let raw = std::fs::read_to_string(root.join("core/src/raw.rs")).unwrap();
    let accessors: Vec<String> = raw
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter(|w| w.starts_with("raw_") && w.ends_with(':'))
        .map(|w| format!(".{}(", w.trim_end_matches(':')))
        .collect();
    assert!(accessors.len() > 40, "the scan found the accessors");
    for f in files {
        let src = std::fs::read_to_string(&f).unwrap();
        let src = src.split("#[cfg(test)]").next().unwrap_or("");
        let used: Vec<_> = accessors
            .iter()
            .filter(|a| src.contains(a.as_str()))
            .collect();
        assert!(
            used.is_empty() && !src.contains("hami_shm::raw"),
            "{} reaches the raw region fields ({used:?}); use core's named operations",
            f.display()
        );
    }
}
