//! Leader election: the groups a node campaigns for, joined and left at run
//! time. Each group runs one `campaign` task; this module owns their
//! handles, the shared wake-up subscription and the bounded shutdown.
//!
//! Shutdown bounds every await by the group's retry interval (at least
//! [`crate::config::MIN_CALL_TIMEOUT`]): the rendezvous with the campaign,
//! which releases the lease itself, and, if the campaign does not answer, a
//! release from outside. All groups stop concurrently, so a hung connection
//! costs about three retry intervals at most however many groups there are;
//! a release that cannot land is forfeited and the lease simply expires.

mod campaign;
mod role;
mod rules;
mod wake;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::config::{validate_name, validate_priority, ElectionConfig};
use crate::error::SuccessorRefusal;
use crate::incarnation::Incarnation;
use crate::store::bounded;
use crate::store::{Deferral, Handover};
use crate::task::Task;
use crate::Error;
use campaign::{Campaign, Command};
use role::Bid;
pub(crate) use role::LocalLease;
pub use role::{Leadership, Role};

/// A handle on one joined group: watch the role, or ask right now whether
/// this node leads.
#[derive(Clone)]
pub struct Group {
    name: String,
    role: watch::Receiver<Role>,
    lease: Arc<Mutex<LocalLease>>,
    leadership: watch::Receiver<Option<Leadership>>,
    bid: Arc<Bid>,
    hints: Arc<wake::HintSlot>,
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group")
            .field("name", &self.name)
            .field("role", &*self.role.borrow())
            .finish()
    }
}

impl Group {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A receiver of role changes; `changed()` fails once the node left the group.
    pub fn role(&self) -> watch::Receiver<Role> {
        self.role.clone()
    }

    /// The term, if this node leads right now by its local lease view. This is
    /// the check to make immediately before doing leader-only work: it also
    /// turns false the instant the local lease runs out, even if the campaign
    /// task has not yet been scheduled to notice.
    pub fn leader_term(&self) -> Option<u64> {
        let lease = *crate::sync::locked(&self.lease);
        lease
            .leading
            .and_then(|(term, valid_until)| (Instant::now() < valid_until).then_some(term))
    }

    /// The term and how much longer the local lease view holds, if this node
    /// leads. For work that must end *before* the lease could pass to another
    /// node: stop once the time left is shorter than the work takes to stop.
    pub fn leader_lease(&self) -> Option<(u64, std::time::Duration)> {
        self.leadership().map(|l| (l.term, l.remaining()))
    }

    /// The term and the instant the local lease view ends, if this node
    /// leads: for work that must end by a point in time rather than poll
    /// [`Group::leader_term`] (a critical section bounded by `until`, a
    /// deadline handed to another process).
    pub fn leadership(&self) -> Option<Leadership> {
        let lease = *crate::sync::locked(&self.lease);
        lease
            .leading
            .map(|(term, until)| Leadership { term, until })
            .filter(|l| Instant::now() < l.until)
    }

    /// A receiver that changes at every confirmed claim or renewal (a new
    /// `until`) and when the local view ends early (a demotion); `changed()`
    /// fails once the node left the group. A view whose `until` passed with
    /// no renewal is ended by the campaign's demotion, which may come a
    /// moment later: compare `until` with now, or call
    /// [`Group::leadership`].
    pub fn leadership_changes(&self) -> watch::Receiver<Option<Leadership>> {
        self.leadership.clone()
    }

    pub fn is_leader(&self) -> bool {
        self.leader_term().is_some()
    }

    /// The timings this node campaigns with right now. They start as the
    /// ones it joined with and change when the group's own timings are
    /// adopted from the store (`Store::write_group_config`), so work tied to the
    /// lease (exec mode's stop deadline) must read them here, not keep a copy.
    pub fn timings(&self) -> ElectionConfig {
        crate::sync::locked(&self.lease).timings
    }

    /// The priority this node campaigns with.
    pub fn priority(&self) -> u32 {
        self.bid.priority()
    }

    /// Changes the priority this node campaigns with. A candidate or a
    /// follower claims at once, so the store knows it before it decides a
    /// free seat; a leader sends it with its next renewal. A leader set to
    /// 0 keeps its seat until it loses it: step down to hand it over now.
    pub fn set_priority(&self, priority: u32) -> Result<(), crate::ConfigError> {
        validate_priority("priority", priority)?;
        if self.bid.set_priority(priority) {
            self.hints.look();
        }
        Ok(())
    }

    /// Marks the application of this node unhealthy (`Some(reason)`) or
    /// healthy again (`None`). While unhealthy the node campaigns with
    /// priority 0, so it never takes a free seat, and the store keeps the
    /// reason, which the controller shows on the member
    /// (docs/behaviour.md P6). A leader keeps its seat: step down to hand it
    /// over. The reason is cut to [`MAX_PROBLEM_BYTES`].
    pub fn set_problem(&self, problem: Option<&str>) {
        let problem = problem.map(|p| cut(p.trim(), MAX_PROBLEM_BYTES).to_owned());
        if self.bid.set_problem(problem) {
            self.hints.look();
        }
    }

    /// Why this node's application is unhealthy, as last set.
    pub fn problem(&self) -> Option<String> {
        self.bid.problem()
    }

    /// Why this node leaves the free seat to another candidate, as its
    /// last claim was answered (`None` when it did not defer).
    pub fn deferral(&self) -> Option<Deferral> {
        self.bid.deferral()
    }
}

struct Entry {
    group: Group,
    config: ElectionConfig,
    commands: mpsc::Sender<Command>,
    task: Task,
}

/// All campaigns of one node.
pub(crate) struct Campaigns {
    shared: Arc<Incarnation>,
    wake: wake::Wake,
    entries: Mutex<HashMap<String, Entry>>,
}

impl Campaigns {
    pub fn new(shared: Arc<Incarnation>) -> Self {
        let wake = wake::Wake::start(&shared.store, &shared.id);
        Self {
            shared,
            wake,
            entries: Mutex::default(),
        }
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        crate::sync::locked(&self.entries)
    }

    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.entries().keys().cloned().collect();
        names.sort();
        names
    }

    pub fn group(&self, name: &str) -> Option<Group> {
        self.entries().get(name).map(|e| e.group.clone())
    }

    pub fn join(&self, name: &str, config: ElectionConfig, priority: u32) -> Result<Group, Error> {
        validate_name("group name", name)?;
        config.validate()?;
        validate_priority("priority", priority)?;
        if self.shared.displaced.borrow().is_some() {
            return Err(Error::Displaced);
        }
        let mut entries = self.entries();
        if entries.contains_key(name) {
            return Err(Error::AlreadyJoined(name.to_owned()));
        }
        let address = self.shared.store.group(name);
        let hints = self.wake.add(name);
        let (role_tx, role_rx) = watch::channel(Role::Candidate);
        let (leadership_tx, leadership_rx) = watch::channel(None);
        let lease = Arc::new(Mutex::new(LocalLease {
            leading: None,
            held: None,
            timings: config,
        }));
        let (commands, commands_rx) = mpsc::channel(8);
        let bid = Arc::new(Bid::new(priority));
        let campaign = Campaign {
            group: name.to_owned(),
            address,
            config,
            shared: self.shared.clone(),
            role: role_tx,
            lease: lease.clone(),
            leadership: leadership_tx,
            bid: bid.clone(),
            hints: hints.clone(),
            wake_healthy: self.wake.healthy(),
            commands: commands_rx,
        };
        let span = tracing::info_span!("campaign", node = %self.shared.id, group = %name);
        let task = crate::task::spawn(tracing::Instrument::instrument(campaign.run(), span));
        let group = Group {
            name: name.to_owned(),
            role: role_rx,
            lease,
            leadership: leadership_rx,
            bid,
            hints,
        };
        entries.insert(
            name.to_owned(),
            Entry {
                group: group.clone(),
                config,
                commands,
                task,
            },
        );
        Ok(group)
    }

    /// Sends `group`'s campaign the command `make` builds around a reply
    /// channel and waits for the answer. The campaign answers within one
    /// bounded store call; the bound allows for the claim or renewal it may
    /// be finishing first.
    async fn ask<T>(
        &self,
        name: &str,
        make: impl FnOnce(oneshot::Sender<Result<T, crate::store::StoreError>>) -> Command,
    ) -> Result<T, Error> {
        let (commands, config) = {
            let entries = self.entries();
            let entry = entries
                .get(name)
                .ok_or_else(|| Error::NotJoined(name.to_owned()))?;
            (entry.commands.clone(), entry.config)
        };
        let (tx, rx) = oneshot::channel();
        commands
            .send(make(tx))
            .await
            .map_err(|_| Error::NotJoined(name.to_owned()))?;
        let limit = config.call_timeout() * 3;
        match tokio::time::timeout(limit, rx).await {
            Ok(Ok(result)) => Ok(result?),
            Ok(Err(_)) => Err(Error::NotJoined(name.to_owned())),
            Err(_) => Err(Error::Store(crate::store::StoreError::Timeout(limit))),
        }
    }

    /// Releases the lease (if held) and abstains for one ttl. Returns whether
    /// this node was leading.
    pub async fn step_down(&self, name: &str) -> Result<bool, Error> {
        self.ask(name, Command::StepDown).await
    }

    /// See [`crate::Node::check_hand_over`].
    pub async fn check_hand_over(&self, name: &str, successor: &str) -> Result<(), Error> {
        let refused = successor_refusal(name, successor);
        validate_name("successor", successor)?;
        if successor == self.shared.id {
            return Err(refused(SuccessorRefusal::Itself));
        }
        let group = self
            .group(name)
            .ok_or_else(|| Error::NotJoined(name.to_owned()))?;
        if !group.is_leader() {
            return Err(refused(SuccessorRefusal::NotLeader));
        }
        let state = self.shared.store.group_state(name).await?;
        if state.problems.contains_key(successor) {
            return Err(refused(SuccessorRefusal::Unhealthy));
        }
        match state.priorities.get(successor) {
            None => Err(refused(SuccessorRefusal::NotMember)),
            Some(0) => Err(refused(SuccessorRefusal::NeverLeads)),
            Some(_) => Ok(()),
        }
    }

    /// A step-down to a named successor ([`crate::Node::hand_over`]).
    pub async fn hand_over(&self, name: &str, successor: &str) -> Result<(), Error> {
        let refused = successor_refusal(name, successor);
        validate_name("successor", successor)?;
        if successor == self.shared.id {
            return Err(refused(SuccessorRefusal::Itself));
        }
        let to = successor.to_owned();
        match self.ask(name, |tx| Command::HandOver(to, tx)).await? {
            Handover::Released => Ok(()),
            Handover::NotHeld => Err(refused(SuccessorRefusal::NotLeader)),
            Handover::NotMember => Err(refused(SuccessorRefusal::NotMember)),
            Handover::NeverLeads => Err(refused(SuccessorRefusal::NeverLeads)),
        }
    }

    /// Leaves one group: stops campaigning and releases the lease if held.
    pub async fn leave(&self, name: &str) -> Result<(), Error> {
        let entry = self
            .entries()
            .remove(name)
            .ok_or_else(|| Error::NotJoined(name.to_owned()))?;
        self.wake.remove(name);
        stop(&self.shared, name.to_owned(), entry).await;
        Ok(())
    }

    /// Leaves every group at once; see the module docs for the bounds.
    /// Stops every campaign; returns the groups whose release did not
    /// reach the store, sorted.
    pub async fn shutdown(&self) -> Vec<String> {
        let entries: Vec<(String, Entry)> = self.entries().drain().collect();
        let mut set = tokio::task::JoinSet::new();
        for (name, entry) in entries {
            self.wake.remove(&name);
            let shared = self.shared.clone();
            set.spawn(async move {
                let released = stop(shared, name.clone(), entry).await;
                (!released).then_some(name)
            });
        }
        let mut unreleased = Vec::new();
        while let Some(joined) = set.join_next().await {
            unreleased.extend(joined.ok().flatten());
        }
        unreleased.sort();
        unreleased
    }
}

/// The longest reason [`Group::set_problem`] keeps, in bytes: it travels
/// with every claim and renewal while set.
pub const MAX_PROBLEM_BYTES: usize = 200;

/// `text` cut to at most `max` bytes, on a character boundary.
fn cut(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Builds the refusal of a handover of `group` to `successor`.
fn successor_refusal<'a>(
    group: &'a str,
    successor: &'a str,
) -> impl Fn(SuccessorRefusal) -> Error + 'a {
    move |reason| Error::Successor {
        group: group.to_owned(),
        successor: successor.to_owned(),
        reason,
    }
}

/// Stops one campaign: a bounded rendezvous in which the campaign releases its
/// lease itself; if it does not answer in time, the task is aborted and the
/// release is made from here, bounded the same way. True if the release
/// reached the store.
async fn stop(shared: impl AsRef<Incarnation>, name: String, entry: Entry) -> bool {
    let shared = shared.as_ref();
    let limit = entry.config.call_timeout();
    let (tx, rx) = oneshot::channel();
    let rendezvous = async {
        entry.commands.send(Command::Shutdown(tx)).await.ok()?;
        rx.await.ok()
    };
    if let Some(released) = tokio::time::timeout(limit * 2, rendezvous)
        .await
        .ok()
        .flatten()
    {
        let _ = entry.task.await;
        return released;
    }
    entry.task.abort();
    let held = crate::sync::locked(&entry.group.lease).held;
    let address = shared.store.group(&name);
    let released = bounded(
        limit,
        shared
            .store
            .release(&address, &shared.id, &shared.nonce, held, true),
    )
    .await;
    tracing::warn!(group = %name, ?released, "campaign did not answer shutdown in time; released from outside");
    released.is_ok()
}
