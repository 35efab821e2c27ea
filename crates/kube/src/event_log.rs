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
        let now = k8s_openapi::jiff::Timestamp::now();
        let event = Event {
            metadata: ObjectMeta {
                name: Some(event_name(&group.name_any(), now.as_nanosecond())),
                namespace: Some(namespace.clone()),
                ..Default::default()
            },
            event_time: Some(MicroTime(now)),
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

/// `NAME.<nanoseconds in hex>`, the name client-go gives an Event. Not
/// `generateName: "NAME."`: API servers up to 1.21 check a generated name's
/// prefix as a whole name, and a trailing dot fails that (422), so no
/// Event was ever recorded there. A name too long for the suffix is cut.
pub fn event_name(object: &str, nanos: i128) -> String {
    let suffix = format!(".{:x}", nanos.max(0));
    let room = MAX_NAME.saturating_sub(suffix.len());
    let mut head = &object[..object.len().min(room)];
    while head.ends_with(['.', '-']) {
        head = &head[..head.len() - 1];
    }
    format!("{head}{suffix}")
}

/// The longest object name (a DNS subdomain).
const MAX_NAME: usize = 253;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_names_are_valid_object_names() {
        assert_eq!(event_name("web", 0x1234), "web.1234");
        let long = format!("{}-{}", "a".repeat(235), "b".repeat(20));
        let name = event_name(&long, i128::from(i64::MAX));
        assert!(name.len() <= MAX_NAME, "{}", name.len());
        assert!(name.ends_with(".7fffffffffffffff"), "{name}");
        assert!(leasehold_daemon::names::validate_object_name("event", &name).is_ok());
    }
}
