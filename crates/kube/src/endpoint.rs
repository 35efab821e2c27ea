//! The leader endpoint (`spec.service`): a selector-less Service and the
//! one EndpointSlice the controller writes for it, holding the leader pod's
//! address and nothing else, or no address while no one leads. A leader
//! change is then one write, made the moment the engine announces it,
//! instead of a label that the endpoints controller has to notice first.
//!
//! The slice carries the term it was written for, and a write is fenced by
//! it: [`Rank`] orders what a slice may say, and a replica whose view is
//! older than what the slice already says writes nothing (see
//! [`slice_write`]). Every write is an update at the resourceVersion the
//! decision was made from, so two replicas (the active one and one that has
//! not noticed it lost its lease yet) cannot both win: the one that read
//! the older version gets a conflict and decides again from the newer.
//!
//! This module decides what the slice and the Service should be, given what
//! was read of them; `endpoint_writer` reads and writes, as `reconcile` for `plan`.

use k8s_openapi::api::core::v1::Service;
use kube::{Resource, ResourceExt};
use serde_json::{json, Value};

use crate::crd::{LeaderGroup, LeaderService};

/// Annotation of the slice: the term it was written for.
pub const TERM_ANNOTATION: &str = "leasehold.dev/term";
/// Annotation of the slice: the leader pod, absent while no one leads.
pub const LEADER_ANNOTATION: &str = "leasehold.dev/leader";
/// Annotation of the slice: `"true"` while its cluster's controller, cut
/// off from the store, cannot confirm the term's leader (across clusters):
/// the slice holds no address, and the term is not over.
pub const UNCONFIRMED_ANNOTATION: &str = "leasehold.dev/unconfirmed";
/// Label of the Service and the slice: the LeaderGroup they belong to.
pub const GROUP_LABEL: &str = "leasehold.dev/group";
/// `endpointslice.kubernetes.io/managed-by` of the slice, so the
/// EndpointSlice controllers leave it alone.
pub const MANAGED_BY: &str = "leasehold.dev";

/// The leader pod's address as the slice holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Address {
    pub pod: String,
    pub ip: String,
    /// The pod is Ready: kube-proxy routes to a ready endpoint only, as it
    /// would for a Service with a selector.
    pub ready: bool,
}

/// What the leader Service's slice should hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderEndpoint {
    pub service: LeaderService,
    pub term: u64,
    /// `None`: no one leads in `term` (its lease lapsed or was released),
    /// or its leader is not confirmed.
    pub leader: Option<Address>,
    /// No address because the store has not answered since `term`'s lease
    /// last seen ran out (across clusters): unlike a vacated term, the term
    /// may still be this cluster's leader's, and once the store answers
    /// the leader's address is written back in the same term.
    pub unconfirmed: bool,
}

/// How far on a slice is: by term, and within a term a vacated slice (the
/// term's lease has ended) is further on than the term's leader. A write
/// never takes a slice back to a lower rank. An unconfirmed slice is of
/// its term's leader's rank: either may follow the other, as the store
/// goes away and answers again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Rank {
    pub term: u64,
    pub vacated: bool,
}

impl LeaderEndpoint {
    pub fn rank(&self) -> Rank {
        Rank {
            term: self.term,
            vacated: self.leader.is_none() && !self.unconfirmed,
        }
    }

    /// What is written into a slice of rank `slice` (`None`: there is none).
    /// An unconfirmed endpoint takes the address off at the term the slice
    /// holds when that is newer than the plan's record of it (a status
    /// write that lagged the slice's): whatever term the address was
    /// written for, nobody can confirm it now.
    pub fn aimed_at(&self, slice: Option<Rank>) -> LeaderEndpoint {
        match slice {
            Some(r) if self.unconfirmed && !r.vacated && r.term > self.term => LeaderEndpoint {
                term: r.term,
                leader: None,
                ..self.clone()
            },
            _ => self.clone(),
        }
    }

    /// The slice's name: the Service's, with a suffix no EndpointSlice
    /// controller uses (theirs end in a random suffix).
    pub fn slice_name(&self) -> String {
        slice_name(&self.service.name)
    }
}

/// The slice of Service `service`.
pub fn slice_name(service: &str) -> String {
    format!("{service}-leader")
}

/// A slice's rank, from its annotations and its endpoints. A slice without
/// the term's annotation is of rank zero: anything may replace it.
pub fn rank_of(slice: &Value) -> Rank {
    let annotations = &slice["metadata"]["annotations"];
    let term = annotations[TERM_ANNOTATION]
        .as_str()
        .and_then(|t| t.parse().ok())
        .unwrap_or(0);
    let unconfirmed = annotations.get(UNCONFIRMED_ANNOTATION).is_some();
    let vacated = !unconfirmed && slice["endpoints"].as_array().is_none_or(Vec::is_empty);
    Rank { term, vacated }
}

/// `IPv4` or `IPv6`: an EndpointSlice holds one family, fixed when it is
/// created.
pub fn address_type(ip: Option<&str>) -> &'static str {
    match ip.and_then(|ip| ip.parse::<std::net::IpAddr>().ok()) {
        Some(std::net::IpAddr::V6(_)) => "IPv6",
        _ => "IPv4",
    }
}

/// The owner reference that ties the Service and the slice to the group,
/// so the garbage collector removes them with it.
fn owner(group: &LeaderGroup) -> Value {
    json!([{
        "apiVersion": LeaderGroup::api_version(&()),
        "kind": LeaderGroup::kind(&()),
        "name": group.name_any(),
        "uid": group.metadata.uid.clone().unwrap_or_default(),
        "controller": true,
    }])
}

/// The slice's whole body (`api_version`: `discovery.k8s.io/v1`, or
/// `v1beta1` on API servers before 1.21: the fields used here are the
/// same in both). `address_type` is the existing slice's, if any.
pub fn slice_body(
    desired: &LeaderEndpoint,
    group: &LeaderGroup,
    api_version: &str,
    address_type: &str,
) -> Value {
    let namespace = group.namespace().unwrap_or_default();
    let mut annotations = json!({ TERM_ANNOTATION: desired.term.to_string() });
    if desired.unconfirmed {
        annotations[UNCONFIRMED_ANNOTATION] = json!("true");
    }
    let mut endpoints = Vec::new();
    if let Some(a) = &desired.leader {
        annotations[LEADER_ANNOTATION] = json!(a.pod);
        endpoints.push(json!({
            "addresses": [a.ip],
            "conditions": { "ready": a.ready },
            "targetRef": { "kind": "Pod", "namespace": namespace, "name": a.pod },
        }));
    }
    let ports: Vec<Value> = desired
        .service
        .ports
        .iter()
        .map(|p| {
            json!({
                "name": p.name.clone().unwrap_or_default(),
                "port": p.target_port.unwrap_or(p.port),
                "protocol": p.protocol.as_str(),
            })
        })
        .collect();
    json!({
        "apiVersion": api_version,
        "kind": "EndpointSlice",
        "metadata": {
            "name": desired.slice_name(),
            "namespace": namespace,
            "labels": {
                "kubernetes.io/service-name": desired.service.name,
                "endpointslice.kubernetes.io/managed-by": MANAGED_BY,
                GROUP_LABEL: group.name_any(),
            },
            "annotations": annotations,
            "ownerReferences": owner(group),
        },
        "addressType": address_type,
        "endpoints": endpoints,
        "ports": ports,
    })
}

/// The Service's ports as the API server stores them (target port and
/// protocol filled in).
fn service_ports(service: &LeaderService) -> Value {
    service
        .ports
        .iter()
        .map(|p| {
            let mut port = json!({
                "port": p.port,
                "targetPort": p.target_port.unwrap_or(p.port),
                "protocol": p.protocol.as_str(),
            });
            if let Some(name) = &p.name {
                port["name"] = json!(name);
            }
            port
        })
        .collect()
}

/// The selector-less Service: no selector, so no EndpointSlice controller
/// writes endpoints for it; only the slice this controller writes.
pub fn service_body(service: &LeaderService, group: &LeaderGroup) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": service.name,
            "namespace": group.namespace().unwrap_or_default(),
            "labels": {
                "app.kubernetes.io/managed-by": "leasehold",
                GROUP_LABEL: group.name_any(),
            },
            "ownerReferences": owner(group),
        },
        "spec": { "ports": service_ports(service) },
    })
}

/// Whether the existing Service `found` is this group's: its controller
/// owner reference names the group's uid, and it has no selector.
pub fn owned(found: &Service, group: &LeaderGroup) -> bool {
    let uid = group.metadata.uid.as_deref();
    let ours = found
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && Some(o.uid.as_str()) == uid);
    let selector = found
        .spec
        .as_ref()
        .and_then(|s| s.selector.as_ref())
        .is_some_and(|s| !s.is_empty());
    ours && !selector
}

/// Whether `found`'s ports are the spec's (as the API server shows them).
pub fn same_ports(found: &Service, service: &LeaderService) -> bool {
    let found: Vec<Value> = found
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .into_iter()
        .flatten()
        .map(|p| {
            let mut port = json!({
                "port": p.port,
                "targetPort": serde_json::to_value(&p.target_port).unwrap_or(Value::Null),
                "protocol": p.protocol.clone().unwrap_or_else(|| "TCP".into()),
            });
            if let Some(name) = p.name.as_ref().filter(|n| !n.is_empty()) {
                port["name"] = json!(name);
            }
            port
        })
        .collect();
    Value::Array(found) == service_ports(service)
}

/// A slice as this replica knows it, for the next write's decision.
pub struct Current {
    pub version: Option<String>,
    pub rank: Rank,
    pub address_type: String,
    /// Its endpoints, ports and annotations as read (`None` when this is
    /// what this replica last wrote, not a read).
    pub read: Option<Value>,
}

/// What of a slice a write sets, to tell a slice that already holds it.
pub fn held(slice: &Value) -> Value {
    json!({
        "endpoints": slice["endpoints"].as_array().cloned().unwrap_or_default(),
        "ports": slice["ports"].as_array().cloned().unwrap_or_default(),
        "term": slice["metadata"]["annotations"][TERM_ANNOTATION],
        "leader": slice["metadata"]["annotations"][LEADER_ANNOTATION],
        "unconfirmed": slice["metadata"]["annotations"][UNCONFIRMED_ANNOTATION],
    })
}

/// What to do with the slice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SliceWrite {
    /// It is further on than this view (a newer term was written), or there
    /// is none and the view is unconfirmed (no address to take off):
    /// nothing.
    Stale,
    /// As read, it holds what is desired already: nothing.
    Unchanged {
        version: Option<String>,
        family: String,
    },
    /// There is none: make it, of this family.
    Create { family: &'static str },
    /// An update at the version it was known at, in its own family.
    Update {
        version: Option<String>,
        family: String,
    },
    /// Its family is fixed and the leader's is another: delete it at the
    /// version it was known at, and make it anew.
    Recreate {
        version: Option<String>,
        family: &'static str,
    },
}

/// The slice's write, from what is known of it (`current`; `None`: there
/// is none). A write never takes a slice to a lower [`Rank`].
pub fn slice_write(
    current: Option<&Current>,
    desired: &LeaderEndpoint,
    group: &LeaderGroup,
    api_version: &str,
) -> SliceWrite {
    // `None` while vacated: no address, no family to change to.
    let family = desired.leader.as_ref().map(|a| address_type(Some(&a.ip)));
    let Some(c) = current else {
        if desired.unconfirmed {
            return SliceWrite::Stale;
        }
        let family = family.unwrap_or("IPv4");
        return SliceWrite::Create { family };
    };
    if c.rank > desired.rank() {
        return SliceWrite::Stale;
    }
    let (version, kept) = (c.version.clone(), c.address_type.clone());
    let wanted = || held(&slice_body(desired, group, api_version, &kept));
    if c.rank == desired.rank() && c.read.as_ref().is_some_and(|read| *read == wanted()) {
        return SliceWrite::Unchanged {
            version,
            family: kept,
        };
    }
    match family {
        Some(family) if family != kept => SliceWrite::Recreate { version, family },
        _ => SliceWrite::Update {
            version,
            family: kept,
        },
    }
}

/// What to do with the group's Service, given the one of its name.
#[derive(Debug, Clone, PartialEq)]
pub enum ServiceWrite {
    /// It is the group's, as the spec says.
    Keep,
    /// It is not the group's (no controller owner reference to it, or it
    /// has a selector): left alone, and an error.
    NotOwned,
    /// The group's, with other ports: this merge patch.
    Patch(Value),
    /// There is none: this one.
    Create(Value),
}

pub fn service_write(
    found: Option<&Service>,
    service: &LeaderService,
    group: &LeaderGroup,
) -> ServiceWrite {
    match found {
        None => ServiceWrite::Create(service_body(service, group)),
        Some(found) if !owned(found, group) => ServiceWrite::NotOwned,
        Some(found) if !same_ports(found, service) => {
            ServiceWrite::Patch(json!({ "spec": { "ports": service_ports(service) } }))
        }
        Some(_) => ServiceWrite::Keep,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{LeaderServicePort, Protocol};

    fn service() -> LeaderService {
        LeaderService {
            name: "web-leader".into(),
            ports: vec![LeaderServicePort {
                name: Some("http".into()),
                port: 80,
                target_port: Some(8080),
                protocol: Protocol::Tcp,
            }],
        }
    }

    fn endpoint(term: u64, leader: Option<&str>) -> LeaderEndpoint {
        LeaderEndpoint {
            service: service(),
            term,
            leader: leader.map(|pod| Address {
                pod: pod.into(),
                ip: "10.0.0.5".into(),
                ready: true,
            }),
            unconfirmed: false,
        }
    }

    /// Term `term` whose leader is not confirmed.
    fn unconfirmed(term: u64) -> LeaderEndpoint {
        LeaderEndpoint {
            unconfirmed: true,
            ..endpoint(term, None)
        }
    }

    fn group() -> LeaderGroup {
        let spec: crate::crd::LeaderGroupSpec =
            serde_json::from_value(json!({ "selector": { "matchLabels": { "app": "web" } } }))
                .unwrap();
        let mut g = LeaderGroup::new("web", spec);
        g.metadata.namespace = Some("shop".into());
        g.metadata.uid = Some("uid-1".into());
        g
    }

    const V1: &str = "discovery.k8s.io/v1";

    /// A slice at `term` as this replica last wrote it (not read).
    fn known(term: u64, leader: Option<&str>, family: &str) -> Current {
        Current {
            version: Some("41".into()),
            rank: endpoint(term, leader).rank(),
            address_type: family.into(),
            read: None,
        }
    }

    fn update(family: &str) -> SliceWrite {
        SliceWrite::Update {
            version: Some("41".into()),
            family: family.into(),
        }
    }

    #[test]
    fn a_slice_never_goes_back_to_an_older_term_or_to_a_term_s_leader_once_vacated() {
        let write = |current: Current, term, leader: Option<&str>| {
            slice_write(Some(&current), &endpoint(term, leader), &group(), V1)
        };
        // Forward: a new term, or the same term's end.
        assert_eq!(
            write(known(4, Some("web-0"), "IPv4"), 5, Some("web-1")),
            update("IPv4")
        );
        assert_eq!(
            write(known(4, Some("web-0"), "IPv4"), 4, None),
            update("IPv4")
        );
        assert_eq!(write(known(4, None, "IPv4"), 5, None), update("IPv4"));
        // The same rank again (a readiness change of the same leader).
        assert_eq!(
            write(known(5, Some("web-1"), "IPv4"), 5, Some("web-1")),
            update("IPv4")
        );
        // Back: a stale replica's view.
        assert_eq!(
            write(known(5, Some("web-1"), "IPv4"), 4, Some("web-0")),
            SliceWrite::Stale
        );
        assert_eq!(
            write(known(4, None, "IPv4"), 4, Some("web-0")),
            SliceWrite::Stale
        );
        assert_eq!(write(known(5, None, "IPv4"), 4, None), SliceWrite::Stale);
        // No slice yet: made in the leader's family, IPv4 while vacated.
        let made = |leader| slice_write(None, &endpoint(0, leader), &group(), V1);
        assert_eq!(made(None), SliceWrite::Create { family: "IPv4" });
        assert_eq!(made(Some("web-0")), SliceWrite::Create { family: "IPv4" });
    }

    #[test]
    fn an_unconfirmed_slice_holds_no_address_and_its_term_s_leader_may_come_back() {
        let body = slice_body(&unconfirmed(7), &group(), V1, "IPv4");
        assert_eq!(body["endpoints"], json!([]));
        let annotations = &body["metadata"]["annotations"];
        assert_eq!(annotations[UNCONFIRMED_ANNOTATION], "true");
        assert_eq!(annotations[TERM_ANNOTATION], "7");
        assert!(annotations.get(LEADER_ANNOTATION).is_none());
        // Of the term's leader's rank, read back as written; a vacated
        // slice is not unconfirmed.
        assert_eq!(rank_of(&body), endpoint(7, Some("web-1")).rank());
        assert_eq!(rank_of(&body), unconfirmed(7).rank());
        let vacated = slice_body(&endpoint(7, None), &group(), V1, "IPv4");
        assert_ne!(held(&body), held(&vacated));
        let write = |current: Current, desired: &LeaderEndpoint| {
            slice_write(Some(&current), desired, &group(), V1)
        };
        // The term's leader is unconfirmed, and written back once the
        // store answers; a newer term or the term's end follow it.
        assert_eq!(
            write(known(7, Some("web-1"), "IPv4"), &unconfirmed(7)),
            update("IPv4")
        );
        let from_unconfirmed = || Current {
            rank: unconfirmed(7).rank(),
            ..known(7, None, "IPv4")
        };
        for next in [
            endpoint(7, Some("web-1")),
            endpoint(7, None),
            endpoint(8, Some("web-2")),
        ] {
            assert_eq!(write(from_unconfirmed(), &next), update("IPv4"), "{next:?}");
        }
        // Never over a vacated term, nor, as planned, over a newer one: the
        // writer first aims it at the slice's own term (`aimed_at`, below).
        assert_eq!(
            write(known(7, None, "IPv4"), &unconfirmed(7)),
            SliceWrite::Stale
        );
        assert_eq!(
            write(known(8, Some("web-2"), "IPv4"), &unconfirmed(7)),
            SliceWrite::Stale
        );
        // No slice: none is made to hold no address.
        assert_eq!(
            slice_write(None, &unconfirmed(7), &group(), V1),
            SliceWrite::Stale
        );
        // A slice further on than the plan's record, with an address: it
        // comes off at the slice's term; a vacated one is left.
        let slice = |term, leader| Some(endpoint(term, leader).rank());
        assert_eq!(
            unconfirmed(7).aimed_at(slice(8, Some("web-2"))),
            unconfirmed(8)
        );
        assert_eq!(unconfirmed(7).aimed_at(slice(9, None)), unconfirmed(7));
        assert_eq!(
            unconfirmed(7).aimed_at(slice(6, Some("web-0"))),
            unconfirmed(7)
        );
        assert_eq!(unconfirmed(7).aimed_at(None), unconfirmed(7));
        let confirmed = endpoint(7, Some("web-1"));
        assert_eq!(confirmed.aimed_at(slice(8, Some("web-2"))), confirmed);
        // As read, the same unconfirmed slice is left as it is.
        let read = Current {
            read: Some(held(&body)),
            ..known(7, Some("web-1"), "IPv4")
        };
        assert_eq!(
            write(read, &unconfirmed(7)),
            SliceWrite::Unchanged {
                version: Some("41".into()),
                family: "IPv4".into()
            }
        );
    }

    #[test]
    fn a_slice_read_holding_the_desired_endpoint_is_left_as_it_is() {
        let desired = endpoint(7, Some("web-1"));
        let body = slice_body(&desired, &group(), V1, "IPv4");
        let read = |body: &Value| Current {
            read: Some(held(body)),
            ..known(7, Some("web-1"), "IPv4")
        };
        assert_eq!(
            slice_write(Some(&read(&body)), &desired, &group(), V1),
            SliceWrite::Unchanged {
                version: Some("41".into()),
                family: "IPv4".into()
            }
        );
        // The same rank with another readiness, or what this replica
        // wrote without a read: written.
        let mut unready = desired.clone();
        unready.leader.as_mut().unwrap().ready = false;
        let unready = slice_write(Some(&read(&body)), &unready, &group(), V1);
        assert_eq!(unready, update("IPv4"));
        let unread = known(7, Some("web-1"), "IPv4");
        assert_eq!(
            slice_write(Some(&unread), &desired, &group(), V1),
            update("IPv4")
        );
    }

    #[test]
    fn a_leader_of_the_other_family_makes_the_slice_anew_a_vacated_one_keeps_it() {
        let mut v6 = endpoint(8, Some("web-2"));
        v6.leader.as_mut().unwrap().ip = "fd00::5".into();
        let current = known(7, Some("web-1"), "IPv4");
        assert_eq!(
            slice_write(Some(&current), &v6, &group(), V1),
            SliceWrite::Recreate {
                version: Some("41".into()),
                family: "IPv6"
            }
        );
        let current = known(8, Some("web-2"), "IPv6");
        let vacated = endpoint(8, None);
        let kept = slice_write(Some(&current), &vacated, &group(), V1);
        assert_eq!(kept, update("IPv6"));
        assert_eq!(
            slice_write(None, &v6, &group(), V1),
            SliceWrite::Create { family: "IPv6" }
        );
    }

    #[test]
    fn the_service_is_made_its_ports_put_right_and_another_s_left_alone() {
        let made = service_write(None, &service(), &group());
        assert_eq!(
            made,
            ServiceWrite::Create(service_body(&service(), &group()))
        );
        let found: Service = serde_json::from_value(service_body(&service(), &group())).unwrap();
        assert_eq!(
            service_write(Some(&found), &service(), &group()),
            ServiceWrite::Keep
        );
        let mut moved = service();
        moved.ports[0].port = 81;
        assert_eq!(
            service_write(Some(&found), &moved, &group()),
            ServiceWrite::Patch(json!({ "spec": { "ports": [
                { "name": "http", "port": 81, "targetPort": 8080, "protocol": "TCP" }
            ] } }))
        );
        let mut other = group();
        other.metadata.uid = Some("uid-2".into());
        let theirs = service_write(Some(&found), &service(), &other);
        assert_eq!(theirs, ServiceWrite::NotOwned);
    }

    #[test]
    fn the_slice_holds_the_leader_alone_with_its_term_and_reads_back_at_its_rank() {
        let desired = endpoint(7, Some("web-1"));
        let body = slice_body(&desired, &group(), "discovery.k8s.io/v1", "IPv4");
        assert_eq!(body["metadata"]["name"], "web-leader-leader");
        assert_eq!(
            body["metadata"]["labels"]["kubernetes.io/service-name"],
            "web-leader"
        );
        assert_eq!(
            body["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"],
            MANAGED_BY
        );
        assert_eq!(body["metadata"]["annotations"][TERM_ANNOTATION], "7");
        assert_eq!(body["metadata"]["annotations"][LEADER_ANNOTATION], "web-1");
        assert_eq!(body["metadata"]["ownerReferences"][0]["uid"], "uid-1");
        assert_eq!(body["endpoints"].as_array().unwrap().len(), 1);
        assert_eq!(body["endpoints"][0]["addresses"], json!(["10.0.0.5"]));
        assert_eq!(body["endpoints"][0]["targetRef"]["name"], "web-1");
        assert_eq!(
            body["ports"],
            json!([{ "name": "http", "port": 8080, "protocol": "TCP" }])
        );
        assert_eq!(rank_of(&body), desired.rank());
        // What a later look compares: the same slice holds it, another
        // leader's or the term's end does not.
        let again = slice_body(&desired, &group(), "discovery.k8s.io/v1", "IPv4");
        assert_eq!(held(&body), held(&again));
        let other = slice_body(
            &endpoint(8, Some("web-1")),
            &group(),
            "discovery.k8s.io/v1",
            "IPv4",
        );
        assert_ne!(held(&body), held(&other));

        let vacated = slice_body(&endpoint(7, None), &group(), "discovery.k8s.io/v1", "IPv4");
        assert_eq!(vacated["endpoints"], json!([]));
        assert!(vacated["metadata"]["annotations"]
            .get(LEADER_ANNOTATION)
            .is_none());
        assert_eq!(
            rank_of(&vacated),
            Rank {
                term: 7,
                vacated: true
            }
        );
        assert_eq!(
            rank_of(&json!({})),
            Rank {
                term: 0,
                vacated: true
            }
        );
    }

    #[test]
    fn the_family_follows_the_address() {
        assert_eq!(address_type(Some("10.1.2.3")), "IPv4");
        assert_eq!(address_type(Some("fd00::5")), "IPv6");
        assert_eq!(address_type(None), "IPv4");
    }

    #[test]
    fn the_service_has_no_selector_and_is_owned_by_the_group() {
        let body = service_body(&service(), &group());
        assert!(body["spec"].get("selector").is_none());
        assert_eq!(
            body["spec"]["ports"],
            json!([{ "name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP" }])
        );
        let found: Service = serde_json::from_value(body).unwrap();
        assert!(owned(&found, &group()));
        assert!(same_ports(&found, &service()));
        let mut other = group();
        other.metadata.uid = Some("uid-2".into());
        assert!(!owned(&found, &other), "another group's");
        let mut selected = found.clone();
        selected.spec.as_mut().unwrap().selector = Some([("app".into(), "web".into())].into());
        assert!(!owned(&selected, &group()), "a Service with a selector");
        let mut moved = service();
        moved.ports[0].port = 81;
        assert!(!same_ports(&found, &moved));
    }
}
