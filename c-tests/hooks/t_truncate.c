/*
 * t_truncate (issue 16): the region file truncated to 0 by another process under a process that
 * holds GPU memory. The holder must survive (it died of SIGBUS), log one line about it, and
 * still refuse an allocation over its configured limit. The library's SIGBUS handler must chain
 * to the application's own handler for a fault elsewhere, and a SIGBUS sent by kill to a
 * process with no handler of its own must still end it.
 *
 *   t_truncate              the driver: runs the modes below and checks what they leave
 *   t_truncate hold LOG     the holder (stderr to LOG)
 *   t_truncate killbus      initialises the library, then raises SIGBUS
 */
#include "common.h"

#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>

static volatile sig_atomic_t g_app_faults;
static volatile void *g_app_page;

/* The application's own SIGBUS handler: maps a zero page over its own cut mapping. */
static void app_handler(int sig, siginfo_t *si, void *ctx)
{
    (void)sig;
    (void)ctx;
    if (si->si_addr == g_app_page) {
        g_app_faults++;
        mmap((void *)g_app_page, 4096, PROT_READ, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    }
}

static CUcontext start(CUdevice *dev)
{
    CU(cuInit(0));
    CU(cuDeviceGet(dev, 0));
    CUcontext ctx;
    CU(cuCtxCreate_v2(&ctx, 0, *dev));
    return ctx;
}

static long long file_len(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long long)st.st_size : -1;
}

static int hold(const char *limit_env)
{
    g_test = "truncate-hold";
    const unsigned long long limit = env_ull(limit_env, GIB);
    const char *cache = getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE");

    /* The application's handler comes first, as a JVM's would. */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = app_handler;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, NULL);

    CUdevice dev;
    CUcontext ctx = start(&dev);
    (void)ctx;
    CUdeviceptr held;
    CU(cuMemAlloc_v2(&held, 256 * MIB));
    size_t fr, tot;
    CU(cuMemGetInfo_v2(&fr, &tot));
    INFO("holding 256 MiB; the application sees %llu MiB used of %llu", (unsigned long long)(tot - fr) / MIB,
         (unsigned long long)tot / MIB);

    /* Another process cuts the region file to nothing. */
    pid_t cutter = fork();
    if (cutter == 0) {
        int fd = open(cache, O_WRONLY | O_CLOEXEC);
        _exit(fd >= 0 && ftruncate(fd, 0) == 0 ? 0 : 1);
    }
    CHECK(wait_status(cutter) == 0 && file_len(cache) == 0, "another process truncated %s to 0",
          cache);

    /* Every path that reads or writes the region runs again. */
    CUresult r = cuMemGetInfo_v2(&fr, &tot);
    CHECK(r == CUDA_SUCCESS, "cuMemGetInfo_v2 after the truncation: %d (alive)", (int)r);
    CUdeviceptr big;
    r = cuMemAlloc_v2(&big, limit + 64 * MIB);
    CHECK(r == CUDA_ERROR_OUT_OF_MEMORY, "an allocation over the configured limit is refused (%d)",
          (int)r);
    if (r == CUDA_SUCCESS)
        cuMemFree_v2(big);
    CUdeviceptr small;
    r = cuMemAlloc_v2(&small, 64 * MIB);
    CHECK(r == CUDA_SUCCESS, "an allocation under the limit is admitted again (%d): the region "
          "was initialised anew and the process registered", (int)r);
    if (r == CUDA_SUCCESS)
        cuMemFree_v2(small);
    r = cuMemFree_v2(held);
    CHECK(r == CUDA_SUCCESS, "the memory held before the truncation is freed (%d)", (int)r);
    CHECK(file_len(cache) == (long long)EXT_END + 1,
          "the file has its size again (%lld bytes)", file_len(cache));

    /* A fault in the application's own mapping still reaches the application's handler. */
    char own[] = "/tmp/hk-truncate-own.XXXXXX";
    int fd = mkstemp(own);
    if (fd < 0 || ftruncate(fd, 4096) != 0) {
        CHECK(0, "cannot make a file of the application's own");
        return finish();
    }
    g_app_page = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0);
    if (ftruncate(fd, 0) != 0)
        CHECK(0, "cannot cut the application's own file");
    unlink(own);
    char v = *(volatile char *)g_app_page;
    CHECK(g_app_faults == 1 && v == 0,
          "a SIGBUS in the application's own mapping reached its handler (%d time)",
          (int)g_app_faults);
    return finish();
}

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "hold") == 0) {
        int fd = open(argv[2], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0 || dup2(fd, 2) < 0)
            return 2;
        return hold("HK_LIMIT");
    }
    if (argc >= 2 && strcmp(argv[1], "killbus") == 0) {
        CUdevice dev;
        start(&dev);
        raise(SIGBUS);
        return 0;
    }

    g_test = "truncate";
    char log[] = "/tmp/hk-truncate-log.XXXXXX";
    int lfd = mkstemp(log);
    if (lfd < 0)
        return 2;
    close(lfd);
    char *hold_argv[] = {argv[0], "hold", log, NULL};
    int st = wait_status(spawn(hold_argv, NULL));
    CHECK(st == 0, "the holder survived the truncation and passed its checks (status %d)", st);
    int lines = count_lines(log, "was truncated under this process");
    CHECK(lines == 1, "it logged one line about the truncation (%d)", lines);
    unlink(log);

    char *kill_argv[] = {argv[0], "killbus", NULL};
    st = wait_status(spawn(kill_argv, NULL));
    CHECK(st == 128 + SIGBUS,
          "a SIGBUS sent to a process without a handler of its own still ends it (status %d)", st);
    return finish();
}
