//! Our exported `dlsym`: the CUDA runtime, PyTorch and nvidia-smi find the driver's entry points
//! with `dlopen` + `dlsym`, so a hooked name must resolve to our hook.
//!
//! The hook calls the real `dlsym` first and substitutes our function only when the real lookup
//! found the name and the name is one we hook; everything else, and every lookup that fails, is
//! the real answer untouched (so a caller probing for an optional driver function still gets
//! null). It allocates nothing, takes no lock and initialises nothing but the real `dlsym`'s
//! address (through `dlvsym`, which we do not export), so it is safe before `main`, from std's own
//! weak-symbol lookups and from inside the driver's initialisation.
//!
//! `RTLD_NEXT` means "the next object after the caller", and glibc finds the caller from the
//! return address. On x86-64 a naked trampoline therefore *jumps* to the real `dlsym` for
//! `RTLD_NEXT` lookups, leaving the caller's return address in place: an OpenMP runtime or
//! another interposer that asks for the next `dlsym`/`malloc` gets the object after itself, not
//! the one after us (upstream's loop on `import torch`, PR 315). On other architectures the
//! lookup goes through the Rust function and `RTLD_NEXT` is resolved relative to this library.

use std::ffi::{c_char, c_void, CStr};

use super::registry;
use super::{guard, real};

/// The body of `dlsym` for every handle but `RTLD_NEXT` (and for `RTLD_NEXT` off x86-64).
///
/// # Safety
/// `symbol` is null or a NUL-terminated string, as for `dlsym`.
pub(crate) unsafe extern "C" fn dlsym_impl(
    handle: *mut c_void,
    symbol: *const c_char,
) -> *mut c_void {
    let Some(real) = real::real_dlsym() else {
        return std::ptr::null_mut();
    };
    // SAFETY: forwarding the caller's arguments to the real dlsym, which has the same contract.
    let found = unsafe { real(handle, symbol) };
    if found.is_null() || symbol.is_null() {
        return found;
    }
    // SAFETY: `symbol` is non-null and NUL-terminated (dlsym's contract; the real dlsym just
    // read it).
    let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    guard(found, || match registry::hook_address(name) {
        Some(hook) => hook as *mut c_void,
        None => found,
    })
}

/// Slow path of the trampoline: resolves the real `dlsym` when it is not known yet.
extern "C" fn resolve_for_trampoline() -> usize {
    real::resolve_real_dlsym()
}

/// `dlsym`, interposed (see the module docs).
///
/// # Safety
/// As for `dlsym(3)`.
///
/// cbindgen:ignore
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    // rdi = handle, rsi = symbol. RTLD_NEXT is (void *)-1.
    core::arch::naked_asm!(
        "cmp rdi, -1",
        "jne {imp}",
        "mov rax, qword ptr [rip + {real}]",
        "test rax, rax",
        "jz 2f",
        "jmp rax",
        "2:",
        // Keep the arguments across the call; three pushes' worth keeps rsp 16-byte aligned.
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {resolve}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jz 3f",
        "jmp rax",
        "3:",
        "ret",
        imp = sym dlsym_impl,
        real = sym real::REAL_DLSYM,
        resolve = sym resolve_for_trampoline,
    )
}

/// `dlsym`, interposed (see the module docs).
///
/// # Safety
/// As for `dlsym(3)`.
///
/// cbindgen:ignore
#[cfg(not(target_arch = "x86_64"))]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    // SAFETY: same contract as ours.
    unsafe { dlsym_impl(handle, symbol) }
}

/// Resolves the real `dlsym` while the library loads, before any other code can call ours, so
/// the trampoline's fast path is the only one normally taken.
extern "C" fn resolve_at_load() {
    let _ = real::resolve_real_dlsym();
}

#[used]
#[link_section = ".init_array"]
static RESOLVE_AT_LOAD: extern "C" fn() = resolve_at_load;
