//! Redis key names. Every key starts with the configured prefix; a group's
//! keys share the hash tag `{GROUP}` so one group's scripts touch one slot.
//! `scripts/remove_node.lua` builds node and topic keys the same way.

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    prefix: String,
}

/// The keys of one group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupKeys {
    /// Holder's `NODE_ID#INCARNATION#TERM`, with PX = ttl.
    pub lease: String,
    /// Fencing token: +1 on every new acquisition.
    pub term: String,
    /// Timings an operator process sets for the group (nodes adopt them).
    pub config: String,
    /// Node id -> candidacy expiry (ms, Redis clock).
    pub members: String,
    /// Node id -> priority, for members whose priority is not the default.
    pub priorities: String,
    /// The free seat's bookkeeping: last holder, vacancy, named successor
    /// (scripts/seat.lua).
    pub seat: String,
    /// Pub/sub channel on which a release is announced, so followers wake.
    pub released: String,
    /// Cluster name -> `TTL RENEW RETRY AT`: each cluster's timings, as its
    /// controller last wrote them (`vote_spec.lua`).
    pub specs: String,
}

impl Keys {
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_owned(),
        }
    }
    pub fn prefix(&self) -> &str {
        &self.prefix
    }
    pub fn nodes(&self) -> String {
        format!("{}:nodes", self.prefix)
    }
    pub fn node(&self, id: &str) -> String {
        format!("{}:node:{id}", self.prefix)
    }
    pub fn inbox(&self, id: &str) -> String {
        format!("{}:node:{id}:inbox", self.prefix)
    }
    /// Commands for the node's engine (a step-down from the controller), in
    /// a stream of their own so they never wait behind, or are dropped for,
    /// the application's unread messages.
    pub fn commands(&self, id: &str) -> String {
        format!("{}:node:{id}:commands", self.prefix)
    }
    pub fn node_subs(&self, id: &str) -> String {
        format!("{}:node:{id}:subs", self.prefix)
    }
    /// When this store was first used (Redis ms), or first used again after
    /// Redis lost its data: new leases wait one ttl after it (see claim.lua).
    pub fn born(&self) -> String {
        format!("{}:born", self.prefix)
    }
    /// The server process and replication history the store was last used
    /// on (`run_id:master_replid`): a different one means a restart or a
    /// promotion, and a store born again (see claim.lua).
    pub fn history(&self) -> String {
        format!("{}:history", self.prefix)
    }
    /// The store's term epoch (see `term.rs`): where its terms start.
    pub fn epoch(&self) -> String {
        format!("{}:epoch", self.prefix)
    }
    /// Channel carrying every engine transition as JSON, for the controller.
    pub fn events(&self) -> String {
        format!("{}:events", self.prefix)
    }
    /// Pub/sub channel on which a release of `group` is announced (also
    /// [`GroupKeys::released`]): built alone for the listener, which
    /// subscribes to one per group.
    pub fn released(&self, group: &str) -> String {
        format!("{}:g:{{{group}}}:released", self.prefix)
    }
    /// The group whose release channel `channel` is.
    pub fn released_group<'a>(&self, channel: &'a str) -> Option<&'a str> {
        channel
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix(":g:{")?
            .strip_suffix("}:released")
    }
    pub fn group(&self, group: &str) -> GroupKeys {
        let base = format!("{}:g:{{{group}}}", self.prefix);
        GroupKeys {
            lease: format!("{base}:lease"),
            term: format!("{base}:term"),
            config: format!("{base}:config"),
            members: format!("{base}:members"),
            priorities: format!("{base}:priorities"),
            seat: format!("{base}:seat"),
            released: self.released(group),
            specs: format!("{base}:specs"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_the_data_model() {
        let k = Keys::new("lh");
        assert_eq!(k.nodes(), "lh:nodes");
        assert_eq!(k.node("ns/a"), "lh:node:ns/a");
        assert_eq!(k.inbox("ns/a"), "lh:node:ns/a:inbox");
        assert_eq!(k.node_subs("ns/a"), "lh:node:ns/a:subs");
        assert_eq!(k.events(), "lh:events");
        let g = k.group("ns/web");
        assert_eq!(g.lease, "lh:g:{ns/web}:lease");
        assert_eq!(g.term, "lh:g:{ns/web}:term");
        assert_eq!(g.config, "lh:g:{ns/web}:config");
        assert_eq!(g.members, "lh:g:{ns/web}:members");
        assert_eq!(g.priorities, "lh:g:{ns/web}:priorities");
        assert_eq!(g.seat, "lh:g:{ns/web}:seat");
        assert_eq!(g.released, "lh:g:{ns/web}:released");
        assert_eq!(k.released("ns/web"), g.released);
        assert_eq!(k.released_group(&g.released), Some("ns/web"));
        assert_eq!(k.released_group("lh:events"), None);
    }
}
