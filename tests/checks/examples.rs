//! The files in examples/ are what a user copies first, so they are checked
//! like code: every LeaderGroup parses as the CRD type and passes the
//! controller's spec rules, every agent's flags pass the agent's own checks,
//! and the selectors of group, workload and Service fit together.

use std::collections::BTreeMap;

use clap::Parser;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Container, PodTemplateSpec, Service};
use leasehold_agent::{AgentArgs, Settings};
use leasehold_kube::crd::{spec_error_message, LeaderGroup, DEFAULT_ROLE_LABEL};
use serde::Deserialize;

const EXAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples");

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    command: Sub,
}

#[derive(clap::Subcommand)]
enum Sub {
    Agent(AgentArgs),
}

/// Every document of every example file, by kind.
fn documents() -> Vec<(String, serde_yaml::Value)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(EXAMPLES).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let text = std::fs::read_to_string(&path).unwrap();
            for doc in serde_yaml::Deserializer::from_str(&text) {
                let value = serde_yaml::Value::deserialize(doc).unwrap();
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                out.push((name, value));
            }
        }
    }
    out
}

fn of_kind<T: serde::de::DeserializeOwned>(kind: &str) -> Vec<(String, T)> {
    documents()
        .into_iter()
        .filter(|(_, d)| d["kind"] == kind)
        .map(|(file, d)| {
            let parsed = serde_yaml::from_value(d).unwrap_or_else(|e| panic!("{file}: {e}"));
            (file, parsed)
        })
        .collect()
}

/// The pod templates of the examples' workloads.
fn templates() -> Vec<(String, PodTemplateSpec)> {
    let mut out: Vec<(String, PodTemplateSpec)> = of_kind::<StatefulSet>("StatefulSet")
        .into_iter()
        .map(|(f, s)| (f, s.spec.unwrap().template))
        .collect();
    out.extend(
        of_kind::<Deployment>("Deployment")
            .into_iter()
            .map(|(f, d)| (f, d.spec.unwrap().template)),
    );
    out
}

/// The agent's flags of a container that runs it, as its pod would give them.
fn agent_settings(c: &Container) -> Option<Settings> {
    let args = c.args.clone().unwrap_or_default();
    let args: Vec<String> = if args.first().map(String::as_str) == Some("agent") {
        args
    } else if c.image.as_deref().is_some_and(|i| i.contains("leasehold")) {
        // An image whose entrypoint is `leasehold agent`.
        std::iter::once("agent".to_owned()).chain(args).collect()
    } else {
        return None;
    };
    // The downward API's values and the env's URL, as the pod would have
    // them, go before any `--`.
    let mut argv = vec!["leasehold".to_owned(), "agent".to_owned()];
    argv.extend(["--pod-name=web-0".into(), "--namespace=shop".into()]);
    for e in c.env.iter().flatten() {
        if let ("LEASEHOLD_STORE_URL", Some(url)) = (e.name.as_str(), &e.value) {
            argv.push(format!("--store-url={url}"));
        }
    }
    argv.extend(args.into_iter().skip(1));
    // Exec mode checks the command exists; the examples' commands live in
    // the user's image, so check the flags with a command this machine has.
    if let Some(i) = argv.iter().position(|a| a == "--") {
        argv.truncate(i + 1);
        argv.push("sh".into());
    }
    let cli = Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    let Sub::Agent(agent) = cli.command;
    Some(Settings::from_args(&agent).unwrap_or_else(|e| panic!("{argv:?}: {e}")))
}

#[test]
fn every_leader_group_is_valid() {
    let groups = of_kind::<LeaderGroup>("LeaderGroup");
    assert!(groups.len() >= 2, "examples hold at least two LeaderGroups");
    for (file, g) in groups {
        if let Err(e) = g.spec.election_config() {
            panic!("{file}: {}", spec_error_message(&e));
        }
        assert!(
            g.spec
                .selector
                .match_labels
                .as_ref()
                .is_some_and(|l| !l.is_empty()),
            "{file}: an empty selector is refused by the API server"
        );
    }
}

#[test]
fn every_agent_in_the_examples_accepts_its_flags_and_names_a_declared_group() {
    let groups: Vec<String> = of_kind::<LeaderGroup>("LeaderGroup")
        .into_iter()
        .map(|(_, g)| g.metadata.name.unwrap())
        .collect();
    let mut agents = 0;
    for (file, t) in templates() {
        let spec = t.spec.unwrap();
        let containers = spec
            .init_containers
            .unwrap_or_default()
            .into_iter()
            .chain(spec.containers);
        for c in containers {
            let Some(settings) = agent_settings(&c) else {
                continue;
            };
            agents += 1;
            for (name, _) in &settings.groups {
                assert!(
                    groups.contains(name),
                    "{file}: group {name} is not declared"
                );
            }
            let env: Vec<String> = c
                .env
                .unwrap_or_default()
                .into_iter()
                .map(|e| e.name)
                .collect();
            for needed in ["POD_NAME", "POD_NAMESPACE", "LEASEHOLD_STORE_URL"] {
                assert!(
                    env.contains(&needed.to_owned()),
                    "{file}: {} lacks {needed}",
                    c.name
                );
            }
        }
    }
    assert!(agents >= 2, "found {agents} agents in the examples");
}

#[test]
fn the_leader_service_selects_the_leader_of_a_declared_group() {
    let groups = of_kind::<LeaderGroup>("LeaderGroup");
    let services = of_kind::<Service>("Service");
    let (_, svc) = services
        .iter()
        .find(|(_, s)| {
            s.spec
                .as_ref()
                .and_then(|s| s.selector.as_ref())
                .is_some_and(|sel| {
                    sel.get(DEFAULT_ROLE_LABEL).map(String::as_str) == Some("leader")
                })
        })
        .expect("a Service selecting the leader");
    let selector: BTreeMap<String, String> = svc.spec.clone().unwrap().selector.unwrap();
    // Some group selects the same pods (its labels, apart from the role).
    let pods: BTreeMap<String, String> = selector
        .iter()
        .filter(|(k, _)| k.as_str() != DEFAULT_ROLE_LABEL)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    assert!(
        groups
            .iter()
            .any(|(_, g)| g.spec.selector.match_labels.as_ref() == Some(&pods)),
        "no LeaderGroup selects {pods:?}"
    );
    // And a workload's pods carry those labels.
    assert!(templates().iter().any(|(_, t)| {
        let labels = t
            .metadata
            .as_ref()
            .and_then(|m| m.labels.clone())
            .unwrap_or_default();
        pods.iter().all(|(k, v)| labels.get(k) == Some(v))
    }));
}
