//! Context admission: a CUDA context is admitted at its real cost before it is created, so the
//! GPU memory really in use stays within the limit while contexts are being created, and a herd
//! of processes starting at once gets as many contexts as fit (spec/ContextAdmission.tla).
//!
//! Estimate-then-grow (reserve 256 MiB, create, measure 518 MiB, grow) let every process of a
//! herd create a context it then could not keep: on an H200, 32 processes under 8 GiB got none
//! while the real usage peaked at 1.7× the limit. Here the cost of a context is learnt once per
//! device and published in the region ([`ContextCell::published_cost`]):
//!
//! - [`plan`] loads the cost, **then** the probe lease. While a live process holds the lease,
//!   everyone waits, even with the cost known (its holder reserves the whole free part until it
//!   shrinks; a reservation against that would be refused). Else a known cost is reserved
//!   ([`Plan::Reserve`]), and an unknown one makes the process try to become the prober.
//! - The prober ([`take_probe`]) re-reads the cost (`recheck`: published since its plan →
//!   give the lease back and reserve the cost), reserves the **whole free part** (the only
//!   amount sure to cover a context of unknown cost), re-reads the cost once more (`recheck`
//!   again: a lease taken over from a live holder could have raced a publication), creates,
//!   measures, [`publish`]es the cost and only then shrinks its reservation to it, and gives the
//!   lease back ([`release_probe`]).
//! - A lease is taken over only from a holder that is dead (pid and start tag), so a live,
//!   slow prober is waited for (bounded by the caller's deadline).
//!
//! The functions here are the shared-memory steps; admission itself is
//! [`crate::admission::try_reserve`], and creating and measuring are the caller's.

use crate::platform::{Liveness, Platform, ProcId};
use crate::sync::{AtomicU64, Ordering};

/// One device's shared context state (in the region's extension tail).
#[derive(Clone, Copy)]
pub struct ContextCell<'a> {
    /// Bytes one context takes on this device, as measured; 0 until the first is measured.
    /// Published with `fetch_max`, never lowered.
    cost: &'a AtomicU64,
    /// The probe lease: 0, or the [`ProcId`] of the process measuring the first context.
    probe: &'a AtomicU64,
}

impl<'a> ContextCell<'a> {
    /// The cell over a cost word and a lease word ([`crate::layout::Ext::context_cell`] gives
    /// the region's; the models make their own).
    pub fn new(cost: &'a AtomicU64, probe: &'a AtomicU64) -> Self {
        ContextCell { cost, probe }
    }

    /// The published cost of one context (acquire); 0 while none is measured.
    pub fn published_cost(&self) -> u64 {
        self.cost.load(Ordering::Acquire)
    }
}

/// What a process about to create a context does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Reserve this many bytes (the published cost), then create.
    Reserve(u64),
    /// The cost is unknown and the lease is free (or its holder dead): try [`take_probe`] from
    /// the lease word seen.
    Probe {
        /// The lease word seen (0, or a dead holder's identity), for the CAS.
        seen: u64,
    },
    /// Another live process (or another thread of this one) is measuring the first context:
    /// wait a little and plan again.
    Wait,
}

/// Decides the next step (spec: `Begin` then `Plan`). The cost is loaded before the lease: a
/// cost seen published was published before the lease load, so a free lease then means its
/// prober has already shrunk and given it back.
pub fn plan<P: Platform>(cell: ContextCell<'_>, platform: &P) -> Plan {
    let cost = cell.published_cost();
    let holder = cell.probe.load(Ordering::Acquire);
    if holder != 0 && platform.liveness(ProcId(holder)) != Liveness::Dead {
        return Plan::Wait;
    }
    if cost != 0 {
        Plan::Reserve(cost)
    } else {
        Plan::Probe { seen: holder }
    }
}

/// Takes the probe lease from the word `seen` (spec: `TakeProbe`): true for exactly one of the
/// processes that race for it.
pub fn take_probe(cell: ContextCell<'_>, seen: u64, me: ProcId) -> bool {
    cell.probe
        .compare_exchange(seen, me.0, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
}

/// Publishes a measured cost (spec: `Publish`, before the prober shrinks). `fetch_max`: two
/// measurements never lower what others reserve.
pub fn publish(cell: ContextCell<'_>, measured: u64) {
    cell.cost.fetch_max(measured, Ordering::AcqRel);
}

/// Gives the probe lease back if `me` holds it (spec: `ReleaseProbe`).
pub fn release_probe(cell: ContextCell<'_>, me: ProcId) {
    let _ = cell
        .probe
        .compare_exchange(me.0, 0, Ordering::AcqRel, Ordering::Relaxed);
}

/// The side effects of admitting one context, which the caller provides: admission against the
/// limit (in the caller's slot), the driver's create and destroy, and the wait between plans.
pub trait Steps {
    /// Reserves `bytes` against the limit; false if refused (nothing reserved).
    fn reserve(&mut self, bytes: u64) -> bool;
    /// Returns `bytes` reserved earlier.
    fn release(&mut self, bytes: u64);
    /// The part of the limit free now; `None` where no limit applies.
    fn free(&mut self) -> Option<u64>;
    /// Creates the context. `Ok(Some(cost))` with its measured cost, `Ok(None)` if it cannot be
    /// measured, `Err(code)` if the driver fails (nothing was created).
    fn create(&mut self) -> Result<Option<u64>, i32>;
    /// Destroys the context just created; returns once the driver has freed its memory.
    fn destroy(&mut self);
    /// Waits a little before planning again; false once the caller's deadline has passed.
    fn wait(&mut self) -> bool;
    /// Waits a little before reserving a known cost again after a refusal that was contention
    /// (the cost still fitted in the free part read after it); false gives up. [`Steps::wait`]
    /// unless overridden (the models override it to plant the final refusal it replaced).
    fn retry(&mut self) -> bool {
        self.wait()
    }
}

/// How an admission ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admitted {
    /// The context exists and `reserved` bytes are counted for it.
    Created {
        /// What stays reserved until the context is destroyed.
        reserved: u64,
    },
    /// Not enough of the limit is free for a context of `needed` bytes; nothing was created.
    Refused {
        /// The reservation that was refused (the cost, the free part, or a larger measured cost).
        needed: u64,
    },
    /// The driver refused to create it (its code); nothing is reserved.
    DriverFailed(i32),
    /// Another process held the probe lease past the caller's deadline; nothing was created.
    TimedOut,
}

/// Admits and creates one context (the whole of spec/ContextAdmission.tla's process). Where no
/// limit applies nobody waits for the lease: the context is created, its measured cost
/// published and counted (`unlimited`). `fallback` is what a context counts when its cost
/// cannot be measured (no NVML): the prober then shrinks to it and publishes it, so the limit
/// is only as safe as that estimate.
pub fn admit<P: Platform>(
    cell: ContextCell<'_>,
    platform: &P,
    steps: &mut impl Steps,
    fallback: u64,
) -> Admitted {
    admit_planned(cell, platform, steps, fallback, plan)
}

/// [`admit`] with the planning step given: the models run mutated plans through it (a plan
/// that reserves a known cost while the lease is held fails the herd's progress).
pub fn admit_planned<P: Platform>(
    cell: ContextCell<'_>,
    platform: &P,
    steps: &mut impl Steps,
    fallback: u64,
    plan: fn(ContextCell<'_>, &P) -> Plan,
) -> Admitted {
    if steps.free().is_none() {
        return unlimited(cell, steps, fallback);
    }
    let me = platform.self_id();
    loop {
        match plan(cell, platform) {
            Plan::Wait => {
                if !steps.wait() {
                    return Admitted::TimedOut;
                }
            }
            Plan::Reserve(cost) => return create_at_cost(steps, cost),
            Plan::Probe { seen } => {
                let Some(lease) = Lease::take(cell, seen, me) else {
                    continue;
                };
                return match lease.recheck() {
                    Err(cost) => create_at_cost(steps, cost),
                    Ok(lease) => probe(lease, steps, fallback),
                };
            }
        }
    }
}

/// A known cost: reserve it, create; a context that measures larger grows its reservation or
/// is destroyed again.
///
/// A refusal is final only if the cost does not fit in the free part read after it.
/// [`crate::admission::try_reserve`] is optimistic: it adds, sums and rolls back, so reservers
/// that overlap see each other's in-flight bytes and can all roll back where one of them fits
/// (three reserving 300 where 400 were free all gave up after its two re-checks: 2 contexts of
/// 5 where 3 fit). Such a refusal is contention: wait ([`Steps::retry`]) and reserve again,
/// until the cost fits or is seen not to (or the caller's deadline passes), so that a refused
/// context is one that did not fit (spec/ContextAdmission.tla, finding 8: `HerdExact`). Safety
/// stays the reservation's; the retry only adds attempts.
fn create_at_cost(steps: &mut impl Steps, cost: u64) -> Admitted {
    while !steps.reserve(cost) {
        let fits = steps.free().is_some_and(|free| free >= cost);
        if !fits || !steps.retry() {
            return Admitted::Refused { needed: cost };
        }
    }
    match steps.create() {
        Err(code) => {
            steps.release(cost);
            Admitted::DriverFailed(code)
        }
        Ok(Some(m)) if m > cost => {
            if steps.reserve(m - cost) {
                Admitted::Created { reserved: m }
            } else {
                steps.destroy();
                steps.release(cost);
                Admitted::Refused { needed: m }
            }
        }
        Ok(_) => Admitted::Created { reserved: cost },
    }
}

/// The probe lease while this process holds it: dropping it gives it back ([`release_probe`]),
/// also when a step unwinds (a panic in the caller's create). A lease left with a live process
/// would make every other process of the device wait out its deadline and fail its context.
/// What was reserved stays reserved then: the context may exist, so it stays counted.
struct Lease<'a> {
    cell: ContextCell<'a>,
    me: ProcId,
}

impl<'a> Lease<'a> {
    /// [`take_probe`], holding the lease on success.
    fn take(cell: ContextCell<'a>, seen: u64, me: ProcId) -> Option<Self> {
        take_probe(cell, seen, me).then_some(Lease { cell, me })
    }

    /// The prober's re-reads (spec: `Recheck` after taking the lease, `Confirm` after reserving
    /// the free part): a cost published meanwhile gives the lease back and is returned (the
    /// caller returns what it reserved, if anything, and reserves the cost instead).
    fn recheck(self) -> Result<Self, u64> {
        let cost = self.cell.cost.load(Ordering::Acquire);
        if cost == 0 {
            Ok(self)
        } else {
            Err(cost)
        }
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        release_probe(self.cell, self.me);
    }
}

/// The prober, holding the lease: reserve the whole free part, confirm, create, measure,
/// publish, then shrink and give the lease back.
fn probe(lease: Lease<'_>, steps: &mut impl Steps, fallback: u64) -> Admitted {
    let cell = lease.cell;
    let (held, lease) = match steps.free() {
        None => {
            // The limit was lifted since the plan.
            drop(lease);
            return unlimited(cell, steps, fallback);
        }
        Some(0) => return Admitted::Refused { needed: fallback },
        Some(free) => {
            if !steps.reserve(free) {
                return Admitted::Refused { needed: free };
            }
            match lease.recheck() {
                Err(cost) => {
                    steps.release(free);
                    return create_at_cost(steps, cost);
                }
                Ok(lease) => (free, lease),
            }
        }
    };
    let measured = match steps.create() {
        Err(code) => {
            steps.release(held);
            return Admitted::DriverFailed(code);
        }
        Ok(m) => m.unwrap_or(fallback),
    };
    publish(cell, measured);
    if measured > held {
        // The context alone is larger than what was free (spec: finding 6).
        steps.destroy();
        steps.release(held);
        return Admitted::Refused { needed: measured };
    }
    steps.release(held - measured);
    drop(lease);
    Admitted::Created { reserved: measured }
}

/// No limit applies: create without the lease (nothing to keep within), publish a measured cost
/// for limited processes of the region, and count the context (measured, else the published
/// cost, else `fallback`) so the views show it.
fn unlimited(cell: ContextCell<'_>, steps: &mut impl Steps, fallback: u64) -> Admitted {
    let measured = match steps.create() {
        Err(code) => return Admitted::DriverFailed(code),
        Ok(m) => m,
    };
    if let Some(m) = measured {
        publish(cell, m);
    }
    let known = cell.cost.load(Ordering::Acquire);
    let cost = measured.unwrap_or(if known != 0 { known } else { fallback });
    let reserved = if steps.reserve(cost) { cost } else { 0 };
    Admitted::Created { reserved }
}
