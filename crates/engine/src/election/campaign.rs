//! One node's campaign for one group: a single task that owns every decision
//! about that group's lease for this node, so no two code paths can disagree
//! about whether it leads.
//!
//! The rules, in order of priority inside the loop:
//! 1. A leader is leader only while its local view of the lease is valid:
//!    the send time of its last confirmed claim or renewal plus ttl, on the
//!    monotonic clock. The store set its expiry no earlier than that send, so the
//!    local view always ends first and two nodes never both believe they lead.
//! 2. A renewal that fails with a store error (or does not answer in time)
//!    demotes at once; the next claim takes back the still-held lease.
//! 3. Followers claim on their retry tick, and earlier when the lease is
//!    released (pub/sub) or due to expire (from the PTTL of their last claim,
//!    or from the last renewal's hint).
//! 4. A node whose calls have gone unanswered for half a ttl sends no claim,
//!    only a probe, until the store answers: an unanswered claim may still
//!    land and keep its own lease standing, and a node that cannot hear the
//!    store must not hold the seat.
//!
//! What each reply means is decided in `rules.rs`, without I/O; this task
//! sends the calls, keeps the state and reports.

use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use super::role::{Bid, Leadership, LocalLease, Role};
use super::rules::{
    after_claim, after_hint, after_renew, candidacy_due, hint_followers, next_step, retry_after,
    AfterClaim, AfterHint, AfterRenew, ClaimContext, Hearing, RenewContext, Standing, Step,
};
use super::wake::{Hint, HintSlot};
use crate::config::ElectionConfig;
use crate::events::{Event, LostReason, Operation};
use crate::incarnation::Incarnation;
use crate::store::candidacy::Candidacy;
use crate::store::{bounded, Claim, GroupRef, Handover, Renewal, StoreError};

pub(crate) enum Command {
    StepDown(oneshot::Sender<Result<bool, StoreError>>),
    /// A step-down that hands the seat to the named member. Answered with
    /// `NotHeld` when this node does not lead.
    HandOver(String, oneshot::Sender<Result<Handover, StoreError>>),
    /// Answered with whether the release reached the store.
    Shutdown(oneshot::Sender<bool>),
}

pub(crate) struct Campaign {
    pub group: String,
    pub address: GroupRef,
    pub config: ElectionConfig,
    pub shared: Arc<Incarnation>,
    pub role: watch::Sender<Role>,
    pub lease: Arc<Mutex<LocalLease>>,
    /// The same view for those who follow every confirmed renewal (role
    /// files, exec mode's guard): it changes at each one, the role does not.
    pub leadership: watch::Sender<Option<Leadership>>,
    /// The priority this node campaigns with, and why it defers.
    pub bid: Arc<Bid>,
    /// Wake-ups from the store's listener (see `wake`).
    pub hints: Arc<HintSlot>,
    /// Whether release wake-ups are known to arrive (see `wake`).
    pub wake_healthy: Arc<std::sync::atomic::AtomicBool>,
    pub commands: mpsc::Receiver<Command>,
}

struct State {
    /// `Some((term, valid_until))` while this node leads.
    leading: Option<(u64, Instant)>,
    /// When the last successful claim/renewal was sent (schedules renewals).
    last_sent: Instant,
    /// While leading: when the claim that won the lease, or the last
    /// renewal that hinted the followers, was sent (`hint_followers`).
    hinted: Instant,
    /// When the last claim the store answered was sent: it renewed this
    /// node's candidacy (`candidacy_due`).
    claimed: Instant,
    /// Term of a lease this node may still hold in the store though it no longer
    /// leads (fail-safe demotion): shutdown and step-down must clear it.
    held: Option<u64>,
    abstain_until: Option<Instant>,
    next_claim: Instant,
    /// Highest term seen for this group: terms never go backwards, even if
    /// the store loses its data.
    seen_term: u64,
    /// Store errors in a row: the next attempt comes after a backoff that
    /// starts short and grows to the retry interval, so a store that comes
    /// back is noticed within milliseconds, not a whole retry interval.
    errors: u32,
    /// Whether the store answers (a node that cannot hear it probes
    /// instead of claiming: `rules::Hearing`).
    hearing: Hearing,
    /// Whether the node is probing (for the log: one line when it starts,
    /// one when the store answers).
    probing: bool,
}

impl Campaign {
    fn ttl_ms(&self) -> u64 {
        self.config.ttl_ms
    }

    /// A candidacy outlives the gap between two claims or renewals: at most
    /// ttl + retry interval for a follower at rest (`candidacy_due`), with
    /// a retry interval to spare. It carries the priority as it is now.
    fn candidacy(&self) -> Candidacy {
        Candidacy {
            ms: self.config.ttl_ms + 2 * self.config.retry_interval_ms,
            priority: self.bid.effective_priority(),
            defer_ms: self.config.deference().as_millis() as u64,
            problem: self.bid.problem(),
        }
    }

    fn node(&self) -> &str {
        &self.shared.id
    }

    fn set_role(&self, role: Role) {
        self.role.send_if_modified(|current| {
            if *current == role {
                false
            } else {
                *current = role;
                true
            }
        });
    }

    /// The only writer of the shared local lease view.
    fn set_lease(&self, st: &mut State, leading: Option<(u64, Instant)>, held: Option<u64>) {
        st.leading = leading;
        st.held = held;
        *crate::sync::locked(&self.lease) = LocalLease {
            leading,
            held,
            timings: self.config,
        };
        let view = leading.map(|(term, until)| Leadership { term, until });
        self.leadership.send_if_modified(|current| {
            let changed = *current != view;
            *current = view;
            changed
        });
        if let Some((term, _)) = leading {
            self.set_role(Role::Leader { term });
        }
    }

    /// Stops leading locally (before any I/O, so no work runs past this point)
    /// and reports why.
    fn demote(&self, st: &mut State, reason: LostReason, next: Role) {
        if let Some((term, _)) = st.leading {
            let held = (reason != LostReason::Replaced).then_some(term);
            self.set_lease(st, None, held);
            self.set_role(next);
            self.report_lost(term, reason);
        } else {
            self.set_role(next);
        }
    }

    pub async fn run(mut self) {
        let now = Instant::now();
        let mut st = State {
            leading: None,
            last_sent: now,
            hinted: now,
            claimed: now,
            held: None,
            abstain_until: None,
            next_claim: now,
            seen_term: 0,
            errors: 0,
            hearing: Hearing::new(now),
            probing: false,
        };
        let mut displaced = self.shared.displaced.subscribe();
        loop {
            if displaced.borrow().is_some() {
                self.demote(&mut st, LostReason::Replaced, Role::Candidate);
                return;
            }
            let now = Instant::now();
            let standing = Standing {
                leading: st.leading,
                abstain_until: st.abstain_until,
                last_sent: st.last_sent,
                next_claim: st.next_claim,
            };
            let (renew, at, deadline, can_wake) = match next_step(&standing, &self.config, now) {
                Step::Expire => {
                    self.demote(&mut st, LostReason::Expired, Role::Candidate);
                    st.next_claim = now;
                    continue;
                }
                Step::EndAbstention => {
                    st.abstain_until = None;
                    st.next_claim = now;
                    self.set_role(Role::Candidate);
                    continue;
                }
                Step::Wait {
                    renew,
                    at,
                    deadline,
                    can_wake,
                } => (renew, at, deadline, can_wake),
            };
            tokio::select! {
                biased;
                _ = displaced.changed() => continue,
                command = self.commands.recv() => match command {
                    Some(Command::StepDown(reply)) => {
                        let result = self.step_down(&mut st).await;
                        let _ = reply.send(result);
                    }
                    Some(Command::HandOver(to, reply)) => {
                        let result = self.hand_over(&mut st, &to).await;
                        let _ = reply.send(result);
                    }
                    Some(Command::Shutdown(reply)) => {
                        let released = self.shutdown(&mut st).await;
                        let _ = reply.send(released);
                        return;
                    }
                    // The node was dropped without closing: act like a crash,
                    // release nothing.
                    None => return,
                },
                _ = sleep_until_opt(deadline) => continue,
                hint = self.hints.next(), if can_wake => self.on_hint(&mut st, hint).await,
                _ = tokio::time::sleep_until(at) => {
                    if renew {
                        self.renew(&mut st).await;
                    } else if st.abstain_until.is_none() {
                        self.claim(&mut st).await;
                    }
                }
            }
        }
    }

    /// A hint from the listener, while not leading. Named successor, an
    /// abstaining node ends its abstention and claims.
    async fn on_hint(&mut self, st: &mut State, hint: Hint) {
        let following = match &*self.role.borrow() {
            Role::Follower { term, .. } => Some(*term),
            _ => None,
        };
        let due = candidacy_due(st.claimed, &self.config);
        let abstaining = st.abstain_until.is_some();
        match after_hint(hint, following, abstaining, due, &self.config) {
            AfterHint::Claim => {
                if abstaining {
                    st.abstain_until = None;
                    self.set_role(Role::Candidate);
                }
                self.claim(st).await;
            }
            AfterHint::ClaimAt(at) => st.next_claim = at,
            AfterHint::Ignore => {}
        }
    }

    async fn claim(&mut self, st: &mut State) {
        if !st.hearing.may_claim(Instant::now(), &self.config) {
            return self.probe(st).await;
        }
        // The ttl this claim asks for: the local lease view must use it even
        // if the reply brings new timings.
        let asked_ttl = self.config.ttl();
        let sent = Instant::now();
        let reply = self.send_claim(st).await;
        st.hearing.note(sent, &reply);
        if let Ok(Claim::Won { config, .. } | Claim::Lost { config, .. }) = &reply {
            self.adopt(*config);
        }
        let now = Instant::now();
        self.shared
            .events
            .observe_call(Operation::Claim, now - sent, reply.is_ok());
        let cx = ClaimContext {
            sent,
            now,
            asked_ttl,
            config: self.config,
            wake_healthy: self.wake_healthy.load(std::sync::atomic::Ordering::SeqCst),
            was_following: matches!(*self.role.borrow(), Role::Follower { .. }),
            errors: st.errors,
        };
        let outcome = after_claim(&reply, &cx);
        if !matches!(outcome, AfterClaim::Wait { .. }) {
            self.bid.set_deferral(None);
        }
        match outcome {
            AfterClaim::Lead {
                term,
                valid_until,
                fresh,
            } => {
                st.seen_term = st.seen_term.max(term);
                st.last_sent = sent;
                st.hinted = sent;
                self.set_lease(st, Some((term, valid_until)), Some(term));
                tracing::info!(term, fresh, "leading");
                self.report_elected(term);
            }
            AfterClaim::Follow {
                leader,
                term,
                announce,
                claim_at,
            } => {
                st.seen_term = st.seen_term.max(term);
                self.set_lease(st, None, None);
                self.follow(leader, term, announce);
                st.next_claim = claim_at;
            }
            AfterClaim::Wait {
                term,
                claim_at,
                deferred,
            } => {
                st.seen_term = st.seen_term.max(term);
                self.set_lease(st, None, None);
                self.set_role(Role::Candidate);
                self.bid.set_deferral(deferred);
                st.next_claim = claim_at;
            }
            AfterClaim::BackOff { claim_at } => {
                self.set_role(Role::Candidate);
                if let Err(e) = &reply {
                    self.store_error(Operation::Claim, e);
                }
                st.next_claim = claim_at;
            }
        }
        if reply.is_ok() {
            st.claimed = sent;
        }
        st.errors = if reply.is_ok() { 0 } else { st.errors + 1 };
    }

    async fn send_claim(&self, st: &State) -> Result<Claim, StoreError> {
        self.shared.count_claim();
        let limit = self.config.call_timeout();
        bounded(
            limit,
            self.shared.store.claim(
                &self.address,
                self.node(),
                &self.shared.nonce,
                self.ttl_ms(),
                st.seen_term,
                &self.candidacy(),
                limit,
            ),
        )
        .await
    }

    /// In place of a claim, while the store has not answered for a while
    /// (`rules::Hearing`): a call that changes nothing, so that this node
    /// learns when the store hears it again without keeping a lease it
    /// cannot confirm. Answered, the node claims at once.
    async fn probe(&mut self, st: &mut State) {
        if !st.probing {
            st.probing = true;
            tracing::warn!(
                group = %self.group,
                "no answer from the store (or only errors) for half a ttl: no claim until it answers a probe, so a lease this node cannot confirm runs out"
            );
        }
        let sent = Instant::now();
        let reply = bounded(self.config.call_timeout(), self.shared.store.ping()).await;
        st.hearing.note(sent, &reply);
        let now = Instant::now();
        st.next_claim = match &reply {
            Ok(()) => {
                st.probing = false;
                tracing::info!(group = %self.group, "the store answers again: claiming");
                now
            }
            Err(e) => now + retry_after(e, st.errors, &self.config),
        };
        st.errors = if reply.is_ok() { 0 } else { st.errors + 1 };
    }

    fn follow(&self, leader: String, term: u64, announce: bool) {
        if announce {
            self.shared.events.emit(Event::Following {
                node: self.node().to_owned(),
                group: self.group.clone(),
                leader: leader.clone(),
                term,
            });
        }
        self.set_role(Role::Follower { leader, term });
    }

    async fn renew(&mut self, st: &mut State) {
        let Some((term, valid_until)) = st.leading else {
            return;
        };
        let asked_ttl = self.config.ttl();
        let sent = Instant::now();
        let hint = hint_followers(st.hinted, sent, &self.config);
        // Never wait past the local lease, nor longer than a call may take.
        let limit = valid_until
            .saturating_duration_since(sent)
            .min(self.config.call_timeout());
        let reply = self.send_renew(term, limit, hint).await;
        st.hearing.note(sent, &reply);
        if let Ok(Renewal::Renewed { config, .. }) = &reply {
            self.adopt(*config);
        }
        let now = Instant::now();
        self.shared
            .events
            .observe_call(Operation::Renew, now - sent, reply.is_ok());
        let cx = RenewContext {
            sent,
            now,
            asked_ttl,
            config: self.config,
            term,
            node: self.node(),
            errors: st.errors,
        };
        match after_renew(&reply, &cx) {
            AfterRenew::Renewed {
                term: renewed,
                valid_until,
                moved,
            } => {
                st.last_sent = sent;
                if hint {
                    st.hinted = sent;
                }
                st.seen_term = st.seen_term.max(renewed);
                self.set_lease(st, Some((renewed, valid_until)), Some(renewed));
                if moved {
                    tracing::info!(from = term, to = renewed, "lease moved to a higher term");
                    self.report_elected(renewed);
                }
            }
            AfterRenew::Expired => {
                self.demote(st, LostReason::Expired, Role::Candidate);
                self.set_lease(st, None, None);
                st.next_claim = Instant::now();
            }
            AfterRenew::Replaced {
                leader,
                displaced,
                claim_at,
            } => {
                if let Some(incarnation) = displaced {
                    // A second live process uses this node id: the node
                    // reports it and stops campaigning.
                    self.shared.mark_displaced(incarnation);
                }
                self.demote(st, LostReason::Replaced, Role::Follower { leader, term });
                st.next_claim = claim_at;
            }
            AfterRenew::Demote { claim_at } => {
                if let Err(e) = &reply {
                    self.store_error(Operation::Renew, e);
                }
                self.demote(st, LostReason::StoreError, Role::Candidate);
                st.next_claim = claim_at;
            }
        }
        st.errors = if reply.is_ok() { 0 } else { st.errors + 1 };
    }

    /// One renewal of the lease held at `term`, within `limit`.
    async fn send_renew(
        &self,
        term: u64,
        limit: std::time::Duration,
        hint: bool,
    ) -> Result<Renewal, StoreError> {
        bounded(
            limit,
            self.shared.store.renew(
                &self.address,
                self.node(),
                &self.shared.nonce,
                term,
                self.ttl_ms(),
                &self.candidacy(),
                hint,
                limit,
            ),
        )
        .await
    }

    async fn release(&self, term: Option<u64>, withdraw: bool) -> Result<bool, StoreError> {
        bounded(
            self.config.call_timeout(),
            self.shared.store.release(
                &self.address,
                self.node(),
                &self.shared.nonce,
                term,
                withdraw,
            ),
        )
        .await
    }

    async fn step_down(&self, st: &mut State) -> Result<bool, StoreError> {
        let term = st.leading.map(|(t, _)| t);
        let held = st.held;
        // Stop leading first, then let go of the lease.
        self.set_lease(st, None, held);
        self.hints.clear();
        st.abstain_until = Some(Instant::now() + self.config.ttl());
        self.set_role(Role::Abstaining);
        let released = match held {
            Some(_) => self.release(held, false).await,
            None => Ok(false),
        };
        if let Some(term) = term {
            self.report_lost(term, LostReason::StepDown);
        }
        match released {
            Ok(_) => {
                self.set_lease(st, None, None);
                Ok(term.is_some())
            }
            Err(e) => {
                self.store_error(Operation::StepDownRelease, &e);
                Err(e)
            }
        }
    }

    /// A step-down to a named member: stops leading first, then hands
    /// over in one call that releases only if the member is a live one
    /// that may lead. Refused, the lease was never let go, so this node
    /// leads on under the same term and the same local view; handed over,
    /// it abstains for one ttl, as after a step-down.
    async fn hand_over(&self, st: &mut State, to: &str) -> Result<Handover, StoreError> {
        let Some((term, valid_until)) = st.leading else {
            return Ok(Handover::NotHeld);
        };
        self.set_lease(st, None, Some(term));
        let result = bounded(
            self.config.call_timeout(),
            self.shared.store.hand_over(
                &self.address,
                self.node(),
                &self.shared.nonce,
                term,
                to,
                self.candidacy().defer_ms,
            ),
        )
        .await;
        match &result {
            Ok(Handover::Released) => {
                self.hints.clear();
                st.abstain_until = Some(Instant::now() + self.config.ttl());
                self.set_role(Role::Abstaining);
                self.set_lease(st, None, None);
                tracing::info!(term, successor = to, "handed over");
                self.report_lost(term, LostReason::StepDown);
            }
            Ok(Handover::NotMember | Handover::NeverLeads) if Instant::now() < valid_until => {
                self.set_lease(st, Some((term, valid_until)), Some(term));
            }
            // Refused too late to lead on, or not ours under this term any
            // more: no longer leading; the next claim finds out who is.
            Ok(_) => {
                self.set_role(Role::Candidate);
                self.report_lost(term, LostReason::Expired);
                st.next_claim = Instant::now();
            }
            Err(e) => {
                self.store_error(Operation::StepDownRelease, e);
                st.abstain_until = Some(Instant::now() + self.config.ttl());
                self.set_role(Role::Abstaining);
                self.report_lost(term, LostReason::StepDown);
            }
        }
        result
    }

    /// Stops leading and releases; false if the release did not reach
    /// the store (a held lease then runs out on its own).
    async fn shutdown(&self, st: &mut State) -> bool {
        let term = st.leading.map(|(t, _)| t);
        let held = st.held;
        self.set_lease(st, None, held);
        self.set_role(Role::Candidate);
        // Release also a lease merely possibly held: one left behind by a
        // fail-safe demotion would block the group for the rest of its ttl.
        let released = match self.release(held, true).await {
            Ok(_) => {
                self.set_lease(st, None, None);
                true
            }
            Err(e) => {
                self.store_error(Operation::ShutdownRelease, &e);
                false
            }
        };
        if let Some(term) = term {
            self.report_lost(term, LostReason::Shutdown);
        }
        released
    }

    /// Takes the group's timings from the store (set through
    /// `Store::write_group_config`) when they differ from the current ones.
    fn adopt(&mut self, config: Option<ElectionConfig>) {
        if let Some(config) = config.filter(|c| *c != self.config) {
            tracing::info!(?config, "group timings changed in the store");
            self.config = config;
            crate::sync::locked(&self.lease).timings = config;
        }
    }

    fn report_elected(&self, term: u64) {
        self.shared.events.emit(Event::Elected {
            node: self.node().to_owned(),
            group: self.group.clone(),
            term,
        });
    }

    fn report_lost(&self, term: u64, reason: LostReason) {
        tracing::info!(term, reason = reason.as_str(), "stopped leading");
        self.shared.events.emit(Event::Lost {
            node: self.node().to_owned(),
            group: self.group.clone(),
            term,
            reason,
        });
    }

    fn store_error(&self, during: Operation, e: &StoreError) {
        tracing::warn!(group = %self.group, %during, error = %e, "store error");
        self.shared.events.emit(Event::StoreError {
            node: self.node().to_owned(),
            during,
            message: e.to_string(),
        });
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
