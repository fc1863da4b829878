/* The C API's device numbering over the stand-in driver (c-tests/fake-driver, two GPUs), as the
 * hooks number devices (c-tests/hooks/t_devices.c does the same for the hooks):
 *
 * - cuda_to_nvml_map / nvml_to_cuda_map: CUDA device k is the NVML device that
 *   CUDA_VISIBLE_DEVICES names at position k, by index or by UUID, before cuInit (from the
 *   variable) and after it (from the driver's UUIDs); without the variable, identity.
 * - add/rm_gpu_device_memory_usage and hami_reserve/hami_release/hami_device_usage take a CUDA
 *   device and account on that NVML (region) device.
 * - init_device_info records NVML's device count and UUIDs in the region: each 96-byte entry is
 *   the UUID text and zeros after it (the bytes after it are poisoned first); without NVML it
 *   records nothing and returns non-zero.
 *
 *   devices                     runs every scenario below as a child with its own region file
 *   devices child MAP           one scenario: MAP lists the NVML device of each CUDA device
 *                               ("1", "1,0", "0,1"); HK_NO_NVML=1: NVML fails (FAKE_NVML_FAIL) */
#include "hami_shm.h"
#include "fake_cuda.h"
#include "fake_nvml.h"

#include "capi_test.h"

#define NVML_DEVS 2
#define NONE 0xffffffffu

static const char *g_run = "devices";
static shared_region_t *region;

static const shrreg_proc_slot_t *own_slot(void) {
    int n = atomic_load(&region->proc_num);
    for (int i = 0; i < n && i < ABI_SLOTS; i++)
        if (atomic_load(&region->procs[i].pid) == getpid())
            return &region->procs[i];
    return NULL;
}

static uint64_t own_used(int nvml_dev) {
    const shrreg_proc_slot_t *s = own_slot();
    return s ? atomic_load(&s->used[nvml_dev].total) : ~0ULL;
}

/* The maps agree with `map` (n CUDA devices); `bounded`: CUDA device n is known not to exist. */
static void check_maps(const char *phase, const int *map, int n, int bounded) {
    char name[160], got[160] = "";
    int ok = 1;
    for (int k = 0; k < n; k++) {
        unsigned v = cuda_to_nvml_map((unsigned)k);
        ok &= v == (unsigned)map[k];
        snprintf(got + strlen(got), sizeof got - strlen(got), "cuda %d->%d ", k, (int)v);
    }
    if (bounded)
        ok &= cuda_to_nvml_map((unsigned)n) == NONE;
    for (int i = 0; i < NVML_DEVS + 1; i++) {
        unsigned want = NONE;
        for (int k = n - 1; k >= 0; k--)
            if (map[k] == i)
                want = (unsigned)k;
        unsigned v = nvml_to_cuda_map((unsigned)i);
        ok &= v == want;
        snprintf(got + strlen(got), sizeof got - strlen(got), "nvml %d->%d ", i, (int)v);
    }
    snprintf(name, sizeof name, "[%s] %s: cuda_to_nvml_map/nvml_to_cuda_map", g_run, phase);
    t_check(ok, name, "%s", got);
}

/* Usage given for CUDA device k lands on NVML device map[k], through both accounting APIs. */
static void check_accounting(const char *phase, const int *map, int n) {
    char name[160];
    for (int k = 0; k < n; k++) {
        int d = map[k], other = 1 - d;
        uint64_t before = own_used(d), before_other = own_used(other);
        int add = add_gpu_device_memory_usage(getpid(), k, 3 * MiB, 2);
        uint64_t added = own_used(d) - before, stray = own_used(other) - before_other;
        int rm = rm_gpu_device_memory_usage(getpid(), k, 3 * MiB, 2);
        snprintf(name, sizeof name, "[%s] %s: add/rm_gpu_device_memory_usage(cuda %d)", g_run,
                 phase, k);
        t_check(add == 0 && rm == 0 && added == 3 * MiB && stray == 0 && own_used(d) == before, name,
                "add %d rm %d; NVML device %d +%lu, device %d +%lu", add, rm, d,
                (unsigned long)added, other, (unsigned long)stray);

        int res = hami_reserve(k, 5 * MiB, 2);
        uint64_t via = hami_device_usage(k), direct = get_current_device_memory_usage(d);
        uint64_t elsewhere = get_current_device_memory_usage(other);
        int rel = hami_release(k, 5 * MiB, 2);
        snprintf(name, sizeof name, "[%s] %s: hami_reserve/hami_device_usage(cuda %d)", g_run,
                 phase, k);
        t_check(res == HAMI_OK && rel == HAMI_OK && via == 5 * MiB && direct == 5 * MiB &&
                    elsewhere == 0 && get_current_device_memory_usage(d) == 0,
                name, "reserve %d release %d; hami_device_usage %lu, NVML device %d %lu, device %d %lu",
                res, rel, (unsigned long)via, d, (unsigned long)direct, other,
                (unsigned long)elsewhere);
    }
}

/* init_device_info over entries whose tails were poisoned: NVML's count and UUIDs, zeros after. */
static void check_device_info(int nvml) {
    const char *path = getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE");
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        t_die("open %s", path);
    shared_region_t *rw = mmap(NULL, sizeof *rw, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (rw == MAP_FAILED)
        t_die("mmap %s", path);
    for (int i = 0; i < ABI_DEVS; i++)
        for (int b = 60; b < UUID_LEN; b++)
            rw->uuids[i].text[b] = (char)0xAA;
    int rc = init_device_info();
    munmap(rw, sizeof *rw);
    close(fd);
    char name[160];
    snprintf(name, sizeof name, "[%s] init_device_info", g_run);
    if (!nvml) {
        t_check(rc != 0 && atomic_load(&region->device_num) == 0, name,
                "without NVML: returned %d, device_num %lu", rc,
                (unsigned long)atomic_load(&region->device_num));
        return;
    }
    if (nvmlInit_v2() != NVML_SUCCESS)
        t_die("nvmlInit_v2");
    int ok = rc == 0 && atomic_load(&region->device_num) == NVML_DEVS;
    char detail[400] = "";
    for (int i = 0; i < NVML_DEVS; i++) {
        char want[UUID_LEN] = {0};
        nvmlDevice_t h;
        if (nvmlDeviceGetHandleByIndex_v2((unsigned)i, &h) != NVML_SUCCESS ||
            nvmlDeviceGetUUID(h, want, sizeof want) != NVML_SUCCESS)
            t_die("NVML device %d", i);
        int same = memcmp(region->uuids[i].text, want, UUID_LEN) == 0;
        ok &= same && want[0] != 0;
        snprintf(detail + strlen(detail), sizeof detail - strlen(detail), "%d: %.40s%s ", i,
                 region->uuids[i].text, same ? "" : " (differs from NVML + zeros)");
    }
    t_check(ok, name, "returned %d, device_num %lu, %s", rc,
            (unsigned long)atomic_load(&region->device_num), detail);
}

static int child(const char *spec) {
    int map[8], n = 0;
    for (const char *p = spec; *p && n < 8; p++)
        if (*p >= '0' && *p <= '9')
            map[n++] = *p - '0';
    g_run = getenv("HK_RUN") ? getenv("HK_RUN") : spec;
    int nvml = !getenv("HK_NO_NVML");
    int listed = getenv("CUDA_VISIBLE_DEVICES") != NULL;
    t_watchdog(60);

    ensure_initialized();
    region = t_map_region(sizeof(shared_region_t));
    check_device_info(nvml);
    /* Before cuInit the map comes from CUDA_VISIBLE_DEVICES (a UUID entry looked up in NVML). */
    check_maps("before cuInit", map, n, listed);
    check_accounting("before cuInit", map, n);
    /* After it, from the driver's UUIDs against NVML's. */
    CUresult r = cuInit(0);
    int count = -1;
    cuDeviceGetCount(&count);
    char name[160];
    snprintf(name, sizeof name, "[%s] cuInit", g_run);
    t_check(r == CUDA_SUCCESS && count == n, name, "returned %d, %d CUDA device(s)", (int)r, count);
    check_maps("after cuInit", map, n, 1);
    check_accounting("after cuInit", map, n);
    return t_failures ? 1 : 0;
}

/* Runs `self child MAP` with the given CUDA_VISIBLE_DEVICES (NULL: unset) and its own region. */
static void scenario(const char *run, const char *map, const char *visible, int no_nvml) {
    char cache[512];
    snprintf(cache, sizeof cache, "%s/%s.cache", t_dir(), run);
    pid_t pid = fork();
    if (pid < 0)
        t_die("fork");
    if (pid == 0) {
        setenv("CUDA_DEVICE_MEMORY_SHARED_CACHE", cache, 1);
        setenv("HK_RUN", run, 1);
        if (visible)
            setenv("CUDA_VISIBLE_DEVICES", visible, 1);
        else
            unsetenv("CUDA_VISIBLE_DEVICES");
        if (no_nvml) {
            setenv("HK_NO_NVML", "1", 1);
            setenv("FAKE_NVML_FAIL", "init", 1);
        }
        char *av[] = {"devices", "child", (char *)map, NULL};
        execv("/proc/self/exe", av);
        _exit(127);
    }
    int st = t_wait(pid, 60000);
    char name[160];
    snprintf(name, sizeof name, "[%s] CUDA_VISIBLE_DEVICES=%s", run, visible ? visible : "(unset)");
    t_check(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0, name, "child %s", t_status_text(st));
}

int main(int argc, char **argv) {
    if (argc >= 3 && strcmp(argv[1], "child") == 0)
        return child(argv[2]);
    static const char *const env[] = {"CUDA_DEVICE_MEMORY_LIMIT=1g", "FAKE_CUDA_DEVICES=2",
                                      "FAKE_CTX_BYTES=64m", NULL};
    t_reexec_with_env(argv, "devices.cache", env);
    char state[512];
    snprintf(state, sizeof state, "%s/fake-gpu.state", t_dir());
    setenv("FAKE_GPU_STATE", state, 1);

    /* NVML device 1's UUID (the parent never initialises CUDA). */
    char uuid[96] = {0};
    nvmlDevice_t h;
    if (nvmlInit_v2() != NVML_SUCCESS || nvmlDeviceGetHandleByIndex_v2(1, &h) != NVML_SUCCESS ||
        nvmlDeviceGetUUID(h, uuid, sizeof uuid) != NVML_SUCCESS || !uuid[0])
        t_die("the stand-in driver gives no UUID for NVML device 1 (is it on LD_LIBRARY_PATH?)");
    scenario("index", "1", "1", 0);
    scenario("uuid", "1", uuid, 0);
    scenario("reorder", "1,0", "1,0", 0);
    scenario("zero", "0", "0", 0);
    scenario("unset", "0,1", NULL, 0);
    scenario("index-no-nvml", "1", "1", 1);
    t_cleanup_dir();
    printf("%s devices: %d failure(s)\n", t_failures ? "FAIL" : "PASS", t_failures);
    return t_failures ? 1 : 0;
}
