//! The PostgreSQL store's start, against a real server (the testkit's
//! throwaway one): the schema is created once and versioned, and a
//! database that cannot serve (a newer schema, a user without the right to
//! create the schema, an unknown user) is refused with an error that says
//! which and what to do, names the host and database but never the
//! password, and changes nothing. The history it reads changes when the
//! server restarts.

use leasehold_engine::store::postgres::{PgStartError, PgStore, SCHEMA_VERSION};
use leasehold_testkit as testkit;
use testkit::postgres::{LocalPostgres, PgDatabase};
use testkit::store::{Kind, StoreServer};
use testkit::StoreFixture as _;

fn server(test: &str) -> Option<LocalPostgres> {
    if let Some(why) = testkit::postgres::missing() {
        testkit::lacks(test, testkit::Part::Postgres, &why);
        return None;
    }
    Some(LocalPostgres::start().expect("postgres starts"))
}

fn tables(pg: &LocalPostgres, schema: &str) -> String {
    pg.psql(&format!(
        "SELECT string_agg(tablename, ',' ORDER BY tablename) FROM pg_tables WHERE schemaname = '{schema}'"
    ))
    .unwrap()
}

/// A database of the test's own in the binary's shared server, for a test
/// that takes the store's locks by hand; None (a skip) without PostgreSQL.
fn shared_database(test: &str) -> Option<StoreServer> {
    StoreServer::start_or_skip(Kind::Postgres, test)
}

fn database(server: &StoreServer) -> &PgDatabase {
    match server {
        StoreServer::Postgres(pg) => pg,
        StoreServer::Redis(_) => unreachable!("a PostgreSQL test"),
    }
}

/// A plain client of the test's database: a transaction the test holds
/// open stands for a store call in flight.
async fn client(pg: &PgDatabase) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(&pg.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

/// Whether one statement containing `text` waits on a lock, in the test's
/// database (the shared server runs other tests).
fn waits_on_a_lock(pg: &PgDatabase, text: &str) -> bool {
    pg.psql(&format!(
        "SELECT count(*) FROM pg_stat_activity \
         WHERE datname = current_database() AND wait_event_type = 'Lock' \
         AND query LIKE '%{text}%'"
    ))
    .unwrap()
        == "1"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schema_is_created_once_by_processes_starting_together() {
    let Some(pg) = server("the_schema_is_created_once_by_processes_starting_together") else {
        return;
    };
    let url = pg.url();
    let opens: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { PgStore::open(&url, "lh").await })
        })
        .collect();
    for open in opens {
        open.await.unwrap().expect("every process starts");
    }
    assert_eq!(
        tables(&pg, "lh"),
        "groups,inbox,members,meta,nodes,queues,retained,specs,store,subscriptions,takes"
    );
    assert_eq!(
        pg.psql("SELECT value FROM lh.meta WHERE key = 'schema_version'")
            .unwrap(),
        SCHEMA_VERSION.to_string()
    );
    // Every table survives a crash and is replicated.
    assert_eq!(
        pg.psql("SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'lh' AND c.relpersistence <> 'p'")
            .unwrap(),
        "0"
    );
    // Another prefix is another schema, apart.
    PgStore::open(&url, "other-prefix").await.unwrap();
    assert!(tables(&pg, "other-prefix").contains("groups"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_1_schema_is_upgraded_in_place_and_keeps_its_leases() {
    let Some(pg) = server("a_version_1_schema_is_upgraded_in_place_and_keeps_its_leases") else {
        return;
    };
    let v1 = leasehold_engine::store::postgres::schema_migration(1, "lh").unwrap();
    pg.psql(&format!(
        "CREATE SCHEMA lh; CREATE TABLE lh.meta (key text PRIMARY KEY, value text NOT NULL); {v1}
         INSERT INTO lh.meta VALUES ('schema_version', '1');
         INSERT INTO lh.groups (name, counter, holder, incarnation, lease_term, expires_ms)
             VALUES ('test/g', 7, 'test/old', 'x', 7, lh.now_ms() + 60000);
         INSERT INTO lh.members VALUES ('test/g', 'test/old', lh.now_ms() + 60000);"
    ))
    .unwrap();
    PgStore::open(&pg.url(), "lh").await.unwrap();
    assert_eq!(
        pg.psql("SELECT value FROM lh.meta WHERE key = 'schema_version'")
            .unwrap(),
        SCHEMA_VERSION.to_string()
    );
    let store = leasehold_engine::Store::connect(&pg.url(), "lh").unwrap();
    let state = store.group_state("test/g").await.unwrap();
    assert_eq!(state.holder.as_deref(), Some("test/old"));
    assert_eq!(state.term, 7);
    assert_eq!(
        state.priorities.get("test/old"),
        Some(&leasehold_engine::DEFAULT_PRIORITY)
    );
    // A process of the previous release still campaigns through version
    // 1's signatures, at the default priority.
    assert_eq!(
        pg.psql("SELECT o_status FROM lh.renew('test/g', 'test/old', 'x', 7, 60000, 60000)")
            .unwrap(),
        "1"
    );
    assert_eq!(
        pg.psql("SELECT o_won FROM lh.claim('test/g', 'test/other', 'y', 1000, 0, 3000, 'h', 0)")
            .unwrap(),
        "f"
    );
    // The holder of the lease kept is the last holder: a free seat never
    // waits for it.
    assert_eq!(
        pg.psql("SELECT last_holder FROM lh.groups WHERE name = 'test/g'")
            .unwrap(),
        "test/old"
    );
}

/// A function that answers without a column the store reads (here
/// `group_state` as version 1 defined it, without the priorities) is a
/// reply error naming the statement and the column, not a panic of the
/// process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_missing_a_column_is_an_error_naming_it() {
    let test = "a_reply_missing_a_column_is_an_error_naming_it";
    let Some(server) = shared_database(test) else {
        return;
    };
    let pg = database(&server);
    PgStore::open(&pg.url(), "lh").await.unwrap();
    pg.psql(
        "DROP FUNCTION lh.group_state(text);
         CREATE FUNCTION lh.group_state(p_group text)
         RETURNS TABLE (o_holder text, o_term bigint, o_pttl bigint, o_now bigint,
                        o_members text[], o_until bigint[])
         LANGUAGE sql AS $$ SELECT NULL::text, 0::bigint, NULL::bigint, lh.now_ms(),
                                   '{}'::text[], '{}'::bigint[] $$;",
    )
    .unwrap();
    let store = leasehold_engine::Store::connect(&pg.url(), "lh").unwrap();
    match store.group_state("test/g").await {
        Err(leasehold_engine::StoreError::Reply(text)) => {
            assert!(
                text.starts_with("GroupState: column o_priorities"),
                "{text}"
            );
        }
        other => panic!("a reply without o_priorities read as {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_schema_is_refused_and_left_as_it_is() {
    let Some(pg) = server("a_newer_schema_is_refused_and_left_as_it_is") else {
        return;
    };
    PgStore::open(&pg.url(), "lh").await.unwrap();
    let newer = SCHEMA_VERSION + 1;
    pg.psql(&format!(
        "UPDATE lh.meta SET value = '{newer}' WHERE key = 'schema_version'"
    ))
    .unwrap();
    let e = PgStore::open(&pg.url(), "lh").await.unwrap_err();
    assert!(
        matches!(e, PgStartError::NewerSchema { found, .. } if found == newer),
        "{e}"
    );
    let text = e.to_string();
    for words in [
        "127.0.0.1:",
        "database \"postgres\"",
        &format!("version {newer}"),
        "newer than this leasehold",
    ] {
        assert!(text.contains(words), "{text} does not say {words:?}");
    }
    assert_eq!(
        pg.psql("SELECT value FROM lh.meta WHERE key = 'schema_version'")
            .unwrap(),
        newer.to_string(),
        "the refusal changed the schema"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_who_may_not_create_the_schema_is_told_what_to_grant() {
    let Some(pg) = server("a_user_who_may_not_create_the_schema_is_told_what_to_grant") else {
        return;
    };
    // PUBLIC has no CREATE on a database: app may not make a schema.
    pg.psql("CREATE ROLE app LOGIN PASSWORD 's3cret'").unwrap();
    let url = format!("postgres://app:s3cret@127.0.0.1:{}/postgres", pg.port);
    let e = PgStore::open(&url, "lh").await.unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, PgStartError::Privilege { .. }), "{text}");
    assert!(
        text.contains("\"app\"") && text.contains("\"lh\"") && text.contains("grant"),
        "{text}"
    );
    assert!(!text.contains("s3cret"), "the password is in {text}");
    assert_eq!(
        pg.psql("SELECT count(*) FROM pg_namespace WHERE nspname = 'lh'")
            .unwrap(),
        "0"
    );
    // A schema an administrator made for it is enough.
    pg.psql("CREATE SCHEMA lh AUTHORIZATION app").unwrap();
    PgStore::open(&url, "lh")
        .await
        .expect("starts in its own schema");
    // An unknown user is refused as such.
    let url = format!("postgres://nobody:s3cret@127.0.0.1:{}/postgres", pg.port);
    let e = PgStore::open(&url, "lh").await.unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, PgStartError::Credentials { .. }), "{text}");
    assert!(
        text.contains("\"nobody\"") && !text.contains("s3cret"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_history_changes_when_the_server_restarts_or_the_schema_is_new() {
    let Some(mut pg) = server("the_history_changes_when_the_server_restarts_or_the_schema_is_new")
    else {
        return;
    };
    let store = PgStore::open(&pg.url(), "lh").await.unwrap();
    let first = store.history().await.unwrap();
    assert!(first.timeline >= 1 && first.meta_oid > 0, "{first:?}");
    assert!(first.continues_in(&store.read_history().await.unwrap()));
    drop(store);
    pg.restart_on_own_data().unwrap();
    let store = PgStore::open(&pg.url(), "lh").await.unwrap();
    let after_crash = store.history().await.unwrap();
    assert_eq!(after_crash.system, first.system, "the same cluster");
    assert_eq!(after_crash.timeline, first.timeline, "no promotion");
    assert_eq!(after_crash.meta_oid, first.meta_oid, "the same schema");
    assert_ne!(
        after_crash.started_us, first.started_us,
        "a crash restart is seen"
    );
    assert!(!first.continues_in(&after_crash));
    drop(store);
    // The schema dropped and made again (as a restore of a dump would).
    pg.psql("DROP SCHEMA lh CASCADE").unwrap();
    let store = PgStore::open(&pg.url(), "lh").await.unwrap();
    assert_ne!(
        store.history().await.unwrap().meta_oid,
        after_crash.meta_oid
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_refused_without_being_shown() {
    let Some(pg) = server("a_wrong_password_is_refused_without_being_shown") else {
        return;
    };
    // Passwords checked for app (the server trusts everyone else).
    pg.psql("CREATE ROLE app LOGIN PASSWORD 'right-one'")
        .unwrap();
    let hba = pg.data_dir().join("pg_hba.conf");
    let rules = std::fs::read_to_string(&hba).unwrap();
    std::fs::write(
        &hba,
        format!("host all app 127.0.0.1/32 scram-sha-256\n{rules}"),
    )
    .unwrap();
    pg.psql("SELECT pg_reload_conf()").unwrap();
    let url = |password: &str| format!("postgres://app:{password}@127.0.0.1:{}/postgres", pg.port);
    pg.psql("CREATE SCHEMA lh AUTHORIZATION app").unwrap();
    PgStore::open(&url("right-one"), "lh")
        .await
        .expect("the right password");
    let e = PgStore::open(&url("wrong-one"), "lh").await.unwrap_err();
    let (text, debug) = (e.to_string(), format!("{e:?}"));
    assert!(matches!(e, PgStartError::Credentials { .. }), "{text}");
    assert!(text.contains("password authentication failed"), "{text}");
    for shown in [&text, &debug] {
        assert!(
            !shown.contains("wrong-one") && !shown.contains("right-one"),
            "{shown}"
        );
    }
    // A raw '@' in a password would put part of it in the host.
    let e = PgStore::open(&url("p@ss"), "lh").await.unwrap_err();
    assert!(matches!(e, PgStartError::Url(_)), "{e}");
    assert!(
        e.to_string().contains("%40") && !e.to_string().contains("ss@"),
        "{e}"
    );
}

/// Through PgBouncer in transaction mode LISTEN cannot work (the server
/// session that listens goes back to the pool after each statement): the
/// store says so at start, naming the pooler and the mode that works, and
/// in session mode it serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooler_in_transaction_mode_is_refused_at_start_and_session_mode_serves() {
    use leasehold_engine::Store;
    use testkit::pgbouncer::LocalPgBouncer;
    let test = "a_pooler_in_transaction_mode_is_refused_at_start_and_session_mode_serves";
    let Some(pg) = server(test) else {
        return;
    };
    if let Some(why) = testkit::pgbouncer::missing() {
        testkit::lacks(test, testkit::Part::Pgbouncer, &why);
        return;
    }
    let transaction = LocalPgBouncer::start(&pg, "transaction").unwrap();
    let store = Store::connect(&transaction.url("postgres"), "lh").unwrap();
    let refusal = store
        .refusal()
        .await
        .expect("a pooler in transaction mode is refused");
    assert!(
        refusal.contains("pool_mode = transaction")
            && refusal.contains("session mode")
            && refusal.contains(&format!("127.0.0.1:{}", transaction.port)),
        "{refusal}"
    );

    // Session mode: no refusal, and a handover by notification (well
    // within the retry interval, which a poll would wait for).
    let session = LocalPgBouncer::start(&pg, "session").unwrap();
    let url = session.url("postgres");
    let store = Store::connect(&url, "lh").unwrap();
    assert_eq!(store.refusal().await, None);
    let cfg = leasehold_engine::ElectionConfig {
        ttl_ms: 3_000,
        renew_interval_ms: 1_000,
        retry_interval_ms: 2_000,
    };
    let node = |id: &'static str| {
        let store = Store::connect(&url, "lh").unwrap();
        async move {
            let n = leasehold_engine::Node::start(store, id, testkit::node_config())
                .await
                .unwrap();
            let g = n.join("test/g", cfg).unwrap();
            (n, g)
        }
    };
    let (a, ga) = node("test/a").await;
    testkit::eventually(std::time::Duration::from_secs(5), "a leads", || {
        ga.is_leader()
    })
    .await;
    let (b, gb) = node("test/b").await;
    testkit::eventually(std::time::Duration::from_secs(5), "b follows a", || {
        matches!(
            &*gb.role().borrow(),
            leasehold_engine::Role::Follower { .. }
        )
    })
    .await;
    a.step_down("test/g").await.unwrap();
    let took = testkit::eventually(std::time::Duration::from_millis(1_000), "b leads", || {
        gb.is_leader()
    })
    .await;
    eprintln!("handover through PgBouncer in session mode: {took:?}");
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// A node that subscribes while a retained message to that topic is being
/// published gets it, as a subscriber or from the retained copy: never
/// neither. The publisher is held, after it read who subscribes, by a lock
/// the test takes on another subscriber's queues row; the node subscribes
/// meanwhile. It guards against a subscribe that runs through (its read of
/// the retained copies not seeing the uncommitted one) while the message
/// reaches the other subscriber only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscribe_racing_a_retained_publish_gets_the_message() {
    use std::time::Duration;
    use testkit::{eventually, node};
    let test = "a_subscribe_racing_a_retained_publish_gets_the_message";
    let Some(server) = shared_database(test) else {
        return;
    };
    let pg = database(&server);
    let x = node(&server, "test/x").await;
    let mut rx_x = x.inbox().unwrap();
    x.subscribe("cfg").await.unwrap();
    let n = node(&server, "test/n").await;
    let mut rx_n = n.inbox().unwrap();
    let p = node(&server, "test/p").await;
    let hold = client(pg).await;
    hold.batch_execute("BEGIN; SELECT 1 FROM lh.queues WHERE node = 'test/x' FOR UPDATE")
        .await
        .unwrap();
    let publish = tokio::spawn(async move {
        p.publish_retained("cfg", b"v1", None).await.unwrap();
        p
    });
    eventually(
        Duration::from_secs(3),
        "the publisher waits on x's row",
        || waits_on_a_lock(pg, "publish"),
    )
    .await;
    let subscribe = tokio::spawn(async move {
        n.subscribe("cfg").await.unwrap();
        n
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    hold.batch_execute("COMMIT").await.unwrap();
    let p = publish.await.unwrap();
    let n = subscribe.await.unwrap();
    for (who, rx) in [("x", &mut rx_x), ("n", &mut rx_n)] {
        let delivery = tokio::time::timeout(Duration::from_secs(2), rx.recv())
            .await
            .unwrap_or_else(|_| panic!("{who} got nothing"));
        match delivery {
            Some(leasehold_engine::Delivery::Message(m)) => assert_eq!(m.payload, b"v1"),
            other => panic!("{who}: {other:?}"),
        }
    }
    for node in [x, n, p] {
        node.close().await.unwrap();
    }
}

/// Two publishers retaining the same topics in opposite orders, batch
/// after batch, to topics with no subscriber (so no node row orders them
/// first): every publish succeeds. Each batch writes its retained copies in
/// topic order; written in message order, two batches could each hold a
/// topic's row the other waits for, and PostgreSQL would end one with a
/// deadlock error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_retaining_the_same_topics_in_opposite_orders_never_deadlock() {
    use leasehold_engine::{Outbound, PublishOptions, Retain, To};
    use testkit::node;
    let test = "batches_retaining_the_same_topics_in_opposite_orders_never_deadlock";
    let Some(server) = shared_database(test) else {
        return;
    };
    let retained = PublishOptions {
        retain: Retain::Forever,
        ..PublishOptions::default()
    };
    let batch = |topics: [&str; 2]| {
        topics
            .iter()
            .map(|t| Outbound {
                to: To::Topic((*t).to_owned(), retained),
                payload: b"x".to_vec(),
            })
            .collect::<Vec<_>>()
    };
    let mut tasks = Vec::new();
    for (id, topics) in [("test/p1", ["a", "b"]), ("test/p2", ["b", "a"])] {
        let p = node(&server, id).await;
        let batch = batch(topics);
        tasks.push(tokio::spawn(async move {
            let mut failed = Vec::new();
            for _ in 0..300 {
                for result in p.publish_all(batch.clone()).await.unwrap() {
                    if let Err(e) = result {
                        failed.push(e.to_string());
                    }
                }
            }
            p.close().await.unwrap();
            failed
        }));
    }
    for task in tasks {
        let failed = task.await.unwrap();
        assert!(
            failed.is_empty(),
            "{} failed: {:?}",
            failed.len(),
            failed.first()
        );
    }
}

/// A publisher in flight holds up neither the receiver's heartbeats nor
/// its reader's acks: a publish transaction to node x is held open for
/// more than two of x's leases, and x stays live throughout (a subscribe
/// of x waiting behind the publisher included: it holds x's row, KEY
/// SHARE, which a heartbeat's FOR UPDATE waited for) and an ack of its
/// inbox answers at once. It guards against publishers that lock the
/// receivers' node rows, which heartbeats and acks lock too: x's
/// heartbeats would wait behind batches to the same inbox, its lease run
/// out and the ack hit the statement timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_in_flight_holds_up_no_heartbeat_and_no_ack() {
    use std::time::Duration;
    let test = "a_publisher_in_flight_holds_up_no_heartbeat_and_no_ack";
    let Some(server) = shared_database(test) else {
        return;
    };
    let pg = database(&server);
    let lease = leasehold_engine::NodeConfig::with_lease(1_000);
    let x = leasehold_engine::Node::start(server.store(), "test/x", lease)
        .await
        .unwrap();
    let mut rx = x.inbox().unwrap();
    let hold = client(pg).await;
    hold.batch_execute(
        "BEGIN; SELECT * FROM lh.publish('test/p', ARRAY['direct'], ARRAY['test/x'], \
         ARRAY['\\x01'::bytea], ARRAY[false], ARRAY[-1]::bigint[])",
    )
    .await
    .unwrap();
    let acker = client(pg).await;
    acker
        .batch_execute("SET statement_timeout = '1s'")
        .await
        .unwrap();
    acker
        .query_one("SELECT * FROM lh.ack_inbox('test/x', 0, 0)", &[])
        .await
        .expect("an ack while a publisher holds x's queues");
    // A subscribe that brings x a retained copy waits for the publisher
    // too, holding x's row: it must not hold up the heartbeats either.
    acker
        .batch_execute(
            "SELECT * FROM lh.publish('test/p', ARRAY['topic'], ARRAY['cfg'], \
             ARRAY['\\x02'::bytea], ARRAY[false], ARRAY[0]::bigint[])",
        )
        .await
        .unwrap();
    let subscribing = {
        let store = server.store();
        tokio::spawn(async move {
            leasehold_engine::test_hooks::subscribe_node(&store, "test/x", "cfg", 100).await
        })
    };
    // Two and a half leases: x's heartbeats (every third of one) go on.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(
        pg.psql("SELECT lease_until_ms > lh.now_ms() FROM lh.nodes WHERE id = 'test/x'")
            .unwrap(),
        "t",
        "x's lease ran out while a publisher was in flight"
    );
    hold.batch_execute("COMMIT").await.unwrap();
    subscribing.await.unwrap().unwrap();
    for payload in [1, 2] {
        match tokio::time::timeout(Duration::from_secs(2), rx.recv()).await {
            Ok(Some(leasehold_engine::Delivery::Message(m))) => assert_eq!(m.payload, [payload]),
            other => panic!("x got {other:?}"),
        }
    }
    x.close().await.unwrap();
}

/// A sweep and a publisher never deadlock over the expired subscribers
/// they both touch. Nodes a and b subscribe and expire, b first; a
/// publisher has locked a's queues row (publishers lock them in id order)
/// when the sweep starts, and then wants b's. A sweep that removed its
/// batch in expiry order would hold b's row while it waited for a's, the
/// publisher would wait for b's, and PostgreSQL would end one of them with
/// "deadlock detected": so the sweep goes in id order too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_and_a_publisher_never_deadlock() {
    use leasehold_engine::test_hooks;
    use std::time::Duration;
    use testkit::eventually;
    let test = "a_sweep_and_a_publisher_never_deadlock";
    let Some(server) = shared_database(test) else {
        return;
    };
    let pg = database(&server);
    let store = server.store();
    for (id, lease) in [("test/b", 100), ("test/a", 300)] {
        test_hooks::register_node(&store, id, "gone", lease, &[])
            .await
            .unwrap();
        test_hooks::subscribe_node(&store, id, "t", 100)
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let publisher = client(pg).await;
    publisher
        .batch_execute(
            "SET statement_timeout = '5s'; BEGIN; \
             SELECT 1 FROM lh.queues WHERE node = 'test/a' FOR UPDATE",
        )
        .await
        .unwrap();
    let sweeper = client(pg).await;
    let sweep = tokio::spawn(async move {
        sweeper
            .query_one("SELECT o_swept FROM lh.sweep(100)", &[])
            .await
            .map(|row| row.get::<_, Vec<String>>("o_swept"))
    });
    eventually(Duration::from_secs(3), "the sweep waits on a's row", || {
        waits_on_a_lock(pg, "sweep")
    })
    .await;
    publisher
        .batch_execute("SELECT 1 FROM lh.queues WHERE node = 'test/b' FOR UPDATE; COMMIT")
        .await
        .expect("the publisher gets b's row");
    let mut swept = sweep.await.unwrap().expect("the sweep ends well");
    swept.sort();
    assert_eq!(swept, ["test/a", "test/b"]);
}
