//! Messaging against a real redis-server: inboxes, topics and patterns,
//! retained messages, limits (docs/behaviour.md N7, X11), and the message
//! side of the node rules N3-N9.

use leasehold_testkit as testkit;

use std::time::Duration;

use leasehold_engine::test_hooks;
use leasehold_engine::{
    Delivery, Error, Event, InboxConfig, Message, Node, NodeConfig, NodeOptions, Overflow,
    PublishOptions, Store, TopicError,
};
use testkit::proxy::Proxy;
use testkit::store::StoreServer;
use testkit::{next_event, node, RedisServer, StoreFixture};

const WAIT: Duration = Duration::from_secs(3);

async fn node_with(redis_url: &str, id: &str, config: NodeConfig, inbox: InboxConfig) -> Node {
    let store = Store::connect(redis_url, "lh").unwrap();
    let options = NodeOptions {
        inbox,
        ..Default::default()
    };
    Node::start_with(store, id, config, options).await.unwrap()
}

/// A node registered straight in Redis, with no process reading its inbox:
/// what publishers do to a full inbox can be counted exactly.
async fn silent_node(
    redis: &impl StoreFixture,
    id: &str,
    inbox_max: u64,
    subscription: &str,
) -> Store {
    let store = redis.store();
    let metadata = [("inbox_max".to_owned(), inbox_max.to_string())];
    test_hooks::register_node(&store, id, "silent", 60_000, &metadata)
        .await
        .unwrap();
    test_hooks::subscribe_node(&store, id, subscription, inbox_max)
        .await
        .unwrap();
    store
}

/// The last message id the store handed out ("" for none yet).
fn last_message_id(server: &mut StoreServer) -> String {
    match server {
        StoreServer::Redis(redis) => redis.cli(&["GET", "lh:msgseq"]),
        StoreServer::Postgres(pg) => {
            let sql = "SELECT CASE WHEN is_called THEN last_value::text ELSE '' END FROM lh.msgseq";
            pg.psql(sql).unwrap()
        }
    }
}

async fn next(inbox: &mut leasehold_engine::Inbox) -> Delivery {
    tokio::time::timeout(WAIT, inbox.recv())
        .await
        .expect("a delivery in time")
        .expect("inbox open")
}

async fn next_msg(inbox: &mut leasehold_engine::Inbox) -> Message {
    match next(inbox).await {
        Delivery::Message(m) => m,
        other => panic!("expected a message, got {other:?}"),
    }
}

async fn nothing_for(inbox: &mut leasehold_engine::Inbox, d: Duration) {
    if let Ok(got) = tokio::time::timeout(d, inbox.recv()).await {
        panic!("expected nothing, got {got:?}");
    }
}

on_both_stores! {
async fn subscribers_receive_what_is_published_with_sender_and_id(server) {
    let a = node(&server, "test/a").await;
    let b = node(&server, "test/b").await;
    let mut inbox = a.inbox().unwrap();
    assert!(a.inbox().is_none(), "the inbox is taken once");
    a.subscribe("orders.created").await.unwrap();
    let first = b.publish("orders.created", b"one").await.unwrap();
    let second = b.publish("orders.created", b"two").await.unwrap();
    assert_eq!(first.reached, 1);
    assert!(second.id > first.id);
    let m = next_msg(&mut inbox).await;
    assert_eq!(
        m,
        Message {
            id: first.id,
            topic: Some("orders.created".into()),
            from: "test/b".into(),
            payload: b"one".to_vec(),
            retained: false
        }
    );
    assert_eq!(next_msg(&mut inbox).await.payload, b"two");
    assert_eq!(b.publish("orders.deleted", b"x").await.unwrap().reached, 0);
    a.unsubscribe("orders.created").await.unwrap();
    assert_eq!(
        b.publish("orders.created", b"three").await.unwrap().reached,
        0
    );
    nothing_for(&mut inbox, Duration::from_millis(200)).await;
    a.close().await.unwrap();
    b.close().await.unwrap();
}
}

on_both_stores! {
/// The reader acknowledges what it took while its next read waits: the
/// store's backlog empties without another message coming to end that read.
async fn what_the_reader_took_leaves_the_store_without_waiting_for_more(server) {
    let a = node(&server, "test/a").await;
    let b = node(&server, "test/b").await;
    let mut inbox = a.inbox().unwrap();
    a.subscribe("t").await.unwrap();
    b.publish("t", b"one").await.unwrap();
    b.publish("t", b"two").await.unwrap();
    assert_eq!(next_msg(&mut inbox).await.payload, b"one");
    assert_eq!(next_msg(&mut inbox).await.payload, b"two");
    let store = server.store();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let state = store.inbox_state("test/a").await.unwrap();
        if state == (0, 0) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the inbox still holds what was delivered: (backlog, dropped) = {state:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    a.close().await.unwrap();
    b.close().await.unwrap();
}
}

/// The fields of each entry of `key`, as `XRANGE` gives them: names and
/// values in turn.
fn entry_fields(redis: &RedisServer, key: &str) -> Vec<Vec<String>> {
    let all = redis.cli(&["XRANGE", key, "-", "+"]);
    let lines: Vec<&str> = all.split('\n').collect();
    let is_id = |l: &&str| l.contains('-') && l.chars().all(|c| c.is_ascii_digit() || c == '-');
    lines
        .split(is_id)
        .skip(1)
        .map(|e| e.iter().map(|f| (*f).to_owned()).collect())
        .collect()
}

/// A publish is sent as an `EVALSHA` built by the store; a Redis that
/// lost its scripts (a restart, a promoted replica, `SCRIPT FLUSH`) has it
/// loaded again and the publish goes through, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_loads_its_script_again_when_redis_lost_it() {
    let redis = RedisServer::start();
    let sub = node(&redis, "test/sub").await;
    sub.subscribe("t").await.unwrap();
    let mut inbox = sub.inbox().unwrap();
    let p = node(&redis, "test/p").await;
    p.publish("t", b"before").await.unwrap();
    assert_eq!(next_msg(&mut inbox).await.payload, b"before");
    redis.cli(&["SCRIPT", "FLUSH"]);
    assert_eq!(p.publish("t", b"after").await.unwrap().reached, 1);
    assert_eq!(next_msg(&mut inbox).await.payload, b"after");
    nothing_for(&mut inbox, Duration::from_millis(200)).await;
    p.close().await.unwrap();
    sub.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_entries_are_packed_for_nodes_that_read_them_and_fielded_for_older_ones() {
    let redis = RedisServer::start();
    let store = redis.store();
    let packed = [("inbox".to_owned(), "packed".to_owned())];
    test_hooks::register_node(&store, "test/new", "n1", 60_000, &packed)
        .await
        .unwrap();
    test_hooks::register_node(&store, "test/old", "o1", 60_000, &[])
        .await
        .unwrap();
    for id in ["test/new", "test/old"] {
        test_hooks::subscribe_node(&store, id, "t", 10)
            .await
            .unwrap();
    }
    let p = node(&redis, "test/p").await;
    let to_all = p.publish("t", b"to all\n2nd line").await.unwrap().id;
    let to_one = p.send("test/new", b"to one").await.unwrap().id;
    let to_old = p.send("test/old", b"to old").await.unwrap().id;
    // One field: "ID TOPIC SENDER", a newline, the payload as it was.
    let new = entry_fields(&redis, "lh:node:test/new:inbox");
    assert_eq!(
        new,
        [
            vec![
                "m".to_owned(),
                format!("{to_all} t test/p"),
                "to all".to_owned(),
                "2nd line".to_owned()
            ],
            vec![
                "m".to_owned(),
                format!("{to_one}  test/p"),
                "to one".to_owned()
            ],
        ],
        "(redis-cli shows the newline as a line break)"
    );
    // An older node reads the fields it knows: id, topic (none for a
    // direct message), sender, payload.
    let names = |e: &Vec<String>| e.iter().step_by(2).cloned().collect::<Vec<_>>();
    let old = entry_fields(&redis, "lh:node:test/old:inbox");
    // (The payload's own newline shows as one more line at its end.)
    assert_eq!(names(&old[0][..8].to_vec()), ["i", "t", "f", "p"]);
    let direct = ["i", &to_old.to_string(), "f", "test/p", "p", "to old"].map(str::to_owned);
    assert_eq!(old[1], direct);
    // An older version registered again under the packed node's id (its
    // script leaves P:packed as it was, with another incarnation): fields.
    redis.cli(&["HSET", "lh:node:test/new", "incarnation", "older"]);
    p.send("test/new", b"after").await.unwrap();
    let new = entry_fields(&redis, "lh:node:test/new:inbox");
    assert_eq!(names(&new[2]), ["i", "f", "p"]);
    p.close().await.unwrap();
}

on_both_stores! {
/// Many tasks of one node publish at once, some giving a publish up after
/// its first poll (handed to the publisher by then, or not yet): each
/// task's messages arrive in its order, every one not given up arrives, and
/// a publish given up never stalls the ones after it.
async fn publishes_given_up_half_way_keep_order_and_stall_nothing(server) {
    let sub = node(&server, "test/sub").await;
    sub.subscribe("seq").await.unwrap();
    let mut rx = sub.inbox().unwrap();
    let p = std::sync::Arc::new(node(&server, "test/p").await);
    const TASKS: u32 = 8;
    const PER: u32 = 100;
    let given_up = |i: u32| i % 7 == 3;
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let p = p.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..PER {
                let payload = [t.to_be_bytes(), i.to_be_bytes()].concat();
                if given_up(i) {
                    // A zero timeout polls the publish once, then drops it.
                    let _ = tokio::time::timeout(Duration::ZERO, p.publish("seq", &payload)).await;
                } else {
                    p.publish("seq", &payload).await.unwrap();
                }
            }
        }));
    }
    // A stall detector, not a timing bound: generous for the slower store.
    let stall = Duration::from_secs(30);
    for task in tasks {
        tokio::time::timeout(stall, task)
            .await
            .expect("no publish stalls")
            .unwrap();
    }
    let expected = TASKS as usize * (0..PER).filter(|&i| !given_up(i)).count();
    let mut last: std::collections::HashMap<u32, u32> = Default::default();
    let mut got = std::collections::HashSet::new();
    let deadline = tokio::time::Instant::now() + stall;
    // Until every message not given up is here (those given up may come
    // too), then a moment more for any given up after the last.
    while got.len() < expected || tokio::time::Instant::now() < deadline {
        let wait = if got.len() < expected {
            deadline.saturating_duration_since(tokio::time::Instant::now())
        } else {
            Duration::from_millis(200)
        };
        let Ok(Some(delivery)) = tokio::time::timeout(wait, rx.recv()).await else {
            break;
        };
        let Delivery::Message(m) = delivery else {
            continue;
        };
        let t = u32::from_be_bytes(m.payload[..4].try_into().unwrap());
        let i = u32::from_be_bytes(m.payload[4..].try_into().unwrap());
        if let Some(prev) = last.insert(t, i) {
            assert!(i > prev, "task {t}: {i} after {prev}");
        }
        got.insert((t, i));
    }
    for t in 0..TASKS {
        for i in (0..PER).filter(|&i| !given_up(i)) {
            assert!(got.contains(&(t, i)), "task {t}'s message {i} never arrived");
        }
    }
    std::sync::Arc::try_unwrap(p).ok().unwrap().close().await.unwrap();
    sub.close().await.unwrap();
}
}

on_both_stores! {
async fn wildcards_match_one_segment_or_the_rest(server) {
    let star = node(&server, "test/star").await;
    let rest = node(&server, "test/rest").await;
    let p = node(&server, "test/pub").await;
    star.subscribe("orders.*.created").await.unwrap();
    rest.subscribe("orders.>").await.unwrap();
    rest.subscribe("orders.eu.created").await.unwrap(); // and the topic itself: still one copy
    let mut star_in = star.inbox().unwrap();
    let mut rest_in = rest.inbox().unwrap();
    assert_eq!(
        p.publish("orders.eu.created", b"1").await.unwrap().reached,
        2
    );
    assert_eq!(p.publish("orders.eu", b"2").await.unwrap().reached, 1);
    assert_eq!(
        p.publish("orders.eu.west.created", b"3")
            .await
            .unwrap()
            .reached,
        1
    );
    assert_eq!(p.publish("orders", b"4").await.unwrap().reached, 0);
    assert_eq!(
        p.publish("invoices.eu.created", b"5")
            .await
            .unwrap()
            .reached,
        0
    );
    assert_eq!(next_msg(&mut star_in).await.payload, b"1");
    nothing_for(&mut star_in, Duration::from_millis(200)).await;
    for expected in [b"1", b"2", b"3"] {
        assert_eq!(next_msg(&mut rest_in).await.payload, expected);
    }
    nothing_for(&mut rest_in, Duration::from_millis(200)).await;
    for n in [star, rest, p] {
        n.close().await.unwrap();
    }
}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_topics_and_patterns_are_refused_and_nothing_is_written() {
    let redis = RedisServer::start();
    let a = node(&redis, "test/a").await;
    for bad in ["", "orders..created", "orders created", "orders:eu"] {
        let err = a.subscribe(bad).await.unwrap_err();
        assert!(
            matches!(err, Error::Topic(TopicError::InvalidTopic { .. })),
            "{bad:?}: {err}"
        );
        let err = a.publish(bad, b"x").await.unwrap_err();
        assert!(
            matches!(err, Error::Topic(TopicError::InvalidTopic { .. })),
            "{bad:?}: {err}"
        );
    }
    for bad in ["orders.>.created", "orders.cre*", "orders.*x"] {
        let err = a.subscribe(bad).await.unwrap_err();
        assert!(
            matches!(err, Error::Topic(TopicError::InvalidPattern { .. })),
            "{bad:?}: {err}"
        );
        assert!(err.to_string().contains(bad), "{err}");
    }
    let err = a.publish("orders.*", b"x").await.unwrap_err().to_string();
    assert!(err.contains("wildcards are for subscriptions"), "{err}");
    let err = a.send("not a node", b"x").await.unwrap_err().to_string();
    assert!(err.contains("node id \"not a node\""), "{err}");
    assert!(a.subscriptions().is_empty());
    assert_eq!(redis.cli(&["KEYS", "lh:topic:*"]), "");
    a.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payload_at_the_limit_passes_and_one_byte_over_is_refused() {
    let redis = RedisServer::start();
    let inbox = InboxConfig {
        max_message_size: 1024,
        ..Default::default()
    };
    let a = node_with(&redis.url(), "test/a", testkit::node_config(), inbox).await;
    a.subscribe("t").await.unwrap();
    let mut rx = a.inbox().unwrap();
    assert_eq!(a.publish("t", &[7u8; 1024]).await.unwrap().reached, 1);
    assert_eq!(next_msg(&mut rx).await.payload.len(), 1024);
    let err = a.publish("t", &[7u8; 1025]).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::DataTooLarge {
                size: 1025,
                max: 1024
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("max_message_size = 1024"), "{err}");
    let err = a.send("test/a", &[0u8; 1025]).await.unwrap_err();
    assert!(matches!(err, Error::DataTooLarge { .. }));
    nothing_for(&mut rx, Duration::from_millis(200)).await;
    assert_eq!(redis.cli(&["GET", "lh:msgseq"]), "1", "nothing was written");
    a.close().await.unwrap();
}

on_both_stores! {
async fn messages_from_each_publisher_arrive_in_order_under_concurrent_publishers(server) {
    let sub = node(&server, "test/sub").await;
    sub.subscribe("seq").await.unwrap();
    let mut rx = sub.inbox().unwrap();
    const PER: u32 = 300;
    let mut publishers = Vec::new();
    for p in 0..3 {
        let n = node(&server, &format!("test/p{p}")).await;
        publishers.push(tokio::spawn(async move {
            for i in 0..PER {
                n.publish("seq", &i.to_be_bytes()).await.unwrap();
            }
            n
        }));
    }
    let mut last: std::collections::HashMap<String, i64> = Default::default();
    for _ in 0..3 * PER {
        let m = next_msg(&mut rx).await;
        let i = u32::from_be_bytes(m.payload.try_into().unwrap()) as i64;
        let prev = last.insert(m.from.clone(), i).unwrap_or(-1);
        assert_eq!(i, prev + 1, "from {}: {i} after {prev}", m.from);
    }
    for p in publishers {
        p.await.unwrap().close().await.unwrap();
    }
    sub.close().await.unwrap();
}
}

on_both_stores! {
async fn fan_out_reaches_100_subscribers_in_order(server) {
    let config = NodeConfig::with_lease(10_000);
    let mut subs = Vec::new();
    for i in 0..100 {
        let n = node_with(
            &server.url(),
            &format!("test/s{i:03}"),
            config,
            InboxConfig::default(),
        )
        .await;
        n.subscribe("fan.out").await.unwrap();
        let rx = n.inbox().unwrap();
        subs.push((n, rx));
    }
    let p = node_with(&server.url(), "test/pub", config, InboxConfig::default()).await;
    for i in 0..10u8 {
        assert_eq!(p.publish("fan.out", &[i]).await.unwrap().reached, 100);
    }
    for (_, rx) in subs.iter_mut() {
        for i in 0..10u8 {
            assert_eq!(next_msg(rx).await.payload, [i]);
        }
    }
    for (n, _) in subs {
        n.close().await.unwrap();
    }
    p.close().await.unwrap();
}
}

/// A retain ttl Redis would refuse is refused with a typed error before
/// anything is queued; the good messages around it are written, and message
/// ids only ever increase (none is handed out twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_out_of_range_retain_ttl_is_refused_before_anything_is_written() {
    let redis = RedisServer::start();
    let store = silent_node(&redis, "test/silent", 1000, "t").await;
    let p = node(&redis, "test/pub").await;
    let first = p.publish("t", b"first").await.unwrap().id;
    let forever_and_more = Duration::from_secs(u64::MAX);
    let publishes = (0..9).map(|i| {
        let p = &p;
        async move {
            if i == 4 {
                p.publish_retained("t", b"bad", Some(forever_and_more))
                    .await
            } else {
                p.publish("t", &[i]).await
            }
        }
    });
    let results = futures::future::join_all(publishes).await;
    let err = results[4].as_ref().unwrap_err();
    assert!(
        matches!(err, Error::Config(leasehold_engine::ConfigError::OutOfBounds { option, .. }) if option.contains("retain ttl")),
        "{err}"
    );
    assert!(err.to_string().contains("from 1 to"), "{err}");
    let mut ids: Vec<u64> = results
        .iter()
        .filter_map(|r| r.as_ref().ok().map(|p| p.id))
        .collect();
    assert_eq!(ids.len(), 8, "{results:?}");
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 8, "an id was handed out twice: {results:?}");
    assert!(ids[0] > first);
    assert_eq!(redis.cli(&["EXISTS", "lh:topic:t:retained"]), "0");
    assert_eq!(store.inbox_state("test/silent").await.unwrap(), (9, 0));
    let next = p.publish("t", b"next").await.unwrap().id;
    assert!(next > ids[7], "id {next} after {}", ids[7]);
    p.close().await.unwrap();
}

on_both_stores! {
/// A retained message handed to a new subscriber whose inbox is full drops
/// the oldest unread message like any publish does, and counts it.
async fn retained_messages_into_a_full_inbox_count_their_drops(server) {
    let store = silent_node(&server, "test/silent", 3, "t").await;
    let p = node(&server, "test/pub").await;
    for i in 0..3u8 {
        p.publish("t", &[i]).await.unwrap();
    }
    p.publish_retained("r.one", b"1", None).await.unwrap();
    p.publish_retained("r.two", b"2", None).await.unwrap();
    assert_eq!(store.inbox_state("test/silent").await.unwrap(), (3, 0));
    let delivered = test_hooks::subscribe_node(&store, "test/silent", "r.*", 3)
        .await
        .unwrap();
    assert_eq!(delivered, 2);
    assert_eq!(
        store.inbox_state("test/silent").await.unwrap(),
        (3, 2),
        "two retained messages into a full inbox: two dropped, both counted"
    );
    p.close().await.unwrap();
}
}

on_both_stores! {
async fn a_full_inbox_drops_its_oldest_messages_and_counts_each_drop(server) {
    let store = silent_node(&server, "test/silent", 10, "t").await;
    let p = node(&server, "test/pub").await;
    for i in 0..10u8 {
        p.publish("t", &[i]).await.unwrap();
    }
    assert_eq!(
        store.inbox_state("test/silent").await.unwrap(),
        (10, 0),
        "at the limit: nothing dropped"
    );
    for i in 10..15u8 {
        p.publish("t", &[i]).await.unwrap();
    }
    assert_eq!(
        store.inbox_state("test/silent").await.unwrap(),
        (10, 5),
        "five over: five dropped"
    );
    // The oldest went: the backlog starts at the sixth message.
    match &mut server {
        StoreServer::Redis(redis) => {
            let first = redis.cli(&[
                "XRANGE",
                "lh:node:test/silent:inbox",
                "-",
                "+",
                "COUNT",
                "1",
            ]);
            assert!(first.lines().any(|l| l.as_bytes() == [5u8]), "{first:?}");
        }
        StoreServer::Postgres(pg) => {
            let first = pg
                .psql("SELECT payload FROM lh.inbox WHERE node = 'test/silent' AND queue = 1 ORDER BY seq LIMIT 1")
                .unwrap();
            assert_eq!(first, "\\x05");
        }
    }
    let listed = store.list_nodes().await.unwrap();
    let silent = listed.iter().find(|n| n.id == "test/silent").unwrap();
    assert_eq!((silent.backlog, silent.dropped), (10, 5));
    p.close().await.unwrap();
}
}

on_both_stores! {
async fn a_bounded_backlog_refuses_the_publish_instead_of_dropping(server) {
    let store = silent_node(&server, "test/silent", 3, "t").await;
    let p = node(&server, "test/pub").await;
    let bounded = PublishOptions {
        overflow: Overflow::Refuse,
        ..Default::default()
    };
    for _ in 0..3 {
        p.publish_with("t", b"x", bounded).await.unwrap();
    }
    let seq = last_message_id(&mut server);
    let err = p.publish_with("t", b"x", bounded).await.unwrap_err();
    assert!(
        matches!(&err, Error::InboxFull(node) if node == "test/silent"),
        "{err}"
    );
    assert_eq!(store.inbox_state("test/silent").await.unwrap(), (3, 0));
    assert_eq!(last_message_id(&mut server), seq, "nothing was written");
    p.close().await.unwrap();
}
}

on_both_stores! {
async fn lag_is_reported_just_past_the_threshold(server) {
    let inbox = InboxConfig {
        lag_threshold: 100,
        ..InboxConfig::with_max_length(1_000)
    };
    let a = node_with(&server.url(), "test/slow", testkit::node_config(), inbox).await;
    a.subscribe("t").await.unwrap();
    let mut events = a.events();
    let mut rx = a.inbox().unwrap();
    let p = node(&server, "test/pub").await;
    for i in 0..100u32 {
        p.publish("t", &i.to_be_bytes()).await.unwrap();
    }
    // At the threshold: no lag, over several checks.
    tokio::time::sleep(Duration::from_millis(400)).await;
    while let Ok(e) = events.try_recv() {
        assert!(!matches!(e, Event::Lag { .. }), "{e:?} at the threshold");
    }
    p.publish("t", b"one more").await.unwrap();
    let lag = next_event(&mut events, Duration::from_millis(500), |e| {
        matches!(e, Event::Lag { .. })
    })
    .await;
    assert_eq!(
        lag,
        Event::Lag {
            node: "test/slow".into(),
            backlog: 101
        }
    );
    for _ in 0..101 {
        next_msg(&mut rx).await;
    }
    a.close().await.unwrap();
    p.close().await.unwrap();
}
}

on_both_stores! {
async fn retained_messages_go_to_new_subscribers_first(server) {
    let p = node(&server, "test/pub").await;
    p.publish_retained("config.db", b"v1", None).await.unwrap();
    p.publish_retained("config.db", b"v2", None).await.unwrap();
    p.publish_retained("config.cache", b"c1", Some(Duration::from_millis(200)))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await; // config.cache's retained message expires
    let a = node(&server, "test/a").await;
    let mut rx = a.inbox().unwrap();
    a.subscribe("config.db").await.unwrap();
    p.publish("config.db", b"v3").await.unwrap();
    let m = next_msg(&mut rx).await;
    assert_eq!(
        (m.payload.as_slice(), m.retained, m.from.as_str()),
        (&b"v2"[..], true, "test/pub")
    );
    let m = next_msg(&mut rx).await;
    assert_eq!((m.payload.as_slice(), m.retained), (&b"v3"[..], false));
    // A pattern gets every live retained message it covers; the expired one is gone.
    let b = node(&server, "test/b").await;
    let mut rx_b = b.inbox().unwrap();
    b.subscribe("config.>").await.unwrap();
    let m = next_msg(&mut rx_b).await;
    assert_eq!(
        (m.topic.as_deref(), m.payload.as_slice(), m.retained),
        (Some("config.db"), &b"v2"[..], true)
    );
    nothing_for(&mut rx_b, Duration::from_millis(200)).await;
    // Subscribing again to what it has does not replay.
    a.subscribe("config.db").await.unwrap();
    nothing_for(&mut rx, Duration::from_millis(200)).await;
    for n in [a, b, p] {
        n.close().await.unwrap();
    }
}
}

on_both_stores! {
/// A retained message that expired is gone from the store, not only
/// skipped by readers (on Redis the key's own expiry; on PostgreSQL the
/// sweep removes expired rows, at most a batch a pass).
async fn an_expired_retained_message_leaves_the_store(server) {
    let p = node(&server, "test/pub").await;
    p.publish_retained("short.lived", b"1", Some(Duration::from_millis(200)))
        .await
        .unwrap();
    p.publish_retained("kept", b"2", None).await.unwrap();
    assert_eq!(server.retained_count(), 2);
    // Its ttl, then a sweep pass (the node's lease, 600 ms), and margin.
    testkit::eventually(Duration::from_millis(200 + 600 + 1000), "the expired one gone", || {
        server.retained_count() == 1
    })
    .await;
    p.close().await.unwrap();
}
}

on_both_stores! {
async fn direct_messages_reach_one_live_node(server) {
    let a = node(&server, "test/a").await;
    let b = node(&server, "test/b").await;
    let mut rx = a.inbox().unwrap();
    let sent = b.send("test/a", b"step down").await.unwrap();
    assert_eq!(sent.reached, 1);
    let m = next_msg(&mut rx).await;
    assert_eq!(
        (m.topic, m.from.as_str(), m.payload.as_slice()),
        (None, "test/b", &b"step down"[..])
    );
    let err = b.send("test/nobody", b"x").await.unwrap_err();
    assert!(
        matches!(&err, Error::NodeNotRegistered(n) if n == "test/nobody"),
        "{err}"
    );
    a.close().await.unwrap();
    b.close().await.unwrap();
}
}

on_both_stores! {
/// docs/behaviour.md N3: messages
/// published meanwhile wait in the inbox and are delivered on reconnection.
async fn short_disconnect_delivers_messages_published_meanwhile(server) {
    let proxy = Proxy::start(server.port()).await;
    let config = NodeConfig {
        lease_duration_ms: 2_000,
        heartbeat_interval_ms: 300,
        sweep_interval_ms: 2_000,
    };
    let a = node_with(&server.url_at(proxy.port), "test/a", config, InboxConfig::default()).await;
    a.subscribe("t").await.unwrap();
    let mut rx = a.inbox().unwrap();
    let p = node(&server, "test/pub").await;
    proxy.pause();
    for i in 0..5u8 {
        assert_eq!(
            p.publish("t", &[i]).await.unwrap().reached,
            1,
            "a is still live"
        );
    }
    nothing_for(&mut rx, Duration::from_millis(300)).await;
    proxy.resume();
    for i in 0..5u8 {
        let d = next(&mut rx).await;
        assert_eq!(
            d,
            Delivery::Message(Message {
                id: d_id(&d),
                topic: Some("t".into()),
                from: "test/pub".into(),
                payload: vec![i],
                retained: false
            })
        );
    }
    a.close().await.unwrap();
    p.close().await.unwrap();
}
}

fn d_id(d: &Delivery) -> u64 {
    match d {
        Delivery::Message(m) => m.id,
        Delivery::Recovered => 0,
    }
}

on_both_stores! {
/// docs/behaviour.md N4, N9: swept, then Recovered comes before any newer message, the
/// subscriptions are restored, retained messages are not replayed, and what
/// was published while it was gone is lost.
async fn paused_longer_than_lease_loses_what_was_published_meanwhile_then_recovers(server) {
    let proxy = Proxy::start(server.port()).await;
    let a = node_with(
        &server.url_at(proxy.port),
        "test/a",
        testkit::node_config(),
        InboxConfig::default(),
    )
    .await;
    let p = node(&server, "test/pub").await;
    p.publish_retained("t", b"retained", None).await.unwrap();
    a.subscribe("t").await.unwrap();
    let mut rx = a.inbox().unwrap();
    assert_eq!(next_msg(&mut rx).await.payload, b"retained");
    p.publish("t", b"before").await.unwrap();
    assert_eq!(next_msg(&mut rx).await.payload, b"before");
    let mut p_events = p.events();
    proxy.pause();
    next_event(
        &mut p_events,
        Duration::from_millis(600 + 400),
        |e| matches!(e, Event::Swept { nodes, .. } if nodes == &["test/a"]),
    )
    .await;
    assert_eq!(p.publish("t", b"while gone").await.unwrap().reached, 0);
    proxy.resume();
    assert_eq!(next(&mut rx).await, Delivery::Recovered);
    assert_eq!(
        p.store().subscriptions("test/a").await.unwrap(),
        vec!["t".to_owned()]
    );
    assert_eq!(p.publish("t", b"after").await.unwrap().reached, 1);
    let m = next_msg(&mut rx).await;
    assert_eq!(
        (m.payload.as_slice(), m.retained),
        (&b"after"[..], false),
        "no replay, nothing from while it was gone"
    );
    nothing_for(&mut rx, Duration::from_millis(200)).await;
    a.close().await.unwrap();
    p.close().await.unwrap();
}
}

on_both_stores! {
/// docs/behaviour.md N5, N6, for messaging: a crashed
/// node's subscriptions go with its sweep, a closed node's at once, and a
/// publish to either writes nothing.
async fn publishing_to_a_swept_or_closed_node_writes_nothing(server) {
    let a = node(&server, "test/a").await;
    let b = node(&server, "test/b").await;
    let p = node(&server, "test/pub").await;
    a.subscribe("t").await.unwrap();
    b.subscribe("t.>").await.unwrap();
    assert_eq!(p.publish("t", b"x").await.unwrap().reached, 1);
    drop(a); // crash: swept by b's or p's sweeper, whichever comes first
    testkit::eventually(Duration::from_millis(600 + 400), "a swept", || {
        !server.registered("test/a")
    })
    .await;
    assert_eq!(p.publish("t", b"x").await.unwrap().reached, 0);
    assert!(!server.keeps_anything_of("test/a"));
    if let Some(redis) = server.redis() {
        assert_eq!(redis.cli(&["EXISTS", "lh:topic:t:subs"]), "0");
    }
    b.close().await.unwrap();
    assert_eq!(p.publish("t.x", b"x").await.unwrap().reached, 0);
    if let Some(redis) = server.redis() {
        assert_eq!(
            redis.cli(&["SMEMBERS", "lh:patterns"]),
            "",
            "the pattern index forgets unused patterns"
        );
    }
    let err = p.send("test/b", b"x").await.unwrap_err();
    assert!(matches!(err, Error::NodeNotRegistered(_)));
    p.close().await.unwrap();
}
}

on_both_stores! {
async fn introspection_lists_nodes_subscriptions_and_group_sizes(server) {
    let a = node(&server, "test/a").await;
    let b = node(&server, "test/b").await;
    a.join("test/g1", testkit::fast()).unwrap();
    a.join("test/g2", testkit::fast()).unwrap();
    b.join("test/g1", testkit::fast()).unwrap();
    a.subscribe("x.y").await.unwrap();
    a.subscribe("x.*").await.unwrap();
    let store = a.store().clone();
    testkit::eventually(WAIT, "groups registered", || {
        server.node_field("test/a", "groups") == "test/g1,test/g2"
            && server.node_field("test/b", "groups") == "test/g1"
    })
    .await;
    let nodes = store.list_nodes().await.unwrap();
    let ids: Vec<&str> = nodes.iter().map(|n| n.id.as_str()).collect();
    assert_eq!(ids.len(), 2);
    assert!(ids.contains(&"test/a") && ids.contains(&"test/b"));
    // Whole seconds, as Redis's TIME gives them.
    let now: u64 = store.time_ms().await.unwrap() / 1000 * 1000;
    for n in &nodes {
        assert!(
            n.live && n.lease_until_ms > now && n.registered_at_ms <= n.last_heartbeat_ms,
            "{n:?}"
        );
        assert_eq!((n.backlog, n.dropped), (0, 0));
    }
    assert_eq!(
        store.subscriptions("test/a").await.unwrap(),
        vec!["x.*".to_owned(), "x.y".to_owned()]
    );
    let counts = store.nodes_per_group().await.unwrap();
    assert_eq!(counts.get("test/g1"), Some(&2));
    assert_eq!(counts.get("test/g2"), Some(&1));
    a.close().await.unwrap();
    b.close().await.unwrap();
}
}

on_both_stores! {
/// Many publishes in flight from one node travel in shared batches; each
/// message still gets its own outcome: with a bounded backlog of 50, exactly
/// 50 of 200 concurrent publishes land and the rest are refused, and direct
/// sends to a missing node fail alone.
async fn concurrent_publishes_from_one_node_keep_their_own_outcomes(server) {
    let store = silent_node(&server, "test/silent", 50, "t").await;
    let p = std::sync::Arc::new(node(&server, "test/pub").await);
    let bounded = PublishOptions {
        overflow: Overflow::Refuse,
        ..Default::default()
    };
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..200u32 {
        let p = p.clone();
        tasks.spawn(async move {
            if i % 20 == 0 {
                (i, p.send("test/nobody", b"x").await)
            } else {
                (i, p.publish_with("t", &i.to_be_bytes(), bounded).await)
            }
        });
    }
    let (mut landed, mut refused, mut missing) = (0, 0, 0);
    let mut ids = std::collections::HashSet::new();
    while let Some(done) = tasks.join_next().await {
        match done.unwrap() {
            (_, Ok(published)) => {
                assert_eq!(published.reached, 1);
                assert!(ids.insert(published.id), "ids are unique");
                landed += 1;
            }
            (_, Err(Error::InboxFull(node))) => {
                assert_eq!(node, "test/silent");
                refused += 1;
            }
            (i, Err(Error::NodeNotRegistered(_))) => {
                assert_eq!(i % 20, 0);
                missing += 1;
            }
            (_, Err(e)) => panic!("{e}"),
        }
    }
    assert_eq!((landed, refused, missing), (50, 140, 10));
    assert_eq!(store.inbox_state("test/silent").await.unwrap(), (50, 0));
    std::sync::Arc::try_unwrap(p)
        .unwrap()
        .close()
        .await
        .unwrap();
}
}

/// docs/behaviour.md N8: publish and subscribe fail with a
/// store error (no panic, nothing half-done locally), and work again once
/// Redis is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_and_subscribe_fail_while_redis_is_unreachable() {
    let mut redis = RedisServer::start();
    let a = node(&redis, "test/a").await;
    redis.kill();
    let err = a.publish("t", b"x").await.unwrap_err();
    assert!(matches!(err, Error::Store(_)), "{err}");
    let err = a.subscribe("t").await.unwrap_err();
    assert!(matches!(err, Error::Store(_)), "{err}");
    assert!(
        a.subscriptions().is_empty(),
        "a failed subscribe is not kept"
    );
    redis.restart();
    testkit::eventually(Duration::from_secs(5), "registered again", || {
        !redis.cli(&["ZSCORE", "lh:nodes", "test/a"]).is_empty()
    })
    .await;
    a.subscribe("t").await.unwrap();
    let mut rx = a.inbox().unwrap();
    assert_eq!(a.publish("t", b"back").await.unwrap().reached, 1);
    // Redis came back empty: the node registered again, and says so first.
    assert_eq!(next(&mut rx).await, Delivery::Recovered);
    assert_eq!(next_msg(&mut rx).await.payload, b"back");
    a.close().await.unwrap();
}

on_both_stores! {
/// An application that stops draining its inbox still steps down when the
/// controller asks: engine commands travel in a stream of their own, which
/// the reader keeps reading while the application's buffer is full, and
/// which the inbox limit never trims.
async fn a_step_down_is_not_held_up_by_an_undrained_inbox(server) {
    let cfg = testkit::fast();
    let stalled = node_with(
        &server.url(),
        "test/stalled",
        testkit::node_config(),
        InboxConfig::with_max_length(50),
    )
    .await;
    // Taken and never read: the application has stopped draining.
    let _inbox = stalled.inbox().unwrap();
    let group = stalled.join("test/group", cfg).unwrap();
    testkit::eventually(Duration::from_secs(3), "it leads", || group.is_leader()).await;
    let controller = node(&server, "test/controller").await;
    // More than the reader's buffer and the inbox's limit together.
    let n = leasehold_engine::config::INBOX_BUFFER as u64 + 50 + 20;
    for i in 0..n {
        controller
            .send("test/stalled", format!("m{i}").as_bytes())
            .await
            .unwrap();
    }
    testkit::eventually_async(Duration::from_secs(3), "the buffer filled up", || async {
        let (backlog, dropped) = server.store().inbox_state("test/stalled").await.unwrap();
        backlog == 50 && dropped > 0
    })
    .await;
    controller
        .ask_to_step_down("test/stalled", "test/group")
        .await
        .unwrap();
    // Read within one stalled read (100 ms), plus a retry interval of margin.
    testkit::eventually(
        Duration::from_millis(100) + cfg.retry_interval() * 2,
        "the stalled node stepped down",
        || testkit::role(&group) == leasehold_engine::Role::Abstaining,
    )
    .await;
    stalled.close().await.unwrap();
    controller.close().await.unwrap();
}
}

/// A node registered by an older version (its hash has no `commands=stream`)
/// reads commands from its inbox only: it still gets them there, and a
/// current node gets them in its command stream, not its inbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_reach_older_nodes_through_their_inbox() {
    let redis = RedisServer::start();
    let store = redis.store();
    test_hooks::register_node(&store, "test/old", "old", 60_000, &[])
        .await
        .unwrap();
    let current = node(&redis, "test/new").await;
    let controller = node(&redis, "test/controller").await;
    controller
        .ask_to_step_down("test/old", "test/group")
        .await
        .unwrap();
    assert_eq!(redis.cli(&["XLEN", "lh:node:test/old:inbox"]), "1");
    assert_eq!(redis.cli(&["EXISTS", "lh:node:test/old:commands"]), "0");
    let entry = redis.cli(&["XRANGE", "lh:node:test/old:inbox", "-", "+"]);
    assert!(
        entry.contains("command") && entry.contains("stepDown"),
        "{entry}"
    );
    // A current node's command goes to its command stream (which its
    // reader takes and trims); nothing lands in its inbox.
    controller
        .ask_to_step_down("test/new", "test/group")
        .await
        .unwrap();
    assert_eq!(redis.cli(&["XLEN", "lh:node:test/new:inbox"]), "0");
    assert_eq!(
        redis.cli(&["HGET", "lh:node:test/new", "commands"]),
        "stream"
    );
    current.close().await.unwrap();
    controller.close().await.unwrap();
}

/// A batch keeps its order, refuses itself whole when one message is
/// invalid, and otherwise gives each message its own outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_checked_whole_and_each_message_has_its_own_outcome() {
    use leasehold_engine::{Outbound, To};
    let redis = RedisServer::start();
    let inbox = InboxConfig {
        max_message_size: 1024,
        ..Default::default()
    };
    let a = node_with(&redis.url(), "test/a", testkit::node_config(), inbox).await;
    a.subscribe("t.>").await.unwrap();
    let mut rx = a.inbox().unwrap();
    let topic = |t: &str, payload: &[u8]| Outbound {
        to: To::Topic(t.into(), PublishOptions::default()),
        payload: payload.to_vec(),
    };
    let to_node = |n: &str, payload: &[u8]| Outbound {
        to: To::Node(n.into()),
        payload: payload.to_vec(),
    };

    // One invalid message anywhere: nothing of the batch is written.
    for (bad, index) in [
        (topic("t..x", b"x"), 1),
        (topic("t.x", &[0u8; 1025]), 1),
        (to_node("", b"x"), 1),
    ] {
        let err = a
            .publish_all(vec![topic("t.a", b"ok"), bad, topic("t.b", b"ok")])
            .await
            .unwrap_err();
        assert!(
            matches!(&err, Error::InBatch { index: i, .. } if *i == index),
            "{err}"
        );
        assert!(
            err.to_string()
                .starts_with("message 1 of the batch (counting from 0): "),
            "{err}"
        );
    }
    nothing_for(&mut rx, Duration::from_millis(200)).await;
    assert_eq!(redis.cli(&["GET", "lh:msgseq"]), "", "nothing was written");

    // 300 messages (more than one publisher batch) arrive in order; a send
    // to a node that is not live fails alone.
    let mut batch: Vec<Outbound> = (0..300u32)
        .map(|i| topic("t.n", &i.to_be_bytes()))
        .collect();
    batch.insert(150, to_node("test/gone", b"x"));
    batch.push(to_node("test/a", b"direct"));
    let results = a.publish_all(batch).await.unwrap();
    assert_eq!(results.len(), 302);
    assert!(
        matches!(&results[150], Err(Error::NodeNotRegistered(n)) if n == "test/gone"),
        "{:?}",
        results[150]
    );
    let ids: Vec<u64> = results
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 150)
        .map(|(_, r)| r.as_ref().unwrap().id)
        .collect();
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "ids rise in batch order"
    );
    for i in 0..300u32 {
        let m = next_msg(&mut rx).await;
        assert_eq!(m.payload, i.to_be_bytes(), "message {i} in order");
    }
    let m = next_msg(&mut rx).await;
    assert_eq!((m.topic, m.payload), (None, b"direct".to_vec()));
    a.close().await.unwrap();
}

on_both_stores! {
/// A reader that takes and acks while publishers drop the oldest entries of
/// its full inbox: every message is either delivered, once and in order,
/// or counted as dropped. (On PostgreSQL a publisher counts a queue it
/// finds full exactly, holding off the acks for that moment: a trim and an
/// ack never both take an entry, nor wait for each other in a cycle.)
async fn drops_and_acks_at_once_lose_nothing_silently(server) {
    use leasehold_engine::{Outbound, To};
    let sub = node_with(
        &server.url(),
        "test/sub",
        testkit::node_config(),
        InboxConfig::with_max_length(20),
    )
    .await;
    sub.subscribe("t").await.unwrap();
    let mut inbox = sub.inbox().unwrap();
    let p = node(&server, "test/pub").await;
    let sent = 3_000u32;
    let publisher = tokio::spawn(async move {
        for b in 0..sent / 50 {
            let batch = (0..50)
                .map(|i| Outbound {
                    to: To::Topic("t".into(), PublishOptions::default()),
                    payload: (b * 50 + i).to_be_bytes().to_vec(),
                })
                .collect();
            for r in p.publish_all(batch).await.unwrap() {
                r.unwrap();
            }
        }
        p
    });
    let (mut received, mut last) = (0u32, None);
    loop {
        match tokio::time::timeout(Duration::from_millis(500), inbox.recv()).await {
            Ok(Some(Delivery::Message(m))) => {
                let n = u32::from_be_bytes(m.payload[..4].try_into().unwrap());
                assert!(last.is_none_or(|l| n > l), "{n} after {last:?}");
                (received, last) = (received + 1, Some(n));
                // A consumer slower than the publisher: the inbox fills.
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            Ok(other) => panic!("{other:?}"),
            Err(_) if publisher.is_finished() => break,
            Err(_) => {}
        }
    }
    let p = publisher.await.unwrap();
    let (_, dropped) = server.store().inbox_state("test/sub").await.unwrap();
    assert!(dropped > 0, "the inbox never filled: nothing was tested");
    assert_eq!(
        u64::from(received) + dropped,
        u64::from(sent),
        "{received} received and {dropped} dropped"
    );
    sub.close().await.unwrap();
    p.close().await.unwrap();
}
}
