//! What the protocols need from the operating system, and nothing more.
//!
//! `hami-linux` implements this for Linux (`/proc` liveness, glibc `sem_t`, `lockf`, `fcntl`);
//! `hami-model` implements it with simulated processes that crash and reuse PIDs.

use crate::layout::RawSem;

/// A process identity that PID reuse cannot fool: the pid in the low 32 bits (what C peers store
/// in and read from `owner_pid`), and above it a tag derived from the process's start time
/// ([`ProcId::start_tag`]). C peers write tag 0, which [`Platform::liveness`] checks by pid only.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ProcId(pub u64);

impl ProcId {
    /// No process (a free `owner_pid`).
    pub const NONE: ProcId = ProcId(0);

    /// Combines a pid and a start tag.
    pub fn new(pid: i32, tag: u32) -> ProcId {
        ProcId(u64::from(pid as u32) | (u64::from(tag) << 32))
    }

    /// The tag of a process started at `start_time` (clock ticks since boot, as
    /// `/proc/<pid>/stat` field 22 reports it). The top bit is always set, so a tag is never 0
    /// (0 means "written by a C peer, pid only"), and it is never all ones (the owner lock's
    /// takeover marker, [`crate::lock::TAKEOVER_MARKER`]).
    pub fn start_tag(start_time: u64) -> u32 {
        ((start_time as u32 & 0x7fff_ffff) | 0x8000_0000).min(u32::MAX - 1)
    }

    /// The pid, as C peers see it.
    pub fn pid(self) -> i32 {
        self.0 as u32 as i32
    }

    /// The start tag; 0 for identities written by C peers.
    pub fn tag(self) -> u32 {
        (self.0 >> 32) as u32
    }
}

/// Whether a process still runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Liveness {
    /// It runs (and, for a tagged identity, it is the same incarnation).
    Alive,
    /// It is gone, a zombie, or its pid now belongs to a different process.
    Dead,
    /// Cannot tell (permission, parse failure, out of file descriptors): treated as alive, since
    /// only a certain death may trigger recovery.
    Unknown,
}

/// Outcome of a bounded semaphore wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SemWait {
    /// The token was taken.
    Acquired,
    /// The timeout passed (or a signal interrupted the wait): try again or recover.
    TimedOut,
    /// The semaphore is unusable (EINVAL): a corrupt region.
    Failed,
}

/// Something wrong in the region that a protocol survived. The platform reports each kind once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Problem {
    /// A slot's seqlock stayed odd past the reader's retries: its writer died mid-update (or a
    /// peer corrupted it). The reader used the value it saw.
    StuckSeqlock {
        /// Slot index.
        slot: usize,
    },
    /// A release would have taken a counter below zero (a peer or caller freed more than it
    /// accounted); the counter was clamped at zero.
    Underflow {
        /// Region device index.
        dev: usize,
    },
    /// `proc_num` held a value outside `[0, SLOTS]`; it was clamped.
    ProcNumOutOfRange {
        /// The value found.
        found: i32,
    },
    /// A dead process held the owner lock; its token was recovered.
    RecoveredDeadOwner {
        /// The dead owner's pid.
        pid: i32,
    },
    /// The owner lock's token was lost (a holder died between the semaphore and `owner_pid`);
    /// it was taken over.
    RecoveredLostToken,
    /// The release found `owner_pid` no longer ours: another process recovered the lock while we
    /// held it (we stalled past the grace period). The semaphore was not posted.
    LockStolen,
}

/// The operating-system services the protocols use. Implementations must be usable from any
/// thread; the owner-lock methods are called by one thread of a process at a time (the caller
/// serialises them, since kernel record locks belong to processes, not threads).
pub trait Platform {
    /// This process's identity.
    fn self_id(&self) -> ProcId;
    /// Whether the process `id` runs; a tag of 0 is checked by pid only.
    fn liveness(&self, id: ProcId) -> Liveness;
    /// Monotonic nanoseconds.
    fn now_ns(&self) -> u64;
    /// Sleeps (or yields, in models) for about `ns` nanoseconds.
    fn sleep_ns(&self, ns: u64);
    /// Reports a problem the protocols survived (log once per kind).
    fn report(&self, problem: Problem);

    /// `sem_init(sem, pshared = 1, value)`; false if it failed.
    fn sem_init(&self, sem: &RawSem, value: u32) -> bool;
    /// Waits at most `timeout_ns` for a token.
    fn sem_wait(&self, sem: &RawSem, timeout_ns: u64) -> SemWait;
    /// Returns a token.
    fn sem_post(&self, sem: &RawSem);
    /// The semaphore's current value.
    fn sem_value(&self, sem: &RawSem) -> u32;

    /// Takes the init lock (`lockf` on the region's bytes, as C peers take it), waiting at most
    /// `timeout_ns`; false on timeout. The kernel releases it if we die.
    fn init_lock(&self, timeout_ns: u64) -> bool;
    /// Releases the init lock.
    fn init_unlock(&self);

    /// Marks this process as inside the owner lock's acquire/release window (a kernel-released
    /// record lock beyond the region's bytes), so that no one takes over the token meanwhile.
    fn window_enter(&self);
    /// Leaves the window.
    fn window_exit(&self);
    /// Whether another process is inside the window.
    fn window_held_by_other(&self) -> bool;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_id_keeps_pid_low_and_tag_high() {
        let id = ProcId::new(4242, ProcId::start_tag(123_456));
        assert_eq!(id.pid(), 4242);
        assert_eq!(id.0 as u32, 4242, "C peers read the low 32 bits");
        assert_eq!(id.tag(), 0x8000_0000 | 123_456);
        assert_ne!(ProcId::start_tag(0), 0);
        assert_eq!(ProcId(4242).tag(), 0);
    }
}
