/*
 * t_hammer: HK_PROCS processes (default 32) hammer one limit (HK_LIMIT) with allocations and
 * frees of 16..256 MiB for HK_SECONDS (default 8). Meanwhile one more process takes the region
 * lock and is stopped (SIGSTOP) for the middle third of the run, and 8 hammering processes are
 * SIGKILLed. The GPU's real usage is sampled every 2 ms behind the library's back (the stand-in
 * driver's own count, or NVML's process list on a GPU: the parent is not preloaded there, see
 * c-tests/gpu/run.sh) and must stay within the limit throughout; the hammering must go on while
 * the lock holder is stopped (allocations never wait on the region lock); and once everyone is
 * gone a fresh process must see no usage at all (no phantom).
 */
#include "common.h"

#include <pthread.h>
#include <stdatomic.h>

#define KILLED 8

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

/* A C API function of the preloaded library (the tests do not link it). */
static void *capi(const char *name)
{
    void *f = dlsym(RTLD_DEFAULT, name);
    if (!f) {
        printf("FAIL [%s] %s is not exported by the preloaded library\n", g_test, name);
        exit(1);
    }
    return f;
}

/* Worker: a context (retried for 10 s while none fits), then hammering until `end`. Writes
 * "C" once it has a context, then one byte per 16 operations to `fd`. */
static int worker(int fd, double seconds)
{
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS)
        return 3;
    double give_up = now_s() + 10;
    while (cuCtxCreate_v2(&ctx, 0, dev) != CUDA_SUCCESS) {
        if (now_s() > give_up) {
            if (write(fd, "N", 1) != 1)
                return 4;
            return 0;
        }
        usleep(100000);
    }
    if (write(fd, "C", 1) != 1)
        return 4;
    CUdeviceptr held[16] = {0};
    unsigned seed = (unsigned)getpid();
    double end = now_s() + seconds;
    for (unsigned long op = 1; now_s() < end; op++) {
        int i = rand_r(&seed) % 16;
        if (held[i]) {
            cuMemFree_v2(held[i]);
            held[i] = 0;
        } else {
            size_t n = (size_t)(16 + rand_r(&seed) % 241) * MIB;
            if (cuMemAlloc_v2(&held[i], n) != CUDA_SUCCESS)
                held[i] = 0;
        }
        if (op % 16 == 0 && write(fd, ".", 1) != 1)
            return 4;
    }
    return 0;
}

int main(int argc, char **argv)
{
    g_test = "hammer";
    int procs = (int)env_ull("HK_PROCS", 32);
    double seconds = (double)env_ull("HK_SECONDS", 8);
    unsigned long long limit = env_ull("HK_LIMIT", GIB);
    if (argc == 3 && !strcmp(argv[1], "worker"))
        return worker(atoi(argv[2]), seconds);
    if (argc == 2 && !strcmp(argv[1], "holder")) {
        ((void (*)(void))capi("ensure_initialized"))();
        ((void (*)(void))capi("lock_shrreg"))();
        raise(SIGSTOP);
        ((void (*)(void))capi("unlock_shrreg"))();
        return 0;
    }
    if (argc == 2 && !strcmp(argv[1], "fresh")) {
        ((void (*)(void))capi("ensure_initialized"))();
        unsigned long long u = ((unsigned long long (*)(int))capi("hami_device_usage"))(0);
        printf("fresh %llu\n", u);
        return u == 0 ? 0 : 1;
    }
    if (procs < KILLED + 1 || procs > 64)
        procs = 32;
    char *self = realpath("/proc/self/exe", NULL);
    pthread_t t;
    pthread_create(&t, NULL, sampler, NULL);
    int pipes[64][2];
    pid_t pids[64];
    for (int i = 0; i < procs; i++) {
        if (pipe(pipes[i]) != 0)
            return 1;
        char fdarg[16];
        snprintf(fdarg, sizeof fdarg, "%d", pipes[i][1]);
        char *av[] = {self, "worker", fdarg, NULL};
        pids[i] = spawn(av, NULL);
        close(pipes[i][1]);
        fcntl(pipes[i][0], F_SETFL, O_NONBLOCK);
    }
    /* Counts each worker's progress bytes; returns how many operations all did since last. */
    int with_ctx = 0, without = 0;
    long ops_total = 0;
    long ops_in[3] = {0};
    double t0 = now_s();
    pid_t holder = -1;
    int phase = 0, killed = 0;
    while (now_s() - t0 < seconds + 15) {
        int open_pipes = 0;
        for (int i = 0; i < procs; i++) {
            if (pipes[i][0] < 0)
                continue;
            char buf[256];
            ssize_t n = read(pipes[i][0], buf, sizeof buf);
            if (n == 0) {
                close(pipes[i][0]);
                pipes[i][0] = -1;
                continue;
            }
            open_pipes++;
            for (ssize_t k = 0; k < n; k++) {
                with_ctx += buf[k] == 'C';
                without += buf[k] == 'N';
                if (buf[k] == '.') {
                    ops_total += 16;
                    ops_in[phase] += 16;
                }
            }
        }
        double t = now_s() - t0;
        if (phase == 0 && t > seconds / 3) {
            char *av[] = {self, "holder", NULL};
            holder = spawn(av, NULL);
            int st;
            waitpid(holder, &st, WUNTRACED);
            CHECK(WIFSTOPPED(st), "a process takes the region lock and is stopped (at %.1f s)", t);
            phase = 1;
        } else if (phase == 1 && !killed && t > seconds / 2) {
            for (int i = 0; i < KILLED; i++)
                kill(pids[i], SIGKILL);
            killed = 1;
        } else if (phase == 1 && t > 2 * seconds / 3) {
            kill(holder, SIGCONT);
            CHECK(wait_status(holder) == 0, "the lock holder resumes and releases (at %.1f s)", t);
            phase = 2;
        }
        if (!open_pipes && phase == 2)
            break;
        usleep(5000);
    }
    int clean = 0;
    for (int i = 0; i < procs; i++)
        clean += wait_status(pids[i]) == (i < KILLED ? 128 + SIGKILL : 0);
    atomic_store(&g_sampling, 0);
    pthread_join(t, NULL);
    INFO("%d processes got a context, %d found none free; %ld operations (%ld before the stop, "
         "%ld while the lock holder was stopped, %ld after)",
         with_ctx, without, ops_total, ops_in[0], ops_in[1], ops_in[2]);
    CHECK(clean == procs, "every process ended as it should (%d of %d; 8 by SIGKILL)", clean,
          procs);
    CHECK(with_ctx > 0 && ops_in[1] > 0,
          "the hammering went on while the lock holder was stopped (%ld operations)", ops_in[1]);
    CHECK(atomic_load(&g_real_max) <= limit,
          "the GPU's real usage stayed within the limit: peak %llu MiB of %llu",
          atomic_load(&g_real_max) / MIB, limit / MIB);
    char *av[] = {self, "fresh", NULL};
    CHECK(wait_status(spawn(av, NULL)) == 0, "a fresh process sees no phantom usage");
    return finish();
}
