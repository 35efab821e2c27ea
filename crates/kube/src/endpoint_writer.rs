//! The writer of the leader endpoint (`endpoint` decides), with what it
//! last wrote: a resync at rest writes nothing, and a leader change is one
//! update with no read before it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions};
use kube::discovery::ApiResource;
use kube::ResourceExt;

use crate::crd::{EndpointStatus, LeaderGroup, LeaderService};
use crate::endpoint::{
    held, owned, rank_of, service_write, slice_body, slice_name, slice_write, Current,
    LeaderEndpoint, ServiceWrite, SliceWrite,
};
use leasehold_engine::sync::locked;

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

/// What this replica wrote of a Service is filed under `NAMESPACE/SERVICE`.
pub(crate) fn service_key(group: &LeaderGroup, service: &str) -> String {
    format!("{}/{service}", group.namespace().unwrap_or_default())
}

/// What a write came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The slice was written.
    Written,
    /// The slice already held it (as this replica last wrote it).
    Unchanged,
    /// The slice is further on than this view (see [`SliceWrite::Stale`]).
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
pub(crate) struct Written {
    group_uid: Option<String>,
    resource_version: Option<String>,
    address_type: String,
    endpoint: LeaderEndpoint,
    at: Instant,
}

/// The writer of the leader Services and their slices, with what it wrote.
#[derive(Default)]
pub struct EndpointWriter {
    /// Whether the controller may write them (`--leader-endpoints`).
    pub enabled: bool,
    /// The EndpointSlice API the server serves, found on first use.
    resource: tokio::sync::OnceCell<ApiResource>,
    /// By `NAMESPACE/SERVICE`.
    pub(crate) slices: Mutex<HashMap<String, Written>>,
    /// Services found to be this group's, with the group's uid and the
    /// spec they were found with, by `NAMESPACE/SERVICE`.
    pub(crate) services: Mutex<HashMap<String, (String, LeaderService)>>,
}

impl EndpointWriter {
    pub fn new(enabled: bool) -> Self {
        Self {
            enabled,
            ..Default::default()
        }
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
                        e => api_error("discovering the EndpointSlice API")(e),
                    })?;
                group
                    .recommended_kind("EndpointSlice")
                    .map(|(resource, _)| resource)
                    .ok_or(EndpointError::NoSliceApi)
            })
            .await
    }

    /// Makes the group's Service exist as the spec says, while `active`.
    /// A Service of that name that is not the group's is an error, and this
    /// group's slice must not stay: it names that Service, and would add
    /// the leader's address to the Service's own endpoints.
    async fn ensure_service(
        &self,
        client: &kube::Client,
        slices: &Api<DynamicObject>,
        group: &LeaderGroup,
        service: &LeaderService,
        active: &impl Fn() -> bool,
    ) -> Result<(), EndpointError> {
        let namespace = group.namespace().unwrap_or_default();
        let key = service_key(group, &service.name);
        let uid = group.metadata.uid.clone().ok_or(EndpointError::NoUid)?;
        let api: Api<Service> = Api::namespaced(client.clone(), &namespace);
        // Twice at most: a creation that finds the Service made meanwhile
        // looks at whose it is.
        for _ in 0..2 {
            let found = api
                .get_opt(&service.name)
                .await
                .map_err(api_error("reading the Service"))?;
            match service_write(found.as_ref(), service, group) {
                ServiceWrite::NotOwned => {
                    locked(&self.services).remove(&key);
                    let slice = slice_name(&service.name);
                    if let Err(e) = delete_own_slice(slices, group, &slice).await {
                        tracing::warn!(service = %service.name, error = %e, "could not remove this group's slice of a Service that is not its own");
                    }
                    return Err(EndpointError::ServiceNotOwned(service.name.clone()));
                }
                ServiceWrite::Keep => {}
                _ if !active() => return Ok(()),
                ServiceWrite::Patch(patch) => {
                    let (params, patch) = (PatchParams::default(), Patch::Merge(&patch));
                    let patched = api.patch(&service.name, &params, &patch).await;
                    patched.map_err(api_error("updating the Service's ports"))?;
                }
                ServiceWrite::Create(body) => {
                    let body: Service = serde_json::from_value(body).expect("a Service body");
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
        locked(&self.services)
            .get(&service_key(group, &service.name))
            .is_some_and(|(uid, known)| {
                Some(uid.as_str()) == group.metadata.uid.as_deref() && known == service
            })
    }

    /// What this replica wrote into the group's slice, if it is still to be
    /// trusted: for this group, with its Service known to be the group's,
    /// and within [`RECHECK`] (past it, both are looked at again).
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

    /// Forgets what this replica wrote into the group's slice of Service
    /// `service` when the group's status records something else (`recorded`):
    /// another replica wrote the slice since. Across clusters, a replica
    /// cut off from the store takes the address off without the lease, and
    /// the active one must read the slice again, not trust its memory.
    pub fn doubt(&self, group: &LeaderGroup, service: &str, recorded: Option<&EndpointStatus>) {
        let key = service_key(group, service);
        let mut slices = locked(&self.slices);
        let Some(w) = slices
            .get(&key)
            .filter(|w| w.group_uid == group.metadata.uid)
        else {
            return;
        };
        let address = w.endpoint.leader.as_ref().map(|a| a.ip.as_str());
        let agrees = recorded.is_some_and(|r| {
            r.service == service
                && r.term == w.endpoint.term as i64
                && r.address.as_deref() == address
        });
        if !agrees {
            slices.remove(&key);
        }
    }

    /// Writes `desired` into the group's slice, fenced by its rank, while
    /// `may_write` says so (the active replica; across clusters, a replica
    /// cut off from the store for an unconfirmed endpoint). The Service is
    /// made sure of before the first write, and after every write behind
    /// it (it may have been deleted or replaced since it was last looked
    /// at); not for an unconfirmed endpoint, which only takes an address
    /// off an existing slice.
    pub async fn write(
        &self,
        client: &kube::Client,
        group: &LeaderGroup,
        desired: &LeaderEndpoint,
        may_write: impl Fn() -> bool,
    ) -> Result<Outcome, EndpointError> {
        if !self.enabled {
            return Err(EndpointError::Disabled);
        }
        let namespace = group.namespace().unwrap_or_default();
        let key = service_key(group, &desired.service.name);
        let known = self.written(&key, group, &desired.service);
        if (known.as_ref()).is_some_and(|w| w.endpoint == desired.aimed_at(Some(w.endpoint.rank())))
        {
            return Ok(Outcome::Unchanged);
        }
        let resource = self.resource(client).await?;
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, resource);
        let checked = desired.unconfirmed || self.service_known(group, &desired.service);
        let service = || self.ensure_service(client, &api, group, &desired.service, &may_write);
        if !checked {
            service().await?;
        }
        let outcome = self
            .put(
                &api,
                &resource.api_version,
                group,
                desired,
                known,
                &may_write,
            )
            .await?;
        if outcome == Outcome::Written && checked && !desired.unconfirmed {
            service().await.inspect_err(|_| {
                locked(&self.slices).remove(&key);
            })?;
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
        may_write: &impl Fn() -> bool,
    ) -> Result<Outcome, EndpointError> {
        let key = &service_key(group, &desired.service.name);
        let name = desired.slice_name();
        let mut current = known.map(|w| Current {
            rank: w.endpoint.rank(),
            version: w.resource_version,
            address_type: w.address_type,
            read: None,
        });
        let mut read = current.is_none();
        let params = PostParams::default();
        let body = |desired: &LeaderEndpoint, family: &str| {
            let body = slice_body(desired, group, api_version, family);
            serde_json::from_value::<DynamicObject>(body).expect("a slice body")
        };
        for _ in 0..3 {
            if read {
                current = read_slice(api, &name).await?;
            }
            read = true;
            let desired = &desired.aimed_at(current.as_ref().map(|c| c.rank));
            let answer = match slice_write(current.as_ref(), desired, group, api_version) {
                SliceWrite::Stale => {
                    locked(&self.slices).remove(key);
                    return Ok(Outcome::Stale);
                }
                SliceWrite::Unchanged { version, family } => {
                    // A look after RECHECK, or another replica's write.
                    self.remember(key, group, version, &family, desired);
                    return Ok(Outcome::Unchanged);
                }
                _ if !may_write() => return Ok(Outcome::NotActive),
                SliceWrite::Create { family } => api.create(&params, &body(desired, family)).await,
                SliceWrite::Update { version, family } => {
                    let mut update = body(desired, &family);
                    update.metadata.resource_version = version;
                    api.replace(&name, &params, &update).await
                }
                SliceWrite::Recreate { version, family } => {
                    let precondition = Preconditions {
                        resource_version: version,
                        uid: None,
                    };
                    let at = DeleteParams {
                        preconditions: Some(precondition),
                        ..Default::default()
                    };
                    match api.delete(&name, &at).await {
                        Ok(_) => api.create(&params, &body(desired, family)).await,
                        // Changed or gone since: decide again.
                        Err(e) if conflict(&e) || not_found(&e) => continue,
                        Err(e) => return Err(api_error("replacing the EndpointSlice")(e)),
                    }
                }
            };
            match answer {
                Ok(written) => {
                    let value = serde_json::to_value(&written).unwrap_or_default();
                    let family = value["addressType"].as_str().unwrap_or("IPv4");
                    self.remember(key, group, written.resource_version(), family, desired);
                    return Ok(Outcome::Written);
                }
                Err(e) if conflict(&e) || not_found(&e) => {
                    // Another writer got there first (409), or the slice
                    // went (404): read it and decide again.
                    locked(&self.slices).remove(key);
                }
                Err(e) => {
                    locked(&self.slices).remove(key);
                    return Err(api_error("writing the EndpointSlice")(e));
                }
            }
        }
        Err(EndpointError::Contended)
    }

    pub(crate) fn remember(
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
        let key = service_key(group, service);
        self.retain(|known| known != key);
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
