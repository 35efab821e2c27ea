//! The `leasehold` command's library side: what the demo, the bench and the
//! project's tests share beyond the crates they run, namely a throwaway
//! `redis-server` ([`local_redis`]) and a throwaway Kubernetes API server
//! ([`local_kube`]).
// Production code only (clippy.toml sets the length); a test reads as one scenario.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

pub mod local_kube;
pub mod local_redis;
