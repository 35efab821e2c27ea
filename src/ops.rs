//! The operator's commands against a store's URL, the way a database's or
//! a message bus's own CLI is used from a shell: `nodes` and `groups` read
//! the registry and the leases, `publish` and `subscribe` use the
//! messaging, `step-down` asks a leader to hand over. Output is a table
//! (kubectl's style) or, with `-o json`, JSON for scripts: one document
//! for the listings, one object per line for a subscription.
//!
//! Commands that write run as a short-lived node of their own
//! (`cli/HOST-PID`), which unregisters when the command ends.

use std::io::Read as _;
use std::time::Duration;

use anyhow::{bail, Context as _};
use leasehold_daemon::store_args::StoreArgs;
use leasehold_engine::{Delivery, Node, NodeConfig, Overflow, PublishOptions, Retain, Store};
use serde_json::{json, Value};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Columns for people.
    #[default]
    Table,
    /// JSON for scripts.
    Json,
}

#[derive(Debug, clap::Args)]
pub struct Common {
    #[command(flatten)]
    pub store: StoreArgs,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Format::Table)]
    pub output: Format,
}

#[derive(Debug, clap::Args)]
pub struct ListArgs {
    #[command(flatten)]
    common: Common,
}

#[derive(Debug, clap::Args)]
pub struct PublishArgs {
    #[command(flatten)]
    common: Common,
    /// Topic to publish to (dot-separated segments, no wildcards).
    topic: String,
    /// The payload; `-` or absent: read it from standard input.
    payload: Option<String>,
    /// Keep the message as the topic's retained one, for subscribers to come.
    #[arg(long)]
    retain: bool,
    /// With --retain: keep it this long, ms (default: until replaced).
    #[arg(long, requires = "retain")]
    retain_ttl_ms: Option<u64>,
    /// When a subscriber's inbox is full: drop its oldest messages, or refuse the whole publish.
    #[arg(long, value_enum, default_value_t = OverflowArg::DropOldest)]
    overflow: OverflowArg,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum OverflowArg {
    DropOldest,
    Refuse,
}

#[derive(Debug, clap::Args)]
pub struct SubscribeArgs {
    #[command(flatten)]
    common: Common,
    /// Topics or patterns (`orders.*`, `orders.>`).
    #[arg(required = true, value_name = "PATTERN")]
    patterns: Vec<String>,
}

#[derive(Debug, clap::Args)]
pub struct StepDownArgs {
    #[command(flatten)]
    common: Common,
    /// The engine's group name: NAMESPACE/NAME for a LeaderGroup.
    group: String,
    /// Hand the group to this member: a pod of the group's namespace, or a node id NAMESPACE/POD. Refused (exit 1, nothing changed) unless it is a live member with a priority above 0.
    #[arg(long, value_name = "POD")]
    to: Option<String>,
    /// How long to wait for another leader, ms (0: do not wait).
    #[arg(long, default_value_t = 10_000)]
    wait_ms: u64,
}

/// The node a writing command runs as.
fn cli_node_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default();
    let host: String = host
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.'))
        .take(60)
        .collect();
    let host = if host.is_empty() {
        "host".to_owned()
    } else {
        host
    };
    format!("cli/{host}-{}", std::process::id())
}

async fn cli_node(store: Store) -> anyhow::Result<Node> {
    Node::start(store, &cli_node_id(), NodeConfig::default())
        .await
        .map_err(anyhow::Error::msg)
        .context("registering this command as a node")
}

/// Columns padded as kubectl pads them: three spaces between columns.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let mut out = String::new();
        let last = cells.len().saturating_sub(1);
        for (i, cell) in cells.into_iter().enumerate() {
            if i == last {
                out += &cell;
            } else {
                out += &format!("{cell:<width$}   ", width = widths[i]);
            }
        }
        out.trim_end().to_owned() + "\n"
    };
    let mut out = line(header.iter().map(|h| (*h).to_owned()).collect());
    for row in rows {
        out += &line(row.clone());
    }
    out
}

/// A duration in kubectl's short style: 850ms, 12s, 3m4s, 2h5m, 3d.
fn short(ms: u64) -> String {
    match ms {
        0..=999 => format!("{ms}ms"),
        1_000..=59_999 => format!("{}s", ms / 1_000),
        60_000..=3_599_999 => format!("{}m{}s", ms / 60_000, ms / 1_000 % 60),
        3_600_000..=86_399_999 => format!("{}h{}m", ms / 3_600_000, ms / 60_000 % 60),
        _ => format!("{}d", ms / 86_400_000),
    }
}

fn print_json(value: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_default()
    );
}

pub async fn nodes(args: ListArgs) -> anyhow::Result<()> {
    let store = args.common.store.connect()?;
    let now = store.time_ms().await.map_err(anyhow::Error::msg)?;
    let nodes = store.list_nodes().await.map_err(anyhow::Error::msg)?;
    match args.common.output {
        Format::Json => print_json(&json!({
            "nodes": nodes.iter().map(|n| json!({
                "id": n.id,
                "live": n.live,
                "leaseLeftMs": n.lease_until_ms.saturating_sub(now),
                "lastHeartbeatMsAgo": now.saturating_sub(n.last_heartbeat_ms),
                "registeredAtMs": n.registered_at_ms,
                "groups": n.groups,
                "backlog": n.backlog,
                "dropped": n.dropped,
            })).collect::<Vec<_>>(),
        })),
        Format::Table => {
            let rows: Vec<Vec<String>> = nodes
                .iter()
                .map(|n| {
                    vec![
                        n.id.clone(),
                        if n.live { "yes" } else { "no" }.to_owned(),
                        short(n.lease_until_ms.saturating_sub(now)),
                        format!("{} ago", short(now.saturating_sub(n.last_heartbeat_ms))),
                        n.backlog.to_string(),
                        n.dropped.to_string(),
                        if n.groups.is_empty() {
                            "<none>".to_owned()
                        } else {
                            n.groups.join(",")
                        },
                    ]
                })
                .collect();
            print!(
                "{}",
                table(
                    &[
                        "NODE",
                        "LIVE",
                        "LEASE LEFT",
                        "HEARTBEAT",
                        "BACKLOG",
                        "DROPPED",
                        "GROUPS"
                    ],
                    &rows
                )
            );
        }
    }
    Ok(())
}

pub async fn groups(args: ListArgs) -> anyhow::Result<()> {
    let store = args.common.store.connect()?;
    // Groups are found through their members' registrations: a group no
    // registered node has joined is not listed.
    let names: std::collections::BTreeSet<String> = store
        .list_nodes()
        .await
        .map_err(anyhow::Error::msg)?
        .into_iter()
        .flat_map(|n| n.groups)
        .collect();
    let mut groups = Vec::new();
    for name in names {
        let state = store.group_state(&name).await.map_err(anyhow::Error::msg)?;
        groups.push((name, state));
    }
    match args.common.output {
        Format::Json => print_json(&json!({
            "groups": groups.iter().map(|(name, g)| json!({
                "group": name,
                "leader": g.holder,
                "term": g.term,
                "leaseLeftMs": g.lease_pttl_ms,
                "members": g.members.iter().map(|(id, _)| id).collect::<Vec<_>>(),
                "priorities": g.priorities,
            })).collect::<Vec<_>>(),
        })),
        Format::Table => {
            let rows: Vec<Vec<String>> = groups
                .iter()
                .map(|(name, g)| {
                    vec![
                        name.clone(),
                        g.holder.clone().unwrap_or_else(|| "<none>".to_owned()),
                        g.term.to_string(),
                        g.lease_pttl_ms.map_or_else(|| "-".to_owned(), short),
                        g.members.len().to_string(),
                        priorities(&g.priorities),
                    ]
                })
                .collect();
            print!(
                "{}",
                table(
                    &[
                        "GROUP",
                        "LEADER",
                        "TERM",
                        "EXPIRES IN",
                        "MEMBERS",
                        "PRIORITIES"
                    ],
                    &rows
                )
            );
        }
    }
    Ok(())
}

pub async fn publish(args: PublishArgs) -> anyhow::Result<()> {
    let store = args.common.store.connect()?;
    let payload = match args.payload.as_deref() {
        None | Some("-") => {
            let mut bytes = Vec::new();
            std::io::stdin()
                .read_to_end(&mut bytes)
                .context("reading the payload from standard input")?;
            bytes
        }
        Some(text) => text.as_bytes().to_vec(),
    };
    let retain = match (args.retain, args.retain_ttl_ms) {
        (false, _) => Retain::No,
        (true, None) => Retain::Forever,
        (true, Some(ms)) => Retain::For(Duration::from_millis(ms)),
    };
    let overflow = match args.overflow {
        OverflowArg::DropOldest => Overflow::DropOldest,
        OverflowArg::Refuse => Overflow::Refuse,
    };
    let node = cli_node(store).await?;
    let result = node
        .publish_with(&args.topic, &payload, PublishOptions { retain, overflow })
        .await;
    let _ = node.close().await;
    let published = result.map_err(|e| match e {
        // The only option the engine bounds is the retain ttl.
        leasehold_engine::Error::Config(e) => anyhow::Error::new(e).context("--retain-ttl-ms"),
        e => anyhow::Error::msg(e),
    })?;
    match args.common.output {
        Format::Json => println!(
            "{}",
            json!({ "id": published.id, "reached": published.reached })
        ),
        Format::Table => println!(
            "published {} bytes to {} as message {}: {} inbox(es) reached",
            payload.len(),
            args.topic,
            published.id,
            published.reached
        ),
    }
    Ok(())
}

pub async fn subscribe(args: SubscribeArgs) -> anyhow::Result<()> {
    let shutdown = leasehold_daemon::signal::shutdown();
    let store = args.common.store.connect()?;
    let node = cli_node(store).await?;
    for pattern in &args.patterns {
        if let Err(e) = node.subscribe(pattern).await {
            let _ = node.close().await;
            return Err(anyhow::Error::msg(e));
        }
    }
    let Some(mut inbox) = node.inbox() else {
        let _ = node.close().await;
        bail!("the node's inbox was taken");
    };
    eprintln!(
        "subscribed as {} to {}; Ctrl-C to stop",
        node.id(),
        args.patterns.join(", ")
    );
    tokio::pin!(shutdown);
    loop {
        let delivery = tokio::select! {
            _ = &mut shutdown => break,
            d = inbox.recv() => d,
        };
        let Some(delivery) = delivery else { break };
        let item = match delivery {
            Delivery::Message(m) => leasehold_agent::Item::Message(m),
            Delivery::Recovered => leasehold_agent::Item::Recovered,
        };
        match args.common.output {
            Format::Json => {
                let mut v = item.to_json();
                v["type"] = json!(item.kind());
                println!("{v}");
            }
            Format::Table => match &item {
                leasehold_agent::Item::Message(m) => println!(
                    "{} from {}{}: {}",
                    m.topic.as_deref().unwrap_or("(direct)"),
                    m.from,
                    if m.retained { " (retained)" } else { "" },
                    String::from_utf8_lossy(&m.payload)
                ),
                _ => println!("-- recovered: this node's lease had expired; messages published meanwhile were lost"),
            },
        }
    }
    node.close().await.map_err(anyhow::Error::msg)
}

pub async fn step_down(args: StepDownArgs) -> anyhow::Result<()> {
    let store = args.common.store.connect()?;
    let before = store
        .group_state(&args.group)
        .await
        .map_err(anyhow::Error::msg)?;
    let Some(holder) = before.holder.clone() else {
        bail!(
            "group {:?} has no leader now: nothing to step down",
            args.group
        );
    };
    let to = args.to.as_deref().map(|to| successor_id(&args.group, to));
    if let Some(to) = &to {
        check_successor(&args.group, &holder, to, &before)?;
    }
    let node = cli_node(store.clone()).await?;
    let asked = match &to {
        Some(to) => node.ask_to_hand_over(&holder, &args.group, to).await,
        None => node.ask_to_step_down(&holder, &args.group).await,
    };
    let _ = node.close().await;
    asked.map_err(anyhow::Error::msg)?;
    let deadline = tokio::time::Instant::now() + Duration::from_millis(args.wait_ms);
    let mut after = None;
    while args.wait_ms > 0 && tokio::time::Instant::now() < deadline {
        let state = store
            .group_state(&args.group)
            .await
            .map_err(anyhow::Error::msg)?;
        // A released lease (no holder yet) is not the end: wait for the
        // next leader, or the deadline.
        let next = state.holder.as_deref();
        if next.is_some() && (state.term > before.term || next != Some(holder.as_str())) {
            after = Some(state);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    match args.common.output {
        Format::Json => println!(
            "{}",
            json!({
                "group": args.group,
                "asked": holder,
                "term": before.term,
                "leader": after.as_ref().and_then(|s| s.holder.clone()),
                "newTerm": after.as_ref().map(|s| s.term),
            })
        ),
        Format::Table => {
            println!(
                "asked {holder} to step down from {} (term {})",
                args.group, before.term
            );
            match &after {
                Some(s) => match &s.holder {
                    Some(next) => println!("{next} leads under term {}", s.term),
                    None => println!("{holder} released the lease; no leader yet"),
                },
                None if args.wait_ms > 0 => println!("no change within {} ms", args.wait_ms),
                None => {}
            }
        }
    }
    match (&to, &after) {
        (Some(to), Some(s)) if s.holder.as_deref() != Some(to.as_str()) => bail!(
            "{to} did not take group {:?} over: {} leads",
            args.group,
            s.holder.as_deref().unwrap_or("nobody")
        ),
        (Some(to), None) if args.wait_ms > 0 => bail!(
            "{holder} did not hand group {:?} over to {to} within {} ms (it may have refused: see its log)",
            args.group,
            args.wait_ms
        ),
        _ => Ok(()),
    }
}

/// The members whose priority is not the default, as `ID=N`, or `-`.
fn priorities(all: &std::collections::BTreeMap<String, u32>) -> String {
    let set: Vec<String> = all
        .iter()
        .filter(|(_, &p)| p != leasehold_engine::DEFAULT_PRIORITY)
        .map(|(id, p)| format!("{id}={p}"))
        .collect();
    if set.is_empty() {
        "-".to_owned()
    } else {
        set.join(",")
    }
}

/// `--to`: a node id as given, or a pod of the group's namespace.
fn successor_id(group: &str, to: &str) -> String {
    match group.split_once('/') {
        Some((namespace, _)) if !to.contains('/') => format!("{namespace}/{to}"),
        _ => to.to_owned(),
    }
}

/// Refuses a handover the leader would refuse, before asking it.
fn check_successor(
    group: &str,
    holder: &str,
    to: &str,
    state: &leasehold_engine::store::GroupState,
) -> anyhow::Result<()> {
    if to == holder {
        bail!("{to} already leads group {group:?}: nothing to hand over");
    }
    match state.priorities.get(to) {
        None => bail!(
            "cannot hand group {group:?} over to {to}: it is not a live member of the group (live members: {})",
            state.priorities.keys().cloned().collect::<Vec<_>>().join(", ")
        ),
        Some(0) => bail!(
            "cannot hand group {group:?} over to {to}: it campaigns with priority 0, so it never leads"
        ),
        Some(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_pad_every_column_but_the_last() {
        let out = table(&["A", "LONGER"], &[vec!["xyz".into(), "1".into()]]);
        assert_eq!(out, "A     LONGER\nxyz   1\n");
    }

    #[test]
    fn durations_read_like_kubectl() {
        assert_eq!(short(850), "850ms");
        assert_eq!(short(12_400), "12s");
        assert_eq!(short(184_000), "3m4s");
        assert_eq!(short(7_500_000), "2h5m");
        assert_eq!(short(3 * 86_400_000), "3d");
    }
}
