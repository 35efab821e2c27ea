//! The node registry: one [`Node`] per process, registered in the store under its
//! id with a lease it keeps alive by heartbeats, plus a sweeper that removes
//! nodes whose lease ran out.
//!
//! A node is also the handle through which it campaigns for groups (see
//! [`crate::election`]): one object to start, observe and close.
//!
//! Promises:
//! - expiry is decided on the store's clock, so skewed local clocks are harmless;
//! - a node that finds its own lease expired (paused, partitioned) registers
//!   again and emits [`Event::Recovered`];
//! - each process run is an *incarnation* with a random nonce next to the id;
//!   a second live process with the same id takes the registration over (a
//!   restart with a stable id must not wait), and the older one learns it on
//!   its next heartbeat or renewal, emits [`Event::Displaced`] and stops,
//!   instead of both silently sharing one lease;
//! - the sweeper sleeps until the earliest lease expiry in the registry
//!   (bounded by the sweep interval), so a dead node goes within its lease and
//!   a few ms, and removes at most [`crate::config::SWEEP_BATCH`] nodes per pass;
//! - dropping a `Node` without [`Node::close`] stops its loops like a crash:
//!   nothing is released and leases expire on their own.

mod messaging;
mod registration;
mod sweeper;

use std::sync::{Arc, Mutex};

use tokio::sync::{broadcast, mpsc, watch};

use crate::config::{self, validate_name, ElectionConfig, InboxConfig, NodeConfig};
use crate::election::{Campaigns, Group};
use crate::events::{Event, EventBus};
use crate::inbox::publisher;
use crate::incarnation::Incarnation;
use crate::store::{bounded, Store};
use crate::task::Task;
use crate::Error;
use registration::{write_groups, Registration, Subscriptions};

/// Options beyond the timings: inbox limits, metadata stored with the
/// registration, the application's event observer, and a test hook.
#[derive(Clone, Default)]
pub struct NodeOptions {
    pub inbox: InboxConfig,
    /// Extra fields of the node's hash (e.g. `namespace`, `pod`, `version`).
    pub metadata: Vec<(String, String)>,
    /// Shifts this node's local wall clock (the only thing it is used for is
    /// the `local_started_at` metadata). Tests use it to prove that no expiry
    /// depends on the local clock.
    #[cfg(feature = "test-hooks")]
    pub wall_clock_skew_ms: i64,
    /// When set, step-down requests from other nodes
    /// ([`Node::ask_to_step_down`]) are handed here instead of
    /// carried out at once, so the application can first stop its
    /// leader-only work and then call [`Node::step_down`] itself.
    pub step_down_requests: Option<mpsc::UnboundedSender<StepDownRequest>>,
    /// Sees every event of this node (e.g. to count it in the
    /// application's metrics registry).
    pub observer: Option<Arc<dyn crate::Observer>>,
}

impl NodeOptions {
    fn clock_skew_ms(&self) -> i64 {
        #[cfg(feature = "test-hooks")]
        return self.wall_clock_skew_ms;
        #[cfg(not(feature = "test-hooks"))]
        0
    }
}

impl std::fmt::Debug for NodeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeOptions")
            .field("inbox", &self.inbox)
            .field("metadata", &self.metadata)
            .field("step_down_requests", &self.step_down_requests.is_some())
            .field("observer", &self.observer.is_some())
            .finish()
    }
}

/// A step-down another node asked for (see [`NodeOptions::step_down_requests`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepDownRequest {
    /// The node that sent the command.
    pub from: String,
    /// The group to step down from.
    pub group: String,
    /// The member to hand the seat to, if one was named
    /// ([`Node::hand_over`]); otherwise a plain [`Node::step_down`].
    pub to: Option<String>,
}

/// A registered node. See the module docs.
pub struct Node {
    shared: Arc<Incarnation>,
    config: NodeConfig,
    inbox_config: InboxConfig,
    campaigns: Arc<Campaigns>,
    /// Restored on re-registration after the node's lease expired.
    subscriptions: Subscriptions,
    inbox: Mutex<Option<mpsc::Receiver<crate::inbox::Delivery>>>,
    /// The joined groups, comma-separated, as stored in the registration.
    groups: watch::Sender<String>,
    publisher: mpsc::Sender<publisher::Request>,
    loops: Vec<Task>,
}

fn new_incarnation() -> String {
    format!("{:016x}", fastrand::u64(..))
}

fn local_wall_ms(skew: i64) -> i64 {
    crate::sync::wall_clock_ms() as i64 + skew
}

impl Node {
    /// Registers `id` with default options. See [`Node::start_with`].
    pub async fn start(store: Store, id: &str, config: NodeConfig) -> Result<Self, Error> {
        Self::start_with(store, id, config, NodeOptions::default()).await
    }

    /// Validates, registers and starts the heartbeat and sweeper loops. A store
    /// that is down is not an error here: registration is retried by the
    /// heartbeat loop and reported as [`Event::StoreError`] meanwhile.
    pub async fn start_with(
        store: Store,
        id: &str,
        config: NodeConfig,
        options: NodeOptions,
    ) -> Result<Self, Error> {
        validate_name("node id", id)?;
        config.validate()?;
        options.inbox.validate()?;
        let events = EventBus::start(store.clone(), options.observer.clone());
        let (commands, command_rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Incarnation {
            store,
            id: id.to_owned(),
            nonce: new_incarnation(),
            events,
            displaced: watch::channel(None).0,
            commands,
            claims_sent: Default::default(),
        });
        let mut metadata = options.metadata.clone();
        metadata.push((
            "local_started_at".into(),
            local_wall_ms(options.clock_skew_ms()).to_string(),
        ));
        metadata.push(("inbox_max".into(), options.inbox.max_length.to_string()));
        let subscriptions = Subscriptions::default();
        let groups = watch::channel(String::new()).0;
        let registration = Registration {
            shared: shared.clone(),
            config,
            metadata,
            subscriptions: subscriptions.clone(),
            groups: groups.subscribe(),
        };
        let registered = registration.register(false).await;
        let heartbeat = crate::task::spawn(tracing::Instrument::instrument(
            registration.heartbeat_loop(registered),
            tracing::info_span!("heartbeat", node = %id),
        ));
        let sweeper = crate::task::spawn(tracing::Instrument::instrument(
            sweeper::run(shared.clone(), config),
            tracing::info_span!("sweeper", node = %id),
        ));
        let groups_writer = crate::task::spawn(write_groups(shared.clone(), groups.subscribe()));
        let (publisher, requests) = mpsc::channel(config::PUBLISH_BATCH * 8);
        let publisher_task = crate::task::spawn(publisher::run(shared.clone(), requests));
        let (tx, rx) = mpsc::channel(config::INBOX_BUFFER);
        let reader = crate::task::spawn(tracing::Instrument::instrument(
            crate::inbox::run_reader(shared.clone(), options.inbox, tx),
            tracing::info_span!("inbox", node = %id),
        ));
        let campaigns = Arc::new(Campaigns::new(shared.clone()));
        let command_task = crate::task::spawn(tracing::Instrument::instrument(
            act_on_commands(
                campaigns.clone(),
                command_rx,
                options.step_down_requests.clone(),
            ),
            tracing::info_span!("commands", node = %id),
        ));
        Ok(Self {
            campaigns,
            shared,
            config,
            inbox_config: options.inbox,
            subscriptions,
            inbox: Mutex::new(Some(rx)),
            groups,
            publisher,
            loops: vec![
                heartbeat,
                sweeper,
                reader,
                groups_writer,
                publisher_task,
                command_task,
            ],
        })
    }

    pub fn id(&self) -> &str {
        &self.shared.id
    }

    /// This process's incarnation nonce.
    pub fn incarnation(&self) -> &str {
        &self.shared.nonce
    }

    pub fn config(&self) -> NodeConfig {
        self.config
    }

    pub fn store(&self) -> &Store {
        &self.shared.store
    }

    #[cfg(feature = "test-hooks")]
    pub(crate) fn claims_sent(&self) -> u64 {
        self.shared
            .claims_sent
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Every engine event of this node, from now on.
    pub fn events(&self) -> broadcast::Receiver<Event> {
        self.shared.events.subscribe()
    }

    /// Whether another live process took over this node id.
    pub fn displaced(&self) -> bool {
        self.shared.displaced.borrow().is_some()
    }

    /// Starts campaigning for `group` with `config`, at the default
    /// priority ([`config::DEFAULT_PRIORITY`]).
    pub fn join(&self, group: &str, config: ElectionConfig) -> Result<Group, Error> {
        self.join_with_priority(group, config, config::DEFAULT_PRIORITY)
    }

    /// Starts campaigning for `group` with `config` and `priority` (0, a
    /// member that never leads, to [`config::MAX_PRIORITY`]). A free seat
    /// goes to the live candidate of highest priority (docs/behaviour.md
    /// P1); a leader keeps its seat when one of higher priority joins.
    pub fn join_with_priority(
        &self,
        group: &str,
        config: ElectionConfig,
        priority: u32,
    ) -> Result<Group, Error> {
        let handle = self.campaigns.join(group, config, priority)?;
        self.publish_groups();
        Ok(handle)
    }

    /// Joins many groups at once; the registration's list of groups is
    /// written once, not once per group (which costs quadratic time for
    /// thousands). Stops at the first refused group, keeping the ones
    /// joined before it.
    pub fn join_all<'a>(
        &self,
        groups: impl IntoIterator<Item = &'a str>,
        config: ElectionConfig,
    ) -> Result<Vec<Group>, Error> {
        self.join_all_with_priority(groups, config, config::DEFAULT_PRIORITY)
    }

    /// [`Node::join_all`] with one priority for every group.
    pub fn join_all_with_priority<'a>(
        &self,
        groups: impl IntoIterator<Item = &'a str>,
        config: ElectionConfig,
        priority: u32,
    ) -> Result<Vec<Group>, Error> {
        let mut joined = Vec::new();
        let mut result = Ok(());
        for name in groups {
            match self.campaigns.join(name, config, priority) {
                Ok(g) => joined.push(g),
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        self.publish_groups();
        result.map(|()| joined)
    }

    /// Stops campaigning for `group`, releasing its lease if held.
    pub async fn leave(&self, group: &str) -> Result<(), Error> {
        self.campaigns.leave(group).await?;
        self.publish_groups();
        Ok(())
    }

    /// Releases `group`'s lease if held and abstains from it for one ttl, so
    /// another node takes over. Returns whether this node was leading.
    pub async fn step_down(&self, group: &str) -> Result<bool, Error> {
        self.campaigns.step_down(group).await
    }

    /// Steps down from `group` in favour of the member `successor`: the
    /// lease is released only if `successor` is a live member of the group
    /// with a priority above 0, and then the other candidates leave the
    /// seat to it for the deference bound ([`ElectionConfig::deference`]),
    /// so it wins unless it dies meanwhile. This node abstains for one
    /// ttl, as after [`Node::step_down`]. Refused ([`Error::Successor`]),
    /// nothing changed and this node leads on.
    pub async fn hand_over(&self, group: &str, successor: &str) -> Result<(), Error> {
        self.campaigns.hand_over(group, successor).await
    }

    /// Whether [`Node::hand_over`] would be refused now, and why, read from
    /// the store without changing anything: for work that must stop
    /// before the handover (exec mode's command) only when it will happen.
    /// The handover itself checks again, in the same step as the release.
    pub async fn check_hand_over(&self, group: &str, successor: &str) -> Result<(), Error> {
        self.campaigns.check_hand_over(group, successor).await
    }

    pub fn group(&self, group: &str) -> Option<Group> {
        self.campaigns.group(group)
    }

    pub fn groups(&self) -> Vec<String> {
        self.campaigns.names()
    }

    /// Leaves every group, releasing held leases concurrently, each bounded
    /// by its group's retry interval. The node stays registered. Returns the
    /// groups whose release did not reach the store: a lease this node held there
    /// runs out on its own, within its ttl.
    pub async fn shutdown(&self) -> Vec<String> {
        self.campaigns.shutdown().await
    }

    /// Shuts down, stops the loops and removes the node from the registry at
    /// once (bounded, so a hung connection cannot wedge it). An error says
    /// the registration could not be removed (it then expires on its own);
    /// see [`Node::shutdown`] for the leases.
    pub async fn close(self) -> Result<(), Error> {
        let unreleased = self.shutdown().await;
        if !unreleased.is_empty() {
            tracing::warn!(node = %self.shared.id, groups = ?unreleased, "leases not released (the store did not answer); they run out within their ttl");
        }
        for task in &self.loops {
            task.abort();
        }
        bounded(
            config::CONNECT_TIMEOUT,
            self.shared
                .store
                .unregister(&self.shared.id, &self.shared.nonce),
        )
        .await?;
        Ok(())
    }

    /// Keeps the `groups` field of the registration current (the writer
    /// task sends the latest value, in order), so a sweep can remove this
    /// node from its groups' member lists.
    fn publish_groups(&self) {
        self.groups.send_replace(self.campaigns.names().join(","));
    }
}

/// Carries out commands other nodes sent to this node's engine.
async fn act_on_commands(
    campaigns: Arc<Campaigns>,
    mut commands: mpsc::UnboundedReceiver<(String, Vec<u8>)>,
    deferred: Option<mpsc::UnboundedSender<StepDownRequest>>,
) {
    while let Some((from, payload)) = commands.recv().await {
        match crate::inbox::command::Command::decode(&payload) {
            Ok(crate::inbox::command::Command::StepDown { group, to }) if deferred.is_some() => {
                tracing::info!(%from, %group, ?to, "step-down requested; handed to the application");
                if let Some(tx) = &deferred {
                    let _ = tx.send(StepDownRequest { from, group, to });
                }
            }
            Ok(crate::inbox::command::Command::StepDown { group, to: None }) => {
                let result = campaigns.step_down(&group).await;
                tracing::info!(%from, %group, ?result, "stepped down on request");
            }
            Ok(crate::inbox::command::Command::StepDown {
                group,
                to: Some(to),
            }) => match campaigns.hand_over(&group, &to).await {
                Ok(()) => tracing::info!(%from, %group, %to, "handed over on request"),
                Err(e) => {
                    tracing::warn!(%from, %group, %to, error = %e, "handover asked for was refused")
                }
            },
            Err(e) => tracing::warn!(%from, error = %e, "ignored an unknown command"),
        }
    }
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("id", &self.shared.id)
            .field("incarnation", &self.shared.nonce)
            .finish()
    }
}
