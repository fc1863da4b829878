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

struct fgraph;

/* A graph node (no edges: the fake runs a graph's nodes as one piece of work). */
struct fnode {
    CUgraphNodeType type;
    CUDA_KERNEL_NODE_PARAMS_v2 kernel; /* kernel: as given (v1 callers: kern, ctx zero) */
    struct fgraph *child;              /* child graph: the node's own copy */
    CUDA_CONDITIONAL_NODE_PARAMS cond; /* conditional: phGraph_out is the node's own array */
    struct fnode *next;
};

/* A graph (exec 0) holds nodes in creation order; an executable graph (exec 1) holds the blocks
 * one launch runs, counted at instantiation: every kernel node's grid, child graphs'
 * recursively, a conditional node's first body once; FAKE_GRAPH_BLOCKS for a graph without
 * nodes. It also keeps its graph's top-level node types, which an update may not change. Child
 * and body graphs belong to their node (owned = 1) and go with it. */
struct fgraph {
    int exec;
    int owned;
    struct fnode *nodes;
    uint64_t blocks;
    CUgraphNodeType *types;
    size_t ntypes;
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

static void graph_free(struct fgraph *g);

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
    while (g_graphs)
        graph_free(g_graphs);
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

static struct fgraph *graph_new(int exec, int owned)
{
    struct fgraph *g = calloc(1, sizeof *g);
    if (!g)
        return NULL;
    g->exec = exec;
    g->owned = owned;
    g->next = g_graphs;
    g_graphs = g;
    return g;
}

/* Unlinks `g` and frees it with its nodes and their child and body graphs. */
static void graph_free(struct fgraph *g)
{
    for (struct fgraph **pp = &g_graphs; *pp; pp = &(*pp)->next)
        if (*pp == g) {
            *pp = g->next;
            break;
        }
    while (g->nodes) {
        struct fnode *n = g->nodes;
        g->nodes = n->next;
        if (n->child)
            graph_free(n->child);
        for (unsigned i = 0; n->cond.phGraph_out && i < n->cond.size; i++)
            if (n->cond.phGraph_out[i])
                graph_free((struct fgraph *)n->cond.phGraph_out[i]);
        free(n->cond.phGraph_out);
        free(n);
    }
    free(g->types);
    free(g);
}

static struct fnode *node_find(CUgraphNode h)
{
    for (struct fgraph *g = g_graphs; g; g = g->next)
        for (struct fnode *n = g->nodes; n; n = n->next)
            if ((CUgraphNode)n == h)
                return n;
    return NULL;
}

/* Appends a node of `type` to graph `hg` (dependencies are accepted and ignored). */
static CUresult node_add(CUgraphNode *out, CUgraph hg, const CUgraphNode *deps, size_t ndeps,
                         CUgraphNodeType type, struct fnode **made)
{
    FK_REQUIRE_INIT();
    struct fgraph *g = graph_find(hg, 0);
    if (!out || !g || (ndeps && !deps))
        return CUDA_ERROR_INVALID_VALUE;
    struct fnode *n = calloc(1, sizeof *n);
    if (!n)
        return CUDA_ERROR_OUT_OF_MEMORY;
    n->type = type;
    struct fnode **tail = &g->nodes;
    while (*tail)
        tail = &(*tail)->next;
    *tail = n;
    *out = (CUgraphNode)n;
    *made = n;
    return CUDA_SUCCESS;
}

static CUresult kernel_node_add(CUgraphNode *out, CUgraph hg, const CUgraphNode *deps,
                                size_t ndeps, const CUDA_KERNEL_NODE_PARAMS_v2 *p)
{
    if (!p || !p->gridDimX || !p->gridDimY || !p->gridDimZ || !p->blockDimX || !p->blockDimY ||
        !p->blockDimZ || (!p->func && !p->kern))
        return CUDA_ERROR_INVALID_VALUE;
    struct fnode *n;
    CUresult r = node_add(out, hg, deps, ndeps, CU_GRAPH_NODE_TYPE_KERNEL, &n);
    if (r == CUDA_SUCCESS)
        n->kernel = *p;
    return r;
}

/* A copy of graph `src` owned by a node: kernel, empty and child-graph nodes (a child graph
 * may not hold conditional nodes). */
static CUresult graph_clone(const struct fgraph *src, struct fgraph **out)
{
    struct fgraph *g = graph_new(0, 1);
    if (!g)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct fnode **tail = &g->nodes;
    for (const struct fnode *s = src->nodes; s; s = s->next) {
        struct fnode *n = calloc(1, sizeof *n);
        CUresult r = !n ? CUDA_ERROR_OUT_OF_MEMORY
                        : s->type == CU_GRAPH_NODE_TYPE_CONDITIONAL ? CUDA_ERROR_NOT_SUPPORTED
                                                                    : CUDA_SUCCESS;
        if (r == CUDA_SUCCESS) {
            n->type = s->type;
            n->kernel = s->kernel;
            *tail = n;
            tail = &n->next;
            if (s->child)
                r = graph_clone(s->child, &n->child);
        } else {
            free(n);
        }
        if (r != CUDA_SUCCESS) {
            graph_free(g);
            return r;
        }
    }
    *out = g;
    return CUDA_SUCCESS;
}

static CUresult child_node_add(CUgraphNode *out, CUgraph hg, const CUgraphNode *deps,
                               size_t ndeps, CUgraph child)
{
    FK_REQUIRE_INIT();
    struct fgraph *c = graph_find(child, 0);
    if (!c || child == hg)
        return CUDA_ERROR_INVALID_VALUE;
    struct fgraph *copy;
    CUresult r = graph_clone(c, &copy);
    if (r)
        return r;
    struct fnode *n;
    r = node_add(out, hg, deps, ndeps, CU_GRAPH_NODE_TYPE_GRAPH, &n);
    if (r == CUDA_SUCCESS)
        n->child = copy;
    else
        graph_free(copy);
    return r;
}

static CUresult cond_handle_create(CUgraphConditionalHandle *out, CUgraph hg, CUcontext ctx)
{
    static CUgraphConditionalHandle next = 1;
    FK_REQUIRE_INIT();
    if (!out || !graph_find(hg, 0) || !ctx)
        return CUDA_ERROR_INVALID_VALUE;
    *out = next++;
    return CUDA_SUCCESS;
}

/* cuGraphAddNode: kernel and conditional nodes. A conditional node gets `size` empty body
 * graphs, returned in phGraph_out as the real driver does. */
static CUresult generic_node_add(CUgraphNode *out, CUgraph hg, const CUgraphNode *deps,
                                 size_t ndeps, CUgraphNodeParams *p)
{
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    if (p->type == CU_GRAPH_NODE_TYPE_KERNEL)
        return kernel_node_add(out, hg, deps, ndeps, &p->kernel);
    if (p->type != CU_GRAPH_NODE_TYPE_CONDITIONAL)
        return CUDA_ERROR_NOT_SUPPORTED;
    CUDA_CONDITIONAL_NODE_PARAMS *c = &p->conditional;
    unsigned max = c->type == CU_GRAPH_COND_TYPE_IF ? 2 : c->type == CU_GRAPH_COND_TYPE_WHILE ? 1
                   : c->type == CU_GRAPH_COND_TYPE_SWITCH ? 64 : 0;
    if (!c->handle || !c->ctx || c->size == 0 || c->size > max)
        return CUDA_ERROR_INVALID_VALUE;
    CUgraph *bodies = calloc(c->size, sizeof *bodies);
    if (!bodies)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct fnode *n;
    CUresult r = node_add(out, hg, deps, ndeps, CU_GRAPH_NODE_TYPE_CONDITIONAL, &n);
    if (r) {
        free(bodies);
        return r;
    }
    n->cond = *c;
    n->cond.phGraph_out = bodies;
    for (unsigned i = 0; i < c->size; i++) {
        bodies[i] = (CUgraph)graph_new(0, 1);
        if (!bodies[i])
            return CUDA_ERROR_OUT_OF_MEMORY; /* the node keeps the bodies it has */
    }
    c->phGraph_out = bodies;
    return CUDA_SUCCESS;
}

static CUresult get_nodes(CUgraph hg, CUgraphNode *nodes, size_t *num)
{
    FK_REQUIRE_INIT();
    struct fgraph *g = graph_find(hg, 0);
    if (!g || !num)
        return CUDA_ERROR_INVALID_VALUE;
    size_t n = 0;
    for (struct fnode *x = g->nodes; x; x = x->next) {
        if (nodes && n < *num)
            nodes[n] = (CUgraphNode)x;
        n++;
    }
    if (nodes) {
        for (size_t i = n; i < *num; i++)
            nodes[i] = NULL;
        if (n > *num)
            n = *num;
    }
    *num = n;
    return CUDA_SUCCESS;
}

static CUresult node_type(CUgraphNode h, CUgraphNodeType *type)
{
    FK_REQUIRE_INIT();
    struct fnode *n = node_find(h);
    if (!n || !type)
        return CUDA_ERROR_INVALID_VALUE;
    *type = n->type;
    return CUDA_SUCCESS;
}

static CUresult kernel_params(CUgraphNode h, void *out, size_t size)
{
    FK_REQUIRE_INIT();
    struct fnode *n = node_find(h);
    if (!n || !out || n->type != CU_GRAPH_NODE_TYPE_KERNEL)
        return CUDA_ERROR_INVALID_VALUE;
    memcpy(out, &n->kernel, size);
    return CUDA_SUCCESS;
}

static CUresult child_graph(CUgraphNode h, CUgraph *out)
{
    FK_REQUIRE_INIT();
    struct fnode *n = node_find(h);
    if (!n || !out || n->type != CU_GRAPH_NODE_TYPE_GRAPH)
        return CUDA_ERROR_INVALID_VALUE;
    *out = (CUgraph)n->child;
    return CUDA_SUCCESS;
}

/* cuGraphNodeGetParams: kernel, empty and conditional nodes; conditional nodes only from CUDA
 * 13.2 (FAKE_CUDA_VERSION), as the real driver: cuda.core reads a conditional node's bodies back
 * "on CUDA 13.2+" only, and the 580 driver (CUDA 13.0) does not report them. */
static CUresult node_params(CUgraphNode h, CUgraphNodeParams *p)
{
    FK_REQUIRE_INIT();
    struct fnode *n = node_find(h);
    if (!n || !p)
        return CUDA_ERROR_INVALID_VALUE;
    memset(p, 0, sizeof *p);
    p->type = n->type;
    if (n->type == CU_GRAPH_NODE_TYPE_KERNEL)
        p->kernel = n->kernel;
    else if (n->type == CU_GRAPH_NODE_TYPE_CONDITIONAL && g_cfg.cuda_version >= 13020)
        p->conditional = n->cond;
    else if (n->type != CU_GRAPH_NODE_TYPE_EMPTY)
        return CUDA_ERROR_NOT_SUPPORTED;
    return CUDA_SUCCESS;
}

static uint64_t sat_add(uint64_t a, uint64_t b) { return a + b < a ? UINT64_MAX : a + b; }

/* The blocks one launch of `g` runs (see struct fgraph). */
static uint64_t graph_blocks(const struct fgraph *g)
{
    uint64_t sum = 0;
    for (const struct fnode *n = g->nodes; n; n = n->next) {
        if (n->type == CU_GRAPH_NODE_TYPE_KERNEL)
            sum = sat_add(sum, (uint64_t)n->kernel.gridDimX * n->kernel.gridDimY * n->kernel.gridDimZ);
        else if (n->type == CU_GRAPH_NODE_TYPE_GRAPH)
            sum = sat_add(sum, graph_blocks(n->child));
        else if (n->type == CU_GRAPH_NODE_TYPE_CONDITIONAL && n->cond.size && n->cond.phGraph_out[0])
            sum = sat_add(sum, graph_blocks((struct fgraph *)n->cond.phGraph_out[0]));
    }
    return sum;
}

static uint64_t exec_blocks(const struct fgraph *g)
{
    return g->nodes ? graph_blocks(g) : g_cfg.graph_blocks;
}

static CUresult graph_create(CUgraph *ph, unsigned int flags)
{
    FK_REQUIRE_INIT();
    if (!ph || flags)
        return CUDA_ERROR_INVALID_VALUE;
    struct fgraph *g = graph_new(0, 0);
    if (!g)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *ph = (CUgraph)g;
    return CUDA_SUCCESS;
}

static CUresult graph_instantiate(CUgraphExec *ph, CUgraph hg)
{
    FK_REQUIRE_INIT();
    struct fgraph *g = graph_find(hg, 0);
    if (!ph || !g)
        return CUDA_ERROR_INVALID_VALUE;
    size_t n = 0;
    for (struct fnode *x = g->nodes; x; x = x->next)
        n++;
    CUgraphNodeType *types = calloc(n ? n : 1, sizeof *types);
    struct fgraph *e = types ? graph_new(1, 0) : NULL;
    if (!e) {
        free(types);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    n = 0;
    for (struct fnode *x = g->nodes; x; x = x->next)
        types[n++] = x->type;
    e->types = types;
    e->ntypes = n;
    e->blocks = exec_blocks(g);
    *ph = (CUgraphExec)e;
    return CUDA_SUCCESS;
}

/* The legacy five-argument cuGraphInstantiate(_v2): refuses a graph with a conditional node at
 * its top level, as the 580 driver does (CUDA_ERROR_NOT_SUPPORTED). */
static CUresult legacy_instantiate(CUgraphExec *ph, CUgraph hg)
{
    FK_REQUIRE_INIT();
    struct fgraph *g = graph_find(hg, 0);
    for (struct fnode *x = g ? g->nodes : NULL; x; x = x->next)
        if (x->type == CU_GRAPH_NODE_TYPE_CONDITIONAL)
            return CUDA_ERROR_NOT_SUPPORTED;
    return graph_instantiate(ph, hg);
}

static CUresult instantiate_with_params(CUgraphExec *ph, CUgraph hg, CUDA_GRAPH_INSTANTIATE_PARAMS *p)
{
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = graph_instantiate(ph, hg);
    p->hErrNode_out = NULL;
    p->result_out = r ? CUDA_GRAPH_INSTANTIATE_ERROR : CUDA_GRAPH_INSTANTIATE_SUCCESS;
    return r;
}

/* Whether graph `g` has the top-level node types executable graph `e` was instantiated with. */
static int same_topology(const struct fgraph *e, const struct fgraph *g)
{
    size_t i = 0;
    for (const struct fnode *x = g->nodes; x; x = x->next, i++)
        if (i == e->ntypes || e->types[i] != x->type)
            return 0;
    return i == e->ntypes;
}

/* The executable graph takes `hg`'s parameters (its blocks) if `hg` has its topology. */
static CUresult exec_update(CUgraphExec he, CUgraph hg, CUgraphExecUpdateResult *result)
{
    FK_REQUIRE_INIT();
    struct fgraph *e = graph_find(he, 1), *g = graph_find(hg, 0);
    if (!e || !g || !result)
        return CUDA_ERROR_INVALID_VALUE;
    if (!same_topology(e, g)) {
        *result = CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
        return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
    }
    *result = CU_GRAPH_EXEC_UPDATE_SUCCESS;
    e->blocks = exec_blocks(g);
    return CUDA_SUCCESS;
}

static CUresult graph_launch(CUgraphExec h, CUstream hs)
{
    struct fctx *c;
    void *st;
    FK_REQUIRE_INIT();
    struct fgraph *e = graph_find(h, 1);
    if (!e)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = fk_stream(hs, &c, &st);
    if (r)
        return r;
    return enqueue(c, st, e->blocks);
}

static CUresult graph_destroy(const void *h, int exec)
{
    FK_REQUIRE_INIT();
    struct fgraph *g = graph_find(h, exec);
    if (!g || g->owned)
        return CUDA_ERROR_INVALID_VALUE;
    graph_free(g);
    return CUDA_SUCCESS;
}

CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags) { FK_LOCKED(graph_create(phGraph, flags)); }
CUresult cuGraphDestroy(CUgraph hGraph) { FK_LOCKED(graph_destroy(hGraph, 0)); }

CUresult cuGraphAddKernelNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                              const CUgraphNode *dependencies, size_t numDependencies,
                              const CUDA_KERNEL_NODE_PARAMS_v1 *nodeParams)
{
    CUDA_KERNEL_NODE_PARAMS_v2 p;
    memset(&p, 0, sizeof p);
    if (nodeParams)
        memcpy(&p, nodeParams, sizeof *nodeParams);
    FK_LOCKED(kernel_node_add(phGraphNode, hGraph, dependencies, numDependencies,
                              nodeParams ? &p : NULL));
}

CUresult cuGraphAddKernelNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph,
                                 const CUgraphNode *dependencies, size_t numDependencies,
                                 const CUDA_KERNEL_NODE_PARAMS_v2 *nodeParams)
{
    FK_LOCKED(kernel_node_add(phGraphNode, hGraph, dependencies, numDependencies, nodeParams));
}

CUresult cuGraphAddChildGraphNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                  const CUgraphNode *dependencies, size_t numDependencies,
                                  CUgraph childGraph)
{
    FK_LOCKED(child_node_add(phGraphNode, hGraph, dependencies, numDependencies, childGraph));
}

static CUresult empty_node_add(CUgraphNode *out, CUgraph hg, const CUgraphNode *deps, size_t ndeps)
{
    struct fnode *n;
    return node_add(out, hg, deps, ndeps, CU_GRAPH_NODE_TYPE_EMPTY, &n);
}

CUresult cuGraphAddEmptyNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                             const CUgraphNode *dependencies, size_t numDependencies)
{
    FK_LOCKED(empty_node_add(phGraphNode, hGraph, dependencies, numDependencies));
}

CUresult cuGraphConditionalHandleCreate(CUgraphConditionalHandle *pHandle_out, CUgraph hGraph,
                                        CUcontext ctx, unsigned int defaultLaunchValue,
                                        unsigned int flags)
{
    (void)defaultLaunchValue, (void)flags;
    FK_LOCKED(cond_handle_create(pHandle_out, hGraph, ctx));
}

CUresult cuGraphAddNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                        size_t numDependencies, CUgraphNodeParams *nodeParams)
{
    FK_LOCKED(generic_node_add(phGraphNode, hGraph, dependencies, numDependencies, nodeParams));
}

CUresult cuGraphAddNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                           const CUgraphEdgeData *dependencyData, size_t numDependencies,
                           CUgraphNodeParams *nodeParams)
{
    (void)dependencyData;
    FK_LOCKED(generic_node_add(phGraphNode, hGraph, dependencies, numDependencies, nodeParams));
}

CUresult cuGraphGetNodes(CUgraph hGraph, CUgraphNode *nodes, size_t *numNodes)
{
    FK_LOCKED(get_nodes(hGraph, nodes, numNodes));
}
CUresult cuGraphNodeGetType(CUgraphNode hNode, CUgraphNodeType *type) { FK_LOCKED(node_type(hNode, type)); }
CUresult cuGraphKernelNodeGetParams(CUgraphNode hNode, CUDA_KERNEL_NODE_PARAMS_v1 *nodeParams)
{
    FK_LOCKED(kernel_params(hNode, nodeParams, sizeof *nodeParams));
}
CUresult cuGraphKernelNodeGetParams_v2(CUgraphNode hNode, CUDA_KERNEL_NODE_PARAMS_v2 *nodeParams)
{
    FK_LOCKED(kernel_params(hNode, nodeParams, sizeof *nodeParams));
}
CUresult cuGraphChildGraphNodeGetGraph(CUgraphNode hNode, CUgraph *phGraph)
{
    FK_LOCKED(child_graph(hNode, phGraph));
}
CUresult cuGraphNodeGetParams(CUgraphNode hNode, CUgraphNodeParams *nodeParams)
{
    FK_LOCKED(node_params(hNode, nodeParams));
}

CUresult cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                            char *logBuffer, size_t bufferSize)
{
    (void)phErrorNode, (void)logBuffer, (void)bufferSize;
    FK_LOCKED(legacy_instantiate(phGraphExec, hGraph));
}
CUresult cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                               char *logBuffer, size_t bufferSize)
{
    (void)phErrorNode, (void)logBuffer, (void)bufferSize;
    FK_LOCKED(legacy_instantiate(phGraphExec, hGraph));
}
CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
                                     unsigned long long flags)
{
    (void)flags;
    FK_LOCKED(graph_instantiate(phGraphExec, hGraph));
}
CUresult cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
                                      CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams)
{
    FK_LOCKED(instantiate_with_params(phGraphExec, hGraph, instantiateParams));
}
CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *phGraphExec, CUgraph hGraph,
                                           CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams)
{
    FK_LOCKED(instantiate_with_params(phGraphExec, hGraph, instantiateParams));
}
CUresult cuGraphExecUpdate(CUgraphExec hGraphExec, CUgraph hGraph, CUgraphNode *hErrorNode_out,
                           CUgraphExecUpdateResult *updateResult_out)
{
    if (hErrorNode_out)
        *hErrorNode_out = NULL;
    FK_LOCKED(exec_update(hGraphExec, hGraph, updateResult_out));
}
CUresult cuGraphExecUpdate_v2(CUgraphExec hGraphExec, CUgraph hGraph,
                              CUgraphExecUpdateResultInfo *resultInfo)
{
    if (!resultInfo)
        return CUDA_ERROR_INVALID_VALUE;
    resultInfo->errorNode = resultInfo->errorFromNode = NULL;
    FK_LOCKED(exec_update(hGraphExec, hGraph, &resultInfo->result));
}
CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) { FK_LOCKED(graph_destroy(hGraphExec, 1)); }
CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) { FK_LOCKED(graph_launch(hGraphExec, hStream)); }
CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
    FK_LOCKED(graph_launch(hGraphExec, hStream));
}
