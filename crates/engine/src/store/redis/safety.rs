//! Settings of the Redis server that break the guarantees, read from
//! `INFO` (which managed services allow where `CONFIG GET` is refused) and
//! reported, so an operator learns of them at start rather than after an
//! incident. See docs/redis.md, "What Redis must provide".

use super::RedisStore;
use crate::store::safety::SettingWarning;
use crate::store::StoreError;

impl RedisStore {
    pub async fn setting_warnings(&self) -> Result<Vec<SettingWarning>, StoreError> {
        // One connection for both reads, so they are of one primary.
        let mut conn = self.conn().await?;
        let info: String = redis::cmd("INFO").query_async(&mut conn).await?;
        // The snapshot rule is not in INFO; a server that refuses CONFIG
        // (a managed one) is not judged on it.
        let save: Option<String> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("save")
            .query_async::<Vec<String>>(&mut conn)
            .await
            .ok()
            .and_then(|pair| pair.into_iter().nth(1));
        Ok(warnings(&info, save.as_deref()))
    }
}

/// The warnings an `INFO` answer (and the `save` setting, if known) call for.
fn warnings(info: &str, save: Option<&str>) -> Vec<SettingWarning> {
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.trim().strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    let mut out = Vec::new();
    if let Some(policy) = field("maxmemory_policy").filter(|p| *p != "noeviction") {
        let first = if policy.starts_with("volatile") {
            ", and this one evicts keys with a ttl, the leases, first"
        } else {
            ""
        };
        out.push(SettingWarning {
            setting: "maxmemory-policy",
            message: format!(
                "redis maxmemory-policy is {policy}: under memory pressure Redis may evict a lease while its holder still leads{first}; set maxmemory-policy noeviction"
            ),
        });
    }
    let replicas: u64 = field("connected_slaves")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let primary = field("role") == Some("master");
    // min_slaves_good_slaves is reported only when min-replicas-to-write is set.
    if primary && replicas > 0 && field("min_slaves_good_slaves").is_none() {
        out.push(SettingWarning {
            setting: "min-replicas-to-write",
            message: format!(
                "redis has {replicas} replica(s) but min-replicas-to-write is 0: a primary cut off from its replicas goes on taking writes, and once it counts none, lease writes are confirmed by no replica; set min-replicas-to-write 1"
            ),
        });
    }
    let aof = field("aof_enabled") == Some("1");
    if primary && replicas > 0 && !aof && save == Some("") {
        out.push(SettingWarning {
            setting: "persistence",
            message: "redis has replicas and no persistence (no AOF, no snapshots): a primary restarted before a failover comes back empty and its replicas copy the empty data set; leases are held back for one ttl then, but the registry and inboxes are gone; set appendonly yes, or keep the primary from restarting by itself".into(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(w: &[SettingWarning]) -> Vec<&'static str> {
        w.iter().map(|w| w.setting).collect::<Vec<_>>()
    }

    #[test]
    fn only_noeviction_is_safe_and_volatile_policies_are_named_worst() {
        assert!(warnings("# Memory\r\nmaxmemory_policy:noeviction\r\n", None).is_empty());
        let w = warnings("# Memory\r\nmaxmemory_policy:allkeys-lru\r\n", None);
        assert_eq!(settings(&w), ["maxmemory-policy"]);
        assert!(
            w[0].message.contains("allkeys-lru") && w[0].message.contains("noeviction"),
            "{w:?}"
        );
        let w = warnings("maxmemory_policy:volatile-ttl\r\n", None);
        assert!(w[0].message.contains("the leases, first"), "{w:?}");
        assert!(warnings("", None).is_empty());
    }

    #[test]
    fn a_replicated_primary_needs_min_replicas_to_write_and_persistence() {
        let base =
            "role:master\r\nconnected_slaves:2\r\naof_enabled:0\r\nmaxmemory_policy:noeviction\r\n";
        assert_eq!(
            settings(&warnings(base, Some(""))),
            ["min-replicas-to-write", "persistence"]
        );
        // Snapshots configured, or not known: no persistence warning.
        assert_eq!(
            settings(&warnings(base, Some("3600 1"))),
            ["min-replicas-to-write"]
        );
        assert_eq!(settings(&warnings(base, None)), ["min-replicas-to-write"]);
        let guarded = format!("{base}min_slaves_good_slaves:2\r\n");
        assert_eq!(
            settings(&warnings(&guarded, Some("3600 1"))),
            Vec::<&str>::new()
        );
        // A lone Redis needs neither.
        let alone = "role:master\r\nconnected_slaves:0\r\naof_enabled:0\r\n";
        assert!(warnings(alone, Some("")).is_empty());
    }
}
