/*
 * t_limit: a program linked with -lcuda allocates 64 MiB chunks until it is refused, under
 * CUDA_DEVICE_MEMORY_LIMIT (HK_LIMIT, default 1g). The admitted chunks plus the context's cost
 * stay within the limit, the memory the driver really used stays within it, nearly all of the
 * limit was usable, and cuMemGetInfo reports the limit as the total.
 */
#include "common.h"

int main(void)
{
    g_test = "limit";
    const unsigned long long limit = env_ull("HK_LIMIT", GIB);
    const unsigned long long chunk = 64 * MIB;

    CU(cuInit(0));
    CUdevice dev;
    CU(cuDeviceGet(&dev, 0));
    CUcontext ctx;
    CU(cuCtxCreate_v2(&ctx, 0, dev));

    size_t fr = 0, tot = 0;
    CU(cuMemGetInfo_v2(&fr, &tot));
    CHECK(tot == limit, "cuMemGetInfo_v2 total %zu == limit %llu", tot, limit);

    unsigned long long ctx_cost = region_usage_kind(0, 0);
    CHECK(ctx_cost > 0, "the context's cost is accounted (%llu MiB)", ctx_cost / MIB);
    unsigned long long ctx_real = real_used_by(0, getpid());
    CHECK(ctx_cost >= ctx_real, "accounted context cost %llu >= real usage %llu after creation",
          ctx_cost, ctx_real);
    CHECK(fr == tot - ctx_cost, "cuMemGetInfo_v2 free %zu == limit - context %llu", fr,
          tot - ctx_cost);

    CUdeviceptr ptrs[4096];
    int n = 0;
    CUresult r = CUDA_SUCCESS;
    unsigned long long max_real = 0;
    while (n < 4096) {
        r = cuMemAlloc_v2(&ptrs[n], chunk);
        if (r != CUDA_SUCCESS)
            break;
        n++;
        unsigned long long ru = real_used(0);
        if (ru > max_real)
            max_real = ru;
    }
    unsigned long long admitted = (unsigned long long)n * chunk;
    INFO("%d chunks of 64 MiB admitted (%llu MiB) + context %llu MiB", n, admitted / MIB,
         ctx_cost / MIB);
    CHECK(r == CUDA_ERROR_OUT_OF_MEMORY, "allocation stops with CUDA_ERROR_OUT_OF_MEMORY (got %d)",
          (int)r);
    CHECK(admitted + ctx_cost <= limit, "admitted + context %llu <= limit %llu",
          admitted + ctx_cost, limit);
    CHECK(admitted + ctx_cost + chunk > limit,
          "the limit is usable: one more chunk would not fit (%llu + 64 MiB > %llu)",
          admitted + ctx_cost, limit);
    CHECK(max_real <= limit, "real device usage never above the limit (max %llu <= %llu)",
          max_real, limit);
    CHECK(real_used(0) <= limit, "real device usage at OOM %llu <= limit", real_used(0));
    CHECK(region_usage(0) == admitted + ctx_cost, "region usage %llu == admitted + context %llu",
          region_usage(0), admitted + ctx_cost);

    /* A refused allocation leaves nothing behind. */
    CUdeviceptr extra = 0;
    unsigned long long before = region_usage(0);
    r = cuMemAlloc_v2(&extra, chunk);
    CHECK(r == CUDA_ERROR_OUT_OF_MEMORY && region_usage(0) == before,
          "a refused allocation changes no accounting (%d, %llu -> %llu)", (int)r, before,
          region_usage(0));

    for (int i = 0; i < n; i++)
        CU(cuMemFree_v2(ptrs[i]));
    CHECK(region_usage(0) == ctx_cost, "after freeing everything the region holds the context only"
          " (%llu)", region_usage(0));
    CU(cuMemGetInfo_v2(&fr, &tot));
    CHECK(fr == limit - ctx_cost, "cuMemGetInfo_v2 free back to %llu (got %zu)", limit - ctx_cost,
          fr);
    CU(cuCtxDestroy_v2(ctx));
    CHECK(region_usage(0) == 0, "after cuCtxDestroy the region holds nothing (%llu)",
          region_usage(0));
    return finish();
}
