//! The Helm chart: `helm lint` and `helm template` with the default values
//! and with each option set, and the rendered YAML checked for the RBAC and
//! security settings the chart promises.
//!
//! `helm` comes from `LEASEHOLD_HELM` or `PATH` (scripts/setup.sh fetches a
//! pinned one). A missing helm fails these tests, unless helm is left out on
//! purpose (`LEASEHOLD_SKIP_HELM`: then they say they were skipped). The
//! checks that need no helm always run.

use leasehold_testkit as testkit;

use std::path::Path;
use std::process::Command;

use serde::Deserialize;
use serde_yaml::Value;
use testkit::helm_or_skip;

const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/charts/leasehold");

/// `helm template` with `--set` values; Ok(rendered) or Err(stderr).
fn template(helm: &Path, sets: &[&str]) -> Result<String, String> {
    template_for(helm, None, sets)
}

/// `helm template` as for a cluster of `kube_version`.
fn template_for(helm: &Path, kube_version: Option<&str>, sets: &[&str]) -> Result<String, String> {
    template_on(helm, kube_version, &[], sets)
}

/// `helm template` as for a cluster of `kube_version` whose API server also
/// serves `api_versions` (`--api-versions`, e.g. `group/version/Kind`).
fn template_on(
    helm: &Path,
    kube_version: Option<&str>,
    api_versions: &[&str],
    sets: &[&str],
) -> Result<String, String> {
    let mut cmd = Command::new(helm);
    cmd.args(["template", "rel", CHART, "--namespace", "ops"]);
    if let Some(v) = kube_version {
        cmd.args(["--kube-version", v]);
    }
    for a in api_versions {
        cmd.args(["--api-versions", a]);
    }
    for s in sets {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().expect("run helm");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

fn docs(yaml: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|d| Value::deserialize(d).expect("helm rendered valid YAML"))
        .filter(|v| !v.is_null())
        .collect()
}

fn kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn one<'a>(docs: &'a [Value], k: &str) -> &'a Value {
    let found = kind(docs, k);
    assert_eq!(found.len(), 1, "expected one {k}, found {}", found.len());
    found[0]
}

fn controller(docs: &[Value]) -> &Value {
    kind(docs, "Deployment")
        .into_iter()
        .find(|d| d["metadata"]["labels"]["app.kubernetes.io/component"] == "controller")
        .expect("the controller Deployment")
}

fn strings(v: &Value) -> Vec<String> {
    v.as_sequence()
        .map(|s| {
            s.iter()
                .filter_map(|x| x.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn env<'a>(container: &'a Value, name: &str) -> Option<&'a Value> {
    container["env"]
        .as_sequence()?
        .iter()
        .find(|e| e["name"] == name)
}

/// The rules the controller needs, and nothing more: `(group, resource, verbs)`.
fn expected_rules() -> Vec<(String, String, Vec<String>)> {
    let r = |g: &str, res: &str, verbs: &[&str]| {
        (
            g.to_owned(),
            res.to_owned(),
            verbs.iter().map(|v| v.to_string()).collect(),
        )
    };
    vec![
        r("leasehold.dev", "leadergroups", &["get", "list", "watch"]),
        r("leasehold.dev", "leadergroups/status", &["get", "patch"]),
        r("", "pods", &["get", "list", "watch", "patch"]),
        r("events.k8s.io", "events", &["create", "patch"]),
    ]
}

fn rules(role: &Value) -> Vec<(String, String, Vec<String>)> {
    let mut out = Vec::new();
    for rule in role["rules"].as_sequence().expect("rules") {
        for g in strings(&rule["apiGroups"]) {
            for res in strings(&rule["resources"]) {
                out.push((g.clone(), res, strings(&rule["verbs"])));
            }
        }
    }
    out
}

#[test]
fn lint_passes_with_the_defaults_and_with_each_option_set() {
    let Some(helm) = helm_or_skip("lint") else {
        return;
    };
    let variants: &[&[&str]] = &[
        &[],
        &["redis.deploy=true"],
        &["watchNamespace=team-a"],
        &["clusterName=east"],
        &["metrics.serviceMonitor.enabled=true"],
        &["podDisruptionBudget.enabled=false"],
        &["store.existingSecret=redis-auth", "store.caSecret=redis-ca"],
        &[
            r"store.url=redis+sentinel://s1:26379\,s2:26379/mymaster",
            "store.sentinelSecret=sentinel-pw",
        ],
        &[r"store.url=rediss+cluster://n1:6379\,n2:6379"],
        &["replicaCount=1", "podAntiAffinity=hard"],
        &["rbac.create=false", "serviceAccount.create=false"],
        &["admissionPolicy.enabled=false"],
        &["leaderEndpoints.enabled=true"],
        &["admissionPolicy.allowedLabelKeys={leasehold.dev/role,example.com/leader}"],
    ];
    for sets in variants {
        let mut cmd = Command::new(&helm);
        cmd.args(["lint", CHART, "--strict"]);
        for s in *sets {
            cmd.args(["--set", s]);
        }
        let out = cmd.output().expect("run helm lint");
        assert!(
            out.status.success(),
            "helm lint {sets:?} failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let rendered = template(&helm, sets).unwrap_or_else(|e| panic!("{sets:?}: {e}"));
        eprintln!("helm template {sets:?}: {} bytes", rendered.len());
    }
}

#[test]
fn the_default_install_is_least_privilege_and_locked_down() {
    let Some(helm) = helm_or_skip("defaults") else {
        return;
    };
    let docs = docs(&template(&helm, &[]).unwrap());

    // RBAC: cluster-wide by default, exactly the needed rules.
    let role = one(&docs, "ClusterRole");
    assert_eq!(rules(role), expected_rules());
    let binding = one(&docs, "ClusterRoleBinding");
    assert_eq!(binding["subjects"][0]["kind"], "ServiceAccount");
    assert_eq!(binding["subjects"][0]["namespace"], "ops");
    assert!(kind(&docs, "Role").is_empty());
    let sa = one(&docs, "ServiceAccount");
    assert_eq!(binding["subjects"][0]["name"], sa["metadata"]["name"]);

    // The controller: 2 replicas spread over nodes, probes, locked down.
    let deploy = controller(&docs);
    let spec = &deploy["spec"]["template"]["spec"];
    assert_eq!(deploy["spec"]["replicas"], 2);
    assert!(
        !spec["affinity"]["podAntiAffinity"].is_null(),
        "anti-affinity"
    );
    assert_eq!(spec["serviceAccountName"], sa["metadata"]["name"]);
    assert_eq!(spec["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        spec["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let c = &spec["containers"][0];
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    assert_eq!(
        strings(&c["securityContext"]["capabilities"]["drop"]),
        ["ALL"]
    );
    assert_eq!(strings(&c["args"])[0], "controller");
    assert!(env(c, "POD_NAME").is_some() && env(c, "POD_NAMESPACE").is_some());
    assert_eq!(
        env(c, "LEASEHOLD_REDIS_URL").unwrap()["value"],
        "redis://redis:6379"
    );
    assert!(env(c, "LEASEHOLD_REDIS_PASSWORD_FILE").is_none());

    // Metrics Service and PDB by default; no ServiceMonitor, no Redis.
    let svc = one(&docs, "Service");
    assert_eq!(svc["spec"]["ports"][0]["name"], "http-metrics");
    assert_eq!(one(&docs, "PodDisruptionBudget")["spec"]["minAvailable"], 1);
    assert!(kind(&docs, "ServiceMonitor").is_empty());
    assert_eq!(kind(&docs, "Deployment").len(), 1);
    // Nothing asks for secrets or for every verb.
    for r in kind(&docs, "ClusterRole") {
        for (_, res, verbs) in rules(r) {
            assert_ne!(res, "secrets");
            assert!(!verbs.contains(&"*".to_owned()));
        }
    }
}

#[test]
fn namespaced_mode_uses_a_role_in_that_namespace_only() {
    let Some(helm) = helm_or_skip("namespaced") else {
        return;
    };
    let docs = docs(&template(&helm, &["watchNamespace=team-a"]).unwrap());
    assert!(kind(&docs, "ClusterRole").is_empty());
    assert!(kind(&docs, "ClusterRoleBinding").is_empty());
    let role = one(&docs, "Role");
    assert_eq!(role["metadata"]["namespace"], "team-a");
    assert_eq!(rules(role), expected_rules());
    let binding = one(&docs, "RoleBinding");
    assert_eq!(binding["metadata"]["namespace"], "team-a");
    assert_eq!(binding["subjects"][0]["namespace"], "ops");
    let args = strings(&controller(&docs)["spec"]["template"]["spec"]["containers"][0]["args"]);
    assert!(
        args.contains(&"--watch-namespace=team-a".to_owned()),
        "{args:?}"
    );
}

#[test]
fn each_option_renders_what_it_says() {
    let Some(helm) = helm_or_skip("options") else {
        return;
    };
    // A throwaway Redis, clearly marked, and the controller pointed at it.
    let docs_ = docs(&template(&helm, &["redis.deploy=true"]).unwrap());
    let redis = kind(&docs_, "Deployment")
        .into_iter()
        .find(|d| d["metadata"]["labels"]["app.kubernetes.io/component"] == "redis")
        .expect("a Redis Deployment");
    assert!(redis["metadata"]["annotations"]["leasehold.dev/not-for-production"].is_string());
    let rc = &redis["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(rc["securityContext"]["readOnlyRootFilesystem"], true);
    let c = &controller(&docs_)["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        env(c, "LEASEHOLD_REDIS_URL").unwrap()["value"],
        "redis://rel-leasehold-redis.ops.svc:6379"
    );

    // The password from a Secret, as a file, never as an env value.
    let docs_ = docs(&template(&helm, &["store.existingSecret=redis-auth"]).unwrap());
    let spec = &controller(&docs_)["spec"]["template"]["spec"];
    let c = &spec["containers"][0];
    let file = env(c, "LEASEHOLD_REDIS_PASSWORD_FILE").unwrap()["value"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(file.starts_with(c["volumeMounts"][0]["mountPath"].as_str().unwrap()));
    assert_eq!(spec["volumes"][0]["secret"]["secretName"], "redis-auth");
    assert!(kind(&docs_, "Secret").is_empty());

    // A cluster's name reaches the controller; without one, no flag.
    let args = |docs_: &[Value]| {
        controller(docs_)["spec"]["template"]["spec"]["containers"][0]["args"].clone()
    };
    let named = docs(&template(&helm, &["clusterName=east"]).unwrap());
    assert!(args(&named)
        .as_sequence()
        .unwrap()
        .contains(&Value::from("--cluster=east")));
    let plain = serde_yaml::to_string(&args(&docs_)).unwrap();
    assert!(!plain.contains("--cluster"), "{plain}");

    // Lease writes wait for every replica by default, or the count given.
    let c = &controller(&docs_)["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        env(c, "LEASEHOLD_REDIS_REPLICA_ACKS").unwrap()["value"],
        "all"
    );
    let docs_ = docs(&template(&helm, &["store.replicaAcks=2"]).unwrap());
    let c = &controller(&docs_)["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        env(c, "LEASEHOLD_REDIS_REPLICA_ACKS").unwrap()["value"],
        "2"
    );

    // ServiceMonitor on demand; no PDB for one replica or when disabled.
    let docs_ = docs(&template(&helm, &["metrics.serviceMonitor.enabled=true"]).unwrap());
    let sm = one(&docs_, "ServiceMonitor");
    assert_eq!(sm["spec"]["endpoints"][0]["port"], "http-metrics");
    // A group's `namespace` label is kept (not renamed exported_namespace).
    assert_eq!(sm["spec"]["endpoints"][0]["honorLabels"], true);
    assert!(kind(&docs_, "PrometheusRule").is_empty());
    assert!(kind(&docs_, "PodMonitor").is_empty());

    // The alerting rules and the agents' PodMonitor on demand, each alone.
    let docs_ = docs(&template(&helm, &["metrics.prometheusRule.enabled=true"]).unwrap());
    let rule = one(&docs_, "PrometheusRule");
    let rendered: Vec<&str> = rule["spec"]["groups"][0]["rules"]
        .as_sequence()
        .expect("rules")
        .iter()
        .filter_map(|r| r["alert"].as_str())
        .collect();
    let file: Value = serde_yaml::from_str(
        &std::fs::read_to_string(Path::new(CHART).join("files/alerts.yaml")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        rule["spec"]["groups"], file["groups"],
        "the rules as the file holds them"
    );
    assert!(rendered.contains(&"LeaseholdTwoLeaders"), "{rendered:?}");
    assert!(kind(&docs_, "PodMonitor").is_empty());
    let docs_ = docs(&template(&helm, &["metrics.podMonitor.enabled=true"]).unwrap());
    let pm = one(&docs_, "PodMonitor");
    assert_eq!(pm["spec"]["podMetricsEndpoints"][0]["port"], "probes");
    assert_eq!(
        pm["spec"]["selector"]["matchLabels"]["leasehold.dev/agent"],
        "true"
    );
    assert_eq!(pm["spec"]["namespaceSelector"]["any"], true);
    assert!(kind(&docs_, "PrometheusRule").is_empty());
    assert!(kind(&docs_, "ConfigMap").is_empty());

    // The Grafana dashboard on demand: the file as it is, with the
    // sidecar's label.
    let docs_ = docs(&template(&helm, &["metrics.dashboard.enabled=true"]).unwrap());
    let cm = one(&docs_, "ConfigMap");
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(cm["metadata"]["namespace"], "ops");
    let file = std::fs::read_to_string(Path::new(CHART).join("files/dashboard.json")).unwrap();
    let rendered: serde_json::Value =
        serde_json::from_str(cm["data"]["leasehold.json"].as_str().unwrap()).unwrap();
    assert_eq!(
        rendered,
        serde_json::from_str::<serde_json::Value>(&file).unwrap()
    );
    let docs_ = docs(
        &template(
            &helm,
            &[
                "metrics.dashboard.enabled=true",
                "metrics.dashboard.namespace=grafana",
            ],
        )
        .unwrap(),
    );
    assert_eq!(one(&docs_, "ConfigMap")["metadata"]["namespace"], "grafana");
    let docs_ = docs(&template(&helm, &["replicaCount=1"]).unwrap());
    assert!(kind(&docs_, "PodDisruptionBudget").is_empty());
    let docs_ = docs(&template(&helm, &["podDisruptionBudget.enabled=false"]).unwrap());
    assert!(kind(&docs_, "PodDisruptionBudget").is_empty());

    // Hard anti-affinity is required, not preferred.
    let docs_ = docs(&template(&helm, &["podAntiAffinity=hard"]).unwrap());
    let aa = &controller(&docs_)["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"];
    assert!(aa["requiredDuringSchedulingIgnoredDuringExecution"].is_sequence());

    // Without RBAC and ServiceAccount, none rendered; the pods use the named one.
    let docs_ = docs(
        &template(
            &helm,
            &[
                "rbac.create=false",
                "serviceAccount.create=false",
                "serviceAccount.name=mine",
            ],
        )
        .unwrap(),
    );
    assert!(kind(&docs_, "ClusterRole").is_empty() && kind(&docs_, "ServiceAccount").is_empty());
    assert_eq!(
        controller(&docs_)["spec"]["template"]["spec"]["serviceAccountName"],
        "mine"
    );
}

#[test]
fn leader_endpoints_add_their_rbac_and_flag_only_when_enabled() {
    let Some(helm) = helm_or_skip("leader-endpoints") else {
        return;
    };
    let args = |docs_: &[Value]| {
        strings(&controller(docs_)["spec"]["template"]["spec"]["containers"][0]["args"])
    };
    let off = docs(&template(&helm, &[]).unwrap());
    assert_eq!(rules(one(&off, "ClusterRole")), expected_rules());
    assert!(!args(&off).contains(&"--leader-endpoints".to_owned()));

    let on = docs(&template(&helm, &["leaderEndpoints.enabled=true"]).unwrap());
    let mut wanted = expected_rules();
    for (g, res, verbs) in [
        ("", "services", &["get", "create", "patch", "delete"]),
        (
            "discovery.k8s.io",
            "endpointslices",
            &["get", "create", "update", "delete"],
        ),
    ] {
        wanted.push((
            g.into(),
            res.into(),
            verbs.iter().map(|v| v.to_string()).collect(),
        ));
    }
    assert_eq!(rules(one(&on, "ClusterRole")), wanted);
    assert!(args(&on).contains(&"--leader-endpoints".to_owned()));
    // Namespaced mode: the same rules, in the Role.
    let ns = docs(
        &template(
            &helm,
            &["leaderEndpoints.enabled=true", "watchNamespace=team-a"],
        )
        .unwrap(),
    );
    assert_eq!(rules(one(&ns, "Role")), wanted);
}

/// The chart's NOTES.txt as `helm install` prints it: helm template does
/// not render NOTES, so a copy of the chart renders it inside a ConfigMap.
fn notes(helm: &Path, sets: &[&str]) -> String {
    let dir = std::env::temp_dir().join(format!("leasehold-notes-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let copied = Command::new("cp")
        .args(["-r", CHART])
        .arg(&dir)
        .status()
        .expect("cp");
    assert!(copied.success());
    std::fs::rename(dir.join("templates/NOTES.txt"), dir.join("notes.tpl")).unwrap();
    std::fs::write(
        dir.join("templates/notes.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\ndata:\n  notes: |\n{{ tpl (.Files.Get \"notes.tpl\") . | indent 4 }}\n",
    )
    .unwrap();
    let mut cmd = Command::new(helm);
    cmd.args(["template", "rel"]).arg(&dir);
    cmd.args(["--namespace", "ops", "--show-only", "templates/notes.yaml"]);
    for s in sets {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().expect("helm template");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_yaml::from_slice(&out.stdout).unwrap();
    doc["data"]["notes"].as_str().unwrap().to_owned()
}

#[test]
fn the_notes_print_the_commands_to_check_a_group() {
    let Some(helm) = helm_or_skip("notes") else {
        return;
    };
    let text = notes(&helm, &[]);
    for command in [
        "kubectl -n NS get lg NAME -o wide",
        "kubectl -n NS wait lg/NAME --for=condition=Ready",
        "kubectl -n NS describe lg NAME",
        "kubectl -n NS get pods -L leasehold.dev/role",
        "kubectl -n ops logs deploy/rel-leasehold",
    ] {
        assert!(text.contains(command), "{command:?} missing from:\n{text}");
    }
    assert!(!text.contains("endpointslices"), "{text}");
    let with_endpoints = notes(&helm, &["leaderEndpoints.enabled=true"]);
    assert!(
        with_endpoints.contains("get endpointslices -l leasehold.dev/group=NAME")
            && with_endpoints.contains("spec.service"),
        "{with_endpoints}"
    );
}

#[test]
fn bad_values_are_refused_with_the_key_named() {
    let Some(helm) = helm_or_skip("bad values") else {
        return;
    };
    let cases: &[(&[&str], &str)] = &[
        (&["replicaCount=0"], "replicaCount"),
        (&["redis.urll=redis://x"], "urll"),
        (&["store.url=http://x"], "store.url"),
        (&["store.url=redis+foo://x"], "store.url"),
        (&["redis.url=http://x"], "redis.url"),
        (
            &["store.sentinelSecret=sentinel-pw"],
            "store.sentinelSecret",
        ),
        (&["podAntiAffinity=sometimes"], "podAntiAffinity"),
        (&["watchNamespace=Team_A"], "watchNamespace"),
        (&["clusterName=east/1"], "clusterName"),
        (&["store.replicaAcks=many"], "store.replicaAcks"),
        (&["store.replicaAcks=0"], "store.replicaAcks"),
        (&["redis.replicaAcks=0"], "redis.replicaAcks"),
        (
            &["admissionPolicy.enabled=maybe"],
            "admissionPolicy.enabled",
        ),
        (
            &["admissionPolicy.allowedLabelKeys={Not A Key}"],
            "admissionPolicy.allowedLabelKeys",
        ),
        (
            &["admissionPolicy.allowedLabelKeys=leasehold.dev/role"],
            "admissionPolicy.allowedLabelKeys",
        ),
        (
            &["admissionPolicy.allowedLabelKeys=null"],
            "allowedLabelKeys is required",
        ),
        (
            &[
                "metrics.service.enabled=false",
                "metrics.serviceMonitor.enabled=true",
            ],
            "metrics.service.enabled",
        ),
    ];
    for (sets, expected) in cases {
        let err = template(&helm, sets).expect_err(&format!("{sets:?} was accepted"));
        assert!(
            err.contains(expected),
            "{sets:?}: {expected:?} not in {err}"
        );
    }
    // Every URL form the binary takes is let through (a comma in --set
    // separates values, hence the backslash).
    for url in [
        "rediss://h:6380/2",
        r"redis+sentinel://s1:26379\,s2:26379/mymaster",
        "rediss+sentinel://s1/mymaster/1",
        r"redis+cluster://n1:6379\,n2:6379",
        "rediss+cluster://n1",
    ] {
        let set = format!("store.url={url}");
        template(&helm, &[set.as_str()]).unwrap_or_else(|e| panic!("{url}: {e}"));
    }
}

#[test]
fn the_sentinels_password_is_a_file_from_its_own_secret() {
    let Some(helm) = helm_or_skip("sentinel password") else {
        return;
    };
    let sentinel = [
        r"store.url=redis+sentinel://s1:26379\,s2:26379/mymaster",
        "store.sentinelSecret=sentinel-pw",
    ];
    let docs_ = docs(&template(&helm, &sentinel).unwrap());
    let spec = &controller(&docs_)["spec"]["template"]["spec"];
    let c = &spec["containers"][0];
    assert_eq!(
        env(c, "LEASEHOLD_REDIS_URL").unwrap()["value"],
        "redis+sentinel://s1:26379,s2:26379/mymaster"
    );
    assert_eq!(
        env(c, "LEASEHOLD_REDIS_SENTINEL_PASSWORD_FILE").unwrap()["value"],
        "/etc/leasehold/redis-sentinel-password/password"
    );
    assert!(env(c, "LEASEHOLD_REDIS_PASSWORD_FILE").is_none());
    let mount = c["volumeMounts"]
        .as_sequence()
        .expect("volumeMounts")
        .iter()
        .find(|m| m["mountPath"] == "/etc/leasehold/redis-sentinel-password")
        .expect("the sentinels' password mounted");
    assert_eq!(mount["readOnly"], true);
    let volume = spec["volumes"]
        .as_sequence()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == mount["name"])
        .expect("the mount's volume");
    assert_eq!(volume["secret"]["secretName"], "sentinel-pw");
    assert_eq!(volume["secret"]["items"][0]["key"], "password");
    assert_eq!(volume["secret"]["items"][0]["path"], "password");
    assert!(kind(&docs_, "Secret").is_empty());

    // With the primary's password too: two files from two Secrets.
    let sets = [&sentinel[..], &["store.existingSecret=redis-auth"][..]].concat();
    let docs_ = docs(&template(&helm, &sets).unwrap());
    let spec = &controller(&docs_)["spec"]["template"]["spec"];
    let c = &spec["containers"][0];
    assert!(env(c, "LEASEHOLD_REDIS_PASSWORD_FILE").is_some());
    assert!(env(c, "LEASEHOLD_REDIS_SENTINEL_PASSWORD_FILE").is_some());
    assert_eq!(c["volumeMounts"].as_sequence().unwrap().len(), 2);
    let secrets: Vec<&str> = spec["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|v| v["secret"]["secretName"].as_str().unwrap())
        .collect();
    assert_eq!(secrets, ["redis-auth", "sentinel-pw"]);
}

#[test]
fn the_chart_carries_the_generated_crd() {
    let chart = std::fs::read_to_string(format!("{CHART}/crds/leadergroups.yaml")).unwrap();
    let generated = leasehold_kube::crd::crd_yaml().unwrap();
    assert!(
        chart == generated,
        "charts/leasehold/crds/leadergroups.yaml is stale: run `cargo run -- crdgen > charts/leasehold/crds/leadergroups.yaml`"
    );
}

/// Objects handed to Kubernetes as they are: their inner keys are
/// Kubernetes' own fields, commented as a whole.
const VERBATIM: [&str; 3] = ["podSecurityContext", "securityContext", "resources"];

#[test]
fn every_value_is_commented() {
    let values = std::fs::read_to_string(format!("{CHART}/values.yaml")).unwrap();
    let mut previous = "";
    // (indent, key) of the keys enclosing the current line.
    let mut ancestors: Vec<(usize, String)> = Vec::new();
    let mut uncommented = Vec::new();
    for line in values.lines() {
        let t = line.trim_start();
        if t.is_empty() {
            continue;
        }
        let indent = line.len() - t.len();
        let key = (!t.starts_with('#') && !t.starts_with('-'))
            .then(|| t.split_once(':').map(|(k, _)| k))
            .flatten()
            .filter(|k| k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
        if let Some(key) = key {
            ancestors.retain(|(i, _)| *i < indent);
            let verbatim = ancestors
                .iter()
                .any(|(_, a)| VERBATIM.contains(&a.as_str()));
            if !verbatim && !previous.trim_start().starts_with('#') {
                uncommented.push(line);
            }
            ancestors.push((indent, key.to_owned()));
        }
        previous = line;
    }
    assert!(
        uncommented.is_empty(),
        "values.yaml keys without a comment above them: {uncommented:#?}"
    );
}

/// Every Kubernetes version the chart's kubeVersion admits gets objects it
/// serves: 1.20 has no policy/v1, so the PodDisruptionBudget is v1beta1
/// there and v1 from 1.21 on.
#[test]
fn the_chart_renders_for_every_kubernetes_version_it_admits() {
    let Some(helm) = helm_or_skip("the_chart_renders_for_every_kubernetes_version_it_admits")
    else {
        return;
    };
    for (version, pdb) in [
        ("1.20.0", "policy/v1beta1"),
        ("1.21.0", "policy/v1"),
        ("1.33.0", "policy/v1"),
    ] {
        let docs = docs(&template_for(&helm, Some(version), &[]).unwrap());
        assert_eq!(
            one(&docs, "PodDisruptionBudget")["apiVersion"],
            pdb,
            "Kubernetes {version}"
        );
    }
    let refused = template_for(&helm, Some("1.19.0"), &[]).unwrap_err();
    assert!(refused.contains("kubeVersion"), "{refused}");
}

/// What `--api-versions` names for a cluster serving the GA admission policy
/// API (Kubernetes 1.30 on), and the beta one (1.28-1.29, when turned on).
const VAP_V1: &str = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy";
const VAP_V1BETA1: &str = "admissionregistration.k8s.io/v1beta1/ValidatingAdmissionPolicy";

fn admission_policy(docs: &[Value]) -> (&Value, &Value) {
    (
        one(docs, "ValidatingAdmissionPolicy"),
        one(docs, "ValidatingAdmissionPolicyBinding"),
    )
}

/// The CEL expression of the policy's variable `name`.
fn variable<'a>(policy: &'a Value, name: &str) -> &'a str {
    policy["spec"]["variables"]
        .as_sequence()
        .expect("variables")
        .iter()
        .find(|v| v["name"] == name)
        .unwrap_or_else(|| panic!("no variable {name}"))["expression"]
        .as_str()
        .unwrap()
}

#[test]
fn the_admission_policy_holds_the_controller_to_the_role_label() {
    let Some(helm) = helm_or_skip("admission policy") else {
        return;
    };
    let docs_ = docs(&template_on(&helm, None, &[VAP_V1], &[]).unwrap());
    let (policy, binding) = admission_policy(&docs_);
    let sa = one(&docs_, "ServiceAccount");
    for o in [policy, binding] {
        assert_eq!(o["apiVersion"], "admissionregistration.k8s.io/v1");
        assert!(o["metadata"]["namespace"].is_null(), "cluster-scoped");
    }
    let spec = &policy["spec"];
    assert_eq!(spec["failurePolicy"], "Fail");
    // Pod updates (a patch is an UPDATE) by the controller's ServiceAccount only.
    let rules = spec["matchConstraints"]["resourceRules"]
        .as_sequence()
        .unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(strings(&rules[0]["apiGroups"]), [""]);
    assert_eq!(strings(&rules[0]["resources"]), ["pods"]);
    assert_eq!(strings(&rules[0]["operations"]), ["UPDATE"]);
    let conditions = spec["matchConditions"].as_sequence().unwrap();
    assert_eq!(conditions.len(), 1);
    assert_eq!(
        conditions[0]["expression"].as_str().unwrap(),
        format!(
            "request.userInfo.username == 'system:serviceaccount:ops:{}'",
            sa["metadata"]["name"].as_str().unwrap()
        )
    );
    // Only the role label may change; the rest of metadata is compared
    // except what the API server itself rewrites.
    assert_eq!(
        variable(policy, "allowedLabelKeys"),
        r#"["leasehold.dev/role"]"#
    );
    assert_eq!(
        variable(policy, "metadataNotCompared"),
        "['labels', 'resourceVersion', 'managedFields', 'generation']"
    );
    let validations = spec["validations"].as_sequence().unwrap();
    assert_eq!(validations.len(), 3);
    for v in validations {
        assert!(v["message"].is_string(), "{v:?}");
        assert_eq!(v["reason"], "Forbidden");
    }
    let cel: Vec<&str> = validations
        .iter()
        .map(|v| v["expression"].as_str().unwrap())
        .collect();
    assert!(cel[0].contains("oldObject"), "{}", cel[0]);
    assert!(
        cel[1].contains("variables.metadataNotCompared"),
        "{}",
        cel[1]
    );
    assert!(cel[2].contains("variables.allowedLabelKeys"), "{}", cel[2]);
    // Bound to the policy, refusing, cluster-wide.
    assert_eq!(binding["spec"]["policyName"], policy["metadata"]["name"]);
    assert_eq!(strings(&binding["spec"]["validationActions"]), ["Deny"]);
    assert!(binding["spec"]["matchResources"].is_null());

    // More keys for LeaderGroups with their own roleLabel; a named account.
    let docs_ = docs(
        &template_on(
            &helm,
            None,
            &[VAP_V1],
            &[
                "admissionPolicy.allowedLabelKeys={leasehold.dev/role,example.com/leader}",
                "serviceAccount.name=mine",
            ],
        )
        .unwrap(),
    );
    let (policy, _) = admission_policy(&docs_);
    assert_eq!(
        variable(policy, "allowedLabelKeys"),
        r#"["leasehold.dev/role","example.com/leader"]"#
    );
    assert_eq!(
        policy["spec"]["matchConditions"][0]["expression"],
        "request.userInfo.username == 'system:serviceaccount:ops:mine'"
    );

    // v1beta1 where only that is served (1.28-1.29); v1 wins when both are.
    for (served, expected) in [
        (&[VAP_V1BETA1][..], "admissionregistration.k8s.io/v1beta1"),
        (
            &[VAP_V1BETA1, VAP_V1][..],
            "admissionregistration.k8s.io/v1",
        ),
    ] {
        let docs_ = docs(&template_on(&helm, Some("1.29.0"), served, &[]).unwrap());
        let (policy, binding) = admission_policy(&docs_);
        assert_eq!(policy["apiVersion"], expected, "{served:?}");
        assert_eq!(binding["apiVersion"], expected, "{served:?}");
    }
}

#[test]
fn no_admission_policy_without_the_api_or_when_disabled() {
    let Some(helm) = helm_or_skip("no admission policy") else {
        return;
    };
    let none = |rendered: Result<String, String>| {
        let docs = docs(&rendered.unwrap());
        assert!(kind(&docs, "ValidatingAdmissionPolicy").is_empty());
        assert!(kind(&docs, "ValidatingAdmissionPolicyBinding").is_empty());
        // The rest of the chart is there all the same.
        one(&docs, "ClusterRole");
    };
    // An API server without the API (1.27): nothing, and no error.
    none(template_for(&helm, Some("1.27.0"), &[]));
    // Turned off, on a cluster that has it.
    none(template_on(
        &helm,
        None,
        &[VAP_V1],
        &["admissionPolicy.enabled=false"],
    ));
}

#[test]
fn namespaced_mode_scopes_the_admission_policy_to_that_namespace() {
    let Some(helm) = helm_or_skip("namespaced admission policy") else {
        return;
    };
    let docs = docs(&template_on(&helm, None, &[VAP_V1], &["watchNamespace=team-a"]).unwrap());
    let (policy, binding) = admission_policy(&docs);
    assert!(policy["metadata"]["namespace"].is_null());
    assert_eq!(
        binding["spec"]["matchResources"]["namespaceSelector"]["matchLabels"]
            ["kubernetes.io/metadata.name"],
        "team-a"
    );
    // The account is still the one in the release namespace.
    assert_eq!(
        policy["spec"]["matchConditions"][0]["expression"],
        "request.userInfo.username == 'system:serviceaccount:ops:rel-leasehold'"
    );
}

/// `store.url` names a PostgreSQL store (and wins over the Redis values);
/// anything else there is refused with the key named.
#[test]
fn a_postgres_store_url_reaches_the_controller() {
    let Some(helm) = helm_or_skip("postgres store") else {
        return;
    };
    let url = r"postgres://app@db-0:5432\,db-1:5432/app?target_session_attrs=read-write";
    let set = format!("store.url={url}");
    let docs_ = docs(&template(&helm, &[set.as_str(), "store.existingSecret=db-pw"]).unwrap());
    let spec = &controller(&docs_)["spec"]["template"]["spec"];
    let c = &spec["containers"][0];
    assert_eq!(
        env(c, "LEASEHOLD_REDIS_URL").unwrap()["value"],
        "postgres://app@db-0:5432,db-1:5432/app?target_session_attrs=read-write"
    );
    assert!(env(c, "LEASEHOLD_REDIS_PASSWORD_FILE").is_some());
    let err = template(&helm, &["store.url=mysql://x"]).unwrap_err();
    assert!(err.to_string().contains("store.url"), "{err}");
}

/// The store values' older names (`redis.*`, deprecated) render the same
/// manifests as the `store.*` ones, and a `store.*` value that is set wins
/// over its older name.
#[test]
fn the_deprecated_redis_values_render_as_the_store_values() {
    let Some(helm) = helm_or_skip("deprecated values") else {
        return;
    };
    let values = [
        ("url", r"rediss+sentinel://s1:26379\,s2:26379/mymaster/1"),
        ("existingSecret", "store-auth"),
        ("existingSecretPasswordKey", "pw"),
        ("sentinelSecret", "sentinel-pw"),
        ("sentinelSecretPasswordKey", "spw"),
        ("caSecret", "store-ca"),
        ("caSecretKey", "ca.pem"),
        ("prefix", "team-a"),
        ("replicaAcks", "2"),
    ];
    let sets = |under: &str| -> Vec<String> {
        values
            .iter()
            .map(|(k, v)| format!("{under}.{k}={v}"))
            .collect()
    };
    let render = |sets: &[String]| {
        let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
        template(&helm, &sets).unwrap()
    };
    let (old, new) = (render(&sets("redis")), render(&sets("store")));
    assert_eq!(old, new, "redis.* and store.* render differently");
    assert!(
        new.contains("/etc/leasehold/redis-sentinel-password"),
        "{new}"
    );
    assert_ne!(new, render(&[]), "the values changed nothing");
    // Unset, both render the defaults (and the deployed Redis alike).
    let deployed = ["redis.deploy=true".to_owned()];
    assert_eq!(
        render(&deployed),
        render(&[deployed[0].clone(), "redis.prefix=leasehold".into()])
    );
    // Both set: the store value wins.
    let both = render(&["redis.prefix=old".into(), "store.prefix=new".into()]);
    let both = docs(&both);
    let c = &controller(&both)["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(env(c, "LEASEHOLD_PREFIX").unwrap()["value"], "new");
}

/// The first line where `rendered` leaves `golden`, with its neighbours.
fn first_difference(golden: &str, rendered: &str) -> String {
    let (g, r): (Vec<&str>, Vec<&str>) = (golden.lines().collect(), rendered.lines().collect());
    let at = (0..g.len().max(r.len()))
        .find(|&i| g.get(i) != r.get(i))
        .unwrap_or(g.len());
    let around = |lines: &[&str]| {
        lines[at.saturating_sub(3).min(lines.len())..(at + 3).min(lines.len())].join("\n")
    };
    format!(
        "line {}:\n--- the chart of 57d1055:\n{}\n--- today's chart:\n{}",
        at + 1,
        around(&g),
        around(&r)
    )
}

/// `text` with the chart's version (`helm.sh/chart: leasehold-0.1.0`,
/// `app.kubernetes.io/version`) and the image's tag read as `VERSION`: a
/// release of the chart changes those in every manifest, and no user's
/// patch addresses them.
fn unversioned(text: &str) -> String {
    text.lines()
        .map(|line| {
            let trimmed = line.trim_start();
            let indent = &line[..line.len() - trimmed.len()];
            if trimmed.starts_with("helm.sh/chart: leasehold-") {
                format!("{indent}helm.sh/chart: leasehold-VERSION")
            } else if trimmed.starts_with("app.kubernetes.io/version: ") {
                format!("{indent}app.kubernetes.io/version: VERSION")
            } else if let Some(image) = trimmed.strip_prefix("image: \"leasehold/leasehold:") {
                let rest = image.split_once('"').map_or("", |(_, rest)| rest);
                format!("{indent}image: \"leasehold/leasehold:VERSION\"{rest}")
            } else {
                line.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Values written for the chart before the `store.*` values render, byte
/// for byte, what that chart (commit 57d1055) rendered for them: a release
/// upgraded with its values unchanged sees no change, and the kustomize or
/// post-renderer patches that address its variables, volumes and mount
/// paths by name still apply. The cases are
/// `tests/checks/fixtures/chart-57d1055/NAME.sets` (one `--set` a line),
/// and `NAME.yaml` is that chart's render of them (made by `generate.sh`
/// there, from git): the defaults and every `redis.*` key set. The chart's
/// and the image's version are read as `VERSION` on both sides
/// ([`unversioned`]), so a release of the chart moves nothing here; any
/// other difference is one an upgrade would apply to a running release,
/// and if it is meant, it goes in the upgrade notes and the cases are
/// rendered again from the commit that made it.
#[test]
fn the_old_values_render_what_the_chart_of_57d1055_rendered() {
    let Some(helm) = helm_or_skip("old values") else {
        return;
    };
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/checks/fixtures/chart-57d1055");
    let mut cases: Vec<std::path::PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "sets"))
        .collect();
    cases.sort();
    let mut keys_set = std::collections::BTreeSet::new();
    for case in &cases {
        let sets = std::fs::read_to_string(case).unwrap();
        let sets: Vec<&str> = sets.lines().collect();
        keys_set.extend(sets.iter().filter_map(|s| {
            let (key, _) = s.strip_prefix("redis.")?.split_once('=')?;
            Some(key.to_owned())
        }));
        let golden = case.with_extension("yaml");
        let golden = std::fs::read_to_string(&golden)
            .unwrap_or_else(|e| panic!("{}: {e} (run generate.sh there)", golden.display()));
        let rendered = template(&helm, &sets).unwrap_or_else(|e| panic!("{case:?}: {e}"));
        let (golden, rendered) = (unversioned(&golden), unversioned(&rendered));
        assert!(
            rendered == golden,
            "{}: today's chart renders other manifests than the chart of 57d1055 did for these \
             values, at {}",
            case.display(),
            first_difference(&golden, &rendered)
        );
    }
    // The cases: the defaults, and every key under redis: set by one.
    assert!(
        cases.iter().any(|c| c.ends_with("defaults.sets")),
        "no defaults case in {}: {cases:?}",
        dir.display()
    );
    let values: Value =
        serde_yaml::from_str(&std::fs::read_to_string(format!("{CHART}/values.yaml")).unwrap())
            .unwrap();
    let unset: Vec<&str> = values["redis"]
        .as_mapping()
        .expect("a redis: block in values.yaml")
        .keys()
        .filter_map(Value::as_str)
        .filter(|key| !keys_set.contains(*key))
        .collect();
    assert!(unset.is_empty(), "redis.* keys no case sets: {unset:?}");
}
