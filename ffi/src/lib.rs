//! libvgpu.so: HAMi-core's preload library, in Rust.
pub(crate) mod capi;
pub mod config;
pub(crate) mod fork;
pub(crate) mod hooks;
pub mod inspect;
pub mod log;
pub(crate) mod one_time;
pub mod platform;
pub(crate) mod process;
pub mod region_file;
pub mod region_guard;
pub mod runtime;
pub(crate) mod sm_limit;
pub(crate) mod suspend;
