/*
 * t_sigkill: a process holding most of the limit is SIGKILLed (no exit handler runs); its
 * memory becomes available to the next process. Modes: "hog" (allocate until refused, report,
 * wait), "probe" (try one allocation of HK_PROBE bytes; exit 2 if refused), "fill" (allocate
 * 64 MiB chunks until refused, print the total).
 */
#include "common.h"

static int start(CUcontext *ctx)
{
    CU(cuInit(0));
    CUdevice dev;
    CU(cuDeviceGet(&dev, 0));
    return cuCtxCreate_v2(ctx, 0, dev) == CUDA_SUCCESS;
}

static unsigned long long fill(CUdeviceptr *ptrs, int max, int *n)
{
    *n = 0;
    while (*n < max && cuMemAlloc_v2(&ptrs[*n], 64 * MIB) == CUDA_SUCCESS)
        (*n)++;
    return (unsigned long long)*n * 64 * MIB;
}

static pid_t run(char *self, const char *mode, int fd)
{
    char fdarg[16];
    snprintf(fdarg, sizeof fdarg, "%d", fd);
    char *av[] = {self, (char *)mode, fdarg, NULL};
    return spawn(av, NULL);
}

int main(int argc, char **argv)
{
    const unsigned long long limit = env_ull("HK_LIMIT", GIB);
    static CUdeviceptr ptrs[4096];
    if (argc >= 3) {
        int fd = atoi(argv[2]);
        CUcontext ctx;
        g_test = argv[1];
        if (strcmp(argv[1], "hog") == 0) {
            if (!start(&ctx))
                return 3;
            int n;
            unsigned long long got = fill(ptrs, 4096, &n);
            dprintf(fd, "%llu\n", got);
            close(fd);
            for (;;)
                pause();
        }
        if (strcmp(argv[1], "probe") == 0) {
            if (!start(&ctx))
                return 2; /* no room for a context either */
            CUdeviceptr p;
            CUresult r = cuMemAlloc_v2(&p, (size_t)env_ull("HK_PROBE", 256 * MIB));
            return r == CUDA_SUCCESS ? 0 : r == CUDA_ERROR_OUT_OF_MEMORY ? 2 : 1;
        }
        if (strcmp(argv[1], "fill") == 0) {
            if (!start(&ctx))
                return 3;
            int n;
            unsigned long long got = fill(ptrs, 4096, &n);
            dprintf(fd, "%llu %llu\n", got, region_usage_kind(0, 0));
            return 0;
        }
        return 1;
    }

    g_test = "sigkill";
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0)
        return 1;
    self[len] = 0;

    int fds[2];
    if (pipe(fds) != 0)
        return 1;
    pid_t hog = run(self, "hog", fds[1]);
    close(fds[1]);
    char buf[128] = {0};
    ssize_t k = read(fds[0], buf, sizeof buf - 1);
    close(fds[0]);
    unsigned long long held = k > 0 ? strtoull(buf, NULL, 10) : 0;
    CHECK(held > limit / 2, "the hog holds %llu MiB of the %llu MiB limit", held / MIB,
          limit / MIB);
    unsigned long long before_kill = region_usage(0);

    int st = wait_status(run(self, "probe", -1));
    CHECK(st == 2, "while the hog lives, another process is refused (status %d)", st);

    kill(hog, SIGKILL);
    st = wait_status(hog);
    CHECK(st == 128 + SIGKILL, "the hog died of SIGKILL (status %d)", st);
    CHECK(region_usage(0) == before_kill, "its usage is still in the region (%llu MiB): no exit "
          "handler ran", region_usage(0) / MIB);

    if (pipe(fds) != 0)
        return 1;
    pid_t filler = run(self, "fill", fds[1]);
    close(fds[1]);
    memset(buf, 0, sizeof buf);
    k = read(fds[0], buf, sizeof buf - 1);
    close(fds[0]);
    st = wait_status(filler);
    unsigned long long got = 0, ctx = 0;
    if (k > 0)
        sscanf(buf, "%llu %llu", &got, &ctx);
    CHECK(st == 0, "a new process runs (status %d)", st);
    CHECK(got + ctx + 64 * MIB > limit && got + ctx <= limit,
          "the dead process's memory is available again: the next one got %llu MiB + context "
          "%llu MiB of %llu MiB", got / MIB, ctx / MIB, limit / MIB);
    reap_dead_slots();
    CHECK(region_usage(0) == 0, "the region is empty at the end (%llu)", region_usage(0));
    CHECK(!on_fake() || real_used(0) == 0, "the driver's real usage is 0 at the end (%llu)",
          real_used(0));
    return finish();
}
