//! One declaration per hooked function: [`hook!`](crate::hooks::hook) makes the real-function
//! slot, the exported hook and its panic boundary, with the fallbacks that follow from the
//! return type ([`HookReturn`]), as rustls-ffi's `ffi_panic_boundary!` does with
//! `PanicOrDefault`.
//!
//! ```text
//! hook! {
//!     /// Doc comment of the hook.
//!     fn cuGraphLaunch(exec: CUgraphExec, h_stream: CUstream) -> CUresult;
//!     |real| { /* the body; `real` is the real function */ }
//! }
//! ```
//!
//! expands to a module `cuGraphLaunch` holding `REAL`, the slot of the real function (resolved
//! in the library the return type names), and `#[no_mangle] pub unsafe extern "C" fn
//! cuGraphLaunch(...)`, whose body runs inside [`boundary`] after `REAL.require()`: a driver
//! without the function gets `MISSING`, a panic gets `PANICKED`. The registry
//! ([`super::registry`]) still lists the hooks by family: which base name `cuGetProcAddress`
//! asks for, the CUDA version from which each ABI is returned and the `_ptsz` forms are facts
//! about several functions together, which one function's declaration cannot carry.

use super::real::{Lib, CUDA, NVML};
use super::types::{CUresult, NvmlReturn};

/// The return type of a hooked function: the library its real function lives in, and what the
/// hook returns where it cannot run its body.
pub trait HookReturn: Copy {
    /// The library the real function is resolved in.
    const LIB: &'static Lib;
    /// The library lacks the real function.
    const MISSING: Self;
    /// The hook's body panicked.
    const PANICKED: Self;
}

impl HookReturn for CUresult {
    const LIB: &'static Lib = &CUDA;
    const MISSING: Self = CUresult::NOT_FOUND;
    const PANICKED: Self = CUresult::UNKNOWN;
}

impl HookReturn for NvmlReturn {
    const LIB: &'static Lib = &NVML;
    const MISSING: Self = NvmlReturn::FUNCTION_NOT_FOUND;
    const PANICKED: Self = NvmlReturn::UNKNOWN;
}

/// The panic boundary of a hook: runs `body`, and a panic becomes `R::PANICKED` (see
/// [`super::guard`]).
pub(crate) fn boundary<R: HookReturn>(body: impl FnOnce() -> R) -> R {
    super::guard(R::PANICKED, body)
}

/// Declares one hooked function: see the module's documentation.
macro_rules! hook {
    (
        $(#[$attr:meta])*
        fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty;
        |$real:ident| $body:block
    ) => {
        #[doc = concat!("The real `", stringify!($name), "`.")]
        pub mod $name {
            #[allow(unused_imports)] // The signature's types, whatever they are.
            use super::*;

            /// The slot of the real function.
            pub static REAL: $crate::hooks::real::Real<unsafe extern "C" fn($($ty),*) -> $ret> =
                $crate::hooks::real::Real::new(
                    <$ret as $crate::hooks::hook::HookReturn>::LIB,
                    $crate::hooks::real::c_name(concat!(stringify!($name), "\0").as_bytes()),
                );
        }

        $(#[$attr])*
        /// cbindgen:ignore
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            $crate::hooks::hook::boundary(|| {
                let Some($real) = $name::REAL.require() else {
                    return <$ret as $crate::hooks::hook::HookReturn>::MISSING;
                };
                $body
            })
        }
    };
}
pub(crate) use hook;
