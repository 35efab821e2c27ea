//! The controller against a real API server (etcd + kube-apiserver 1.20 from
//! `scripts/kubernetes/build.sh apiserver`, see `support/kube_api.rs`), as
//! the `leasehold controller` process holding the chart's ServiceAccount
//! token, so it has the chart's RBAC and nothing more. Pods are API objects
//! (no kubelet); each member pod has a real `leasehold agent` process named
//! after it, electing on a real redis-server.
//!
//! A watch of the namespace's pods follows every label change in the order
//! the API server made them: at no point may two pods carry the leader
//! label. Each test starts its own API server (about ten seconds).

use leasehold_testkit as testkit;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, CustomResourceExt};
use leasehold_kube::crd::{LeaderGroup, DEFAULT_ROLE_LABEL};
use leasehold_kube::test_hooks::STOP_BEFORE_LABEL;
use serde_json::{json, Value};
use testkit::agent::Agent;
use testkit::kube_api::{ApiServer, User, CONTROLLER_NAMESPACE, CONTROLLER_SERVICE_ACCOUNT};
use testkit::{eventually_async, free_port, RedisServer, Signal};

pub(crate) const NS: &str = "shop";
/// The group's timings: ttl 1000, renew 300, retry 200 ms.
pub(crate) const TTL: Duration = Duration::from_millis(1000);
pub(crate) const RETRY: Duration = Duration::from_millis(200);

/// How long a leader change may take to show as labels: the old lease's
/// ttl (a SIGKILLed leader), a claim on the next retry tick, then the
/// engine event, a reconcile and the label patches; two retry intervals and
/// a second of margin for the API server on a busy machine.
pub(crate) fn label_bound() -> Duration {
    TTL + 2 * RETRY + Duration::from_secs(2)
}

/// The pods' role labels as the API server changed them, from one watch.
#[derive(Default)]
struct LabelState {
    roles: BTreeMap<String, String>,
    /// Every state with two or more leaders, described.
    two_leaders: Vec<String>,
    changes: usize,
    /// Each change of a pod's role label a watch event brought, the role
    /// after it (a relist replaces `roles` and adds nothing here).
    history: Vec<(String, Option<String>)>,
}

pub(crate) struct LabelWatch {
    state: Arc<Mutex<LabelState>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for LabelWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl LabelWatch {
    pub(crate) fn start(client: kube::Client) -> Self {
        let state = Arc::new(Mutex::new(LabelState::default()));
        let api: Api<Pod> = Api::namespaced(client, NS);
        let shared = state.clone();
        let task = tokio::spawn(async move {
            let mut relist: Option<BTreeMap<String, String>> = None;
            // Backing off as the controller does: a watch without it retries in
            // a busy loop while the API server is down.
            let mut events = watcher(api, watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(event) = events.next().await {
                let Ok(event) = event else { continue };
                let mut s = shared.lock().unwrap();
                match event {
                    watcher::Event::Init => relist = Some(BTreeMap::new()),
                    watcher::Event::InitApply(pod) => {
                        if let (Some(r), Some(role)) = (relist.as_mut(), role_of(&pod)) {
                            r.insert(pod.metadata.name.clone().unwrap_or_default(), role);
                        }
                    }
                    watcher::Event::InitDone => {
                        if let Some(r) = relist.take() {
                            s.roles = r;
                        }
                    }
                    watcher::Event::Apply(pod) => {
                        let name = pod.metadata.name.clone().unwrap_or_default();
                        let role = role_of(&pod);
                        let before = match &role {
                            Some(role) => s.roles.insert(name.clone(), role.clone()),
                            None => s.roles.remove(&name),
                        };
                        if before != role {
                            s.history.push((name, role));
                        }
                    }
                    watcher::Event::Delete(pod) => {
                        s.roles
                            .remove(&pod.metadata.name.clone().unwrap_or_default());
                    }
                }
                s.changes += 1;
                let leaders: Vec<&String> = s
                    .roles
                    .iter()
                    .filter(|(_, r)| *r == "leader")
                    .map(|(n, _)| n)
                    .collect();
                if leaders.len() > 1 {
                    let what = format!("{leaders:?}");
                    s.two_leaders.push(what);
                }
            }
        });
        Self { state, task }
    }

    pub(crate) fn leader(&self) -> Option<String> {
        let s = self.state.lock().unwrap();
        s.roles
            .iter()
            .find(|(_, r)| *r == "leader")
            .map(|(n, _)| n.clone())
    }

    pub(crate) fn roles(&self) -> BTreeMap<String, String> {
        self.state.lock().unwrap().roles.clone()
    }

    /// How many role changes have been seen; [`LabelWatch::changes_since`]
    /// lists those after.
    fn history_mark(&self) -> usize {
        self.state.lock().unwrap().history.len()
    }

    fn changes_since(&self, mark: usize) -> Vec<(String, Option<String>)> {
        self.state.lock().unwrap().history[mark..].to_vec()
    }

    /// Waits for a leader label on a pod other than `not`; returns it.
    pub(crate) async fn next_leader(
        &self,
        not: Option<&str>,
        limit: Duration,
    ) -> (String, Duration) {
        let start = Instant::now();
        loop {
            if let Some(l) = self.leader().filter(|l| Some(l.as_str()) != not) {
                return (l, start.elapsed());
            }
            assert!(
                start.elapsed() < limit,
                "no leader label other than {not:?} within {limit:?}; labels: {:?}",
                self.roles()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    pub(crate) fn assert_never_two_leaders(&self) {
        let s = self.state.lock().unwrap();
        assert!(
            s.two_leaders.is_empty(),
            "two pods carried the leader label at once: {:?}",
            s.two_leaders
        );
        assert!(s.changes > 0, "the label watch saw nothing");
    }
}

fn role_of(pod: &Pod) -> Option<String> {
    pod.metadata
        .labels
        .as_ref()?
        .get(DEFAULT_ROLE_LABEL)
        .cloned()
}

/// `leasehold controller` as a process, with the chart's ServiceAccount's
/// kubeconfig; its log goes to a file the test reads.
pub(crate) struct Controller {
    pub(crate) name: String,
    child: Option<Child>,
    log: PathBuf,
    port: u16,
    /// The file that arms its test hook, if it was started with one.
    hook: Option<PathBuf>,
}

impl Controller {
    fn start(api: &ApiServer, redis: &RedisServer, name: &str) -> Self {
        Self::start_with(api, redis, name, &[])
    }

    /// [`Controller::start`] with more flags.
    fn start_with(api: &ApiServer, redis: &RedisServer, name: &str, extra: &[&str]) -> Self {
        Self::start_with_env(api, redis, name, extra, &[])
    }

    /// [`Controller::start_with`] with more environment variables.
    fn start_with_env(
        api: &ApiServer,
        redis: &RedisServer,
        name: &str,
        extra: &[&str],
        env: &[(&str, &std::ffi::OsStr)],
    ) -> Self {
        Self::start_at(api, &redis.url(), name, extra, env)
    }

    /// A controller of the store at `url`.
    pub(crate) fn start_at(
        api: &ApiServer,
        url: &str,
        name: &str,
        extra: &[&str],
        env: &[(&str, &std::ffi::OsStr)],
    ) -> Self {
        let port = free_port();
        let log = api.dir.join(format!("{name}.log"));
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .args(["controller", "--store-url", url, "--prefix", "lh"])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args([
                "--replica-ttl-ms",
                "1000",
                "--replica-renew-interval-ms",
                "300",
            ])
            .args(["--replica-retry-interval-ms", "100"])
            .args(extra)
            .env("KUBECONFIG", api.kubeconfig(User::Controller))
            .env("POD_NAME", name)
            .env("POD_NAMESPACE", CONTROLLER_NAMESPACE)
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .expect("spawn leasehold controller");
        Self {
            name: name.into(),
            child: Some(child),
            log,
            port,
            hook: None,
        }
    }

    /// [`Controller::start`] with the controller's test hook
    /// (`leasehold_kube::test_hooks`) pointed at a file of its own, which
    /// [`Controller::stop_before_label`] writes.
    fn start_hooked(api: &ApiServer, redis: &RedisServer, name: &str) -> Self {
        let hook = api.dir.join(format!("{name}.stop-before-label"));
        let env = [(STOP_BEFORE_LABEL, hook.as_os_str())];
        let mut controller = Self::start_with_env(api, redis, name, &[], &env);
        controller.hook = Some(hook);
        controller
    }

    /// Arms the hook: the process stops itself (SIGSTOP) after the
    /// leadership check of its next label patch of `value`, before sending it.
    fn stop_before_label(&self, value: &str) {
        std::fs::write(self.hook.as_ref().expect("started hooked"), value).unwrap();
    }

    /// Waits until the hook has stopped the process; the patch it holds,
    /// `POD KEY=VALUE`.
    async fn held_patch(&self, limit: Duration) -> String {
        testkit::eventually(limit, "the replica stopped itself", || self.stopped()).await;
        let hook = self.hook.as_ref().expect("started hooked");
        let held = std::fs::read_to_string(format!("{}.stopped", hook.display())).unwrap();
        held.trim().to_owned()
    }

    pub(crate) async fn active(&self) -> bool {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], self.port));
        let (code, body) = testkit::http_status(addr, "GET", "/metrics").await;
        code == 200
            && body
                .lines()
                .any(|l| l.starts_with("leasehold_controller_active") && l.ends_with(" 1"))
    }

    /// Whether it is up, and a standby.
    pub(crate) async fn serves(&self) -> bool {
        self.metric("leasehold_controller_active").await == Some(0.0)
    }

    /// The value of the series `name{labels}` in this replica's /metrics.
    async fn metric(&self, series: &str) -> Option<f64> {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], self.port));
        let (code, body) = testkit::http_status(addr, "GET", "/metrics").await;
        if code != 200 {
            return None;
        }
        body.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    pub(crate) fn signal(&mut self, sig: Signal) {
        let child = self.child.as_ref().expect("running");
        assert!(
            testkit::send_signal(child.id(), sig),
            "{sig} to {}",
            self.name
        );
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Whether the process is stopped (`T` in `/proc/PID/stat`), as by SIGSTOP.
    fn stopped(&self) -> bool {
        let pid = self.child.as_ref().expect("running").id();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // The state follows the command's name, which is in parentheses.
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            == Some("T")
    }

    /// Lines of its log where the API server refused it for want of RBAC.
    pub(crate) fn forbidden(&self) -> Vec<String> {
        self.log()
            .lines()
            .filter(|l| l.to_ascii_lowercase().contains("forbidden"))
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            let log = self.log();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            eprintln!(
                "--- {} log (last lines, newest first):\n{}",
                self.name,
                tail.join("\n")
            );
        }
    }
}

/// An API server with the CRD, the chart's RBAC, namespace `shop` with pods
/// `web-0..n` (labels `app=web`), and a redis-server.
struct Testbed {
    api: ApiServer,
    admin: kube::Client,
    redis: RedisServer,
    agents: BTreeMap<String, Agent>,
}

impl Testbed {
    async fn start(test: &str, pods: usize) -> Option<Self> {
        Self::start_with(test, pods, &[]).await
    }

    /// [`Testbed::start`] with the chart's RBAC rendered with `chart_values`
    /// (`--set`).
    async fn start_with(test: &str, pods: usize, chart_values: &[&str]) -> Option<Self> {
        let (api, admin) = prepared_api_server(test, chart_values).await?;
        let bed = Self {
            api,
            admin,
            redis: RedisServer::start(),
            agents: BTreeMap::new(),
        };
        for i in 0..pods {
            bed.create_pod(&format!("web-{i}")).await;
        }
        Some(bed)
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.admin.clone(), NS)
    }

    fn groups(&self) -> Api<LeaderGroup> {
        Api::namespaced(self.admin.clone(), NS)
    }

    async fn create_pod(&self, name: &str) {
        create_pod(&self.admin, name).await;
    }

    async fn create_group(&self, name: &str, spec: Value) -> Result<LeaderGroup, kube::Error> {
        create_group(&self.admin, name, spec).await
    }

    /// The group `web` every test uses: pods `app=web`, ttl 1000/300/200.
    async fn create_web_group(&self) {
        self.create_group(
            "web",
            json!({ "selector": { "matchLabels": { "app": "web" } },
                    "ttlMs": 1000, "renewIntervalMs": 300, "retryIntervalMs": 200 }),
        )
        .await
        .expect("create LeaderGroup web");
    }

    /// The usual start: group `web`, an agent for each of `pods`, the
    /// controller; returns it and the first leader the watch saw labelled.
    async fn elect(&mut self, pods: &[&str], watch: &LabelWatch) -> (Controller, String) {
        self.create_web_group().await;
        for pod in pods {
            self.start_agent(pod).await;
        }
        let controller = Controller::start(&self.api, &self.redis, "leasehold-0");
        let (leader, took) = watch.next_leader(None, Duration::from_secs(20)).await;
        println!("first leader label: {leader} after {took:?}");
        (controller, leader)
    }

    /// Starts the agent of pod `pod` (a new process; one already running
    /// for it is killed first).
    async fn start_agent(&mut self, pod: &str) {
        self.start_agent_with(pod, &[]).await;
    }

    /// [`Testbed::start_agent`] with more flags.
    async fn start_agent_with(&mut self, pod: &str, extra: &[&str]) {
        self.agents.remove(pod);
        let port = free_port();
        let args: Vec<String> = [
            "agent",
            "--redis-url",
            &self.redis.url(),
            "--prefix",
            "lh",
            "--namespace",
            NS,
            "--pod-name",
            pod,
            "--group",
            "web",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--ttl-ms",
            "1000",
            "--renew-interval-ms",
            "300",
            "--retry-interval-ms",
            "200",
        ]
        .iter()
        .chain(extra)
        .map(|s| s.to_string())
        .collect();
        let agent = Agent::start(&format!("{NS}/{pod}"), port, args).await;
        self.agents.insert(pod.to_owned(), agent);
    }

    fn agent(&self, pod: &str) -> &Agent {
        self.agents.get(pod).expect("an agent for the pod")
    }

    async fn status(&self, group: &str) -> Value {
        let g = self.groups().get(group).await.expect("get group");
        serde_json::to_value(g.status).unwrap_or(Value::Null)
    }

    async fn condition(&self, group: &str, type_: &str) -> Option<(String, String, String)> {
        let status = self.status(group).await;
        let c = status["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == type_)?
            .clone();
        Some((
            c["status"].as_str()?.to_owned(),
            c["reason"].as_str()?.to_owned(),
            c["message"].as_str().unwrap_or("").to_owned(),
        ))
    }

    /// The note of the newest Event about LeaderGroup `group`.
    async fn latest_event_note(&self, group: &str) -> Option<String> {
        let events: Api<Event> = Api::namespaced(self.admin.clone(), NS);
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items
            .into_iter()
            .filter(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(group)
                    && e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("LeaderGroup")
            })
            .max_by_key(|e| e.event_time.as_ref().map(|t| t.0))
            .and_then(|e| e.note)
    }
}

/// An API server with the CRD, namespaces `shop` and the controller's, and
/// the chart's RBAC rendered with `chart_values` (`--set`); its admin client.
pub(crate) async fn prepared_api_server(
    test: &str,
    chart_values: &[&str],
) -> Option<(ApiServer, kube::Client)> {
    let helm = testkit::helm_or_skip(test)?;
    let api = ApiServer::start(test).await?;
    let admin = api.client(User::Admin).await;
    install_crd(&admin).await;
    for ns in [NS, CONTROLLER_NAMESPACE] {
        let ns: Namespace = serde_json::from_value(json!({ "metadata": { "name": ns } })).unwrap();
        Api::<Namespace>::all(admin.clone())
            .create(&PostParams::default(), &ns)
            .await
            .expect("create namespace");
    }
    apply_chart_rbac(&helm, &admin, chart_values).await;
    Some((api, admin))
}

/// Pod `name` of namespace `shop` (labels `app=web`), with the IP and
/// readiness a kubelet would report.
pub(crate) async fn create_pod(admin: &kube::Client, name: &str) {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": { "name": name, "labels": { "app": "web" } },
        "spec": { "containers": [{ "name": "app", "image": "leasehold-test:none" }] }
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
    // What a kubelet would report (there is none): an IP and Ready.
    let ip = pod_ip(name);
    let status = json!({ "status": {
        "phase": "Running",
        "podIP": ip,
        "podIPs": [{ "ip": ip }],
        "conditions": [{ "type": "Ready", "status": "True" }],
    } });
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("set the pod's status");
}

/// LeaderGroup `name` of namespace `shop`.
pub(crate) async fn create_group(
    admin: &kube::Client,
    name: &str,
    spec: Value,
) -> Result<LeaderGroup, kube::Error> {
    let group: LeaderGroup = serde_json::from_value(json!({
        "apiVersion": "leasehold.dev/v1alpha1", "kind": "LeaderGroup",
        "metadata": { "name": name },
        "spec": spec,
    }))
    .unwrap();
    Api::<LeaderGroup>::namespaced(admin.clone(), NS)
        .create(&PostParams::default(), &group)
        .await
}

/// The IP the testbed gives pod `name`: distinct per name.
fn pod_ip(name: &str) -> String {
    let n = name
        .bytes()
        .fold(7u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
    format!(
        "10.{}.{}.{}",
        1 + n % 200,
        (n >> 8) % 250,
        1 + (n >> 16) % 250
    )
}

async fn install_crd(admin: &kube::Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    crds.create(&PostParams::default(), &LeaderGroup::crd())
        .await
        .expect("create the LeaderGroup CRD");
    eventually_async(Duration::from_secs(10), "the CRD is established", || {
        let crds = crds.clone();
        async move {
            let Ok(crd) = crds.get("leadergroups.leasehold.dev").await else {
                return false;
            };
            crd.status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        }
    })
    .await;
}

/// The chart's ServiceAccount, ClusterRole and ClusterRoleBinding, as
/// `helm template` renders them for release `leasehold` in
/// `leasehold-system`, created as they are.
async fn apply_chart_rbac(helm: &std::path::Path, admin: &kube::Client, values: &[&str]) {
    let out = Command::new(helm)
        .args(values.iter().flat_map(|v| ["--set", v]))
        .args([
            "template",
            "leasehold",
            concat!(env!("CARGO_MANIFEST_DIR"), "/charts/leasehold"),
        ])
        .args(["--namespace", CONTROLLER_NAMESPACE])
        .args(["--show-only", "templates/rbac.yaml"])
        .args(["--show-only", "templates/serviceaccount.yaml"])
        .output()
        .expect("run helm");
    assert!(
        out.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let mut kinds = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let value: Value = serde::Deserialize::deserialize(doc).unwrap();
        if value.is_null() {
            continue;
        }
        let kind = value["kind"].as_str().unwrap_or("").to_owned();
        let pp = PostParams::default();
        match kind.as_str() {
            "ServiceAccount" => {
                assert_eq!(value["metadata"]["name"], CONTROLLER_SERVICE_ACCOUNT);
                let sa: ServiceAccount = serde_json::from_value(value).unwrap();
                Api::<ServiceAccount>::namespaced(admin.clone(), CONTROLLER_NAMESPACE)
                    .create(&pp, &sa)
                    .await
                    .map(drop)
            }
            "ClusterRole" => Api::<ClusterRole>::all(admin.clone())
                .create(&pp, &serde_json::from_value(value).unwrap())
                .await
                .map(drop),
            "ClusterRoleBinding" => Api::<ClusterRoleBinding>::all(admin.clone())
                .create(&pp, &serde_json::from_value(value).unwrap())
                .await
                .map(drop),
            other => panic!("unexpected {other} in the chart's RBAC"),
        }
        .unwrap_or_else(|e| panic!("create the chart's {kind}: {e}"));
        kinds.push(kind);
    }
    kinds.sort();
    assert_eq!(
        kinds,
        ["ClusterRole", "ClusterRoleBinding", "ServiceAccount"]
    );
}

/// `kubectl` as a user runs it, or `None` when there is none and the
/// Kubernetes part is left out on purpose (a failure otherwise).
pub(crate) fn kubectl(api: &ApiServer, args: &[&str]) -> Option<String> {
    let out = match Command::new("kubectl")
        .args(args)
        .env("KUBECONFIG", api.kubeconfig(User::Admin))
        .output()
    {
        Ok(out) => out,
        Err(e) => {
            testkit::lacks(
                "kubectl",
                testkit::Part::Kubernetes,
                &format!("kubectl: {e} (scripts/kubernetes/build.sh apiserver installs it)"),
            );
            return None;
        }
    };
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(String::from_utf8(out.stdout).unwrap())
}

/// The status of `web`, and its series on `controller`'s /metrics: has a
/// leader, term, live members, leader changes.
async fn group_figures(bed: &Testbed, controller: &Controller) -> (Value, Vec<Option<f64>>) {
    let status = bed.status("web").await;
    let mut got = Vec::new();
    for name in [
        "group_has_leader",
        "group_term",
        "group_live_members",
        "group_leader_changes_total",
    ] {
        let series = format!("leasehold_{name}{{namespace=\"{NS}\",group=\"web\"}}");
        got.push(controller.metric(&series).await);
    }
    (status, got)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_label_follows_kills_terminations_and_step_downs() {
    let Some(mut bed) = Testbed::start("apiserver: labels follow the leader", 3).await else {
        return;
    };
    let watch = LabelWatch::start(bed.admin.clone());
    // First election, reflected: one leader, two followers, the status.
    let (controller, first) = bed.elect(&["web-0", "web-1", "web-2"], &watch).await;
    eventually_async(Duration::from_secs(5), "two followers labelled", || async {
        watch.roles().values().filter(|r| *r == "follower").count() == 2
    })
    .await;
    eventually_async(Duration::from_secs(5), "status names the leader", || {
        let bed = &bed;
        let first = first.clone();
        async move {
            let s = bed.status("web").await;
            s["leader"] == first.as_str() && s["term"].as_i64() >= Some(1) && s["liveMembers"] == 3
        }
    })
    .await;
    let (ready, reason, _) = bed
        .condition("web", "Ready")
        .await
        .expect("Ready condition");
    assert_eq!((ready.as_str(), reason.as_str()), ("True", "Ready"));

    // What `kubectl get lg -o wide` shows: the columns, the leader, and how
    // long it has led.
    if let Some(table) = kubectl(&bed.api, &["get", "lg", "-n", NS, "-o", "wide"]) {
        println!("{table}");
        let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
        assert_eq!(
            header,
            [
                "NAME",
                "LEADER",
                "TERM",
                "LIVE",
                "READY",
                "AGE",
                "SINCE",
                "ENDPOINT",
                "PREFERRED"
            ]
        );
        let row = table.lines().nth(1).expect("a row for web");
        assert!(row.starts_with("web ") && row.contains(&first), "{row}");
        assert!(!row.contains("<invalid>"), "{row}");
        let columns: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(columns[4], "True", "READY: {row}");
        // A relative time: "12s", "3m4s".
        assert!(
            columns[6].ends_with('s') || columns[6].ends_with('m'),
            "SINCE: {row}"
        );
        // No spec.service: the ENDPOINT column is blank; all at the
        // default priority: placement prefers the leader.
        assert_eq!(columns.len(), 8, "{row}");
        assert_eq!(columns[7], first, "{row}");
    }
    let term_of = |s: &Value| s["term"].as_i64().unwrap_or(0);
    let note = bed.latest_event_note("web").await.expect("an Event on web");
    assert!(note.contains(&first), "latest event: {note}");

    // The group's series on the active replica's /metrics follow the status.
    eventually_async(Duration::from_secs(5), "the group's metrics", || async {
        let (s, got) = group_figures(&bed, &controller).await;
        got == [
            Some(1.0),
            Some(term_of(&s) as f64),
            Some(3.0),
            s["transitions"].as_i64().map(|t| t as f64),
        ]
    })
    .await;
    let changes_before = group_figures(&bed, &controller).await.1[3].unwrap();

    // SIGKILL: the old lease runs out, another pod is labelled.
    let mut leader = first;
    let mut term = term_of(&bed.status("web").await);
    for how in [Signal::SIGKILL, Signal::SIGTERM] {
        bed.agent(&leader).signal(how);
        let (next, took) = watch.next_leader(Some(&leader), label_bound()).await;
        println!("{how}: label moved {leader} -> {next} in {took:?}");
        if how == Signal::SIGTERM {
            // A terminated agent releases its lease: no ttl to wait for.
            assert!(took < 2 * RETRY + Duration::from_secs(2), "{took:?}");
        }
        eventually_async(Duration::from_secs(5), "status and events follow", || {
            let bed = &bed;
            let next = next.clone();
            async move {
                let s = bed.status("web").await;
                let note = bed.latest_event_note("web").await.unwrap_or_default();
                s["leader"] == next.as_str() && term_of(&s) > term && note.contains(&next)
            }
        })
        .await;
        let status = bed.status("web").await;
        let new_term = term_of(&status);
        let note = bed.latest_event_note("web").await.unwrap();
        assert!(
            note.contains(&format!("term {new_term}")),
            "the latest Event tells the current term {new_term}: {note}"
        );
        term = new_term;
        bed.start_agent(&leader).await; // the pod's container restarts
        leader = next;
    }

    // Two leader changes later (the SIGKILL's and the SIGTERM's), the
    // metrics count them and show the new term.
    eventually_async(Duration::from_secs(5), "the metrics follow", || async {
        let (s, got) = group_figures(&bed, &controller).await;
        got[0] == Some(1.0)
            && got[1] == Some(term_of(&s) as f64)
            && got[1] == Some(term as f64)
            && got[3] >= Some(changes_before + 2.0)
    })
    .await;

    // A step-down asked on the LeaderGroup.
    bed.groups()
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(
                json!({ "metadata": { "annotations": { "leasehold.dev/step-down": "1" } } }),
            ),
        )
        .await
        .expect("annotate");
    let (next, took) = watch.next_leader(Some(&leader), label_bound()).await;
    println!("step-down: label moved {leader} -> {next} in {took:?}");
    assert!(took < 2 * RETRY + Duration::from_secs(2), "{took:?}");

    eventually_async(Duration::from_secs(5), "two followers again", || async {
        watch.roles().values().filter(|r| *r == "follower").count() == 2
    })
    .await;
    watch.assert_never_two_leaders();
    assert_eq!(controller.forbidden(), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_specs_are_refused_or_reported_and_label_nothing() {
    let Some(bed) = Testbed::start("apiserver: bad specs", 2).await else {
        return;
    };
    let controller = Controller::start(&bed.api, &bed.redis, "leasehold-0");

    // Out of the schema's range: refused by the API server, naming the field.
    let err = bed
        .create_group(
            "zero-ttl",
            json!({ "selector": { "matchLabels": { "app": "web" } }, "ttlMs": 0 }),
        )
        .await
        .expect_err("ttlMs 0 is refused");
    let text = err.to_string();
    assert!(text.contains("spec.ttlMs"), "{text}");
    assert!(bed.groups().get_opt("zero-ttl").await.unwrap().is_none());
    let err = bed
        .create_group(
            "far-port",
            json!({ "selector": { "matchLabels": { "app": "web" } },
                    "service": { "name": "web-leader", "ports": [{ "port": 70000 }] } }),
        )
        .await
        .expect_err("port 70000 is refused");
    let text = err.to_string();
    assert!(text.contains("spec.service.ports"), "{text}");

    // What 1.20 cannot check (it has no CEL rules): the controller reports
    // it as SpecValid=False and labels nothing for that group.
    bed.create_group(
        "slow-renew",
        json!({ "selector": { "matchLabels": { "app": "web" } },
                "ttlMs": 1000, "renewIntervalMs": 1000, "retryIntervalMs": 200 }),
    )
    .await
    .expect("accepted by 1.20");
    bed.create_group(
        "self-label",
        json!({ "selector": { "matchLabels": { "app": "web" } }, "roleLabel": "app" }),
    )
    .await
    .expect("accepted by 1.20");
    bed.create_group(
        "bad-service",
        json!({ "selector": { "matchLabels": { "app": "web" } },
                "service": { "name": "Web_Leader", "ports": [{ "port": 80 }] } }),
    )
    .await
    .expect("accepted by 1.20");
    // A good spec.service, but this controller runs without
    // --leader-endpoints: said in the condition, and nothing written.
    bed.create_group(
        "off",
        json!({ "selector": { "matchLabels": { "app": "none" } },
                "service": { "name": "off-leader", "ports": [{ "port": 80 }] } }),
    )
    .await
    .expect("create off");
    eventually_async(
        Duration::from_secs(20),
        "LeaderEndpoint False on off",
        || async {
            matches!(bed.condition("off", "LeaderEndpoint").await,
            Some((s, _, m)) if s == "False" && m.contains("--leader-endpoints"))
        },
    )
    .await;
    let services = Api::<k8s_openapi::api::core::v1::Service>::namespaced(bed.admin.clone(), NS);
    assert!(services.get_opt("off-leader").await.unwrap().is_none());
    let errors = controller
        .metric("leasehold_reconcile_errors_total{kind=\"endpoint\"}")
        .await;
    assert!(
        errors.unwrap_or(0.0) == 0.0,
        "a standing answer counted as errors: {errors:?}"
    );
    for (group, reason, field) in [
        ("slow-renew", "InvalidTimings", "renewIntervalMs"),
        ("self-label", "InvalidRoleLabel", "app"),
        (
            "bad-service",
            "InvalidService",
            "service.name \"Web_Leader\"",
        ),
    ] {
        eventually_async(
            Duration::from_secs(20),
            &format!("{group}: SpecValid=False {reason}"),
            || async {
                matches!(bed.condition(group, "SpecValid").await,
                    Some((s, r, _)) if s == "False" && r == reason)
            },
        )
        .await;
        let (_, _, message) = bed.condition(group, "SpecValid").await.unwrap();
        assert!(message.contains(field), "{group}: {message}");
        let (ready, _, _) = bed.condition(group, "Ready").await.unwrap();
        assert_eq!(ready, "False", "{group}");
    }
    let labelled: Vec<String> = bed
        .pods()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|p| role_of(p).is_some())
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    assert!(labelled.is_empty(), "labelled: {labelled:?}");
    assert_eq!(controller.forbidden(), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_deleted_and_recreated_and_a_deleted_group_leave_no_stale_label() {
    let Some(mut bed) = Testbed::start("apiserver: deletions", 3).await else {
        return;
    };
    let watch = LabelWatch::start(bed.admin.clone());
    let (controller, leader) = bed.elect(&["web-0", "web-1", "web-2"], &watch).await;

    // A follower's pod deleted and re-created under the same name (a
    // StatefulSet's way): the new pod gets its label back.
    let follower = ["web-0", "web-1", "web-2"]
        .into_iter()
        .find(|p| *p != leader)
        .unwrap()
        .to_owned();
    bed.agents.remove(&follower);
    bed.pods()
        .delete(&follower, &DeleteParams::default().grace_period(0))
        .await
        .expect("delete pod");
    eventually_async(Duration::from_secs(10), "the pod is gone", || async {
        bed.pods().get_opt(&follower).await.unwrap().is_none()
    })
    .await;
    bed.create_pod(&follower).await;
    bed.start_agent(&follower).await;
    eventually_async(
        Duration::from_secs(10),
        "the new pod is a follower",
        || async { watch.roles().get(&follower).map(String::as_str) == Some("follower") },
    )
    .await;

    // The leader's pod deleted: its agent dies with it, another leads.
    bed.agents.remove(&leader);
    bed.pods()
        .delete(&leader, &DeleteParams::default().grace_period(0))
        .await
        .expect("delete pod");
    let (next, took) = watch.next_leader(Some(&leader), label_bound()).await;
    println!("leader pod deleted: {leader} -> {next} in {took:?}");
    bed.create_pod(&leader).await;
    bed.start_agent(&leader).await;
    eventually_async(
        Duration::from_secs(10),
        "the re-created pod follows",
        || async { watch.roles().get(&leader).map(String::as_str) == Some("follower") },
    )
    .await;

    // The LeaderGroup deleted: every role label goes, the leader's too.
    bed.groups()
        .delete("web", &DeleteParams::default())
        .await
        .expect("delete group");
    eventually_async(Duration::from_secs(10), "no role label is left", || async {
        watch.roles().is_empty()
    })
    .await;
    let still: Vec<Option<String>> = bed
        .pods()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(role_of)
        .collect();
    assert!(still.iter().all(Option::is_none), "{still:?}");
    watch.assert_never_two_leaders();
    assert_eq!(controller.forbidden(), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_rides_out_an_api_server_restart() {
    let Some(mut bed) = Testbed::start("apiserver: restart", 3).await else {
        return;
    };
    bed.create_web_group().await;
    for pod in ["web-0", "web-1", "web-2"] {
        bed.start_agent(pod).await;
    }
    let controller = Controller::start(&bed.api, &bed.redis, "leasehold-0");
    let watch = LabelWatch::start(bed.admin.clone());
    let (leader, _) = watch.next_leader(None, Duration::from_secs(20)).await;
    drop(watch);

    // The API server goes away for 3 s; meanwhile the leader dies and the
    // election moves on in Redis. Once the server is back, the labels catch up.
    let down = Duration::from_secs(3);
    assert_eq!(controller.forbidden(), Vec::<String>::new());
    let before = controller.forbidden().len();
    bed.api.kill();
    bed.agents.remove(&leader);
    tokio::time::sleep(down).await;
    bed.api
        .start_again()
        .await
        .expect("kube-apiserver restarts");
    let back = Instant::now();
    let admin = bed.api.client(User::Admin).await;
    let watch = LabelWatch::start(admin);
    // The controller's watches back off up to a few seconds while the
    // server is down; its label patches retry after 1 s.
    let (next, _) = watch
        .next_leader(Some(&leader), Duration::from_secs(15))
        .await;
    println!(
        "after the restart: {leader} -> {next} {:?} after the server was ready",
        back.elapsed()
    );
    eventually_async(
        Duration::from_secs(10),
        "the dead leader's label is gone",
        || async { !watch.roles().contains_key(&leader) },
    )
    .await;
    watch.assert_never_two_leaders();
    assert!(
        !controller.log().contains("panicked"),
        "the controller panicked:\n{}",
        controller.log()
    );
    // A restarted API server answers 403 until its RBAC caches are filled,
    // after /readyz already says ok: such refusals are retried within
    // seconds (not at the 30 s resync), which the bound above holds.
    let after = controller.forbidden().len() - before;
    println!("403s from the restarted API server: {after}");
}

/// The one replica that says it is active, waiting up to `limit` for
/// exactly one to say so.
pub(crate) async fn one_active(replicas: &[Controller], limit: Duration) -> usize {
    let start = Instant::now();
    loop {
        let mut on = Vec::new();
        for (i, r) in replicas.iter().enumerate() {
            if r.active().await {
                on.push(i);
            }
        }
        if let [one] = on[..] {
            return one;
        }
        assert!(
            start.elapsed() < limit,
            "not one active replica within {limit:?}: {on:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_controller_replicas_hand_over() {
    let Some(mut bed) = Testbed::start("apiserver: two replicas", 2).await else {
        return;
    };
    let watch = LabelWatch::start(bed.admin.clone());
    bed.create_web_group().await;
    for pod in ["web-0", "web-1"] {
        bed.start_agent(pod).await;
    }
    let mut replicas = [
        Controller::start(&bed.api, &bed.redis, "leasehold-0"),
        Controller::start(&bed.api, &bed.redis, "leasehold-1"),
    ];
    let (mut leader, _) = watch.next_leader(None, Duration::from_secs(20)).await;

    for how in [Signal::SIGKILL, Signal::SIGTERM] {
        let active = one_active(&replicas, Duration::from_secs(10)).await;
        replicas[active].signal(how);
        // The standby takes over the controllers' election (ttl 1000 ms
        // after a SIGKILL), and the next leader change shows as labels.
        bed.agents.remove(&leader);
        let (next, took) = watch
            .next_leader(Some(&leader), Duration::from_secs(1) + label_bound())
            .await;
        println!("replica {active} {how}: label {leader} -> {next} {took:?} later");
        bed.start_agent(&leader).await;
        // The stopped replica comes back, as its pod would be restarted.
        let name = replicas[active].name.clone();
        let old = std::mem::replace(
            &mut replicas[active],
            Controller::start(&bed.api, &bed.redis, &name),
        );
        assert_eq!(old.forbidden(), Vec::<String>::new());
        leader = next;
    }
    watch.assert_never_two_leaders();
    for r in &replicas {
        assert_eq!(r.forbidden(), Vec::<String>::new());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_label_patch_is_retried_within_seconds() {
    let Some(mut bed) = Testbed::start("apiserver: refused patches", 2).await else {
        return;
    };
    let watch = LabelWatch::start(bed.admin.clone());
    let (controller, leader) = bed.elect(&["web-0", "web-1"], &watch).await;

    // The binding goes (as it does for a moment on a restarted API server,
    // whose RBAC caches are not filled yet), the leader dies: the next
    // label patches are refused with 403.
    let bindings: Api<ClusterRoleBinding> = Api::all(bed.admin.clone());
    let mut binding = bindings
        .get("leasehold")
        .await
        .expect("the chart's binding");
    bindings
        .delete("leasehold", &DeleteParams::default())
        .await
        .expect("delete the binding");
    bed.agents.remove(&leader);
    eventually_async(Duration::from_secs(10), "a refused label patch", || async {
        controller
            .forbidden()
            .iter()
            .any(|l| l.contains("refused a label patch"))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    binding.metadata.resource_version = None;
    binding.metadata.uid = None;
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .expect("the binding again");
    let back = Instant::now();
    // Refusals are retried after 1, 2, 4, 8 s...: the retry after the
    // binding is back comes within 4 s of it, plus a reconcile.
    let (next, _) = watch
        .next_leader(Some(&leader), Duration::from_secs(6))
        .await;
    println!(
        "label {leader} -> {next} {:?} after the binding was back",
        back.elapsed()
    );
    watch.assert_never_two_leaders();
}

/// A replica stopped between its leadership check and a label patch, for
/// longer than its lease, while the standby took over and moved the labels
/// on: woken, it sends the patch it planned from pods that have changed
/// since. The replica stops itself at that line (the controller's test
/// hook, armed for the next leader label it gives); the leader moves twice
/// meanwhile, so the held patch names a pod the successor has taken the
/// label from. The patch carries the pod's version as the plan read it:
/// the API server refuses it, no pod is labelled where the successor's
/// plan has none, and never two leaders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_woken_after_its_lease_ran_out_puts_no_label_back() {
    let Some(mut bed) = Testbed::start("apiserver: a stale replica woken", 3).await else {
        return;
    };
    let watch = LabelWatch::start(bed.admin.clone());
    bed.create_web_group().await;
    for pod in ["web-0", "web-1", "web-2"] {
        bed.start_agent(pod).await;
    }
    let mut replicas: Vec<Controller> = (0..2)
        .map(|i| Controller::start_hooked(&bed.api, &bed.redis, &format!("leasehold-{i}")))
        .collect();
    let (first, _) = watch.next_leader(None, Duration::from_secs(20)).await;
    eventually_async(Duration::from_secs(5), "three pods labelled", || async {
        watch.roles().len() == 3
    })
    .await;

    // The active replica will stop before the next leader label it gives;
    // the leader terminates.
    let active = one_active(&replicas, Duration::from_secs(10)).await;
    let standby = 1 - active;
    replicas[active].stop_before_label("leader");
    bed.agent(&first).signal(Signal::SIGTERM);
    let held = replicas[active].held_patch(label_bound()).await;
    let held_pod = held
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned();
    assert_eq!(held, format!("{held_pod} {DEFAULT_ROLE_LABEL}=leader"));
    println!("replica {active} stopped before its patch {held}");

    // The standby takes over once the stopped replica's lease (1000 ms)
    // ran out, and labels that pod; then its agent terminates too, and
    // the standby moves the label on.
    let (next, took) = watch
        .next_leader(Some(&first), Duration::from_secs(1) + label_bound())
        .await;
    println!("replica {standby} took over: label {first} -> {next} in {took:?}");
    assert_eq!(
        next, held_pod,
        "the standby labelled another pod than the held patch names"
    );
    assert!(replicas[standby].active().await);
    bed.agent(&held_pod).signal(Signal::SIGTERM);
    let (last, took) = watch.next_leader(Some(&held_pod), label_bound()).await;
    eventually_async(
        Duration::from_secs(5),
        "the held pod unlabelled",
        || async { !watch.roles().contains_key(&held_pod) },
    )
    .await;
    let settled = watch.roles();
    println!("label {held_pod} -> {last} in {took:?}; labels {settled:?}");

    // Woken, the stopped replica sends its patch at once.
    let (mark, seen) = (bed.api.audit_mark(), watch.history_mark());
    replicas[active].signal(Signal::SIGCONT);
    eventually_async(Duration::from_secs(5), "the held patch sent", || async {
        !patches_of(&bed.api, mark, &held_pod).is_empty()
    })
    .await;
    // Room for the successor to see it and undo it, had it landed.
    tokio::time::sleep(2 * RETRY + Duration::from_secs(1)).await;
    let answers = patches_of(&bed.api, mark, &held_pod);
    let changes = watch.changes_since(seen);
    println!(
        "after SIGCONT: patches of {held_pod} answered {answers:?}; label changes {changes:?}; labels {:?}",
        watch.roles()
    );
    watch.assert_never_two_leaders();
    assert!(
        !changes
            .iter()
            .any(|(pod, role)| pod == &held_pod && role.as_deref() == Some("leader")),
        "the woken replica put the leader label back on {held_pod}: {changes:?}"
    );
    assert_eq!(
        watch.roles(),
        settled,
        "labels moved after the replica was woken"
    );
    assert_eq!(answers, [409], "the held patch was not refused as stale");
    assert!(
        replicas[active]
            .log()
            .contains("a pod changed after the plan read it"),
        "the woken replica does not say its plan was stale"
    );
    for r in &replicas {
        assert_eq!(r.forbidden(), Vec::<String>::new());
    }
}

/// A label patch that meets a change its plan did not see (a kubelet's
/// status update moves the pod's version too) is refused with a conflict;
/// the active replica plans again from the pod as it now is and labels it
/// with one more patch, at once: no write lost, no storm of retries. The
/// replica stops itself before the patch for a moment, well inside its
/// lease, while the pod's status changes, so the conflict is certain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_label_patch_that_meets_a_status_update_is_planned_again_at_once() {
    let Some(mut bed) = Testbed::start("apiserver: a label patch in conflict", 2).await else {
        return;
    };
    let watch = LabelWatch::start(bed.admin.clone());
    bed.create_web_group().await;
    for pod in ["web-0", "web-1"] {
        bed.start_agent(pod).await;
    }
    let mut controller = Controller::start_hooked(&bed.api, &bed.redis, "leasehold-0");
    let (first, _) = watch.next_leader(None, Duration::from_secs(20)).await;
    eventually_async(Duration::from_secs(5), "two pods labelled", || async {
        watch.roles().len() == 2
    })
    .await;

    controller.stop_before_label("leader");
    bed.agent(&first).signal(Signal::SIGTERM);
    let held = controller.held_patch(label_bound()).await;
    let pod = held
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned();
    // What a kubelet does meanwhile: a status update, a new version.
    let mark = bed.api.audit_mark();
    bed.pods()
        .patch_status(
            &pod,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "message": "probed again" } })),
        )
        .await
        .expect("the pod's status updated");
    controller.signal(Signal::SIGCONT);
    // The controller looks again 200 ms after a conflict at the latest
    // (the watch bringing the change triggers it sooner), two retry
    // intervals and a second of margin.
    let bound = Duration::from_millis(200) + 2 * RETRY + Duration::from_secs(1);
    let (next, took) = watch.next_leader(Some(&first), bound).await;
    tokio::time::sleep(2 * RETRY).await;
    let answers = patches_of(&bed.api, mark, &pod);
    println!("held {held}: labelled {took:?} after SIGCONT; patches of {pod} answered {answers:?}");
    assert_eq!(next, pod);
    assert!(
        answers.first() == Some(&409) && answers.last() == Some(&200) && answers.len() <= 3,
        "not one conflict and then the label: {answers:?}"
    );
    assert!(
        controller.active().await,
        "the replica lost its lease while it was stopped"
    );
    assert!(controller
        .log()
        .contains("a pod changed after the plan read it"));
    watch.assert_never_two_leaders();
    assert_eq!(controller.forbidden(), Vec::<String>::new());
}

/// The answers (status codes) to the controller's patches of pod `pod`
/// since `mark`, in order.
fn patches_of(api: &ApiServer, mark: u64, pod: &str) -> Vec<u16> {
    let user = User::Controller.username();
    let path = format!("/api/v1/namespaces/{NS}/pods/{pod}");
    api.audit_since(mark)
        .into_iter()
        .filter(|r| r.user.username == user && r.verb == "patch")
        .filter(|r| r.request_uri.split('?').next() == Some(path.as_str()))
        .map(|r| r.response_status.map_or(0, |s| s.code))
        .collect()
}

/// The controller's own requests since `mark`, as `verb resource` counts.
fn controller_requests(api: &ApiServer, mark: u64) -> BTreeMap<String, usize> {
    let user = User::Controller.username();
    let mut counted = BTreeMap::new();
    for r in api.audit_since(mark) {
        if r.user.username == user {
            *counted.entry(r.what()).or_insert(0) += 1;
        }
    }
    counted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_change_costs_four_requests_and_a_new_member_is_labelled_at_once() {
    let Some(mut bed) = Testbed::start("apiserver: requests per change", 3).await else {
        return;
    };
    let watch = LabelWatch::start(bed.admin.clone());
    bed.create_web_group().await;
    for pod in ["web-0", "web-1"] {
        bed.start_agent(pod).await;
    }
    let _controller = Controller::start(&bed.api, &bed.redis, "leasehold-0");
    let (mut leader, _) = watch.next_leader(None, Duration::from_secs(20)).await;
    eventually_async(Duration::from_secs(5), "one follower", || async {
        watch.roles().len() == 2
    })
    .await;

    // A member whose pod has been there all along joins: nothing about the
    // pod changes, and the resync is 30 s away; its agent's first claim
    // tells the controller.
    tokio::time::sleep(Duration::from_secs(1)).await;
    bed.start_agent("web-2").await;
    let took = eventually_async(
        Duration::from_secs(2),
        "web-2 labelled follower",
        || async { watch.roles().get("web-2").map(String::as_str) == Some("follower") },
    )
    .await;
    println!("web-2 follower label {took:?} after its agent answered");

    // Each change of leader: the old leader's label, the new leader's, the
    // status and one Event, nothing more.
    for round in 0..4 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mark = bed.api.audit_mark();
        let (code, body) =
            testkit::agent::post(bed.agent(&leader).port, "/v1/groups/web/step-down").await;
        assert_eq!(code, 200, "step-down: {body}");
        let (next, _) = watch.next_leader(Some(&leader), label_bound()).await;
        // The status and the Event come right after the labels.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let counted = controller_requests(&bed.api, mark);
        println!("change {round}, {leader} -> {next}: {counted:?}");
        let expected: BTreeMap<String, usize> = [
            ("create events", 1),
            ("patch leadergroups/status", 1),
            ("patch pods", 2),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        assert_eq!(counted, expected, "change {round}: {leader} -> {next}");
        let note = bed.latest_event_note("web").await.unwrap_or_default();
        assert!(
            note.contains(&format!("pod {next} leads"))
                && note.contains(&format!("after node {NS}/{leader}")),
            "{note}"
        );
        leader = next;
    }
    watch.assert_never_two_leaders();
}

/// docs/controller.md "Who leads" on a real API server, with agents of
/// priorities 1 (web-0), 3 (web-1) and 0 (web-2): failback after the
/// stability window, the step-down-to annotation (refused for priority 0:
/// a warning Event and Handover=False, the leader leading on; carried out
/// for a live member), a handover undone by failback only once the new
/// leader has led for the window, and none with failback off. The label
/// watch never sees two leaders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priorities_failback_and_a_named_successor_on_a_real_api_server() {
    let Some(mut bed) = Testbed::start("apiserver: who leads", 3).await else {
        return;
    };
    let watch = LabelWatch::start(bed.admin.clone());
    bed.create_group(
        "web",
        json!({ "selector": { "matchLabels": { "app": "web" } },
                "ttlMs": 1000, "renewIntervalMs": 300, "retryIntervalMs": 200,
                "placement": { "failback": "AfterStable", "stableSeconds": 1 } }),
    )
    .await
    .expect("create LeaderGroup web");
    bed.start_agent_with("web-0", &["--priority", "1"]).await;
    let _controller = Controller::start(&bed.api, &bed.redis, "leasehold-0");
    let (first, _) = watch.next_leader(None, Duration::from_secs(20)).await;
    assert_eq!(first, "web-0");
    // A member of higher priority arrives: web-0 keeps its seat until
    // web-1 has been live for the window, then hands over once.
    let arrived = Instant::now();
    bed.start_agent_with("web-1", &["--priority", "3"]).await;
    bed.start_agent_with("web-2", &["--priority", "0"]).await;
    let (next, _) = watch
        .next_leader(Some("web-0"), Duration::from_secs(10))
        .await;
    let took = arrived.elapsed();
    println!("failback web-0 -> {next} {took:?} after web-1 arrived");
    assert_eq!(next, "web-1");
    assert!(
        took >= Duration::from_secs(1),
        "failback before the window: {took:?}"
    );
    eventually_async(
        Duration::from_secs(5),
        "status: handover Failback, preferred web-1",
        || {
            let bed = &bed;
            async move {
                let s = bed.status("web").await;
                s["handover"]["reason"] == "Failback"
                    && s["handover"]["to"] == "shop/web-1"
                    && s["preferred"] == "web-1"
                    && s["members"].as_array().is_some_and(|m| {
                        m.iter().any(|m| m["pod"] == "web-2" && m["priority"] == 0)
                    })
            }
        },
    )
    .await;

    // Named successor of priority 0: refused, web-1 leads on.
    let annotate = |to: &'static str| {
        let groups = bed.groups();
        async move {
            groups
                .patch(
                    "web",
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "metadata": { "annotations": {
                        "leasehold.dev/step-down-to": to } } })),
                )
                .await
                .expect("annotate")
        }
    };
    annotate("web-2").await;
    eventually_async(
        Duration::from_secs(5),
        "Handover=False and a warning",
        || {
            let bed = &bed;
            async move {
                let refused = bed
                    .condition("web", "Handover")
                    .await
                    .is_some_and(|(s, r, m)| {
                        s == "False" && r == "SuccessorRefused" && m.contains("priority 0")
                    });
                let note = bed.latest_event_note("web").await.unwrap_or_default();
                refused && note.contains("refused")
            }
        },
    )
    .await;
    tokio::time::sleep(2 * RETRY).await;
    assert_eq!(bed.status("web").await["leader"], "web-1");

    // Named successor web-0: it leads; after it has led for the window,
    // failback returns the seat to web-1.
    annotate("web-0").await;
    let (named, _) = watch
        .next_leader(Some("web-1"), Duration::from_secs(5))
        .await;
    assert_eq!(named, "web-0");
    let handed = Instant::now();
    let (back, _) = watch
        .next_leader(Some("web-0"), Duration::from_secs(10))
        .await;
    let held = handed.elapsed();
    println!("named web-0 held the seat {held:?} before failback to {back}");
    assert_eq!(back, "web-1");
    // The window less the labels' own latency (two retry intervals).
    assert!(
        held >= Duration::from_secs(1) - 2 * RETRY,
        "failback undid the handover at once: {held:?}"
    );

    // Failback off: a handover to web-0 stays.
    bed.groups()
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "placement": { "failback": "Never" } },
                "metadata": { "annotations": { "leasehold.dev/step-down-to": null } } })),
        )
        .await
        .expect("failback off");
    tokio::time::sleep(Duration::from_millis(500)).await;
    annotate("web-0").await;
    let (named, _) = watch
        .next_leader(Some("web-1"), Duration::from_secs(5))
        .await;
    assert_eq!(named, "web-0");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        bed.status("web").await["leader"],
        "web-0",
        "failback while off"
    );
    watch.assert_never_two_leaders();
}

/// One state of the leader Service's EndpointSlice, as the watch saw it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SliceSeen {
    pub(crate) term: u64,
    pub(crate) leader: Option<String>,
    /// Its cluster's controller, cut off from the store, could not confirm
    /// the term's leader (`leasehold.dev/unconfirmed`): of the term's
    /// leader's rank.
    pub(crate) unconfirmed: bool,
    pub(crate) addresses: Vec<String>,
    /// The endpoint's `conditions.ready`, when it has one.
    pub(crate) ready: Option<bool>,
}

/// Every state of the EndpointSlices of namespace `shop`, from one watch,
/// checked as it comes: at most one address, the address the leader
/// annotation's pod has, a rank (term, then vacated) that never goes back,
/// and one pod per term.
#[derive(Default)]
struct SliceLog {
    /// Every slice name seen (the checks are of `web-leader-leader`).
    names: std::collections::BTreeSet<String>,
    current: Option<SliceSeen>,
    states: usize,
    leader_of_term: BTreeMap<u64, String>,
    unconfirmed_seen: bool,
    broken: Vec<String>,
}

pub(crate) struct SliceWatch {
    log: Arc<Mutex<SliceLog>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for SliceWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl SliceWatch {
    pub(crate) async fn start(client: kube::Client) -> Self {
        let group = kube::discovery::group(&client, "discovery.k8s.io")
            .await
            .expect("the API server serves discovery.k8s.io");
        let (resource, _) = group
            .recommended_kind("EndpointSlice")
            .expect("an EndpointSlice kind");
        let api: Api<kube::api::DynamicObject> = Api::namespaced_with(client, NS, &resource);
        let log = Arc::new(Mutex::new(SliceLog::default()));
        let shared = log.clone();
        let task = tokio::spawn(async move {
            let mut events = watcher(api, watcher::Config::default())
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(event) = events.next().await {
                let Ok(slice) = event else { continue };
                let value = serde_json::to_value(&slice).unwrap();
                let name = value["metadata"]["name"].as_str().unwrap_or("").to_owned();
                shared.lock().unwrap().names.insert(name.clone());
                if name != "web-leader-leader" {
                    continue;
                }
                let annotations = &value["metadata"]["annotations"];
                let seen = SliceSeen {
                    term: annotations["leasehold.dev/term"]
                        .as_str()
                        .and_then(|t| t.parse().ok())
                        .unwrap_or(0),
                    leader: annotations["leasehold.dev/leader"]
                        .as_str()
                        .map(str::to_owned),
                    unconfirmed: annotations.get("leasehold.dev/unconfirmed").is_some(),
                    addresses: value["endpoints"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .flat_map(|e| e["addresses"].as_array().cloned().unwrap_or_default())
                        .filter_map(|a| a.as_str().map(str::to_owned))
                        .collect(),
                    ready: value["endpoints"][0]["conditions"]["ready"].as_bool(),
                };
                shared.lock().unwrap().record(seen);
            }
        });
        Self { log, task }
    }

    pub(crate) fn current(&self) -> Option<SliceSeen> {
        self.log.lock().unwrap().current.clone()
    }

    /// Waits until the slice holds a pod other than `not`; returns it and
    /// the term.
    pub(crate) async fn next_leader(
        &self,
        not: Option<&str>,
        limit: Duration,
    ) -> (String, u64, Duration) {
        let start = Instant::now();
        loop {
            if let Some(s) = self.current() {
                if let Some(l) = s.leader.filter(|l| Some(l.as_str()) != not) {
                    return (l, s.term, start.elapsed());
                }
            }
            assert!(
                start.elapsed() < limit,
                "the slice holds no pod other than {not:?} within {limit:?}: {:?}",
                self.current()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Waits until the slice holds no address; returns it, and how long it
    /// took.
    pub(crate) async fn emptied(&self, limit: Duration, what: &str) -> (SliceSeen, Duration) {
        let start = Instant::now();
        loop {
            if let Some(s) = self.current().filter(|s| s.addresses.is_empty()) {
                return (s, start.elapsed());
            }
            assert!(
                start.elapsed() < limit,
                "{what}: the slice still holds an address after {limit:?}: {:?}",
                self.current()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// No rule broken, over at least `states` states seen.
    pub(crate) fn assert_fenced(&self, states: usize) {
        let log = self.log.lock().unwrap();
        assert!(
            log.broken.is_empty(),
            "the slice broke a rule: {:#?}",
            log.broken
        );
        assert!(
            log.states >= states,
            "the watch saw only {} states",
            log.states
        );
    }

    /// Whether the slice was ever marked unconfirmed.
    pub(crate) fn seen_unconfirmed(&self) -> bool {
        self.log.lock().unwrap().unconfirmed_seen
    }
}

impl SliceLog {
    fn record(&mut self, seen: SliceSeen) {
        self.states += 1;
        self.unconfirmed_seen |= seen.unconfirmed;
        if seen.addresses.len() > 1 {
            self.broken.push(format!("two addresses: {seen:?}"));
        }
        match (&seen.leader, seen.addresses.first()) {
            (Some(pod), Some(address)) if *address != pod_ip(pod) => {
                self.broken.push(format!("not {pod}'s address: {seen:?}"));
            }
            (Some(_), None) | (None, Some(_)) => {
                self.broken
                    .push(format!("annotation and address disagree: {seen:?}"));
            }
            _ => {}
        }
        if let Some(pod) = &seen.leader {
            let first = self.leader_of_term.entry(seen.term).or_insert(pod.clone());
            if first != pod {
                self.broken
                    .push(format!("term {} held by {first} and then {pod}", seen.term));
            }
        }
        if let Some(before) = &self.current {
            let rank = |s: &SliceSeen| (s.term, s.leader.is_none() && !s.unconfirmed);
            if rank(&seen) < rank(before) {
                self.broken
                    .push(format!("went back from {before:?} to {seen:?}"));
            }
        }
        self.current = Some(seen);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_endpoint_holds_one_address_through_kills_step_downs_and_a_replica_handover() {
    let Some(mut bed) = Testbed::start_with(
        "apiserver: leader endpoint",
        3,
        &["leaderEndpoints.enabled=true"],
    )
    .await
    else {
        return;
    };
    let labels = LabelWatch::start(bed.admin.clone());
    let slices = SliceWatch::start(bed.admin.clone()).await;
    bed.create_group(
        "web",
        json!({ "selector": { "matchLabels": { "app": "web" } },
                "ttlMs": 1000, "renewIntervalMs": 300, "retryIntervalMs": 200,
                "service": { "name": "web-leader",
                             "ports": [{ "name": "http", "port": 80, "targetPort": 8080 }] } }),
    )
    .await
    .expect("create LeaderGroup web with spec.service");
    for pod in ["web-0", "web-1", "web-2"] {
        bed.start_agent(pod).await;
    }
    let flags = ["--leader-endpoints"];
    let mut replicas = [
        Controller::start_with(&bed.api, &bed.redis, "leasehold-0", &flags),
        Controller::start_with(&bed.api, &bed.redis, "leasehold-1", &flags),
    ];
    let (mut leader, mut term, took) = slices.next_leader(None, Duration::from_secs(20)).await;
    println!("first leader in the slice: {leader} at term {term}, after {took:?}");

    // The Service: no selector, the spec's ports, owned by the group.
    let service = Api::<k8s_openapi::api::core::v1::Service>::namespaced(bed.admin.clone(), NS)
        .get("web-leader")
        .await
        .expect("the controller created Service web-leader");
    let spec = service.spec.clone().unwrap();
    assert!(
        spec.selector.as_ref().is_none_or(|s| s.is_empty()),
        "{spec:?}"
    );
    let port = &spec.ports.unwrap()[0];
    assert_eq!((port.port, port.name.as_deref()), (80, Some("http")));
    let owner = &service.metadata.owner_references.unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("LeaderGroup", "web")
    );
    // The status records it, and says so in a condition.
    eventually_async(Duration::from_secs(5), "status.endpoint", || async {
        let s = bed.status("web").await;
        s["endpoint"]
            == json!({ "service": "web-leader", "address": pod_ip(&leader), "term": term })
    })
    .await;
    let (ok, reason, message) = bed.condition("web", "LeaderEndpoint").await.unwrap();
    assert_eq!(
        (ok.as_str(), reason.as_str()),
        ("True", "EndpointWritten"),
        "{message}"
    );

    // Faults of the leader: a kill, a termination, a step-down.
    for fault in ["SIGKILL", "SIGTERM", "step-down"] {
        match fault {
            "SIGKILL" => bed.agent(&leader).signal(Signal::SIGKILL),
            "SIGTERM" => bed.agent(&leader).signal(Signal::SIGTERM),
            _ => {
                bed.groups()
                    .patch(
                        "web",
                        &PatchParams::default(),
                        &Patch::Merge(json!({ "metadata": { "annotations": {
                            "leasehold.dev/step-down": "1" } } })),
                    )
                    .await
                    .expect("annotate");
            }
        }
        let (next, next_term, took) = slices.next_leader(Some(&leader), label_bound()).await;
        println!("{fault}: slice {leader} -> {next}, term {term} -> {next_term}, in {took:?}");
        assert!(next_term > term);
        if fault != "step-down" {
            bed.start_agent(&leader).await;
        }
        (leader, term) = (next, next_term);
    }

    // The active replica is killed; the leader then terminates: the
    // standby, once active, writes the next leader over the last one's.
    let active = one_active(&replicas, Duration::from_secs(10)).await;
    replicas[active].signal(Signal::SIGKILL);
    bed.agent(&leader).signal(Signal::SIGTERM);
    let (next, next_term, took) = slices
        .next_leader(Some(&leader), Duration::from_secs(1) + label_bound())
        .await;
    println!("replica {active} killed: slice {leader} -> {next} at term {next_term}, in {took:?}");
    bed.start_agent(&leader).await;
    let name = replicas[active].name.clone();
    let old = std::mem::replace(
        &mut replicas[active],
        Controller::start_with(&bed.api, &bed.redis, &name, &flags),
    );
    assert_eq!(old.forbidden(), Vec::<String>::new());
    leader = next;

    // The active replica is frozen (SIGSTOP) mid-flight while the leader
    // terminates: the standby takes over and writes; the frozen one, let
    // go, finds a slice further on than anything it could write.
    let active = one_active(&replicas, Duration::from_secs(10)).await;
    replicas[active].signal(Signal::SIGSTOP);
    bed.agent(&leader).signal(Signal::SIGTERM);
    let (next, next_term, took) = slices
        .next_leader(Some(&leader), Duration::from_secs(1) + label_bound())
        .await;
    println!("replica {active} frozen: slice {leader} -> {next} at term {next_term}, in {took:?}");
    bed.start_agent(&leader).await;
    replicas[active].signal(Signal::SIGCONT);
    tokio::time::sleep(2 * RETRY + Duration::from_secs(1)).await;
    let now = slices.current().expect("a slice");
    assert_eq!(
        (now.leader.as_deref(), now.term),
        (Some(next.as_str()), next_term),
        "the slice moved after the frozen replica came back"
    );
    leader = next;

    // A Service of the name that is not the group's: left alone, said so,
    // and no slice for it.
    let taken: k8s_openapi::api::core::v1::Service = serde_json::from_value(json!({
        "metadata": { "name": "taken" },
        "spec": { "selector": { "app": "other" }, "ports": [{ "port": 80 }] }
    }))
    .unwrap();
    Api::<k8s_openapi::api::core::v1::Service>::namespaced(bed.admin.clone(), NS)
        .create(&PostParams::default(), &taken)
        .await
        .expect("create Service taken");
    bed.create_group(
        "other",
        json!({ "selector": { "matchLabels": { "app": "none" } },
                "service": { "name": "taken", "ports": [{ "port": 80 }] } }),
    )
    .await
    .expect("create LeaderGroup other");
    eventually_async(Duration::from_secs(10), "LeaderEndpoint False on other", || async {
        matches!(bed.condition("other", "LeaderEndpoint").await,
            Some((s, r, m)) if s == "False" && r == "EndpointNotWritten" && m.contains("not this group's"))
    })
    .await;
    let taken_slices = slices.log.lock().unwrap().names.clone();
    assert!(
        !taken_slices.contains("taken-leader"),
        "a slice was written for a Service that is not the group's: {taken_slices:?}"
    );

    // No one left to lead: the slice is emptied, at the last term.
    bed.agents.clear();
    eventually_async(label_bound(), "an empty slice", || async {
        slices
            .current()
            .is_some_and(|s| s.leader.is_none() && s.addresses.is_empty())
    })
    .await;
    println!("emptied after {leader} went: {:?}", slices.current());
    // The active replica says no one leads; the standby exports no group.
    let active = one_active(&replicas, Duration::from_secs(10)).await;
    eventually_async(Duration::from_secs(5), "group_has_leader 0", || async {
        group_figures(&bed, &replicas[active]).await.1[0] == Some(0.0)
    })
    .await;
    let standby = &replicas[1 - active];
    assert_eq!(
        standby
            .metric(&format!(
                "leasehold_group_term{{namespace=\"{NS}\",group=\"web\"}}"
            ))
            .await,
        None,
        "the standby exports the group's series"
    );
    assert!(standby.metric("leasehold_controller_active").await == Some(0.0));
    slices.assert_fenced(4);
    labels.assert_never_two_leaders();
    for r in &replicas {
        assert_eq!(r.forbidden(), Vec::<String>::new());
    }
}

/// Sets pod `name`'s Ready condition, as a kubelet would.
async fn set_ready(admin: &kube::Client, name: &str, ready: bool) {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
    let status = if ready { "True" } else { "False" };
    let patch = json!({ "status": { "conditions": [{ "type": "Ready", "status": status }] } });
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("set the pod's readiness");
}

/// A replica that becomes the active one again does not trust what it
/// wrote into a slice in its earlier spell: the other replica wrote the
/// leader unready meanwhile, and the leader is ready again by the time
/// this one takes over. Trusting its memory (the leader, ready, at the same
/// term: just what it now wants) it would write nothing, and the slice
/// would hold the leader unready until the memory's five minutes ran out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_active_again_reads_the_slice_it_wrote_in_its_earlier_spell() {
    let Some(mut bed) = Testbed::start_with(
        "apiserver: a replica active again",
        1,
        &["leaderEndpoints.enabled=true"],
    )
    .await
    else {
        return;
    };
    let slices = SliceWatch::start(bed.admin.clone()).await;
    bed.create_group(
        "web",
        json!({ "selector": { "matchLabels": { "app": "web" } },
                "ttlMs": 1000, "renewIntervalMs": 300, "retryIntervalMs": 200,
                "service": { "name": "web-leader", "ports": [{ "port": 80 }] } }),
    )
    .await
    .expect("create LeaderGroup web with spec.service");
    bed.start_agent("web-0").await;
    let flags = ["--leader-endpoints"];
    let mut first = [Controller::start_with(
        &bed.api,
        &bed.redis,
        "leasehold-0",
        &flags,
    )];
    assert_eq!(one_active(&first, Duration::from_secs(20)).await, 0);
    let (leader, term, _) = slices.next_leader(None, Duration::from_secs(20)).await;
    let shows = |ready: bool| {
        let slice = slices.current();
        slice
            .is_some_and(|s| s.leader.as_deref() == Some(leader.as_str()) && s.ready == Some(ready))
    };
    eventually_async(label_bound(), "the leader ready in the slice", || async {
        shows(true)
    })
    .await;
    let [r0] = &mut first;
    let mut r1 = Controller::start_with(&bed.api, &bed.redis, "leasehold-1", &flags);
    eventually_async(Duration::from_secs(10), "leasehold-1 up", || async {
        r1.serves().await
    })
    .await;

    // leasehold-1 takes over and writes the leader unready.
    r0.signal(Signal::SIGSTOP);
    eventually_async(Duration::from_secs(5), "leasehold-1 active", || async {
        r1.active().await
    })
    .await;
    set_ready(&bed.admin, &leader, false).await;
    eventually_async(label_bound(), "the leader unready in the slice", || async {
        shows(false)
    })
    .await;
    r0.signal(Signal::SIGCONT);
    eventually_async(Duration::from_secs(5), "leasehold-0 a standby", || async {
        r0.serves().await
    })
    .await;

    // leasehold-1 stops; the leader is ready again before leasehold-0
    // takes over.
    r1.signal(Signal::SIGSTOP);
    set_ready(&bed.admin, &leader, true).await;
    eventually_async(Duration::from_secs(5), "leasehold-0 active", || async {
        r0.active().await
    })
    .await;
    let active_at = Instant::now();
    eventually_async(
        label_bound(),
        "the leader ready in the slice again",
        || async { shows(true) },
    )
    .await;
    println!(
        "ready in the slice {:?} after leasehold-0 took over",
        active_at.elapsed()
    );
    assert_eq!(slices.current().map(|s| s.term), Some(term));
    r1.signal(Signal::SIGCONT);
    slices.assert_fenced(3);
    for r in [&*r0, &r1] {
        assert_eq!(r.forbidden(), Vec::<String>::new(), "{}", r.name);
    }
}

#[test]
fn the_slice_checker_sees_each_broken_rule() {
    let seen = |term, leader: Option<&str>, addresses: &[&str]| SliceSeen {
        term,
        leader: leader.map(str::to_owned),
        unconfirmed: false,
        addresses: addresses.iter().map(|a| a.to_string()).collect(),
        ready: None,
    };
    let unconfirmed = |term| SliceSeen {
        unconfirmed: true,
        ..seen(term, None, &[])
    };
    let ip = |pod| pod_ip(pod);
    let mut ok = SliceLog::default();
    ok.record(seen(1, Some("web-0"), &[&ip("web-0")]));
    // A cut-off cluster's slice, and the same term's leader back.
    ok.record(unconfirmed(1));
    ok.record(seen(1, Some("web-0"), &[&ip("web-0")]));
    ok.record(seen(1, None, &[]));
    ok.record(seen(2, Some("web-1"), &[&ip("web-1")]));
    assert!(ok.broken.is_empty(), "{:?}", ok.broken);
    for (what, states) in [
        (
            "two addresses",
            vec![seen(1, Some("web-0"), &[&ip("web-0"), &ip("web-1")])],
        ),
        (
            "another pod's address",
            vec![seen(1, Some("web-0"), &[&ip("web-1")])],
        ),
        (
            "back a term",
            vec![
                seen(2, Some("web-1"), &[&ip("web-1")]),
                seen(1, Some("web-0"), &[&ip("web-0")]),
            ],
        ),
        (
            "back to a vacated term's leader",
            vec![seen(2, None, &[]), seen(2, Some("web-1"), &[&ip("web-1")])],
        ),
        (
            "two pods in a term",
            vec![
                seen(2, Some("web-1"), &[&ip("web-1")]),
                seen(2, Some("web-0"), &[&ip("web-0")]),
            ],
        ),
        (
            "back from a vacated term to unconfirmed",
            vec![seen(2, None, &[]), unconfirmed(2)],
        ),
        (
            "an annotation without an address",
            vec![seen(1, Some("web-0"), &[])],
        ),
        (
            "an address without an annotation",
            vec![seen(1, None, &[&ip("web-0")])],
        ),
    ] {
        let mut log = SliceLog::default();
        for s in states {
            log.record(s);
        }
        // Each case breaks its own rule and no other.
        assert_eq!(log.broken.len(), 1, "{what}: {:?}", log.broken);
    }
}
