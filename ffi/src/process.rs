//! Process lifecycle: release our slot at exit and on catchable termination signals, and notice
//! fork. Everything that runs in a handler touches atomics only.
//!
//! Signals: for SIGTERM, SIGINT, SIGHUP and SIGABRT we install a handler only where the
//! disposition is still the default, so an application's own handler (Python's SIGINT, a JVM's
//! SIGTERM) is never replaced; our handler frees the slot, restores the default and re-raises,
//! so the process dies of the same signal as it would have without us. We never touch SIGUSR1 or
//! SIGUSR2 (upstream's suspend stubs replace the application's handlers, bug B28).

use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::Once;

use hami_shm::layout::SharedRegion;
use hami_shm::platform::ProcId;
use hami_shm::slots;

use crate::runtime::{self, Runtime};

/// What the exit paths release, published for handlers (no locks, no runtime lookup).
static EXIT_REGION: AtomicPtr<SharedRegion> = AtomicPtr::new(std::ptr::null_mut());
static EXIT_SLOT: AtomicUsize = AtomicUsize::new(usize::MAX);
static EXIT_ID: AtomicU64 = AtomicU64::new(0);

/// The signals whose default action ends the process without running atexit handlers.
const TERMINATING: [libc::c_int; 4] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGABRT];

/// Publishes the slot the exit paths must free.
pub(crate) fn set_exit_slot(region: &'static SharedRegion, slot: usize, me: ProcId) {
    EXIT_REGION.store(
        region as *const SharedRegion as *mut SharedRegion,
        Ordering::Relaxed,
    );
    EXIT_ID.store(me.0, Ordering::Relaxed);
    EXIT_SLOT.store(slot, Ordering::Release);
}

/// Frees our slot if it counts no memory (else the reapers free it once we are dead; see
/// [`slots::release_on_exit_if_idle`]). Async-signal-safe.
fn release_slot() {
    let slot = EXIT_SLOT.swap(usize::MAX, Ordering::AcqRel);
    let region = EXIT_REGION.load(Ordering::Relaxed);
    if slot == usize::MAX || region.is_null() {
        return;
    }
    // SAFETY: EXIT_REGION only ever holds a `&'static SharedRegion` (set_exit_slot), a mapping
    // that is never unmapped.
    let region: &SharedRegion = unsafe { &*region };
    slots::release_on_exit_if_idle(region, slot, ProcId(EXIT_ID.load(Ordering::Relaxed)));
}

extern "C" fn at_exit() {
    release_slot();
}

extern "C" fn on_terminating_signal(sig: libc::c_int) {
    release_slot();
    // Restoring SIG_DFL and re-raising makes the process end exactly as it would have without
    // our handler.
    // SAFETY: signal() is async-signal-safe and takes no pointers; SIG_DFL is a valid disposition.
    unsafe { libc::signal(sig, libc::SIG_DFL) };
    // SAFETY: raise() is async-signal-safe and takes no pointers.
    unsafe { libc::raise(sig) };
}

/// In a forked child (atomics only): the exit handler's slot and the runtime's identity are the
/// parent's.
pub(crate) fn after_fork() {
    EXIT_SLOT.store(usize::MAX, Ordering::Relaxed);
    if let Some(rt) = runtime::existing() {
        rt.mark_forked();
    }
}

/// Installs the exit, signal and fork handlers, once per process.
pub(crate) fn install(_rt: &'static Runtime) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers a plain `extern "C"` function that never unwinds; atexit has no
        // other preconditions.
        unsafe { libc::atexit(at_exit) };
        crate::fork::install();
        for sig in TERMINATING {
            install_if_default(sig);
        }
    });
}

/// Installs our handler for `sig` only if the disposition is SIG_DFL.
fn install_if_default(sig: libc::c_int) {
    // SAFETY: all-zero bytes are a valid `sigaction` (integers, a handler address, a mask).
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: a query (act = null) changes nothing; it only fills `old`, ours and writable.
    if unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) } != 0
        || old.sa_sigaction != libc::SIG_DFL
    {
        return;
    }
    // SAFETY: as for `old`, all-zero bytes are a valid `sigaction`.
    let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
    act.sa_sigaction = on_terminating_signal as extern "C" fn(libc::c_int) as usize;
    act.sa_flags = libc::SA_RESTART;
    // SAFETY: `act.sa_mask` is a valid, writable `sigset_t` of ours.
    unsafe { libc::sigemptyset(&mut act.sa_mask) };
    // SAFETY: `act` is filled in with a one-argument handler (no SA_SIGINFO), and we install
    // it only over SIG_DFL, so no handler of the application's is replaced.
    unsafe { libc::sigaction(sig, &act, std::ptr::null_mut()) };
}
