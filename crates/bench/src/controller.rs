//! `--scenario controller`: the controller against a real API server (the
//! testkit's throwaway one, `leasehold_testkit::kube`), as the controller
//! process it runs in production (this binary's hidden `controller`
//! subcommand, the product's `leasehold_kube::run::run`), with the chart's
//! ServiceAccount identity (bound to cluster-admin here: the bench measures
//! requests, not RBAC). Members are in-process engine nodes named after
//! their pods, so the moment a node acquires the lease is known exactly.
//!
//! Figures:
//! - label moved: from the new leader's acquisition (its role turning
//!   leader in this process) to the leader label on its pod, as a watch of
//!   the pods sees it, after a crash (the node dropped without a word, as
//!   SIGKILL leaves it), a shutdown (released, as on SIGTERM) and a
//!   step-down;
//! - EndpointSlice written: the same, for a group with `spec.service`, to
//!   the leader Service's slice naming the new leader, as a watch of the
//!   slices sees it;
//! - API requests per leader change, from the API server's audit log,
//!   counted for the controller's user only, by verb and resource;
//! - a leader change across two clusters that share the store
//!   (`cross_cluster.rs`);
//! - the controller's memory (resident, and its peak) and CPU at rest with
//!   one group, and with `--controller-groups` groups of three pods each,
//!   over a window that holds a full resync, with the pod LISTs the
//!   controller made in it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, CustomResourceExt};
use leasehold_engine::sync::locked;
use leasehold_engine::{ElectionConfig, Group, Node, NodeConfig, Role, Store};
use leasehold_kube::crd::{LeaderGroup, DEFAULT_ROLE_LABEL};
use leasehold_testkit::kube::{ApiServer, User, CONTROLLER_NAMESPACE};
use serde_json::json;
use tokio::process::{Child, Command};

use super::args::BenchArgs;
use super::report::{ms, progress};
use super::report::{Row, Series};

/// The namespace of the one-group trials, and of the scale step.
const TRIALS_NS: &str = "bench";
const SCALE_NS: &str = "bench-scale";
/// The namespace of the leader-endpoint trials.
const ENDPOINT_NS: &str = "bench-endpoint";
/// A label moved within 50 ms of the acquisition is as quick as the
/// engine's own event reaches the controller; the EndpointSlice is held to
/// the same goal, since a client routes by either.
pub(super) const LABEL_GOAL_MS: u64 = 50;
const REQUESTS_GOAL: f64 = 4.0;
const MEMORY_GOAL_MIB: f64 = 128.0;
/// Creations in flight at once when filling the API server.
const IN_FLIGHT: usize = 16;

/// The leaders a watch sees: pod name -> when it appeared as leader
/// (removed when it goes). Of the pods' leader labels, or of the leader
/// Services' EndpointSlices (`spec.service`).
#[derive(Clone, Default)]
pub(super) struct Leaders(Arc<Mutex<BTreeMap<String, Instant>>>);

impl Leaders {
    /// The pods labelled leader.
    pub(super) fn labelled(client: kube::Client, namespace: &str) -> (Self, Watch) {
        let labels = Self::default();
        let shared = labels.clone();
        let api: Api<Pod> = Api::namespaced(client, namespace);
        let config = watcher::Config::default().labels(&format!("{DEFAULT_ROLE_LABEL}=leader"));
        let task = tokio::spawn(async move {
            let mut events = watcher(api, config).default_backoff().boxed();
            while let Some(Ok(event)) = events.next().await {
                let now = Instant::now();
                let mut map = locked(&shared.0);
                match event {
                    watcher::Event::Apply(pod) | watcher::Event::InitApply(pod) => {
                        map.entry(pod.metadata.name.unwrap_or_default())
                            .or_insert(now);
                    }
                    watcher::Event::Delete(pod) => {
                        map.remove(&pod.metadata.name.unwrap_or_default());
                    }
                    watcher::Event::Init => map.clear(),
                    watcher::Event::InitDone => {}
                }
            }
        });
        (labels, Watch(task))
    }

    /// The pods the leader Services' slices hold, by their
    /// `leasehold.dev/leader` annotation (one slice per group).
    async fn in_slices(client: kube::Client, namespace: &str) -> anyhow::Result<(Self, Watch)> {
        let group = kube::discovery::group(&client, "discovery.k8s.io")
            .await
            .map_err(anyhow::Error::msg)?;
        let (resource, _) = group
            .recommended_kind("EndpointSlice")
            .context("no EndpointSlice kind")?;
        let api: Api<kube::api::DynamicObject> = Api::namespaced_with(client, namespace, &resource);
        let leaders = Self::default();
        let shared = leaders.clone();
        let task = tokio::spawn(async move {
            // Slice name -> the pod it holds.
            let mut held: BTreeMap<String, String> = BTreeMap::new();
            let mut events = watcher(api, watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(Ok(event)) = events.next().await {
                let now = Instant::now();
                let mut map = locked(&shared.0);
                let (slice, gone) = match event {
                    watcher::Event::Apply(s) | watcher::Event::InitApply(s) => (s, false),
                    watcher::Event::Delete(s) => (s, true),
                    watcher::Event::Init => {
                        map.clear();
                        held.clear();
                        continue;
                    }
                    watcher::Event::InitDone => continue,
                };
                let name = slice.metadata.name.clone().unwrap_or_default();
                let pod = slice
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get("leasehold.dev/leader").cloned())
                    .filter(|_| !gone);
                let before = match &pod {
                    Some(p) => held.insert(name, p.clone()),
                    None => held.remove(&name),
                };
                if before != pod {
                    if let Some(b) = before {
                        map.remove(&b);
                    }
                    if let Some(p) = pod {
                        map.insert(p, now);
                    }
                }
            }
        });
        Ok((leaders, Watch(task)))
    }

    pub(super) fn since(&self, pod: &str) -> Option<Instant> {
        locked(&self.0).get(pod).copied()
    }

    pub(super) fn count(&self) -> usize {
        locked(&self.0).len()
    }
}

/// The watch task behind [`Leaders`], ended when this is dropped.
pub(super) struct Watch(tokio::task::JoinHandle<()>);

impl Drop for Watch {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The controller process and what /proc says of it.
pub(super) struct ControllerProcess {
    child: Child,
    pid: u32,
    metrics: std::net::SocketAddr,
}

impl ControllerProcess {
    fn start(api: &ApiServer, url: &str, prefix: &str) -> anyhow::Result<Self> {
        Self::start_in(api, url, prefix, &[])
    }

    /// [`ControllerProcess::start`] with more flags (`--cluster NAME`).
    pub(super) fn start_in(
        api: &ApiServer,
        url: &str,
        prefix: &str,
        extra: &[&str],
    ) -> anyhow::Result<Self> {
        let port = leasehold_testkit::redis::free_port()?;
        let exe = std::env::current_exe()?;
        let child = Command::new(exe)
            .args(["controller", "--store-url", url, "--prefix", prefix])
            .args(extra)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--resync-seconds", "30", "--leader-endpoints"])
            .env("KUBECONFIG", api.kubeconfig(User::Controller))
            .env("POD_NAME", "leasehold-0")
            .env("POD_NAMESPACE", CONTROLLER_NAMESPACE)
            .env("RUST_LOG", "error")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("start the controller")?;
        let pid = child.id().context("the controller exited at once")?;
        Ok(Self {
            child,
            pid,
            metrics: std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        })
    }

    /// (resident, peak resident) in MiB.
    fn memory_mib(&self) -> (f64, f64) {
        leasehold_testkit::procfs::memory_mib(self.pid)
    }

    /// User + system CPU time so far.
    fn cpu(&self) -> Duration {
        leasehold_testkit::procfs::cpu_time(self.pid).unwrap_or_default()
    }

    /// A counter or gauge from its /metrics, summed over its label sets.
    async fn metric(&self, name: &str) -> f64 {
        let Ok((200, body)) = leasehold_testkit::http::request(
            self.metrics,
            "GET",
            "/metrics",
            Duration::from_secs(2),
        )
        .await
        else {
            return 0.0;
        };
        body.lines()
            .filter(|l| l.starts_with(name))
            .filter(|l| l[name.len()..].starts_with([' ', '{']))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    pub(super) fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

// A scenario read top to bottom: its steps in the order they run.
#[allow(clippy::too_many_lines)]
pub async fn run(url: &str, args: &BenchArgs) -> anyhow::Result<Vec<Row>> {
    progress("controller: starting etcd and kube-apiserver");
    let api = ApiServer::start().await?;
    let admin = api.client(User::Admin).await?;
    prepare(&admin).await?;
    let prefix = super::report::prefix();
    let timings = args.timings()?;
    let mut controller = ControllerProcess::start(&api, url, &prefix)?;
    let mut rows = Vec::new();

    progress("controller: one group of three pods");
    let store = Store::connect(url, &prefix).map_err(anyhow::Error::msg)?;
    create_namespace(&admin, TRIALS_NS).await?;
    let pods: Vec<String> = (0..3).map(|i| format!("web-{i}")).collect();
    for pod in &pods {
        create_pod(&admin, TRIALS_NS, pod, "web").await?;
    }
    create_group(&admin, TRIALS_NS, "web", timings).await?;
    let (labels, _watch) = Leaders::labelled(admin.clone(), TRIALS_NS);
    let mut members = Vec::new();
    for pod in &pods {
        members.push(Member::start(&store, TRIALS_NS, pod, "web", timings).await?);
    }
    let first = Instant::now();
    wait_until(Duration::from_secs(60), "the first leader label", || {
        labels.count() == 1
    })
    .await?;
    rows.push(Row::new(
        "controller: first leader labelled, from its start (incl. its own election)".into(),
        "-".into(),
        format!("{:.2} s", first.elapsed().as_secs_f64()),
        None,
    ));

    let trials = Trials {
        api: &api,
        store: &store,
        timings,
        count: args.trials,
    };
    let (series, requests) = trials
        .run(&mut controller, &mut members, &labels, "label moved")
        .await?;
    rows.extend(series);
    rows.push(requests_row(
        "controller: API requests per leader change (audit log, the controller's user)",
        &requests,
        Some(REQUESTS_GOAL),
    ));

    progress("controller: at rest with one group");
    rows.extend(at_rest(&api, &mut controller, "one group", Duration::from_secs(35)).await?);
    for m in members.drain(..) {
        m.close().await;
    }

    // The same leader changes with the leader endpoint (`spec.service`):
    // from the acquisition to the EndpointSlice holding the new leader.
    progress("controller: leader endpoint, one group of three pods");
    create_namespace(&admin, ENDPOINT_NS).await?;
    for pod in &pods {
        create_pod(&admin, ENDPOINT_NS, pod, "web").await?;
    }
    let service = json!({ "name": "web-leader", "ports": [{ "port": 80, "targetPort": 8080 }] });
    create_group_with(&admin, ENDPOINT_NS, "web", timings, Some(service)).await?;
    let (in_slice, _slice_watch) = Leaders::in_slices(admin.clone(), ENDPOINT_NS).await?;
    for pod in &pods {
        members.push(Member::start(&store, ENDPOINT_NS, pod, "web", timings).await?);
    }
    wait_until(
        Duration::from_secs(60),
        "the first leader in the slice",
        || in_slice.count() == 1,
    )
    .await?;
    let (series, requests) = trials
        .run(
            &mut controller,
            &mut members,
            &in_slice,
            "EndpointSlice written",
        )
        .await?;
    rows.extend(series);
    rows.push(requests_row(
        "controller: API requests per leader change with spec.service (the slice's GET and update besides)",
        &requests,
        None,
    ));
    for m in members.drain(..) {
        m.close().await;
    }

    rows.extend(
        scale(
            &api,
            &admin,
            &store,
            &mut controller,
            args.controller_groups,
        )
        .await?,
    );
    Ok(rows)
}

/// The leader-change trials of one group: each fault `count` times, timed
/// from the acquisition to what `seen` shows.
struct Trials<'a> {
    api: &'a ApiServer,
    store: &'a Store,
    timings: ElectionConfig,
    count: usize,
}

impl Trials<'_> {
    /// A row per fault, and the requests each change cost.
    async fn run(
        &self,
        controller: &mut ControllerProcess,
        members: &mut Vec<Member>,
        seen: &Leaders,
        what: &str,
    ) -> anyhow::Result<(Vec<Row>, Vec<BTreeMap<String, usize>>)> {
        let mut series = Vec::new();
        let mut requests = Vec::new();
        for fault in [Fault::Crash, Fault::Shutdown, Fault::StepDown] {
            let mut s = Series::new(
                &format!("{what} after acquisition, {}", fault.name()),
                self.timings.ttl_ms,
                Some(LABEL_GOAL_MS),
            );
            for trial in 0..self.count {
                progress(&format!(
                    "controller: {what}, {} {}/{}",
                    fault.name(),
                    trial + 1,
                    self.count
                ));
                let (took, counted) =
                    leader_change(self.api, self.store, members, seen, fault, self.timings).await?;
                s.push(took);
                requests.push(counted);
            }
            series.push(s);
            if !controller.alive() {
                bail!("the controller exited during the trials");
            }
        }
        let rows = series
            .iter()
            .map(|s| {
                Row::new(
                    format!("controller: {}", s.scenario),
                    format!("<= {LABEL_GOAL_MS} ms p99"),
                    format!(
                        "p50 {}, p99 {}, max {} ({} trials)",
                        ms(s.p(50.0)),
                        ms(s.p(99.0)),
                        ms(s.p(100.0)),
                        s.samples.len()
                    ),
                    s.goal_met(),
                )
            })
            .collect();
        Ok((rows, requests))
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    Crash,
    Shutdown,
    StepDown,
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::Crash => "crash (SIGKILL)",
            Fault::Shutdown => "shutdown (SIGTERM)",
            Fault::StepDown => "step-down",
        }
    }
}

/// A pod's engine node, in this process.
pub(super) struct Member {
    namespace: String,
    pod: String,
    node: Node,
    group: Group,
}

impl Member {
    async fn start(
        store: &Store,
        namespace: &str,
        pod: &str,
        group: &str,
        timings: ElectionConfig,
    ) -> anyhow::Result<Self> {
        Self::start_as(
            store,
            &format!("{namespace}/{pod}"),
            namespace,
            pod,
            group,
            timings,
        )
        .await
    }

    /// A member whose node id is `id` (`CLUSTER/NAMESPACE/POD` across clusters).
    pub(super) async fn start_as(
        store: &Store,
        id: &str,
        namespace: &str,
        pod: &str,
        group: &str,
        timings: ElectionConfig,
    ) -> anyhow::Result<Self> {
        let node = Node::start(store.clone(), id, NodeConfig::default())
            .await
            .map_err(anyhow::Error::msg)?;
        let group = node
            .join(&format!("{namespace}/{group}"), timings)
            .map_err(anyhow::Error::msg)?;
        Ok(Self {
            namespace: namespace.to_owned(),
            pod: pod.to_owned(),
            node,
            group,
        })
    }

    /// The member's role, as a watch.
    pub(super) fn role(&self) -> tokio::sync::watch::Receiver<Role> {
        self.group.role()
    }

    pub(super) fn leads(&self) -> bool {
        matches!(*self.group.role().borrow(), Role::Leader { .. })
    }

    pub(super) async fn close(self) {
        let _ = self.node.close().await;
    }
}

/// One leader change: the fault, the new leader's acquisition, its label;
/// then the controller's requests for it from the audit log. The member
/// that crashed or shut down is started again before the next trial.
// A scenario read top to bottom: its steps in the order they run.
#[allow(clippy::too_many_lines)]
async fn leader_change(
    api: &ApiServer,
    store: &Store,
    members: &mut Vec<Member>,
    labels: &Leaders,
    fault: Fault,
    timings: ElectionConfig,
) -> anyhow::Result<(Duration, BTreeMap<String, usize>)> {
    // Start from a settled state: one leader, labelled, and a quiet second.
    let settle = Instant::now() + Duration::from_secs(20);
    let old = loop {
        let leaders: Vec<usize> = (0..members.len()).filter(|&i| members[i].leads()).collect();
        if let [i] = leaders[..] {
            if labels.since(&members[i].pod).is_some() && labels.count() == 1 {
                break i;
            }
        }
        if Instant::now() > settle {
            bail!("no settled leader within 20 s");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mark = api.audit_mark();

    // Every other member reports the moment its role turns leader.
    let mut acquired = Vec::new();
    for (_, m) in members.iter().enumerate().filter(|(i, _)| *i != old) {
        let mut role = m.group.role();
        let pod = m.pod.clone();
        acquired.push(tokio::spawn(async move {
            let _ = role.wait_for(|r| matches!(r, Role::Leader { .. })).await;
            (pod, Instant::now())
        }));
    }
    let group = members[old].group.name().to_owned();
    let restart = match fault {
        Fault::Crash => {
            let m = members.remove(old);
            let pod = (m.namespace.clone(), m.pod.clone());
            drop(m); // no release, no unregister: the lease runs out
            Some(pod)
        }
        Fault::Shutdown => {
            let m = members.remove(old);
            let pod = (m.namespace.clone(), m.pod.clone());
            m.close().await;
            Some(pod)
        }
        Fault::StepDown => {
            members[old]
                .node
                .step_down(&group)
                .await
                .map_err(anyhow::Error::msg)?;
            None
        }
    };
    let limit = Duration::from_millis(timings.ttl_ms * 3 + 5_000);
    let (first, _, others) = tokio::time::timeout(limit, futures::future::select_all(acquired))
        .await
        .map_err(|_| anyhow!("no new leader within {limit:?}"))?;
    others.iter().for_each(|t| t.abort());
    let (pod, at) = first?;
    let labelled = loop {
        if let Some(t) = labels
            .since(&pod)
            .filter(|t| *t >= at - Duration::from_secs(1))
        {
            break t;
        }
        if at.elapsed() > Duration::from_secs(30) {
            bail!("{pod} was not labelled leader within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    // The status and the Event follow the labels; give them a second.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut counted = BTreeMap::new();
    let user = User::Controller.username();
    for r in api
        .audit_since(mark)
        .iter()
        .filter(|r| r.user.username == user)
    {
        *counted.entry(r.what()).or_insert(0) += 1;
    }
    if let Some((namespace, pod)) = restart {
        members.push(Member::start(store, &namespace, &pod, "web", timings).await?);
    }
    Ok((labelled.saturating_duration_since(at), counted))
}

fn requests_row(title: &str, trials: &[BTreeMap<String, usize>], goal: Option<f64>) -> Row {
    let totals: Vec<usize> = trials.iter().map(|t| t.values().sum()).collect();
    let max = totals.iter().copied().max().unwrap_or(0);
    let mean = totals.iter().sum::<usize>() as f64 / totals.len().max(1) as f64;
    let mut by_kind: BTreeMap<&str, usize> = BTreeMap::new();
    for t in trials {
        for (k, v) in t {
            *by_kind.entry(k.as_str()).or_insert(0) += v;
        }
    }
    let kinds: Vec<String> = by_kind
        .iter()
        .map(|(k, v)| format!("{k} {:.2}", *v as f64 / trials.len().max(1) as f64))
        .collect();
    Row::new(
        title.into(),
        goal.map_or("-".into(), |g| format!("<= {g}")),
        format!("mean {mean:.2}, max {max}: {}", kinds.join(", ")),
        goal.map(|g| mean <= g),
    )
}

/// The audit log's verbs that change an object.
const WRITE_VERBS: [&str; 5] = [
    "create ",
    "update ",
    "patch ",
    "delete ",
    "deletecollection ",
];

/// A controller at rest (no member changes) spends at most this share of
/// a core, with 1,000 groups as with one: what it costs at rest must not
/// grow with the groups it watches.
const REST_CPU_GOAL: f64 = 0.05;

/// Memory and CPU over `window`, which holds at least one resync (30 s),
/// and what the controller asked the API server meanwhile: at rest a
/// resync reads Redis and writes nothing.
async fn at_rest(
    api: &ApiServer,
    controller: &mut ControllerProcess,
    what: &str,
    window: Duration,
) -> anyhow::Result<Vec<Row>> {
    let mark = api.audit_mark();
    let reconciles = controller
        .metric("leasehold_reconcile_duration_seconds_count")
        .await;
    let cpu = controller.cpu();
    let start = Instant::now();
    tokio::time::sleep(window).await;
    if !controller.alive() {
        bail!("the controller exited");
    }
    let cpu = controller.cpu().saturating_sub(cpu).as_secs_f64() / start.elapsed().as_secs_f64();
    let reconciled = controller
        .metric("leasehold_reconcile_duration_seconds_count")
        .await
        - reconciles;
    let (rss, peak) = controller.memory_mib();
    let user = User::Controller.username();
    let mut counted: BTreeMap<String, usize> = BTreeMap::new();
    for r in api
        .audit_since(mark)
        .iter()
        .filter(|r| r.user.username == user)
    {
        *counted.entry(r.what()).or_insert(0) += 1;
    }
    let pod_lists = counted.get("list pods").copied().unwrap_or(0);
    let writes: usize = counted
        .iter()
        .filter(|(what, _)| WRITE_VERBS.iter().any(|verb| what.starts_with(verb)))
        .map(|(_, n)| n)
        .sum();
    let mut requests: Vec<String> = counted.iter().map(|(k, v)| format!("{k} {v}")).collect();
    // Which objects were written, so that a write at rest can be looked into.
    requests.extend(
        api.audit_since(mark)
            .iter()
            .filter(|r| r.user.username == user)
            .filter(|r| WRITE_VERBS.iter().any(|verb| r.what().starts_with(verb)))
            .take(5)
            .map(|r| format!("({} {})", r.verb, r.request_uri)),
    );
    Ok(vec![
        Row::new(
            format!("controller at rest, {what}: resident memory (peak)"),
            format!("< {MEMORY_GOAL_MIB} MiB"),
            format!("{rss:.1} MiB ({peak:.1} MiB)"),
            Some(peak < MEMORY_GOAL_MIB),
        ),
        Row::new(
            format!(
                "controller at rest, {what}: CPU over {:.0} s",
                window.as_secs_f64()
            ),
            format!("<= {:.0} % of a core", REST_CPU_GOAL * 100.0),
            format!("{:.2} % of a core", cpu * 100.0),
            Some(cpu <= REST_CPU_GOAL),
        ),
        Row::new(
            format!("controller at rest, {what}: the resync"),
            "no pod LIST, no API write".into(),
            format!(
                "{reconciled:.0} reconciles, {pod_lists} pod LISTs, {writes} writes; requests: {}",
                if requests.is_empty() {
                    "none".into()
                } else {
                    requests.join(", ")
                }
            ),
            Some(pod_lists == 0 && writes == 0),
        ),
    ])
}

/// `groups` LeaderGroups of three pods each, every pod a live member: how
/// long until every group's leader is labelled, then the controller at rest.
async fn scale(
    api: &ApiServer,
    admin: &kube::Client,
    store: &Store,
    controller: &mut ControllerProcess,
    groups: usize,
) -> anyhow::Result<Vec<Row>> {
    let timings = ElectionConfig::default();
    create_namespace(admin, SCALE_NS).await?;
    progress(&format!(
        "controller: creating {groups} groups and {} pods",
        groups * 3
    ));
    let created = Instant::now();
    futures::stream::iter(0..groups)
        .map(|g| async move {
            for p in 0..3 {
                create_pod(admin, SCALE_NS, &format!("g{g}-{p}"), &format!("g{g}")).await?;
            }
            create_group(admin, SCALE_NS, &format!("g{g}"), timings).await
        })
        .buffer_unordered(IN_FLIGHT)
        .try_collect::<Vec<()>>()
        .await?;
    let created = created.elapsed();
    progress(&format!("controller: starting {} member nodes", groups * 3));
    let (labels, _watch) = Leaders::labelled(admin.clone(), SCALE_NS);
    let started = Instant::now();
    let members: Vec<Member> = futures::stream::iter(0..groups * 3)
        .map(|i| {
            let (g, p) = (i / 3, i % 3);
            async move {
                Member::start(
                    store,
                    SCALE_NS,
                    &format!("g{g}-{p}"),
                    &format!("g{g}"),
                    timings,
                )
                .await
            }
        })
        .buffer_unordered(IN_FLIGHT * 4)
        .try_collect()
        .await?;
    wait_until(
        Duration::from_secs(600),
        &format!("all {groups} leaders labelled"),
        || {
            progress(&format!(
                "controller: {} of {groups} leaders labelled",
                labels.count()
            ));
            labels.count() == groups
        },
    )
    .await?;
    let labelled = started.elapsed();
    let mut rows = vec![Row::new(
        format!("controller, {groups} groups x 3 pods: every leader labelled"),
        "-".into(),
        format!(
            "{:.1} s after the members started ({:.1} s to create the {} objects)",
            labelled.as_secs_f64(),
            created.as_secs_f64(),
            groups * 4
        ),
        None,
    )];
    progress(&format!("controller: at rest with {groups} groups"));
    rows.extend(scale_at_rest(api, admin, controller, groups).await?);
    drop(members); // the store's prefix is thrown away with the run
    Ok(rows)
}

/// The scale step's groups at rest, and whether their leaders stayed.
async fn scale_at_rest(
    api: &ApiServer,
    admin: &kube::Client,
    controller: &mut ControllerProcess,
    groups: usize,
) -> anyhow::Result<Vec<Row>> {
    let before = leader_changes(admin, SCALE_NS).await?;
    let mut rows = at_rest(
        api,
        controller,
        &format!("{groups} groups x 3 pods"),
        Duration::from_secs(35),
    )
    .await?;
    // A leader change in the window (a member of this loaded process
    // missing its renewals) is a change, and its status write no cost of
    // rest: said, so the writes above can be read.
    let changed = leader_changes(admin, SCALE_NS).await? - before;
    rows.push(Row::new(
        format!("controller at rest, {groups} groups x 3 pods: leader changes in the window"),
        "-".into(),
        changed.to_string(),
        None,
    ));
    Ok(rows)
}

/// The leader changes the groups of `namespace` have seen, in all.
async fn leader_changes(admin: &kube::Client, namespace: &str) -> anyhow::Result<i64> {
    let groups: Api<LeaderGroup> = Api::namespaced(admin.clone(), namespace);
    Ok(groups
        .list(&Default::default())
        .await?
        .items
        .iter()
        .filter_map(|g| g.status.as_ref())
        .map(|s| s.transitions)
        .sum())
}

/// The controller's waits look every 100 ms: each look is a read of the
/// bench's own caches, not a process.
async fn wait_until(
    limit: Duration,
    what: &str,
    check: impl FnMut() -> bool,
) -> anyhow::Result<()> {
    crate::promotion::until("controller", Duration::from_millis(100), limit, what, check).await
}

/// The CRD, the controller's namespace, and its user bound to cluster-admin.
pub(super) async fn prepare(admin: &kube::Client) -> anyhow::Result<()> {
    // kube's errors write their causes into their messages: taken flat.
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    crds.create(&PostParams::default(), &LeaderGroup::crd())
        .await
        .map_err(anyhow::Error::msg)
        .context("create the CRD")?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let crd = crds
            .get("leadergroups.leasehold.dev")
            .await
            .map_err(anyhow::Error::msg)?;
        let established = crd
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        if established {
            break;
        }
        if Instant::now() > deadline {
            bail!("the CRD was not established within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    create_namespace(admin, CONTROLLER_NAMESPACE).await?;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": { "name": "leasehold-bench" },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin" },
        "subjects": [{ "kind": "User", "name": User::Controller.username() }]
    }))?;
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await
        .map_err(anyhow::Error::msg)
        .context("bind the controller's user")?;
    Ok(())
}

pub(super) async fn create_namespace(admin: &kube::Client, name: &str) -> anyhow::Result<()> {
    let ns: Namespace = serde_json::from_value(json!({ "metadata": { "name": name } }))?;
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &ns)
        .await
        .map(drop)
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("create namespace {name}"))
}

pub(super) async fn create_pod(
    admin: &kube::Client,
    ns: &str,
    name: &str,
    app: &str,
) -> anyhow::Result<()> {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": { "name": name, "labels": { "app": app } },
        "spec": { "containers": [{ "name": "app", "image": "bench:none" }] }
    }))?;
    let pods = Api::<Pod>::namespaced(admin.clone(), ns);
    pods.create(&PostParams::default(), &pod)
        .await
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("create pod {ns}/{name}"))?;
    // What a kubelet would report (there is none): an IP and Ready.
    let n = format!("{ns}/{name}")
        .bytes()
        .fold(7u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
    let ip = format!(
        "10.{}.{}.{}",
        1 + n % 200,
        (n >> 8) % 250,
        1 + (n >> 16) % 250
    );
    let status = json!({ "status": {
        "phase": "Running",
        "podIP": ip,
        "podIPs": [{ "ip": ip }],
        "conditions": [{ "type": "Ready", "status": "True" }],
    } });
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .map(drop)
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("set the status of pod {ns}/{name}"))
}

pub(super) async fn create_group(
    admin: &kube::Client,
    ns: &str,
    name: &str,
    t: ElectionConfig,
) -> anyhow::Result<()> {
    create_group_with(admin, ns, name, t, None).await
}

/// [`create_group`] with a `spec.service`.
async fn create_group_with(
    admin: &kube::Client,
    ns: &str,
    name: &str,
    t: ElectionConfig,
    service: Option<serde_json::Value>,
) -> anyhow::Result<()> {
    let mut group = json!({
        "apiVersion": "leasehold.dev/v1alpha1", "kind": "LeaderGroup",
        "metadata": { "name": name },
        "spec": { "selector": { "matchLabels": { "app": name } },
                  "ttlMs": t.ttl_ms, "renewIntervalMs": t.renew_interval_ms,
                  "retryIntervalMs": t.retry_interval_ms }
    });
    if let Some(service) = service {
        group["spec"]["service"] = service;
    }
    Api::<LeaderGroup>::namespaced(admin.clone(), ns)
        .patch(
            name,
            &PatchParams::apply("leasehold-bench"),
            &Patch::Apply(group),
        )
        .await
        .map(drop)
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("create LeaderGroup {ns}/{name}"))
}
