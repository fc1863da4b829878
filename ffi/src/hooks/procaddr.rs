//! `cuGetProcAddress` and `cuGetProcAddress_v2`: how CUDA 12/13 runtimes (and PyTorch's own
//! driver shims) obtain every driver entry point.
//!
//! The real function is called first, with the caller's arguments (so `symbolStatus`, errors
//! and unknown names are the driver's). If it returned a pointer for a name we hook, the pointer
//! is replaced by our hook *of the same ABI*: the variant whose real address the driver returned
//! (`cuMemAlloc` at `cudaVersion` 3020 or later is `cuMemAlloc_v2`; with
//! `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`, `cuLaunchKernel` is `cuLaunchKernel_ptsz`).
//! Only when the driver's pointer is none of the exported variants (the 580 driver's answer for
//! `cuGraphInstantiate` at 12000) does the request decide ([`registry::choose`]): the base name
//! gets our version table's ABI, an exact variant name that variant; the hook then forwards to the
//! driver's export of that ABI, not to the unexported pointer. Asking for `cuGetProcAddress`
//! itself returns our hook, so entry points fetched through the returned pointer are hooked too.

use std::ffi::{c_char, c_int, c_void, CStr};

use super::hook::hook;
use super::registry;
use super::types::*;

/// Replaces `*pfn` by our hook if `symbol` is hooked (see the module docs).
///
/// # Safety
/// `symbol` is null or a C string; `pfn` is null or writable, as the caller passed them to the
/// real function, which succeeded.
unsafe fn substitute(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64) {
    if symbol.is_null() || pfn.is_null() {
        return;
    }
    // SAFETY: non-null, and written by the successful real call.
    let got = unsafe { *pfn };
    if got.is_null() {
        return;
    }
    // SAFETY: non-null C string (the real call just read it).
    let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    let Some(family) = registry::family_of(name) else {
        return;
    };
    if let Some(v) = registry::choose(family, name, got as usize, version, flags) {
        // SAFETY: `pfn` is non-null and writable (see above).
        unsafe { *pfn = v.hook as *mut c_void };
    }
}

hook! {
    fn cuGetProcAddress(
        symbol: *const c_char,
        pfn: *mut *mut c_void,
        cuda_version: c_int,
        flags: Cuuint64,
    ) -> CUresult;
    |real_fn| {
        // SAFETY: forwarding the caller's arguments unchanged.
        let r = unsafe { real_fn(symbol, pfn, cuda_version, flags) };
        if r.ok() {
            // SAFETY: the real call succeeded with these arguments.
            unsafe { substitute(symbol, pfn, cuda_version, flags) };
        }
        r
    }
}

hook! {
    fn cuGetProcAddress_v2(
        symbol: *const c_char,
        pfn: *mut *mut c_void,
        cuda_version: c_int,
        flags: Cuuint64,
        symbol_status: *mut c_int,
    ) -> CUresult;
    |real_fn| {
        // SAFETY: forwarding the caller's arguments unchanged.
        let r = unsafe { real_fn(symbol, pfn, cuda_version, flags, symbol_status) };
        if r.ok() {
            // SAFETY: the real call succeeded with these arguments.
            unsafe { substitute(symbol, pfn, cuda_version, flags) };
        }
        r
    }
}
