/*
 * fake_nvml.c: the fake libnvidia-ml.so.1.
 *
 * It reads the same shared state file as the fake libcuda: device memory in
 * use, per-process usage and the kernel busy history. Like the real NVML it
 * ignores CUDA_VISIBLE_DEVICES (it always sees every device) and reports
 * pids as seen from outside the container: the pid plus FAKE_NVML_PID_OFFSET.
 */
#define _GNU_SOURCE
#include "fake_nvml.h"
#include "fake_state.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static pthread_mutex_t g_nmu = PTHREAD_MUTEX_INITIALIZER;
static int g_refs; /* nvmlInit minus nvmlShutdown */
static struct fake_config g_ncfg;
static struct fake_state *g_nst;

/* Device handles point into this array; nothing else is a valid handle. */
static struct nvml_dev {
    int index;
} g_devs[FAKE_MAX_DEV];

#define UTIL_WINDOW_NS 100000000ULL   /* nvmlDeviceGetUtilizationRates: last 100 ms */
#define PROC_HISTORY_US 2000000ULL     /* oldest sample time we can answer for */
#define FAKE_DRIVER_VERSION "570.124.06"

#define NV_LOCKED(expr)                  \
    do {                                 \
        nvmlReturn_t nv_r_;              \
        pthread_mutex_lock(&g_nmu);      \
        nv_r_ = (expr);                  \
        pthread_mutex_unlock(&g_nmu);    \
        return nv_r_;                    \
    } while (0)

static void nv_prepare(void)
{
    pthread_mutex_lock(&g_nmu);
    fake_state_atfork_prepare();
}
static void nv_parent(void)
{
    fake_state_atfork_parent();
    pthread_mutex_unlock(&g_nmu);
}
static void nv_child(void)
{
    fake_state_atfork_child();
    pthread_mutex_unlock(&g_nmu);
}

__attribute__((constructor)) static void nv_ctor(void)
{
    for (int i = 0; i < FAKE_MAX_DEV; i++)
        g_devs[i].index = i;
    pthread_atfork(nv_prepare, nv_parent, nv_child);
}

/* Index of a valid handle, or -1 (also when NVML is not initialised). */
static int dev_index(nvmlDevice_t d)
{
    uintptr_t p = (uintptr_t)d, base = (uintptr_t)g_devs;
    if (p < base || p >= base + sizeof g_devs || (p - base) % sizeof g_devs[0])
        return -1;
    int i = (int)((p - base) / sizeof g_devs[0]);
    return i < g_ncfg.ndev ? i : -1;
}

#define NV_DEVICE(d, idx)                        \
    do {                                         \
        if (!g_refs)                             \
            return NVML_ERROR_UNINITIALIZED;     \
        if (((idx) = dev_index(d)) < 0)          \
            return NVML_ERROR_INVALID_ARGUMENT;  \
    } while (0)

/* ---------------- init ---------------- */

/* The environment is read again at every init, so a test can change it. */
static nvmlReturn_t nv_init(void)
{
    fake_config_load(&g_ncfg);
    if (g_ncfg.nvml_fail == 1)
        return NVML_ERROR_DRIVER_NOT_LOADED;
    struct fake_state *s = fake_state_map(g_ncfg.state_path);
    if (!s)
        return NVML_ERROR_UNKNOWN;
    g_nst = s;
    g_refs++;
    return NVML_SUCCESS;
}

static nvmlReturn_t nv_shutdown(void)
{
    if (!g_refs)
        return NVML_ERROR_UNINITIALIZED;
    g_refs--;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit(void) { NV_LOCKED(nv_init()); }
nvmlReturn_t nvmlInit_v2(void) { NV_LOCKED(nv_init()); }
nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags; /* NO_GPUS / NO_ATTACH change nothing for a fake */
    NV_LOCKED(nv_init());
}
nvmlReturn_t nvmlShutdown(void) { NV_LOCKED(nv_shutdown()); }

const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case NVML_ERROR_DEPRECATED: return "Deprecated";
    case NVML_ERROR_NOT_READY: return "Not Ready";
    case NVML_ERROR_GPU_NOT_FOUND: return "GPU not found";
    case NVML_ERROR_INVALID_STATE: return "Invalid state";
    case NVML_ERROR_UNKNOWN: return "Unknown Error";
    default: return "Unknown Error";
    }
}

/* ---------------- system ---------------- */

static nvmlReturn_t sys_driver(char *version, unsigned int length)
{
    if (!g_refs)
        return NVML_ERROR_UNINITIALIZED;
    if (!version)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (length < sizeof FAKE_DRIVER_VERSION)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(version, FAKE_DRIVER_VERSION, sizeof FAKE_DRIVER_VERSION);
    return NVML_SUCCESS;
}

static nvmlReturn_t sys_cuda(int *v)
{
    if (!g_refs)
        return NVML_ERROR_UNINITIALIZED;
    if (!v)
        return NVML_ERROR_INVALID_ARGUMENT;
    *v = g_ncfg.cuda_version;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    NV_LOCKED(sys_driver(version, length));
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) { NV_LOCKED(sys_cuda(v)); }
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { NV_LOCKED(sys_cuda(v)); }

/* ---------------- device handles ---------------- */

static nvmlReturn_t dev_count(unsigned int *n)
{
    if (!g_refs)
        return NVML_ERROR_UNINITIALIZED;
    if (!n)
        return NVML_ERROR_INVALID_ARGUMENT;
    *n = (unsigned)g_ncfg.ndev;
    return NVML_SUCCESS;
}

static nvmlReturn_t by_index(unsigned int index, nvmlDevice_t *device)
{
    if (!g_refs)
        return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= (unsigned)g_ncfg.ndev)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = (nvmlDevice_t)&g_devs[index];
    return NVML_SUCCESS;
}

static nvmlReturn_t by_uuid(const char *uuid, nvmlDevice_t *device)
{
    if (!g_refs)
        return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < g_ncfg.ndev; i++) {
        char u[NVML_DEVICE_UUID_BUFFER_SIZE];
        fake_uuid_string(i, u, sizeof u);
        if (strcmp(u, uuid) == 0) {
            *device = (nvmlDevice_t)&g_devs[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

/* "domain:bus:device.function" or "bus:device.function", hex, any case. */
static nvmlReturn_t by_pci(const char *id, nvmlDevice_t *device)
{
    unsigned dom = 0, bus, dv, fn;
    int used = -1;
    if (!g_refs)
        return NVML_ERROR_UNINITIALIZED;
    if (!id || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (sscanf(id, "%x:%x:%x.%x%n", &dom, &bus, &dv, &fn, &used) != 4 || id[used]) {
        used = -1;
        dom = 0;
        if (sscanf(id, "%x:%x.%x%n", &bus, &dv, &fn, &used) != 3 || id[used])
            return NVML_ERROR_INVALID_ARGUMENT;
    }
    for (int i = 0; i < g_ncfg.ndev; i++)
        if (dom == 0 && bus == (unsigned)FAKE_PCI_BUS(i) && dv == 0 && fn == 0) {
            *device = (nvmlDevice_t)&g_devs[i];
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_FOUND;
}

static nvmlReturn_t get_index(nvmlDevice_t d, unsigned int *index)
{
    int i;
    NV_DEVICE(d, i);
    if (!index)
        return NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned)i;
    return NVML_SUCCESS;
}

static nvmlReturn_t get_string(nvmlDevice_t d, char *buf, unsigned int length, int uuid)
{
    int i;
    char s[NVML_DEVICE_UUID_BUFFER_SIZE];
    NV_DEVICE(d, i);
    if (!buf)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (uuid)
        fake_uuid_string(i, s, sizeof s);
    else
        snprintf(s, sizeof s, "%s", FAKE_GPU_NAME);
    if (length < strlen(s) + 1)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, s, strlen(s) + 1);
    return NVML_SUCCESS;
}

static nvmlReturn_t get_cc(nvmlDevice_t d, int *major, int *minor)
{
    int i;
    NV_DEVICE(d, i);
    if (!major || !minor)
        return NVML_ERROR_INVALID_ARGUMENT;
    *major = 9;
    *minor = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount) { NV_LOCKED(dev_count(deviceCount)); }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount) { NV_LOCKED(dev_count(deviceCount)); }
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    NV_LOCKED(by_index(index, device));
}
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    NV_LOCKED(by_index(index, device));
}
nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    NV_LOCKED(by_uuid(uuid, device));
}
nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device)
{
    NV_LOCKED(by_pci(pciBusId, device));
}
nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
{
    NV_LOCKED(by_pci(pciBusId, device));
}
nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) { NV_LOCKED(get_index(device, index)); }
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    NV_LOCKED(get_string(device, uuid, length, 1));
}
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    NV_LOCKED(get_string(device, name, length, 0));
}
nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    NV_LOCKED(get_cc(device, major, minor));
}

/* ---------------- memory ---------------- */

static void mem_numbers(int i, uint64_t *total, uint64_t *used, uint64_t *free_)
{
    *total = g_ncfg.mem_total[i];
    fake_prune_dead(g_nst);
    *used = atomic_load(&g_nst->dev[i].used);
    *free_ = *used < *total ? *total - *used : 0;
}

static nvmlReturn_t mem_v1(nvmlDevice_t d, nvmlMemory_t *m)
{
    int i;
    uint64_t t, u, f;
    NV_DEVICE(d, i);
    if (!m)
        return NVML_ERROR_INVALID_ARGUMENT;
    mem_numbers(i, &t, &u, &f);
    m->total = t;
    m->used = u;
    m->free = f;
    return NVML_SUCCESS;
}

static nvmlReturn_t mem_v2(nvmlDevice_t d, nvmlMemory_v2_t *m)
{
    int i;
    uint64_t t, u, f;
    NV_DEVICE(d, i);
    if (!m)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (m->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    mem_numbers(i, &t, &u, &f);
    m->total = t;
    m->reserved = 0; /* no driver-reserved memory in the fake */
    m->used = u;
    m->free = f;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) { NV_LOCKED(mem_v1(device, memory)); }
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    NV_LOCKED(mem_v2(device, memory));
}

/* ---------------- processes ---------------- */

static unsigned host_pid(int32_t pid) { return (unsigned)((long long)pid + g_ncfg.pid_offset); }

/* Running processes are the live entries with memory on the device; the
 * three ABI versions differ only in the element layout. */
static nvmlReturn_t procs(nvmlDevice_t d, unsigned int *count, void *infos, int layout)
{
    int i;
    NV_DEVICE(d, i);
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (g_ncfg.nvml_fail == 2)
        return NVML_ERROR_UNKNOWN;
    fake_prune_dead(g_nst);
    unsigned n = 0, cap = *count;
    for (int k = 0; k < FAKE_MAX_PROC; k++) {
        int32_t pid = atomic_load(&g_nst->proc[k].pid);
        uint64_t used = atomic_load(&g_nst->proc[k].dev[i].used);
        if (pid <= 0 || used == 0)
            continue;
        if (n < cap && infos) {
            if (layout == 1) {
                nvmlProcessInfo_v1_t *e = (nvmlProcessInfo_v1_t *)infos + n;
                e->pid = host_pid(pid);
                e->usedGpuMemory = used;
            } else { /* v2 and v3 share one layout */
                nvmlProcessInfo_t *e = (nvmlProcessInfo_t *)infos + n;
                e->pid = host_pid(pid);
                e->usedGpuMemory = used;
                e->gpuInstanceId = 0xFFFFFFFFu; /* MIG off */
                e->computeInstanceId = 0xFFFFFFFFu;
            }
        }
        n++;
    }
    *count = n;
    if (n > cap)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    if (n && !infos)
        return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                  nvmlProcessInfo_v1_t *infos)
{
    NV_LOCKED(procs(device, infoCount, infos, 1));
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_v2_t *infos)
{
    NV_LOCKED(procs(device, infoCount, infos, 2));
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos)
{
    NV_LOCKED(procs(device, infoCount, infos, 3));
}

/* A compute-only GPU: no graphics or MPS processes. */
static nvmlReturn_t no_procs(nvmlDevice_t d, unsigned int *count)
{
    int i;
    NV_DEVICE(d, i);
    (void)i;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = 0;
    return NVML_SUCCESS;
}

#define NO_PROCS(name, info_t)                                                           \
    nvmlReturn_t name(nvmlDevice_t device, unsigned int *infoCount, info_t *infos)          \
    {                                                                                        \
        (void)infos;                                                                         \
        NV_LOCKED(no_procs(device, infoCount));                                              \
    }
NO_PROCS(nvmlDeviceGetGraphicsRunningProcesses, nvmlProcessInfo_v1_t)
NO_PROCS(nvmlDeviceGetGraphicsRunningProcesses_v2, nvmlProcessInfo_v2_t)
NO_PROCS(nvmlDeviceGetGraphicsRunningProcesses_v3, nvmlProcessInfo_t)
NO_PROCS(nvmlDeviceGetMPSComputeRunningProcesses, nvmlProcessInfo_v1_t)
NO_PROCS(nvmlDeviceGetMPSComputeRunningProcesses_v2, nvmlProcessInfo_v2_t)
NO_PROCS(nvmlDeviceGetMPSComputeRunningProcesses_v3, nvmlProcessInfo_t)

/* The name of the process NVML calls `pid` (a host pid: our pid + FAKE_NVML_PID_OFFSET): the
 * first word of its command line, as the real one gives it. */
static nvmlReturn_t proc_name(unsigned int pid, char *name, unsigned int length)
{
    if (!name || length == 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    long long local = (long long)pid - g_ncfg.pid_offset;
    if (local <= 0)
        return NVML_ERROR_NOT_FOUND;
    char path[64];
    snprintf(path, sizeof path, "/proc/%lld/cmdline", local);
    FILE *f = fopen(path, "r");
    if (!f)
        return NVML_ERROR_NOT_FOUND;
    size_t n = fread(name, 1, length - 1, f);
    fclose(f);
    name[n] = 0;
    return n ? NVML_SUCCESS : NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int length)
{
    NV_LOCKED(proc_name(pid, name, length));
}

/* ---------------- utilisation ---------------- */

static uint64_t device_busy(int i, uint64_t a, uint64_t b)
{
    uint64_t sum = 0;
    for (int k = 0; k < FAKE_MAX_PROC; k++)
        if (atomic_load(&g_nst->proc[k].pid) > 0)
            sum += fake_busy_in_window(&g_nst->proc[k].dev[i], a, b);
    return sum;
}

static unsigned percent(uint64_t busy, uint64_t window)
{
    uint64_t p = (busy * 100 + window / 2) / window;
    return p > 100 ? 100 : (unsigned)p;
}

static nvmlReturn_t util_rates(nvmlDevice_t d, nvmlUtilization_t *u)
{
    int i;
    NV_DEVICE(d, i);
    if (!u)
        return NVML_ERROR_INVALID_ARGUMENT;
    uint64_t now = fake_now_ns();
    u->gpu = percent(device_busy(i, now - UTIL_WINDOW_NS, now), UTIL_WINDOW_NS);
    u->memory = 0; /* the fake has no memory traffic */
    return NVML_SUCCESS;
}

/* One sample per process that ran kernels on the device after
 * lastSeenTimeStamp (CPU µs): its share of that time, stamped now. */
static nvmlReturn_t proc_util(nvmlDevice_t d, nvmlProcessUtilizationSample_t *out, unsigned *count,
                              unsigned long long last_seen)
{
    int i;
    NV_DEVICE(d, i);
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    uint64_t now_us = fake_realtime_us(), now = fake_now_ns();
    if (last_seen >= now_us) {
        *count = 0;
        return NVML_ERROR_NOT_FOUND;
    }
    uint64_t span_us = now_us - last_seen;
    if (span_us > PROC_HISTORY_US)
        span_us = PROC_HISTORY_US;
    uint64_t a = now - span_us * 1000ULL;
    unsigned n = 0, cap = out ? *count : 0;
    for (int k = 0; k < FAKE_MAX_PROC; k++) {
        int32_t pid = atomic_load(&g_nst->proc[k].pid);
        if (pid <= 0)
            continue;
        uint64_t busy = fake_busy_in_window(&g_nst->proc[k].dev[i], a, now);
        if (!busy)
            continue;
        if (n < cap) {
            out[n].pid = host_pid(pid);
            out[n].timeStamp = now_us;
            out[n].smUtil = percent(busy, now - a);
            out[n].memUtil = 0;
            out[n].encUtil = 0;
            out[n].decUtil = 0;
        }
        n++;
    }
    if (n == 0) {
        *count = 0;
        return NVML_ERROR_NOT_FOUND;
    }
    unsigned had = *count;
    *count = n;
    /* A NULL buffer asks for the size. */
    return !out || n > had ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
}

/* Device samples (NVML_GPU_UTILIZATION_SAMPLES): one per DEVICE_SAMPLE_US of CLOCK_REALTIME,
 * stamped at the end of its window with the device's busy share over that window, the last 2 s
 * kept; those stamped after lastSeenTimeStamp, oldest first. A NULL buffer asks for the count. */
#define DEVICE_SAMPLE_US 100000ULL
#define DEVICE_SAMPLES_KEPT 20ULL
static nvmlReturn_t device_samples(nvmlDevice_t d, nvmlSamplingType_t type,
                                   unsigned long long last_seen, nvmlValueType_t *kind,
                                   unsigned *count, nvmlSample_t *out)
{
    int i;
    NV_DEVICE(d, i);
    if (!count || !kind)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (type != NVML_GPU_UTILIZATION_SAMPLES)
        return NVML_ERROR_NOT_SUPPORTED;
    uint64_t now_us = fake_realtime_us(), now = fake_now_ns();
    uint64_t newest = now_us / DEVICE_SAMPLE_US * DEVICE_SAMPLE_US;
    uint64_t oldest = newest - (DEVICE_SAMPLES_KEPT - 1) * DEVICE_SAMPLE_US;
    uint64_t after = (last_seen / DEVICE_SAMPLE_US + 1) * DEVICE_SAMPLE_US;
    if (after > oldest)
        oldest = after;
    unsigned n = oldest <= newest ? (unsigned)((newest - oldest) / DEVICE_SAMPLE_US + 1) : 0;
    *kind = NVML_VALUE_TYPE_UNSIGNED_INT;
    if (n == 0) {
        *count = 0;
        return NVML_ERROR_NOT_FOUND;
    }
    if (!out) {
        *count = n;
        return NVML_SUCCESS;
    }
    if (n > *count)
        n = *count;
    for (unsigned k = 0; k < n; k++) {
        uint64_t stamp = oldest + k * DEVICE_SAMPLE_US;
        uint64_t end = now - (now_us - stamp) * 1000ULL;
        out[k].timeStamp = stamp;
        out[k].sampleValue.ullVal = 0;
        out[k].sampleValue.uiVal =
            percent(device_busy(i, end - DEVICE_SAMPLE_US * 1000ULL, end), DEVICE_SAMPLE_US * 1000ULL);
    }
    *count = n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetSamples(nvmlDevice_t device, nvmlSamplingType_t type,
                                  unsigned long long lastSeenTimeStamp,
                                  nvmlValueType_t *sampleValType, unsigned int *sampleCount,
                                  nvmlSample_t *samples)
{
    NV_LOCKED(device_samples(device, type, lastSeenTimeStamp, sampleValType, sampleCount, samples));
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    NV_LOCKED(util_rates(device, utilization));
}
nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                             nvmlProcessUtilizationSample_t *utilization,
                                             unsigned int *processSamplesCount,
                                             unsigned long long lastSeenTimeStamp)
{
    NV_LOCKED(proc_util(device, utilization, processSamplesCount, lastSeenTimeStamp));
}
