//! Notices when the kernels a program launches change, so that the SM controller measures its
//! solo rate again ([`crate::sm_controller`]): that rate is counted in blocks, and a block of a
//! matmul costs the GPU many times a block of an elementwise kernel. Without this, a program
//! that switches between them keeps a cap in blocks that is wrong by that factor until the next
//! periodic re-measurement (20 s alone, 30 to 60 s beside other containers).
//!
//! The launch hook sets one bit per kernel ([`KernelSet::bucket`]: one relaxed load, and an
//! atomic OR the first time a bucket is hit in a period); the controller takes the period's
//! set and hands it to [`Watch`]. A change: for [`LASTING`] periods in a row, most of a
//! period's kernels were not seen in the [`EPOCH`] to twice that many periods before.
//! Remembering what ran recently (rather than only what the last measurement saw)
//! keeps a program whose iterations run different kernels in turn, each phase longer than a
//! period, from being measured again at every phase. The price: switching back to work that
//! ran within that memory goes unnoticed until the periodic re-measurement. So does a change
//! of cost without a change of kernels (the same kernel on larger data).

/// Periods in a row whose kernels must be mostly new: one such period is noise (a rare kernel,
/// a phase shorter than a period).
pub const LASTING: u32 = 3;
/// Periods of memory: kernels seen in the current epoch and the one before count as known
/// (5 to 10 s at 200 ms a period).
pub const EPOCH: u32 = 25;
/// Words of a [`KernelSet`]: 256 buckets, few enough collisions for the hundred-odd kernels of
/// a training step.
pub const WORDS: usize = 4;

/// Kernels launched over some periods, one bit per hash bucket of the kernel's handle.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelSet(pub [u64; WORDS]);

impl KernelSet {
    /// No kernel (a period without launches tells nothing).
    pub const EMPTY: KernelSet = KernelSet([0; WORDS]);

    /// The word and bit of a kernel, from its handle (a `CUfunction`, or a `CUgraphExec` for a
    /// graph launch); a multiplicative hash spreads aligned pointers.
    pub fn bucket(kernel: usize) -> (usize, u64) {
        let h = (kernel as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56;
        ((h & 3) as usize, 1 << (h >> 2))
    }

    /// The set holding just `kernel`.
    pub fn of(kernel: usize) -> KernelSet {
        let (word, bit) = KernelSet::bucket(kernel);
        let mut s = KernelSet::EMPTY;
        s.0[word] = bit;
        s
    }

    fn union(self, other: KernelSet) -> KernelSet {
        let mut s = self;
        for (a, b) in s.0.iter_mut().zip(other.0) {
            *a |= b;
        }
        s
    }

    fn count(self) -> u32 {
        self.0.iter().map(|w| w.count_ones()).sum()
    }

    /// How many of this set's buckets `known` lacks.
    fn new_beside(self, known: KernelSet) -> u32 {
        self.0
            .iter()
            .zip(known.0)
            .map(|(a, k)| (a & !k).count_ones())
            .sum()
    }
}

/// The kernels seen lately, and the run of periods whose kernels were mostly new.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Watch {
    /// Kernels of the current epoch and of the one before.
    known: [KernelSet; 2],
    /// Periods into the current epoch.
    age: u32,
    /// Periods in a row with mostly new kernels.
    run: u32,
    /// Their kernels.
    run_set: KernelSet,
}

impl Default for Watch {
    fn default() -> Self {
        Watch {
            known: [KernelSet::EMPTY; 2],
            age: 0,
            run: 0,
            run_set: KernelSet::EMPTY,
        }
    }
}

impl Watch {
    /// Looks at one period's kernels: true when this is the [`LASTING`]th period in a row whose
    /// kernels were mostly new. They are then known, like those of any ordinary period.
    pub fn changed(&mut self, kernels: KernelSet) -> bool {
        if kernels == KernelSet::EMPTY {
            return false;
        }
        let known = self.known[0].union(self.known[1]);
        let novel = known != KernelSet::EMPTY && 2 * kernels.new_beside(known) > kernels.count();
        if !novel {
            self.run = 0;
            self.run_set = KernelSet::EMPTY;
            self.learn(kernels);
            return false;
        }
        self.run += 1;
        self.run_set = self.run_set.union(kernels);
        if self.run < LASTING {
            return false;
        }
        let run = core::mem::take(&mut self.run_set);
        self.run = 0;
        self.learn(run);
        true
    }

    fn learn(&mut self, kernels: KernelSet) {
        self.known[0] = self.known[0].union(kernels);
        self.age += 1;
        if self.age >= EPOCH {
            self.known = [KernelSet::EMPTY, self.known[0]];
            self.age = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    extern crate std;
    use std::vec::Vec;

    /// Kernels `first..first + n`, as distinct handles.
    fn kernels(first: usize, n: usize) -> KernelSet {
        (first..first + n)
            .map(|k| KernelSet::of(0x7f00_0000_0000 + 0x40 * k))
            .fold(KernelSet::EMPTY, KernelSet::union)
    }

    #[test]
    fn a_lasting_switch_to_other_kernels_is_a_change_once() {
        let mut w = Watch::default();
        for _ in 0..10 {
            assert!(!w.changed(kernels(0, 20)));
        }
        let fired: Vec<bool> = (0..10).map(|_| w.changed(kernels(100, 20))).collect();
        let expected: Vec<bool> = (0..10).map(|i| i + 1 == LASTING as usize).collect();
        assert_eq!(fired, expected, "a change on the third period, once");
    }

    /// Two periods of other kernels are not a change, nor are periods that add a few kernels
    /// to the usual ones. Mutation: any new kernel making a period new fails this.
    #[test]
    fn noise_is_not_a_change() {
        let mut w = Watch::default();
        for _ in 0..5 {
            w.changed(kernels(0, 20));
        }
        for step in 0..100 {
            let k = match step % 7 {
                0 | 1 => kernels(200 + step, 20),
                2 | 3 => kernels(0, 20).union(kernels(300 + step, 3)),
                _ => kernels(0, 20),
            };
            assert!(!w.changed(k), "step {step}");
        }
    }

    /// A program that runs two phases in turn, each 1 s (5 periods) of its own kernels: the
    /// second phase is a change the first time only. Mutation: forgetting the old kernels at a
    /// change (knowing only what the last measurement saw) makes every phase one.
    #[test]
    fn phases_in_turn_are_learnt() {
        let mut w = Watch::default();
        let mut changes = 0;
        for step in 0..500 {
            let k = if step / 5 % 2 == 0 {
                kernels(0, 20)
            } else {
                kernels(100, 20)
            };
            changes += u32::from(w.changed(k));
        }
        assert_eq!(changes, 1);
    }

    /// Work that ran more than two epochs ago is forgotten: switching back to it is a change.
    /// Mutation: an epoch that never ends keeps it known.
    #[test]
    fn work_run_long_ago_is_new_again() {
        let mut w = Watch::default();
        let mut changes = 0;
        for k in [kernels(0, 20), kernels(100, 20), kernels(0, 20)] {
            for _ in 0..2 * EPOCH + LASTING {
                changes += u32::from(w.changed(k));
            }
        }
        assert_eq!(changes, 2);
    }
}
