//! Every hooked name, grouped by the base name `cuGetProcAddress` is asked for, with the CUDA
//! version that introduced each ABI and whether it is the per-thread-default-stream (`_ptsz`)
//! form. `dlsym` looks exact names up here; `cuGetProcAddress` picks a family's variant.

use super::real::Real;
use super::types::CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
use super::{context, graph, launch, memory, nvml, nvml_procs, procaddr};

/// Something with a real address (a [`Real`] of any signature).
pub trait RealAddr {
    /// The real function's address, 0 if the library lacks it.
    fn addr(&self) -> usize;
}

impl<F: Copy> RealAddr for Real<F> {
    fn addr(&self) -> usize {
        Real::addr(self)
    }
}

/// One exported hook.
pub struct Variant {
    /// The exact symbol name.
    pub name: &'static str,
    /// Our hook's address.
    pub hook: *const (),
    /// The real function it forwards to.
    pub real: &'static (dyn RealAddr + Sync),
    /// `cudaVersion` from which `cuGetProcAddress` returns this ABI for the base name.
    pub since: i32,
    /// The `_ptsz` (per-thread default stream) form.
    pub ptsz: bool,
}

// SAFETY: `hook` is the address of a function (immutable code), and `real` is Sync.
unsafe impl Sync for Variant {}

/// The variants of one base name.
pub struct Family {
    /// The name `cuGetProcAddress` is asked for.
    pub base: &'static str,
    /// Oldest first.
    pub variants: &'static [Variant],
}

/// A variant declared with [`super::hook::hook`]: its real slot is the hook's `REAL`.
macro_rules! v {
    ($m:ident :: $f:ident, $since:expr) => {
        v!($m::$f, $since, false)
    };
    ($m:ident :: $f:ident, $since:expr, $ptsz:expr) => {
        Variant {
            name: stringify!($f),
            hook: $m::$f as *const (),
            real: &$m::$f::REAL,
            since: $since,
            ptsz: $ptsz,
        }
    };
}

macro_rules! fam {
    ($base:ident: $($v:expr),+ $(,)?) => {
        Family { base: stringify!($base), variants: &[$($v),+] }
    };
}

/// Every hooked name.
pub static FAMILIES: &[Family] = &[
    fam!(cuInit: v!(launch::cuInit, 2000)),
    fam!(cuGetProcAddress:
        v!(procaddr::cuGetProcAddress, 11030),
        v!(procaddr::cuGetProcAddress_v2, 12000)),
    fam!(cuMemAlloc: v!(memory::cuMemAlloc, 2000), v!(memory::cuMemAlloc_v2, 3020)),
    fam!(cuMemAllocPitch: v!(memory::cuMemAllocPitch, 2000), v!(memory::cuMemAllocPitch_v2, 3020)),
    fam!(cuMemFree: v!(memory::cuMemFree, 2000), v!(memory::cuMemFree_v2, 3020)),
    fam!(cuMemAllocManaged: v!(memory::cuMemAllocManaged, 6000)),
    fam!(cuMemCreate: v!(memory::cuMemCreate, 10020)),
    fam!(cuMemRelease: v!(memory::cuMemRelease, 10020)),
    fam!(cuMemAllocAsync:
        v!(memory::cuMemAllocAsync, 11020),
        v!(memory::cuMemAllocAsync_ptsz, 11020, true)),
    fam!(cuMemAllocFromPoolAsync:
        v!(memory::cuMemAllocFromPoolAsync, 11020),
        v!(memory::cuMemAllocFromPoolAsync_ptsz, 11020, true)),
    fam!(cuMemFreeAsync:
        v!(memory::cuMemFreeAsync, 11020),
        v!(memory::cuMemFreeAsync_ptsz, 11020, true)),
    fam!(cuMemPoolTrimTo: v!(memory::cuMemPoolTrimTo, 11020)),
    fam!(cuMemPoolCreate: v!(memory::cuMemPoolCreate, 11020)),
    fam!(cuMemPoolDestroy: v!(memory::cuMemPoolDestroy, 11020)),
    fam!(cuArrayCreate: v!(memory::cuArrayCreate, 2000), v!(memory::cuArrayCreate_v2, 3020)),
    fam!(cuArray3DCreate: v!(memory::cuArray3DCreate, 2000), v!(memory::cuArray3DCreate_v2, 3020)),
    fam!(cuArrayDestroy: v!(memory::cuArrayDestroy, 2000)),
    fam!(cuMipmappedArrayCreate: v!(memory::cuMipmappedArrayCreate, 5000)),
    fam!(cuMipmappedArrayDestroy: v!(memory::cuMipmappedArrayDestroy, 5000)),
    fam!(cuMemGetInfo: v!(memory::cuMemGetInfo, 2000), v!(memory::cuMemGetInfo_v2, 3020)),
    fam!(cuDeviceTotalMem: v!(memory::cuDeviceTotalMem, 2000), v!(memory::cuDeviceTotalMem_v2, 3020)),
    fam!(cuCtxCreate:
        v!(context::cuCtxCreate, 2000),
        v!(context::cuCtxCreate_v2, 3020),
        v!(context::cuCtxCreate_v3, 11040),
        v!(context::cuCtxCreate_v4, 12050)),
    fam!(cuCtxDestroy: v!(context::cuCtxDestroy, 2000), v!(context::cuCtxDestroy_v2, 4000)),
    fam!(cuDevicePrimaryCtxRetain: v!(context::cuDevicePrimaryCtxRetain, 7000)),
    fam!(cuDevicePrimaryCtxRelease:
        v!(context::cuDevicePrimaryCtxRelease, 7000),
        v!(context::cuDevicePrimaryCtxRelease_v2, 11000)),
    fam!(cuDevicePrimaryCtxReset:
        v!(context::cuDevicePrimaryCtxReset, 7000),
        v!(context::cuDevicePrimaryCtxReset_v2, 11000)),
    fam!(cuLaunchKernel:
        v!(launch::cuLaunchKernel, 4000),
        v!(launch::cuLaunchKernel_ptsz, 7000, true)),
    fam!(cuLaunchKernelEx:
        v!(launch::cuLaunchKernelEx, 11060),
        v!(launch::cuLaunchKernelEx_ptsz, 11060, true)),
    fam!(cuLaunchCooperativeKernel:
        v!(launch::cuLaunchCooperativeKernel, 9000),
        v!(launch::cuLaunchCooperativeKernel_ptsz, 9000, true)),
    fam!(cuGraphLaunch:
        v!(launch::cuGraphLaunch, 10000),
        v!(launch::cuGraphLaunch_ptsz, 10000, true)),
    // From CUDA 12.0 the base name `cuGraphInstantiate` has the ABI of
    // `cuGraphInstantiateWithFlags` (cudaTypedefs.h: PFN_cuGraphInstantiate is
    // PFN_cuGraphInstantiateWithFlags_v11040), which the driver returns for it.
    fam!(cuGraphInstantiate:
        v!(graph::cuGraphInstantiate, 10000),
        v!(graph::cuGraphInstantiate_v2, 11000),
        v!(graph::cuGraphInstantiateWithFlags, 12000)),
    fam!(cuGraphInstantiateWithParams:
        v!(graph::cuGraphInstantiateWithParams, 12000),
        v!(graph::cuGraphInstantiateWithParams_ptsz, 12000, true)),
    fam!(cuGraphExecUpdate:
        v!(graph::cuGraphExecUpdate, 10020),
        v!(graph::cuGraphExecUpdate_v2, 12000)),
    fam!(cuGraphExecDestroy: v!(graph::cuGraphExecDestroy, 10000)),
    // CUDA 13.0 gave the base name `cuGraphAddNode` the ABI of `cuGraphAddNode_v2` (12.3, with
    // edge data).
    fam!(cuGraphAddNode: v!(graph::cuGraphAddNode, 12020), v!(graph::cuGraphAddNode_v2, 13000)),
    fam!(cuGraphDestroy: v!(graph::cuGraphDestroy, 10000)),
    fam!(nvmlDeviceGetMemoryInfo: v!(nvml::nvmlDeviceGetMemoryInfo, 0)),
    fam!(nvmlDeviceGetMemoryInfo_v2: v!(nvml::nvmlDeviceGetMemoryInfo_v2, 0)),
    fam!(nvmlDeviceGetComputeRunningProcesses:
        v!(nvml_procs::nvmlDeviceGetComputeRunningProcesses, 0)),
    fam!(nvmlDeviceGetComputeRunningProcesses_v2:
        v!(nvml_procs::nvmlDeviceGetComputeRunningProcesses_v2, 0)),
    fam!(nvmlDeviceGetComputeRunningProcesses_v3:
        v!(nvml_procs::nvmlDeviceGetComputeRunningProcesses_v3, 0)),
    fam!(nvmlDeviceGetGraphicsRunningProcesses:
        v!(nvml_procs::nvmlDeviceGetGraphicsRunningProcesses, 0)),
    fam!(nvmlDeviceGetGraphicsRunningProcesses_v2:
        v!(nvml_procs::nvmlDeviceGetGraphicsRunningProcesses_v2, 0)),
    fam!(nvmlDeviceGetGraphicsRunningProcesses_v3:
        v!(nvml_procs::nvmlDeviceGetGraphicsRunningProcesses_v3, 0)),
    fam!(nvmlDeviceGetMPSComputeRunningProcesses:
        v!(nvml_procs::nvmlDeviceGetMPSComputeRunningProcesses, 0)),
    fam!(nvmlDeviceGetMPSComputeRunningProcesses_v2:
        v!(nvml_procs::nvmlDeviceGetMPSComputeRunningProcesses_v2, 0)),
    fam!(nvmlDeviceGetMPSComputeRunningProcesses_v3:
        v!(nvml_procs::nvmlDeviceGetMPSComputeRunningProcesses_v3, 0)),
    fam!(nvmlDeviceGetProcessUtilization:
        v!(nvml_procs::nvmlDeviceGetProcessUtilization, 0)),
    fam!(nvmlSystemGetProcessName: v!(nvml_procs::nvmlSystemGetProcessName, 0)),
];

/// Whether a name can be hooked at all (cheap pre-filter for `dlsym`).
fn candidate(name: &[u8]) -> bool {
    name.len() > 3 && (name.starts_with(b"cu") || name.starts_with(b"nvml"))
}

/// Our hook for the exact symbol `name`.
pub fn hook_address(name: &[u8]) -> Option<*const ()> {
    if !candidate(name) {
        return None;
    }
    FAMILIES
        .iter()
        .flat_map(|f| f.variants.iter())
        .find(|v| v.name.as_bytes() == name)
        .map(|v| v.hook)
}

/// The family `cuGetProcAddress` consults for `name` (a base name, or an exact variant name).
pub fn family_of(name: &[u8]) -> Option<&'static Family> {
    if !candidate(name) {
        return None;
    }
    FAMILIES
        .iter()
        .find(|f| f.base.as_bytes() == name || f.variants.iter().any(|v| v.name.as_bytes() == name))
}

/// The variant `cuGetProcAddress` would return by the version rule: the newest whose `since` is
/// at most `version`, among the `_ptsz` forms if `flags` asks for per-thread default stream and
/// the family has them.
fn by_version<'a>(
    candidates: impl Iterator<Item = &'a Variant> + Clone,
    version: i32,
    flags: u64,
) -> Option<&'a Variant> {
    let per_thread = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0;
    let has_ptsz = candidates.clone().any(|v| v.ptsz);
    let want_ptsz = per_thread && has_ptsz;
    candidates
        .filter(|v| v.ptsz == want_ptsz && v.since <= version)
        .max_by_key(|v| v.since)
}

/// Which of `family`'s hooks replaces the pointer `got` that the real `cuGetProcAddress`
/// returned for `requested`. The variant whose real address is `got` (the driver's own choice of
/// ABI) wins; if several share it, the version rule decides among them. If none does (a driver
/// that returns an unexported entry point), the ABI follows from the request: an exact variant
/// name is that variant, the base name the version rule's variant (`cuGraphInstantiate` at 12000
/// is `cuGraphInstantiateWithFlags`'s three-argument ABI, not the five-argument export of the
/// same name).
pub fn choose(
    family: &'static Family,
    requested: &[u8],
    got: usize,
    version: i32,
    flags: u64,
) -> Option<&'static Variant> {
    let matching = family.variants.iter().filter(|v| v.real.addr() == got);
    match matching.clone().count() {
        1 => matching.clone().next(),
        0 if family.base.as_bytes() == requested => {
            by_version(family.variants.iter(), version, flags)
        }
        0 => family
            .variants
            .iter()
            .find(|v| v.name.as_bytes() == requested),
        _ => by_version(matching.clone(), version, flags).or_else(|| matching.clone().next_back()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_is_unique_and_found() {
        let mut names: Vec<&str> = FAMILIES
            .iter()
            .flat_map(|f| f.variants.iter().map(|v| v.name))
            .collect();
        let n = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), n, "duplicate hook names");
        for name in names {
            assert!(hook_address(name.as_bytes()).is_some(), "{name}");
        }
        assert!(hook_address(b"cuMemcpy").is_none());
        assert!(hook_address(b"malloc").is_none());
    }

    #[test]
    fn an_unexported_answer_gets_the_abi_of_the_request() {
        // An address no export has: the driver answered with an internal entry point.
        let got = 0x1000;
        let f = family_of(b"cuGraphInstantiate").unwrap();
        let pick = |name: &[u8], version| choose(f, name, got, version, 0).map(|v| v.name);
        assert_eq!(
            pick(b"cuGraphInstantiate", 12000),
            Some("cuGraphInstantiateWithFlags")
        );
        assert_eq!(
            pick(b"cuGraphInstantiate", 11000),
            Some("cuGraphInstantiate_v2")
        );
        assert_eq!(
            pick(b"cuGraphInstantiate", 10000),
            Some("cuGraphInstantiate")
        );
        assert_eq!(
            pick(b"cuGraphInstantiate_v2", 12000),
            Some("cuGraphInstantiate_v2")
        );
        assert_eq!(
            pick(b"cuGraphInstantiateWithFlags", 12080),
            Some("cuGraphInstantiateWithFlags")
        );
    }

    #[test]
    fn version_rule() {
        let f = family_of(b"cuMemAlloc").unwrap();
        assert_eq!(
            by_version(f.variants.iter(), 12080, 0).unwrap().name,
            "cuMemAlloc_v2"
        );
        assert_eq!(
            by_version(f.variants.iter(), 3000, 0).unwrap().name,
            "cuMemAlloc"
        );
        let f = family_of(b"cuCtxCreate").unwrap();
        assert_eq!(
            by_version(f.variants.iter(), 12000, 0).unwrap().name,
            "cuCtxCreate_v3"
        );
        assert_eq!(
            by_version(f.variants.iter(), 13000, 0).unwrap().name,
            "cuCtxCreate_v4"
        );
        let f = family_of(b"cuLaunchKernel").unwrap();
        assert_eq!(
            by_version(f.variants.iter(), 12000, 2).unwrap().name,
            "cuLaunchKernel_ptsz"
        );
        assert_eq!(
            by_version(f.variants.iter(), 12000, 1).unwrap().name,
            "cuLaunchKernel"
        );
        let f = family_of(b"cuMemGetInfo").unwrap();
        assert_eq!(
            by_version(f.variants.iter(), 12000, 2).unwrap().name,
            "cuMemGetInfo_v2"
        );
        assert!(family_of(b"cuMemAlloc_v2").is_some());
        assert!(family_of(b"cuMemcpy").is_none());
    }
}
