/* Test scaffolding shared by the C API programs: checks that print PASS/FAIL with numbers, a
 * private temporary directory for region files, re-execution so that the environment is set
 * before libvgpu.so is loaded, pipes, timing and watchdogs.
 *
 * Header-only (static functions); includes no API header, so a program picks upstream_api.h or
 * hami_shm.h itself. */
#ifndef HAMI_CAPI_TEST_H
#define HAMI_CAPI_TEST_H

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/select.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MiB (1024UL * 1024UL)

static int t_failures;

/* One checked condition: prints "PASS name (detail)" or "FAIL name (detail)". */
static __attribute__((unused)) void t_check(int ok, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static __attribute__((unused)) void t_check(int ok, const char *name, const char *fmt, ...) {
    char detail[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    printf("%s %s (%s)\n", ok ? "PASS" : "FAIL", name, detail);
    fflush(stdout);
    if (!ok)
        t_failures++;
}

/* A failure that makes going on pointless (in a child: exit status 2). */
static __attribute__((unused)) void t_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static __attribute__((unused)) void t_die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("FAIL fatal (pid %d): ", (int)getpid());
    vprintf(fmt, ap);
    printf(" [errno %d: %s]\n", errno, strerror(errno));
    va_end(ap);
    fflush(stdout);
    _exit(2);
}

static __attribute__((unused)) double t_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static __attribute__((unused)) void t_sleep_ms(double ms) {
    struct timespec ts;
    ts.tv_sec = (time_t)(ms / 1e3);
    ts.tv_nsec = (long)((ms - (double)ts.tv_sec * 1e3) * 1e6);
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* xorshift64*: per-process random numbers without global state surprises. */
static uint64_t t_rng_state = 88172645463325252ULL;
static __attribute__((unused)) void t_seed(uint64_t seed) { t_rng_state = seed ? seed : 88172645463325252ULL; }
static __attribute__((unused)) uint64_t t_rand(void) {
    uint64_t x = t_rng_state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    t_rng_state = x;
    return x * 2685821657736338717ULL;
}
/* Uniform in [lo, hi]. */
static __attribute__((unused)) uint64_t t_rand_range(uint64_t lo, uint64_t hi) { return lo + t_rand() % (hi - lo + 1); }

/* The directory all region files of this run live in (created by t_reexec_with_env). */
static __attribute__((unused)) const char *t_dir(void) {
    const char *d = getenv("HAMI_CAPI_TEST_DIR");
    if (!d)
        t_die("HAMI_CAPI_TEST_DIR unset");
    return d;
}

/* On first entry: makes a private temporary directory, points the region file into it, applies
 * the `defaults` (NAME=VALUE strings, NULL-terminated; existing variables are kept) and execs
 * this program again, so that libvgpu.so starts with that environment however early it reads
 * it. On the second entry it returns. Never lets a test touch /tmp/cudevshr.cache. */
static __attribute__((unused)) void t_reexec_with_env(char **argv, const char *cache_name, const char *const *defaults) {
    if (getenv("HAMI_CAPI_TEST_DIR"))
        return;
    char tmpl[] = "/tmp/hami-capi-XXXXXX";
    if (!mkdtemp(tmpl))
        t_die("mkdtemp");
    setenv("HAMI_CAPI_TEST_DIR", tmpl, 1);
    char path[512];
    snprintf(path, sizeof path, "%s/%s", tmpl, cache_name);
    setenv("CUDA_DEVICE_MEMORY_SHARED_CACHE", path, 1);
    for (const char *const *d = defaults; d && *d; d++) {
        char name[128];
        const char *eq = strchr(*d, '=');
        if (!eq || (size_t)(eq - *d) >= sizeof name)
            continue;
        memcpy(name, *d, (size_t)(eq - *d));
        name[eq - *d] = '\0';
        setenv(name, eq + 1, 0);
    }
    execv("/proc/self/exe", argv);
    t_die("execv /proc/self/exe");
}

/* Removes the run's directory (only one we made). */
static __attribute__((unused)) void t_cleanup_dir(void) {
    const char *d = getenv("HAMI_CAPI_TEST_DIR");
    if (!d || strncmp(d, "/tmp/hami-capi-", 15) != 0 || strchr(d, '\'') || getenv("HAMI_CAPI_KEEP"))
        return;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", d);
}

/* Pipes carrying one byte per event. */
static __attribute__((unused)) void t_pipe(int fds[2]) {
    if (pipe(fds) != 0)
        t_die("pipe");
}

static __attribute__((unused)) void t_write_byte(int fd, char c) {
    while (write(fd, &c, 1) != 1) {
        if (errno != EINTR)
            t_die("write to pipe");
    }
}

/* Reads one byte, waiting at most `timeout_ms`; returns the byte, or -1 on timeout/EOF. */
static __attribute__((unused)) int t_read_byte(int fd, int timeout_ms) {
    double end = t_now_ms() + timeout_ms;
    for (;;) {
        double left = end - t_now_ms();
        if (left <= 0)
            return -1;
        fd_set set;
        FD_ZERO(&set);
        FD_SET(fd, &set);
        struct timeval tv = {.tv_sec = (long)(left / 1e3), .tv_usec = (long)((left - (long)(left / 1e3) * 1e3) * 1e3)};
        int r = select(fd + 1, &set, NULL, NULL, &tv);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        unsigned char c;
        ssize_t n = read(fd, &c, 1);
        if (n == 1)
            return c;
        if (n < 0 && errno == EINTR)
            continue;
        return -1;
    }
}

/* Reads exactly `len` bytes within `timeout_ms`; returns 0 on success. */
static __attribute__((unused)) int t_read_exact(int fd, void *buf, size_t len, int timeout_ms) {
    unsigned char *p = buf;
    for (size_t i = 0; i < len; i++) {
        int c = t_read_byte(fd, timeout_ms);
        if (c < 0)
            return -1;
        p[i] = (unsigned char)c;
    }
    return 0;
}

/* Waits for `pid` at most `timeout_ms`; returns its wait status, or -1 on timeout (then the
 * child is SIGKILLed and reaped, so nothing is left behind). */
static __attribute__((unused)) int t_wait(pid_t pid, int timeout_ms) {
    double end = t_now_ms() + timeout_ms;
    for (;;) {
        int st;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid)
            return st;
        if (r < 0 && errno != EINTR)
            return -1;
        if (t_now_ms() > end) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -1;
        }
        t_sleep_ms(1);
    }
}

/* "exit 0", "signal 9", "timeout" for a status from t_wait. */
static __attribute__((unused)) const char *t_status_text(int st) {
    static char buf[64];
    if (st == -1)
        return "timeout (killed)";
    if (WIFEXITED(st))
        snprintf(buf, sizeof buf, "exit %d", WEXITSTATUS(st));
    else if (WIFSIGNALED(st))
        snprintf(buf, sizeof buf, "signal %d", WTERMSIG(st));
    else
        snprintf(buf, sizeof buf, "status 0x%x", st);
    return buf;
}

/* Maps the region file read-only (the descriptor stays open for the life of the process:
 * closing a descriptor of the file would drop this process's record locks on it). */
static __attribute__((unused)) void *t_map_region(size_t size) {
    const char *path = getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        t_die("open %s", path);
    void *p = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        t_die("mmap %s", path);
    return p;
}

/* The watchdog of a child: dies by SIGALRM if it runs `seconds` longer than planned. */
static __attribute__((unused)) void t_watchdog(unsigned seconds) { alarm(seconds); }

#endif
