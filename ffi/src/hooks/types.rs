//! Hand-written declarations of the CUDA driver and NVML types the hooks touch.
//!
//! Result codes are `#[repr(transparent)]` newtypes, never Rust enums: a driver or application
//! newer than these declarations can hand us any value, and an enum holding a value it does not
//! list is undefined behaviour. Structs are declared exactly as `cuda.h` / `nvml.h` lay them out
//! (CUDA 12.x/13.x); where only a prefix of a longer struct is read, the declaration says so and
//! is only ever used behind a pointer.

use std::ffi::{c_int, c_uint, c_void};

/// `CUresult`.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CUresult(pub c_int);

impl CUresult {
    /// `CUDA_SUCCESS`.
    pub const SUCCESS: CUresult = CUresult(0);
    /// `CUDA_ERROR_OUT_OF_MEMORY`.
    pub const OUT_OF_MEMORY: CUresult = CUresult(2);
    /// `CUDA_ERROR_NOT_FOUND`: what a hook returns when the driver lacks the function.
    pub const NOT_FOUND: CUresult = CUresult(500);
    /// `CUDA_ERROR_UNKNOWN`: what a hook returns if its body failed unexpectedly.
    pub const UNKNOWN: CUresult = CUresult(999);

    /// Whether this is `CUDA_SUCCESS`.
    pub fn ok(self) -> bool {
        self == Self::SUCCESS
    }
}

/// `CUdevice` (an ordinal in the process's CUDA numbering).
pub type CUdevice = c_int;
/// `CUdeviceptr` (`unsigned long long` on 64-bit platforms).
pub type CUdeviceptr = u64;
/// `CUdeviceptr_v1`, the 32-bit pointer of the legacy unversioned entry points.
pub type CUdeviceptrV1 = c_uint;
/// `CUcontext`.
pub type CUcontext = *mut c_void;
/// `CUstream`.
pub type CUstream = *mut c_void;
/// `CUmemoryPool`.
pub type CUmemoryPool = *mut c_void;
/// `CUarray`.
pub type CUarray = *mut c_void;
/// `CUmipmappedArray`.
pub type CUmipmappedArray = *mut c_void;
/// `CUfunction`.
pub type CUfunction = *mut c_void;
/// `CUgraphExec`.
pub type CUgraphExec = *mut c_void;
/// `CUgraph`.
pub type CUgraph = *mut c_void;
/// `CUgraphNode`.
pub type CUgraphNode = *mut c_void;
/// `CUmemGenericAllocationHandle`.
pub type CUmemGenericAllocationHandle = u64;
/// `cuuint64_t`.
pub type Cuuint64 = u64;

/// `CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE`.
pub const CU_MEM_LOCATION_TYPE_DEVICE: c_int = 1;
/// `CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED`.
pub const CU_MEM_ALLOCATION_TYPE_PINNED: c_int = 1;
/// `CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM`.
pub const CU_MEM_ALLOC_GRANULARITY_MINIMUM: c_int = 0;
/// `CUdriverProcAddress_flags::CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.
pub const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 2;
/// `CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL`.
pub const CU_GRAPH_NODE_TYPE_KERNEL: c_int = 0;
/// `CUgraphNodeType::CU_GRAPH_NODE_TYPE_GRAPH` (a child graph).
pub const CU_GRAPH_NODE_TYPE_GRAPH: c_int = 4;
/// `CUgraphNodeType::CU_GRAPH_NODE_TYPE_CONDITIONAL` (CUDA 12.3).
pub const CU_GRAPH_NODE_TYPE_CONDITIONAL: c_int = 13;

/// `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CUmemLocation {
    /// `CUmemLocationType`.
    pub type_: c_int,
    /// Device ordinal (for `CU_MEM_LOCATION_TYPE_DEVICE`).
    pub id: c_int,
}

/// The `allocFlags` member of `CUmemAllocationProp`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CUmemAllocFlags {
    /// `compressionType`.
    pub compression_type: u8,
    /// `gpuDirectRDMACapable`.
    pub gpu_direct_rdma_capable: u8,
    /// `usage`.
    pub usage: u16,
    /// `reserved`.
    pub reserved: [u8; 4],
}

/// `CUmemAllocationProp` (32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemAllocationProp {
    /// `CUmemAllocationType`.
    pub type_: c_int,
    /// `CUmemAllocationHandleType`.
    pub requested_handle_types: c_int,
    /// Where the memory lives.
    pub location: CUmemLocation,
    /// `win32HandleMetaData`.
    pub win32_handle_meta_data: *mut c_void,
    /// `allocFlags`.
    pub alloc_flags: CUmemAllocFlags,
}

/// The leading members of `CUmemPoolProps` (the struct is 88 bytes; only read through a
/// pointer).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemPoolPropsPrefix {
    /// `allocType`.
    pub alloc_type: c_int,
    /// `handleTypes`.
    pub handle_types: c_int,
    /// Where the pool's memory lives.
    pub location: CUmemLocation,
}

/// `CUDA_ARRAY_DESCRIPTOR` (the `_v2` layout, used by `cuArrayCreate_v2`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CudaArrayDescriptor {
    /// Width in elements.
    pub width: usize,
    /// Height in elements (0 for 1D).
    pub height: usize,
    /// `CUarray_format`.
    pub format: c_int,
    /// 1, 2 or 4.
    pub num_channels: c_uint,
}

/// `CUDA_ARRAY_DESCRIPTOR_v1` (legacy `cuArrayCreate`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CudaArrayDescriptorV1 {
    /// Width in elements.
    pub width: c_uint,
    /// Height in elements.
    pub height: c_uint,
    /// `CUarray_format`.
    pub format: c_int,
    /// Channels.
    pub num_channels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR` (the `_v2` layout).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CudaArray3dDescriptor {
    /// Width in elements.
    pub width: usize,
    /// Height in elements.
    pub height: usize,
    /// Depth (or number of layers).
    pub depth: usize,
    /// `CUarray_format`.
    pub format: c_int,
    /// Channels.
    pub num_channels: c_uint,
    /// `CUDA_ARRAY3D_*` flags.
    pub flags: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR_v1` (legacy `cuArray3DCreate`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CudaArray3dDescriptorV1 {
    /// Width in elements.
    pub width: c_uint,
    /// Height in elements.
    pub height: c_uint,
    /// Depth.
    pub depth: c_uint,
    /// `CUarray_format`.
    pub format: c_int,
    /// Channels.
    pub num_channels: c_uint,
    /// Flags.
    pub flags: c_uint,
}

/// `CUDA_ARRAY_MEMORY_REQUIREMENTS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CudaArrayMemoryRequirements {
    /// Bytes the array occupies.
    pub size: usize,
    /// Its alignment.
    pub alignment: usize,
    /// Reserved.
    pub reserved: [c_uint; 4],
}

/// A launch's grid, block and dynamic shared-memory sizes: seven `unsigned int`s, laid out alike
/// at the start of `CUlaunchConfig` and after `func` in `CUDA_KERNEL_NODE_PARAMS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct LaunchDims {
    /// Grid width in blocks.
    pub grid_dim_x: c_uint,
    /// Grid height in blocks.
    pub grid_dim_y: c_uint,
    /// Grid depth in blocks.
    pub grid_dim_z: c_uint,
    /// Block width in threads.
    pub block_dim_x: c_uint,
    /// Block height in threads.
    pub block_dim_y: c_uint,
    /// Block depth in threads.
    pub block_dim_z: c_uint,
    /// Dynamic shared memory per block.
    pub shared_mem_bytes: c_uint,
}

/// `CUlaunchConfig`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUlaunchConfig {
    /// `gridDimX` to `sharedMemBytes`.
    pub dims: LaunchDims,
    /// The stream.
    pub h_stream: CUstream,
    /// `CUlaunchAttribute *attrs`.
    pub attrs: *mut c_void,
    /// Number of attributes.
    pub num_attrs: c_uint,
}

/// `CUDA_KERNEL_NODE_PARAMS_v2` (72 bytes; what `cuGraphKernelNodeGetParams_v2` writes). Its first
/// 56 bytes are `CUDA_KERNEL_NODE_PARAMS_v1`, all that the unversioned `cuGraphKernelNodeGetParams`
/// writes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CudaKernelNodeParams {
    /// `CUfunction func`.
    pub func: CUfunction,
    /// `gridDimX` to `sharedMemBytes`.
    pub dims: LaunchDims,
    /// `void **kernelParams`.
    pub kernel_params: *mut *mut c_void,
    /// `void **extra`.
    pub extra: *mut *mut c_void,
    /// `CUkernel kern` (v2 only).
    pub kern: *mut c_void,
    /// `CUcontext ctx` (v2 only).
    pub ctx: CUcontext,
}

impl CudaKernelNodeParams {
    /// All zero, for the driver to fill in.
    pub fn zeroed() -> Self {
        CudaKernelNodeParams {
            func: std::ptr::null_mut(),
            dims: LaunchDims::default(),
            kernel_params: std::ptr::null_mut(),
            extra: std::ptr::null_mut(),
            kern: std::ptr::null_mut(),
            ctx: std::ptr::null_mut(),
        }
    }
}

/// `CUDA_CONDITIONAL_NODE_PARAMS` (CUDA 12.3).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CudaConditionalNodeParams {
    /// `CUgraphConditionalHandle handle`.
    pub handle: u64,
    /// `CUgraphConditionalNodeType type` (if, while, switch).
    pub type_: c_int,
    /// Entries of `ph_graph_out`.
    pub size: c_uint,
    /// `CUgraph *phGraph_out`: the driver-owned array of body graphs.
    pub ph_graph_out: *mut CUgraph,
    /// `CUcontext ctx`.
    pub ctx: CUcontext,
}

/// `CUgraphNodeParams` (256 bytes), declared with the one union member read here (the
/// conditional parameters, at the union's offset 16) and the rest of the union as padding.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUgraphNodeParams {
    /// `CUgraphNodeType type`.
    pub type_: c_int,
    /// `int reserved0[3]`.
    pub reserved0: [c_int; 3],
    /// The union's `conditional` member.
    pub conditional: CudaConditionalNodeParams,
    /// The rest of the 232-byte union.
    pub union_rest: [u64; 25],
    /// `long long reserved2`.
    pub reserved2: i64,
}

impl CUgraphNodeParams {
    /// All zero, for the driver to fill in (its API wants unused bytes zeroed).
    pub const fn zeroed() -> Self {
        CUgraphNodeParams {
            type_: 0,
            reserved0: [0; 3],
            conditional: CudaConditionalNodeParams {
                handle: 0,
                type_: 0,
                size: 0,
                ph_graph_out: std::ptr::null_mut(),
                ctx: std::ptr::null_mut(),
            },
            union_rest: [0; 25],
            reserved2: 0,
        }
    }
}

/// `CUuuid`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CUuuid {
    /// The 16 bytes.
    pub bytes: [u8; 16],
}

/// `nvmlReturn_t`.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NvmlReturn(pub c_int);

impl NvmlReturn {
    /// `NVML_SUCCESS`.
    pub const SUCCESS: NvmlReturn = NvmlReturn(0);
    /// `NVML_ERROR_INSUFFICIENT_SIZE`.
    pub const INSUFFICIENT_SIZE: NvmlReturn = NvmlReturn(7);
    /// `NVML_ERROR_NOT_FOUND`.
    pub const NOT_FOUND: NvmlReturn = NvmlReturn(6);
    /// `NVML_ERROR_FUNCTION_NOT_FOUND`: what a hook returns when the library lacks the function.
    pub const FUNCTION_NOT_FOUND: NvmlReturn = NvmlReturn(13);
    /// `NVML_ERROR_UNKNOWN`.
    pub const UNKNOWN: NvmlReturn = NvmlReturn(999);

    /// Whether this is `NVML_SUCCESS`.
    pub fn ok(self) -> bool {
        self == Self::SUCCESS
    }
}

/// `nvmlDevice_t`.
pub type NvmlDevice = *mut c_void;

/// `nvmlMemory_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct NvmlMemory {
    /// Total memory in bytes.
    pub total: u64,
    /// Free memory in bytes.
    pub free: u64,
    /// Used memory in bytes.
    pub used: u64,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct NvmlMemoryV2 {
    /// Structure version (`nvmlMemory_v2`).
    pub version: c_uint,
    /// Total memory in bytes.
    pub total: u64,
    /// Memory the driver reserves.
    pub reserved: u64,
    /// Free memory in bytes.
    pub free: u64,
    /// Used memory in bytes.
    pub used: u64,
}

/// `nvmlProcessInfo_v1_t` (for `nvmlDeviceGetComputeRunningProcesses`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct NvmlProcessInfoV1 {
    /// Process id as the driver sees it (the host pid).
    pub pid: c_uint,
    /// Bytes used, or `NVML_VALUE_NOT_AVAILABLE`.
    pub used_gpu_memory: u64,
}

/// `nvmlProcessInfo_t` / `nvmlProcessInfo_v2_t` (for the `_v2` and `_v3` process queries).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct NvmlProcessInfo {
    /// Process id as the driver sees it (the host pid).
    pub pid: c_uint,
    /// Bytes used, or `NVML_VALUE_NOT_AVAILABLE`.
    pub used_gpu_memory: u64,
    /// MIG GPU instance, or 0xFFFFFFFF.
    pub gpu_instance_id: c_uint,
    /// MIG compute instance, or 0xFFFFFFFF.
    pub compute_instance_id: c_uint,
}

/// `nvmlProcessUtilizationSample_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct NvmlProcessUtilSample {
    /// Process id as the driver sees it.
    pub pid: c_uint,
    /// CPU timestamp of the sample, microseconds.
    pub time_stamp: u64,
    /// SM utilisation, percent.
    pub sm_util: c_uint,
    /// Memory utilisation, percent.
    pub mem_util: c_uint,
    /// Encoder utilisation, percent.
    pub enc_util: c_uint,
    /// Decoder utilisation, percent.
    pub dec_util: c_uint,
}

/// `NVML_DEVICE_UUID_V2_BUFFER_SIZE`.
pub const NVML_UUID_BUFFER: usize = 96;

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn layouts_match_the_headers() {
        assert_eq!(size_of::<CUmemAllocationProp>(), 32);
        assert_eq!(offset_of!(CUmemAllocationProp, location), 8);
        assert_eq!(offset_of!(CUmemAllocationProp, alloc_flags), 24);
        assert_eq!(size_of::<CudaArrayDescriptor>(), 24);
        assert_eq!(size_of::<CudaArrayDescriptorV1>(), 16);
        assert_eq!(size_of::<CudaArray3dDescriptor>(), 40);
        assert_eq!(size_of::<CudaArray3dDescriptorV1>(), 24);
        assert_eq!(size_of::<CudaArrayMemoryRequirements>(), 32);
        assert_eq!(offset_of!(CUlaunchConfig, h_stream), 32);
        assert_eq!(size_of::<CUlaunchConfig>(), 56);
        assert_eq!(size_of::<LaunchDims>(), 28);
        assert_eq!(offset_of!(CudaKernelNodeParams, dims), 8);
        assert_eq!(offset_of!(CudaKernelNodeParams, kernel_params), 40);
        assert_eq!(offset_of!(CudaKernelNodeParams, kern), 56);
        assert_eq!(size_of::<CudaKernelNodeParams>(), 72);
        assert_eq!(size_of::<CudaConditionalNodeParams>(), 32);
        assert_eq!(offset_of!(CudaConditionalNodeParams, ph_graph_out), 16);
        assert_eq!(offset_of!(CUgraphNodeParams, conditional), 16);
        assert_eq!(offset_of!(CUgraphNodeParams, reserved2), 248);
        assert_eq!(size_of::<CUgraphNodeParams>(), 256);
        assert_eq!(size_of::<NvmlMemory>(), 24);
        assert_eq!(size_of::<NvmlMemoryV2>(), 40);
        assert_eq!(offset_of!(NvmlMemoryV2, total), 8);
        assert_eq!(size_of::<NvmlProcessInfoV1>(), 16);
        assert_eq!(size_of::<NvmlProcessInfo>(), 24);
        assert_eq!(size_of::<NvmlProcessUtilSample>(), 32);
        assert_eq!(size_of::<CUresult>(), 4);
        assert_eq!(size_of::<NvmlReturn>(), 4);
    }
}
