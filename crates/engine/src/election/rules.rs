//! The campaign's rules, apart from its I/O: what the outcome of a claim or a
//! renewal means for this node (lead, follow, wait, back off, demote), and
//! which deadline the loop waits for next. `campaign.rs` sends the calls,
//! applies these answers and reports them; the tests below are the table of
//! every outcome.
//!
//! Times are passed in, never read here, so each rule is a plain function of
//! what the node knew when the reply came.

use std::time::Duration;

use tokio::time::Instant;

use super::wake::Hint;
use crate::config::ElectionConfig;
use crate::store::{Claim, Deferral, Renewal, StoreError};

/// What a claim's reply tells this node to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum AfterClaim {
    /// Lead under `term`, locally valid until `valid_until`: the send time
    /// plus the ttl the claim asked for, so the local view ends no later
    /// than the lease the store set on receipt.
    Lead {
        term: u64,
        valid_until: Instant,
        fresh: bool,
    },
    /// Another node leads under `term`: follow it (`announce` the first time)
    /// and claim again at `claim_at`.
    Follow {
        leader: String,
        term: u64,
        announce: bool,
        claim_at: Instant,
    },
    /// Nobody leads and this node may not take the seat yet: the store is
    /// in its first ttl after a birth (claim.lua's hold-back), or the seat
    /// waits for a better candidate (`deferred`). A candidate until
    /// `claim_at`.
    Wait {
        term: u64,
        claim_at: Instant,
        deferred: Option<Deferral>,
    },
    /// The call failed (an unconfirmed write included): a candidate, back
    /// off until `claim_at`.
    BackOff { claim_at: Instant },
}

/// What a renewal's reply tells a leader to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum AfterRenew {
    /// Still leading, now under `term` (higher than before when the term
    /// counter had been restored above it: the same leader, a new token).
    Renewed {
        term: u64,
        valid_until: Instant,
        moved: bool,
    },
    /// The lease ran out before the renewal reached the store: claim at once.
    Expired,
    /// Another holder has the lease: follow it. `displaced` carries the other
    /// incarnation when that holder is this node's own id (a second live
    /// process with it), which ends the campaign.
    Replaced {
        leader: String,
        displaced: Option<String>,
        claim_at: Instant,
    },
    /// The call failed or was not confirmed: demote at once (a leader that
    /// cannot prove its lease is not one), the lease possibly still held.
    Demote { claim_at: Instant },
}

/// What the node knew when a claim's reply came.
#[derive(Debug, Clone, Copy)]
pub(super) struct ClaimContext {
    /// When the claim was sent.
    pub sent: Instant,
    /// When the reply came.
    pub now: Instant,
    /// The ttl the claim asked for (the timings may change with the reply).
    pub asked_ttl: Duration,
    /// The timings after adopting the reply's.
    pub config: ElectionConfig,
    /// Whether release wake-ups are known to arrive.
    pub wake_healthy: bool,
    /// Whether this node already followed someone.
    pub was_following: bool,
    /// Store errors in a row before this reply.
    pub errors: u32,
}

pub(super) fn after_claim(reply: &Result<Claim, StoreError>, cx: &ClaimContext) -> AfterClaim {
    match reply {
        Ok(Claim::Won { term, fresh, .. }) => AfterClaim::Lead {
            term: *term,
            valid_until: cx.sent + cx.asked_ttl,
            fresh: *fresh,
        },
        Ok(Claim::Lost {
            term,
            pttl_ms,
            holder,
            deferred,
            ..
        }) => {
            let claim_at = cx.now + follower_wait(*pttl_ms, &cx.config, cx.wake_healthy);
            if holder.is_empty() {
                AfterClaim::Wait {
                    term: *term,
                    claim_at,
                    deferred: deferred.clone(),
                }
            } else {
                AfterClaim::Follow {
                    leader: holder.clone(),
                    term: *term,
                    announce: !cx.was_following,
                    claim_at,
                }
            }
        }
        Err(e) => AfterClaim::BackOff {
            claim_at: cx.now + retry_after(e, cx.errors, &cx.config),
        },
    }
}

/// A follower claims again 1 ms after the lease is due to expire, so the store
/// sees it expired; a release (or new timings) wakes it earlier. Never later
/// than one ttl: a lease taken under a longer ttl is shortened by the
/// holder's next renewal once it adopts a shorter one. Without confirmed
/// wake-ups, at the retry tick at the latest. A lease with no expiry
/// (negative PTTL) is looked at again at the retry tick.
pub(super) fn follower_wait(pttl_ms: i64, config: &ElectionConfig, wake_healthy: bool) -> Duration {
    match u64::try_from(pttl_ms) {
        Ok(ms) if wake_healthy => Duration::from_millis(ms + 1).min(config.ttl()),
        Ok(ms) => Duration::from_millis(ms + 1).min(config.retry_interval()),
        Err(_) => config.retry_interval(),
    }
}

/// What a hint from the store's listener tells a campaign that neither
/// leads nor abstains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AfterHint {
    /// Claim now: the lease was released, the timings changed, hints may
    /// have been lost, or a lease this node did not know of stands.
    Claim,
    /// The followed leader renewed: claim again only at `claim_at`, a
    /// little before the renewed lease would run out, or when the
    /// candidacy needs its refresh if that comes first.
    ClaimAt(Instant),
    /// A renewal under an older term than the one followed (a hint that
    /// came late): nothing to learn from it.
    Ignore,
}

/// `following` is the term of the lease this node follows, `None` for a
/// candidate. `candidacy_due` is when this node's candidacy must be
/// renewed by a claim ([`candidacy_due`]): a hint never moves the next
/// claim past it, or the follower would drop out of the group's live
/// members (its pod's label, the LeaderGroup's status) while it rests.
///
/// A hint is read some time after the moment the lease was renewed from
/// (the script's run, the delivery, the listener's turn), so a follower
/// that counted the ttl from the hint would claim late after a crash by
/// that much. It claims a quarter renew interval early instead: that claim
/// reads the exact time left (as [`follower_wait`] does) and costs one call
/// only when the leader died; while it lives, its next hint comes first
/// (another quarter renew interval before, [`hint_followers`]). A follower
/// whose process stood still longer than that quarter with a hint unread
/// claims late by the rest. Never later than one ttl, as in
/// [`follower_wait`].
pub(super) fn after_hint(
    hint: Hint,
    following: Option<u64>,
    abstaining: bool,
    candidacy_due: Instant,
    config: &ElectionConfig,
) -> AfterHint {
    // A node that stepped down sits out its abstention (E9) unless the
    // leader handed the seat to it by name (P5).
    if abstaining {
        return match hint {
            Hint::Successor => AfterHint::Claim,
            _ => AfterHint::Ignore,
        };
    }
    match (hint, following) {
        (Hint::Renewed { term, ttl, at }, Some(followed)) if term == followed => {
            let lease_ends = at + ttl.min(config.ttl()) - config.renew_interval() / 4;
            AfterHint::ClaimAt(lease_ends.min(candidacy_due))
        }
        (Hint::Renewed { term, .. }, Some(followed)) if term < followed => AfterHint::Ignore,
        _ => AfterHint::Claim,
    }
}

/// When a node whose last answered claim was sent at `claimed` must claim
/// again to stay a live member: a claim makes its candidacy last ttl + 2 ×
/// retry interval from when the store ran it, so ttl + retry interval after
/// the send leaves a retry interval to spare. At rest on a store with
/// renewal hints, this is what a follower's claims cost: one per ttl +
/// retry interval.
pub(super) fn candidacy_due(claimed: Instant, config: &ElectionConfig) -> Instant {
    claimed + config.ttl() + config.retry_interval()
}

/// Whether a renewal sent at `now` tells the followers how long the lease
/// now stands. Since the last hint (or the claim that won the lease, which
/// every follower that claimed since saw) they sleep until about
/// `hinted + ttl − renew/4` ([`after_hint`]); the next renewal comes one
/// renew interval after this one. This one hints only when the next one
/// might not land, with another quarter renew interval to spare, before
/// they wake: at ttl 15 s and renewals every 5 s, every other renewal
/// hints. A hint that does not arrive costs a claim, nothing more.
pub(super) fn hint_followers(hinted: Instant, now: Instant, config: &ElectionConfig) -> bool {
    let renew = config.renew_interval();
    now.saturating_duration_since(hinted) + renew + renew / 2 >= config.ttl()
}

/// What the node knew when a renewal's reply came.
#[derive(Debug, Clone, Copy)]
pub(super) struct RenewContext<'a> {
    pub sent: Instant,
    pub now: Instant,
    pub asked_ttl: Duration,
    pub config: ElectionConfig,
    /// The term the renewal was for.
    pub term: u64,
    /// This node's id.
    pub node: &'a str,
    pub errors: u32,
}

pub(super) fn after_renew(reply: &Result<Renewal, StoreError>, cx: &RenewContext) -> AfterRenew {
    match reply {
        Ok(Renewal::Renewed { term, .. }) => AfterRenew::Renewed {
            term: *term,
            valid_until: cx.sent + cx.asked_ttl,
            moved: *term != cx.term,
        },
        Ok(Renewal::Gone) => AfterRenew::Expired,
        Ok(Renewal::Replaced {
            holder,
            incarnation,
        }) => AfterRenew::Replaced {
            leader: holder.clone(),
            displaced: (holder == cx.node).then(|| incarnation.clone()),
            claim_at: cx.now + cx.config.retry_interval(),
        },
        Err(e) => AfterRenew::Demote {
            claim_at: cx.now + retry_after(e, cx.errors, &cx.config),
        },
    }
}

/// When to claim again after a failed call. A call that was not answered
/// in time may still take effect when the store answers again: a claim
/// queued behind a stopped server wins the free lease the moment it
/// resumes. So after a timeout the next claim goes at once (the timeout
/// itself spaced the attempts, one per call timeout): an answer is always
/// awaited, and a node whose earlier claim won learns it from the next
/// one's answer, not after a backoff (a retry interval later, with no
/// leader meanwhile). Any other failure backs off ([`error_backoff`]).
pub(super) fn retry_after(error: &StoreError, errors: u32, config: &ElectionConfig) -> Duration {
    match error {
        StoreError::Timeout(_) => Duration::ZERO,
        _ => error_backoff(errors, config),
    }
}

/// 10 ms after the first error in a row, doubling, at most one retry
/// interval: a store that comes back is noticed within milliseconds, not a
/// whole retry interval, without a tight loop against one that refuses.
pub(super) fn error_backoff(errors: u32, config: &ElectionConfig) -> Duration {
    Duration::from_millis(10u64.saturating_mul(1 << errors.min(16))).min(config.retry_interval())
}

/// What this node has heard from the store: when the last call it
/// answered was sent, and whether one went unanswered since. A call that
/// is not answered may still have reached the store (a link that carries
/// requests but not replies, replies slower than the call's bound): a
/// claim that lands keeps this node's own lease standing (claim.lua keeps a
/// lease its claimant still holds) or takes a free seat, and the node never
/// learns it. So after [`deaf_after`] without an answer the node sends
/// nothing that could take or keep a lease, only a probe, until the store
/// answers again; whatever its unanswered claims left standing runs out
/// within a ttl, and a member that hears the store takes over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Hearing {
    answered: Instant,
    unanswered: bool,
}

/// What a call's reply says of the link: answered (`Some(true)`: the
/// store replied, even to refuse, or to say the replicas did not confirm),
/// unknown (`Some(false)`: sent, and no answer came in time, or the
/// connection failed under it), or nothing sent (`None`: no primary to
/// send to).
pub(super) fn heard<T>(reply: &Result<T, StoreError>) -> Option<bool> {
    match reply {
        Ok(_) | Err(StoreError::Unconfirmed { .. } | StoreError::Reply(_)) => Some(true),
        Err(StoreError::Timeout(_) | StoreError::Failed { .. }) => Some(false),
        Err(StoreError::Topology(_)) => None,
    }
}

/// How long a node goes without an answer, after a call went unanswered,
/// before it stops claiming: half a ttl from the send of the last answered
/// call. Its unanswered claims then stop before that call's send + ttl / 2,
/// so a lease they kept standing ends within 1.5 ttl of the moment the
/// replies stopped, and a live member leads within about that plus a
/// retry interval (the bound the tests assert is 2 ttl + a retry
/// interval). A renewal that timed out once is still taken back by a
/// claim; when the renew interval and a call's bound add up to half a ttl
/// or more (ttl 1000, renew 300, retry 200 ms), a probe goes first, one
/// round trip more.
pub(super) fn deaf_after(config: &ElectionConfig) -> Duration {
    config.ttl() / 2
}

impl Hearing {
    pub fn new(now: Instant) -> Self {
        Self {
            answered: now,
            unanswered: false,
        }
    }

    /// Takes in what the reply to a call sent at `sent` said of the link.
    pub fn note<T>(&mut self, sent: Instant, reply: &Result<T, StoreError>) {
        match heard(reply) {
            Some(true) if sent >= self.answered => {
                self.answered = sent;
                self.unanswered = false;
            }
            Some(false) => self.unanswered = true,
            _ => {}
        }
    }

    /// Whether a claim may go at `now`; if not, only a probe.
    pub fn may_claim(&self, now: Instant, config: &ElectionConfig) -> bool {
        !self.unanswered || now < self.answered + deaf_after(config)
    }
}

/// Where the campaign stands between two calls.
#[derive(Debug, Clone, Copy)]
pub(super) struct Standing {
    /// `(term, valid_until)` while leading.
    pub leading: Option<(u64, Instant)>,
    pub abstain_until: Option<Instant>,
    pub last_sent: Instant,
    pub next_claim: Instant,
}

/// What the loop does at `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    /// The local lease view ran out: demote before anything else.
    Expire,
    /// A step-down's abstention is over: a candidate again, claiming now.
    EndAbstention,
    /// Wait for `at`, then renew (a leader) or claim; until then a release
    /// may wake a claim early only when `can_wake` (not leading; an
    /// abstaining node heeds only its naming as successor,
    /// [`after_hint`]), and a leader's lease
    /// view ends at `deadline`.
    Wait {
        renew: bool,
        at: Instant,
        deadline: Option<Instant>,
        can_wake: bool,
    },
}

pub(super) fn next_step(st: &Standing, config: &ElectionConfig, now: Instant) -> Step {
    if st
        .leading
        .is_some_and(|(_, valid_until)| now >= valid_until)
    {
        return Step::Expire;
    }
    if st.abstain_until.is_some_and(|until| now >= until) {
        return Step::EndAbstention;
    }
    let (renew, at) = match (st.leading, st.abstain_until) {
        (Some(_), _) => (true, st.last_sent + config.renew_interval()),
        (None, Some(until)) => (false, until),
        (None, None) => (false, st.next_claim),
    };
    Step::Wait {
        renew,
        at,
        deadline: st.leading.map(|(_, v)| v),
        can_wake: st.leading.is_none(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ElectionConfig {
        ElectionConfig {
            ttl_ms: 1000,
            renew_interval_ms: 300,
            retry_interval_ms: 200,
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn claim_cx(t0: Instant) -> ClaimContext {
        ClaimContext {
            sent: t0,
            now: t0 + ms(3),
            asked_ttl: ms(1000),
            config: config(),
            wake_healthy: true,
            was_following: false,
            errors: 0,
        }
    }

    fn lost(term: u64, pttl_ms: i64, holder: &str) -> Result<Claim, StoreError> {
        Ok(Claim::Lost {
            term,
            pttl_ms,
            holder: holder.into(),
            config: None,
            deferred: None,
        })
    }

    #[test]
    fn a_won_claim_leads_from_its_send_time_for_the_asked_ttl() {
        let t0 = Instant::now();
        let mut cx = claim_cx(t0);
        // New timings came with the reply; the lease the store set is the one asked for.
        cx.config.ttl_ms = 5000;
        let won = Ok(Claim::Won {
            term: 7,
            fresh: true,
            config: None,
        });
        assert_eq!(
            after_claim(&won, &cx),
            AfterClaim::Lead {
                term: 7,
                valid_until: t0 + ms(1000),
                fresh: true
            }
        );
    }

    #[test]
    fn a_claim_lost_to_a_live_holder_follows_and_claims_just_after_its_expiry() {
        let t0 = Instant::now();
        let cx = claim_cx(t0);
        assert_eq!(
            after_claim(&lost(4, 640, "n2"), &cx),
            AfterClaim::Follow {
                leader: "n2".into(),
                term: 4,
                announce: true,
                claim_at: cx.now + ms(641)
            }
        );
        let following = ClaimContext {
            was_following: true,
            ..cx
        };
        assert!(matches!(
            after_claim(&lost(4, 640, "n2"), &following),
            AfterClaim::Follow {
                announce: false,
                ..
            }
        ));
    }

    #[test]
    fn a_follower_waits_at_most_a_ttl_or_without_wake_ups_a_retry_interval() {
        let c = config();
        assert_eq!(follower_wait(640, &c, true), ms(641));
        // A lease taken under a longer ttl: looked at again after one ttl.
        assert_eq!(follower_wait(9000, &c, true), ms(1000));
        assert_eq!(follower_wait(640, &c, false), ms(200));
        assert_eq!(follower_wait(50, &c, false), ms(51));
        // No expiry on the key (PTTL -1): the retry tick.
        assert_eq!(follower_wait(-1, &c, true), ms(200));
    }

    #[test]
    fn a_born_again_store_holds_every_claim_back_until_its_first_ttl_ends() {
        let t0 = Instant::now();
        let cx = claim_cx(t0);
        assert_eq!(
            after_claim(&lost(3_000, 400, ""), &cx),
            AfterClaim::Wait {
                term: 3_000,
                claim_at: cx.now + ms(401),
                deferred: None,
            }
        );
    }

    #[test]
    fn a_claim_that_defers_on_a_free_seat_waits_until_the_deference_ends_and_says_why() {
        let t0 = Instant::now();
        let cx = claim_cx(t0);
        let deferral = Deferral {
            reason: crate::store::DeferReason::Priority,
            to: "n9".into(),
        };
        let reply = Ok(Claim::Lost {
            term: 5,
            pttl_ms: 350,
            holder: String::new(),
            config: None,
            deferred: Some(deferral.clone()),
        });
        assert_eq!(
            after_claim(&reply, &cx),
            AfterClaim::Wait {
                term: 5,
                claim_at: cx.now + ms(351),
                deferred: Some(deferral),
            }
        );
    }

    #[test]
    fn a_failed_or_unconfirmed_claim_backs_off_from_10_ms_to_the_retry_interval() {
        let t0 = Instant::now();
        let unconfirmed = Err(StoreError::Unconfirmed {
            acked: 0,
            wanted: 1,
        });
        let failed = Err(StoreError::Reply("nonsense".into()));
        for (errors, wait) in [(0, 10), (1, 20), (3, 80), (4, 160), (5, 200), (40, 200)] {
            let cx = ClaimContext {
                errors,
                ..claim_cx(t0)
            };
            for reply in [&unconfirmed, &failed] {
                assert_eq!(
                    after_claim(reply, &cx),
                    AfterClaim::BackOff {
                        claim_at: cx.now + ms(wait)
                    },
                    "after {errors} errors"
                );
            }
        }
    }

    /// A claim not answered in time may have won (it ran when the store
    /// resumed): the next one goes at once, however many errors came
    /// before, so its answer says so; a backoff would leave nobody leading
    /// for up to a retry interval, past the 200 ms bound of a store that
    /// was stopped for longer than a ttl.
    #[test]
    fn a_claim_or_renewal_that_timed_out_is_followed_by_a_claim_at_once() {
        let t0 = Instant::now();
        let timeout = || StoreError::Timeout(ms(200));
        for errors in [0, 4, 40] {
            let cx = ClaimContext {
                errors,
                ..claim_cx(t0)
            };
            assert_eq!(
                after_claim(&Err(timeout()), &cx),
                AfterClaim::BackOff { claim_at: cx.now },
                "after {errors} errors"
            );
            let cx = RenewContext {
                errors,
                ..renew_cx(t0)
            };
            assert_eq!(
                after_renew(&Err(timeout()), &cx),
                AfterRenew::Demote { claim_at: cx.now },
                "after {errors} errors"
            );
        }
    }

    fn renew_cx(t0: Instant) -> RenewContext<'static> {
        RenewContext {
            sent: t0,
            now: t0 + ms(2),
            asked_ttl: ms(1000),
            config: config(),
            term: 9,
            node: "n1",
            errors: 0,
        }
    }

    #[test]
    fn a_renewal_extends_the_lease_from_its_send_time() {
        let t0 = Instant::now();
        let renewed = Ok(Renewal::Renewed {
            config: None,
            term: 9,
        });
        assert_eq!(
            after_renew(&renewed, &renew_cx(t0)),
            AfterRenew::Renewed {
                term: 9,
                valid_until: t0 + ms(1000),
                moved: false
            }
        );
    }

    #[test]
    fn a_renewal_under_a_restored_counter_moves_the_lease_to_a_higher_term() {
        let t0 = Instant::now();
        let renewed = Ok(Renewal::Renewed {
            config: None,
            term: 2_001,
        });
        assert!(matches!(
            after_renew(&renewed, &renew_cx(t0)),
            AfterRenew::Renewed {
                term: 2_001,
                moved: true,
                ..
            }
        ));
    }

    #[test]
    fn a_renewal_that_came_too_late_claims_at_once() {
        let t0 = Instant::now();
        assert_eq!(
            after_renew(&Ok(Renewal::Gone), &renew_cx(t0)),
            AfterRenew::Expired
        );
    }

    #[test]
    fn a_renewal_lost_to_another_node_follows_it_and_to_its_own_id_is_displaced() {
        let t0 = Instant::now();
        let cx = renew_cx(t0);
        let replaced = |holder: &str| {
            Ok(Renewal::Replaced {
                holder: holder.into(),
                incarnation: "i2".into(),
            })
        };
        assert_eq!(
            after_renew(&replaced("n2"), &cx),
            AfterRenew::Replaced {
                leader: "n2".into(),
                displaced: None,
                claim_at: cx.now + ms(200)
            }
        );
        assert_eq!(
            after_renew(&replaced("n1"), &cx),
            AfterRenew::Replaced {
                leader: "n1".into(),
                displaced: Some("i2".into()),
                claim_at: cx.now + ms(200)
            }
        );
    }

    #[test]
    fn a_failed_or_unconfirmed_renewal_demotes_at_once() {
        let t0 = Instant::now();
        let cx = RenewContext {
            errors: 2,
            ..renew_cx(t0)
        };
        for reply in [
            Err(StoreError::Unconfirmed {
                acked: 1,
                wanted: 2,
            }),
            Err(StoreError::Reply("nonsense".into())),
        ] {
            assert_eq!(
                after_renew(&reply, &cx),
                AfterRenew::Demote {
                    claim_at: cx.now + ms(40)
                }
            );
        }
    }

    fn standing(t0: Instant) -> Standing {
        Standing {
            leading: None,
            abstain_until: None,
            last_sent: t0,
            next_claim: t0 + ms(150),
        }
    }

    #[test]
    fn a_leader_renews_one_renew_interval_after_its_last_send_until_its_view_ends() {
        let t0 = Instant::now();
        let st = Standing {
            leading: Some((5, t0 + ms(1000))),
            ..standing(t0)
        };
        assert_eq!(
            next_step(&st, &config(), t0 + ms(10)),
            Step::Wait {
                renew: true,
                at: t0 + ms(300),
                deadline: Some(t0 + ms(1000)),
                can_wake: false
            }
        );
        assert_eq!(next_step(&st, &config(), t0 + ms(1000)), Step::Expire);
    }

    #[test]
    fn a_candidate_claims_at_its_next_claim_or_when_woken() {
        let t0 = Instant::now();
        assert_eq!(
            next_step(&standing(t0), &config(), t0),
            Step::Wait {
                renew: false,
                at: t0 + ms(150),
                deadline: None,
                can_wake: true
            }
        );
    }

    #[test]
    fn an_abstaining_node_waits_for_its_abstention_to_end_or_a_wake_up_naming_it() {
        let t0 = Instant::now();
        let st = Standing {
            abstain_until: Some(t0 + ms(1000)),
            ..standing(t0)
        };
        assert_eq!(
            next_step(&st, &config(), t0 + ms(1)),
            Step::Wait {
                renew: false,
                at: t0 + ms(1000),
                deadline: None,
                can_wake: true
            }
        );
        assert_eq!(
            next_step(&st, &config(), t0 + ms(1000)),
            Step::EndAbstention
        );
    }

    #[test]
    fn a_follower_hinted_of_its_leaders_renewal_claims_shortly_before_the_renewed_lease_ends() {
        let at = Instant::now();
        let renewed = |term| Hint::Renewed {
            term,
            ttl: ms(1000),
            at,
        };
        let due = at + ms(5000);
        // ttl 1000 less a quarter of the renew interval, 300.
        assert_eq!(
            after_hint(renewed(4), Some(4), false, due, &config()),
            AfterHint::ClaimAt(at + ms(925))
        );
        // Never past the candidacy's refresh.
        assert_eq!(
            after_hint(renewed(4), Some(4), false, at + ms(700), &config()),
            AfterHint::ClaimAt(at + ms(700))
        );
        // A longer ttl than the follower's: at most one of its own ttls.
        let longer = Hint::Renewed {
            term: 4,
            ttl: ms(5000),
            at,
        };
        assert_eq!(
            after_hint(longer, Some(4), false, due, &config()),
            AfterHint::ClaimAt(at + ms(925))
        );
        // A late hint of an older lease says nothing.
        assert_eq!(
            after_hint(renewed(3), Some(4), false, due, &config()),
            AfterHint::Ignore
        );
        // A lease under a term this node has not seen: claim to learn its holder.
        assert_eq!(
            after_hint(renewed(5), Some(4), false, due, &config()),
            AfterHint::Claim
        );
        assert_eq!(
            after_hint(renewed(5), None, false, due, &config()),
            AfterHint::Claim
        );
        assert_eq!(
            after_hint(Hint::Look, Some(4), false, due, &config()),
            AfterHint::Claim
        );
        assert_eq!(
            after_hint(Hint::Successor, Some(4), false, due, &config()),
            AfterHint::Claim
        );
    }

    #[test]
    fn an_abstaining_node_claims_only_when_named_successor() {
        let due = Instant::now() + ms(5000);
        assert_eq!(
            after_hint(Hint::Successor, None, true, due, &config()),
            AfterHint::Claim
        );
        for hint in [Hint::Look, renewed_at(4, Instant::now())] {
            assert_eq!(
                after_hint(hint, None, true, due, &config()),
                AfterHint::Ignore
            );
        }
    }

    fn renewed_at(term: u64, at: Instant) -> Hint {
        Hint::Renewed {
            term,
            ttl: ms(1000),
            at,
        }
    }

    #[test]
    fn a_candidacy_is_refreshed_a_ttl_and_a_retry_interval_after_the_last_answered_claim() {
        let t0 = Instant::now();
        // Its candidacy lasts ttl + 2 × retry = 1400 ms from the claim's run.
        assert_eq!(candidacy_due(t0, &config()), t0 + ms(1200));
    }

    #[test]
    fn a_leader_hints_on_the_renewal_after_which_the_next_might_come_too_late() {
        let t0 = Instant::now();
        // ttl 1000, renew 300: a renewal hints when 450 ms more would reach
        // the ttl since the last hint, i.e. from 550 ms on.
        assert!(!hint_followers(t0, t0 + ms(300), &config()));
        assert!(!hint_followers(t0, t0 + ms(549), &config()));
        assert!(hint_followers(t0, t0 + ms(550), &config()));
        assert!(hint_followers(t0, t0 + ms(600), &config()));
        // Production timings: every other renewal.
        let production = ElectionConfig {
            ttl_ms: 15_000,
            renew_interval_ms: 5_000,
            retry_interval_ms: 2_000,
        };
        assert!(!hint_followers(t0, t0 + ms(5_000), &production));
        assert!(hint_followers(t0, t0 + ms(10_000), &production));
        // A renew interval over two thirds of the ttl: every renewal.
        let tight = ElectionConfig {
            ttl_ms: 1000,
            renew_interval_ms: 700,
            retry_interval_ms: 200,
        };
        assert!(hint_followers(t0, t0 + ms(700), &tight));
    }

    #[test]
    fn a_node_that_hears_no_answer_for_half_a_ttl_stops_claiming() {
        let cfg = config();
        let t0 = Instant::now();
        let mut h = Hearing::new(t0);
        let timeout: Result<(), StoreError> = Err(StoreError::Timeout(ms(200)));
        let answered: Result<(), StoreError> = Ok(());
        // Answered calls: claims go on, however long between them (a
        // follower at rest claims once a ttl).
        h.note(t0, &answered);
        assert!(h.may_claim(t0 + ms(5000), &cfg));
        // A renewal sent at 300 ms goes unanswered: claims go on until half
        // a ttl after the last answered call's send.
        h.note(t0 + ms(300), &timeout);
        assert!(h.may_claim(t0 + ms(499), &cfg));
        assert!(!h.may_claim(t0 + ms(500), &cfg));
        // A probe answered: claims again.
        h.note(t0 + ms(900), &answered);
        assert!(h.may_claim(t0 + ms(900), &cfg));
        assert!(h.may_claim(t0 + ms(5000), &cfg));
        // Calls go one at a time: an answer noted after a silence that
        // came from a call sent before the last answered one changes
        // nothing.
        h.note(t0 + ms(1000), &timeout);
        h.note(t0 + ms(800), &answered);
        assert!(!h.may_claim(t0 + ms(1400), &cfg));
    }

    #[test]
    fn what_counts_as_an_answer() {
        let unconfirmed: Result<(), StoreError> = Err(StoreError::Unconfirmed {
            acked: 0,
            wanted: 1,
        });
        assert_eq!(heard(&unconfirmed), Some(true));
        assert_eq!(heard::<()>(&Err(StoreError::Reply("x".into()))), Some(true));
        assert_eq!(heard::<()>(&Err(StoreError::Timeout(ms(1)))), Some(false));
        assert_eq!(heard::<()>(&Err(StoreError::Topology("x".into()))), None);
    }
}
