/*
 * t_failclosed: the memory limit holds off the happy path (issue "fail closed"). Over the
 * stand-in driver, with HK_LIMIT (1 GiB) and 64 MiB contexts; a sampler thread reads the GPU's
 * real usage (the stand-in's own count, which the library does not hook) every 2 ms through
 * every scenario and the test asserts it never passes the limit.
 *
 * 1. stopped-holder: a process fills the limit; another takes the region lock and stops
 *    (SIGSTOP). Two newcomers cannot register in time: they are refused (no private account),
 *    each says so in one line, and nobody passes the limit. Once the holder resumes (and the
 *    filler is killed), the newcomers' next attempts register and are admitted.
 * 2. table-full: every slot belongs to a live process: a newcomer is refused, says so in one
 *    line, and is admitted at a later attempt once a slot frees.
 * 3. sizes: with 576 MiB counted, cuMemAlloc / cuMemAllocManaged / cuMemAllocAsync of SIZE_MAX
 *    and cuMemAllocPitch of 2^32 x 2^32 fail and leave the count at 576 MiB; nothing blames a
 *    peer; the limit still refuses 512 MiB more.
 * 4. phantom: a process that _exits holding 256 MiB and one SIGKILLed holding 256 MiB stop
 *    counting without anyone being refused: a registered process's cuMemGetInfo, and a fresh
 *    process's, see none of it.
 * 5. stricter: a process configured with 512m in a region created with 1g admits only up to
 *    512 MiB in all, and says so in one line.
 * 6. no-region: a region file that cannot be created, with a limit: the context is refused with
 *    one line; without a limit, the process works.
 */
#include "common.h"

#include <pthread.h>
#include <stdatomic.h>

static unsigned long long g_limit;

/* Calls the C API function `name` of the preloaded library (the tests do not link it). */
static void capi(const char *name)
{
    void (*f)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, name);
    if (!f) {
        printf("FAIL [%s] %s is not exported by the preloaded library\n", g_test, name);
        exit(1);
    }
    f();
}
static atomic_ullong g_real_max;
static atomic_int g_sampling = 1;

static void *sampler(void *arg)
{
    (void)arg;
    while (atomic_load(&g_sampling)) {
        unsigned long long u = real_used(0);
        unsigned long long m = atomic_load(&g_real_max);
        while (u > m && !atomic_compare_exchange_weak(&g_real_max, &m, u))
            ;
        usleep(2000);
    }
    return NULL;
}

static int ctx_create(CUcontext *ctx)
{
    CUdevice dev;
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS)
        return 0;
    return cuCtxCreate_v2(ctx, 0, dev) == CUDA_SUCCESS;
}

/* Child modes (argv[1]); each reports on stdout (a log file the parent reads). */
static int child(int argc, char **argv)
{
    const char *mode = argv[1];
    CUcontext ctx;
    static CUdeviceptr ptrs[1024];
    if (!strcmp(mode, "fill")) { /* context, then 64 MiB chunks until refused; then wait */
        if (!ctx_create(&ctx))
            return 3;
        int n = 0;
        while (n < 1024 && cuMemAlloc_v2(&ptrs[n], 64 * MIB) == CUDA_SUCCESS)
            n++;
        printf("filled %d\n", n);
        fflush(stdout);
        for (;;)
            pause();
    }
    if (!strcmp(mode, "holder")) { /* take the region lock, stop, release when continued */
        capi("ensure_initialized");
        capi("lock_shrreg");
        printf("locked\n");
        fflush(stdout);
        raise(SIGSTOP);
        capi("unlock_shrreg");
        return 0;
    }
    if (!strcmp(mode, "newcomer")) { /* a context and 64 MiB, retried every 50 ms for 20 s */
        int first = 1;
        for (int i = 0; i < 400; i++) {
            int ok = ctx_create(&ctx);
            CUdeviceptr p;
            if (ok && cuMemAlloc_v2(&p, 64 * MIB) == CUDA_SUCCESS) {
                printf("admitted after %d attempts\n", i + 1);
                return 0;
            }
            if (ok)
                cuCtxDestroy_v2(ctx);
            if (first) {
                printf("refused first\n");
                fflush(stdout);
                first = 0;
            }
            usleep(50000);
        }
        printf("never admitted\n");
        return 1;
    }
    if (!strcmp(mode, "sizes")) {
        if (!ctx_create(&ctx))
            return 3;
        CUdeviceptr p;
        if (cuMemAlloc_v2(&p, 512 * MIB) != CUDA_SUCCESS)
            return 4;
        unsigned long long before = region_usage_pid(0, getpid());
        size_t pitch = 0;
        CUresult r1 = cuMemAlloc_v2(&p, SIZE_MAX);
        CUresult r2 = cuMemAllocManaged(&p, SIZE_MAX, 1);
        CUresult r3 = cuMemAllocAsync(&p, SIZE_MAX, 0);
        CUresult r4 = cuMemAllocPitch_v2(&p, &pitch, (size_t)1 << 32, (size_t)1 << 32, 4);
        CUresult r5 = cuMemAlloc_v2(&p, (size_t)1 << 63);
        unsigned long long after = region_usage_pid(0, getpid());
        CUresult more = cuMemAlloc_v2(&p, 512 * MIB);
        printf("before %llu after %llu results %d %d %d %d %d more %d\n", before, after, r1, r2,
               r3, r4, r5, more);
        return 0;
    }
    if (!strcmp(mode, "leaver") || !strcmp(mode, "victim")) { /* hold 256 MiB, then go */
        if (!ctx_create(&ctx))
            return 3;
        CUdeviceptr p;
        if (cuMemAlloc_v2(&p, 256 * MIB) != CUDA_SUCCESS)
            return 4;
        printf("holding\n");
        fflush(stdout);
        if (!strcmp(mode, "leaver"))
            _exit(0); /* no atexit handler runs */
        for (;;)
            pause();
    }
    if (!strcmp(mode, "viewer")) { /* context; on SIGUSR1-free polling of a file, view usage */
        if (!ctx_create(&ctx))
            return 3;
        size_t fr = 0, tot = 0;
        if (argc > 2) { /* wait until the parent creates argv[2] */
            printf("viewing\n");
            fflush(stdout);
            for (int i = 0; i < 2000 && access(argv[2], F_OK) != 0; i++)
                usleep(5000);
            usleep(150000); /* past the views' reap interval */
        }
        cuMemGetInfo_v2(&fr, &tot);
        nvmlDevice_t h;
        nvmlMemory_t m = {0};
        nvmlInit_v2();
        nvmlDeviceGetHandleByIndex_v2(0, &h);
        nvmlDeviceGetMemoryInfo(h, &m);
        printf("seen %llu nvml %llu\n", (unsigned long long)(tot - fr), (unsigned long long)m.used);
        return 0;
    }
    if (!strcmp(mode, "greedy")) { /* 64 MiB chunks until refused; print the region's usage */
        if (!ctx_create(&ctx))
            return 3;
        int n = 0;
        while (n < 1024 && cuMemAlloc_v2(&ptrs[n], 64 * MIB) == CUDA_SUCCESS)
            n++;
        printf("got %d region %llu\n", n, region_usage(0));
        return 0;
    }
    if (!strcmp(mode, "plain")) { /* a context and 64 MiB */
        CUdeviceptr p;
        int ok = ctx_create(&ctx) && cuMemAlloc_v2(&p, 64 * MIB) == CUDA_SUCCESS;
        printf("%s\n", ok ? "works" : "refused");
        return 0;
    }
    return 99;
}

/* Starts `self mode [arg]` with stdout and stderr to `log`, plus `env` (may be NULL; an entry
 * "-NAME" unsets NAME). */
static pid_t start(char *self, const char *mode, const char *arg, const char *log,
                   char *const env[])
{
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        for (int i = 0; env && env[i]; i++)
            if (env[i][0] == '-')
                unsetenv(env[i] + 1); /* "-NAME" unsets NAME */
            else
                putenv(env[i]);
        char *av[] = {self, (char *)mode, (char *)arg, NULL};
        execv(self, av);
        _exit(127);
    }
    return pid;
}

/* Whether `log` contains `text`, waiting up to `ms`. */
static int wait_for(const char *log, const char *text, int ms)
{
    for (int i = 0; i <= ms / 10; i++) {
        FILE *f = fopen(log, "r");
        if (f) {
            char line[4096];
            while (fgets(line, sizeof line, f))
                if (strstr(line, text)) {
                    fclose(f);
                    return 1;
                }
            fclose(f);
        }
        usleep(10000);
    }
    return 0;
}


/* The first line of `log` that contains `text`, into `out`. */
static void line_of(const char *log, const char *text, char *out, size_t len)
{
    out[0] = 0;
    FILE *f = fopen(log, "r");
    if (!f)
        return;
    char line[4096];
    while (fgets(line, sizeof line, f))
        if (strstr(line, text)) {
            line[strcspn(line, "\n")] = 0;
            snprintf(out, len, "%s", line);
            break;
        }
    fclose(f);
}

static char g_dir[] = "/tmp/hk-failclosed.XXXXXX";

static const char *path(const char *name)
{
    static char buf[8][512];
    static int next;
    char *b = buf[next++ % 8];
    snprintf(b, 512, "%s/%s", g_dir, name);
    return b;
}

static void stopped_holder(char *self)
{
    g_test = "stopped-holder";
    pid_t fill = start(self, "fill", NULL, path("fill.log"), NULL);
    CHECK(wait_for(path("fill.log"), "filled", 10000), "a process fills the limit");
    pid_t holder = start(self, "holder", NULL, path("holder.log"), NULL);
    CHECK(wait_for(path("holder.log"), "locked", 10000), "another takes the region lock");
    int st;
    waitpid(holder, &st, WUNTRACED);
    CHECK(WIFSTOPPED(st), "and is stopped while it holds it");
    double t0 = now_s();
    pid_t n1 = start(self, "newcomer", NULL, path("n1.log"), NULL);
    pid_t n2 = start(self, "newcomer", NULL, path("n2.log"), NULL);
    int r1 = wait_for(path("n1.log"), "refused first", 15000);
    int r2 = wait_for(path("n2.log"), "refused first", 15000);
    CHECK(r1 && r2, "both newcomers are refused while the holder is stopped (%.1f s)",
          now_s() - t0);
    CHECK(count_lines(path("n1.log"), "admitted after") == 0 &&
              count_lines(path("n2.log"), "admitted after") == 0,
          "neither got memory meanwhile");
    char line[4096];
    line_of(path("n1.log"), "cannot register", line, sizeof line);
    CHECK(count_lines(path("n1.log"), "cannot register") == 1 &&
              count_lines(path("n2.log"), "cannot register") == 1 && strstr(line, "stopped"),
          "each says so in one line: %s", line);
    CHECK(count_lines(path("n1.log"), "within the process only") == 0,
          "no private fallback is announced");
    kill(fill, SIGKILL);
    wait_status(fill);
    kill(holder, SIGCONT);
    CHECK(wait_status(holder) == 0, "the holder resumes and releases the lock");
    CHECK(wait_status(n1) == 0 && wait_status(n2) == 0,
          "both newcomers register at a later attempt and are admitted");
    line_of(path("n1.log"), "admitted again", line, sizeof line);
    CHECK(line[0] != 0, "and say so: %s", line);
}

static void table_full(char *self)
{
    g_test = "table-full";
    pid_t sleeper = fork();
    if (sleeper == 0) {
        for (;;)
            pause();
    }
    const char *cache = getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE");
    int fd = open(cache, O_RDWR);
    shared_region_t *r = mmap(NULL, sizeof *r, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    int filled = 0;
    for (int i = 0; i < ABI_SLOTS; i++) /* every slot but ours, dead processes' too */
        if (r->procs[i].pid != getpid() || i >= r->proc_num) {
            memset(&r->procs[i], 0, sizeof r->procs[i]);
            r->procs[i].pid = sleeper;
            r->procs[i].status = 1;
            filled++;
        }
    r->proc_num = ABI_SLOTS;
    INFO("%d slots given to live pid %d", filled, (int)sleeper);
    pid_t n = start(self, "newcomer", NULL, path("full.log"), NULL);
    CHECK(wait_for(path("full.log"), "refused first", 15000), "a newcomer is refused");
    char line[4096];
    line_of(path("full.log"), "cannot register", line, sizeof line);
    CHECK(count_lines(path("full.log"), "cannot register") == 1 && strstr(line, "live processes"),
          "and says why in one line: %s", line);
    r->procs[ABI_SLOTS - 1].pid = 0;
    CHECK(wait_status(n) == 0, "once a slot frees, a later attempt registers and is admitted");
    for (int i = 0; i < ABI_SLOTS; i++)
        if (r->procs[i].pid == sleeper)
            r->procs[i].pid = 0;
    munmap(r, sizeof *r);
    kill(sleeper, SIGKILL);
    wait_status(sleeper);
}

static void sizes(char *self)
{
    g_test = "sizes";
    pid_t p = start(self, "sizes", NULL, path("sizes.log"), NULL);
    CHECK(wait_status(p) == 0, "the process runs through");
    char line[4096];
    line_of(path("sizes.log"), "before", line, sizeof line);
    unsigned long long before = 0, after = 0;
    int r[5] = {0}, more = 0;
    sscanf(line, "before %llu after %llu results %d %d %d %d %d more %d", &before, &after, &r[0],
           &r[1], &r[2], &r[3], &r[4], &more);
    CHECK(before == 576 * MIB && after == before, "huge requests change nothing counted: %s", line);
    CHECK(r[0] && r[1] && r[2] && r[3] && r[4], "each huge request fails");
    CHECK(more == CUDA_ERROR_OUT_OF_MEMORY, "the limit still refuses 512 MiB more");
    CHECK(count_lines(path("sizes.log"), "peer") == 0, "nothing blames a peer");
}

static void phantom(char *self)
{
    g_test = "phantom";
    const char *go = path("go");
    pid_t viewer = start(self, "viewer", go, path("viewer.log"), NULL);
    CHECK(wait_for(path("viewer.log"), "viewing", 10000), "a process is registered and waits");
    pid_t leaver = start(self, "leaver", NULL, path("leaver.log"), NULL);
    pid_t victim = start(self, "victim", NULL, path("victim.log"), NULL);
    CHECK(wait_for(path("victim.log"), "holding", 10000) && wait_status(leaver) == 0,
          "one process _exits holding 256 MiB, another holds 256 MiB");
    kill(victim, SIGKILL);
    wait_status(victim);
    INFO("the region still counts %llu MiB", region_usage(0) / MIB);
    close(open(go, O_CREAT | O_WRONLY, 0644));
    CHECK(wait_status(viewer) == 0, "the registered process looks again");
    char line[4096];
    line_of(path("viewer.log"), "seen", line, sizeof line);
    unsigned long long seen = 1, nvml = 1;
    sscanf(line, "seen %llu nvml %llu", &seen, &nvml);
    CHECK(seen == 64 * MIB && nvml == 64 * MIB,
          "its cuMemGetInfo and NVML show only its own context: %s", line);
    pid_t fresh = start(self, "viewer", NULL, path("fresh.log"), NULL);
    CHECK(wait_status(fresh) == 0, "a fresh process looks");
    line_of(path("fresh.log"), "seen", line, sizeof line);
    sscanf(line, "seen %llu nvml %llu", &seen, &nvml);
    CHECK(seen == 64 * MIB && nvml == 64 * MIB, "and sees only its own context: %s", line);
}

static void stricter(char *self)
{
    g_test = "stricter";
    static char *env_small[] = {"CUDA_DEVICE_MEMORY_LIMIT=512m", NULL};
    pid_t p = start(self, "greedy", NULL, path("small.log"), env_small);
    CHECK(wait_status(p) == 0, "a process configured with 512m joins the 1g region");
    char line[4096];
    line_of(path("small.log"), "got", line, sizeof line);
    int n = 0;
    unsigned long long reg = 0;
    sscanf(line, "got %d region %llu", &n, &reg);
    CHECK(reg <= 512 * MIB && n == 7, "its own, stricter limit applies: %s", line);
    line_of(path("small.log"), "differ", line, sizeof line);
    CHECK(count_lines(path("small.log"), "differ") == 1 && strstr(line, "536870912 bytes applies"),
          "said once: %s", line);
}

static void no_region(char *self)
{
    g_test = "no-region";
    static char *env_limited[] = {"CUDA_DEVICE_MEMORY_SHARED_CACHE=/proc/no-such-dir/r.cache",
                                  NULL};
    pid_t p = start(self, "plain", NULL, path("nr.log"), env_limited);
    CHECK(wait_status(p) == 0 && wait_for(path("nr.log"), "refused", 0),
          "with a limit and no usable region, GPU memory is refused");
    char line[4096];
    line_of(path("nr.log"), "refused on every device", line, sizeof line);
    CHECK(line[0] != 0, "in one line: %s", line);
    static char *env_free[] = {"CUDA_DEVICE_MEMORY_SHARED_CACHE=/proc/no-such-dir/r.cache",
                               "-CUDA_DEVICE_MEMORY_LIMIT", NULL};
    p = start(self, "plain", NULL, path("nr2.log"), env_free);
    CHECK(wait_status(p) == 0 && wait_for(path("nr2.log"), "works", 0),
          "without a limit the same process works");
}

int main(int argc, char **argv)
{
    if (argc >= 2)
        return child(argc, argv);
    g_test = "failclosed";
    g_limit = env_ull("HK_LIMIT", GIB);
    if (!mkdtemp(g_dir)) {
        printf("FAIL [%s] mkdtemp\n", g_test);
        return 1;
    }
    capi("ensure_initialized"); /* the parent creates the region with the limit */
    pthread_t t;
    pthread_create(&t, NULL, sampler, NULL);
    char *self = realpath("/proc/self/exe", NULL);
    stopped_holder(self);
    table_full(self);
    sizes(self);
    phantom(self);
    stricter(self);
    no_region(self);
    atomic_store(&g_sampling, 0);
    pthread_join(t, NULL);
    g_test = "failclosed";
    CHECK(atomic_load(&g_real_max) <= g_limit,
          "the GPU's real usage stayed within the limit throughout: peak %llu MiB of %llu",
          atomic_load(&g_real_max) / MIB, g_limit / MIB);
    return finish();
}
