//! One group across two Kubernetes clusters that share a store: two real API
//! servers (each with its own etcd), one store, and in each cluster a
//! `leasehold controller` and agents named for it (`--cluster east`,
//! `--cluster west`). Pods of the same name run in both clusters. East's
//! controller and agents reach the store through a proxy, which the test
//! pauses to cut east off while west still reaches the store.
//!
//! A watch of each API server's pods follows every label change in the
//! order that server made them: at no point may two pods of one cluster
//! carry the leader label. The group has a leader Service (`spec.service`),
//! and a watch of each cluster's EndpointSlice checks every state of it: one
//! address at most, the annotated pod's, a term that never goes back.

use leasehold_testkit as testkit;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kube::api::{Patch, PatchParams};
use kube::Api;
use leasehold_kube::crd::LeaderGroup;
use serde_json::{json, Value};
use testkit::agent::Agent;
use testkit::kube_api::ApiServer;
use testkit::proxy::Proxy;
use testkit::{eventually_async, free_port, Signal};

use crate::apiserver::{
    create_group, create_pod, kubectl, label_bound, one_active, prepared_api_server, Controller,
    LabelWatch, SliceWatch, NS, RETRY, TTL,
};

/// The group's renew interval (ttl 1000, renew 300, retry 200 ms).
const RENEW: Duration = Duration::from_millis(300);

/// One cluster: its API server, its controller and its agents, all of them
/// reaching the store at `store_url`.
struct Cluster {
    name: &'static str,
    api: ApiServer,
    admin: kube::Client,
    watch: LabelWatch,
    /// The leader Service's slice in this cluster.
    slices: SliceWatch,
    store_url: String,
    controller: Option<Controller>,
    agents: BTreeMap<String, Agent>,
}

impl Cluster {
    /// The API server with pods `pods` and the group `web` (ttl
    /// 1000/300/200) with its leader Service `web-leader`.
    async fn start(
        test: &str,
        name: &'static str,
        store_url: String,
        pods: &[&str],
    ) -> Option<Self> {
        Self::start_with_ttl(test, name, store_url, pods, 1000).await
    }

    /// [`Cluster::start`] with the group's ttl `ttl_ms`.
    async fn start_with_ttl(
        test: &str,
        name: &'static str,
        store_url: String,
        pods: &[&str],
        ttl_ms: u64,
    ) -> Option<Self> {
        let (api, admin) = prepared_api_server(test, &["leaderEndpoints.enabled=true"]).await?;
        for pod in pods {
            create_pod(&admin, pod).await;
        }
        let spec = json!({ "selector": { "matchLabels": { "app": "web" } },
                           "ttlMs": ttl_ms, "renewIntervalMs": 300, "retryIntervalMs": 200,
                           "service": { "name": "web-leader", "ports": [{ "port": 80 }] } });
        create_group(&admin, "web", spec)
            .await
            .expect("create LeaderGroup web");
        let watch = LabelWatch::start(admin.clone());
        let slices = SliceWatch::start(admin.clone()).await;
        Some(Self {
            name,
            api,
            admin,
            watch,
            slices,
            store_url,
            controller: None,
            agents: BTreeMap::new(),
        })
    }

    fn start_controller(&mut self) {
        let name = format!("leasehold-{}", self.name);
        let controller = self.replica(&name, &self.store_url);
        self.controller = Some(controller);
    }

    /// A controller replica `name` of this cluster, reaching the store at
    /// `store_url`.
    fn replica(&self, name: &str, store_url: &str) -> Controller {
        let flags = ["--cluster", self.name, "--leader-endpoints"];
        Controller::start_at(&self.api, store_url, name, &flags, &[])
    }

    /// Starts the agent of pod `pod` at `priority` (a new process; one
    /// already running for it is killed first).
    async fn start_agent(&mut self, pod: &str, priority: u32) {
        self.agents.remove(pod);
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        let priority = priority.to_string();
        let args: Vec<String> = [
            "agent",
            "--store-url",
            &self.store_url,
            "--prefix",
            "lh",
            "--cluster",
            self.name,
            "--namespace",
            NS,
            "--pod-name",
            pod,
            "--group",
            "web",
            "--priority",
            &priority,
            "--listen",
            &listen,
            "--ttl-ms",
            "1000",
            "--renew-interval-ms",
            "300",
            "--retry-interval-ms",
            "200",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let id = format!("{}/{NS}/{pod}", self.name);
        let agent = Agent::start(&id, port, args).await;
        self.agents.insert(pod.to_owned(), agent);
    }

    fn agent(&self, pod: &str) -> &Agent {
        self.agents.get(pod).expect("an agent for the pod")
    }

    async fn status(&self) -> Value {
        let groups: Api<LeaderGroup> = Api::namespaced(self.admin.clone(), NS);
        let g = groups.get("web").await.expect("get group");
        serde_json::to_value(g.status).unwrap_or(Value::Null)
    }

    /// `(status, reason)` of condition `type_`.
    async fn condition(&self, type_: &str) -> Option<(String, String)> {
        let status = self.status().await;
        let c = (status["conditions"].as_array()?.iter()).find(|c| c["type"] == type_)?;
        Some((
            c["status"].as_str()?.to_owned(),
            c["reason"].as_str()?.to_owned(),
        ))
    }

    /// Whether the status shows `leader` (`CLUSTER/POD`) leading, with
    /// Ready as `ready` and for `reason`.
    async fn shows(&self, leader: &str, ready: (&str, &str)) -> bool {
        let status = self.status().await;
        let condition = self.condition("Ready").await;
        status["leader"] == leader
            && condition.as_ref().map(|(s, r)| (s.as_str(), r.as_str())) == Some(ready)
    }

    async fn annotate(&self, key: &str, value: &str) {
        let groups: Api<LeaderGroup> = Api::namespaced(self.admin.clone(), NS);
        let patch = json!({ "metadata": { "annotations": { key: value } } });
        groups
            .patch("web", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("annotate the group");
    }
}

/// Waits until cluster `c` shows no pod labelled leader; how long it took.
async fn unlabelled(c: &Cluster, limit: Duration, what: &str) -> Duration {
    let start = Instant::now();
    while c.watch.leader().is_some() {
        assert!(
            start.elapsed() < limit,
            "{what}: {} still labels {:?} after {limit:?}",
            c.name,
            c.watch.leader()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    start.elapsed()
}

on_both_stores! {
    /// East is preferred (priority 10 against west's 5). Its leader is
    /// killed, and west takes over; a step-down asked in east hands the
    /// seat back across clusters; then east is cut off from the store, and
    /// west takes over while east's controller takes its leader label off
    /// a ttl after its last read; the link heals and east labels what the
    /// store says.
    async fn a_singleton_moves_between_two_clusters(server) {
        let test = "clusters: one group across two API servers";
        let proxy = Proxy::start(server.port()).await;
        let Some(mut east) = Cluster::start(test, "east", server.url_at(proxy.port), &["web-0"]).await
        else {
            return;
        };
        let Some(mut west) = Cluster::start(test, "west", server.url(), &["web-0", "web-1"]).await
        else {
            return;
        };
        east.start_agent("web-0", 10).await;
        east.start_controller();
        west.start_controller();
        let (first, _) = east.watch.next_leader(None, Duration::from_secs(20)).await;
        assert_eq!(first, "web-0");
        west.start_agent("web-0", 5).await;
        west.start_agent("web-1", 5).await;

        // Each cluster says who leads and where; west labels its own pods
        // followers (its web-0 is not east's), and shows east's member.
        eventually_async(Duration::from_secs(10), "west shows east's leader", || async {
            west.shows("east/web-0", ("False", "LeaderInOtherCluster")).await
                && west.watch.roles().values().filter(|r| *r == "follower").count() == 2
        })
        .await;
        eventually_async(Duration::from_secs(10), "east shows its own leader", || async {
            east.shows("east/web-0", ("True", "Ready")).await
        })
        .await;
        // East's slice holds its leader's address; west's holds none.
        let (in_slice, _, _) = east.slices.next_leader(None, label_bound()).await;
        assert_eq!(in_slice, "web-0");
        west.slices.emptied(label_bound(), "west's slice while east leads").await;
        let members = west.status().await["members"].clone();
        let east_member = (members.as_array().unwrap().iter())
            .find(|m| m["node"] == "east/shop/web-0")
            .expect("east's member in west's status")
            .clone();
        assert_eq!(
            (&east_member["cluster"], &east_member["pod"], &east_member["role"]),
            (&json!("east"), &json!("web-0"), &json!("leader")),
            "{east_member}"
        );
        assert!(east_member.get("problem").is_none(), "{east_member}");
        if let Some(table) = kubectl(&west.api, &["get", "lg", "-n", NS]) {
            println!("west:\n{table}");
            let row = table.lines().nth(1).expect("a row for web");
            assert!(row.contains("east/web-0"), "{row}");
        }

        // 1. East's leader dies: a pod of west is labelled within ttl +
        // retry + the label bound, and east's label goes within the label
        // bound of west's.
        let killed = Instant::now();
        east.agent("web-0").signal(Signal::SIGKILL);
        let (next, took) = west.watch.next_leader(None, TTL + RETRY + label_bound()).await;
        println!("kill: west labels {next} {took:?} after east's leader died");
        let gone = unlabelled(&east, label_bound(), "after the kill").await;
        println!("kill: east's label gone {gone:?} after west's, {:?} after the kill", killed.elapsed());
        let (in_slice, _, _) = west.slices.next_leader(None, label_bound()).await;
        assert_eq!(in_slice, next, "west's slice");
        east.slices.emptied(label_bound(), "east's slice after the kill").await;

        // 2. East's pod comes back (failback is off: west leads on); a
        // step-down asked in east moves the seat back to the best member,
        // east's.
        east.start_agent("web-0", 10).await;
        // Live, and campaigning: it follows west's leader. A member that is
        // live but has not yet read the lease may not hear the release in
        // time, and others wait for a better member two retry intervals at
        // most (docs/guarantees.md): the seat would go to west's web-0.
        eventually_async(Duration::from_secs(10), "east's member is back, a follower", || async {
            east.status().await["liveMembers"] == 3
                && east.agent("web-0").role("web").await.map(|(role, _)| role).as_deref() == Some("follower")
        })
        .await;
        assert_eq!(west.watch.leader().as_deref(), Some(next.as_str()));
        east.annotate("leasehold.dev/step-down", "1").await;
        let (back, took) = east.watch.next_leader(None, label_bound()).await;
        assert_eq!(back, "web-0");
        println!("step-down: east labels {back} {took:?} after the request");
        let gone = unlabelled(&west, label_bound(), "after the step-down").await;
        println!("step-down: west's label gone {gone:?} after east's");
        let (in_slice, term, _) = east.slices.next_leader(None, label_bound()).await;
        assert_eq!(in_slice, "web-0", "east's slice");
        west.slices.emptied(label_bound(), "west's slice after the step-down").await;

        // 3. East cut off from the store (its controller and agents): west
        // leads within ttl + retry and is labelled within the label bound
        // after; east takes its leader label, and its slice's address, off
        // a ttl after its controller's last read of the store, which came
        // at most half a ttl (and a reconcile) before the cut: not at once,
        // and within a ttl of the cut, with two retry intervals of margin.
        let cut = Instant::now();
        proxy.pause();
        let (mut west_at, mut east_off_at, mut east_slice_at) = (None, None, None);
        let limit = TTL + RETRY + label_bound();
        while west_at.is_none() || east_off_at.is_none() || east_slice_at.is_none() {
            let t = cut.elapsed();
            if west_at.is_none() && west.watch.leader().is_some() {
                west_at = Some(t);
            }
            if east_off_at.is_none() && east.watch.leader().is_none() {
                east_off_at = Some(t);
            }
            if east_slice_at.is_none() && east.slices.current().is_some_and(|s| s.addresses.is_empty()) {
                east_slice_at = Some(t);
            }
            assert!(
                t < limit,
                "after the cut, within {limit:?}: west labels {:?}, east labels {:?}, east's slice {:?}",
                west.watch.leader(),
                east.watch.leader(),
                east.slices.current()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let (west_at, east_off_at) = (west_at.unwrap(), east_off_at.unwrap());
        let east_slice_at = east_slice_at.unwrap();
        let taken = west.watch.leader().expect("west's leader");
        println!("cut: west labels {taken} {west_at:?} after the cut, east's label goes {east_off_at:?} and its slice's address {east_slice_at:?} after it");
        // The lease east read last had at least ttl - renew left, and the
        // read came at most half a ttl (and a reconcile) before the cut.
        let earliest = TTL - RENEW - TTL / 2 - Duration::from_millis(100);
        let bound = TTL + 2 * RETRY;
        for (what, at) in [("label", east_off_at), ("slice's address", east_slice_at)] {
            assert!(
                at >= earliest,
                "east's {what} went {at:?} after the cut, before the lease it saw could have run out"
            );
            assert!(at <= bound, "east's {what} went {at:?} after the cut (bound {bound:?})");
        }
        // Marked unconfirmed at the term it held, not vacated: the same
        // term's leader may be written back.
        let emptied = east.slices.current().expect("east's slice");
        assert!(emptied.unconfirmed && emptied.term == term, "{emptied:?}");
        let (in_slice, _, _) = west.slices.next_leader(None, label_bound()).await;
        assert_eq!(in_slice, taken, "west's slice");
        eventually_async(Duration::from_secs(5), "east says why", || async {
            east.condition("Ready").await.map(|(_, r)| r) == Some("LeaderUnconfirmed".into())
        })
        .await;

        // 4. The link heals: east labels what the store says, its pod a
        // follower of west's leader.
        proxy.resume();
        let leader = format!("west/{taken}");
        eventually_async(Duration::from_secs(10), "east relabels after the cut", || async {
            east.shows(&leader, ("False", "LeaderInOtherCluster")).await
                && east.watch.roles().get("web-0").map(String::as_str) == Some("follower")
        })
        .await;
        eventually_async(Duration::from_secs(10), "east's slice after the cut", || async {
            (east.slices.current())
                .is_some_and(|s| s.addresses.is_empty() && !s.unconfirmed && s.term > term)
        })
        .await;
        assert_eq!(west.watch.leader(), Some(taken));

        east.watch.assert_never_two_leaders();
        west.watch.assert_never_two_leaders();
        for c in [&east, &west] {
            c.slices.assert_fenced(4);
            let forbidden = c.controller.as_ref().map(|c| c.forbidden()).unwrap_or_default();
            assert_eq!(forbidden, Vec::<String>::new(), "{}", c.name);
        }
    }
}

on_both_stores! {
    /// The two clusters' LeaderGroups disagree on the ttl (east 1000 ms,
    /// west 2000 ms): the first written stays, the store's timings change
    /// once and no more, and both clusters say so in `SpecConflict`; once
    /// west agrees, neither reports a conflict.
    async fn timings_that_differ_between_clusters_are_reported_and_never_flap(server) {
        let test = "clusters: timings that differ";
        let Some(mut east) = Cluster::start(test, "east", server.url(), &["web-0"]).await else {
            return;
        };
        let Some(mut west) =
            Cluster::start_with_ttl(test, "west", server.url(), &["web-0"], 2000).await
        else {
            return;
        };
        east.start_agent("web-0", 10).await;
        east.start_controller();
        eventually_async(Duration::from_secs(20), "east writes its timings", || async {
            server.adopted_ttl_ms("shop/web") == "1000"
        })
        .await;
        west.start_agent("web-0", 5).await;
        west.start_controller();
        // Every 50 ms (each sample is a client process) for 5 s: the
        // store's ttl stays east's, the first written.
        let watched = Instant::now();
        let mut seen = vec![server.adopted_ttl_ms("shop/web")];
        let mut both = false;
        while watched.elapsed() < Duration::from_secs(5) || !both {
            let ttl = server.adopted_ttl_ms("shop/web");
            if seen.last() != Some(&ttl) {
                seen.push(ttl);
            }
            let conflict = |c: Option<(String, String)>| c == Some(("True".into(), "TimingsDiffer".into()));
            both = conflict(east.condition("SpecConflict").await)
                && conflict(west.condition("SpecConflict").await);
            assert!(
                watched.elapsed() < Duration::from_secs(20),
                "no SpecConflict in both within 20 s: east {:?}, west {:?}",
                east.condition("SpecConflict").await,
                west.condition("SpecConflict").await
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(seen, ["1000"], "the store's ttl changed after east's was written");

        // West's LeaderGroup takes east's ttl: the conflict is over in both.
        let groups: Api<LeaderGroup> = Api::namespaced(west.admin.clone(), NS);
        let patch = json!({ "spec": { "ttlMs": 1000 } });
        groups
            .patch("web", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("patch west's LeaderGroup");
        let agreed = |c: Option<(String, String)>| c == Some(("False".into(), "TimingsAgree".into()));
        eventually_async(Duration::from_secs(20), "the clusters agree", || async {
            agreed(west.condition("SpecConflict").await) && agreed(east.condition("SpecConflict").await)
        })
        .await;
        assert_eq!(server.adopted_ttl_ms("shop/web"), "1000");

        // West's LeaderGroup is deleted: its record goes with it, so east's
        // next timings are written at once, with no conflict (a record left
        // behind would count for ten minutes).
        assert!(server.keeps_timings_of("shop/web", "west"));
        groups
            .delete("web", &Default::default())
            .await
            .expect("delete west's LeaderGroup");
        eventually_async(Duration::from_secs(5), "west's record withdrawn", || async {
            !server.keeps_timings_of("shop/web", "west")
        })
        .await;
        assert!(server.keeps_timings_of("shop/web", "east"));
        let east_groups: Api<LeaderGroup> = Api::namespaced(east.admin.clone(), NS);
        let patch = json!({ "spec": { "ttlMs": 1500, "renewIntervalMs": 400 } });
        east_groups
            .patch("web", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("patch east's LeaderGroup");
        eventually_async(Duration::from_secs(10), "east's new ttl written", || async {
            server.adopted_ttl_ms("shop/web") == "1500"
                && agreed(east.condition("SpecConflict").await)
        })
        .await;
    }
}

on_both_stores! {
    /// One controller replica of east is cut off from the store while the
    /// other, and east's agents, still reach it: the leader keeps its lease
    /// and its term. The cut-off replica takes the label and the slice's
    /// address off once, a lease after its last read (it cannot tell this
    /// case from its whole cluster being cut off); the other replica, active
    /// by then, puts both back at the same term at its next look, and they
    /// stay. The group's ttl (3 s) is longer than the replicas' (1 s), so
    /// the other replica is active, and has written the slice, before the
    /// cut-off one acts: its memory of the slice is then behind.
    async fn a_replica_cut_off_alone_leaves_the_leader_labelled_and_in_its_slice(server) {
        let test = "clusters: one replica cut off";
        let ttl = Duration::from_secs(3);
        let proxy = Proxy::start(server.port()).await;
        let Some(mut east) =
            Cluster::start_with_ttl(test, "east", server.url(), &["web-0", "web-1"], 3000).await
        else {
            return;
        };
        east.start_agent("web-0", 10).await;
        east.start_agent("web-1", 5).await;
        // The replica that reaches the store through the proxy starts
        // first, so that it is the active one when it is cut off.
        let cut_off = east.replica("leasehold-0", &server.url_at(proxy.port));
        let active = [cut_off];
        assert_eq!(one_active(&active, Duration::from_secs(20)).await, 0);
        let [cut_off] = active;
        let (leader, term, _) = east.slices.next_leader(None, Duration::from_secs(20)).await;
        eventually_async(Duration::from_secs(5), "the slice recorded in the status", || async {
            east.status().await["endpoint"]["address"].is_string()
                && east.watch.leader().as_deref() == Some(leader.as_str())
        })
        .await;
        let replicas = [cut_off, east.replica("leasehold-1", &server.url())];
        eventually_async(Duration::from_secs(10), "leasehold-1 serves as a standby", || async {
            replicas[1].serves().await
        })
        .await;

        let cut = Instant::now();
        proxy.pause();
        eventually_async(Duration::from_secs(5), "leasehold-1 takes over", || async {
            replicas[1].active().await
        })
        .await;
        let took_over = cut.elapsed();
        // The cut-off replica acts a lease after its last read, which came
        // at most half a lease before the cut.
        eventually_async(ttl + 2 * RETRY, "the slice unconfirmed", || async {
            east.slices.seen_unconfirmed()
        })
        .await;
        let unconfirmed = cut.elapsed();
        // Back within a look (half a lease) and the label bound.
        eventually_async(ttl / 2 + label_bound(), "the leader labelled and in its slice again", || async {
            let slice = east.slices.current();
            east.watch.leader().as_deref() == Some(leader.as_str())
                && slice.is_some_and(|s| s.leader.as_deref() == Some(leader.as_str()) && s.term == term)
        })
        .await;
        println!(
            "cut: leasehold-1 active {took_over:?}, the slice unconfirmed {unconfirmed:?}, both back {:?} after the cut",
            cut.elapsed()
        );
        // And they stay: the cut-off replica does not act again.
        tokio::time::sleep(ttl).await;
        let slice = east.slices.current().expect("east's slice");
        assert_eq!((slice.leader.as_deref(), slice.term), (Some(leader.as_str()), term));
        assert_eq!(east.watch.leader().as_deref(), Some(leader.as_str()));
        east.watch.assert_never_two_leaders();
        east.slices.assert_fenced(3);
        for r in &replicas {
            assert_eq!(r.forbidden(), Vec::<String>::new(), "{}", r.name);
        }
    }
}
