//! The Kubernetes Events the controller records on a LeaderGroup
//! (events.k8s.io/v1), one new Event object per transition. kube's
//! `Recorder` folds repeats of a reason into a series that keeps the first
//! note, so after four elections `kubectl get events` would still read
//! "pod web-0 leads under term 1"; here every transition says its own truth.
//! Transitions are rare (a change of leader, a sweep, a step-down), and the
//! API server expires Events on its own.

use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::PostParams;
use kube::runtime::events::Reporter;
use kube::{Api, Resource, ResourceExt};

use crate::crd::LeaderGroup;
use crate::plan::PlannedEvent;

/// What every Event's `action` says: the controller reconciled the group.
const ACTION: &str = "Reconcile";

pub struct EventLog {
    client: kube::Client,
    reporter: Reporter,
}

impl EventLog {
    pub fn new(client: kube::Client, reporter: Reporter) -> Self {
        Self { client, reporter }
    }

    /// Creates one Event on `group` for `planned`.
    pub async fn record(
        &self,
        planned: &PlannedEvent,
        group: &LeaderGroup,
    ) -> Result<(), kube::Error> {
        let namespace = group.namespace().unwrap_or_else(|| "default".into());
        let event = Event {
            metadata: ObjectMeta {
                generate_name: Some(format!("{}.", group.name_any())),
                namespace: Some(namespace.clone()),
                ..Default::default()
            },
            event_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
            action: Some(ACTION.into()),
            reason: Some(planned.reason.into()),
            note: Some(planned.note.clone()),
            type_: Some(if planned.warning { "Warning" } else { "Normal" }.into()),
            regarding: Some(group.object_ref(&())),
            reporting_controller: Some(self.reporter.controller.clone()),
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| self.reporter.controller.clone()),
            ),
            ..Default::default()
        };
        Api::<Event>::namespaced(self.client.clone(), &namespace)
            .create(&PostParams::default(), &event)
            .await
            .map(drop)
    }
}
