/*
 * graph_probe: what the real driver does with the calls libvgpu's graph accounting relies on,
 * printed WITHOUT libvgpu (run it without LD_PRELOAD; c-tests/gpu/graph_probe.sh builds and runs
 * it). Prints:
 * - the symbol-table (ELF) and dlsym addresses of the instantiate and add-node exports;
 * - cuGetProcAddress_v2's answers for cuGraphInstantiate at several versions, and which export
 *   (if any) each answer is;
 * - for a graph built as t_graph builds it (kernel node, child graph with a grandchild, `if`
 *   conditional node with two bodies): the node types cuGraphGetNodes lists, what
 *   cuGraphNodeGetParams returns for each, and the conditional bodies' node counts;
 * - what the legacy five-argument cuGraphInstantiate(_v2) and the 12.0 pointer return for it.
 */
#include "../hooks/common.h"

typedef CUresult (*gpa2_fn)(const char *, void **, int, cuuint64_t,
                            CUdriverProcAddressQueryResult *);
typedef CUresult (*legacy_fn)(CUgraphExec *, CUgraph, CUgraphNode *, char *, size_t);
typedef CUresult (*with_flags_fn)(CUgraphExec *, CUgraph, unsigned long long);
typedef CUresult (*clone_fn)(CUgraph *, CUgraph);
typedef CUresult (*node_get_params_fn)(CUgraphNode, CUgraphNodeParams *);
typedef CUresult (*add_node_v2_fn)(CUgraphNode *, CUgraph, const CUgraphNode *, const void *,
                                   size_t, CUgraphNodeParams *);

static const char *const exports[] = {"cuGraphInstantiate", "cuGraphInstantiate_v2",
                                      "cuGraphInstantiateWithFlags", "cuGraphAddNode",
                                      "cuGraphAddNode_v2", "cuGraphNodeGetParams", NULL};

/* Which export `p` is, by dlsym, or "no export". */
static const char *which(void *p)
{
    for (int i = 0; exports[i]; i++)
        if (p && p == lib_dlsym("libcuda.so.1", exports[i]))
            return exports[i];
    return "no export";
}

static size_t count_nodes(CUgraph g)
{
    size_t n = 0;
    return cuGraphGetNodes(g, NULL, &n) == CUDA_SUCCESS ? n : (size_t)-1;
}

/* An `if` node with two bodies of `b0`, `b1` blocks added to `g` by cuGraphAddNode (v2 = 0) or
 * cuGraphAddNode_v2; prints what it returned. */
static CUresult add_cond(CUgraph g, CUfunction f, int v2, CUgraph bodies[2], CUgraphNode *node)
{
    CUcontext ctx;
    CU(cuCtxGetCurrent(&ctx));
    CUgraphNodeParams np;
    memset(&np, 0, sizeof np);
    np.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
    np.conditional.type = CU_GRAPH_COND_TYPE_IF;
    np.conditional.size = 2;
    np.conditional.ctx = ctx;
    CU(cuGraphConditionalHandleCreate(&np.conditional.handle, g, ctx, 1, 0));
    add_node_v2_fn add2 = (add_node_v2_fn)lib_dlsym("libcuda.so.1", "cuGraphAddNode_v2");
    CUresult r = v2 ? (add2 ? add2(node, g, NULL, NULL, 0, &np) : CUDA_ERROR_NOT_FOUND)
                    : cuGraphAddNode(node, g, NULL, 0, &np);
    printf("cuGraphAddNode%s(conditional if, size 2) = %d, phGraph_out %p -> {%p, %p}\n",
           v2 ? "_v2" : "", (int)r, (void *)np.conditional.phGraph_out,
           r ? NULL : (void *)np.conditional.phGraph_out[0],
           r ? NULL : (void *)np.conditional.phGraph_out[1]);
    if (r)
        return r;
    CUgraphNode n;
    CUDA_KERNEL_NODE_PARAMS_v2 k = kernel_node(f, 25, 1, 1);
    CU(cuGraphAddKernelNode_v2(&n, np.conditional.phGraph_out[0], NULL, 0, &k));
    k = kernel_node(f, 60, 1, 1);
    CU(cuGraphAddKernelNode_v2(&n, np.conditional.phGraph_out[1], NULL, 0, &k));
    bodies[0] = np.conditional.phGraph_out[0], bodies[1] = np.conditional.phGraph_out[1];
    return r;
}

/* Every node of `g`: type, cuGraphNodeGetParams's answer, and what the type-specific getters say. */
static void list_nodes(const char *what, CUgraph g, CUgraph bodies[2])
{
    CUgraphNode nodes[16];
    size_t n = 16;
    CUresult r = cuGraphGetNodes(g, nodes, &n);
    /* Through dlsym: driver 580's libcuda.so.1 did not link it by name (run 17). */
    node_get_params_fn get_params =
        (node_get_params_fn)lib_dlsym("libcuda.so.1", "cuGraphNodeGetParams");
    printf("%s: cuGraphGetNodes = %d, %zu nodes\n", what, (int)r, r ? 0 : n);
    for (size_t i = 0; r == CUDA_SUCCESS && i < n && i < 16; i++) {
        CUgraphNodeType t = -1;
        CUresult rt = cuGraphNodeGetType(nodes[i], &t);
        CUgraphNodeParams p;
        memset(&p, 0, sizeof p);
        CUresult rp = get_params ? get_params(nodes[i], &p) : CUDA_ERROR_NOT_FOUND;
        printf("  node %zu: type %d (rc %d); cuGraphNodeGetParams = %d, type %d", i, (int)t,
               (int)rt, (int)rp, (int)p.type);
        if (t == CU_GRAPH_NODE_TYPE_KERNEL) {
            CUDA_KERNEL_NODE_PARAMS_v2 k;
            memset(&k, 0, sizeof k);
            CUresult rk = cuGraphKernelNodeGetParams_v2(nodes[i], &k);
            printf("; kernel grid %ux%ux%u (rc %d)", k.gridDimX, k.gridDimY, k.gridDimZ, (int)rk);
        } else if (t == CU_GRAPH_NODE_TYPE_GRAPH) {
            CUgraph c = NULL;
            CUresult rc = cuGraphChildGraphNodeGetGraph(nodes[i], &c);
            printf("; child graph %p (rc %d), %zu nodes", (void *)c, (int)rc, count_nodes(c));
        } else if (t == CU_GRAPH_NODE_TYPE_CONDITIONAL) {
            printf("\n    conditional: size %u, phGraph_out %p", p.conditional.size,
                   (void *)p.conditional.phGraph_out);
            for (unsigned b = 0; rp == CUDA_SUCCESS && p.conditional.phGraph_out && b < p.conditional.size && b < 4; b++)
                printf(" [%u] %p (%zu nodes)", b, (void *)p.conditional.phGraph_out[b],
                       count_nodes(p.conditional.phGraph_out[b]));
            printf("; bodies from creation %p (%zu nodes), %p (%zu nodes)", (void *)bodies[0],
                   count_nodes(bodies[0]), (void *)bodies[1], count_nodes(bodies[1]));
        }
        printf("\n");
    }
}

int main(void)
{
    g_test = "probe";
    setvbuf(stdout, NULL, _IOLBF, 0); /* each line out before a call that might crash */
    CU(cuInit(0));
    int v = 0;
    CU(cuDriverGetVersion(&v));
    printf("cuDriverGetVersion = %d\n", v);
    for (int i = 0; exports[i]; i++) {
        void *e = real_sym("libcuda.so.1", exports[i]), *d = lib_dlsym("libcuda.so.1", exports[i]);
        printf("%-28s symbol table %p, dlsym %p%s\n", exports[i], e, d, e == d ? "" : "  DIFFER");
    }

    gpa2_fn gpa2 = (gpa2_fn)lib_dlsym("libcuda.so.1", "cuGetProcAddress_v2");
    static const struct { const char *sym; int version; } asks[] = {
        {"cuGraphInstantiate", 10000}, {"cuGraphInstantiate", 11000},
        {"cuGraphInstantiate", 12000}, {"cuGraphInstantiate", 12080},
        {"cuGraphInstantiate", 13000}, {"cuGraphInstantiateWithFlags", 11040},
        {"cuGraphInstantiateWithFlags", 12080}, {"cuGraphAddNode", 12030},
        {"cuGraphAddNode", 13000}, {"cuGraphNodeGetParams", 13000}};
    char buf[160];
    void *at12000 = NULL;
    for (size_t i = 0; gpa2 && i < sizeof asks / sizeof asks[0]; i++) {
        void *p = NULL;
        CUdriverProcAddressQueryResult st = -1;
        CUresult r = gpa2(asks[i].sym, &p, asks[i].version, 0, &st);
        if (asks[i].version == 12000)
            at12000 = p;
        printf("cuGetProcAddress_v2(%s, %d) = %d/%d %p: %s (%s)\n", asks[i].sym, asks[i].version,
               (int)r, (int)st, p, which(p), sym_name(p, buf, sizeof buf));
    }

    CUcontext ctx = create_context(0);
    CUfunction f = load_spin_kernel();
    CUgraph g, child, grand, plain, bodies[2] = {NULL, NULL};
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
    CU(cuGraphCreate(&plain, 0));
    k = kernel_node(f, 100, 1, 1);
    CU(cuGraphAddKernelNode_v2(&n, g, NULL, 0, &k));
    CU(cuGraphAddKernelNode_v2(&n, plain, NULL, 0, &k));
    CU(cuGraphAddChildGraphNode(&n, g, NULL, 0, child));
    CU(cuGraphAddChildGraphNode(&n, plain, NULL, 0, child));
    CUgraphNode cond;
    add_cond(g, f, 0, bodies, &cond);
    list_nodes("graph (t_graph's)", g, bodies);

    CUgraph g2, bodies2[2] = {NULL, NULL};
    CU(cuGraphCreate(&g2, 0));
    if (add_cond(g2, f, 1, bodies2, &cond) == CUDA_SUCCESS)
        list_nodes("graph with a cuGraphAddNode_v2 conditional", g2, bodies2);

    CUgraph clone = NULL;
    clone_fn clone_graph = (clone_fn)lib_dlsym("libcuda.so.1", "cuGraphClone");
    CUresult r = clone_graph ? clone_graph(&clone, g) : CUDA_ERROR_NOT_FOUND;
    printf("cuGraphClone = %d\n", (int)r);
    if (r == CUDA_SUCCESS)
        list_nodes("clone", clone, bodies);
    CUgraph outer;
    CU(cuGraphCreate(&outer, 0));
    printf("cuGraphAddChildGraphNode(child = the graph with a conditional node) = %d\n",
           (int)cuGraphAddChildGraphNode(&n, outer, NULL, 0, g));

    legacy_fn l1 = (legacy_fn)real_sym("libcuda.so.1", "cuGraphInstantiate");
    legacy_fn l2 = (legacy_fn)real_sym("libcuda.so.1", "cuGraphInstantiate_v2");
    with_flags_fn wf = (with_flags_fn)real_sym("libcuda.so.1", "cuGraphInstantiateWithFlags");
    CUgraphExec e;
    const struct { CUgraph g; const char *what; } gs[] = {{plain, "without a conditional node"},
                                                         {g, "with a conditional node"}};
    for (int i = 0; i < 2; i++) {
        printf("%s: cuGraphInstantiate = %d", gs[i].what, l1 ? (int)l1(&e, gs[i].g, NULL, NULL, 0) : -1);
        printf(", _v2 = %d", l2 ? (int)l2(&e, gs[i].g, NULL, NULL, 0) : -1);
        printf(", WithFlags = %d", wf ? (int)wf(&e, gs[i].g, 0) : -1);
        printf(", the 12000 pointer (3 args) = %d\n", at12000 ? (int)((with_flags_fn)at12000)(&e, gs[i].g, 0) : -1);
    }
    CU(cuCtxSynchronize());
    CU(cuCtxDestroy_v2(ctx));
    return 0;
}
