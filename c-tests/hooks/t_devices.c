/*
 * t_devices: CUDA_VISIBLE_DEVICES renumbering and per-device limits, over two GPUs with
 * CUDA_DEVICE_MEMORY_LIMIT_0=1g and _1=2g (HK_LIMIT0, HK_LIMIT1). Usage lands on the region
 * device of the physical GPU (NVML's index), and that device's limit holds, whether the GPU is
 * selected by index or by UUID. Each run uses its own region file.
 *   t_devices                 runs the three scenarios below as children
 *   t_devices visible <phys>  one visible device, expected to be NVML device <phys>
 *   t_devices both            no CUDA_VISIBLE_DEVICES: both devices, each with its own limit
 */
#include "common.h"

static unsigned long long g_lim[2];

static nvmlMemory_t nvml_mem(unsigned idx)
{
    nvmlMemory_t m = {0, 0, 0};
    nvmlDevice_t h;
    if (nvmlDeviceGetHandleByIndex_v2(idx, &h) == NVML_SUCCESS)
        nvmlDeviceGetMemoryInfo(h, &m);
    return m;
}

/* Fills the current context's device in 64 MiB chunks; returns the bytes admitted. */
static unsigned long long fill(CUdeviceptr *ptrs, int *n)
{
    *n = 0;
    while (*n < 1024 && cuMemAlloc_v2(&ptrs[*n], 64 * MIB) == CUDA_SUCCESS)
        (*n)++;
    return (unsigned long long)*n * 64 * MIB;
}

static int visible(int phys)
{
    g_test = getenv("HK_RUN") ? getenv("HK_RUN") : "devices-visible";
    int other = 1 - phys;
    CU(cuInit(0));
    int count = 0;
    CU(cuDeviceGetCount(&count));
    int want = (int)env_ull("HK_COUNT", 1);
    CHECK(count == want, "%d CUDA device(s) visible (%d)", want, count);
    CUdevice dev;
    CU(cuDeviceGet(&dev, 0));
    CUcontext ctx;
    CU(cuCtxCreate_v2(&ctx, 0, dev));
    size_t fr, tot;
    CU(cuMemGetInfo_v2(&fr, &tot));
    CHECK(tot == g_lim[phys], "cuMemGetInfo_v2 total %zu is physical device %d's limit %llu", tot,
          phys, g_lim[phys]);
    size_t tm;
    CU(cuDeviceTotalMem_v2(&tm, dev));
    CHECK(tm == g_lim[phys], "cuDeviceTotalMem_v2(0) %zu is device %d's limit", tm, phys);
    CUdeviceptr p;
    CU(cuMemAlloc_v2(&p, 256 * MIB));
    unsigned long long u = region_usage(phys), ctxc = region_usage_kind(phys, 0);
    CHECK(u == ctxc + 256 * MIB && ctxc > 0,
          "usage lands on region device %d (%llu MiB = context %llu + 256)", phys, u / MIB,
          ctxc / MIB);
    CHECK(region_usage(other) == 0, "nothing on region device %d (%llu)", other,
          region_usage(other));
    CHECK(real_used(phys) > 0 && real_used(other) == 0,
          "the driver agrees: physical %d in use (%llu MiB), %d idle (%llu)", phys,
          real_used(phys) / MIB, other, real_used(other));
    if (!getenv("FAKE_NVML_FAIL")) {
        CHECK(nvmlInit_v2() == NVML_SUCCESS, "nvmlInit_v2");
        nvmlMemory_t m = nvml_mem((unsigned)phys), mo = nvml_mem((unsigned)other);
        CHECK(m.total == g_lim[phys] && m.used == u,
              "NVML device %d: total %llu == its limit, used %llu == region usage", phys, m.total,
              m.used);
        CHECK(mo.total == g_lim[other] && mo.used == 0, "NVML device %d: total %llu == its limit, "
              "used %llu == 0", other, mo.total, mo.used);
    }
    CU(cuMemFree_v2(p));
    static CUdeviceptr ptrs[1024];
    int n;
    unsigned long long got = fill(ptrs, &n);
    CHECK(got + ctxc <= g_lim[phys] && got + ctxc + 64 * MIB > g_lim[phys],
          "device %d's limit holds: %llu MiB + context %llu MiB of %llu MiB", phys, got / MIB,
          ctxc / MIB, g_lim[phys] / MIB);
    CHECK(real_used(phys) <= g_lim[phys], "real usage of device %d %llu MiB <= its limit", phys,
          real_used(phys) / MIB);
    for (int i = 0; i < n; i++)
        CU(cuMemFree_v2(ptrs[i]));
    CU(cuCtxDestroy_v2(ctx));
    CHECK(region_usage(phys) == 0, "region device %d back to 0", phys);
    return finish();
}

static int both(void)
{
    g_test = "devices-both";
    CU(cuInit(0));
    int count = 0;
    CU(cuDeviceGetCount(&count));
    CHECK(count == 2, "two CUDA devices (%d)", count);
    CUcontext ctx[2];
    static CUdeviceptr ptrs[2][1024];
    int n[2];
    unsigned long long got[2], ctxc[2];
    for (int d = 0; d < 2; d++) {
        CUdevice dev;
        CU(cuDeviceGet(&dev, d));
        CU(cuCtxCreate_v2(&ctx[d], 0, dev));
        size_t fr, tot;
        CU(cuMemGetInfo_v2(&fr, &tot));
        CHECK(tot == g_lim[d], "device %d: cuMemGetInfo_v2 total %zu == its limit %llu", d, tot,
              g_lim[d]);
        ctxc[d] = region_usage_kind(d, 0);
        got[d] = fill(ptrs[d], &n[d]);
    }
    for (int d = 0; d < 2; d++) {
        CHECK(got[d] + ctxc[d] <= g_lim[d] && got[d] + ctxc[d] + 64 * MIB > g_lim[d],
              "device %d: %llu MiB + context %llu MiB within its %llu MiB limit", d,
              got[d] / MIB, ctxc[d] / MIB, g_lim[d] / MIB);
        CHECK(region_usage(d) == got[d] + ctxc[d], "region device %d holds exactly that", d);
        CHECK(real_used(d) <= g_lim[d], "real usage of device %d %llu MiB <= limit", d,
              real_used(d) / MIB);
    }
    for (int d = 0; d < 2; d++) {
        CU(cuCtxSetCurrent(ctx[d]));
        for (int i = 0; i < n[d]; i++)
            CU(cuMemFree_v2(ptrs[d][i]));
        CU(cuCtxDestroy_v2(ctx[d]));
        CHECK(region_usage(d) == 0, "region device %d back to 0", d);
    }
    return finish();
}

/* Runs this program as `mode phys` in a child with the given environment, on a fresh region
 * file `cache`, or on the one left by the scenario before when `extra` (one more NAME=value) is
 * given: then the region is kept afterwards too. */
static int scenario(char *self, const char *name, const char *mode, const char *phys,
                    const char *visible_env, const char *cache, const char *count, char *extra)
{
    char envbuf[4][256];
    snprintf(envbuf[0], sizeof envbuf[0], "CUDA_DEVICE_MEMORY_SHARED_CACHE=%s", cache);
    snprintf(envbuf[1], sizeof envbuf[1], "HK_RUN=%s", name);
    snprintf(envbuf[3], sizeof envbuf[3], "HK_COUNT=%s", count);
    char *env[6] = {envbuf[0], envbuf[1], envbuf[3], extra, NULL, NULL};
    if (visible_env) {
        snprintf(envbuf[2], sizeof envbuf[2], "CUDA_VISIBLE_DEVICES=%s", visible_env);
        env[extra ? 4 : 3] = envbuf[2];
    }
    if (!extra)
        unlink(cache);
    char *av[] = {self, (char *)mode, (char *)phys, NULL};
    pid_t pid = fork();
    if (pid == 0) {
        if (!visible_env)
            unsetenv("CUDA_VISIBLE_DEVICES");
        for (int i = 0; env[i]; i++)
            putenv(env[i]);
        execv(self, av);
        _exit(127);
    }
    int st = wait_status(pid);
    if (!extra)
        unlink(cache);
    return st;
}

int main(int argc, char **argv)
{
    g_lim[0] = env_ull("HK_LIMIT0", GIB);
    g_lim[1] = env_ull("HK_LIMIT1", 2 * GIB);
    if (argc >= 3 && strcmp(argv[1], "visible") == 0)
        return visible(atoi(argv[2]));
    if (argc >= 2 && strcmp(argv[1], "both") == 0)
        return both();

    g_test = "devices";
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0)
        return 1;
    self[len] = 0;
    const char *base = getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE");
    char cache[4200];
    snprintf(cache, sizeof cache, "%s.dev", base ? base : "/tmp/hk-devices");

    /* The UUID of physical device 1, from NVML (the parent never initialises CUDA). */
    char uuid[96] = {0};
    nvmlDevice_t h;
    if (nvmlInit_v2() == NVML_SUCCESS && nvmlDeviceGetHandleByIndex_v2(1, &h) == NVML_SUCCESS)
        nvmlDeviceGetUUID(h, uuid, sizeof uuid);
    CHECK(uuid[0] != 0, "NVML device 1 has UUID %s", uuid);

    int st = scenario(self, "devices-index", "visible", "1", "1", cache, "1", NULL);
    CHECK(st == 0, "CUDA_VISIBLE_DEVICES=1: accounting on region device 1 (status %d)", st);
    st = scenario(self, "devices-uuid", "visible", "1", uuid, cache, "1", NULL);
    CHECK(st == 0, "CUDA_VISIBLE_DEVICES=%s: accounting on region device 1 (status %d)", uuid, st);
    /* A region whose UUIDs an earlier process published maps devices without NVML: here NVML
     * fails, so CUDA_VISIBLE_DEVICES=<uuid> can only be resolved through the region. */
    st = scenario(self, "devices-uuid-publish", "visible", "1", uuid, cache, "1", "HK_KEEP=1");
    CHECK(st == 0, "CUDA_VISIBLE_DEVICES=%s, region kept (status %d)", uuid, st);
    st = scenario(self, "devices-uuid-no-nvml", "visible", "1", uuid, cache, "1", "FAKE_NVML_FAIL=init");
    CHECK(st == 0, "the same without NVML: mapped by the region's UUIDs to region device 1 "
          "(status %d)", st);
    unlink(cache);
    st = scenario(self, "devices-reorder", "visible", "1", "1,0", cache, "2", NULL);
    CHECK(st == 0, "CUDA_VISIBLE_DEVICES=1,0: CUDA device 0 is region device 1 (status %d)", st);
    st = scenario(self, "devices-zero", "visible", "0", "0", cache, "1", NULL);
    CHECK(st == 0, "CUDA_VISIBLE_DEVICES=0: accounting on region device 0 (status %d)", st);
    st = scenario(self, "devices-both", "both", "-", NULL, cache, "2", NULL);
    CHECK(st == 0, "both devices, each with its own limit (status %d)", st);
    return finish();
}
