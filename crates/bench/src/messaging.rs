//! Messaging figures: latency, throughput, fan-out, and idle cost.
//!
//! Latency is one message at a time, judged against the floor the spec
//! sets: its own publish (the engine's publish.lua, which must read every
//! subscriber's lease, inbox limit and entry format) called by `EVALSHA`
//! and an `XREAD BLOCK` on the subscriber's inbox, with no engine between
//! them. leasehold's p99 may be at most 1.2 times that floor's
//! (`SPEC_FLOOR_RATIO`). Beside it the bare floor, an `XADD` and the same
//! read, is shown and not judged: no implementation of the spec can reach
//! it. Each message of leasehold's is timed right after one of each floor
//! (`StreamFloor`), so all three see the same machine at the same moment.

use leasehold_testkit::Signal;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};
use leasehold_engine::{InboxConfig, Node, NodeConfig, NodeOptions, Store};
use redis::aio::MultiplexedConnection;
use redis::streams::StreamReadReply;
use redis::{AsyncConnectionConfig, FromRedisValue as _, Value};

use super::args::BenchArgs;
use super::commandstats;
use super::report::{ms, percentile, prefix, progress, Row};

async fn start(
    url: &str,
    prefix: &str,
    id: &str,
    lease_ms: u64,
    inbox: InboxConfig,
) -> anyhow::Result<Node> {
    let store = Store::connect(url, prefix).map_err(anyhow::Error::msg)?;
    let options = NodeOptions {
        inbox,
        ..Default::default()
    };
    Node::start_with(store, id, NodeConfig::with_lease(lease_ms), options)
        .await
        .map_err(anyhow::Error::msg)
}

/// The subscribers' inbox bound in the throughput steps: past any step's
/// default count, so that nothing is dropped.
const BIG_INBOX: u64 = 1_000_000;

/// `in_flight` workers publish `n` messages between them, each one at a time,
/// so `in_flight` publishes are outstanding at any moment.
fn spawn_publishers(
    publisher: Arc<Node>,
    topic: &'static str,
    n: u64,
    in_flight: usize,
) -> tokio::task::JoinHandle<anyhow::Result<()>> {
    tokio::spawn(async move {
        let workers = in_flight.max(1) as u64;
        let mut tasks = tokio::task::JoinSet::new();
        for w in 0..workers {
            let publisher = publisher.clone();
            tasks.spawn(async move {
                let mut i = w;
                while i < n {
                    publisher
                        .publish(topic, &i.to_be_bytes())
                        .await
                        .map_err(anyhow::Error::msg)?;
                    i += workers;
                }
                Ok::<(), anyhow::Error>(())
            });
        }
        while let Some(done) = tasks.join_next().await {
            done??;
        }
        Ok(())
    })
}

// A scenario read top to bottom: its steps in the order they run.
#[allow(clippy::too_many_lines)]
pub async fn run(url: &str, args: &BenchArgs) -> anyhow::Result<Vec<Row>> {
    // The peer first, so that it meets the machine as leasehold does: no
    // nodes of leasehold's are running meanwhile.
    let relay = match super::local::name(url) {
        "Redis" => super::peers::relay(url, args).await?,
        _ => None,
    };
    let prefix = prefix();
    let big = InboxConfig::with_max_length(BIG_INBOX);
    let sub = start(url, &prefix, "bench/sub", 30_000, big).await?;
    let publisher = Arc::new(start(url, &prefix, "bench/pub", 30_000, big).await?);
    sub.subscribe("bench.t").await.map_err(anyhow::Error::msg)?;
    let mut inbox = sub.inbox().context("inbox taken")?;
    let mut rows = Vec::new();

    // 1. One message at a time: publish, wait for its delivery, repeat;
    // on Redis each one beside the two floors (StreamFloor), so that all
    // three see the same machine at the same moment.
    progress(&format!(
        "latency, {} messages one at a time, each beside the spec's publish and a bare stream ping-pong",
        args.latency_messages
    ));
    let mut floors = match super::local::name(url) {
        "Redis" => Some((
            StreamFloor::spec(url, &prefix).await?,
            StreamFloor::bare(url, &format!("{prefix}:floor")).await?,
        )),
        _ => None,
    };
    let mut latencies = Vec::with_capacity(args.latency_messages as usize);
    let mut spec_floor = Vec::with_capacity(args.latency_messages as usize);
    let mut bare_floor = Vec::with_capacity(args.latency_messages as usize);
    for i in 0..args.latency_messages {
        if let Some((spec, bare)) = floors.as_mut() {
            spec_floor.push(spec.ping().await?);
            bare_floor.push(bare.ping().await?);
        }
        let sent = Instant::now();
        publisher
            .publish("bench.t", &i.to_be_bytes())
            .await
            .map_err(anyhow::Error::msg)?;
        let m = tokio::time::timeout(Duration::from_secs(5), inbox.next_message())
            .await
            .map_err(|_| anyhow!("a message was not delivered within 5 s"))?
            .context("inbox closed")?;
        latencies.push(sent.elapsed());
        if m.payload != i.to_be_bytes() {
            bail!("messages out of order");
        }
    }
    latencies.sort();
    let library_p99 = percentile(&latencies, 99.0);
    rows.push(Row {
        scenario: format!(
            "publish-to-delivery, one at a time ({} messages)",
            args.latency_messages
        ),
        goal: "p99 <= 0.5 ms".into(),
        measured: spread(&latencies),
        met: Some(library_p99 <= Duration::from_micros(500)),
    });
    if let Some((spec, bare)) = floors {
        spec.clean().await?;
        bare.clean().await?;
        spec_floor.sort();
        bare_floor.sort();
        let floor_row = |what: &str, goal: &str, sorted: &[Duration]| Row {
            scenario: format!(
                "{what}, one at a time ({} messages, interleaved with the above)",
                args.latency_messages
            ),
            goal: goal.into(),
            measured: spread(sorted),
            met: None,
        };
        rows.push(floor_row(
            "the spec's floor: publish.lua by EVALSHA + XREAD BLOCK, no engine",
            "none: the ratio below is judged",
            &spec_floor,
        ));
        rows.push(floor_row(
            "the bare floor: XADD + XREAD BLOCK",
            "none: shown, not judged",
            &bare_floor,
        ));
        let spec_p99 = percentile(&spec_floor, 99.0);
        let ratio = library_p99.as_secs_f64() / spec_p99.as_secs_f64();
        rows.push(Row {
            scenario: "publish-to-delivery p99 over the spec's floor p99".into(),
            goal: format!("<= {SPEC_FLOOR_RATIO}"),
            measured: format!("{ratio:.2} ({} over {})", ms(library_p99), ms(spec_p99)),
            met: Some(ratio <= SPEC_FLOOR_RATIO),
        });
    }

    // 2. Throughput to one subscriber with many publishes in flight.
    let n = args.throughput_messages;
    progress(&format!(
        "throughput, {n} messages, {} in flight",
        args.in_flight
    ));
    let started = Instant::now();
    let sender = spawn_publishers(publisher.clone(), "bench.t", n, args.in_flight);
    let mut received = 0;
    // One deadline for the whole run rather than a timer per message.
    let deadline = tokio::time::sleep(Duration::from_secs(10) + Duration::from_micros(n * 100));
    tokio::pin!(deadline);
    while received < n {
        tokio::select! {
            m = inbox.next_message() => {
                m.context("inbox closed")?;
                received += 1;
            }
            _ = &mut deadline => bail!("only {received} of {n} delivered"),
        }
    }
    let took = started.elapsed();
    let library_rate = n as f64 / took.as_secs_f64();
    sender.await??;
    let (_, dropped) = sub
        .store()
        .inbox_state("bench/sub")
        .await
        .map_err(anyhow::Error::msg)?;
    rows.push(Row {
        scenario: format!(
            "messages/s to one subscriber ({n} messages, {} in flight)",
            args.in_flight
        ),
        goal: ">= 60k/s, no silent loss".into(),
        measured: format!("{:.0}/s, {dropped} dropped", n as f64 / took.as_secs_f64()),
        met: Some(n as f64 / took.as_secs_f64() >= 60_000.0 && dropped == 0),
    });
    sub.close().await.map_err(anyhow::Error::msg)?;

    // 3. Fan-out: every message to every subscriber.
    let count = args.subscribers;
    progress(&format!(
        "fan-out, {} messages to {count} subscribers",
        args.fanout_messages
    ));
    let mut subscribers = Vec::new();
    for i in 0..count {
        let node = start(url, &prefix, &format!("bench/fan-{i:03}"), 30_000, big).await?;
        node.subscribe("bench.fan")
            .await
            .map_err(anyhow::Error::msg)?;
        let inbox = node.inbox().context("inbox taken")?;
        subscribers.push((node, inbox));
    }
    let m = args.fanout_messages;
    let started = Instant::now();
    let mut readers = Vec::new();
    for (node, mut inbox) in subscribers {
        readers.push(tokio::spawn(async move {
            let mut got = 0u64;
            while got < m {
                match tokio::time::timeout(Duration::from_secs(10), inbox.next_message()).await {
                    Ok(Some(_)) => got += 1,
                    _ => break,
                }
            }
            (node, got)
        }));
    }
    spawn_publishers(publisher.clone(), "bench.fan", m, args.in_flight).await??;
    let mut deliveries = 0;
    let mut nodes = Vec::with_capacity(count);
    for reader in readers {
        let (node, got) = reader.await?;
        deliveries += got;
        nodes.push(node);
    }
    // Until the last subscriber has every message, as the peer's figure is
    // timed; closing the 100 nodes is not delivery.
    let took = started.elapsed();
    for node in nodes {
        node.close().await.map_err(anyhow::Error::msg)?;
    }
    let fanout_rate = deliveries as f64 / took.as_secs_f64();
    rows.push(Row {
        scenario: format!("deliveries/s fanned out to {count} subscribers ({m} messages)"),
        goal: ">= 120k/s".into(),
        measured: format!(
            "{fanout_rate:.0}/s ({deliveries} of {} delivered)",
            m * count as u64
        ),
        met: Some(fanout_rate >= 120_000.0),
    });
    if let Some(relay) = relay {
        rows.extend(against_relay(
            relay,
            library_p99,
            library_rate,
            fanout_rate,
            args,
        ));
    }
    if let Ok(p) = Arc::try_unwrap(publisher) {
        p.close().await.map_err(anyhow::Error::msg)?;
    }
    rows.extend(agent_path(url, &prefix, args, library_p99, library_rate).await?);
    Ok(rows)
}

/// leasehold's figures beside Relay's from the same run, and the goals
/// stated against them: five times Relay's throughput, to one subscriber and
/// fanned out (a ratio from one run holds on a noisy machine where an
/// absolute figure does not).
fn against_relay(
    relay: super::peers::Relay,
    library_p99: Duration,
    library_rate: f64,
    fanout_rate: f64,
    args: &BenchArgs,
) -> Vec<Row> {
    // leasehold's rate over Relay's, judged against five times.
    let five_times = |scenario: String, ours: f64, theirs: f64| Row {
        scenario,
        goal: ">= 5x".into(),
        measured: format!(
            "{:.1}x: {ours:.0}/s over Relay's {theirs:.0}/s",
            ours / theirs
        ),
        met: Some(ours / theirs >= 5.0),
    };
    vec![
        Row {
            scenario: format!(
                "BullMQ 6.7.0 Relay: publish-to-delivery, one at a time ({} messages)",
                args.latency_messages
            ),
            goal: "-".into(),
            measured: format!(
                "p99 {:.3} ms (leasehold {})",
                relay.latency_p99_ms,
                ms(library_p99)
            ),
            met: None,
        },
        five_times(
            format!(
                "messages/s to one subscriber over Relay's ({} in flight; Relay's inbox 100,000)",
                args.in_flight
            ),
            library_rate,
            relay.one_subscriber_per_s,
        ),
        five_times(
            format!(
                "deliveries/s fanned out to {} subscribers over Relay's (its subscribers in 4 processes)",
                args.subscribers
            ),
            fanout_rate,
            relay.fanout_per_s,
        ),
    ]
}

/// Publishes through one agent's API (`POST /v1/publish` on kept-alive
/// connections) and reads them from another agent's event
/// stream: the path of an application in any language, next to the
/// library's figures above.
// A scenario read top to bottom: its steps in the order they run.
#[allow(clippy::too_many_lines)]
async fn agent_path(
    url: &str,
    prefix: &str,
    args: &BenchArgs,
    library_p99: Duration,
    library_rate: f64,
) -> anyhow::Result<Vec<Row>> {
    use super::agents::GROUP;
    use leasehold_testkit::http::{Connection, EventStream};

    let timings = args.timings()?;
    let groups = [GROUP.to_owned()];
    let a = super::agents::start(url, prefix, "http-pub", &groups, timings, 30_000, &[]).await?;
    // The same inbox bound as the library's subscriber (BIG_INBOX): at the
    // agent's default of 10,000 a long step drops messages, and the count
    // then waits out its deadline.
    let b = super::agents::start(
        url,
        prefix,
        "http-sub",
        &groups,
        timings,
        30_000,
        &[format!("--inbox-max-length={BIG_INBOX}")],
    )
    .await?;
    let (code, body) =
        leasehold_testkit::agent::post(b.port, "/v1/subscriptions?pattern=bench.http").await;
    if code != 200 {
        bail!("subscribing through the agent: {code} {body}");
    }
    let mut stream = EventStream::open(b.addr(), "/v1/inbox/events", None).await?;
    let mut rows = Vec::new();

    progress(&format!(
        "agent HTTP path: latency, {} messages one at a time",
        args.latency_messages
    ));
    let mut latencies = Vec::with_capacity(args.latency_messages as usize);
    let mut connection = Connection::open(a.addr()).await?;
    for i in 0..args.latency_messages {
        let sent = Instant::now();
        publish_through(&mut connection, i..i + 1, false).await?;
        let event = tokio::time::timeout(Duration::from_secs(5), stream.next())
            .await
            .map_err(|_| anyhow!("a message was not delivered through the agent within 5 s"))?
            .context("the agent's event stream ended")?;
        latencies.push(sent.elapsed());
        if !event.data.contains(&format!("\"payload\":\"{i}\"")) {
            bail!("through the agent, message {i} came as {}", event.data);
        }
    }
    latencies.sort();
    let p99 = percentile(&latencies, 99.0);
    rows.push(Row {
        scenario: format!(
            "publish-to-delivery through two agents' HTTP APIs, one at a time ({} messages)",
            args.latency_messages
        ),
        goal: format!(
            "p99 <= library p99 + 0.5 ms = {}",
            ms(library_p99 + Duration::from_micros(500))
        ),
        measured: spread(&latencies),
        met: Some(p99 <= library_p99 + Duration::from_micros(500)),
    });

    // Throughput, first with one message per request, then in batches
    // (`POST /v1/publish/batch`), with as many messages in flight as the
    // library had: HTTP/1.1 costs each request a write and a read on both
    // ends, which batches share.
    let n = args.throughput_messages;
    let batch = args.agent_batch.max(1);
    let one_rate = agent_throughput(a.addr(), &mut stream, n, args.in_flight, 1).await?;
    let batch_rate = agent_throughput(a.addr(), &mut stream, n, args.in_flight, batch).await?;
    rows.push(Row {
        scenario: format!(
            "messages/s through two agents' HTTP APIs, one per request ({n} messages, {} in flight)",
            args.in_flight
        ),
        goal: "none: for comparison with batches".into(),
        measured: format!(
            "{one_rate:.0}/s ({:.0} % of the library's)",
            100.0 * one_rate / library_rate
        ),
        met: None,
    });
    rows.push(Row {
        scenario: format!(
            "messages/s through two agents' HTTP APIs, batches of {batch} ({n} messages, {} in flight)",
            args.in_flight
        ),
        goal: format!(">= half the library's {library_rate:.0}/s"),
        measured: format!(
            "{batch_rate:.0}/s ({:.0} % of the library's)",
            100.0 * batch_rate / library_rate
        ),
        met: Some(batch_rate >= library_rate / 2.0),
    });
    drop(stream);
    for mut agent in [a, b] {
        agent.signal(Signal::SIGTERM);
        super::agents::ended(&mut agent, Duration::from_secs(5)).await?;
    }
    Ok(rows)
}

/// Publishes the messages numbered `numbers` (their payload is the number)
/// to `bench.http` through an agent: in one batch request, or, unbatched,
/// one request per message. Each publisher has a connection of its own,
/// kept alive, as an application with an HTTP client would.
async fn publish_through(
    connection: &mut leasehold_testkit::http::Connection,
    numbers: std::ops::Range<u64>,
    batched: bool,
) -> anyhow::Result<()> {
    if !batched {
        for i in numbers {
            let body = bytes::Bytes::from(i.to_string());
            let (code, answer) = connection
                .request("POST", "/v1/publish?topic=bench.http", body)
                .await?;
            if code != 200 {
                bail!("publish through the agent: {code} {answer}");
            }
        }
        return Ok(());
    }
    let messages: Vec<_> = numbers
        .map(|i| serde_json::json!({ "topic": "bench.http", "payload": i.to_string() }))
        .collect();
    let body = serde_json::json!({ "messages": messages }).to_string();
    let (code, answer) = connection
        .request("POST", "/v1/publish/batch", bytes::Bytes::from(body))
        .await?;
    if code != 200 || !answer.contains("\"failed\":0") {
        bail!("batch publish through the agent: {code} {answer}");
    }
    Ok(())
}

/// Messages per second from publishers on kept-alive connections to
/// agent A, `batch` messages per request and about `in_flight` messages in
/// flight in all, to the event stream of agent B.
async fn agent_throughput(
    addr: std::net::SocketAddr,
    stream: &mut leasehold_testkit::http::EventStream,
    n: u64,
    in_flight: usize,
    batch: usize,
) -> anyhow::Result<f64> {
    use leasehold_testkit::http::Connection;
    progress(&format!(
        "agent HTTP path: throughput, {n} messages, {in_flight} in flight, {batch} per request"
    ));
    let started = Instant::now();
    let workers = (in_flight / batch).max(1) as u64;
    let batch = batch as u64;
    let mut senders = tokio::task::JoinSet::new();
    for w in 0..workers {
        senders.spawn(async move {
            let mut connection = Connection::open(addr).await?;
            // Worker w sends the requests w, w + workers, ... of `batch`
            // messages each.
            let mut first = w * batch;
            while first < n {
                let last = (first + batch).min(n);
                publish_through(&mut connection, first..last, batch > 1).await?;
                first += workers * batch;
            }
            Ok::<(), anyhow::Error>(())
        });
    }
    let mut received = 0;
    let deadline = tokio::time::sleep(Duration::from_secs(30) + Duration::from_micros(n * 200));
    tokio::pin!(deadline);
    while received < n {
        tokio::select! {
            event = stream.next() => {
                let event = event.context("the agent's event stream ended")?;
                if event.event == "message" {
                    received += 1;
                }
            }
            // A publisher that failed says why at once.
            Some(Ok(Err(e))) = senders.join_next() => return Err(e),
            _ = &mut deadline => bail!("only {received} of {n} delivered through the agent"),
        }
    }
    let took = started.elapsed();
    while let Some(done) = senders.join_next().await {
        done??;
    }
    Ok(n as f64 / took.as_secs_f64())
}

/// Store calls per second of idle nodes: client calls (EVALSHA, XREAD, ...,
/// or PostgreSQL's statements) and all commands including those run inside
/// scripts.
pub async fn idle(url: &str, args: &BenchArgs) -> anyhow::Result<Vec<Row>> {
    let prefix = prefix();
    progress(&format!(
        "idle cost, {} nodes at a {} ms lease for {} s",
        args.idle_nodes, args.idle_lease_ms, args.idle_seconds
    ));
    let mut nodes = Vec::new();
    for i in 0..args.idle_nodes {
        nodes.push(
            start(
                url,
                &prefix,
                &format!("bench/idle-{i:03}"),
                args.idle_lease_ms,
                InboxConfig::default(),
            )
            .await?,
        );
    }
    // Let start-up traffic settle before measuring; PostgreSQL publishes
    // an idle backend's counts up to 10 s late (commandstats.rs).
    let settle = if super::local::name(url) == "PostgreSQL" {
        12
    } else {
        2
    };
    tokio::time::sleep(Duration::from_secs(settle)).await;
    let before = commandstats::calls(url).await?;
    tokio::time::sleep(Duration::from_secs(args.idle_seconds)).await;
    let after = commandstats::calls(url).await?;
    // What the nodes send: scripts, blocking inbox reads, event publishes.
    let (client_side, total) = commandstats::deltas(&before, &after);
    let per = |n: u64| n as f64 / args.idle_seconds as f64 / args.idle_nodes as f64;
    for node in nodes {
        node.close().await.map_err(anyhow::Error::msg)?;
    }
    Ok(vec![Row {
        scenario: format!(
            "{} calls/s per idle node ({} ms lease)",
            super::local::name(url),
            args.idle_lease_ms
        ),
        goal: "< 0.9 calls/s".into(),
        measured: format!(
            "{:.3} calls/s from the client, {:.3} commands/s including those inside scripts",
            per(client_side),
            per(total)
        ),
        met: Some(per(client_side) < 0.9),
    }])
}

/// leasehold's one-at-a-time p99 may be at most this many times the spec's
/// floor's: what the engine adds around publish.lua (the publisher's call,
/// the inbox reader, the hand-off to the application) costs a fifth of it.
const SPEC_FLOOR_RATIO: f64 = 1.2;

/// The topic, subscriber and sender of the spec's floor: apart from
/// leasehold's own (`bench.t`), so neither reads the other's messages.
const SPEC_TOPIC: &str = "bench.floor";
const SPEC_SUBSCRIBER: &str = "bench/floor";
const SPEC_SENDER: &str = "bench/floor-pub";
/// The incarnation recorded for the spec's subscriber, twice over: in its
/// node hash and in `P:packed`, which is how publish.lua knows that it reads
/// packed entries.
const SPEC_INCARNATION: &str = "floor";
/// The spec's subscriber's lease: longer than any latency step, since
/// nothing renews it.
const SPEC_LEASE_MS: u64 = 3_600_000;
/// Eight bytes, as leasehold's own messages (`i.to_be_bytes()`).
const FLOOR_PAYLOAD: &str = "12345678";

/// publish.lua as the engine loads it (crates/engine/src/store/redis/
/// scripts.rs): the shared prologue, the topic rules, then its own body.
/// The same text, so the same SHA as the engine's: one script in Redis.
fn publish_lua() -> String {
    [
        include_str!("../../engine/src/store/redis/scripts/now.lua"),
        include_str!("../../engine/src/store/redis/scripts/topics.lua"),
        include_str!("../../engine/src/store/redis/scripts/publish.lua"),
    ]
    .concat()
}

/// "p50, p99, max" of sorted times.
fn spread(sorted: &[Duration]) -> String {
    format!(
        "p50 {}, p99 {}, max {}",
        ms(percentile(sorted, 50.0)),
        ms(percentile(sorted, 99.0)),
        ms(percentile(sorted, 100.0))
    )
}

/// What one message costs over Redis streams on this machine at this
/// moment, with no engine: a write on one connection wakes an
/// `XREAD BLOCK` already waiting on another. Two floors, by their write:
///
/// - the spec's floor, the one leasehold is judged against: the engine's
///   own publish.lua, by `EVALSHA` with the engine's arguments, into the
///   inbox of the topic's one subscriber. The script must do what any
///   implementation of the spec must: read the subscriber's lease, inbox
///   limit and entry format before it writes the packed entry;
/// - the bare floor, shown only: an `XADD`, with no script and no routing,
///   below which no messaging over streams can go.
struct StreamFloor {
    writer: MultiplexedConnection,
    reader: MultiplexedConnection,
    /// The reader's `CLIENT ID`, to see it blocked before each write.
    reader_id: i64,
    /// The stream read: the bare floor's own, or the subscriber's inbox.
    key: String,
    last: String,
    write: FloorWrite,
}

/// How a floor's message reaches its stream.
enum FloorWrite {
    Bare,
    /// publish.lua's SHA and the key prefix it builds every key from.
    Spec {
        sha: String,
        prefix: String,
    },
}

impl StreamFloor {
    async fn bare(url: &str, key: &str) -> anyhow::Result<Self> {
        Self::open(url, key, FloorWrite::Bare).await
    }

    /// Loads publish.lua and registers its subscriber under `prefix` as
    /// a node's engine leaves one (register.lua, subscribe.lua): live on the
    /// Redis clock, leasehold's subscriber's inbox limit, packed entries.
    /// Nothing reads its inbox but the floor's `XREAD`.
    async fn spec(url: &str, prefix: &str) -> anyhow::Result<Self> {
        let node = format!("{prefix}:node:{SPEC_SUBSCRIBER}");
        // A bare floor until publish.lua is loaded through its writer.
        let mut floor = Self::open(url, &format!("{node}:inbox"), FloorWrite::Bare).await?;
        let sha = redis::Script::new(&publish_lua())
            .load_async(&mut floor.writer)
            .await?;
        let (seconds, micros): (u64, u64) =
            redis::cmd("TIME").query_async(&mut floor.writer).await?;
        let expiry = seconds * 1000 + micros / 1000 + SPEC_LEASE_MS;
        let _: Value = redis::pipe()
            .atomic()
            .cmd("ZADD")
            .arg(format!("{prefix}:nodes"))
            .arg(expiry)
            .arg(SPEC_SUBSCRIBER)
            .cmd("HSET")
            .arg(&node)
            .arg("incarnation")
            .arg(SPEC_INCARNATION)
            .cmd("HSET")
            .arg(format!("{prefix}:limits"))
            .arg(SPEC_SUBSCRIBER)
            .arg(BIG_INBOX)
            .cmd("HSET")
            .arg(format!("{prefix}:packed"))
            .arg(SPEC_SUBSCRIBER)
            .arg(SPEC_INCARNATION)
            .cmd("SADD")
            .arg(format!("{prefix}:topic:{SPEC_TOPIC}:subs"))
            .arg(SPEC_SUBSCRIBER)
            .query_async(&mut floor.writer)
            .await?;
        floor.write = FloorWrite::Spec {
            sha,
            prefix: prefix.to_owned(),
        };
        Ok(floor)
    }

    async fn open(url: &str, key: &str, write: FloorWrite) -> anyhow::Result<Self> {
        let client = redis::Client::open(url)?;
        // A blocked read must not time out.
        let config = AsyncConnectionConfig::new().set_response_timeout(None);
        let mut reader = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        let reader_id: i64 = redis::cmd("CLIENT")
            .arg("ID")
            .query_async(&mut reader)
            .await?;
        Ok(Self {
            writer: client.get_multiplexed_async_connection().await?,
            reader,
            reader_id,
            key: key.to_owned(),
            last: "0-0".to_owned(),
            write,
        })
    }

    /// One message: the read is sent first and seen waiting in Redis; the
    /// time runs from the write to the read's answer.
    async fn ping(&mut self) -> anyhow::Result<Duration> {
        let mut read = redis::cmd("XREAD");
        read.arg("BLOCK")
            .arg(5_000)
            .arg("STREAMS")
            .arg(&self.key)
            .arg(&self.last);
        let mut reader = self.reader.clone();
        let mut waiting = Box::pin(async move { read.query_async::<Value>(&mut reader).await });
        // Polled once, the read is handed to the connection's own task;
        // the write waits until Redis shows the reader blocked, so the
        // time holds none of the read's own trip.
        if let std::task::Poll::Ready(early) = futures::poll!(&mut waiting) {
            bail!("the floor's XREAD answered before any write: {early:?}");
        }
        self.until_blocked().await?;
        let write = self.write_command();
        let sent = Instant::now();
        let written: String = write.query_async(&mut self.writer).await?;
        let answer = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .map_err(|_| anyhow!("the floor's XREAD did not answer within 5 s"))??;
        let took = sent.elapsed();
        self.last = self.delivered(&written, answer)?;
        // Trimmed as the inbox is after each read, so both streams stay short.
        let _: Value = redis::cmd("XTRIM")
            .arg(&self.key)
            .arg("MAXLEN")
            .arg(0)
            .query_async(&mut self.writer)
            .await?;
        Ok(took)
    }

    /// The floor's write, built before the clock starts.
    fn write_command(&self) -> redis::Cmd {
        match &self.write {
            FloorWrite::Bare => {
                let mut xadd = redis::cmd("XADD");
                xadd.arg(&self.key)
                    .arg("*")
                    .arg("p")
                    .arg(FLOOR_PAYLOAD.as_bytes());
                xadd
            }
            // As the engine calls it (store/redis/messaging.rs): no KEYS;
            // the prefix, the sender, then one message's five values.
            FloorWrite::Spec { sha, prefix } => {
                let mut evalsha = redis::cmd("EVALSHA");
                evalsha
                    .arg(sha)
                    .arg(0)
                    .arg(prefix)
                    .arg(SPEC_SENDER)
                    .arg("topic")
                    .arg(SPEC_TOPIC)
                    .arg(FLOOR_PAYLOAD.as_bytes())
                    .arg("drop")
                    .arg(-1);
                evalsha
            }
        }
    }

    /// The entry id the read answered, once it is the message `written`
    /// wrote: the `XADD`'s entry, or the packed entry of the message id
    /// publish.lua answered, which must have reached its one subscriber.
    fn delivered(&self, written: &str, answer: Value) -> anyhow::Result<String> {
        let read = StreamReadReply::from_redis_value(answer)?;
        let Some(entry) = read.keys.into_iter().flat_map(|k| k.ids).next() else {
            bail!("the floor's XREAD answered no entry");
        };
        match &self.write {
            FloorWrite::Bare if entry.id != written => {
                bail!("the bare XREAD answered entry {}, not {written}", entry.id)
            }
            FloorWrite::Bare => {}
            FloorWrite::Spec { .. } => {
                let Some((id, "1")) = written.split_once(' ') else {
                    bail!("publish.lua answered {written:?}: its subscriber was not reached");
                };
                let packed = format!("{id} {SPEC_TOPIC} {SPEC_SENDER}\n{FLOOR_PAYLOAD}");
                let got: Option<String> = entry.get("m");
                if got.as_deref() != Some(packed.as_str()) {
                    bail!("the spec's floor read {got:?}, not the packed entry {packed:?}");
                }
            }
        }
        Ok(entry.id)
    }

    async fn until_blocked(&mut self) -> anyhow::Result<()> {
        for _ in 0..1_000 {
            let line: String = redis::cmd("CLIENT")
                .arg("LIST")
                .arg("ID")
                .arg(self.reader_id)
                .query_async(&mut self.writer)
                .await?;
            if line.split_whitespace().any(|field| field == "flags=b") {
                return Ok(());
            }
        }
        bail!("the floor's XREAD was not blocked in Redis after 1,000 looks")
    }

    /// Takes away what the floor wrote: its stream, and the spec's
    /// subscriber with its registration and subscription.
    async fn clean(mut self) -> anyhow::Result<()> {
        let mut pipe = redis::pipe();
        pipe.cmd("DEL").arg(&self.key);
        if let FloorWrite::Spec { prefix, .. } = &self.write {
            pipe.cmd("DEL")
                .arg(format!("{prefix}:node:{SPEC_SUBSCRIBER}"))
                .arg(format!("{prefix}:topic:{SPEC_TOPIC}:subs"))
                .cmd("ZREM")
                .arg(format!("{prefix}:nodes"))
                .arg(SPEC_SUBSCRIBER)
                .cmd("HDEL")
                .arg(format!("{prefix}:limits"))
                .arg(SPEC_SUBSCRIBER)
                .cmd("HDEL")
                .arg(format!("{prefix}:packed"))
                .arg(SPEC_SUBSCRIBER);
        }
        let _: Value = pipe.query_async(&mut self.writer).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_testkit::LocalRedis;

    async fn connection(redis: &LocalRedis) -> anyhow::Result<MultiplexedConnection> {
        Ok(redis::Client::open(redis.url())?
            .get_multiplexed_async_connection()
            .await?)
    }

    #[tokio::test]
    async fn the_spec_floor_runs_the_engines_own_publish_script() -> anyhow::Result<()> {
        let redis = LocalRedis::start()?;
        let publisher = start(
            &redis.url(),
            "floor-test",
            "bench/pub",
            30_000,
            InboxConfig::default(),
        )
        .await?;
        publisher
            .publish("bench.nobody", b"x")
            .await
            .map_err(anyhow::Error::msg)?;
        publisher.close().await.map_err(anyhow::Error::msg)?;
        let sha = redis::Script::new(&publish_lua()).get_hash().to_owned();
        let loaded: Vec<bool> = redis::cmd("SCRIPT")
            .arg("EXISTS")
            .arg(&sha)
            .query_async(&mut connection(&redis).await?)
            .await?;
        assert_eq!(
            loaded,
            [true],
            "the engine's publish is not the bench's publish_lua()"
        );
        Ok(())
    }

    #[tokio::test]
    async fn the_spec_floor_reaches_its_subscriber_and_leaves_no_keys_behind() -> anyhow::Result<()>
    {
        let redis = LocalRedis::start()?;
        let prefix = "floor-test";
        let mut floor = StreamFloor::spec(&redis.url(), prefix).await?;
        // Each ping fails unless publish.lua took the subscriber for live
        // and wrote it the packed entry the read then answered.
        for _ in 0..3 {
            floor.ping().await?;
        }
        floor.clean().await?;
        let left: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{prefix}:*"))
            .query_async(&mut connection(&redis).await?)
            .await?;
        // The message ids' counter, which leasehold's publishes share.
        assert_eq!(left, [format!("{prefix}:msgseq")]);
        Ok(())
    }
}
