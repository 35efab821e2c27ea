//! The leader endpoint (`spec.service`): a selector-less Service and the
//! one EndpointSlice the controller writes for it, holding the leader pod's
//! address and nothing else, or no address while no one leads. A leader
//! change is then one write, made the moment the engine announces it,
//! instead of a label that the endpoints controller has to notice first.
//!
//! The slice carries the term it was written for, and a write is fenced by
//! it: [`Rank`] orders what a slice may say, and a replica whose view is
//! older than what the slice already says writes nothing (see
//! [`decide`]). Every write is an update at the resourceVersion the
//! decision was made from, so two replicas (the active one and one that has
//! not noticed it lost its lease yet) cannot both win: the one that read
//! the older version gets a conflict and decides again from the newer.
//!
//! This module holds the pure part (what to write, in which order) and the
//! writes (see [`Endpoints::write`]).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions};
use kube::discovery::ApiResource;
use kube::{Resource, ResourceExt};
use serde_json::{json, Value};

use crate::crd::{LeaderGroup, LeaderService};
use leasehold_engine::sync::locked;

/// Annotation of the slice: the term it was written for.
pub const TERM_ANNOTATION: &str = "leasehold.dev/term";
/// Annotation of the slice: the leader pod, absent while no one leads.
pub const LEADER_ANNOTATION: &str = "leasehold.dev/leader";
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
    /// `None`: no one leads in `term` (its lease lapsed or was released).
    pub leader: Option<Address>,
}

/// How far on a slice is: by term, and within a term a vacated slice (the
/// term's lease has ended) is further on than the term's leader. A write
/// never takes a slice back to a lower rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Rank {
    pub term: u64,
    pub vacated: bool,
}

impl LeaderEndpoint {
    pub fn rank(&self) -> Rank {
        Rank {
            term: self.term,
            vacated: self.leader.is_none(),
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

/// Whether to write, given the rank of the slice as it is (`None`: there is
/// no slice).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Write,
    /// The slice is further on than this view: another replica (or a
    /// later reconcile) wrote a newer term.
    Stale,
}

pub fn decide(current: Option<Rank>, desired: Rank) -> Decision {
    match current {
        Some(current) if current > desired => Decision::Stale,
        _ => Decision::Write,
    }
}

/// A slice's rank, from its annotation and its endpoints. A slice without
/// the annotation is of rank zero: anything may replace it.
pub fn rank_of(slice: &Value) -> Rank {
    let term = slice["metadata"]["annotations"][TERM_ANNOTATION]
        .as_str()
        .and_then(|t| t.parse().ok())
        .unwrap_or(0);
    let vacated = slice["endpoints"].as_array().is_none_or(Vec::is_empty);
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
fn same_ports(found: &Service, service: &LeaderService) -> bool {
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

#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error("the controller runs without --leader-endpoints (the chart's leaderEndpoints.enabled): spec.service of this group is not written")]
    Disabled,
    #[error("this API server serves no EndpointSlice API (discovery.k8s.io)")]
    NoSliceApi,
    #[error("Service {0} exists and is not this group's (no controller owner reference to it, or it has a selector): it is left alone")]
    ServiceNotOwned(String),
    #[error("the group has no uid yet")]
    NoUid,
    #[error("{what}: {source}")]
    Api {
        what: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error("the EndpointSlice kept changing under this write (3 conflicts in a row)")]
    Contended,
}

impl EndpointError {
    /// An answer that stays the same until someone changes the install,
    /// the cluster or the spec: reported in the group's condition, not
    /// retried as a failure.
    pub fn standing(&self) -> bool {
        matches!(
            self,
            Self::Disabled | Self::NoSliceApi | Self::ServiceNotOwned(_) | Self::NoUid
        )
    }
}

fn api_error(what: &'static str) -> impl FnOnce(kube::Error) -> EndpointError {
    move |source| EndpointError::Api { what, source }
}

fn conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

fn not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// A slice as it is, for the next write's decision.
struct Current {
    version: Option<String>,
    rank: Rank,
    address_type: String,
    /// Its endpoints, ports and annotations as read (`None` when this is
    /// what this replica last wrote, not a read).
    read: Option<Value>,
}

/// What of a slice a write sets, to tell a slice that already holds it.
fn held(slice: &Value) -> Value {
    json!({
        "endpoints": slice["endpoints"].as_array().cloned().unwrap_or_default(),
        "ports": slice["ports"].as_array().cloned().unwrap_or_default(),
        "term": slice["metadata"]["annotations"][TERM_ANNOTATION],
        "leader": slice["metadata"]["annotations"][LEADER_ANNOTATION],
    })
}

async fn read_slice(
    api: &Api<DynamicObject>,
    name: &str,
) -> Result<Option<Current>, EndpointError> {
    let found = api
        .get_opt(name)
        .await
        .map_err(api_error("reading the EndpointSlice"))?;
    Ok(found.map(|s| {
        let value = serde_json::to_value(&s).unwrap_or_default();
        Current {
            version: s.resource_version(),
            rank: rank_of(&value),
            address_type: value["addressType"].as_str().unwrap_or("IPv4").to_owned(),
            read: Some(held(&value)),
        }
    }))
}

/// What [`put_slice`] came to.
enum Put {
    /// The API server's answer to the update or creation.
    Answer(Box<Result<DynamicObject, kube::Error>>),
    /// The slice had to be made anew (its family changed), and the delete
    /// found it changed or gone: decide again.
    Again,
}

/// Writes the slice over `current` (an update at its version), or creates
/// it. A slice's addressType is fixed: when the family (`None`: no
/// address, which keeps the slice's) changes, the slice is deleted at the
/// version decided on and made anew.
async fn put_slice(
    api: &Api<DynamicObject>,
    name: &str,
    current: Option<&Current>,
    family: Option<&str>,
    body: impl Fn(&str) -> DynamicObject,
) -> Result<Put, EndpointError> {
    let params = PostParams::default();
    let Some(current) = current else {
        let made = api.create(&params, &body(family.unwrap_or("IPv4"))).await;
        return Ok(Put::Answer(Box::new(made)));
    };
    if family.is_none_or(|f| f == current.address_type) {
        let mut update = body(&current.address_type);
        update.metadata.resource_version = current.version.clone();
        let answer = api.replace(name, &params, &update).await;
        return Ok(Put::Answer(Box::new(answer)));
    }
    let delete = DeleteParams {
        preconditions: Some(Preconditions {
            resource_version: current.version.clone(),
            uid: None,
        }),
        ..Default::default()
    };
    match api.delete(name, &delete).await {
        Ok(_) => {
            let made = api.create(&params, &body(family.unwrap_or("IPv4"))).await;
            Ok(Put::Answer(Box::new(made)))
        }
        Err(e) if conflict(&e) || not_found(&e) => Ok(Put::Again),
        Err(e) => Err(api_error("replacing the EndpointSlice")(e)),
    }
}

/// What a write came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The slice was written.
    Written,
    /// The slice already held it (as this replica last wrote it).
    Unchanged,
    /// The slice is further on than this view (see [`Decision::Stale`]).
    Stale,
    /// This replica stopped being the active one before the write.
    NotActive,
}

/// How long what this replica wrote is trusted without a look: a slice or
/// Service deleted by hand comes back within this, not only at the next
/// leader change. One GET per group in this mode at most this often.
const RECHECK: Duration = Duration::from_secs(300);

/// What this replica last wrote into a slice, for which group (its uid:
/// a group deleted and made anew under the same name starts afresh).
#[derive(Debug, Clone)]
struct Written {
    group_uid: Option<String>,
    resource_version: Option<String>,
    address_type: String,
    endpoint: LeaderEndpoint,
    at: Instant,
}

/// The writer of the leader Services and their slices, with what it
/// wrote (so a resync at rest writes nothing, and a leader change is one
/// update with no read before it).
#[derive(Default)]
pub struct Endpoints {
    /// Whether the controller may write them (`--leader-endpoints`).
    pub enabled: bool,
    /// The EndpointSlice API the server serves, found on first use.
    resource: tokio::sync::OnceCell<ApiResource>,
    /// By `NAMESPACE/SERVICE`.
    slices: Mutex<HashMap<String, Written>>,
    /// Services found to be this group's, with the group's uid and the
    /// spec they were found with, by `NAMESPACE/SERVICE`.
    services: Mutex<HashMap<String, (String, LeaderService)>>,
}

impl Endpoints {
    pub fn new(enabled: bool) -> Self {
        Self {
            enabled,
            ..Default::default()
        }
    }

    /// Forgets what it wrote for a group's Service (its group was deleted).
    pub fn forget(&self, namespace: &str, service: &str) {
        let key = format!("{namespace}/{service}");
        locked(&self.slices).remove(&key);
        locked(&self.services).remove(&key);
    }

    /// Forgets the Services `present` does not keep (`NAMESPACE/SERVICE`).
    pub fn retain(&self, present: impl Fn(&str) -> bool) {
        locked(&self.slices).retain(|key, _| present(key));
        locked(&self.services).retain(|key, _| present(key));
    }

    async fn resource(&self, client: &kube::Client) -> Result<&ApiResource, EndpointError> {
        self.resource
            .get_or_try_init(|| async {
                let group = kube::discovery::group(client, "discovery.k8s.io")
                    .await
                    .map_err(|e| match e {
                        kube::Error::Discovery(_) => EndpointError::NoSliceApi,
                        e if not_found(&e) => EndpointError::NoSliceApi,
                        e => EndpointError::Api {
                            what: "discovering the EndpointSlice API",
                            source: e,
                        },
                    })?;
                group
                    .recommended_kind("EndpointSlice")
                    .map(|(resource, _)| resource)
                    .ok_or(EndpointError::NoSliceApi)
            })
            .await
    }

    /// Makes the group's Service exist as the spec says, while `active`.
    /// A Service of that name that is not the group's is an error.
    async fn ensure_service(
        &self,
        client: &kube::Client,
        group: &LeaderGroup,
        service: &LeaderService,
        active: &impl Fn() -> bool,
    ) -> Result<(), EndpointError> {
        let namespace = group.namespace().unwrap_or_default();
        let key = format!("{namespace}/{}", service.name);
        let uid = group.metadata.uid.clone().ok_or(EndpointError::NoUid)?;
        let api: Api<Service> = Api::namespaced(client.clone(), &namespace);
        // Twice at most: a creation that finds the Service made meanwhile
        // looks at whose it is.
        for _ in 0..2 {
            let found = api
                .get_opt(&service.name)
                .await
                .map_err(api_error("reading the Service"))?;
            match found {
                Some(found) if !owned(&found, group) => {
                    locked(&self.services).remove(&key);
                    return Err(EndpointError::ServiceNotOwned(service.name.clone()));
                }
                Some(found) if !same_ports(&found, service) => {
                    if !active() {
                        return Ok(());
                    }
                    let patch = json!({ "spec": { "ports": service_ports(service) } });
                    api.patch(
                        &service.name,
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await
                    .map_err(api_error("updating the Service's ports"))?;
                }
                Some(_) => {}
                None => {
                    if !active() {
                        return Ok(());
                    }
                    let body: Service = serde_json::from_value(service_body(service, group))
                        .expect("a Service body");
                    match api.create(&PostParams::default(), &body).await {
                        Ok(_) => {}
                        Err(e) if conflict(&e) => continue,
                        Err(e) => return Err(api_error("creating the Service")(e)),
                    }
                }
            }
            locked(&self.services).insert(key, (uid, service.clone()));
            return Ok(());
        }
        Err(EndpointError::Contended)
    }

    fn service_known(&self, group: &LeaderGroup, service: &LeaderService) -> bool {
        let key = format!("{}/{}", group.namespace().unwrap_or_default(), service.name);
        locked(&self.services)
            .get(&key)
            .is_some_and(|(uid, known)| {
                Some(uid.as_str()) == group.metadata.uid.as_deref() && known == service
            })
    }

    /// What this replica wrote into the group's slice, if it is still to
    /// be trusted: for this group, checked within [`RECHECK`], with its
    /// Service known to be the group's.
    /// Past [`RECHECK`], the slice and the Service are looked at again.
    fn written(&self, key: &str, group: &LeaderGroup, service: &LeaderService) -> Option<Written> {
        let known = locked(&self.slices).get(key).cloned()?;
        if known.at.elapsed() >= RECHECK {
            locked(&self.slices).remove(key);
            locked(&self.services).remove(key);
            return None;
        }
        (known.group_uid == group.metadata.uid && self.service_known(group, service))
            .then_some(known)
    }

    /// Writes `desired` into the group's slice, fenced by its rank, while
    /// `active` says this replica is the active one. The Service is made
    /// sure of before the first write, and after every write behind it
    /// (it may have been deleted or replaced since it was last looked at).
    pub async fn write(
        &self,
        client: &kube::Client,
        group: &LeaderGroup,
        desired: &LeaderEndpoint,
        active: impl Fn() -> bool,
    ) -> Result<Outcome, EndpointError> {
        if !self.enabled {
            return Err(EndpointError::Disabled);
        }
        let namespace = group.namespace().unwrap_or_default();
        let key = format!("{namespace}/{}", desired.service.name);
        let known = self.written(&key, group, &desired.service);
        if known.as_ref().is_some_and(|w| &w.endpoint == desired) {
            return Ok(Outcome::Unchanged);
        }
        let resource = self.resource(client).await?;
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, resource);
        let checked = self.service_known(group, &desired.service);
        if !checked {
            if let Err(e) = self
                .ensure_service(client, group, &desired.service, &active)
                .await
            {
                self.drop_slice_of_other(&api, group, &desired.service, &e)
                    .await;
                return Err(e);
            }
        }
        let outcome = self
            .put(&api, &resource.api_version, group, desired, known, &active)
            .await?;
        if outcome == Outcome::Written && checked {
            if let Err(e) = self
                .ensure_service(client, group, &desired.service, &active)
                .await
            {
                locked(&self.slices).remove(&key);
                self.drop_slice_of_other(&api, group, &desired.service, &e)
                    .await;
                return Err(e);
            }
        }
        Ok(outcome)
    }

    /// The slice write itself: decided from what this replica last wrote
    /// (`known`) or from a read, and again from a read after a conflict.
    async fn put(
        &self,
        api: &Api<DynamicObject>,
        api_version: &str,
        group: &LeaderGroup,
        desired: &LeaderEndpoint,
        known: Option<Written>,
        active: &impl Fn() -> bool,
    ) -> Result<Outcome, EndpointError> {
        let key = format!(
            "{}/{}",
            group.namespace().unwrap_or_default(),
            desired.service.name
        );
        let name = desired.slice_name();
        let mut current = known.map(|w| Current {
            rank: w.endpoint.rank(),
            version: w.resource_version,
            address_type: w.address_type,
            read: None,
        });
        let mut read = current.is_none();
        for _ in 0..3 {
            if read {
                current = read_slice(api, &name).await?;
            }
            read = true;
            if decide(current.as_ref().map(|c| c.rank), desired.rank()) == Decision::Stale {
                locked(&self.slices).remove(&key);
                return Ok(Outcome::Stale);
            }
            if let Some(c) = current.as_ref().filter(|c| c.rank == desired.rank()) {
                let wanted = held(&slice_body(desired, group, api_version, &c.address_type));
                if c.read.as_ref() == Some(&wanted) {
                    // The slice holds it already (a look after RECHECK, or
                    // another replica's write): nothing to write.
                    self.remember(&key, group, c.version.clone(), &c.address_type, desired);
                    return Ok(Outcome::Unchanged);
                }
            }
            if !active() {
                return Ok(Outcome::NotActive);
            }
            // `None` while vacated: no address, no family to change to.
            let family = desired.leader.as_ref().map(|a| address_type(Some(&a.ip)));
            let body = |kind: &str| {
                let body = slice_body(desired, group, api_version, kind);
                serde_json::from_value::<DynamicObject>(body).expect("a slice body")
            };
            let answer = match put_slice(api, &name, current.as_ref(), family, body).await? {
                Put::Answer(answer) => *answer,
                Put::Again => continue,
            };
            match answer {
                Ok(written) => {
                    let value = serde_json::to_value(&written).unwrap_or_default();
                    let family = value["addressType"].as_str().unwrap_or("IPv4");
                    self.remember(&key, group, written.resource_version(), family, desired);
                    return Ok(Outcome::Written);
                }
                Err(e) if conflict(&e) || not_found(&e) => {
                    // Another writer got there first (409), or the slice
                    // went (404): read it and decide again.
                    locked(&self.slices).remove(&key);
                }
                Err(e) => {
                    locked(&self.slices).remove(&key);
                    return Err(api_error("writing the EndpointSlice")(e));
                }
            }
        }
        Err(EndpointError::Contended)
    }

    fn remember(
        &self,
        key: &str,
        group: &LeaderGroup,
        resource_version: Option<String>,
        address_type: &str,
        endpoint: &LeaderEndpoint,
    ) {
        locked(&self.slices).insert(
            key.to_owned(),
            Written {
                group_uid: group.metadata.uid.clone(),
                resource_version,
                address_type: address_type.to_owned(),
                endpoint: endpoint.clone(),
                at: Instant::now(),
            },
        );
    }

    /// When the group's Service turns out not to be its own, this group's
    /// slice must not stay: it names that Service, and would add the
    /// leader's address to the Service's own endpoints.
    async fn drop_slice_of_other(
        &self,
        api: &Api<DynamicObject>,
        group: &LeaderGroup,
        service: &LeaderService,
        error: &EndpointError,
    ) {
        if !matches!(error, EndpointError::ServiceNotOwned(_)) {
            return;
        }
        if let Err(e) = delete_own_slice(api, group, &slice_name(&service.name)).await {
            tracing::warn!(service = %service.name, error = %e, "could not remove this group's slice of a Service that is not its own");
        }
    }

    /// Removes the Service and slice a group had under another name (its
    /// `spec.service` was renamed or removed), if they are still its own,
    /// while `active`. Nothing without `--leader-endpoints` (no RBAC).
    pub async fn retire(
        &self,
        client: &kube::Client,
        group: &LeaderGroup,
        service: &str,
        active: impl Fn() -> bool,
    ) -> Result<(), EndpointError> {
        if !self.enabled {
            return Ok(());
        }
        let namespace = group.namespace().unwrap_or_default();
        self.forget(&namespace, service);
        let services: Api<Service> = Api::namespaced(client.clone(), &namespace);
        if let Some(found) = services
            .get_opt(service)
            .await
            .map_err(api_error("reading the retired Service"))?
        {
            if owned(&found, group) && active() {
                match services.delete(service, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(e) if not_found(&e) => {}
                    Err(e) => return Err(api_error("deleting the retired Service")(e)),
                }
            }
        }
        let resource = self.resource(client).await?;
        let slices: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, resource);
        if active() {
            delete_own_slice(&slices, group, &slice_name(service)).await?;
        }
        Ok(())
    }
}

/// Deletes slice `name` if it is `group`'s (its owner reference).
async fn delete_own_slice(
    api: &Api<DynamicObject>,
    group: &LeaderGroup,
    name: &str,
) -> Result<(), EndpointError> {
    let Some(found) = api
        .get_opt(name)
        .await
        .map_err(api_error("reading the EndpointSlice"))?
    else {
        return Ok(());
    };
    let ours = found
        .owner_references()
        .iter()
        .any(|o| Some(o.uid.as_str()) == group.metadata.uid.as_deref());
    if !ours {
        return Ok(());
    }
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(e) if not_found(&e) => Ok(()),
        Err(e) => Err(api_error("deleting the EndpointSlice")(e)),
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

    #[test]
    fn a_slice_never_goes_back_to_an_older_term_or_to_a_term_s_leader_once_vacated() {
        let rank = |term, leader: Option<&str>| endpoint(term, leader).rank();
        // Forward: a new term, or the same term's end.
        assert_eq!(
            decide(Some(rank(4, Some("web-0"))), rank(5, Some("web-1"))),
            Decision::Write
        );
        assert_eq!(
            decide(Some(rank(4, Some("web-0"))), rank(4, None)),
            Decision::Write
        );
        assert_eq!(decide(Some(rank(4, None)), rank(5, None)), Decision::Write);
        // The same rank again (a readiness change of the same leader).
        assert_eq!(
            decide(Some(rank(5, Some("web-1"))), rank(5, Some("web-1"))),
            Decision::Write
        );
        // Back: a stale replica's view.
        assert_eq!(
            decide(Some(rank(5, Some("web-1"))), rank(4, Some("web-0"))),
            Decision::Stale
        );
        assert_eq!(
            decide(Some(rank(4, None)), rank(4, Some("web-0"))),
            Decision::Stale
        );
        assert_eq!(decide(Some(rank(5, None)), rank(4, None)), Decision::Stale);
        // No slice yet.
        assert_eq!(decide(None, rank(0, None)), Decision::Write);
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
