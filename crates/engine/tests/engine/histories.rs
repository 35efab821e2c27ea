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
use testkit::postgres::LocalPostgres;
use testkit::proxy::Proxy;
use testkit::store::{Kind, StoreServer};
use testkit::{eventually, fast, node, RedisServer, StoreFixture};

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
/// which knows only t. Without the store's history in its terms, c would
/// be handed b's term again.
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

// ---- PostgreSQL ----
//
// The same promise on PostgreSQL, whose histories end differently: a
// server started on an older copy of its volume, a standby promoted while
// it lagged, a crash under `synchronous_commit = off`. Each hands a term to
// a node that then dies with the data, as above.

/// `n` joins and leads under a term the fenced sink has not seen (it
/// would refuse a term used before); returns the group and the term.
async fn leads_fenced(
    n: &leasehold_engine::Node,
    sink: &mut FencedSink,
    limit: Duration,
) -> (Group, u64) {
    let g = n.join(GROUP, fast()).unwrap();
    let term = leads(&g, limit, &format!("{} leads", n.id())).await;
    assert!(
        sink.write(n.id(), term),
        "{} led under term {term}, first used by {:?}",
        n.id(),
        sink.holder(term)
    );
    (g, term)
}

/// A node of its own store on `url` (a multi-host URL reaches whichever
/// server takes writes).
async fn node_on(url: &str, id: &str) -> leasehold_engine::Node {
    let store = leasehold_engine::Store::connect(url, "lh").expect("store");
    leasehold_engine::Node::start(store, id, testkit::node_config())
        .await
        .expect("node")
}

/// a leads under term t and a copy of the volume is taken; b leads under
/// the next term and dies with the server; the server comes back on the
/// copy, which knows only t. Only the history the store reads (the server's
/// start) tells this from a plain restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_started_on_an_older_copy_never_repeats_a_term() {
    let test = "a_postgres_started_on_an_older_copy_never_repeats_a_term";
    let Some(mut server) = StoreServer::start_own_or_skip(Kind::Postgres, test) else {
        return;
    };
    let mut sink = FencedSink::default();
    let a = node(&server, "test/a").await;
    let (_ga, first) = leads_fenced(&a, &mut sink, Duration::from_secs(3)).await;
    // A crash-consistent copy of the volume, as a snapshot takes it.
    let pg = server.postgres().unwrap();
    pg.pause().unwrap();
    let copy = pg.copy_data().unwrap();
    pg.resume();
    a.close().await.unwrap();
    let b = node(&server, "test/b").await;
    let (gb, lost) = leads_fenced(&b, &mut sink, Duration::from_secs(3)).await;
    // b dies with the server (killed first, so b cannot reach the new one).
    server.postgres().unwrap().kill();
    drop(gb);
    drop(b);
    server.postgres().unwrap().start_on_copy(&copy).unwrap();
    assert_eq!(
        server.stored_term(GROUP),
        first,
        "the copy holds the older term"
    );
    let c = node(&server, "test/c").await;
    let (_gc, term) = leads_fenced(&c, &mut sink, first_lease_bound()).await;
    assert!(term > lost);
    assert!(
        leasehold_engine::term::epoch(term) > 0,
        "a new epoch: {term}"
    );
    assert_eq!(sink.duplicates, 0);
    c.close().await.unwrap();
}

/// A standby made with `pg_basebackup -R` stops receiving (the network
/// between them is paused, then cut) while the primary hands out another
/// term; the primary dies with the node that held it, and the standby is
/// promoted without that term. The nodes reach whichever server takes
/// writes through one multi-host URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_standby_that_lagged_never_repeats_a_term() {
    let test = "a_promoted_standby_that_lagged_never_repeats_a_term";
    let Some(mut server) = StoreServer::start_own_or_skip(Kind::Postgres, test) else {
        return;
    };
    let primary_port = server.postgres().unwrap().port;
    let link = Proxy::start(primary_port).await;
    let standby = LocalPostgres::standby_through(server.postgres().unwrap(), link.port).unwrap();
    let url = format!(
        "postgres://postgres@127.0.0.1:{primary_port},127.0.0.1:{}/postgres?target_session_attrs=read-write",
        standby.port
    );
    let mut sink = FencedSink::default();
    let a = node_on(&url, "test/a").await;
    let (_ga, first) = leads_fenced(&a, &mut sink, Duration::from_secs(3)).await;
    let replicated = format!("SELECT counter FROM lh.groups WHERE name = '{GROUP}'");
    eventually(Duration::from_secs(10), "the standby has term t", || {
        standby.psql(&replicated).ok().as_deref() == Some(first.to_string().as_str())
    })
    .await;
    // From here the standby lags: nothing more reaches it.
    link.pause();
    a.close().await.unwrap();
    let b = node_on(&url, "test/b").await;
    let (gb, lost) = leads_fenced(&b, &mut sink, Duration::from_secs(3)).await;
    server.postgres().unwrap().kill();
    drop(gb);
    drop(b);
    // What the link held back is lost with it.
    link.cut();
    standby.promote().unwrap();
    assert_eq!(
        standby.psql(&replicated).unwrap(),
        first.to_string(),
        "the promoted standby lacks the last term"
    );
    let c = node_on(&url, "test/c").await;
    // The standby's promotion, then the nodes finding it, then one ttl.
    let (_gc, term) = leads_fenced(&c, &mut sink, first_lease_bound() * 3).await;
    assert!(term > lost);
    assert!(
        leasehold_engine::term::epoch(term) > 0,
        "a new epoch: {term}"
    );
    c.close().await.unwrap();
}

/// A server whose default is `synchronous_commit = off` is killed (-9)
/// right after a term was handed out: the settings check names the
/// setting, and the term after the crash is greater than every one before,
/// whatever the crash kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_under_synchronous_commit_off_never_repeats_a_term() {
    let test = "a_crash_under_synchronous_commit_off_never_repeats_a_term";
    let Some(mut server) = StoreServer::start_postgres_with(&["synchronous_commit=off"], test)
    else {
        return;
    };
    let store = server.store();
    let warnings = store.setting_warnings().await.unwrap();
    assert!(
        warnings.iter().any(|w| w.setting == "synchronous_commit"),
        "{warnings:?}"
    );
    let mut sink = FencedSink::default();
    let a = node(&server, "test/a").await;
    let (_ga, _first) = leads_fenced(&a, &mut sink, Duration::from_secs(3)).await;
    a.close().await.unwrap();
    let b = node(&server, "test/b").await;
    let (gb, lost) = leads_fenced(&b, &mut sink, Duration::from_secs(3)).await;
    server.postgres().unwrap().kill();
    drop(gb);
    drop(b);
    server.postgres().unwrap().restart_on_own_data().unwrap();
    let c = node(&server, "test/c").await;
    let (_gc, term) = leads_fenced(&c, &mut sink, first_lease_bound()).await;
    assert!(term > lost);
    assert_eq!(sink.duplicates, 0);
    c.close().await.unwrap();
}
