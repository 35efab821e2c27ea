//! Chaos: several `leasehold agent` processes and a store this test
//! controls (Redis, then PostgreSQL: one body, `on_both_stores!`), random
//! faults, and the guarantees checked from outside, continuously, through
//! the agents' HTTP API and the store itself.
//!
//! The agents campaign with mixed priorities (1, 2, 3 and 0, which never
//! leads) and a health check (`--health-command`) that the test turns
//! failing and back.
//!
//! Faults: SIGKILL of an agent (it comes back under a new pod name, so the
//! dead node must be swept), SIGTERM, SIGSTOP for longer than the ttl, a
//! step-down, a handover to a named agent, a health check failing for a
//! while, the store SIGSTOPped, the store crashing and restarting (Redis
//! with its data lost, PostgreSQL killed -9 and recovering from its WAL: a
//! new history either way), and per agent a TCP proxy to the store that
//! black-holes, cuts or delays traffic.
//!
//! First, that the faults happened: a run in which none did proves nothing,
//! so it fails (at least one fault per 4 s, and each group led under at
//! least two terms).
//!
//! Checks:
//! - every leader report is a write under its term to a fenced sink per
//!   group (`testkit::fenced`), which refuses a term another agent used
//!   first and a term below the highest it accepted. It may refuse only the
//!   second kind, and only for a report in flight when the higher term was
//!   first seen: once a leader under term t has been seen, no agent may
//!   report leading under a lower term (a process resuming from SIGSTOP
//!   included: its local lease has run out), and no two agents ever report
//!   leading under the same term; so terms seen only increase;
//! - after the faults stop, one agreed leader per group within
//!   ttl + retry + margin;
//! - a killed node leaves the registry within its lease + the sweep interval;
//! - every message sent to a live agent outside the windows in which
//!   docs/behaviour.md allows a loss (N4: its lease ran out; X7: the store
//!   lost its data) arrives, and no more arrive than were sent (counting
//!   a send whose answer never came, which may have landed, as sent).
//!
//! Short by default (CI). `LEASEHOLD_CHAOS_SECONDS=600` runs ten minutes;
//! `LEASEHOLD_CHAOS_SEED=N` repeats a run. The seed is printed first.

use leasehold_testkit as testkit;

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use leasehold_agent::Status;
use leasehold_engine::{Node, NodeConfig};
use testkit::agent::{get, post, Agent};
use testkit::fenced::FencedSink;
use testkit::free_port;
use testkit::proxy::Proxy;
use testkit::StoreFixture;

const GROUPS: [&str; 2] = ["alpha", "beta"];
const AGENTS: usize = 4;
const TTL_MS: u64 = 1000;
const RENEW_MS: u64 = 300;
const RETRY_MS: u64 = 200;
/// The agents' node lease; the sweep interval equals it.
const LEASE_MS: u64 = 1000;
/// Each slot's priority: agent-3 follows and never leads.
const PRIORITIES: [u32; AGENTS] = [1, 2, 3, 0];

/// The file whose presence fails slot `index`'s health check.
fn sick_file(index: usize) -> std::path::PathBuf {
    std::env::temp_dir().join(format!(
        "leasehold-chaos-{}-sick-{index}",
        std::process::id()
    ))
}

fn args(name: &str, url: &str, port: u16, index: usize) -> Vec<String> {
    [
        "agent".to_owned(),
        format!("--store-url={url}"),
        "--prefix=lh".into(),
        "--namespace=chaos".into(),
        format!("--pod-name={name}"),
        format!("--group={}", GROUPS.join(",")),
        format!("--listen=127.0.0.1:{port}"),
        format!("--ttl-ms={TTL_MS}"),
        format!("--renew-interval-ms={RENEW_MS}"),
        format!("--retry-interval-ms={RETRY_MS}"),
        format!("--node-lease-ms={LEASE_MS}"),
        format!("--priority={}", PRIORITIES[index]),
        format!("--health-command=test ! -e {}", sick_file(index).display()),
        "--health-failures=2".into(),
    ]
    .to_vec()
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    Live,
    /// SIGSTOPped until then.
    Paused(Instant),
    /// Killed or stopped; restarted then.
    Down(Instant),
}

/// One agent position: its proxy stays, its process comes and goes.
struct Slot {
    index: usize,
    generation: u32,
    proxy: Proxy,
    /// The store's URL through the proxy.
    url: String,
    agent: Option<Agent>,
    state: State,
    /// Proxy black-holed until then.
    partitioned: Option<Instant>,
    /// Proxy delaying until then.
    delayed: Option<Instant>,
    /// Health check failing until then.
    sick: Option<Instant>,
    /// When the current process started.
    started: Instant,
}

impl Slot {
    fn id(&self) -> String {
        format!("chaos/agent-{}-{}", self.index, self.generation)
    }
    fn name(&self) -> String {
        format!("agent-{}-{}", self.index, self.generation)
    }
    /// Starts the next process of this slot, under a new pod name (the
    /// dead one must be swept).
    async fn start_next(&mut self) {
        self.generation += 1;
        let port = free_port();
        let args = args(&self.name(), &self.url, port, self.index);
        let mut agent = Agent::start(&self.id(), port, args).await;
        agent.read_inbox();
        self.agent = Some(agent);
        self.started = Instant::now();
    }

    fn faulted(&self) -> bool {
        self.state != State::Live || self.partitioned.is_some()
    }
}

/// What the checks remember.
#[derive(Default)]
struct Record {
    /// Per group: every leader report written to the group's sink.
    sinks: HashMap<&'static str, FencedSink>,
    /// Per group: term -> when a report under it was first accepted.
    accepted_at: HashMap<&'static str, BTreeMap<u64, Instant>>,
    leader_reports: u64,
    /// Stale reports the sinks refused that were in flight when the higher
    /// term was first seen (allowed).
    in_flight_refusals: u64,
    /// Who was first refused in flight under a term the sink never
    /// accepted (group, term): a second agent there is a term with two
    /// holders that the sink could not see.
    in_flight_holders: HashMap<(&'static str, u64), String>,
    /// Refusals the sinks should never have had to make, each said.
    violations: Vec<String>,
    /// Windows in which a node may lose messages: node id -> [from, to).
    loss_windows: HashMap<String, Vec<(Instant, Instant)>>,
    /// Store faults: [from, to).
    store_windows: Vec<(Instant, Instant)>,
    /// Messages: node id -> send times of successful sends.
    sent: HashMap<String, Vec<Instant>>,
    /// Sends whose answer did not come (timed out, or the store failed
    /// mid-call): each may or may not have reached the inbox.
    uncertain: HashMap<String, u64>,
    /// Latest inbox count per node id, and when it was read.
    received: HashMap<String, (u64, Instant)>,
    /// Killed node ids and when.
    killed: Vec<(String, Instant)>,
    faults: BTreeMap<&'static str, u64>,
}

impl Record {
    /// A status read between `sent` and `received` from agent `id`.
    fn observe(&mut self, id: &str, status: &Status, sent: Instant, received: Instant, seed: u64) {
        for group in GROUPS {
            let Some(view) = status.groups.get(group) else {
                continue;
            };
            if view.role != "leader" {
                continue;
            }
            let term = view.term.expect("a leader reports its term");
            self.leader_reports += 1;
            let sink = self.sinks.entry(group).or_default();
            let accepted_at = self.accepted_at.entry(group).or_default();
            if sink.write(id, term) {
                accepted_at.entry(term).or_insert(received);
                continue;
            }
            match sink.holder(term) {
                Some(first) if first != id => self.violations.push(format!(
                    "seed {seed}: {id} and {first} both reported leading {group} under term {term}"
                )),
                // Below the highest accepted: a stale leader if a higher
                // term was seen before this request was even sent.
                _ => match accepted_at.range(term + 1..).find(|(_, at)| **at < sent) {
                    Some((higher, _)) => self.violations.push(format!(
                        "seed {seed}: {id} reported leading {group} under term {term} after {} had been seen leading under {higher}",
                        sink.holder(*higher).unwrap_or_default()
                    )),
                    None => {
                        self.in_flight_refusals += 1;
                        let first = self
                            .in_flight_holders
                            .entry((group, term))
                            .or_insert_with(|| id.to_owned());
                        if sink.holder(term).is_none() && first != id {
                            self.violations.push(format!(
                                "seed {seed}: {id} and {first} both reported leading {group} under term {term}"
                            ));
                        }
                    }
                },
            }
        }
        self.received
            .insert(id.to_owned(), (status.inbox.received, received));
    }

    fn may_lose(&self, id: &str, at: Instant) -> bool {
        let margin = Duration::from_millis(LEASE_MS + 500);
        let within = |(from, to): &(Instant, Instant)| {
            at + Duration::from_secs(1) >= *from && at <= *to + margin
        };
        self.loss_windows
            .get(id)
            .is_some_and(|w| w.iter().any(within))
            || self.store_windows.iter().any(within)
    }
}

async fn status(port: u16) -> Option<(Status, Instant, Instant)> {
    let sent = Instant::now();
    let (code, body) = get(port, "/v1/status").await;
    let received = Instant::now();
    (code == 200).then(|| {
        serde_json::from_str(&body)
            .ok()
            .map(|s| (s, sent, received))
    })?
}

fn pick<T: Copy>(rng: &mut fastrand::Rng, items: &[T]) -> T {
    items[rng.usize(..items.len())]
}

/// The two runs (one per store) take turns: each is timed against its
/// bounds, on two shared cores.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

testkit::on_both_stores! {
async fn agents_keep_their_guarantees_under_random_faults(server: own) {
    let _turn = ONE_AT_A_TIME.lock().await;
    let seconds: u64 = std::env::var("LEASEHOLD_CHAOS_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let seed: u64 = std::env::var("LEASEHOLD_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    eprintln!("chaos: seed {seed} ({seconds} s; LEASEHOLD_CHAOS_SEED={seed} repeats it)");
    let mut rng = fastrand::Rng::with_seed(seed);

    let mut store_paused: Option<Instant> = None;
    let mut slots = Vec::new();
    for index in 0..AGENTS {
        let proxy = Proxy::start(server.port()).await;
        let mut slot = Slot {
            index,
            generation: 0,
            url: server.url_at(proxy.port),
            proxy,
            agent: None,
            state: State::Live,
            partitioned: None,
            delayed: None,
            sick: None,
            started: Instant::now(),
        };
        let _ = std::fs::remove_file(sick_file(index));
        let port = free_port();
        let mut agent = Agent::start(
            &slot.id(),
            port,
            args(&slot.name(), &slot.url, port, index),
        )
        .await;
        agent.read_inbox();
        slot.agent = Some(agent);
        slots.push(slot);
    }
    // The message sender talks to the store directly, with a long lease.
    let sender = Node::start(
        server.store(),
        "chaos/sender",
        NodeConfig::with_lease(60_000),
    )
    .await
    .unwrap();
    let mut record = Record::default();
    let start = Instant::now();
    let run = Duration::from_secs(seconds);
    let mut next_fault = start + Duration::from_secs(2);
    let mut next_message = start;

    while start.elapsed() < run {
        let now = Instant::now();
        // Faults that are over: the store's first, so that no agent starts
        // against a store this loop holds stopped (an agent checks its
        // store before it answers).
        if store_paused.is_some_and(|until| now >= until) {
            server.resume();
            store_paused = None;
        }
        for slot in &mut slots {
            match slot.state {
                State::Paused(until) if now >= until => {
                    slot.agent
                        .as_ref()
                        .unwrap()
                        .signal(testkit::Signal::SIGCONT);
                    slot.state = State::Live;
                }
                State::Down(until) if now >= until && store_paused.is_none() => {
                    slot.start_next().await;
                    slot.state = State::Live;
                }
                _ => {}
            }
            if slot.partitioned.is_some_and(|until| now >= until) {
                slot.proxy.resume();
                slot.partitioned = None;
            }
            if slot.delayed.is_some_and(|until| now >= until) {
                slot.proxy.delay(Duration::ZERO);
                slot.delayed = None;
            }
            if slot.sick.is_some_and(|until| now >= until) {
                let _ = std::fs::remove_file(sick_file(slot.index));
                slot.sick = None;
            }
        }
        let names: Vec<String> = slots.iter().map(Slot::name).collect();

        // A new fault.
        if now >= next_fault {
            next_fault = now + Duration::from_millis(rng.u64(300..1500));
            let faulted = slots.iter().filter(|s| s.faulted()).count();
            let knowing = slots
                .iter()
                .filter(|s| !s.faulted() && s.started + Duration::from_millis(TTL_MS) < now)
                .count();
            let i = rng.usize(..AGENTS);
            let kinds: &[&'static str] = &[
                "kill",
                "term",
                "pause",
                "step-down",
                "handover",
                "sick",
                "partition",
                "cut",
                "delay",
                "store-pause",
                "store-restart",
            ];
            let kind = pick(&mut rng, kinds);
            let slot = &mut slots[i];
            let agent_fault = matches!(kind, "kill" | "term" | "pause" | "partition");
            // At most two agents faulted at once, and the store restarts
            // only while two agents that know the terms are up: terms can
            // only carry on through nodes that remember them.
            let allowed = match kind {
                _ if agent_fault => faulted < 2 && !slot.faulted(),
                "store-pause" | "store-restart" => {
                    store_paused.is_none() && (kind != "store-restart" || knowing >= 2)
                }
                _ => !slot.faulted(),
            };
            if allowed {
                *record.faults.entry(kind).or_default() += 1;
                let id = slot.id();
                match kind {
                    "kill" => {
                        slot.agent
                            .as_ref()
                            .unwrap()
                            .signal(testkit::Signal::SIGKILL);
                        let mut gone = slot.agent.take().unwrap();
                        gone.exited_within(Duration::from_secs(5)).await;
                        let back = now + Duration::from_millis(rng.u64(0..2000));
                        record.killed.push((id.clone(), now));
                        record.loss_windows.entry(id).or_default().push((now, back));
                        slot.state = State::Down(back);
                    }
                    "term" => {
                        slot.agent
                            .as_ref()
                            .unwrap()
                            .signal(testkit::Signal::SIGTERM);
                        let mut gone = slot.agent.take().unwrap();
                        assert!(
                            gone.exited_within(Duration::from_secs(5))
                                .await
                                .is_some_and(|s| s.success()),
                            "seed {seed}: {id} did not exit 0 after SIGTERM"
                        );
                        let back = now + Duration::from_millis(rng.u64(0..1000));
                        record.loss_windows.entry(id).or_default().push((now, back));
                        slot.state = State::Down(back);
                    }
                    "pause" => {
                        let until = now + Duration::from_millis(TTL_MS + rng.u64(200..1500));
                        slot.agent
                            .as_ref()
                            .unwrap()
                            .signal(testkit::Signal::SIGSTOP);
                        record
                            .loss_windows
                            .entry(id)
                            .or_default()
                            .push((now, until));
                        slot.state = State::Paused(until);
                    }
                    "step-down" => {
                        let group = pick(&mut rng, &GROUPS);
                        let port = slot.agent.as_ref().unwrap().port;
                        post(port, &format!("/v1/groups/{group}/step-down")).await;
                    }
                    // Refused unless this agent leads and the one named is
                    // a live member that may lead: either way, no two
                    // leaders under one term.
                    "handover" => {
                        let group = pick(&mut rng, &GROUPS);
                        let to = pick(&mut rng, &names.iter().map(String::as_str).collect::<Vec<_>>());
                        let port = slot.agent.as_ref().unwrap().port;
                        post(port, &format!("/v1/groups/{group}/step-down?to={to}")).await;
                    }
                    "sick" => {
                        std::fs::write(sick_file(slot.index), "").unwrap();
                        slot.sick = Some(now + Duration::from_millis(rng.u64(200..2500)));
                    }
                    "partition" => {
                        let until = now + Duration::from_millis(rng.u64(200..2500));
                        slot.proxy.pause();
                        record
                            .loss_windows
                            .entry(id)
                            .or_default()
                            .push((now, until));
                        slot.partitioned = Some(until);
                    }
                    "cut" => slot.proxy.cut(),
                    "delay" => {
                        slot.proxy.delay(Duration::from_millis(rng.u64(20..150)));
                        slot.delayed = Some(now + Duration::from_millis(rng.u64(500..3000)));
                    }
                    "store-pause" => {
                        let until = now + Duration::from_millis(rng.u64(100..2000));
                        server.pause();
                        record.store_windows.push((now, until));
                        store_paused = Some(until);
                    }
                    "store-restart" => {
                        server.crash_restart();
                        record.store_windows.push((now, Instant::now()));
                    }
                    _ => unreachable!(),
                }
            }
        }

        // Messages to every live agent.
        if now >= next_message && store_paused.is_none() {
            next_message = now + Duration::from_millis(50);
            for slot in slots.iter().filter(|s| s.agent.is_some()) {
                let id = slot.id();
                let sent_at = Instant::now();
                let send =
                    tokio::time::timeout(Duration::from_millis(500), sender.send(&id, b"ping"))
                        .await;
                match send {
                    Ok(Ok(_)) => record.sent.entry(id).or_default().push(sent_at),
                    Ok(Err(leasehold_engine::Error::Store(_))) | Err(_) => {
                        *record.uncertain.entry(id).or_default() += 1;
                    }
                    Ok(Err(_)) => {}
                }
            }
        }

        // Observe every agent that can answer.
        for slot in &slots {
            if slot.state != State::Live {
                continue;
            }
            let port = slot.agent.as_ref().unwrap().port;
            if let Some((status, sent, received)) = status(port).await {
                record.observe(&slot.id(), &status, sent, received, seed);
            }
        }

        // Killed nodes leave the registry within lease + sweep interval,
        // unless the store itself was stalled meanwhile.
        let bound = Duration::from_millis(2 * LEASE_MS + 500);
        // (Never while the store is stopped: its client would wait for it, and
        // this loop is what resumes it.)
        let due: Vec<String> = record
            .killed
            .iter()
            .filter(|_| store_paused.is_none())
            .filter(|(_, at)| {
                let window_end = *at + bound;
                now >= window_end
                    && now < window_end + Duration::from_millis(200)
                    && !record.store_windows.iter().any(|(f, t)| {
                        *f <= window_end && *t + Duration::from_millis(LEASE_MS) >= *at
                    })
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in due {
            assert!(
                !server.registered(&id),
                "seed {seed}: {id} was killed more than {bound:?} ago and is still registered"
            );
            *record.faults.entry("sweep checks").or_default() += 1;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    // The faults happened, before anything is concluded from the run.
    let injected: u64 = record
        .faults
        .iter()
        .filter(|(kind, _)| **kind != "sweep checks")
        .map(|(_, n)| n)
        .sum();
    assert!(
        injected >= seconds / 4,
        "seed {seed}: {injected} faults in {seconds} s (at least one per 4 s wanted): a run without faults proves nothing"
    );
    for group in GROUPS {
        let terms = record.sinks.get(group).map_or(0, FencedSink::terms);
        assert!(
            terms >= 2,
            "seed {seed}: {group} was led under {terms} term(s) in {seconds} s: no failover happened, so the run proves nothing (faults {:?})",
            record.faults
        );
    }

    // The faults stop.
    let quiet = Instant::now();
    if store_paused.is_some() {
        server.resume();
    }
    for slot in &mut slots {
        slot.proxy.resume();
        slot.proxy.delay(Duration::ZERO);
        slot.partitioned = None;
        let _ = std::fs::remove_file(sick_file(slot.index));
        slot.sick = None;
        match slot.state {
            State::Paused(_) => slot
                .agent
                .as_ref()
                .unwrap()
                .signal(testkit::Signal::SIGCONT),
            State::Down(_) => slot.start_next().await,
            State::Live => {}
        }
        slot.state = State::Live;
    }
    // One agreed leader per group within ttl + retry + margin (two retry
    // intervals, and half a second for a restarted process to start), plus
    // what the rules of who leads may add: a health check's interval (one
    // retry interval) before a recovered agent campaigns at its priority
    // again, and the deference bound (two retry intervals) while the
    // candidacy of a killed agent of higher priority has not lapsed
    // (docs/behaviour.md P3, P6).
    let bound = Duration::from_millis(TTL_MS + 6 * RETRY_MS + 500);
    let agreed_after = loop {
        let mut statuses = Vec::new();
        for slot in &slots {
            let port = slot.agent.as_ref().unwrap().port;
            if let Some((status, sent, received)) = status(port).await {
                record.observe(&slot.id(), &status, sent, received, seed);
                statuses.push(status);
            }
        }
        let agreed = statuses.len() == AGENTS
            && GROUPS.iter().all(|g| {
                let leaders: Vec<&Status> = statuses
                    .iter()
                    .filter(|s| s.groups[*g].role == "leader")
                    .collect();
                leaders.len() == 1 && {
                    let term = leaders[0].groups[*g].term;
                    statuses.iter().all(|s| s.groups[*g].term == term)
                }
            });
        if agreed {
            break quiet.elapsed();
        }
        assert!(
            quiet.elapsed() < bound,
            "seed {seed}: no single agreed leader per group within {bound:?} after the faults stopped: {}",
            statuses
                .iter()
                .map(|s| GROUPS
                    .iter()
                    .map(|g| format!("{g} {} {:?}", s.groups[*g].role, s.groups[*g].term))
                    .collect::<Vec<_>>()
                    .join(", "))
                .collect::<Vec<_>>()
                .join("; ")
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };

    // Safety: the sinks refused nothing but reports in flight.
    assert!(
        record.violations.is_empty(),
        "{} refusals the fenced sinks should not have had to make:\n{}",
        record.violations.len(),
        record.violations.join("\n")
    );

    // Dead nodes are gone; only the live agents (and the sender) remain.
    let sweep_bound = Duration::from_millis(2 * LEASE_MS + 500);
    let live: Vec<String> = slots
        .iter()
        .map(|s| s.id())
        .chain(["chaos/sender".to_owned()])
        .collect();
    testkit::eventually(sweep_bound, "only live nodes registered", || {
        server
            .registered_ids()
            .iter()
            .all(|id| live.contains(id))
    })
    .await;

    // Messages: what was sent outside a loss window arrived, and nothing
    // arrived that was not sent.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut protected_total = 0;
    for slot in &slots {
        let id = slot.id();
        let port = slot.agent.as_ref().unwrap().port;
        let (status, sent_at, received_at) = status(port).await.expect("a live agent answers");
        record.observe(&id, &status, sent_at, received_at, seed);
        let sent = record.sent.get(&id).cloned().unwrap_or_default();
        let protected = sent.iter().filter(|&&t| !record.may_lose(&id, t)).count() as u64;
        protected_total += protected;
        let received = status.inbox.received;
        assert!(
            received >= protected,
            "seed {seed}: {id} received {received} messages, but {protected} were sent to it outside any loss window"
        );
        let uncertain = record.uncertain.get(&id).copied().unwrap_or(0);
        assert!(
            received <= sent.len() as u64 + uncertain,
            "seed {seed}: {id} received {received} messages, more than the {} sent \
             and {uncertain} whose send went unanswered",
            sent.len()
        );
    }

    let sent_total: usize = record.sent.values().map(Vec::len).sum();
    let uncertain_total: u64 = record.uncertain.values().sum();
    let sinks = GROUPS.map(|g| {
        let sink = &record.sinks[g];
        format!(
            "{g}: {} terms, {} writes accepted, refused {} as a term another agent used and {} as below the highest",
            sink.terms(),
            sink.accepted,
            sink.duplicates,
            sink.stale
        )
    });
    eprintln!(
        "chaos: {:?} of faults {:?}; {} leader reports; sinks {}; {} stale reports refused, all in flight; \
         agreed leader {agreed_after:?} after the faults stopped; {sent_total} messages sent \
         ({uncertain_total} more unanswered), {protected_total} outside loss windows to live agents, all delivered",
        start.elapsed(),
        record.faults,
        record.leader_reports,
        sinks.join("; "),
        record.in_flight_refusals,
    );
    for slot in &mut slots {
        if let Some(agent) = &slot.agent {
            agent.signal(testkit::Signal::SIGTERM);
        }
    }
    let _ = sender.close().await;
}
}
