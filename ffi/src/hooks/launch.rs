//! Kernel launches and `cuInit`: every launch form (legacy and per-thread default stream,
//! `cuLaunchKernelEx`, cooperative launches and graph launches) passes through
//! [`crate::sm_limit::before_launch`] with the region device of the current context, the
//! launch's block count and what it runs (the function, or the graph), then the real launch. A
//! graph launch's block count is the one counted when the graph was instantiated
//! ([`super::graph`]); one block for a graph not seen then.

use std::ffi::{c_uint, c_void};
use std::sync::atomic::{AtomicBool, Ordering};

use super::hook::hook;
use super::types::*;
use super::{devices, graph, nvml};

/// Before a launch of `blocks` blocks of `kernel` (a function or graph handle) on the current
/// device: waits while suspended, records the launch for HAMi's monitor (`last_kernel_time`),
/// and calls the SM limiter.
fn before_launch(blocks: u64, kernel: *mut c_void) {
    let Some(rt) = crate::runtime::get() else {
        return;
    };
    crate::suspend::wait_while_suspended(rt);
    crate::capi::record_kernel_launch(rt);
    start_limiter(rt);
    // Without a limited device the limiter has nothing to do: skip asking the driver for the
    // current device (one driver call per launch).
    if !crate::sm_limit::any_limited() {
        return;
    }
    if let Some((_, dev)) = devices::current(rt) {
        crate::sm_limit::before_launch(dev, blocks, kernel as usize);
    }
}

/// Starts the SM limiter (once), handing it the NVML utilisation source.
pub(crate) fn start_limiter(rt: &'static crate::runtime::Runtime) {
    static STARTED: AtomicBool = AtomicBool::new(false);
    if STARTED.load(Ordering::Relaxed) || STARTED.swap(true, Ordering::AcqRel) {
        return;
    }
    crate::sm_limit::start(rt, nvml::limiter_view);
}

fn blocks(x: c_uint, y: c_uint, z: c_uint) -> u64 {
    u64::from(x)
        .saturating_mul(u64::from(y))
        .saturating_mul(u64::from(z))
}

/// The blocks of a launch's grid, saturating.
pub(crate) fn grid_blocks(d: &LaunchDims) -> u64 {
    blocks(d.grid_dim_x, d.grid_dim_y, d.grid_dim_z)
}

hook! {
    fn cuInit(flags: c_uint) -> CUresult;
    |real_fn| {
        super::devices::prepare_nvml();
        // SAFETY: forwarding the caller's argument unchanged.
        let r = unsafe { real_fn(flags) };
        if r.ok() {
            if let Some(rt) = crate::runtime::get() {
                start_limiter(rt);
            }
        }
        r
    }
}

/// The launches by grid (`cuLaunchKernel` with `extra`, `cuLaunchCooperativeKernel` without).
macro_rules! launch_grid {
    ($name:ident $(, $extra:ident)?) => {
        hook! {
            fn $name(
                f: CUfunction,
                grid_x: c_uint,
                grid_y: c_uint,
                grid_z: c_uint,
                block_x: c_uint,
                block_y: c_uint,
                block_z: c_uint,
                shared_mem_bytes: c_uint,
                h_stream: CUstream,
                kernel_params: *mut *mut c_void
                $(, $extra: *mut *mut c_void)?
            ) -> CUresult;
            |real_fn| {
                before_launch(blocks(grid_x, grid_y, grid_z), f);
                // SAFETY: forwarding the caller's arguments unchanged.
                unsafe {
                    real_fn(
                        f,
                        grid_x,
                        grid_y,
                        grid_z,
                        block_x,
                        block_y,
                        block_z,
                        shared_mem_bytes,
                        h_stream,
                        kernel_params
                        $(, $extra)?
                    )
                }
            }
        }
    };
}
launch_grid!(cuLaunchKernel, extra);
launch_grid!(cuLaunchKernel_ptsz, extra);
launch_grid!(cuLaunchCooperativeKernel);
launch_grid!(cuLaunchCooperativeKernel_ptsz);

macro_rules! launch_ex {
    ($name:ident) => {
        hook! {
            fn $name(
                config: *const CUlaunchConfig,
                f: CUfunction,
                kernel_params: *mut *mut c_void,
                extra: *mut *mut c_void,
            ) -> CUresult;
            |real_fn| {
                // SAFETY: null-checked; per the API a non-null config points to a CUlaunchConfig.
                if let Some(c) = unsafe { config.as_ref() } {
                    before_launch(grid_blocks(&c.dims), f);
                }
                // SAFETY: forwarding the caller's arguments unchanged.
                unsafe { real_fn(config, f, kernel_params, extra) }
            }
        }
    };
}
launch_ex!(cuLaunchKernelEx);
launch_ex!(cuLaunchKernelEx_ptsz);

macro_rules! graph_launch {
    ($name:ident) => {
        hook! {
            fn $name(exec: CUgraphExec, h_stream: CUstream) -> CUresult;
            |real_fn| {
                before_launch(graph::launch_blocks(exec).unwrap_or(1), exec);
                // SAFETY: forwarding the caller's arguments unchanged.
                unsafe { real_fn(exec, h_stream) }
            }
        }
    };
}
graph_launch!(cuGraphLaunch);
graph_launch!(cuGraphLaunch_ptsz);
