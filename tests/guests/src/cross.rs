//! A clock read on two vCPUs must never go backwards from one to the other:
//! the leader publishes its reading, the follower then reads its own and
//! flags any value below the published one; repeated for up to `ROUNDS`
//! rounds or until the leader's time budget runs out (round-robin TCG
//! switches vCPUs only every few tens of ms), and at least once however
//! long the follower takes to get there (the host's scheduling; the
//! runner's timeout is the hang guard).

use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Rounds after which both sides stop.
pub const ROUNDS: u64 = 1000;

/// The shared state (a `static` in the guest).
#[derive(Debug)]
pub struct CrossCheck {
    published: AtomicU64,
    rounds: AtomicU64,
    backwards: AtomicBool,
}

impl Default for CrossCheck {
    fn default() -> Self {
        Self::new()
    }
}

impl CrossCheck {
    /// Nothing published yet.
    pub const fn new() -> Self {
        CrossCheck {
            published: AtomicU64::new(0),
            rounds: AtomicU64::new(0),
            backwards: AtomicBool::new(false),
        }
    }

    /// The follower (second vCPU): check each published value against a
    /// later reading of `clock` until the leader stops.
    pub fn follow(&self, clock: impl Fn() -> u64) {
        let mut seen = 0;
        while self.rounds.load(Ordering::Acquire) < ROUNDS {
            let p = self.published.load(Ordering::Acquire);
            if p == seen {
                core::hint::spin_loop();
                continue;
            }
            if clock().wrapping_sub(p) > u64::MAX / 2 {
                self.backwards.store(true, Ordering::Release);
            }
            seen = p;
            self.rounds.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// The leader: publish `clock` readings while `more()` says so, and
    /// until the follower completed one round; returns (rounds completed,
    /// whether the follower ever saw time go backwards). The follower stops
    /// too.
    pub fn lead(&self, clock: impl Fn() -> u64, mut more: impl FnMut() -> bool) -> (u64, bool) {
        let mut round = 0;
        while more() || self.rounds.load(Ordering::Acquire) == 0 {
            let done = self.rounds.load(Ordering::Acquire);
            if done >= ROUNDS {
                break;
            }
            if done == round {
                self.published.store(clock(), Ordering::Release);
                round += 1;
            }
            core::hint::spin_loop();
        }
        let rounds = self.rounds.swap(ROUNDS, Ordering::AcqRel);
        (rounds, self.backwards.load(Ordering::Acquire))
    }
}
