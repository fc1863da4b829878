//! libvgpu.so: HAMi-core's preload library, in Rust.
pub mod capi;
pub mod config;
pub mod hooks;
pub mod inspect;
pub mod log;
pub(crate) mod one_time;
pub mod platform;
pub mod process;
pub mod region_file;
pub mod region_guard;
pub mod runtime;
pub mod sm_limit;
pub mod suspend;
