/*
 * t_herd: HK_PROCS processes (default 32) start at once, each retaining a primary context, under
 * HK_LIMIT. Contexts are admitted at their cost, learnt once per device, so exactly as many get
 * one as fit (HK_EXPECT, or limit / FAKE_CTX_BYTES), and the others get
 * CUDA_ERROR_OUT_OF_MEMORY with one line (on a GPU, where the cost is the driver's, the count wanted
 * is limit / the cost the library measured and published, and it is printed to compare with NVML); the GPU's real usage (the stand-in's own count, or
 * NVML's process list on a GPU), sampled every 2 ms behind the library's back, never passes the
 * limit while the contexts are created and destroyed. Then the admitted processes allocate
 * 16 MiB chunks until refused: together they can use all the rest of the limit.
 */
#include "common.h"

#include <pthread.h>
#include <stdatomic.h>

static atomic_ullong g_real_max;

/* The context cost the library published for region device `dev` in the region's tail (0: none). */
static unsigned long long published_cost(int dev)
{
    const char *path = getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE");
    unsigned long long cost = 0;
    int fd = open(path && *path ? path : "/tmp/cudevshr.cache", O_RDONLY);
    if (fd >= 0) {
        off_t at = EXT_OFFSET + offsetof(hami_ext_t, context_cost) + (off_t)dev * sizeof cost;
        if (pread(fd, &cost, sizeof cost, at) != (ssize_t)sizeof cost)
            cost = 0;
        close(fd);
    }
    return cost;
}
static atomic_int g_sampling = 1;

static void *sampler(void *arg)
{
    (void)arg;
    while (atomic_load(&g_sampling)) {
        unsigned long long u = real_used(0);
        if (u > atomic_load(&g_real_max))
            atomic_store(&g_real_max, u);
        usleep(2000);
    }
    return NULL;
}

/* Worker: waits for the start byte, retains the primary context, reports 'A' (admitted) or 'R'
 * (refused with OOM) or 'E' (other error) and its time; if admitted, waits for the fill byte,
 * allocates 16 MiB chunks until refused, reports how many, and waits to be told to exit. */
static int worker(int in, int out)
{
    char b;
    if (cuInit(0) != CUDA_SUCCESS || read(in, &b, 1) != 1)
        return 3;
    CUdevice dev;
    CUcontext ctx;
    cuDeviceGet(&dev, 0);
    double t0 = now_s();
    CUresult r = cuDevicePrimaryCtxRetain(&ctx, dev);
    char rep[64];
    int n = snprintf(rep, sizeof rep, "%c %.0f\n",
                     r == CUDA_SUCCESS ? 'A' : r == CUDA_ERROR_OUT_OF_MEMORY ? 'R' : 'E',
                     (now_s() - t0) * 1e3);
    if (write(out, rep, (size_t)n) != n)
        return 4;
    if (r != CUDA_SUCCESS)
        return 0;
    cuCtxSetCurrent(ctx);
    if (read(in, &b, 1) != 1)
        return 5;
    int chunks = 0;
    CUdeviceptr p;
    while (chunks < 100000 && cuMemAlloc_v2(&p, 16 * MIB) == CUDA_SUCCESS)
        chunks++;
    n = snprintf(rep, sizeof rep, "F %d\n", chunks);
    if (write(out, rep, (size_t)n) != n)
        return 4;
    if (read(in, &b, 1) != 1)
        return 5;
    cuDevicePrimaryCtxRelease_v2(dev);
    return 0;
}

/* Reads one line from `fd` into `buf` (blocking, with a deadline in seconds). */
static int read_line(int fd, char *buf, size_t len, double seconds)
{
    size_t k = 0;
    double end = now_s() + seconds;
    while (k + 1 < len && now_s() < end) {
        char c;
        ssize_t r = read(fd, &c, 1);
        if (r == 1) {
            if (c == '\n')
                break;
            buf[k++] = c;
        } else if (r == 0) {
            break;
        } else {
            usleep(1000);
        }
    }
    buf[k] = 0;
    return (int)k;
}

int main(int argc, char **argv)
{
    g_test = "herd";
    if (argc == 4 && !strcmp(argv[1], "worker"))
        return worker(atoi(argv[2]), atoi(argv[3]));
    int procs = (int)env_ull("HK_PROCS", 32);
    if (procs < 1 || procs > 64)
        procs = 32;
    unsigned long long limit = env_ull("HK_LIMIT", 8 * GIB);
    unsigned long long ctx = env_ull("FAKE_CTX_BYTES", 0);
    int expect = (int)env_ull("HK_EXPECT", ctx ? limit / ctx : 0);
    char *self = realpath("/proc/self/exe", NULL);
    int to[64][2], from[64][2];
    pid_t pids[64];
    for (int i = 0; i < procs; i++) {
        if (pipe(to[i]) != 0 || pipe(from[i]) != 0)
            return 1;
        char a[16], b[16];
        snprintf(a, sizeof a, "%d", to[i][0]);
        snprintf(b, sizeof b, "%d", from[i][1]);
        char *av[] = {self, "worker", a, b, NULL};
        pids[i] = spawn(av, NULL);
        close(to[i][0]);
        close(from[i][1]);
        fcntl(from[i][0], F_SETFL, O_NONBLOCK);
    }
    usleep(300000); /* every worker past cuInit */
    pthread_t t;
    pthread_create(&t, NULL, sampler, NULL);
    for (int i = 0; i < procs; i++)
        if (write(to[i][1], "s", 1) != 1)
            return 1;
    int admitted = 0, refused = 0, other = 0;
    double slowest = 0;
    int ok[64] = {0};
    for (int i = 0; i < procs; i++) {
        char line[64];
        read_line(from[i][0], line, sizeof line, 60);
        double ms = 0;
        sscanf(line + (line[0] ? 2 : 0), "%lf", &ms);
        if (ms > slowest)
            slowest = ms;
        ok[i] = line[0] == 'A';
        admitted += line[0] == 'A';
        refused += line[0] == 'R';
        other += line[0] != 'A' && line[0] != 'R';
    }
    INFO("%d processes: %d got a context, %d refused, %d other; the slowest answer took %.0f ms",
         procs, admitted, refused, other, slowest);
    unsigned long long cost = published_cost(0);
    INFO("the published context cost: %llu MiB (%llu bytes)", cost / MIB, cost);
    if (!expect && cost)
        expect = (int)(limit / cost);
    if (expect)
        CHECK(admitted == expect && refused == procs - expect,
              "exactly as many contexts as fit: %d of %d (want %d), the others refused", admitted,
              procs, expect);
    else
        CHECK(admitted > 0 && admitted + refused == procs,
              "every process is told: %d admitted, %d refused", admitted, refused);
    unsigned long long after_ctx = real_used(0);
    for (int i = 0; i < procs; i++)
        if (ok[i] && write(to[i][1], "f", 1) != 1)
            return 1;
    int chunks = 0;
    for (int i = 0; i < procs; i++) {
        if (!ok[i])
            continue;
        char line[64];
        read_line(from[i][0], line, sizeof line, 60);
        int c = 0;
        sscanf(line, "F %d", &c);
        chunks += c;
    }
    unsigned long long used = region_usage(0);
    CHECK(used + 16 * MIB > limit && used <= limit,
          "the admitted processes can use all the rest: %llu MiB counted of %llu (%d chunks of "
          "16 MiB beside %llu MiB of contexts)",
          used / MIB, limit / MIB, chunks, after_ctx / MIB);
    for (int i = 0; i < procs; i++)
        if (ok[i] && write(to[i][1], "q", 1) != 1)
            return 1;
    int clean = 0;
    for (int i = 0; i < procs; i++)
        clean += wait_status(pids[i]) == 0;
    atomic_store(&g_sampling, 0);
    pthread_join(t, NULL);
    CHECK(clean == procs, "every process ended cleanly (%d of %d)", clean, procs);
    CHECK(atomic_load(&g_real_max) <= limit,
          "the GPU's real usage stayed within the limit while contexts were created: peak %llu "
          "MiB of %llu",
          atomic_load(&g_real_max) / MIB, limit / MIB);
    return finish();
}
