//! The plugin's requests for `qemu_plugin_reset`, so that none is lost.
//!
//! The plugin resets itself for two reasons: `trace=`'s window ended on
//! every vCPU (retranslate without the trace's callbacks) and `limit=` was
//! reached (hold every vCPU, write the report, stop). QEMU accepts one reset
//! at a time: `plugin_reset_uninstall` (plugins/loader.c) returns without a
//! word while the plugin's `ctx->resetting` is set, from the request until
//! the reset's callback has returned. A second request in that time — the
//! limit reached on one vCPU while the trace's reset waits for another to
//! reach a block boundary — would be dropped, and the run would never stop.
//!
//! [`Resets`] therefore asks QEMU once and collects every reason asked for
//! until that reset's callback runs, which serves them all. The callback
//! runs in QEMU's exclusive section (no vCPU executes guest code, so none
//! can ask), and QEMU clears `resetting` right after it returns: a request
//! after [`Resets::run`] finds QEMU ready for a new reset.

/// Why the plugin asks for a reset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Every vCPU passed its `trace=` window.
    TraceDone,
    /// A vCPU reached `limit=` (the vCPU's index).
    Limit(u32),
}

/// What one reset's callback is to do.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Wanted {
    /// Retranslate without the trace's callbacks.
    pub trace_done: bool,
    /// Stop at `limit=`: the first vCPU that reached it.
    pub limit: Option<u32>,
}

/// The plugin's reset requests: whether one is with QEMU, and what it is
/// for.
#[derive(Debug, Default)]
pub struct Resets {
    pending: bool,
    wanted: Wanted,
}

impl Resets {
    /// None asked for.
    pub const fn new() -> Self {
        Resets {
            pending: false,
            wanted: Wanted {
                trace_done: false,
                limit: None,
            },
        }
    }

    /// Ask for a reset for `why`. True: the caller is to call
    /// `qemu_plugin_reset` now (none of ours is pending). False: one is
    /// pending, and its callback serves `why` too.
    pub fn request(&mut self, why: Reason) -> bool {
        match why {
            Reason::TraceDone => self.wanted.trace_done = true,
            Reason::Limit(v) => {
                self.wanted.limit.get_or_insert(v);
            }
        }
        !std::mem::replace(&mut self.pending, true)
    }

    /// The pending reset's callback runs: every reason asked for since the
    /// request, and none pending after.
    pub fn run(&mut self) -> Wanted {
        self.pending = false;
        std::mem::take(&mut self.wanted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// QEMU's side (plugins/loader.c `plugin_reset_uninstall`): a request
    /// while a reset is pending is dropped.
    #[derive(Default)]
    struct Qemu {
        resetting: bool,
        accepted: u32,
    }

    impl Qemu {
        fn reset(&mut self) {
            if !self.resetting {
                self.resetting = true;
                self.accepted += 1;
            }
        }
        /// The exclusive section: our callback, then `resetting` cleared.
        fn run_pending(&mut self, r: &mut Resets) -> Option<Wanted> {
            let w = self.resetting.then(|| r.run());
            self.resetting = false;
            w
        }
    }

    fn ask(q: &mut Qemu, r: &mut Resets, why: Reason) {
        if r.request(why) {
            q.reset();
        }
    }

    #[test]
    fn a_limit_reached_while_the_trace_reset_is_pending_is_served_by_it() {
        let (mut q, mut r) = (Qemu::default(), Resets::default());
        ask(&mut q, &mut r, Reason::TraceDone);
        ask(&mut q, &mut r, Reason::Limit(1));
        ask(&mut q, &mut r, Reason::Limit(0));
        assert_eq!(
            q.run_pending(&mut r),
            Some(Wanted {
                trace_done: true,
                limit: Some(1),
            }),
            "one reset serves both, with the first vCPU at the limit"
        );
        assert_eq!(q.accepted, 1);
    }

    #[test]
    fn a_request_after_the_callback_gets_a_reset_of_its_own() {
        let (mut q, mut r) = (Qemu::default(), Resets::default());
        ask(&mut q, &mut r, Reason::TraceDone);
        assert_eq!(q.run_pending(&mut r).map(|w| w.limit), Some(None));
        ask(&mut q, &mut r, Reason::Limit(2));
        assert_eq!(
            q.run_pending(&mut r),
            Some(Wanted {
                trace_done: false,
                limit: Some(2),
            })
        );
        assert_eq!(q.accepted, 2);
        assert_eq!(q.run_pending(&mut r), None, "nothing left pending");
    }
}
