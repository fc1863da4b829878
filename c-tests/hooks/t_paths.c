/*
 * t_paths: every allocation path is accounted and every free releases it; the views are
 * virtualised. For each path: the usage an application sees (cuMemGetInfo_v2 total - free) and
 * the region's usage grow by the size rounded to the granularity (for pitched allocations and
 * arrays: by what the driver really used, at least), the driver's real usage never grows by
 * more than that, and after the free both return to where they were.
 */
#include "common.h"

static unsigned long long g_gran;
static int g_dev = 0;

/* Usage snapshot: what the application sees, the region, and the driver's real usage. */
struct snap {
    unsigned long long seen, reg, real;
};

static struct snap snap(void)
{
    struct snap s = {seen_used(), region_usage(g_dev), real_used_by(g_dev, getpid())};
    return s;
}

/* After an allocation that should have added exactly `expect` bytes. */
static void grew(const char *what, struct snap b, unsigned long long expect)
{
    struct snap a = snap();
    CHECK(a.seen - b.seen == expect && a.reg - b.reg == expect,
          "%s: +%llu bytes accounted (seen +%llu, region +%llu)", what, expect, a.seen - b.seen,
          a.reg - b.reg);
    CHECK(a.real - b.real <= a.reg - b.reg, "%s: the driver really used %llu <= accounted %llu",
          what, a.real - b.real, a.reg - b.reg);
}

/* After an allocation whose size the driver picks: accounted must cover what it really used. */
static unsigned long long grew_at_least(const char *what, struct snap b, unsigned long long min)
{
    struct snap a = snap();
    unsigned long long d = a.reg - b.reg;
    CHECK(a.seen - b.seen == d && d >= min && d % g_gran == 0,
          "%s: +%llu bytes accounted (>= %llu, whole granules, seen +%llu)", what, d, min,
          a.seen - b.seen);
    CHECK(a.real - b.real <= d, "%s: the driver really used %llu <= accounted %llu", what,
          a.real - b.real, d);
    return d;
}

/* After a pool allocation: a real driver grows pools in steps of its own (32 MiB), which the
 * accounting follows; the stand-in grows by exactly the shortfall. */
static void grew_pool(const char *what, struct snap b, unsigned long long expect)
{
    if (on_fake()) {
        grew(what, b, expect);
        return;
    }
    grew_at_least(what, b, expect);
}

static void back(const char *what, struct snap b)
{
    struct snap a = snap();
    /* A real driver may keep a small chunk of its sub-allocator; the stand-in frees exactly. */
    int real_ok = on_fake() ? a.real == b.real : a.real <= b.real + 2 * g_gran;
    CHECK(a.seen == b.seen && a.reg == b.reg && real_ok,
          "%s: released (seen %llu->%llu, region %llu->%llu, real %llu->%llu)", what, b.seen,
          a.seen, b.reg, a.reg, b.real, a.real);
}

static void unchanged(const char *what, struct snap b)
{
    struct snap a = snap();
    CHECK(a.reg == b.reg, "%s: no accounting change (region %llu->%llu)", what, b.reg, a.reg);
}

int main(void)
{
    g_test = "paths";
    const unsigned long long limit = env_ull("HK_LIMIT", GIB);
    CU(cuInit(0));
    CUdevice dev;
    CU(cuDeviceGet(&dev, 0));
    g_gran = granularity(dev);
    INFO("granularity %llu bytes", g_gran);

    /* Primary context: the first retain counts, the second does not, the last release frees. */
    struct snap s0;
    CUcontext pctx, pctx2;
    CU(cuDevicePrimaryCtxRetain(&pctx, dev));
    CU(cuCtxSetCurrent(pctx));
    unsigned long long pcost = region_usage_kind(0, 0);
    CHECK(pcost > 0, "cuDevicePrimaryCtxRetain: context cost %llu MiB accounted", pcost / MIB);
    CHECK(pcost >= real_used_by(0, getpid()), "primary context: accounted %llu >= real %llu", pcost,
          real_used_by(0, getpid()));
    s0 = snap();
    CU(cuDevicePrimaryCtxRetain(&pctx2, dev));
    unchanged("second cuDevicePrimaryCtxRetain", s0);
    CU(cuDevicePrimaryCtxRelease_v2(dev));
    unchanged("cuDevicePrimaryCtxRelease_v2 (one retain left)", s0);

    struct snap b;
    CUdeviceptr p = 0, p2 = 0;

    b = snap();
    CU(cuMemAlloc_v2(&p, 1));
    grew("cuMemAlloc_v2(1 byte)", b, g_gran);
    CU(cuMemFree_v2(p));
    back("cuMemFree_v2", b);

    b = snap();
    CU(cuMemAlloc_v2(&p, 3 * g_gran + 1));
    grew("cuMemAlloc_v2(3 granules + 1)", b, 4 * g_gran);
    CU(cuMemFree_v2(p));
    back("cuMemFree_v2", b);

    CUdeviceptr_v1 p32 = 0;
    b = snap();
    CUresult r = cuMemAlloc(&p32, 5 * MIB);
    if (r == CUDA_SUCCESS) {
        grew("cuMemAlloc (legacy 32-bit)(5 MiB)", b, round_up(5 * MIB, g_gran));
        CU(cuMemFree(p32));
        back("cuMemFree (legacy)", b);
    } else {
        INFO("SKIP legacy cuMemAlloc: the driver returns %d", (int)r);
    }

    size_t pitch = 0;
    b = snap();
    CU(cuMemAllocPitch_v2(&p, &pitch, 1000, 3000, 4));
    grew("cuMemAllocPitch_v2(1000 x 3000)", b, round_up((unsigned long long)pitch * 3000, g_gran));
    CHECK(pitch >= 1000, "pitch %zu >= width 1000", pitch);
    CU(cuMemFree_v2(p));
    back("cuMemFree_v2 (pitched)", b);

    unsigned int pitch32 = 0;
    b = snap();
    r = cuMemAllocPitch(&p32, &pitch32, 777, 2000, 4);
    if (r == CUDA_SUCCESS) {
        grew("cuMemAllocPitch (legacy)(777 x 2000)", b,
             round_up((unsigned long long)pitch32 * 2000, g_gran));
        CU(cuMemFree(p32));
        back("cuMemFree (legacy, pitched)", b);
    } else {
        INFO("SKIP legacy cuMemAllocPitch: the driver returns %d", (int)r);
    }

    b = snap();
    CU(cuMemAllocManaged(&p, 10 * MIB + 3, CU_MEM_ATTACH_GLOBAL));
    grew("cuMemAllocManaged(10 MiB + 3)", b, round_up(10 * MIB + 3, g_gran));
    CU(cuMemFree_v2(p));
    back("cuMemFree_v2 (managed)", b);

    /* VMM */
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    CUmemGenericAllocationHandle h;
    b = snap();
    CU(cuMemCreate(&h, 8 * g_gran, &prop, 0));
    grew("cuMemCreate(8 granules)", b, 8 * g_gran);
    CUdeviceptr va = 0;
    if (cuMemAddressReserve(&va, 8 * g_gran, 0, 0, 0) == CUDA_SUCCESS) {
        struct snap mid = snap();
        CU(cuMemMap(va, 8 * g_gran, 0, h, 0));
        unchanged("cuMemMap of a created handle", mid);
        CU(cuMemUnmap(va, 8 * g_gran));
        CU(cuMemAddressFree(va, 8 * g_gran));
    }
    CU(cuMemRelease(h));
    back("cuMemRelease", b);

    /* Stream-ordered allocations, both stream conventions. A pool keeps freed memory reserved
     * until it is trimmed, and so does the accounting: after the free, the pool's reserve is
     * still counted (as much as the driver still holds, at least); after cuMemPoolTrimTo it is
     * gone. */
    CUmemoryPool dpool = NULL;
    CU(cuDeviceGetMemPool(&dpool, dev));
    b = snap();
    CU(cuMemAllocAsync(&p, 6 * MIB + 1, NULL));
    grew_pool("cuMemAllocAsync(6 MiB + 1)", b, round_up(6 * MIB + 1, g_gran));
    CU(cuMemFreeAsync(p, NULL));
    CU(cuStreamSynchronize(NULL));
    struct snap kept = snap();
    CHECK(kept.reg - b.reg >= kept.real - b.real && kept.seen == kept.reg,
          "cuMemFreeAsync: the pool's reserve stays accounted (%llu) while the driver holds %llu",
          kept.reg - b.reg, kept.real - b.real);
    struct snap before_reuse = snap();
    CU(cuMemAllocAsync(&p, 4 * MIB, NULL));
    CHECK(region_usage(0) == before_reuse.reg,
          "an allocation the pool's reserve can serve adds nothing (%llu -> %llu)",
          before_reuse.reg, region_usage(0));
    CU(cuMemFreeAsync(p, NULL));
    CU(cuStreamSynchronize(NULL));
    CU(cuMemPoolTrimTo(dpool, 0));
    back("cuMemPoolTrimTo(default pool, 0)", b);

    b = snap();
    CU(cuMemAllocAsync_ptsz(&p, 6 * MIB, CU_STREAM_PER_THREAD));
    grew_pool("cuMemAllocAsync_ptsz(6 MiB)", b, round_up(6 * MIB, g_gran));
    CU(cuMemFreeAsync_ptsz(p, CU_STREAM_PER_THREAD));
    CU(cuStreamSynchronize_ptsz(CU_STREAM_PER_THREAD));
    CU(cuMemPoolTrimTo(dpool, 0));
    back("cuMemFreeAsync_ptsz + trim", b);

    /* cudaMallocAsync memory may be freed with cuMemFree and vice versa. */
    b = snap();
    CU(cuMemAllocAsync(&p, 4 * MIB, NULL));
    CU(cuStreamSynchronize(NULL));
    CU(cuMemFree_v2(p));
    CU(cuMemPoolTrimTo(dpool, 0));
    back("cuMemAllocAsync freed with cuMemFree_v2 (+ trim)", b);

    CUmemPoolProps pp = pool_props(dev);
    CUmemoryPool pool;
    CU(cuMemPoolCreate(&pool, &pp));
    b = snap();
    CU(cuMemAllocFromPoolAsync(&p, 12 * MIB, pool, NULL));
    grew_pool("cuMemAllocFromPoolAsync(12 MiB)", b, 12 * MIB);
    CU(cuMemAllocFromPoolAsync_ptsz(&p2, 2 * MIB, pool, CU_STREAM_PER_THREAD));
    grew_pool("... plus cuMemAllocFromPoolAsync_ptsz(2 MiB)", b, 14 * MIB);
    CU(cuMemFreeAsync(p, NULL));
    CU(cuMemFreeAsync_ptsz(p2, CU_STREAM_PER_THREAD));
    CU(cuStreamSynchronize(NULL));
    CU(cuStreamSynchronize_ptsz(CU_STREAM_PER_THREAD));
    kept = snap();
    CHECK(kept.reg - b.reg >= kept.real - b.real,
          "freed pool memory: accounted %llu >= what the driver keeps %llu", kept.reg - b.reg,
          kept.real - b.real);
    CU(cuMemPoolTrimTo(pool, 0));
    back("cuMemPoolTrimTo(pool, 0)", b);
    CU(cuMemAllocFromPoolAsync(&p, 8 * MIB, pool, NULL));
    CU(cuStreamSynchronize(NULL));
    CU(cuMemFreeAsync(p, NULL));
    CU(cuStreamSynchronize(NULL));
    CU(cuMemPoolDestroy(pool));
    back("cuMemPoolDestroy releases the pool's reserve", b);

    /* At the limit, memory cached in a pool does not stand in the application's way: a refused
     * allocation (by any path) trims the device's pools and is admitted. */
    {
        size_t fr0, tot0;
        CU(cuMemGetInfo_v2(&fr0, &tot0));
        /* Real pools reserve in 32 MiB steps, which admission counts ahead: leave two. */
        unsigned long long step = 32ull * MIB;
        unsigned long long big = (fr0 / step) * step - 2 * step;
        CUdeviceptr q = 0, q2 = 0;
        CU(cuMemAllocAsync(&q, big, NULL));
        CU(cuMemFreeAsync(q, NULL));
        CU(cuStreamSynchronize(NULL));
        b = snap();
        CHECK(b.reg >= big, "a freed %llu MiB stays in the default pool's reserve (region %llu MiB)",
              big / MIB, b.reg / MIB);
        CUresult rq = cuMemAlloc_v2(&q2, big);
        CHECK(rq == CUDA_SUCCESS, "cuMemAlloc_v2 of %llu MiB succeeds: the pool was trimmed to make "
              "room (%d)", big / MIB, (int)rq);
        CHECK(real_used(0) <= limit, "the driver's usage %llu MiB stays within the limit",
              real_used(0) / MIB);
        if (rq == CUDA_SUCCESS)
            CU(cuMemFree_v2(q2));
        CU(cuMemAllocAsync(&q, big, NULL));
        CU(cuMemFreeAsync(q, NULL));
        CU(cuStreamSynchronize(NULL));
        CU(cuMemPoolCreate(&pool, &pp));
        rq = cuMemAllocFromPoolAsync(&q, big, pool, NULL);
        CHECK(rq == CUDA_SUCCESS, "cuMemAllocFromPoolAsync of %llu MiB from another pool succeeds "
              "after the default pool's trim (%d)", big / MIB, (int)rq);
        CHECK(real_used(0) <= limit, "the driver's usage %llu MiB stays within the limit",
              real_used(0) / MIB);
        if (rq == CUDA_SUCCESS) {
            CU(cuMemFreeAsync(q, NULL));
            CU(cuStreamSynchronize(NULL));
        }
        CU(cuMemPoolDestroy(pool));
        CU(cuMemPoolTrimTo(dpool, 0));
        CHECK(region_usage(0) < b.reg - big + g_gran, "everything trimmed again (%llu MiB)",
              region_usage(0) / MIB);
    }

    /* Arrays */
    CUarray arr;
    CUDA_ARRAY_DESCRIPTOR ad = {1024, 1024, CU_AD_FORMAT_FLOAT, 4};
    b = snap();
    CU(cuArrayCreate_v2(&arr, &ad));
    grew_at_least("cuArrayCreate_v2(1024 x 1024 float4)", b, 16 * MIB);
    CU(cuArrayDestroy(arr));
    back("cuArrayDestroy", b);

    CUDA_ARRAY_DESCRIPTOR_v1 ad1 = {2048, 512, CU_AD_FORMAT_UNSIGNED_INT16, 2};
    b = snap();
    r = cuArrayCreate(&arr, &ad1);
    if (r == CUDA_SUCCESS) {
        grew_at_least("cuArrayCreate (legacy)(2048 x 512 u16x2)", b, 4 * MIB);
        CU(cuArrayDestroy(arr));
        back("cuArrayDestroy (legacy)", b);
    } else {
        INFO("SKIP legacy cuArrayCreate: %d", (int)r);
    }

    CUDA_ARRAY3D_DESCRIPTOR a3 = {256, 256, 256, CU_AD_FORMAT_UNSIGNED_INT8, 1, 0};
    b = snap();
    CU(cuArray3DCreate_v2(&arr, &a3));
    grew_at_least("cuArray3DCreate_v2(256^3 u8)", b, 16 * MIB);
    CU(cuArrayDestroy(arr));
    back("cuArrayDestroy (3D)", b);

    CUDA_ARRAY3D_DESCRIPTOR_v1 a31 = {128, 128, 64, CU_AD_FORMAT_FLOAT, 1, 0};
    b = snap();
    r = cuArray3DCreate(&arr, &a31);
    if (r == CUDA_SUCCESS) {
        grew_at_least("cuArray3DCreate (legacy)(128 x 128 x 64 float)", b, 4 * MIB);
        CU(cuArrayDestroy(arr));
        back("cuArrayDestroy (legacy 3D)", b);
    } else {
        INFO("SKIP legacy cuArray3DCreate: %d", (int)r);
    }

    CUmipmappedArray mm;
    CUDA_ARRAY3D_DESCRIPTOR md = {2048, 2048, 0, CU_AD_FORMAT_FLOAT, 1, 0};
    b = snap();
    CU(cuMipmappedArrayCreate(&mm, &md, 4));
    grew_at_least("cuMipmappedArrayCreate(2048^2 float, 4 levels)", b, 16 * MIB);
    CU(cuMipmappedArrayDestroy(mm));
    back("cuMipmappedArrayDestroy", b);

    /* A free of memory we never saw (allocated behind libvgpu's back) passes through. */
    typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
    alloc_fn real_alloc = (alloc_fn)real_sym("libcuda.so.1", "cuMemAlloc_v2");
    CHECK(real_alloc != NULL && (void *)real_alloc != (void *)cuMemAlloc_v2,
          "the driver's own cuMemAlloc_v2 (%p) is not the hook (%p)", (void *)real_alloc,
          (void *)cuMemAlloc_v2);
    if (real_alloc) {
        unsigned long long reg0 = region_usage(0), real0 = real_used_by(0, getpid());
        CU(real_alloc(&p, 8 * MIB));
        CHECK(region_usage(0) == reg0, "an allocation behind the hooks is not accounted");
        r = cuMemFree_v2(p);
        CHECK(r == CUDA_SUCCESS, "cuMemFree_v2 of a pointer the hooks never saw succeeds (%d)",
              (int)r);
        CHECK(region_usage(0) == reg0 && real_used_by(0, getpid()) == real0,
              "... and frees it without touching the accounting (real %llu -> %llu)", real0,
              real_used_by(0, getpid()));
    }
    r = cuMemFree_v2(0xdead0000ULL);
    CHECK(r != CUDA_SUCCESS && r != CUDA_ERROR_OUT_OF_MEMORY,
          "a free of a pointer nobody allocated is the driver's error (%d)", (int)r);

    /* A second context costs memory; destroying it releases that and what it allocated. */
    b = snap();
    CUcontext c2;
    CU(cuCtxCreate_v2(&c2, 0, dev));
    unsigned long long c2cost = region_usage(0) - b.reg;
    CHECK(c2cost > 0, "cuCtxCreate_v2: context cost %llu MiB accounted", c2cost / MIB);
    CHECK(real_used_by(0, getpid()) - b.real <= c2cost, "cuCtxCreate_v2: real %llu <= accounted %llu",
          real_used_by(0, getpid()) - b.real, c2cost);
    CU(cuMemAlloc_v2(&p, 20 * MIB));
    CU(cuArrayCreate_v2(&arr, &ad));
    CHECK(region_usage(0) > b.reg + c2cost, "allocations in the second context are accounted");
    CU(cuCtxDestroy_v2(c2));
    CU(cuCtxSetCurrent(pctx));
    b.seen = seen_used();
    back("cuCtxDestroy_v2 (its context and its allocations)", b);

    CUcontext c3;
    b = snap();
    r = cuCtxCreate_v4(&c3, NULL, 0, dev);
    if (r == CUDA_SUCCESS) {
        CHECK(region_usage(0) > b.reg, "cuCtxCreate_v4 is accounted");
        CU(cuCtxDestroy_v2(c3));
    } else {
        INFO("SKIP cuCtxCreate_v4: %d", (int)r);
    }
    CUexecAffinityParam aff = {CU_EXEC_AFFINITY_TYPE_SM_COUNT, {{1}}};
    r = cuCtxCreate_v3(&c3, &aff, 1, 0, dev);
    if (r == CUDA_SUCCESS) {
        CHECK(region_usage(0) > b.reg, "cuCtxCreate_v3 is accounted");
        CU(cuCtxDestroy_v2(c3));
    } else {
        INFO("SKIP cuCtxCreate_v3: %d", (int)r);
    }
    CU(cuCtxSetCurrent(pctx));
    b.seen = seen_used();
    back("cuCtxCreate_v4/_v3 + cuCtxDestroy_v2", b);

    /* Views */
    size_t tm = 0;
    CU(cuDeviceTotalMem_v2(&tm, dev));
    CHECK(tm == limit, "cuDeviceTotalMem_v2 %zu == limit %llu", tm, limit);
    unsigned int tm32 = 0;
    if (cuDeviceTotalMem(&tm32, dev) == CUDA_SUCCESS)
        CHECK(tm32 == (limit > 0xffffffffULL ? 0xffffffffU : limit),
              "cuDeviceTotalMem (legacy) %u == limit", tm32);
    unsigned int f32 = 0, t32 = 0;
    if (cuMemGetInfo(&f32, &t32) == CUDA_SUCCESS)
        CHECK(t32 == (limit > 0xffffffffULL ? 0xffffffffU : limit),
              "cuMemGetInfo (legacy) total %u == limit", t32);

    CU(cuMemAlloc_v2(&p, 100 * MIB));
    CHECK(nvmlInit_v2() == NVML_SUCCESS, "nvmlInit_v2");
    nvmlDevice_t nd;
    CHECK(nvmlDeviceGetHandleByIndex_v2(0, &nd) == NVML_SUCCESS, "nvmlDeviceGetHandleByIndex_v2");
    nvmlMemory_t m;
    CHECK(nvmlDeviceGetMemoryInfo(nd, &m) == NVML_SUCCESS, "nvmlDeviceGetMemoryInfo");
    CHECK(m.total == limit && m.used == region_usage(0) && m.free == limit - m.used,
          "nvmlDeviceGetMemoryInfo: total %llu == limit, used %llu == region %llu, free %llu",
          m.total, m.used, region_usage(0), m.free);
    nvmlMemory_v2_t m2;
    memset(&m2, 0, sizeof m2);
    m2.version = nvmlMemory_v2;
    CHECK(nvmlDeviceGetMemoryInfo_v2(nd, &m2) == NVML_SUCCESS, "nvmlDeviceGetMemoryInfo_v2");
    CHECK(m2.total == limit && m2.used == region_usage(0) &&
              m2.free + m2.used + m2.reserved == limit,
          "nvmlDeviceGetMemoryInfo_v2: total %llu, used %llu, reserved %llu, free %llu", m2.total,
          m2.used, m2.reserved, m2.free);
    CU(cuMemFree_v2(p));

    /* The last primary release frees the context and its allocations. */
    CU(cuMemAlloc_v2(&p, 30 * MIB));
    CU(cuDevicePrimaryCtxRelease_v2(dev));
    CHECK(region_usage(0) == 0, "last cuDevicePrimaryCtxRelease_v2 releases the context and its "
          "allocations (region %llu)", region_usage(0));
    return finish();
}
