/*
 * demo: what an application sees under libvgpu.so, for scripts/demo.sh.
 *   demo alone          cuMemGetInfo, then 64 MiB allocations until one is refused
 *   demo hold MIB FILE  allocate MIB, write FILE, wait until FILE is removed
 *   demo fill           as alone, quietly: one summary line
 */
#include "common.h"

static CUcontext start(void)
{
    CU(cuInit(0));
    CUdevice dev;
    CU(cuDeviceGet(&dev, 0));
    CUcontext ctx;
    CUresult r = cuCtxCreate_v2(&ctx, 0, dev);
    if (r != CUDA_SUCCESS) {
        const char *name = "?";
        cuGetErrorName(r, &name);
        printf("  [pid %d] cuCtxCreate_v2: %s (no room left for a context)\n", getpid(), name);
        exit(1);
    }
    return ctx;
}

static int fill(int verbose)
{
    static CUdeviceptr ptrs[4096];
    size_t fr, tot;
    CU(cuMemGetInfo_v2(&fr, &tot));
    printf("  [pid %d] cuMemGetInfo: total %llu MiB, free %llu MiB, used %llu MiB (contexts included)\n",
           getpid(), (unsigned long long)tot / MIB, (unsigned long long)fr / MIB,
           (unsigned long long)(tot - fr) / MIB);
    int n = 0;
    CUresult r = CUDA_SUCCESS;
    while (n < 4096 && (r = cuMemAlloc_v2(&ptrs[n], 64 * MIB)) == CUDA_SUCCESS) {
        n++;
        if (verbose && (n <= 2 || n % 4 == 0))
            printf("  [pid %d] cuMemAlloc_v2(64 MiB) #%d: ok (%d MiB held)\n", getpid(), n, n * 64);
    }
    const char *name = "?";
    cuGetErrorName(r, &name);
    printf("  [pid %d] cuMemAlloc_v2(64 MiB) #%d: refused with %s; %d MiB allocated in all\n",
           getpid(), n + 1, name, n * 64);
    for (int i = 0; i < n; i++)
        cuMemFree_v2(ptrs[i]);
    return 0;
}

int main(int argc, char **argv)
{
    g_test = "demo";
    if (argc >= 2 && strcmp(argv[1], "alone") == 0) {
        start();
        return fill(1);
    }
    if (argc >= 2 && strcmp(argv[1], "fill") == 0) {
        start();
        return fill(0);
    }
    if (argc >= 4 && strcmp(argv[1], "hold") == 0) {
        start();
        size_t mib = (size_t)atoi(argv[2]);
        CUdeviceptr p;
        CUresult r = cuMemAlloc_v2(&p, mib * MIB);
        printf("  [pid %d] holds %zu MiB (%s)\n", getpid(), mib, r == CUDA_SUCCESS ? "ok" : "refused");
        fflush(stdout);
        FILE *f = fopen(argv[3], "w");
        if (f)
            fclose(f);
        while (access(argv[3], F_OK) == 0)
            usleep(20000);
        return r == CUDA_SUCCESS ? 0 : 1;
    }
    fprintf(stderr, "usage: demo alone | fill | hold MIB FILE\n");
    return 2;
}
