//! Allocation hooks and the virtualised memory views.
//!
//! | API | device | bytes reserved |
//! |---|---|---|
//! | `cuMemAlloc(_v2)`, `cuMemAllocManaged` | current context's | size rounded up to the granularity |
//! | `cuMemAllocPitch(_v2)` | current context's | `pitch × height` as returned, rounded (reserved first for the width rounded to 512 bytes, then adjusted) |
//! | `cuMemCreate` (device location only) | `prop.location.id` | size rounded to the prop's minimum granularity |
//! | `cuMemAllocAsync(_ptsz)` | current context's | size rounded |
//! | `cuMemAllocFromPoolAsync(_ptsz)` | the pool's (from `cuMemPoolCreate`), else current | size rounded |
//! | `cuArrayCreate(_v2)`, `cuArray3DCreate(_v2)`, `cuMipmappedArrayCreate` | current context's | elements × channels × element size (every level, for mipmaps), rounded; then the driver's `cu*GetMemoryRequirements` size where it has one |
//!
//! Frees (`cuMemFree(_v2)`, `cuMemFreeAsync(_ptsz)`, `cuMemRelease`, `cuArrayDestroy`,
//! `cuMipmappedArrayDestroy`) release the record's bytes after the driver succeeded; a pointer
//! without a record is passed through. Destroying a context releases every record it owned
//! ([`super::context`]). Host memory (`cuMemAllocHost`, `cuMemHostAlloc`, registration) is not
//! device memory and is not hooked.
//!
//! Views: `cuMemGetInfo(_v2)` reports `total = min(limit, real total)` and
//! `free = min(total − usage, real free)` (never below 0); `cuDeviceTotalMem(_v2)` reports
//! `min(limit, real total)`. With no limit on the device both pass through unchanged.

use std::ffi::{c_int, c_uint, c_void};

use hami_shm::admission::OutOfMemory;
use hami_shm::seqlock::Kind;

use crate::log::log_debug;
use crate::runtime::Runtime;

use super::devices::{self, granularity, round_up};
use super::hook::hook;
use super::table::{self, Key, Record};
use super::types::*;
use super::{active, adjust, real, refused, Active};

/// Records a successful allocation, releasing any stale record the key replaces.
fn record(rt: &Runtime, key: Key, rec: Record) {
    if let Some(old) = table::insert(key, rec) {
        release_record(rt, &old);
    }
}

/// Gives back what a freed allocation accounted: to the region, or, for pool memory, to its
/// pool's reserve (which stays accounted until the pool is trimmed or destroyed).
pub(crate) fn release_record(rt: &Runtime, rec: &Record) {
    if rec.pool == 0 {
        rt.release(rec.dev, rec.kind, rec.bytes);
        return;
    }
    // A destroyed pool holds only its live allocations: what it reserved beyond them goes back.
    let back = table::with_pools(|m| {
        let st = m.get_mut(&rec.pool)?;
        st.inuse = st.inuse.saturating_sub(rec.bytes);
        st.epoch += 1;
        let (dev, spare) = (st.dev, st.reserved - st.reserved.min(st.inuse));
        if st.destroyed {
            st.reserved -= spare;
            if st.inuse == 0 {
                m.remove(&rec.pool);
            }
            return Some((dev, spare));
        }
        Some((dev, 0))
    });
    match back {
        None => rt.release(rec.dev, rec.kind, rec.bytes),
        Some((dev, spare)) if spare > 0 => rt.release(dev, Kind::Data, spare),
        Some(_) => {}
    }
}

/// Reserves `bytes` on `dev`, runs the real allocation, and records the result under the key
/// `key` reads back (called only on success). Rolls back if the driver fails.
fn admitted(
    a: &Active,
    what: &str,
    dev: usize,
    bytes: u64,
    ctx: usize,
    call: impl FnOnce() -> CUresult,
    key: impl FnOnce() -> Key,
) -> CUresult {
    if let Err(oom) = reserve(a.rt, dev, Kind::Data, bytes) {
        return refused(what, dev, bytes, oom);
    }
    let r = call();
    if !r.ok() {
        a.rt.release(dev, Kind::Data, bytes);
        return r;
    }
    let k = key();
    log_debug!("{what}: {bytes} bytes accounted on device {dev} ({k:?})");
    record(a.rt, k, Record::data(dev, bytes, ctx));
    r
}

/// Runs the real free of `key` and, if it succeeds, releases its record.
fn freed(key: Key, call: impl FnOnce() -> CUresult) -> CUresult {
    let Some(a) = active() else {
        return call();
    };
    let rec = table::remove(key);
    let r = call();
    match rec {
        Some(rec) if r.ok() => {
            log_debug!(
                "free of {key:?}: {} bytes released on device {}",
                rec.bytes,
                rec.dev
            );
            release_record(a.rt, &rec)
        }
        // The driver refused the free: the memory is still allocated.
        Some(rec) => {
            let _ = table::insert(key, rec);
        }
        None => {}
    }
    r
}

/// A plain device allocation on the current device: `size` requested, the pointer written to
/// `out` by `call`.
fn device_alloc(
    what: &str,
    size: u64,
    out_valid: bool,
    call: impl FnOnce() -> CUresult,
    key: impl FnOnce() -> Key,
) -> CUresult {
    let Some(a) = active() else {
        return call();
    };
    if !out_valid || size == 0 {
        return call(); // the driver reports the error
    }
    let Some((ord, dev)) = devices::current(a.rt) else {
        return call();
    };
    let bytes = round_up(size, granularity(ord));
    admitted(&a, what, dev, bytes, devices::current_ctx(), call, key)
}

hook! {
    fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult;
    |real_fn| {
        device_alloc(
            "cuMemAlloc",
            bytesize as u64,
            !dptr.is_null(),
            // SAFETY: forwarding the caller's arguments unchanged.
            || unsafe { real_fn(dptr, bytesize) },
            // SAFETY: called only after the driver succeeded, so it wrote `*dptr`.
            || Key::Ptr(unsafe { *dptr }),
        )
    }
}

hook! {
    /// The legacy 32-bit `cuMemAlloc`.
    fn cuMemAlloc(dptr: *mut CUdeviceptrV1, bytesize: c_uint) -> CUresult;
    |real_fn| {
        device_alloc(
            "cuMemAlloc",
            u64::from(bytesize),
            !dptr.is_null(),
            // SAFETY: forwarding the caller's arguments unchanged.
            || unsafe { real_fn(dptr, bytesize) },
            // SAFETY: called only after the driver succeeded, so it wrote `*dptr`.
            || Key::Ptr(u64::from(unsafe { *dptr })),
        )
    }
}

hook! {
    fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytesize: usize, flags: c_uint) -> CUresult;
    |real_fn| {
        device_alloc(
            "cuMemAllocManaged",
            bytesize as u64,
            !dptr.is_null(),
            // SAFETY: forwarding the caller's arguments unchanged.
            || unsafe { real_fn(dptr, bytesize, flags) },
            // SAFETY: called only after the driver succeeded, so it wrote `*dptr`.
            || Key::Ptr(unsafe { *dptr }),
        )
    }
}

/// What a pitched allocation reserves before the driver picks the pitch.
const PITCH_GUESS_ALIGN: u64 = 512;

/// A pitched allocation: reserve a guess, call, then adjust to `pitch × height`.
fn pitch_alloc(
    width: u64,
    height: u64,
    out_valid: bool,
    call: impl FnOnce() -> CUresult,
    result: impl FnOnce() -> (u64, u64),
    undo: impl FnOnce(u64),
) -> CUresult {
    let Some(a) = active() else {
        return call();
    };
    if !out_valid || width == 0 || height == 0 {
        return call();
    }
    let Some((ord, dev)) = devices::current(a.rt) else {
        return call();
    };
    let g = granularity(ord);
    // A pitch × height past 64 bits is refused before anything is counted.
    let Some(rows) = round_up(width, PITCH_GUESS_ALIGN).checked_mul(height) else {
        return refused("cuMemAllocPitch", dev, u64::MAX, OutOfMemory::TooLarge);
    };
    let guess = round_up(rows, g);
    if let Err(oom) = reserve(a.rt, dev, Kind::Data, guess) {
        return refused("cuMemAllocPitch", dev, guess, oom);
    }
    let r = call();
    if !r.ok() {
        a.rt.release(dev, Kind::Data, guess);
        return r;
    }
    let (ptr, pitch) = result();
    let actual = round_up(pitch.saturating_mul(height), g);
    if let Err(oom) = adjust(a.rt, dev, Kind::Data, guess, actual) {
        undo(ptr);
        a.rt.release(dev, Kind::Data, guess);
        return refused("cuMemAllocPitch", dev, actual, oom);
    }
    record(
        a.rt,
        Key::Ptr(ptr),
        Record::data(dev, actual, devices::current_ctx()),
    );
    r
}

hook! {
    fn cuMemAllocPitch_v2(
        dptr: *mut CUdeviceptr,
        p_pitch: *mut usize,
        width_in_bytes: usize,
        height: usize,
        element_size_bytes: c_uint,
    ) -> CUresult;
    |real_fn| {
        pitch_alloc(
            width_in_bytes as u64,
            height as u64,
            !dptr.is_null() && !p_pitch.is_null(),
            // SAFETY: forwarding the caller's arguments unchanged.
            || unsafe { real_fn(dptr, p_pitch, width_in_bytes, height, element_size_bytes) },
            || {
                // SAFETY: runs only when both outputs are non-null and the driver succeeded,
                // so it wrote `*dptr`.
                let ptr = unsafe { *dptr };
                // SAFETY: likewise, the driver wrote `*p_pitch`.
                let pitch = unsafe { *p_pitch };
                (ptr, pitch as u64)
            },
            |ptr| {
                if let Some(free) = cuMemFree_v2::REAL.get() {
                    // SAFETY: freeing the allocation the driver just made.
                    let _ = unsafe { free(ptr) };
                }
            },
        )
    }
}

hook! {
    /// The legacy 32-bit `cuMemAllocPitch`.
    fn cuMemAllocPitch(
        dptr: *mut CUdeviceptrV1,
        p_pitch: *mut c_uint,
        width_in_bytes: c_uint,
        height: c_uint,
        element_size_bytes: c_uint,
    ) -> CUresult;
    |real_fn| {
        pitch_alloc(
            u64::from(width_in_bytes),
            u64::from(height),
            !dptr.is_null() && !p_pitch.is_null(),
            // SAFETY: forwarding the caller's arguments unchanged.
            || unsafe { real_fn(dptr, p_pitch, width_in_bytes, height, element_size_bytes) },
            || {
                // SAFETY: runs only when both outputs are non-null and the driver succeeded,
                // so it wrote `*dptr`.
                let ptr = unsafe { *dptr };
                // SAFETY: likewise, the driver wrote `*p_pitch`.
                let pitch = unsafe { *p_pitch };
                (u64::from(ptr), u64::from(pitch))
            },
            |ptr| {
                if let Some(free) = cuMemFree::REAL.get() {
                    // SAFETY: freeing the allocation the driver just made.
                    let _ = unsafe { free(ptr as CUdeviceptrV1) };
                }
            },
        )
    }
}

hook! {
    fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult;
    |real_fn| {
        // SAFETY: forwarding the caller's argument unchanged.
        let call = || unsafe { real_fn(dptr) };
        if dptr == 0 {
            return call();
        }
        freed(Key::Ptr(dptr), call)
    }
}

hook! {
    /// The legacy 32-bit `cuMemFree`.
    fn cuMemFree(dptr: CUdeviceptrV1) -> CUresult;
    |real_fn| {
        // SAFETY: forwarding the caller's argument unchanged.
        let call = || unsafe { real_fn(dptr) };
        if dptr == 0 {
            return call();
        }
        freed(Key::Ptr(u64::from(dptr)), call)
    }
}

// ---- VMM ----------------------------------------------------------------------------------

hook! {
    fn cuMemCreate(
        handle: *mut CUmemGenericAllocationHandle,
        size: usize,
        prop: *const CUmemAllocationProp,
        flags: u64,
    ) -> CUresult;
    |real_fn| {
        // SAFETY: forwarding the caller's arguments unchanged.
        let call = || unsafe { real_fn(handle, size, prop, flags) };
        let Some(a) = active() else {
            return call();
        };
        if handle.is_null() || prop.is_null() || size == 0 {
            return call();
        }
        // SAFETY: `prop` is non-null and, per the API, points to a CUmemAllocationProp.
        let p = unsafe { *prop };
        if p.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE {
            return call(); // host memory
        }
        let ord = p.location.id;
        let Some(dev) = devices::region_index(a.rt, ord) else {
            return call();
        };
        let g = devices::prop_granularity(&p).unwrap_or_else(|| granularity(ord));
        let bytes = round_up(size as u64, g);
        admitted(&a, "cuMemCreate", dev, bytes, 0, call, || {
            // SAFETY: read only after the driver succeeded and wrote `*handle`.
            Key::Vmm(unsafe { *handle })
        })
    }
}

hook! {
    fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult;
    |real_fn| {
        // SAFETY: forwarding the caller's argument unchanged.
        freed(Key::Vmm(handle), || unsafe { real_fn(handle) })
    }
}

// ---- Stream-ordered allocation -------------------------------------------------------------
//
// A pool keeps freed memory reserved until it is trimmed (the driver releases it at the next
// synchronisation only when the pool's release threshold allows), so the GPU memory a pool costs
// is its reserve. We model each pool (table::PoolState): an allocation reserves in the region
// only what the pool must grow by (`inuse + bytes - reserved`); a free returns its bytes to the
// pool's reserve, not to the region; `cuMemPoolTrimTo` and `cuMemPoolDestroy` release the unused
// reserve. When the region refuses any allocation on a device ([`reserve`]), we trim that
// device's pools ourselves (real `cuMemPoolTrimTo(pool, 0)`, which only drops unused reserve),
// release that reserve and try once more, so memory the application freed is never what stands
// in its way.

/// The pool `cuMemAllocAsync` allocates from on CUDA device `ordinal` (its current pool).
fn current_pool(ordinal: CUdevice) -> CUmemoryPool {
    let Some(f) = real::cuDeviceGetMemPool.get() else {
        return std::ptr::null_mut();
    };
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    // SAFETY: the real query writing one handle into a local.
    if unsafe { f(&mut pool, ordinal) }.ok() {
        pool
    } else {
        std::ptr::null_mut()
    }
}

/// `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`.
const CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: c_int = 5;

/// What a real pool grows by at least when the driver can tell us its reserve (NVIDIA drivers
/// reserve pool memory in 32 MiB steps; the reserve is read back after each allocation).
const POOL_CHUNK: u64 = 32 << 20;

/// The driver's own count of `pool`'s reserve, if it has `cuMemPoolGetAttribute`.
fn reserved_real(pool: usize) -> Option<u64> {
    let f = real::cuMemPoolGetAttribute.get()?;
    let mut v: u64 = 0;
    // SAFETY: the real query writing one cuuint64_t into a local, for a pool handle the
    // application used successfully.
    let r = unsafe {
        f(
            pool as CUmemoryPool,
            CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
            (&mut v as *mut u64).cast(),
        )
    };
    r.ok().then_some(v)
}

/// How far [`settle`] may move a pool's model.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Settle {
    /// Only down (after a trim, which never grows a pool).
    Shrink,
    /// Down, or up by a reservation in the region (after an allocation).
    Both,
}

/// How often [`settle`] reads the driver again when the pool's model changed under it.
const SETTLE_TRIES: usize = 4;

/// Moves the model's reserve of `pool` to the driver's count (never below `inuse`), or to
/// `fallback(model)` where the driver cannot tell. The driver is read with the map unlocked,
/// and the reading is applied only if the pool's model is still the one it was read against
/// (else read again; after [`SETTLE_TRIES`] the model stays: the change that interfered is an
/// allocation, followed by its own settle, or a free, which leaves the reserve). Growth is
/// reserved in the region with the map unlocked, then recorded. Returns the bytes released;
/// fails, changing nothing, if a larger reserve is refused.
fn settle(
    rt: &Runtime,
    pool: usize,
    how: Settle,
    fallback: impl Fn(&table::PoolState) -> Option<u64>,
) -> Result<u64, OutOfMemory> {
    for _ in 0..SETTLE_TRIES {
        let Some(seen) = table::with_pools(|m| m.get(&pool).copied()) else {
            return Ok(0);
        };
        let Some(real) = reserved_real(pool).or_else(|| fallback(&seen)) else {
            return Ok(0);
        };
        // (device, bytes released from the model, bytes the model must grow by)
        let step = table::with_pools(|m| {
            let st = m.get_mut(&pool).filter(|st| **st == seen)?;
            let target = real.max(st.inuse);
            if target > st.reserved {
                let short = if how == Settle::Both {
                    target - st.reserved
                } else {
                    0
                };
                return Some((st.dev, 0, short));
            }
            let spare = st.reserved - target;
            st.reserved = target;
            st.epoch += 1;
            Some((st.dev, spare, 0))
        });
        let Some((dev, spare, short)) = step else {
            continue;
        };
        if spare > 0 {
            rt.release(dev, Kind::Data, spare);
        }
        if short > 0 {
            rt.reserve(dev, Kind::Data, short)?;
            let kept = table::with_pools(|m| {
                let st = m.get_mut(&pool).filter(|st| !st.destroyed)?;
                st.reserved += short;
                st.epoch += 1;
                Some(())
            });
            if kept.is_none() {
                // Destroyed meanwhile: a destroyed pool keeps no reserve beyond its allocations.
                rt.release(dev, Kind::Data, short);
            }
        }
        return Ok(spare);
    }
    Ok(0)
}

/// Trims `pool` to its live allocations with the real driver.
fn trim_real(pool: usize) -> bool {
    cuMemPoolTrimTo::REAL
        .get()
        // SAFETY: the real call on a pool handle the application gave us; keeping 0 bytes
        // frees only unused reserve.
        .map(|f| unsafe { f(pool as CUmemoryPool, 0) }.ok())
        .unwrap_or(false)
}

/// Trims every pool on region device `dev` that holds unused reserve (the real
/// `cuMemPoolTrimTo(pool, 0)`, with the pool map unlocked), releasing that reserve in the
/// region. Returns the bytes released.
fn trim_cached(rt: &Runtime, dev: usize) -> u64 {
    let cached: Vec<usize> = table::with_pools(|m| {
        m.iter()
            .filter(|(_, st)| st.dev == dev && !st.destroyed && st.reserved > st.inuse)
            .map(|(&pool, _)| pool)
            .collect()
    });
    cached
        .into_iter()
        .filter(|&pool| trim_real(pool))
        // Trimmed to 0, a pool the driver cannot count for us keeps its live allocations.
        .map(|pool| settle(rt, pool, Settle::Shrink, |_| Some(0)).unwrap_or(0))
        .sum()
}

/// The one policy for a refused reservation on region device `dev`: trim the device's pools
/// of the memory the application already freed into them, and if that released anything,
/// make the `attempt` once more.
fn reclaiming<T>(
    rt: &Runtime,
    dev: usize,
    mut attempt: impl FnMut() -> Result<T, OutOfMemory>,
) -> Result<T, OutOfMemory> {
    match attempt() {
        Err(oom) if trim_cached(rt, dev) == 0 => Err(oom),
        Err(_) => attempt(),
        ok => ok,
    }
}

/// [`Runtime::reserve`], reclaiming pool memory if refused ([`reclaiming`]).
pub(crate) fn reserve(rt: &Runtime, dev: usize, kind: Kind, bytes: u64) -> Result<(), OutOfMemory> {
    crate::suspend::wait_while_suspended(rt);
    reclaiming(rt, dev, || rt.reserve(dev, kind, bytes))
}

/// How often [`take_once`] reserves again when a concurrent trim took the reserve it counted on.
const TAKE_ROUNDS: usize = 8;

/// Takes `bytes` from `pool`'s model, growing its reserve (admitted in the region) as needed,
/// reclaiming pool memory if refused ([`reclaiming`]). Returns how much the reserve grew.
fn pool_take(
    rt: &Runtime,
    pool: usize,
    dev: usize,
    ordinal: CUdevice,
    bytes: u64,
) -> Result<u64, OutOfMemory> {
    crate::suspend::wait_while_suspended(rt);
    let fresh = table::PoolState::new(dev, ordinal);
    let chunk = if real::cuMemPoolGetAttribute.get().is_some() {
        POOL_CHUNK
    } else {
        1
    };
    reclaiming(rt, dev, || take_once(rt, pool, fresh, bytes, chunk))
}

/// One attempt of [`pool_take`]. The shortfall is reserved in the region with the map unlocked
/// and recorded as the pool's reserve before anything else reads it, so no byte is lost or
/// counted twice; if a trim lowered the reserve meanwhile, the new shortfall is reserved in
/// another round. A refusal gives back what the earlier rounds reserved.
fn take_once(
    rt: &Runtime,
    pool: usize,
    fresh: table::PoolState,
    bytes: u64,
    chunk: u64,
) -> Result<u64, OutOfMemory> {
    let (mut grown, mut short, mut dev) = (0, 0, fresh.dev);
    for _ in 0..TAKE_ROUNDS {
        let need;
        (dev, need) = table::with_pools(|m| {
            let st = m.entry(pool).or_insert(fresh);
            st.reserved += short;
            let need = round_up(
                st.inuse.saturating_add(bytes).saturating_sub(st.reserved),
                chunk,
            );
            if need == 0 {
                st.inuse += bytes;
            }
            st.epoch += 1;
            (st.dev, need)
        });
        grown += short;
        if need == 0 {
            return Ok(grown);
        }
        if let Err(oom) = rt.reserve(dev, Kind::Data, need) {
            pool_untake(rt, pool, 0, grown);
            return Err(oom);
        }
        short = need;
    }
    // Trimmed under us round after round (the device is at its limit): refuse.
    rt.release(dev, Kind::Data, short);
    pool_untake(rt, pool, 0, grown);
    Err(OutOfMemory::OverLimit {
        used: rt.usage(dev),
        limit: rt.limit(dev).unwrap_or(0),
    })
}

/// Undoes [`pool_take`] after the driver refused the allocation.
fn pool_untake(rt: &Runtime, pool: usize, bytes: u64, grow: u64) {
    let back = table::with_pools(|m| {
        let st = m.get_mut(&pool)?;
        st.inuse = st.inuse.saturating_sub(bytes);
        let back = grow.min(st.reserved - st.reserved.min(st.inuse));
        st.reserved -= back;
        st.epoch += 1;
        Some((st.dev, back))
    });
    if let Some((dev, back)) = back.filter(|&(_, b)| b > 0) {
        rt.release(dev, Kind::Data, back);
    }
}

/// Frees a stream-ordered allocation we just made, on the stream it was made on.
fn free_pool_ptr(k: Key, stream: CUstream) {
    if let (Key::Ptr(p), Some(f)) = (k, cuMemFreeAsync::REAL.get()) {
        // SAFETY: freeing the allocation the driver just made, on its own stream.
        let _ = unsafe { f(p, stream) };
    }
}

/// A stream-ordered allocation from `pool` (null: the current device's current pool).
fn pool_alloc(
    what: &str,
    size: u64,
    pool: CUmemoryPool,
    out_valid: bool,
    call: impl FnOnce() -> CUresult,
    key: impl FnOnce() -> Key,
    undo: impl FnOnce(Key),
) -> CUresult {
    let Some(a) = active() else {
        return call();
    };
    if !out_valid || size == 0 {
        return call();
    }
    let known = (!pool.is_null())
        .then(|| table::with_pools(|m| m.get(&(pool as usize)).copied()))
        .flatten();
    let (ordinal, dev, pool) = match known {
        Some(st) => (st.ordinal, st.dev, pool),
        None => {
            let Some((ord, dev)) = devices::current(a.rt) else {
                return call();
            };
            let pool = if pool.is_null() {
                current_pool(ord)
            } else {
                pool
            };
            (ord, dev, pool)
        }
    };
    let bytes = round_up(size, granularity(ordinal));
    if pool.is_null() {
        // No pool to model (a driver without cuDeviceGetMemPool): account the allocation.
        return admitted(&a, what, dev, bytes, 0, call, key);
    }
    let p = pool as usize;
    let grow = match pool_take(a.rt, p, dev, ordinal, bytes) {
        Ok(g) => g,
        Err(oom) => return refused(what, dev, bytes, oom),
    };
    let r = call();
    if !r.ok() {
        pool_untake(a.rt, p, bytes, grow);
        return r;
    }
    let k = key();
    // The driver may have grown the pool by more than the model (its own steps): account what
    // it reports, or give the allocation back if that does not fit.
    if let Err(oom) = settle(a.rt, p, Settle::Both, |_| None) {
        undo(k);
        table::with_pools(|m| {
            if let Some(st) = m.get_mut(&p) {
                st.inuse = st.inuse.saturating_sub(bytes);
                st.epoch += 1;
            }
        });
        if trim_real(p) {
            let _ = settle(a.rt, p, Settle::Both, |_| None);
        }
        return refused(what, dev, bytes, oom);
    }
    log_debug!("{what}: {bytes} bytes from pool {p:#x} on device {dev} (reserve grew {grow})");
    let mut rec = Record::data(dev, bytes, 0);
    rec.pool = p;
    record(a.rt, k, rec);
    r
}

macro_rules! alloc_async {
    ($name:ident) => {
        hook! {
            fn $name(dptr: *mut CUdeviceptr, bytesize: usize, h_stream: CUstream) -> CUresult;
            |real_fn| {
                pool_alloc(
                    stringify!($name),
                    bytesize as u64,
                    std::ptr::null_mut(),
                    !dptr.is_null(),
                    // SAFETY: forwarding the caller's arguments unchanged.
                    || unsafe { real_fn(dptr, bytesize, h_stream) },
                    // SAFETY: called only after the driver succeeded, so it wrote `*dptr`.
                    || Key::Ptr(unsafe { *dptr }),
                    |k| free_pool_ptr(k, h_stream),
                )
            }
        }
    };
}
alloc_async!(cuMemAllocAsync);
alloc_async!(cuMemAllocAsync_ptsz);

macro_rules! alloc_from_pool {
    ($name:ident) => {
        hook! {
            fn $name(
                dptr: *mut CUdeviceptr,
                bytesize: usize,
                pool: CUmemoryPool,
                h_stream: CUstream,
            ) -> CUresult;
            |real_fn| {
                if pool.is_null() {
                    // SAFETY: forwarding the caller's arguments; the driver rejects a null pool.
                    return unsafe { real_fn(dptr, bytesize, pool, h_stream) };
                }
                pool_alloc(
                    stringify!($name),
                    bytesize as u64,
                    pool,
                    !dptr.is_null(),
                    // SAFETY: forwarding the caller's arguments unchanged.
                    || unsafe { real_fn(dptr, bytesize, pool, h_stream) },
                    // SAFETY: called only after the driver succeeded, so it wrote `*dptr`.
                    || Key::Ptr(unsafe { *dptr }),
                    |k| free_pool_ptr(k, h_stream),
                )
            }
        }
    };
}
alloc_from_pool!(cuMemAllocFromPoolAsync);
alloc_from_pool!(cuMemAllocFromPoolAsync_ptsz);

macro_rules! free_async {
    ($name:ident) => {
        hook! {
            fn $name(dptr: CUdeviceptr, h_stream: CUstream) -> CUresult;
            |real_fn| {
                // SAFETY: forwarding the caller's arguments unchanged.
                let call = || unsafe { real_fn(dptr, h_stream) };
                if dptr == 0 {
                    return call();
                }
                freed(Key::Ptr(dptr), call)
            }
        }
    };
}
free_async!(cuMemFreeAsync);
free_async!(cuMemFreeAsync_ptsz);

hook! {
    /// Trimming releases a pool's unused reserve: after the driver did it, so do we.
    fn cuMemPoolTrimTo(pool: CUmemoryPool, min_bytes_to_keep: usize) -> CUresult;
    |real_fn| {
        // SAFETY: forwarding the caller's arguments unchanged.
        let r = unsafe { real_fn(pool, min_bytes_to_keep) };
        if !r.ok() {
            return r;
        }
        let Some(a) = active() else {
            return r;
        };
        let _ = settle(a.rt, pool as usize, Settle::Shrink, |st| {
            Some(round_up(min_bytes_to_keep as u64, granularity(st.ordinal)))
        });
        r
    }
}

hook! {
    /// Remembers which device a pool allocates on, for `cuMemAllocFromPoolAsync`.
    fn cuMemPoolCreate(pool: *mut CUmemoryPool, props: *const CUmemPoolPropsPrefix) -> CUresult;
    |real_fn| {
        // SAFETY: forwarding the caller's arguments unchanged.
        let r = unsafe { real_fn(pool, props) };
        if !r.ok() || pool.is_null() || props.is_null() {
            return r;
        }
        let Some(a) = active() else {
            return r;
        };
        // SAFETY: `props` is non-null, and the driver accepted it as a readable properties struct.
        let p = unsafe { *props };
        // SAFETY: `pool` is non-null, and the driver succeeded, so it wrote `*pool`.
        let handle = unsafe { *pool };
        if p.location.type_ == CU_MEM_LOCATION_TYPE_DEVICE {
            if let Some(dev) = devices::region_index(a.rt, p.location.id) {
                let fresh = table::PoolState::new(dev, p.location.id);
                table::with_pools(|m| m.insert(handle as usize, fresh));
            }
        }
        r
    }
}

hook! {
    /// Destroying a pool releases its unused reserve now, and the rest as it is freed.
    fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult;
    |real_fn| {
        // SAFETY: forwarding the caller's argument unchanged.
        let r = unsafe { real_fn(pool) };
        if !r.ok() {
            return r;
        }
        let Some(a) = active() else {
            return r;
        };
        let key = pool as usize;
        let spare = table::with_pools(|m| {
            let st = m.get_mut(&key)?;
            let spare = (st.dev, st.reserved - st.reserved.min(st.inuse));
            st.reserved -= spare.1;
            st.destroyed = true;
            st.epoch += 1;
            if st.inuse == 0 {
                m.remove(&key);
            }
            Some(spare)
        });
        if let Some((dev, bytes)) = spare.filter(|&(_, b)| b > 0) {
            a.rt.release(dev, Kind::Data, bytes);
        }
        r
    }
}

// ---- Arrays -------------------------------------------------------------------------------

/// Bytes per channel element of a `CUarray_format` (4 for formats this table does not know).
fn format_bytes(format: i32) -> u64 {
    match format {
        0x01 | 0x08 => 1,        // UNSIGNED_INT8, SIGNED_INT8
        0x02 | 0x09 | 0x10 => 2, // UNSIGNED_INT16, SIGNED_INT16, HALF
        0x03 | 0x0a | 0x20 => 4, // UNSIGNED_INT32, SIGNED_INT32, FLOAT
        _ => 4,
    }
}

/// Element count × channels × element size of a `w × h × d` array.
fn array_bytes(w: u64, h: u64, d: u64, channels: u64, format: i32) -> u64 {
    w.max(1)
        .saturating_mul(h.max(1))
        .saturating_mul(d.max(1))
        .saturating_mul(channels.max(1))
        .saturating_mul(format_bytes(format))
}

/// Which array kind, for the driver's memory-requirements query.
#[derive(Clone, Copy)]
enum ArrayKind {
    Array,
    Mipmap,
}

/// The driver's own size for an array, where it can tell.
fn array_requirement(kind: ArrayKind, handle: *mut c_void, ord: CUdevice) -> Option<u64> {
    let mut req = CudaArrayMemoryRequirements::default();
    let r = match kind {
        // SAFETY: the real query writing one struct into a local, for a handle it just made.
        ArrayKind::Array => unsafe {
            real::cuArrayGetMemoryRequirements.get()?(&mut req, handle, ord)
        },
        // SAFETY: as above.
        ArrayKind::Mipmap => unsafe {
            real::cuMipmappedArrayGetMemoryRequirements.get()?(&mut req, handle, ord)
        },
    };
    (r.ok() && req.size > 0).then_some(req.size as u64)
}

/// An array allocation: reserve the estimate, call, adjust to the driver's size.
fn array_alloc(
    what: &str,
    kind: ArrayKind,
    estimate: u64,
    out_valid: bool,
    call: impl FnOnce() -> CUresult,
    handle: impl FnOnce() -> *mut c_void,
    undo: impl FnOnce(*mut c_void),
) -> CUresult {
    let Some(a) = active() else {
        return call();
    };
    if !out_valid {
        return call();
    }
    let Some((ord, dev)) = devices::current(a.rt) else {
        return call();
    };
    let g = granularity(ord);
    let guess = round_up(estimate, g);
    if let Err(oom) = reserve(a.rt, dev, Kind::Data, guess) {
        return refused(what, dev, guess, oom);
    }
    let r = call();
    if !r.ok() {
        a.rt.release(dev, Kind::Data, guess);
        return r;
    }
    let h = handle();
    let actual = array_requirement(kind, h, ord).map_or(guess, |s| round_up(s, g));
    if let Err(oom) = adjust(a.rt, dev, Kind::Data, guess, actual) {
        undo(h);
        a.rt.release(dev, Kind::Data, guess);
        return refused(what, dev, actual, oom);
    }
    let key = match kind {
        ArrayKind::Array => Key::Array(h as usize),
        ArrayKind::Mipmap => Key::Mipmap(h as usize),
    };
    record(a.rt, key, Record::data(dev, actual, devices::current_ctx()));
    r
}

fn destroy_array(h: *mut c_void) {
    if let Some(f) = cuArrayDestroy::REAL.get() {
        // SAFETY: destroying the array the driver just created.
        let _ = unsafe { f(h) };
    }
}

/// The array descriptors of `cuArrayCreate*` and `cuArray3DCreate*`: what an array of them
/// needs as bytes, before the driver says better.
trait ArrayDescriptor {
    fn estimate(&self) -> u64;
}

impl ArrayDescriptor for CudaArrayDescriptor {
    fn estimate(&self) -> u64 {
        let (w, h) = (self.width as u64, self.height as u64);
        array_bytes(w, h, 1, u64::from(self.num_channels), self.format)
    }
}

impl ArrayDescriptor for CudaArrayDescriptorV1 {
    fn estimate(&self) -> u64 {
        let (w, h) = (u64::from(self.width), u64::from(self.height));
        array_bytes(w, h, 1, u64::from(self.num_channels), self.format)
    }
}

impl ArrayDescriptor for CudaArray3dDescriptor {
    fn estimate(&self) -> u64 {
        let (w, h, d) = (self.width as u64, self.height as u64, self.depth as u64);
        array_bytes(w, h, d, u64::from(self.num_channels), self.format)
    }
}

impl ArrayDescriptor for CudaArray3dDescriptorV1 {
    fn estimate(&self) -> u64 {
        let (w, h) = (u64::from(self.width), u64::from(self.height));
        array_bytes(
            w,
            h,
            u64::from(self.depth),
            u64::from(self.num_channels),
            self.format,
        )
    }
}

/// One array creation through the real `create`, with admission (see [`array_alloc`]).
fn create_array<D: ArrayDescriptor>(
    what: &str,
    create: unsafe extern "C" fn(*mut CUarray, *const D) -> CUresult,
    handle: *mut CUarray,
    desc: *const D,
) -> CUresult {
    // SAFETY: `desc` is checked for null; per the API it points to a descriptor.
    let est = unsafe { desc.as_ref() }.map_or(0, ArrayDescriptor::estimate);
    array_alloc(
        what,
        ArrayKind::Array,
        est,
        !handle.is_null() && !desc.is_null(),
        // SAFETY: forwarding the caller's arguments unchanged.
        || unsafe { create(handle, desc) },
        // SAFETY: the driver succeeded and wrote `*handle`.
        || unsafe { *handle },
        destroy_array,
    )
}

/// The array creations: `$what` names the family in the log, `$desc` is the descriptor type.
macro_rules! array_create {
    ($name:ident, $what:literal, $desc:ty) => {
        hook! {
            fn $name(handle: *mut CUarray, desc: *const $desc) -> CUresult;
            |real_fn| { create_array($what, real_fn, handle, desc) }
        }
    };
}
array_create!(cuArrayCreate_v2, "cuArrayCreate", CudaArrayDescriptor);
array_create!(cuArrayCreate, "cuArrayCreate", CudaArrayDescriptorV1);
array_create!(cuArray3DCreate_v2, "cuArray3DCreate", CudaArray3dDescriptor);
array_create!(cuArray3DCreate, "cuArray3DCreate", CudaArray3dDescriptorV1);

hook! {
    fn cuArrayDestroy(handle: CUarray) -> CUresult;
    |real_fn| {
        // SAFETY: forwarding the caller's argument unchanged.
        freed(Key::Array(handle as usize), || unsafe { real_fn(handle) })
    }
}

/// Bytes of every level of a mipmapped array (each level halves every non-zero extent).
fn mipmap_bytes(d: &CudaArray3dDescriptor, levels: u32) -> u64 {
    let (mut w, mut h, mut z) = (d.width as u64, d.height as u64, d.depth as u64);
    let layered = d.flags & 0x01 != 0; // CUDA_ARRAY3D_LAYERED: depth is a layer count
    let mut total = 0u64;
    for _ in 0..levels.clamp(1, 64) {
        total = total.saturating_add(array_bytes(w, h, z, u64::from(d.num_channels), d.format));
        w = (w / 2).max(1);
        if h > 0 {
            h = (h / 2).max(1);
        }
        if z > 0 && !layered {
            z = (z / 2).max(1);
        }
    }
    total
}

hook! {
    fn cuMipmappedArrayCreate(
        handle: *mut CUmipmappedArray,
        desc: *const CudaArray3dDescriptor,
        num_mipmap_levels: c_uint,
    ) -> CUresult;
    |real_fn| {
        // SAFETY: `desc` is checked for null; per the API it points to a descriptor.
        let est = unsafe { desc.as_ref() }.map_or(0, |d| mipmap_bytes(d, num_mipmap_levels));
        array_alloc(
            "cuMipmappedArrayCreate",
            ArrayKind::Mipmap,
            est,
            !handle.is_null() && !desc.is_null(),
            // SAFETY: forwarding the caller's arguments unchanged.
            || unsafe { real_fn(handle, desc, num_mipmap_levels) },
            // SAFETY: the driver succeeded and wrote `*handle`.
            || unsafe { *handle },
            |h| {
                if let Some(d) = cuMipmappedArrayDestroy::REAL.get() {
                    // SAFETY: destroying the array the driver just created.
                    let _ = unsafe { d(h) };
                }
            },
        )
    }
}

hook! {
    fn cuMipmappedArrayDestroy(handle: CUmipmappedArray) -> CUresult;
    |real_fn| {
        // SAFETY: forwarding the caller's argument unchanged.
        freed(Key::Mipmap(handle as usize), || unsafe { real_fn(handle) })
    }
}

// ---- Views ----------------------------------------------------------------------------------

/// The limited view of region device `dev`: `(total, free)` from the real ones, or `None` when
/// the device has no limit.
fn limited(rt: &Runtime, dev: usize, real_free: u64, real_total: u64) -> Option<(u64, u64)> {
    let limit = rt.limit(dev)?;
    let total = limit.min(real_total);
    let free = total.saturating_sub(rt.usage(dev)).min(real_free);
    Some((total, free))
}

/// The total that NVML and `cuDeviceTotalMem` report for a device limited to `limit` bytes: the
/// limit, capped at the GPU's memory unless `CUDA_OVERSUBSCRIBE=true` (HAMi-core reports the
/// limit there; `cuMemGetInfo` stays capped in both, see `limited`).
pub(crate) fn reported_total(rt: &Runtime, limit: u64, real_total: u64) -> u64 {
    if rt.config.oversubscribe {
        limit
    } else {
        limit.min(real_total)
    }
}

/// `cuMemGetInfo` for the current device, after the real call filled `(free, total)`.
fn mem_info(real_free: u64, real_total: u64) -> Option<(u64, u64)> {
    let a = active()?;
    let (_, dev) = devices::current(a.rt)?;
    limited(a.rt, dev, real_free, real_total)
}

hook! {
    fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult;
    |real_fn| {
        // SAFETY: forwarding the caller's arguments unchanged.
        let r = unsafe { real_fn(free, total) };
        if !r.ok() || free.is_null() || total.is_null() {
            return r;
        }
        // SAFETY: `free` is non-null and was just written by the driver.
        let rf = unsafe { *free } as u64;
        // SAFETY: `total` is non-null and was just written by the driver.
        let rt = unsafe { *total } as u64;
        if let Some((t, fr)) = mem_info(rf, rt) {
            // SAFETY: as above, `total` is the caller's non-null, writable output.
            unsafe { *total = t as usize };
            // SAFETY: as above, `free` is the caller's non-null, writable output.
            unsafe { *free = fr as usize };
        }
        r
    }
}

hook! {
    /// The legacy 32-bit `cuMemGetInfo`.
    fn cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) -> CUresult;
    |real_fn| {
        // SAFETY: forwarding the caller's arguments unchanged.
        let r = unsafe { real_fn(free, total) };
        if !r.ok() || free.is_null() || total.is_null() {
            return r;
        }
        // SAFETY: `free` is non-null and was just written by the driver.
        let rf = u64::from(unsafe { *free });
        // SAFETY: `total` is non-null and was just written by the driver.
        let rt = u64::from(unsafe { *total });
        if let Some((t, fr)) = mem_info(rf, rt) {
            // SAFETY: as above, `total` is the caller's non-null, writable output.
            unsafe { *total = t.min(u64::from(u32::MAX)) as c_uint };
            // SAFETY: as above, `free` is the caller's non-null, writable output.
            unsafe { *free = fr.min(u64::from(u32::MAX)) as c_uint };
        }
        r
    }
}

/// [`reported_total`] for CUDA device `ordinal`, or `None` without a limit.
fn total_mem(ordinal: CUdevice, real_total: u64) -> Option<u64> {
    let a = active()?;
    let dev = devices::region_index(a.rt, ordinal)?;
    Some(reported_total(a.rt, a.rt.limit(dev)?, real_total))
}

hook! {
    fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult;
    |real_fn| {
        // SAFETY: forwarding the caller's arguments unchanged.
        let r = unsafe { real_fn(bytes, dev) };
        if !r.ok() || bytes.is_null() {
            return r;
        }
        // SAFETY: non-null and just written by the driver.
        if let Some(t) = total_mem(dev, unsafe { *bytes } as u64) {
            // SAFETY: as above.
            unsafe { *bytes = t as usize };
        }
        r
    }
}

hook! {
    /// The legacy 32-bit `cuDeviceTotalMem`.
    fn cuDeviceTotalMem(bytes: *mut c_uint, dev: CUdevice) -> CUresult;
    |real_fn| {
        // SAFETY: forwarding the caller's arguments unchanged.
        let r = unsafe { real_fn(bytes, dev) };
        if !r.ok() || bytes.is_null() {
            return r;
        }
        // SAFETY: non-null and just written by the driver.
        if let Some(t) = total_mem(dev, u64::from(unsafe { *bytes })) {
            // SAFETY: as above.
            unsafe { *bytes = t.min(u64::from(u32::MAX)) as c_uint };
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn array_sizes() {
        assert_eq!(array_bytes(1024, 0, 0, 1, 0x20), 4096);
        assert_eq!(array_bytes(1024, 1024, 0, 4, 0x01), 4 << 20);
        assert_eq!(array_bytes(u64::MAX, 2, 1, 1, 0x20), u64::MAX);
        let d = CudaArray3dDescriptor {
            width: 8,
            height: 8,
            depth: 0,
            format: 0x01,
            num_channels: 1,
            flags: 0,
        };
        // 64 + 16 + 4 + 1
        assert_eq!(mipmap_bytes(&d, 4), 85);
    }
}
