//! Part of `--scenario controller`, after `controller.rs`: one group across two clusters that share
//! the store, each a throwaway API server with its own controller
//! (`--cluster east`, `--cluster west`) and one member pod, `web-0` in
//! both. The leader's member is dropped without a word (as SIGKILL leaves
//! it), and the other cluster's member takes over.
//!
//! Figures, per trial:
//! - from the crash to the leader label in the other cluster: what a
//!   singleton's move between clusters takes (bounded by the ttl, a retry
//!   interval and the label latency);
//! - from the new leader's acquisition to its label there: the label
//!   latency across clusters, judged as the one-cluster figure is.

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};
use leasehold_engine::{ElectionConfig, Role, Store};
use leasehold_testkit::kube::{ApiServer, User};

use super::args::BenchArgs;
use super::controller::{
    create_group, create_namespace, create_pod, prepare, ControllerProcess, Leaders, Member, Watch,
};
use super::report::{ms, progress, Row, Series};

const NS: &str = "bench-clusters";

/// One cluster of the two: its API server, its controller, the watch of
/// its leader labels.
struct Cluster {
    name: &'static str,
    // Kept for the controller and the watch, which use it.
    _api: ApiServer,
    controller: ControllerProcess,
    labels: Leaders,
    _watch: Watch,
}

impl Cluster {
    async fn start(
        name: &'static str,
        url: &str,
        prefix: &str,
        timings: ElectionConfig,
    ) -> anyhow::Result<Self> {
        let api = ApiServer::start().await?;
        let admin = api.client(User::Admin).await?;
        prepare(&admin).await?;
        create_namespace(&admin, NS).await?;
        create_pod(&admin, NS, "web-0", "web").await?;
        create_group(&admin, NS, "web", timings).await?;
        let controller = ControllerProcess::start_in(&api, url, prefix, &["--cluster", name])?;
        let (labels, watch) = Leaders::labelled(admin, NS);
        Ok(Self {
            name,
            _api: api,
            controller,
            labels,
            _watch: watch,
        })
    }

    async fn member(&self, store: &Store, timings: ElectionConfig) -> anyhow::Result<Member> {
        let id = format!("{}/{NS}/web-0", self.name);
        Member::start_as(store, &id, NS, "web-0", "web", timings).await
    }
}

pub(super) async fn run(url: &str, args: &BenchArgs) -> anyhow::Result<Vec<Row>> {
    progress("controller: two clusters that share the store (two more API servers)");
    let prefix = &super::report::prefix();
    let store = &Store::connect(url, prefix).map_err(anyhow::Error::msg)?;
    let (timings, trials) = (args.timings()?, args.trials);
    let mut clusters = [
        Cluster::start("east", url, prefix, timings).await?,
        Cluster::start("west", url, prefix, timings).await?,
    ];
    let mut members = Vec::new();
    for c in &clusters {
        members.push(c.member(store, timings).await?);
    }
    let mut moved = Series::new(
        "cross-cluster takeover, crash (SIGKILL) to the label in the other cluster",
        timings.ttl_ms,
        None,
    );
    let mut labelled = Series::new(
        "cross-cluster label after acquisition, crash (SIGKILL)",
        timings.ttl_ms,
        Some(super::controller::LABEL_GOAL_MS),
    );
    for trial in 0..trials {
        progress(&format!(
            "controller: across clusters, crash {}/{trials}",
            trial + 1
        ));
        let (from_crash, from_acquisition) =
            crash_once(&clusters, &mut members, store, timings).await?;
        moved.push(from_crash);
        labelled.push(from_acquisition);
        for c in &mut clusters {
            if !c.controller.alive() {
                bail!("{}'s controller exited during the trials", c.name);
            }
        }
    }
    for m in members {
        m.close().await;
    }
    let bound = timings.ttl_ms + timings.retry_interval_ms + super::controller::LABEL_GOAL_MS;
    let row = |s: &Series, goal: String, met: Option<bool>| {
        Row::new(
            format!("controller: {}", s.scenario),
            goal,
            format!(
                "p50 {}, p99 {}, max {} ({} trials)",
                ms(s.p(50.0)),
                ms(s.p(99.0)),
                ms(s.p(100.0)),
                s.samples.len()
            ),
            met,
        )
    };
    let within = moved.p(100.0) <= Duration::from_millis(bound);
    Ok(vec![
        row(
            &moved,
            format!(
                "<= ttl + retry + {} ms = {bound} ms",
                super::controller::LABEL_GOAL_MS
            ),
            Some(within),
        ),
        row(
            &labelled,
            format!("<= {} ms p99", super::controller::LABEL_GOAL_MS),
            labelled.goal_met(),
        ),
    ])
}

/// One trial: the leader's member dropped without a word, then started
/// again; from the crash, and from the other's acquisition, to its label.
async fn crash_once(
    clusters: &[Cluster; 2],
    members: &mut Vec<Member>,
    store: &Store,
    timings: ElectionConfig,
) -> anyhow::Result<(Duration, Duration)> {
    let old = settled(clusters, members).await?;
    let new = 1 - old;
    let mut role = members[new].role();
    let crashed = Instant::now();
    let dropped = members.remove(old);
    drop(dropped); // no release: the lease runs out
    let limit = Duration::from_millis(timings.ttl_ms * 3 + 5_000);
    tokio::time::timeout(limit, role.wait_for(|r| matches!(r, Role::Leader { .. })))
        .await
        .map_err(|_| anyhow!("no leader in {} within {limit:?}", clusters[new].name))??;
    let acquired = Instant::now();
    let shown = loop {
        if let Some(t) = clusters[new]
            .labels
            .since("web-0")
            .filter(|t| *t >= crashed)
        {
            break t;
        }
        if acquired.elapsed() > Duration::from_secs(30) {
            bail!(
                "{}'s web-0 was not labelled leader within 30 s",
                clusters[new].name
            );
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    members.insert(old, clusters[old].member(store, timings).await?);
    Ok((
        shown.saturating_duration_since(crashed),
        shown.saturating_duration_since(acquired),
    ))
}

/// Waits for one member leading and labelled in its own cluster only, then a
/// quiet second; the leader's index.
async fn settled(clusters: &[Cluster; 2], members: &[Member]) -> anyhow::Result<usize> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let leaders: Vec<usize> = (0..2).filter(|&i| members[i].leads()).collect();
        if let [i] = leaders[..] {
            if clusters[i].labels.count() == 1 && clusters[1 - i].labels.count() == 0 {
                tokio::time::sleep(Duration::from_secs(1)).await;
                return Ok(i);
            }
        }
        if Instant::now() > deadline {
            bail!("no leader labelled in one cluster alone within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
