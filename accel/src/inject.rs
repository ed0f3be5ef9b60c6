//! Steal and preemption on demand: `-accel rustkvm,inject-steal=...` and
//! QMP `x-rustkvm-inject-steal` (docs/steal-time.md, "Injected steal").
//!
//! An [`Injection`] takes vCPU `cpu` off its host CPU at VM time `at_ns`
//! (QEMU's virtual clock) for `window_ns` of VM time, as a host scheduler
//! preempting it would: it runs no guest code meanwhile, its x86
//! `kvm_steal_time.preempted` reads KVM_VCPU_PREEMPTED to the other vCPUs
//! (arm64's PV time has no such flag, as KVM), and when the window ends its
//! steal counter grows by `steal_ns` at its next entry, where KVM's
//! `record_steal_time` adds a preemption's run delay. A zero window only adds
//! the steal. Nothing else of the guest's steal accounting changes.
//!
//! The [`Schedule`] here is pure: it orders the injections and says what is
//! due at a VM time. The machine arms one QEMU timer at
//! [`Schedule::next_deadline`] and applies what [`Schedule::due`] returns
//! (`vm::Vm::inject_fire`). Under `-icount` VM time counts instructions, so
//! the timer stops guest execution at the same instruction every run and
//! the guest sees the same steal and the same windows every time.

use thiserror::Error;

/// One injection: steal for vCPU `cpu`, with a preemption window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Injection {
    /// QEMU's `cpu_index` of the vCPU.
    pub cpu: u32,
    /// VM time (QEMU_CLOCK_VIRTUAL ns) at which it starts.
    pub at_ns: u64,
    /// Steal added to the vCPU's steal counter when the window ends.
    pub steal_ns: u64,
    /// VM time the vCPU is held preempted (not running), from `at_ns`.
    pub window_ns: u64,
}

impl Injection {
    /// vCPU `cpu` held `window_ns` from `at_ns`, then `steal_ns` of steal.
    pub const fn new(cpu: u32, at_ns: u64, steal_ns: u64, window_ns: u64) -> Self {
        Injection {
            cpu,
            at_ns,
            steal_ns,
            window_ns,
        }
    }

    /// Refused if its vCPU is not one of `max_cpus`, or its steal or window
    /// is longer than [`MAX_AMOUNT_NS`] (so that the steal a guest sees,
    /// and VM time plus a window, stay far from 2^64): what `add` and a
    /// stream's decode both check of one injection.
    fn check(&self, max_cpus: u32) -> Result<(), InjectError> {
        if self.cpu >= max_cpus {
            return Err(InjectError::NoSuchCpu {
                cpu: self.cpu,
                max_cpus,
            });
        }
        for (what, ns) in [("steal", self.steal_ns), ("window", self.window_ns)] {
            if ns > MAX_AMOUNT_NS {
                return Err(InjectError::TooLong { what, ns });
            }
        }
        Ok(())
    }

    /// When the window ends (VM ns).
    pub fn end_ns(&self) -> u64 {
        self.at_ns.saturating_add(self.window_ns)
    }
}

/// Why an injection or a spec is refused (an `-accel` or QMP error).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum InjectError {
    /// A spec entry is not `CPU:AT:STEAL[:WINDOW]`.
    #[error("'{0}': expected CPU:AT:STEAL[:WINDOW] (times in ns, or with a unit: ns, us, ms, s)")]
    Syntax(String),
    /// A time is not a number with an optional unit.
    #[error("'{0}': not a time (a number of ns, or with a unit: ns, us, ms, s)")]
    Time(String),
    /// A time beyond 2^64 ns.
    #[error("'{0}': time too large")]
    TooLarge(String),
    /// No such vCPU index in this machine.
    #[error("vCPU {cpu} does not exist (the machine has {max_cpus} vCPU slots)")]
    NoSuchCpu {
        /// The index given.
        cpu: u32,
        /// The machine's `-smp maxcpus`.
        max_cpus: u32,
    },
    /// The start time is already past.
    #[error("at={at_ns} ns is in the past (VM time is {now_ns} ns)")]
    Past {
        /// The start asked for.
        at_ns: u64,
        /// VM time now.
        now_ns: u64,
    },
    /// A migration stream's schedule is malformed.
    #[error("bad injection schedule in the migration stream: {0}")]
    Stream(String),
    /// A steal or a window longer than [`MAX_AMOUNT_NS`].
    #[error("{what} of {ns} ns: at most {MAX_AMOUNT_NS} ns (1 day)")]
    TooLong {
        /// "steal" or "window".
        what: &'static str,
        /// The length given.
        ns: u64,
    },
    /// A vCPU has [`MAX_PER_VCPU`] injections not done yet.
    #[error("vCPU {cpu} already has {MAX_PER_VCPU} injections not done yet")]
    TooMany {
        /// The vCPU.
        cpu: u32,
    },
    /// Two windows of one vCPU overlap.
    #[error("vCPU {cpu}: the window {at_ns}..{end_ns} ns overlaps another of its windows")]
    Overlap {
        /// The vCPU.
        cpu: u32,
        /// The new window's start.
        at_ns: u64,
        /// The new window's end.
        end_ns: u64,
    },
}

/// Parse a time: a number of ns, or a number with `ns`, `us`, `ms` or `s`.
pub fn parse_time(s: &str) -> Result<u64, InjectError> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let scale: u64 = match unit {
        "" | "ns" => 1,
        "us" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        _ => return Err(InjectError::Time(s.to_owned())),
    };
    let n: u64 = num.parse().map_err(|_| InjectError::Time(s.to_owned()))?;
    n.checked_mul(scale)
        .ok_or_else(|| InjectError::TooLarge(s.to_owned()))
}

/// Parse `-accel rustkvm,inject-steal=`: entries `CPU:AT:STEAL[:WINDOW]`
/// separated by `/`, e.g. `0:100ms:5ms:5ms/1:200ms:1ms`.
pub fn parse_spec(spec: &str) -> Result<Vec<Injection>, InjectError> {
    spec.split('/')
        .map(|entry| {
            let f: Vec<&str> = entry.split(':').collect();
            if !(3..=4).contains(&f.len()) {
                return Err(InjectError::Syntax(entry.to_owned()));
            }
            let cpu = f[0]
                .trim()
                .parse()
                .map_err(|_| InjectError::Syntax(entry.to_owned()))?;
            Ok(Injection {
                cpu,
                at_ns: parse_time(f[1])?,
                steal_ns: parse_time(f[2])?,
                window_ns: f.get(3).map_or(Ok(0), |w| parse_time(w))?,
            })
        })
        .collect()
}

/// What a due injection asks of a vCPU, in VM-time order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Take vCPU `cpu` off its CPU: it runs no guest code until released
    /// (x86: `preempted` set).
    Hold {
        /// The vCPU.
        cpu: u32,
    },
    /// The window ended: vCPU `cpu` may run, with `steal_ns` more steal.
    Release {
        /// The vCPU.
        cpu: u32,
        /// Steal to add.
        steal_ns: u64,
    },
    /// No window: add `steal_ns` to vCPU `cpu`'s steal.
    Steal {
        /// The vCPU.
        cpu: u32,
        /// Steal to add.
        steal_ns: u64,
    },
}

/// The machine's injections not done yet: those to start, and the windows
/// in progress.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Schedule {
    /// Not started, by start time (then by order of addition).
    pending: Vec<Injection>,
    /// Started, window not ended.
    active: Vec<Injection>,
}

impl Schedule {
    /// Add `inj`, checked against `max_cpus` and VM time `now_ns`: a start in
    /// the past or a window overlapping another of the same vCPU's is refused.
    pub fn add(&mut self, inj: Injection, max_cpus: u32, now_ns: u64) -> Result<(), InjectError> {
        inj.check(max_cpus)?;
        if inj.at_ns < now_ns {
            return Err(InjectError::Past {
                at_ns: inj.at_ns,
                now_ns,
            });
        }
        let mine = || {
            self.pending
                .iter()
                .chain(&self.active)
                .filter(|o| o.cpu == inj.cpu)
        };
        if mine().count() >= MAX_PER_VCPU {
            return Err(InjectError::TooMany { cpu: inj.cpu });
        }
        if mine().any(|o| overlap(o, &inj)) {
            return Err(InjectError::Overlap {
                cpu: inj.cpu,
                at_ns: inj.at_ns,
                end_ns: inj.end_ns(),
            });
        }
        let at = self.pending.partition_point(|p| p.at_ns <= inj.at_ns);
        self.pending.insert(at, inj);
        Ok(())
    }

    /// The VM time of the next action, if any is left.
    pub fn next_deadline(&self) -> Option<u64> {
        let start = self.pending.first().map(|p| p.at_ns);
        let end = self.active.iter().map(Injection::end_ns).min();
        start.into_iter().chain(end).min()
    }

    /// Take the actions due at VM time `now_ns`, in VM-time order; at one
    /// instant a window's end comes before a start.
    pub fn due(&mut self, now_ns: u64) -> Vec<Action> {
        let mut timed: Vec<(u64, u8, Action)> = Vec::new();
        self.active.retain(|a| {
            let done = a.end_ns() <= now_ns;
            if done {
                timed.push((
                    a.end_ns(),
                    0,
                    Action::Release {
                        cpu: a.cpu,
                        steal_ns: a.steal_ns,
                    },
                ));
            }
            !done
        });
        let started = self.pending.partition_point(|p| p.at_ns <= now_ns);
        for inj in self.pending.drain(..started) {
            if inj.window_ns == 0 {
                timed.push((
                    inj.at_ns,
                    1,
                    Action::Steal {
                        cpu: inj.cpu,
                        steal_ns: inj.steal_ns,
                    },
                ));
            } else if inj.end_ns() <= now_ns {
                // The whole window passed at once (a timer that fired late).
                timed.push((inj.at_ns, 1, Action::Hold { cpu: inj.cpu }));
                timed.push((
                    inj.end_ns(),
                    0,
                    Action::Release {
                        cpu: inj.cpu,
                        steal_ns: inj.steal_ns,
                    },
                ));
            } else {
                timed.push((inj.at_ns, 1, Action::Hold { cpu: inj.cpu }));
                self.active.push(inj);
            }
        }
        timed.sort_by_key(|&(t, order, _)| (t, order));
        timed.into_iter().map(|(_, _, a)| a).collect()
    }

    /// Whether nothing is left.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty() && self.active.is_empty()
    }

    /// The windows in progress (their vCPUs are held).
    pub fn active(&self) -> &[Injection] {
        &self.active
    }

    /// The schedule as it travels in vmstate (QEMU's `rustkvm/inject`
    /// subsection): per injection [`ENCODED_LEN`] bytes, little-endian:
    /// cpu (u32), whether its window is in progress (u32), at, steal and
    /// window (u64 each); the windows in progress first.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity((self.active.len() + self.pending.len()) * ENCODED_LEN);
        for (inj, active) in self
            .active
            .iter()
            .map(|i| (i, 1u32))
            .chain(self.pending.iter().map(|i| (i, 0)))
        {
            out.extend_from_slice(&inj.cpu.to_le_bytes());
            out.extend_from_slice(&active.to_le_bytes());
            for v in [inj.at_ns, inj.steal_ns, inj.window_ns] {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        out
    }

    /// A schedule from [`Schedule::encode`]'s bytes, for a machine of
    /// `max_cpus` vCPUs; refused if malformed (a stream is input): as
    /// [`Schedule::add`] refuses, an unknown vCPU, more than
    /// [`MAX_PER_VCPU`] injections of one vCPU or two of its windows that
    /// overlap, and a window in progress that is empty. A start already
    /// past is taken (it is due at once). O(n log n) in the records.
    pub fn decode(bytes: &[u8], max_cpus: u32) -> Result<Schedule, InjectError> {
        if bytes.len() % ENCODED_LEN != 0 {
            return Err(InjectError::Stream(format!(
                "{} bytes, not a multiple of {ENCODED_LEN}",
                bytes.len()
            )));
        }
        if bytes.len() / ENCODED_LEN > max_len(max_cpus) / ENCODED_LEN {
            return Err(InjectError::Stream(format!(
                "{} injections, more than {MAX_PER_VCPU} for each of {max_cpus} vCPUs",
                bytes.len() / ENCODED_LEN
            )));
        }
        let mut s = Schedule::default();
        for rec in bytes.chunks_exact(ENCODED_LEN) {
            let u32_at =
                |o: usize| u32::from_le_bytes([rec[o], rec[o + 1], rec[o + 2], rec[o + 3]]);
            let u64_at = |o: usize| {
                let mut b = [0u8; 8];
                b.copy_from_slice(&rec[o..o + 8]);
                u64::from_le_bytes(b)
            };
            let inj = Injection {
                cpu: u32_at(0),
                at_ns: u64_at(8),
                steal_ns: u64_at(16),
                window_ns: u64_at(24),
            };
            inj.check(max_cpus)?;
            match u32_at(4) {
                0 => s.pending.push(inj),
                1 if inj.window_ns != 0 => s.active.push(inj),
                other => {
                    return Err(InjectError::Stream(format!(
                        "injection state {other} (window {} ns)",
                        inj.window_ns
                    )))
                }
            }
        }
        // By start time, in the order of the stream at one instant: what a
        // sequence of `add`s makes (a stable sort).
        s.pending.sort_by_key(|p| p.at_ns);
        check_windows(s.pending.iter().chain(&s.active))?;
        Ok(s)
    }
}

/// Whether `a` and `b` (one vCPU's) overlap: half-open windows [at, end); a
/// zero window is the instant `at`, which may touch but not fall inside
/// another window.
fn overlap(a: &Injection, b: &Injection) -> bool {
    if a.window_ns == 0 || b.window_ns == 0 {
        (a.at_ns < b.at_ns && b.at_ns < a.end_ns()) || (b.at_ns < a.at_ns && a.at_ns < b.end_ns())
    } else {
        a.at_ns < b.end_ns() && b.at_ns < a.end_ns()
    }
}

/// `injs` as [`Schedule::add`] would take them one by one: at most
/// [`MAX_PER_VCPU`] per vCPU, no two of a vCPU's overlapping. Sorted by
/// (vCPU, start), non-empty windows that do not overlap their predecessor
/// are disjoint, and an instant overlaps only the last window starting
/// before it.
fn check_windows<'a>(injs: impl Iterator<Item = &'a Injection>) -> Result<(), InjectError> {
    let mut all: Vec<&Injection> = injs.collect();
    all.sort_by_key(|i| (i.cpu, i.at_ns));
    let refuse = |i: &Injection| InjectError::Overlap {
        cpu: i.cpu,
        at_ns: i.at_ns,
        end_ns: i.end_ns(),
    };
    for one in all.chunk_by(|a, b| a.cpu == b.cpu) {
        if one.len() > MAX_PER_VCPU {
            return Err(InjectError::TooMany { cpu: one[0].cpu });
        }
        let windows: Vec<&Injection> = one.iter().copied().filter(|i| i.window_ns != 0).collect();
        if let Some(w) = windows.windows(2).find(|w| overlap(w[0], w[1])) {
            return Err(refuse(w[1]));
        }
        for i in one.iter().filter(|i| i.window_ns == 0) {
            let before = windows.partition_point(|w| w.at_ns < i.at_ns);
            if before > 0 && overlap(windows[before - 1], i) {
                return Err(refuse(i));
            }
        }
    }
    Ok(())
}

/// The longest steal or window one injection may ask for: one day of VM
/// time (`-accel`, QMP and a stream alike).
pub const MAX_AMOUNT_NS: u64 = 86_400 * 1_000_000_000;

/// At most this many injections of one vCPU not done yet: `add` refuses
/// more, and a stream bringing more is refused.
pub const MAX_PER_VCPU: usize = 1024;

/// The longest schedule a machine of `max_cpus` vCPUs can carry, in bytes
/// ([`Schedule::encode`]).
pub fn max_len(max_cpus: u32) -> usize {
    max_cpus as usize * MAX_PER_VCPU * ENCODED_LEN
}

/// Bytes per injection in [`Schedule::encode`].
pub const ENCODED_LEN: usize = 32;

#[cfg(test)]
mod tests {
    use super::*;

    fn inj(cpu: u32, at: u64, steal: u64, window: u64) -> Injection {
        Injection::new(cpu, at, steal, window)
    }

    #[test]
    fn times_take_units_and_refuse_anything_else() {
        assert_eq!(parse_time("7"), Ok(7));
        assert_eq!(parse_time("7ns"), Ok(7));
        assert_eq!(parse_time("3us"), Ok(3_000));
        assert_eq!(parse_time("100ms"), Ok(100_000_000));
        assert_eq!(parse_time(" 2s "), Ok(2_000_000_000));
        for bad in ["", "ms", "1.5ms", "-1", "1m", "1 ms", "0x10"] {
            assert!(parse_time(bad).is_err(), "{bad:?} accepted");
        }
        assert!(matches!(
            parse_time("18446744073710s"),
            Err(InjectError::TooLarge(_))
        ));
    }

    #[test]
    fn a_spec_lists_entries_with_an_optional_window() {
        assert_eq!(
            parse_spec("0:100ms:5ms:2ms/1:200ms:1ms"),
            Ok(vec![
                inj(0, 100_000_000, 5_000_000, 2_000_000),
                inj(1, 200_000_000, 1_000_000, 0)
            ])
        );
        for bad in ["", "0", "0:1", "0:1:2:3:4", "x:1:2", "0:1:2/", "-1:1:2"] {
            assert!(parse_spec(bad).is_err(), "{bad:?} accepted");
        }
        let e = parse_spec("0:1:2:3:4").unwrap_err().to_string();
        assert!(e.contains("CPU:AT:STEAL[:WINDOW]"), "{e}");
    }

    #[test]
    fn add_refuses_unknown_vcpus_past_starts_and_overlapping_windows() {
        let mut s = Schedule::default();
        assert_eq!(
            s.add(inj(2, 10, 1, 0), 2, 0),
            Err(InjectError::NoSuchCpu {
                cpu: 2,
                max_cpus: 2
            })
        );
        assert!(matches!(
            s.add(inj(0, 5, 1, 0), 2, 6),
            Err(InjectError::Past { .. })
        ));
        s.add(inj(0, 100, 1, 50), 2, 0).unwrap();
        for clash in [inj(0, 120, 1, 10), inj(0, 50, 1, 51), inj(0, 120, 1, 0)] {
            assert!(
                matches!(s.add(clash, 2, 0), Err(InjectError::Overlap { .. })),
                "{clash:?}"
            );
        }
        // Touching windows, instants at the edges and other vCPUs are fine.
        s.add(inj(0, 150, 1, 10), 2, 0).unwrap();
        s.add(inj(0, 50, 1, 50), 2, 0).unwrap();
        s.add(inj(0, 100, 1, 0), 2, 0).unwrap();
        s.add(inj(1, 120, 1, 10), 2, 0).unwrap();
        assert_eq!(s.next_deadline(), Some(50));
    }

    #[test]
    fn due_actions_come_in_vm_time_order_at_their_deadlines() {
        let mut s = Schedule::default();
        s.add(inj(0, 100, 7, 50), 2, 0).unwrap();
        s.add(inj(1, 120, 3, 0), 2, 0).unwrap();
        s.add(inj(0, 150, 9, 10), 2, 0).unwrap();
        assert_eq!(s.next_deadline(), Some(100));
        assert_eq!(s.due(99), vec![]);
        assert_eq!(s.due(100), vec![Action::Hold { cpu: 0 }]);
        assert_eq!(s.next_deadline(), Some(120));
        assert_eq!(
            s.due(120),
            vec![Action::Steal {
                cpu: 1,
                steal_ns: 3
            }]
        );
        assert_eq!(s.next_deadline(), Some(150));
        // The end of one window before the start of the next at one instant.
        assert_eq!(
            s.due(150),
            vec![
                Action::Release {
                    cpu: 0,
                    steal_ns: 7
                },
                Action::Hold { cpu: 0 }
            ]
        );
        assert_eq!(s.next_deadline(), Some(160));
        assert_eq!(
            s.due(1_000),
            vec![Action::Release {
                cpu: 0,
                steal_ns: 9
            }]
        );
        assert!(s.is_empty());
        assert_eq!(s.next_deadline(), None);
    }

    #[test]
    fn the_schedule_travels_as_bytes_and_a_bad_stream_is_refused() {
        let mut s = Schedule::default();
        s.add(inj(0, 10, 5, 10), 2, 0).unwrap();
        s.add(inj(1, 30, 6, 0), 2, 0).unwrap();
        s.add(inj(1, 40, 7, 3), 2, 0).unwrap();
        assert_eq!(s.due(12), vec![Action::Hold { cpu: 0 }]);
        let bytes = s.encode();
        assert_eq!(bytes.len(), 3 * ENCODED_LEN);
        let back = Schedule::decode(&bytes, 2).unwrap();
        assert_eq!(back, s);
        assert_eq!(back.active(), &[inj(0, 10, 5, 10)]);
        assert_eq!(Schedule::decode(&[], 1), Ok(Schedule::default()));
        assert!(matches!(
            Schedule::decode(&bytes[1..], 2),
            Err(InjectError::Stream(_))
        ));
        assert!(matches!(
            Schedule::decode(&bytes, 1),
            Err(InjectError::NoSuchCpu { cpu: 1, .. })
        ));
        let mut bad = bytes.clone();
        bad[4] = 2;
        assert!(matches!(
            Schedule::decode(&bad, 2),
            Err(InjectError::Stream(_))
        ));
    }

    #[test]
    fn a_late_timer_still_holds_and_releases_in_order() {
        let mut s = Schedule::default();
        s.add(inj(0, 10, 5, 10), 1, 0).unwrap();
        s.add(inj(0, 30, 6, 10), 1, 0).unwrap();
        assert_eq!(
            s.due(35),
            vec![
                Action::Hold { cpu: 0 },
                Action::Release {
                    cpu: 0,
                    steal_ns: 5
                },
                Action::Hold { cpu: 0 }
            ]
        );
        assert_eq!(s.next_deadline(), Some(40));
    }

    #[test]
    fn steal_and_windows_beyond_a_day_are_refused() {
        let mut s = Schedule::default();
        s.add(inj(0, 0, MAX_AMOUNT_NS, MAX_AMOUNT_NS), 1, 0)
            .unwrap();
        for bad in [
            inj(0, 1 << 60, MAX_AMOUNT_NS + 1, 0),
            inj(0, 1 << 60, 0, u64::MAX),
        ] {
            assert!(
                matches!(s.add(bad, 1, 0), Err(InjectError::TooLong { .. })),
                "{bad:?}"
            );
        }
        let mut bytes = s.encode();
        bytes[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(
            Schedule::decode(&bytes, 1),
            Err(InjectError::TooLong {
                what: "steal",
                ns: u64::MAX
            })
        );
    }

    #[test]
    fn add_refuses_more_than_max_per_vcpu() {
        let mut s = Schedule::default();
        for k in 0..MAX_PER_VCPU as u64 {
            s.add(inj(0, k * 10, 1, 5), 2, 0).unwrap();
        }
        assert_eq!(
            s.add(inj(0, 1 << 40, 1, 0), 2, 0),
            Err(InjectError::TooMany { cpu: 0 })
        );
        s.add(inj(1, 0, 1, 0), 2, 0).unwrap();
        let bytes = s.encode();
        assert_eq!(Schedule::decode(&bytes, 2).as_ref(), Ok(&s));
        let mut more = bytes.clone();
        more.extend_from_slice(&bytes[..ENCODED_LEN]);
        more[bytes.len() + 8] = 0xff; // at: a free instant of vCPU 0's
        assert_eq!(
            Schedule::decode(&more, 2),
            Err(InjectError::TooMany { cpu: 0 })
        );
        assert!(matches!(
            Schedule::decode(&vec![0; max_len(1) + ENCODED_LEN], 1),
            Err(InjectError::Stream(_))
        ));
    }

    fn record(cpu: u32, state: u32, at: u64, steal: u64, window: u64) -> Vec<u8> {
        let mut b = Vec::with_capacity(ENCODED_LEN);
        b.extend_from_slice(&cpu.to_le_bytes());
        b.extend_from_slice(&state.to_le_bytes());
        for v in [at, steal, window] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b
    }

    #[test]
    fn a_stream_with_overlapping_windows_of_one_vcpu_is_refused() {
        let ok = [
            record(0, 1, 10, 1, 10),
            record(0, 0, 20, 1, 5),
            record(1, 0, 12, 1, 0),
        ];
        assert!(Schedule::decode(&ok.concat(), 2).is_ok());
        for clash in [
            record(0, 0, 15, 1, 1),
            record(0, 0, 15, 1, 0),
            record(0, 0, 5, 1, 6),
            record(0, 0, 10, 1, 10),
        ] {
            let mut bytes = ok.concat();
            bytes.extend_from_slice(&clash);
            assert!(
                matches!(
                    Schedule::decode(&bytes, 2),
                    Err(InjectError::Overlap { cpu: 0, .. })
                ),
                "{clash:?}"
            );
        }
    }

    use proptest::prelude::*;

    /// Records of few vCPUs and small times, so that clashes are common.
    fn records() -> impl Strategy<Value = Vec<(u32, u32, u64, u64, u64)>> {
        proptest::collection::vec((0u32..3, 0u32..3, 0u64..40, 0u64..3, 0u64..8), 0..12)
    }

    proptest! {
        /// Any bytes: refused or taken, never a panic; what is taken travels
        /// unchanged.
        #[test]
        fn decode_takes_any_bytes_without_panicking(bytes in proptest::collection::vec(any::<u8>(), 0..200), cpus in 1u32..4) {
            if let Ok(s) = Schedule::decode(&bytes, cpus) {
                prop_assert_eq!(Schedule::decode(&s.encode(), cpus), Ok(s));
            }
        }

        /// decode takes a stream exactly when `add`, one record after
        /// another (no start is past), takes its records, and in the order
        /// `add` leaves them.
        #[test]
        fn decode_checks_as_add_does(recs in records()) {
            let bytes: Vec<u8> = recs.iter().flat_map(|&(c, st, a, l, w)| record(c, st, a, l, w)).collect();
            let mut naive = Schedule::default();
            let mut naive_ok = true;
            for &(cpu, state, at, steal, window) in &recs {
                if state > 1 || (state == 1 && window == 0) || cpu >= 2 {
                    naive_ok = false;
                    break;
                }
                if naive.add(inj(cpu, at, steal, window), 2, 0).is_err() {
                    naive_ok = false;
                    break;
                }
            }
            let decoded = Schedule::decode(&bytes, 2);
            prop_assert_eq!(decoded.is_ok(), naive_ok, "{:?}", decoded);
            if let Ok(d) = decoded {
                let pending: Vec<Injection> = naive
                    .pending
                    .iter()
                    .filter(|p| !d.active.contains(p))
                    .copied()
                    .collect();
                prop_assert_eq!(&d.pending, &pending);
            }
        }
    }
}
