//! The README's user guide, command for command, on a one-node Kubernetes
//! 1.20 (`scripts/kubernetes/node.sh`: etcd, kube-apiserver, scheduler,
//! controller-manager, containerd, kubelet, kube-proxy and a cluster DNS in a
//! network namespace of their own). The images are assembled locally
//! (`scripts/kubernetes/images.sh`, standing in for `docker build`) from this
//! test's own `leasehold` binary.
//!
//! Every command below that the README shows is checked to be in the README,
//! so the two cannot drift apart; the few departures are the cluster's age
//! (1.20 has no native sidecars: the StatefulSet's agent becomes a plain
//! container, as the README says to do there) and `--wait=false` on deletes
//! whose effect is timed.
//!
//! Needs root and the binaries of `scripts/kubernetes/build.sh cluster`;
//! without them it fails, unless the cluster is left out on purpose
//! (`LEASEHOLD_SKIP_CLUSTER`, which scripts/test sets without root). Takes about
//! four minutes, most of it starting the node and building its images.

// A test may lock a mutex raw (clippy.toml refuses it elsewhere): a
// poisoned lock means another thread of the test panicked, which fails it.
#![allow(clippy::disallowed_methods)]

use leasehold_testkit as testkit;
use testkit::wall_ns;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Why the cluster cannot start here, if it cannot.
fn missing() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if !testkit::root() {
        return Some(
            "the one-node cluster needs root (network namespace, containerd, kubelet)".into(),
        );
    }
    let bin = testkit::kube::bin_dir();
    for name in [
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kubelet",
        "kube-proxy",
    ] {
        if !bin.join(name).is_file() {
            return Some(format!(
                "needs {} (scripts/kubernetes/build.sh cluster builds it)",
                bin.join(name).display()
            ));
        }
    }
    testkit::kube::missing()
}

/// The one-node cluster; taken down on drop, its directory (every
/// component's log) kept when the test failed.
struct Cluster {
    dir: PathBuf,
    helm: PathBuf,
}

impl Cluster {
    fn up(test: &str) -> Option<Self> {
        if let Some(why) = missing() {
            testkit::lacks(test, testkit::Part::Cluster, &why);
            return None;
        }
        let helm = testkit::helm_or_skip(test)?;
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("one-node-cluster");
        let started = Instant::now();
        let out = Command::new("bash")
            .arg(Path::new(ROOT).join("scripts/kubernetes/node.sh"))
            .arg("up")
            .arg(&dir)
            .env("LEASEHOLD_BIN", env!("CARGO_BIN_EXE_leasehold"))
            .output()
            .expect("run node.sh up");
        let cluster = Self { dir, helm };
        assert!(
            out.status.success(),
            "node.sh up failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        println!("one-node cluster up after {:?}", started.elapsed());
        Some(cluster)
    }

    /// CMD inside the cluster's network namespace, admin kubeconfig, helm
    /// on the PATH, in the repository (the README's paths are relative).
    fn command(&self, program: &str, args: &[&str]) -> Command {
        let path = format!(
            "{}:{}",
            self.helm.parent().expect("helm's directory").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut cmd = Command::new("bash");
        cmd.arg(Path::new(ROOT).join("scripts/kubernetes/node.sh"))
            .arg("run")
            .arg(&self.dir)
            .arg("env")
            .arg(format!("PATH={path}"))
            .arg(program)
            .args(args)
            .current_dir(ROOT);
        cmd
    }

    fn output(&self, program: &str, args: &[&str]) -> Output {
        self.command(program, args)
            .output()
            .expect("run in the cluster's namespace")
    }

    /// A shell command line, which must succeed; its stdout.
    fn sh(&self, line: &str) -> String {
        let out = self.output("sh", &["-c", line]);
        assert!(
            out.status.success(),
            "`{line}` failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A command the README shows (checked), run as it is written.
    fn readme(&self, line: &str) -> String {
        assert_in_readme(line);
        self.sh(line)
    }

    fn kubectl(&self, args: &[&str]) -> String {
        let out = self.output("kubectl", args);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// kubectl's answer, or None while it fails (an object not there yet).
    fn try_kubectl(&self, args: &[&str]) -> Option<String> {
        let out = self.output("kubectl", args);
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut args = args.to_vec();
        args.extend(["-o", "json"]);
        serde_json::from_str(&self.kubectl(&args)).expect("kubectl's JSON")
    }

    /// `kubectl get lg NAME`'s LEADER column, when it has one.
    fn leader_of(&self, group: &str) -> Option<String> {
        let out = self.try_kubectl(&[
            "get",
            "lg",
            group,
            "--no-headers",
            "-o",
            "custom-columns=L:.status.leader",
        ])?;
        let leader = out.trim();
        (!leader.is_empty() && leader != "<none>").then(|| leader.to_owned())
    }

    /// The pods of a label selector with their role labels.
    fn roles(&self, namespace: &str, selector: &str) -> Vec<(String, String)> {
        let pods = self.json(&["-n", namespace, "get", "pods", "-l", selector]);
        pods["items"]
            .as_array()
            .expect("items")
            .iter()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .map(|p| {
                let name = p["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                let role = p["metadata"]["labels"]["leasehold.dev/role"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned();
                (name, role)
            })
            .collect()
    }

    fn logs_tail(&self) -> String {
        let mut out = String::new();
        for name in ["kubelet", "kube-apiserver", "containerd"] {
            let log =
                std::fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(15).collect();
            out += &format!("--- {name}.log, last lines\n");
            for line in tail.iter().rev() {
                out += line;
                out.push('\n');
            }
        }
        out
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for (what, args) in [
                (
                    "pods",
                    vec![
                        "get",
                        "pods",
                        "-A",
                        "-o",
                        "wide",
                        "-L",
                        "leasehold.dev/role",
                    ],
                ),
                ("groups", vec!["get", "lg", "-A", "-o", "wide"]),
                (
                    "controller",
                    vec![
                        "-n",
                        "leasehold-system",
                        "logs",
                        "-l",
                        "app.kubernetes.io/component=controller",
                        "--tail",
                        "30",
                    ],
                ),
            ] {
                let out = self.output("kubectl", &args);
                eprintln!(
                    "--- {what}\n{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            eprintln!("{}", self.logs_tail());
            eprintln!("the cluster's directory is kept: {}", self.dir.display());
        }
        let _ = Command::new("bash")
            .arg(Path::new(ROOT).join("scripts/kubernetes/node.sh"))
            .arg("down")
            .arg(&self.dir)
            .status();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Whitespace-normalised README, with shell line continuations joined and
/// trailing `# comments` dropped.
fn readme_commands() -> String {
    let text = std::fs::read_to_string(Path::new(ROOT).join("README.md")).expect("README.md");
    let mut out = String::new();
    for line in text.lines() {
        let line = match line.find("  #").or_else(|| line.find(" # ")) {
            Some(i) => &line[..i],
            None => line,
        };
        let line = line.trim_end();
        match line.strip_suffix('\\') {
            Some(head) => {
                out += head.trim();
                out.push(' ');
            }
            None => {
                out += line.trim();
                out.push('\n');
            }
        }
    }
    out.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join("\n")
}

fn assert_in_readme(line: &str) {
    let line = line.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        readme_commands().contains(&line),
        "the README no longer shows `{line}`: change the test with it"
    );
}

/// Every state of the `web-leader` Service's endpoints, in the API server's
/// order, from `kubectl get endpoints -w`: the ready pods and when the test
/// saw them.
struct EndpointWatch {
    child: Child,
    seen: Arc<Mutex<Vec<EndpointState>>>,
}

/// When the watch delivered a state, and the ready pods in it.
type EndpointState = (Instant, Vec<String>);

impl EndpointWatch {
    fn start(cluster: &Cluster, service: &str) -> Self {
        let mut child = cluster
            .command(
                "kubectl",
                &["get", "endpoints", service, "-w", "-o", "json"],
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("kubectl get endpoints -w");
        let stdout = child.stdout.take().expect("stdout");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        std::thread::spawn(move || {
            let objects =
                serde_json::Deserializer::from_reader(BufReader::new(stdout)).into_iter::<Value>();
            for object in objects {
                let Ok(endpoints) = object else { break };
                let mut pods = Vec::new();
                for subset in endpoints["subsets"].as_array().into_iter().flatten() {
                    for address in subset["addresses"].as_array().into_iter().flatten() {
                        pods.push(
                            address["targetRef"]["name"]
                                .as_str()
                                .unwrap_or("?")
                                .to_owned(),
                        );
                    }
                }
                sink.lock().unwrap().push((Instant::now(), pods));
            }
        });
        Self { child, seen }
    }

    /// The first state after `since` that is one pod other than `not`.
    fn wait_for_other(&self, not: &str, since: Instant, limit: Duration) -> (String, Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let found = self
                .seen
                .lock()
                .unwrap()
                .iter()
                .find(|(at, pods)| *at >= since && pods.len() == 1 && pods[0] != not)
                .map(|(at, pods)| (pods[0].clone(), *at - since));
            if let Some(found) = found {
                return found;
            }
            assert!(
                Instant::now() < deadline,
                "web-leader did not move from {not} to another pod within {limit:?}: {:?}",
                self.states()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// How many times the one endpoint went from one pod to another after
    /// `since` (a state with none between two pods does not count).
    fn leader_changes_since(&self, since: Instant) -> usize {
        let seen = self.seen.lock().unwrap();
        let last_before = seen
            .iter()
            .filter(|(at, pods)| *at < since && pods.len() == 1)
            .map(|(_, pods)| pods[0].clone())
            .next_back();
        let mut current = last_before;
        let mut changes = 0;
        for (_, pods) in seen.iter().filter(|(at, _)| *at >= since) {
            if let [pod] = &pods[..] {
                if current.as_ref().is_some_and(|c| c != pod) {
                    changes += 1;
                }
                current = Some(pod.clone());
            }
        }
        changes
    }

    fn states(&self) -> Vec<Vec<String>> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .map(|(_, p)| p.clone())
            .collect()
    }

    fn assert_never_two(&self) {
        let states = self.states();
        assert!(
            states.iter().all(|pods| pods.len() <= 1),
            "web-leader had more than one endpoint: {states:?}"
        );
    }
}

impl Drop for EndpointWatch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How soon `web-leader` must reach another pod after a SIGTERM or a
/// step-down: the README's bound (the retry interval, 2 s by default) plus two
/// retry intervals of margin, which also cover the controller's label patch and
/// the endpoints controller.
const MOVE_BOUND: Duration = Duration::from_secs(6);

/// Waits for `kubectl get lg web` to count three live members again.
fn three_live(cluster: &Cluster) {
    eventually(
        Duration::from_secs(90),
        "LIVE 3 in `kubectl get lg web`",
        || {
            let out = cluster.try_kubectl(&[
                "get",
                "lg",
                "web",
                "--no-headers",
                "-o",
                "custom-columns=L:.status.liveMembers",
            ])?;
            (out.trim() == "3").then_some(())
        },
    );
}

/// What one rollout did to the leader.
#[derive(Debug)]
struct RolloutFigure {
    /// Leader changes, from the LeaderGroup's `status.transitions`.
    changes: i64,
    /// Leader changes the `web-leader` Service went through (a state with
    /// no endpoint between two leaders does not count).
    endpoint_changes: usize,
    leader: String,
    /// Whether the leader after is on the StatefulSet's updated revision.
    on_new_revision: bool,
}

/// One `kubectl rollout restart` of the StatefulSet, with `preferUpdated`
/// set as given and the leader first put on web-1 by name (the README's
/// step-down-to), so that both runs start alike: a StatefulSet replaces
/// web-2 first, then web-1, then web-0.
fn rollout(cluster: &Cluster, watch: &EndpointWatch, prefer_updated: bool) -> RolloutFigure {
    let minute = Duration::from_secs(60);
    let patch = format!(r#"{{"spec":{{"placement":{{"preferUpdated":{prefer_updated}}}}}}}"#);
    cluster.kubectl(&["patch", "lg", "web", "--type", "merge", "-p", &patch]);
    three_live(cluster);
    if cluster.leader_of("web").as_deref() != Some("web-1") {
        cluster.readme("kubectl annotate lg web leasehold.dev/step-down-to-");
        cluster.kubectl(&[
            "annotate",
            "--overwrite",
            "lg",
            "web",
            "leasehold.dev/step-down-to=web-1",
        ]);
        eventually(minute, "web-1 leads after step-down-to=web-1", || {
            (cluster.leader_of("web").as_deref() == Some("web-1")).then_some(())
        });
    }
    let transitions = || {
        cluster
            .kubectl(&["get", "lg", "web", "-o", "jsonpath={.status.transitions}"])
            .trim()
            .parse::<i64>()
            .expect("transitions")
    };
    let before = transitions();
    let since = Instant::now();
    cluster.kubectl(&["rollout", "restart", "statefulset", "web"]);
    cluster.kubectl(&["rollout", "status", "statefulset", "web", "--timeout=5m"]);
    three_live(cluster);
    // The last handover, if any, is settled within a retry interval.
    std::thread::sleep(Duration::from_secs(3));
    let leader = eventually(minute, "a leader after the rollout", || {
        cluster.leader_of("web")
    });
    let updated = cluster.kubectl(&[
        "get",
        "statefulset",
        "web",
        "-o",
        "jsonpath={.status.updateRevision}",
    ]);
    let revision = cluster.kubectl(&[
        "get",
        "pod",
        &leader,
        "-o",
        "jsonpath={.metadata.labels.controller-revision-hash}",
    ]);
    RolloutFigure {
        changes: transitions() - before,
        endpoint_changes: watch.leader_changes_since(since),
        on_new_revision: !updated.trim().is_empty() && updated.trim() == revision.trim(),
        leader,
    }
}

fn eventually<T>(limit: Duration, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(Instant::now() < deadline, "not within {limit:?}: {what}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The StatefulSet as the README says to run it before Kubernetes 1.29:
/// the agent moved from `initContainers` (a native sidecar) to
/// `containers`, without its `restartPolicy`.
fn statefulset_for_1_20(dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(Path::new(ROOT).join("examples/statefulset.yaml"))
        .expect("statefulset.yaml");
    let mut set: serde_yaml::Value = serde_yaml::from_str(&text).expect("statefulset.yaml parses");
    let spec = &mut set["spec"]["template"]["spec"];
    let mut agent = spec["initContainers"][0].clone();
    assert_eq!(
        agent["name"].as_str(),
        Some("leasehold"),
        "the sidecar moved in statefulset.yaml"
    );
    agent
        .as_mapping_mut()
        .expect("a container")
        .remove("restartPolicy");
    spec.as_mapping_mut()
        .expect("a pod spec")
        .remove("initContainers");
    spec["containers"]
        .as_sequence_mut()
        .expect("containers")
        .push(agent);
    let path = dir.join("statefulset-1.20.yaml");
    std::fs::write(&path, serde_yaml::to_string(&set).expect("yaml")).expect("write");
    path
}

/// The controller replica whose `/metrics` says it is active.
fn active_controller(cluster: &Cluster) -> Option<String> {
    let pods = cluster.json(&[
        "-n",
        "leasehold-system",
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/component=controller",
    ]);
    let mut active = Vec::new();
    for pod in pods["items"].as_array().into_iter().flatten() {
        if !pod["metadata"]["deletionTimestamp"].is_null() {
            continue;
        }
        let (Some(name), Some(ip)) = (
            pod["metadata"]["name"].as_str(),
            pod["status"]["podIP"].as_str(),
        ) else {
            continue;
        };
        let out = cluster.output(
            "curl",
            &[
                "-s",
                "--max-time",
                "2",
                &format!("http://{ip}:8080/metrics"),
            ],
        );
        if String::from_utf8_lossy(&out.stdout)
            .lines()
            .any(|l| l == "leasehold_controller_active 1")
        {
            active.push(name.to_owned());
        }
    }
    (active.len() == 1).then(|| active.remove(0))
}

/// Runs of `examples/singleton-exec.yaml`'s job as recorded in Redis by the
/// image's `run-report` stand-in: "POD TERM" every 200 ms while it runs.
fn report_runs(cluster: &Cluster, redis_ip: &str) -> Vec<String> {
    let out = cluster.output(
        "redis-cli",
        &["-h", redis_ip, "LRANGE", "nightly-report:runs", "0", "-1"],
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The records as consecutive blocks of one pod and term, with their
/// lengths.
fn blocks(runs: &[String]) -> Vec<(String, u64, usize)> {
    let mut blocks: Vec<(String, u64, usize)> = Vec::new();
    for run in runs {
        let (pod, term) = run.split_once(' ').expect("POD TERM");
        let term: u64 = term.parse().expect("a term");
        match blocks.last_mut() {
            Some((p, t, n)) if p == pod && *t == term => *n += 1,
            _ => blocks.push((pod.to_owned(), term, 1)),
        }
    }
    blocks
}

/// A client of a Service from inside the cluster's network: `curl` in a
/// loop (a pause of 20 ms between calls, so two of them leave the cores to
/// what they time), each answer with the wall clock (ns) it came at. The same clock
/// as the test's: the cluster shares the machine's kernel.
struct Client {
    child: Child,
    answers: Arc<Mutex<Vec<(u128, String)>>>,
}

impl Client {
    fn start(cluster: &Cluster, ip: &str) -> Self {
        let script = format!(
            "while :; do t=$(date +%s%N); r=$(curl -s -m 1 http://{ip}/ 2>/dev/null | tr -d '\\n'); echo \"$t $r\"; sleep 0.02; done"
        );
        let mut child = cluster
            .command("sh", &["-c", &script])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("a client loop");
        let stdout = child.stdout.take().expect("stdout");
        let answers = Arc::new(Mutex::new(Vec::new()));
        let sink = answers.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let (t, answer) = line.split_once(' ').unwrap_or((&line, ""));
                if let Ok(t) = t.parse::<u128>() {
                    sink.lock().unwrap().push((t, answer.to_owned()));
                }
            }
        });
        Self { child, answers }
    }

    /// How long after `since` (wall clock, ns) the Service first answered
    /// from a pod other than `not`, and which.
    fn moved(&self, not: &str, since: u128, limit: Duration) -> (String, Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let found = self.answers.lock().unwrap().iter().find_map(|(t, answer)| {
                let pod = answer.strip_prefix("served by ")?;
                (*t >= since && pod != not).then(|| (pod.to_owned(), *t - since))
            });
            if let Some((pod, ns)) = found {
                return (pod, Duration::from_nanos(ns as u64));
            }
            assert!(
                Instant::now() < deadline,
                "no answer from a pod other than {not} within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The README's leader endpoint: the chart upgraded with it, a
/// `spec.service` on `web`; then step-downs, with a client on each Service
/// (the label-selected `web-leader`, and `web-leader-now` whose slice the
/// controller writes), timed from the step-down to the first answer from
/// the new leader.
fn leader_endpoint_against_the_label(cluster: &Cluster) {
    let minute = Duration::from_secs(60);
    cluster.readme(
        "helm upgrade leasehold charts/leasehold -n leasehold-system --reuse-values \
           --set leaderEndpoints.enabled=true",
    );
    eventually(2 * minute, "the upgraded controller active", || {
        let args = cluster.kubectl(&[
            "-n",
            "leasehold-system",
            "get",
            "pods",
            "-l",
            "app.kubernetes.io/component=controller",
            "-o",
            "jsonpath={.items[*].spec.containers[0].args}",
        ]);
        let pods = cluster.kubectl(&["-n", "leasehold-system", "get", "pods", "--no-headers"]);
        let ready = pods
            .lines()
            .filter(|l| l.contains(" 1/1 ") && l.contains("Running"))
            .count();
        (args.matches("--leader-endpoints").count() == 2 && ready == 3)
            .then(|| active_controller(cluster))
            .flatten()
    });
    cluster.readme(
        "kubectl patch lg web --type merge \
           -p '{\"spec\":{\"service\":{\"name\":\"web-leader-now\",\"ports\":[{\"name\":\"http\",\"port\":80,\"targetPort\":5678}]}}}'",
    );
    let leader = eventually(minute, "the LeaderEndpoint condition True", || {
        let g = cluster.json(&["get", "lg", "web"]);
        let ok = g["status"]["conditions"]
            .as_array()?
            .iter()
            .any(|c| c["type"] == "LeaderEndpoint" && c["status"] == "True");
        let address = g["status"]["endpoint"]["address"].as_str()?;
        (ok && !address.is_empty()).then(|| g["status"]["leader"].as_str().map(str::to_owned))?
    });
    assert_in_readme("kubectl get lg web -o wide");
    let ip = |service: &str| {
        cluster
            .kubectl(&[
                "get",
                "service",
                service,
                "-o",
                "jsonpath={.spec.clusterIP}",
            ])
            .trim()
            .to_owned()
    };
    // The slice is written; kube-proxy programs it at its next sync (at
    // most a second after the last one on 1.20). Until then the Service
    // refuses ("No route to host", seen in CI).
    let url = format!("http://{}/", ip("web-leader-now"));
    let written = Instant::now();
    eventually(Duration::from_secs(30), "web-leader-now answers", || {
        let out = cluster.output("curl", &["-s", "-m", "1", &url]);
        String::from_utf8_lossy(&out.stdout)
            .contains(&format!("served by {leader}"))
            .then_some(())
    });
    println!(
        "leader endpoint: web-leader-now answered from {leader} {:?} after the condition said written",
        written.elapsed()
    );
    let served = cluster.readme(
        "kubectl run probe --rm -i --image=busybox:1.36 --restart=Never -- wget -qO- web-leader-now",
    );
    assert!(
        served.contains(&format!("served by {leader}")),
        "web-leader-now answered {served:?}, not from the leader {leader}"
    );
    let by_label = Client::start(cluster, &ip("web-leader"));
    let by_slice = Client::start(cluster, &ip("web-leader-now"));
    let mut leader = leader;
    let (mut label_ms, mut slice_ms) = (Vec::new(), Vec::new());
    for trial in 1..=3 {
        // The member that stepped down last sits out one ttl (15 s).
        std::thread::sleep(Duration::from_secs(16));
        three_live(cluster);
        let since = wall_ns();
        cluster.kubectl(&[
            "annotate",
            "--overwrite",
            "lg",
            "web",
            &format!("leasehold.dev/step-down=endpoint-{trial}"),
        ]);
        let (label_pod, label_took) = by_label.moved(&leader, since, MOVE_BOUND);
        let (slice_pod, slice_took) = by_slice.moved(&leader, since, MOVE_BOUND);
        assert_eq!(
            label_pod, slice_pod,
            "the two Services reached different pods"
        );
        println!(
            "leader endpoint, step-down {trial} of {leader}: a client reached {slice_pod} \
             through web-leader {label_took:?} and through web-leader-now {slice_took:?} after the step-down"
        );
        label_ms.push(label_took.as_secs_f64() * 1000.0);
        slice_ms.push(slice_took.as_secs_f64() * 1000.0);
        leader = slice_pod;
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!(
        "leader endpoint: a client reaches the new leader, median of 3 step-downs: \
         label mode {:.0} ms, EndpointSlice mode {:.0} ms",
        median(&mut label_ms),
        median(&mut slice_ms)
    );
    let (ok, _, message) = {
        let g = cluster.json(&["get", "lg", "web"]);
        let c = g["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "LeaderEndpoint")
            .unwrap()
            .clone();
        (
            c["status"].as_str().unwrap_or("").to_owned(),
            (),
            c["message"].as_str().unwrap_or("").to_owned(),
        )
    };
    assert_eq!(ok, "True", "{message}");
}

#[test]
fn the_readme_user_guide_works_on_a_one_node_cluster() {
    let Some(cluster) = Cluster::up("the_readme_user_guide_works_on_a_one_node_cluster") else {
        return;
    };
    let minute = Duration::from_secs(60);

    // 1. Install the operator.
    cluster.readme(
        "helm install leasehold charts/leasehold \
           --namespace leasehold-system --create-namespace \
           --set redis.deploy=true",
    );
    assert_in_readme("kubectl -n leasehold-system get pods");
    let active = eventually(
        2 * minute,
        "two controller replicas ready and one of them active",
        || {
            let pods = cluster.kubectl(&["-n", "leasehold-system", "get", "pods", "--no-headers"]);
            let ready = pods
                .lines()
                .filter(|l| l.contains(" 1/1 ") && l.contains("Running"))
                .count();
            (ready == 3).then(|| active_controller(&cluster)).flatten()
        },
    );
    println!("1. installed; active controller replica: {active}");

    // 2. Declare a group and add the agent to its pods.
    let statefulset = statefulset_for_1_20(&cluster.dir);
    assert_in_readme(
        "kubectl apply -f examples/leadergroup.yaml -f examples/statefulset.yaml -f examples/leader-service.yaml",
    );
    cluster.sh(&format!(
        "kubectl apply -f examples/leadergroup.yaml -f {} -f examples/leader-service.yaml",
        statefulset.display()
    ));
    assert_in_readme("kubectl get lg web");
    let leader = eventually(
        3 * minute,
        "`kubectl get lg web`: a LEADER, LIVE 3 and READY True",
        || {
            let out = cluster.try_kubectl(&["get", "lg", "web", "--no-headers"])?;
            let columns: Vec<&str> = out.split_whitespace().collect();
            // NAME LEADER TERM LIVE READY AGE
            (columns.len() == 6 && columns[3] == "3" && columns[4] == "True")
                .then(|| columns[1].to_owned())
        },
    );
    assert_in_readme("kubectl get pods -L leasehold.dev/role");
    eventually(
        Duration::from_secs(10),
        "the leader labelled leader, the others follower",
        || {
            let roles = cluster.roles("default", "app=web");
            let leaders: Vec<_> = roles
                .iter()
                .filter(|(_, r)| r == "leader")
                .map(|(n, _)| n.clone())
                .collect();
            let followers = roles.iter().filter(|(_, r)| r == "follower").count();
            (leaders == [leader.clone()] && followers == 2).then_some(())
        },
    );
    let watch = EndpointWatch::start(&cluster, "web-leader");
    let served = cluster.readme(
        "kubectl run probe --rm -i --image=busybox:1.36 --restart=Never -- wget -qO- web-leader",
    );
    assert!(
        served.contains(&format!("served by {leader}")),
        "the probe got {served:?}, not the leader {leader}"
    );
    println!(
        "2. {leader} leads, and web-leader reaches it: {:?}",
        served.lines().next()
    );

    // 4. What happens when... the leader pod is deleted (SIGTERM).
    let since = Instant::now();
    cluster.kubectl(&["delete", "pod", &leader, "--wait=false"]);
    let (next, took) = watch.wait_for_other(&leader, since, MOVE_BOUND);
    println!("4. `kubectl delete pod {leader}`: web-leader reaches {next} {took:?} later");
    let served = cluster.readme(
        "kubectl run probe --rm -i --image=busybox:1.36 --restart=Never -- wget -qO- web-leader",
    );
    assert!(
        served.contains(&format!("served by {next}")),
        "after the delete the probe got {served:?}, not {next}"
    );

    // ... a step-down, once web-1 is back (with two members sitting out or
    // gone the lease would wait out the ttl).
    three_live(&cluster);
    let since = Instant::now();
    cluster.readme("kubectl annotate --overwrite lg web leasehold.dev/step-down=$(date +%s)");
    let (after_step_down, took) = watch.wait_for_other(&next, since, MOVE_BOUND);
    println!("4. step-down of {next}: web-leader reaches {after_step_down} {took:?} later");

    // ... the active controller replica is deleted: the other takes over and
    // moves the label at the next change.
    cluster.kubectl(&[
        "-n",
        "leasehold-system",
        "delete",
        "pod",
        &active,
        "--wait=false",
    ]);
    let took_over = eventually(minute, "another controller replica active", || {
        active_controller(&cluster).filter(|a| *a != active)
    });
    println!("4. controller replica {active} deleted; {took_over} is active");
    // Again, a second time: `--overwrite` makes the README's command
    // repeatable. The member that stepped down before sits out one ttl (15 s):
    // wait it out, so the step-down has two members to go to.
    std::thread::sleep(Duration::from_secs(15));
    three_live(&cluster);
    let since = Instant::now();
    cluster.readme("kubectl annotate --overwrite lg web leasehold.dev/step-down=$(date +%s)");
    let (last, took) = watch.wait_for_other(&after_step_down, since, MOVE_BOUND);
    println!("4. step-down of {after_step_down} under {took_over}: web-leader reaches {last} {took:?} later");

    // 5. Choose who leads: a named successor, then a rollout with
    // placement off and one with it on (the default). The figure goes into
    // the README.
    three_live(&cluster);
    cluster.readme("kubectl annotate --overwrite lg web leasehold.dev/step-down-to=web-2");
    let (named, _) = eventually(minute, "web-2 leads, or the request refused", || {
        let g = cluster.json(&["get", "lg", "web"]);
        let handover = g["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "Handover")?
            .clone();
        let leader = g["status"]["leader"].as_str()?.to_owned();
        (leader == "web-2" || handover["status"] == "False").then_some((leader, handover))
    });
    println!("5. step-down-to=web-2: web-2 leads ({named})");
    assert_eq!(named, "web-2");
    cluster.readme("kubectl annotate lg web leasehold.dev/step-down-to-");
    let off = rollout(&cluster, &watch, false);
    println!("5. rollout with preferUpdated off: {off:?}");
    let on = rollout(&cluster, &watch, true);
    println!(
        "5. rollout with preferUpdated on: {on:?}; {} leads after it",
        on.leader
    );
    assert!(
        on.on_new_revision && on.changes == 1 && on.endpoint_changes == 1,
        "with preferUpdated a rollout moves the leader once, onto the new revision: {on:?}"
    );
    watch.assert_never_two();
    println!(
        "   web-leader's endpoints, every state the watch saw: {:?}",
        watch.states()
    );

    // The singleton job: never two runs at once, through a pod deletion and
    // a step-down.
    cluster.sh("kubectl apply -f examples/singleton-exec.yaml");
    let redis_ip = cluster
        .kubectl(&[
            "-n",
            "leasehold-system",
            "get",
            "service",
            "leasehold-redis",
            "-o",
            "jsonpath={.spec.clusterIP}",
        ])
        .trim()
        .to_owned();
    // Each run is watched for at least a second (5 records) before the next
    // change, so a run that went on after its successor started would show
    // as records interleaved with the successor's.
    let running = |not: &[&str]| {
        let blocks = blocks(&report_runs(&cluster, &redis_ip));
        let (pod, term, records) = blocks.last()?.clone();
        (records >= 5 && !not.contains(&pod.as_str())).then_some((pod, term))
    };
    let (first, _) = eventually(
        3 * minute,
        "the nightly report running on its leader",
        || {
            let leader = cluster.leader_of("nightly-report")?;
            running(&[]).filter(|(pod, _)| *pod == leader)
        },
    );
    cluster.kubectl(&["delete", "pod", &first, "--wait=false"]);
    let (second, _) = eventually(minute, "the report running on another pod", || {
        running(&[&first])
    });
    cluster.kubectl(&[
        "annotate",
        "--overwrite",
        "lg",
        "nightly-report",
        "leasehold.dev/step-down=1",
    ]);
    eventually(
        minute,
        "the report running on a third pod after the step-down",
        || running(&[&first, &second]),
    );
    let runs = report_runs(&cluster, &redis_ip);
    let blocks = blocks(&runs);
    println!(
        "singleton-exec: {} records, runs in order: {blocks:?}",
        runs.len()
    );
    let distinct: BTreeSet<(&String, u64)> =
        blocks.iter().map(|(pod, term, _)| (pod, *term)).collect();
    assert_eq!(
        distinct.len(),
        blocks.len(),
        "one leadership's runs were interleaved with another's (the job ran twice at once): {blocks:?}"
    );
    assert!(
        blocks.len() >= 3 && blocks.windows(2).all(|w| w[0].1 < w[1].1),
        "terms do not rise from run to run: {blocks:?}"
    );

    leader_endpoint_against_the_label(&cluster);

    // Uninstall: the LeaderGroups first, while the controller runs, so it
    // takes the role labels off.
    cluster.kubectl(&["delete", "lg", "nightly-report"]);
    eventually(
        Duration::from_secs(20),
        "no role label on the nightly-report pods",
        || {
            let roles = cluster.roles("default", "app=nightly-report");
            (!roles.is_empty() && roles.iter().all(|(_, r)| r.is_empty())).then_some(())
        },
    );
    cluster.sh("kubectl delete -f examples/singleton-exec.yaml --ignore-not-found");
    assert_in_readme(
        "kubectl delete -f examples/leadergroup.yaml -f examples/statefulset.yaml -f examples/leader-service.yaml",
    );
    cluster.sh(&format!(
        "kubectl delete -f examples/leadergroup.yaml -f {} -f examples/leader-service.yaml",
        statefulset.display()
    ));
    cluster.readme("helm uninstall leasehold -n leasehold-system");
    eventually(2 * minute, "nothing of the release left running", || {
        let pods = cluster.kubectl(&["-n", "leasehold-system", "get", "pods", "--no-headers"]);
        let others = cluster.kubectl(&["get", "pods", "--no-headers"]);
        (pods.trim().is_empty() && others.trim().is_empty()).then_some(())
    });
    assert!(
        cluster
            .try_kubectl(&["get", "crd", "leadergroups.leasehold.dev"])
            .is_some(),
        "helm uninstall deleted the CRD (Helm keeps CRDs; the README says to delete it by hand)"
    );
    cluster.readme("kubectl delete crd leadergroups.leasehold.dev");
    println!("uninstalled: no pods left, the CRD deleted by hand");
}
