//! CUDA graphs in the SM limiter: a launch of an executable graph costs the blocks of every kernel
//! it runs, counted once when the graph is instantiated, not one token per launch.
//!
//! After a successful instantiation (`cuGraphInstantiate` in its two five-argument ABIs,
//! `cuGraphInstantiateWithFlags`, `cuGraphInstantiateWithParams(_ptsz)`) the source graph is
//! walked ([`blocks`]): kernel nodes add their grid's blocks, child-graph nodes their embedded
//! graph's, conditional nodes (CUDA 12.3) their largest body graph once. A conditional node's
//! bodies are what `cuGraphNodeGetParams` reports (drivers of CUDA 13.2 and later), else what
//! the driver wrote to `phGraph_out` when the node was added: `cuGraphAddNode(_v2)` record them
//! ([`table::set_conditional`]) and `cuGraphDestroy` forgets them with the graph. A conditional
//! node neither reports nor was seen added (one in a graph copied by `cuGraphClone`) counts
//! nothing. The sum, saturating, is recorded for the executable graph
//! (`table::set_graph_blocks`); `cuGraphLaunch(_ptsz)` looks it up, and an executable graph
//! instantiated before the library saw it costs one block as before. `cuGraphExecUpdate(_v2)`
//! recounts from the graph it copied the parameters from; `cuGraphExecDestroy` forgets.
//!
//! Not hooked: the exec-side setters (`cuGraphExecKernelNodeSetParams(_v2)`,
//! `cuGraphExecChildGraphNodeSetParams`, `cuGraphExecNodeSetParams`, `cuGraphNodeSetEnabled`).
//! They are how programs change a replayed kernel's arguments, which leaves its grid as it was;
//! a setter that does change a grid leaves the count stale until the next update or
//! instantiation. Counting those exactly needs the executable graph's per-node grids, which the
//! driver does not report, so a per-node copy of every executable graph and four more hooks; a
//! stale count is a block count off by a constant factor, which the controller's measurement of
//! the program's unthrottled rate (made in the same units) and NVML's reading of the GPU's time
//! absorb.
//!
//! Nothing is walked in a process without an SM limit. A walk is bounded: [`MAX_DEPTH`] levels
//! of child graphs and [`MAX_NODES`] nodes in all, past which the rest counts nothing.

use std::ffi::{c_char, c_int, c_void};

use super::hook::hook;
use super::types::*;
use super::{real, table};

/// Deepest nesting of child and body graphs walked (the root is depth 0).
pub(crate) const MAX_DEPTH: usize = 16;
/// Most nodes looked at in one walk, over all levels.
pub(crate) const MAX_NODES: usize = 1 << 20;
/// Most body graphs read from one conditional node.
const MAX_BODIES: usize = 1024;

/// What one node of a graph runs, as far as the SM limiter cares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Node<G> {
    /// A kernel of this many blocks.
    Kernel(u64),
    /// A child-graph node: its embedded graph.
    Child(G),
    /// A conditional node: its body graphs (per launch, at most one body runs for `if` and
    /// `switch`; `while` runs its one body as often as the condition holds, unknown here).
    Conditional(Vec<G>),
    /// Anything else (copies, memsets, host calls, events), or a node that cannot be read.
    Other,
}

/// Reading graphs: the driver in the hooks, a model in the tests.
pub(crate) trait Graphs {
    /// A graph handle.
    type Graph: Copy;
    /// A node handle.
    type Node: Copy;
    /// The nodes of `g` (none if it cannot be read), at most `max` of them.
    fn nodes(&self, g: Self::Graph, max: usize) -> Vec<Self::Node>;
    /// What node `n` of graph `g` runs.
    fn node(&self, g: Self::Graph, n: Self::Node) -> Node<Self::Graph>;
}

/// The blocks one launch of `root` runs: its kernels' blocks, its child graphs' recursively, the
/// largest body of each conditional node once. Saturates at `u64::MAX`; bounded by
/// [`MAX_DEPTH`] and [`MAX_NODES`] (a cycle, which the driver never builds, ends at the depth
/// bound).
pub(crate) fn blocks<S: Graphs>(src: &S, root: S::Graph) -> u64 {
    let mut budget = MAX_NODES;
    walk(src, root, 0, &mut budget)
}

fn walk<S: Graphs>(src: &S, g: S::Graph, depth: usize, budget: &mut usize) -> u64 {
    if depth > MAX_DEPTH || *budget == 0 {
        return 0;
    }
    let mut sum = 0u64;
    for n in src.nodes(g, *budget) {
        if *budget == 0 {
            break;
        }
        *budget -= 1;
        let b = match src.node(g, n) {
            Node::Kernel(b) => b,
            Node::Child(c) => walk(src, c, depth + 1, budget),
            Node::Conditional(bodies) => bodies
                .into_iter()
                .map(|body| walk(src, body, depth + 1, budget))
                .max()
                .unwrap_or(0),
            Node::Other => 0,
        };
        sum = sum.saturating_add(b);
    }
    sum
}

/// The real driver's graphs.
struct Driver;

impl Driver {
    /// The grid of kernel node `n`, through the `_v2` parameters where the driver has them.
    fn kernel_blocks(n: CUgraphNode) -> Option<u64> {
        let get = real::cuGraphKernelNodeGetParams_v2
            .get()
            .or_else(|| real::cuGraphKernelNodeGetParams.get())?;
        let mut p = CudaKernelNodeParams::zeroed();
        // SAFETY: `p` is a writable CUDA_KERNEL_NODE_PARAMS_v2; the unversioned function writes
        // only its first 56 bytes, the v1 layout.
        let r = unsafe { get(n, &mut p) };
        r.ok().then(|| super::launch::grid_blocks(&p.dims))
    }

    /// The embedded graph of child-graph node `n`.
    fn child(n: CUgraphNode) -> Option<CUgraph> {
        let get = real::cuGraphChildGraphNodeGetGraph.get()?;
        let mut g: CUgraph = std::ptr::null_mut();
        // SAFETY: `g` is a writable CUgraph.
        let r = unsafe { get(n, &mut g) };
        (r.ok() && !g.is_null()).then_some(g)
    }

    /// The body graphs of conditional node `n` of graph `g`: as the driver reports them, else
    /// as recorded when the node was added.
    fn bodies(g: CUgraph, n: CUgraphNode) -> Vec<CUgraph> {
        let mut p = CUgraphNodeParams::zeroed();
        let reported = real::cuGraphNodeGetParams.get().is_some_and(|get| {
            // SAFETY: `p` is a writable, zeroed CUgraphNodeParams.
            unsafe { get(n, &mut p) }.ok()
        });
        if reported {
            // SAFETY: the driver's array, valid while the node lives (the caller's graph holds
            // it until its instantiation returns).
            let graphs = unsafe { body_graphs(&p) };
            if !graphs.is_empty() {
                return graphs;
            }
        }
        table::conditional(n as usize, g as usize)
            .into_iter()
            .map(|b| b as CUgraph)
            .collect()
    }
}

impl Graphs for Driver {
    type Graph = CUgraph;
    type Node = CUgraphNode;

    fn nodes(&self, g: CUgraph, max: usize) -> Vec<CUgraphNode> {
        let Some(get) = real::cuGraphGetNodes.get() else {
            return Vec::new();
        };
        let mut count = 0usize;
        // SAFETY: a null array asks for the count only.
        let r = unsafe { get(g, std::ptr::null_mut(), &mut count) };
        if !r.ok() || count == 0 {
            return Vec::new();
        }
        let mut v: Vec<CUgraphNode> = vec![std::ptr::null_mut(); count.min(max)];
        let mut got = v.len();
        // SAFETY: `v` has `got` writable entries, and the driver fills at most `got`.
        let r = unsafe { get(g, v.as_mut_ptr(), &mut got) };
        if !r.ok() {
            return Vec::new();
        }
        v.truncate(got);
        v.retain(|n| !n.is_null());
        v
    }

    fn node(&self, g: CUgraph, n: CUgraphNode) -> Node<CUgraph> {
        let Some(get_type) = real::cuGraphNodeGetType.get() else {
            return Node::Other;
        };
        let mut t: c_int = -1;
        // SAFETY: `t` is a writable CUgraphNodeType (an int).
        if !unsafe { get_type(n, &mut t) }.ok() {
            return Node::Other;
        }
        match t {
            CU_GRAPH_NODE_TYPE_KERNEL => Self::kernel_blocks(n).map_or(Node::Other, Node::Kernel),
            CU_GRAPH_NODE_TYPE_GRAPH => Self::child(n).map_or(Node::Other, Node::Child),
            CU_GRAPH_NODE_TYPE_CONDITIONAL => Node::Conditional(Self::bodies(g, n)),
            _ => Node::Other,
        }
    }
}

/// The non-null body graphs of conditional parameters `p` (none for other node types).
///
/// # Safety
/// Where `p` is a conditional node's and `phGraph_out` is not null, it points to `size` graphs.
unsafe fn body_graphs(p: &CUgraphNodeParams) -> Vec<CUgraph> {
    let c = p.conditional;
    if p.type_ != CU_GRAPH_NODE_TYPE_CONDITIONAL || c.ph_graph_out.is_null() {
        return Vec::new();
    }
    let len = (c.size as usize).min(MAX_BODIES);
    // SAFETY: `size` graphs (the caller's contract), of which `len` are read.
    let graphs = unsafe { std::slice::from_raw_parts(c.ph_graph_out, len) };
    graphs.iter().copied().filter(|g| !g.is_null()).collect()
}

/// Whether this process has an SM limit (starting the limiter on first use).
fn limited() -> bool {
    let Some(rt) = crate::runtime::get() else {
        return false;
    };
    super::launch::start_limiter(rt);
    crate::sm_limit::any_limited()
}

/// Records what a launch of `exec` runs, from `graph` (just instantiated into it, or copied into
/// it by an update), if this process has an SM limit.
fn count(exec: CUgraphExec, graph: CUgraph) {
    if !exec.is_null() && limited() {
        table::set_graph_blocks(exec as usize, blocks(&Driver, graph));
    }
}

/// After a successful `cuGraphAddNode(_v2)`: if it added a conditional node, records the body
/// graphs the driver wrote to `phGraph_out` (for drivers whose `cuGraphNodeGetParams` does not
/// report them), if this process has an SM limit.
fn record_bodies(out: *mut CUgraphNode, graph: CUgraph, params: *const CUgraphNodeParams) {
    // SAFETY: the real call succeeded, so it read a CUgraphNodeParams at `params` and wrote the
    // new node through `out` (both null-checked).
    let (Some(p), Some(&node)) = (unsafe { params.as_ref() }, unsafe { out.as_ref() }) else {
        return;
    };
    if node.is_null() || p.type_ != CU_GRAPH_NODE_TYPE_CONDITIONAL || !limited() {
        return;
    }
    // SAFETY: the driver filled `phGraph_out` with `size` graphs as it added the node.
    let bodies = unsafe { body_graphs(p) };
    table::set_conditional(
        node as usize,
        graph as usize,
        bodies.into_iter().map(|b| b as usize).collect(),
    );
}

/// The blocks a launch of `exec` runs, as counted when it was instantiated; `None` for an
/// executable graph this process did not see instantiated (or has no SM limit for).
pub(crate) fn launch_blocks(exec: CUgraphExec) -> Option<u64> {
    table::graph_blocks(exec as usize)
}

/// The executable graph of a hook's first argument once the real call succeeded: `out` for the
/// pointer an instantiation wrote it to, `exec` for the handle itself.
macro_rules! exec_of {
    (out $p:ident) => {
        // SAFETY: the real instantiation succeeded, so it wrote the new handle through `$p`
        // (null-checked here).
        unsafe { $p.as_ref() }
            .copied()
            .unwrap_or(std::ptr::null_mut())
    };
    (exec $e:ident) => {
        $e
    };
}

/// A hook that forwards `$name(first, graph, rest...)` and, when the real call succeeds,
/// counts `graph` for the executable graph that `first` gives ([`exec_of`]).
macro_rules! counting {
    ($kind:ident $name:ident($first:ident: $first_ty:ty, $($arg:ident: $ty:ty),*)) => {
        hook! {
            fn $name($first: $first_ty, graph: CUgraph, $($arg: $ty),*) -> CUresult;
            |real_fn| {
                // SAFETY: forwarding the caller's arguments unchanged.
                let r = unsafe { real_fn($first, graph, $($arg),*) };
                if r.ok() {
                    count(exec_of!($kind $first), graph);
                }
                r
            }
        }
    };
}

type ExecOut = *mut CUgraphExec;
type NodeOut = *mut CUgraphNode;

counting!(out cuGraphInstantiate(out: ExecOut, error_node: NodeOut, log: *mut c_char, size: usize));
counting!(out cuGraphInstantiate_v2(out: ExecOut, error_node: NodeOut, log: *mut c_char, size: usize));
counting!(out cuGraphInstantiateWithFlags(out: ExecOut, flags: u64));
counting!(out cuGraphInstantiateWithParams(out: ExecOut, params: *mut c_void));
counting!(out cuGraphInstantiateWithParams_ptsz(out: ExecOut, params: *mut c_void));
counting!(exec cuGraphExecUpdate(exec: CUgraphExec, error_node: NodeOut, result: *mut c_int));
counting!(exec cuGraphExecUpdate_v2(exec: CUgraphExec, result_info: *mut c_void));

hook! {
    fn cuGraphAddNode(
        out: NodeOut,
        graph: CUgraph,
        deps: *const CUgraphNode,
        ndeps: usize,
        params: *mut CUgraphNodeParams,
    ) -> CUresult;
    |real_fn| {
        // SAFETY: forwarding the caller's arguments unchanged.
        let r = unsafe { real_fn(out, graph, deps, ndeps, params) };
        if r.ok() {
            record_bodies(out, graph, params);
        }
        r
    }
}

hook! {
    fn cuGraphAddNode_v2(
        out: NodeOut,
        graph: CUgraph,
        deps: *const CUgraphNode,
        edge_data: *const c_void,
        ndeps: usize,
        params: *mut CUgraphNodeParams,
    ) -> CUresult;
    |real_fn| {
        // SAFETY: forwarding the caller's arguments unchanged.
        let r = unsafe { real_fn(out, graph, deps, edge_data, ndeps, params) };
        if r.ok() {
            record_bodies(out, graph, params);
        }
        r
    }
}

hook! {
    fn cuGraphDestroy(graph: CUgraph) -> CUresult;
    |real_fn| {
        // Before the real call, as for cuGraphExecDestroy: the driver may reuse the handles.
        table::forget_conditionals(graph as usize);
        // SAFETY: forwarding the caller's argument unchanged.
        unsafe { real_fn(graph) }
    }
}

hook! {
    fn cuGraphExecDestroy(exec: CUgraphExec) -> CUresult;
    |real_fn| {
        // Before the real call: once it returns, the driver may hand the same handle to another
        // thread's instantiation, whose count must not be forgotten.
        table::forget_graph(exec as usize);
        // SAFETY: forwarding the caller's argument unchanged.
        unsafe { real_fn(exec) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Graphs as lists of nodes; node `i` of the model is `nodes[i]`.
    struct Model {
        graphs: HashMap<u32, Vec<usize>>,
        nodes: Vec<Node<u32>>,
    }

    impl Model {
        fn new() -> Self {
            Model {
                graphs: HashMap::new(),
                nodes: Vec::new(),
            }
        }
        fn add(&mut self, g: u32, n: Node<u32>) -> &mut Self {
            self.nodes.push(n);
            let id = self.nodes.len() - 1;
            self.graphs.entry(g).or_default().push(id);
            self
        }
    }

    impl Graphs for Model {
        type Graph = u32;
        type Node = usize;
        fn nodes(&self, g: u32, max: usize) -> Vec<usize> {
            let mut v = self.graphs.get(&g).cloned().unwrap_or_default();
            v.truncate(max);
            v
        }
        fn node(&self, _g: u32, n: usize) -> Node<u32> {
            self.nodes[n].clone()
        }
    }

    #[test]
    fn kernels_and_nested_child_graphs_add_up() {
        let mut m = Model::new();
        m.add(0, Node::Kernel(42))
            .add(0, Node::Other)
            .add(0, Node::Child(1))
            .add(0, Node::Kernel(100))
            .add(1, Node::Kernel(25))
            .add(1, Node::Child(2))
            .add(1, Node::Child(3))
            .add(2, Node::Kernel(11));
        assert_eq!(blocks(&m, 0), 42 + 100 + 25 + 11);
        assert_eq!(blocks(&m, 1), 25 + 11);
        assert_eq!(blocks(&m, 3), 0, "an empty graph");
        assert_eq!(blocks(&m, 9), 0, "an unreadable graph");
    }

    #[test]
    fn a_conditional_node_counts_its_largest_body_once() {
        let mut m = Model::new();
        m.add(0, Node::Kernel(1))
            .add(0, Node::Conditional(vec![1, 2]))
            .add(0, Node::Conditional(Vec::new()))
            .add(1, Node::Kernel(30))
            .add(2, Node::Kernel(50))
            .add(2, Node::Child(3))
            .add(3, Node::Kernel(7));
        assert_eq!(blocks(&m, 0), 1 + 57);
    }

    #[test]
    fn the_sum_saturates() {
        let mut m = Model::new();
        m.add(0, Node::Kernel(u64::MAX - 1))
            .add(0, Node::Kernel(5))
            .add(0, Node::Child(1))
            .add(1, Node::Kernel(u64::MAX));
        assert_eq!(blocks(&m, 0), u64::MAX);
    }

    #[test]
    fn a_cycle_ends_at_the_depth_bound() {
        let mut m = Model::new();
        m.add(0, Node::Kernel(1)).add(0, Node::Child(0));
        assert_eq!(blocks(&m, 0), MAX_DEPTH as u64 + 1);
        // Two children of one graph at every level: 2^17 - 1 graphs, cut by the node budget.
        let mut m = Model::new();
        m.add(0, Node::Kernel(1))
            .add(0, Node::Child(0))
            .add(0, Node::Child(0));
        let n = blocks(&m, 0);
        assert!(n > 0 && n <= MAX_NODES as u64 / 3 + 1, "{n}");
    }

    #[test]
    fn the_node_budget_bounds_one_wide_graph() {
        let mut m = Model::new();
        for _ in 0..MAX_NODES + 10 {
            m.add(0, Node::Kernel(1));
        }
        assert_eq!(blocks(&m, 0), MAX_NODES as u64);
    }
}
