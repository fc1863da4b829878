/*
 * t_multi: HK_PROCS (default 8) processes, started at once with fork+exec, allocate random sizes
 * through random paths (cuMemAlloc_v2, cuMemAllocManaged, cuMemAllocAsync, cuMemCreate) and free
 * them in random order, against one limit (HK_LIMIT). The parent samples the driver's real usage
 * all the while: it never exceeds the limit. The limit is contended (some allocations are
 * refused), every worker succeeds, and at the end the region holds nothing.
 */
#include "common.h"

#define HELD_MAX 24

struct held {
    int kind; /* 0 alloc, 1 managed, 2 async, 3 vmm */
    CUdeviceptr p;
    CUmemGenericAllocationHandle h;
};

static int worker(int out_fd, unsigned seed, unsigned long long limit)
{
    g_test = "multi-worker";
    CU(cuInit(0));
    CUdevice dev;
    CU(cuDeviceGet(&dev, 0));
    CUcontext ctx;
    CUresult cr = cuCtxCreate_v2(&ctx, 0, dev);
    if (cr == CUDA_ERROR_OUT_OF_MEMORY) {
        dprintf(out_fd, "ctxoom 1 0 0 0\n");
        return 0;
    }
    CU(cr);
    unsigned long long g = granularity(dev);
    srand(seed);
    struct held held[HELD_MAX];
    int n = 0, allocs = 0, ooms = 0, bad = 0, over = 0;
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    for (int it = 0; it < 300; it++) {
        if (n < HELD_MAX && (n == 0 || rand() % 100 < 60)) {
            size_t sz = (size_t)(1 + rand() % 96) * MIB + (size_t)(rand() % 4096);
            struct held x = {rand() % 4, 0, 0};
            CUresult r;
            switch (x.kind) {
            case 0: r = cuMemAlloc_v2(&x.p, sz); break;
            case 1: r = cuMemAllocManaged(&x.p, sz, CU_MEM_ATTACH_GLOBAL); break;
            case 2: r = cuMemAllocAsync(&x.p, sz, NULL); break;
            default: r = cuMemCreate(&x.h, round_up(sz, g), &prop, 0); break;
            }
            if (r == CUDA_SUCCESS) {
                held[n++] = x;
                allocs++;
            } else if (r == CUDA_ERROR_OUT_OF_MEMORY) {
                ooms++;
            } else {
                bad++;
            }
        } else {
            int i = rand() % n;
            struct held x = held[i];
            held[i] = held[--n];
            CUresult r = x.kind == 3 ? cuMemRelease(x.h)
                         : x.kind == 2 ? cuMemFreeAsync(x.p, NULL)
                                       : cuMemFree_v2(x.p);
            if (r != CUDA_SUCCESS)
                bad++;
        }
        /* In-flight reservations that will be rolled back can show the sum above the limit
         * for an instant; what is allocated never is (the parent checks the driver). */
        if (region_usage(0) > limit)
            over++;
        if (rand() % 4 == 0)
            usleep((useconds_t)(rand() % 500));
    }
    {
        unsigned long long mine = region_usage_pid(0, getpid()), real = real_used_by(0, getpid());
        if (real > mine)
            INFO("pid %d: the driver holds %llu MiB, %llu MiB more than accounted (%llu MiB)",
                 getpid(), real / MIB, (real - mine) / MIB, mine / MIB);
    }
    while (n > 0) {
        struct held x = held[--n];
        CUresult r = x.kind == 3 ? cuMemRelease(x.h)
                     : x.kind == 2 ? cuMemFreeAsync(x.p, NULL)
                                   : cuMemFree_v2(x.p);
        if (r != CUDA_SUCCESS)
            bad++;
    }
    CU(cuStreamSynchronize(NULL));
    CU(cuCtxDestroy_v2(ctx));
    if (over)
        INFO("pid %d saw in-flight reservations above the limit %d times", getpid(), over);
    dprintf(out_fd, "ok %d %d %d %d\n", allocs, ooms, bad, getpid());
    return bad ? 1 : 0;
}

int main(int argc, char **argv)
{
    const unsigned long long limit = env_ull("HK_LIMIT", GIB);
    if (argc >= 4 && strcmp(argv[1], "worker") == 0)
        return worker(atoi(argv[2]), (unsigned)atoi(argv[3]), limit);

    g_test = "multi";
    int procs = (int)env_ull("HK_PROCS", 8);
    int fds[2];
    if (pipe(fds) != 0)
        return 1;
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0)
        return 1;
    self[len] = 0;
    pid_t pids[64];
    char fdarg[16];
    snprintf(fdarg, sizeof fdarg, "%d", fds[1]);
    for (int i = 0; i < procs && i < 64; i++) {
        char seed[16];
        snprintf(seed, sizeof seed, "%d", 1000 + i * 7919);
        char *av[] = {self, "worker", fdarg, seed, NULL};
        pids[i] = spawn(av, NULL);
    }
    close(fds[1]);

    unsigned long long max_real = 0, max_region = 0, samples = 0;
    int running = procs, statuses_ok = 0;
    int *done = calloc((size_t)procs, sizeof(int));
    double t0 = now_s();
    while (running > 0 && now_s() - t0 < 120) {
        unsigned long long ru = real_used(0);
        if (ru > max_real)
            max_real = ru;
        if (access(getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE") ? getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE")
                                                             : "/tmp/cudevshr.cache", R_OK) == 0) {
            unsigned long long rg = region_usage(0);
            if (rg > max_region)
                max_region = rg;
        }
        samples++;
        for (int i = 0; i < procs; i++) {
            if (done[i])
                continue;
            int st;
            pid_t w = waitpid(pids[i], &st, WNOHANG);
            if (w == pids[i]) {
                done[i] = 1;
                running--;
                if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
                    statuses_ok++;
                else
                    INFO("worker %d ended with status 0x%x", (int)pids[i], st);
            }
        }
        usleep(200);
    }
    for (int i = 0; i < procs; i++)
        if (!done[i]) {
            kill(pids[i], SIGKILL);
            wait_status(pids[i]);
        }

    char buf[8192];
    size_t got = 0;
    ssize_t k;
    while (got < sizeof buf - 1 && (k = read(fds[0], buf + got, sizeof buf - 1 - got)) > 0)
        got += (size_t)k;
    buf[got] = 0;
    int allocs = 0, ooms = 0, bad = 0, reports = 0, ctxooms = 0;
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
        char tag[16];
        int a, o, b, p;
        if (sscanf(line, "%15s %d %d %d %d", tag, &a, &o, &b, &p) == 5) {
            reports++;
            if (strcmp(tag, "ctxoom") == 0) {
                ctxooms++;
                continue;
            }
            allocs += a;
            ooms += o;
            bad += b;
        }
    }
    INFO("%d workers: %d allocations admitted, %d refused, %d contexts refused; %llu samples",
         procs, allocs, ooms, ctxooms, samples);
    CHECK(statuses_ok == procs && reports == procs, "all %d workers finished cleanly (%d ok, %d "
          "reports)", procs, statuses_ok, reports);
    CHECK(bad == 0, "no worker saw an unexpected error (%d)", bad);
    CHECK(ooms > 0, "the limit was contended: %d allocations refused", ooms);
    CHECK(max_real <= limit, "real device usage never exceeded the limit (max %llu MiB <= %llu MiB)",
          max_real / MIB, limit / MIB);
    INFO("region usage sampled up to %llu MiB (in-flight reservations included)",
         max_region / MIB);
    reap_dead_slots();
    CHECK(region_usage(0) == 0, "all usage returned to 0 in the region (%llu)", region_usage(0));
    CHECK(region_live_slots() == 0, "no slot left behind (%d live)", region_live_slots());
    CHECK(real_used(0) == 0 || !on_fake(), "the driver's real usage is back to 0 (%llu)",
          real_used(0));
    return finish();
}
