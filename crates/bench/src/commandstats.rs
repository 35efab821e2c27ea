//! What the store says it ran: Redis's `INFO commandstats`, or PostgreSQL's
//! committed and rolled-back transactions of the database
//! (`pg_stat_database`: every engine call is one statement in a
//! transaction of its own), read before and after a window, and the calls
//! in between (the cost, idle and replicas scenarios count the engine's
//! store calls this way). PostgreSQL publishes a backend's counts up to a
//! second late (10 s for an idle one): windows of tens of seconds keep
//! that small.

use std::collections::HashMap;

/// `INFO commandstats` as command -> calls, or on PostgreSQL
/// `statements` -> the database's transactions.
pub async fn calls(url: &str) -> anyhow::Result<HashMap<String, u64>> {
    if leasehold_engine::store::postgres::is_postgres_url(url) {
        return statements(url).await;
    }
    // A RedisError's message is its cause's: taken flat.
    let client = redis::Client::open(url).map_err(anyhow::Error::msg)?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(anyhow::Error::msg)?;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .map_err(anyhow::Error::msg)?;
    let mut calls = HashMap::new();
    for line in info.lines() {
        let Some(rest) = line.strip_prefix("cmdstat_") else {
            continue;
        };
        let Some((name, stats)) = rest.split_once(':') else {
            continue;
        };
        let n = stats
            .split(',')
            .find_map(|kv| kv.strip_prefix("calls="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        calls.insert(name.to_owned(), n);
    }
    Ok(calls)
}

/// The database's transactions so far, less the ones of this reading.
async fn statements(url: &str) -> anyhow::Result<HashMap<String, u64>> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    let task = tokio::spawn(connection);
    // A snapshot of the counters as they are now, not as of this
    // transaction's start.
    client
        .batch_execute("SELECT pg_stat_clear_snapshot()")
        .await?;
    let row = client
        .query_one(
            "SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database WHERE datname = current_database()",
            &[],
        )
        .await?;
    task.abort();
    let n: i64 = row.get(0);
    Ok(HashMap::from([("statements".to_owned(), n.max(0) as u64)]))
}

/// The calls of `name` between two readings.
pub fn delta(before: &HashMap<String, u64>, after: &HashMap<String, u64>, name: &str) -> u64 {
    after.get(name).copied().unwrap_or(0) - before.get(name).copied().unwrap_or(0)
}

/// Client calls (scripts, blocking inbox reads, event publishes) and all
/// commands but the readings' own `INFO`, between two readings.
pub fn deltas(before: &HashMap<String, u64>, after: &HashMap<String, u64>) -> (u64, u64) {
    let calls = |name: &str| delta(before, after, name);
    let client: u64 = ["evalsha", "eval", "xread", "publish", "statements"]
        .iter()
        .map(|c| calls(c))
        .sum();
    let all: u64 = after.keys().map(|k| calls(k)).sum::<u64>() - calls("info");
    (client, all)
}

/// The renewals' hints to followers (`renewed TERM TTL` on a group's release
/// channel) seen since [`RenewalHints::start`]. `INFO commandstats` counts
/// them under PUBLISH as if a client had published, but renew.lua sends
/// them: commands inside a script, not calls, so the cost scenario takes
/// them off its client calls. PostgreSQL renewals send none.
pub struct RenewalHints {
    seen: std::sync::Arc<std::sync::atomic::AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl RenewalHints {
    /// Listens on the release channels of every group under `prefix`;
    /// `None` on PostgreSQL.
    pub async fn start(url: &str, prefix: &str) -> anyhow::Result<Option<Self>> {
        use futures::StreamExt;
        if leasehold_engine::store::postgres::is_postgres_url(url) {
            return Ok(None);
        }
        let client = redis::Client::open(url).map_err(anyhow::Error::msg)?;
        let mut pubsub = client
            .get_async_pubsub()
            .await
            .map_err(anyhow::Error::msg)?;
        pubsub
            .psubscribe(format!("{prefix}:g:*:released"))
            .await
            .map_err(anyhow::Error::msg)?;
        let seen = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counter = seen.clone();
        let task = tokio::spawn(async move {
            let mut messages = pubsub.into_on_message();
            while let Some(message) = messages.next().await {
                if message.get_payload_bytes().starts_with(b"renewed ") {
                    counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        });
        Ok(Some(Self { seen, task }))
    }

    pub fn seen(&self) -> u64 {
        self.seen.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for RenewalHints {
    fn drop(&mut self) {
        self.task.abort();
    }
}
