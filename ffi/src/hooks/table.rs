//! What this process allocated and has not freed yet: pointer (or handle) → region device,
//! accounted bytes, owning context. A free looks its record up to release exactly what the
//! allocation reserved, on the device it reserved it on, whatever the current device is then.
//! Beside them, the stream-ordered pools' models, the block count of each executable graph and
//! the body graphs of the conditional nodes seen added.
//!
//! Sixteen shards, each a short spin lock over a hash map, so threads allocating at once rarely
//! meet; a critical section is one map operation. A fork copies the maps in whatever state the
//! other threads left them: the fork handlers (`crate::fork`) take every lock before the fork
//! and release them after it in both processes, and the child then forgets every record (a CUDA
//! context does not survive fork; the child accounts afresh in its own slot).

use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};

use hami_shm::seqlock::Kind;

/// What a record is keyed by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Key {
    /// A device pointer (`cuMemAlloc*`, `cuMemAllocManaged`, the stream-ordered allocators).
    Ptr(u64),
    /// A VMM handle (`cuMemCreate`).
    Vmm(u64),
    /// A `CUarray`.
    Array(usize),
    /// A `CUmipmappedArray`.
    Mipmap(usize),
    /// A context created with `cuCtxCreate*` (its own cost).
    Ctx(usize),
    /// A device's primary context (keyed by CUDA ordinal; the record's `refs` counts retains).
    Primary(i32),
}

/// One live allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    /// Region device index the bytes were reserved on.
    pub dev: usize,
    /// Bytes reserved.
    pub bytes: u64,
    /// Which counter.
    pub kind: Kind,
    /// The context current at allocation (0 if none or not context-owned, e.g. VMM handles):
    /// destroying that context frees the allocation.
    pub ctx: usize,
    /// Retain count, for [`Key::Primary`].
    pub refs: u32,
    /// The stream-ordered pool the allocation came from (0 if none): its bytes go back to the
    /// pool's reserve when freed, not to the region (see [`PoolState`]).
    pub pool: usize,
}

impl Record {
    /// A data allocation of `bytes` on region device `dev`, owned by context `ctx`.
    pub fn data(dev: usize, bytes: u64, ctx: usize) -> Record {
        Record {
            dev,
            bytes,
            kind: Kind::Data,
            ctx,
            refs: 0,
            pool: 0,
        }
    }
}

/// Our model of one stream-ordered memory pool: the driver keeps freed pool memory reserved
/// (up to the pool's release threshold) until the pool is trimmed, so what the pool costs the
/// GPU is its reserve, not what is allocated from it. `reserved` bytes are accounted in the
/// region; `inuse` of them are live allocations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolState {
    /// Region device.
    pub dev: usize,
    /// CUDA ordinal (for the granularity).
    pub ordinal: i32,
    /// Bytes accounted for the pool (≥ `inuse`).
    pub reserved: u64,
    /// Bytes of live allocations.
    pub inuse: u64,
    /// `cuMemPoolDestroy` was called; the state lives until its last allocation is freed.
    pub destroyed: bool,
    /// Bumped by every change of the fields above: a reading of the driver taken while the map
    /// was unlocked is applied only if the pool's model did not change meanwhile.
    pub epoch: u64,
}

impl PoolState {
    /// A pool on region device `dev` (CUDA ordinal `ordinal`) with nothing reserved yet.
    pub fn new(dev: usize, ordinal: i32) -> PoolState {
        PoolState {
            dev,
            ordinal,
            reserved: 0,
            inuse: 0,
            destroyed: false,
            epoch: 0,
        }
    }
}

/// A multiplicative hash: keys are pointers and handles, already well spread above the low bits.
#[derive(Default)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0 ^ v).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
    fn write_i32(&mut self, v: i32) {
        self.write_u64(v as u32 as u64);
    }
}

type Map = HashMap<Key, Record, BuildHasherDefault<KeyHasher>>;

const SHARDS: usize = 16;

/// A value behind a short spin lock, held across `fork` by the fork handlers.
struct Locked<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: `value` is only touched while `locked` is held (see `with`) or in the single-threaded
// fork child after `hold` took the lock, which makes access exclusive across threads.
unsafe impl<T: Send> Sync for Locked<T> {}

impl<T> Locked<T> {
    const fn new(value: T) -> Self {
        Locked {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    /// Runs `f` on the value, one thread at a time.
    fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        crate::fork::install();
        let _held = crate::runtime::spin_lock(&self.locked);
        // SAFETY: we hold the lock, so no other reference to the value exists.
        f(unsafe { &mut *self.value.get() })
    }

    /// Takes the lock before `fork` (released by [`Locked::release`] or
    /// [`Locked::reset_in_child`]).
    fn hold(&self) {
        std::mem::forget(crate::runtime::spin_lock(&self.locked));
    }

    /// Releases what [`Locked::hold`] took.
    fn release(&self) {
        self.locked.store(false, Ordering::Release);
    }

    /// In the fork child: applies `reset` to the value and releases what [`Locked::hold`] took.
    fn reset_in_child(&self, reset: impl FnOnce(&mut T)) {
        // SAFETY: the child has one thread and `hold` took the lock before the fork, so nothing
        // else can reference the value.
        reset(unsafe { &mut *self.value.get() });
        self.release();
    }
}

type Shard = Locked<Map>;

static TABLE: [Shard; SHARDS] =
    [const { Locked::new(HashMap::with_hasher(BuildHasherDefault::new())) }; SHARDS];

/// Pool handle → its model.
pub type PoolMap = HashMap<usize, PoolState, BuildHasherDefault<KeyHasher>>;

static POOLS: Locked<PoolMap> = Locked::new(HashMap::with_hasher(BuildHasherDefault::new()));

/// Runs `f` on the pool states, one thread at a time. `f` only reads and writes the map: it
/// never waits, calls the driver or touches the region (whose lock may be waited for), so a
/// thread trimming a pool never holds up another thread's free.
pub fn with_pools<R>(f: impl FnOnce(&mut PoolMap) -> R) -> R {
    POOLS.with(f)
}

/// Executable graph (`CUgraphExec`) → blocks one launch of it runs (`super::graph`).
type GraphMap = HashMap<usize, u64, BuildHasherDefault<KeyHasher>>;

static GRAPHS: Locked<GraphMap> = Locked::new(HashMap::with_hasher(BuildHasherDefault::new()));

/// Records that a launch of the executable graph `exec` runs `blocks` blocks.
pub(crate) fn set_graph_blocks(exec: usize, blocks: u64) {
    GRAPHS.with(|m| m.insert(exec, blocks));
}

/// The blocks a launch of `exec` runs, if recorded.
pub(crate) fn graph_blocks(exec: usize) -> Option<u64> {
    GRAPHS.with(|m| m.get(&exec).copied())
}

/// Forgets `exec` (destroyed).
pub(crate) fn forget_graph(exec: usize) {
    GRAPHS.with(|m| m.remove(&exec));
}

/// A conditional node's graph and its body graphs, as the driver gave them when it added the node.
struct Conditional {
    graph: usize,
    bodies: Vec<usize>,
}

/// Conditional node (`CUgraphNode`) → [`Conditional`] (`super::graph`).
type ConditionalMap = HashMap<usize, Conditional, BuildHasherDefault<KeyHasher>>;

static CONDITIONALS: Locked<ConditionalMap> =
    Locked::new(HashMap::with_hasher(BuildHasherDefault::new()));

/// Most conditional nodes recorded at once; past it new ones are not (and count nothing).
const MAX_CONDITIONALS: usize = 1 << 16;

/// Records that conditional node `node`, just added to `graph`, has the body graphs `bodies`.
pub(crate) fn set_conditional(node: usize, graph: usize, bodies: Vec<usize>) {
    CONDITIONALS.with(|m| {
        if m.len() < MAX_CONDITIONALS || m.contains_key(&node) {
            m.insert(node, Conditional { graph, bodies });
        }
    });
}

/// The body graphs recorded for conditional node `node` of `graph` (none if it was recorded in
/// another graph: a handle the driver reused).
pub(crate) fn conditional(node: usize, graph: usize) -> Vec<usize> {
    CONDITIONALS.with(|m| match m.get(&node) {
        Some(c) if c.graph == graph => c.bodies.clone(),
        _ => Vec::new(),
    })
}

/// Forgets the conditional nodes of `graph` (destroyed), and those of their bodies, recursively.
pub(crate) fn forget_conditionals(graph: usize) {
    CONDITIONALS.with(|m| {
        let mut gone = vec![graph];
        while let Some(g) = gone.pop() {
            m.retain(|_, c| {
                if c.graph == g {
                    gone.extend_from_slice(&c.bodies);
                }
                c.graph != g
            });
        }
    });
}

fn shard(key: &Key) -> &'static Shard {
    use std::hash::BuildHasher;
    let h = BuildHasherDefault::<KeyHasher>::new().hash_one(key);
    // The high bits of a multiplicative hash are the well-mixed ones.
    &TABLE[(h >> 60) as usize % SHARDS]
}

/// Records `rec` under `key`, returning the record it replaces (an allocation whose free we
/// missed, e.g. freed by a context destruction we did not see; the caller releases it).
pub fn insert(key: Key, rec: Record) -> Option<Record> {
    shard(&key).with(|m| m.insert(key, rec))
}

/// Removes and returns the record of `key`.
pub fn remove(key: Key) -> Option<Record> {
    shard(&key).with(|m| m.remove(&key))
}

/// The record of `key`, left in place.
pub fn get(key: Key) -> Option<Record> {
    shard(&key).with(|m| m.get(&key).copied())
}

/// Applies `f` to the record of `key` (inserting `init` first if absent) and returns the updated
/// record; if `f` returns false the record is removed (and still returned).
pub fn update(key: Key, init: Record, f: impl FnOnce(&mut Record) -> bool) -> Record {
    shard(&key).with(|m| {
        let rec = m.entry(key).or_insert(init);
        let keep = f(rec);
        let out = *rec;
        if !keep {
            m.remove(&key);
        }
        out
    })
}

/// Removes every record whose context is `ctx` (a destroyed context frees its allocations) and
/// calls `release` for each.
pub fn remove_context(ctx: usize, mut release: impl FnMut(Key, Record)) {
    if ctx == 0 {
        return;
    }
    for s in &TABLE {
        let mut gone: Vec<(Key, Record)> = Vec::new();
        s.with(|m| {
            m.retain(|k, r| {
                let owned = r.ctx == ctx && !matches!(k, Key::Ctx(_) | Key::Primary(_));
                if owned {
                    gone.push((*k, *r));
                }
                !owned
            })
        });
        for (k, r) in gone {
            release(k, r);
        }
    }
}

/// Takes every lock of the tables across `fork` (released by the after-fork handlers).
pub(crate) fn before_fork() {
    CONDITIONALS.hold();
    GRAPHS.hold();
    POOLS.hold();
    for s in &TABLE {
        s.hold();
    }
}

/// Releases what [`before_fork`] took, in the parent.
pub(crate) fn after_fork_parent() {
    for s in TABLE.iter().rev() {
        s.release();
    }
    POOLS.release();
    GRAPHS.release();
    CONDITIONALS.release();
}

/// Empties the tables and releases what [`before_fork`] took, in the child (`clear` keeps the
/// capacity and does not allocate).
pub(crate) fn after_fork_child() {
    POOLS.reset_in_child(|m| m.clear());
    for s in TABLE.iter().rev() {
        s.reset_in_child(|m| m.clear());
    }
    GRAPHS.reset_in_child(|m| m.clear());
    CONDITIONALS.reset_in_child(|m| m.clear());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditionals_are_forgotten_with_their_graph_and_its_bodies() {
        let (root, body, nested, other) = (0x7001_0000, 0x7001_1000, 0x7001_2000, 0x7001_3000);
        set_conditional(0x7002_0000, root, vec![body]);
        set_conditional(0x7002_1000, body, vec![nested]);
        set_conditional(0x7002_2000, other, vec![0x7001_4000]);
        assert_eq!(conditional(0x7002_0000, root), vec![body]);
        assert!(
            conditional(0x7002_0000, other).is_empty(),
            "the handle in another graph"
        );
        forget_conditionals(root);
        assert!(conditional(0x7002_0000, root).is_empty());
        assert!(
            conditional(0x7002_1000, body).is_empty(),
            "a conditional node in a body"
        );
        assert_eq!(conditional(0x7002_2000, other), vec![0x7001_4000]);
    }
}
