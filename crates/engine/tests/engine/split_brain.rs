//! No two nodes ever lead the same group: random interleavings of crashes,
//! restarts with the same id, step-downs, leaves, graceful closes, Redis
//! pauses and per-node network partitions (longer and shorter than the ttl),
//! while a monitor samples every node's `leader_term()` every millisecond.
//!
//! A run must first show that its faults happened (a step that broke
//! something, and the group led under at least two terms): one without
//! proves nothing and fails. It runs on both stores. Each run prints its seed; `LEASEHOLD_SEED=N` replays one, and
//! `LEASEHOLD_SPLIT_BRAIN_STEPS` makes runs longer.

use leasehold_testkit as testkit;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_engine::{ElectionConfig, Group, Node, Store};
use testkit::proxy::Proxy;
use testkit::store::{Kind, StoreServer};

const GROUP: &str = "test/split";
const SLOTS: usize = 4;

struct Slot {
    id: String,
    proxy: Proxy,
    /// The store's URL through the proxy.
    url: String,
    node: Option<Node>,
}

type Watched = Arc<Mutex<Vec<Option<Group>>>>;

/// Two shapes of timing: a short retry interval (a hung renewal demotes the
/// leader after one retry interval), and one longer than the ttl (only the
/// local lease view demotes it), so both safety mechanisms are exercised.
fn cfg(long_retry: bool) -> ElectionConfig {
    ElectionConfig {
        ttl_ms: 300,
        renew_interval_ms: 100,
        retry_interval_ms: if long_retry { 400 } else { 50 },
    }
}

async fn start(slot: &mut Slot, watched: &Watched, i: usize, config: ElectionConfig) {
    let store = Store::connect(&slot.url, "lh").unwrap();
    let node = Node::start(store, &slot.id, testkit::node_config())
        .await
        .unwrap();
    let group = node.join(GROUP, config).unwrap();
    watched.lock().unwrap()[i] = Some(group);
    slot.node = Some(node);
}

/// What the monitor saw: its samples and the terms the group was led under.
struct Seen {
    samples: u64,
    terms: u64,
}

/// Samples every millisecond; returns what it saw, or the first violation.
fn monitor(
    watched: Watched,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<Result<Seen, String>> {
    std::thread::spawn(move || {
        let mut samples = 0;
        let mut terms = 0;
        let mut highest = 0;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let leaders: Vec<(usize, u64)> = watched
                .lock()
                .unwrap()
                .iter()
                .enumerate()
                .filter_map(|(i, g)| g.as_ref().and_then(|g| g.leader_term()).map(|t| (i, t)))
                .collect();
            if leaders.len() > 1 {
                return Err(format!("two leaders at once: {leaders:?}"));
            }
            if let Some(&(i, term)) = leaders.first() {
                if term < highest {
                    return Err(format!(
                        "slot {i} leads under term {term} after term {highest}"
                    ));
                }
                if term > highest {
                    terms += 1;
                }
                highest = term;
            }
            samples += 1;
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(Seen { samples, terms })
    })
}

async fn run(kind: Kind, seed: u64, steps: usize) {
    // Odd seeds use a retry interval longer than the ttl.
    let config = cfg(seed % 2 == 1);
    println!("split-brain run on {kind:?}: LEASEHOLD_SEED={seed} {config:?}");
    let mut rng = fastrand::Rng::with_seed(seed);
    let Some(mut server) =
        StoreServer::start_own_or_skip(kind, &format!("{kind:?}").to_lowercase())
    else {
        return;
    };
    let watched: Watched = Arc::new(Mutex::new((0..SLOTS).map(|_| None).collect()));
    let mut slots = Vec::new();
    for i in 0..SLOTS {
        let proxy = Proxy::start(server.port()).await;
        slots.push(Slot {
            id: format!("test/n{i}"),
            url: server.url_at(proxy.port),
            proxy,
            node: None,
        });
    }
    for (i, slot) in slots.iter_mut().enumerate() {
        start(slot, &watched, i, config).await;
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let checker = monitor(watched.clone(), stop.clone());
    let mut log = Vec::new();
    let mut faults = 0;
    for _ in 0..steps {
        let i = rng.usize(..SLOTS);
        let action = rng.u8(..8);
        let slot = &mut slots[i];
        match (action, slot.node.is_some()) {
            (0, true) => {
                // Crash: a dead process does not act, so stop watching it first.
                watched.lock().unwrap()[i] = None;
                drop(slot.node.take());
                log.push(format!("crash {i}"));
            }
            (1, true) => {
                let _ = slot.node.as_ref().unwrap().step_down(GROUP).await;
                log.push(format!("step-down {i}"));
            }
            (2, true) => {
                watched.lock().unwrap()[i] = None;
                let _ = slot.node.take().unwrap().close().await;
                log.push(format!("close {i}"));
            }
            (3, true) => {
                let node = slot.node.as_ref().unwrap();
                let _ = node.leave(GROUP).await;
                watched.lock().unwrap()[i] = node.join(GROUP, config).ok();
                log.push(format!("leave+join {i}"));
            }
            (4, _) | (5, _) => {
                // Partition one node, sometimes for longer than the ttl.
                let ms = rng.u64(20..600);
                slot.proxy.pause();
                tokio::time::sleep(Duration::from_millis(ms)).await;
                slots[i].proxy.resume();
                log.push(format!("partition {i} {ms}ms"));
            }
            (6, _) => {
                let ms = rng.u64(20..400);
                server.pause();
                tokio::time::sleep(Duration::from_millis(ms)).await;
                server.resume();
                log.push(format!("store pause {ms}ms"));
            }
            (_, false) => {
                start(slot, &watched, i, config).await;
                log.push(format!("restart {i}"));
            }
            _ => log.push("idle".into()),
        }
        if log
            .last()
            .is_some_and(|step| step != "idle" && !step.starts_with("restart"))
        {
            faults += 1;
        }
        tokio::time::sleep(Duration::from_millis(rng.u64(0..150))).await;
        if checker.is_finished() {
            break;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let verdict = checker.join().unwrap();
    let seen =
        verdict.unwrap_or_else(|violation| panic!("seed {seed}: {violation}\nsteps: {log:?}"));
    // The faults happened, or the run proves nothing.
    assert!(
        faults > 0 && seen.terms >= 2,
        "seed {seed}: {faults} faults, the group led under {} term(s): no failover happened\nsteps: {log:?}",
        seen.terms
    );
    assert!(
        seen.samples > 100,
        "the monitor hardly ran ({} samples)",
        seen.samples
    );
    // After the faults stop, exactly one leader within ttl + retry + margin.
    for (i, slot) in slots.iter_mut().enumerate() {
        if slot.node.is_none() {
            start(slot, &watched, i, config).await;
        }
    }
    let groups: Vec<Group> = watched.lock().unwrap().iter().flatten().cloned().collect();
    let refs: Vec<&Group> = groups.iter().collect();
    testkit::one_leader(&refs, config.ttl() * 2 + config.retry_interval() * 3).await;
    for slot in slots.iter_mut() {
        if let Some(node) = slot.node.take() {
            let _ = node.close().await;
        }
    }
}

on_both_stores! {
/// Two runs per store (a short and a long retry interval), each on a
/// server of its own.
async fn no_two_nodes_ever_lead_the_same_group(server) {
    let kind = server.kind();
    drop(server);
    let steps = std::env::var("LEASEHOLD_SPLIT_BRAIN_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    match std::env::var("LEASEHOLD_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        Some(seed) => run(kind, seed, steps).await,
        None => {
            let seed = fastrand::u64(..);
            run(kind, seed & !1, steps).await;
            run(kind, seed | 1, steps).await;
        }
    }
}
}
