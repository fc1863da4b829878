//! The library changes no process-wide state it does not own: after initialisation the umask,
//! the working directory and the application's own signal handlers are what they were; only
//! signals left at their default get our slot-releasing handler.
//!
//! The library is driven through its C API, as a C program would: its Rust modules are private.

use std::mem::offset_of;
use std::sync::atomic::{AtomicBool, Ordering};

use hami_shm::layout::{SharedProcSlot, SharedRegion};
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
    assert_eq!(i32_at(&bytes, offset_of!(SharedRegion, proc_num)), 1);
    let pid = offset_of!(SharedRegion, procs) + offset_of!(SharedProcSlot, pid);
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

/// Fields of the region's `#[repr(C)]` types (`Region`, `ProcSlot`, `DeviceMemory`,
/// `DeviceUtil`, `DeviceUuid`, `RawSem`, `Ext`, `SmBucket`). Every operation on them is core's
/// (`hami_shm::fields` and the protocol modules); ffi calls those.
const REGION_FIELDS: &[&str] = &[
    "initialized_flag",
    "major_version",
    "minor_version",
    "sm_init_flag",
    "owner_pid",
    "sem",
    "device_num",
    "uuids",
    "limit",
    "sm_limit",
    "procs",
    "proc_num",
    "utilization_switch",
    "recent_kernel",
    "priority",
    "last_kernel_time",
    "sem_postinit",
    "pid",
    "hostpid",
    "used",
    "monitorused",
    "device_util",
    "status",
    "padding",
    "seqlock",
    "unused",
    "context_size",
    "module_size",
    "data_size",
    "offset",
    "total",
    "dec_util",
    "enc_util",
    "sm_util",
    "text",
    "words",
    "magic",
    "version",
    "devs",
    "buckets",
    "context_cost",
    "context_probe",
    "reserved",
    "tokens",
    "rate",
    "refilled_ns",
    "lease",
    "spent",
];

/// Fields that are structs or arrays of structs: binding one (`let b = &ext.buckets[d];`, to
/// hand to a core protocol) is no atomic operation.
const AGGREGATES: &[&str] = &[
    "sem",
    "sem_postinit",
    "uuids",
    "procs",
    "used",
    "device_util",
    "buckets",
];

const ATOMIC_OPS: &[&str] = &["load(", "store(", "fetch_", "compare_exchange", "swap("];

/// Atomic operations on region fields in `src` (whitespace removed first, so a chain split over
/// lines counts): `.field` followed by any `[index]`es, then `.load(`, `.store(`, `.fetch_*`,
/// `.compare_exchange*` or `.swap(`; and `let x = &...field;`, an alias the operation would go
/// through. Returns the 1-based lines and the matched text.
fn region_atomic_ops(src: &str) -> Vec<(usize, String)> {
    let (mut flat, mut line_of) = (Vec::new(), Vec::new());
    let mut line = 1;
    for c in src.chars() {
        if c == '\n' {
            line += 1;
        }
        if !c.is_whitespace() {
            flat.push(c);
            line_of.push(line);
        }
    }
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut hits = Vec::new();
    for start in 0..flat.len() {
        if flat[start] != '.' || start + 1 >= flat.len() || !ident(flat[start + 1]) {
            continue;
        }
        let mut i = start + 1;
        while i < flat.len() && ident(flat[i]) {
            i += 1;
        }
        let field: String = flat[start + 1..i].iter().collect();
        if !REGION_FIELDS.contains(&field.as_str()) {
            continue;
        }
        while i < flat.len() && flat[i] == '[' {
            let mut depth = 0;
            while i < flat.len() {
                match flat[i] {
                    '[' => depth += 1,
                    ']' => depth -= 1,
                    _ => {}
                }
                i += 1;
                if depth == 0 {
                    break;
                }
            }
        }
        if flat.get(i) == Some(&';') {
            // `let x = &region.field;`: an alias that the atomic operation would go through.
            let stmt = flat[..start]
                .iter()
                .rposition(|&c| matches!(c, ';' | '{' | '}'))
                .map_or(0, |p| p + 1);
            let head: String = flat[stmt..start].iter().collect();
            if head.starts_with("let")
                && head.contains("=&")
                && !AGGREGATES.contains(&field.as_str())
            {
                let shown: String = flat[stmt..=i].iter().collect();
                hits.push((line_of[start], shown));
            }
            continue;
        }
        if i >= flat.len() || flat[i] != '.' {
            continue;
        }
        let rest: String = flat[i + 1..flat.len().min(i + 20)].iter().collect();
        if ATOMIC_OPS.iter().any(|op| rest.starts_with(op)) {
            let shown: String = flat[start..flat.len().min(i + 20)].iter().collect();
            hits.push((line_of[start], shown));
        }
    }
    hits
}

/// Outside core, no crate makes an atomic operation on region bytes (ffi, hami-linux and the
/// tool's sources): they call core's named operations instead (issue "Seal the region"). The
/// scan is syntactic: it sees `let x = &region.f;` but not an atomic reached through a closure
/// parameter or a pattern (`.map(|m| m.load(..))` over `slot.monitorused.iter()`); none exists
/// today, and review keeps it so.
///
/// Exempt: `#[cfg(test)]` modules (from the line that opens one to the end of the file): their
/// fixtures write a private `Region::zeroed()` of their own to set a scene, shared with nobody.
#[test]
fn no_crate_but_core_makes_an_atomic_operation_on_region_fields() {
    fn rs_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                rs_files(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for (dir, at_least) in [("ffi/src", 20), ("linux/src", 5), ("tool/src", 5)] {
        let before = files.len();
        rs_files(&root.join(dir), &mut files);
        assert!(files.len() - before >= at_least, "the scan found {dir}");
    }
    let mut found = Vec::new();
    for f in &files {
        let src = std::fs::read_to_string(f).unwrap();
        let src = src.split("#[cfg(test)]").next().unwrap_or("");
        for (line, what) in region_atomic_ops(src) {
            found.push(format!("{}:{line}: {what}", f.display()));
        }
    }
    assert!(
        found.is_empty(),
        "a crate operates on region fields directly; use (or add) a named operation in core \
         (hami_shm::fields or the protocol's module):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_region_field_scan_sees_real_sites() {
    let planted = [
        "rt.region.utilization_switch.load(Ordering::Relaxed)",
        "rt.region.sm_limit[d].load(Ordering::Relaxed)",
        "slot.device_util[d].sm_util.store(0, Ordering::Relaxed)",
        "rt\n    .region\n    .sm_init_flag\n    .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)",
        "rt.region.last_kernel_time.fetch_max(now, Ordering::AcqRel)",
        "b.lease.swap(0, Ordering::Relaxed)",
        "let rk = &rt.region.recent_kernel;",
    ];
    for p in planted {
        assert_eq!(region_atomic_ops(p).len(), 1, "{p}");
    }
    for fine in [
        "self.slot.load(Ordering::Relaxed)",
        "ENTRIES[self.0].base.store(FREE, Ordering::Release)",
        "rt.region.limit(d)",
        "slot.set_sm_util(d, 0)",
        "let b = &rt.ext.buckets[dev];",
        "let live = rt.region.live_range();",
    ] {
        assert!(region_atomic_ops(fine).is_empty(), "{fine}");
    }
}
