/*
 * t_procs: inside a container, NVML's process queries list the container's processes, under the
 * pids the container knows, with the memory the region counts for each (contexts included), and
 * nothing of other containers. The stand-in driver reports pids as a host would (pid +
 * FAKE_NVML_PID_OFFSET). Three processes of our region (this one and workers A and B, holding
 * 50, 100 and 200 MiB beside their contexts) and one process of another container (another region
 * file, 300 MiB) run kernels; then:
 *   - nvmlDeviceGetComputeRunningProcesses v1, v2 and v3 list exactly this, A and B under their
 *     own pids with the region's counts, and never the other container's process, while the
 *     unhooked query (the driver behind libvgpu) lists all four under host pids;
 *   - a count too small gets NVML_ERROR_INSUFFICIENT_SIZE and the count needed;
 *   - graphics and MPS lists hold nothing of the other container;
 *   - nvmlDeviceGetProcessUtilization's samples are ours only, under our pids;
 *   - nvmlSystemGetProcessName(A's pid) names this test's binary;
 *   - a process killed drops out of the list at once, before its slot is reaped.
 * Workers: `t_procs work MIB` allocates MIB, launches kernels, writes "ready" on stdout and waits
 * for stdin to close; this process does the same with 50 MiB.
 */
#include "common.h"

#define MAXP 16

/* A context on device 0 holding `mib` MiB, and 20 kernels run in it (they leave utilisation
 * samples). */
static void hold_and_run(long mib)
{
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr p;
    CU(cuInit(0));
    CU(cuDeviceGet(&dev, 0));
    CU(cuCtxCreate_v2(&ctx, 0, dev));
    CU(cuMemAlloc_v2(&p, (size_t)mib * MIB));
    CUfunction f = load_spin_kernel();
    for (int i = 0; i < 20; i++)
        CU(cuLaunchKernel(f, 64, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
    CU(cuCtxSynchronize());
}

static int worker(long mib)
{
    hold_and_run(mib);
    printf("ready\n");
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0 || errno == EINTR)
        ;
    return 0;
}

struct child {
    pid_t pid;
    int to, from; /* its stdin (we hold the write end), its stdout */
};

/* Starts `t_procs work MIB` with extra environment `env`; returns once it is ready. */
static struct child start(const char *self, long mib, char *const env[])
{
    int in[2], out[2];
    struct child c = {-1, -1, -1};
    if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC))
        return c;
    char arg[32];
    snprintf(arg, sizeof arg, "%ld", mib);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[1]);
        close(out[0]);
        for (int i = 0; env && env[i]; i++)
            putenv(env[i]);
        execl(self, self, "work", arg, (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    c.pid = pid;
    c.to = in[1];
    c.from = out[0];
    char buf[16] = {0};
    ssize_t n = read(c.from, buf, sizeof buf - 1);
    CHECK(n > 0 && strncmp(buf, "ready", 5) == 0, "worker %d (%ld MiB) ready", (int)pid, mib);
    return c;
}


typedef nvmlReturn_t (*list_fn)(nvmlDevice_t, unsigned int *, nvmlProcessInfo_t *);
typedef nvmlReturn_t (*util_fn)(nvmlDevice_t, nvmlProcessUtilizationSample_t *, unsigned int *,
                                unsigned long long);

/* Pids and bytes of one list query into `pids`/`bytes`; the count, or -1 on an error. */
static int query(nvmlDevice_t h, int version, list_fn f, unsigned *pids, unsigned long long *bytes)
{
    unsigned n = MAXP;
    if (version == 1) {
        nvmlProcessInfo_v1_t v1[MAXP];
        if (nvmlDeviceGetComputeRunningProcesses(h, &n, v1) != NVML_SUCCESS)
            return -1;
        for (unsigned i = 0; i < n; i++)
            pids[i] = v1[i].pid, bytes[i] = v1[i].usedGpuMemory;
        return (int)n;
    }
    nvmlProcessInfo_t v[MAXP];
    if (f(h, &n, v) != NVML_SUCCESS)
        return -1;
    for (unsigned i = 0; i < n; i++)
        pids[i] = v[i].pid, bytes[i] = v[i].usedGpuMemory;
    return (int)n;
}

static int has(const unsigned *pids, int n, unsigned pid)
{
    for (int i = 0; i < n; i++)
        if (pids[i] == pid)
            return 1;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "work") == 0)
        return worker(atol(argv[2]));
    g_test = "procs";
    const char *self = argv[0];
    long long offset = (long long)env_ull("FAKE_NVML_PID_OFFSET", 0);
    CHECK(offset > 0, "NVML reports host pids (offset %lld)", offset);

    /* Another container: its own region file. */
    char other_region[256], other_env[300];
    snprintf(other_region, sizeof other_region, "%s.other", getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE"));
    snprintf(other_env, sizeof other_env, "CUDA_DEVICE_MEMORY_SHARED_CACHE=%s", other_region);
    char *other[] = {other_env, NULL};
    struct child x = start(self, 300, other);
    struct child a = start(self, 100, NULL);
    struct child b = start(self, 200, NULL);

    hold_and_run(50);

    nvmlInit_v2();
    nvmlDevice_t h;
    CHECK(nvmlDeviceGetHandleByIndex_v2(0, &h) == NVML_SUCCESS, "NVML device 0");

    unsigned me = (unsigned)getpid();
    unsigned ours[3] = {me, (unsigned)a.pid, (unsigned)b.pid};

    /* The driver behind the hooks lists everyone, under host pids. */
    list_fn real_v3 = (list_fn)real_sym("libnvidia-ml.so.1", "nvmlDeviceGetComputeRunningProcesses_v3");
    unsigned rp[MAXP];
    unsigned long long rb[MAXP];
    int rn = real_v3 ? query(h, 3, real_v3, rp, rb) : -1;
    CHECK(rn == 4 && has(rp, rn, (unsigned)(x.pid + offset)) && has(rp, rn, (unsigned)(me + offset)),
          "unhooked, NVML lists 4 processes under host pids, the other container's included (%d)", rn);

    list_fn hooked[] = {NULL, (list_fn)nvmlDeviceGetComputeRunningProcesses_v2,
                        nvmlDeviceGetComputeRunningProcesses_v3};
    for (int version = 1; version <= 3; version++) {
        unsigned pids[MAXP];
        unsigned long long bytes[MAXP];
        int n = query(h, version, hooked[version - 1], pids, bytes);
        CHECK(n == 3, "v%d lists the container's 3 processes (%d)", version, n);
        CHECK(!has(pids, n, (unsigned)x.pid) && !has(pids, n, (unsigned)(x.pid + offset)),
              "v%d: nothing of the other container", version);
        for (int k = 0; k < 3; k++) {
            int found = -1;
            for (int i = 0; i < n; i++)
                if (pids[i] == ours[k])
                    found = i;
            unsigned long long counted = region_usage_pid(0, (int)ours[k]);
            CHECK(found >= 0 && bytes[found] == counted && counted > 0,
                  "v%d: pid %u listed with the region's %llu MiB (listed %llu)", version, ours[k],
                  counted / MIB, found >= 0 ? bytes[found] / MIB : 0);
        }
    }

    unsigned small = 1;
    nvmlProcessInfo_t one[1];
    nvmlReturn_t r = nvmlDeviceGetComputeRunningProcesses_v3(h, &small, one);
    CHECK(r == NVML_ERROR_INSUFFICIENT_SIZE && small == 3,
          "room for 1: NVML_ERROR_INSUFFICIENT_SIZE and 3 needed (%d, %u)", (int)r, small);
    unsigned none = 0;
    r = nvmlDeviceGetComputeRunningProcesses_v3(h, &none, NULL);
    CHECK(r == NVML_ERROR_INSUFFICIENT_SIZE && none == 3, "a size query: 3 (%d, %u)", (int)r, none);

    unsigned gn = MAXP, mn = MAXP;
    nvmlProcessInfo_t g[MAXP];
    CHECK(nvmlDeviceGetGraphicsRunningProcesses_v3(h, &gn, g) == NVML_SUCCESS && gn == 0 &&
              nvmlDeviceGetMPSComputeRunningProcesses_v3(h, &mn, g) == NVML_SUCCESS && mn == 0,
          "graphics and MPS lists: none (%u, %u)", gn, mn);

    /* Utilisation samples: ours, under our pids; the driver has the other container's too. */
    nvmlProcessUtilizationSample_t s[MAXP];
    unsigned sn = MAXP;
    r = nvmlDeviceGetProcessUtilization(h, s, &sn, 0);
    int mine = 0, foreign = 0;
    for (unsigned i = 0; r == NVML_SUCCESS && i < sn; i++) {
        mine += s[i].pid == me;
        foreign += !has(ours, 3, s[i].pid);
    }
    CHECK(r == NVML_SUCCESS && mine == 1 && foreign == 0,
          "utilisation samples: %u, this process's under its pid (%d), none foreign (%d)", sn, mine,
          foreign);
    util_fn real_util = (util_fn)real_sym("libnvidia-ml.so.1", "nvmlDeviceGetProcessUtilization");
    unsigned rsn = MAXP;
    int x_sampled = 0;
    if (real_util && real_util(h, s, &rsn, 0) == NVML_SUCCESS)
        for (unsigned i = 0; i < rsn; i++)
            x_sampled += s[i].pid == (unsigned)(x.pid + offset);
    CHECK(x_sampled == 1, "unhooked, the driver has a sample of the other container's process");

    char name[256] = {0};
    r = nvmlSystemGetProcessName((unsigned)a.pid, name, sizeof name);
    CHECK(r == NVML_SUCCESS && strstr(name, "t_procs") != NULL,
          "nvmlSystemGetProcessName(%d) names it: \"%s\"", (int)a.pid, name);

    /* B dies: it leaves the list at once, whatever its slot says until it is reaped. */
    kill(b.pid, SIGKILL);
    wait_status(b.pid);
    unsigned pids[MAXP];
    unsigned long long bytes[MAXP];
    int n = query(h, 3, nvmlDeviceGetComputeRunningProcesses_v3, pids, bytes);
    CHECK(n == 2 && !has(pids, n, (unsigned)b.pid), "after B's kill: %d listed, B not among them", n);

    close(a.to);
    close(x.to);
    CHECK(wait_status(a.pid) == 0 && wait_status(x.pid) == 0, "workers exit cleanly");
    unlink(other_region);
    return finish();
}
