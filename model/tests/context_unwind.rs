//! A panic in the driver's create while this process holds the context-probe lease
//! (core::context) gives the lease back as it unwinds, so the device's other processes do not
//! wait out their deadline for a live process that will never publish; what was reserved stays
//! counted (the context may exist).
//!
//! Run: `cargo test -p hami-model --test context_unwind`
#![cfg(not(any(loom, shuttle)))]

use std::panic::{catch_unwind, AssertUnwindSafe};

use hami_model::{Sim, SimProc};
use hami_shm::context::{self, ContextCell, Steps};
use hami_shm::sync::{AtomicU64, Ordering};

const LIMIT: u64 = 1000;

/// A limit of [`LIMIT`] in this process alone, and a driver whose create panics.
struct PanickingCreate {
    reserved: u64,
}

impl Steps for PanickingCreate {
    fn reserve(&mut self, bytes: u64) -> bool {
        self.reserved += bytes;
        true
    }
    fn release(&mut self, bytes: u64) {
        self.reserved -= bytes;
    }
    fn free(&mut self) -> Option<u64> {
        Some(LIMIT - self.reserved)
    }
    fn create(&mut self) -> Result<Option<u64>, i32> {
        panic!("planted: the driver's create panics");
    }
    fn destroy(&mut self) {}
    fn wait(&mut self) -> bool {
        false
    }
}

#[test]
fn a_panicking_create_gives_the_probe_lease_back() {
    let sim = Sim::<8, 1>::initialised([LIMIT]);
    let p = SimProc::spawn(&sim, 0);
    let (cost, probe) = (AtomicU64::new(0), AtomicU64::new(0));
    let cell = ContextCell::new(&cost, &probe);
    let mut steps = PanickingCreate { reserved: 0 };
    let unwound = catch_unwind(AssertUnwindSafe(|| {
        context::admit(cell, &p, &mut steps, LIMIT / 4)
    }));
    assert!(unwound.is_err(), "the planted panic unwinds");
    assert_eq!(
        probe.load(Ordering::SeqCst),
        0,
        "the probe lease is free again"
    );
    assert_eq!(
        steps.reserved, LIMIT,
        "the prober's reservation stays counted"
    );
}
