/*
 * w_work MODE SECONDS OUT: a workload for c-tests/hooks/t_monitor.py (and c-tests/gpu/monitor.sh
 * builds it against the real driver). MODE `launch`: batches of 4 launches of 1000 blocks, then
 * cuCtxSynchronize; MODE `alloc`: cuMemAlloc of 2 MiB and cuMemFree. Every 50 ms it appends
 * "MONOTONIC_SECONDS COUNT" to OUT (COUNT: blocks launched, or allocations made, so far), so the
 * caller can see when the work moves and when it stands still (a closed priority gate, a
 * suspension). Exit status 0 when it ran for SECONDS.
 */
#include "common.h"

#define BLOCKS 1000u

int main(int argc, char **argv)
{
    if (argc != 4)
        return 2;
    g_test = "w_work";
    int alloc = strcmp(argv[1], "alloc") == 0;
    double seconds = atof(argv[2]);
    FILE *out = fopen(argv[3], "w");
    if (!out)
        return 2;
    CU(cuInit(0));
    CUdevice dev;
    CUcontext ctx;
    CU(cuDeviceGet(&dev, 0));
    CU(cuCtxCreate_v2(&ctx, 0, dev));
    CUfunction f = load_spin_kernel();
    unsigned long long count = 0;
    double t0 = now_s(), last = 0;
    fprintf(out, "%.3f 0\n", t0);
    fflush(out);
    while (now_s() - t0 < seconds) {
        if (alloc) {
            CUdeviceptr p;
            CU(cuMemAlloc_v2(&p, 2 * MIB));
            CU(cuMemFree_v2(p));
            count++;
        } else {
            for (int i = 0; i < 4; i++)
                CU(cuLaunchKernel(f, BLOCKS, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
            CU(cuCtxSynchronize());
            count += 4 * BLOCKS;
        }
        double now = now_s();
        if (now - last >= 0.05) {
            fprintf(out, "%.3f %llu\n", now, count);
            fflush(out);
            last = now;
        }
    }
    fprintf(out, "%.3f %llu\n", now_s(), count);
    fclose(out);
    CU(cuCtxDestroy_v2(ctx));
    return 0;
}
