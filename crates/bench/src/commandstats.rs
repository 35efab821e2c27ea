//! What Redis says it ran: `INFO commandstats` read before and after a
//! window, and the calls in between (the cost, idle and replicas scenarios
//! count the engine's Redis calls this way).

use std::collections::HashMap;

/// `INFO commandstats` as command -> calls.
pub async fn calls(url: &str) -> anyhow::Result<HashMap<String, u64>> {
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

/// The calls of `name` between two readings.
pub fn delta(before: &HashMap<String, u64>, after: &HashMap<String, u64>, name: &str) -> u64 {
    after.get(name).copied().unwrap_or(0) - before.get(name).copied().unwrap_or(0)
}

/// Client calls (scripts, blocking inbox reads, event publishes) and all
/// commands but the readings' own `INFO`, between two readings.
pub fn deltas(before: &HashMap<String, u64>, after: &HashMap<String, u64>) -> (u64, u64) {
    let calls = |name: &str| delta(before, after, name);
    let client: u64 = ["evalsha", "eval", "xread", "publish"]
        .iter()
        .map(|c| calls(c))
        .sum();
    let all: u64 = after.keys().map(|k| calls(k)).sum::<u64>() - calls("info");
    (client, all)
}
