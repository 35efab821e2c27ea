//! The Lua scripts, loaded once per connection and invoked by SHA (the redis
//! crate falls back to EVAL and reloads on NOSCRIPT, e.g. after a restart).
//! Each script is the shared prologue (`now.lua`) plus its own body.

use std::sync::LazyLock;

use redis::Script;

const PROLOGUE: &str = include_str!("scripts/now.lua");
const REMOVE_NODE: &str = include_str!("scripts/remove_node.lua");

fn script(parts: &[&str]) -> Script {
    Script::new(&parts.concat())
}

pub static CLAIM: LazyLock<Script> =
    LazyLock::new(|| script(&[PROLOGUE, include_str!("scripts/claim.lua")]));
pub static RENEW: LazyLock<Script> =
    LazyLock::new(|| script(&[PROLOGUE, include_str!("scripts/renew.lua")]));
pub static RELEASE: LazyLock<Script> =
    LazyLock::new(|| script(&[PROLOGUE, include_str!("scripts/release.lua")]));
pub static GROUP_STATE: LazyLock<Script> =
    LazyLock::new(|| script(&[PROLOGUE, include_str!("scripts/group_state.lua")]));
pub static REGISTER: LazyLock<Script> =
    LazyLock::new(|| script(&[PROLOGUE, include_str!("scripts/register.lua")]));
pub static HEARTBEAT: LazyLock<Script> =
    LazyLock::new(|| script(&[PROLOGUE, include_str!("scripts/heartbeat.lua")]));
pub static SWEEP: LazyLock<Script> =
    LazyLock::new(|| script(&[PROLOGUE, REMOVE_NODE, include_str!("scripts/sweep.lua")]));
pub static UNREGISTER: LazyLock<Script> = LazyLock::new(|| {
    script(&[
        PROLOGUE,
        REMOVE_NODE,
        include_str!("scripts/unregister.lua"),
    ])
});
