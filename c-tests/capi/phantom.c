/* Phantom usage: 32 processes hammer add/rm through the C API for a second; 8 of them are
 * SIGKILLed while they hammer, the other 24 `_exit` (no exit handler runs) still holding 1 MiB.
 * Then a freshly exec'd process reads the usage through get_gpu_memory_usage and
 * hami_device_usage: it must be exactly 0, without anyone having been refused first (the
 * views reap the slots of processes that are gone). Repeated ROUNDS times on fresh regions.
 * (The C original leaves 22 MiB for the fresh process here; before the views reaped, this
 * library left 24-25 MiB.) */
#include "capi_test.h"

#include "hami_shm.h"

#define WORKERS 32
#define KILLED 8
#define ROUNDS 3

static int verify_fresh(void) {
    ensure_initialized();
    uint64_t a = get_gpu_memory_usage(0), b = hami_device_usage(0);
    printf("fresh process: get_gpu_memory_usage %lu, hami_device_usage %lu\n", (unsigned long)a,
           (unsigned long)b);
    return a == 0 && b == 0 ? 0 : 1;
}

static void worker(int index, int ready_fd) {
    ensure_initialized();
    t_seed((uint64_t)getpid() * 2654435761u + (uint64_t)index);
    int pid = getpid();
    t_write_byte(ready_fd, 'r');
    double end = t_now_ms() + 1000;
    while (t_now_ms() < end) {
        size_t n = (size_t)t_rand_range(1, 4) * MiB;
        add_gpu_device_memory_usage(pid, 0, n, 2);
        rm_gpu_device_memory_usage(pid, 0, n, 2);
    }
    add_gpu_device_memory_usage(pid, 0, MiB, 2);
    _exit(0); /* holding 1 MiB; no atexit handler runs */
}

static int round_once(char **argv, int round) {
    int ready[2];
    t_pipe(ready);
    pid_t pids[WORKERS];
    for (int i = 0; i < WORKERS; i++) {
        pids[i] = fork();
        if (pids[i] == 0) {
            close(ready[0]);
            worker(i, ready[1]);
        }
    }
    close(ready[1]);
    for (int i = 0; i < WORKERS; i++)
        if (t_read_byte(ready[0], 20000) < 0)
            t_die("round %d: worker %d did not start", round, i);
    close(ready[0]);
    t_sleep_ms(300);
    for (int i = 0; i < KILLED; i++)
        kill(pids[i], SIGKILL);
    for (int i = 0; i < WORKERS; i++)
        t_wait(pids[i], 20000);
    pid_t v = fork();
    if (v == 0) {
        char *args[] = {argv[0], "--verify", NULL};
        execv("/proc/self/exe", args);
        _exit(3);
    }
    int st = t_wait(v, 20000);
    int ok = st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
    t_check(ok, "a fresh process sees no phantom usage",
            "round %d: %d processes, %d SIGKILLed, %d _exited holding 1 MiB: %s", round, WORKERS,
            KILLED, WORKERS - KILLED, t_status_text(st));
    return ok;
}

int main(int argc, char **argv) {
    static const char *const env[] = {"CUDA_DEVICE_MEMORY_LIMIT=1g", NULL};
    t_reexec_with_env(argv, "phantom.cache", env);
    if (argc > 1 && !strcmp(argv[1], "--verify"))
        return verify_fresh();
    t_watchdog(120);
    for (int round = 1; round <= ROUNDS; round++) {
        unlink(getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE")); /* a fresh region each round */
        round_once(argv, round);
    }
    t_cleanup_dir();
    printf("%s phantom: %d failure(s)\n", t_failures ? "FAIL" : "PASS", t_failures);
    return t_failures ? 1 : 0;
}
