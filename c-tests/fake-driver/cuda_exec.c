/*
 * cuda_exec.c: modules, streams, graphs and kernel launches of the fake
 * libcuda.
 *
 * A kernel does nothing but occupy its device: gridDim.x*y*z blocks take
 * blocks * FAKE_NS_PER_BLOCK ns, queued after all work already queued on that
 * physical device by any process (the busy timeline in the state file).
 * Launches return at once; synchronisation sleeps until the work is done.
 */
#define _GNU_SOURCE
#include "cuda_internal.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct fmod;

struct ffunc {
    char *name;
    struct fmod *mod;
    struct ffunc *next;
};

struct fmod {
    struct fctx *ctx;
    struct ffunc *funcs;
    struct fmod *next;
};

struct fstream {
    struct fctx *ctx;
    unsigned flags;
    uint64_t last_end; /* end of the last kernel queued on this stream */
    struct fstream *next;
};

/* Graphs carry no nodes: a launch costs FAKE_GRAPH_BLOCKS blocks. */
struct fgraph {
    int exec; /* 0: CUgraph, 1: CUgraphExec */
    struct fgraph *next;
};

static struct fmod *g_mods;
static struct fstream *g_streams;
static struct fgraph *g_graphs;

/* ---------------- lookups ---------------- */

static struct fmod *mod_find(CUmodule h)
{
    for (struct fmod *m = g_mods; m; m = m->next)
        if ((CUmodule)m == h)
            return m;
    return NULL;
}

static struct ffunc *func_find(CUfunction h)
{
    for (struct fmod *m = g_mods; m; m = m->next)
        for (struct ffunc *f = m->funcs; f; f = f->next)
            if ((CUfunction)f == h)
                return f;
    return NULL;
}

static struct fgraph *graph_find(const void *h, int exec)
{
    for (struct fgraph *g = g_graphs; g; g = g->next)
        if ((const void *)g == h && g->exec == exec)
            return g;
    return NULL;
}

CUresult fk_stream(CUstream hs, struct fctx **ctx, void **st)
{
    if (hs == NULL || hs == CU_STREAM_LEGACY || hs == CU_STREAM_PER_THREAD) {
        *st = NULL;
        return fk_current(ctx);
    }
    for (struct fstream *s = g_streams; s; s = s->next)
        if ((CUstream)s == hs) {
            *ctx = s->ctx;
            *st = s;
            return CUDA_SUCCESS;
        }
    return CUDA_ERROR_INVALID_HANDLE;
}

static void mod_free(struct fmod *m)
{
    while (m->funcs) {
        struct ffunc *n = m->funcs->next;
        free(m->funcs->name);
        free(m->funcs);
        m->funcs = n;
    }
    free(m);
}

void fk_exec_ctx_teardown(const struct fctx *c)
{
    for (struct fmod **pp = &g_mods; *pp;) {
        struct fmod *m = *pp;
        if (m->ctx == c) {
            *pp = m->next;
            mod_free(m);
        } else {
            pp = &m->next;
        }
    }
    for (struct fstream **pp = &g_streams; *pp;) {
        struct fstream *s = *pp;
        if (s->ctx == c) {
            *pp = s->next;
            free(s);
        } else {
            pp = &s->next;
        }
    }
}

void fk_exec_forget(void)
{
    while (g_mods) {
        struct fmod *n = g_mods->next;
        mod_free(g_mods);
        g_mods = n;
    }
    while (g_streams) {
        struct fstream *n = g_streams->next;
        free(g_streams);
        g_streams = n;
    }
    while (g_graphs) {
        struct fgraph *n = g_graphs->next;
        free(g_graphs);
        g_graphs = n;
    }
}

/* ---------------- modules ---------------- */

static CUresult mod_new(CUmodule *out)
{
    struct fctx *c;
    CUresult r = fk_current(&c);
    if (r)
        return r;
    struct fmod *m = calloc(1, sizeof *m);
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    m->ctx = c;
    m->next = g_mods;
    g_mods = m;
    *out = (CUmodule)m;
    return CUDA_SUCCESS;
}

static CUresult mod_load(CUmodule *module, const char *fname)
{
    FK_REQUIRE_INIT();
    if (!module || !fname)
        return CUDA_ERROR_INVALID_VALUE;
    if (access(fname, R_OK) != 0)
        return CUDA_ERROR_FILE_NOT_FOUND;
    return mod_new(module);
}

static CUresult mod_load_data(CUmodule *module, const void *image)
{
    FK_REQUIRE_INIT();
    if (!module || !image)
        return CUDA_ERROR_INVALID_VALUE;
    return mod_new(module);
}

/* Every name resolves (the fake has no images to look in); asking twice for
 * one name gives the same handle. */
static CUresult mod_function(CUfunction *hfunc, CUmodule hmod, const char *name)
{
    FK_REQUIRE_INIT();
    if (!hfunc || !name)
        return CUDA_ERROR_INVALID_VALUE;
    struct fmod *m = mod_find(hmod);
    if (!m)
        return CUDA_ERROR_INVALID_HANDLE;
    for (struct ffunc *f = m->funcs; f; f = f->next)
        if (strcmp(f->name, name) == 0) {
            *hfunc = (CUfunction)f;
            return CUDA_SUCCESS;
        }
    struct ffunc *f = calloc(1, sizeof *f);
    char *n = f ? strdup(name) : NULL;
    if (!n) {
        free(f);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    f->name = n;
    f->mod = m;
    f->next = m->funcs;
    m->funcs = f;
    *hfunc = (CUfunction)f;
    return CUDA_SUCCESS;
}

static CUresult mod_unload(CUmodule hmod)
{
    FK_REQUIRE_INIT();
    for (struct fmod **pp = &g_mods; *pp; pp = &(*pp)->next)
        if ((CUmodule)*pp == hmod) {
            struct fmod *m = *pp;
            *pp = m->next;
            mod_free(m);
            return CUDA_SUCCESS;
        }
    return CUDA_ERROR_INVALID_HANDLE;
}

CUresult cuModuleLoad(CUmodule *module, const char *fname) { FK_LOCKED(mod_load(module, fname)); }
CUresult cuModuleLoadData(CUmodule *module, const void *image) { FK_LOCKED(mod_load_data(module, image)); }
CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
    FK_LOCKED(mod_function(hfunc, hmod, name));
}
CUresult cuModuleUnload(CUmodule hmod) { FK_LOCKED(mod_unload(hmod)); }

/* ---------------- streams ---------------- */

static CUresult stream_create(CUstream *ph, unsigned int flags)
{
    struct fctx *c;
    FK_REQUIRE_INIT();
    if (!ph || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = fk_current(&c);
    if (r)
        return r;
    struct fstream *s = calloc(1, sizeof *s);
    if (!s)
        return CUDA_ERROR_OUT_OF_MEMORY;
    s->ctx = c;
    s->flags = flags;
    s->next = g_streams;
    g_streams = s;
    *ph = (CUstream)s;
    return CUDA_SUCCESS;
}

/* Queued work still runs to completion, as on a real device. */
static CUresult stream_destroy(CUstream hs)
{
    FK_REQUIRE_INIT();
    for (struct fstream **pp = &g_streams; *pp; pp = &(*pp)->next)
        if ((CUstream)*pp == hs) {
            struct fstream *s = *pp;
            *pp = s->next;
            free(s);
            return CUDA_SUCCESS;
        }
    return CUDA_ERROR_INVALID_HANDLE;
}

/* The default stream waits for all of its context's work, a stream for its own. */
static CUresult stream_sync(CUstream hs)
{
    struct fctx *c;
    void *st;
    pthread_mutex_lock(&g_mu);
    CUresult r = g_inited ? fk_stream(hs, &c, &st) : CUDA_ERROR_NOT_INITIALIZED;
    uint64_t until = r ? 0 : st ? ((struct fstream *)st)->last_end : c->last_end;
    pthread_mutex_unlock(&g_mu);
    if (r == CUDA_SUCCESS)
        fake_sleep_until(until);
    return r;
}

CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags) { FK_LOCKED(stream_create(phStream, Flags)); }
CUresult cuStreamDestroy(CUstream hStream) { FK_LOCKED(stream_destroy(hStream)); }
CUresult cuStreamDestroy_v2(CUstream hStream) { FK_LOCKED(stream_destroy(hStream)); }
CUresult cuStreamSynchronize(CUstream hStream) { return stream_sync(hStream); }
CUresult cuStreamSynchronize_ptsz(CUstream hStream) { return stream_sync(hStream); }

/* ---------------- launches ---------------- */

/* Queue `blocks` blocks of work on the stream's device. */
static CUresult enqueue(struct fctx *c, void *st, uint64_t blocks)
{
    uint64_t cost;
    if (__builtin_mul_overflow(blocks, g_cfg.ns_per_block, &cost))
        cost = UINT64_MAX / 4; /* absurd but finite */
    uint64_t end = fake_launch(g_st, fk_entry(), c->phys, cost);
    if (end > c->last_end)
        c->last_end = end;
    if (st)
        ((struct fstream *)st)->last_end = end;
    return CUDA_SUCCESS;
}

static CUresult launch(CUfunction hf, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                       unsigned by, unsigned bz, CUstream hs)
{
    struct fctx *c;
    void *st;
    FK_REQUIRE_INIT();
    if (!gx || !gy || !gz || !bx || !by || !bz)
        return CUDA_ERROR_INVALID_VALUE;
    /* The device limits of cuDeviceGetAttribute. */
    if (gy > 65535 || gz > 65535 || gx > 2147483647u || bx > 1024 || by > 1024 || bz > 64 ||
        (uint64_t)bx * by * bz > 1024)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = fk_stream(hs, &c, &st);
    if (r)
        return r;
    struct ffunc *f = func_find(hf);
    if (!f || f->mod->ctx != c) /* unknown, or from another context */
        return CUDA_ERROR_INVALID_HANDLE;
    return enqueue(c, st, (uint64_t)gx * gy * gz);
}

static CUresult launch_ex(const CUlaunchConfig *cfg, CUfunction f)
{
    if (!cfg || (cfg->numAttrs && !cfg->attrs))
        return CUDA_ERROR_INVALID_VALUE;
    return launch(f, cfg->gridDimX, cfg->gridDimY, cfg->gridDimZ, cfg->blockDimX, cfg->blockDimY,
                  cfg->blockDimZ, cfg->hStream);
}

CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                        unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                        unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                        void **kernelParams, void **extra)
{
    (void)sharedMemBytes, (void)kernelParams, (void)extra;
    FK_LOCKED(launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, hStream));
}

CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                             unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                             unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                             void **kernelParams, void **extra)
{
    (void)sharedMemBytes, (void)kernelParams, (void)extra;
    FK_LOCKED(launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, hStream));
}

CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                          void **extra)
{
    (void)kernelParams, (void)extra;
    FK_LOCKED(launch_ex(config, f));
}

CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                               void **extra)
{
    (void)kernelParams, (void)extra;
    FK_LOCKED(launch_ex(config, f));
}

CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                   unsigned int gridDimZ, unsigned int blockDimX,
                                   unsigned int blockDimY, unsigned int blockDimZ,
                                   unsigned int sharedMemBytes, CUstream hStream,
                                   void **kernelParams)
{
    (void)sharedMemBytes, (void)kernelParams;
    FK_LOCKED(launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, hStream));
}

CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                        unsigned int gridDimZ, unsigned int blockDimX,
                                        unsigned int blockDimY, unsigned int blockDimZ,
                                        unsigned int sharedMemBytes, CUstream hStream,
                                        void **kernelParams)
{
    (void)sharedMemBytes, (void)kernelParams;
    FK_LOCKED(launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, hStream));
}

/* ---------------- graphs ---------------- */

static CUresult graph_new(void **out, int exec)
{
    struct fgraph *g = calloc(1, sizeof *g);
    if (!g)
        return CUDA_ERROR_OUT_OF_MEMORY;
    g->exec = exec;
    g->next = g_graphs;
    g_graphs = g;
    *out = g;
    return CUDA_SUCCESS;
}

static CUresult graph_del(const void *h, int exec)
{
    for (struct fgraph **pp = &g_graphs; *pp; pp = &(*pp)->next)
        if ((const void *)*pp == h && (*pp)->exec == exec) {
            struct fgraph *g = *pp;
            *pp = g->next;
            free(g);
            return CUDA_SUCCESS;
        }
    return CUDA_ERROR_INVALID_VALUE;
}

static CUresult graph_create(CUgraph *ph, unsigned int flags)
{
    FK_REQUIRE_INIT();
    if (!ph || flags)
        return CUDA_ERROR_INVALID_VALUE;
    return graph_new((void **)ph, 0);
}

static CUresult graph_instantiate(CUgraphExec *ph, CUgraph g, unsigned long long flags)
{
    (void)flags;
    FK_REQUIRE_INIT();
    if (!ph || !graph_find(g, 0))
        return CUDA_ERROR_INVALID_VALUE;
    return graph_new((void **)ph, 1);
}

static CUresult graph_launch(CUgraphExec h, CUstream hs)
{
    struct fctx *c;
    void *st;
    FK_REQUIRE_INIT();
    if (!graph_find(h, 1))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = fk_stream(hs, &c, &st);
    if (r)
        return r;
    return enqueue(c, st, g_cfg.graph_blocks);
}

static CUresult graph_destroy(const void *h, int exec)
{
    FK_REQUIRE_INIT();
    return graph_del(h, exec);
}

CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags) { FK_LOCKED(graph_create(phGraph, flags)); }
CUresult cuGraphDestroy(CUgraph hGraph) { FK_LOCKED(graph_destroy(hGraph, 0)); }
CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
                                     unsigned long long flags)
{
    FK_LOCKED(graph_instantiate(phGraphExec, hGraph, flags));
}
CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) { FK_LOCKED(graph_destroy(hGraphExec, 1)); }
CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) { FK_LOCKED(graph_launch(hGraphExec, hStream)); }
CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
    FK_LOCKED(graph_launch(hGraphExec, hStream));
}
