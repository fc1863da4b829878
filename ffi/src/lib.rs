//! libvgpu.so: HAMi-core's preload library, in Rust.
