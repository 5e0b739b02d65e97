-- Filter tables stored once per subscription snapshot (issue #42, docs/ROUTING.md, "How the
-- ingest decides").
--
-- The ingest statement used to receive a project's filters as text and parse each of them,
-- every statement: with 100 filtered endpoints that parse was the largest part of what the
-- filters cost (~80 µs a statement, docs/BENCHMARKS.md, "Payload filters"). A `jsonpath`
-- value is stored parsed, so a snapshot's filters (and its routes: endpoint, subscription,
-- ordered) are kept here under the SHA-256 of their content, which the ingest computes
-- (ingest/src/plan/filtered.rs, `Seal`), and a statement names them by that digest. Content
-- addressed: a row never changes, any process that computes the same tables finds the same
-- row, and reading one is always right.
--
-- Bounded: a statement that stores a new row first deletes its project's rows that no
-- statement has named with their texts for an hour. A statement that names a row with its
-- texts (each process's first statement per sender-cache snapshot, about once a second) marks
-- the row used at most every ten minutes, without waiting for a lock, so a row in use is never
-- that old. A statement that names a row without its texts and finds none (deleted all the
-- same, or a database restored without it) fails with SQLSTATE RH001 and writes nothing; the
-- ingest then sends the texts (group_commit.rs, `insert_or_find`).
--
-- Expand only: a new table, and railhook_ingest() with five more arguments that default to
-- NULL, so the previous release's 23-argument call still finds it (below).
CREATE TABLE filter_tables (
    digest bytea PRIMARY KEY,
    project_id text NOT NULL REFERENCES projects (id),
    paths jsonpath[] NOT NULL,
    route_endpoints text[] NOT NULL,
    route_subscriptions text[] NOT NULL,
    route_ordered boolean[] NOT NULL,
    used_at timestamptz NOT NULL DEFAULT now(),
    CHECK (octet_length(digest) = 32),
    CHECK (cardinality(route_endpoints) = cardinality(route_subscriptions)
           AND cardinality(route_endpoints) = cardinality(route_ordered))
);
CREATE INDEX filter_tables_project_idx ON filter_tables (project_id, used_at);
-- Read whole on every statement that names the row: uncompressed, so reading it is a copy
-- (measured: 4 µs for 100 filters, against ~80 µs to parse them).
ALTER TABLE filter_tables
    ALTER COLUMN paths SET STORAGE EXTERNAL,
    ALTER COLUMN route_endpoints SET STORAGE EXTERNAL,
    ALTER COLUMN route_subscriptions SET STORAGE EXTERNAL;

-- The 23-argument function of migration 20261206000027 gives way to this one, whose five
-- new arguments default to NULL: the previous release's ingest, during a rolling deploy,
-- calls it with 23 and gets the same statement without stored tables. (Both at once would
-- make a 23-argument call ambiguous; drop and create are one transaction.)
DROP FUNCTION railhook_ingest(
    text, text[], text[], text[], text[], text[], text[], text[], text[], boolean[], integer,
    text[], text[], text[], text[], text[], text[], text[], text[], boolean[], integer[],
    integer[], integer[]);

-- The ingest statement with stored filter tables. As the 23-argument one of migration
-- 20261206000027, plus:
--   p_tables            the digest of the snapshot's tables (NULL: none; the candidates then
--                       number only p_filters and p_route_*, as before);
--   p_table_filters, p_table_endpoints, p_table_subscriptions, p_table_ordered
--                       the tables' texts, or NULL when the ingest knows the row exists.
-- With a digest, a candidate's filter and route number the stored tables first and then
-- p_filters and p_route_* (what the snapshot's tables lack: filters joined for an endpoint
-- two subscriptions match, or another snapshot's entries in the same statement).
CREATE FUNCTION railhook_ingest(
    p_project text,
    p_ids text[], p_types text[], p_payloads text[], p_keys text[],
    p_delivery_ids text[], p_delivery_events text[], p_delivery_endpoints text[],
    p_delivery_subscriptions text[], p_delivery_ordered boolean[],
    p_window_hours integer,
    p_traceparents text[], p_tracestates text[],
    p_applications text[], p_channels text[], p_event_uids text[],
    p_filters text[],
    p_route_endpoints text[], p_route_subscriptions text[], p_route_ordered boolean[],
    p_candidate_events integer[], p_candidate_filters integer[], p_candidate_routes integer[],
    p_tables bytea DEFAULT NULL,
    p_table_filters text[] DEFAULT NULL, p_table_endpoints text[] DEFAULT NULL,
    p_table_subscriptions text[] DEFAULT NULL, p_table_ordered boolean[] DEFAULT NULL
) RETURNS TABLE (id text, created_at timestamptz, passed integer[])
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    -- Each filter parsed (or read parsed) once, however many candidates use it, and each
    -- payload, into arrays the candidates index by number: no join and no hash table per
    -- candidate (measured: a candidate costs about half a microsecond beside its `@@`).
    v_paths jsonpath[];
    v_payloads jsonb[];
    v_endpoints text[];
    v_subscriptions text[];
    v_ordered boolean[];
BEGIN
    -- The per-key lock first, then the insert with a fresh snapshot: see migration
    -- 20261204000011 for why the order matters.
    PERFORM pg_advisory_xact_lock(k)
    FROM (SELECT DISTINCT hashtextextended(p_project || '/' || key, 0) AS k
          FROM unnest(p_keys) AS key WHERE key IS NOT NULL ORDER BY 1) AS ordered_keys;

    IF p_tables IS NOT NULL THEN
        SELECT t.paths, t.route_endpoints, t.route_subscriptions, t.route_ordered
        INTO v_paths, v_endpoints, v_subscriptions, v_ordered
        FROM filter_tables t
        WHERE t.digest = p_tables AND t.project_id = p_project;
        IF NOT FOUND THEN
            IF p_table_filters IS NULL THEN
                RAISE EXCEPTION 'filter tables not stored' USING ERRCODE = 'RH001';
            END IF;
            v_paths := p_table_filters::jsonpath[];
            v_endpoints := p_table_endpoints;
            v_subscriptions := p_table_subscriptions;
            v_ordered := p_table_ordered;
            DELETE FROM filter_tables t
            WHERE t.project_id = p_project AND t.used_at < now() - interval '1 hour';
            INSERT INTO filter_tables (digest, project_id, paths, route_endpoints,
                                       route_subscriptions, route_ordered)
            VALUES (p_tables, p_project, v_paths, v_endpoints, v_subscriptions, v_ordered)
            ON CONFLICT (digest) DO NOTHING;
        ELSIF p_table_filters IS NOT NULL THEN
            -- Named with its texts: in use. Marked at most every ten minutes, and skipped
            -- if another statement is marking it now.
            UPDATE filter_tables t SET used_at = now()
            WHERE t.digest = (SELECT u.digest FROM filter_tables u
                              WHERE u.digest = p_tables
                                AND u.used_at < now() - interval '10 minutes'
                              FOR UPDATE SKIP LOCKED);
        END IF;
        IF cardinality(p_filters) > 0 THEN
            v_paths := v_paths || p_filters::jsonpath[];
        END IF;
        IF cardinality(p_route_endpoints) > 0 THEN
            v_endpoints := v_endpoints || p_route_endpoints;
            v_subscriptions := v_subscriptions || p_route_subscriptions;
            v_ordered := v_ordered || p_route_ordered;
        END IF;
    ELSIF cardinality(p_filters) > 0 THEN
        -- Casts, not queries: plpgsql evaluates them without starting an executor.
        v_paths := p_filters::jsonpath[];
        v_endpoints := p_route_endpoints;
        v_subscriptions := p_route_subscriptions;
        v_ordered := p_route_ordered;
    END IF;
    IF cardinality(p_candidate_events) > 0 THEN
        v_payloads := p_payloads::jsonb[];
    END IF;

    RETURN QUERY
    WITH ev AS (
        INSERT INTO events (id, project_id, event_type, payload, idempotency_key,
                            traceparent, tracestate, application_id, channels, event_uid)
        SELECT x.id, p_project, x.event_type, x.payload::jsonb, x.key, x.tp, x.ts,
               x.app, string_to_array(x.ch, ','), x.uid
        FROM (SELECT u.*, row_number() OVER (PARTITION BY u.key ORDER BY u.n) AS nth
              FROM unnest(p_ids, p_types, p_payloads, p_keys, p_traceparents, p_tracestates,
                          p_applications, p_channels, p_event_uids)
                   WITH ORDINALITY AS u(id, event_type, payload, key, tp, ts, app, ch, uid, n)) AS x
        WHERE x.key IS NULL
           OR (x.nth = 1 AND NOT EXISTS (
                 SELECT 1 FROM events e
                 WHERE e.project_id = p_project AND e.idempotency_key = x.key
                   AND e.id >= railhook_ulid_floor('evt_', now() - make_interval(hours => p_window_hours))))
        ORDER BY x.n
        RETURNING events.id, events.created_at, events.traceparent
    ), inserted AS MATERIALIZED (
        -- The inserted Events by position, for the candidates to find theirs.
        SELECT u.n, ev.id
        FROM unnest(p_ids) WITH ORDINALITY AS u(id, n) JOIN ev ON ev.id = u.id
    ), held AS MATERIALIZED (
        -- The candidates whose filter holds (whether their Event was inserted is asked of
        -- these few only, below). A series and subscripts, not `unnest` of the three
        -- arrays, which materializes each (measured: 20 % slower for 400 or 10,000).
        SELECT c.n, p_candidate_events[c.n] AS event, p_candidate_routes[c.n] AS route
        FROM generate_series(1, cardinality(p_candidate_events)) AS c(n)
        WHERE v_payloads[p_candidate_events[c.n]] @@ v_paths[p_candidate_filters[c.n]]
    ), passed AS MATERIALIZED (
        SELECT h.n, e.id AS event_id,
               railhook_filtered_delivery_id(e.id, h.n::integer) AS delivery_id,
               v_endpoints[h.route] AS endpoint_id, v_subscriptions[h.route] AS subscription_id,
               v_ordered[h.route] AS ordered
        FROM held h JOIN inserted e ON e.n = h.event
    ), d AS (
        INSERT INTO deliveries (id, project_id, event_id, endpoint_id, subscription_id, ordered)
        SELECT x.id, p_project, x.event_id, x.endpoint_id, x.subscription_id, x.ordered
        FROM (SELECT u.id, u.event_id, u.endpoint_id, u.subscription_id, u.ordered, u.n
              FROM unnest(p_delivery_ids, p_delivery_events, p_delivery_endpoints,
                          p_delivery_subscriptions, p_delivery_ordered)
                   WITH ORDINALITY AS u(id, event_id, endpoint_id, subscription_id, ordered, n)
              JOIN ev ON ev.id = u.event_id
              UNION ALL
              SELECT p.delivery_id, p.event_id, p.endpoint_id, p.subscription_id, p.ordered,
                     p.n + 2147483648
              FROM passed p) AS x
        ORDER BY x.n
        RETURNING deliveries.id, deliveries.endpoint_id, deliveries.event_id
    ), announced AS (
        INSERT INTO outbox (delivery_id, endpoint_id, project_id, reason, traceparent)
        SELECT d.id, d.endpoint_id, p_project, 'CREATED', ev.traceparent
        FROM d JOIN ev ON ev.id = d.event_id ORDER BY d.id
    ), kept AS (
        SELECT p.event_id, array_agg(p.n::integer ORDER BY p.n) AS ns
        FROM passed p GROUP BY p.event_id
    )
    SELECT ev.id, ev.created_at, k.ns
    FROM ev LEFT JOIN kept k ON k.event_id = ev.id;
END $$;
