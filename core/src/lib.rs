//! hami-shm: the shared region of HAMi-core v1.2, byte for byte, and every protocol that runs on it.
//!
//! This crate is pure logic: it never calls the operating system. Everything it needs from the
//! outside world (who am I, is that process alive, what time is it, the two `sem_t`s, the init file
//! lock) comes through the [`platform::Platform`] trait, which `hami-linux` implements for Linux and
//! `hami-model` implements with simulated crashes and PID reuse.
//!
//! Modules, one protocol each (docs/protocols.md describes them together):
//! - [`layout`]: the `#[repr(C)]` region, all atomics, sizes pinned.
//! - [`validate`]: tell the historical layouts apart before a file is used.
//! - [`init`]: one initialiser, crash-tolerant, one acquire load when done.
//! - [`lock`]: the owner lock (`sem` + `owner_pid`) with dead-owner and lost-token recovery.
//! - [`slots`]: claim, release on exit, lazy reaping.
//! - [`seqlock`]: per-slot accounting writer and reader.
//! - [`admission`]: reserve/release against the limit across processes.
//! - [`bucket`]: the region-wide SM token bucket and its controller.
//! - [`workload`]: notices when a program's kernels change (the controller measures again).
//! - [`context`]: admitting a CUDA context at its real cost, learnt once per device.
//! - [`fields`]: the named operations on single fields, the inspector's header.
//! - [`host_pid`]: claiming a host pid in a slot, never by two live slots.
//! - [`envparse`]: HAMi-core's size syntax (`1g`, `1024m`, `0x...`), strictly.
#![no_std]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod admission;
pub mod bucket;
pub mod context;
pub mod envparse;
pub mod fields;
pub mod host_pid;
pub mod init;
pub mod layout;
pub mod lock;
pub mod platform;
#[cfg(feature = "raw-fields")]
pub mod raw;
pub mod seqlock;
pub mod slots;
pub mod sm_controller;
pub mod sync;
pub mod validate;
pub mod workload;
