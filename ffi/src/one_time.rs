//! One-time work of a process (the runtime, the device map, the host-pid search): the first
//! thread that asks runs it while others wait a bounded time or go on without it.
//!
//! One state machine for all of them, idle → running → done, with two rules the hand-written
//! ones each had to get right: work that reports it could not finish goes back to idle (a later
//! call tries again), and so does work that panics (a hook catches the panic; the state must not
//! stay "running", or every later call would wait for nothing). A forked child resets what it
//! must redo.

use std::cell::Cell;
use std::sync::atomic::{AtomicU8, Ordering};
use std::thread::LocalKey;

const IDLE: u8 = 0;
const RUNNING: u8 = 1;
const DONE: u8 = 2;

/// The state of one piece of one-time work.
pub(crate) struct OneTime(AtomicU8);

/// What [`OneTime::start`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Started {
    /// This call ran the work; whether it finished.
    Ran(bool),
    /// Another thread is running it now.
    Running,
    /// It was done before.
    Done,
}

impl OneTime {
    /// Not started.
    pub(crate) const fn new() -> Self {
        OneTime(AtomicU8::new(IDLE))
    }

    /// Runs `work` if nobody has started it (or the last run did not finish). `work` returns
    /// whether it finished; if not, or if it panics, the state goes back to idle.
    pub(crate) fn start(&self, work: impl FnOnce() -> bool) -> Started {
        match self
            .0
            .compare_exchange(IDLE, RUNNING, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => {
                let back_to_idle = BackToIdle(&self.0);
                let finished = work();
                std::mem::forget(back_to_idle);
                self.0
                    .store(if finished { DONE } else { IDLE }, Ordering::Release);
                Started::Ran(finished)
            }
            Err(DONE) => Started::Done,
            Err(_) => Started::Running,
        }
    }

    /// Waits while another thread runs the work, at most `ns` nanoseconds (1 ms sleeps);
    /// whether it is done.
    pub(crate) fn wait(&self, ns: u64) -> bool {
        let start = crate::platform::monotonic_ns();
        loop {
            match self.0.load(Ordering::Acquire) {
                DONE => return true,
                IDLE => return false,
                _ if crate::platform::monotonic_ns().saturating_sub(start) > ns => return false,
                _ => std::thread::sleep(std::time::Duration::from_millis(1)),
            }
        }
    }

    /// Whether the work is done.
    pub(crate) fn is_done(&self) -> bool {
        self.0.load(Ordering::Acquire) == DONE
    }

    /// Whether nobody has started the work (or the last run did not finish).
    pub(crate) fn is_idle(&self) -> bool {
        self.0.load(Ordering::Acquire) == IDLE
    }

    /// In a forked child (atomics only): the work is to be done again.
    pub(crate) fn reset(&self) {
        self.0.store(IDLE, Ordering::Relaxed);
    }
}

/// A thread's "I am running this work" flag, set for the guard's life (also when the work
/// unwinds): the work's own nested calls (the driver calling back into a hook) see it and pass
/// through instead of waiting for themselves.
pub(crate) struct RunningHere(&'static LocalKey<Cell<bool>>);

impl RunningHere {
    /// Sets `flag` for this thread until the guard drops.
    pub(crate) fn set(flag: &'static LocalKey<Cell<bool>>) -> Self {
        let _ = flag.try_with(|f| f.set(true));
        RunningHere(flag)
    }

    /// Whether this thread is running the work (true where thread-locals are gone: pass through).
    pub(crate) fn is_set(flag: &'static LocalKey<Cell<bool>>) -> bool {
        flag.try_with(Cell::get).unwrap_or(true)
    }
}

impl Drop for RunningHere {
    fn drop(&mut self) {
        let _ = self.0.try_with(|f| f.set(false));
    }
}

/// Puts a running state back to idle when dropped: only while `work` unwinds.
struct BackToIdle<'a>(&'a AtomicU8);

impl Drop for BackToIdle<'_> {
    fn drop(&mut self) {
        self.0.store(IDLE, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_caller_runs_it_and_others_see_it_done() {
        let w = OneTime::new();
        assert!(w.is_idle());
        assert_eq!(w.start(|| true), Started::Ran(true));
        assert!(w.is_done() && w.wait(0));
        assert_eq!(w.start(|| unreachable!("done already")), Started::Done);
        w.reset();
        assert_eq!(
            w.start(|| true),
            Started::Ran(true),
            "a forked child runs it again"
        );
    }

    #[test]
    fn unfinished_work_is_tried_again() {
        let w = OneTime::new();
        assert_eq!(w.start(|| false), Started::Ran(false));
        assert!(w.is_idle() && !w.wait(0));
        assert_eq!(w.start(|| true), Started::Ran(true));
    }

    #[test]
    fn while_one_thread_runs_it_others_are_told_and_can_wait() {
        let w = std::sync::Arc::new(OneTime::new());
        let (tx, rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let runner = {
            let w = w.clone();
            std::thread::spawn(move || {
                w.start(|| {
                    tx.send(()).unwrap();
                    go_rx.recv().unwrap();
                    true
                })
            })
        };
        rx.recv().unwrap();
        assert_eq!(
            w.start(|| unreachable!("running elsewhere")),
            Started::Running
        );
        assert!(!w.wait(2_000_000), "a bounded wait gives up while it runs");
        go_tx.send(()).unwrap();
        assert!(w.wait(5_000_000_000));
        assert_eq!(runner.join().unwrap(), Started::Ran(true));
    }

    /// Work that panics leaves the state idle, not running: the hook that catches the panic
    /// goes on, and a later call tries again instead of waiting for nothing (mutation: without
    /// `BackToIdle` the second `start` reports `Running` forever).
    #[test]
    fn work_that_panics_can_be_tried_again() {
        let w = OneTime::new();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            w.start(|| panic!("planted"));
        }));
        assert!(r.is_err());
        assert!(w.is_idle());
        assert_eq!(w.start(|| true), Started::Ran(true));
    }
}
