//! The Linux side of the shared region, shared by `libvgpu.so` (hami-vgpu), `shrreg-tool`
//! (hami-tool) and the region bench: the [`platform`] that core's protocols run on, the
//! [`region_file`] and the SIGBUS guard of its mappings ([`region_guard`]), the [`config`] read
//! from the environment, and HAMi-core's [`log`] lines. Nothing here hooks CUDA or NVML.

pub mod config;
pub mod log;
pub mod platform;
pub mod region_file;
pub mod region_guard;
