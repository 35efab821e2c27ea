//! Messaging through the agent's local API, with real agent processes on a
//! real redis-server: publishing and direct sends through one agent, the
//! inbox read from another as an event stream and by long-poll, wildcards
//! and retained messages, the recovery notice, a client that stops reading,
//! the payload limit, and bad requests refused with the field named.

use leasehold_testkit as testkit;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::Value;
use testkit::agent::{args, get, post_body, request, Agent};
use testkit::http::{EventStream, ServerEvent};
use testkit::{free_port, RedisServer};

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

async fn agent(redis: &RedisServer, id: &str, extra: &[&str]) -> Agent {
    let port = free_port();
    let mut flags = args(id, &redis.url(), port, "g");
    flags.extend(extra.iter().map(|s| s.to_string()));
    Agent::start(id, port, flags).await
}

async fn publish(from: &Agent, query: &str, payload: &[u8]) -> Value {
    let (code, body) = post_body(from.port, &format!("/v1/publish?{query}"), payload).await;
    assert_eq!(code, 200, "publish {query}: {body}");
    serde_json::from_str(&body).expect("JSON")
}

/// The next event, within two seconds.
async fn next(stream: &mut EventStream) -> ServerEvent {
    tokio::time::timeout(Duration::from_secs(2), stream.next())
        .await
        .expect("an event within 2s")
        .expect("the stream goes on")
}

fn data(event: &ServerEvent) -> Value {
    serde_json::from_str(&event.data).expect("event data is JSON")
}

async fn long_poll(port: u16, query: &str) -> Value {
    let (code, body) = get(port, &format!("/v1/inbox?{query}")).await;
    assert_eq!(code, 200, "long-poll {query}: {body}");
    serde_json::from_str(&body).expect("JSON")
}

/// Long-polls with this client's cursor (kept between calls) until `n`
/// messages came or `limit` passed.
async fn poll_messages(
    port: u16,
    cursor: &mut Option<String>,
    n: usize,
    limit: Duration,
) -> Vec<Value> {
    let deadline = Instant::now() + limit;
    let mut out = Vec::new();
    while out.len() < n && Instant::now() < deadline {
        let query = match cursor {
            Some(c) => format!("after={c}&wait=500"),
            None => "wait=500".to_owned(),
        };
        let answer = long_poll(port, &query).await;
        *cursor = answer["cursor"].as_str().map(str::to_owned);
        for item in answer["items"].as_array().into_iter().flatten() {
            if item["type"] == "message" {
                out.push(item.clone());
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_through_one_agent_reaches_anothers_stream_and_long_poll_in_order() {
    let redis = RedisServer::start();
    let a = agent(&redis, "t/a", &[]).await;
    let b = agent(&redis, "t/b", &["--subscribe=orders.>"]).await;
    let mut stream = EventStream::open(addr(b.port), "/v1/inbox/events", None)
        .await
        .unwrap();
    for i in 0..20 {
        let answer = publish(&a, "topic=orders.eu.created", format!("m{i}").as_bytes()).await;
        assert_eq!(answer["reached"], 1, "{answer}");
    }
    let mut first_id = None;
    for i in 0..20 {
        let event = next(&mut stream).await;
        assert_eq!(event.event, "message");
        let m = data(&event);
        assert_eq!(
            (
                m["payload"].as_str(),
                m["topic"].as_str(),
                m["from"].as_str()
            ),
            (
                Some(&*format!("m{i}")),
                Some("orders.eu.created"),
                Some("t/a")
            ),
            "{m}"
        );
        first_id.get_or_insert(event.id.clone().expect("an id"));
    }
    let first_id = first_id.unwrap();
    // A client that reconnects with the last id it saw gets what followed,
    // from the agent's log (the inbox in Redis has been read).
    let mut again = EventStream::open(addr(b.port), "/v1/inbox/events", Some(&first_id))
        .await
        .unwrap();
    assert_eq!(data(&next(&mut again).await)["payload"], "m1");
    drop(again);
    // So does a long-poll, from the first event on, in the same order.
    let answer = long_poll(b.port, &format!("after={first_id}&wait=0")).await;
    let payloads: Vec<&str> = answer["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["payload"].as_str().unwrap())
        .collect();
    let expected: Vec<String> = (1..20).map(|i| format!("m{i}")).collect();
    assert_eq!(payloads, expected);
    // Long-poll waits for what comes next; both clients get it.
    let mut cursor = answer["cursor"].as_str().map(str::to_owned);
    let waiting = tokio::spawn(async move {
        let got = poll_messages(b.port, &mut cursor, 2, Duration::from_secs(5)).await;
        (b, got)
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    publish(&a, "topic=orders.us.created", b"text").await;
    publish(&a, "topic=orders.us.created", &[0xff, 0x00, 0x01]).await;
    let (b, got) = waiting.await.unwrap();
    assert_eq!(got[0]["payload"], "text");
    assert_eq!(
        got[1]["payloadBase64"], "/wAB",
        "bytes that are not UTF-8 come as base64"
    );
    assert!(got[1].get("payload").is_none());
    assert_eq!(data(&next(&mut stream).await)["payload"], "text");
    assert_eq!(data(&next(&mut stream).await)["payloadBase64"], "/wAB");
    // A direct message to one node.
    let (code, body) = post_body(a.port, "/v1/send?node=t%2Fb", b"just you").await;
    assert_eq!(code, 200, "{body}");
    let direct = data(&next(&mut stream).await);
    assert_eq!(
        (direct["payload"].as_str(), direct["topic"].is_null()),
        (Some("just you"), true)
    );
    // The status counts what was handed to clients.
    let (_, status) = get(b.port, "/v1/status").await;
    let status: Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["inbox"]["received"], 23);
    // SIGTERM with a client still on the stream: the agent ends the stream,
    // exits 0 and removes its registration at once.
    let mut b = b;
    b.signal(testkit::Signal::SIGTERM);
    let exit = b
        .exited_within(Duration::from_secs(5))
        .await
        .expect("b exits within 5 s");
    assert!(exit.success(), "{exit}");
    let ended = tokio::time::timeout(Duration::from_secs(2), stream.next()).await;
    assert!(
        matches!(ended, Ok(None)),
        "the stream did not end: {ended:?}"
    );
    let nodes = redis.store().list_nodes().await.unwrap();
    assert!(
        nodes.iter().all(|n| n.id != "t/b"),
        "t/b still registered: {nodes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wildcards_and_retained_messages_work_through_the_api() {
    let redis = RedisServer::start();
    let a = agent(&redis, "t/a", &[]).await;
    let b = agent(&redis, "t/b", &[]).await;
    publish(&a, "topic=config.db&retain=true", b"v1").await;
    publish(&a, "topic=config.tmp&retain=true&retainTtlMs=1", b"gone").await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (code, body) = request(b.port, "POST", "/v1/subscriptions?pattern=config.*").await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["subscriptions"],
        serde_json::json!(["config.*"])
    );
    let mut stream = EventStream::open(addr(b.port), "/v1/inbox/events", None)
        .await
        .unwrap();
    let retained = data(&next(&mut stream).await);
    assert_eq!(
        (retained["payload"].as_str(), retained["retained"].as_bool()),
        (Some("v1"), Some(true)),
        "{retained}"
    );
    for topic in ["config.cache", "other.cache", "config.a.b", "config.db"] {
        publish(&a, &format!("topic={topic}"), topic.as_bytes()).await;
    }
    let got: Vec<String> = [next(&mut stream).await, next(&mut stream).await]
        .iter()
        .map(|e| data(e)["topic"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        got,
        ["config.cache", "config.db"],
        "`*` is one segment; other topics stay out"
    );
    // `>` for the rest; unsubscribing stops delivery.
    request(b.port, "POST", "/v1/subscriptions?pattern=config.%3E").await;
    request(b.port, "DELETE", "/v1/subscriptions?pattern=config.*").await;
    let (_, body) = get(b.port, "/v1/subscriptions").await;
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["subscriptions"],
        serde_json::json!(["config.>"])
    );
    // A new subscription covering a retained message gets it first.
    let again = data(&next(&mut stream).await);
    assert_eq!(
        (again["topic"].as_str(), again["retained"].as_bool()),
        (Some("config.db"), Some(true)),
        "{again}"
    );
    publish(&a, "topic=config.a.b", b"deep").await;
    let deep = data(&next(&mut stream).await);
    assert_eq!(deep["topic"], "config.a.b");
    request(b.port, "DELETE", "/v1/subscriptions?pattern=config.%3E").await;
    publish(&a, "topic=config.a.b", b"unheard").await;
    let nothing = tokio::time::timeout(Duration::from_millis(800), stream.next()).await;
    assert!(
        nothing.is_err(),
        "a message after the unsubscribe: {nothing:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovery_is_signalled_to_the_client_before_newer_messages() {
    let redis = RedisServer::start();
    let a = agent(&redis, "t/a", &[]).await;
    let b = agent(&redis, "t/b", &["--subscribe=news", "--node-lease-ms=1000"]).await;
    let mut stream = EventStream::open(addr(b.port), "/v1/inbox/events", None)
        .await
        .unwrap();
    publish(&a, "topic=news", b"before").await;
    assert_eq!(data(&next(&mut stream).await)["payload"], "before");
    // Paused for more than its node lease: its registration expires.
    b.signal(testkit::Signal::SIGSTOP);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let lost = publish(&a, "topic=news", b"while gone").await;
    assert_eq!(lost["reached"], 0, "published while b was not registered");
    b.signal(testkit::Signal::SIGCONT);
    // Once it is back, a publish reaches it.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut n = 0;
    loop {
        n += 1;
        let answer = publish(&a, "topic=news", format!("after {n}").as_bytes()).await;
        if answer["reached"] == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "b never registered again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let recovered = next(&mut stream).await;
    assert_eq!(
        recovered.event, "recovered",
        "the first event after the pause: {recovered:?}"
    );
    let after = next(&mut stream).await;
    assert_eq!(
        (after.event.as_str(), data(&after)["payload"].as_str()),
        ("message", Some(&*format!("after {n}")))
    );
}

/// Resident memory of a process, KiB.
fn rss_kib(pid: u32) -> u64 {
    let (resident, _) = testkit::procfs::memory_kib(pid);
    assert!(resident > 0, "no VmRSS for {pid}");
    resident
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_reads_nothing_for_a_minute_leaves_the_agents_memory_flat() {
    let redis = RedisServer::start();
    let a = agent(&redis, "t/a", &[]).await;
    let b = agent(
        &redis,
        "t/b",
        &["--subscribe=bulk", "--inbox-max-length=200"],
    )
    .await;
    // A client that connects to the stream and never reads from it.
    let mut stalled = std::net::TcpStream::connect(addr(b.port)).unwrap();
    stalled
        .write_all(
            b"GET /v1/inbox/events HTTP/1.1\r\nHost: agent\r\nAccept: text/event-stream\r\n\r\n",
        )
        .unwrap();
    let payload = vec![b'x'; 10 * 1024];
    let start = Instant::now();
    let mut early = None;
    let mut sent = 0u64;
    while start.elapsed() < Duration::from_secs(60) {
        for _ in 0..10 {
            publish(&a, "topic=bulk", &payload).await;
            sent += 1;
        }
        if early.is_none() && start.elapsed() > Duration::from_secs(10) {
            early = Some(rss_kib(b.pid()));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let late = rss_kib(b.pid());
    let early = early.unwrap();
    println!("{sent} messages of 10 KiB published in 60 s; agent RSS {early} KiB at 10 s, {late} KiB at 60 s");
    assert!(
        late <= early + 4 * 1024,
        "the agent's memory grew from {early} KiB to {late} KiB while its client read nothing"
    );
    // Redis kept the backlog at its limit, dropped the oldest and counted them.
    let nodes = redis.store().list_nodes().await.unwrap();
    let node = nodes.iter().find(|n| n.id == "t/b").unwrap();
    println!(
        "inbox in Redis: backlog {}, dropped {}",
        node.backlog, node.dropped
    );
    assert!(
        node.backlog <= 200,
        "backlog {} over the limit",
        node.backlog
    );
    assert!(
        node.dropped > 0 && node.dropped < sent,
        "dropped {} of {sent}",
        node.dropped
    );
    // The client reads again: first what was on its way to it, then the
    // drops it was told of, in order.
    let text = tokio::task::spawn_blocking(move || {
        stalled
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut seen = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            let n = stalled.read(&mut buf).unwrap_or(0);
            seen.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&seen);
            if let Some(at) = text.find("event: dropped\ndata: ") {
                return text[at..].lines().nth(1).map(str::to_owned);
            }
            if n == 0 {
                break;
            }
        }
        None
    })
    .await
    .unwrap()
    .expect("a dropped event once the client reads again");
    let dropped: Value = serde_json::from_str(text.trim_start_matches("data: ")).unwrap();
    assert!(dropped["total"].as_u64().unwrap() > 0, "{dropped}");
    // Nothing is lost silently: with a reader on the inbox, every message
    // is handed to a client or was dropped and counted.
    let dropped = redis
        .store()
        .list_nodes()
        .await
        .unwrap()
        .into_iter()
        .find(|n| n.id == "t/b")
        .unwrap()
        .dropped;
    let mut cursor = None;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, status) = get(b.port, "/v1/status").await;
        let received = serde_json::from_str::<Value>(&status).unwrap()["inbox"]["received"]
            .as_u64()
            .unwrap();
        if received + dropped == sent {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "handed out {received}, dropped {dropped}, published {sent}: some were lost"
        );
        poll_messages(b.port, &mut cursor, 1000, Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payloads_at_the_limit_pass_and_one_byte_over_is_refused_with_413() {
    let redis = RedisServer::start();
    let a = agent(&redis, "t/a", &[]).await;
    let b = agent(&redis, "t/b", &["--subscribe=big"]).await;
    let limit = 512 * 1024;
    let answer = publish(&a, "topic=big", &vec![b'y'; limit]).await;
    assert_eq!(answer["reached"], 1);
    let mut cursor = None;
    let got = poll_messages(b.port, &mut cursor, 1, Duration::from_secs(5)).await;
    assert_eq!(got[0]["payload"].as_str().map(str::len), Some(limit));
    let (code, body) = post_body(a.port, "/v1/publish?topic=big", &vec![b'y'; limit + 1]).await;
    assert_eq!(code, 413, "{body}");
    let refusal: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (refusal["size"].as_u64(), refusal["max"].as_u64()),
        (Some(limit as u64 + 1), Some(limit as u64)),
        "{refusal}"
    );
    assert!(
        refusal["error"]
            .as_str()
            .unwrap()
            .contains("max_message_size"),
        "{refusal}"
    );
    let again = poll_messages(b.port, &mut cursor, 1, Duration::from_millis(600)).await;
    assert!(again.is_empty(), "a refused publish was delivered");
    // More waiting than the agent's log holds (20 x 512 KiB > 8 MiB): a
    // reader that asks for all of it at once still gets every message, in
    // answers of about 4 MiB, and is never told it missed any.
    for i in 0..20u8 {
        publish(&a, "topic=big", &vec![b'a' + i; limit]).await;
    }
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while got.len() < 20 && Instant::now() < deadline {
        let answer = long_poll(
            b.port,
            &format!("after={}&wait=500&max=1000", cursor.clone().unwrap()),
        )
        .await;
        assert_eq!(
            answer["missed"], 0,
            "a reader lost messages it had not seen"
        );
        cursor = answer["cursor"].as_str().map(str::to_owned);
        got.extend(
            answer["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m["payload"].as_str().unwrap().as_bytes()[0]),
        );
    }
    let expected: Vec<u8> = (0..20u8).map(|i| b'a' + i).collect();
    assert_eq!(got, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_messaging_requests_are_refused_with_the_field_named() {
    let redis = RedisServer::start();
    let a = agent(&redis, "t/a", &[]).await;
    for (method, path, status, words) in [
        ("POST", "/v1/publish", 400, "topic"),
        ("POST", "/v1/publish?topic=a..b", 400, "a..b"),
        ("POST", "/v1/publish?topic=a.*", 400, "wildcards"),
        (
            "POST",
            "/v1/publish?topic=a&retainTtlMs=5",
            400,
            "retainTtlMs needs retain=true",
        ),
        (
            "POST",
            "/v1/publish?topic=a&retain=true&retainTtlMs=0",
            400,
            "retainTtlMs",
        ),
        ("POST", "/v1/publish?topic=a&overflow=keep", 400, "overflow"),
        ("POST", "/v1/send?node=t%2Fnobody", 404, "t/nobody"),
        ("GET", "/v1/inbox?wait=999999", 400, "wait"),
        ("GET", "/v1/inbox?max=0", 400, "max"),
        ("GET", "/v1/inbox?after=nonsense", 400, "RUN-SEQ"),
        ("POST", "/v1/subscriptions?pattern=a.%3E.b", 400, "a.>.b"),
        ("POST", "/v1/subscriptions", 400, "pattern"),
        ("PUT", "/v1/subscriptions", 405, "GET, POST or DELETE"),
        ("GET", "/v1/publish", 405, "POST"),
    ] {
        let (code, body) = request(a.port, method, path).await;
        assert_eq!(code, status, "{method} {path}: {body}");
        assert!(
            body.contains(words),
            "{method} {path}: {body} does not name {words:?}"
        );
    }
    // HEAD is not GET: it is refused at once, and starts no long-poll.
    let started = Instant::now();
    let (code, _) = request(a.port, "HEAD", "/v1/inbox?wait=5000").await;
    assert_eq!(code, 405);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    // A browser page may not read the inbox or publish.
    let (code, body) = testkit::http::request_with(
        addr(a.port),
        "POST",
        "/v1/publish?topic=a",
        &[("origin", "https://example.test")],
        bytes::Bytes::new(),
        Duration::from_secs(2),
    )
    .await
    .unwrap();
    assert_eq!(code, 403, "{body}");
    // Flags are checked before the agent starts.
    for (flag, words) in [
        ("--subscribe=a..b", "--subscribe"),
        ("--inbox-max-length=0", "--inbox-max-length"),
        ("--inbox-max-length=0", "from 1 to 10000000"),
        ("--inbox-lag-threshold=20000", "--inbox-lag-threshold"),
        ("--inbox-lag-threshold=20000", "from 1 to 10000"),
    ] {
        let port = free_port().to_string();
        let (status, stderr) = testkit::agent::run_to_end(&[
            "agent",
            "--redis-url",
            &redis.url(),
            "--node-id",
            "t/x",
            "--group",
            "g",
            "--listen",
            &format!("127.0.0.1:{port}"),
            flag,
        ]);
        assert!(!status.success(), "{flag} accepted");
        assert!(stderr.contains(words), "{flag}: {stderr}");
    }
}

async fn post_json(port: u16, path: &str, body: &Value) -> (u16, Value) {
    let (code, text) = post_body(port, path, body.to_string().as_bytes()).await;
    let value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("JSON: {text}"));
    (code, value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_publishes_in_order_or_is_refused_whole() {
    use serde_json::json;
    let redis = RedisServer::start();
    let a = agent(&redis, "t/a", &[]).await;
    let b = agent(&redis, "t/b", &["--subscribe=jobs.>"]).await;
    let mut stream = EventStream::open(addr(b.port), "/v1/inbox/events", None)
        .await
        .unwrap();

    // 250 messages in one request: text and base64 payloads, a retained
    // message and a direct send, delivered in the batch's order.
    let mut messages: Vec<Value> = (0..247)
        .map(|i| json!({ "topic": "jobs.run", "payload": format!("j{i}") }))
        .collect();
    messages.push(json!({ "topic": "jobs.bin", "payloadBase64": "/wA=" }));
    messages.push(
        json!({ "topic": "jobs.last", "payload": "kept", "retain": true, "retainTtlMs": 60000 }),
    );
    messages.push(json!({ "node": "t/b", "payload": "direct" }));
    let (code, answer) = post_json(
        a.port,
        "/v1/publish/batch",
        &json!({ "messages": messages }),
    )
    .await;
    assert_eq!(code, 200, "{answer}");
    let results = answer["results"].as_array().unwrap();
    assert_eq!(results.len(), 250);
    assert!(results.iter().all(|r| r["reached"] == 1), "{answer}");
    for (i, result) in results.iter().take(247).enumerate() {
        let m = data(&next(&mut stream).await);
        assert_eq!(m["payload"], format!("j{i}"), "{m}");
        assert_eq!(m["id"], result["id"]);
    }
    assert_eq!(data(&next(&mut stream).await)["payloadBase64"], "/wA=");
    assert_eq!(data(&next(&mut stream).await)["payload"], "kept");
    let direct = data(&next(&mut stream).await);
    assert_eq!(
        (direct["payload"].as_str(), direct["topic"].as_str()),
        (Some("direct"), None)
    );
    // The retained one reaches a subscriber that comes later.
    let (code, body) = request(a.port, "POST", "/v1/subscriptions?pattern=jobs.last").await;
    assert_eq!(code, 200, "{body}");
    let items = poll_messages(a.port, &mut None, 1, Duration::from_secs(3)).await;
    assert_eq!(items[0]["payload"], "kept", "{items:?}");
    assert_eq!(items[0]["retained"], true, "{items:?}");

    // A batch with one bad message is refused whole, naming it.
    let ok = json!({ "topic": "jobs.run", "payload": "never" });
    for (bad, status, words) in [
        (
            json!({ "topic": "jobs..x", "payload": "x" }),
            400,
            "messages[1]: ",
        ),
        (
            json!({ "payload": "x" }),
            400,
            "messages[1] has no destination",
        ),
        (
            json!({ "topic": "a", "node": "t/b", "payload": "x" }),
            400,
            "messages[1] has both topic and node",
        ),
        (json!({ "topic": "a" }), 400, "messages[1] has no payload"),
        (
            json!({ "topic": "a", "payloadBase64": "%%" }),
            400,
            "messages[1].payloadBase64",
        ),
        (
            json!({ "topic": "a", "payload": "x", "overflow": "keep" }),
            400,
            "messages[1].overflow",
        ),
        (
            json!({ "topic": "a", "payload": "x", "retainTtlMs": 5 }),
            400,
            "messages[1].retainTtlMs needs \"retain\": true in messages[1]",
        ),
        (
            json!({ "topic": "a", "payload": "x", "retain": true, "retainTtlMs": 0 }),
            400,
            "messages[1].retainTtlMs = 0 is out of range",
        ),
        (
            json!({ "node": "t/b", "payload": "x", "retain": true }),
            400,
            "topics only",
        ),
        (
            json!({ "topic": "a", "payload": "x", "colour": "red" }),
            400,
            "unknown field `colour`",
        ),
        (
            json!({ "topic": "a", "payloadBase64": "A".repeat(699_052) }),
            413,
            "messages[1]: ",
        ),
    ] {
        let (code, answer) = post_json(
            a.port,
            "/v1/publish/batch",
            &json!({ "messages": [ok, bad, ok] }),
        )
        .await;
        assert_eq!(code, status, "{answer}");
        let text = answer["error"].as_str().unwrap();
        assert!(text.contains(words), "{text} does not say {words:?}");
        assert_eq!(answer["index"], 1, "{answer}");
    }
    let too_many: Vec<Value> = (0..1001).map(|_| ok.clone()).collect();
    let (code, answer) = post_json(
        a.port,
        "/v1/publish/batch",
        &json!({ "messages": too_many }),
    )
    .await;
    assert_eq!(code, 400, "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .contains("messages has 1001 entries: a batch holds at most 1000"),
        "{answer}"
    );
    let (code, body) = post_body(a.port, "/v1/publish/batch", b"[1, 2]").await;
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("messages"), "{body}");
    // Nothing of those reached the subscriber.
    if let Ok(Some(event)) = tokio::time::timeout(Duration::from_millis(300), stream.next()).await {
        panic!("a refused batch delivered {event:?}");
    }

    // Past the checks, each message has its own outcome. One published is
    // 200 (resending the batch would publish it twice), with `failed`.
    let (code, answer) = post_json(
        a.port,
        "/v1/publish/batch",
        &json!({ "messages": [
            { "topic": "jobs.run", "payload": "before" },
            { "node": "t/nobody", "payload": "x" },
            { "topic": "jobs.run", "payload": "after" },
        ] }),
    )
    .await;
    assert_eq!(code, 200, "{answer}");
    assert_eq!(answer["failed"], 1, "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .starts_with("1 of 3 messages failed; the first, messages[1]"),
        "{answer}"
    );
    assert_eq!(answer["results"][1]["status"], 404, "{answer}");
    assert_eq!(answer["results"][0]["reached"], 1, "{answer}");
    assert_eq!(data(&next(&mut stream).await)["payload"], "before");
    assert_eq!(data(&next(&mut stream).await)["payload"], "after");
    // None published: the first failure's status, and nothing delivered.
    let (code, answer) = post_json(
        a.port,
        "/v1/publish/batch",
        &json!({ "messages": [
            { "node": "t/nobody", "payload": "x" },
            { "node": "t/nobody", "payload": "y" },
        ] }),
    )
    .await;
    assert_eq!(code, 404, "{answer}");
    assert_eq!(answer["failed"], 2, "{answer}");
    let (code, answer) = post_json(a.port, "/v1/publish/batch", &json!({ "messages": [] })).await;
    assert_eq!((code, &answer["failed"]), (200, &json!(0)), "{answer}");

    let (code, body) = request(a.port, "GET", "/v1/publish/batch").await;
    assert_eq!((code, body.contains("POST")), (405, true), "{body}");
    let (code, body) = testkit::http::request_with(
        addr(a.port),
        "POST",
        "/v1/publish/batch",
        &[("origin", "https://example.test")],
        bytes::Bytes::from(json!({ "messages": [ok] }).to_string()),
        Duration::from_secs(2),
    )
    .await
    .unwrap();
    assert_eq!(code, 403, "{body}");
}

/// An agent whose `--subscribe` Redis refuses exits with the flag named and
/// leaves no registration behind (before: it stayed until its lease ran
/// out, a live node that nobody ran).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscribe_refused_at_start_leaves_no_registration() {
    let redis = RedisServer::start();
    // A user that may use every key but the index of retained topics
    // (`lh:retained`), which only a pattern subscription reads: registering
    // and unregistering work, subscribing to `a.>` fails.
    redis.cli(&[
        "ACL",
        "SETUSER",
        "narrow",
        "on",
        ">pw",
        "~lh:node*",
        "~lh:born",
        "~lh:history",
        "~lh:epoch",
        "~lh:events",
        "~lh:msgseq",
        "~lh:patterns",
        "~lh:topic:*",
        "~lh:g:*",
        "&*",
        "+@all",
    ]);
    let url = redis.url().replacen("redis://", "redis://narrow:pw@", 1);
    let port = free_port();
    let mut flags = args("t/narrow", &url, port, "g");
    flags.push("--subscribe=a.>".into());
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let (status, stderr) = testkit::agent::run_to_end(&flags);
    assert!(!status.success(), "the agent started: {stderr}");
    assert!(stderr.contains("--subscribe \"a.>\""), "{stderr}");
    assert_eq!(
        redis.cli(&["EXISTS", "lh:node:t/narrow"]),
        "0",
        "the registration is left behind: {stderr}"
    );
    assert_eq!(redis.cli(&["ZSCORE", "lh:nodes", "t/narrow"]), "");
}
