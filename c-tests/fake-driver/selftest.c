/*
 * selftest.c: exercises every function of the fake driver, linked directly
 * against the fake libcuda.so.1 and libnvidia-ml.so.1.
 *
 * Prints one line per check ("PASS ..." / "FAIL ...") and finally
 * "N passed, M failed"; exits 1 when anything failed. Checks in forked
 * children count too (the counters live in a shared mapping).
 *
 * Usage: selftest [state-file]   (default /tmp/fake-gpu-selftest-<pid>)
 * It sets its own FAKE_* environment: 2 devices of 1 GiB and 4 GiB, NVML pid
 * offset 1000, the other knobs at their defaults.
 */
#define _GNU_SOURCE
#include "fake_cuda.h"
#include "fake_nvml.h"

#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MiB (1024ULL * 1024ULL)
#define GiB (1024ULL * MiB)
#define CTX (300 * MiB)   /* FAKE_CTX_BYTES default */
#define GRAN (2 * MiB)    /* FAKE_GPU_GRANULE default */
#define PID_OFFSET 1000
#define DEV0_TOTAL (1 * GiB)
#define DEV1_TOTAL (4 * GiB)

/* ---------------- reporting ---------------- */

static struct counters {
    _Atomic int pass, fail;
} *g_cnt;
static char g_who[64] = "";

__attribute__((format(printf, 2, 3))) static int check(int ok, const char *fmt, ...)
{
    va_list ap;
    printf("%s %s", ok ? "PASS" : "FAIL", g_who);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
    atomic_fetch_add(ok ? &g_cnt->pass : &g_cnt->fail, 1);
    return ok;
}

static int check_cu(CUresult want, CUresult got, const char *what)
{
    return check(got == want, "%s -> %d (want %d)", what, (int)got, (int)want);
}
#define CU(want, call) check_cu((want), (call), #call)

static int check_nv(nvmlReturn_t want, nvmlReturn_t got, const char *what)
{
    return check(got == want, "%s -> %d (want %d)", what, (int)got, (int)want);
}
#define NV(want, call) check_nv((want), (call), #call)

static int check_u64(unsigned long long want, unsigned long long got, const char *what)
{
    return check(got == want, "%s: %llu (want %llu)", what, got, want);
}
#define EQ(want, got, what) check_u64((unsigned long long)(want), (unsigned long long)(got), what)

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static uint64_t now_us_real(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000ULL + (uint64_t)ts.tv_nsec / 1000ULL;
}

static double ms_since(uint64_t t0) { return (double)(now_ns() - t0) / 1e6; }

static unsigned long long used0(void) { return fakeGpuRealUsed(0); }
static unsigned long long used1(void) { return fakeGpuRealUsed(1); }
static unsigned long long mine(int dev) { return fakeGpuProcessUsed(dev, getpid()); }

/* Run fn in a forked child; its checks are counted; it must exit 0. */
static void in_child(const char *name, void (*fn)(void))
{
    fflush(stdout);
    pid_t p = fork();
    if (p == 0) {
        snprintf(g_who, sizeof g_who, "[%s] ", name);
        fn();
        fflush(stdout);
        exit(0); /* exit, not _exit: the driver's destructor must run */
    }
    int st = 0;
    waitpid(p, &st, 0);
    check(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child %s exited cleanly (status %d)", name, st);
}

static void uuid_str(const CUuuid *u, char *out, size_t n)
{
    const unsigned char *b = (const unsigned char *)u->bytes;
    snprintf(out, n, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12],
             b[13], b[14], b[15]);
}

/* Shared objects used across tests. */
static CUcontext g_pc0;   /* device 0 primary context, retained throughout */
static CUmodule g_mod;
static CUfunction g_fn;

static CUresult blocks(CUfunction f, unsigned n, CUstream s)
{
    return cuLaunchKernel(f, n, 1, 1, 128, 1, 1, 0, s, NULL, NULL);
}

/* ---------------- before cuInit ---------------- */

static void test_before_init(void)
{
    int v = 0, n;
    CUdeviceptr p;
    CUcontext c;
    CU(CUDA_SUCCESS, cuDriverGetVersion(&v));
    EQ(12080, v, "cuDriverGetVersion before cuInit (FAKE_CUDA_VERSION default)");
    CU(CUDA_ERROR_NOT_INITIALIZED, cuDeviceGetCount(&n));
    CU(CUDA_ERROR_NOT_INITIALIZED, cuMemAlloc_v2(&p, 1));
    CU(CUDA_ERROR_NOT_INITIALIZED, cuDevicePrimaryCtxRetain(&c, 0));
    CU(CUDA_ERROR_INVALID_VALUE, cuInit(1));
    fakeCudaResetState();
    EQ(0, used0(), "device 0 usage after fakeCudaResetState (before cuInit)");
    CU(CUDA_SUCCESS, cuInit(0));
    CU(CUDA_SUCCESS, cuInit(0));
    CU(CUDA_ERROR_INVALID_VALUE, cuDriverGetVersion(NULL));
}

/* ---------------- devices ---------------- */

static void test_devices(void)
{
    int n = -1, v;
    CUdevice d = -1;
    char name[64];
    CUuuid u0, u0b, u1;
    size_t t;
    unsigned int t32;

    CU(CUDA_SUCCESS, cuDeviceGetCount(&n));
    EQ(2, n, "cuDeviceGetCount (FAKE_CUDA_DEVICES=2)");
    CU(CUDA_SUCCESS, cuDeviceGet(&d, 1));
    EQ(1, d, "cuDeviceGet(1)");
    CU(CUDA_ERROR_INVALID_DEVICE, cuDeviceGet(&d, 2));
    CU(CUDA_ERROR_INVALID_DEVICE, cuDeviceGet(&d, -1));
    CU(CUDA_ERROR_INVALID_VALUE, cuDeviceGetCount(NULL));

    CU(CUDA_SUCCESS, cuDeviceGetName(name, sizeof name, 0));
    check(strcmp(name, "Fake H200") == 0, "cuDeviceGetName: \"%s\"", name);
    CU(CUDA_SUCCESS, cuDeviceGetName(name, 5, 1));
    check(strcmp(name, "Fake") == 0, "cuDeviceGetName truncates to len-1: \"%s\"", name);
    CU(CUDA_ERROR_INVALID_DEVICE, cuDeviceGetName(name, sizeof name, 2));

    CU(CUDA_SUCCESS, cuDeviceGetUuid(&u0, 0));
    CU(CUDA_SUCCESS, cuDeviceGetUuid_v2(&u0b, 0));
    CU(CUDA_SUCCESS, cuDeviceGetUuid_v2(&u1, 1));
    check(memcmp(&u0, &u0b, sizeof u0) == 0, "cuDeviceGetUuid and _v2 agree");
    check(memcmp(&u0, &u1, sizeof u0) != 0, "UUIDs differ between devices");
    char s[64];
    uuid_str(&u1, s, sizeof s);
    check(strcmp(s, "GPU-fa4e0000-0000-0000-0000-000000000001") == 0, "device 1 UUID %s", s);

    CU(CUDA_SUCCESS, cuDeviceTotalMem_v2(&t, 0));
    EQ(DEV0_TOTAL, t, "cuDeviceTotalMem_v2(0) (FAKE_GPU_MEM_MB=1024)");
    CU(CUDA_SUCCESS, cuDeviceTotalMem_v2(&t, 1));
    EQ(DEV1_TOTAL, t, "cuDeviceTotalMem_v2(1) (FAKE_GPU_MEM_MB_1=4096)");
    CU(CUDA_SUCCESS, cuDeviceTotalMem(&t32, 0));
    EQ(DEV0_TOTAL, t32, "cuDeviceTotalMem (32-bit) on 1 GiB");
    CU(CUDA_SUCCESS, cuDeviceTotalMem(&t32, 1));
    EQ(0xFFFFFFFFu, t32, "cuDeviceTotalMem (32-bit) clamps 4 GiB");

    CU(CUDA_SUCCESS, cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0));
    EQ(132, v, "MULTIPROCESSOR_COUNT");
    CU(CUDA_SUCCESS, cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 0));
    EQ(9, v, "COMPUTE_CAPABILITY_MAJOR");
    v = -1;
    CU(CUDA_SUCCESS, cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 1));
    EQ(0, v, "COMPUTE_CAPABILITY_MINOR");
    CU(CUDA_SUCCESS, cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, 0));
    EQ(2048, v, "MAX_THREADS_PER_MULTIPROCESSOR");
    CU(CUDA_SUCCESS, cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 1));
    EQ(0x11, v, "PCI_BUS_ID of device 1");
    v = -1;
    CU(CUDA_SUCCESS, cuDeviceGetAttribute(&v, (CUdevice_attribute)200, 0));
    EQ(0, v, "an unmodelled attribute reads 0");
    CU(CUDA_ERROR_INVALID_VALUE, cuDeviceGetAttribute(&v, (CUdevice_attribute)0, 0));
    CU(CUDA_ERROR_INVALID_DEVICE, cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 5));
}

/* ---------------- primary context ---------------- */

static void test_primary(void)
{
    CUdeviceptr p;
    CUcontext pc2, cur = NULL;
    unsigned fl = 99;
    int act = 99;
    CUdevice d = -1;
    unsigned long long u0 = used0();

    CU(CUDA_ERROR_INVALID_CONTEXT, cuMemAlloc_v2(&p, 1));
    CU(CUDA_SUCCESS, cuDevicePrimaryCtxGetState(0, &fl, &act));
    EQ(0, act, "primary context inactive before retain");
    CU(CUDA_SUCCESS, cuDevicePrimaryCtxRetain(&g_pc0, 0));
    EQ(u0 + CTX, used0(), "primary context costs FAKE_CTX_BYTES (300 MiB)");
    EQ(CTX, mine(0), "fakeGpuProcessUsed counts the context");
    CU(CUDA_SUCCESS, cuDevicePrimaryCtxRetain(&pc2, 0));
    check(pc2 == g_pc0, "second retain gives the same handle");
    EQ(u0 + CTX, used0(), "second retain costs nothing (refcounted)");
    CU(CUDA_SUCCESS, cuDevicePrimaryCtxGetState(0, &fl, &act));
    EQ(1, act, "primary context active after retain");
    CU(CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, cuDevicePrimaryCtxSetFlags(0, CU_CTX_SCHED_YIELD));
    CU(CUDA_SUCCESS, cuDevicePrimaryCtxSetFlags_v2(0, CU_CTX_SCHED_YIELD));
    CU(CUDA_SUCCESS, cuDevicePrimaryCtxGetState(0, &fl, &act));
    EQ(CU_CTX_SCHED_YIELD, fl, "flags set by cuDevicePrimaryCtxSetFlags_v2");
    CU(CUDA_ERROR_INVALID_VALUE, cuDevicePrimaryCtxSetFlags_v2(0, 0x1000));
    CU(CUDA_SUCCESS, cuDevicePrimaryCtxRelease_v2(0));
    EQ(u0 + CTX, used0(), "release of one of two references keeps the context");

    CU(CUDA_SUCCESS, cuCtxSetCurrent(g_pc0));
    CU(CUDA_SUCCESS, cuCtxGetCurrent(&cur));
    check(cur == g_pc0, "cuCtxGetCurrent returns the context set");
    CU(CUDA_SUCCESS, cuCtxGetDevice(&d));
    EQ(0, d, "cuCtxGetDevice");
    CU(CUDA_SUCCESS, cuCtxSynchronize());
}

/* ---------------- linear allocations ---------------- */

static void test_linear(void)
{
    CUdeviceptr p = 0, q = 0, b = 0, pp = 0, m = 0;
    size_t f = 0, t = 0, s = 0, pitch = 0;
    unsigned long long u0 = used0();

    CU(CUDA_SUCCESS, cuMemGetInfo_v2(&f, &t));
    EQ(DEV0_TOTAL, t, "cuMemGetInfo_v2 total");
    EQ(DEV0_TOTAL - u0, f, "cuMemGetInfo_v2 free = total - real usage");

    CU(CUDA_SUCCESS, cuMemAlloc_v2(&p, 1));
    EQ(u0 + GRAN, used0(), "1-byte cuMemAlloc_v2 costs one 2 MiB granule");
    check(p >= 0x7f0000000000ULL, "device pointer 0x%llx is in device 0's fake range", p);
    CU(CUDA_SUCCESS, cuMemAlloc_v2(&q, 3 * MiB));
    EQ(u0 + 3 * GRAN, used0(), "3 MiB rounds up to 4 MiB");
    check(q != p, "allocations get distinct addresses");
    CU(CUDA_SUCCESS, cuMemGetAddressRange_v2(&b, &s, q + MiB));
    check(b == q && s == 3 * MiB, "cuMemGetAddressRange_v2 of an inner address: base ok %d, size %zu",
          b == q, s);
    CU(CUDA_ERROR_NOT_FOUND, cuMemGetAddressRange_v2(&b, &s, q + 3 * MiB + 1));
    CU(CUDA_SUCCESS, cuMemGetAddressRange_v2(NULL, NULL, p));

    CU(CUDA_SUCCESS, cuMemFree_v2(p));
    EQ(u0 + 2 * GRAN, used0(), "cuMemFree_v2 gives the granule back");
    CU(CUDA_ERROR_INVALID_VALUE, cuMemFree_v2(p));
    CU(CUDA_ERROR_INVALID_VALUE, cuMemFree_v2(q + 4096));
    CU(CUDA_ERROR_INVALID_VALUE, cuMemFree_v2(0xdead0000ULL));
    CU(CUDA_SUCCESS, cuMemFree_v2(0));
    CU(CUDA_ERROR_INVALID_VALUE, cuMemAlloc_v2(&p, 0));
    CU(CUDA_ERROR_INVALID_VALUE, cuMemAlloc_v2(NULL, 10));
    CU(CUDA_SUCCESS, cuMemFree_v2(q));
    EQ(u0, used0(), "usage back to the baseline");

    CU(CUDA_SUCCESS, cuMemAllocPitch_v2(&pp, &pitch, 100, 10, 4));
    EQ(512, pitch, "cuMemAllocPitch_v2 pitch of 100-byte rows");
    CU(CUDA_SUCCESS, cuMemGetAddressRange_v2(&b, &s, pp));
    EQ(5120, s, "pitched allocation size = pitch * height");
    EQ(u0 + GRAN, used0(), "pitched allocation charged one granule");
    CU(CUDA_ERROR_INVALID_VALUE, cuMemAllocPitch_v2(&p, &pitch, 100, 10, 3));
    CU(CUDA_SUCCESS, cuMemFree_v2(pp));

    CU(CUDA_SUCCESS, cuMemAllocManaged(&m, 5 * MiB, CU_MEM_ATTACH_GLOBAL));
    EQ(u0 + 6 * MiB, used0(), "cuMemAllocManaged 5 MiB charges 6 MiB");
    CU(CUDA_ERROR_INVALID_VALUE, cuMemAllocManaged(&p, MiB, 0));
    CU(CUDA_SUCCESS, cuMemFree_v2(m));
    EQ(u0, used0(), "managed memory freed by cuMemFree_v2");
    EQ(CTX, mine(0), "process usage is the context only again");
}

static void test_oom(void)
{
    CUdeviceptr big = 0, x = 0;
    size_t f = 1, t = 0;
    unsigned long long u0 = used0(), avail = DEV0_TOTAL - u0;

    CU(CUDA_SUCCESS, cuMemAlloc_v2(&big, avail));
    EQ(DEV0_TOTAL, used0(), "allocating all free memory fills the device");
    CU(CUDA_SUCCESS, cuMemGetInfo_v2(&f, &t));
    EQ(0, f, "cuMemGetInfo_v2 free is 0 on a full device");
    CU(CUDA_ERROR_OUT_OF_MEMORY, cuMemAlloc_v2(&x, 1));
    EQ(DEV0_TOTAL, used0(), "a failed allocation changes nothing");
    CU(CUDA_SUCCESS, cuMemFree_v2(big));
    CU(CUDA_ERROR_OUT_OF_MEMORY, cuMemAlloc_v2(&x, DEV0_TOTAL + 1));
    CU(CUDA_ERROR_OUT_OF_MEMORY, cuMemAlloc_v2(&x, avail + 1)); /* rounds past the total */
    CU(CUDA_SUCCESS, cuMemAlloc_v2(&big, avail - MiB));          /* rounds up to exactly full */
    CU(CUDA_ERROR_OUT_OF_MEMORY, cuMemAllocManaged(&x, 1, CU_MEM_ATTACH_GLOBAL));
    CU(CUDA_SUCCESS, cuMemFree_v2(big));
    EQ(u0, used0(), "usage back after OOM tests");
}

static void test_host(void)
{
    void *h = NULL, *h2 = NULL, *h3 = NULL;
    unsigned long long u0 = used0();
    CU(CUDA_SUCCESS, cuMemAllocHost_v2(&h, MiB));
    memset(h, 0x5a, MiB); /* real, writable memory */
    CU(CUDA_SUCCESS, cuMemHostAlloc(&h2, 4096, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
    CU(CUDA_ERROR_INVALID_VALUE, cuMemHostAlloc(&h3, 4096, 0x100));
    CU(CUDA_SUCCESS, cuMemAllocHost(&h3, 100));
    EQ(u0, used0(), "host allocations are not device memory");
    CU(CUDA_SUCCESS, cuMemFreeHost(h));
    CU(CUDA_SUCCESS, cuMemFreeHost(h2));
    CU(CUDA_SUCCESS, cuMemFreeHost(h3));
    CU(CUDA_ERROR_INVALID_VALUE, cuMemFreeHost(h));
    CU(CUDA_ERROR_INVALID_VALUE, cuMemFreeHost(&u0));
}

static void test_legacy(void)
{
    CUdeviceptr_v1 p1 = 0, p2 = 0, b = 0;
    unsigned f = 0, t = 0, s = 0, pitch = 0;
    unsigned long long u0 = used0();
    CU(CUDA_SUCCESS, cuMemAlloc(&p1, 1000));
    check(p1 != 0, "cuMemAlloc (32-bit) returns a 32-bit pointer 0x%x", p1);
    EQ(u0 + GRAN, used0(), "cuMemAlloc (32-bit) charges a granule");
    CU(CUDA_SUCCESS, cuMemGetInfo(&f, &t));
    EQ(DEV0_TOTAL, t, "cuMemGetInfo (32-bit) total");
    EQ(DEV0_TOTAL - used0(), f, "cuMemGetInfo (32-bit) free");
    CU(CUDA_SUCCESS, cuMemGetAddressRange(&b, &s, p1 + 10));
    check(b == p1 && s == 1000, "cuMemGetAddressRange (32-bit): base ok %d size %u", b == p1, s);
    CU(CUDA_SUCCESS, cuMemAllocPitch(&p2, &pitch, 600, 4, 8));
    EQ(1024, pitch, "cuMemAllocPitch (32-bit) pitch");
    CU(CUDA_SUCCESS, cuMemFree(p1));
    CU(CUDA_ERROR_INVALID_VALUE, cuMemFree(p1));
    CU(CUDA_SUCCESS, cuMemFree_v2(p2)); /* a 32-bit pointer is a valid 64-bit one */
    EQ(u0, used0(), "legacy allocations freed");
}

/* ---------------- VMM ---------------- */

static void *vmm_thread(void *arg)
{
    (void)arg;
    CUmemAllocationProp prop = {0};
    CUmemGenericAllocationHandle h = 0;
    CUcontext cur = (CUcontext)1;
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    cuCtxGetCurrent(&cur);
    check(cur == NULL, "a new thread has no current context");
    CUdeviceptr p;
    CU(CUDA_ERROR_INVALID_CONTEXT, cuMemAlloc_v2(&p, 1));
    CU(CUDA_ERROR_INVALID_CONTEXT, cuCtxPopCurrent_v2(NULL));
    CU(CUDA_SUCCESS, cuMemCreate(&h, GRAN, &prop, 0)); /* needs no context */
    CU(CUDA_SUCCESS, cuMemRelease(h));
    return NULL;
}

static void test_vmm(void)
{
    CUmemAllocationProp prop = {0}, got;
    CUmemGenericAllocationHandle h = 0, h2 = 0;
    CUdeviceptr va = 0, b = 0;
    size_t g = 0, s = 0;
    unsigned long long u1 = used1();

    EQ(32, sizeof(CUmemAllocationProp), "sizeof(CUmemAllocationProp)");
    EQ(16, offsetof(CUmemAllocationProp, win32HandleMetaData), "offsetof win32HandleMetaData");
    EQ(24, offsetof(CUmemAllocationProp, allocFlags), "offsetof allocFlags");
    EQ(12, sizeof(CUmemAccessDesc), "sizeof(CUmemAccessDesc)");

    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 1;
    prop.allocFlags.gpuDirectRDMACapable = 1;
    CU(CUDA_SUCCESS, cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    EQ(GRAN, g, "cuMemGetAllocationGranularity = FAKE_GPU_GRANULE");
    CU(CUDA_SUCCESS, cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    CU(CUDA_ERROR_INVALID_VALUE, cuMemGetAllocationGranularity(&g, &prop, (CUmemAllocationGranularity_flags)7));

    CU(CUDA_ERROR_INVALID_VALUE, cuMemCreate(&h, 3 * MiB, &prop, 0));
    CU(CUDA_SUCCESS, cuMemCreate(&h, 4 * MiB, &prop, 0));
    EQ(u1 + 4 * MiB, used1(), "cuMemCreate charges location.id's device");
    CU(CUDA_SUCCESS, cuMemGetAllocationPropertiesFromHandle(&got, h));
    check(memcmp(&got, &prop, sizeof got) == 0, "cuMemGetAllocationPropertiesFromHandle returns the prop");
    prop.location.id = 9;
    CU(CUDA_ERROR_INVALID_DEVICE, cuMemCreate(&h2, 2 * MiB, &prop, 0));
    prop.location.id = 1;
    prop.type = CU_MEM_ALLOCATION_TYPE_INVALID;
    CU(CUDA_ERROR_INVALID_VALUE, cuMemCreate(&h2, 2 * MiB, &prop, 0));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    CU(CUDA_ERROR_OUT_OF_MEMORY, cuMemCreate(&h2, DEV1_TOTAL, &prop, 0));

    CU(CUDA_SUCCESS, cuMemAddressReserve(&va, 8 * MiB, 0, 0, 0));
    CU(CUDA_ERROR_INVALID_VALUE, cuMemAddressReserve(&b, 3 * MiB, 0, 0, 0));
    EQ(u1 + 4 * MiB, used1(), "reserving addresses costs no memory");
    CU(CUDA_SUCCESS, cuMemMap(va, 4 * MiB, 0, h, 0));
    CU(CUDA_ERROR_INVALID_VALUE, cuMemMap(va, 4 * MiB, 0, h, 0));
    CU(CUDA_ERROR_INVALID_VALUE, cuMemMap(va + 4 * MiB, 8 * MiB, 0, h, 0));
    CU(CUDA_ERROR_INVALID_VALUE, cuMemMap(va + 4 * MiB, 4 * MiB, GRAN, h, 0));

    CUmemAccessDesc ad = {{CU_MEM_LOCATION_TYPE_DEVICE, 1}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CU(CUDA_SUCCESS, cuMemSetAccess(va, 4 * MiB, &ad, 1));
    CU(CUDA_ERROR_INVALID_VALUE, cuMemSetAccess(va, 8 * MiB, &ad, 1));
    CU(CUDA_ERROR_INVALID_VALUE, cuMemSetAccess(va, 4 * MiB, &ad, 0));
    CU(CUDA_SUCCESS, cuMemGetAddressRange_v2(&b, &s, va + 100));
    check(b == va && s == 4 * MiB, "cuMemGetAddressRange_v2 of a mapping: size %zu", s);

    CU(CUDA_SUCCESS, cuMemRelease(h));
    EQ(u1 + 4 * MiB, used1(), "released but mapped memory stays allocated");
    CU(CUDA_ERROR_INVALID_VALUE, cuMemRelease(h));
    CU(CUDA_ERROR_INVALID_VALUE, cuMemAddressFree(va, 8 * MiB));
    CU(CUDA_ERROR_INVALID_VALUE, cuMemUnmap(va, 2 * MiB)); /* would split the mapping */
    CU(CUDA_SUCCESS, cuMemUnmap(va, 4 * MiB));
    EQ(u1, used1(), "the last unmap of a released handle frees it");
    CU(CUDA_ERROR_INVALID_VALUE, cuMemUnmap(va, 4 * MiB));
    CU(CUDA_SUCCESS, cuMemAddressFree(va, 8 * MiB));
    CU(CUDA_ERROR_INVALID_VALUE, cuMemAddressFree(va, 8 * MiB));

    CU(CUDA_SUCCESS, cuMemCreate(&h2, 2 * MiB, &prop, 0));
    CU(CUDA_SUCCESS, cuMemRelease(h2));
    EQ(u1, used1(), "an unmapped handle is freed by cuMemRelease");

    pthread_t th;
    pthread_create(&th, NULL, vmm_thread, NULL);
    pthread_join(th, NULL);
}

/* ---------------- pools ---------------- */

static void test_pools(void)
{
    CUmemoryPool dp = NULL, cp = NULL, mp = NULL;
    CUdeviceptr a = 0, b = 0, c = 0, x = 0;
    CUmemPoolProps pp;
    unsigned long long u0 = used0(), u1;

    EQ(88, sizeof(CUmemPoolProps), "sizeof(CUmemPoolProps)");
    CU(CUDA_SUCCESS, cuDeviceGetDefaultMemPool(&dp, 0));
    CU(CUDA_SUCCESS, cuDeviceGetMemPool(&cp, 0));
    check(dp && dp == cp, "device 0's current pool is its default pool");
    CU(CUDA_ERROR_INVALID_DEVICE, cuDeviceGetDefaultMemPool(&cp, 7));

    CU(CUDA_SUCCESS, cuMemAllocAsync(&a, 10 * MiB, NULL));
    EQ(u0 + 10 * MiB, used0(), "cuMemAllocAsync grows the pool");
    CU(CUDA_SUCCESS, cuMemFreeAsync(a, NULL));
    EQ(u0 + 10 * MiB, used0(), "cuMemFreeAsync keeps the memory in the pool");
    CU(CUDA_SUCCESS, cuMemAllocAsync(&a, 4 * MiB, NULL));
    EQ(u0 + 10 * MiB, used0(), "a smaller allocation reuses the pool");
    CU(CUDA_SUCCESS, cuMemAllocAsync_ptsz(&b, 8 * MiB, CU_STREAM_PER_THREAD));
    EQ(u0 + 12 * MiB, used0(), "the pool grows by the shortfall only");
    CU(CUDA_SUCCESS, cuMemFree_v2(b)); /* cuMemFree takes pool memory too */
    CU(CUDA_SUCCESS, cuMemFreeAsync_ptsz(a, CU_STREAM_LEGACY));
    EQ(u0 + 12 * MiB, used0(), "freed pool memory stays reserved");
    CU(CUDA_ERROR_INVALID_VALUE, cuMemFreeAsync(a, NULL));
    CU(CUDA_SUCCESS, cuMemPoolTrimTo(dp, 0));
    EQ(u0, used0(), "cuMemPoolTrimTo(0) releases the reserve");
    CU(CUDA_ERROR_INVALID_HANDLE, cuMemAllocAsync(&a, MiB, (CUstream)0x1234));
    CU(CUDA_SUCCESS, cuMemAlloc_v2(&x, MiB));
    CU(CUDA_ERROR_INVALID_VALUE, cuMemFreeAsync(x, NULL));
    CU(CUDA_SUCCESS, cuMemFree_v2(x));
    CU(CUDA_ERROR_INVALID_VALUE, cuMemPoolDestroy(dp));

    memset(&pp, 0, sizeof pp);
    pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    pp.location.id = 1;
    CU(CUDA_SUCCESS, cuMemPoolCreate(&mp, &pp));
    u1 = used1();
    CU(CUDA_SUCCESS, cuMemAllocFromPoolAsync(&c, 6 * MiB, mp, NULL));
    EQ(u1 + 6 * MiB, used1(), "cuMemAllocFromPoolAsync charges the pool's device");
    EQ(u0, used0(), "... and not the stream's device");
    CU(CUDA_SUCCESS, cuMemFreeAsync(c, NULL));
    CU(CUDA_SUCCESS, cuMemPoolTrimTo(mp, 3 * MiB));
    EQ(u1 + 4 * MiB, used1(), "cuMemPoolTrimTo(3 MiB) keeps 4 MiB (granule)");
    CU(CUDA_SUCCESS, cuMemAllocFromPoolAsync_ptsz(&c, 2 * MiB, mp, NULL));
    EQ(u1 + 4 * MiB, used1(), "allocation within the reserve costs nothing");
    CU(CUDA_SUCCESS, cuMemPoolDestroy(mp));
    EQ(u1 + 2 * MiB, used1(), "cuMemPoolDestroy frees the unused reserve at once");
    CU(CUDA_SUCCESS, cuMemFreeAsync(c, NULL));
    EQ(u1, used1(), "... and the rest when its last allocation is freed");
    CU(CUDA_ERROR_INVALID_VALUE, cuMemAllocFromPoolAsync(&c, 2 * MiB, mp, NULL));
    CU(CUDA_ERROR_INVALID_VALUE, cuMemPoolTrimTo(mp, 0));

    pp.maxSize = 4 * MiB;
    CU(CUDA_SUCCESS, cuMemPoolCreate(&mp, &pp));
    CU(CUDA_ERROR_OUT_OF_MEMORY, cuMemAllocFromPoolAsync(&c, 6 * MiB, mp, NULL));
    CU(CUDA_SUCCESS, cuMemAllocFromPoolAsync(&c, 4 * MiB, mp, NULL));
    CU(CUDA_SUCCESS, cuMemFree_v2(c));
    CU(CUDA_SUCCESS, cuMemPoolDestroy(mp));
    EQ(u1, used1(), "bounded pool gone");
    pp.location.id = 5;
    CU(CUDA_ERROR_INVALID_DEVICE, cuMemPoolCreate(&mp, &pp));
    pp.location.id = 0;
    pp.allocType = CU_MEM_ALLOCATION_TYPE_INVALID;
    CU(CUDA_ERROR_INVALID_VALUE, cuMemPoolCreate(&mp, &pp));
}

/* ---------------- arrays ---------------- */

static void test_arrays(void)
{
    CUarray arr = NULL, arr2 = NULL;
    CUmipmappedArray mm = NULL;
    unsigned long long u0 = used0();

    EQ(24, sizeof(CUDA_ARRAY_DESCRIPTOR), "sizeof(CUDA_ARRAY_DESCRIPTOR)");
    EQ(40, sizeof(CUDA_ARRAY3D_DESCRIPTOR), "sizeof(CUDA_ARRAY3D_DESCRIPTOR)");
    EQ(16, sizeof(CUDA_ARRAY_DESCRIPTOR_v1), "sizeof(CUDA_ARRAY_DESCRIPTOR_v1)");
    EQ(24, sizeof(CUDA_ARRAY3D_DESCRIPTOR_v1), "sizeof(CUDA_ARRAY3D_DESCRIPTOR_v1)");

    CUDA_ARRAY_DESCRIPTOR d = {1024, 1024, CU_AD_FORMAT_FLOAT, 4};
    CU(CUDA_SUCCESS, cuArrayCreate_v2(&arr, &d));
    EQ(u0 + 16 * MiB, used0(), "1024x1024 float4 array = 16 MiB");
    CU(CUDA_SUCCESS, cuArrayDestroy(arr));
    EQ(u0, used0(), "cuArrayDestroy frees it");
    CU(CUDA_ERROR_INVALID_HANDLE, cuArrayDestroy(arr));
    d.Format = (CUarray_format)0x77;
    CU(CUDA_ERROR_INVALID_VALUE, cuArrayCreate_v2(&arr, &d));
    d.Format = CU_AD_FORMAT_UNSIGNED_INT8;
    d.NumChannels = 3;
    CU(CUDA_ERROR_INVALID_VALUE, cuArrayCreate_v2(&arr, &d));

    CUDA_ARRAY3D_DESCRIPTOR d3 = {256, 256, 16, CU_AD_FORMAT_UNSIGNED_INT8, 1, 0};
    CU(CUDA_SUCCESS, cuArray3DCreate_v2(&arr, &d3));
    EQ(u0 + GRAN, used0(), "256x256x16 uint8 (1 MiB) charged a granule");
    CUDA_ARRAY_DESCRIPTOR_v1 d1 = {1024, 2048, CU_AD_FORMAT_HALF, 2};
    CU(CUDA_SUCCESS, cuArrayCreate(&arr2, &d1));
    EQ(u0 + GRAN + 8 * MiB, used0(), "cuArrayCreate (v1) 1024x2048 half2 = 8 MiB");
    CU(CUDA_SUCCESS, cuArrayDestroy(arr2));
    CUDA_ARRAY3D_DESCRIPTOR_v1 d31 = {64, 64, 64, CU_AD_FORMAT_SIGNED_INT32, 4, 0};
    CU(CUDA_SUCCESS, cuArray3DCreate(&arr2, &d31));
    EQ(u0 + GRAN + 4 * MiB, used0(), "cuArray3DCreate (v1) 64^3 int4 = 4 MiB");
    CU(CUDA_SUCCESS, cuArrayDestroy(arr2));
    CU(CUDA_SUCCESS, cuArrayDestroy(arr));

    CUDA_ARRAY3D_DESCRIPTOR dm = {1024, 1024, 0, CU_AD_FORMAT_FLOAT, 1, 0};
    CU(CUDA_SUCCESS, cuMipmappedArrayCreate(&mm, &dm, 3));
    EQ(u0 + 6 * MiB, used0(), "3-level 1024^2 float mipmap (5.25 MiB) charged 6 MiB");
    CU(CUDA_ERROR_INVALID_VALUE, cuMipmappedArrayCreate(&mm, &dm, 12));
    CU(CUDA_ERROR_INVALID_VALUE, cuMipmappedArrayCreate(&mm, &dm, 0));
    CU(CUDA_SUCCESS, cuMipmappedArrayDestroy(mm));
    CU(CUDA_ERROR_INVALID_HANDLE, cuMipmappedArrayDestroy(mm));
    EQ(u0, used0(), "arrays all freed");
}

/* ---------------- contexts ---------------- */

static void test_contexts(void)
{
    CUcontext c = NULL, c3 = NULL, c4 = NULL, cur = NULL, popped = NULL;
    CUdevice d = -1;
    CUdeviceptr p = 0, big = 0;
    CUmodule m;
    unsigned long long u0 = used0(), u1 = used1();
    unsigned fl;
    int act;

    EQ(24, sizeof(CUctxCreateParams), "sizeof(CUctxCreateParams)");
    CU(CUDA_SUCCESS, cuCtxCreate_v2(&c, 0, 1));
    EQ(u1 + CTX, used1(), "cuCtxCreate_v2 costs FAKE_CTX_BYTES on its device");
    CU(CUDA_SUCCESS, cuCtxGetCurrent(&cur));
    check(cur == c, "a created context becomes current");
    CU(CUDA_SUCCESS, cuCtxGetDevice(&d));
    EQ(1, d, "cuCtxGetDevice in the new context");
    CU(CUDA_SUCCESS, cuMemAlloc_v2(&p, 10 * MiB));
    CU(CUDA_SUCCESS, cuModuleLoadData(&m, "image"));
    EQ(u1 + CTX + 10 * MiB, used1(), "allocation in the new context is on device 1");
    CU(CUDA_SUCCESS, cuCtxDestroy_v2(c));
    EQ(u1, used1(), "cuCtxDestroy_v2 frees the context and its allocations");
    CU(CUDA_SUCCESS, cuCtxGetCurrent(&cur));
    check(cur == g_pc0, "destroying the current context pops it");
    CU(CUDA_ERROR_INVALID_VALUE, cuMemFree_v2(p));
    CU(CUDA_ERROR_INVALID_CONTEXT, cuCtxDestroy_v2(c));
    CU(CUDA_ERROR_INVALID_CONTEXT, cuCtxSetCurrent(c));
    CU(CUDA_ERROR_INVALID_CONTEXT, cuCtxPushCurrent_v2(c));
    CU(CUDA_ERROR_INVALID_CONTEXT, cuCtxDestroy_v2(g_pc0));
    CU(CUDA_ERROR_INVALID_VALUE, cuCtxCreate_v2(&c, 0x100, 0));
    CU(CUDA_ERROR_INVALID_DEVICE, cuCtxCreate_v2(&c, 0, 2));

    CUexecAffinityParam ap;
    memset(&ap, 0, sizeof ap);
    ap.type = CU_EXEC_AFFINITY_TYPE_SM_COUNT;
    ap.param.smCount.val = 66;
    CU(CUDA_SUCCESS, cuCtxCreate_v3(&c3, &ap, 1, 0, 0));
    EQ(u0 + CTX, used0(), "cuCtxCreate_v3 costs FAKE_CTX_BYTES");
    CU(CUDA_SUCCESS, cuCtxPopCurrent_v2(&popped));
    check(popped == c3, "cuCtxPopCurrent_v2 returns the top context");
    CU(CUDA_SUCCESS, cuCtxGetCurrent(&cur));
    check(cur == g_pc0, "after the pop the primary context is current");
    CU(CUDA_SUCCESS, cuCtxPushCurrent_v2(c3));
    CU(CUDA_SUCCESS, cuCtxGetCurrent(&cur));
    check(cur == c3, "cuCtxPushCurrent_v2 makes it current");
    CU(CUDA_SUCCESS, cuCtxPopCurrent(NULL));
    CU(CUDA_SUCCESS, cuCtxPushCurrent(c3));
    CU(CUDA_SUCCESS, cuCtxDestroy(c3));
    EQ(u0, used0(), "cuCtxDestroy (v1) frees the context");
    CU(CUDA_ERROR_INVALID_VALUE, cuCtxCreate_v3(&c3, NULL, 1, 0, 0));

    CUctxCreateParams cp;
    memset(&cp, 0, sizeof cp);
    CU(CUDA_SUCCESS, cuCtxCreate_v4(&c4, &cp, 0, 1));
    EQ(u1 + CTX, used1(), "cuCtxCreate_v4 costs FAKE_CTX_BYTES");
    CU(CUDA_SUCCESS, cuCtxDestroy_v2(c4));
    CU(CUDA_SUCCESS, cuCtxCreate_v4(&c4, NULL, 0, 1));
    CU(CUDA_SUCCESS, cuCtxDestroy_v2(c4));
    CUctxCigParam cig = {CIG_DATA_TYPE_D3D12_COMMAND_QUEUE, NULL};
    cp.cigParams = &cig;
    CU(CUDA_ERROR_NOT_SUPPORTED, cuCtxCreate_v4(&c4, &cp, 0, 1));
    CU(CUDA_SUCCESS, cuCtxCreate(&c, CU_CTX_SCHED_BLOCKING_SYNC, 0));
    CU(CUDA_SUCCESS, cuCtxDestroy(c));
    EQ(u1, used1(), "device 1 back to the baseline");
    EQ(u0, used0(), "device 0 back to the baseline");

    /* Not enough room for another context. */
    CU(CUDA_SUCCESS, cuMemAlloc_v2(&big, DEV0_TOTAL - u0 - 100 * MiB));
    CU(CUDA_ERROR_OUT_OF_MEMORY, cuCtxCreate_v2(&c, 0, 0));
    EQ(DEV0_TOTAL - 100 * MiB, used0(), "a context that does not fit costs nothing");
    CU(CUDA_SUCCESS, cuCtxGetCurrent(&cur));
    check(cur == g_pc0, "a failed cuCtxCreate leaves the current context alone");
    CU(CUDA_SUCCESS, cuMemFree_v2(big));

    /* Primary context released to zero, and reset, free their allocations. */
    CUcontext pc1;
    CU(CUDA_SUCCESS, cuDevicePrimaryCtxRetain(&pc1, 1));
    CU(CUDA_SUCCESS, cuCtxPushCurrent_v2(pc1));
    CU(CUDA_SUCCESS, cuMemAlloc_v2(&p, 20 * MiB));
    CU(CUDA_SUCCESS, cuCtxPopCurrent_v2(NULL));
    EQ(u1 + CTX + 20 * MiB, used1(), "primary context 1 with an allocation");
    CU(CUDA_SUCCESS, cuDevicePrimaryCtxRelease_v2(1));
    EQ(u1, used1(), "releasing the last reference frees context and allocations");
    CU(CUDA_SUCCESS, cuDevicePrimaryCtxGetState(1, &fl, &act));
    EQ(0, act, "primary context 1 inactive");
    CU(CUDA_ERROR_INVALID_CONTEXT, cuDevicePrimaryCtxRelease(1));
    CU(CUDA_ERROR_INVALID_CONTEXT, cuCtxSetCurrent(pc1));
    CU(CUDA_SUCCESS, cuDevicePrimaryCtxRetain(&pc1, 1));
    CU(CUDA_SUCCESS, cuDevicePrimaryCtxRetain(&pc1, 1));
    CU(CUDA_SUCCESS, cuCtxPushCurrent_v2(pc1));
    CU(CUDA_SUCCESS, cuMemAlloc_v2(&p, 20 * MiB));
    CU(CUDA_SUCCESS, cuCtxPopCurrent_v2(NULL));
    CU(CUDA_SUCCESS, cuDevicePrimaryCtxReset_v2(1));
    EQ(u1, used1(), "cuDevicePrimaryCtxReset_v2 frees everything despite 2 references");
    CU(CUDA_SUCCESS, cuDevicePrimaryCtxGetState(1, &fl, &act));
    EQ(0, act, "primary context 1 inactive after reset");
    CU(CUDA_SUCCESS, cuDevicePrimaryCtxRetain(&pc1, 1));
    CU(CUDA_SUCCESS, cuDevicePrimaryCtxReset(1));
    EQ(u1, used1(), "cuDevicePrimaryCtxReset (v1)");

    CU(CUDA_SUCCESS, cuCtxSetCurrent(NULL));
    CU(CUDA_SUCCESS, cuCtxGetCurrent(&cur));
    check(cur == NULL, "cuCtxSetCurrent(NULL) unbinds");
    CU(CUDA_ERROR_INVALID_CONTEXT, cuCtxSynchronize());
    CU(CUDA_SUCCESS, cuCtxSetCurrent(g_pc0));
}

/* ---------------- modules and launches ---------------- */

static void test_launches(void)
{
    CUmodule m2 = NULL;
    CUfunction f2 = NULL, f3 = NULL;
    unsigned long long b0, b1;
    uint64_t t0;

    CU(CUDA_SUCCESS, cuModuleLoadData(&g_mod, "fake image"));
    CU(CUDA_ERROR_INVALID_VALUE, cuModuleLoadData(&m2, NULL));
    CU(CUDA_ERROR_FILE_NOT_FOUND, cuModuleLoad(&m2, "/nonexistent/kernels.cubin"));
    CU(CUDA_SUCCESS, cuModuleLoad(&m2, "/proc/self/exe"));
    CU(CUDA_SUCCESS, cuModuleGetFunction(&g_fn, g_mod, "busy"));
    CU(CUDA_SUCCESS, cuModuleGetFunction(&f2, g_mod, "busy"));
    check(f2 == g_fn, "the same name gives the same function");
    CU(CUDA_SUCCESS, cuModuleGetFunction(&f3, m2, "other"));
    CU(CUDA_ERROR_INVALID_HANDLE, cuModuleGetFunction(&f2, (CUmodule)&b0, "x"));

    EQ(56, sizeof(CUlaunchConfig), "sizeof(CUlaunchConfig)");
    EQ(32, offsetof(CUlaunchConfig, hStream), "offsetof(CUlaunchConfig, hStream)");
    EQ(72, sizeof(CUlaunchAttribute), "sizeof(CUlaunchAttribute)");

    /* Timed from before the launch: the kernel cannot end sooner than 10 ms later. */
    b0 = fakeGpuBusyNs(0);
    t0 = now_ns();
    CU(CUDA_SUCCESS, cuLaunchKernel(g_fn, 1000, 10, 1, 256, 1, 1, 0, NULL, NULL, NULL));
    EQ(b0 + 10000 * 1000ULL, fakeGpuBusyNs(0), "10000 blocks busy 10 ms (FAKE_NS_PER_BLOCK=1000)");
    CU(CUDA_SUCCESS, cuCtxSynchronize());
    double ms = ms_since(t0);
    check(ms >= 10.0 && ms < 2000.0, "cuCtxSynchronize waited for the kernel: %.1f ms", ms);
    t0 = now_ns();
    CU(CUDA_SUCCESS, cuCtxSynchronize());
    ms = ms_since(t0);
    check(ms < 50.0, "cuCtxSynchronize on an idle context returns at once (%.2f ms)", ms);

    CU(CUDA_ERROR_INVALID_VALUE, cuLaunchKernel(g_fn, 0, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
    CU(CUDA_ERROR_INVALID_VALUE, cuLaunchKernel(g_fn, 1, 1, 1, 2048, 1, 1, 0, NULL, NULL, NULL));
    CU(CUDA_ERROR_INVALID_HANDLE, cuLaunchKernel(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
    CU(CUDA_ERROR_INVALID_HANDLE, cuLaunchKernel((CUfunction)&b0, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));

    b0 = fakeGpuBusyNs(0);
    CU(CUDA_SUCCESS, cuLaunchKernel_ptsz(g_fn, 5, 1, 1, 32, 1, 1, 0, CU_STREAM_PER_THREAD, NULL, NULL));
    EQ(b0 + 5000, fakeGpuBusyNs(0), "cuLaunchKernel_ptsz busy");
    CUlaunchConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDimX = 7;
    cfg.gridDimY = 2;
    cfg.gridDimZ = 3;
    cfg.blockDimX = 128;
    cfg.blockDimY = 1;
    cfg.blockDimZ = 1;
    b0 = fakeGpuBusyNs(0);
    CU(CUDA_SUCCESS, cuLaunchKernelEx(&cfg, g_fn, NULL, NULL));
    EQ(b0 + 42000, fakeGpuBusyNs(0), "cuLaunchKernelEx 7x2x3 blocks");
    CUlaunchAttribute attr;
    memset(&attr, 0, sizeof attr);
    attr.id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    attr.value.cooperative = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    CU(CUDA_SUCCESS, cuLaunchKernelEx_ptsz(&cfg, g_fn, NULL, NULL));
    EQ(b0 + 84000, fakeGpuBusyNs(0), "cuLaunchKernelEx_ptsz with an attribute");
    cfg.attrs = NULL;
    CU(CUDA_ERROR_INVALID_VALUE, cuLaunchKernelEx(&cfg, g_fn, NULL, NULL));
    CU(CUDA_ERROR_INVALID_VALUE, cuLaunchKernelEx(NULL, g_fn, NULL, NULL));
    b0 = fakeGpuBusyNs(0);
    CU(CUDA_SUCCESS, cuLaunchCooperativeKernel(g_fn, 132, 1, 1, 256, 1, 1, 0, NULL, NULL));
    CU(CUDA_SUCCESS, cuLaunchCooperativeKernel_ptsz(g_fn, 132, 1, 1, 256, 1, 1, 0, NULL, NULL));
    EQ(b0 + 264000, fakeGpuBusyNs(0), "cuLaunchCooperativeKernel(_ptsz) busy");
    CU(CUDA_SUCCESS, cuLaunchKernel(f3, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
    CU(CUDA_SUCCESS, cuModuleUnload(m2));
    CU(CUDA_ERROR_INVALID_HANDLE, cuModuleUnload(m2));
    CU(CUDA_ERROR_INVALID_HANDLE, cuLaunchKernel(f3, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));

    /* A launch in a device-1 context runs on device 1; device 0's function
     * does not belong to that context. */
    CUcontext c1;
    CUmodule m1;
    CUfunction fn1;
    b0 = fakeGpuBusyNs(0);
    b1 = fakeGpuBusyNs(1);
    CU(CUDA_SUCCESS, cuCtxCreate_v2(&c1, 0, 1));
    CU(CUDA_ERROR_INVALID_HANDLE, cuLaunchKernel(g_fn, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
    CU(CUDA_SUCCESS, cuModuleLoadData(&m1, "img"));
    CU(CUDA_SUCCESS, cuModuleGetFunction(&fn1, m1, "k"));
    CU(CUDA_SUCCESS, blocks(fn1, 3000, NULL));
    EQ(b1 + 3000000, fakeGpuBusyNs(1), "a device-1 launch is busy on device 1");
    EQ(b0, fakeGpuBusyNs(0), "... and not on device 0");
    CU(CUDA_SUCCESS, cuCtxDestroy_v2(c1));
    CU(CUDA_SUCCESS, cuCtxSynchronize());
}

static void test_streams_graphs(void)
{
    CUstream s = NULL, s2 = NULL;
    CUgraph g = NULL;
    CUgraphExec ge = NULL;
    unsigned long long b0;

    CU(CUDA_SUCCESS, cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CU(CUDA_ERROR_INVALID_VALUE, cuStreamCreate(&s2, 4));
    uint64_t t0 = now_ns();
    CU(CUDA_SUCCESS, blocks(g_fn, 20000, s));
    CU(CUDA_SUCCESS, cuStreamSynchronize(s));
    double ms = ms_since(t0);
    check(ms >= 20.0 && ms < 2000.0, "cuStreamSynchronize waited for a 20 ms kernel: %.1f ms", ms);
    CU(CUDA_SUCCESS, cuStreamSynchronize_ptsz(NULL));
    CU(CUDA_SUCCESS, cuStreamSynchronize(CU_STREAM_LEGACY));
    CU(CUDA_SUCCESS, cuStreamDestroy_v2(s));
    CU(CUDA_ERROR_INVALID_HANDLE, cuStreamSynchronize(s));
    CU(CUDA_ERROR_INVALID_HANDLE, cuStreamDestroy_v2(s));
    CU(CUDA_ERROR_INVALID_HANDLE, blocks(g_fn, 1, s));
    CU(CUDA_SUCCESS, cuStreamCreate(&s2, 0));
    CU(CUDA_SUCCESS, cuStreamDestroy(s2));

    CU(CUDA_SUCCESS, cuGraphCreate(&g, 0));
    CU(CUDA_SUCCESS, cuGraphInstantiateWithFlags(&ge, g, 0));
    b0 = fakeGpuBusyNs(0);
    CU(CUDA_SUCCESS, cuGraphLaunch(ge, NULL));
    EQ(b0 + 1000 * 1000ULL, fakeGpuBusyNs(0), "cuGraphLaunch costs FAKE_GRAPH_BLOCKS (1000) blocks");
    CU(CUDA_SUCCESS, cuGraphLaunch_ptsz(ge, CU_STREAM_PER_THREAD));
    EQ(b0 + 2000 * 1000ULL, fakeGpuBusyNs(0), "cuGraphLaunch_ptsz");
    CU(CUDA_ERROR_INVALID_VALUE, cuGraphLaunch((CUgraphExec)g, NULL));
    CU(CUDA_SUCCESS, cuGraphExecDestroy(ge));
    CU(CUDA_ERROR_INVALID_VALUE, cuGraphLaunch(ge, NULL));
    CU(CUDA_SUCCESS, cuGraphDestroy(g));
    CU(CUDA_ERROR_INVALID_VALUE, cuGraphInstantiateWithFlags(&ge, g, 0));
    CU(CUDA_SUCCESS, cuCtxSynchronize());
}

/* Graphs with nodes: a launch runs every kernel node's blocks, child graphs' and a conditional
 * node's first body's included. */
static void test_graph_nodes(void)
{
    CUgraph g, child, grand, other;
    CUgraphNode n[4], got[8];
    CUgraphExec ge;
    CUDA_KERNEL_NODE_PARAMS_v2 kp;
    memset(&kp, 0, sizeof kp);
    kp.func = g_fn;
    kp.blockDimX = kp.blockDimY = kp.blockDimZ = 1;
    kp.gridDimX = 7, kp.gridDimY = 3, kp.gridDimZ = 2;

    CU(CUDA_SUCCESS, cuGraphCreate(&grand, 0));
    CU(CUDA_SUCCESS, cuGraphAddKernelNode_v2(&n[0], grand, NULL, 0, &kp));       /* 42 */
    CU(CUDA_SUCCESS, cuGraphCreate(&child, 0));
    CU(CUDA_SUCCESS, cuGraphAddChildGraphNode(&n[0], child, NULL, 0, grand));
    CU(CUDA_SUCCESS, cuGraphAddEmptyNode(&n[1], child, &n[0], 1));
    CU(CUDA_SUCCESS, cuGraphCreate(&g, 0));
    CUDA_KERNEL_NODE_PARAMS_v1 k1;
    memcpy(&k1, &kp, sizeof k1);
    k1.gridDimX = 100, k1.gridDimY = 1, k1.gridDimZ = 1;
    CU(CUDA_SUCCESS, cuGraphAddKernelNode(&n[0], g, NULL, 0, &k1));              /* 100 */
    CU(CUDA_SUCCESS, cuGraphAddChildGraphNode(&n[1], g, &n[0], 1, child));       /* 42 */
    CU(CUDA_ERROR_INVALID_VALUE, cuGraphAddChildGraphNode(&n[2], g, NULL, 0, g));
    size_t num = 0;
    CU(CUDA_SUCCESS, cuGraphGetNodes(g, NULL, &num));
    EQ(2, num, "cuGraphGetNodes counts the nodes");
    num = 8;
    CU(CUDA_SUCCESS, cuGraphGetNodes(g, got, &num));
    check(num == 2 && got[0] == n[0] && got[1] == n[1] && got[2] == NULL,
          "cuGraphGetNodes lists them in order and clears the rest");
    CUgraphNodeType t;
    CU(CUDA_SUCCESS, cuGraphNodeGetType(n[1], &t));
    EQ(CU_GRAPH_NODE_TYPE_GRAPH, t, "a child-graph node's type");
    CUDA_KERNEL_NODE_PARAMS_v2 back;
    CU(CUDA_SUCCESS, cuGraphKernelNodeGetParams_v2(n[0], &back));
    EQ(100, back.gridDimX, "cuGraphKernelNodeGetParams_v2 reads the grid back");
    CU(CUDA_ERROR_INVALID_VALUE, cuGraphKernelNodeGetParams(n[1], &k1));
    CUgraph inner;
    CU(CUDA_SUCCESS, cuGraphChildGraphNodeGetGraph(n[1], &inner));
    check(inner != child, "a child-graph node holds its own copy of the graph");
    CU(CUDA_ERROR_INVALID_VALUE, cuGraphDestroy(inner));

    CUgraphConditionalHandle h;
    CUcontext ctx;
    CU(CUDA_SUCCESS, cuCtxGetCurrent(&ctx));
    CU(CUDA_SUCCESS, cuGraphConditionalHandleCreate(&h, g, ctx, 1, 0));
    CUgraphNodeParams np;
    memset(&np, 0, sizeof np);
    np.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
    np.conditional.handle = h;
    np.conditional.type = CU_GRAPH_COND_TYPE_IF;
    np.conditional.size = 2;
    np.conditional.ctx = ctx;
    CU(CUDA_SUCCESS, cuGraphAddNode(&n[2], g, NULL, 0, &np));
    kp.gridDimX = 5, kp.gridDimY = 5, kp.gridDimZ = 1;
    CU(CUDA_SUCCESS, cuGraphAddKernelNode_v2(&n[3], np.conditional.phGraph_out[0], NULL, 0, &kp)); /* 25 */
    kp.gridDimX = 1000;
    CU(CUDA_SUCCESS, cuGraphAddKernelNode_v2(&n[3], np.conditional.phGraph_out[1], NULL, 0, &kp));
    CUgraphNodeParams rp;
    CU(CUDA_ERROR_NOT_SUPPORTED, cuGraphNodeGetParams(n[2], &rp)); /* before CUDA 13.2 */
    CU(CUDA_ERROR_NOT_SUPPORTED, cuGraphAddChildGraphNode(&n[3], child, NULL, 0, g));

    CU(CUDA_ERROR_NOT_SUPPORTED, cuGraphInstantiate(&ge, g, NULL, NULL, 0));
    CU(CUDA_ERROR_NOT_SUPPORTED, cuGraphInstantiate_v2(&ge, g, NULL, NULL, 0));
    CU(CUDA_SUCCESS, cuGraphInstantiateWithFlags(&ge, g, 0));
    unsigned long long b0 = fakeGpuBusyNs(0);
    CU(CUDA_SUCCESS, cuGraphLaunch(ge, NULL));
    EQ(b0 + (100 + 42 + 25) * 1000ULL, fakeGpuBusyNs(0),
       "a graph launch runs its kernels, its child graphs' and a conditional's first body");

    /* An update takes another graph's grids if its top level has the same node types. */
    CU(CUDA_SUCCESS, cuGraphCreate(&other, 0));
    CUgraphExecUpdateResultInfo info;
    CU(CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, cuGraphExecUpdate_v2(ge, other, &info));
    EQ(CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED, info.result, "an update to another topology fails");
    kp.gridDimX = 9, kp.gridDimY = 1;
    CU(CUDA_SUCCESS, cuGraphAddKernelNode_v2(&n[0], other, NULL, 0, &kp));
    CU(CUDA_SUCCESS, cuGraphAddChildGraphNode(&n[1], other, NULL, 0, grand));
    CU(CUDA_SUCCESS, cuGraphAddEmptyNode(&n[2], other, NULL, 0));
    CUgraphExecUpdateResult res;
    CU(CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, cuGraphExecUpdate(ge, other, NULL, &res));
    CU(CUDA_SUCCESS, cuGraphDestroy(other));
    CU(CUDA_SUCCESS, cuGraphCreate(&other, 0));
    CU(CUDA_SUCCESS, cuGraphAddKernelNode_v2(&n[0], other, NULL, 0, &kp));      /* 9 */
    CU(CUDA_SUCCESS, cuGraphAddChildGraphNode(&n[1], other, NULL, 0, grand));   /* 42 */
    CU(CUDA_SUCCESS, cuGraphAddNode(&n[2], other, NULL, 0, &np));               /* empty body */
    CU(CUDA_SUCCESS, cuGraphExecUpdate(ge, other, NULL, &res));
    b0 = fakeGpuBusyNs(0);
    CU(CUDA_SUCCESS, cuGraphLaunch(ge, NULL));
    EQ(b0 + (9 + 42) * 1000ULL, fakeGpuBusyNs(0), "after cuGraphExecUpdate a launch runs the new grids");
    CU(CUDA_SUCCESS, cuGraphExecDestroy(ge));

    CUDA_GRAPH_INSTANTIATE_PARAMS ip;
    memset(&ip, 0, sizeof ip);
    CU(CUDA_SUCCESS, cuGraphInstantiateWithParams_ptsz(&ge, other, &ip));
    EQ(CUDA_GRAPH_INSTANTIATE_SUCCESS, ip.result_out, "cuGraphInstantiateWithParams_ptsz");
    CU(CUDA_SUCCESS, cuGraphExecDestroy(ge));
    CU(CUDA_SUCCESS, cuGraphDestroy(other));
    CU(CUDA_SUCCESS, cuGraphDestroy(g));
    CU(CUDA_SUCCESS, cuGraphDestroy(child));
    CU(CUDA_SUCCESS, cuGraphDestroy(grand));
    CU(CUDA_SUCCESS, cuCtxSynchronize());
}

/* ---------------- cuGetProcAddress ---------------- */

static void test_proc_address(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    void *pfn;
    CUdriverProcAddressQueryResult st;
    check(lib != NULL, "libcuda.so.1 is loaded (dlopen RTLD_NOLOAD)");
    if (!lib)
        return;

    static const struct {
        const char *name;
        int version;
        unsigned flags;
        const char *want;
    } cases[] = {
        {"cuMemAlloc", 3020, 0, "cuMemAlloc_v2"},
        {"cuMemAlloc", 12080, 0, "cuMemAlloc_v2"},
        {"cuMemAlloc", 3010, 0, "cuMemAlloc"},
        {"cuMemAlloc", 2000, 0, "cuMemAlloc"},
        {"cuMemGetInfo", 3020, 0, "cuMemGetInfo_v2"},
        {"cuMemGetInfo", 2000, 0, "cuMemGetInfo"},
        {"cuMemFree", 3020, 0, "cuMemFree_v2"},
        {"cuMemAllocPitch", 3020, 0, "cuMemAllocPitch_v2"},
        {"cuMemGetAddressRange", 3020, 0, "cuMemGetAddressRange_v2"},
        {"cuMemAllocHost", 3020, 0, "cuMemAllocHost_v2"},
        {"cuMemAllocHost", 3000, 0, "cuMemAllocHost"},
        {"cuDeviceTotalMem", 3020, 0, "cuDeviceTotalMem_v2"},
        {"cuDeviceTotalMem", 2000, 0, "cuDeviceTotalMem"},
        {"cuCtxCreate", 2000, 0, "cuCtxCreate"},
        {"cuCtxCreate", 3020, 0, "cuCtxCreate_v2"},
        {"cuCtxCreate", 11040, 0, "cuCtxCreate_v3"},
        {"cuCtxCreate", 12040, 0, "cuCtxCreate_v3"},
        {"cuCtxCreate", 12050, 0, "cuCtxCreate_v4"},
        {"cuCtxDestroy", 4000, 0, "cuCtxDestroy_v2"},
        {"cuCtxDestroy", 3020, 0, "cuCtxDestroy"},
        {"cuCtxPushCurrent", 4000, 0, "cuCtxPushCurrent_v2"},
        {"cuCtxPopCurrent", 4000, 0, "cuCtxPopCurrent_v2"},
        {"cuStreamDestroy", 4000, 0, "cuStreamDestroy_v2"},
        {"cuArrayCreate", 3020, 0, "cuArrayCreate_v2"},
        {"cuArray3DCreate", 3020, 0, "cuArray3DCreate_v2"},
        {"cuArray3DCreate", 2000, 0, "cuArray3DCreate"},
        {"cuDeviceGetUuid", 11040, 0, "cuDeviceGetUuid_v2"},
        {"cuDeviceGetUuid", 11030, 0, "cuDeviceGetUuid"},
        {"cuDevicePrimaryCtxRelease", 11000, 0, "cuDevicePrimaryCtxRelease_v2"},
        {"cuDevicePrimaryCtxRelease", 10020, 0, "cuDevicePrimaryCtxRelease"},
        {"cuDevicePrimaryCtxReset", 11000, 0, "cuDevicePrimaryCtxReset_v2"},
        {"cuDevicePrimaryCtxSetFlags", 11000, 0, "cuDevicePrimaryCtxSetFlags_v2"},
        {"cuDevicePrimaryCtxSetFlags", 7000, 0, "cuDevicePrimaryCtxSetFlags"},
        {"cuGetProcAddress", 11030, 0, "cuGetProcAddress"},
        {"cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2"},
        {"cuLaunchKernel", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuLaunchKernel_ptsz"},
        {"cuLaunchKernel", 12000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, "cuLaunchKernel"},
        {"cuLaunchKernel", 12000, CU_GET_PROC_ADDRESS_DEFAULT, "cuLaunchKernel"},
        {"cuLaunchKernel", 6050, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuLaunchKernel"},
        {"cuLaunchKernelEx", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuLaunchKernelEx_ptsz"},
        {"cuLaunchCooperativeKernel", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuLaunchCooperativeKernel_ptsz"},
        {"cuGraphLaunch", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuGraphLaunch_ptsz"},
        {"cuGraphLaunch", 12000, 0, "cuGraphLaunch"},
        {"cuGraphInstantiate", 10000, 0, "cuGraphInstantiate"},
        {"cuGraphInstantiate", 11040, 0, "cuGraphInstantiate_v2"},
        {"cuGraphInstantiateWithParams", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
         "cuGraphInstantiateWithParams_ptsz"},
        {"cuGraphExecUpdate", 11000, 0, "cuGraphExecUpdate"},
        {"cuGraphExecUpdate", 12000, 0, "cuGraphExecUpdate_v2"},
        {"cuGraphKernelNodeGetParams", 12000, 0, "cuGraphKernelNodeGetParams_v2"},
        {"cuGraphAddNode", 12030, 0, "cuGraphAddNode"},
        {"cuGraphAddNode", 13000, 0, "cuGraphAddNode_v2"},
        {"cuMemAllocAsync", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuMemAllocAsync_ptsz"},
        {"cuMemFreeAsync", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuMemFreeAsync_ptsz"},
        {"cuMemAllocFromPoolAsync", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuMemAllocFromPoolAsync_ptsz"},
        {"cuStreamSynchronize", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuStreamSynchronize_ptsz"},
        {"cuInit", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuInit"},
        {"cuMemAlloc", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuMemAlloc_v2"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        pfn = NULL;
        CUresult r = cuGetProcAddress(cases[i].name, &pfn, cases[i].version, cases[i].flags);
        void *want = dlsym(lib, cases[i].want);
        check(r == CUDA_SUCCESS && want && pfn == want, "cuGetProcAddress(%s, %d, flags %u) -> %s (rc %d)",
              cases[i].name, cases[i].version, cases[i].flags, cases[i].want, (int)r);
    }

    /* cuGraphInstantiate from 12.0: an entry point the library does not export. */
    pfn = NULL;
    CU(CUDA_SUCCESS, cuGetProcAddress("cuGraphInstantiate", &pfn, 12000, 0));
    check(pfn && pfn != dlsym(lib, "cuGraphInstantiate") &&
              pfn != dlsym(lib, "cuGraphInstantiateWithFlags"),
          "cuGetProcAddress(cuGraphInstantiate, 12000) is an unexported entry point");

    /* Every other entry point resolves to its own exported name at 12.8. */
    static const char *same[] = {
        "cuGetErrorString", "cuGetErrorName", "cuInit", "cuDriverGetVersion", "cuGetExportTable",
        "cuDeviceGet", "cuDeviceGetCount", "cuDeviceGetName", "cuDeviceGetAttribute",
        "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxGetState", "cuDeviceGetDefaultMemPool",
        "cuDeviceGetMemPool", "cuCtxGetCurrent", "cuCtxSetCurrent", "cuCtxGetDevice",
        "cuCtxSynchronize", "cuMemAllocManaged", "cuMemHostAlloc", "cuMemFreeHost", "cuMemCreate",
        "cuMemRelease", "cuMemAddressReserve", "cuMemAddressFree", "cuMemMap", "cuMemUnmap",
        "cuMemSetAccess", "cuMemGetAllocationGranularity", "cuMemGetAllocationPropertiesFromHandle",
        "cuMemAllocAsync", "cuMemFreeAsync", "cuMemAllocFromPoolAsync", "cuMemPoolCreate",
        "cuMemPoolDestroy", "cuMemPoolTrimTo", "cuArrayDestroy", "cuMipmappedArrayCreate",
        "cuMipmappedArrayDestroy", "cuModuleLoad", "cuModuleLoadData", "cuModuleGetFunction",
        "cuModuleUnload", "cuStreamCreate", "cuStreamSynchronize", "cuLaunchKernel",
        "cuLaunchKernelEx", "cuLaunchCooperativeKernel", "cuGraphCreate", "cuGraphDestroy",
        "cuGraphInstantiateWithFlags", "cuGraphExecDestroy",
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
        pfn = NULL;
        if (cuGetProcAddress(same[i], &pfn, 12080, 0) != CUDA_SUCCESS || pfn != dlsym(lib, same[i])) {
            check(0, "cuGetProcAddress(%s, 12080) resolves to %s", same[i], same[i]);
            bad++;
        }
    }
    check(bad == 0, "%zu more entry points resolve to their own names", sizeof same / sizeof same[0]);

    pfn = (void *)1;
    st = (CUdriverProcAddressQueryResult)9;
    CU(CUDA_SUCCESS, cuGetProcAddress_v2("cuMemAlloc", &pfn, 12000, 0, &st));
    check(st == CU_GET_PROC_ADDRESS_SUCCESS && pfn == dlsym(lib, "cuMemAlloc_v2"),
          "cuGetProcAddress_v2 status SUCCESS, cuMemAlloc_v2");
    CU(CUDA_ERROR_NOT_FOUND, cuGetProcAddress_v2("cuNoSuchFunction", &pfn, 12000, 0, &st));
    check(st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND && pfn == NULL, "unknown name: SYMBOL_NOT_FOUND, NULL");
    CU(CUDA_ERROR_NOT_FOUND, cuGetProcAddress_v2("cuMemAllocAsync", &pfn, 11000, 0, &st));
    check(st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT && pfn == NULL,
          "cuMemAllocAsync at 11.0: VERSION_NOT_SUFFICIENT");
    CU(CUDA_ERROR_NOT_FOUND, cuGetProcAddress("cuMemAlloc", &pfn, 1000, 0));
    CU(CUDA_ERROR_NOT_FOUND, cuGetProcAddress("cuMemAlloc_v2", &pfn, 12000, 0));
    CU(CUDA_ERROR_INVALID_VALUE, cuGetProcAddress("cuMemAlloc", &pfn, 12000, 4));
    CU(CUDA_ERROR_INVALID_VALUE, cuGetProcAddress("cuMemAlloc", &pfn, 12000, 3));
    CU(CUDA_ERROR_INVALID_VALUE, cuGetProcAddress(NULL, &pfn, 12000, 0));

    int v = 0;
    CU(CUDA_SUCCESS, cuGetProcAddress("cuDriverGetVersion", &pfn, 12000, 0));
    CU(CUDA_SUCCESS, ((CUresult(*)(int *))pfn)(&v));
    EQ(12080, v, "calling through the resolved pointer");
}

static void test_errors(void)
{
    const char *s = NULL;
    CU(CUDA_SUCCESS, cuGetErrorString(CUDA_ERROR_OUT_OF_MEMORY, &s));
    check(s && strcmp(s, "out of memory") == 0, "cuGetErrorString(2) = \"%s\"", s ? s : "(null)");
    CU(CUDA_SUCCESS, cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &s));
    check(s && strcmp(s, "CUDA_ERROR_OUT_OF_MEMORY") == 0, "cuGetErrorName(2) = %s", s ? s : "(null)");
    CU(CUDA_SUCCESS, cuGetErrorName(CUDA_ERROR_NOT_FOUND, &s));
    check(s && strcmp(s, "CUDA_ERROR_NOT_FOUND") == 0, "cuGetErrorName(500) = %s", s ? s : "(null)");
    CU(CUDA_ERROR_INVALID_VALUE, cuGetErrorString((CUresult)12345, &s));
    check(s == NULL, "unknown code: string NULL");
    CU(CUDA_ERROR_INVALID_VALUE, cuGetErrorName(CUDA_SUCCESS, NULL));
    const void *tbl = &s;
    CUuuid id;
    memset(&id, 0, sizeof id);
    CU(CUDA_ERROR_NOT_SUPPORTED, cuGetExportTable(&tbl, &id));
    check(tbl == NULL, "cuGetExportTable clears the table pointer");
}

/* ---------------- NVML ---------------- */

static nvmlDevice_t g_nd0, g_nd1;

static void test_nvml_basic(void)
{
    unsigned n = 0, idx = 9;
    nvmlDevice_t d = NULL;
    char buf[128];
    nvmlMemory_t m;
    nvmlMemory_v2_t m2;
    int v, ma, mi;

    NV(NVML_ERROR_UNINITIALIZED, nvmlDeviceGetCount_v2(&n));
    NV(NVML_ERROR_UNINITIALIZED, nvmlShutdown());
    NV(NVML_SUCCESS, nvmlInit_v2());
    NV(NVML_SUCCESS, nvmlDeviceGetCount_v2(&n));
    EQ(2, n, "nvmlDeviceGetCount_v2");
    NV(NVML_SUCCESS, nvmlDeviceGetCount(&n));
    EQ(2, n, "nvmlDeviceGetCount");
    NV(NVML_SUCCESS, nvmlDeviceGetHandleByIndex_v2(0, &g_nd0));
    NV(NVML_SUCCESS, nvmlDeviceGetHandleByIndex_v2(1, &g_nd1));
    NV(NVML_SUCCESS, nvmlDeviceGetHandleByIndex(1, &d));
    check(d == g_nd1 && g_nd0 != g_nd1, "handles: v1 and v2 agree, devices differ");
    NV(NVML_ERROR_INVALID_ARGUMENT, nvmlDeviceGetHandleByIndex_v2(2, &d));

    for (int i = 0; i < 2; i++) {
        CUuuid u;
        char cs[64];
        cuDeviceGetUuid(&u, i);
        uuid_str(&u, cs, sizeof cs);
        NV(NVML_SUCCESS, nvmlDeviceGetUUID(i ? g_nd1 : g_nd0, buf, sizeof buf));
        check(strcmp(buf, cs) == 0, "NVML UUID %s matches cuDeviceGetUuid of device %d", buf, i);
    }
    NV(NVML_ERROR_INSUFFICIENT_SIZE, nvmlDeviceGetUUID(g_nd1, buf, 10));
    NV(NVML_SUCCESS, nvmlDeviceGetUUID(g_nd1, buf, sizeof buf));
    NV(NVML_SUCCESS, nvmlDeviceGetHandleByUUID(buf, &d));
    check(d == g_nd1, "nvmlDeviceGetHandleByUUID");
    NV(NVML_ERROR_NOT_FOUND, nvmlDeviceGetHandleByUUID("GPU-nope", &d));
    NV(NVML_SUCCESS, nvmlDeviceGetHandleByPciBusId_v2("00000000:11:00.0", &d));
    check(d == g_nd1, "nvmlDeviceGetHandleByPciBusId_v2 00000000:11:00.0");
    NV(NVML_SUCCESS, nvmlDeviceGetHandleByPciBusId("0000:10:00.0", &d));
    check(d == g_nd0, "nvmlDeviceGetHandleByPciBusId 0000:10:00.0");
    NV(NVML_SUCCESS, nvmlDeviceGetHandleByPciBusId_v2("11:00.0", &d));
    check(d == g_nd1, "bus id without domain");
    NV(NVML_ERROR_NOT_FOUND, nvmlDeviceGetHandleByPciBusId_v2("00000000:99:00.0", &d));
    NV(NVML_ERROR_INVALID_ARGUMENT, nvmlDeviceGetHandleByPciBusId_v2("zz", &d));
    NV(NVML_SUCCESS, nvmlDeviceGetIndex(g_nd1, &idx));
    EQ(1, idx, "nvmlDeviceGetIndex");
    NV(NVML_ERROR_INVALID_ARGUMENT, nvmlDeviceGetIndex((nvmlDevice_t)&n, &idx));
    NV(NVML_SUCCESS, nvmlDeviceGetName(g_nd0, buf, sizeof buf));
    check(strcmp(buf, "Fake H200") == 0, "nvmlDeviceGetName \"%s\"", buf);
    NV(NVML_ERROR_INSUFFICIENT_SIZE, nvmlDeviceGetName(g_nd0, buf, 4));
    NV(NVML_SUCCESS, nvmlDeviceGetCudaComputeCapability(g_nd0, &ma, &mi));
    check(ma == 9 && mi == 0, "nvmlDeviceGetCudaComputeCapability %d.%d", ma, mi);
    NV(NVML_SUCCESS, nvmlSystemGetCudaDriverVersion_v2(&v));
    EQ(12080, v, "nvmlSystemGetCudaDriverVersion_v2");
    NV(NVML_SUCCESS, nvmlSystemGetCudaDriverVersion(&v));
    NV(NVML_SUCCESS, nvmlSystemGetDriverVersion(buf, sizeof buf));
    NV(NVML_ERROR_INSUFFICIENT_SIZE, nvmlSystemGetDriverVersion(buf, 3));
    check(strcmp(nvmlErrorString(NVML_ERROR_NOT_FOUND), "Not Found") == 0, "nvmlErrorString");

    NV(NVML_SUCCESS, nvmlDeviceGetMemoryInfo(g_nd0, &m));
    check(m.total == DEV0_TOTAL && m.used == used0() && m.free == m.total - m.used,
          "nvmlDeviceGetMemoryInfo: total %llu used %llu free %llu", m.total, m.used, m.free);
    NV(NVML_SUCCESS, nvmlDeviceGetMemoryInfo(g_nd1, &m));
    EQ(DEV1_TOTAL, m.total, "nvmlDeviceGetMemoryInfo total of device 1");
    EQ(40 | (2u << 24), nvmlMemory_v2, "nvmlMemory_v2 = sizeof | 2 << 24");
    memset(&m2, 0, sizeof m2);
    NV(NVML_ERROR_ARGUMENT_VERSION_MISMATCH, nvmlDeviceGetMemoryInfo_v2(g_nd0, &m2));
    m2.version = 40 | (1u << 24);
    NV(NVML_ERROR_ARGUMENT_VERSION_MISMATCH, nvmlDeviceGetMemoryInfo_v2(g_nd0, &m2));
    m2.version = nvmlMemory_v2;
    NV(NVML_SUCCESS, nvmlDeviceGetMemoryInfo_v2(g_nd0, &m2));
    check(m2.total == DEV0_TOTAL && m2.used == used0() && m2.free + m2.used + m2.reserved == m2.total,
          "nvmlDeviceGetMemoryInfo_v2: used %llu reserved %llu free %llu", m2.used, m2.reserved, m2.free);

    NV(NVML_SUCCESS, nvmlInitWithFlags(0));
    NV(NVML_SUCCESS, nvmlInit());
    NV(NVML_SUCCESS, nvmlShutdown());
    NV(NVML_SUCCESS, nvmlShutdown());
    NV(NVML_SUCCESS, nvmlDeviceGetCount_v2(&n)); /* still one reference */
}

static void test_nvml_procs(void)
{
    nvmlProcessInfo_t infos[16];
    nvmlProcessInfo_v2_t i2[16];
    nvmlProcessInfo_v1_t i1[16];
    unsigned cnt, me = (unsigned)getpid() + PID_OFFSET;
    CUdeviceptr p;

    EQ(16, sizeof(nvmlProcessInfo_v1_t), "sizeof(nvmlProcessInfo_v1_t)");
    EQ(24, sizeof(nvmlProcessInfo_t), "sizeof(nvmlProcessInfo_t)");
    CU(CUDA_SUCCESS, cuMemAlloc_v2(&p, 64 * MiB));
    unsigned long long want = mine(0);
    check(want == CTX + 64 * MiB, "process usage: context + 64 MiB (%llu)", want);

    cnt = 16;
    NV(NVML_SUCCESS, nvmlDeviceGetComputeRunningProcesses_v3(g_nd0, &cnt, infos));
    int found = 0, raw = 0;
    for (unsigned i = 0; i < cnt; i++) {
        if (infos[i].pid == me && infos[i].usedGpuMemory == want &&
            infos[i].gpuInstanceId == 0xFFFFFFFFu && infos[i].computeInstanceId == 0xFFFFFFFFu)
            found++;
        if (infos[i].pid == (unsigned)getpid())
            raw++;
    }
    check(found == 1 && raw == 0, "_v3 lists pid+FAKE_NVML_PID_OFFSET with our usage (found %d, raw %d, of %u)",
          found, raw, cnt);
    cnt = 16;
    NV(NVML_SUCCESS, nvmlDeviceGetComputeRunningProcesses_v2(g_nd0, &cnt, i2));
    found = 0;
    for (unsigned i = 0; i < cnt; i++)
        found += i2[i].pid == me && i2[i].usedGpuMemory == want;
    check(found == 1, "_v2 lists us");
    cnt = 16;
    NV(NVML_SUCCESS, nvmlDeviceGetComputeRunningProcesses(g_nd0, &cnt, i1));
    found = 0;
    for (unsigned i = 0; i < cnt; i++)
        found += i1[i].pid == me && i1[i].usedGpuMemory == want;
    check(found == 1, "v1 (16-byte entries) lists us");
    cnt = 0;
    NV(NVML_ERROR_INSUFFICIENT_SIZE, nvmlDeviceGetComputeRunningProcesses_v3(g_nd0, &cnt, NULL));
    check(cnt >= 1, "count query returns %u", cnt);
    cnt = 16;
    NV(NVML_SUCCESS, nvmlDeviceGetComputeRunningProcesses_v3(g_nd1, &cnt, infos));
    found = 0;
    for (unsigned i = 0; i < cnt; i++)
        found += infos[i].pid == me;
    check(found == (mine(1) > 0), "on device 1 we are listed iff we use it (%d)", found);
    CU(CUDA_SUCCESS, cuMemFree_v2(p));

    setenv("FAKE_NVML_FAIL", "procs", 1);
    NV(NVML_SUCCESS, nvmlInit_v2()); /* re-reads the environment */
    cnt = 16;
    NV(NVML_ERROR_UNKNOWN, nvmlDeviceGetComputeRunningProcesses_v3(g_nd0, &cnt, infos));
    setenv("FAKE_NVML_FAIL", "init", 1);
    NV(NVML_ERROR_DRIVER_NOT_LOADED, nvmlInit_v2());
    unsetenv("FAKE_NVML_FAIL");
    NV(NVML_SUCCESS, nvmlInit_v2());
    cnt = 16;
    NV(NVML_SUCCESS, nvmlDeviceGetComputeRunningProcesses_v3(g_nd0, &cnt, infos));
    NV(NVML_SUCCESS, nvmlShutdown());
    NV(NVML_SUCCESS, nvmlShutdown());
}

static void test_utilization(void)
{
    nvmlUtilization_t u;
    nvmlProcessUtilizationSample_t smp[16];
    unsigned cnt, me = (unsigned)getpid() + PID_OFFSET;

    EQ(32, sizeof(nvmlProcessUtilizationSample_t), "sizeof(nvmlProcessUtilizationSample_t)");
    usleep(1100 * 1000); /* let the last second go idle */
    NV(NVML_SUCCESS, nvmlDeviceGetUtilizationRates(g_nd0, &u));
    EQ(0, u.gpu, "idle device 0 reads 0% GPU");
    cnt = 16;
    NV(NVML_ERROR_NOT_FOUND, nvmlDeviceGetProcessUtilization(g_nd0, smp, &cnt, now_us_real() - 1000000));

    uint64_t ts = now_us_real();
    CU(CUDA_SUCCESS, blocks(g_fn, 80000, NULL)); /* 80 ms */
    CU(CUDA_SUCCESS, cuCtxSynchronize());
    uint64_t t_end = now_ns();
    NV(NVML_SUCCESS, nvmlDeviceGetUtilizationRates(g_nd0, &u));
    /* 80 ms busy ending just now; less if we were descheduled after the sync
     * (bucket edges cost up to ~5%). */
    int want = 75 - (int)ms_since(t_end);
    check((int)u.gpu >= (want > 0 ? want : 0) && u.gpu <= 100,
          "80 ms of kernels: %u%% over the last 100 ms (want %d..100)", u.gpu, want);
    NV(NVML_SUCCESS, nvmlDeviceGetUtilizationRates(g_nd1, &u));
    EQ(0, u.gpu, "device 1 stayed idle");

    cnt = 0;
    NV(NVML_ERROR_INSUFFICIENT_SIZE, nvmlDeviceGetProcessUtilization(g_nd0, NULL, &cnt, ts));
    check(cnt >= 1, "sample count query: %u", cnt);
    cnt = 16;
    NV(NVML_SUCCESS, nvmlDeviceGetProcessUtilization(g_nd0, smp, &cnt, ts));
    int found = 0;
    for (unsigned i = 0; i < cnt; i++)
        if (smp[i].pid == me) {
            found = 1;
            check(smp[i].smUtil >= 70, "our smUtil since the launch: %u%% (want >= 70)", smp[i].smUtil);
            check(smp[i].timeStamp >= ts && smp[i].timeStamp <= now_us_real(), "sample timestamp is recent");
        }
    check(found, "our pid+offset has a sample");
    cnt = 16;
    NV(NVML_SUCCESS, nvmlDeviceGetProcessUtilization(g_nd0, smp, &cnt, now_us_real() - 1000000));
    found = 0;
    for (unsigned i = 0; i < cnt; i++)
        if (smp[i].pid == me) {
            found = 1;
            check(smp[i].smUtil >= 6 && smp[i].smUtil <= 12,
                  "80 ms in the last second: smUtil %u%% (want 6..12)", smp[i].smUtil);
        }
    check(found, "sample over the last second");
    cnt = 16;
    NV(NVML_ERROR_NOT_FOUND, nvmlDeviceGetProcessUtilization(g_nd1, smp, &cnt, now_us_real() - 1000000));
    cnt = 16;
    NV(NVML_ERROR_NOT_FOUND, nvmlDeviceGetProcessUtilization(g_nd0, smp, &cnt, now_us_real() + 5000000));
}

/* ---------------- several processes ---------------- */

static int g_c2p[2], g_p2c[2];

static void child_signal(void)
{
    char c = 'r';
    if (write(g_c2p[1], &c, 1) != 1)
        exit(3);
}
static void child_wait(void)
{
    char c;
    if (read(g_p2c[0], &c, 1) != 1)
        exit(4);
}
static void parent_wait(void)
{
    char c;
    if (read(g_c2p[0], &c, 1) != 1)
        check(0, "child signalled");
}
static void parent_signal(void)
{
    char c = 'g';
    if (write(g_p2c[1], &c, 1) != 1)
        check(0, "signal child");
}

static pid_t spawn(void (*fn)(void), const char *name)
{
    fflush(stdout);
    pid_t p = fork();
    if (p == 0) {
        snprintf(g_who, sizeof g_who, "[%s] ", name);
        fn();
        fflush(stdout);
        exit(0);
    }
    return p;
}

static void reap(pid_t p, const char *name)
{
    int st = 0;
    waitpid(p, &st, 0);
    check(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child %s exited cleanly (status %d)", name, st);
}

static void child_holder(void)
{
    CUcontext c;
    CUdeviceptr p;
    CU(CUDA_ERROR_NOT_INITIALIZED, cuMemAlloc_v2(&p, 1)); /* a forked child starts afresh */
    CU(CUDA_SUCCESS, cuInit(0));
    CU(CUDA_SUCCESS, cuDevicePrimaryCtxRetain(&c, 0));
    CU(CUDA_SUCCESS, cuCtxSetCurrent(c));
    CU(CUDA_SUCCESS, cuMemAlloc_v2(&p, 100 * MiB));
    child_signal();
    child_wait();
}

static void child_killed(void)
{
    CUcontext c;
    CUdeviceptr p;
    cuInit(0);
    cuDevicePrimaryCtxRetain(&c, 0);
    cuCtxSetCurrent(c);
    cuMemAlloc_v2(&p, 50 * MiB);
    child_signal();
    for (;;)
        pause();
}

static void child_attach(void) { CU(CUDA_SUCCESS, cuInit(0)); }

static void child_long_kernel(void)
{
    CUcontext c;
    CUmodule m;
    CUfunction f;
    cuInit(0);
    cuDevicePrimaryCtxRetain(&c, 0);
    cuCtxSetCurrent(c);
    cuModuleLoadData(&m, "img");
    cuModuleGetFunction(&f, m, "long");
    CU(CUDA_SUCCESS, blocks(f, 100000, NULL)); /* 100 ms on device 0 */
    child_signal();
    child_wait();
}

static void child_filler(void)
{
    CUcontext c;
    CUdeviceptr p;
    size_t f, t;
    cuInit(0);
    CU(CUDA_SUCCESS, cuCtxCreate_v2(&c, 0, 1));
    CU(CUDA_SUCCESS, cuMemGetInfo_v2(&f, &t));
    CU(CUDA_SUCCESS, cuMemAlloc_v2(&p, f));
    child_signal();
    child_wait();
}

static void test_multiprocess(void)
{
    nvmlProcessInfo_t infos[16];
    unsigned cnt;
    size_t f0, f1, t;
    if (pipe(g_c2p) || pipe(g_p2c)) {
        check(0, "pipe");
        return;
    }

    /* A second process's memory is seen by this one, and goes at its exit. */
    unsigned long long u0 = used0();
    CU(CUDA_SUCCESS, cuMemGetInfo_v2(&f0, &t));
    pid_t c = spawn(child_holder, "holder");
    parent_wait();
    EQ(CTX + 100 * MiB, fakeGpuProcessUsed(0, c), "the other process's usage (context + 100 MiB)");
    EQ(u0 + CTX + 100 * MiB, used0(), "device usage includes the other process");
    CU(CUDA_SUCCESS, cuMemGetInfo_v2(&f1, &t));
    EQ(f0 - CTX - 100 * MiB, f1, "our cuMemGetInfo_v2 free shrank by the other's usage");
    cnt = 16;
    NV(NVML_SUCCESS, nvmlDeviceGetComputeRunningProcesses_v3(g_nd0, &cnt, infos));
    int found = 0;
    for (unsigned i = 0; i < cnt; i++)
        found += infos[i].pid == (unsigned)c + PID_OFFSET && infos[i].usedGpuMemory == CTX + 100 * MiB;
    check(found == 1, "NVML lists the other process (pid %d + offset)", (int)c);
    parent_signal();
    reap(c, "holder");
    EQ(u0, used0(), "the other process's exit gave its memory back");
    EQ(0, fakeGpuProcessUsed(0, c), "its entry is gone");

    /* SIGKILL: nothing runs at exit, but a real driver frees the memory as the process exits,
     * before its parent reaps it; the stand-in prunes zombies when its usage is read. */
    c = spawn(child_killed, "killed");
    parent_wait();
    EQ(u0 + CTX + 50 * MiB, used0(), "killed-to-be child holds context + 50 MiB");
    kill(c, SIGKILL);
    siginfo_t zombie;
    waitid(P_PID, (id_t)c, &zombie, WEXITED | WNOWAIT); /* dead, not yet reaped */
    EQ(u0, used0(), "a SIGKILLed process's memory is free while it is still a zombie");
    waitpid(c, NULL, 0);
    in_child("attach", child_attach);
    EQ(u0, used0(), "and stays free once it is reaped");

    /* The busy timeline is per device, shared by processes. */
    unsigned long long b0 = fakeGpuBusyNs(0);
    c = spawn(child_long_kernel, "kernel");
    parent_wait();
    uint64_t t0 = now_ns();
    CU(CUDA_SUCCESS, blocks(g_fn, 1, NULL));
    CU(CUDA_SUCCESS, cuCtxSynchronize());
    double ms = ms_since(t0);
    check(ms >= 50.0, "our 1-block kernel queued behind the other process's 100 ms kernel: %.1f ms", ms);
    EQ(b0 + 100000 * 1000ULL + 1000, fakeGpuBusyNs(0), "device busy time sums both processes");
    parent_signal();
    reap(c, "kernel");

    /* Out of memory because of another process. */
    CUcontext c1;
    CUdeviceptr p;
    CU(CUDA_SUCCESS, cuCtxCreate_v2(&c1, 0, 1));
    c = spawn(child_filler, "filler");
    parent_wait();
    EQ(DEV1_TOTAL, used1(), "the other process filled device 1");
    CU(CUDA_ERROR_OUT_OF_MEMORY, cuMemAlloc_v2(&p, 1));
    parent_signal();
    reap(c, "filler");
    CU(CUDA_SUCCESS, cuMemAlloc_v2(&p, 1));
    CU(CUDA_SUCCESS, cuMemFree_v2(p));
    CU(CUDA_SUCCESS, cuCtxDestroy_v2(c1));
    close(g_c2p[0]);
    close(g_c2p[1]);
    close(g_p2c[0]);
    close(g_p2c[1]);
}

/* ---------------- CUDA_VISIBLE_DEVICES ---------------- */

static void cvd_index(void)
{
    int n = 0, bus = 0;
    size_t t = 0;
    CUuuid u;
    CUdevice d;
    CUcontext c;
    unsigned nn = 0;
    setenv("CUDA_VISIBLE_DEVICES", "1", 1);
    CU(CUDA_SUCCESS, cuInit(0));
    CU(CUDA_SUCCESS, cuDeviceGetCount(&n));
    EQ(1, n, "CUDA_VISIBLE_DEVICES=1: one device");
    CU(CUDA_SUCCESS, cuDeviceTotalMem_v2(&t, 0));
    EQ(DEV1_TOTAL, t, "ordinal 0 is physical device 1 (4 GiB)");
    CU(CUDA_SUCCESS, cuDeviceGetUuid(&u, 0));
    EQ(1, (unsigned char)u.bytes[15], "ordinal 0 has device 1's UUID");
    CU(CUDA_SUCCESS, cuDeviceGetAttribute(&bus, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 0));
    EQ(0x11, bus, "ordinal 0 has device 1's PCI bus");
    CU(CUDA_ERROR_INVALID_DEVICE, cuDeviceGet(&d, 1));
    CU(CUDA_SUCCESS, cuDevicePrimaryCtxRetain(&c, 0));
    EQ(CTX, mine(1), "the context is charged to physical device 1");
    EQ(0, mine(0), "... not to physical device 0");
    NV(NVML_SUCCESS, nvmlInit_v2());
    NV(NVML_SUCCESS, nvmlDeviceGetCount_v2(&nn));
    EQ(2, nn, "NVML ignores CUDA_VISIBLE_DEVICES");
}

static void cvd_uuid(void)
{
    int n = 0;
    size_t t0 = 0, t1 = 0;
    setenv("CUDA_VISIBLE_DEVICES", "GPU-fa4e0000-0000-0000-0000-000000000001,0", 1);
    CU(CUDA_SUCCESS, cuInit(0));
    CU(CUDA_SUCCESS, cuDeviceGetCount(&n));
    EQ(2, n, "UUID list: two devices");
    cuDeviceTotalMem_v2(&t0, 0);
    cuDeviceTotalMem_v2(&t1, 1);
    check(t0 == DEV1_TOTAL && t1 == DEV0_TOTAL, "by UUID: ordinal 0 = physical 1, ordinal 1 = physical 0");
}

/* A prefix matching both UUIDs is ambiguous: the list ends before it. */
static void cvd_ambiguous(void)
{
    int n = 0;
    setenv("CUDA_VISIBLE_DEVICES", "GPU-fa4e", 1);
    CU(CUDA_ERROR_NO_DEVICE, cuInit(0));
    CU(CUDA_ERROR_NO_DEVICE, cuInit(0)); /* sticky, like the real driver */
    CU(CUDA_ERROR_NOT_INITIALIZED, cuDeviceGetCount(&n));
}

/* With one device the same prefix is unique, and selects it. */
static void cvd_unique_prefix(void)
{
    int n = 0;
    setenv("FAKE_CUDA_DEVICES", "1", 1);
    setenv("CUDA_VISIBLE_DEVICES", "GPU-fa4e", 1);
    CU(CUDA_SUCCESS, cuInit(0));
    CU(CUDA_SUCCESS, cuDeviceGetCount(&n));
    EQ(1, n, "a unique UUID prefix selects the device");
}

static void cvd_unknown_uuid(void)
{
    int n = 0;
    size_t t = 0;
    setenv("CUDA_VISIBLE_DEVICES", "1,GPU-deadbeef-0000-0000-0000-000000000000,0", 1);
    CU(CUDA_SUCCESS, cuInit(0));
    CU(CUDA_SUCCESS, cuDeviceGetCount(&n));
    EQ(1, n, "an unknown UUID ends the list");
    cuDeviceTotalMem_v2(&t, 0);
    EQ(DEV1_TOTAL, t, "... after physical device 1");
}

static void cvd_invalid_tail(void)
{
    int n = 0;
    setenv("CUDA_VISIBLE_DEVICES", " 1 ,7,0", 1);
    CU(CUDA_SUCCESS, cuInit(0));
    CU(CUDA_SUCCESS, cuDeviceGetCount(&n));
    EQ(1, n, "\" 1 ,7,0\": the invalid 7 ends the list");
}

static void cvd_duplicate(void)
{
    int n = 0;
    setenv("CUDA_VISIBLE_DEVICES", "0,0,1", 1);
    CU(CUDA_SUCCESS, cuInit(0));
    CU(CUDA_SUCCESS, cuDeviceGetCount(&n));
    EQ(1, n, "\"0,0,1\": the repeated 0 ends the list");
}

static void cvd_empty(void)
{
    int n = 0;
    setenv("CUDA_VISIBLE_DEVICES", "", 1);
    CU(CUDA_ERROR_NO_DEVICE, cuInit(0));
    CU(CUDA_ERROR_NOT_INITIALIZED, cuDeviceGetCount(&n));
}

static void test_visible_devices(void)
{
    in_child("cvd=1", cvd_index);
    in_child("cvd=uuid,0", cvd_uuid);
    in_child("cvd=GPU-fa4e", cvd_ambiguous);
    in_child("cvd=GPU-fa4e,1dev", cvd_unique_prefix);
    in_child("cvd=1,unknown", cvd_unknown_uuid);
    in_child("cvd=1,7,0", cvd_invalid_tail);
    in_child("cvd=0,0,1", cvd_duplicate);
    in_child("cvd=empty", cvd_empty);
}

/* ---------------- the other knobs ---------------- */

static void knobs_small(void)
{
    int v = 0;
    CUcontext c;
    CUdeviceptr p;
    CUmodule m;
    CUfunction f;
    CUgraph g;
    CUgraphExec ge;
    size_t gran = 0;
    CUmemAllocationProp prop = {0};
    setenv("FAKE_GPU_GRANULE", "64K", 1);
    setenv("FAKE_CTX_BYTES", "0", 1);
    setenv("FAKE_NS_PER_BLOCK", "10", 1);
    setenv("FAKE_CUDA_VERSION", "11080", 1);
    setenv("FAKE_GRAPH_BLOCKS", "5", 1);
    setenv("FAKE_CTX_CREATE_MS", "50", 1);
    setenv("FAKE_CTX_DESTROY_MS", "40", 1);
    CU(CUDA_SUCCESS, cuDriverGetVersion(&v));
    EQ(11080, v, "FAKE_CUDA_VERSION=11080 before cuInit");
    CU(CUDA_SUCCESS, cuInit(0));
    CU(CUDA_SUCCESS, cuDriverGetVersion(&v));
    EQ(11080, v, "FAKE_CUDA_VERSION=11080");
    uint64_t t0 = now_ns();
    CU(CUDA_SUCCESS, cuDevicePrimaryCtxRetain(&c, 0));
    double took = ms_since(t0);
    check(took >= 50, "FAKE_CTX_CREATE_MS=50: the retain took %.1f ms", took);
    {
        CUcontext extra;
        CU(CUDA_SUCCESS, cuCtxCreate_v2(&extra, 0, 0));
        t0 = now_ns();
        CU(CUDA_SUCCESS, cuCtxDestroy_v2(extra));
        took = ms_since(t0);
        check(took >= 40, "FAKE_CTX_DESTROY_MS=40: the destroy took %.1f ms", took);
    }
    CU(CUDA_SUCCESS, cuCtxSetCurrent(c));
    EQ(0, mine(0), "FAKE_CTX_BYTES=0: a free context");
    CU(CUDA_SUCCESS, cuMemAlloc_v2(&p, 1));
    EQ(65536, mine(0), "FAKE_GPU_GRANULE=64K: 1 byte costs 64 KiB");
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    CU(CUDA_SUCCESS, cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    EQ(65536, gran, "granularity reported by cuMemGetAllocationGranularity");
    cuModuleLoadData(&m, "x");
    cuModuleGetFunction(&f, m, "k");
    unsigned long long b0 = fakeGpuBusyNs(0);
    CU(CUDA_SUCCESS, blocks(f, 1000, NULL));
    EQ(b0 + 10000, fakeGpuBusyNs(0), "FAKE_NS_PER_BLOCK=10");
    cuGraphCreate(&g, 0);
    cuGraphInstantiateWithFlags(&ge, g, 0);
    CU(CUDA_SUCCESS, cuGraphLaunch(ge, NULL));
    EQ(b0 + 10050, fakeGpuBusyNs(0), "FAKE_GRAPH_BLOCKS=5");
    CU(CUDA_SUCCESS, cuCtxSynchronize());
}

static void knobs_devices(void)
{
    int n = 0;
    size_t t = 0;
    unsigned nn = 0;
    nvmlDevice_t d;
    nvmlMemory_t m;
    setenv("FAKE_CUDA_DEVICES", "3", 1);
    setenv("FAKE_GPU_MEM_MB", "2048", 1);
    unsetenv("FAKE_GPU_MEM_MB_1");
    setenv("FAKE_GPU_MEM_MB_2", "512", 1);
    setenv("FAKE_CTX_BYTES", "1M", 1);
    CU(CUDA_SUCCESS, cuInit(0));
    CU(CUDA_SUCCESS, cuDeviceGetCount(&n));
    EQ(3, n, "FAKE_CUDA_DEVICES=3");
    cuDeviceTotalMem_v2(&t, 1);
    EQ(2 * GiB, t, "FAKE_GPU_MEM_MB=2048 applies where no _<i> is set");
    cuDeviceTotalMem_v2(&t, 2);
    EQ(512 * MiB, t, "FAKE_GPU_MEM_MB_2=512");
    CUcontext c;
    CU(CUDA_SUCCESS, cuDevicePrimaryCtxRetain(&c, 2));
    EQ(MiB, mine(2), "FAKE_CTX_BYTES=1M");
    NV(NVML_SUCCESS, nvmlInit_v2()); /* re-reads the environment */
    NV(NVML_SUCCESS, nvmlDeviceGetCount_v2(&nn));
    EQ(3, nn, "NVML sees 3 devices");
    NV(NVML_SUCCESS, nvmlDeviceGetHandleByIndex_v2(2, &d));
    NV(NVML_SUCCESS, nvmlDeviceGetMemoryInfo(d, &m));
    check(m.total == 512 * MiB && m.used == MiB, "NVML device 2: total %llu used %llu", m.total, m.used);
}

static void knobs_bad(void)
{
    int n = 0;
    setenv("FAKE_CUDA_DEVICES", "two", 1);
    CU(CUDA_SUCCESS, cuInit(0));
    CU(CUDA_SUCCESS, cuDeviceGetCount(&n));
    EQ(1, n, "an unparsable FAKE_CUDA_DEVICES falls back to the default (1)");
}

static void knobs_default_path(void)
{
    char path[64];
    unsetenv("FAKE_GPU_STATE");
    snprintf(path, sizeof path, "/tmp/fake-gpu-state-%u", (unsigned)getuid());
    /* The file stays: other processes (a parallel selftest) may map it too. */
    fakeGpuRealUsed(0); /* maps (and if need be creates) the default file */
    check(access(path, R_OK | W_OK) == 0, "default state file %s", path);
}

static void test_knobs(void)
{
    in_child("knobs", knobs_small);
    in_child("knobs-devices", knobs_devices);
    in_child("knobs-bad", knobs_bad);
    in_child("knobs-path", knobs_default_path);
}

/* ---------------- threads ---------------- */

static _Atomic int g_thread_fail;

static void *worker(void *arg)
{
    long id = (long)arg;
    if (cuCtxSetCurrent(g_pc0) != CUDA_SUCCESS)
        g_thread_fail++;
    for (int i = 0; i < 200; i++) {
        CUdeviceptr p;
        size_t sz = (size_t)((i + id) % 5 + 1) * MiB;
        CUresult r = cuMemAlloc_v2(&p, sz);
        if (r == CUDA_SUCCESS) {
            if (i % 20 == 0 && blocks(g_fn, 10, NULL) != CUDA_SUCCESS)
                g_thread_fail++;
            if (cuMemFree_v2(p) != CUDA_SUCCESS)
                g_thread_fail++;
        } else if (r != CUDA_ERROR_OUT_OF_MEMORY) {
            g_thread_fail++;
        }
    }
    return NULL;
}

static void test_threads(void)
{
    pthread_t th[8];
    unsigned long long u0 = used0(), b0 = fakeGpuBusyNs(0);
    for (long i = 0; i < 8; i++)
        pthread_create(&th[i], NULL, worker, (void *)i);
    for (int i = 0; i < 8; i++)
        pthread_join(th[i], NULL);
    EQ(0, g_thread_fail, "8 threads x 200 alloc/free: no unexpected errors");
    EQ(u0, used0(), "usage balanced after concurrent alloc/free");
    EQ(b0 + 8 * 10 * 10 * 1000ULL, fakeGpuBusyNs(0), "concurrent launches all counted");
    CU(CUDA_SUCCESS, cuCtxSynchronize());
}

/* ---------------- reset ---------------- */

static void test_reset(void)
{
    CUcontext cur = (CUcontext)1, c;
    unsigned fl;
    int act = 1;
    fakeCudaResetState();
    check(used0() == 0 && used1() == 0 && fakeGpuBusyNs(0) == 0 && mine(0) == 0,
          "fakeCudaResetState zeroes usage and busy time");
    CU(CUDA_SUCCESS, cuCtxGetCurrent(&cur));
    check(cur == NULL, "... and unbinds this thread's context");
    CU(CUDA_SUCCESS, cuDevicePrimaryCtxGetState(0, &fl, &act));
    EQ(0, act, "... and deactivates the primary context");
    CU(CUDA_SUCCESS, cuDevicePrimaryCtxRetain(&c, 0));
    EQ(CTX, used0(), "retain after reset charges the context again");
    CU(CUDA_SUCCESS, cuDevicePrimaryCtxRelease_v2(0));
    EQ(0, used0(), "release after reset");
}

int main(int argc, char **argv)
{
    char path[256];
    g_cnt = mmap(NULL, sizeof *g_cnt, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (g_cnt == MAP_FAILED)
        return 2;
    if (argc > 1)
        snprintf(path, sizeof path, "%s", argv[1]);
    else
        snprintf(path, sizeof path, "/tmp/fake-gpu-selftest-%d", (int)getpid());
    setenv("FAKE_GPU_STATE", path, 1);
    setenv("FAKE_CUDA_DEVICES", "2", 1);
    setenv("FAKE_GPU_MEM_MB", "1024", 1);
    setenv("FAKE_GPU_MEM_MB_1", "4096", 1);
    setenv("FAKE_NVML_PID_OFFSET", "1000", 1);
    static const char *defaults[] = {"CUDA_VISIBLE_DEVICES", "FAKE_GPU_GRANULE", "FAKE_CTX_BYTES",
                                     "FAKE_CUDA_VERSION",   "FAKE_NS_PER_BLOCK", "FAKE_GRAPH_BLOCKS"};
    for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++)
        unsetenv(defaults[i]);
    unlink(path);
    printf("fake-driver selftest, state file %s\n", path);

    test_before_init();
    test_devices();
    test_primary();
    test_linear();
    test_oom();
    test_host();
    test_legacy();
    test_vmm();
    test_pools();
    test_arrays();
    test_contexts();
    test_launches();
    test_streams_graphs();
    test_graph_nodes();
    test_proc_address();
    test_errors();
    test_nvml_basic();
    test_nvml_procs();
    test_utilization();
    test_multiprocess();
    test_visible_devices();
    test_knobs();
    test_threads();
    test_reset();

    NV(NVML_SUCCESS, nvmlShutdown());
    NV(NVML_ERROR_UNINITIALIZED, nvmlShutdown());
    unlink(path);
    int pass = atomic_load(&g_cnt->pass), fail = atomic_load(&g_cnt->fail);
    printf("%d passed, %d failed\n", pass, fail);
    return fail ? 1 : 0;
}
