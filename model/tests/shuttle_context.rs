//! shuttle: context admission (core::context, spec/ContextAdmission.tla) with the real core
//! code. N processes of a `Region<8, 1>` with limit L each create one context that really costs
//! C; the stand-in driver's real usage is a counter that rises when a create starts and falls
//! when a destroy returns. Checked: the real usage never passes L (contexts being created and
//! not yet measured included), and when they all start together and the cost is unknown,
//! exactly min(N, L / C) get a context and the others are refused (no herd in which everyone
//! backs off). Mutations: today's estimate-then-grow (reserve 2/3 of C, create, grow) fails
//! the safety check; a plan that reserves a known cost while the probe lease is held, and a
//! known-cost reservation whose refusal is final although the cost still fits (no retry after
//! contention), fail the progress check.
//!
//! Run: `RUSTFLAGS="--cfg shuttle" cargo test -p hami-model --release --target-dir target/shuttle`
#![cfg(shuttle)]

use std::sync::atomic::{AtomicU64 as PlainU64, Ordering as Plain};
use std::sync::Arc as StdArc;

use hami_model::rt::{thread, Arc};
use hami_model::{model_lock_cfg, Sim, SimProc};
use hami_shm::admission;
use hami_shm::context::{self, Admitted, ContextCell, Plan, Steps};
use hami_shm::platform::Platform;
use hami_shm::seqlock::Kind;
use hami_shm::slots;
use hami_shm::sync::{AtomicU64, Ordering};

const LIMIT: u64 = 1000;
const COST: u64 = 300;
type S = Sim<8, 1>;
type P = SimProc<8, 1>;

/// The shared context state (the region's extension tail in the library).
struct Cells {
    cost: AtomicU64,
    probe: AtomicU64,
}

/// What the GPU really holds, and its check against `limit` (`None`: no limit applies).
struct Gpu {
    limit: Option<u64>,
    real: PlainU64,
    created: PlainU64,
    refused: PlainU64,
    waits: PlainU64,
}

impl Gpu {
    fn create(&self) {
        let now = self.real.fetch_add(COST, Plain::SeqCst) + COST;
        if let Some(limit) = self.limit {
            assert!(now <= limit, "real usage over the limit: {now} of {limit}");
        }
    }
}

/// One process's side of the admission: its slot, the driver, a bounded wait.
struct ModelSteps<'a> {
    p: &'a P,
    slot: usize,
    gpu: &'a Gpu,
    waits: u32,
}

impl Steps for ModelSteps<'_> {
    fn reserve(&mut self, bytes: u64) -> bool {
        admission::try_reserve(self.p.region(), self.p, self.slot, 0, Kind::Context, bytes).is_ok()
    }
    fn release(&mut self, bytes: u64) {
        admission::release(self.p.region(), self.p, self.slot, 0, Kind::Context, bytes);
    }
    fn free(&mut self) -> Option<u64> {
        let limit = self.gpu.limit?;
        Some(limit.saturating_sub(admission::device_usage(self.p.region(), 0)))
    }
    fn create(&mut self) -> Result<Option<u64>, i32> {
        self.gpu.create();
        thread::yield_now();
        Ok(Some(COST))
    }
    fn destroy(&mut self) {
        thread::yield_now();
        self.gpu.real.fetch_sub(COST, Plain::SeqCst);
    }
    fn wait(&mut self) -> bool {
        self.waits += 1;
        self.p.sleep_ns(1);
        self.waits < 100_000
    }
}

/// How a process gets its context: core's admission or a mutant.
type Admit = fn(ContextCell<'_>, &P, &mut ModelSteps<'_>) -> Admitted;

fn core_admit(cell: ContextCell<'_>, p: &P, steps: &mut ModelSteps<'_>) -> Admitted {
    context::admit(cell, p, steps, COST / 2)
}

/// `n` processes start together under `limit`; returns how many got a context.
fn herd(n: usize, admit: Admit, limit: u64) -> u64 {
    herd_under(n, admit, Some(limit)).0
}

/// `n` processes start together under `limit`; returns how many got a context and how many
/// times they waited for the probe lease.
fn herd_under(n: usize, admit: Admit, limit: Option<u64>) -> (u64, u64) {
    let sim: Arc<S> = S::initialised([limit.unwrap_or(0)]);
    let cells = Arc::new(Cells {
        cost: AtomicU64::new(0),
        probe: AtomicU64::new(0),
    });
    let gpu = StdArc::new(Gpu {
        limit,
        waits: PlainU64::new(0),
        real: PlainU64::new(0),
        created: PlainU64::new(0),
        refused: PlainU64::new(0),
    });
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let (p, cells, gpu) = (P::spawn(&sim, i), cells.clone(), gpu.clone());
            thread::spawn(move || {
                let slot = p
                    .with_owner_lock(&model_lock_cfg(), |g| slots::claim(p.region(), &p, g))
                    .unwrap()
                    .unwrap();
                let cell = ContextCell::new(&cells.cost, &cells.probe);
                let mut steps = ModelSteps {
                    p: &p,
                    slot,
                    gpu: &gpu,
                    waits: 0,
                };
                let admitted = admit(cell, &p, &mut steps);
                gpu.waits.fetch_add(u64::from(steps.waits), Plain::SeqCst);
                match admitted {
                    Admitted::Created { reserved } => {
                        assert!(
                            reserved >= COST,
                            "a context counted below its cost: {reserved}"
                        );
                        gpu.created.fetch_add(1, Plain::SeqCst);
                    }
                    Admitted::Refused { .. } => {
                        gpu.refused.fetch_add(1, Plain::SeqCst);
                    }
                    other => panic!("a process ended with {other:?}"),
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(
        gpu.created.load(Plain::SeqCst) + gpu.refused.load(Plain::SeqCst),
        n as u64,
        "every process is told created or refused"
    );
    if limit.is_none() {
        assert_eq!(
            cells.cost.load(Ordering::Acquire),
            COST,
            "the cost is published"
        );
    }
    (
        gpu.created.load(Plain::SeqCst),
        gpu.waits.load(Plain::SeqCst),
    )
}

/// The herd's progress under `limit`: exactly as many contexts as fit.
fn progress(n: usize, admit: Admit, limit: u64) -> impl Fn() + Send + Sync + 'static {
    move || {
        let created = herd(n, admit, limit);
        let fit = (n as u64).min(limit / COST);
        assert_eq!(
            created, fit,
            "herd progress: {created} of {n} created where {fit} fit"
        );
    }
}

/// Random schedules, then PCT schedules (which find the narrow windows between two steps of
/// one process, such as between the prober's publication and its shrink).
fn check_progress(n: usize, admit: Admit, iterations: usize) {
    shuttle::check_random(progress(n, admit, LIMIT), iterations);
    shuttle::check_pct(progress(n, admit, LIMIT), iterations, 3);
}

/// Five processes start together with the cost unknown: exactly three contexts (1000 / 300),
/// never more real usage than the limit. Exact, not "at most": a refused process is one whose
/// context did not fit (the hooks return its OUT_OF_MEMORY to the application, no retry).
/// Before `create_at_cost` retried a refusal that was contention, about 1 run in 5 failed
/// here (e.g. seed 9376297755981320704: after the prober and one other, the last three
/// wanting the one place left kept colliding in `try_reserve` and all gave up: 2 of 5).
#[test]
fn a_herd_gets_as_many_contexts_as_fit() {
    check_progress(5, core_admit, 3000);
}

/// Two processes: both fit.
#[test]
fn two_processes_both_get_one() {
    check_progress(2, core_admit, 1000);
}

/// No limit: every process gets its context at once, nobody waits for the lease, and the cost
/// is published for limited processes.
#[test]
fn without_a_limit_nobody_waits() {
    shuttle::check_random(
        || {
            let (created, waits) = herd_under(5, core_admit, None);
            assert_eq!(created, 5, "every process gets a context");
            assert_eq!(waits, 0, "nobody waits for the probe lease");
        },
        1000,
    );
}

/// Today's estimate-then-grow: reserve 200, create (the GPU holds 300 at once), measure, grow
/// or destroy. The real usage passes the limit. Mutation test. Safety alone is checked: the
/// mutant also under-admits (destroyed contexts), and a progress assertion failing first made
/// this test fail with the wrong message in about 1 run in 20.
#[test]
#[should_panic(expected = "real usage over the limit")]
fn mutation_estimate_then_grow() {
    fn estimate_then_grow(_: ContextCell<'_>, _: &P, steps: &mut ModelSteps<'_>) -> Admitted {
        let estimate = COST * 2 / 3;
        if !steps.reserve(estimate) {
            return Admitted::Refused { needed: estimate };
        }
        let _ = steps.create();
        if steps.reserve(COST - estimate) {
            Admitted::Created { reserved: COST }
        } else {
            steps.destroy();
            steps.release(estimate);
            Admitted::Refused { needed: COST }
        }
    }
    let body = || {
        herd(5, estimate_then_grow, LIMIT);
    };
    shuttle::check_random(body, 3000);
    shuttle::check_pct(body, 3000, 3);
}

/// A plan that reserves a known cost while the probe lease is held (spec finding 1): those who
/// start while the first context is measured are refused against the prober's whole-free-part
/// reservation. Mutation test.
#[test]
#[should_panic(expected = "herd progress")]
fn mutation_known_cost_ignores_the_probe() {
    fn eager<Q: Platform>(cell: ContextCell<'_>, platform: &Q) -> Plan {
        let cost = cell.published_cost();
        if cost != 0 {
            return Plan::Reserve(cost);
        }
        context::plan(cell, platform)
    }
    fn eager_admit(cell: ContextCell<'_>, p: &P, steps: &mut ModelSteps<'_>) -> Admitted {
        context::admit_planned(cell, p, steps, COST / 2, eager)
    }
    check_progress(5, eager_admit, 3000);
}

/// Delegates to [`ModelSteps`] but never retries a reservation refused for contention: the
/// final refusal that `create_at_cost` had before its retry.
struct FinalRefusal<'s, 'a>(&'s mut ModelSteps<'a>);

impl Steps for FinalRefusal<'_, '_> {
    fn reserve(&mut self, bytes: u64) -> bool {
        self.0.reserve(bytes)
    }
    fn release(&mut self, bytes: u64) {
        self.0.release(bytes);
    }
    fn free(&mut self) -> Option<u64> {
        self.0.free()
    }
    fn create(&mut self) -> Result<Option<u64>, i32> {
        self.0.create()
    }
    fn destroy(&mut self) {
        self.0.destroy();
    }
    fn wait(&mut self) -> bool {
        self.0.wait()
    }
    fn retry(&mut self) -> bool {
        false
    }
}

/// A known cost's refusal is final even where the cost still fits (no retry after contention):
/// optimistic reservers that overlap all roll back and are all refused. Three processes under
/// 600: the prober's context, then two that want the one place left collide in `try_reserve`
/// until its re-checks run out and neither is created (about 1 random schedule in 330; 5000
/// make a miss about e^-15). Mutation test.
#[test]
#[should_panic(expected = "herd progress")]
fn mutation_contention_refusal_is_final() {
    fn no_retry(cell: ContextCell<'_>, p: &P, steps: &mut ModelSteps<'_>) -> Admitted {
        context::admit(cell, p, &mut FinalRefusal(steps), COST / 2)
    }
    shuttle::check_random(progress(3, no_retry, 600), 5000);
}
