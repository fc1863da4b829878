//! The one sync facade: every atomic the protocols touch comes from here, so the same code runs on
//! real atomics, under loom (`--cfg loom`, memory-ordering bugs) and under shuttle (`--cfg shuttle`,
//! interleaving bugs over many simulated processes).
//!
//! `Data*` atomics are always `core`'s: they hold bytes that no protocol reasons about (UUID
//! strings, sem_t storage handed to the platform, padding), so models need not pay for them.

#[cfg(loom)]
pub use loom::{
    hint::spin_loop,
    sync::atomic::{fence, AtomicI32, AtomicU32, AtomicU64, Ordering},
};

#[cfg(all(shuttle, not(loom)))]
pub use shuttle::{
    hint::spin_loop,
    sync::atomic::{fence, AtomicI32, AtomicU32, AtomicU64, Ordering},
};

#[cfg(not(any(loom, shuttle)))]
pub use core::{
    hint::spin_loop,
    sync::atomic::{fence, AtomicI32, AtomicU32, AtomicU64, Ordering},
};

pub use core::sync::atomic::{AtomicU64 as DataAtomicU64, AtomicU8 as DataAtomicU8};

/// True when the atomics are the real, layout-exact ones (not a model checker's).
pub const REAL_ATOMICS: bool = cfg!(not(any(loom, shuttle)));
