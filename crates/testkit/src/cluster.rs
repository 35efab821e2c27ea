//! A Redis Cluster for the tests and the bench: three primaries and a
//! fourth node that replicates the one slot a key prefix's keys live in (in
//! a cluster the engine makes the prefix a hash tag, `{PREFIX}`). Every
//! node is a real `redis-server` on a directory of its own, holding its
//! `nodes.conf`, so a node SIGKILLed and started again on that directory
//! ([`LocalRedis::start_on_own_data`]) rejoins the cluster it knew, as a
//! replica of whoever took its slots over meanwhile. Made the way an
//! operator makes one: `redis-cli --cluster create` for the primaries, then
//! `CLUSTER MEET` and `CLUSTER REPLICATE` for the fourth node.

use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

use crate::redis::free_port;
use crate::LocalRedis;

/// `cluster-node-timeout`: how long a node may be silent before the others
/// take it for failed (a replica then takes its slots over). Shorter than
/// the ttls the tests and the bench use, as docs/redis.md asks.
pub const NODE_TIMEOUT_MS: u64 = 2000;

pub struct Cluster {
    /// `nodes[..3]` the primaries made at start, `nodes[3]` the replica of
    /// [`Cluster::slot`] then; failovers change who is what, so ask
    /// [`Cluster::owner`] and [`Cluster::replica_of`].
    pub nodes: Vec<LocalRedis>,
    /// The hash slot of the prefix given to [`Cluster::start`].
    pub slot: u16,
}

/// Waits until `check` holds, or fails with `what` after `limit`; checks
/// every 50 ms, since each check starts `redis-cli` processes.
async fn until(limit: Duration, what: &str, mut check: impl FnMut() -> bool) -> anyhow::Result<()> {
    let start = Instant::now();
    while !check() {
        if start.elapsed() > limit {
            bail!("cluster: not within {limit:?}: {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// A cluster node (its cluster bus on a port of its own) and that port.
fn cluster_node() -> anyhow::Result<(LocalRedis, u16)> {
    let bus_port = free_port()?;
    let bus = bus_port.to_string();
    let timeout = NODE_TIMEOUT_MS.to_string();
    let node = LocalRedis::start_with_args(&[
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        "--cluster-node-timeout",
        &timeout,
        "--cluster-port",
        &bus,
    ])
    .context("a cluster node")?;
    Ok((node, bus_port))
}

/// Whether `node` says it serves `slot` as a primary. A node that does not
/// answer (killed) serves nothing.
pub fn serves(node: &LocalRedis, slot: u16) -> bool {
    let slot = u64::from(slot);
    // CLUSTER NODES: id addr flags master ping pong epoch link slots...
    node.cli(&["CLUSTER", "NODES"])
        .unwrap_or_default()
        .lines()
        .any(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.len() > 8
                && fields[2].contains("myself")
                && fields[2].contains("master")
                && fields[8..].iter().any(|range| {
                    let (a, b) = range.split_once('-').unwrap_or((range, range));
                    matches!((a.parse::<u64>(), b.parse::<u64>()),
                        (Ok(a), Ok(b)) if (a..=b).contains(&slot))
                })
        })
}

/// The first of `nodes` that says it serves `slot` as a primary.
pub fn owner(nodes: &[LocalRedis], slot: u16) -> Option<usize> {
    nodes.iter().position(|n| serves(n, slot))
}

impl Cluster {
    /// Three primaries and a fourth node replicating the slot of the key
    /// prefix `prefix` (of the hash tag `{prefix}`); returns once every
    /// node says the cluster is ok and the replica is in sync as its
    /// primary sees it (`state=online`: only then does a lease write wait
    /// for it). On Redis's own replication settings: the replica's first
    /// full sync waits 5 s (`repl-diskless-sync-delay`).
    pub async fn start(prefix: &str) -> anyhow::Result<Self> {
        let (nodes, buses): (Vec<LocalRedis>, Vec<u16>) = (0..4)
            .map(|_| cluster_node())
            .collect::<anyhow::Result<Vec<_>>>()?
            .into_iter()
            .unzip();
        let primaries: Vec<String> = nodes[..3]
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let created = std::process::Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&primaries)
            .args(["--cluster-yes"])
            .output()
            .context("redis-cli --cluster create (Debian: apt-get install redis-tools)")?;
        if !created.status.success() {
            bail!(
                "redis-cli --cluster create failed: {}",
                String::from_utf8_lossy(&created.stdout)
            );
        }
        let tag = format!("{{{prefix}}}");
        let slot_text = nodes[0].cli(&["CLUSTER", "KEYSLOT", &tag])?;
        let slot: u16 = slot_text
            .parse()
            .with_context(|| format!("CLUSTER KEYSLOT {tag} answered {slot_text:?}"))?;
        let cluster = Self { nodes, slot };
        let owner = owner(&cluster.nodes[..3], slot).with_context(|| {
            format!("no primary serves slot {slot} after the cluster's creation")
        })?;
        // The fourth node replicates the slot's owner.
        let meet = cluster.nodes[3].cli(&[
            "CLUSTER",
            "MEET",
            "127.0.0.1",
            &cluster.nodes[0].port.to_string(),
            &buses[0].to_string(),
        ])?;
        if meet != "OK" {
            bail!("CLUSTER MEET answered {meet:?}");
        }
        let owner_id = cluster.nodes[owner].cli(&["CLUSTER", "MYID"])?;
        until(Duration::from_secs(20), "the fourth node joins", || {
            cluster.nodes[3]
                .cli(&["CLUSTER", "REPLICATE", &owner_id])
                .is_ok_and(|out| out == "OK")
        })
        .await?;
        until(
            Duration::from_secs(30),
            "the cluster is ok and the replica in sync",
            || cluster.ok() && cluster.in_sync(owner),
        )
        .await?;
        Ok(cluster)
    }

    /// The first node that says it serves `slot` as a primary.
    pub fn owner(&self, slot: u16) -> Option<usize> {
        owner(&self.nodes, slot)
    }

    /// The node that says it replicates `primary`, if one does.
    pub fn replica_of(&self, primary: usize) -> Option<usize> {
        let id = self.nodes[primary].cli(&["CLUSTER", "MYID"]).ok()?;
        if id.is_empty() {
            return None;
        }
        self.nodes.iter().position(|n| {
            n.cli(&["CLUSTER", "NODES"])
                .unwrap_or_default()
                .lines()
                .any(|line| {
                    let fields: Vec<&str> = line.split_whitespace().collect();
                    fields.len() > 3
                        && fields[2].contains("myself")
                        && fields[2].contains("slave")
                        && fields[3] == id
                })
        })
    }

    /// Whether `primary` has a replica in sync (`state=online`), and that
    /// replica says its link is up.
    pub fn in_sync(&self, primary: usize) -> bool {
        let online = self.nodes[primary]
            .cli(&["INFO", "replication"])
            .is_ok_and(|i| i.contains("state=online"));
        online
            && self.replica_of(primary).is_some_and(|r| {
                self.nodes[r]
                    .cli(&["INFO", "replication"])
                    .is_ok_and(|i| i.contains("master_link_status:up"))
            })
    }

    /// Whether every node says `cluster_state:ok` (a killed node says
    /// nothing, so not).
    pub fn ok(&self) -> bool {
        self.nodes.iter().all(|n| {
            n.cli(&["CLUSTER", "INFO"])
                .is_ok_and(|i| i.contains("cluster_state:ok"))
        })
    }

    /// A `redis+cluster://` URL with every node as a seed.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// A `redis+cluster://` URL with one seed, `nodes[seed]`.
    pub fn url_with_seed(&self, seed: usize) -> String {
        format!("redis+cluster://127.0.0.1:{}", self.nodes[seed].port)
    }
}
