//! Suspension: a slot whose `status` is 2 ([`STATUS_SUSPENDED`], set by `shrreg-tool --suspend`,
//! the C API's `suspend_all`, or a C peer's SIGUSR2 handler) makes its process's kernel launches
//! and allocations wait until the status is 1 again (`--resume`), as upstream's `ENSURE_RUNNING`
//! does. Unlike upstream, only status 2 waits (a slot left at 0 by a peer never hangs us, B3a),
//! and the wait is bounded: after [`SUSPEND_MAX_NS`] the call goes on, with one warning, because
//! a suspender that died would otherwise hang the program for good.

use hami_shm::layout::STATUS_SUSPENDED;
use hami_shm::platform::Platform;

use crate::log::{self, log_warn};
use crate::runtime::Runtime;

/// Longest one launch or allocation waits while suspended.
const SUSPEND_MAX_NS: u64 = 60_000_000_000;
/// How often the status is read again while waiting.
const POLL_NS: u64 = 10_000_000;
/// Said once: a call went on after [`SUSPEND_MAX_NS`].
static SUSPEND_TIMEOUT: log::Once = log::Once::new();

/// Waits while this process's slot is suspended (bounded; see the module docs). One relaxed
/// load of the status when running.
pub fn wait_while_suspended(rt: &Runtime) {
    if suspended(rt) {
        wait(rt);
    }
}

fn suspended(rt: &Runtime) -> bool {
    rt.own_slot()
        .and_then(|s| rt.region.slot(s))
        .is_some_and(|p| p.status() == STATUS_SUSPENDED)
}

#[cold]
fn wait(rt: &Runtime) {
    let start = rt.platform.now_ns();
    while suspended(rt) {
        if rt.platform.now_ns().saturating_sub(start) >= SUSPEND_MAX_NS {
            if SUSPEND_TIMEOUT.first() {
                log_warn!(
                    "this process was suspended (slot status 2) for {} s; going on with the call \
                     (resume it with shrreg-tool --resume, or the suspender is gone)",
                    SUSPEND_MAX_NS / 1_000_000_000
                );
            }
            return;
        }
        rt.platform.sleep_ns(POLL_NS);
    }
}
