//! Exec mode when the agent itself stalls: the leading agent alone is
//! stopped (SIGSTOP) or starved (a cgroup's CPU quota) for three ttl while
//! the command it guards, a process of its own, runs on, as a sidecar is
//! when its container is throttled or its runtime is wedged. The command's
//! work is a shared log, checked with the fenced sink: no line under a
//! lower term after one under a higher term (two singletons at once), and
//! no term written by two nodes.

use leasehold_testkit as testkit;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use testkit::agent::{args, get, Agent, RETRY_MS, TTL_MS};
use testkit::cpu_quota::CpuQuota;
use testkit::fenced::FencedSink;
use testkit::{free_port, wall_ns, RedisServer, Signal};

const GROUP: &str = "jobs";
const GRACE_MS: u64 = 250;
/// How long the leading agent stays stalled.
const STALL: Duration = Duration::from_millis(3 * TTL_MS);

/// One line of the shared log: who wrote it, under which term, when (Unix
/// ns, read just before the write).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Work {
    node: String,
    term: u64,
    at_ns: u128,
}

fn read_work(log: &Path) -> Vec<Work> {
    let mut lines: Vec<Work> = std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut f = l.split(' ');
            Some(Work {
                node: f.next()?.to_owned(),
                term: f.next()?.parse().ok()?,
                at_ns: f.next()?.parse().ok()?,
            })
        })
        .collect();
    lines.sort_by_key(|w| w.at_ns);
    lines
}

/// The agents of one stall test: each runs `sh` writing a line to `log`
/// every 5 ms while it leads, and keeps a role file under `roles/ID`.
struct Bed {
    _redis: RedisServer,
    agents: Vec<Agent>,
    log: PathBuf,
    roles: PathBuf,
}

impl Bed {
    async fn start(name: &str) -> Self {
        let redis = RedisServer::start();
        let base = std::env::temp_dir().join(format!("leasehold-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap();
        let (log, roles) = (base.join("work.log"), base.join("roles"));
        let script = format!(
            "while :; do echo \"$LEASEHOLD_NODE_ID $LEASEHOLD_TERM $(date +%s%N)\" >> {}; sleep 0.005; done",
            log.display()
        );
        let mut agents = Vec::new();
        for i in 0..3 {
            let id = format!("t/a{i}");
            let port = free_port();
            let mut a = args(&id, &redis.url(), port, GROUP);
            a.extend([
                "--grace-period-ms".into(),
                GRACE_MS.to_string(),
                "--role-dir".into(),
                roles.join(format!("a{i}")).display().to_string(),
                "--".into(),
                "sh".into(),
                "-c".into(),
                script.clone(),
            ]);
            agents.push(Agent::start(&id, port, a).await);
        }
        Self {
            _redis: redis,
            agents,
            log,
            roles,
        }
    }

    /// The node writing now (its last line under 200 ms old) and its term.
    async fn writer(&self) -> (usize, u64) {
        let start = Instant::now();
        loop {
            let work = read_work(&self.log);
            if let Some(last) = work.last() {
                if wall_ns().saturating_sub(last.at_ns) < 200_000_000 {
                    let i = self.agents.iter().position(|a| a.id == last.node).unwrap();
                    return (i, last.term);
                }
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "no command writing within 10 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn role_file(&self, i: usize) -> String {
        std::fs::read_to_string(self.roles.join(format!("a{i}")).join(GROUP)).unwrap_or_default()
    }

    /// Waits until every agent answers its API again.
    async fn all_answer(&self) {
        for a in &self.agents {
            testkit::eventually_async(Duration::from_secs(5), "the agent answers", || async {
                a.role(GROUP).await.is_some()
            })
            .await;
        }
    }
}

/// What the agent's API says of its lease while it leads: the
/// milliseconds left, within one ttl.
async fn lease_remaining_ms(agent: &Agent) -> u64 {
    let (code, body) = get(agent.port, &format!("/v1/groups/{GROUP}/leader")).await;
    assert_eq!(code, 200, "{body}");
    let view: serde_json::Value = serde_json::from_str(&body).unwrap();
    let left = view["leaseRemainingMs"]
        .as_u64()
        .unwrap_or_else(|| panic!("no leaseRemainingMs: {body}"));
    assert!(left > 0 && left <= TTL_MS, "{body}");
    left
}

/// The shared log read through the fenced sink: every line in time order,
/// offered under its term. Returns the sink and how many terms wrote.
fn check_fenced(log: &Path) -> (FencedSink, usize) {
    let work = read_work(log);
    let mut sink = FencedSink::default();
    let mut terms = std::collections::BTreeSet::new();
    // The first line under the highest term so far.
    let mut newest: Option<&Work> = None;
    for w in &work {
        if !sink.write(&w.node, w.term) {
            if let Some(n) = newest.filter(|n| n.term > w.term) {
                eprintln!(
                    "overlap: {} wrote under term {} {} ms after {} began under term {}",
                    w.node,
                    w.term,
                    (w.at_ns - n.at_ns) / 1_000_000,
                    n.node,
                    n.term
                );
            }
        }
        if newest.is_none_or(|n| w.term > n.term) {
            newest = Some(w);
        }
        terms.insert(w.term);
    }
    (sink, terms.len())
}

/// How one stall went: the stalled node's last line under its term
/// against the instant the stall began.
struct Stalled {
    term: u64,
    stopped_ns: u128,
    last_ns: u128,
}

/// The stalled leader's command ended before its local view of the lease
/// could have: that view ends at its last confirmed renewal's send plus
/// ttl, and that send came before the stall.
fn assert_gone_by_the_lease(log: &Path, node: &str, s: &Stalled) {
    let bound = s.stopped_ns + u128::from(TTL_MS) * 1_000_000;
    assert!(
        s.last_ns < bound,
        "{node}'s command wrote under term {} {} ms after its agent stalled (ttl {TTL_MS} ms): {:?}",
        s.term,
        (s.last_ns - s.stopped_ns) / 1_000_000,
        read_work(log).iter().rev().take(5).collect::<Vec<_>>()
    );
}

fn last_line(log: &Path, node: &str, term: u64) -> u128 {
    read_work(log)
        .iter()
        .filter(|w| w.node == node && w.term == term)
        .map(|w| w.at_ns)
        .max()
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_agent_s_command_ends_before_its_lease_and_never_overlaps_the_next() {
    const STALLS: usize = 10;
    let mut bed = Bed::start("stall-stop").await;
    let mut taken_over = 0;
    for k in 1..=STALLS {
        let (l, term) = bed.writer().await;
        let left = lease_remaining_ms(&bed.agents[l]).await;
        let node = bed.agents[l].id.clone();
        let stopped_ns = wall_ns();
        bed.agents[l].signal(Signal::SIGSTOP);
        tokio::time::sleep(STALL).await;
        // The role file still says leader (nobody can rewrite it), and
        // its instant has passed: a reader can tell it is stale.
        let file = bed.role_file(l);
        let until_ms: u128 = file
            .trim_end()
            .strip_prefix(&format!("leader {term} until "))
            .and_then(|ms| ms.parse().ok())
            .unwrap_or_else(|| panic!("role file of a stopped leader: {file:?}"));
        assert!(
            until_ms * 1_000_000 < wall_ns(),
            "the role file's instant has not passed after {STALL:?}: {file:?}"
        );
        bed.agents[l].signal(Signal::SIGCONT);
        let s = Stalled {
            term,
            stopped_ns,
            last_ns: last_line(&bed.log, &node, term),
        };
        assert_gone_by_the_lease(&bed.log, &node, &s);
        let (next, next_term) = bed.writer().await;
        if next_term > term {
            taken_over += 1;
        }
        eprintln!(
            "stall {k}: {node} term {term} ({left} ms left) stopped; its command's last line {} ms later; now {} leads under {next_term}",
            (s.last_ns - s.stopped_ns) / 1_000_000,
            bed.agents[next].id
        );
        bed.all_answer().await;
    }
    let (sink, terms) = check_fenced(&bed.log);
    assert_eq!(
        (sink.stale, sink.duplicates),
        (0, 0),
        "lines under an older term after a newer one began (stale), or one term from two nodes"
    );
    // Every stall handed the lead on: the check above saw a takeover each time.
    assert_eq!(
        taken_over, STALLS,
        "a stall without a takeover proves nothing"
    );
    assert!(terms > STALLS, "{terms} terms for {STALLS} stalls");
    // The agents came back and go on: one of them leads and runs the command.
    bed.writer().await;
    for a in &mut bed.agents {
        a.signal(Signal::SIGTERM);
        assert!(a.exited_within(Duration::from_secs(5)).await.is_some());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_starved_agent_s_command_ends_before_its_lease_and_never_overlaps_the_next() {
    const STALLS: usize = 5;
    // 1 ms of CPU a second: the agent runs in slivers, far apart.
    let name = format!("leasehold-stall-{}", std::process::id());
    let mut quota = match CpuQuota::create(&name, 1_000, 1_000_000) {
        Ok(quota) => quota,
        Err(e) => return testkit::lacks("starved agent", testkit::Part::Cgroup, &format!("{e:#}")),
    };
    let bed = Bed::start("stall-starve").await;
    let mut taken_over = 0;
    for k in 1..=STALLS {
        let (l, term) = bed.writer().await;
        let node = bed.agents[l].id.clone();
        let pid = bed.agents[l].pid();
        let stopped_ns = wall_ns();
        quota.throttle(pid).unwrap();
        tokio::time::sleep(STALL).await;
        quota.release(pid).unwrap();
        let s = Stalled {
            term,
            stopped_ns,
            last_ns: last_line(&bed.log, &node, term),
        };
        let (next, next_term) = bed.writer().await;
        // A starved agent still runs in slivers and may renew in one: its
        // lease, and so its command, can then rightly outlast the stall's
        // start + ttl. What must hold is the fenced sink's check below.
        if next_term > term {
            taken_over += 1;
        }
        eprintln!(
            "starved {k}: {node} term {term}; its command's last line {} ms after; now {} leads under {next_term}",
            s.last_ns.saturating_sub(s.stopped_ns) / 1_000_000,
            bed.agents[next].id
        );
        bed.all_answer().await;
        tokio::time::sleep(Duration::from_millis(2 * RETRY_MS)).await;
    }
    let (sink, _) = check_fenced(&bed.log);
    assert_eq!((sink.stale, sink.duplicates), (0, 0));
    assert!(
        taken_over > 0,
        "no starved leader lost the lead: the quota starved nothing"
    );
}
