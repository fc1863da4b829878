/*
 * t_smlimit: the SM limit over the stand-in driver, whose kernels keep the device busy for
 * blocks x FAKE_NS_PER_BLOCK and whose NVML reports that busy time as utilisation. Worker
 * processes launch kernels in a loop (4 launches, then cuCtxSynchronize) and report the blocks
 * completed per second after a warm-up; the parent compares runs:
 *
 * - no limit: the reference rate;
 * - GPU_CORE_UTILIZATION_POLICY=force with CUDA_DEVICE_SM_LIMIT=25 and 50: the rate falls to the
 *   limit (a wide band here: this checks the wiring of launches, bucket, controller and NVML on
 *   a busy CI machine; core's controller tests check convergence to 3 points, and
 *   c-tests/gpu/sm_limit.sh the H200);
 * - two processes sharing one region with a limit of 25: together they get 25%, not 50%;
 * - policy `disable`, and the default policy with the region's utilization_switch at 0 (HAMi's
 *   monitor's "one task alone"): no throttling;
 * - the region's recent_kernel at -1 (the monitor's priority gate): launches wait until it is
 *   lifted;
 * - two devices with CUDA_DEVICE_SM_LIMIT_0=25 only: device 0 is throttled, device 1 is not;
 * - CUDA graphs: a worker replaying a graph of the same 4 kernels (one cuGraphLaunch per batch)
 *   falls to the limit of its unlimited rate, and beside a worker launching the kernels one by
 *   one under one 25% limit the two together get 25% (a graph launch costs its kernels' blocks,
 *   counted at instantiation; at one token per graph launch the graph worker ran unthrottled);
 * - work in bursts (0.6 s of batches, then 1.2 s idle, as a server between requests): under a
 *   25% limit its bursts get 25% of its unlimited rate (measuring again after an idle second let
 *   each burst run unthrottled).
 *
 * Independent runs go in parallel, each with its own stand-in GPU and region.
 */
#include "common.h"

#include <pthread.h>

#define BLOCKS 1000u
/* The controller measures the unthrottled rate in the first 1-2 s, and once more 2 s later where
 * the start is in doubt (a program in bursts, or one that idled); the start is not paid back, and
 * the window starts after both. */
#define WARMUP_S 4.5
#define MEASURE_S 3.0

/* Maps the region writable, as HAMi's monitor does, to set its scheduler fields. */
static shared_region_t *region_rw(void)
{
    int fd = open(getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE"), O_RDWR);
    if (fd < 0)
        return NULL;
    void *p = mmap(NULL, sizeof(shared_region_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    return p == MAP_FAILED ? NULL : p;
}

static void *lift_gate(void *arg)
{
    usleep(1000 * 1000);
    atomic_store(&((shared_region_t *)arg)->recent_kernel, 0);
    return NULL;
}

/* The batch as a graph of 4 kernel nodes (the graph workers), else NULL. */
static CUgraphExec g_batch;

static double launch_batch(CUfunction f)
{
    if (g_batch)
        CU(cuGraphLaunch(g_batch, NULL));
    else
        for (int i = 0; i < 4; i++)
            CU(cuLaunchKernel(f, BLOCKS, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
    CU(cuCtxSynchronize());
    return 4.0 * BLOCKS;
}

/* One burst: 0.6 s of batches, then 1.2 s idle. */
static double burst(CUfunction f)
{
    double blocks = 0, t = now_s();
    while (now_s() - t < 0.6)
        blocks += launch_batch(f);
    usleep(1200 * 1000);
    return blocks;
}

static CUgraphExec batch_graph(CUfunction f)
{
    CUgraph g;
    CUgraphNode n;
    CUgraphExec ge;
    CUDA_KERNEL_NODE_PARAMS_v2 p = kernel_node(f, BLOCKS, 1, 1);
    CU(cuGraphCreate(&g, 0));
    for (int i = 0; i < 4; i++)
        CU(cuGraphAddKernelNode_v2(&n, g, NULL, 0, &p));
    CU(cuGraphInstantiateWithFlags(&ge, g, 0));
    CU(cuGraphDestroy(g));
    return ge;
}

/* worker OUT [switch0|gate|dev1|graph]: writes "rate R first_ms M" to OUT. */
static int worker(const char *out, const char *mode)
{
    if (mode && strcmp(mode, "-") == 0)
        mode = NULL;
    g_test = "smlimit-worker";
    CU(cuInit(0));
    CUdevice dev;
    CUcontext ctx;
    CU(cuDeviceGet(&dev, mode && strcmp(mode, "dev1") == 0 ? 1 : 0));
    CU(cuCtxCreate_v2(&ctx, 0, dev));
    CUfunction f = load_spin_kernel();
    if (mode && strcmp(mode, "graph") == 0)
        g_batch = batch_graph(f);
    shared_region_t *r = region_rw();
    pthread_t lifter;
    int gate = mode && strcmp(mode, "gate") == 0;
    if (r && mode && strcmp(mode, "switch0") == 0)
        atomic_store(&r->utilization_switch, 0);
    if (r && gate) {
        atomic_store(&r->recent_kernel, -1);
        pthread_create(&lifter, NULL, lift_gate, r);
    }
    double t0 = now_s();
    launch_batch(f);
    double first_ms = (now_s() - t0) * 1000.0;
    if (gate)
        pthread_join(lifter, NULL);
    double blocks = 0, m0;
    if (mode && strcmp(mode, "bursts") == 0) {
        /* The first measurement takes six busy steps from the second burst on, and the start's
         * second one comes with the first burst held back 2 s later (the 4th or 5th burst), so 5
         * bursts warm up and 3 are counted. */
        for (int i = 0; i < 5; i++)
            burst(f);
        m0 = now_s();
        for (int i = 0; i < 3; i++)
            blocks += burst(f);
    } else {
        while (now_s() - t0 < WARMUP_S)
            launch_batch(f);
        m0 = now_s();
        while (now_s() - m0 < MEASURE_S)
            blocks += launch_batch(f);
    }
    FILE *o = fopen(out, "w");
    if (!o)
        return 1;
    fprintf(o, "rate %.0f first_ms %.0f\n", blocks / (now_s() - m0), first_ms);
    fclose(o);
    return 0;
}

struct run {
    const char *name;
    const char *env[4];
    const char *mode; /* "mixed": process 0 launches kernels, process 1 a graph */
    int procs;
    double rate;     /* blocks per second, summed over the run's processes */
    double first_ms; /* the first batch's latency (the gate run) */
    pid_t pid[2];
};

static char g_tmp[64];

static void start(struct run *r, const char *self)
{
    static char bufs[64][160];
    static int nb;
    for (int i = 0; i < r->procs; i++) {
        char *state = bufs[nb++], *cache = bufs[nb++], *out = bufs[nb++];
        snprintf(state, 160, "FAKE_GPU_STATE=%s/%s.state", g_tmp, r->name);
        snprintf(cache, 160, "CUDA_DEVICE_MEMORY_SHARED_CACHE=%s/%s.region", g_tmp, r->name);
        snprintf(out, 160, "%s/%s.%d.out", g_tmp, r->name, i);
        char *env[8] = {state, cache};
        int n = 2;
        for (int k = 0; r->env[k]; k++)
            env[n++] = (char *)r->env[k];
        env[n] = NULL;
        const char *mode = !r->mode ? "-" : strcmp(r->mode, "mixed") ? r->mode : i ? "graph" : "-";
        char *argv[] = {(char *)self, "worker", out, (char *)mode, NULL};
        r->pid[i] = spawn(argv, env);
    }
}

static void collect(struct run *r)
{
    r->rate = 0;
    for (int i = 0; i < r->procs; i++) {
        int st = wait_status(r->pid[i]);
        char path[300];
        snprintf(path, sizeof path, "%s/%s.%d.out", g_tmp, r->name, i);
        FILE *f = fopen(path, "r");
        double rate = -1, first = -1;
        if (!f || fscanf(f, "rate %lf first_ms %lf", &rate, &first) != 2 || st != 0) {
            CHECK(0, "%s: worker %d reported nothing (status %d)", r->name, i, st);
            r->rate = -1;
        } else {
            r->rate += rate;
            r->first_ms = first;
            if (r->procs > 1)
                INFO("%-10s worker %d: %.0f blocks/s", r->name, i, rate);
        }
        if (f)
            fclose(f);
    }
    INFO("%-10s %d process(es): %.0f blocks/s", r->name, r->procs, r->rate);
}

int main(int argc, char **argv)
{
    if (argc >= 4 && strcmp(argv[1], "worker") == 0)
        return worker(argv[2], argv[3]);
    g_test = "smlimit";
    snprintf(g_tmp, sizeof g_tmp, "/tmp/t_smlimit.%d", getpid());
    mkdir(g_tmp, 0700);
    /* Unset in the parent's environment so that only the runs that name them have them. */
    unsetenv("CUDA_DEVICE_SM_LIMIT");
    unsetenv("GPU_CORE_UTILIZATION_POLICY");
    struct run phase1[] = {
        {.name = "none", .procs = 1},
        {.name = "force25", .env = {"GPU_CORE_UTILIZATION_POLICY=force", "CUDA_DEVICE_SM_LIMIT=25"}, .procs = 1},
        {.name = "force50", .env = {"GPU_CORE_UTILIZATION_POLICY=force", "CUDA_DEVICE_SM_LIMIT=50"}, .procs = 1},
        {.name = "disable", .env = {"GPU_CORE_UTILIZATION_POLICY=disable", "CUDA_DEVICE_SM_LIMIT=25"}, .procs = 1},
        {.name = "switch0", .env = {"CUDA_DEVICE_SM_LIMIT=25"}, .mode = "switch0", .procs = 1},
        {.name = "dev0of2", .env = {"FAKE_CUDA_DEVICES=2", "GPU_CORE_UTILIZATION_POLICY=force", "CUDA_DEVICE_SM_LIMIT_0=25"}, .procs = 1},
        {.name = "dev1of2", .env = {"FAKE_CUDA_DEVICES=2", "GPU_CORE_UTILIZATION_POLICY=force", "CUDA_DEVICE_SM_LIMIT_0=25"}, .mode = "dev1", .procs = 1},
        {.name = "graph", .mode = "graph", .procs = 1},
        {.name = "graph25", .env = {"GPU_CORE_UTILIZATION_POLICY=force", "CUDA_DEVICE_SM_LIMIT=25"}, .mode = "graph", .procs = 1},
        {.name = "bursts", .mode = "bursts", .procs = 1},
        {.name = "bursts25", .env = {"GPU_CORE_UTILIZATION_POLICY=force", "CUDA_DEVICE_SM_LIMIT=25"}, .mode = "bursts", .procs = 1},
    };
    struct run phase2[] = {
        {.name = "shared25", .env = {"GPU_CORE_UTILIZATION_POLICY=force", "CUDA_DEVICE_SM_LIMIT=25"}, .procs = 2},
        {.name = "gate", .env = {"CUDA_DEVICE_SM_LIMIT=50"}, .mode = "gate", .procs = 1},
        {.name = "mixed25", .env = {"GPU_CORE_UTILIZATION_POLICY=force", "CUDA_DEVICE_SM_LIMIT=25"}, .mode = "mixed", .procs = 2},
    };
    int n1 = sizeof phase1 / sizeof phase1[0], n2 = sizeof phase2 / sizeof phase2[0];
    for (int i = 0; i < n1; i++)
        start(&phase1[i], argv[0]);
    for (int i = 0; i < n1; i++)
        collect(&phase1[i]);
    for (int i = 0; i < n2; i++)
        start(&phase2[i], argv[0]);
    for (int i = 0; i < n2; i++)
        collect(&phase2[i]);

    double base = phase1[0].rate;
    CHECK(base > 0, "the unlimited run keeps the stand-in GPU busy (%.0f blocks/s)", base);
    if (base <= 0)
        return finish();
#define SHARE(r) (100.0 * (r).rate / base)
    CHECK(SHARE(phase1[1]) >= 15 && SHARE(phase1[1]) <= 35,
          "a 25%% limit (force) gives %.1f%% of the unlimited rate (want 15..35)", SHARE(phase1[1]));
    CHECK(SHARE(phase1[2]) >= 38 && SHARE(phase1[2]) <= 62,
          "a 50%% limit (force) gives %.1f%% (want 38..62)", SHARE(phase1[2]));
    CHECK(SHARE(phase2[0]) >= 15 && SHARE(phase2[0]) <= 35,
          "two processes under one 25%% limit together get %.1f%% (want 15..35: one bucket, not two)",
          SHARE(phase2[0]));
    CHECK(SHARE(phase1[3]) >= 85, "GPU_CORE_UTILIZATION_POLICY=disable: %.1f%%, not throttled",
          SHARE(phase1[3]));
    CHECK(SHARE(phase1[4]) >= 85,
          "default policy with the region's utilization_switch at 0: %.1f%%, not throttled",
          SHARE(phase1[4]));
    CHECK(SHARE(phase1[5]) >= 15 && SHARE(phase1[5]) <= 35,
          "two devices, CUDA_DEVICE_SM_LIMIT_0=25: device 0 gets %.1f%% (want 15..35)", SHARE(phase1[5]));
    CHECK(SHARE(phase1[6]) >= 85, "two devices, CUDA_DEVICE_SM_LIMIT_0=25: device 1 gets %.1f%%, not throttled",
          SHARE(phase1[6]));
    double graph_base = phase1[7].rate;
    CHECK(graph_base > 0.5 * base, "the unlimited graph worker keeps the stand-in GPU as busy "
          "(%.0f blocks/s)", graph_base);
    CHECK(graph_base > 0 && 100.0 * phase1[8].rate / graph_base >= 15 &&
              100.0 * phase1[8].rate / graph_base <= 35,
          "a 25%% limit (force) gives a graph-replaying worker %.1f%% of its unlimited rate "
          "(want 15..35)", graph_base > 0 ? 100.0 * phase1[8].rate / graph_base : -1.0);
    double bursts_base = phase1[9].rate;
    CHECK(bursts_base > 0 && 100.0 * phase1[10].rate / bursts_base >= 15 &&
              100.0 * phase1[10].rate / bursts_base <= 35,
          "a 25%% limit (force) gives work in bursts (0.6 s on, 1.2 s off) %.1f%% of its "
          "unlimited rate (want 15..35)", bursts_base > 0 ? 100.0 * phase1[10].rate / bursts_base : -1.0);
    CHECK(SHARE(phase2[2]) >= 15 && SHARE(phase2[2]) <= 35,
          "a kernel worker and a graph worker under one 25%% limit together get %.1f%% (want "
          "15..35: a graph launch costs its blocks)", SHARE(phase2[2]));
    CHECK(phase2[1].first_ms >= 800,
          "recent_kernel at -1 holds launches until the monitor lifts it (first batch after %.0f ms, "
          "lifted at 1000)", phase2[1].first_ms);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_tmp);
    if (system(cmd) != 0)
        INFO("could not remove %s", g_tmp);
    return finish();
}
