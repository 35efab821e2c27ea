//! The controller's I/O against a mock Kubernetes API (kube-rs's tower-test
//! approach: each expected request is checked and answered in turn, with a
//! timeout so a missing call fails fast) and a real redis-server where engine
//! nodes elect for real.

use leasehold_testkit as testkit;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Method, Request, Response};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::client::Body;
use kube::core::PartialObjectMeta;
use kube::runtime::events::Reporter;
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::Store as Reflector;
use kube::runtime::watcher;
use leasehold_engine::{ElectionConfig, Node};
use leasehold_kube::crd::{LeaderGroup, LeaderGroupSpec, DEFAULT_ROLE_LABEL};
use leasehold_kube::event_log::EventLog;
use leasehold_kube::memory::Memory;
use leasehold_kube::metrics::ControllerMetrics;
use leasehold_kube::reconcile::{clean_up, reconcile, Context};
use serde_json::{json, Value};
use testkit::{eventually, fast, node, RedisServer, StoreFixture};

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

fn group() -> LeaderGroup {
    let spec = LeaderGroupSpec {
        selector: LabelSelector {
            match_labels: Some([("app".to_owned(), "web".to_owned())].into()),
            match_expressions: None,
        },
        ttl_ms: 600,
        renew_interval_ms: 200,
        retry_interval_ms: 100,
        role_label: DEFAULT_ROLE_LABEL.into(),
        placement: Default::default(),
        service: None,
    };
    let mut g = LeaderGroup::new("web", spec);
    g.metadata.namespace = Some("shop".into());
    g.metadata.uid = Some("uid-1".into());
    g.metadata.generation = Some(1);
    g
}

fn pod_json(name: &str, role: Option<&str>) -> Value {
    let mut labels = json!({ "app": "web" });
    if let Some(r) = role {
        labels[DEFAULT_ROLE_LABEL] = json!(r);
    }
    json!({ "apiVersion": "v1", "kind": "Pod", "metadata": { "name": name, "namespace": "shop", "labels": labels } })
}

fn respond(send: tower_test::mock::SendResponse<Response<Body>>, body: Value) {
    send.send_response(
        Response::builder()
            .body(Body::from(serde_json::to_vec(&body).unwrap()))
            .unwrap(),
    );
}

/// What the mock API server saw, in order: "METHOD path body".
type Seen = Arc<Mutex<Vec<String>>>;

async fn http_body_util_collect(body: Body) -> String {
    let bytes = body.collect_bytes().await.unwrap_or_default();
    String::from_utf8_lossy(&bytes).into_owned()
}

struct Setup {
    ctx: Arc<Context>,
    seen: Seen,
    _server: tokio::task::JoinHandle<()>,
}

async fn setup(redis: &impl StoreFixture, pods: Vec<Value>) -> Setup {
    setup_with(redis, pods, fast()).await
}

/// `leadership` is the timing of the controllers' own group.
async fn setup_with(redis: &impl StoreFixture, pods: Vec<Value>, timings: ElectionConfig) -> Setup {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let seen: Seen = Arc::default();
    let cache = pod_cache(&pods);
    let server = cluster(handle, pods, seen.clone());
    let controller = Arc::new(node(redis, "ops/controller-0").await);
    let leadership = controller
        .join("ops/leasehold-controller", timings)
        .unwrap();
    eventually(Duration::from_secs(3), "the controller is active", || {
        leadership.is_leader()
    })
    .await;
    let ctx = context(client, controller, leadership, cache);
    Setup {
        ctx,
        seen,
        _server: server,
    }
}

/// The controller's context as `run_with` builds it, with an empty group
/// cache, the pods of `pods`, and no leader endpoints.
fn context(
    client: kube::Client,
    node: Arc<Node>,
    leadership: leasehold_engine::Group,
    pods: Reflector<PartialObjectMeta<Pod>>,
) -> Arc<Context> {
    let reporter = Reporter {
        controller: "leasehold-controller".into(),
        instance: Some(node.id().rsplit('/').next().unwrap_or_default().to_owned()),
    };
    let metrics = ControllerMetrics::register(&mut leasehold_daemon::metrics::new_registry());
    Arc::new(Context {
        client: client.clone(),
        node,
        leadership,
        events: EventLog::new(client, reporter),
        groups: Writer::<LeaderGroup>::default().as_reader(),
        pods,
        swept: Mutex::new(Vec::new()),
        resync: Duration::from_secs(30),
        store_settings: tokio::sync::watch::channel(Vec::new()).1,
        memory: Memory::new(metrics, false),
        cluster: None,
    })
}

/// The pod cache a running controller's watch would have filled with `pods`.
fn pod_cache(pods: &[Value]) -> Reflector<PartialObjectMeta<Pod>> {
    let mut writer = Writer::<PartialObjectMeta<Pod>>::default();
    writer.apply_watcher_event(&watcher::Event::Init);
    for pod in pods {
        let meta: PartialObjectMeta<Pod> =
            serde_json::from_value(pod.clone()).expect("pod metadata");
        writer.apply_watcher_event(&watcher::Event::InitApply(meta));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
    writer.as_reader()
}

fn writes(seen: &Seen) -> Vec<String> {
    seen.lock()
        .unwrap()
        .iter()
        .filter(|r| !r.starts_with("GET"))
        .cloned()
        .collect()
}

/// The group as the controller would read it after a led under term 1.
fn led_by_a() -> LeaderGroup {
    let mut g = group();
    g.status = Some(leasehold_kube::crd::LeaderGroupStatus {
        holder: Some("shop/a".into()),
        leader: Some("a".into()),
        term: Some(1),
        ..Default::default()
    });
    g
}

async fn elect(redis: &impl StoreFixture, id: &str) -> (Node, leasehold_engine::Group) {
    let n = node(redis, id).await;
    let cfg = ElectionConfig {
        ttl_ms: 600,
        renew_interval_ms: 200,
        retry_interval_ms: 100,
    };
    let g = n.join("shop/web", cfg).unwrap();
    (n, g)
}

/// Each change of leader is an Event of its own that names the new leader:
/// `kubectl get events` tells the latest truth, not the first note of a
/// series.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_change_of_leader_is_an_event_that_names_the_new_leader() {
    let redis = RedisServer::start();
    let (a, ga) = elect(&redis, "shop/a").await;
    eventually(Duration::from_secs(3), "a leads", || ga.is_leader()).await;
    let (b, gb) = elect(&redis, "shop/b").await;
    let s = setup(&redis, vec![pod_json("a", None), pod_json("b", None)]).await;
    let elected_notes = |s: &Setup| -> Vec<String> {
        writes(&s.seen)
            .into_iter()
            .filter(|r| r.contains("/apis/events.k8s.io/v1/") && r.contains("LeaderElected"))
            .collect()
    };
    reconcile(Arc::new(group()), s.ctx.clone()).await.unwrap();
    let first = elected_notes(&s);
    assert_eq!(first.len(), 1, "{first:#?}");
    assert!(first[0].contains("pod a leads under term 1"), "{first:#?}");
    a.step_down("shop/web").await.unwrap();
    eventually(Duration::from_secs(3), "b leads", || gb.is_leader()).await;
    reconcile(Arc::new(led_by_a()), s.ctx.clone())
        .await
        .unwrap();
    let all = elected_notes(&s);
    assert_eq!(all.len(), 2, "{all:#?}");
    assert!(
        all[1].starts_with("POST ") && all[1].contains("pod b leads under term 2"),
        "the second election is not an event of its own that names b: {all:#?}"
    );
    a.close().await.unwrap();
    b.close().await.unwrap();
}

on_both_stores! {
async fn first_election_labels_followers_then_the_leader_and_writes_status(server) {
    let (a, ga) = elect(&server, "shop/a").await;
    eventually(Duration::from_secs(3), "a leads", || ga.is_leader()).await;
    let (b, gb) = elect(&server, "shop/b").await;
    eventually(Duration::from_secs(3), "b follows", || {
        matches!(testkit::role(&gb), leasehold_engine::Role::Follower { .. })
    })
    .await;
    let s = setup(&server, vec![pod_json("a", None), pod_json("b", None)]).await;
    tokio::time::timeout(
        Duration::from_secs(5),
        reconcile(Arc::new(group()), s.ctx.clone()),
    )
    .await
    .expect("reconcile finished")
    .expect("reconcile succeeded");
    let w = writes(&s.seen);
    assert!(
        w[0].starts_with("PATCH /api/v1/namespaces/shop/pods/b ")
            && w[0].contains(r#""leasehold.dev/role":"follower""#),
        "{w:#?}"
    );
    assert!(
        w[1].starts_with("PATCH /api/v1/namespaces/shop/pods/a ")
            && w[1].contains(r#""leasehold.dev/role":"leader""#),
        "{w:#?}"
    );
    assert!(
        w.iter().any(
            |r| r.starts_with("POST /apis/events.k8s.io/v1/namespaces/shop/events")
                && r.contains("LeaderElected")
        ),
        "{w:#?}"
    );
    let status = w
        .iter()
        .find(|r| r.contains("/leadergroups/web/status"))
        .expect("status written");
    assert!(
        status.starts_with("PATCH")
            && status.contains(r#""leader":"a""#)
            && status.contains(r#""term":1"#),
        "{status}"
    );
    // The group's timings went to Redis for the nodes to adopt.
    assert_eq!(server.adopted_ttl_ms("shop/web"), "600");
    a.close().await.unwrap();
    b.close().await.unwrap();
}
}

/// A deleted LeaderGroup's role labels come off the pods, the leader's
/// first, although its members still run: a leader Service stops routing to
/// a pod that no longer leads anything. Pods without the label are not
/// touched, and a standby replica touches nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_groups_role_labels_come_off_its_pods() {
    let redis = RedisServer::start();
    // The agents still run: b leads, a follows, as the labels say.
    let (b, gb) = elect(&redis, "shop/b").await;
    eventually(Duration::from_secs(3), "b leads", || gb.is_leader()).await;
    let (a, ga) = elect(&redis, "shop/a").await;
    eventually(Duration::from_secs(3), "a follows", || {
        matches!(testkit::role(&ga), leasehold_engine::Role::Follower { .. })
    })
    .await;
    let s = setup(
        &redis,
        vec![
            pod_json("a", Some("follower")),
            pod_json("b", Some("leader")),
            pod_json("c", None),
        ],
    )
    .await;
    let removed = tokio::time::timeout(Duration::from_secs(5), clean_up(&group(), &s.ctx))
        .await
        .expect("clean-up finished")
        .expect("clean-up succeeded");
    assert_eq!(removed, 2);
    let w = writes(&s.seen);
    assert_eq!(w.len(), 2, "{w:#?}");
    assert!(
        w[0].starts_with("PATCH /api/v1/namespaces/shop/pods/b ")
            && w[0].contains(r#""leasehold.dev/role":null"#),
        "{w:#?}"
    );
    assert!(
        w[1].starts_with("PATCH /api/v1/namespaces/shop/pods/a ")
            && w[1].contains(r#""leasehold.dev/role":null"#),
        "{w:#?}"
    );
    a.close().await.unwrap();
    b.close().await.unwrap();
}

on_both_stores! {
/// The running controller sees a LeaderGroup's deletion on its watch and
/// takes the group's labels off (kube-runtime's controller alone never
/// reconciles a deleted object: before, the last leader kept its label).
async fn the_running_controller_cleans_up_after_a_deleted_group(server) {
    use leasehold_kube::run::run_with;
    // b's agent still runs and leads: while the group lives, its label stays.
    let (b, gb) = elect(&server, "shop/b").await;
    eventually(Duration::from_secs(3), "b leads", || gb.is_leader()).await;
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let seen: Seen = Arc::default();
    let deleted = Arc::new(tokio::sync::Notify::new());
    let _server = cluster_deleting(
        handle,
        vec![pod_json("b", Some("leader"))],
        group(),
        seen.clone(),
        Some(deleted.clone()),
    );
    let args = testkit::controller_args(&server, "lh", "ops", testkit::free_addr());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let controller = tokio::spawn(run_with(client, args, async move {
        let _ = stopped.await;
    }));
    // Once this replica is active (its reconciles write the status), delete.
    eventually(Duration::from_secs(5), "the controller is active", || {
        seen.lock()
            .unwrap()
            .iter()
            .any(|r| r.starts_with("PATCH ") && r.contains("/leadergroups/web/status"))
    })
    .await;
    assert!(
        !seen
            .lock()
            .unwrap()
            .iter()
            .any(|r| r.starts_with("PATCH /api/v1/namespaces/shop/pods/b ")),
        "b's label changed while the group lived"
    );
    deleted.notify_waiters();
    eventually(Duration::from_secs(3), "b's leader label removed", || {
        seen.lock().unwrap().iter().any(|r| {
            r.starts_with("PATCH /api/v1/namespaces/shop/pods/b ")
                && r.contains(r#""leasehold.dev/role":null"#)
        })
    })
    .await;
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), controller).await;
    b.close().await.unwrap();
}
}

on_both_stores! {
async fn on_a_leader_change_the_old_label_is_removed_before_the_new_one_is_set(server) {
    let (a, ga) = elect(&server, "shop/a").await;
    eventually(Duration::from_secs(3), "a leads", || ga.is_leader()).await;
    let (b, gb) = elect(&server, "shop/b").await;
    a.step_down("shop/web").await.unwrap();
    eventually(Duration::from_secs(3), "b leads", || gb.is_leader()).await;
    // The cluster still shows a as leader.
    let s = setup(
        &server,
        vec![
            pod_json("a", Some("leader")),
            pod_json("b", Some("follower")),
        ],
    )
    .await;
    reconcile(Arc::new(group()), s.ctx.clone()).await.unwrap();
    let w = writes(&s.seen);
    let a_at = w
        .iter()
        .position(|r| r.contains("/pods/a "))
        .expect("a patched");
    let b_at = w
        .iter()
        .position(|r| r.contains("/pods/b "))
        .expect("b patched");
    assert!(a_at < b_at, "old leader first: {w:#?}");
    assert!(
        w[a_at].contains(r#""follower""#) || w[a_at].contains("null"),
        "{}",
        w[a_at]
    );
    assert!(w[b_at].contains(r#""leader""#), "{}", w[b_at]);
    a.close().await.unwrap();
    b.close().await.unwrap();
}
}

on_both_stores! {
async fn a_crashed_leader_loses_its_label_before_a_successor_exists(server) {
    let (a, ga) = elect(&server, "shop/a").await;
    eventually(Duration::from_secs(3), "a leads", || ga.is_leader()).await;
    drop(a); // crash, no successor candidate at all
    eventually(Duration::from_secs(3), "lease expired", || {
        !server.lease_held("shop/web")
    })
    .await;
    let s = setup(&server, vec![pod_json("a", Some("leader"))]).await;
    reconcile(Arc::new(group()), s.ctx.clone()).await.unwrap();
    let w = writes(&s.seen);
    assert!(
        w[0].starts_with("PATCH /api/v1/namespaces/shop/pods/a ")
            && w[0].contains(r#""leasehold.dev/role":null"#),
        "{w:#?}"
    );
    let status = w.iter().find(|r| r.contains("/status")).expect("status");
    assert!(status.contains("NoLeader"), "{status}");
}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_unavailable_touches_no_label_and_reports_it() {
    let redis = RedisServer::start();
    let (a, ga) = elect(&redis, "shop/a").await;
    eventually(Duration::from_secs(3), "a leads", || ga.is_leader()).await;
    // The controllers' own lease outlasts the outage, so this replica stays
    // active and reports it; it must still not touch a label.
    let steady = ElectionConfig {
        ttl_ms: 20_000,
        renew_interval_ms: 5_000,
        retry_interval_ms: 5_000,
    };
    let s = setup_with(&redis, vec![pod_json("a", Some("leader"))], steady).await;
    redis.pause();
    let result = tokio::time::timeout(
        Duration::from_secs(5),
        reconcile(Arc::new(group()), s.ctx.clone()),
    )
    .await;
    redis.resume();
    result
        .expect("reconcile finished")
        .expect("reconcile succeeded");
    let w = writes(&s.seen);
    assert!(
        !w.iter().any(|r| r.contains("/pods/")),
        "no label touched: {w:#?}"
    );
    let status = w
        .iter()
        .find(|r| r.contains("/status"))
        .unwrap_or_else(|| panic!("status written: {w:#?} {:?}", s.seen.lock().unwrap()));
    assert!(
        status.contains("RedisUnavailable") && status.contains(r#""StoreAvailable""#),
        "{status}"
    );
    drop(a);
}

on_both_stores! {
async fn the_step_down_annotation_reaches_the_leader_once(server) {
    let (a, ga) = elect(&server, "shop/a").await;
    eventually(Duration::from_secs(3), "a leads", || ga.is_leader()).await;
    let (b, gb) = elect(&server, "shop/b").await;
    let s = setup(
        &server,
        vec![
            pod_json("a", Some("leader")),
            pod_json("b", Some("follower")),
        ],
    )
    .await;
    let mut g = group();
    g.metadata.annotations = Some(
        [(
            leasehold_kube::crd::STEP_DOWN_ANNOTATION.to_owned(),
            "now".to_owned(),
        )]
        .into(),
    );
    reconcile(Arc::new(g), s.ctx.clone()).await.unwrap();
    eventually(Duration::from_secs(2), "a stepped down, b leads", || {
        !ga.is_leader() && gb.is_leader()
    })
    .await;
    let w = writes(&s.seen);
    assert!(w.iter().any(|r| r.contains("StepDownRequested")), "{w:#?}");
    let status = w.iter().find(|r| r.contains("/status")).expect("status");
    assert!(status.contains(r#""handledStepDown":"now""#), "{status}");
    a.close().await.unwrap();
    b.close().await.unwrap();
}
}

/// A standby replica (not holding the controllers' lease) writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_replica_writes_nothing() {
    let redis = RedisServer::start();
    let active = node(&redis, "ops/controller-1").await;
    let g = active.join("ops/leasehold-controller", fast()).unwrap();
    eventually(Duration::from_secs(3), "another replica is active", || {
        g.is_leader()
    })
    .await;
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let seen: Seen = Arc::default();
    let _server = cluster(handle, vec![], seen.clone());
    let standby = Arc::new(node(&redis, "ops/controller-0").await);
    let leadership = standby.join("ops/leasehold-controller", fast()).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!leadership.is_leader());
    let ctx = context(client, standby, leadership, pod_cache(&[]));
    reconcile(Arc::new(group()), ctx).await.unwrap();
    assert!(
        seen.lock().unwrap().is_empty(),
        "{:?}",
        seen.lock().unwrap()
    );
    active.close().await.unwrap();
}

/// Waits for the next `elected` event of shop/web and checks that the plan
/// made from Redis then labels `name` as leader; returns how long it took.
async fn plan_follows(
    events: &mut tokio::sync::mpsc::UnboundedReceiver<leasehold_engine::Event>,
    store: &leasehold_engine::Store,
    name: &str,
    bound: Duration,
) -> Duration {
    use leasehold_kube::plan::{plan, Observed, PodView, StoreView, LEADER};
    let pods: Vec<PodView> = ["a", "b"]
        .iter()
        .map(|p| PodView {
            name: p.to_string(),
            labels: [("app".to_owned(), "web".to_owned())].into(),
            ..Default::default()
        })
        .collect();
    let g = group();
    let start = std::time::Instant::now();
    loop {
        let event = tokio::time::timeout(bound, events.recv())
            .await
            .expect("an engine event in time")
            .expect("open");
        if !matches!(&event, leasehold_engine::Event::Elected { group, .. } if group == "shop/web")
        {
            continue;
        }
        let state = store.group_state("shop/web").await.unwrap();
        let view = StoreView::Available(state);
        let p = plan(&Observed {
            group: &g,
            cluster: None,
            pods: &pods,
            others: &[],
            store: &view,
            swept: &[],
            local_now_ms: 0,
            store_warnings: &[],
            votes: None,
            lease_seen_until_ms: None,
            holder_gone_since_ms: Some(0),
        });
        let labelled = p
            .labels
            .iter()
            .find(|c| c.value.as_deref() == Some(LEADER))
            .map(|c| c.pod.as_str());
        assert_eq!(labelled, Some(name), "{:?}", p.labels);
        assert_eq!(p.status.leader.as_deref(), Some(name));
        return start.elapsed();
    }
}

/// Engine to controller: engine nodes elect on a real Redis; the controller's
/// Redis side (the `P:events` subscription and the state read) produces a
/// plan that labels the new leader, within a bound of each transition
/// (step-down, then a crash).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_engine_transition_reaches_the_plan_within_a_bound() {
    let redis = RedisServer::start();
    let store = redis.store();
    let mut events = store.follow_events();
    tokio::time::sleep(Duration::from_millis(100)).await; // subscribed
    let (a, ga) = elect(&redis, "shop/a").await;
    let (b, gb) = elect(&redis, "shop/b").await;
    eventually(Duration::from_secs(3), "a leader", || {
        ga.is_leader() || gb.is_leader()
    })
    .await;
    let (first, second, second_name, first_name) = if ga.is_leader() {
        (a, b, "b", "a")
    } else {
        (b, a, "a", "b")
    };
    // Drain the first election's events.
    while tokio::time::timeout(Duration::from_millis(100), events.recv())
        .await
        .is_ok()
    {}
    // Step-down: the release wakes the other node at once.
    first.step_down("shop/web").await.unwrap();
    let took = plan_follows(&mut events, &store, second_name, Duration::from_millis(500)).await;
    assert!(took <= Duration::from_millis(500));
    // Crash of the new leader: after its lease (600 ms) the first node, whose
    // cooldown has run out by then, takes over.
    drop(second);
    let took = plan_follows(
        &mut events,
        &store,
        first_name,
        Duration::from_millis(600 + 500),
    )
    .await;
    assert!(took <= Duration::from_millis(600 + 500));
    first.close().await.unwrap();
}

/// A mock API server good enough for the whole controller: lists answer,
/// watches stay open and silent, writes are echoed and recorded.
fn cluster(handle: Handle, pods: Vec<Value>, seen: Seen) -> tokio::task::JoinHandle<()> {
    cluster_with(handle, pods, group(), seen)
}

/// [`cluster`] serving `listed` as the one LeaderGroup.
fn cluster_with(
    handle: Handle,
    pods: Vec<Value>,
    listed: LeaderGroup,
    seen: Seen,
) -> tokio::task::JoinHandle<()> {
    cluster_deleting(handle, pods, listed, seen, None)
}

/// [`cluster_with`], whose LeaderGroup watches answer with the group's
/// deletion once `delete` is notified.
fn cluster_deleting(
    mut handle: Handle,
    pods: Vec<Value>,
    listed: LeaderGroup,
    seen: Seen,
    delete: Option<Arc<tokio::sync::Notify>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut open_watches = Vec::new();
        while let Some((request, send)) = handle.next_request().await {
            let method = request.method().clone();
            let path = request.uri().path().to_owned();
            let query = request.uri().query().unwrap_or_default().to_owned();
            let body = http_body_util_collect(request.into_body()).await;
            if query.contains("watch=") {
                match &delete {
                    Some(delete) if path.ends_with("/leadergroups") => {
                        let (delete, listed) = (delete.clone(), listed.clone());
                        tokio::spawn(async move {
                            delete.notified().await;
                            let mut g = serde_json::to_value(&listed).unwrap();
                            g["metadata"]["resourceVersion"] = json!("2");
                            let line =
                                serde_json::to_vec(&json!({ "type": "DELETED", "object": g }))
                                    .unwrap();
                            send.send_response(Response::builder().body(Body::from(line)).unwrap());
                        });
                    }
                    _ => open_watches.push(send),
                }
                continue;
            }
            seen.lock().unwrap().push(format!("{method} {path} {body}"));
            let list = |kind: &str, items: Vec<Value>| json!({ "apiVersion": "v1", "kind": kind, "metadata": { "resourceVersion": "1" }, "items": items });
            let answer = match (method.clone(), path.as_str()) {
                (Method::GET, "/apis/leasehold.dev/v1alpha1/leadergroups") => {
                    let mut g = serde_json::to_value(&listed).unwrap();
                    g["metadata"]["resourceVersion"] = json!("1");
                    list("LeaderGroupList", vec![g])
                }
                (Method::GET, "/api/v1/pods") | (Method::GET, "/api/v1/namespaces/shop/pods") => {
                    list("PodList", pods.clone())
                }
                (Method::PATCH, p) if p.starts_with("/api/v1/namespaces/shop/pods/") => {
                    pod_json(p.rsplit('/').next().unwrap(), None)
                }
                (Method::PATCH, p) if p.ends_with("/status") => {
                    serde_json::to_value(group()).unwrap()
                }
                // The finalizer added or removed.
                (Method::PATCH, p) if p.contains("/leadergroups/") => {
                    serde_json::to_value(group()).unwrap()
                }
                (Method::POST, p) if p.contains("/events") => {
                    let mut e: Value = serde_json::from_str(&body).unwrap_or(json!({}));
                    e["metadata"]["name"] = json!("ev");
                    e
                }
                _ => json!({}),
            };
            respond(send, answer);
        }
    })
}

fn leader_patched(seen: &Seen, pod: &str) -> bool {
    seen.lock().unwrap().iter().any(|r| {
        r.starts_with(&format!("PATCH /api/v1/namespaces/shop/pods/{pod} "))
            && r.contains(r#""leasehold.dev/role":"leader""#)
    })
}

/// The whole controller (watches, the P:events trigger, leader-gated
/// reconciles) against the mock API: the first leader is labelled, and after
/// a step-down the new leader is labelled within a second, although the
/// resync interval is an hour: only the engine's event can have triggered it.
/// The pods are listed once, by the watch behind the pod cache (before, each
/// reconcile listed the namespace's pods).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_running_controller_follows_engine_events_without_a_resync() {
    use leasehold_kube::run::run_with;
    let redis = RedisServer::start();
    let (a, ga) = elect(&redis, "shop/a").await;
    eventually(Duration::from_secs(3), "a leads", || ga.is_leader()).await;
    let (b, gb) = elect(&redis, "shop/b").await;
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let seen: Seen = Arc::default();
    let _server = cluster(
        handle,
        vec![pod_json("a", None), pod_json("b", None)],
        seen.clone(),
    );
    let listen = testkit::free_addr();
    let args = testkit::controller_args(&redis, "lh", "ops", listen);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let controller = tokio::spawn(run_with(client, args, async move {
        let _ = stopped.await;
    }));
    // The controllers' own lease is the engine default (15 s ttl); the first
    // claim wins at once in a fresh Redis.
    let limit = Duration::from_secs(10);
    let start = std::time::Instant::now();
    while !leader_patched(&seen, "a") {
        assert!(
            start.elapsed() < limit,
            "a never labelled leader: {:#?}",
            seen.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Probes answer.
    let (status, health) = testkit::http_status(listen, "GET", "/healthz").await;
    assert_eq!(status, 200, "{health}");
    let (_, metrics) = testkit::http_status(listen, "GET", "/metrics").await;
    assert!(
        metrics.contains("leasehold_label_patches_total")
            && metrics.contains("leasehold_controller_active 1"),
        "{metrics}"
    );
    a.step_down("shop/web").await.unwrap();
    eventually(Duration::from_secs(2), "b leads", || gb.is_leader()).await;
    let moved = std::time::Instant::now();
    while !leader_patched(&seen, "b") {
        assert!(
            moved.elapsed() < Duration::from_secs(1),
            "b not labelled within 1 s: {:#?}",
            seen.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The status follows the labels and the Event.
    eventually(Duration::from_secs(2), "the second status write", || {
        seen.lock()
            .unwrap()
            .iter()
            .filter(|r| r.starts_with("PATCH ") && r.contains("/leadergroups/web/status"))
            .count()
            >= 2
    })
    .await;
    // Two leader changes, so several reconciles: the pods were listed once,
    // by the watch that keeps the cache, not by each reconcile.
    let pod_lists = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|r| {
            // A LIST, not the GET of one pod (its IP and readiness).
            let path = r.split(['?', ' ']).take(2).collect::<Vec<_>>().join(" ");
            path == "GET /api/v1/pods" || path == "GET /api/v1/namespaces/shop/pods"
        })
        .count();
    let reconciles = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.starts_with("PATCH ") && r.contains("/leadergroups/web/status"))
        .count();
    assert!(reconciles >= 2, "{:#?}", seen.lock().unwrap());
    assert_eq!(
        pod_lists, 1,
        "pods listed {pod_lists} times in {reconciles} reconciles"
    );
    let _ = stop.send(());
    let ended = tokio::time::timeout(Duration::from_secs(10), controller)
        .await
        .expect("run_with returns within 10 s of shutdown");
    ended.unwrap().unwrap();
    // Nothing of the controller outlives run_with: its probe server is gone.
    assert!(
        tokio::net::TcpStream::connect(listen).await.is_err(),
        "the probe server still accepts connections after shutdown"
    );
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// A sweep made by any node (here another node's, published on `P:events`)
/// is reflected in the groups that listed the swept node: a `NodesSwept`
/// event and `lastSweep` in the status. Agents usually sweep before the
/// controller does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_by_another_node_is_reflected_in_the_group() {
    use leasehold_kube::run::run_with;
    let redis = RedisServer::start();
    let (a, ga) = elect(&redis, "shop/a").await;
    eventually(Duration::from_secs(3), "a leads", || ga.is_leader()).await;
    // c is a member when the controller first looks (the controller plans
    // from the status it wrote itself, which lists c, not from this stale
    // copy the mock keeps serving).
    let (c, gc) = elect(&redis, "shop/c").await;
    eventually(Duration::from_secs(3), "c follows", || {
        matches!(testkit::role(&gc), leasehold_engine::Role::Follower { .. })
    })
    .await;
    // The group as last written: c was a member.
    let mut listed = group();
    listed.status = Some(leasehold_kube::crd::LeaderGroupStatus {
        holder: Some("shop/a".into()),
        leader: Some("a".into()),
        term: Some(1),
        members: ["a", "c"]
            .iter()
            .map(|m| leasehold_kube::crd::Member {
                node: format!("shop/{m}"),
                cluster: None,
                pod: Some((*m).into()),
                role: leasehold_kube::crd::MemberRole::Follower,
                problem: None,
                priority: 1,
                live_since: None,
                revision: None,
                unhealthy: None,
            })
            .collect(),
        ..Default::default()
    });
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let seen: Seen = Arc::default();
    let _server = cluster_with(handle, vec![pod_json("a", None)], listed, seen.clone());
    let args = testkit::controller_args(&redis, "lh", "ops", testkit::free_addr());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let controller = tokio::spawn(run_with(client, args, async move {
        let _ = stopped.await;
    }));
    eventually(Duration::from_secs(10), "a labelled leader", || {
        leader_patched(&seen, "a")
    })
    .await;
    // Another node swept c: only its event on P:events tells the controller.
    redis.cli(&[
        "PUBLISH",
        "lh:events",
        r#"{"type":"swept","node":"shop/a","nodes":["shop/c"]}"#,
    ]);
    eventually(Duration::from_secs(3), "NodesSwept recorded", || {
        writes(&seen)
            .iter()
            .any(|r| r.contains("/events") && r.contains("NodesSwept") && r.contains("shop/c"))
    })
    .await;
    eventually(Duration::from_secs(3), "lastSweep written", || {
        writes(&seen)
            .iter()
            .any(|r| r.contains("/leadergroups/web/status") && r.contains("lastSweep"))
    })
    .await;
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), controller).await;
    a.close().await.unwrap();
    c.close().await.unwrap();
}

/// A fresh install, Redis started with it: the controller, at its default
/// replica timings, labels the first leader within its replica ttl of
/// Redis's start (the store's birth), not one 15 s ttl after its own first
/// claim as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_fresh_store_the_first_leader_is_labelled_within_seconds() {
    use leasehold_kube::run::{run_with, REPLICA_TIMINGS};
    let redis = RedisServer::start();
    let redis_started = std::time::Instant::now();
    // A store never used: not the tests' preset birth and epoch.
    redis.cli(&["DEL", "lh:born", "lh:epoch"]);
    let (a, ga) = elect(&redis, "shop/a").await;
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let seen: Seen = Arc::default();
    let _server = cluster(handle, vec![pod_json("a", None)], seen.clone());
    let mut args = testkit::controller_args(&redis, "lh", "ops", testkit::free_addr());
    args.replica_ttl_ms = REPLICA_TIMINGS.ttl_ms;
    args.replica_renew_interval_ms = REPLICA_TIMINGS.renew_interval_ms;
    args.replica_retry_interval_ms = REPLICA_TIMINGS.retry_interval_ms;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let controller = tokio::spawn(run_with(client, args, async move {
        let _ = stopped.await;
    }));
    eventually(Duration::from_secs(3), "a leads", || ga.is_leader()).await;
    // Within seconds: the replica ttl (5 s) after Redis's start (which the
    // store places up to 2 s late: its uptime counts whole seconds), and two
    // retry intervals (1 s) more. Before: one 15 s ttl after the first claim.
    let limit = Duration::from_secs(9);
    while !leader_patched(&seen, "a") {
        assert!(
            redis_started.elapsed() < limit,
            "a not labelled leader within {limit:?} of Redis's start"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!("labelled {:?} after Redis started", redis_started.elapsed());
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), controller).await;
    a.close().await.unwrap();
}

/// The pod cache is a watch, and a watch can lag: for 15 s after an API
/// server restart in tests/kubernetes/apiserver.rs, where a leader label the
/// controller had just given never reached its cache. Here the mock's
/// cache never shows any label: the leader label given to a must still be
/// taken away before b gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_label_the_cache_does_not_show_is_taken_away_before_the_next_leader_gets_it() {
    let redis = RedisServer::start();
    let (a, ga) = elect(&redis, "shop/a").await;
    eventually(Duration::from_secs(3), "a leads", || ga.is_leader()).await;
    let (b, gb) = elect(&redis, "shop/b").await;
    let s = setup(&redis, vec![pod_json("a", None), pod_json("b", None)]).await;
    reconcile(Arc::new(group()), s.ctx.clone()).await.unwrap();
    assert!(leader_patched(&s.seen, "a"), "{:#?}", writes(&s.seen));
    let before = writes(&s.seen).len();
    // a leaves (released, unregistered): no longer a member, so nothing
    // but a's own leader label, which the cache does not show, calls for
    // a patch of a.
    a.close().await.unwrap();
    eventually(Duration::from_secs(3), "b leads", || gb.is_leader()).await;
    reconcile(Arc::new(led_by_a()), s.ctx.clone())
        .await
        .unwrap();
    let after: Vec<String> = writes(&s.seen)[before..]
        .iter()
        .filter(|r| r.contains("/api/v1/namespaces/shop/pods/"))
        .cloned()
        .collect();
    let a_cleared = after
        .iter()
        .position(|r| r.contains("/pods/a ") && r.contains(r#""leasehold.dev/role":null"#));
    let b_led = after
        .iter()
        .position(|r| r.contains("/pods/b ") && r.contains(r#""leasehold.dev/role":"leader""#));
    assert!(
        matches!((a_cleared, b_led), (Some(x), Some(y)) if x < y),
        "a's leader label must go before b gets one: {after:#?}"
    );
    drop(ga);
    b.close().await.unwrap();
}
