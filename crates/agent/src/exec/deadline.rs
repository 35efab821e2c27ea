//! The deadline exec mode's guard enforces on the command by itself: the
//! instant the agent's local view of the lease ends, on the monotonic clock,
//! with the grace period before it. The agent sends one before the command
//! starts and another after every confirmed claim or renewal; the guard
//! acts on the last one it got, whatever became of the agent meanwhile
//! (stopped, throttled, deadlocked). This module owns the one-line wire
//! format of each direction and the pure rule of when the guard acts, so
//! both are tested without processes.
//!
//! Both processes read `CLOCK_MONOTONIC`, which is one clock for the whole
//! machine and never steps; the lease itself is measured on the same clock
//! ([`leasehold_engine::Leadership`]).

use std::time::Duration;

/// How long before the deadline the guard SIGKILLs the command's tree, so
/// the kill has landed by the deadline itself. The agent's own check sends
/// SIGTERM at the same threshold, seen every `RECHECK`, so its SIGTERM
/// comes with the guard's or up to a re-check later; the guard's SIGKILL
/// bounds the command's end either way.
pub const LEAD: Duration = Duration::from_millis(20);

/// The guard's one report, sent before it exits: it ended the command
/// because the deadline came with no extension (not because the command
/// ended by itself, nor because the agent asked).
pub const EXPIRED: &[u8] = b"expired\n";

/// When the command must be gone, and how long SIGTERM comes before that.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline {
    /// `CLOCK_MONOTONIC`, in nanoseconds.
    pub until_ns: u64,
    pub grace_ns: u64,
}

/// What the guard does next under a deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Act {
    /// Nothing yet: look again after this long, or sooner if the agent
    /// sends a new deadline.
    Wait(Duration),
    /// SIGTERM to the command's group: less than the grace period is left.
    Terminate,
    /// SIGKILL to the whole tree: the deadline is `LEAD` away.
    Kill,
}

impl Deadline {
    /// The deadline `until` is on the monotonic clock. The clock is read
    /// before `Instant::now()`, so a stall between the two reads makes the
    /// deadline earlier, never later.
    pub fn at(until: std::time::Instant, grace: Duration) -> Self {
        let clock = monotonic_ns();
        let left = until.saturating_duration_since(std::time::Instant::now());
        Self {
            until_ns: clock.saturating_add(nanos(left)),
            grace_ns: nanos(grace),
        }
    }

    /// The line the agent writes.
    pub fn line(&self) -> String {
        format!("until {} grace {}\n", self.until_ns, self.grace_ns)
    }

    /// A line the agent wrote (without its newline).
    pub fn parse(line: &str) -> Option<Self> {
        let words: Vec<&str> = line.split(' ').collect();
        let ["until", until, "grace", grace] = words[..] else {
            return None;
        };
        Some(Self {
            until_ns: until.parse().ok()?,
            grace_ns: grace.parse().ok()?,
        })
    }

    fn kill_at(&self) -> u64 {
        self.until_ns.saturating_sub(nanos(LEAD))
    }

    fn terminate_at(&self) -> u64 {
        self.kill_at().saturating_sub(self.grace_ns)
    }

    /// Whether a command may still be started under this deadline: its
    /// grace period has not begun.
    pub fn allows_start(&self, now_ns: u64) -> bool {
        now_ns < self.terminate_at()
    }

    /// What to do at `now_ns`, SIGTERM sent already or not.
    pub fn act(&self, now_ns: u64, terminated: bool) -> Act {
        if now_ns >= self.kill_at() {
            Act::Kill
        } else if !terminated && now_ns >= self.terminate_at() {
            Act::Terminate
        } else {
            let next = if terminated {
                self.kill_at()
            } else {
                self.terminate_at()
            };
            Act::Wait(Duration::from_nanos(next - now_ns))
        }
    }
}

/// Bytes read from the agent, cut into lines; keeps a partial line for the
/// next read.
#[derive(Debug, Default)]
pub struct Lines(Vec<u8>);

impl Lines {
    /// The last whole deadline among what came in, if any; a line that is
    /// not a deadline is skipped (and said on standard error).
    pub fn push(&mut self, bytes: &[u8]) -> Option<Deadline> {
        self.0.extend_from_slice(bytes);
        let end = self.0.iter().rposition(|&b| b == b'\n')?;
        let whole: Vec<u8> = self.0.drain(..=end).collect();
        let mut last = None;
        for line in whole.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            match std::str::from_utf8(line).ok().and_then(Deadline::parse) {
                Some(deadline) => last = Some(deadline),
                None => eprintln!(
                    "leasehold exec-guard: not a deadline: {:?}",
                    String::from_utf8_lossy(line)
                ),
            }
        }
        last
    }
}

/// `CLOCK_MONOTONIC` now, in nanoseconds.
pub fn monotonic_ns() -> u64 {
    // The monotonic clock exists on every system the agent builds for;
    // nothing to do but read it.
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .expect("CLOCK_MONOTONIC can be read");
    (now.tv_sec() as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(now.tv_nsec() as u64)
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_line_reads_back_as_it_was_written() {
        let d = Deadline {
            until_ns: 123_456_789_000,
            grace_ns: 250 * MS,
        };
        assert_eq!(d.line(), "until 123456789000 grace 250000000\n");
        assert_eq!(Deadline::parse(d.line().trim_end()), Some(d));
        for bad in [
            "",
            "until 1",
            "until x grace 1",
            "until 1 grace 2 more",
            "grace 1 until 2",
        ] {
            assert_eq!(Deadline::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn lines_cut_across_reads_give_the_last_whole_deadline() {
        let mut lines = Lines::default();
        assert_eq!(lines.push(b"until 5 gr"), None);
        let d = lines.push(b"ace 1\nuntil 9 grace 2\nuntil 1");
        assert_eq!(
            d,
            Some(Deadline {
                until_ns: 9,
                grace_ns: 2
            })
        );
        assert_eq!(
            lines.push(b"0 grace 3\n"),
            Some(Deadline {
                until_ns: 10,
                grace_ns: 3
            })
        );
        // A line that is no deadline leaves the last good one standing.
        assert_eq!(lines.push(b"nonsense\n"), None);
    }

    #[test]
    fn sigterm_a_grace_period_before_the_kill_and_the_kill_a_lead_before_the_deadline() {
        let d = Deadline {
            until_ns: 1_000 * MS,
            grace_ns: 250 * MS,
        };
        let lead = LEAD.as_nanos() as u64;
        let terminate_at = 1_000 * MS - lead - 250 * MS;
        assert_eq!(
            d.act(0, false),
            Act::Wait(Duration::from_nanos(terminate_at))
        );
        assert!(d.allows_start(terminate_at - 1));
        assert!(!d.allows_start(terminate_at));
        assert_eq!(d.act(terminate_at, false), Act::Terminate);
        // Once SIGTERM went out, the next step is the kill.
        assert_eq!(
            d.act(terminate_at, true),
            Act::Wait(Duration::from_nanos(250 * MS))
        );
        assert_eq!(d.act(1_000 * MS - lead, true), Act::Kill);
        // Late (the guard itself was slow): straight to the kill.
        assert_eq!(d.act(2_000 * MS, false), Act::Kill);
        // No grace period: SIGKILL is the first signal.
        let no_grace = Deadline { grace_ns: 0, ..d };
        assert_eq!(no_grace.act(1_000 * MS - lead, false), Act::Kill);
    }

    #[test]
    fn a_deadline_from_an_instant_is_on_the_monotonic_clock() {
        let before = monotonic_ns();
        let d = Deadline::at(
            std::time::Instant::now() + Duration::from_millis(500),
            Duration::ZERO,
        );
        let after = monotonic_ns();
        assert!(d.until_ns <= after + 500 * MS, "{d:?} {after}");
        assert!(d.until_ns + 50 * MS >= before + 500 * MS, "{d:?} {before}");
        // An instant already past is now, not a wrapped-around future.
        let past = Deadline::at(std::time::Instant::now(), Duration::ZERO);
        assert!(past.until_ns <= monotonic_ns());
    }
}
