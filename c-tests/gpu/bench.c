/*
 * bench.c: the CUDA driver calls that libvgpu.so hooks, timed, for c-tests/gpu/bench.sh, which
 * runs this same binary with and without LD_PRELOAD=libvgpu.so and prints the ratios.
 *
 * Built against fake_cuda.h (NVIDIA's names, values and layouts, no cuda.h needed), linked
 * against whichever libcuda.so.1 the script names: the real driver on the device, the stand-in
 * of c-tests/fake-driver elsewhere.
 *
 *   bench alloc [ITERS]      cuMemAlloc_v2 + cuMemFree_v2 of 2 MiB      -> "alloc_ns=<ns per pair>"
 *   bench getinfo [ITERS]    cuMemGetInfo_v2                          -> "getinfo_ns=<ns per call>"
 *   bench launch [ITERS]     cuLaunchKernel of an empty kernel (1x1),  -> "launch_ns=<ns per launch>"
 *                            cuCtxSynchronize every 1000 launches
 *   bench startup            cuInit .. first successful 2 MiB cuMemAlloc_v2
 *                            -> "startup_ns=<from before cuInit> exec_ns=<from BENCH_T0> done_at=<abs>"
 *   bench group N MODE [ITERS]
 *                            N processes (each an exec of this binary, so each loads the
 *                            libraries as a fresh process does) released together; prints
 *                            "group_median=<ns> group_max=<ns> group_wall_ns=<ns>". For alloc,
 *                            getinfo and launch the barrier is after set-up and warm-up (the
 *                            timed loops overlap); for startup it is before exec (all start at
 *                            once) and group_wall_ns runs from the release to the last process's
 *                            first allocation.
 *
 * BENCH_VERBOSE=1 copies every worker's line to stderr.
 *
 * Every worker uses device 0's primary context. A failed CUDA call prints "FAIL ..." and exits 1.
 * Times are CLOCK_MONOTONIC, which is one clock for every process of the machine.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fake_cuda.h"

#define MIB (1024ULL * 1024ULL)
#define ALLOC_BYTES (2 * MIB)
#define SYNC_EVERY 1000

/* An empty kernel, as PTX for the driver to JIT-compile: "%s" is the target, sm_XY of the
 * device up to sm_90 (whose PTX also runs on newer GPUs); PTX ISA 7.8 is CUDA 12.0's. */
static const char PTX_FMT[] = ".version 7.8\n"
                              ".target %s\n"
                              ".address_size 64\n"
                              ".visible .entry empty()\n"
                              "{\n"
                              "    ret;\n"
                              "}\n";

static long long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

#define CU(call)                                                                              \
    do {                                                                                      \
        CUresult r_ = (call);                                                                 \
        if (r_ != CUDA_SUCCESS) {                                                             \
            printf("FAIL %s returned %d (%s:%d)\n", #call, (int)r_, __FILE__, __LINE__);       \
            fflush(stdout);                                                                   \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

static void context(void)
{
    CUdevice dev;
    CUcontext ctx;
    CU(cuInit(0));
    CU(cuDeviceGet(&dev, 0));
    CU(cuDevicePrimaryCtxRetain(&ctx, dev));
    CU(cuCtxSetCurrent(ctx));
}

/* In a group: say "ready", then wait until the parent releases everyone (EOF on the go pipe). */
static void barrier(void)
{
    const char *r = getenv("BENCH_READY_FD"), *g = getenv("BENCH_GO_FD");
    if (!r || !g)
        return;
    int rfd = atoi(r), gfd = atoi(g);
    char c = 'r';
    if (write(rfd, &c, 1) != 1)
        exit(1);
    close(rfd);
    while (read(gfd, &c, 1) < 0 && errno == EINTR) {
    }
    close(gfd);
}

static long iters_arg(int argc, char **argv, int i, long def)
{
    return argc > i ? atol(argv[i]) : def;
}

static void alloc_once(void)
{
    CUdeviceptr p;
    CU(cuMemAlloc_v2(&p, ALLOC_BYTES));
    CU(cuMemFree_v2(p));
}

static int run_alloc(long iters)
{
    context();
    for (int i = 0; i < 100; i++)
        alloc_once();
    barrier();
    long long t = now_ns();
    for (long i = 0; i < iters; i++)
        alloc_once();
    printf("alloc_ns=%.1f\n", (double)(now_ns() - t) / (double)iters);
    return 0;
}

static int run_getinfo(long iters)
{
    size_t free_b, total_b;
    context();
    for (int i = 0; i < 1000; i++)
        CU(cuMemGetInfo_v2(&free_b, &total_b));
    barrier();
    long long t = now_ns();
    for (long i = 0; i < iters; i++)
        CU(cuMemGetInfo_v2(&free_b, &total_b));
    printf("getinfo_ns=%.1f\n", (double)(now_ns() - t) / (double)iters);
    return 0;
}

static int run_launch(long iters)
{
    CUmodule mod;
    CUfunction fn;
    CUdevice dev;
    int major = 0, minor = 0;
    context();
    CU(cuDeviceGet(&dev, 0));
    CU(cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
    CU(cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
    if (major > 9 || major < 5) {
        major = 9;
        minor = 0;
    }
    char target[16], ptx[sizeof PTX_FMT + 16];
    snprintf(target, sizeof target, "sm_%d%d", major, minor);
    snprintf(ptx, sizeof ptx, PTX_FMT, target);
    CU(cuModuleLoadData(&mod, ptx));
    CU(cuModuleGetFunction(&fn, mod, "empty"));
    for (int i = 0; i < 2 * SYNC_EVERY; i++)
        CU(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
    CU(cuCtxSynchronize());
    barrier();
    long long t = now_ns();
    for (long i = 0; i < iters; i++) {
        CU(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
        if ((i + 1) % SYNC_EVERY == 0)
            CU(cuCtxSynchronize());
    }
    CU(cuCtxSynchronize());
    printf("launch_ns=%.1f\n", (double)(now_ns() - t) / (double)iters);
    return 0;
}

static int run_startup(void)
{
    long long t0 = now_ns();
    CUdeviceptr p;
    context();
    CU(cuMemAlloc_v2(&p, ALLOC_BYTES));
    long long t1 = now_ns();
    const char *e = getenv("BENCH_T0");
    long long exec0 = e ? atoll(e) : t0;
    printf("startup_ns=%lld exec_ns=%lld done_at=%lld\n", t1 - t0, t1 - exec0, t1);
    CU(cuMemFree_v2(p));
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The first number after `key` in `line`, or -1. */
static double field(const char *line, const char *key)
{
    const char *p = strstr(line, key);
    return p ? atof(p + strlen(key)) : -1;
}

static int run_group(int n, char **mode_argv)
{
    const char *mode = mode_argv[0];
    int startup = strcmp(mode, "startup") == 0;
    int ready[2], go[2], res[2];
    if (pipe(ready) || pipe(go) || pipe(res)) {
        perror("FAIL pipe");
        return 1;
    }
    pid_t *pids = calloc((size_t)n, sizeof *pids);
    for (int i = 0; i < n; i++) {
        pid_t pid = fork();
        if (pid < 0) {
            perror("FAIL fork");
            return 1;
        }
        if (pid == 0) {
            close(ready[0]);
            close(go[1]);
            close(res[0]);
            dup2(res[1], 1);
            close(res[1]);
            char buf[32];
            if (startup) {
                close(ready[1]);
                char c;
                while (read(go[0], &c, 1) < 0 && errno == EINTR) {
                }
                close(go[0]);
                snprintf(buf, sizeof buf, "%lld", now_ns());
                setenv("BENCH_T0", buf, 1);
            } else {
                snprintf(buf, sizeof buf, "%d", ready[1]);
                setenv("BENCH_READY_FD", buf, 1);
                snprintf(buf, sizeof buf, "%d", go[0]);
                setenv("BENCH_GO_FD", buf, 1);
            }
            execv("/proc/self/exe", mode_argv - 1);
            _exit(127);
        }
        pids[i] = pid;
    }
    close(ready[1]);
    close(go[0]);
    close(res[1]);
    if (!startup) {
        for (int got = 0; got < n;) {
            char c;
            ssize_t k = read(ready[0], &c, 1);
            if (k == 1)
                got++;
            else if (k == 0 || errno != EINTR) {
                printf("FAIL only %d of %d workers got ready\n", got, n);
                return 1;
            }
        }
    }
    long long t_go = now_ns();
    close(go[1]);
    FILE *in = fdopen(res[0], "r");
    double *v = calloc((size_t)n, sizeof *v);
    int nv = 0, bad = 0;
    long long last_done = 0;
    char line[512];
    char key[32];
    snprintf(key, sizeof key, "%s_ns=", mode);
    int verbose = getenv("BENCH_VERBOSE") != NULL;
    while (fgets(line, sizeof line, in)) {
        if (verbose)
            fputs(line, stderr);
        if (strncmp(line, "FAIL", 4) == 0) {
            fputs(line, stdout);
            bad = 1;
        }
        double x = field(line, key);
        if (x >= 0 && nv < n)
            v[nv++] = x;
        if (startup) {
            long long d = (long long)field(line, "done_at=");
            if (d > last_done)
                last_done = d;
        }
    }
    long long t_end = now_ns();
    for (int i = 0; i < n; i++) {
        int st = 0;
        waitpid(pids[i], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            bad = 1;
    }
    if (bad || nv != n) {
        printf("FAIL %d of %d workers reported\n", nv, n);
        return 1;
    }
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    long long wall = startup ? last_done - t_go : t_end - t_go;
    printf("group_n=%d group_median=%.1f group_max=%.1f group_wall_ns=%lld\n", n, v[n / 2],
           v[n - 1], wall);
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) {
        fprintf(stderr, "usage: %s alloc|getinfo|launch [ITERS] | startup | group N MODE [ITERS]\n",
                argv[0]);
        return 2;
    }
    const char *mode = argv[1];
    if (strcmp(mode, "alloc") == 0)
        return run_alloc(iters_arg(argc, argv, 2, 5000));
    if (strcmp(mode, "getinfo") == 0)
        return run_getinfo(iters_arg(argc, argv, 2, 100000));
    if (strcmp(mode, "launch") == 0)
        return run_launch(iters_arg(argc, argv, 2, 100000));
    if (strcmp(mode, "startup") == 0)
        return run_startup();
    if (strcmp(mode, "group") == 0 && argc >= 4) {
        int n = atoi(argv[2]);
        if (n < 1)
            return 2;
        argv[2] = argv[0]; /* the workers' argv: this program, MODE, [ITERS] */
        return run_group(n, argv + 3);
    }
    fprintf(stderr, "unknown mode %s\n", mode);
    return 2;
}
