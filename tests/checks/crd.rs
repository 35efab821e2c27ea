//! The committed CRD is what the Rust type generates, and it carries the
//! bounds, rules and columns users rely on.

use kube::CustomResourceExt;
use leasehold_kube::crd::{crd_yaml, LeaderGroup};

#[test]
fn committed_crd_matches_the_generated_one() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/crds/leadergroups.yaml");
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    let generated = crd_yaml().unwrap();
    assert!(
        committed == generated,
        "crds/leadergroups.yaml is out of date with the LeaderGroup type; regenerate it with:\n    cargo run -- crdgen > crds/leadergroups.yaml"
    );
}

#[test]
fn the_crd_has_names_columns_bounds_and_rules() {
    let crd = serde_json::to_value(LeaderGroup::crd()).unwrap();
    let spec = &crd["spec"];
    assert_eq!(spec["group"], "leasehold.dev");
    assert_eq!(spec["names"]["shortNames"][0], "lg");
    assert_eq!(spec["scope"], "Namespaced");
    let version = &spec["versions"][0];
    assert_eq!(version["name"], "v1alpha1");
    assert!(version["subresources"]["status"].is_object());
    let columns: Vec<&str> = version["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        columns,
        [
            "Leader",
            "Term",
            "Live",
            "Ready",
            "Age",
            "Since",
            "Endpoint",
            "Preferred"
        ]
    );
    let column = |i: usize| &version["additionalPrinterColumns"][i];
    assert_eq!(
        column(3)["jsonPath"],
        ".status.conditions[?(@.type==\"Ready\")].status"
    );
    // How long the leader has led, the endpoint and the preferred member
    // show with `-o wide`.
    for i in [5, 6, 7] {
        assert_eq!(column(i)["priority"], 1, "{}", column(i));
    }
    // A past time, shown relative ("3m4s"); nothing shown moves while a
    // group is at rest (a lease expiry would, and cost a write per resync).
    assert_eq!(column(5)["type"], "date", "{}", column(5));
    assert_eq!(column(5)["jsonPath"], ".status.leaderSince");
    let status = &version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"];
    assert!(status["leaseExpiresAt"].is_null());
    assert!(status["members"]["items"]["properties"]["expiresAt"].is_null());
    let schema = &version["schema"]["openAPIV3Schema"]["properties"]["spec"];
    for field in ["ttlMs", "renewIntervalMs", "retryIntervalMs"] {
        assert_eq!(
            schema["properties"][field]["minimum"].as_f64(),
            Some(1.0),
            "{field}"
        );
        assert_eq!(
            schema["properties"][field]["maximum"].as_f64(),
            Some(2147483647.0),
            "{field}"
        );
    }
    let placement = &schema["properties"]["placement"]["properties"];
    assert_eq!(placement["stableSeconds"]["minimum"].as_f64(), Some(1.0));
    assert_eq!(
        placement["stableSeconds"]["maximum"].as_f64(),
        Some(86400.0)
    );
    assert_eq!(
        placement["failback"]["enum"],
        serde_json::json!(["Never", "AfterStable"])
    );
    // spec.service: a DNS label and 1 to 100 ports in range.
    let service = &schema["properties"]["service"]["properties"];
    assert_eq!(service["name"]["maxLength"], 63);
    assert_eq!(service["ports"]["minItems"], 1);
    assert_eq!(service["ports"]["maxItems"], 100);
    let port = &service["ports"]["items"]["properties"];
    for field in ["port", "targetPort"] {
        assert_eq!(port[field]["minimum"].as_f64(), Some(1.0), "{field}");
        assert_eq!(port[field]["maximum"].as_f64(), Some(65535.0), "{field}");
    }
    assert_eq!(
        port["protocol"]["enum"],
        serde_json::json!(["TCP", "UDP", "SCTP"])
    );
    let text = serde_json::to_string(schema).unwrap();
    assert!(text.contains("service.name must be a DNS label"), "{text}");
    assert!(text.contains("self.renewIntervalMs < self.ttlMs"), "{text}");
    assert!(text.contains("selector must not be empty"), "{text}");
    assert!(text.contains("roleLabel must be a label key"), "{text}");
    assert!(
        text.contains("!(self.roleLabel in self.selector.matchLabels)"),
        "{text}"
    );
    let status =
        &version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["conditions"];
    assert_eq!(status["x-kubernetes-list-type"], "map");
    assert_eq!(status["x-kubernetes-list-map-keys"][0], "type");
}
