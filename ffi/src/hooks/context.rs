//! Contexts: their own memory counts against the limit (as `Kind::Context`), and destroying one
//! releases everything allocated in it.
//!
//! A context costs the GPU hundreds of MiB (its local-memory, printf and heap reservations; 518
//! MiB on an H200), and the limit is about the memory the container's processes really use as
//! NVML reports it. So each `cuCtxCreate*` and the first `cuDevicePrimaryCtxRetain` per device
//! is admitted at its real cost *before* it is created ([`hami_shm::context`],
//! spec/ContextAdmission.tla): the cost of a context is learnt once per device, by the first
//! process that creates one there, and published in the region's tail, where every later
//! process reads and reserves it. The first process (the prober) reserves the whole free part of
//! the limit, creates, measures, publishes and then shrinks to the cost; processes that start
//! meanwhile wait for the publication (at most [`PROBE_WAIT_NS`]). A herd of processes starting
//! together thus gets as many contexts as fit, and the rest `CUDA_ERROR_OUT_OF_MEMORY`, without
//! the real usage ever passing the limit.
//!
//! Measuring: this process's usage of the device in NVML's process list after the creation minus
//! before, found by the host pid (discovered by [`host_pid`] at the first context, or set in its
//! slot by HAMi's monitor), else by its own pid. Without NVML a context counts
//! `HAMI_CONTEXT_SIZE` (default 256 MiB), and the limit is only as good as that figure. A
//! context that measures more than the published cost grows its reservation, or is destroyed
//! again and refused.
//!
//! The cost is released by `cuCtxDestroy*`, or by the `cuDevicePrimaryCtxRelease*` that drops
//! this process's retain count to zero. `cuDevicePrimaryCtxReset*` frees the context's
//! allocations (their records are released) but keeps the context's own cost, since the
//! context is re-created on next use.

use std::ffi::{c_int, c_uint, c_void};

use hami_shm::admission::OutOfMemory;
use hami_shm::context::{self, Admitted, Steps};
use hami_shm::platform::Platform;
use hami_shm::seqlock::Kind;

use crate::log::{log_debug, log_warn};
use crate::platform::{monotonic_ns, ms_between};
use crate::runtime::Runtime;

use super::devices;
use super::hook::hook;
use super::host_pid::{self, processes, usage_of, NewContext, Proc};
use super::table::{self, Key, Record};
use super::types::*;
use super::{active, refused};

/// How long a process waits for another one to measure the first context of a device (it takes
/// a few hundred milliseconds; a prober stopped by a signal or a debugger must not hang the
/// others): past it the context is refused.
const PROBE_WAIT_NS: u64 = 10_000_000_000;
/// The pause between two looks at the probe lease.
const PROBE_POLL_NS: u64 = 2_000_000;

/// The pid NVML reports for this process: the host pid, discovered or set in its slot by HAMi's
/// monitor; else its own pid (right in the driver's pid namespace).
fn my_pid(rt: &Runtime) -> u32 {
    host_pid::known()
        .or_else(|| {
            let slot = rt.own_slot().and_then(|s| rt.region.slot(s))?;
            let h = slot.hostpid_acquire();
            (h > 0).then_some(h as u32)
        })
        .unwrap_or_else(|| rt.platform.self_id().pid() as u32)
}

/// The context's cost: our usage in NVML's list `after` its creation minus `before`.
fn measure(rt: &Runtime, before: Option<&[Proc]>, after: &[Proc]) -> Option<u64> {
    let pid = my_pid(rt);
    let u = usage_of(after, pid)?;
    let b = before.and_then(|l| usage_of(l, pid)).unwrap_or(0);
    Some(u.saturating_sub(b)).filter(|&c| c > 0)
}

/// One context's admission as [`context::admit`] drives it: reservations in this process's
/// slot, the driver's create (measured through NVML) and undo, and the bounded wait.
struct Admission<'a, C, M, U> {
    rt: &'a Runtime,
    what: &'a str,
    dev: usize,
    ordinal: CUdevice,
    create: Option<C>,
    made: M,
    undo: Option<U>,
    deadline_ns: u64,
    /// Why the last reservation was refused, for the line that reports it.
    refusal: Option<OutOfMemory>,
}

impl<C, M, U> Steps for Admission<'_, C, M, U>
where
    C: FnOnce() -> CUresult,
    M: Fn() -> CUcontext,
    U: FnOnce(),
{
    fn reserve(&mut self, bytes: u64) -> bool {
        match super::memory::reserve(self.rt, self.dev, Kind::Context, bytes) {
            Ok(()) => true,
            Err(oom) => {
                self.refusal = Some(oom);
                false
            }
        }
    }

    fn release(&mut self, bytes: u64) {
        self.rt.release(self.dev, Kind::Context, bytes);
    }

    fn free(&mut self) -> Option<u64> {
        let limit = self.rt.limit(self.dev)?;
        Some(limit.saturating_sub(self.rt.usage(self.dev)))
    }

    fn create(&mut self) -> Result<Option<u64>, i32> {
        let Some(create) = self.create.take() else {
            return Err(CUresult::UNKNOWN.0);
        };
        let t0 = monotonic_ns();
        let before = if devices::nvml_ready() || !host_pid::list_before_optional() {
            processes(self.dev)
        } else {
            None
        };
        let t1 = monotonic_ns();
        let r = create();
        let t2 = monotonic_ns();
        if !r.ok() {
            return Err(r.0);
        }
        let new = NewContext {
            dev: self.dev,
            ordinal: self.ordinal,
            ctx: (self.made)(),
        };
        let after =
            host_pid::discover(self.rt, &new, before.as_deref()).or_else(|| processes(self.dev));
        let cost = after.and_then(|a| measure(self.rt, before.as_deref(), &a));
        log_debug!(
            "{}: context on device {} measured {cost:?} bytes; NVML list before {} ms, creation              {} ms, host pid and list after {} ms",
            self.what,
            self.dev,
            ms_between(t0, t1),
            ms_between(t1, t2),
            ms_between(t2, monotonic_ns())
        );
        Ok(cost)
    }

    fn destroy(&mut self) {
        if let Some(undo) = self.undo.take() {
            undo();
        }
    }

    fn wait(&mut self) -> bool {
        if monotonic_ns() >= self.deadline_ns {
            return false;
        }
        self.rt.platform.sleep_ns(PROBE_POLL_NS);
        true
    }
}

/// Creates a context with admission (module docs). `create` makes it; `made` reads it once made;
/// `undo` destroys it again. Returns the driver's result (or OOM) and the bytes reserved.
fn create_counted(
    rt: &Runtime,
    what: &str,
    (dev, ordinal): (usize, CUdevice),
    create: impl FnOnce() -> CUresult,
    made: impl Fn() -> CUcontext,
    undo: impl FnOnce(),
) -> (CUresult, u64) {
    let Some(cell) = rt.ext.context_cell(dev) else {
        return (create(), 0);
    };
    let mut steps = Admission {
        rt,
        what,
        dev,
        ordinal,
        create: Some(create),
        made,
        undo: Some(undo),
        deadline_ns: monotonic_ns().saturating_add(PROBE_WAIT_NS),
        refusal: None,
    };
    match context::admit(cell, &rt.platform, &mut steps, rt.config.context_size) {
        Admitted::Created { reserved } => (CUresult::SUCCESS, reserved),
        Admitted::DriverFailed(code) => (CUresult(code), 0),
        Admitted::Refused { needed } => {
            let oom = steps.refusal.unwrap_or(OutOfMemory::OverLimit {
                used: rt.usage(dev),
                limit: rt.limit(dev).unwrap_or(0),
            });
            (refused(what, dev, needed, oom), 0)
        }
        Admitted::TimedOut => {
            let holder = rt.ext.context_prober(dev).pid();
            log_warn!(
                "Device {dev} OOM: {what} refused: process {holder} has been measuring the first \
                 context on this device for {} s (stopped or hung?); resume or end it and retry",
                PROBE_WAIT_NS / 1_000_000_000
            );
            (CUresult::OUT_OF_MEMORY, 0)
        }
    }
}

/// Releases every allocation record owned by context `ctx`.
fn release_owned(rt: &Runtime, ctx: usize) {
    table::remove_context(ctx, |_, r| super::memory::release_record(rt, &r));
}

fn destroy_ctx(ctx: CUcontext) {
    if let Some(f) = cuCtxDestroy_v2::REAL
        .get()
        .or_else(|| cuCtxDestroy::REAL.get())
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
    // SAFETY: `made` runs only after the driver succeeded (in `create_counted`, and in the undo
    // closure below), so `*pctx` holds the new context.
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
        hook! {
            fn $name(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult;
            |real_fn| {
                // SAFETY: forwarding the caller's arguments unchanged.
                ctx_create("cuCtxCreate", pctx, dev, || unsafe { real_fn(pctx, flags, dev) })
            }
        }
    };
}
ctx_create_v1v2!(cuCtxCreate_v2);
ctx_create_v1v2!(cuCtxCreate);

hook! {
    fn cuCtxCreate_v3(
        pctx: *mut CUcontext,
        params: *mut c_void,
        num_params: c_int,
        flags: c_uint,
        dev: CUdevice,
    ) -> CUresult;
    |real_fn| {
        ctx_create("cuCtxCreate_v3", pctx, dev, || {
            // SAFETY: forwarding the caller's arguments unchanged.
            unsafe { real_fn(pctx, params, num_params, flags, dev) }
        })
    }
}

hook! {
    fn cuCtxCreate_v4(
        pctx: *mut CUcontext,
        params: *mut c_void,
        flags: c_uint,
        dev: CUdevice,
    ) -> CUresult;
    |real_fn| {
        ctx_create("cuCtxCreate_v4", pctx, dev, || {
            // SAFETY: forwarding the caller's arguments unchanged.
            unsafe { real_fn(pctx, params, flags, dev) }
        })
    }
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

/// A hook of one argument that forwards the call and, where it succeeded, hands the argument
/// to `$after` (the end of a context, or of a primary context's use).
macro_rules! forward_then {
    ($name:ident($arg:ident: $ty:ty) => $after:ident) => {
        hook! {
            fn $name($arg: $ty) -> CUresult;
            |real_fn| {
                // SAFETY: forwarding the caller's argument unchanged.
                let r = unsafe { real_fn($arg) };
                if r.ok() {
                    $after($arg);
                }
                r
            }
        }
    };
}
forward_then!(cuCtxDestroy_v2(ctx: CUcontext) => ctx_destroyed);
forward_then!(cuCtxDestroy(ctx: CUcontext) => ctx_destroyed);

hook! {
    fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult;
    |real_fn| {
        // SAFETY: forwarding the caller's arguments unchanged.
        let call = || unsafe { real_fn(pctx, dev) };
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
                if let Some(rel) = cuDevicePrimaryCtxRelease_v2::REAL
                    .get()
                    .or_else(|| cuDevicePrimaryCtxRelease::REAL.get())
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
    }
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

forward_then!(cuDevicePrimaryCtxRelease(dev: CUdevice) => primary_released);
forward_then!(cuDevicePrimaryCtxRelease_v2(dev: CUdevice) => primary_released);

/// After a successful primary-context reset of CUDA device `dev`: the allocations made in it
/// are gone (its cost stays counted while it is retained).
fn primary_reset(dev: CUdevice) {
    if let (Some(a), Some(rec)) = (active(), table::get(Key::Primary(dev))) {
        release_owned(a.rt, rec.ctx);
    }
}

forward_then!(cuDevicePrimaryCtxReset(dev: CUdevice) => primary_reset);
forward_then!(cuDevicePrimaryCtxReset_v2(dev: CUdevice) => primary_reset);
