//! The library changes no process-wide state it does not own: after initialisation the umask,
//! the working directory and the application's own signal handlers are what they were; only
//! signals left at their default get our slot-releasing handler.

use std::sync::atomic::{AtomicBool, Ordering};

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

    let rt = vgpu::runtime::get().expect("runtime initialises");
    assert!(rt.shared, "the region file in a temp dir is usable");
    assert!(rt.own_slot().is_some());

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
