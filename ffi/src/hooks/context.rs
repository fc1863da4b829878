//! Contexts: their own memory counts against the limit (as `Kind::Context`), and destroying one
//! releases everything allocated in it.
//!
//! A context costs the GPU hundreds of MiB (its local-memory, printf and heap reservations, and
//! on real GPUs the runtime's first module loads), and the limit is about the memory the
//! container's processes really use as NVML reports it. So each `cuCtxCreate*` and the first
//! `cuDevicePrimaryCtxRetain` per device:
//!
//! 1. reserves an *estimate* first (admission before creation; refused → `CUDA_ERROR_OUT_OF_MEMORY`
//!    and no context): the last cost measured on that device in this process, else
//!    `HAMI_CONTEXT_SIZE` (a size such as `512m`), else 256 MiB;
//! 2. creates the context; the process's first one also finds its host pid ([`host_pid`]).
//!    Then it **measures** the context's cost: this process's usage of the device in NVML's
//!    process list after minus before, found by the host pid (discovered, or set in its slot by
//!    HAMi's monitor), else by its own pid. If it cannot be measured, the estimate stands;
//! 3. moves the reservation to the measured cost. If the larger cost no longer fits, the
//!    context is destroyed again and the call returns `CUDA_ERROR_OUT_OF_MEMORY`, so the real
//!    usage stays within the limit.
//!
//! The cost is released by `cuCtxDestroy*`, or by the `cuDevicePrimaryCtxRelease*` that drops
//! this process's retain count to zero. `cuDevicePrimaryCtxReset*` frees the context's
//! allocations (their records are released) but keeps the context's own cost, since the
//! context is re-created on next use.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicU64, Ordering};

use hami_shm::layout::ABI_DEVS;
use hami_shm::platform::Platform;
use hami_shm::seqlock::Kind;

use crate::log::log_debug;
use crate::platform::{monotonic_ns, ms_between};
use crate::runtime::Runtime;

use super::devices;
use super::host_pid::{self, processes, usage_of, NewContext, Proc};
use super::table::{self, Key, Record};
use super::types::*;
use super::{active, adjust, guard, real, refused};

/// The last measured context cost per region device (0 = none yet).
static LAST_COST: [AtomicU64; ABI_DEVS] = [const { AtomicU64::new(0) }; ABI_DEVS];

/// The estimate for a new context on `dev`: the last cost measured there, else the configured
/// one (`HAMI_CONTEXT_SIZE`, read and reported with the rest of the configuration).
fn estimate(rt: &Runtime, dev: usize) -> u64 {
    match LAST_COST.get(dev).map(|c| c.load(Ordering::Relaxed)) {
        Some(c) if c != 0 => c,
        _ => rt.config.context_size,
    }
}

/// The pid NVML reports for this process: the host pid, discovered or set in its slot by HAMi's
/// monitor; else its own pid (right in the driver's pid namespace).
fn my_pid(rt: &Runtime) -> u32 {
    host_pid::known()
        .or_else(|| {
            let slot = rt.own_slot().and_then(|s| rt.region.procs.get(s))?;
            let h = slot.hostpid.load(Ordering::Acquire);
            (h > 0).then_some(h as u32)
        })
        .unwrap_or_else(|| rt.platform.self_id().pid() as u32)
}

/// The context's cost: our usage in NVML's list `after` its creation minus `before`.
fn measure(rt: &Runtime, before: Option<&[Proc]>, after: &[Proc]) -> Option<u64> {
    let pid = my_pid(rt);
    let u = usage_of(after, pid)?;
    let b = before.and_then(|l| usage_of(l, pid)).unwrap_or(0);
    Some(u.saturating_sub(b))
}

/// Creates a context with admission and measurement (module docs). `create` makes it; `undo`
/// destroys it again. Returns the driver's result (or OOM) and the bytes reserved.
fn create_counted(
    rt: &Runtime,
    what: &str,
    (dev, ordinal): (usize, CUdevice),
    create: impl FnOnce() -> CUresult,
    made: impl FnOnce() -> CUcontext,
    undo: impl FnOnce(),
) -> (CUresult, u64) {
    let est = estimate(rt, dev);
    if let Err(oom) = super::memory::reserve(rt, dev, Kind::Context, est) {
        return (refused(what, dev, est, oom), 0);
    }
    let t0 = monotonic_ns();
    let before = if devices::nvml_ready() || !host_pid::list_before_optional() {
        processes(dev)
    } else {
        None
    };
    let t1 = monotonic_ns();
    let r = create();
    let t2 = monotonic_ns();
    if !r.ok() {
        rt.release(dev, Kind::Context, est);
        return (r, 0);
    }
    let new = NewContext {
        dev,
        ordinal,
        ctx: made(),
    };
    let after = host_pid::discover(rt, &new, before.as_deref()).or_else(|| processes(dev));
    let cost = match after.and_then(|a| measure(rt, before.as_deref(), &a)) {
        Some(c) if c > 0 => {
            if let Some(slot) = LAST_COST.get(dev) {
                slot.store(c, Ordering::Relaxed);
            }
            c
        }
        _ => est,
    };
    log_debug!(
        "{what}: context on device {dev} costs {cost} bytes (estimate {est}); NVML list before \
         {} ms, creation {} ms, host pid and list after {} ms",
        ms_between(t0, t1),
        ms_between(t1, t2),
        ms_between(t2, monotonic_ns())
    );
    if let Err(oom) = adjust(rt, dev, Kind::Context, est, cost) {
        undo();
        rt.release(dev, Kind::Context, est);
        return (refused(what, dev, cost, oom), 0);
    }
    (r, cost)
}

/// Releases every allocation record owned by context `ctx`.
fn release_owned(rt: &Runtime, ctx: usize) {
    table::remove_context(ctx, |_, r| super::memory::release_record(rt, &r));
}

fn destroy_ctx(ctx: CUcontext) {
    if let Some(f) = real::cuCtxDestroy_v2
        .get()
        .or_else(|| real::cuCtxDestroy.get())
    {
        // SAFETY: destroying the context the driver just created for us.
        let _ = unsafe { f(ctx) };
    }
}

/// A `cuCtxCreate*` variant: `create` makes the context into `*pctx` on CUDA device `ordinal`.
fn ctx_create(
    what: &str,
    pctx: *mut CUcontext,
    ordinal: CUdevice,
    create: impl FnOnce() -> CUresult,
) -> CUresult {
    let Some(a) = active() else {
        return create();
    };
    if pctx.is_null() {
        return create();
    }
    let Some(dev) = devices::region_index(a.rt, ordinal) else {
        return create();
    };
    // SAFETY (both closures): they run only after the driver succeeded, so `*pctx` holds the
    // new context.
    let made = || unsafe { *pctx };
    let (r, cost) = create_counted(a.rt, what, (dev, ordinal), create, made, || {
        destroy_ctx(made())
    });
    if r.ok() {
        // SAFETY: as above.
        let ctx = unsafe { *pctx } as usize;
        if let Some(old) = table::insert(
            Key::Ctx(ctx),
            Record {
                dev,
                bytes: cost,
                kind: Kind::Context,
                ctx,
                refs: 1,
                pool: 0,
            },
        ) {
            a.rt.release(old.dev, old.kind, old.bytes);
        }
    }
    r
}

macro_rules! ctx_create_v1v2 {
    ($name:ident) => {
        /// cbindgen:ignore
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            pctx: *mut CUcontext,
            flags: c_uint,
            dev: CUdevice,
        ) -> CUresult {
            guard(CUresult::UNKNOWN, || {
                let Some(f) = real::$name.require() else {
                    return CUresult::NOT_FOUND;
                };
                // SAFETY: forwarding the caller's arguments unchanged.
                ctx_create("cuCtxCreate", pctx, dev, || unsafe { f(pctx, flags, dev) })
            })
        }
    };
}
ctx_create_v1v2!(cuCtxCreate_v2);
ctx_create_v1v2!(cuCtxCreate);

/// cbindgen:ignore
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v3(
    pctx: *mut CUcontext,
    params: *mut c_void,
    num_params: c_int,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    guard(CUresult::UNKNOWN, || {
        let Some(f) = real::cuCtxCreate_v3.require() else {
            return CUresult::NOT_FOUND;
        };
        ctx_create("cuCtxCreate_v3", pctx, dev, || {
            // SAFETY: forwarding the caller's arguments unchanged.
            unsafe { f(pctx, params, num_params, flags, dev) }
        })
    })
}

/// cbindgen:ignore
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v4(
    pctx: *mut CUcontext,
    params: *mut c_void,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    guard(CUresult::UNKNOWN, || {
        let Some(f) = real::cuCtxCreate_v4.require() else {
            return CUresult::NOT_FOUND;
        };
        ctx_create("cuCtxCreate_v4", pctx, dev, || {
            // SAFETY: forwarding the caller's arguments unchanged.
            unsafe { f(pctx, params, flags, dev) }
        })
    })
}

/// After a successful destruction of `ctx`: releases its cost and its allocations.
fn ctx_destroyed(ctx: CUcontext) {
    let Some(a) = active() else {
        return;
    };
    let ctx = ctx as usize;
    if let Some(rec) = table::remove(Key::Ctx(ctx)) {
        a.rt.release(rec.dev, rec.kind, rec.bytes);
    }
    release_owned(a.rt, ctx);
}

macro_rules! ctx_destroy {
    ($name:ident) => {
        /// cbindgen:ignore
        #[no_mangle]
        pub unsafe extern "C" fn $name(ctx: CUcontext) -> CUresult {
            guard(CUresult::UNKNOWN, || {
                let Some(f) = real::$name.require() else {
                    return CUresult::NOT_FOUND;
                };
                // SAFETY: forwarding the caller's argument unchanged.
                let r = unsafe { f(ctx) };
                if r.ok() {
                    ctx_destroyed(ctx);
                }
                r
            })
        }
    };
}
ctx_destroy!(cuCtxDestroy_v2);
ctx_destroy!(cuCtxDestroy);

/// cbindgen:ignore
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    guard(CUresult::UNKNOWN, || {
        let Some(f) = real::cuDevicePrimaryCtxRetain.require() else {
            return CUresult::NOT_FOUND;
        };
        // SAFETY: forwarding the caller's arguments unchanged.
        let call = || unsafe { f(pctx, dev) };
        let Some(a) = active() else {
            return call();
        };
        if pctx.is_null() {
            return call();
        }
        let Some(idx) = devices::region_index(a.rt, dev) else {
            return call();
        };
        let retained = table::get(Key::Primary(dev)).is_some_and(|r| r.refs > 0);
        if retained {
            let r = call();
            if r.ok() {
                let init = Record {
                    dev: idx,
                    bytes: 0,
                    kind: Kind::Context,
                    ctx: 0,
                    refs: 0,
                    pool: 0,
                };
                table::update(Key::Primary(dev), init, |rec| {
                    rec.refs = rec.refs.saturating_add(1);
                    true
                });
            }
            return r;
        }
        // SAFETY: runs only after the driver succeeded, so `*pctx` holds the primary context.
        let made = || unsafe { *pctx };
        let (r, cost) = create_counted(
            a.rt,
            "cuDevicePrimaryCtxRetain",
            (idx, dev),
            call,
            made,
            || {
                if let Some(rel) = real::cuDevicePrimaryCtxRelease_v2
                    .get()
                    .or_else(|| real::cuDevicePrimaryCtxRelease.get())
                {
                    // SAFETY: dropping the retain the driver just granted.
                    let _ = unsafe { rel(dev) };
                }
            },
        );
        if r.ok() {
            // SAFETY: the driver succeeded, so `*pctx` holds the primary context.
            let ctx = unsafe { *pctx } as usize;
            let init = Record {
                dev: idx,
                bytes: 0,
                kind: Kind::Context,
                ctx,
                refs: 0,
                pool: 0,
            };
            let mut surplus = 0;
            table::update(Key::Primary(dev), init, |rec| {
                if rec.refs == 0 {
                    rec.bytes = cost;
                    rec.ctx = ctx;
                    rec.dev = idx;
                } else {
                    surplus = cost; // another thread counted it first
                }
                rec.refs = rec.refs.saturating_add(1);
                true
            });
            if surplus > 0 {
                a.rt.release(idx, Kind::Context, surplus);
            }
        }
        r
    })
}

/// After a successful primary-context release of CUDA device `dev`.
fn primary_released(dev: CUdevice) {
    let Some(a) = active() else {
        return;
    };
    let Some(rec) = table::get(Key::Primary(dev)) else {
        return;
    };
    let after = table::update(Key::Primary(dev), rec, |r| {
        r.refs = r.refs.saturating_sub(1);
        r.refs > 0
    });
    if after.refs == 0 {
        a.rt.release(after.dev, Kind::Context, after.bytes);
        release_owned(a.rt, after.ctx);
    }
}

macro_rules! primary_release {
    ($name:ident) => {
        /// cbindgen:ignore
        #[no_mangle]
        pub unsafe extern "C" fn $name(dev: CUdevice) -> CUresult {
            guard(CUresult::UNKNOWN, || {
                let Some(f) = real::$name.require() else {
                    return CUresult::NOT_FOUND;
                };
                // SAFETY: forwarding the caller's argument unchanged.
                let r = unsafe { f(dev) };
                if r.ok() {
                    primary_released(dev);
                }
                r
            })
        }
    };
}
primary_release!(cuDevicePrimaryCtxRelease);
primary_release!(cuDevicePrimaryCtxRelease_v2);

macro_rules! primary_reset {
    ($name:ident) => {
        /// cbindgen:ignore
        #[no_mangle]
        pub unsafe extern "C" fn $name(dev: CUdevice) -> CUresult {
            guard(CUresult::UNKNOWN, || {
                let Some(f) = real::$name.require() else {
                    return CUresult::NOT_FOUND;
                };
                // SAFETY: forwarding the caller's argument unchanged.
                let r = unsafe { f(dev) };
                if r.ok() {
                    if let (Some(a), Some(rec)) = (active(), table::get(Key::Primary(dev))) {
                        release_owned(a.rt, rec.ctx);
                    }
                }
                r
            })
        }
    };
}
primary_reset!(cuDevicePrimaryCtxReset);
primary_reset!(cuDevicePrimaryCtxReset_v2);
