//! The Lua scripts, loaded once per connection and invoked by SHA (the redis
//! crate falls back to EVAL and reloads on NOSCRIPT, e.g. after a restart).
//! Each script is the shared prologue (`now.lua`) plus its own body; the
//! lease scripts also have `terms.lua`, with the constants of `term.rs`,
//! and `seat.lua`, with the default priority of `config.rs`.

use std::sync::LazyLock;

use redis::Script;

const PROLOGUE: &str = include_str!("scripts/now.lua");
const TOPICS: &str = include_str!("scripts/topics.lua");
const REMOVE_NODE: &str = include_str!("scripts/remove_node.lua");

fn script(parts: &[&str]) -> Script {
    Script::new(&parts.concat())
}

/// A lease script: the prologue, the term rules, the seat's rules and `body`.
fn lease_script(body: &str) -> Script {
    let constants = crate::term::lua_constants();
    script(&[PROLOGUE, &constants, TERMS, &seat(), body])
}

const TERMS: &str = include_str!("scripts/terms.lua");

/// `seat.lua` with the constant it needs.
fn seat() -> String {
    format!(
        "local DEFAULT_PRIORITY = {}\n{}",
        crate::config::DEFAULT_PRIORITY,
        include_str!("scripts/seat.lua")
    )
}

pub static CLAIM: LazyLock<Script> =
    LazyLock::new(|| lease_script(include_str!("scripts/claim.lua")));
pub static RENEW: LazyLock<Script> =
    LazyLock::new(|| lease_script(include_str!("scripts/renew.lua")));
pub static RELEASE: LazyLock<Script> =
    LazyLock::new(|| script(&[PROLOGUE, include_str!("scripts/release.lua")]));
pub static HANDOVER: LazyLock<Script> =
    LazyLock::new(|| script(&[PROLOGUE, &seat(), include_str!("scripts/handover.lua")]));
pub static GROUP_STATE: LazyLock<Script> =
    LazyLock::new(|| script(&[PROLOGUE, include_str!("scripts/group_state.lua")]));
pub static REGISTER: LazyLock<Script> =
    LazyLock::new(|| script(&[PROLOGUE, TOPICS, include_str!("scripts/register.lua")]));
pub static HEARTBEAT: LazyLock<Script> =
    LazyLock::new(|| script(&[PROLOGUE, include_str!("scripts/heartbeat.lua")]));
pub static SWEEP: LazyLock<Script> = LazyLock::new(|| {
    script(&[
        PROLOGUE,
        TOPICS,
        REMOVE_NODE,
        include_str!("scripts/sweep.lua"),
    ])
});
pub static UNREGISTER: LazyLock<Script> = LazyLock::new(|| {
    script(&[
        PROLOGUE,
        TOPICS,
        REMOVE_NODE,
        include_str!("scripts/unregister.lua"),
    ])
});
pub static SUBSCRIBE: LazyLock<Script> =
    LazyLock::new(|| script(&[PROLOGUE, TOPICS, include_str!("scripts/subscribe.lua")]));
pub static UNSUBSCRIBE: LazyLock<Script> =
    LazyLock::new(|| script(&[PROLOGUE, TOPICS, include_str!("scripts/unsubscribe.lua")]));
pub static PUBLISH: LazyLock<Script> =
    LazyLock::new(|| script(&[PROLOGUE, TOPICS, include_str!("scripts/publish.lua")]));
pub static ACK: LazyLock<Script> =
    LazyLock::new(|| script(&[PROLOGUE, include_str!("scripts/ack.lua")]));
pub static SET_FIELD: LazyLock<Script> =
    LazyLock::new(|| script(&[include_str!("scripts/set_field.lua")]));
pub static LIST_NODES: LazyLock<Script> =
    LazyLock::new(|| script(&[PROLOGUE, include_str!("scripts/list_nodes.lua")]));
pub static VOTE_SPEC: LazyLock<Script> =
    LazyLock::new(|| script(&[PROLOGUE, include_str!("scripts/vote_spec.lua")]));
pub static RESTORE_TERM: LazyLock<Script> =
    LazyLock::new(|| script(&[include_str!("scripts/restore_term.lua")]));
