/*
 * t_hostpid: every process finds its host pid (the pid NVML reports; the stand-in driver reports
 * pid + FAKE_NVML_PID_OFFSET) and writes it into its slot's hostpid, without serialising processes
 * that start together:
 *   (a) one process in "another pid namespace" (offset) finds getpid() + offset;
 *   (b) HK_PROCS (default 16) processes released together by a pipe barrier, half with
 *       cuCtxCreate and half with cuDevicePrimaryCtxRetain, all find their own, distinct. Worker i's
 *       context creation takes 60 + 8 (n - 1 - i) ms (FAKE_CTX_CREATE_MS): they overlap and end in
 *       an order unrelated to NVML's list, so a process that took the first new pid would be
 *       wrong. Three rounds;
 *   (c) NVML reporting our own pids (offset 0) several processes take the cheap path (own pid):
 *       in the initial pid namespace that is the host pid and goes into hostpid; in another one
 *       the driver translates pids, so hostpid stays 0 for HAMi's monitor (one info line each);
 *   (d) with NVML failing (FAKE_NVML_FAIL=init / procs) one clear line, hostpid 0, and the
 *       process carries on (allocations work, exit 0);
 *   (e) a forked child finds its own host pid, not its parent's.
 * The wall time of (b)'s start with and without LD_PRELOAD is printed for information only.
 * Workers report "pid hostpid ctx_seconds alloc_ok" on a pipe; their stderr goes to a file.
 */
#include "common.h"

#define OFFSET 10000000 /* above any pid_max: host pids never collide with real pids */
#define MAXW 64

static int own_hostpid(void)
{
    shared_region_t *r = region();
    int n = r->proc_num;
    if (n > ABI_SLOTS)
        n = ABI_SLOTS;
    for (int i = 0; i < n; i++)
        if (r->procs[i].pid == getpid())
            return r->procs[i].hostpid;
    return -1;
}

static void wait_eof(int fd)
{
    char c;
    while (fd >= 0 && (read(fd, &c, 1) > 0 || errno == EINTR))
        ;
}

/* Creates a context (cuCtxCreate, or the primary context when `primary`), allocates through it. */
static int open_ctx(int primary, CUcontext *ctx, double *secs)
{
    CUdevice dev;
    CU(cuDeviceGet(&dev, 0));
    double t0 = now_s();
    if (primary) {
        CU(cuDevicePrimaryCtxRetain(ctx, dev));
        CU(cuCtxSetCurrent(*ctx));
    } else {
        CU(cuCtxCreate_v2(ctx, 0, dev));
    }
    *secs = now_s() - t0;
    CUdeviceptr p;
    int ok = cuMemAlloc_v2(&p, 8 * MIB) == CUDA_SUCCESS && cuMemFree_v2(p) == CUDA_SUCCESS;
    return ok;
}

static void close_ctx(int primary, CUcontext ctx)
{
    if (primary) {
        CUdevice dev;
        CU(cuCtxGetDevice(&dev));
        CU(cuDevicePrimaryCtxRelease_v2(dev));
    } else {
        CU(cuCtxDestroy_v2(ctx));
    }
}

/* worker REPORT_FD BARRIER_FD HOLD_FD PRIMARY PRELOADED FORK */
static int worker(char **argv)
{
    int report = atoi(argv[2]), barrier = atoi(argv[3]), hold = atoi(argv[4]);
    int primary = atoi(argv[5]), preloaded = atoi(argv[6]), do_fork = atoi(argv[7]);
    g_test = "hostpid-worker";
    CU(cuInit(0));
    wait_eof(barrier);
    CUcontext ctx;
    double secs;
    int ok = open_ctx(primary, &ctx, &secs);
    dprintf(report, "%d %d %.6f %d\n", (int)getpid(), preloaded ? own_hostpid() : 0, secs, ok);
    if (do_fork) {
        pid_t c = fork();
        if (c == 0) {
            CU(cuInit(0));
            CUcontext cctx;
            int cok = open_ctx(0, &cctx, &secs);
            dprintf(report, "%d %d %.6f %d\n", (int)getpid(), own_hostpid(), secs, cok);
            close_ctx(0, cctx);
            _exit(0);
        }
        if (wait_status(c) != 0)
            return 1;
    }
    wait_eof(hold);
    close_ctx(primary, ctx);
    return 0;
}

struct report {
    int pid, hostpid, ok;
    double secs;
};

struct run {
    int n;                  /* workers */
    struct report r[MAXW + 1];
    int reports;
    double wall;            /* barrier release to the last report */
    int failed_lines;       /* "SET_TASK_PID FAILED" lines in the workers' stderr */
    char first_line[1024];  /* the first of them */
    int how_own, how_lone, how_probe; /* debug lines: how host pids were found */
    int how_ns;                       /* info lines: a namespace pid, hostpid left 0 */
    int statuses_ok;
};

static char g_self[4096];

/* Starts `n` workers with extra environment `env` (NULL-terminated), releases them together and
 * collects `n * (1 + do_fork)` reports. `stagger`: worker i's context creation takes
 * 60 + 8 (n - 1 - i) ms. */
static void run_workers(struct run *out, int n, char *const env[], int preloaded, int do_fork,
                        int stagger)
{
    memset(out, 0, sizeof *out);
    out->n = n;
    int rep[2], bar[2], hold[2];
    if (pipe(rep) || pipe(bar) || pipe(hold)) {
        printf("FAIL [hostpid] pipe: %s\n", strerror(errno));
        exit(1);
    }
    char errpath[] = "/tmp/hk-hostpid-err.XXXXXX";
    int errfd = mkstemp(errpath);
    if (errfd < 0)
        exit(1);
    char a_rep[16], a_bar[16], a_hold[16], a_pre[4], a_fork[4];
    snprintf(a_rep, sizeof a_rep, "%d", rep[1]);
    snprintf(a_bar, sizeof a_bar, "%d", bar[0]);
    snprintf(a_hold, sizeof a_hold, "%d", hold[0]);
    snprintf(a_pre, sizeof a_pre, "%d", preloaded);
    snprintf(a_fork, sizeof a_fork, "%d", do_fork);
    pid_t pids[MAXW];
    for (int i = 0; i < n && i < MAXW; i++) {
        char *av[] = {g_self, "worker", a_rep, a_bar, a_hold, i % 2 ? "1" : "0", a_pre, a_fork, NULL};
        pids[i] = fork();
        if (pids[i] == 0) {
            close(rep[0]);
            close(bar[1]);
            close(hold[1]);
            dup2(errfd, 2);
            for (int k = 0; env && env[k]; k++)
                putenv(env[k]);
            static char ms[64];
            snprintf(ms, sizeof ms, "FAKE_CTX_CREATE_MS=%d", 60 + 8 * (n - 1 - i));
            if (stagger)
                putenv(ms);
            execv(av[0], av);
            _exit(127);
        }
    }
    close(rep[1]);
    close(bar[0]);
    close(hold[0]);
    usleep(300 * 1000); /* let every worker reach the barrier (past cuInit) */
    double t0 = now_s();
    close(bar[1]);
    int want = n * (1 + do_fork);
    FILE *f = fdopen(rep[0], "r");
    while (out->reports < want && out->reports <= MAXW) {
        struct report x;
        if (fscanf(f, "%d %d %lf %d", &x.pid, &x.hostpid, &x.secs, &x.ok) != 4)
            break;
        out->r[out->reports++] = x;
    }
    out->wall = now_s() - t0;
    close(hold[1]);
    for (int i = 0; i < n; i++)
        out->statuses_ok += wait_status(pids[i]) == 0;
    fclose(f);

    FILE *e = fopen(errpath, "r");
    char line[1024];
    while (e && fgets(line, sizeof line, e)) {
        line[strcspn(line, "\n")] = 0;
        if (strstr(line, "SET_TASK_PID FAILED")) {
            if (!out->failed_lines++)
                snprintf(out->first_line, sizeof out->first_line, "%s", line);
        }
        out->how_own += strstr(line, "(by own pid)") != NULL;
        out->how_ns += strstr(line, "its pid in the container's namespace") != NULL;
        out->how_lone += strstr(line, "(by lone candidate)") != NULL;
        out->how_probe += strstr(line, "(by probe)") != NULL;
    }
    if (e)
        fclose(e);
    close(errfd);
    unlink(errpath);
}

/* Every report has hostpid == pid + offset, all distinct, and every worker allocated. */
static int all_correct(const struct run *r, int offset, int *distinct)
{
    int good = 0;
    *distinct = 1;
    for (int i = 0; i < r->reports; i++) {
        good += r->r[i].hostpid == r->r[i].pid + offset && r->r[i].ok;
        if (r->r[i].hostpid != r->r[i].pid + offset)
            INFO("pid %d: hostpid %d, want %d", r->r[i].pid, r->r[i].hostpid, r->r[i].pid + offset);
        for (int j = 0; j < i; j++)
            if (r->r[j].hostpid == r->r[i].hostpid)
                *distinct = 0;
    }
    return good;
}

static double max_secs(const struct run *r)
{
    double m = 0;
    for (int i = 0; i < r->reports; i++)
        if (r->r[i].secs > m)
            m = r->r[i].secs;
    return m;
}

int main(int argc, char **argv)
{
    if (argc >= 8 && strcmp(argv[1], "worker") == 0)
        return worker(argv);
    g_test = "hostpid";
    ssize_t len = readlink("/proc/self/exe", g_self, sizeof g_self - 1);
    if (len <= 0)
        return 1;
    g_self[len] = 0;
    int procs = (int)env_ull("HK_PROCS", 16);
    if (procs > MAXW)
        procs = MAXW;
    struct run r;
    int distinct, good;

    char *pidns[] = {"FAKE_NVML_PID_OFFSET=10000000", "LIBCUDA_LOG_LEVEL=4", NULL};
    run_workers(&r, 1, pidns, 1, 0, 0);
    good = all_correct(&r, OFFSET, &distinct);
    CHECK(r.reports == 1 && good == 1 && r.statuses_ok == 1,
          "(a) one process with pid offset %d finds hostpid == getpid() + offset (%d of %d)",
          OFFSET, good, r.reports);
    CHECK(r.failed_lines == 0, "(a) no failure message (%d)", r.failed_lines);
    INFO("(a) found by: own pid %d, lone candidate %d, probe %d", r.how_own, r.how_lone, r.how_probe);

    for (int round = 1; round <= 3; round++) {
        run_workers(&r, procs, pidns, 1, 0, 1);
        good = all_correct(&r, OFFSET, &distinct);
        CHECK(r.reports == procs && good == procs && r.statuses_ok == procs,
              "(b) round %d: %d processes started together all find hostpid == pid + offset (%d "
              "correct, %d reports, %d clean exits)", round, procs, good, r.reports, r.statuses_ok);
        CHECK(distinct, "(b) round %d: the %d host pids are distinct", round, r.reports);
        CHECK(r.failed_lines == 0, "(b) round %d: no failure message (%d)%s%s", round,
              r.failed_lines, r.failed_lines ? ": " : "", r.first_line);
        INFO("(b) round %d: found by own pid %d, lone candidate %d, probe %d", round, r.how_own,
             r.how_lone, r.how_probe);
    }
    double with = r.wall, with_ctx = max_secs(&r);
    char *plain[] = {"FAKE_NVML_PID_OFFSET=10000000", "LD_PRELOAD=", NULL};
    run_workers(&r, procs, plain, 0, 0, 1);
    INFO("(b) %d-process start, barrier to last context: %.1f ms with LD_PRELOAD (slowest "
         "context %.1f ms), %.1f ms without (slowest %.1f ms); information, not a check",
         procs, with * 1e3, with_ctx * 1e3, r.wall * 1e3, max_secs(&r) * 1e3);

    char *samens[] = {"FAKE_NVML_PID_OFFSET=0", "LIBCUDA_LOG_LEVEL=4", NULL};
    run_workers(&r, 4, samens, 1, 0, 1);
    char ns[64] = "";
    ssize_t nl = readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
    int initial = nl < 0 || strcmp(ns, "pid:[4026531836]") == 0;
    if (initial) {
        good = all_correct(&r, 0, &distinct);
        CHECK(r.reports == 4 && good == 4 && distinct, "(c) offset 0, initial pid namespace: 4 "
              "processes find hostpid == their own pid (%d of %d)", good, r.reports);
        CHECK(r.how_own == 4 && r.how_probe == 0, "(c) all took the cheap path (own pid %d, probe %d)",
              r.how_own, r.how_probe);
    } else {
        int zero = 0;
        for (int i = 0; i < r.reports; i++)
            zero += r.r[i].hostpid == 0 && r.r[i].ok;
        CHECK(r.reports == 4 && zero == 4 && r.statuses_ok == 4, "(c) offset 0 in pid namespace %s: "
              "hostpid stays 0 in all 4 and they carry on (%d of %d)", ns, zero, r.reports);
        CHECK(r.how_ns == 4 && r.how_probe == 0 && r.failed_lines == 0, "(c) each says why in one "
              "info line, no probe, no failure (%d, probe %d, failures %d)", r.how_ns, r.how_probe,
              r.failed_lines);
    }

    const char *modes[] = {"init", "procs"};
    for (int m = 0; m < 2; m++) {
        char failenv[64];
        snprintf(failenv, sizeof failenv, "FAKE_NVML_FAIL=%s", modes[m]);
        char *broken[] = {"FAKE_NVML_PID_OFFSET=10000000", failenv, NULL};
        run_workers(&r, 1, broken, 1, 0, 0);
        int carried_on = r.reports == 1 && r.r[0].ok && r.statuses_ok == 1;
        CHECK(carried_on && r.r[0].hostpid == 0, "(d) %s: hostpid stays 0 and the process carries "
              "on (hostpid %d, alloc ok %d, clean exit %d)", failenv, r.reports ? r.r[0].hostpid : -1,
              r.reports ? r.r[0].ok : 0, r.statuses_ok);
        CHECK(r.failed_lines == 1 && strstr(r.first_line, "NVML") && strstr(r.first_line, "Fix:"),
              "(d) %s: exactly one line names the problem and the fix (%d)", failenv, r.failed_lines);
        INFO("(d) stderr: %s", r.first_line);
        INFO("(d) %s: the context creation took %.1f ms (information)", failenv,
             r.reports ? r.r[0].secs * 1e3 : 0);
    }

    run_workers(&r, 1, pidns, 1, 1, 0);
    good = all_correct(&r, OFFSET, &distinct);
    CHECK(r.reports == 2 && good == 2 && distinct && r.statuses_ok == 1,
          "(e) a forked child finds its own host pid, not its parent's (%d of %d correct)", good,
          r.reports);
    return finish();
}
