//! The library's one `pthread_atfork` registration: what each module must do around a `fork`,
//! in one list, registered once, on the first use of any state that needs it.
//!
//! Before: the hooks' tables take their locks (so no other thread holds one in the child).
//! Parent: they release them. Child (one thread, atomics and no allocation): the runtime learns
//! it runs in a new process, the host-pid search and NVML's initialisation are redone, and the
//! tables are emptied and released.

use std::sync::Once;

use crate::hooks::guard;

extern "C" fn before() {
    guard((), crate::hooks::table::before_fork);
}

extern "C" fn parent() {
    guard((), crate::hooks::table::after_fork_parent);
}

extern "C" fn child() {
    guard((), || {
        crate::process::after_fork();
        crate::hooks::host_pid::after_fork();
        crate::hooks::devices::after_fork();
        crate::hooks::table::after_fork_child();
    });
}

/// Registers the handlers, once per process.
pub(crate) fn install() {
    static ONCE: Once = Once::new();
    if ONCE.is_completed() {
        return;
    }
    ONCE.call_once(|| {
        // SAFETY: registering three `extern "C"` functions that never unwind; pthread_atfork
        // has no other preconditions.
        unsafe { libc::pthread_atfork(Some(before), Some(parent), Some(child)) };
    });
}
