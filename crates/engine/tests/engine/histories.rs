//! Terms across a store's histories. A Redis that restarts on an older
//! snapshot, or loses its data set, starts a new history in which no one
//! may remember the last term handed out: its holder died with the data.
//! A term granted after such a change must still be greater than every
//! term granted before it, or a fenced resource takes writes from two
//! holders of one term. Each test here hands a term to a node that then
//! dies with the data, so only the store itself can keep the promise.
//! (Failovers behind Sentinel and in a Cluster are in `sentinel_chaos.rs`
//! and `cluster.rs`.)

use leasehold_testkit as testkit;

use std::time::Duration;

use leasehold_engine::Group;
use testkit::fenced::FencedSink;
use testkit::{eventually, fast, node, RedisServer};

const GROUP: &str = "test/histories";

/// The longest a new history holds leases back: one ttl for the lease, or
/// the term epoch's hold (see claim.lua), whichever is longer.
fn first_lease_bound() -> Duration {
    let cfg = fast();
    Duration::from_millis(
        cfg.ttl_ms.max(leasehold_engine::TERM_EPOCH_HOLD_MS) + 4 * cfg.retry_interval_ms,
    )
}

async fn leads(g: &Group, limit: Duration, what: &str) -> u64 {
    eventually(limit, what, || g.is_leader()).await;
    g.leader_term().expect("a term")
}

/// a leads under term t and the snapshot is taken; b leads under the next
/// term and dies with the Redis process; Redis comes back on the snapshot,
/// which knows only t. Before terms carried the store's history, c was
/// handed b's term again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restarted_on_an_older_snapshot_never_repeats_a_term() {
    let mut redis = RedisServer::start();
    let mut sink = FencedSink::default();
    let a = node(&redis, "test/a").await;
    let ga = a.join(GROUP, fast()).unwrap();
    let first = leads(&ga, Duration::from_secs(3), "a leads").await;
    assert!(sink.write("a", first));
    assert_eq!(redis.cli(&["SAVE"]), "OK");
    // a leaves in order: nobody alive remembers what comes next.
    a.close().await.unwrap();
    let b = node(&redis, "test/b").await;
    let gb = b.join(GROUP, fast()).unwrap();
    let lost = leads(&gb, Duration::from_secs(3), "b leads").await;
    assert!(lost > first);
    assert!(sink.write("b", lost));
    // b dies with Redis (killed first, so b cannot reach the new one).
    redis.kill();
    drop(gb);
    drop(b);
    redis.start_on_own_data();
    assert_eq!(
        redis.cli(&["GET", &format!("lh:g:{{{GROUP}}}:term")]),
        first.to_string(),
        "the snapshot holds the older term"
    );
    let c = node(&redis, "test/c").await;
    let gc = c.join(GROUP, fast()).unwrap();
    let term = leads(&gc, first_lease_bound(), "c leads on the older data").await;
    assert!(
        sink.write("c", term),
        "c led under term {term} after {lost} (first used by {:?})",
        sink.holder(term)
    );
    assert_eq!(sink.duplicates, 0);
    c.close().await.unwrap();
}

/// The same with the data set flushed while Redis runs on (FLUSHALL, or a
/// restore of a backup taken before the group existed): the store cannot
/// tell this from a first use, and must still hand out a greater term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_store_never_repeats_a_term() {
    let redis = RedisServer::start();
    let mut sink = FencedSink::default();
    let a = node(&redis, "test/a").await;
    let ga = a.join(GROUP, fast()).unwrap();
    let first = leads(&ga, Duration::from_secs(3), "a leads").await;
    assert!(sink.write("a", first));
    a.close().await.unwrap();
    let b = node(&redis, "test/b").await;
    let gb = b.join(GROUP, fast()).unwrap();
    let lost = leads(&gb, Duration::from_secs(3), "b leads").await;
    assert!(sink.write("b", lost));
    // b stops dead while Redis is stalled, then the data set goes.
    redis.pause();
    drop(gb);
    drop(b);
    redis.resume();
    assert_eq!(redis.cli(&["FLUSHALL"]), "OK");
    let c = node(&redis, "test/c").await;
    let gc = c.join(GROUP, fast()).unwrap();
    let term = leads(&gc, first_lease_bound(), "c leads on the flushed store").await;
    assert!(
        sink.write("c", term),
        "c led under term {term} after {lost} (first used by {:?})",
        sink.holder(term)
    );
    assert_eq!(sink.duplicates, 0);
    c.close().await.unwrap();
}
