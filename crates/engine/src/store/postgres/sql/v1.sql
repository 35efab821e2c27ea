-- Schema version 1 of the PostgreSQL store, run by schema.rs in one
-- transaction under an advisory lock. Placeholders: {s} the quoted schema,
-- {c} the prefix of the notification channels (a string literal's
-- content), and the constants of term.rs and config.rs in capitals.
--
-- Times are milliseconds since 1970 on the database's clock, taken with
-- clock_timestamp() (now() is frozen at the start of a transaction) after
-- the row locks a decision needs, as Redis's TIME is taken inside a script.
-- Every table is LOGGED: an unlogged table is empty after a crash and
-- absent on a standby, which would hand out terms again.

-- The store as a whole: its birth and term epoch (the history rule of
-- term.rs), and the history (server, timeline, start) it was last used on.
CREATE TABLE {s}.store (
    id int PRIMARY KEY CHECK (id = 1),
    born_ms bigint NOT NULL DEFAULT -1,
    epoch bigint NOT NULL DEFAULT -1,
    history text
);
INSERT INTO {s}.store (id) VALUES (1);

-- One row per group: the term counter, the lease, the adopted timings.
-- Updated in place at every renewal: room on the page for HOT updates.
CREATE TABLE {s}.groups (
    name text PRIMARY KEY,
    counter bigint NOT NULL DEFAULT 0,
    holder text,
    incarnation text,
    lease_term bigint,
    expires_ms bigint,
    ttl_ms bigint,
    renew_interval_ms bigint,
    retry_interval_ms bigint
) WITH (fillfactor = 50);

-- Candidacies: who campaigns for which group, until when.
CREATE TABLE {s}.members (
    grp text NOT NULL,
    node text NOT NULL,
    until_ms bigint NOT NULL,
    PRIMARY KEY (grp, node)
) WITH (fillfactor = 50);

-- The node registry. Its rows are the registrations only: publishers and
-- acks never lock them, and the few that append while holding one
-- (register's recovery marker, subscribe's retained copies, the latter
-- KEY SHARE only) do not hold up a heartbeat behind a busy inbox.
CREATE TABLE {s}.nodes (
    id text PRIMARY KEY,
    incarnation text NOT NULL,
    lease_until_ms bigint NOT NULL,
    registered_at_ms bigint NOT NULL,
    heartbeat_at_ms bigint NOT NULL,
    fields jsonb NOT NULL DEFAULT '{}',
    inbox_max bigint NOT NULL DEFAULT {DEFAULT_INBOX}
);
CREATE INDEX nodes_lease_until ON {s}.nodes (lease_until_ms);

-- A node's two queues (0: its engine's commands, 1: its inbox) as those
-- who append see them: the entries put in and not dropped, and the inbox
-- entries dropped. The row's lock orders everything that appends to the
-- node's queues (entries numbered under it commit in number order), and
-- removing the node takes it before deleting the entries.
CREATE TABLE {s}.queues (
    node text PRIMARY KEY,
    commands_len bigint NOT NULL DEFAULT 0,
    inbox_len bigint NOT NULL DEFAULT 0,
    dropped bigint NOT NULL DEFAULT 0
) WITH (fillfactor = 50);

-- What the node's reader has taken from each queue. Only acks write it,
-- so an ack never waits for a publisher: a queue holds its queues.*_len
-- minus these. These counts only grow, so a publisher that reads them
-- without a lock counts a queue long, never short; only when that count
-- says full does it lock this row (FOR SHARE) and count again, exactly.
-- dropped_after_read: entries a publisher dropped after the reader had
-- taken them (counted in queues.dropped, though the node has them); the
-- node's drops are queues.dropped minus these.
CREATE TABLE {s}.takes (
    node text PRIMARY KEY,
    commands bigint NOT NULL DEFAULT 0,
    inbox bigint NOT NULL DEFAULT 0,
    dropped_after_read bigint NOT NULL DEFAULT 0
) WITH (fillfactor = 50);

CREATE TABLE {s}.subscriptions (
    node text NOT NULL,
    pattern text NOT NULL,
    is_pattern boolean NOT NULL,
    PRIMARY KEY (node, pattern)
);
CREATE INDEX subscriptions_pattern ON {s}.subscriptions (pattern);
CREATE INDEX subscriptions_patterns ON {s}.subscriptions (pattern) WHERE is_pattern;

-- Both queues of every node. A queue: rows come and go all the time.
CREATE TABLE {s}.inbox (
    node text NOT NULL,
    queue smallint NOT NULL,
    seq bigint NOT NULL,
    kind text NOT NULL,
    msg_id bigint NOT NULL DEFAULT 0,
    topic text NOT NULL DEFAULT '',
    sender text NOT NULL DEFAULT '',
    payload bytea NOT NULL DEFAULT '',
    retained boolean NOT NULL DEFAULT false,
    PRIMARY KEY (node, queue, seq)
) WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_cost_delay = 0);

CREATE TABLE {s}.retained (
    topic text PRIMARY KEY,
    msg_id bigint NOT NULL,
    sender text NOT NULL,
    payload bytea NOT NULL,
    expires_ms bigint
);
-- The sweep removes the expired ones (Redis's keys expire by themselves).
CREATE INDEX retained_expiry ON {s}.retained (expires_ms) WHERE expires_ms IS NOT NULL;

-- Message ids: only ever grow (a sequence never hands a value out twice).
CREATE SEQUENCE {s}.msgseq;
-- Entry numbers, the inbox cursors: one sequence for every queue, so that
-- a node swept and registered again numbers its entries after every one
-- it ever had, as a new Redis stream's time-based ids do, and a reader's
-- cursor from before still reads them.
CREATE SEQUENCE {s}.entryseq;

CREATE FUNCTION {s}.now_ms() RETURNS bigint LANGUAGE sql VOLATILE AS
$$ SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint $$;

-- The term rules of term.rs (and terms.lua): the clock's epoch at ms, the
-- term after base, and how long a term must wait before it may be granted.
CREATE FUNCTION {s}.epoch_at(ms bigint) RETURNS bigint LANGUAGE sql IMMUTABLE AS
$$ SELECT greatest(0, floor((ms - {ANCHOR})::numeric / {EPOCH_MS}))::bigint $$;

CREATE FUNCTION {s}.next_term(base bigint) RETURNS bigint LANGUAGE sql IMMUTABLE AS
$$ SELECT CASE WHEN (base + 1) % {SPAN} = 0 THEN base + 2 ELSE base + 1 END $$;

CREATE FUNCTION {s}.epoch_wait(term bigint, now bigint) RETURNS bigint LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    e bigint := term / {SPAN};
    start bigint;
BEGIN
    IF e = 0 THEN RETURN 0; END IF;
    start := {ANCHOR} + e * {EPOCH_MS};
    IF start > now + {HOLD} THEN RETURN 0; END IF;
    RETURN greatest(0, start + {HOLD} - now);
END $$;

-- Claim a group's lease: claim.lua's rules, on the group's row lock (taken
-- first: concurrent claims of one group run one after the other, each
-- seeing the one before). The store row is locked only when the store's
-- state must change (a first claim, a new history, a term from a lost
-- history), so claims of different groups do not queue on it.
-- p_history is the history the caller's connection read when it was made
-- (a restart or a failover ends every connection): the system identifier,
-- timeline and start; the oid of meta is read here, as a schema restored
-- in place changes it under open connections. p_started_ms is the
-- server's start, the earliest birth the store may record.
CREATE FUNCTION {s}.claim(p_group text, p_id text, p_inc text, p_ttl bigint, p_seen bigint,
                          p_candidacy bigint, p_history text, p_started_ms bigint)
RETURNS TABLE (o_won boolean, o_term bigint, o_fresh boolean, o_wait_ms bigint, o_holder text,
               o_ttl_ms bigint, o_renew_interval_ms bigint, o_retry_interval_ms bigint)
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
    INSERT INTO {s}.members (grp, node, until_ms) VALUES (p_group, p_id, v_now + p_candidacy)
        ON CONFLICT (grp, node) DO UPDATE SET until_ms = excluded.until_ms;
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
        v_term := {s}.next_term(greatest(v_stored, v_epoch * {SPAN}));
        v_wait := {s}.epoch_wait(v_term, v_now);
        IF v_wait = 0 THEN
            UPDATE {s}.groups SET counter = v_term, holder = p_id, incarnation = p_inc,
                lease_term = v_term, expires_ms = v_now + p_ttl
                WHERE name = p_group;
            o_won := true; o_term := v_term; o_fresh := true; o_wait_ms := 0; o_holder := p_id;
            RETURN NEXT; RETURN;
        END IF;
        o_wait_ms := v_wait;
    END IF;
    IF v_stored <> g.counter THEN
        UPDATE {s}.groups SET counter = v_stored WHERE name = p_group;
    END IF;
    RETURN NEXT;
END $$;

-- Renew a held lease (renew.lua): status 1 renewed (with the lease's term
-- afterwards, moved above a restored counter when it may be), 0 the lease
-- is gone, -1 another holder.
CREATE FUNCTION {s}.renew(p_group text, p_id text, p_inc text, p_term bigint, p_ttl bigint,
                          p_candidacy bigint)
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
    INSERT INTO {s}.members (grp, node, until_ms) VALUES (p_group, p_id, v_now + p_candidacy)
        ON CONFLICT (grp, node) DO UPDATE SET until_ms = excluded.until_ms;
    -- The leader keeps the member list tidy: candidacies that lapsed go.
    DELETE FROM {s}.members WHERE grp = p_group AND until_ms <= v_now;
    o_status := 1;
    o_ttl_ms := g.ttl_ms;
    o_renew_interval_ms := g.renew_interval_ms;
    o_retry_interval_ms := g.retry_interval_ms;
    RETURN NEXT;
END $$;

-- Release a lease this incarnation holds under this term, and wake the
-- group's followers (the notification goes out at commit).
CREATE FUNCTION {s}.release(p_group text, p_id text, p_inc text, p_term bigint, p_withdraw boolean)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_released boolean;
BEGIN
    -- The group's row first, as claim and renew take it.
    UPDATE {s}.groups SET holder = NULL, incarnation = NULL, expires_ms = NULL
        WHERE name = p_group AND holder = p_id AND incarnation = p_inc AND lease_term = p_term
          AND expires_ms > {s}.now_ms();
    v_released := FOUND;
    IF p_withdraw THEN
        DELETE FROM {s}.members WHERE grp = p_group AND node = p_id;
    END IF;
    IF v_released THEN
        PERFORM pg_notify('{c}.release', p_group);
    END IF;
    RETURN v_released;
END $$;

CREATE FUNCTION {s}.group_state(p_group text)
RETURNS TABLE (o_holder text, o_term bigint, o_pttl bigint, o_now bigint, o_members text[],
               o_until bigint[])
LANGUAGE plpgsql AS $$
DECLARE
    g {s}.groups%ROWTYPE;
BEGIN
    o_now := {s}.now_ms();
    SELECT * INTO g FROM {s}.groups WHERE name = p_group;
    o_term := coalesce(g.counter, 0);
    IF g.holder IS NOT NULL AND g.expires_ms > o_now THEN
        o_holder := g.holder;
        o_pttl := g.expires_ms - o_now;
    END IF;
    SELECT coalesce(array_agg(node ORDER BY until_ms, node), '{}'),
           coalesce(array_agg(until_ms ORDER BY until_ms, node), '{}')
        INTO o_members, o_until
        FROM {s}.members WHERE grp = p_group AND until_ms > o_now;
    RETURN NEXT;
END $$;

-- Topic matching (topics.lua): segments split on '.', '*' one segment,
-- '>' one or more trailing segments.
CREATE FUNCTION {s}.matches(pattern text, topic text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    p text[] := string_to_array(pattern, '.');
    t text[] := string_to_array(topic, '.');
    np int := coalesce(array_length(p, 1), 0);
    nt int := coalesce(array_length(t, 1), 0);
BEGIN
    FOR i IN 1 .. np LOOP
        IF p[i] = '>' THEN RETURN i <= nt; END IF;
        IF i > nt THEN RETURN false; END IF;
        IF p[i] <> '*' AND p[i] <> t[i] THEN RETURN false; END IF;
    END LOOP;
    RETURN np = nt;
END $$;

-- Append one entry to a node's inbox (queue 1), dropping (and counting)
-- its oldest entries past p_max (NULL: none dropped, as for the recovery
-- marker). The update of the node's queues row takes its lock before the
-- entry is numbered. For the few entries that are not published (the
-- recovery marker, retained copies for a new subscription); publish
-- appends its batch in bulk.
CREATE FUNCTION {s}.deliver(p_node text, p_kind text, p_msg_id bigint, p_topic text,
                            p_sender text, p_payload bytea, p_retained boolean, p_max bigint)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_len bigint;
    v_taken bigint;
    v_over bigint;
BEGIN
    UPDATE {s}.queues SET inbox_len = inbox_len + 1 WHERE node = p_node RETURNING inbox_len INTO v_len;
    IF NOT FOUND THEN RETURN; END IF;
    INSERT INTO {s}.inbox (node, queue, seq, kind, msg_id, topic, sender, payload, retained)
        VALUES (p_node, 1, nextval('{s}.entryseq'), p_kind, p_msg_id, p_topic, p_sender,
                p_payload, p_retained);
    IF p_max IS NULL THEN RETURN; END IF;
    SELECT inbox INTO v_taken FROM {s}.takes WHERE node = p_node;
    IF v_len - coalesce(v_taken, 0) <= greatest(p_max, 1) THEN RETURN; END IF;
    SELECT inbox INTO v_taken FROM {s}.takes WHERE node = p_node FOR SHARE;
    PERFORM {s}.trim_inbox(p_node, v_len - coalesce(v_taken, 0) - greatest(p_max, 1));
END $$;

-- Drop a node's p_over oldest inbox entries and count them. The caller
-- holds the node's queues row and, locked FOR SHARE, its takes row: no
-- ack runs meanwhile, so the count it read is exact.
CREATE FUNCTION {s}.trim_inbox(p_node text, p_over bigint) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_gone bigint;
BEGIN
    IF p_over <= 0 THEN RETURN; END IF;
    WITH gone AS (
        DELETE FROM {s}.inbox WHERE node = p_node AND queue = 1 AND seq IN (
            SELECT seq FROM {s}.inbox WHERE node = p_node AND queue = 1 ORDER BY seq LIMIT p_over)
        RETURNING 1)
    SELECT count(*) INTO v_gone FROM gone;
    UPDATE {s}.queues SET inbox_len = inbox_len - v_gone, dropped = dropped + v_gone
        WHERE node = p_node;
END $$;

-- Register (or re-register) a node incarnation (register.lua). Returns
-- the previous incarnation ('' when none). On recovery the subscriptions
-- are restored and a marker goes into the inbox.
CREATE FUNCTION {s}.register(p_id text, p_inc text, p_lease bigint, p_recovery boolean,
                             p_subs text[], p_fields jsonb)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_now bigint;
    v_prev text;
BEGIN
    SELECT incarnation INTO v_prev FROM {s}.nodes WHERE id = p_id FOR UPDATE;
    v_now := {s}.now_ms();
    INSERT INTO {s}.nodes AS n (id, incarnation, lease_until_ms, registered_at_ms, heartbeat_at_ms,
                               fields, inbox_max)
        VALUES (p_id, p_inc, v_now + p_lease, v_now, v_now, p_fields - 'dropped',
                coalesce((p_fields ->> 'inbox_max')::bigint, {DEFAULT_INBOX}))
        ON CONFLICT (id) DO UPDATE SET
            incarnation = excluded.incarnation,
            lease_until_ms = excluded.lease_until_ms,
            registered_at_ms = excluded.registered_at_ms,
            heartbeat_at_ms = excluded.heartbeat_at_ms,
            fields = n.fields || excluded.fields,
            inbox_max = coalesce((p_fields ->> 'inbox_max')::bigint, n.inbox_max);
    INSERT INTO {s}.queues AS q (node, dropped)
        VALUES (p_id, coalesce((p_fields ->> 'dropped')::bigint, 0))
        ON CONFLICT (node) DO UPDATE SET
            dropped = coalesce((p_fields ->> 'dropped')::bigint, q.dropped);
    INSERT INTO {s}.takes AS t (node) VALUES (p_id)
        ON CONFLICT (node) DO UPDATE SET dropped_after_read = 0 WHERE p_fields ? 'dropped';
    INSERT INTO {s}.subscriptions (node, pattern, is_pattern)
        SELECT p_id, sub, sub ~ '[*>]' FROM unnest(p_subs) AS sub
        ON CONFLICT DO NOTHING;
    IF p_recovery THEN
        PERFORM {s}.deliver(p_id, 'recovered', 0, '', '', '', false, NULL);
        PERFORM pg_notify('{c}.inbox', p_id);
    END IF;
    RETURN coalesce(v_prev, '');
END $$;

-- Extend a node's lease: 1 extended, 0 expired or swept (register again),
-- -1 another incarnation owns the id (o_incarnation).
CREATE FUNCTION {s}.heartbeat(p_id text, p_inc text, p_lease bigint)
RETURNS TABLE (o_status int, o_incarnation text) LANGUAGE plpgsql AS $$
DECLARE
    v_inc text;
    v_until bigint;
    v_now bigint;
BEGIN
    -- NO KEY UPDATE: a subscribe holding the row (KEY SHARE) while it waits
    -- for the node's queues does not hold up the heartbeat; a sweep's or
    -- a register's FOR UPDATE still orders them.
    SELECT incarnation, lease_until_ms INTO v_inc, v_until FROM {s}.nodes WHERE id = p_id
        FOR NO KEY UPDATE;
    IF FOUND AND v_inc <> p_inc THEN
        o_status := -1; o_incarnation := v_inc; RETURN NEXT; RETURN;
    END IF;
    v_now := {s}.now_ms();
    IF NOT FOUND OR v_until <= v_now THEN
        o_status := 0; RETURN NEXT; RETURN;
    END IF;
    UPDATE {s}.nodes SET lease_until_ms = v_now + p_lease, heartbeat_at_ms = v_now WHERE id = p_id;
    o_status := 1;
    RETURN NEXT;
END $$;

-- A node and everything it owns (remove_node.lua): its candidacies in the
-- groups it listed, its subscriptions and both queues.
CREATE FUNCTION {s}.remove_node(p_id text) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_groups text;
BEGIN
    SELECT fields ->> 'groups' INTO v_groups FROM {s}.nodes WHERE id = p_id;
    IF v_groups IS NOT NULL AND v_groups <> '' THEN
        DELETE FROM {s}.members WHERE node = p_id AND grp = ANY (string_to_array(v_groups, ','));
    END IF;
    DELETE FROM {s}.subscriptions WHERE node = p_id;
    -- The queues row first: it waits for the appends in flight, and no
    -- append comes after it; then the reader's row (an ack in flight).
    DELETE FROM {s}.queues WHERE node = p_id;
    DELETE FROM {s}.takes WHERE node = p_id;
    DELETE FROM {s}.inbox WHERE node = p_id;
    DELETE FROM {s}.nodes WHERE id = p_id;
END $$;

-- Remove at most p_batch expired nodes. Rows another sweeper holds are
-- skipped, not waited for.
CREATE FUNCTION {s}.sweep(p_batch int)
RETURNS TABLE (o_swept text[], o_now bigint, o_next bigint) LANGUAGE plpgsql AS $$
DECLARE
    v_id text;
BEGIN
    o_now := {s}.now_ms();
    o_swept := '{}';
    -- The earliest expired, removed in id order: each removal holds the
    -- node's queues row to the end, and publishers lock those rows in id
    -- order too (in expiry order, a sweep and a publisher to two of the
    -- nodes could each hold one the other waits for).
    FOR v_id IN
        SELECT id FROM (
            SELECT id FROM {s}.nodes WHERE lease_until_ms <= o_now
                ORDER BY lease_until_ms LIMIT p_batch FOR UPDATE SKIP LOCKED) AS expired
            ORDER BY id
    LOOP
        PERFORM {s}.remove_node(v_id);
        o_swept := o_swept || v_id;
    END LOOP;
    -- Expired retained messages, a batch a pass (readers skip them already).
    DELETE FROM {s}.retained WHERE topic IN (
        SELECT topic FROM {s}.retained WHERE expires_ms <= o_now
            LIMIT p_batch FOR UPDATE SKIP LOCKED);
    SELECT min(lease_until_ms) INTO o_next FROM {s}.nodes;
    RETURN NEXT;
END $$;

CREATE FUNCTION {s}.unregister(p_id text, p_inc text) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_inc text;
BEGIN
    SELECT incarnation INTO v_inc FROM {s}.nodes WHERE id = p_id FOR UPDATE;
    IF FOUND AND v_inc <> p_inc THEN RETURN false; END IF;
    PERFORM {s}.remove_node(p_id);
    RETURN true;
END $$;

-- Subscribe a node (subscribe.lua); a new subscription first gets the
-- retained messages it covers. Returns how many were delivered.
CREATE FUNCTION {s}.subscribe(p_id text, p_sub text, p_max bigint)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_pattern boolean := p_sub ~ '[*>]';
    v_registered boolean;
    v_now bigint;
    v_count bigint := 0;
    r record;
BEGIN
    -- Publishers of retained messages hold this lock shared from before
    -- they read who subscribes until they commit: taken here, a publish
    -- either sees this subscription or has committed its retained copy
    -- before the read below (without it, each could miss the other). It
    -- comes before any row lock, as in publish.
    PERFORM pg_advisory_xact_lock(hashtextextended('{c}.retained', 0));
    -- The node's row (KEY SHARE: it stays, and a heartbeat, NO KEY UPDATE,
    -- may still update it), then, through deliver, its queues row, in the
    -- order register and remove_node take them.
    PERFORM 1 FROM {s}.nodes WHERE id = p_id FOR KEY SHARE;
    v_registered := FOUND;
    INSERT INTO {s}.subscriptions (node, pattern, is_pattern) VALUES (p_id, p_sub, v_pattern)
        ON CONFLICT DO NOTHING;
    IF NOT FOUND OR NOT v_registered THEN RETURN 0; END IF;
    v_now := {s}.now_ms();
    FOR r IN
        SELECT * FROM {s}.retained
            WHERE (expires_ms IS NULL OR expires_ms > v_now)
              AND (topic = p_sub OR (v_pattern AND {s}.matches(p_sub, topic)))
            ORDER BY topic
    LOOP
        PERFORM {s}.deliver(p_id, 'topic', r.msg_id, r.topic, r.sender, r.payload, true, p_max);
        v_count := v_count + 1;
    END LOOP;
    IF v_count > 0 THEN
        PERFORM pg_notify('{c}.inbox', p_id);
    END IF;
    RETURN v_count;
END $$;

-- Publish a batch from one sender, in order, in one transaction
-- (publish.lua). Per message: (id, nodes reached), or (-1, node) when
-- "refuse" met a full inbox, or (-2, node) when a direct target is not
-- live. The receivers' queues rows are locked in id order before anything
-- is written (publishers that locked them in message order could
-- deadlock). The decisions are made message by message on the counts held
-- here; the entries then go in with one statement, the queues past their
-- bounds are trimmed, and each inbox is notified once per batch: a batch
-- costs a few statements, not a few per message.
CREATE FUNCTION {s}.publish(p_sender text, p_modes text[], p_targets text[], p_payloads bytea[],
                            p_refuse boolean[], p_retain bigint[])
RETURNS TABLE (o_code bigint, o_node text) LANGUAGE plpgsql AS $$
DECLARE
    n int := coalesce(array_length(p_modes, 1), 0);
    v_now bigint;
    -- Each topic of the batch, once, and its subscribers in id order:
    -- t_all[t_from[k]:t_to[k]] for t_topics[k].
    t_topics text[] := '{}';
    t_from int[] := '{}';
    t_to int[] := '{}';
    t_all text[] := '{}';
    v_ids text[];
    v_every text[];
    k int;
    i int;
    -- The receivers, in id order, as the batch leaves them (r_exact: its
    -- takes row locked, the taken counts exact).
    r_id text[] := '{}';
    r_commands bigint[] := '{}';
    r_inbox bigint[] := '{}';
    r_live boolean[];
    r_stream boolean[];
    r_max bigint[];
    r_taken bigint[];
    r_taken_commands bigint[];
    r_exact boolean[];
    r_added int[];
    v_row record;
    v_taken bigint;
    v_taken_commands bigint;
    -- This message's live receivers (indexes into r_*).
    v_live int[];
    v_full text;
    v_id bigint;
    v_stream boolean;
    v_over bigint;
    -- The entries to append, one per message and receiver.
    e_node text[] := '{}';
    e_queue smallint[] := '{}';
    e_seq bigint[] := '{}';
    e_msg bigint[] := '{}';
    e_m int[] := '{}';
    v_kept_topics text[] := '{}';
    v_kept_ids bigint[] := '{}';
    v_kept_payloads bytea[] := '{}';
    v_kept_expiries bigint[] := '{}';
    v_retains boolean := false;
BEGIN
    FOR m IN 1 .. n LOOP
        IF p_retain[m] < -1 OR p_retain[m] > {MAX_RETAIN} THEN
            RAISE EXCEPTION 'retain ttl out of range: %', p_retain[m] USING ERRCODE = '22023';
        END IF;
        v_retains := v_retains OR (p_modes[m] = 'topic' AND p_retain[m] >= 0);
    END LOOP;
    -- A batch that retains holds off subscribes until it commits (see
    -- subscribe).
    IF v_retains THEN
        PERFORM pg_advisory_xact_lock_shared(hashtextextended('{c}.retained', 0));
    END IF;
    -- Pass 1: who each topic may reach (its own subscribers by index, and
    -- the patterns, few, matched one by one), and every receiver.
    v_every := '{}';
    FOR m IN 1 .. n LOOP
        IF p_modes[m] <> 'topic' THEN
            v_every := v_every || p_targets[m];
            CONTINUE;
        END IF;
        CONTINUE WHEN p_targets[m] = ANY (t_topics);
        SELECT coalesce(array_agg(node ORDER BY node), '{}') INTO v_ids FROM (
            SELECT node FROM {s}.subscriptions WHERE pattern = p_targets[m]
            UNION
            SELECT node FROM {s}.subscriptions
                WHERE is_pattern AND {s}.matches(pattern, p_targets[m])) AS t;
        t_topics := t_topics || p_targets[m];
        t_from := t_from || (cardinality(t_all) + 1);
        t_all := t_all || v_ids;
        t_to := t_to || cardinality(t_all);
    END LOOP;
    v_every := v_every || t_all;
    -- The receivers' queues rows, locked in id order; a node removed
    -- meanwhile has none and is no receiver.
    FOR v_row IN
        SELECT node, commands_len, inbox_len FROM {s}.queues
            WHERE node = ANY (v_every) ORDER BY node FOR UPDATE
    LOOP
        r_id := r_id || v_row.node;
        r_commands := r_commands || v_row.commands_len;
        r_inbox := r_inbox || v_row.inbox_len;
    END LOOP;
    v_now := {s}.now_ms();
    SELECT coalesce(array_agg(coalesce(nd.lease_until_ms > v_now, false) ORDER BY r.o), '{}'),
           coalesce(array_agg(coalesce(nd.fields ->> 'commands' = 'stream', false) ORDER BY r.o), '{}'),
           coalesce(array_agg(coalesce(nd.inbox_max, 1) ORDER BY r.o), '{}'),
           coalesce(array_agg(coalesce(tk.inbox, 0) ORDER BY r.o), '{}'),
           coalesce(array_agg(coalesce(tk.commands, 0) ORDER BY r.o), '{}')
        INTO r_live, r_stream, r_max, r_taken, r_taken_commands
        FROM unnest(r_id) WITH ORDINALITY AS r(id, o)
        LEFT JOIN {s}.nodes nd ON nd.id = r.id
        LEFT JOIN {s}.takes tk ON tk.node = r.id;
    r_exact := array_fill(false, ARRAY[cardinality(r_id)]);
    r_added := array_fill(0, ARRAY[cardinality(r_id)]);
    -- Pass 2: decide, message by message, on the counts held here.
    FOR m IN 1 .. n LOOP
        IF p_modes[m] = 'topic' THEN
            k := array_position(t_topics, p_targets[m]);
            v_ids := t_all[t_from[k]:t_to[k]];
        ELSE
            v_ids := ARRAY[p_targets[m]];
        END IF;
        v_live := '{}';
        FOR j IN 1 .. cardinality(v_ids) LOOP
            i := array_position(r_id, v_ids[j]);
            IF i IS NOT NULL AND r_live[i] THEN
                v_live := v_live || i;
            END IF;
        END LOOP;
        IF p_modes[m] <> 'topic' AND cardinality(v_live) = 0 THEN
            o_code := -2; o_node := p_targets[m]; RETURN NEXT; CONTINUE;
        END IF;
        v_stream := p_modes[m] = 'command' AND r_stream[v_live[1]];
        IF NOT v_stream AND p_refuse[m] THEN
            v_full := NULL;
            FOREACH i IN ARRAY v_live LOOP
                IF r_inbox[i] - r_taken[i] >= r_max[i] AND NOT r_exact[i] THEN
                    SELECT inbox, commands INTO v_taken, v_taken_commands
                        FROM {s}.takes WHERE node = r_id[i] FOR SHARE;
                    r_taken[i] := coalesce(v_taken, 0);
                    r_taken_commands[i] := coalesce(v_taken_commands, 0);
                    r_exact[i] := true;
                END IF;
                IF r_inbox[i] - r_taken[i] >= r_max[i] THEN
                    v_full := r_id[i];
                    EXIT;
                END IF;
            END LOOP;
            IF v_full IS NOT NULL THEN
                o_code := -1; o_node := v_full; RETURN NEXT; CONTINUE;
            END IF;
        END IF;
        v_id := nextval('{s}.msgseq');
        IF p_modes[m] = 'topic' AND p_retain[m] >= 0 THEN
            v_kept_topics := v_kept_topics || p_targets[m];
            v_kept_ids := v_kept_ids || v_id;
            v_kept_payloads := v_kept_payloads || p_payloads[m];
            v_kept_expiries := v_kept_expiries
                || CASE WHEN p_retain[m] > 0 THEN v_now + p_retain[m] END;
        END IF;
        FOREACH i IN ARRAY v_live LOOP
            e_node := e_node || r_id[i];
            e_queue := e_queue || (CASE WHEN v_stream THEN 0 ELSE 1 END)::smallint;
            e_seq := e_seq || nextval('{s}.entryseq');
            e_msg := e_msg || v_id;
            e_m := e_m || m;
            IF v_stream THEN
                r_commands[i] := r_commands[i] + 1;
            ELSE
                r_inbox[i] := r_inbox[i] + 1;
            END IF;
            r_added[i] := r_added[i] + 1;
        END LOOP;
        o_code := v_id; o_node := cardinality(v_live)::text; RETURN NEXT;
    END LOOP;
    INSERT INTO {s}.inbox (node, queue, seq, kind, msg_id, topic, sender, payload)
        SELECT e.node, e.queue, e.seq,
               CASE WHEN e.queue = 0 THEN 'command' ELSE p_modes[e.m] END, e.msg,
               CASE WHEN p_modes[e.m] = 'topic' THEN p_targets[e.m] ELSE '' END,
               p_sender, p_payloads[e.m]
            FROM unnest(e_node, e_queue, e_seq, e_msg, e_m) AS e(node, queue, seq, msg, m);
    -- The receivers' new counts, in one statement (a fan-out has many).
    UPDATE {s}.queues AS q SET inbox_len = c.inbox, commands_len = c.commands
        FROM unnest(r_id, r_inbox, r_commands, r_added) AS c(node, inbox, commands, added)
        WHERE q.node = c.node AND c.added > 0;
    -- The queues past their bounds, counted exactly, drop their oldest
    -- entries (the inbox's counted, the commands' newest {COMMANDS_MAX} kept).
    FOR i IN 1 .. cardinality(r_id) LOOP
        CONTINUE WHEN r_added[i] = 0
            OR (r_inbox[i] - r_taken[i] <= greatest(r_max[i], 1)
                AND r_commands[i] - r_taken_commands[i] <= {COMMANDS_MAX});
        IF NOT r_exact[i] THEN
            SELECT inbox, commands INTO v_taken, v_taken_commands
                FROM {s}.takes WHERE node = r_id[i] FOR SHARE;
            r_taken[i] := coalesce(v_taken, 0);
            r_taken_commands[i] := coalesce(v_taken_commands, 0);
            r_exact[i] := true;
        END IF;
        IF r_inbox[i] - r_taken[i] > greatest(r_max[i], 1) THEN
            PERFORM {s}.trim_inbox(r_id[i], r_inbox[i] - r_taken[i] - greatest(r_max[i], 1));
        END IF;
        v_over := r_commands[i] - r_taken_commands[i] - {COMMANDS_MAX};
        IF v_over > 0 THEN
            WITH gone AS (
                DELETE FROM {s}.inbox WHERE node = r_id[i] AND queue = 0 AND seq IN (
                    SELECT seq FROM {s}.inbox WHERE node = r_id[i] AND queue = 0
                        ORDER BY seq LIMIT v_over)
                RETURNING 1)
            SELECT count(*) INTO v_over FROM gone;
            UPDATE {s}.queues SET commands_len = commands_len - v_over WHERE node = r_id[i];
        END IF;
    END LOOP;
    -- The retained copies, the newest per topic, written in topic order:
    -- two batches retaining the same topics in another order would
    -- otherwise each hold a row the other waits for.
    IF v_retains THEN
        INSERT INTO {s}.retained (topic, msg_id, sender, payload, expires_ms)
            SELECT DISTINCT ON (k.topic) k.topic, k.id, p_sender, k.payload, k.expires
                FROM unnest(v_kept_topics, v_kept_ids, v_kept_payloads, v_kept_expiries)
                    AS k(topic, id, payload, expires)
                ORDER BY k.topic, k.id DESC
            ON CONFLICT (topic) DO UPDATE SET msg_id = excluded.msg_id,
                sender = excluded.sender, payload = excluded.payload,
                expires_ms = excluded.expires_ms
            -- A publish that committed later with a lower id is older.
            WHERE {s}.retained.msg_id < excluded.msg_id;
    END IF;
    PERFORM pg_notify('{c}.inbox', x) FROM (SELECT DISTINCT unnest(e_node) AS x) d;
END $$;

-- The reader has taken every inbox entry up to p_seq, p_taken of them
-- since its last ack: they go. Those of them already gone a publisher
-- dropped after the reader took them; they come off the drop count.
-- Returns (backlog, dropped so far). Only the node's takes row is locked:
-- an ack never waits for a publisher, and one that counts a full queue
-- exactly waits for the ack.
CREATE FUNCTION {s}.ack_inbox(p_id text, p_seq bigint, p_taken bigint)
RETURNS TABLE (o_backlog bigint, o_dropped bigint) LANGUAGE plpgsql AS $$
DECLARE
    v_gone bigint;
BEGIN
    o_backlog := 0; o_dropped := 0;
    PERFORM 1 FROM {s}.takes WHERE node = p_id FOR UPDATE;
    IF NOT FOUND THEN RETURN NEXT; RETURN; END IF;
    WITH gone AS (
        DELETE FROM {s}.inbox WHERE node = p_id AND queue = 1 AND seq <= p_seq RETURNING 1)
    SELECT count(*) INTO v_gone FROM gone;
    UPDATE {s}.takes SET inbox = inbox + v_gone,
        dropped_after_read = dropped_after_read + greatest(p_taken - v_gone, 0)
        WHERE node = p_id;
    SELECT greatest(q.inbox_len - t.inbox, 0), greatest(q.dropped - t.dropped_after_read, 0)
        INTO o_backlog, o_dropped
        FROM {s}.queues q JOIN {s}.takes t ON t.node = q.node WHERE q.node = p_id;
    o_backlog := coalesce(o_backlog, 0); o_dropped := coalesce(o_dropped, 0);
    RETURN NEXT;
END $$;

CREATE FUNCTION {s}.ack_commands(p_id text, p_seq bigint) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_gone bigint;
BEGIN
    PERFORM 1 FROM {s}.takes WHERE node = p_id FOR UPDATE;
    IF NOT FOUND THEN RETURN; END IF;
    WITH gone AS (
        DELETE FROM {s}.inbox WHERE node = p_id AND queue = 0 AND seq <= p_seq RETURNING 1)
    SELECT count(*) INTO v_gone FROM gone;
    UPDATE {s}.takes SET commands = commands + v_gone WHERE node = p_id;
END $$;
