/* N processes (8..32, the first argument; default 16) hammer one fresh region through the C API:
 * they start at once and initialise the region concurrently (exactly one initialises it, all
 * register), then for a few seconds reserve and release random sizes with hami_reserve /
 * hami_release on device 0 against its limit, and add/rm pairs (which record without admitting)
 * on device 1. Meanwhile the parent samples usage continuously.
 *
 * Checked:
 * - every process registered in its own slot, and the region was initialised once, with the
 *   limit from the environment;
 * - the sum of *admitted* reservations (published by the workers in memory of the test's own,
 *   one atomic counter: added after hami_reserve returns 0, removed before hami_release) never
 *   exceeds the limit, at any sample;
 * - the usage the library reports (hami_device_usage) stays within the limit plus what can be in
 *   flight (a reservation is visible while it is checked and rolled back: N requests at most);
 * - contention happened (reservations were both admitted and refused);
 * - every call returned a defined value; no worker crashed or passed its watchdog;
 * - at the end, with half the workers having exited still holding reservations (such a slot
 *   is left until its process is dead, then reaped by the next view, at most every 100 ms),
 *   usage is exactly 0 on every device, seen by the library, by reading every slot of the
 *   file, and by a freshly exec'd process; only the parent's slot is in use.
 * Every phase has a deadline; the program exits non-zero on any failure. */
#include "region_view.h"

#define LIMIT (64 * MiB)
#define MAX_REQ (6 * MiB)
#define HELD_MAX 12

/* What each worker reports at its end (one atomic pipe write). */
struct result {
    int index;
    int errors;   /* a call returned something undefined */
    long ops;
    long admitted;
    long refused;
    long pairs;
};

/* Memory shared by the test's processes (not the library's). */
struct shared {
    _Atomic uint64_t admitted_total; /* bytes admitted and not yet released, all workers */
    _Atomic int hammer;              /* 1 while workers hammer */
};

static struct shared *sh;

static void worker(int index, int go_fd, int hammer_fd, int ready_fd, int result_fd, double seconds) {
    t_watchdog((unsigned)seconds + 40);
    t_seed((uint64_t)getpid() * 7919u + (uint64_t)index);
    struct result res = {.index = index};
    if (t_read_byte(go_fd, 20000) != 'g')
        t_die("worker %d: no start signal", index);

    ensure_initialized();
    t_write_byte(ready_fd, 'r');
    if (t_read_byte(hammer_fd, 20000) != 'h')
        t_die("worker %d: no hammer signal", index);

    size_t held_size[HELD_MAX];
    int held_kind[HELD_MAX];
    int held = 0;
    pid_t me = getpid();
    double end = t_now_ms() + seconds * 1e3;
    while (t_now_ms() < end) {
        res.ops++;
        uint64_t r = t_rand() % 100;
        if (r < 45 && held < HELD_MAX) {
            size_t size = (size_t)t_rand_range(1, MAX_REQ);
            int kind = (int)(t_rand() % 3);
            int rc = hami_reserve(0, size, kind);
            if (rc == HAMI_OK) {
                atomic_fetch_add(&sh->admitted_total, size);
                held_size[held] = size;
                held_kind[held] = kind;
                held++;
                res.admitted++;
            } else if (rc == HAMI_REFUSED) {
                res.refused++;
            } else {
                res.errors++;
            }
        } else if (r < 85 && held > 0) {
            int i = (int)(t_rand() % (uint64_t)held);
            atomic_fetch_sub(&sh->admitted_total, held_size[i]);
            if (hami_release(0, held_size[i], held_kind[i]) != HAMI_OK)
                res.errors++;
            held--;
            held_size[i] = held_size[held];
            held_kind[i] = held_kind[held];
        } else {
            size_t size = (size_t)t_rand_range(1, MAX_REQ);
            int kind = (int)(t_rand() % 3);
            int a = add_gpu_device_memory_usage(me, 1, size, kind);
            int b = rm_gpu_device_memory_usage(me, 1, size, kind);
            if (a != 0 || b != 0)
                res.errors++;
            res.pairs++;
        }
    }
    /* Odd workers give everything back; even ones exit holding it (the views must reap it). */
    if (index % 2) {
        while (held > 0) {
            held--;
            atomic_fetch_sub(&sh->admitted_total, held_size[held]);
            if (hami_release(0, held_size[held], held_kind[held]) != HAMI_OK)
                res.errors++;
        }
    } else {
        /* Not released through the API: no longer admitted once this process is gone, which
         * the parent only observes after reaping us; take it off the test's counter now. */
        for (int i = 0; i < held; i++)
            atomic_fetch_sub(&sh->admitted_total, held_size[i]);
    }
    if (write(result_fd, &res, sizeof res) != (ssize_t)sizeof res)
        t_die("worker %d: result write", index);
    exit(0);
}

/* `stress --verify`: a fresh process (exec'd, new runtime) reads the usage. */
static int verify_fresh(void) {
    ensure_initialized();
    uint64_t u0 = hami_device_usage(0), u1 = hami_device_usage(1);
    printf("fresh process: usage dev0 %lu dev1 %lu, limit %lu\n", (unsigned long)u0,
           (unsigned long)u1, (unsigned long)get_current_device_memory_limit(0));
    return (u0 == 0 && u1 == 0 && get_current_device_memory_limit(0) == LIMIT) ? 0 : 1;
}

int main(int argc, char **argv) {
    static const char *const env[] = {"CUDA_DEVICE_MEMORY_LIMIT=64m", NULL};
    t_reexec_with_env(argv, "stress.cache", env);
    if (argc > 1 && !strcmp(argv[1], "--verify"))
        return verify_fresh();
    int n = argc > 1 ? atoi(argv[1]) : 16;
    double seconds = argc > 2 ? atof(argv[2]) : 3.0;
    if (n < 8 || n > 32 || seconds <= 0 || seconds > 60) {
        fprintf(stderr, "usage: %s [processes 8..32] [seconds]\n", argv[0]);
        return 2;
    }
    t_watchdog((unsigned)seconds + 90);
    double t0 = t_now_ms();

    sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED)
        t_die("mmap shared");
    /* One pipe per phase: a worker that is fast through one phase must not eat a slower one's
     * byte of the next. */
    int go[2], hammer[2], ready[2], results[2];
    t_pipe(go);
    t_pipe(hammer);
    t_pipe(ready);
    t_pipe(results);
    pid_t pids[32];
    /* Fork before this process touches the library: every worker initialises on its own. */
    for (int i = 0; i < n; i++) {
        pids[i] = fork();
        if (pids[i] < 0)
            t_die("fork");
        if (pids[i] == 0) {
            close(go[1]);
            close(hammer[1]);
            close(ready[0]);
            close(results[0]);
            worker(i, go[0], hammer[0], ready[1], results[1], seconds);
        }
    }
    close(go[0]);
    close(hammer[0]);
    close(ready[1]);
    close(results[1]);

    /* Phase 1: concurrent initialisation and registration. */
    double t_init = t_now_ms();
    for (int i = 0; i < n; i++)
        t_write_byte(go[1], 'g');
    ensure_initialized(); /* the parent races them too */
    int got = 0;
    while (got < n && t_read_byte(ready[0], 20000) == 'r')
        got++;
    double init_ms = t_now_ms() - t_init;
    const shared_region_t *reg = rv_map();
    int registered = 0, distinct = 1;
    for (int i = 0; i < n; i++) {
        int s = rv_slot_of(pids[i]);
        registered += s >= 0 && atomic_load(&reg->procs[s].status) == STATUS_RUNNING;
        for (int j = 0; j < i; j++)
            if (s >= 0 && s == rv_slot_of(pids[j]))
                distinct = 0;
    }
    int parent_slot = rv_slot_of(getpid());
    t_check(got == n && registered == n && distinct && parent_slot >= 0 &&
                rv_proc_num() == n + 1 && rv_used_slots() == n + 1,
            "concurrent init and registration",
            "%d/%d ready in %.0f ms, %d registered, distinct %d, proc_num %d, used %d", got, n,
            init_ms, registered, distinct, rv_proc_num(), rv_used_slots());
    t_check(atomic_load(&reg->initialized_flag) == MAGIC && atomic_load(&reg->limit[0]) == LIMIT &&
                atomic_load(&reg->limit[1]) == LIMIT && get_current_device_memory_limit(0) == LIMIT,
            "region initialised once with the limit", "flag %d, limit %lu",
            atomic_load(&reg->initialized_flag), (unsigned long)atomic_load(&reg->limit[0]));

    /* Phase 2: hammer, sampling. */
    for (int i = 0; i < n; i++)
        t_write_byte(hammer[1], 'h');
    double t_hammer = t_now_ms();
    long samples = 0, over_admitted = 0, over_limit = 0, over_bound = 0;
    uint64_t max_usage = 0, max_admitted = 0;
    int alive = n;
    int status[32];
    for (int i = 0; i < n; i++)
        status[i] = -2;
    double deadline = t_hammer + seconds * 1e3 + 30000;
    while (alive > 0 && t_now_ms() < deadline) {
        uint64_t adm = atomic_load(&sh->admitted_total);
        uint64_t u = hami_device_usage(0);
        samples++;
        if (adm > max_admitted)
            max_admitted = adm;
        if (u > max_usage)
            max_usage = u;
        over_admitted += adm > LIMIT;
        over_limit += u > LIMIT;
        over_bound += u > LIMIT + (uint64_t)n * MAX_REQ;
        if (samples % 256 == 0) {
            for (int i = 0; i < n; i++) {
                if (status[i] != -2)
                    continue;
                int st;
                if (waitpid(pids[i], &st, WNOHANG) == pids[i]) {
                    status[i] = st;
                    alive--;
                }
            }
        }
    }
    double hammer_ms = t_now_ms() - t_hammer;
    int clean_exits = 0;
    for (int i = 0; i < n; i++) {
        if (status[i] == -2)
            status[i] = t_wait(pids[i], 1000);
        clean_exits += status[i] != -1 && WIFEXITED(status[i]) && WEXITSTATUS(status[i]) == 0;
    }
    struct result total = {0};
    int reports = 0;
    struct result r;
    while (t_read_exact(results[0], &r, sizeof r, 1000) == 0) {
        reports++;
        total.errors += r.errors;
        total.ops += r.ops;
        total.admitted += r.admitted;
        total.refused += r.refused;
        total.pairs += r.pairs;
    }
    t_check(clean_exits == n && reports == n, "workers finished", "%d/%d exited 0, %d reports, %.0f ms",
            clean_exits, n, reports, hammer_ms);
    t_check(total.errors == 0, "every call returned a defined value", "%d errors in %ld ops",
            total.errors, total.ops);
    t_check(over_admitted == 0 && max_admitted <= LIMIT, "admitted sum never over the limit",
            "%ld samples, max admitted %lu of %lu", samples, (unsigned long)max_admitted,
            (unsigned long)LIMIT);
    t_check(over_bound == 0, "reported usage within limit + in-flight requests",
            "max usage %lu (limit %lu + %d x %lu); %ld of %ld samples above the limit itself",
            (unsigned long)max_usage, (unsigned long)LIMIT, n, (unsigned long)MAX_REQ, over_limit,
            samples);
    t_check(total.admitted > 0 && total.refused > 0 && max_admitted >= LIMIT / 2,
            "contention happened", "%ld admitted, %ld refused, %ld add/rm pairs, max admitted %lu MiB",
            total.admitted, total.refused, total.pairs, (unsigned long)(max_admitted / MiB));

    /* Phase 3: exact accounting at the end, once a view may reap again (every 100 ms). */
    t_sleep_ms(150);
    uint64_t u0 = hami_device_usage(0), u1 = hami_device_usage(1);
    uint64_t slots_sum = rv_total_everything();
    int workers_left = 0;
    for (int i = 0; i < n; i++)
        workers_left += rv_slot_of(pids[i]) >= 0;
    t_check(u0 == 0 && u1 == 0 && get_gpu_memory_usage(0) == 0 && slots_sum == 0,
            "usage exactly 0 at the end", "API dev0 %lu dev1 %lu; sum over all slots %lu",
            (unsigned long)u0, (unsigned long)u1, (unsigned long)slots_sum);
    t_check(workers_left == 0 && rv_used_slots() == 1 && rv_slot_of(getpid()) == parent_slot,
            "only the parent's slot in use", "%d worker slots left, %d used", workers_left,
            rv_used_slots());
    pid_t v = fork();
    if (v == 0) {
        char *args[] = {argv[0], "--verify", NULL};
        execv("/proc/self/exe", args);
        _exit(3);
    }
    int vst = t_wait(v, 10000);
    t_check(vst != -1 && WIFEXITED(vst) && WEXITSTATUS(vst) == 0, "a fresh process sees usage 0",
            "%s", t_status_text(vst));

    double total_ms = t_now_ms() - t0;
    t_check(total_ms < seconds * 1e3 + 30000, "stress wall time", "%.0f ms for %d processes", total_ms, n);
    t_cleanup_dir();
    printf("%s stress (%d processes): %d failure(s)\n", t_failures ? "FAIL" : "PASS", n, t_failures);
    return t_failures ? 1 : 0;
}
