//! The node registry: one [`Node`] per process, registered in Redis under its
//! id with a lease it keeps alive by heartbeats, plus a sweeper that removes
//! nodes whose lease ran out.
//!
//! A node is also the handle through which it campaigns for groups (see
//! [`crate::election`]): one object to start, observe and close.
//!
//! Promises:
//! - expiry is decided on the Redis clock, so skewed local clocks are harmless;
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

mod sweeper;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, watch};

use crate::config::{self, validate_name, ElectionConfig, NodeConfig};
use crate::election::{Campaigns, Group};
use crate::events::{Event, EventBus};
use crate::store::{bounded, Heartbeat, Store};
use crate::task::Task;
use crate::Error;

/// What every loop of one node shares.
pub(crate) struct Shared {
    pub store: Store,
    pub id: String,
    pub incarnation: String,
    pub events: EventBus,
    /// Set once another live incarnation of this id shows up.
    pub displaced: watch::Sender<Option<String>>,
}

impl Shared {
    pub fn mark_displaced(&self, by: String) {
        let first = self.displaced.send_if_modified(|d| {
            if d.is_none() {
                *d = Some(by.clone());
                true
            } else {
                false
            }
        });
        if first {
            tracing::error!(node = %self.id, %by, "another live process uses this node id; this one stops");
            self.events.emit(Event::Displaced {
                node: self.id.clone(),
                by_incarnation: by,
            });
        }
    }
}

/// Options beyond the timings: metadata stored with the registration, and a
/// test hook.
#[derive(Debug, Clone, Default)]
pub struct NodeOptions {
    /// Extra fields of the node's hash (e.g. `namespace`, `pod`, `version`).
    pub metadata: Vec<(String, String)>,
    /// Shifts this node's local wall clock (the only thing it is used for is
    /// the `local_started_at` metadata). Tests use it to prove that no expiry
    /// depends on the local clock.
    pub wall_clock_skew_ms: i64,
}

/// A registered node. See the module docs.
pub struct Node {
    shared: Arc<Shared>,
    config: NodeConfig,
    campaigns: Campaigns,
    loops: Vec<Task>,
}

fn new_incarnation() -> String {
    format!("{:016x}", fastrand::u64(..))
}

fn local_wall_ms(skew: i64) -> i64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    now + skew
}

impl Node {
    /// Registers `id` with default options. See [`Node::start_with`].
    pub async fn start(store: Store, id: &str, config: NodeConfig) -> Result<Self, Error> {
        Self::start_with(store, id, config, NodeOptions::default()).await
    }

    /// Validates, registers and starts the heartbeat and sweeper loops. A Redis
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
        let events = EventBus::start(store.clone());
        let shared = Arc::new(Shared {
            store,
            id: id.to_owned(),
            incarnation: new_incarnation(),
            events,
            displaced: watch::channel(None).0,
        });
        let mut metadata = options.metadata.clone();
        metadata.push((
            "local_started_at".into(),
            local_wall_ms(options.wall_clock_skew_ms).to_string(),
        ));
        let registration = Registration {
            shared: shared.clone(),
            config,
            metadata,
        };
        let registered = registration.register(false).await;
        let heartbeat = Task::spawn(tracing::Instrument::instrument(
            registration.heartbeat_loop(registered),
            tracing::info_span!("heartbeat", node = %id),
        ));
        let sweeper = Task::spawn(tracing::Instrument::instrument(
            sweeper::run(shared.clone(), config),
            tracing::info_span!("sweeper", node = %id),
        ));
        Ok(Self {
            campaigns: Campaigns::new(shared.clone()),
            shared,
            config,
            loops: vec![heartbeat, sweeper],
        })
    }

    pub fn id(&self) -> &str {
        &self.shared.id
    }

    /// This process's incarnation nonce.
    pub fn incarnation(&self) -> &str {
        &self.shared.incarnation
    }

    pub fn config(&self) -> NodeConfig {
        self.config
    }

    pub fn store(&self) -> &Store {
        &self.shared.store
    }

    /// Every engine event of this node, from now on.
    pub fn events(&self) -> broadcast::Receiver<Event> {
        self.shared.events.subscribe()
    }

    /// Whether another live process took over this node id.
    pub fn displaced(&self) -> bool {
        self.shared.displaced.borrow().is_some()
    }

    /// Starts campaigning for `group` with `config`.
    pub fn join(&self, group: &str, config: ElectionConfig) -> Result<Group, Error> {
        let handle = self.campaigns.join(group, config)?;
        self.publish_groups();
        Ok(handle)
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

    pub fn group(&self, group: &str) -> Option<Group> {
        self.campaigns.group(group)
    }

    pub fn groups(&self) -> Vec<String> {
        self.campaigns.names()
    }

    /// Leaves every group, releasing held leases concurrently, each bounded
    /// by its group's retry interval. The node stays registered.
    pub async fn shutdown(&self) {
        self.campaigns.shutdown().await;
    }

    /// Shuts down, stops the loops and removes the node from the registry at
    /// once (bounded, so a hung connection cannot wedge it).
    pub async fn close(self) -> Result<(), Error> {
        self.shutdown().await;
        for task in &self.loops {
            task.abort();
        }
        bounded(
            config::CONNECT_TIMEOUT,
            self.shared
                .store
                .unregister(&self.shared.id, &self.shared.incarnation),
        )
        .await?;
        Ok(())
    }

    /// Keeps the `groups` field of the registration current, so a sweep can
    /// remove this node from its groups' member lists.
    fn publish_groups(&self) {
        let store = self.shared.store.clone();
        let id = self.shared.id.clone();
        let groups = self.campaigns.names().join(",");
        tokio::spawn(async move {
            let _ = bounded(
                config::CONNECT_TIMEOUT,
                store.set_node_field(&id, "groups", &groups),
            )
            .await;
        });
    }
}

struct Registration {
    shared: Arc<Shared>,
    config: NodeConfig,
    metadata: Vec<(String, String)>,
}

impl Registration {
    fn limit(&self) -> Duration {
        self.config.lease()
    }

    /// One registration attempt; `again` marks a re-registration after the
    /// lease ran out. Returns whether it succeeded.
    async fn register(&self, again: bool) -> bool {
        let s = &self.shared;
        let result = bounded(
            self.limit().min(config::CONNECT_TIMEOUT),
            s.store.register(
                &s.id,
                &s.incarnation,
                self.config.lease_duration_ms,
                &self.metadata,
            ),
        )
        .await;
        match result {
            Ok(previous) => {
                if let Some(previous) = previous {
                    tracing::info!(%previous, "took over the registration of an earlier incarnation of this id");
                }
                let node = s.id.clone();
                s.events.emit(if again {
                    Event::Recovered { node }
                } else {
                    Event::Registered { node }
                });
                true
            }
            Err(e) => {
                s.events.emit(Event::StoreError {
                    node: s.id.clone(),
                    during: "register",
                    message: e.to_string(),
                });
                false
            }
        }
    }

    async fn heartbeat_loop(self, mut registered: bool) {
        let s = self.shared.clone();
        let mut ever_registered = registered;
        loop {
            tokio::time::sleep(self.config.heartbeat_interval()).await;
            if !registered {
                registered = self.register(ever_registered).await;
                ever_registered |= registered;
                continue;
            }
            let beat = bounded(
                self.limit(),
                s.store
                    .heartbeat(&s.id, &s.incarnation, self.config.lease_duration_ms),
            )
            .await;
            match beat {
                Ok(Heartbeat::Extended) => {}
                Ok(Heartbeat::Expired) => {
                    tracing::warn!("own lease expired: registering again");
                    registered = self.register(true).await;
                }
                Ok(Heartbeat::Displaced { incarnation }) => {
                    s.mark_displaced(incarnation);
                    return;
                }
                Err(e) => s.events.emit(Event::StoreError {
                    node: s.id.clone(),
                    during: "heartbeat",
                    message: e.to_string(),
                }),
            }
        }
    }
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("id", &self.shared.id)
            .field("incarnation", &self.shared.incarnation)
            .finish()
    }
}
