//! Settings of the Redis server that break the guarantees, read from
//! `INFO` (which managed services allow where `CONFIG GET` is refused) and
//! reported, so an operator learns of them at start rather than after an
//! incident. See the README's "What Redis must provide".

use super::{Store, StoreError};

impl Store {
    /// What is wrong with the server's settings, one sentence each (empty
    /// when nothing is).
    pub async fn setting_warnings(&self) -> Result<Vec<String>, StoreError> {
        let info: String = redis::cmd("INFO")
            .arg("memory")
            .query_async(&mut self.conn())
            .await?;
        Ok(warnings(&info))
    }
}

/// The warnings an `INFO memory` answer calls for.
fn warnings(info: &str) -> Vec<String> {
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
        out.push(format!(
            "redis maxmemory-policy is {policy}: under memory pressure Redis may evict a lease while its holder still leads{first}; set maxmemory-policy noeviction"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_noeviction_is_safe_and_volatile_policies_are_named_worst() {
        assert!(warnings("# Memory\r\nmaxmemory_policy:noeviction\r\n").is_empty());
        let w = warnings("# Memory\r\nmaxmemory_policy:allkeys-lru\r\n");
        assert_eq!(w.len(), 1);
        assert!(
            w[0].contains("allkeys-lru") && w[0].contains("noeviction"),
            "{w:?}"
        );
        let w = warnings("maxmemory_policy:volatile-ttl\r\n");
        assert!(w[0].contains("the leases, first"), "{w:?}");
        assert!(warnings("").is_empty());
    }
}
