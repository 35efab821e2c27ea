-- Schema version 3: each Kubernetes cluster's timings for a group, as its
-- controller last wrote them, for groups that span clusters sharing the
-- store (docs/clusters.md): the controllers compare them before any of
-- them writes the group's timings. Run on a version 2 schema; nothing of
-- version 2 changes.

-- at_ms: when the record was last written (the database's clock), so a
-- cluster whose controller is gone stops counting.
CREATE TABLE {s}.specs (
    grp text NOT NULL,
    cluster text NOT NULL,
    ttl_ms bigint NOT NULL,
    renew_interval_ms bigint NOT NULL,
    retry_interval_ms bigint NOT NULL,
    at_ms bigint NOT NULL,
    PRIMARY KEY (grp, cluster)
);
