/*
 * common.h: helpers shared by the hook tests (the t_*.c files beside it). The tests are built against
 * fake_cuda.h / fake_nvml.h (same names, values and layouts as NVIDIA's headers), so the same
 * sources run over the stand-in driver in CI and over the real driver in c-tests/gpu/run.sh.
 *
 * - CHECK(cond, fmt, ...) prints one "PASS"/"FAIL" line per check; finish() prints the tally and
 *   returns the exit status (non-zero if any check failed).
 * - region_*(): read the shared region (CUDA_DEVICE_MEMORY_SHARED_CACHE) through hami_shm.h.
 * - real_used(dev): the GPU memory really in use on NVML device `dev`: the fake driver's
 *   fakeGpuRealUsed() when present, else the sum of NVML's per-process usage (on a GPU the tests
 *   have to themselves, that is everything).
 * - real_sym(lib, name): the library's own definition of `name`, found in its ELF symbol table,
 *   bypassing dlsym (and so our hooks): for calling the real driver behind libvgpu's back.
 * - lib_dlsym(lib, name): what glibc's own dlsym answers for `name` in `lib`'s handle, bypassing
 *   libvgpu's dlsym hook: the address libvgpu's hooks forward to (ffi/src/hooks/real.rs).
 */
#ifndef HOOKS_COMMON_H
#define HOOKS_COMMON_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fake_cuda.h"
#include "fake_nvml.h"
#include "hami_shm.h"

#define MIB (1024ULL * 1024ULL)
#define GIB (1024ULL * MIB)

static int g_pass, g_fail;
static const char *g_test = "test";

#define CHECK(cond, ...)                                                                      \
    do {                                                                                      \
        int ok_ = !!(cond);                                                                   \
        if (ok_)                                                                              \
            g_pass++;                                                                         \
        else                                                                                  \
            g_fail++;                                                                         \
        printf("%s [%s] ", ok_ ? "PASS" : "FAIL", g_test);                                    \
        printf(__VA_ARGS__);                                                                  \
        printf("\n");                                                                         \
        fflush(stdout);                                                                       \
    } while (0)

#define INFO(...)                                                                             \
    do {                                                                                      \
        printf("     [%s] ", g_test);                                                         \
        printf(__VA_ARGS__);                                                                  \
        printf("\n");                                                                         \
        fflush(stdout);                                                                       \
    } while (0)

/* A CUDA call that must succeed for the test to go on. */
#define CU(call)                                                                              \
    do {                                                                                      \
        CUresult r_ = (call);                                                                 \
        if (r_ != CUDA_SUCCESS) {                                                             \
            printf("FAIL [%s] %s returned %d (%s:%d)\n", g_test, #call, (int)r_, __FILE__,     \
                   __LINE__);                                                                 \
            fflush(stdout);                                                                   \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

static __attribute__((unused)) int finish(void)
{
    printf("%s: %d passed, %d failed\n", g_test, g_pass, g_fail);
    fflush(stdout);
    return g_fail ? 1 : 0;
}

static __attribute__((unused)) unsigned long long env_ull(const char *name, unsigned long long def)
{
    const char *s = getenv(name);
    if (!s || !*s)
        return def;
    char *end;
    unsigned long long v = strtoull(s, &end, 0);
    switch (*end) {
    case 'g': case 'G': v <<= 30; break;
    case 'm': case 'M': v <<= 20; break;
    case 'k': case 'K': v <<= 10; break;
    default: break;
    }
    return v;
}

static __attribute__((unused)) double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* A kernel that does nothing: over the stand-in driver a launch keeps the GPU busy for its block
 * count (FAKE_NS_PER_BLOCK each) whatever the code. */
static __attribute__((unused)) CUfunction load_spin_kernel(void)
{
    static const char ptx[] = ".version 7.0\n.target sm_50\n.address_size 64\n"
                              ".visible .entry spin()\n{\n ret;\n}\n";
    CUmodule mod;
    CUfunction f;
    CU(cuModuleLoadData(&mod, ptx));
    CU(cuModuleGetFunction(&f, mod, "spin"));
    return f;
}

/* ---------------- the shared region ---------------- */

static shared_region_t *g_region;

static __attribute__((unused)) shared_region_t *region(void)
{
    if (g_region)
        return g_region;
    const char *path = getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE");
    if (!path || !*path)
        path = "/tmp/cudevshr.cache";
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        printf("FAIL [%s] cannot open the region %s: %s\n", g_test, path, strerror(errno));
        exit(1);
    }
    /* A peer creates the file and then extends it: mapping it while it is still short would
     * fault (SIGBUS) on the first read, so wait (up to 5 s) for its full size. */
    struct stat st;
    for (int i = 0; fstat(fd, &st) == 0 && (size_t)st.st_size < sizeof(shared_region_t); i++) {
        if (i == 5000) {
            printf("FAIL [%s] the region %s stays %lld bytes, short of %zu\n", g_test, path,
                   (long long)st.st_size, sizeof(shared_region_t));
            exit(1);
        }
        usleep(1000);
    }
    void *p = mmap(NULL, sizeof(shared_region_t), PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        printf("FAIL [%s] cannot map the region %s: %s\n", g_test, path, strerror(errno));
        exit(1);
    }
    g_region = p;
    return g_region;
}

/* Usage of region device `dev` by all live slots; `kind`: -1 total, 0 context, 1 module, 2 data. */
static __attribute__((unused)) unsigned long long region_usage_kind(int dev, int kind)
{
    shared_region_t *r = region();
    int n = r->proc_num;
    if (n < 0)
        n = 0;
    if (n > ABI_SLOTS)
        n = ABI_SLOTS;
    unsigned long long sum = 0;
    for (int i = 0; i < n; i++) {
        if (r->procs[i].pid == 0)
            continue;
        const device_memory_t *m = &r->procs[i].used[dev];
        sum += kind == -1 ? m->total : kind == 0 ? m->context_size : kind == 1 ? m->module_size
                                                                             : m->data_size;
    }
    return sum;
}

static __attribute__((unused)) unsigned long long region_usage(int dev) { return region_usage_kind(dev, -1); }

/* Usage of region device `dev` by the slot of process `pid`. */
static __attribute__((unused)) unsigned long long region_usage_pid(int dev, int pid)
{
    shared_region_t *r = region();
    int n = r->proc_num;
    if (n > ABI_SLOTS)
        n = ABI_SLOTS;
    for (int i = 0; i < n; i++)
        if (r->procs[i].pid == pid)
            return r->procs[i].used[dev].total;
    return 0;
}

/* Live slots in the region. */
static __attribute__((unused)) int region_live_slots(void)
{
    shared_region_t *r = region();
    int n = r->proc_num, live = 0;
    if (n > ABI_SLOTS)
        n = ABI_SLOTS;
    for (int i = 0; i < n; i++)
        live += r->procs[i].pid != 0;
    return live;
}

/* ---------------- the real driver, behind the hooks ---------------- */

/* `name` as defined in the already loaded library `lib` (its .dynsym), or NULL. */
typedef void *(*dlsym_fn)(void *, const char *);

static __attribute__((unused)) void *lib_dlsym(const char *lib, const char *name)
{
    static dlsym_fn glibc_dlsym;
    /* dlvsym is not hooked; dlsym is in libc from glibc 2.34, in libdl before. */
    static const char *const where[][2] = {{"libc.so.6", "GLIBC_2.34"},
                                           {"libdl.so.2", "GLIBC_2.2.5"},
                                           {"libdl.so.2", "GLIBC_2.17"}};
    for (size_t i = 0; !glibc_dlsym && i < sizeof where / sizeof where[0]; i++) {
        void *h = dlopen(where[i][0], RTLD_NOW | RTLD_NOLOAD);
        if (h)
            glibc_dlsym = (dlsym_fn)dlvsym(h, "dlsym", where[i][1]);
    }
    void *h = dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
    return glibc_dlsym && h ? glibc_dlsym(h, name) : NULL;
}

/* "name+0xoff" for the exported symbol of the library holding `p` at or below it. */
static __attribute__((unused)) const char *sym_name(const void *p, char *buf, size_t len)
{
    Dl_info di;
    if (p && dladdr(p, &di) && di.dli_sname)
        snprintf(buf, len, "%s+%#lx", di.dli_sname, (unsigned long)((const char *)p - (const char *)di.dli_saddr));
    else
        snprintf(buf, len, "?");
    return buf;
}

static __attribute__((unused)) void *real_sym(const char *lib, const char *name)
{
    void *h = dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
    if (!h)
        h = dlopen(lib, RTLD_NOW);
    if (!h)
        return NULL;
    struct link_map *lm = NULL;
    if (dlinfo(h, RTLD_DI_LINKMAP, &lm) != 0 || !lm || !lm->l_name || !*lm->l_name)
        return NULL;
    int fd = open(lm->l_name, O_RDONLY);
    if (fd < 0)
        return NULL;
    struct stat st;
    void *result = NULL;
    if (fstat(fd, &st) == 0) {
        unsigned char *f = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (f != MAP_FAILED) {
            const Elf64_Ehdr *eh = (const Elf64_Ehdr *)f;
            const Elf64_Shdr *sh = (const Elf64_Shdr *)(f + eh->e_shoff);
            for (int i = 0; i < eh->e_shnum && !result; i++) {
                if (sh[i].sh_type != SHT_DYNSYM)
                    continue;
                const Elf64_Sym *syms = (const Elf64_Sym *)(f + sh[i].sh_offset);
                const char *strs = (const char *)(f + sh[sh[i].sh_link].sh_offset);
                size_t n = sh[i].sh_size / sizeof(Elf64_Sym);
                for (size_t j = 0; j < n; j++) {
                    if (syms[j].st_value && syms[j].st_shndx != SHN_UNDEF &&
                        strcmp(strs + syms[j].st_name, name) == 0) {
                        result = (void *)(lm->l_addr + syms[j].st_value);
                        break;
                    }
                }
            }
            munmap(f, (size_t)st.st_size);
        }
    }
    close(fd);
    return result;
}

/* ---------------- real device usage ---------------- */

typedef unsigned long long (*fake_used_fn)(int);
typedef unsigned long long (*fake_proc_used_fn)(int, int);
typedef nvmlReturn_t (*procs_fn)(nvmlDevice_t, unsigned int *, nvmlProcessInfo_t *);

/* Whether the stand-in driver is loaded (its test exports exist). */
static __attribute__((unused)) int on_fake(void) { return dlsym(RTLD_DEFAULT, "fakeGpuRealUsed") != NULL; }

static __attribute__((unused)) unsigned long long nvml_process_sum(int dev, int only_pid)
{
    static int inited;
    if (!inited) {
        nvmlInit_v2();
        inited = 1;
    }
    nvmlDevice_t h;
    if (nvmlDeviceGetHandleByIndex_v2((unsigned)dev, &h) != NVML_SUCCESS)
        return 0;
    /* The driver's own list, behind our hooks (which list only the region's processes, at the
     * region's counts). */
    static procs_fn list;
    if (!list)
        list = (procs_fn)real_sym("libnvidia-ml.so.1", "nvmlDeviceGetComputeRunningProcesses_v3");
    if (!list)
        list = nvmlDeviceGetComputeRunningProcesses_v3;
    nvmlProcessInfo_t infos[256];
    unsigned int n = 256;
    if (list(h, &n, infos) != NVML_SUCCESS)
        return 0;
    unsigned long long sum = 0;
    for (unsigned i = 0; i < n && i < 256; i++) {
        if (infos[i].usedGpuMemory == (unsigned long long)NVML_VALUE_NOT_AVAILABLE)
            continue;
        if (only_pid && (int)infos[i].pid != only_pid)
            continue;
        sum += infos[i].usedGpuMemory;
    }
    return sum;
}

/* Bytes really in use on NVML device `dev` (all processes). */
static __attribute__((unused)) unsigned long long real_used(int dev)
{
    fake_used_fn f = (fake_used_fn)dlsym(RTLD_DEFAULT, "fakeGpuRealUsed");
    if (f)
        return f(dev);
    return nvml_process_sum(dev, 0);
}

/* Bytes really in use on NVML device `dev` by process `pid`. */
static __attribute__((unused)) unsigned long long real_used_by(int dev, int pid)
{
    fake_proc_used_fn f = (fake_proc_used_fn)dlsym(RTLD_DEFAULT, "fakeGpuProcessUsed");
    if (f)
        return f(dev, pid);
    return nvml_process_sum(dev, pid);
}

/* ---------------- CUDA helpers ---------------- */

/* cuInit, then a new context on CUDA device `ordinal`, current on this thread. */
static __attribute__((unused)) CUcontext create_context(int ordinal)
{
    CUdevice dev;
    CUcontext ctx;
    CU(cuInit(0));
    CU(cuDeviceGet(&dev, ordinal));
    CU(cuCtxCreate_v2(&ctx, 0, dev));
    return ctx;
}

/* Kernel node parameters: `f` on a grid of x*y*z blocks of 32 threads. */
static __attribute__((unused)) CUDA_KERNEL_NODE_PARAMS_v2 kernel_node(CUfunction f, unsigned x,
                                                                      unsigned y, unsigned z)
{
    CUDA_KERNEL_NODE_PARAMS_v2 p;
    memset(&p, 0, sizeof p);
    p.func = f;
    p.gridDimX = x, p.gridDimY = y, p.gridDimZ = z;
    p.blockDimX = 32, p.blockDimY = 1, p.blockDimZ = 1;
    return p;
}

/* used = total - free, as an application sees it through cuMemGetInfo_v2. */
/* Properties of a pinned memory pool on CUDA device `dev`. */
static __attribute__((unused)) CUmemPoolProps pool_props(CUdevice dev)
{
    CUmemPoolProps pp;
    memset(&pp, 0, sizeof pp);
    pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    pp.location.id = dev;
    return pp;
}

static __attribute__((unused)) unsigned long long seen_used(void)
{
    size_t fr = 0, tot = 0;
    CU(cuMemGetInfo_v2(&fr, &tot));
    return (unsigned long long)(tot - fr);
}

static __attribute__((unused)) unsigned long long granularity(CUdevice dev)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    size_t g = 0;
    if (cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS ||
        g == 0)
        g = 2 * MIB;
    return g;
}

static __attribute__((unused)) unsigned long long round_up(unsigned long long v, unsigned long long g)
{
    return (v + g - 1) / g * g;
}

/* Runs `argv` in a child with extra environment `env` (NAME=VALUE strings, NULL-terminated);
 * returns its pid. */
static __attribute__((unused)) pid_t spawn(char *const argv[], char *const env[])
{
    pid_t pid = fork();
    if (pid == 0) {
        for (int i = 0; env && env[i]; i++)
            putenv(env[i]);
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}

/* Lines of the file `log` that contain `text`; -1 if it cannot be read. */
static __attribute__((unused)) int count_lines(const char *log, const char *text)
{
    FILE *f = fopen(log, "r");
    if (!f)
        return -1;
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof line, f))
        n += strstr(line, text) != NULL;
    fclose(f);
    return n;
}

/* Has the dead processes' slots reaped: a process that ends holding memory leaves its slot
 * until it is dead (the driver frees its memory only then), for the next process to attach or
 * look to reap. A short-lived child attaches (which reaps) and exits holding nothing. */
static __attribute__((unused)) void reap_dead_slots(void)
{
    pid_t pid = fork();
    if (pid == 0) {
        void (*attach)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "ensure_initialized");
        if (attach)
            attach();
        exit(0);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
}

/* Waits for `pid`; its exit status, or 128 + signal. */
static __attribute__((unused)) int wait_status(pid_t pid)
{
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    if (WIFEXITED(st))
        return WEXITSTATUS(st);
    if (WIFSIGNALED(st))
        return 128 + WTERMSIG(st);
    return 255;
}

#endif /* HOOKS_COMMON_H */
