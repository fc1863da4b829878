/*
 * t_pooltrim: the library trims pools itself when the limit refuses an allocation (the memory
 * the application freed into a pool must not stand in its way). That trim is a driver call
 * that may take long (FAKE_POOL_TRIM_MS makes the stand-in's cuMemPoolTrimTo slow): meanwhile
 * another thread's pool free and pool allocation must not wait for it, and when both are done
 * every byte is accounted once.
 */
#include "common.h"

#include <pthread.h>
#include <stdatomic.h>

static CUdeviceptr g_big_ptr;
static unsigned long long g_big;
static CUresult g_big_r = CUDA_ERROR_UNKNOWN;
static atomic_int g_big_done;
static double g_big_s;

/* Refused by the limit while the default pool holds freed memory: the library trims it. */
static void *alloc_big(void *arg)
{
    CUcontext ctx = arg;
    cuCtxSetCurrent(ctx);
    double t0 = now_s();
    g_big_r = cuMemAlloc_v2(&g_big_ptr, g_big);
    g_big_s = now_s() - t0;
    atomic_store(&g_big_done, 1);
    return NULL;
}

int main(void)
{
    g_test = "pooltrim";
    const unsigned long long limit = env_ull("HK_LIMIT", GIB);
    const double trim_s = (double)env_ull("FAKE_POOL_TRIM_MS", 0) / 1000.0;
    CHECK(trim_s >= 1.0, "the stand-in's cuMemPoolTrimTo takes %.1f s (FAKE_POOL_TRIM_MS)", trim_s);
    CU(cuInit(0));
    CUdevice dev;
    CU(cuDeviceGet(&dev, 0));
    CUcontext ctx;
    CU(cuDevicePrimaryCtxRetain(&ctx, dev));
    CU(cuCtxSetCurrent(ctx));
    const unsigned long long reg0 = region_usage(0), real0 = real_used_by(0, getpid());

    /* A pool of our own with one allocation in it. */
    CUmemPoolProps pp = pool_props(dev);
    CUmemoryPool pool;
    CU(cuMemPoolCreate(&pool, &pp));
    CUdeviceptr small = 0, small2 = 0;
    CU(cuMemAllocFromPoolAsync(&small, 8 * MIB, pool, NULL));

    /* Most of the limit freed into the default pool, which keeps it reserved. */
    size_t fr, tot;
    CU(cuMemGetInfo_v2(&fr, &tot));
    g_big = (fr / (64 * MIB)) * (64 * MIB) - 64 * MIB;
    CUdeviceptr q = 0;
    CU(cuMemAllocAsync(&q, g_big, NULL));
    CU(cuMemFreeAsync(q, NULL));
    CU(cuStreamSynchronize(NULL));
    CHECK(region_usage(0) >= reg0 + g_big, "the freed %llu MiB stay accounted in the pool's reserve",
          g_big / MIB);

    pthread_t t;
    pthread_create(&t, NULL, alloc_big, ctx);
    usleep(300 * 1000);
    int during = !atomic_load(&g_big_done);
    double t0 = now_s();
    CU(cuMemFreeAsync(small, NULL));
    double free_s = now_s() - t0;
    t0 = now_s();
    CU(cuMemAllocFromPoolAsync(&small2, 4 * MIB, pool, NULL));
    double alloc_s = now_s() - t0;
    during = during && !atomic_load(&g_big_done);
    pthread_join(t, NULL);

    CHECK(during, "the other thread's free and allocation ran while the trim was in progress");
    CHECK(free_s < trim_s / 4, "cuMemFreeAsync (pool memory) took %.3f s while a trim took %.1f s: "
          "the pool map is not locked across the trim", free_s, trim_s);
    CHECK(alloc_s < trim_s / 4, "cuMemAllocFromPoolAsync took %.3f s while a trim took %.1f s",
          alloc_s, trim_s);
    CHECK(g_big_r == CUDA_SUCCESS && g_big_s >= trim_s,
          "cuMemAlloc_v2 of %llu MiB succeeds after trimming the default pool (%d, %.2f s)",
          g_big / MIB, (int)g_big_r, g_big_s);
    CHECK(real_used(0) <= limit, "the driver's usage %llu MiB stays within the limit",
          real_used(0) / MIB);
    /* Now: the context, the big allocation, the pool's 8 MiB reserve holding small2. */
    unsigned long long reg = region_usage(0), real = real_used_by(0, getpid());
    CHECK(reg - reg0 == real - real0 && reg - reg0 == g_big + 8 * MIB,
          "every byte counted once: region +%llu MiB, driver +%llu MiB (expected +%llu MiB)",
          (reg - reg0) / MIB, (real - real0) / MIB, (g_big + 8 * MIB) / MIB);

    if (g_big_r == CUDA_SUCCESS)
        CU(cuMemFree_v2(g_big_ptr));
    CU(cuMemFreeAsync(small2, NULL));
    CU(cuStreamSynchronize(NULL));
    CU(cuMemPoolDestroy(pool));
    CUmemoryPool dpool;
    CU(cuDeviceGetMemPool(&dpool, dev));
    CU(cuMemPoolTrimTo(dpool, 0));
    CHECK(region_usage(0) == reg0 && real_used_by(0, getpid()) == real0,
          "all released (region %llu -> %llu, driver %llu -> %llu)", reg0, region_usage(0), real0,
          real_used_by(0, getpid()));
    return finish();
}
