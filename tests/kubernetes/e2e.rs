//! End to end against a real cluster: set LEASEHOLD_E2E_KUBECONFIG to
//! a kubeconfig (kind, k3d, any cluster where you may create a namespace and
//! a CRD). It applies crds/, creates a namespace with two pods and a
//! LeaderGroup, runs two library nodes named after the pods and the
//! controller in this process against a local redis-server, checks labels
//! and status, kills the leader node and checks that the label moves.
//! Without a kubeconfig it fails, unless `LEASEHOLD_SKIP_E2E` is set
//! (scripts/test sets it when none is given).

use leasehold_testkit as testkit;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, CustomResourceExt};
use leasehold_engine::{ElectionConfig, Node, NodeConfig, Store};
use leasehold_kube::crd::LeaderGroup;
use leasehold_kube::run::ControllerArgs;
use serde_json::json;
use testkit::{eventually_async, RedisServer};

async fn role_of(pods: &Api<Pod>, name: &str) -> Option<String> {
    let pod = pods.get(name).await.ok()?;
    pod.metadata.labels?.get("leasehold.dev/role").cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_labels_follow_the_leader_in_a_real_cluster() {
    let Ok(path) = std::env::var("LEASEHOLD_E2E_KUBECONFIG") else {
        testkit::lacks(
            "e2e_labels_follow_the_leader_in_a_real_cluster",
            testkit::Part::E2e,
            "set LEASEHOLD_E2E_KUBECONFIG to a cluster's kubeconfig (docs/controller.md, 'End-to-end tests')",
        );
        return;
    };
    let kubeconfig = Kubeconfig::read_from(&path).expect("read LEASEHOLD_E2E_KUBECONFIG");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig");
    let client = kube::Client::try_from(config).expect("client");
    // The controller reads KUBECONFIG like kubectl does.
    std::env::set_var("KUBECONFIG", &path);

    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.patch(
        "leadergroups.leasehold.dev",
        &PatchParams::apply("leasehold-e2e").force(),
        &Patch::Apply(LeaderGroup::crd()),
    )
    .await
    .expect("apply the CRD");
    tokio::time::sleep(Duration::from_secs(2)).await; // established

    let ns = format!("leasehold-e2e-{:06x}", fastrand::u32(..0xffffff));
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({ "metadata": { "name": ns } })).unwrap(),
        )
        .await
        .expect("create namespace");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    for name in ["web-0", "web-1"] {
        let pod = json!({
            "metadata": { "name": name, "labels": { "app": "web" } },
            "spec": { "containers": [{ "name": "pause", "image": "registry.k8s.io/pause:3.9" }] }
        });
        pods.create(
            &PostParams::default(),
            &serde_json::from_value(pod).unwrap(),
        )
        .await
        .expect("create pod");
    }
    let groups: Api<LeaderGroup> = Api::namespaced(client.clone(), &ns);
    let group = json!({
        "apiVersion": "leasehold.dev/v1alpha1", "kind": "LeaderGroup",
        "metadata": { "name": "web" },
        "spec": { "selector": { "matchLabels": { "app": "web" } }, "ttlMs": 2000, "renewIntervalMs": 500, "retryIntervalMs": 200 }
    });
    groups
        .create(
            &PostParams::default(),
            &serde_json::from_value(group).unwrap(),
        )
        .await
        .expect("create LeaderGroup");
    // A bad spec is refused by the API server.
    let bad = json!({
        "apiVersion": "leasehold.dev/v1alpha1", "kind": "LeaderGroup", "metadata": { "name": "bad" },
        "spec": { "selector": { "matchLabels": { "app": "web" } }, "ttlMs": 1000, "renewIntervalMs": 1000 }
    });
    let refused = groups
        .create(
            &PostParams::default(),
            &serde_json::from_value(bad).unwrap(),
        )
        .await;
    assert!(refused.is_err(), "renewIntervalMs >= ttlMs must be refused");

    let redis = RedisServer::start();
    let prefix = "lh-e2e";
    let cfg = ElectionConfig {
        ttl_ms: 2000,
        renew_interval_ms: 500,
        retry_interval_ms: 200,
    };
    let mut nodes = Vec::new();
    for name in ["web-0", "web-1"] {
        let store = Store::connect(&redis.url(), prefix).unwrap();
        let node = Node::start(store, &format!("{ns}/{name}"), NodeConfig::with_lease(2000))
            .await
            .unwrap();
        let g = node.join(&format!("{ns}/web"), cfg).unwrap();
        nodes.push((name, node, g));
    }
    let args = ControllerArgs {
        pod_name: "controller-e2e".into(),
        resync_seconds: 5,
        watch_namespace: Some(ns.clone()),
        leader_endpoints: false,
        ..testkit::controller_args(&redis, prefix, &ns, testkit::free_addr())
    };
    let controller = tokio::spawn(leasehold_kube::run::run(args));

    let limit = Duration::from_secs(30);
    eventually_async(limit, "one pod labelled leader, the other follower", || {
        let pods = pods.clone();
        async move {
            let (a, b) = (role_of(&pods, "web-0").await, role_of(&pods, "web-1").await);
            matches!(
                (a.as_deref(), b.as_deref()),
                (Some("leader"), Some("follower")) | (Some("follower"), Some("leader"))
            )
        }
    })
    .await;
    let leader_index = nodes
        .iter()
        .position(|(_, _, g)| g.is_leader())
        .expect("a leader node");
    let leader_pod = nodes[leader_index].0;
    assert_eq!(role_of(&pods, leader_pod).await.as_deref(), Some("leader"));
    eventually_async(limit, "status shows the leader", || {
        let groups = groups.clone();
        async move {
            let g = groups.get("web").await.ok();
            g.and_then(|g| g.status).and_then(|s| s.leader).as_deref() == Some(leader_pod)
        }
    })
    .await;

    // Crash the leader node: the label moves to the other pod.
    let (_, crashed, _) = nodes.remove(leader_index);
    drop(crashed);
    let survivor = nodes[0].0;
    eventually_async(limit, "the label moved to the other pod", || {
        let pods = pods.clone();
        async move {
            role_of(&pods, survivor).await.as_deref() == Some("leader")
                && role_of(&pods, leader_pod).await.as_deref() != Some("leader")
        }
    })
    .await;

    controller.abort();
    for (_, node, _) in nodes {
        let _ = node.close().await;
    }
    let _ = namespaces.delete(&ns, &DeleteParams::default()).await;
}
