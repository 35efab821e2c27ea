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
            "SELECT (xact_commit + xact_rollback)::bigint AS transactions FROM pg_stat_database WHERE datname = current_database()",
            &[],
        )
        .await?;
    task.abort();
    let n: i64 = row.get("transactions");
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
