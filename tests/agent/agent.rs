//! `leasehold agent` as real processes against a real redis-server: the
//! local API, hand-over on SIGTERM and SIGKILL, role files, exec mode, and
//! flags refused before anything starts.

use leasehold_testkit as testkit;

use std::time::{Duration, Instant};

use testkit::agent::{args, get, post, run_to_end, Agent, RENEW_MS, RETRY_MS, TTL_MS};
use testkit::procfs;
use testkit::proxy::Proxy;
use testkit::{free_port, wall_ns};
use testkit::{RedisServer, StoreFixture};

const GROUP: &str = "jobs";

async fn start_agents(redis: &impl StoreFixture, n: usize) -> Vec<Agent> {
    let mut agents = Vec::new();
    for i in 0..n {
        let id = format!("t/agent-{i}");
        let port = free_port();
        agents.push(Agent::start(&id, port, args(&id, &redis.url(), port, GROUP)).await);
    }
    agents
}

/// Waits until exactly one of `agents` leads and the others follow it under
/// the same term; returns the leader's index.
async fn agreed_leader(agents: &[Agent], limit: Duration) -> usize {
    let start = Instant::now();
    loop {
        let mut roles = Vec::new();
        for a in agents {
            roles.push(a.role(GROUP).await);
        }
        let leaders: Vec<usize> = (0..agents.len())
            .filter(|&i| matches!(&roles[i], Some((r, _)) if r == "leader"))
            .collect();
        if let [l] = leaders[..] {
            let term = roles[l].as_ref().and_then(|r| r.1);
            let all_follow = (0..agents.len())
                .filter(|&i| i != l)
                .all(|i| matches!(&roles[i], Some((r, t)) if r == "follower" && *t == term));
            if all_follow {
                return l;
            }
        }
        assert!(
            start.elapsed() < limit,
            "no agreed leader within {limit:?}: {roles:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Time until one of `agents` (other than `except`) reports leading.
async fn time_to_new_leader(agents: &[Agent], except: usize, limit: Duration) -> Duration {
    let start = Instant::now();
    loop {
        for (i, a) in agents.iter().enumerate() {
            if i != except && a.leads(GROUP).await {
                return start.elapsed();
            }
        }
        assert!(start.elapsed() < limit, "no new leader within {limit:?}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

on_both_stores! {
async fn three_agents_agree_on_one_leader_and_the_api_says_so(server) {
    let agents = start_agents(&server, 3).await;
    let l = agreed_leader(&agents, Duration::from_secs(3)).await;

    let (code, body) = get(agents[l].port, "/v1/status").await;
    assert_eq!(code, 200);
    let status: leasehold_agent::Status = serde_json::from_str(&body).unwrap();
    assert_eq!(status.node, agents[l].id);
    assert_eq!(status.groups[GROUP].group, "t/jobs");
    assert_eq!(
        status.groups[GROUP].leader.as_deref(),
        Some(agents[l].id.as_str())
    );

    let follower = (l + 1) % 3;
    let (code, body) = get(agents[follower].port, "/v1/groups/jobs/leader").await;
    assert_eq!(code, 503, "{body}");
    let (code, _) = get(agents[l].port, "/v1/groups/jobs/leader").await;
    assert_eq!(code, 200);
    let (code, _) = get(agents[l].port, "/v1/groups/other/leader").await;
    assert_eq!(code, 404);
    let (code, _) = get(agents[l].port, "/v1/groups/jobs/step-down").await;
    assert_eq!(code, 405, "step-down needs POST");
    // A group it does not campaign for is unknown whatever the method.
    let (code, body) = testkit::agent::post(agents[l].port, "/v1/groups/other/leader").await;
    assert_eq!(code, 404, "{body}");
    assert!(body.contains("does not campaign"), "{body}");
    assert_eq!(get(agents[l].port, "/readyz").await.0, 200);
    let (code, metrics) = get(agents[l].port, "/metrics").await;
    assert_eq!(code, 200);
    assert!(
        metrics.contains("leasehold_agent_leader{group=\"jobs\"} 1"),
        "{metrics}"
    );

    // A step-down through the API hands over; the old leader abstains.
    let (code, body) = post(agents[l].port, "/v1/groups/jobs/step-down").await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"wasLeader\":true"), "{body}");
    let took = time_to_new_leader(&agents, l, Duration::from_secs(2)).await;
    assert_eq!(agents[l].role(GROUP).await.unwrap().0, "abstaining");
    assert!(
        took < Duration::from_millis(3 * RETRY_MS),
        "step-down handover took {took:?}"
    );
}
}

on_both_stores! {
/// docs/behaviour.md P1, P2, P5 through the agent: `--priority` (empty is
/// the default, as an absent annotation reads through the downward API),
/// `/v1/status` shows it and why a candidate waits, and
/// `step-down?to=POD` hands over to that pod or is refused (422, 409) with
/// the leader leading on.
async fn priorities_and_a_named_successor_through_the_agent(server) {
    let mut agents = Vec::new();
    for (i, priority) in ["", "3", "0"].iter().enumerate() {
        let id = format!("t/agent-{i}");
        let port = free_port();
        let mut a = args(&id, &server.url(), port, GROUP);
        a.extend(["--priority".to_owned(), (*priority).to_owned()]);
        agents.push(Agent::start(&id, port, a).await);
    }
    let status = |i: usize| {
        let agent = &agents[i];
        async move {
            let (code, body) = get(agent.port, "/v1/status").await;
            assert_eq!(code, 200, "{body}");
            serde_json::from_str::<leasehold_agent::Status>(&body).unwrap()
        }
    };
    let l = agreed_leader(&agents, Duration::from_secs(3)).await;
    assert_ne!(l, 2, "priority 0 led");
    let mut priorities = Vec::new();
    for i in 0..3 {
        priorities.push(status(i).await.groups[GROUP].priority);
    }
    assert_eq!(priorities, [1, 3, 0]);
    // Make agent-0 (priority 1) the leader by name, then refuse what
    // cannot be.
    if l == 1 {
        let (code, body) = post(agents[1].port, "/v1/groups/jobs/step-down?to=agent-0").await;
        assert_eq!(code, 200, "{body}");
        assert!(body.contains("\"to\":\"t/agent-0\""), "{body}");
        time_to_new_leader(&agents, 1, Duration::from_secs(2)).await;
        assert!(agents[0].leads(GROUP).await, "the named pod did not lead");
    }
    let term = agents[0].role(GROUP).await.unwrap().1;
    for (path, code, words) in [
        ("/v1/groups/jobs/step-down?to=agent-2", 422, "priority 0"),
        ("/v1/groups/jobs/step-down?to=ghost", 422, "not a live member"),
        ("/v1/groups/jobs/step-down?to=agent-0", 422, "the leader itself"),
        ("/v1/groups/jobs/step-down?to=a%20b", 400, "successor"),
    ] {
        let (got, body) = post(agents[0].port, path).await;
        assert_eq!((got, body.contains(words)), (code, true), "{path}: {body}");
    }
    let (got, body) = post(agents[1].port, "/v1/groups/jobs/step-down?to=agent-0").await;
    assert_eq!(got, 409, "{body}");
    assert_eq!(agents[0].role(GROUP).await.unwrap(), ("leader".to_owned(), term));
    // Priority 0 says why it waits once it is alone with a free seat: the
    // two others are killed.
    agents[0].signal(testkit::Signal::SIGKILL);
    agents[1].signal(testkit::Signal::SIGKILL);
    let start = Instant::now();
    loop {
        let view = status(2).await.groups[GROUP].clone();
        assert_ne!(view.role, "leader", "priority 0 led");
        if view.deferring.as_ref().is_some_and(|d| d.reason == "neverLeads") {
            break;
        }
        assert!(start.elapsed() < Duration::from_millis(TTL_MS * 3), "{view:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
}

on_both_stores! {
/// docs/behaviour.md P6 through the agent (`--health-command`, a file the
/// test removes and puts back): an unhealthy member never leads and says
/// why; a leader whose check fails three times in a row steps down within
/// three retry intervals and a margin of two; with every member unhealthy
/// nobody leads, and each reports it; a member that passes again leads.
async fn health_checks_gate_who_leads(server) {
    let dir = tempfile_dir("health");
    let ok = |i: usize| dir.join(format!("ok-{i}"));
    let mut agents = Vec::new();
    for i in 0..2 {
        let id = format!("t/agent-{i}");
        let port = free_port();
        let mut a = args(&id, &server.url(), port, GROUP);
        a.extend([
            "--health-command".to_owned(),
            format!("test -f {}", ok(i).display()),
            "--health-failures".to_owned(),
            "3".to_owned(),
        ]);
        agents.push(Agent::start(&id, port, a).await);
    }
    std::fs::write(ok(0), "").unwrap();
    let status = |i: usize| {
        let agent = &agents[i];
        async move {
            let (code, body) = get(agent.port, "/v1/status").await;
            assert_eq!(code, 200, "{body}");
            serde_json::from_str::<leasehold_agent::Status>(&body).unwrap()
        }
    };
    // agent-0 is healthy and leads; agent-1 never checked healthy.
    let start = Instant::now();
    while !agents[0].leads(GROUP).await {
        assert!(start.elapsed() < Duration::from_secs(5), "agent-0 did not lead");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let one = status(1).await;
    assert!(!agents[1].leads(GROUP).await);
    let health = one.health.clone().unwrap();
    assert!(!health.healthy && health.checked, "{health:?}");
    let problem = one.groups[GROUP].problem.clone().unwrap_or_default();
    assert!(problem.contains("unhealthy: the health command exited with 1"), "{problem}");
    let (_, metrics) = get(agents[1].port, "/metrics").await;
    assert!(metrics.contains("leasehold_agent_healthy 0"), "{metrics}");

    // agent-0 turns unhealthy: it steps down after three failed checks,
    // and with agent-1 unhealthy too, nobody leads.
    std::fs::remove_file(ok(0)).unwrap();
    let gone = Instant::now();
    while agents[0].leads(GROUP).await {
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(gone.elapsed() < Duration::from_secs(5), "agent-0 kept leading");
    }
    let took = gone.elapsed();
    assert!(
        took <= Duration::from_millis(5 * RETRY_MS),
        "the unhealthy leader stepped down after {took:?}, more than three checks and two retry intervals"
    );
    let until = Instant::now() + Duration::from_millis(3 * TTL_MS);
    while Instant::now() < until {
        for (i, agent) in agents.iter().enumerate() {
            assert!(!agent.leads(GROUP).await, "agent-{i} led while unhealthy");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for i in 0..2 {
        assert!(status(i).await.groups[GROUP].problem.is_some());
    }
    // agent-1 passes again: it leads.
    std::fs::write(ok(1), "").unwrap();
    let back = Instant::now();
    while !agents[1].leads(GROUP).await {
        assert!(back.elapsed() < Duration::from_millis(3 * TTL_MS), "agent-1 did not lead once healthy");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(status(1).await.groups[GROUP].problem, None);
    let _ = std::fs::remove_dir_all(&dir);
}
}

/// A directory of the test's own under the system's temporary directory.
fn tempfile_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "leasehold-{name}-{}-{}",
        std::process::id(),
        free_port()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

on_both_stores! {
async fn sigterm_on_the_leader_hands_over_within_the_retry_interval(server: own) {
    let mut agents = start_agents(&server, 3).await;
    let l = agreed_leader(&agents, Duration::from_secs(3)).await;
    agents[l].signal(testkit::Signal::SIGTERM);
    // docs/behaviour.md E2: at most one retry interval; the margin is two more.
    let took = time_to_new_leader(&agents, l, Duration::from_secs(5)).await;
    eprintln!("SIGTERM -> new leader: {took:?}");
    assert!(
        took <= Duration::from_millis(3 * RETRY_MS),
        "graceful handover took {took:?}, bound {} ms",
        3 * RETRY_MS
    );
    let status = agents[l].exited_within(Duration::from_secs(3)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "SIGTERM must end the agent with 0, got {status:?}"
    );
    // It left the registry at once.
    assert!(!server.registered(&agents[l].id));
}
}

#[tokio::test]
async fn sigkill_on_the_leader_hands_over_within_ttl_plus_retry() {
    let redis = RedisServer::start();
    let mut agents = start_agents(&redis, 3).await;
    let l = agreed_leader(&agents, Duration::from_secs(3)).await;
    agents[l].signal(testkit::Signal::SIGKILL);
    let took = time_to_new_leader(&agents, l, Duration::from_secs(10)).await;
    eprintln!("SIGKILL -> new leader: {took:?}");
    let bound = Duration::from_millis(TTL_MS + 3 * RETRY_MS);
    assert!(
        took <= bound,
        "crash takeover took {took:?}, bound {bound:?}"
    );
    assert!(agents[l]
        .exited_within(Duration::from_secs(1))
        .await
        .is_some());
}

#[tokio::test]
async fn a_step_down_command_from_the_controller_reaches_the_agent() {
    let redis = RedisServer::start();
    let agents = start_agents(&redis, 2).await;
    let l = agreed_leader(&agents, Duration::from_secs(3)).await;
    // The controller's path: a command into the leader node's inbox.
    let sender = testkit::node(&redis, "t/controller").await;
    sender
        .ask_to_step_down(&agents[l].id, "t/jobs")
        .await
        .unwrap();
    let took = time_to_new_leader(&agents, l, Duration::from_secs(2)).await;
    assert!(took < Duration::from_millis(3 * RETRY_MS), "took {took:?}");
    assert_eq!(agents[l].role(GROUP).await.unwrap().0, "abstaining");
}

#[tokio::test]
async fn role_files_follow_the_role_and_say_stopped_at_exit() {
    let redis = RedisServer::start();
    let dir = std::env::temp_dir().join(format!("leasehold-roles-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (dir_a, dir_b) = (dir.join("a"), dir.join("b"));
    let mut agents = Vec::new();
    for (id, d) in [("t/a", &dir_a), ("t/b", &dir_b)] {
        let port = free_port();
        let mut a = args(id, &redis.url(), port, GROUP);
        a.extend(["--role-dir".into(), d.display().to_string()]);
        agents.push(Agent::start(id, port, a).await);
    }
    let l = agreed_leader(&agents, Duration::from_secs(3)).await;
    let dirs = [&dir_a, &dir_b];
    let read = |i: usize| std::fs::read_to_string(dirs[i].join(GROUP)).unwrap_or_default();
    testkit::eventually(Duration::from_secs(1), "role files written", || {
        read(l).starts_with("leader ") && read(1 - l) == "follower\n"
    })
    .await;
    // `leader TERM until UNIX_MS`: the instant lies within one ttl.
    let leader_line = |text: &str| -> Option<(u64, u64)> {
        let f: Vec<&str> = text.trim_end().split(' ').collect();
        match f[..] {
            ["leader", term, "until", ms] => Some((term.parse().ok()?, ms.parse().ok()?)),
            _ => None,
        }
    };
    let (term, until) = leader_line(&read(l)).unwrap();
    let now_ms = leasehold_engine::sync::wall_clock_ms();
    assert!(
        until > now_ms && until <= now_ms + TTL_MS,
        "until {until}, now {now_ms}"
    );
    // It moves on with every renewal.
    testkit::eventually(
        Duration::from_millis(3 * RENEW_MS),
        "a renewal rewrote the file",
        || leader_line(&read(l)).is_some_and(|(t, u)| t == term && u > until),
    )
    .await;

    agents[l].signal(testkit::Signal::SIGTERM);
    assert!(agents[l]
        .exited_within(Duration::from_secs(3))
        .await
        .is_some());
    assert_eq!(read(l), "stopped\n");
    testkit::eventually(Duration::from_secs(1), "the other file says leader", || {
        leader_line(&read(1 - l)).is_some_and(|(t, _)| t == term + 1)
    })
    .await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn the_password_can_come_from_a_file() {
    let redis = RedisServer::start_with_password("s3cret/with:odd@chars");
    let file = std::env::temp_dir().join(format!("leasehold-pw-{}", std::process::id()));
    std::fs::write(&file, "s3cret/with:odd@chars\n").unwrap();
    let port = free_port();
    let mut a = args(
        "t/a",
        &format!("redis://127.0.0.1:{}", redis.port),
        port,
        GROUP,
    );
    a.extend(["--redis-password-file".into(), file.display().to_string()]);
    let agent = Agent::start("t/a", port, a).await;
    testkit::eventually_async(Duration::from_secs(3), "the agent leads", || {
        agent.leads(GROUP)
    })
    .await;
    let _ = std::fs::remove_file(&file);
}

/// One line of the exec test's log, written by the command itself.
#[derive(Debug)]
struct Line {
    what: String,
    node: String,
    at_ns: u128,
    pid: Option<u32>,
}

fn read_log(path: &std::path::Path) -> Vec<Line> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some(Line {
                what: f.first()?.to_string(),
                node: f.get(1)?.to_string(),
                at_ns: f.get(3)?.parse().ok()?,
                pid: f.get(4).and_then(|p| p.parse().ok()),
            })
        })
        .collect()
}

/// An exec-mode command that appends `start NODE TERM NS PID` to `log`, and
/// on SIGTERM runs `on_term`, appends `stop NODE TERM NS` and exits.
fn logging_script(log: &std::path::Path, on_term: &str) -> String {
    format!(
        "echo \"start $LEASEHOLD_NODE_ID $LEASEHOLD_TERM $(date +%s%N) $$\" >> {log}; \
         trap '{on_term}echo \"stop $LEASEHOLD_NODE_ID $LEASEHOLD_TERM $(date +%s%N)\" >> {log}; exit 0' TERM; \
         while :; do sleep 0.01 2>/dev/null; done",
        log = log.display()
    )
}

async fn wait_for_line(
    log: &std::path::Path,
    what: &str,
    node: &str,
    n: usize,
    limit: Duration,
) -> Line {
    let start = Instant::now();
    loop {
        let mut lines: Vec<Line> = read_log(log)
            .into_iter()
            .filter(|l| l.what == what && l.node == node)
            .collect();
        if lines.len() >= n {
            return lines.swap_remove(n - 1);
        }
        assert!(
            start.elapsed() < limit,
            "no {what} #{n} of {node} within {limit:?}: {:?}",
            read_log(log)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_mode_runs_the_command_only_while_leading_and_never_twice() {
    // Longer ttl than the other tests: the command is stopped a grace period
    // before the lease could run out, and the bound is the lease itself.
    const TTL: u64 = 2000;
    const GRACE: u64 = 500;
    let redis = RedisServer::start();
    let proxy = Proxy::start(redis.port).await;
    let log = std::env::temp_dir().join(format!("leasehold-exec-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    // The command takes 300 ms to stop after SIGTERM, so a successor that
    // started before it was gone would show in the log.
    let script = logging_script(&log, "sleep 0.3; ");
    let exec_args = |id: &str, url: &str, port: u16| {
        let mut a = args(id, url, port, GROUP);
        let ttl = a.iter().position(|x| x == "--ttl-ms").unwrap() + 1;
        a[ttl] = TTL.to_string();
        a.extend(["--grace-period-ms".into(), GRACE.to_string()]);
        a.extend(["--".into(), "sh".into(), "-c".into(), script.clone()]);
        a
    };
    let (port_a, port_b) = (free_port(), free_port());
    // a talks to Redis directly, b through the proxy (so b can be cut off).
    let mut a = Agent::start("t/a", port_a, exec_args("t/a", &redis.url(), port_a)).await;
    let first = wait_for_line(&log, "start", "t/a", 1, Duration::from_secs(3)).await;
    let b = Agent::start("t/b", port_b, exec_args("t/b", &proxy.url(), port_b)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        read_log(&log).iter().all(|l| l.node == "t/a"),
        "a follower ran the command: {:?}",
        read_log(&log)
    );

    // 1. Step-down through the API: the command is gone when the call returns.
    let (code, body) = post(port_a, "/v1/groups/jobs/step-down").await;
    assert_eq!(code, 200, "{body}");
    assert!(
        read_log(&log)
            .iter()
            .any(|l| l.what == "stop" && l.node == "t/a"),
        "the step-down answered before the command stopped"
    );
    assert!(!procfs::alive(first.pid.unwrap()));
    wait_for_line(&log, "start", "t/b", 1, Duration::from_secs(2)).await;

    // 2. b loses Redis: its command stops before the lease can expire there.
    let cut = wall_ns();
    proxy.pause();
    let stop_b = wait_for_line(&log, "stop", "t/b", 1, Duration::from_secs(5)).await;
    let stopped_after = Duration::from_nanos((stop_b.at_ns - cut) as u64);
    eprintln!("b cut off -> command stopped after {stopped_after:?}");
    assert!(
        stopped_after < Duration::from_millis(TTL),
        "the command outlived the lease: stopped {stopped_after:?} after the cut, ttl {TTL} ms"
    );
    let second = wait_for_line(&log, "start", "t/a", 2, Duration::from_secs(5)).await;
    assert!(second.at_ns > stop_b.at_ns, "a started before b stopped");
    proxy.resume();

    // 3. SIGKILL of the leading agent takes its command with it.
    a.signal(testkit::Signal::SIGKILL);
    assert!(a.exited_within(Duration::from_secs(1)).await.is_some());
    testkit::eventually(
        Duration::from_millis(4 * RETRY_MS),
        "a's command died with it",
        || !procfs::alive(second.pid.unwrap()),
    )
    .await;
    let a_gone = wall_ns();
    let third = wait_for_line(&log, "start", "t/b", 2, Duration::from_secs(10)).await;
    assert!(
        third.at_ns > a_gone,
        "b started before a's command was gone"
    );

    // Never two at once: starts and stops alternate, one node at a time.
    // a's second run ended by SIGKILL, without a stop line: add its end.
    let mut lines = read_log(&log);
    lines.push(Line {
        what: "stop".into(),
        node: "t/a".into(),
        at_ns: a_gone,
        pid: None,
    });
    lines.sort_by_key(|l| l.at_ns);
    let mut running: Option<&str> = None;
    for l in &lines {
        if l.what == "start" {
            assert!(
                running.is_none(),
                "{} started while {running:?} ran: {lines:?}",
                l.node
            );
            running = Some(&l.node);
        } else {
            assert_eq!(running, Some(l.node.as_str()), "{lines:?}");
            running = None;
        }
    }
    drop(b);
    let _ = std::fs::remove_file(&log);
}

/// `(pid, ppid, state)` of every process in `/proc`.
fn processes() -> Vec<(u32, u32, char)> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| {
            let pid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let mut f = stat.rsplit_once(')')?.1.split_whitespace();
            let state = f.next()?.chars().next()?;
            Some((pid, f.next()?.parse().ok()?, state))
        })
        .collect()
}

/// Every descendant of `root` (not `root` itself).
fn descendants(root: u32) -> Vec<(u32, char)> {
    let table = processes();
    let mut found = Vec::new();
    let mut parents = vec![root];
    while let Some(parent) = parents.pop() {
        for &(pid, ppid, state) in &table {
            if ppid == parent {
                found.push((pid, state));
                parents.push(pid);
            }
        }
    }
    found
}

fn pid_in(file: &std::path::Path) -> Option<u32> {
    std::fs::read_to_string(file).ok()?.trim().parse().ok()
}

/// The agent's flags for exec mode at the test timings, running `script`
/// with `sh -c`.
fn exec_args(id: &str, url: &str, port: u16, script: &str) -> Vec<String> {
    let mut a = args(id, url, port, GROUP);
    a.extend(["--grace-period-ms".into(), "300".into()]);
    a.extend(["--".into(), "sh".into(), "-c".into(), script.into()]);
    a
}

/// A command that ends by a signal nix has no name for (a real-time one)
/// still ends the agent with 128 + the signal. Before the guard read wait
/// statuses itself, nix's `waitpid` reaped such a command and then failed,
/// so the guard never saw it end and the agent kept "running" it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_killed_by_a_real_time_signal_ends_the_agent_with_its_code() {
    let redis = RedisServer::start();
    let port = free_port();
    let mut agent = Agent::start(
        "t/a",
        port,
        exec_args("t/a", &redis.url(), port, "sleep 0.3; kill -40 $$"),
    )
    .await;
    let status = agent
        .exited_within(Duration::from_secs(5))
        .await
        .expect("the agent ended with its command");
    assert_eq!(status.code(), Some(128 + 40), "{status:?}");
}

/// A SIGKILLed agent takes the command's whole tree with it: the shell's
/// own children and a daemon that left its process group with `setsid`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_of_the_commands_tree_outlives_a_killed_agent() {
    let redis = RedisServer::start();
    let dir = std::env::temp_dir().join(format!("leasehold-tree-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (child, daemon) = (dir.join("child"), dir.join("daemon"));
    let script = format!(
        "setsid sleep 301 & echo $! > {daemon}; sleep 302 & echo $! > {child}; wait",
        daemon = daemon.display(),
        child = child.display()
    );
    let port = free_port();
    let mut agent = Agent::start("t/a", port, exec_args("t/a", &redis.url(), port, &script)).await;
    testkit::eventually(
        Duration::from_secs(3),
        "the command started both processes",
        || pid_in(&child).is_some() && pid_in(&daemon).is_some(),
    )
    .await;
    let (child, daemon) = (pid_in(&child).unwrap(), pid_in(&daemon).unwrap());
    assert!(procfs::alive(child) && procfs::alive(daemon));

    agent.signal(testkit::Signal::SIGKILL);
    assert!(agent.exited_within(Duration::from_secs(1)).await.is_some());
    testkit::eventually(
        Duration::from_millis(4 * RETRY_MS),
        "the command's tree died with the agent",
        || !procfs::alive(child) && !procfs::alive(daemon),
    )
    .await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Timings adopted from the LeaderGroup that leave less room than the grace
/// period shorten it: the command runs all through the term instead of
/// never starting (ttl 2000 ms against the default grace of 5000 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adopted_timings_shorten_the_grace_period_instead_of_stopping_the_command() {
    let redis = RedisServer::start();
    // The group's own timings, as the controller writes them from the
    // LeaderGroup: ttl 2000, renew 1500, retry 200.
    let adopted = leasehold_engine::config::ElectionConfig {
        ttl_ms: 2000,
        renew_interval_ms: 1500,
        retry_interval_ms: 200,
    };
    redis
        .store()
        .write_group_config(&format!("t/{GROUP}"), &adopted)
        .await
        .unwrap();
    let log = std::env::temp_dir().join(format!("leasehold-adopt-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let script = logging_script(&log, "");
    // The flags' timings (ttl 15 s) leave room for the default grace period.
    let port = free_port();
    let mut a = args("t/a", &redis.url(), port, GROUP);
    let ttl = a.iter().position(|x| x == "--ttl-ms").unwrap() + 1;
    a[ttl] = "15000".into();
    a.extend(["--".into(), "sh".into(), "-c".into(), script]);
    let agent = Agent::start("t/a", port, a).await;
    wait_for_line(&log, "start", "t/a", 1, Duration::from_secs(3)).await;
    // Three renewal cycles of the adopted timings under one term.
    tokio::time::sleep(Duration::from_millis(3 * adopted.ttl_ms)).await;
    let lines = read_log(&log);
    assert!(agent.leads(GROUP).await);
    assert_eq!(
        lines.len(),
        1,
        "the command should have started once and kept running: {lines:?}"
    );
    let pttl: i64 = redis
        .cli(&["PTTL", &format!("lh:g:{{t/{GROUP}}}:lease")])
        .parse()
        .unwrap();
    assert!(
        pttl <= adopted.ttl_ms as i64,
        "the agent did not adopt the group's timings (lease pttl {pttl} ms)"
    );
    drop(agent);
    let _ = std::fs::remove_file(&log);
}

/// As PID 1 of its PID namespace (a container's entrypoint), the agent
/// leaves no zombie behind: not of the command's tree, not of a process
/// entered into the namespace from outside (as `kubectl exec` does).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn as_pid_one_the_agent_reaps_orphans() {
    // SAFETY: plain syscall.
    if !testkit::root() {
        testkit::lacks(
            "as_pid_one_the_agent_reaps_orphans",
            testkit::Part::Root,
            "a PID namespace needs root",
        );
        return;
    }
    let redis = RedisServer::start();
    // The command leaves an orphan that exits 200 ms later.
    let script = "(sleep 0.2 &); exec sleep 300";
    let port = free_port();
    let agent = Agent::start_under(
        &["unshare", "--pid", "--fork", "--kill-child", "--mount-proc"],
        "t/a",
        port,
        exec_args("t/a", &redis.url(), port, script),
    )
    .await;
    testkit::eventually_async(Duration::from_secs(3), "leading", || agent.leads(GROUP)).await;
    let unshare = agent.pid();
    let pid_one = descendants(unshare)
        .first()
        .map(|(pid, _)| *pid)
        .expect("the agent under unshare");
    // A process entered into the namespace from outside leaves an orphan
    // too; it is re-parented to the agent.
    let entered = std::process::Command::new("nsenter")
        .args(["--target", &pid_one.to_string(), "--pid", "--"])
        .args(["sh", "-c", "sleep 0.2 & exit 0"])
        .status()
        .unwrap();
    assert!(entered.success());
    // The orphans have exited after 200 ms; give the reaping two sweeps.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let tree = descendants(pid_one);
    assert!(
        tree.iter().all(|(_, state)| *state != 'Z'),
        "zombies under the agent (PID 1 of its namespace): {tree:?}"
    );
    assert!(
        tree.iter().any(|(_, state)| *state != 'Z'),
        "the command should still run: {tree:?}"
    );
    drop(agent);
}

#[test]
fn bad_flags_are_refused_with_clear_errors_and_touch_nothing() {
    let redis = RedisServer::start();
    let url = redis.url();
    // Every case but two starts from a valid start-up: URL and node id.
    let agent = |extra: &[&str]| -> Vec<String> {
        ["agent", "--redis-url", &url, "--node-id", "t/a"]
            .iter()
            .chain(extra)
            .map(|a| a.to_string())
            .collect()
    };
    let owned = |args: &[&str]| -> Vec<String> { args.iter().map(|a| a.to_string()).collect() };
    let not_pem_file =
        std::env::temp_dir().join(format!("leasehold-not-pem-{}", std::process::id()));
    std::fs::write(&not_pem_file, "not a certificate\n").unwrap();
    let not_pem = not_pem_file.display().to_string();
    let tls_url = url.replacen("redis://", "rediss://", 1);
    let cases: Vec<(Vec<String>, &str)> = vec![
        // Without --group the agent only relays messages; a bad
        // subscription is refused like any flag.
        (agent(&["--subscribe", "a..b"]), "--subscribe"),
        (
            agent(&["--group", "Bad_Name"]),
            "--group \"Bad_Name\" is invalid",
        ),
        (
            owned(&["agent", "--redis-url", &url, "--group", "g"]),
            "POD_NAME",
        ),
        (
            agent(&["--group", "g", "--cluster", "East/1"]),
            "--cluster \"East/1\" is invalid: it contains a character outside the allowed set; a cluster name is 1 to 63 lowercase letters",
        ),
        (
            agent(&[
                "--group",
                "g",
                "--ttl-ms",
                "100",
                "--renew-interval-ms",
                "200",
            ]),
            "renew_interval_ms = 200 must be less than ttl_ms = 100",
        ),
        (
            agent(&["--group", "g", "--redis-replica-acks", "some"]),
            "\"some\" is not a replica count: use all, off, or a whole number from 1 to 100",
        ),
        (
            agent(&["--group", "g", "--redis-replica-wait-ms", "0"]),
            "--store-replica-wait-ms = 0 is out of range",
        ),
        (
            agent(&["--group", "g", "--ttl-ms", "0"]),
            "ttl_ms = 0 is out of range",
        ),
        (
            agent(&["--group", "g", "--priority", "101"]),
            "--priority = \"101\" is out of range: it must be a whole number from 0 (never leads) to 100",
        ),
        (
            agent(&["--group", "g", "--priority", "-1"]),
            "--priority = \"-1\" is out of range",
        ),
        (
            agent(&["--group", "g", "--health-url", "https://127.0.0.1/ready"]),
            "must be an http:// URL",
        ),
        (
            agent(&["--group", "g", "--health-command", "true", "--health-timeout-ms", "0"]),
            "--health-timeout-ms = 0 is out of range: it must be a whole number of milliseconds from 1 to 60000",
        ),
        (
            agent(&["--group", "g", "--health-command", "true", "--health-failures", "0"]),
            "--health-failures = 0 is out of range: it must be a whole number from 1 to 100",
        ),
        (
            agent(&["--group", "g", "--health-command", "true", "--health-url", "http://x/"]),
            "--health-url",
        ),
        (
            agent(&["--group", "g", "--group", "h", "--", "sh"]),
            "one group",
        ),
        (
            agent(&["--group", "g", "--", "no-such-command-x"]),
            "\"no-such-command-x\" was not found",
        ),
        (
            agent(&["--group", "g", "--grace-period-ms", "9000", "--", "sh"]),
            "--grace-period-ms = 9000 is too long",
        ),
        (
            owned(&[
                "agent",
                "--redis-url",
                "http://x",
                "--node-id",
                "t/a",
                "--group",
                "g",
            ]),
            "--store-url: the store URL is invalid",
        ),
        (
            agent(&["--group", "g", "--listen", "not-an-address"]),
            "--listen",
        ),
        (
            agent(&["--group", "g", "--redis-password-file", "/no/such/file"]),
            "--store-password-file /no/such/file",
        ),
        (
            agent(&["--group", "g", "--redis-ca-file", &not_pem]),
            "--store-ca-file: a CA certificate was given for a plain redis:// URL",
        ),
        (
            owned(&[
                "agent",
                "--redis-url",
                &tls_url,
                "--node-id",
                "t/a",
                "--group",
                "g",
                "--redis-ca-file",
                &not_pem,
            ]),
            "--store-ca-file: the CA certificate is not PEM",
        ),
        (
            owned(&[
                "agent",
                "--store-url",
                "postgres://app@127.0.0.1:1/app",
                "--node-id",
                "t/a",
                "--group",
                "g",
                "--store-ca-file",
                &not_pem,
            ]),
            "--store-ca-file: PostgreSQL at 127.0.0.1:1, database \"app\": the CA certificate is not PEM",
        ),
        (
            owned(&[
                "agent",
                "--store-url",
                "postgres://app@127.0.0.1:1/app?sslmode=verify-full",
                "--node-id",
                "t/a",
                "--group",
                "g",
            ]),
            "--store-url: PostgreSQL at 127.0.0.1:1, database \"app\": sslmode=verify-full checks the server's certificate, but no CA was given",
        ),
    ];
    for (args, expected) in cases {
        let started = Instant::now();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (status, stderr) = run_to_end(&args);
        assert!(!status.success(), "{args:?} was accepted");
        assert!(
            stderr.contains(expected),
            "{args:?}: expected {expected:?} in {stderr}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{args:?} took {:?}",
            started.elapsed()
        );
    }
    let _ = std::fs::remove_file(&not_pem_file);
    // Only the store's birth and epoch, which the test set up, are there.
    let keys = redis.keys();
    assert_eq!(
        keys,
        ["lh:born", "lh:epoch"],
        "a refused start wrote to Redis"
    );
}

/// A graceful stop while Redis does not answer says the leases were not
/// released (they run out on their own), never that they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_with_redis_away_does_not_claim_the_leases_were_released() {
    let redis = RedisServer::start();
    let port = free_port();
    let log = std::env::temp_dir().join(format!("leasehold-agent-stop-{}.log", std::process::id()));
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(args("t/a", &redis.url(), port, GROUP))
        .env("RUST_LOG", "info")
        .env_remove("POD_NAME")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    testkit::eventually_async(Duration::from_secs(5), "the agent leads", || async {
        get(port, &format!("/v1/groups/{GROUP}/leader")).await.0 == 200
    })
    .await;
    redis.pause();
    assert!(testkit::send_signal(child.id(), testkit::Signal::SIGTERM));
    // Every shutdown step is bounded: rendezvous and release by the call
    // timeout, the unregistration by the connect timeout.
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the agent did not stop");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    redis.resume();
    assert!(status.success(), "{status:?}");
    let text = std::fs::read_to_string(&log).unwrap();
    let _ = std::fs::remove_file(&log);
    assert!(!text.contains("leases released"), "{text}");
    assert!(text.contains("leases not released"), "{text}");
}

/// The agent's HTTP server closes connections that send no request within
/// the header timeout (5 s) and holds at most 64 at once: idle clients cannot
/// pile up, and once they are dropped the API answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_and_capped() {
    use tokio::io::AsyncReadExt;
    let redis = RedisServer::start();
    let port = free_port();
    let agent = Agent::start("t/a", port, args("t/a", &redis.url(), port, GROUP)).await;
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    // More idle connections than the cap; none sends a byte.
    let mut idle = Vec::new();
    for _ in 0..80 {
        idle.push(tokio::net::TcpStream::connect(addr).await.unwrap());
    }
    let opened = Instant::now();
    // Each accepted one is closed by the server after the header timeout;
    // the ones past the cap are accepted and closed after that.
    for (i, mut socket) in idle.into_iter().enumerate() {
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(20), socket.read(&mut byte)).await;
        assert!(
            matches!(read, Ok(Ok(0)) | Ok(Err(_))),
            "idle connection {i} still open after {:?}: {read:?}",
            opened.elapsed()
        );
    }
    let closed_after = opened.elapsed();
    // Two rounds of the 5 s header timeout (80 > 64), with a margin.
    assert!(closed_after >= Duration::from_secs(4), "{closed_after:?}");
    assert!(closed_after < Duration::from_secs(15), "{closed_after:?}");
    assert_eq!(get(port, "/healthz").await.0, 200);
    // A kept-alive connection serves requests one after another, and is
    // closed once it has been idle for the header timeout.
    let mut kept = testkit::http::Connection::open(addr).await.unwrap();
    for _ in 0..3 {
        let (code, _) = kept
            .request("GET", "/healthz", bytes::Bytes::new())
            .await
            .unwrap();
        assert_eq!(code, 200);
    }
    let idle_from = Instant::now();
    let mut raw = tokio::net::TcpStream::connect(addr).await.unwrap();
    {
        use tokio::io::AsyncWriteExt;
        raw.write_all(b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n")
            .await
            .unwrap();
    }
    let mut seen = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(20), async {
        let mut buf = [0u8; 1024];
        loop {
            match raw.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    let idle_for = idle_from.elapsed();
    assert!(
        closed.is_ok(),
        "a kept-alive connection idle for 20 s is still open"
    );
    assert!(
        String::from_utf8_lossy(&seen).starts_with("HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&seen)
    );
    assert!(
        idle_for >= Duration::from_secs(4) && idle_for < Duration::from_secs(10),
        "closed after {idle_for:?} idle, not after the 5 s header timeout"
    );
    drop(agent);
}

/// One raw HTTP/1.1 request with extra header lines; the status code.
async fn raw_status(port: u16, method: &str, path: &str, headers: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut socket = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{headers}Content-Length: 0\r\nConnection: close\r\n\r\n"
    );
    socket.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    socket.read_to_string(&mut answer).await.unwrap();
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {answer:?}"))
}

/// `--probe-listen` serves probes and metrics, and nothing that changes
/// anything; on the API, a step-down that a browser sends (it carries
/// `Origin`) is refused, so no web page can make a leader step down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_are_exposed_without_step_down_and_browsers_cannot_step_down() {
    let redis = RedisServer::start();
    let (port, probes) = (free_port(), free_port());
    let mut a = args("t/a", &redis.url(), port, GROUP);
    a.extend(["--probe-listen".into(), format!("127.0.0.1:{probes}")]);
    let agent = Agent::start("t/a", port, a).await;
    testkit::eventually_async(Duration::from_secs(3), "leading", || agent.leads(GROUP)).await;
    let step_down = format!("/v1/groups/{GROUP}/step-down");
    assert_eq!(get(probes, "/healthz").await.0, 200);
    assert_eq!(get(probes, "/readyz").await.0, 200);
    let (code, metrics) = get(probes, "/metrics").await;
    assert_eq!(code, 200);
    assert!(metrics.contains("leasehold_"), "{metrics}");
    assert_eq!(get(probes, "/v1/status").await.0, 404);
    let (code, body) = post(probes, &step_down).await;
    assert_eq!(code, 404, "{body}");
    assert!(body.contains("--probe-listen"), "{body}");
    // A browser's cross-origin (or rebound-DNS) POST carries Origin.
    let code = raw_status(port, "POST", &step_down, "Origin: http://evil.example\r\n").await;
    assert_eq!(code, 403);
    tokio::time::sleep(Duration::from_millis(2 * RETRY_MS)).await;
    assert!(agent.leads(GROUP).await, "a refused step-down stepped down");
    // A plain client still can.
    assert_eq!(post(port, &step_down).await.0, 200);
    assert!(!agent.leads(GROUP).await);
    drop(agent);
}

/// Out of file descriptors, the accept loop waits between failed accepts
/// instead of spinning a core, and the agent answers again once idle
/// connections are closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_file_descriptor_limit_the_accept_loop_does_not_spin() {
    let redis = RedisServer::start();
    let port = free_port();
    // Room for the runtime, Redis connections and a few clients, not 60.
    let agent = Agent::start_under(
        &["prlimit", "--nofile=40:40", "--"],
        "t/a",
        port,
        args("t/a", &redis.url(), port, GROUP),
    )
    .await;
    let pid = agent.pid();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut idle = Vec::new();
    for _ in 0..60 {
        idle.push(tokio::net::TcpStream::connect(addr).await.unwrap());
    }
    // CPU time (user + system, clock ticks) of the agent over 2 s.
    let ticks = || -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let f: Vec<&str> = stat
            .rsplit_once(')')
            .unwrap()
            .1
            .split_whitespace()
            .collect();
        f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = ticks();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let used = ticks() - before;
    // A spinning loop takes about 200 ticks (a whole core at 100 Hz).
    assert!(
        used < 40,
        "the agent used {used} ticks in 2 s at its fd limit"
    );
    drop(idle);
    testkit::eventually_async(
        Duration::from_secs(12),
        "the agent answers again",
        || async { get(port, "/healthz").await.0 == 200 },
    )
    .await;
    drop(agent);
}

/// A PostgreSQL database that refuses for a reason a retry will not cure
/// (here: a schema written by a newer leasehold) stops the agent at start
/// with an error that says which and names the flag, and changes nothing;
/// the same database once it can serve takes the agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_that_refuses_stops_the_agent_at_start_and_says_why() {
    let test = "a_postgres_that_refuses_stops_the_agent_at_start_and_says_why";
    let Some(mut server) = testkit::store::StoreServer::start_postgres_with(&[], test) else {
        return;
    };
    let pg = server.postgres().unwrap();
    pg.psql("UPDATE lh.meta SET value = '99' WHERE key = 'schema_version'")
        .unwrap();
    let port = free_port();
    let mut flags = args("t/refused", &pg.url(), port, GROUP);
    flags[1] = "--store-url".into();
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let started = Instant::now();
    let (status, stderr) = run_to_end(&flags);
    assert!(!status.success(), "the agent started: {stderr}");
    assert!(
        stderr.contains("--store-url")
            && stderr.contains("version 99, newer than this leasehold")
            && stderr.contains("127.0.0.1"),
        "{stderr}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(
        pg.psql("SELECT value FROM lh.meta WHERE key = 'schema_version'")
            .unwrap(),
        "99",
        "left as it was"
    );
    assert_eq!(
        pg.psql("SELECT count(*) FROM lh.nodes").unwrap(),
        "0",
        "nothing written"
    );
}
