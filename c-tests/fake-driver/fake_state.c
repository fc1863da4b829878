/*
 * fake_state.c: configuration and the shared state file (see fake_state.h).
 *
 * The file is the stand-in for the GPU's own memory and engine: several
 * processes map it MAP_SHARED and update it with C11 atomics only, so no
 * process can leave a lock held behind it. Entries of processes that died
 * without cleaning up are pruned by whoever maps the file next.
 */
#define _GNU_SOURCE
#include "fake_state.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---------------- configuration ---------------- */

/* Parse a decimal number with an optional K/M/G (binary) suffix. */
static int parse_num(const char *s, int allow_suffix, unsigned long long *out)
{
    char *end;
    errno = 0;
    if (*s == '-' || *s == '\0')
        return -1;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s)
        return -1;
    unsigned long long mul = 1;
    if (allow_suffix && *end) {
        switch (*end) {
        case 'k': case 'K': mul = 1ULL << 10; break;
        case 'm': case 'M': mul = 1ULL << 20; break;
        case 'g': case 'G': mul = 1ULL << 30; break;
        default: return -1;
        }
        end++;
    }
    if (*end)
        return -1;
    if (v > ~0ULL / mul)
        return -1;
    *out = v * mul;
    return 0;
}

static unsigned long long env_num(const char *name, unsigned long long def, int allow_suffix,
                                  unsigned long long min, unsigned long long max)
{
    const char *s = getenv(name);
    unsigned long long v;
    if (!s || !*s)
        return def;
    if (parse_num(s, allow_suffix, &v) || v < min || v > max) {
        fprintf(stderr, "fake-driver: ignoring %s=%s (want %llu..%llu%s); using %llu\n", name, s,
                min, max, allow_suffix ? ", optional K/M/G suffix" : "", def);
        return def;
    }
    return v;
}

void fake_config_load(struct fake_config *c)
{
    memset(c, 0, sizeof *c);
    c->ndev = (int)env_num("FAKE_CUDA_DEVICES", 1, 0, 0, FAKE_MAX_DEV);
    unsigned long long mb = env_num("FAKE_GPU_MEM_MB", 16384, 0, 1, 1ULL << 30);
    for (int i = 0; i < FAKE_MAX_DEV; i++) {
        char name[32];
        snprintf(name, sizeof name, "FAKE_GPU_MEM_MB_%d", i);
        c->mem_total[i] = env_num(name, mb, 0, 1, 1ULL << 30) * FAKE_MIB;
    }
    c->granule = env_num("FAKE_GPU_GRANULE", 2 * FAKE_MIB, 1, 1, 1ULL << 40);
    c->ctx_bytes = env_num("FAKE_CTX_BYTES", 300 * FAKE_MIB, 1, 0, 1ULL << 50);
    c->ctx_create_ms = env_num("FAKE_CTX_CREATE_MS", 0, 0, 0, 60000);
    c->ctx_destroy_ms = env_num("FAKE_CTX_DESTROY_MS", 0, 0, 0, 60000);
    c->pool_trim_ms = env_num("FAKE_POOL_TRIM_MS", 0, 0, 0, 60000);
    c->cuda_version = (int)env_num("FAKE_CUDA_VERSION", 12080, 0, 1000, 999999);
    c->ns_per_block = env_num("FAKE_NS_PER_BLOCK", 1000, 0, 0, 1ULL << 32);
    c->graph_blocks = env_num("FAKE_GRAPH_BLOCKS", 1000, 0, 0, 1ULL << 32);

    const char *off = getenv("FAKE_NVML_PID_OFFSET");
    if (off && *off) {
        char *end;
        errno = 0;
        long long v = strtoll(off, &end, 10);
        if (errno || end == off || *end || v < -(1LL << 31) || v > (1LL << 31))
            fprintf(stderr, "fake-driver: ignoring FAKE_NVML_PID_OFFSET=%s; using 0\n", off);
        else
            c->pid_offset = v;
    }

    const char *fail = getenv("FAKE_NVML_FAIL");
    if (fail && *fail) {
        if (strcmp(fail, "init") == 0)
            c->nvml_fail = 1;
        else if (strcmp(fail, "procs") == 0)
            c->nvml_fail = 2;
        else
            fprintf(stderr, "fake-driver: ignoring FAKE_NVML_FAIL=%s (want init or procs)\n", fail);
    }

    const char *path = getenv("FAKE_GPU_STATE");
    if (path && *path && strlen(path) < sizeof c->state_path)
        snprintf(c->state_path, sizeof c->state_path, "%s", path);
    else
        snprintf(c->state_path, sizeof c->state_path, "/tmp/fake-gpu-state-%u",
                 (unsigned)getuid());
}

/* ---------------- the mapping ---------------- */

static pthread_mutex_t g_map_mu = PTHREAD_MUTEX_INITIALIZER;
static struct fake_state *g_map;
static char g_map_path[4096];

void fake_state_atfork_prepare(void) { pthread_mutex_lock(&g_map_mu); }
void fake_state_atfork_parent(void) { pthread_mutex_unlock(&g_map_mu); }
void fake_state_atfork_child(void) { pthread_mutex_unlock(&g_map_mu); }

struct fake_state *fake_state_map(const char *path)
{
    pthread_mutex_lock(&g_map_mu);
    if (g_map && strcmp(path, g_map_path) == 0) {
        struct fake_state *s = g_map;
        pthread_mutex_unlock(&g_map_mu);
        return s;
    }
    if (g_map) {
        munmap(g_map, sizeof *g_map);
        g_map = NULL;
    }

    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
        fprintf(stderr, "fake-driver: cannot open state file %s: %s\n", path, strerror(errno));
        pthread_mutex_unlock(&g_map_mu);
        return NULL;
    }
    /* The flock only serialises creation: two first users must not both
     * initialise, and nobody may map a half-sized file. */
    struct fake_state *s = MAP_FAILED;
    struct stat st;
    if (flock(fd, LOCK_EX) == 0 && fstat(fd, &st) == 0) {
        int fresh = 0;
        if ((uint64_t)st.st_size != sizeof *s) {
            /* Truncating to 0 first zero-fills a file of an older layout. */
            if (ftruncate(fd, 0) == 0 && ftruncate(fd, (off_t)sizeof *s) == 0)
                fresh = 1;
        }
        if (fresh || (uint64_t)st.st_size == sizeof *s)
            s = mmap(NULL, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (s != MAP_FAILED && atomic_load(&s->magic) != FAKE_STATE_MAGIC) {
            memset((void *)s, 0, sizeof *s);
            s->size = sizeof *s;
            atomic_store(&s->magic, FAKE_STATE_MAGIC);
        }
        flock(fd, LOCK_UN);
    }
    if (s == MAP_FAILED)
        fprintf(stderr, "fake-driver: cannot map state file %s: %s\n", path, strerror(errno));
    close(fd);
    if (s == MAP_FAILED) {
        pthread_mutex_unlock(&g_map_mu);
        return NULL;
    }
    g_map = s;
    snprintf(g_map_path, sizeof g_map_path, "%s", path);
    pthread_mutex_unlock(&g_map_mu);

    fake_prune_dead(s);
    return s;
}

void fake_state_unmap(void)
{
    pthread_mutex_lock(&g_map_mu);
    if (g_map)
        munmap(g_map, sizeof *g_map);
    g_map = NULL;
    g_map_path[0] = '\0';
    pthread_mutex_unlock(&g_map_mu);
}

/* ---------------- process entries ---------------- */

void fake_sat_sub(_Atomic uint64_t *a, uint64_t v)
{
    uint64_t cur = atomic_load(a);
    while (!atomic_compare_exchange_weak(a, &cur, cur > v ? cur - v : 0))
        ;
}

/* Return the entry's bytes to the devices and zero it; caller owns the entry
 * (pid is ours or -1), so no one else writes it meanwhile. */
static void proc_wipe(struct fake_state *s, int idx)
{
    struct fake_proc *p = &s->proc[idx];
    for (int d = 0; d < FAKE_MAX_DEV; d++) {
        uint64_t u = atomic_exchange(&p->dev[d].used, 0);
        if (u)
            fake_sat_sub(&s->dev[d].used, u);
        atomic_store(&p->dev[d].busy_ns, 0);
        atomic_store(&p->dev[d].head, 0);
        for (int b = 0; b < FAKE_BUCKETS; b++)
            atomic_store(&p->dev[d].bucket[b], 0);
    }
}

/* Whether `pid` is gone or a zombie: a real driver frees a process's memory as the process
 * exits (its device files close before it turns zombie), not when its parent reaps it. */
static int fake_pid_gone(int32_t pid)
{
    if (kill(pid, 0) != 0 && errno == ESRCH)
        return 1;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    const char *state = strrchr(buf, ')'); /* the command may hold spaces and parentheses */
    return state && (state[2] == 'Z' || state[2] == 'X');
}

void fake_prune_dead(struct fake_state *s)
{
    for (int i = 0; i < FAKE_MAX_PROC; i++) {
        int32_t pid = atomic_load(&s->proc[i].pid);
        if (pid <= 0 || !fake_pid_gone(pid))
            continue;
        /* The CAS makes exactly one pruner wipe it. */
        if (atomic_compare_exchange_strong(&s->proc[i].pid, &pid, -1)) {
            proc_wipe(s, i);
            atomic_store(&s->proc[i].pid, 0);
        }
    }
}

int fake_proc_claim(struct fake_state *s, int pid)
{
    for (int i = 0; i < FAKE_MAX_PROC; i++) {
        int32_t cur = pid;
        /* Our pid but not our entry: a previous image (exec) or pid reuse. */
        if (atomic_compare_exchange_strong(&s->proc[i].pid, &cur, -1)) {
            proc_wipe(s, i);
            atomic_store(&s->proc[i].pid, pid);
            return i;
        }
    }
    for (int i = 0; i < FAKE_MAX_PROC; i++) {
        int32_t cur = 0;
        if (atomic_compare_exchange_strong(&s->proc[i].pid, &cur, pid))
            return i;
    }
    return -1;
}

void fake_proc_release(struct fake_state *s, int idx)
{
    proc_wipe(s, idx);
    atomic_store(&s->proc[idx].pid, 0);
}

void fake_state_zero(struct fake_state *s)
{
    memset((void *)s->dev, 0, sizeof s->dev);
    memset((void *)s->proc, 0, sizeof s->proc);
}

int fake_reserve(struct fake_state *s, int idx, int dev, uint64_t bytes, uint64_t total)
{
    _Atomic uint64_t *u = &s->dev[dev].used;
    uint64_t cur = atomic_load(u);
    do {
        if (bytes > total || cur > total - bytes)
            return -1;
    } while (!atomic_compare_exchange_weak(u, &cur, cur + bytes));
    atomic_fetch_add(&s->proc[idx].dev[dev].used, bytes);
    return 0;
}

void fake_release(struct fake_state *s, int idx, int dev, uint64_t bytes)
{
    fake_sat_sub(&s->proc[idx].dev[dev].used, bytes);
    fake_sat_sub(&s->dev[dev].used, bytes);
}

/* ---------------- time ---------------- */

uint64_t fake_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

uint64_t fake_realtime_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000ULL + (uint64_t)ts.tv_nsec / 1000ULL;
}

void fake_sleep_until(uint64_t mono_ns)
{
    struct timespec ts = {(time_t)(mono_ns / 1000000000ULL), (long)(mono_ns % 1000000000ULL)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
}

/* Add [start, end) to the entry's bucket history. Intervals of one device
 * never overlap and each starts after all earlier ones ended (they queue on
 * busy_until), so buckets only ever advance. */
static void record_busy(struct fake_proc_dev *pd, uint64_t start, uint64_t end)
{
    if (end <= start)
        return;
    uint64_t k0 = start / FAKE_BUCKET_NS, k1 = (end - 1) / FAKE_BUCKET_NS;
    if (k1 - k0 >= FAKE_BUCKETS) /* older buckets would be overwritten anyway */
        k0 = k1 - FAKE_BUCKETS + 1;
    uint64_t head = atomic_load(&pd->head);
    if (k1 > head) {
        uint64_t from = k1 - head >= FAKE_BUCKETS ? k1 - FAKE_BUCKETS + 1 : head + 1;
        for (uint64_t k = from; k <= k1; k++)
            atomic_store(&pd->bucket[k % FAKE_BUCKETS], 0);
        atomic_store(&pd->head, k1);
        head = k1;
    }
    for (uint64_t k = k0; k <= k1; k++) {
        if (k + FAKE_BUCKETS <= head)
            continue;
        uint64_t lo = k * FAKE_BUCKET_NS, hi = lo + FAKE_BUCKET_NS;
        if (lo < start)
            lo = start;
        if (hi > end)
            hi = end;
        atomic_fetch_add(&pd->bucket[k % FAKE_BUCKETS], hi - lo);
    }
}

uint64_t fake_launch(struct fake_state *s, int idx, int dev, uint64_t cost)
{
    struct fake_dev *d = &s->dev[dev];
    uint64_t now = fake_now_ns();
    uint64_t bu = atomic_load(&d->busy_until), start, end;
    do {
        start = bu > now ? bu : now;
        end = start + cost;
    } while (!atomic_compare_exchange_weak(&d->busy_until, &bu, end));
    atomic_fetch_add(&d->busy_ns, cost);
    if (idx >= 0) {
        struct fake_proc_dev *pd = &s->proc[idx].dev[dev];
        atomic_fetch_add(&pd->busy_ns, cost);
        record_busy(pd, start, end);
    }
    return end;
}

uint64_t fake_busy_in_window(const struct fake_proc_dev *pd, uint64_t a, uint64_t b)
{
    if (b <= a)
        return 0;
    uint64_t head = atomic_load(&pd->head), sum = 0;
    for (uint64_t k = a / FAKE_BUCKET_NS; k <= (b - 1) / FAKE_BUCKET_NS; k++) {
        if (k > head || k + FAKE_BUCKETS <= head)
            continue; /* never written, or already recycled */
        uint64_t v = atomic_load(&pd->bucket[k % FAKE_BUCKETS]);
        if (!v)
            continue;
        uint64_t lo = k * FAKE_BUCKET_NS, hi = lo + FAKE_BUCKET_NS;
        if (lo < a)
            lo = a;
        if (hi > b)
            hi = b;
        /* Busy time inside a bucket is taken as spread evenly over it. */
        sum += v * (hi - lo) / FAKE_BUCKET_NS;
    }
    return sum;
}

/* ---------------- identity ---------------- */

void fake_uuid_string(int dev, char *buf, unsigned len)
{
    snprintf(buf, len, "GPU-fa4e0000-0000-0000-0000-%012x", (unsigned)dev);
}

void fake_uuid_bytes(int dev, unsigned char out[16])
{
    memset(out, 0, 16);
    out[0] = 0xfa;
    out[1] = 0x4e;
    out[15] = (unsigned char)dev;
}
