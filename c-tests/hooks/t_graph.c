/*
 * t_graph: a CUDA graph's launch costs the SM limiter the blocks of every kernel it runs,
 * counted when the graph is instantiated. Run with an SM limit and
 * GPU_CORE_UTILIZATION_POLICY=force, so that every launch draws its cost from device 0's token
 * bucket; the bucket's `spent` (the region's tail, hami_ext_t) grows by exactly that cost.
 *
 * The graph: a kernel node of 100 blocks (added through the v1 entry point), a child graph
 * holding a 7x3x2 kernel, an empty node and a grandchild graph with an 11-block kernel, and an
 * `if` conditional node whose bodies hold 25 and 60 blocks (the largest body counts once):
 * 100 + 42 + 11 + 60 = 213 blocks. The conditional node is added with cuGraphAddNode or
 * cuGraphAddNode_v2; drivers before CUDA 13.2 do not report its bodies through
 * cuGraphNodeGetParams, so the library records them when the node is added. Every instantiation
 * entry point counts the graph (also the one cuGetProcAddress returns for `cuGraphInstantiate`
 * at CUDA 12.0); the legacy five-argument ones may refuse a graph with a conditional node (the
 * 580 driver does: CUDA_ERROR_NOT_SUPPORTED) and count the graph without it; cuGraphExecUpdate(_v2)
 * recounts; an executable graph destroyed, or instantiated behind the library's back, costs one
 * block; the stand-in GPU runs what it was given (its conditional runs the first body).
 */
#include "common.h"

#define PLAIN (100u + 42u + 11u)
#define WANT (PLAIN + 60u)

/* The stand-in GPU's kernel time on device 0 so far (ns); 0 on a real GPU, where the check that
 * uses it is skipped (the driver has no such count). Looked up at run time, so this test links
 * against the real driver too. */
static unsigned long long fake_busy_ns(void)
{
    unsigned long long (*f)(int) = (unsigned long long (*)(int))dlsym(RTLD_DEFAULT, "fakeGpuBusyNs");
    return f ? f(0) : 0;
}

/* Blocks spent on region device 0 by every launch so far. */
static unsigned long long spent(void)
{
    const char *path = getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE");
    unsigned long long v = 0;
    int fd = open(path, O_RDONLY);
    off_t at = EXT_OFFSET + offsetof(hami_ext_t, buckets) + offsetof(SmBucket, spent);
    if (fd < 0 || pread(fd, &v, sizeof v, at) != (ssize_t)sizeof v)
        v = ~0ULL;
    if (fd >= 0)
        close(fd);
    return v;
}

/* Blocks one launch of `ge` costs the limiter. */
static unsigned long long cost(CUgraphExec ge)
{
    unsigned long long b = spent();
    CU(cuGraphLaunch(ge, NULL));
    return spent() - b;
}

typedef CUresult (*add_node_v2_fn)(CUgraphNode *, CUgraph, const CUgraphNode *, const void *,
                                   size_t, CUgraphNodeParams *);

/* How build() adds the conditional node. */
enum cond { NO_COND, COND_V1, COND_V2 };

/* The graph described above, with `top` blocks in its first node and `body0`, `body1` in the
 * conditional's bodies. */
static CUgraph build(CUfunction f, unsigned top, unsigned body0, unsigned body1, enum cond how)
{
    CUgraph g, child, grand;
    CUgraphNode n;
    CUDA_KERNEL_NODE_PARAMS_v2 k = kernel_node(f, 11, 1, 1);
    CU(cuGraphCreate(&grand, 0));
    CU(cuGraphAddKernelNode_v2(&n, grand, NULL, 0, &k));
    CU(cuGraphCreate(&child, 0));
    k = kernel_node(f, 7, 3, 2);
    CU(cuGraphAddKernelNode_v2(&n, child, NULL, 0, &k));
    CU(cuGraphAddEmptyNode(&n, child, NULL, 0));
    CU(cuGraphAddChildGraphNode(&n, child, NULL, 0, grand));
    CU(cuGraphCreate(&g, 0));
    k = kernel_node(f, top, 1, 1);
    CUDA_KERNEL_NODE_PARAMS_v1 k1;
    memcpy(&k1, &k, sizeof k1);
    CU(cuGraphAddKernelNode(&n, g, NULL, 0, &k1));
    CU(cuGraphAddChildGraphNode(&n, g, NULL, 0, child));
    CU(cuGraphDestroy(child));
    CU(cuGraphDestroy(grand));
    if (how == NO_COND)
        return g;
    CUcontext ctx;
    CU(cuCtxGetCurrent(&ctx));
    CUgraphNodeParams np;
    memset(&np, 0, sizeof np);
    np.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
    np.conditional.type = CU_GRAPH_COND_TYPE_IF;
    np.conditional.size = 2;
    np.conditional.ctx = ctx;
    CU(cuGraphConditionalHandleCreate(&np.conditional.handle, g, ctx, 1, 0));
    if (how == COND_V1) {
        CU(cuGraphAddNode(&n, g, NULL, 0, &np));
    } else {
        /* Through dlsym, as a CUDA 13 program reaches it (the header names it cuGraphAddNode). */
        add_node_v2_fn add = (add_node_v2_fn)dlsym(RTLD_DEFAULT, "cuGraphAddNode_v2");
        CHECK(add != NULL, "cuGraphAddNode_v2 is there");
        if (!add)
            exit(finish());
        CU(add(&n, g, NULL, NULL, 0, &np));
    }
    k = kernel_node(f, body0, 1, 1);
    CU(cuGraphAddKernelNode_v2(&n, np.conditional.phGraph_out[0], NULL, 0, &k));
    k = kernel_node(f, body1, 1, 1);
    CU(cuGraphAddKernelNode_v2(&n, np.conditional.phGraph_out[1], NULL, 0, &k));
    return g;
}

typedef CUresult (*with_flags_fn)(CUgraphExec *, CUgraph, unsigned long long);

int main(void)
{
    g_test = "graph";
    CUcontext ctx = create_context(0);
    CUfunction f = load_spin_kernel();
    CUgraph g = build(f, 100, 25, 60, COND_V1);
    CUgraphExec ge;

    CU(cuGraphInstantiateWithFlags(&ge, g, 0));
    unsigned long long busy = fake_busy_ns(), c = cost(ge);
    CHECK(c == WANT, "cuGraphInstantiateWithFlags: a launch costs %llu blocks (want %u: kernels, "
          "nested child graphs, the larger conditional body)", c, WANT);
    CU(cuCtxSynchronize());
    if (on_fake())
        CHECK(fake_busy_ns() - busy == (100 + 42 + 11 + 25) * env_ull("FAKE_NS_PER_BLOCK", 1000),
              "the stand-in GPU ran the graph's kernels (its conditional: the first body)");
    c = spent();
    CU(cuGraphLaunch_ptsz(ge, CU_STREAM_PER_THREAD));
    CHECK(spent() - c == WANT, "cuGraphLaunch_ptsz costs the same %llu", spent() - c);

    /* An update recounts from the graph it copies the parameters from. */
    CUgraph g2 = build(f, 1000, 3, 2, COND_V2);
    CUgraphExecUpdateResultInfo info;
    CU(cuGraphExecUpdate_v2(ge, g2, &info));
    c = cost(ge);
    CHECK(c == 1000 + 42 + 11 + 3, "after cuGraphExecUpdate_v2 a launch costs %llu (want %u)", c,
          1000 + 42 + 11 + 3);
    CUgraphExecUpdateResult res;
    CU(cuGraphExecUpdate(ge, g, NULL, &res));
    c = cost(ge);
    CHECK(c == WANT, "after cuGraphExecUpdate back: %llu", c);
    CUgraph empty;
    CU(cuGraphCreate(&empty, 0));
    CHECK(cuGraphExecUpdate_v2(ge, empty, &info) != CUDA_SUCCESS && cost(ge) == WANT,
          "a failed update leaves the count");
    /* A graph with a conditional node may have one executable at a time on the real driver (as
     * graphs with device-updatable nodes; a second instantiation returned 801 on driver 580), so
     * each entry point below instantiates it alone and destroys what it made. */
    CU(cuGraphExecDestroy(ge));

    /* Every other entry point. The legacy ones on the graph without its conditional node, and
     * on the whole graph where the driver takes it. */
    CUgraph plain = build(f, 100, 0, 0, NO_COND);
    CUgraphExec e1, e2, e3, e4, l1, l2;
    CU(cuGraphInstantiate(&e1, plain, NULL, NULL, 0));
    CU(cuGraphInstantiate_v2(&e2, plain, NULL, NULL, 0));
    unsigned long long c1 = cost(e1), c2 = cost(e2);
    CHECK(c1 == PLAIN && c2 == PLAIN, "cuGraphInstantiate, _v2 (no conditional node): %llu %llu "
          "(want %u)", c1, c2, PLAIN);
    CUresult r1 = cuGraphInstantiate(&l1, g, NULL, NULL, 0);
    c1 = r1 == CUDA_SUCCESS ? cost(l1) : WANT;
    if (r1 == CUDA_SUCCESS)
        CU(cuGraphExecDestroy(l1));
    CUresult r2 = cuGraphInstantiate_v2(&l2, g, NULL, NULL, 0);
    c2 = r2 == CUDA_SUCCESS ? cost(l2) : WANT;
    if (r2 == CUDA_SUCCESS)
        CU(cuGraphExecDestroy(l2));
    CHECK((r1 == CUDA_SUCCESS || r1 == CUDA_ERROR_NOT_SUPPORTED) &&
              (r2 == CUDA_SUCCESS || r2 == CUDA_ERROR_NOT_SUPPORTED) && c1 == WANT && c2 == WANT,
          "cuGraphInstantiate, _v2 with a conditional node: %d %d (0, or 801 where the driver "
          "refuses), costing %llu %llu (want %u)", (int)r1, (int)r2, c1, c2, WANT);
    CUDA_GRAPH_INSTANTIATE_PARAMS ip;
    memset(&ip, 0, sizeof ip);
    CU(cuGraphInstantiateWithParams(&e3, g, &ip));
    unsigned long long c3 = cost(e3);
    CU(cuGraphExecDestroy(e3));
    CU(cuGraphInstantiateWithParams_ptsz(&e4, g, &ip));
    unsigned long long c4 = cost(e4);
    CU(cuGraphExecDestroy(e4));
    CHECK(c3 == WANT && c4 == WANT, "cuGraphInstantiateWithParams, WithParams_ptsz: %llu %llu "
          "(want %u)", c3, c4, WANT);

    /* The pointer a CUDA 12 runtime gets for "cuGraphInstantiate" has WithFlags's ABI: our hook
     * of the export the driver answers with (cuGraphInstantiateWithFlags on the stand-in,
     * cuGraphInstantiate_v2 on driver 580; t_resolve checks which). */
    with_flags_fn wf = NULL;
    CU(cuGetProcAddress_v2("cuGraphInstantiate", (void **)&wf, 12000, 0, NULL));
    CHECK(wf && ((void *)wf == dlsym(RTLD_DEFAULT, "cuGraphInstantiateWithFlags") ||
                 (void *)wf == dlsym(RTLD_DEFAULT, "cuGraphInstantiate_v2")),
          "cuGetProcAddress(cuGraphInstantiate, 12000) is one of our instantiate hooks");
    CUgraphExec e5 = NULL;
    if (wf) {
        CU(wf(&e5, g, 0));
        c = cost(e5);
        CHECK(c == WANT, "... and counts: %llu", c);
        CU(cuGraphExecDestroy(e5));
    }

    /* Destroyed: the handle is forgotten (a launch of it fails and costs the minimum). */
    CU(cuGraphExecDestroy(e1));
    c = spent();
    CHECK(cuGraphLaunch(e1, NULL) != CUDA_SUCCESS && spent() - c == 1,
          "a destroyed executable graph is forgotten (cost %llu)", spent() - c);

    /* Instantiated behind the library's back: one block, as before graphs were counted. */
    with_flags_fn real = (with_flags_fn)real_sym("libcuda.so.1", "cuGraphInstantiateWithFlags");
    CUgraphExec hidden;
    CHECK(real && real(&hidden, g, 0) == CUDA_SUCCESS && cost(hidden) == 1,
          "an executable graph the library did not see instantiated costs 1 block");

    CU(cuCtxSynchronize());
    CU(cuCtxDestroy_v2(ctx));
    return finish();
}
