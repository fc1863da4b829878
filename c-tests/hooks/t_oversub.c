/*
 * t_oversub: the memory views when the limit exceeds the GPU (a 1 GiB stand-in GPU, a 2 GiB
 * limit). With CUDA_OVERSUBSCRIBE=true (HAMi sets it when memory scaling > 1) they are HAMi-core's
 * (commit 8f3a89c6: src/cuda/memory.c cuMemGetInfo_v2, src/nvml/hook.c _nvmlDeviceGetMemoryInfo,
 * src/cuda/device.c cuDeviceTotalMem_v2): NVML and cuDeviceTotalMem report the limit as the total,
 * cuMemGetInfo stays within the GPU. Without it every view is capped at the GPU.
 * Environment: HK_OVERSUB (1: expect the oversubscribed views), HK_LIMIT.
 */
#include "common.h"

#include "fake_nvml.h"

int main(void)
{
    g_test = "oversub";
    int over = (int)env_ull("HK_OVERSUB", 0);
    unsigned long long limit = env_ull("HK_LIMIT", 2 * GIB), gpu = 1 * GIB;
    CU(cuInit(0));
    CUdevice dev;
    CUcontext ctx;
    CU(cuDeviceGet(&dev, 0));
    CU(cuCtxCreate_v2(&ctx, 0, dev));
    CUdeviceptr p;
    CU(cuMemAlloc_v2(&p, 256 * MIB));
    unsigned long long used = region_usage(0);
    CHECK(used >= 256 * MIB, "the allocation is counted (%llu bytes with the context)", used);

    size_t fr = 0, tot = 0;
    CU(cuMemGetInfo_v2(&fr, &tot));
    CHECK(tot == gpu, "cuMemGetInfo_v2 total %zu is the GPU's %llu (limit %llu)", tot, gpu, limit);
    CHECK(fr <= gpu - used, "cuMemGetInfo_v2 free %zu <= GPU - usage %llu", fr, gpu - used);

    size_t dtot = 0;
    CU(cuDeviceTotalMem_v2(&dtot, dev));
    unsigned long long want = over ? limit : gpu;
    CHECK(dtot == want, "cuDeviceTotalMem_v2 %zu == %llu (%s)", dtot, want,
          over ? "the limit, as HAMi-core" : "capped at the GPU");

    nvmlDevice_t h;
    nvmlMemory_t m;
    CHECK(nvmlInit_v2() == NVML_SUCCESS, "nvmlInit_v2");
    CHECK(nvmlDeviceGetHandleByIndex_v2(0, &h) == NVML_SUCCESS, "nvml handle 0");
    CHECK(nvmlDeviceGetMemoryInfo(h, &m) == NVML_SUCCESS, "nvmlDeviceGetMemoryInfo");
    CHECK(m.total == want && m.used == used && m.free == want - used,
          "nvmlDeviceGetMemoryInfo total %llu used %llu free %llu (want %llu, %llu, %llu)",
          (unsigned long long)m.total, (unsigned long long)m.used, (unsigned long long)m.free,
          want, used, want - used);
    CU(cuMemFree_v2(p));
    return finish();
}
