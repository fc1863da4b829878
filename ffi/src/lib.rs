//! libvgpu.so: HAMi-core's preload library, in Rust.
pub mod capi;
pub mod config;
pub mod log;
pub mod platform;
pub mod region_file;
pub mod runtime;
pub mod process;
pub mod sm_limit;
pub mod inspect;
pub mod hooks;
