/*
 * cuda_core.c: driver initialisation, devices, contexts, error strings,
 * cuGetProcAddress and the test-only exports of the fake libcuda.
 */
#define _GNU_SOURCE
#include "cuda_internal.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
struct fake_config g_cfg;
struct fake_state *g_st;
int g_inited;
int g_nvis;
int g_vis[FAKE_MAX_DEV];

static CUresult g_init_err;                 /* sticky result of a failed cuInit */
static struct fctx *g_ctxs;                 /* every context, dead ones included */
static struct fctx *g_primary[FAKE_MAX_DEV]; /* by ordinal */
static int g_my_idx = -1;                   /* our entry in the state file */
static int g_exiting;                       /* the destructor ran */

/* Each thread's context stack (cuCtxPushCurrent/PopCurrent). */
#define FK_STACK_MAX 64
static __thread struct fctx *t_stack[FK_STACK_MAX];
static __thread int t_depth;

/* ---------------- process lifecycle ---------------- */

static void atfork_prepare(void)
{
    pthread_mutex_lock(&g_mu);
    fake_state_atfork_prepare();
}

static void atfork_parent(void)
{
    fake_state_atfork_parent();
    pthread_mutex_unlock(&g_mu);
}

static void free_contexts(void)
{
    while (g_ctxs) {
        struct fctx *n = g_ctxs->next;
        free(g_ctxs);
        g_ctxs = n;
    }
    memset(g_primary, 0, sizeof g_primary);
}

/* The child is a new process to the driver (as with the real one, it has to
 * call cuInit again): it owns none of the parent's contexts or memory. */
static void atfork_child(void)
{
    fake_state_atfork_child();
    pthread_mutex_unlock(&g_mu);
    fk_mem_forget();
    fk_exec_forget();
    free_contexts();
    t_depth = 0;
    g_inited = 0;
    g_init_err = CUDA_SUCCESS;
    g_my_idx = -1;
    g_st = NULL;
    fake_state_unmap();
}

__attribute__((constructor)) static void fk_ctor(void)
{
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

/* Exit gives the process's device memory back, as the real driver does when
 * a process dies. Objects are not freed: other threads may still run. */
__attribute__((destructor)) static void fk_dtor(void)
{
    pthread_mutex_lock(&g_mu);
    g_exiting = 1;
    if (g_st && g_my_idx >= 0 && atomic_load(&g_st->proc[g_my_idx].pid) == getpid())
        fake_proc_release(g_st, g_my_idx);
    g_my_idx = -1;
    pthread_mutex_unlock(&g_mu);
}

/* ---------------- helpers shared with the other files ---------------- */

int fk_entry(void)
{
    if (g_exiting || !g_st)
        return -1;
    int pid = getpid();
    if (g_my_idx >= 0 && atomic_load(&g_st->proc[g_my_idx].pid) == pid)
        return g_my_idx;
    g_my_idx = fake_proc_claim(g_st, pid);
    if (g_my_idx < 0)
        fprintf(stderr, "fake-driver: process table of %s is full (%d entries)\n",
                g_cfg.state_path, FAKE_MAX_PROC);
    return g_my_idx;
}

uint64_t fk_round(uint64_t bytes)
{
    uint64_t g = g_cfg.granule;
    if (bytes > UINT64_MAX - g)
        return UINT64_MAX;
    return (bytes + g - 1) / g * g;
}

CUresult fk_charge(int phys, uint64_t bytes)
{
    if (g_exiting)
        return CUDA_ERROR_DEINITIALIZED;
    if (bytes == 0)
        return CUDA_SUCCESS;
    int idx = fk_entry();
    if (idx < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (fake_reserve(g_st, idx, phys, bytes, g_cfg.mem_total[phys]))
        return CUDA_ERROR_OUT_OF_MEMORY;
    return CUDA_SUCCESS;
}

void fk_uncharge(int phys, uint64_t bytes)
{
    /* Only from our own entry: after someone else's reset it may not be ours. */
    if (!bytes || !g_st || g_my_idx < 0 || atomic_load(&g_st->proc[g_my_idx].pid) != getpid())
        return;
    fake_release(g_st, g_my_idx, phys, bytes);
}

CUresult fk_ordinal(CUdevice dev, int *phys)
{
    if (dev < 0 || dev >= g_nvis)
        return CUDA_ERROR_INVALID_DEVICE;
    *phys = g_vis[dev];
    return CUDA_SUCCESS;
}

int fk_ctx_alive(const struct fctx *c)
{
    for (struct fctx *p = g_ctxs; p; p = p->next)
        if (p == c)
            return p->alive;
    return 0;
}

CUresult fk_current(struct fctx **out)
{
    /* Stack entries are always our own pointers, so reading alive is safe. */
    if (t_depth == 0 || !t_stack[t_depth - 1]->alive)
        return CUDA_ERROR_INVALID_CONTEXT;
    *out = t_stack[t_depth - 1];
    return CUDA_SUCCESS;
}

/* ---------------- initialisation ---------------- */

/* CUDA_VISIBLE_DEVICES: indices or (unique prefixes of) UUIDs, comma
 * separated; like the real driver, the list ends at the first entry that is
 * invalid or repeated, and unset means every device. */
static int parse_visible(const char *env, int ndev, int out[FAKE_MAX_DEV])
{
    if (!env) {
        for (int i = 0; i < ndev; i++)
            out[i] = i;
        return ndev;
    }
    int n = 0;
    const char *p = env;
    while (*p && n < FAKE_MAX_DEV) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char tok[128];
        while (len && isspace((unsigned char)*p)) {
            p++;
            len--;
        }
        while (len && isspace((unsigned char)p[len - 1]))
            len--;
        if (len == 0 || len >= sizeof tok)
            break;
        memcpy(tok, p, len);
        tok[len] = '\0';

        int phys = -1;
        if (strspn(tok, "0123456789") == len) {
            long v = strtol(tok, NULL, 10);
            if (v < ndev)
                phys = (int)v;
        } else if (strncmp(tok, "GPU-", 4) == 0) {
            for (int i = 0; i < ndev; i++) {
                char u[64];
                fake_uuid_string(i, u, sizeof u);
                if (strncmp(u, tok, len) == 0) {
                    if (phys >= 0) { /* ambiguous prefix */
                        phys = -1;
                        break;
                    }
                    phys = i;
                }
            }
        }
        for (int i = 0; i < n && phys >= 0; i++)
            if (out[i] == phys)
                phys = -1;
        if (phys < 0)
            break;
        out[n++] = phys;
        if (!comma)
            break;
        p = comma + 1;
    }
    return n;
}

static CUresult do_init(unsigned int flags)
{
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (g_inited)
        return CUDA_SUCCESS;
    if (g_init_err != CUDA_SUCCESS)
        return g_init_err;

    fake_config_load(&g_cfg);
    g_st = fake_state_map(g_cfg.state_path);
    if (!g_st)
        return g_init_err = CUDA_ERROR_OPERATING_SYSTEM;
    g_nvis = parse_visible(getenv("CUDA_VISIBLE_DEVICES"), g_cfg.ndev, g_vis);
    if (g_nvis == 0)
        return g_init_err = CUDA_ERROR_NO_DEVICE;
    for (int i = 0; i < g_nvis; i++) {
        struct fctx *c = calloc(1, sizeof *c);
        if (!c)
            return CUDA_ERROR_OUT_OF_MEMORY;
        c->ordinal = i;
        c->phys = g_vis[i];
        c->primary = 1;
        c->next = g_ctxs;
        g_ctxs = c;
        g_primary[i] = c;
    }
    g_inited = 1;
    return CUDA_SUCCESS;
}

CUresult cuInit(unsigned int Flags) { FK_LOCKED(do_init(Flags)); }

CUresult cuDriverGetVersion(int *driverVersion)
{
    if (!driverVersion)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    if (g_inited) {
        *driverVersion = g_cfg.cuda_version;
    } else { /* allowed before cuInit */
        static struct fake_config c;
        fake_config_load(&c);
        *driverVersion = c.cuda_version;
    }
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

CUresult cuGetExportTable(const void **ppExportTable, const CUuuid *pExportTableId)
{
    (void)pExportTableId;
    if (ppExportTable)
        *ppExportTable = NULL;
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* ---------------- devices ---------------- */

static CUresult dev_get(CUdevice *device, int ordinal)
{
    FK_REQUIRE_INIT();
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= g_nvis)
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

static CUresult dev_count(int *count)
{
    FK_REQUIRE_INIT();
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = g_nvis;
    return CUDA_SUCCESS;
}

static CUresult dev_name(char *name, int len, CUdevice dev)
{
    int phys;
    FK_REQUIRE_INIT();
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = fk_ordinal(dev, &phys);
    if (r)
        return r;
    snprintf(name, (size_t)len, "%s", FAKE_GPU_NAME);
    return CUDA_SUCCESS;
}

static CUresult dev_uuid(CUuuid *uuid, CUdevice dev)
{
    int phys;
    FK_REQUIRE_INIT();
    if (!uuid)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = fk_ordinal(dev, &phys);
    if (r)
        return r;
    fake_uuid_bytes(phys, (unsigned char *)uuid->bytes);
    return CUDA_SUCCESS;
}

static CUresult dev_total(size_t *bytes, CUdevice dev)
{
    int phys;
    FK_REQUIRE_INIT();
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = fk_ordinal(dev, &phys);
    if (r)
        return r;
    *bytes = g_cfg.mem_total[phys];
    return CUDA_SUCCESS;
}

static CUresult dev_attr(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    int phys;
    FK_REQUIRE_INIT();
    if (!pi || (int)attrib < 1 || (int)attrib > 255)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = fk_ordinal(dev, &phys);
    if (r)
        return r;
    int v = 0; /* unknown attributes read as 0, like unsupported features */
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: v = 64; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: v = 2147483647; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: v = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: v = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: v = 49152; break;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: v = 65536; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: v = 32; break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: v = 65536; break;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: v = 1980000; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: v = 132; break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: v = FAKE_PCI_BUS(phys); break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: v = 2048; break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: v = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: v = 1; break;
    default: break;
    }
    *pi = v;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) { FK_LOCKED(dev_get(device, ordinal)); }
CUresult cuDeviceGetCount(int *count) { FK_LOCKED(dev_count(count)); }
CUresult cuDeviceGetName(char *name, int len, CUdevice dev) { FK_LOCKED(dev_name(name, len, dev)); }
CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) { FK_LOCKED(dev_uuid(uuid, dev)); }
CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) { FK_LOCKED(dev_uuid(uuid, dev)); }
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) { FK_LOCKED(dev_total(bytes, dev)); }
CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    FK_LOCKED(dev_attr(pi, attrib, dev));
}

static CUresult dev_total_v1(unsigned int *bytes, CUdevice dev)
{
    size_t b;
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = dev_total(&b, dev);
    if (r == CUDA_SUCCESS) /* the 32-bit ABI cannot say more than 4 GiB - 1 */
        *bytes = b > 0xFFFFFFFFu ? 0xFFFFFFFFu : (unsigned int)b;
    return r;
}
CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev) { FK_LOCKED(dev_total_v1(bytes, dev)); }

/* ---------------- contexts ---------------- */

static void stack_remove(const struct fctx *c)
{
    int j = 0;
    for (int i = 0; i < t_depth; i++)
        if (t_stack[i] != c)
            t_stack[j++] = t_stack[i];
    t_depth = j;
}

/* Destroying a context frees everything allocated in it and its own cost. */
static void ctx_teardown(struct fctx *c)
{
    fk_mem_ctx_teardown(c);
    fk_exec_ctx_teardown(c);
    fk_uncharge(c->phys, g_cfg.ctx_bytes);
    c->alive = 0;
}

static CUresult ctx_create(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    int phys;
    FK_REQUIRE_INIT();
    if (!pctx || (flags & ~(unsigned)CU_CTX_FLAGS_MASK))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = fk_ordinal(dev, &phys);
    if (r)
        return r;
    if (t_depth >= FK_STACK_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    struct fctx *c = calloc(1, sizeof *c);
    if (!c)
        return CUDA_ERROR_OUT_OF_MEMORY;
    r = fk_charge(phys, g_cfg.ctx_bytes);
    if (r) {
        free(c);
        return r;
    }
    c->ordinal = dev;
    c->phys = phys;
    c->flags = flags;
    c->alive = 1;
    c->next = g_ctxs;
    g_ctxs = c;
    t_stack[t_depth++] = c; /* a new context becomes current */
    *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}

static CUresult ctx_create_v3(CUcontext *pctx, CUexecAffinityParam *params, int n,
                              unsigned int flags, CUdevice dev)
{
    if (n < 0 || (n > 0 && !params))
        return CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; i < n; i++)
        if (params[i].type != CU_EXEC_AFFINITY_TYPE_SM_COUNT)
            return CUDA_ERROR_INVALID_VALUE;
    return ctx_create(pctx, flags, dev);
}

static CUresult ctx_create_v4(CUcontext *pctx, CUctxCreateParams *p, unsigned int flags,
                              CUdevice dev)
{
    if (p && p->cigParams) /* CUDA in graphics contexts: Windows only */
        return CUDA_ERROR_NOT_SUPPORTED;
    if (p)
        return ctx_create_v3(pctx, p->execAffinityParams, p->numExecAffinityParams, flags, dev);
    return ctx_create(pctx, flags, dev);
}

static CUresult ctx_destroy(CUcontext ctx)
{
    FK_REQUIRE_INIT();
    struct fctx *c = (struct fctx *)ctx;
    if (!c || !fk_ctx_alive(c) || c->primary)
        return CUDA_ERROR_INVALID_CONTEXT;
    ctx_teardown(c);
    stack_remove(c);
    return CUDA_SUCCESS;
}

static CUresult ctx_get_current(CUcontext *pctx)
{
    FK_REQUIRE_INIT();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = t_depth ? (CUcontext)t_stack[t_depth - 1] : NULL;
    return CUDA_SUCCESS;
}

static CUresult ctx_set_current(CUcontext ctx)
{
    FK_REQUIRE_INIT();
    struct fctx *c = (struct fctx *)ctx;
    if (!c) { /* unbind */
        if (t_depth)
            t_depth--;
        return CUDA_SUCCESS;
    }
    if (!fk_ctx_alive(c))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (t_depth == 0)
        t_depth = 1;
    t_stack[t_depth - 1] = c;
    return CUDA_SUCCESS;
}

static CUresult ctx_push(CUcontext ctx)
{
    FK_REQUIRE_INIT();
    struct fctx *c = (struct fctx *)ctx;
    if (!c || !fk_ctx_alive(c))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (t_depth >= FK_STACK_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    t_stack[t_depth++] = c;
    return CUDA_SUCCESS;
}

static CUresult ctx_pop(CUcontext *pctx)
{
    FK_REQUIRE_INIT();
    if (t_depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    struct fctx *c = t_stack[--t_depth];
    if (pctx)
        *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}

static CUresult ctx_get_device(CUdevice *device)
{
    struct fctx *c;
    FK_REQUIRE_INIT();
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = fk_current(&c);
    if (r)
        return r;
    *device = c->ordinal;
    return CUDA_SUCCESS;
}

CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    FK_LOCKED_CTX(ctx_create(pctx, flags, dev));
}
CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    FK_LOCKED_CTX(ctx_create(pctx, flags, dev));
}
CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
                        unsigned int flags, CUdevice dev)
{
    FK_LOCKED_CTX(ctx_create_v3(pctx, paramsArray, numParams, flags, dev));
}
CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags,
                        CUdevice dev)
{
    FK_LOCKED_CTX(ctx_create_v4(pctx, ctxCreateParams, flags, dev));
}
CUresult cuCtxDestroy(CUcontext ctx) { FK_LOCKED_DESTROY(ctx_destroy(ctx)); }
CUresult cuCtxDestroy_v2(CUcontext ctx) { FK_LOCKED_DESTROY(ctx_destroy(ctx)); }
CUresult cuCtxGetCurrent(CUcontext *pctx) { FK_LOCKED(ctx_get_current(pctx)); }
CUresult cuCtxSetCurrent(CUcontext ctx) { FK_LOCKED(ctx_set_current(ctx)); }
CUresult cuCtxPushCurrent(CUcontext ctx) { FK_LOCKED(ctx_push(ctx)); }
CUresult cuCtxPushCurrent_v2(CUcontext ctx) { FK_LOCKED(ctx_push(ctx)); }
CUresult cuCtxPopCurrent(CUcontext *pctx) { FK_LOCKED(ctx_pop(pctx)); }
CUresult cuCtxPopCurrent_v2(CUcontext *pctx) { FK_LOCKED(ctx_pop(pctx)); }
CUresult cuCtxGetDevice(CUdevice *device) { FK_LOCKED(ctx_get_device(device)); }

/* Waits (unlocked) for every kernel queued in the current context. */
CUresult cuCtxSynchronize(void)
{
    struct fctx *c;
    pthread_mutex_lock(&g_mu);
    CUresult r = g_inited ? fk_current(&c) : CUDA_ERROR_NOT_INITIALIZED;
    uint64_t until = r ? 0 : c->last_end;
    pthread_mutex_unlock(&g_mu);
    if (r == CUDA_SUCCESS)
        fake_sleep_until(until);
    return r;
}

/* ---------------- primary contexts ---------------- */

static CUresult primary(CUdevice dev, struct fctx **out)
{
    int phys;
    FK_REQUIRE_INIT();
    CUresult r = fk_ordinal(dev, &phys);
    if (r)
        return r;
    *out = g_primary[dev];
    return CUDA_SUCCESS;
}

static CUresult pctx_retain(CUcontext *pctx, CUdevice dev)
{
    struct fctx *p;
    CUresult r = primary(dev, &p);
    if (r)
        return r;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (p->refcount == 0) { /* (re)created: costs its memory again */
        r = fk_charge(p->phys, g_cfg.ctx_bytes);
        if (r)
            return r;
        p->alive = 1;
    }
    p->refcount++;
    *pctx = (CUcontext)p;
    return CUDA_SUCCESS;
}

static CUresult pctx_release(CUdevice dev)
{
    struct fctx *p;
    CUresult r = primary(dev, &p);
    if (r)
        return r;
    if (p->refcount == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (--p->refcount == 0)
        ctx_teardown(p);
    return CUDA_SUCCESS;
}

static CUresult pctx_reset(CUdevice dev)
{
    struct fctx *p;
    CUresult r = primary(dev, &p);
    if (r)
        return r;
    if (p->refcount > 0)
        ctx_teardown(p);
    p->refcount = 0;
    p->flags = 0;
    return CUDA_SUCCESS;
}

static CUresult pctx_state(CUdevice dev, unsigned int *flags, int *active)
{
    struct fctx *p;
    CUresult r = primary(dev, &p);
    if (r)
        return r;
    if (!flags || !active)
        return CUDA_ERROR_INVALID_VALUE;
    *flags = p->flags;
    *active = p->refcount > 0;
    return CUDA_SUCCESS;
}

/* v1 refuses while the context is active; v2 (CUDA 11) allows it. */
static CUresult pctx_set_flags(CUdevice dev, unsigned int flags, int v2)
{
    struct fctx *p;
    CUresult r = primary(dev, &p);
    if (r)
        return r;
    if (flags & ~(unsigned)CU_CTX_FLAGS_MASK)
        return CUDA_ERROR_INVALID_VALUE;
    if (!v2 && p->refcount > 0)
        return CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE;
    p->flags = flags;
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) { FK_LOCKED_CTX(pctx_retain(pctx, dev)); }
CUresult cuDevicePrimaryCtxRelease(CUdevice dev) { FK_LOCKED_DESTROY(pctx_release(dev)); }
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) { FK_LOCKED_DESTROY(pctx_release(dev)); }
CUresult cuDevicePrimaryCtxReset(CUdevice dev) { FK_LOCKED(pctx_reset(dev)); }
CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) { FK_LOCKED(pctx_reset(dev)); }
CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    FK_LOCKED(pctx_state(dev, flags, active));
}
CUresult cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags)
{
    FK_LOCKED(pctx_set_flags(dev, flags, 0));
}
CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags)
{
    FK_LOCKED(pctx_set_flags(dev, flags, 1));
}

/* ---------------- errors ---------------- */

static const struct {
    CUresult code;
    const char *name, *text;
} g_errors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_FILE_NOT_FOUND, "CUDA_ERROR_FILE_NOT_FOUND", "file not found"},
    {CUDA_ERROR_OPERATING_SYSTEM, "CUDA_ERROR_OPERATING_SYSTEM", "OS call failed or operation not supported on this OS"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch"},
    {CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE", "primary context active"},
    {CUDA_ERROR_CONTEXT_IS_DESTROYED, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
    {CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE",
     "the graph update was not performed because it included changes which violated constraints "
     "specific to instantiated graph update"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static CUresult error_lookup(CUresult error, const char **pStr, int want_name)
{
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof g_errors / sizeof g_errors[0]; i++)
        if (g_errors[i].code == error) {
            *pStr = want_name ? g_errors[i].name : g_errors[i].text;
            return CUDA_SUCCESS;
        }
    *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult error, const char **pStr) { return error_lookup(error, pStr, 0); }
CUresult cuGetErrorName(CUresult error, const char **pStr) { return error_lookup(error, pStr, 1); }

/* ---------------- cuGetProcAddress ---------------- */

/* {base name, first CUDA version of this ABI, function, per-thread-stream
 * variant}. A request for `name` at version V gets the newest row with
 * version <= V, as the real driver's table does. The library is linked with
 * -Bsymbolic-functions, so these are our own functions even when a preloaded
 * library (libvgpu.so) exports the same names. */
struct proc_row {
    const char *name;
    int version;
    void *fn;
    void *ptsz;
};
#define ROW(n, v, f) {n, v, (void *)(f), NULL}
#define ROWP(n, v, f) {n, v, (void *)(f), (void *)(f##_ptsz)}

/* What cuGetProcAddress answers for cuGraphInstantiate from 12.0: an entry point of
 * cuGraphInstantiateWithFlags's ABI that the library does not export. The real 580 driver's answer
 * is, by the H100 run of t_resolve, none of its exports (c-tests/gpu/graph_probe.sh prints it). */
static CUresult graph_instantiate_v12000(CUgraphExec *phGraphExec, CUgraph hGraph,
                                         unsigned long long flags)
{
    return cuGraphInstantiateWithFlags(phGraphExec, hGraph, flags);
}

static const struct proc_row g_procs[] = {
    ROW("cuGetErrorString", 6000, cuGetErrorString),
    ROW("cuGetErrorName", 6000, cuGetErrorName),
    ROW("cuInit", 2000, cuInit),
    ROW("cuDriverGetVersion", 2020, cuDriverGetVersion),
    ROW("cuGetExportTable", 3000, cuGetExportTable),
    ROW("cuGetProcAddress", 11030, cuGetProcAddress),
    ROW("cuGetProcAddress", 12000, cuGetProcAddress_v2),
    ROW("cuDeviceGet", 2000, cuDeviceGet),
    ROW("cuDeviceGetCount", 2000, cuDeviceGetCount),
    ROW("cuDeviceGetName", 2000, cuDeviceGetName),
    ROW("cuDeviceGetUuid", 9020, cuDeviceGetUuid),
    ROW("cuDeviceGetUuid", 11040, cuDeviceGetUuid_v2),
    ROW("cuDeviceTotalMem", 2000, cuDeviceTotalMem),
    ROW("cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2),
    ROW("cuDeviceGetAttribute", 2000, cuDeviceGetAttribute),
    ROW("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain),
    ROW("cuDevicePrimaryCtxRelease", 7000, cuDevicePrimaryCtxRelease),
    ROW("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2),
    ROW("cuDevicePrimaryCtxReset", 7000, cuDevicePrimaryCtxReset),
    ROW("cuDevicePrimaryCtxReset", 11000, cuDevicePrimaryCtxReset_v2),
    ROW("cuDevicePrimaryCtxGetState", 7000, cuDevicePrimaryCtxGetState),
    ROW("cuDevicePrimaryCtxSetFlags", 7000, cuDevicePrimaryCtxSetFlags),
    ROW("cuDevicePrimaryCtxSetFlags", 11000, cuDevicePrimaryCtxSetFlags_v2),
    ROW("cuDeviceGetDefaultMemPool", 11020, cuDeviceGetDefaultMemPool),
    ROW("cuDeviceGetMemPool", 11020, cuDeviceGetMemPool),
    ROW("cuCtxCreate", 2000, cuCtxCreate),
    ROW("cuCtxCreate", 3020, cuCtxCreate_v2),
    ROW("cuCtxCreate", 11040, cuCtxCreate_v3),
    ROW("cuCtxCreate", 12050, cuCtxCreate_v4),
    ROW("cuCtxDestroy", 2000, cuCtxDestroy),
    ROW("cuCtxDestroy", 4000, cuCtxDestroy_v2),
    ROW("cuCtxGetCurrent", 4000, cuCtxGetCurrent),
    ROW("cuCtxSetCurrent", 4000, cuCtxSetCurrent),
    ROW("cuCtxPushCurrent", 2000, cuCtxPushCurrent),
    ROW("cuCtxPushCurrent", 4000, cuCtxPushCurrent_v2),
    ROW("cuCtxPopCurrent", 2000, cuCtxPopCurrent),
    ROW("cuCtxPopCurrent", 4000, cuCtxPopCurrent_v2),
    ROW("cuCtxGetDevice", 2000, cuCtxGetDevice),
    ROW("cuCtxSynchronize", 2000, cuCtxSynchronize),
    ROW("cuMemGetInfo", 2000, cuMemGetInfo),
    ROW("cuMemGetInfo", 3020, cuMemGetInfo_v2),
    ROW("cuMemAlloc", 2000, cuMemAlloc),
    ROW("cuMemAlloc", 3020, cuMemAlloc_v2),
    ROW("cuMemAllocPitch", 2000, cuMemAllocPitch),
    ROW("cuMemAllocPitch", 3020, cuMemAllocPitch_v2),
    ROW("cuMemAllocManaged", 6000, cuMemAllocManaged),
    ROW("cuMemFree", 2000, cuMemFree),
    ROW("cuMemFree", 3020, cuMemFree_v2),
    ROW("cuMemGetAddressRange", 2000, cuMemGetAddressRange),
    ROW("cuMemGetAddressRange", 3020, cuMemGetAddressRange_v2),
    ROW("cuMemAllocHost", 2000, cuMemAllocHost),
    ROW("cuMemAllocHost", 3020, cuMemAllocHost_v2),
    ROW("cuMemHostAlloc", 2020, cuMemHostAlloc),
    ROW("cuMemFreeHost", 2000, cuMemFreeHost),
    ROW("cuMemCreate", 10020, cuMemCreate),
    ROW("cuMemRelease", 10020, cuMemRelease),
    ROW("cuMemAddressReserve", 10020, cuMemAddressReserve),
    ROW("cuMemAddressFree", 10020, cuMemAddressFree),
    ROW("cuMemMap", 10020, cuMemMap),
    ROW("cuMemUnmap", 10020, cuMemUnmap),
    ROW("cuMemSetAccess", 10020, cuMemSetAccess),
    ROW("cuMemGetAllocationGranularity", 10020, cuMemGetAllocationGranularity),
    ROW("cuMemGetAllocationPropertiesFromHandle", 10020, cuMemGetAllocationPropertiesFromHandle),
    ROWP("cuMemAllocAsync", 11020, cuMemAllocAsync),
    ROWP("cuMemFreeAsync", 11020, cuMemFreeAsync),
    ROWP("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync),
    ROW("cuMemPoolCreate", 11020, cuMemPoolCreate),
    ROW("cuMemPoolDestroy", 11020, cuMemPoolDestroy),
    ROW("cuMemPoolTrimTo", 11020, cuMemPoolTrimTo),
    ROW("cuArrayCreate", 2000, cuArrayCreate),
    ROW("cuArrayCreate", 3020, cuArrayCreate_v2),
    ROW("cuArray3DCreate", 2000, cuArray3DCreate),
    ROW("cuArray3DCreate", 3020, cuArray3DCreate_v2),
    ROW("cuArrayDestroy", 2000, cuArrayDestroy),
    ROW("cuMipmappedArrayCreate", 5000, cuMipmappedArrayCreate),
    ROW("cuMipmappedArrayDestroy", 5000, cuMipmappedArrayDestroy),
    ROW("cuModuleLoad", 2000, cuModuleLoad),
    ROW("cuModuleLoadData", 2000, cuModuleLoadData),
    ROW("cuModuleGetFunction", 2000, cuModuleGetFunction),
    ROW("cuModuleUnload", 2000, cuModuleUnload),
    ROW("cuStreamCreate", 2000, cuStreamCreate),
    ROW("cuStreamDestroy", 2000, cuStreamDestroy),
    ROW("cuStreamDestroy", 4000, cuStreamDestroy_v2),
    ROWP("cuStreamSynchronize", 2000, cuStreamSynchronize),
    ROWP("cuLaunchKernel", 4000, cuLaunchKernel),
    ROWP("cuLaunchKernelEx", 11060, cuLaunchKernelEx),
    ROWP("cuLaunchCooperativeKernel", 9000, cuLaunchCooperativeKernel),
    ROW("cuGraphCreate", 10000, cuGraphCreate),
    ROW("cuGraphDestroy", 10000, cuGraphDestroy),
    ROW("cuGraphAddKernelNode", 10000, cuGraphAddKernelNode),
    ROW("cuGraphAddKernelNode", 12000, cuGraphAddKernelNode_v2),
    ROW("cuGraphAddChildGraphNode", 10000, cuGraphAddChildGraphNode),
    ROW("cuGraphAddEmptyNode", 10000, cuGraphAddEmptyNode),
    ROW("cuGraphConditionalHandleCreate", 12030, cuGraphConditionalHandleCreate),
    ROW("cuGraphAddNode", 12020, cuGraphAddNode),
    ROW("cuGraphAddNode", 13000, cuGraphAddNode_v2),
    ROW("cuGraphGetNodes", 10000, cuGraphGetNodes),
    ROW("cuGraphNodeGetType", 10000, cuGraphNodeGetType),
    ROW("cuGraphKernelNodeGetParams", 10000, cuGraphKernelNodeGetParams),
    ROW("cuGraphKernelNodeGetParams", 12000, cuGraphKernelNodeGetParams_v2),
    ROW("cuGraphChildGraphNodeGetGraph", 10000, cuGraphChildGraphNodeGetGraph),
    ROW("cuGraphNodeGetParams", 13020, cuGraphNodeGetParams),
    /* From 12.0 the base name has cuGraphInstantiateWithFlags's ABI. */
    ROW("cuGraphInstantiate", 10000, cuGraphInstantiate),
    ROW("cuGraphInstantiate", 11000, cuGraphInstantiate_v2),
    ROW("cuGraphInstantiate", 12000, graph_instantiate_v12000),
    ROW("cuGraphInstantiateWithFlags", 11040, cuGraphInstantiateWithFlags),
    ROWP("cuGraphInstantiateWithParams", 12000, cuGraphInstantiateWithParams),
    ROW("cuGraphExecUpdate", 10020, cuGraphExecUpdate),
    ROW("cuGraphExecUpdate", 12000, cuGraphExecUpdate_v2),
    ROW("cuGraphExecDestroy", 10000, cuGraphExecDestroy),
    ROWP("cuGraphLaunch", 10000, cuGraphLaunch),
};

static CUresult proc_address(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status)
{
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    if (flags & ~(cuuint64_t)3 || flags == 3)
        return CUDA_ERROR_INVALID_VALUE;
    const struct proc_row *best = NULL;
    int known = 0;
    for (size_t i = 0; i < sizeof g_procs / sizeof g_procs[0]; i++) {
        const struct proc_row *r = &g_procs[i];
        if (strcmp(r->name, symbol) != 0)
            continue;
        known = 1;
        if (r->version <= cudaVersion && (!best || r->version > best->version))
            best = r;
    }
    if (!best) {
        if (status)
            *status = known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                            : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_ERROR_NOT_FOUND;
    }
    /* _ptsz variants exist from CUDA 7.0 (per-thread default stream). */
    int ptds = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && cudaVersion >= 7000;
    *pfn = ptds && best->ptsz ? best->ptsz : best->fn;
    if (status)
        *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    return proc_address(symbol, pfn, cudaVersion, flags, NULL);
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus)
{
    return proc_address(symbol, pfn, cudaVersion, flags, symbolStatus);
}

/* ---------------- test-only exports ---------------- */

/* The state file, mapped from the environment when cuInit has not run. */
static struct fake_state *test_state(void)
{
    if (g_st)
        return g_st;
    fake_config_load(&g_cfg);
    g_st = fake_state_map(g_cfg.state_path);
    return g_st;
}

unsigned long long fakeGpuRealUsed(int physical_dev)
{
    unsigned long long v = 0;
    pthread_mutex_lock(&g_mu);
    struct fake_state *s = test_state();
    if (s && physical_dev >= 0 && physical_dev < FAKE_MAX_DEV) {
        fake_prune_dead(s);
        v = atomic_load(&s->dev[physical_dev].used);
    }
    pthread_mutex_unlock(&g_mu);
    return v;
}

unsigned long long fakeGpuProcessUsed(int physical_dev, int pid)
{
    unsigned long long v = 0;
    pthread_mutex_lock(&g_mu);
    struct fake_state *s = test_state();
    if (s && physical_dev >= 0 && physical_dev < FAKE_MAX_DEV && pid > 0)
        for (int i = 0; i < FAKE_MAX_PROC; i++)
            if (atomic_load(&s->proc[i].pid) == pid)
                v += atomic_load(&s->proc[i].dev[physical_dev].used);
    pthread_mutex_unlock(&g_mu);
    return v;
}

unsigned long long fakeGpuBusyNs(int physical_dev)
{
    unsigned long long v = 0;
    pthread_mutex_lock(&g_mu);
    struct fake_state *s = test_state();
    if (s && physical_dev >= 0 && physical_dev < FAKE_MAX_DEV)
        v = atomic_load(&s->dev[physical_dev].busy_ns);
    pthread_mutex_unlock(&g_mu);
    return v;
}

void fakeCudaResetState(void)
{
    pthread_mutex_lock(&g_mu);
    struct fake_state *s = test_state();
    if (s)
        fake_state_zero(s);
    /* Everything we had is gone with it: contexts become inactive, memory
     * objects unknown. Context structs stay allocated (threads may hold them). */
    fk_mem_forget();
    fk_exec_forget();
    for (struct fctx *c = g_ctxs; c; c = c->next) {
        c->alive = 0;
        c->refcount = 0;
        c->last_end = 0;
    }
    t_depth = 0;
    g_my_idx = -1;
    pthread_mutex_unlock(&g_mu);
}
