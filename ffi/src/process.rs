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
    // SAFETY: signal() and raise() are async-signal-safe; restoring SIG_DFL and re-raising makes
    // the process end exactly as it would have without our handler.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

extern "C" fn in_forked_child() {
    EXIT_SLOT.store(usize::MAX, Ordering::Relaxed);
    if let Some(rt) = runtime::existing() {
        rt.mark_forked();
    }
}

/// Installs the exit, signal and fork handlers, once per process.
pub(crate) fn install(_rt: &'static Runtime) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: registering plain `extern "C"` functions that never unwind; pthread_atfork and
        // atexit have no other preconditions.
        unsafe {
            libc::atexit(at_exit);
            libc::pthread_atfork(None, None, Some(in_forked_child));
        }
        for sig in TERMINATING {
            install_if_default(sig);
        }
    });
}

/// Installs our handler for `sig` only if the disposition is SIG_DFL.
fn install_if_default(sig: libc::c_int) {
    // SAFETY: sigaction with a zeroed, then filled struct; querying first (act = null) changes
    // nothing, and we only install over SIG_DFL.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(sig, std::ptr::null(), &mut old) != 0
            || old.sa_sigaction != libc::SIG_DFL
        {
            return;
        }
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = on_terminating_signal as extern "C" fn(libc::c_int) as usize;
        act.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut act.sa_mask);
        libc::sigaction(sig, &act, std::ptr::null_mut());
    }
}
