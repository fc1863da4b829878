//! libvgpu.so: HAMi-core's preload library, in Rust. Everything is crate-private: the library's
//! interface is its exported C symbols (the hooks and the C API), so the compiler finds dead code.
pub(crate) mod capi;
pub(crate) mod fork;
pub(crate) mod hooks;
pub(crate) mod one_time;
pub(crate) mod process;
pub(crate) mod runtime;
pub(crate) mod sm_limit;
pub(crate) mod suspend;

// hami-linux's modules under the paths the hooks name them by (`crate::log`, `crate::platform`).
pub(crate) use hami_linux::{config, log, platform, region_file, region_guard};
