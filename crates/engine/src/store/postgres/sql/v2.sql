-- Schema version 2: a candidate's priority kept with its candidacy, the
-- free seat's rules and the handover to a named successor, as seat.lua
-- and handover.lua keep them on Redis (docs/behaviour.md P1-P4). Run on
-- a version 1 schema; the functions whose signatures change are dropped
-- and made again, and version 1's claim and renew stay callable (below)
-- for the processes of the previous release during an upgrade.

-- problem: why the member's application is unhealthy (its priority is 0
-- meanwhile), NULL when it is not.
ALTER TABLE {s}.members ADD COLUMN priority int NOT NULL DEFAULT {DEFAULT_PRIORITY},
    ADD COLUMN problem text;

-- last_holder: the holder of the latest lease (never waited for: it had
-- the seat and let it go); vacant_ms: when a claim first deferred on the
-- free seat (the deference counts from there); successor and
-- successor_until_ms: a named successor and the end of its window;
-- preferred: the members the controller prefers (NULL: no preference).
ALTER TABLE {s}.groups ADD COLUMN last_holder text, ADD COLUMN vacant_ms bigint,
    ADD COLUMN successor text, ADD COLUMN successor_until_ms bigint,
    ADD COLUMN preferred text[];
UPDATE {s}.groups SET last_holder = holder;

DROP FUNCTION {s}.claim(text, text, text, bigint, bigint, bigint, text, bigint);
DROP FUNCTION {s}.renew(text, text, text, bigint, bigint, bigint);
DROP FUNCTION {s}.group_state(text);

-- A candidate's rank on a free seat: priority first; among equals, the
-- preferred ones (all of them, without a list). 0 never leads.
CREATE FUNCTION {s}.seat_rank(p_node text, p_priority int, p_preferred text[]) RETURNS int
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_priority <= 0 THEN 0
                WHEN p_preferred IS NULL OR p_node = ANY (p_preferred) THEN p_priority * 2 + 1
                ELSE p_priority * 2 END
$$;

-- Whether the claimant p_id (of p_priority) must leave the free seat of
-- group g (its row, locked by the caller) to a better candidate: all NULL
-- when it may take it, else the ms to wait, the reason and the candidate
-- waited for. The deference lasts at most p_defer from the first claim
-- that deferred, so a better candidate that does not claim (dead, its
-- candidacy not yet lapsed) cannot keep the seat empty for longer.
CREATE FUNCTION {s}.seat_deferral(g {s}.groups, p_id text, p_priority int, p_now bigint,
                                  p_defer bigint, OUT o_wait bigint, OUT o_reason text,
                                  OUT o_to text)
LANGUAGE plpgsql AS $$
DECLARE
    v_best text;
    v_best_priority int;
    v_best_rank int;
    v_vacant bigint;
BEGIN
    IF p_priority <= 0 THEN
        o_wait := p_defer; o_reason := 'neverLeads'; o_to := ''; RETURN;
    END IF;
    IF g.successor IS NOT NULL AND p_now < g.successor_until_ms THEN
        IF g.successor = p_id THEN RETURN; END IF;
        IF EXISTS (SELECT 1 FROM {s}.members
                   WHERE grp = g.name AND node = g.successor AND until_ms > p_now) THEN
            o_wait := g.successor_until_ms - p_now; o_reason := 'successor'; o_to := g.successor;
            RETURN;
        END IF;
    END IF;
    SELECT m.node, m.priority, {s}.seat_rank(m.node, m.priority, g.preferred)
        INTO v_best, v_best_priority, v_best_rank
        FROM {s}.members m
        WHERE m.grp = g.name AND m.until_ms > p_now AND m.node <> p_id
          AND m.node IS DISTINCT FROM g.last_holder
        ORDER BY 3 DESC, m.node LIMIT 1;
    IF v_best IS NULL OR v_best_rank <= {s}.seat_rank(p_id, p_priority, g.preferred) THEN
        RETURN;
    END IF;
    v_vacant := g.vacant_ms;
    IF v_vacant IS NULL OR v_vacant > p_now THEN
        v_vacant := p_now;
        UPDATE {s}.groups SET vacant_ms = p_now WHERE name = g.name;
    END IF;
    IF p_now >= v_vacant + p_defer THEN RETURN; END IF;
    o_wait := v_vacant + p_defer - p_now;
    o_to := v_best;
    o_reason := CASE WHEN v_best_priority > p_priority THEN 'priority' ELSE 'preferred' END;
END $$;

-- Claim a group's lease (version 1's rules), keeping the claimant's
-- priority and leaving a free seat to a better candidate (seat_deferral).
CREATE FUNCTION {s}.claim(p_group text, p_id text, p_inc text, p_ttl bigint, p_seen bigint,
                          p_candidacy bigint, p_history text, p_started_ms bigint,
                          p_priority int, p_defer bigint, p_problem text)
RETURNS TABLE (o_won boolean, o_term bigint, o_fresh boolean, o_wait_ms bigint, o_holder text,
               o_ttl_ms bigint, o_renew_interval_ms bigint, o_retry_interval_ms bigint,
               o_defer text, o_defer_to text)
LANGUAGE plpgsql AS $$
DECLARE
    g {s}.groups%ROWTYPE;
    st {s}.store%ROWTYPE;
    v_now bigint;
    v_born bigint;
    v_epoch bigint;
    v_moved_on boolean := false;
    v_stored bigint;
    v_term bigint;
    v_wait bigint;
    v_registered text;
    v_defer_wait bigint;
BEGIN
    p_history := p_history || ':' || '{s}.meta'::regclass::oid;
    INSERT INTO {s}.groups (name) VALUES (p_group) ON CONFLICT DO NOTHING;
    SELECT * INTO g FROM {s}.groups WHERE name = p_group FOR UPDATE;
    SELECT * INTO st FROM {s}.store WHERE id = 1;
    IF st.born_ms < 0 OR st.epoch < 0 OR st.history IS DISTINCT FROM p_history
       OR p_seen > g.counter THEN
        SELECT * INTO st FROM {s}.store WHERE id = 1 FOR UPDATE;
    END IF;
    v_now := {s}.now_ms();
    v_born := st.born_ms;
    v_epoch := st.epoch;
    IF v_born < 0 THEN v_born := least(v_now, p_started_ms); END IF;
    IF v_epoch < 0 THEN v_epoch := {s}.epoch_at(v_now); END IF;
    IF st.history IS NOT NULL AND st.history <> p_history THEN
        -- Another server, timeline or start: born again, in a new epoch.
        v_born := v_now;
        v_epoch := greatest(v_epoch, {s}.epoch_at(v_now), st.epoch + 1);
        v_moved_on := true;
    END IF;
    v_stored := g.counter;
    IF p_seen > v_stored THEN
        -- A claimant remembers a term the data lacks: the data was lost.
        IF v_moved_on THEN
            v_epoch := greatest(v_epoch, p_seen / {SPAN} + 1);
        ELSE
            v_born := v_now;
            v_epoch := greatest(v_epoch, {s}.epoch_at(v_now), p_seen / {SPAN} + 1);
        END IF;
        v_stored := p_seen;
    END IF;
    IF v_born <> st.born_ms OR v_epoch <> st.epoch OR st.history IS DISTINCT FROM p_history THEN
        UPDATE {s}.store SET born_ms = v_born, epoch = v_epoch, history = p_history WHERE id = 1;
    END IF;
    INSERT INTO {s}.members (grp, node, until_ms, priority, problem)
        VALUES (p_group, p_id, v_now + p_candidacy, p_priority, p_problem)
        ON CONFLICT (grp, node) DO UPDATE SET until_ms = excluded.until_ms,
            priority = excluded.priority, problem = excluded.problem;
    o_ttl_ms := g.ttl_ms;
    o_renew_interval_ms := g.renew_interval_ms;
    o_retry_interval_ms := g.retry_interval_ms;
    IF g.holder = p_id AND g.incarnation = p_inc AND g.expires_ms > v_now THEN
        -- Our own lease, still standing after a fail-safe demotion: it
        -- keeps its term.
        UPDATE {s}.groups SET counter = greatest(v_stored, g.lease_term), expires_ms = v_now + p_ttl
            WHERE name = p_group;
        o_won := true; o_term := g.lease_term; o_fresh := false; o_wait_ms := 0; o_holder := p_id;
        RETURN NEXT; RETURN;
    END IF;
    o_won := false; o_term := v_stored;
    IF g.holder IS NOT NULL AND g.expires_ms > v_now THEN
        o_wait_ms := g.expires_ms - v_now;
        o_holder := g.holder;
        IF g.holder = p_id THEN
            -- Another incarnation of this id: only the registered one (or
            -- any, when none is) may take it over.
            SELECT incarnation INTO v_registered FROM {s}.nodes WHERE id = p_id;
        END IF;
        IF g.holder <> p_id OR (v_registered IS NOT NULL AND v_registered <> p_inc) THEN
            IF v_stored <> g.counter THEN
                UPDATE {s}.groups SET counter = v_stored WHERE name = p_group;
            END IF;
            RETURN NEXT; RETURN;
        END IF;
    END IF;
    o_holder := '';
    IF v_now - v_born < p_ttl THEN
        -- The store's first ttl after its birth: no new lease yet.
        o_wait_ms := v_born + p_ttl - v_now;
    ELSE
        SELECT d.o_wait, d.o_reason, d.o_to INTO v_defer_wait, o_defer, o_defer_to
            FROM {s}.seat_deferral(g, p_id, p_priority, v_now, p_defer) d;
        IF v_defer_wait IS NOT NULL THEN
            o_wait_ms := v_defer_wait;
        ELSE
            v_term := {s}.next_term(greatest(v_stored, v_epoch * {SPAN}));
            v_wait := {s}.epoch_wait(v_term, v_now);
            IF v_wait = 0 THEN
                UPDATE {s}.groups SET counter = v_term, holder = p_id, incarnation = p_inc,
                    lease_term = v_term, expires_ms = v_now + p_ttl, last_holder = p_id,
                    vacant_ms = NULL, successor = NULL, successor_until_ms = NULL
                    WHERE name = p_group;
                o_won := true; o_term := v_term; o_fresh := true; o_wait_ms := 0;
                o_holder := p_id;
                RETURN NEXT; RETURN;
            END IF;
            o_wait_ms := v_wait;
        END IF;
    END IF;
    IF v_stored <> g.counter THEN
        UPDATE {s}.groups SET counter = v_stored WHERE name = p_group;
    END IF;
    RETURN NEXT;
END $$;


-- Renew a held lease (version 1), keeping the leader's priority.
CREATE FUNCTION {s}.renew(p_group text, p_id text, p_inc text, p_term bigint, p_ttl bigint,
                          p_candidacy bigint, p_priority int, p_problem text)
RETURNS TABLE (o_status int, o_term bigint, o_holder text, o_incarnation text,
               o_ttl_ms bigint, o_renew_interval_ms bigint, o_retry_interval_ms bigint)
LANGUAGE plpgsql AS $$
DECLARE
    g {s}.groups%ROWTYPE;
    v_now bigint;
    v_epoch bigint;
    v_moved bigint;
BEGIN
    SELECT * INTO g FROM {s}.groups WHERE name = p_group FOR UPDATE;
    v_now := {s}.now_ms();
    IF NOT FOUND OR g.holder IS NULL OR g.expires_ms <= v_now THEN
        o_status := 0; RETURN NEXT; RETURN;
    END IF;
    IF g.holder <> p_id OR g.incarnation <> p_inc OR g.lease_term <> p_term THEN
        o_status := -1; o_holder := g.holder; o_incarnation := g.incarnation;
        RETURN NEXT; RETURN;
    END IF;
    o_term := p_term;
    SELECT greatest(epoch, 0) INTO v_epoch FROM {s}.store WHERE id = 1;
    v_moved := {s}.next_term(greatest(g.counter, v_epoch * {SPAN}));
    IF g.counter > p_term AND {s}.epoch_wait(v_moved, v_now) = 0 THEN
        o_term := v_moved;
    END IF;
    UPDATE {s}.groups SET counter = greatest(counter, o_term), lease_term = o_term,
        expires_ms = v_now + p_ttl WHERE name = p_group;
    INSERT INTO {s}.members (grp, node, until_ms, priority, problem)
        VALUES (p_group, p_id, v_now + p_candidacy, p_priority, p_problem)
        ON CONFLICT (grp, node) DO UPDATE SET until_ms = excluded.until_ms,
            priority = excluded.priority, problem = excluded.problem;
    -- The leader keeps the member list tidy: candidacies that lapsed go.
    DELETE FROM {s}.members WHERE grp = p_group AND until_ms <= v_now;
    o_status := 1;
    o_ttl_ms := g.ttl_ms;
    o_renew_interval_ms := g.renew_interval_ms;
    o_retry_interval_ms := g.retry_interval_ms;
    RETURN NEXT;
END $$;


CREATE FUNCTION {s}.group_state(p_group text)
RETURNS TABLE (o_holder text, o_term bigint, o_pttl bigint, o_now bigint, o_members text[],
               o_until bigint[], o_priorities int[], o_problems text[], o_preferred text[])
LANGUAGE plpgsql AS $$
DECLARE
    g {s}.groups%ROWTYPE;
BEGIN
    o_now := {s}.now_ms();
    SELECT * INTO g FROM {s}.groups WHERE name = p_group;
    o_term := coalesce(g.counter, 0);
    o_preferred := g.preferred;
    IF g.holder IS NOT NULL AND g.expires_ms > o_now THEN
        o_holder := g.holder;
        o_pttl := g.expires_ms - o_now;
    END IF;
    SELECT coalesce(array_agg(node ORDER BY until_ms, node), '{}'),
           coalesce(array_agg(until_ms ORDER BY until_ms, node), '{}'),
           coalesce(array_agg(priority ORDER BY until_ms, node), '{}'),
           coalesce(array_agg(coalesce(problem, '') ORDER BY until_ms, node), '{}')
        INTO o_members, o_until, o_priorities, o_problems
        FROM {s}.members WHERE grp = p_group AND until_ms > o_now;
    RETURN NEXT;
END $$;


-- The version 1 signatures of claim and renew, for processes of the
-- previous release while an upgrade rolls out (the first newer process
-- migrates the schema under them): they campaign at the default priority,
-- never defer, and read the same columns as before.
CREATE FUNCTION {s}.claim(p_group text, p_id text, p_inc text, p_ttl bigint, p_seen bigint,
                          p_candidacy bigint, p_history text, p_started_ms bigint)
RETURNS TABLE (o_won boolean, o_term bigint, o_fresh boolean, o_wait_ms bigint, o_holder text,
               o_ttl_ms bigint, o_renew_interval_ms bigint, o_retry_interval_ms bigint)
LANGUAGE sql AS $$
    SELECT c.o_won, c.o_term, c.o_fresh, c.o_wait_ms, c.o_holder, c.o_ttl_ms,
           c.o_renew_interval_ms, c.o_retry_interval_ms
    FROM {s}.claim(p_group, p_id, p_inc, p_ttl, p_seen, p_candidacy, p_history, p_started_ms,
                   {DEFAULT_PRIORITY}, 0, NULL) c
$$;

CREATE FUNCTION {s}.renew(p_group text, p_id text, p_inc text, p_term bigint, p_ttl bigint,
                          p_candidacy bigint)
RETURNS TABLE (o_status int, o_term bigint, o_holder text, o_incarnation text,
               o_ttl_ms bigint, o_renew_interval_ms bigint, o_retry_interval_ms bigint)
LANGUAGE sql AS $$
    SELECT * FROM {s}.renew(p_group, p_id, p_inc, p_term, p_ttl, p_candidacy,
                            {DEFAULT_PRIORITY}, NULL)
$$;

-- Release a lease to a named successor (handover.lua): 1 released, 0 not
-- this incarnation's lease under this term, -1 the successor is not a live
-- member, -2 it campaigns with priority 0 (the lease kept in both).
CREATE FUNCTION {s}.hand_over(p_group text, p_id text, p_inc text, p_term bigint,
                              p_successor text, p_window bigint)
RETURNS int LANGUAGE plpgsql AS $$
DECLARE
    g {s}.groups%ROWTYPE;
    v_now bigint;
    v_priority int;
BEGIN
    SELECT * INTO g FROM {s}.groups WHERE name = p_group FOR UPDATE;
    v_now := {s}.now_ms();
    IF NOT FOUND OR g.holder IS DISTINCT FROM p_id OR g.incarnation IS DISTINCT FROM p_inc
       OR g.lease_term IS DISTINCT FROM p_term OR g.expires_ms <= v_now THEN
        RETURN 0;
    END IF;
    SELECT priority INTO v_priority FROM {s}.members
        WHERE grp = p_group AND node = p_successor AND until_ms > v_now;
    IF NOT FOUND THEN RETURN -1; END IF;
    IF v_priority <= 0 THEN RETURN -2; END IF;
    UPDATE {s}.groups SET holder = NULL, incarnation = NULL, expires_ms = NULL,
        successor = p_successor, successor_until_ms = v_now + p_window, vacant_ms = NULL
        WHERE name = p_group;
    -- The successor is named, so it claims even while it abstains.
    PERFORM pg_notify('{c}.release', p_group || ' ' || p_successor);
    RETURN 1;
END $$;
