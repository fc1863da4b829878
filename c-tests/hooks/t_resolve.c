/*
 * t_resolve: the three ways a program reaches the driver all land in the hooks.
 *   1. symbol interposition (this program is linked with -lcuda): covered by t_limit/t_paths;
 *   2. dlopen("libcuda.so.1") + dlsym: hooked names resolve to the hooks, others to the driver,
 *      unknown names to NULL; dlsym(RTLD_NEXT) still means "next after the caller";
 *   3. cuGetProcAddress / cuGetProcAddress_v2: the hook that wraps the driver's answer: the hook
 *      of the export the driver returned, or, where the driver returned an entry point it does
 *      not export, the hook of the ABI the request implies (by cudaVersion and the
 *      per-thread-default-stream flag); allocations through the returned pointers are accounted.
 */
#include "common.h"

const char *probe_next(void);

typedef CUresult (*gpa1_fn)(const char *, void **, int, cuuint64_t);
typedef CUresult (*gpa2_fn)(const char *, void **, int, cuuint64_t,
                            CUdriverProcAddressQueryResult *);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);

static void *hook(const char *name) { return dlsym(RTLD_DEFAULT, name); }

int main(void)
{
    g_test = "resolve";
    /* dlsym(RTLD_NEXT) from another library is resolved relative to that library. */
    const char *next = probe_next();
    CHECK(strcmp(next, "b") == 0, "dlsym(RTLD_NEXT) from libprobe_a finds libprobe_b's "
          "definition (got \"%s\")", next);

    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    CHECK(cuda != NULL, "dlopen(libcuda.so.1)");
    void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    CHECK(nvml != NULL, "dlopen(libnvidia-ml.so.1)");

    static const char *hooked[] = {
        "cuInit", "cuGetProcAddress", "cuGetProcAddress_v2", "cuMemAlloc", "cuMemAlloc_v2",
        "cuMemAllocPitch_v2", "cuMemAllocManaged", "cuMemFree_v2", "cuMemCreate", "cuMemRelease",
        "cuMemAllocAsync", "cuMemAllocAsync_ptsz", "cuMemAllocFromPoolAsync",
        "cuMemAllocFromPoolAsync_ptsz", "cuMemFreeAsync", "cuMemFreeAsync_ptsz",
        "cuMemPoolTrimTo", "cuArrayCreate_v2", "cuArray3DCreate_v2", "cuArrayDestroy",
        "cuMipmappedArrayCreate", "cuMipmappedArrayDestroy", "cuCtxCreate_v2", "cuCtxCreate_v3",
        "cuCtxCreate_v4", "cuCtxDestroy_v2", "cuDevicePrimaryCtxRetain",
        "cuDevicePrimaryCtxRelease_v2", "cuMemGetInfo_v2", "cuDeviceTotalMem_v2",
        "cuLaunchKernel", "cuLaunchKernel_ptsz", "cuLaunchKernelEx", "cuLaunchKernelEx_ptsz",
        "cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel_ptsz", "cuGraphLaunch",
        "cuGraphLaunch_ptsz", "cuGraphInstantiate", "cuGraphInstantiate_v2",
        "cuGraphInstantiateWithFlags", "cuGraphInstantiateWithParams",
        "cuGraphInstantiateWithParams_ptsz", "cuGraphExecUpdate", "cuGraphExecUpdate_v2",
        "cuGraphExecDestroy", "cuGraphAddNode", "cuGraphAddNode_v2", "cuGraphDestroy", NULL};
    int good = 0, total = 0;
    for (int i = 0; hooked[i]; i++) {
        void *via = dlsym(cuda, hooked[i]);
        void *real = real_sym("libcuda.so.1", hooked[i]);
        void *h = hook(hooked[i]);
        total++;
        if (via && via == h && via != real)
            good++;
        else
            INFO("dlsym(libcuda, %s) = %p, hook %p, driver %p", hooked[i], via, h, real);
    }
    CHECK(good == total, "dlsym(libcuda handle) returns the hook for %d/%d hooked names", good,
          total);
    void *name = dlsym(cuda, "cuDeviceGetName");
    CHECK(name != NULL && name == real_sym("libcuda.so.1", "cuDeviceGetName"),
          "dlsym of an unhooked name returns the driver's function");
    CHECK(dlsym(cuda, "cuNoSuchFunction_v9") == NULL, "dlsym of a name the driver lacks is NULL");
    void *nm = dlsym(nvml, "nvmlDeviceGetMemoryInfo");
    void *nm2 = dlsym(nvml, "nvmlDeviceGetMemoryInfo_v2");
    CHECK(nm && nm == hook("nvmlDeviceGetMemoryInfo") && nm2 &&
              nm2 == hook("nvmlDeviceGetMemoryInfo_v2") &&
              nm != real_sym("libnvidia-ml.so.1", "nvmlDeviceGetMemoryInfo"),
          "dlsym(libnvidia-ml handle) returns the NVML memory hooks");
    void *nn = dlsym(nvml, "nvmlDeviceGetCount_v2");
    CHECK(nn && nn == real_sym("libnvidia-ml.so.1", "nvmlDeviceGetCount_v2"),
          "dlsym of an unhooked NVML name returns NVML's function");

    /* Allocation through dlsym'ed pointers is accounted. */
    CUresult (*init)(unsigned) = (CUresult(*)(unsigned))dlsym(cuda, "cuInit");
    CU(init(0));
    CUdevice dev;
    CU(cuDeviceGet(&dev, 0));
    CUcontext ctx;
    CU(cuCtxCreate_v2(&ctx, 0, dev));
    unsigned long long g = granularity(dev);
    alloc_fn da = (alloc_fn)dlsym(cuda, "cuMemAlloc_v2");
    free_fn df = (free_fn)dlsym(cuda, "cuMemFree_v2");
    unsigned long long b = region_usage(0);
    CUdeviceptr p;
    CU(da(&p, 10 * MIB));
    CHECK(region_usage(0) - b == round_up(10 * MIB, g),
          "cuMemAlloc_v2 through dlsym is accounted (+%llu)", region_usage(0) - b);
    CU(df(p));
    CHECK(region_usage(0) == b, "cuMemFree_v2 through dlsym releases it");

    /* cuGetProcAddress */
    gpa2_fn gpa2 = (gpa2_fn)dlsym(cuda, "cuGetProcAddress_v2");
    gpa1_fn gpa1 = (gpa1_fn)dlsym(cuda, "cuGetProcAddress");
    CHECK(gpa2 && (void *)gpa2 == hook("cuGetProcAddress_v2"), "cuGetProcAddress_v2 is hooked");
    CHECK(gpa1 && (void *)gpa1 == hook("cuGetProcAddress"), "cuGetProcAddress is hooked");

    struct {
        const char *sym;
        int version;
        cuuint64_t flags;
        const char *expect; /* the hook expected, by name; NULL: the driver's own function */
    } cases[] = {
        {"cuMemAlloc", 12000, 0, "cuMemAlloc_v2"},
        {"cuMemAlloc", 3000, 0, "cuMemAlloc"},
        {"cuMemFree", 12080, 0, "cuMemFree_v2"},
        {"cuMemGetInfo", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuMemGetInfo_v2"},
        {"cuDeviceTotalMem", 11000, 0, "cuDeviceTotalMem_v2"},
        {"cuMemAllocPitch", 12000, 0, "cuMemAllocPitch_v2"},
        {"cuCtxCreate", 3020, 0, "cuCtxCreate_v2"},
        {"cuCtxCreate", 11040, 0, "cuCtxCreate_v3"},
        {"cuCtxCreate", 12080, 0, "cuCtxCreate_v4"},
        {"cuCtxDestroy", 12000, 0, "cuCtxDestroy_v2"},
        {"cuDevicePrimaryCtxRelease", 12000, 0, "cuDevicePrimaryCtxRelease_v2"},
        {"cuDevicePrimaryCtxRelease", 10000, 0, "cuDevicePrimaryCtxRelease"},
        {"cuMemAllocAsync", 12000, 0, "cuMemAllocAsync"},
        {"cuMemAllocAsync", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
         "cuMemAllocAsync_ptsz"},
        {"cuMemFreeAsync", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
         "cuMemFreeAsync_ptsz"},
        {"cuMemAllocFromPoolAsync", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
         "cuMemAllocFromPoolAsync_ptsz"},
        {"cuLaunchKernel", 12000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, "cuLaunchKernel"},
        {"cuLaunchKernel", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
         "cuLaunchKernel_ptsz"},
        {"cuLaunchKernelEx", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
         "cuLaunchKernelEx_ptsz"},
        {"cuGraphLaunch", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
         "cuGraphLaunch_ptsz"},
        {"cuLaunchCooperativeKernel", 12000, 0, "cuLaunchCooperativeKernel"},
        {"cuGraphInstantiate", 10000, 0, "cuGraphInstantiate"},
        {"cuGraphInstantiate", 11000, 0, "cuGraphInstantiate_v2"},
        {"cuGraphInstantiate", 12000, 0, "cuGraphInstantiateWithFlags"},
        {"cuGraphInstantiateWithFlags", 12080, 0, "cuGraphInstantiateWithFlags"},
        {"cuGraphInstantiateWithParams", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
         "cuGraphInstantiateWithParams_ptsz"},
        {"cuGraphInstantiateWithParams", 12000, 0, "cuGraphInstantiateWithParams"},
        {"cuGraphExecUpdate", 11000, 0, "cuGraphExecUpdate"},
        {"cuGraphExecUpdate", 12000, 0, "cuGraphExecUpdate_v2"},
        {"cuGraphExecDestroy", 12000, 0, "cuGraphExecDestroy"},
        {"cuGraphDestroy", 12000, 0, "cuGraphDestroy"},
        {"cuGraphAddNode", 12030, 0, "cuGraphAddNode"},
        {"cuGraphAddNode", 13000, 0, "cuGraphAddNode_v2"},
        {"cuGraphGetNodes", 12000, 0, NULL},
        {"cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2"},
        {"cuGetProcAddress", 11030, 0, "cuGetProcAddress"},
        {"cuMemCreate", 12000, 0, "cuMemCreate"},
        {"cuDeviceGetName", 12000, 0, NULL},
    };
    int n = (int)(sizeof cases / sizeof cases[0]);
    int ok2 = 0, ok1 = 0;
    char b1[160], b2[160];
    /* Where the symbol table and dlsym could differ (versioned or indirect symbols), and what the
     * driver answers for them: printed, not checked. */
    static const char *graph_names[] = {"cuGraphInstantiate", "cuGraphInstantiate_v2",
                                        "cuGraphInstantiateWithFlags", NULL};
    for (int i = 0; graph_names[i]; i++) {
        void *e = real_sym("libcuda.so.1", graph_names[i]), *d = lib_dlsym("libcuda.so.1", graph_names[i]);
        INFO("%s: symbol table %p, dlsym %p%s", graph_names[i], e, d, e == d ? "" : " (they differ)");
    }
    /* The driver's own answers, behind our hook. The hook that wraps exactly the driver's answer
     * is that of the export at that address (what libvgpu's hooks forward to is the driver's
     * dlsym answer, lib_dlsym). A driver may answer a base name with one of its hooked exports
     * (driver 580 answers cuGraphInstantiate at 12000 with cuGraphInstantiate_v2; then that
     * export's hook is right: a hook forwards every argument register unchanged, whatever ABI
     * the caller used), or with an entry point it does not export (then
     * the library can only forward to the export of the same ABI: the hook `expect` names). */
    gpa2_fn real_gpa2 = (gpa2_fn)real_sym("libcuda.so.1", "cuGetProcAddress_v2");
    for (int i = 0; i < n; i++) {
        void *want = cases[i].expect ? hook(cases[i].expect)
                                     : real_sym("libcuda.so.1", cases[i].sym);
        void *own = NULL;
        CUdriverProcAddressQueryResult own_st;
        if (cases[i].expect && real_gpa2 &&
            real_gpa2(cases[i].sym, &own, cases[i].version, cases[i].flags, &own_st) == CUDA_SUCCESS &&
            own && own != lib_dlsym("libcuda.so.1", cases[i].expect)) {
            const char *export = NULL;
            for (int j = 0; hooked[j] && !export; j++)
                if (own == lib_dlsym("libcuda.so.1", hooked[j]))
                    export = hooked[j];
            if (export) {
                want = hook(export);
                INFO("the driver answers %s at %d with its export %s, not %s's",
                     cases[i].sym, cases[i].version, export, cases[i].expect);
            } else {
                INFO("the driver answers %s at %d with %p (%s), not an export of %s or %s (%p)",
                     cases[i].sym, cases[i].version, own, sym_name(own, b1, sizeof b1),
                     cases[i].sym, cases[i].expect, lib_dlsym("libcuda.so.1", cases[i].expect));
            }
        }
        void *f2 = NULL, *f1 = NULL;
        CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        CUresult r2 = gpa2(cases[i].sym, &f2, cases[i].version, cases[i].flags, &st);
        CUresult r1 = gpa1(cases[i].sym, &f1, cases[i].version, cases[i].flags);
        if (r2 == CUDA_SUCCESS && st == CU_GET_PROC_ADDRESS_SUCCESS && f2 && f2 == want)
            ok2++;
        else
            INFO("cuGetProcAddress_v2(%s, %d, %llu) = %d/%d %p (%s), want %p (%s)", cases[i].sym,
                 cases[i].version, (unsigned long long)cases[i].flags, (int)r2, (int)st, f2,
                 sym_name(f2, b1, sizeof b1), want, sym_name(want, b2, sizeof b2));
        if (r1 == CUDA_SUCCESS && f1 && f1 == want)
            ok1++;
        else
            INFO("cuGetProcAddress(%s, %d, %llu) = %d %p (%s), want %p (%s)", cases[i].sym,
                 cases[i].version, (unsigned long long)cases[i].flags, (int)r1, f1,
                 sym_name(f1, b1, sizeof b1), want, sym_name(want, b2, sizeof b2));
    }
    CHECK(ok2 == n, "cuGetProcAddress_v2 returns the right hook (ABI by version and stream flag) "
          "for %d/%d names", ok2, n);
    CHECK(ok1 == n, "cuGetProcAddress returns the right hook for %d/%d names", ok1, n);

    void *f = NULL;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
    CUresult r = gpa2("cuNoSuchFunction", &f, 12000, 0, &st);
    CHECK(r != CUDA_SUCCESS || f == NULL, "cuGetProcAddress_v2 of an unknown name is the "
          "driver's answer (%d, status %d, %p)", (int)r, (int)st, f);

    /* Entry points fetched the way the CUDA runtime does it: cuGetProcAddress_v2 obtained from
     * cuGetProcAddress_v2 itself, then everything through it. */
    gpa2_fn self = NULL;
    CU(gpa2("cuGetProcAddress", (void **)&self, 12080, 0, NULL));
    alloc_fn pa = NULL;
    free_fn pf = NULL;
    CU(self("cuMemAlloc", (void **)&pa, 12080, 0, NULL));
    CU(self("cuMemFree", (void **)&pf, 12080, 0, NULL));
    b = region_usage(0);
    CU(pa(&p, 3 * g));
    CHECK(region_usage(0) - b == 3 * g, "cuMemAlloc via cuGetProcAddress is accounted (+%llu)",
          region_usage(0) - b);
    CU(pf(p));
    CHECK(region_usage(0) == b, "cuMemFree via cuGetProcAddress releases it");

    typedef CUresult (*async_fn)(CUdeviceptr *, size_t, CUstream);
    typedef CUresult (*free_async_fn)(CUdeviceptr, CUstream);
    async_fn aa = NULL;
    free_async_fn fa = NULL;
    CU(self("cuMemAllocAsync", (void **)&aa, 12080, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
            NULL));
    CU(self("cuMemFreeAsync", (void **)&fa, 12080, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
            NULL));
    CU(aa(&p, 2 * g, CU_STREAM_PER_THREAD));
    /* At least the allocation: a real pool's reserve grows in larger steps, all of it counted. */
    CHECK(region_usage(0) - b >= 2 * g, "cuMemAllocAsync_ptsz via cuGetProcAddress is accounted "
          "(+%llu for %llu)", (unsigned long long)(region_usage(0) - b), (unsigned long long)(2 * g));
    CU(fa(p, CU_STREAM_PER_THREAD));
    CU(cuStreamSynchronize_ptsz(CU_STREAM_PER_THREAD));
    CUmemoryPool pool;
    CU(cuDeviceGetMemPool(&pool, dev));
    CU(cuMemPoolTrimTo(pool, 0));
    CHECK(region_usage(0) == b, "cuMemFreeAsync_ptsz via cuGetProcAddress (+ pool trim) releases it");

    CU(cuCtxDestroy_v2(ctx));
    return finish();
}
