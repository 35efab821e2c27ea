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

-- Records cluster p_cluster's timings for group p_grp (when they changed,
-- or the record is p_refresh ms old) and returns every cluster's, with its
-- age. One group's votes are taken one at a time (a transaction lock on
-- the group), so a second cluster's first vote sees the first's: of two
-- clusters that disagree, at most one found no conflict.
CREATE FUNCTION {s}.vote_spec(p_grp text, p_cluster text, p_ttl bigint, p_renew bigint,
                              p_retry bigint, p_refresh bigint)
RETURNS TABLE (o_cluster text, o_ttl_ms bigint, o_renew_interval_ms bigint,
               o_retry_interval_ms bigint, o_age_ms bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_now bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('{c} spec ' || p_grp, 0));
    v_now := {s}.now_ms();
    INSERT INTO {s}.specs AS v (grp, cluster, ttl_ms, renew_interval_ms, retry_interval_ms, at_ms)
    VALUES (p_grp, p_cluster, p_ttl, p_renew, p_retry, v_now)
    ON CONFLICT (grp, cluster) DO UPDATE SET ttl_ms = excluded.ttl_ms,
        renew_interval_ms = excluded.renew_interval_ms,
        retry_interval_ms = excluded.retry_interval_ms, at_ms = excluded.at_ms
    WHERE (v.ttl_ms, v.renew_interval_ms, v.retry_interval_ms)
            IS DISTINCT FROM (excluded.ttl_ms, excluded.renew_interval_ms, excluded.retry_interval_ms)
        OR v.at_ms <= v_now - p_refresh;
    RETURN QUERY
        SELECT s.cluster, s.ttl_ms, s.renew_interval_ms, s.retry_interval_ms,
               greatest(v_now - s.at_ms, 0)
        FROM {s}.specs s WHERE s.grp = p_grp;
END
$$;
