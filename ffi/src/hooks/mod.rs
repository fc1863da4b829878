//! The CUDA driver and NVML hooks: what makes `libvgpu.so` a memory limit.
//!
//! # How calls reach us
//!
//! - **Symbol interposition.** Every hook is exported under the driver's own name
//!   (`cuMemAlloc_v2`, `nvmlDeviceGetMemoryInfo`), so a binary linked with `-lcuda` or
//!   `-lnvidia-ml` binds to the preloaded library first.
//! - **`dlsym`** ([`dlsym`]): the CUDA runtime, PyTorch and nvidia-smi `dlopen` the driver and
//!   look names up; our `dlsym` returns the hook for a hooked name the real lookup found.
//! - **`cuGetProcAddress(_v2)`** ([`procaddr`]): CUDA 12/13 runtimes fetch every entry point
//!   through it, by base name plus the CUDA version they were built for plus a per-thread
//!   default-stream flag; we return the hook whose ABI is the one the driver chose.
//!
//! Each hook forwards to the real function resolved from `libcuda.so.1` / `libnvidia-ml.so.1`
//! ([`real`]), never to its own symbol. A function the driver lacks is reported once and the hook
//! returns `CUDA_ERROR_NOT_FOUND` / `NVML_ERROR_FUNCTION_NOT_FOUND`.
//!
//! # What is accounted
//!
//! Every allocation path reserves its bytes in the shared region *before* the real allocation
//! (refused: `CUDA_ERROR_OUT_OF_MEMORY`, and the driver is not called), and rolls the
//! reservation back if the driver fails. Sizes are rounded up to the device's allocation
//! granularity (what `cuMemGetAllocationGranularity` reports, 2 MiB on NVIDIA GPUs), since that is
//! what the GPU really spends. See [`memory`] for the paths and [`context`] for context memory.
//! Frees release exactly what the allocation reserved (a per-process [`table`]); frees of
//! pointers we never saw are passed through.
//!
//! Stream-ordered pools (`cuMemAllocAsync`, `cuMemAllocFromPoolAsync`) are accounted by what
//! they cost the GPU, their *reserve*: a pool keeps freed memory for reuse (up to its release
//! threshold) until it is trimmed. An allocation reserves in the region only what the pool must
//! grow by; `cuMemFreeAsync` returns the bytes to the pool's reserve, which stays counted;
//! `cuMemPoolTrimTo` and `cuMemPoolDestroy` release the unused reserve. When the region refuses
//! any allocation (a pool's growth, `cuMemAlloc`, a context...), the hook trims the device's pools
//! (real `cuMemPoolTrimTo(pool, 0)`, which drops only unused reserve) and tries once more, so
//! memory the application already freed never causes its OOM. The pool map's
//! lock guards the map alone: trims, driver queries and region reservations run with it
//! released, and a driver reading is applied only to the pool model it was taken against.
//! On a driver that releases pool memory at synchronisation (release threshold 0, CUDA's
//! default) the region may count a reserve the driver has already given back, until the next
//! trim: the views then show less free memory than there is, never more.
//!
//! # Device indices
//!
//! All accounting and views use one region device index per CUDA device, the NVML index
//! ([`devices`]).

#![allow(clippy::missing_safety_doc)] // The hooks' contracts are the CUDA and NVML APIs'.
#![allow(non_snake_case)] // Hooks carry the driver's names.
#![allow(clippy::too_many_arguments)] // Launch hooks take the driver's argument lists.

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};

use hami_shm::admission::OutOfMemory;
use hami_shm::seqlock::Kind;

use crate::log::{log_info, log_warn};
use crate::runtime::{self, Runtime};

pub mod context;
pub mod devices;
pub mod dlsym;
pub mod graph;
pub mod hook;
pub mod host_pid;
pub mod launch;
pub mod memory;
pub mod nvml;
pub mod nvml_procs;
pub mod procaddr;
pub mod real;
pub mod registry;
pub mod table;
pub mod types;

use types::CUresult;

/// Runs a hook's body (or another entry from C: `dlsym`, the fork handlers); a panic becomes
/// `fallback` instead of unwinding into C or killing the application (the release profile
/// unwinds for this). Entries without it abort at their `extern "C"` boundary on a panic, the
/// last resort: the signal handlers (std's panic machinery allocates and locks, which a handler
/// must not) and functions of atomics and libc calls only, which cannot panic.
pub(crate) fn guard<R>(fallback: R, f: impl FnOnce() -> R) -> R {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(fallback)
}

thread_local! {
    /// This thread is inside an accounting hook (the driver may call our exports from inside
    /// the real function; such nested calls are passed through, not counted twice).
    static IN_HOOK: Cell<bool> = const { Cell::new(false) };
}

/// An accounting hook in progress on this thread.
pub(crate) struct Active {
    /// The process's runtime.
    pub rt: &'static Runtime,
}

impl Drop for Active {
    fn drop(&mut self) {
        let _ = IN_HOOK.try_with(|c| c.set(false));
    }
}

/// The runtime, if this call should be accounted: `None` inside our own initialisation, inside
/// another hook on this thread, or if the runtime is unavailable. `None` means "pass through".
pub(crate) fn active() -> Option<Active> {
    // A thread whose TLS is being torn down still accounts (its frees must be released).
    if IN_HOOK.try_with(|c| c.replace(true)).unwrap_or(false) {
        return None;
    }
    match runtime::get() {
        Some(rt) => Some(Active { rt }),
        None => {
            let _ = IN_HOOK.try_with(|c| c.set(false));
            None
        }
    }
}

static FIRST_REFUSAL: AtomicBool = AtomicBool::new(true);

/// Logs a refused allocation (the first at warning level, later ones at info) and returns
/// `CUDA_ERROR_OUT_OF_MEMORY`. The line names the real obstacle: the limit, a size that cannot
/// be counted, or a process that could not register in the region.
pub(crate) fn refused(what: &str, dev: usize, bytes: u64, oom: OutOfMemory) -> CUresult {
    let why = match oom {
        OutOfMemory::OverLimit { used, limit } => {
            format!("{used} of {limit} bytes in use (CUDA_DEVICE_MEMORY_LIMIT)")
        }
        OutOfMemory::TooLarge => "the size cannot be counted beside what this process holds \
             (it overflows 64 bits)"
            .to_string(),
        OutOfMemory::Unregistered => "this process is not registered in the shared region \
             (see the earlier line)"
            .to_string(),
        OutOfMemory::NoRegion => {
            "this process cannot count its memory where the container's other processes see \
             it (see the earlier line)"
                .to_string()
        }
    };
    if FIRST_REFUSAL.swap(false, Ordering::Relaxed) {
        log_warn!("Device {dev} OOM: {what} of {bytes} bytes refused, {why}");
    } else {
        log_info!("Device {dev} OOM: {what} of {bytes} bytes refused, {why}");
    }
    CUresult::OUT_OF_MEMORY
}

/// Moves a reservation of `reserved` bytes to `actual` bytes (after the driver told us the real
/// size). On refusal the original reservation is still held.
pub(crate) fn adjust(
    rt: &Runtime,
    dev: usize,
    kind: Kind,
    reserved: u64,
    actual: u64,
) -> Result<(), OutOfMemory> {
    if actual > reserved {
        memory::reserve(rt, dev, kind, actual - reserved)
    } else {
        if reserved > actual {
            rt.release(dev, kind, reserved - actual);
        }
        Ok(())
    }
}
