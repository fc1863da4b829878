//! The real driver: `libcuda.so.1` and `libnvidia-ml.so.1` opened at run time, their functions
//! resolved lazily, one at a time, through the real `dlsym`.
//!
//! Nothing here takes a lock or a once-cell: every slot is an atomic that racing threads fill
//! with the same value, so a hook may run from any thread, before `main`, or inside the driver's
//! own initialisation. A function is looked up in the driver's own handle, whose search scope is
//! the driver and its dependencies, never the preloaded library, so a real pointer is never one
//! of our hooks (nothing recurses).

use std::ffi::{c_char, c_int, c_void, CStr};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::log::log_warn;

use super::types::*;

/// The signature of `dlsym`.
pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// The real `dlsym`'s address, 0 until resolved. Read by the `dlsym` trampoline (dlsym.rs).
pub(crate) static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

/// Resolves the real `dlsym` (the next definition after this library: glibc's) and stores it in
/// [`REAL_DLSYM`]; returns it, or 0. Calls only `dlvsym`, which we do not hook, so it cannot
/// recurse.
pub(crate) extern "C" fn resolve_real_dlsym() -> usize {
    let cached = REAL_DLSYM.load(Ordering::Acquire);
    if cached != 0 {
        return cached;
    }
    // glibc 2.34 moved dlsym into libc with a new version; older ones define it in libdl.
    const VERSIONS: [&CStr; 3] = [c"GLIBC_2.34", c"GLIBC_2.2.5", c"GLIBC_2.17"];
    for v in VERSIONS {
        // SAFETY: dlvsym with RTLD_NEXT and two NUL-terminated literals; it returns an address
        // or null and has no other effect.
        let p = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), v.as_ptr()) };
        if !p.is_null() {
            REAL_DLSYM.store(p as usize, Ordering::Release);
            return p as usize;
        }
    }
    0
}

/// The real `dlsym`, if it can be found.
pub fn real_dlsym() -> Option<DlsymFn> {
    let p = resolve_real_dlsym();
    if p == 0 {
        return None;
    }
    // SAFETY: `p` is the address of glibc's dlsym, whose signature is DlsymFn.
    Some(unsafe { std::mem::transmute::<usize, DlsymFn>(p) })
}

/// Looks `name` up with the real dlsym in `handle`.
///
/// # Safety
/// `handle` is a handle `dlopen` returned (and not closed) or a dlsym pseudo-handle.
pub unsafe fn lookup(handle: *mut c_void, name: &CStr) -> *mut c_void {
    match real_dlsym() {
        // SAFETY: the real dlsym with a valid handle (the caller's contract) and a C string.
        Some(f) => unsafe { f(handle, name.as_ptr()) },
        None => std::ptr::null_mut(),
    }
}

/// Slot states besides an address.
const UNRESOLVED: usize = 0;
const MISSING: usize = 1;

/// A library opened on first use.
pub struct Lib {
    name: &'static CStr,
    handle: AtomicUsize,
}

impl Lib {
    const fn new(name: &'static CStr) -> Lib {
        Lib {
            name,
            handle: AtomicUsize::new(UNRESOLVED),
        }
    }

    /// The library's handle, or `None` if it cannot be loaded.
    pub fn handle(&self) -> Option<*mut c_void> {
        match self.handle.load(Ordering::Acquire) {
            MISSING => None,
            UNRESOLVED => {
                // SAFETY: dlopen of a library name; if the application already loaded it this
                // returns the same object. A constructor it runs may call back into our exports,
                // which only read atomics here.
                let h =
                    unsafe { libc::dlopen(self.name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
                if h.is_null() {
                    if self.handle.swap(MISSING, Ordering::AcqRel) != MISSING {
                        log_warn!(
                            "cannot load {}: the real driver is not available, hooked calls \
                             return an error",
                            self.name.to_string_lossy()
                        );
                    }
                    None
                } else {
                    self.handle.store(h as usize, Ordering::Release);
                    Some(h)
                }
            }
            h => Some(h as *mut c_void),
        }
    }

    /// Looks `name` up in this library; null if it is absent (or the library is).
    pub fn symbol(&self, name: &CStr) -> *mut c_void {
        match self.handle() {
            // SAFETY: `h` came from dlopen and is never closed.
            Some(h) => unsafe { lookup(h, name) },
            None => std::ptr::null_mut(),
        }
    }
}

/// The CUDA driver.
pub static CUDA: Lib = Lib::new(c"libcuda.so.1");
/// NVML.
pub static NVML: Lib = Lib::new(c"libnvidia-ml.so.1");

/// A real function of type `F` (an `unsafe extern "C" fn` pointer), resolved on first use.
pub struct Real<F> {
    lib: &'static Lib,
    name: &'static CStr,
    addr: AtomicUsize,
    reported: crate::log::Once,
    _f: PhantomData<F>,
}

impl<F: Copy> Real<F> {
    /// A slot for `name` in `lib`. `F` must be a function pointer.
    pub const fn new(lib: &'static Lib, name: &'static CStr) -> Self {
        assert!(std::mem::size_of::<F>() == std::mem::size_of::<usize>());
        Real {
            lib,
            name,
            addr: AtomicUsize::new(UNRESOLVED),
            reported: crate::log::Once::new(),
            _f: PhantomData,
        }
    }

    /// The function's address, 0 if the library lacks it.
    pub fn addr(&self) -> usize {
        match self.addr.load(Ordering::Acquire) {
            MISSING => 0,
            UNRESOLVED => {
                let p = self.lib.symbol(self.name) as usize;
                // A failed dlopen is retried never; a missing symbol is remembered as missing.
                self.addr
                    .store(if p == 0 { MISSING } else { p }, Ordering::Release);
                p
            }
            p => p,
        }
    }

    /// The function, or `None` if the library lacks it (silently: for optional helpers).
    pub fn get(&self) -> Option<F> {
        let p = self.addr();
        if p == 0 {
            return None;
        }
        // SAFETY: `F` is a function pointer type (size checked in `new`), and `p` is the
        // address dlsym returned for the function whose C signature `F` declares.
        Some(unsafe { std::mem::transmute_copy::<usize, F>(&p) })
    }

    /// The function, or `None` after logging (once per function) that the driver lacks it. For
    /// the function a hook forwards to.
    pub fn require(&self) -> Option<F> {
        let f = self.get();
        if f.is_none() && self.reported.first() {
            log_warn!(
                "{} has no {}: the call returns an error instead",
                self.lib.name.to_string_lossy(),
                self.name.to_string_lossy()
            );
        }
        f
    }
}

/// `name`, which ends with its NUL, as a C string (for the slot macros, at compile time).
pub const fn c_name(name: &'static [u8]) -> &'static CStr {
    match CStr::from_bytes_with_nul(name) {
        Ok(c) => c,
        Err(_) => panic!("symbol name without its NUL or with another"),
    }
}

macro_rules! real_fns {
    ($lib:ident; $( $name:ident ( $($ty:ty),* $(,)? ) -> $ret:ty; )*) => {
        $(
            #[allow(non_upper_case_globals)]
            #[doc = concat!("The real `", stringify!($name), "`.")]
            pub static $name: Real<unsafe extern "C" fn($($ty),*) -> $ret> = Real::new(
                &$lib,
                c_name(concat!(stringify!($name), "\0").as_bytes()),
            );
        )*
    };
}

type SizeP = *mut usize;

real_fns! { CUDA;
    cuDeviceGet(*mut CUdevice, c_int) -> CUresult;
    cuDeviceGetCount(*mut c_int) -> CUresult;
    cuDeviceGetUuid(*mut CUuuid, CUdevice) -> CUresult;
    cuDeviceGetUuid_v2(*mut CUuuid, CUdevice) -> CUresult;
    cuCtxGetDevice(*mut CUdevice) -> CUresult;
    cuCtxGetCurrent(*mut CUcontext) -> CUresult;
    cuCtxPushCurrent_v2(CUcontext) -> CUresult;
    cuCtxPopCurrent_v2(*mut CUcontext) -> CUresult;
    cuMemGetAllocationGranularity(SizeP, *const CUmemAllocationProp, c_int) -> CUresult;
    cuArrayGetMemoryRequirements(*mut CudaArrayMemoryRequirements, CUarray, CUdevice) -> CUresult;
    cuMipmappedArrayGetMemoryRequirements(*mut CudaArrayMemoryRequirements, CUmipmappedArray, CUdevice) -> CUresult;

    cuDeviceGetMemPool(*mut CUmemoryPool, CUdevice) -> CUresult;
    cuMemPoolGetAttribute(CUmemoryPool, c_int, *mut c_void) -> CUresult;

    cuGraphGetNodes(CUgraph, *mut CUgraphNode, SizeP) -> CUresult;
    cuGraphNodeGetType(CUgraphNode, *mut c_int) -> CUresult;
    cuGraphKernelNodeGetParams(CUgraphNode, *mut CudaKernelNodeParams) -> CUresult;
    cuGraphKernelNodeGetParams_v2(CUgraphNode, *mut CudaKernelNodeParams) -> CUresult;
    cuGraphChildGraphNodeGetGraph(CUgraphNode, *mut CUgraph) -> CUresult;
    cuGraphNodeGetParams(CUgraphNode, *mut CUgraphNodeParams) -> CUresult;
}

real_fns! { NVML;
    nvmlInit_v2() -> NvmlReturn;
    nvmlDeviceGetCount_v2(*mut u32) -> NvmlReturn;
    nvmlDeviceGetHandleByIndex_v2(u32, *mut NvmlDevice) -> NvmlReturn;
    nvmlDeviceGetUUID(NvmlDevice, *mut c_char, u32) -> NvmlReturn;
    nvmlDeviceGetIndex(NvmlDevice, *mut u32) -> NvmlReturn;
    nvmlDeviceGetMaxMigDeviceCount(NvmlDevice, *mut u32) -> NvmlReturn;
    nvmlDeviceGetMigDeviceHandleByIndex(NvmlDevice, u32, *mut NvmlDevice) -> NvmlReturn;
}
