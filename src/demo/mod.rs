//! `leasehold demo`: three nodes in one group on a real store of either
//! kind, no cluster.
//! It shows the leader, crashes it (no release: its lease must expire), shows
//! who took over and how long it took, then steps the new leader down and
//! shows the handover. Timings are short so it ends in a few seconds.

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};
use leasehold_daemon::election_args::{election_config, FLAGS};
use leasehold_engine::{Group, Node, NodeConfig, Store};

mod postgres;
mod server;

use postgres::PostgresServer;
use server::RedisServer;

#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// The store (redis://... or postgres://...; --redis-url: deprecated); when
    /// absent, a throwaway server of the kind --store names starts on a free port.
    #[arg(long, alias = "redis-url", env = "LEASEHOLD_STORE_URL")]
    store_url: Option<String>,
    /// Which store to start when no URL is given.
    #[arg(long, default_value = "redis", value_parser = ["redis", "postgres"])]
    store: String,
    /// Lease time to live, ms.
    #[arg(long, default_value_t = 1000)]
    ttl_ms: u64,
    /// How often the leader renews, ms (less than ttl).
    #[arg(long, default_value_t = 300)]
    renew_interval_ms: u64,
    /// How often followers try to claim at the latest, ms.
    #[arg(long, default_value_t = 200)]
    retry_interval_ms: u64,
}

/// The throwaway server the demo started, if any, stopped when dropped.
enum Local {
    None,
    Redis(#[allow(dead_code)] RedisServer),
    Postgres(#[allow(dead_code)] PostgresServer),
}

const GROUP: &str = "demo/singleton";
const NODES: [&str; 3] = ["demo/node-1", "demo/node-2", "demo/node-3"];

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

/// Waits for exactly one leader among `members`, up to `limit`.
async fn leader_of(members: &[(Node, Group)], limit: Duration) -> anyhow::Result<usize> {
    let start = Instant::now();
    loop {
        let leaders: Vec<usize> = (0..members.len())
            .filter(|&i| members[i].1.is_leader())
            .collect();
        if let [one] = leaders[..] {
            return Ok(one);
        }
        if start.elapsed() > limit {
            bail!("no single leader within {limit:?} (leaders: {leaders:?})");
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

// A scenario read top to bottom: its steps in the order they run.
#[allow(clippy::too_many_lines)]
pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    let election = election_config(
        FLAGS,
        args.ttl_ms,
        args.renew_interval_ms,
        args.retry_interval_ms,
    )?;
    let (_local, url) = match (args.store_url, args.store.as_str()) {
        (Some(url), _) => (Local::None, url),
        (None, "postgres") => {
            let local = PostgresServer::start()?;
            println!(
                "started postgres on 127.0.0.1:{} (stopped at exit)",
                local.port
            );
            let url = local.url();
            (Local::Postgres(local), url)
        }
        (None, _) => {
            let local = RedisServer::start()?;
            println!(
                "started redis-server on 127.0.0.1:{} (stopped at exit)",
                local.port
            );
            let url = local.url();
            (Local::Redis(local), url)
        }
    };
    // A prefix of its own, so the demo never touches other data in that
    // store (on PostgreSQL a schema of its own, dropped by nobody: name it
    // with --store-url on a database you can spare).
    let prefix = format!("leasehold_demo_{:08x}", fastrand::u32(..));
    let store = Store::connect(&url, &prefix).map_err(anyhow::Error::msg)?;
    let kind = store.kind();
    tokio::time::timeout(Duration::from_secs(10), store.check())
        .await
        .map_err(|_| anyhow!("the {kind} store did not answer within 10 s"))?
        .map_err(anyhow::Error::msg)?;
    println!(
        "group {GROUP}: ttl {} ms, renew every {} ms, retry every {} ms",
        election.ttl_ms, election.renew_interval_ms, election.retry_interval_ms
    );

    let node_config = NodeConfig::with_lease(election.ttl_ms);
    let mut members = Vec::new();
    for id in NODES {
        let node = Node::start(store.clone(), id, node_config)
            .await
            .map_err(anyhow::Error::msg)?;
        let group = node.join(GROUP, election).map_err(anyhow::Error::msg)?;
        members.push((node, group));
    }
    let limit = election.ttl() * 3 + Duration::from_secs(2);
    let first = leader_of(&members, limit).await?;
    let term = members[first].1.leader_term().unwrap_or_default();
    println!("1. {} leads (term {term})", members[first].0.id());

    // Crash: drop the node without closing it. Nothing is released.
    let state = store.group_state(GROUP).await.map_err(anyhow::Error::msg)?;
    let lease_left = Duration::from_millis(state.lease_pttl_ms.unwrap_or(0));
    let (crashed, _) = members.remove(first);
    let crashed_id = crashed.id().to_owned();
    let killed = Instant::now();
    drop(crashed);
    println!(
        "2. {crashed_id} crashes (its lease has {} left in {kind})",
        ms(lease_left)
    );
    let second = leader_of(&members, limit).await?;
    let takeover = killed.elapsed();
    let term = members[second].1.leader_term().unwrap_or_default();
    println!(
        "   {} took over after {} (term {term}): {} after the lease expired",
        members[second].0.id(),
        ms(takeover),
        ms(takeover.saturating_sub(lease_left)),
    );

    // Step-down: released at once, the other node takes over.
    let stepped = Instant::now();
    members[second]
        .0
        .step_down(GROUP)
        .await
        .map_err(anyhow::Error::msg)?;
    let third = leader_of(&members, limit).await?;
    let handover = stepped.elapsed();
    let term = members[third].1.leader_term().unwrap_or_default();
    println!(
        "3. {} steps down; {} took over after {} (term {term})",
        members[second].0.id(),
        members[third].0.id(),
        ms(handover)
    );

    for (node, _) in members {
        node.close().await.map_err(anyhow::Error::msg)?;
    }
    println!(
        "summary: crash takeover {} (bound: ttl + retry = {} ms), step-down handover {} (bound: retry = {} ms)",
        ms(takeover),
        election.ttl_ms + election.retry_interval_ms,
        ms(handover),
        election.retry_interval_ms
    );
    Ok(())
}
