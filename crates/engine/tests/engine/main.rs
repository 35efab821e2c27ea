//! The engine against real redis-servers (one per test, on free ports):
//! elections, nodes and inboxes, replication and its histories, split
//! brain, Sentinel, Cluster and TLS; and the PostgreSQL store as far as it
//! is built (its start). One test binary; a module per subject.

// A test may lock a mutex raw (clippy.toml refuses it elsewhere): a
// poisoned lock means another thread of the test panicked, which fails it.
#![allow(clippy::disallowed_methods)]

#[macro_use]
extern crate leasehold_testkit;

mod cluster;
mod election;
mod histories;
mod links;
mod messaging;
mod nodes;
mod postgres;
mod replication;
mod seat;
mod sentinel;
mod split_brain;
mod tls;
