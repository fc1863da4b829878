/*
 * t_config: prints what an application sees (cuMemGetInfo_v2 and cuDeviceTotalMem_v2 totals,
 * and the total with the limit out of the way, from the driver itself) for config.sh, which
 * runs it under good and bad configuration.
 */
#include "common.h"

int main(void)
{
    g_test = "config";
    CU(cuInit(0));
    CUdevice dev;
    CU(cuDeviceGet(&dev, 0));
    CUcontext ctx;
    CU(cuCtxCreate_v2(&ctx, 0, dev));
    size_t fr, tot, tm;
    CU(cuMemGetInfo_v2(&fr, &tot));
    CU(cuDeviceTotalMem_v2(&tm, dev));
    typedef CUresult (*total_fn)(size_t *, CUdevice);
    total_fn real_total = (total_fn)real_sym("libcuda.so.1", "cuDeviceTotalMem_v2");
    size_t phys = 0;
    if (real_total)
        real_total(&phys, dev);
    printf("total=%zu devtotal=%zu physical=%zu\n", tot, tm, phys);
    CU(cuCtxDestroy_v2(ctx));
    return 0;
}
