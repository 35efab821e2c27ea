//! The engine against real redis-servers (one per test, on free ports):
//! elections, nodes and inboxes, replication and its histories, split
//! brain, Sentinel, Cluster and TLS; and the PostgreSQL store as far as it
//! is built (its start). One test binary; a module per subject.

/// One test per store from one body: `on_both_stores! { async fn
/// name(server) { ... } }` makes the module `name` with the tests `redis`
/// and `postgres`, each running the body with a mutable `server`, a
/// `testkit::StoreServer` of its kind.
macro_rules! on_both_stores {
    ($(#[doc = $doc:expr])* async fn $name:ident($server:ident) $body:block) => {
        $(#[doc = $doc])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            #[allow(unused_mut)]
            async fn body(mut $server: leasehold_testkit::StoreServer) $body

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn redis() {
                let kind = leasehold_testkit::Kind::Redis;
                if let Some(server) = leasehold_testkit::StoreServer::start_or_skip(kind, "redis") {
                    body(server).await;
                }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                let kind = leasehold_testkit::Kind::Postgres;
                if let Some(server) = leasehold_testkit::StoreServer::start_or_skip(kind, "postgres") {
                    body(server).await;
                }
            }
        }
    };
}

mod cluster;
mod election;
mod histories;
mod messaging;
mod nodes;
mod postgres;
mod replication;
mod sentinel;
mod split_brain;
mod tls;
