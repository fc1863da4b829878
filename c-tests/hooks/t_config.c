/*
 * t_config: prints what an application sees, for config.sh, which runs it under good and bad
 * configuration: the result of cuCtxCreate_v2 and of one cuMemAlloc_v2 of HK_ALLOC bytes (default
 * 64 MiB), the cuMemGetInfo_v2 and cuDeviceTotalMem_v2 totals, and the total with the limit out
 * of the way, from the driver itself. Nothing here stops at a refused call: a process with a
 * malformed limit is expected to be refused, and config.sh reads the codes.
 */
#include "common.h"

int main(void)
{
    g_test = "config";
    CU(cuInit(0));
    CUdevice dev;
    CU(cuDeviceGet(&dev, 0));
    CUcontext ctx = NULL;
    CUresult ctx_rc = cuCtxCreate_v2(&ctx, 0, dev);
    CUresult alloc_rc = -1;
    size_t fr = 0, tot = 0, tm = 0;
    if (ctx_rc == CUDA_SUCCESS) {
        CUdeviceptr p = 0;
        alloc_rc = cuMemAlloc_v2(&p, (size_t)env_ull("HK_ALLOC", 64 * MIB));
        if (alloc_rc == CUDA_SUCCESS)
            cuMemFree_v2(p);
        cuMemGetInfo_v2(&fr, &tot);
    }
    cuDeviceTotalMem_v2(&tm, dev);
    typedef CUresult (*total_fn)(size_t *, CUdevice);
    total_fn real_total = (total_fn)real_sym("libcuda.so.1", "cuDeviceTotalMem_v2");
    size_t phys = 0;
    if (real_total)
        real_total(&phys, dev);
    printf("ctx=%d alloc=%d total=%zu devtotal=%zu physical=%zu\n", (int)ctx_rc, (int)alloc_rc,
           tot, tm, phys);
    if (ctx)
        cuCtxDestroy_v2(ctx);
    return 0;
}
