-- Payload filters and transformations (issue #42, docs/ROUTING.md).
--
-- A filter is a SQL/JSON path predicate, stored as the canonical text of its `jsonpath` (the
-- CHECK parses it, so no filter that would fail the ingest statement can be stored; text,
-- because the driver has no `jsonpath` type): on
-- an endpoint, it applies to every Event that endpoint's subscriptions match; on a
-- subscription, to the Events that subscription matches. The ingest statement evaluates it
-- on each Event's payload, so a Delivery exists exactly when the filter held for the payload
-- that was stored with it.
--
-- A transformation is JavaScript run by the worker right before an Attempt
-- (common/src/transformation.rs). Its last outcome is kept on the endpoint, written only when
-- it changes (the worker) or by the test route, so a hot endpoint's row is not rewritten per
-- Attempt. What a transformed Attempt sent is kept with the Attempt (`attempts.request`).
--
-- Expand only: nullable columns or a constant default (catalogue only, no rewrite), and a
-- new overload of railhook_ingest() (the 16-argument one stays for the previous release's
-- ingest during a rolling deploy; it plans no filters, as that release knew none).
ALTER TABLE endpoints
    ADD COLUMN filter text,
    ADD COLUMN transformation_code text,
    ADD COLUMN transformation_enabled boolean NOT NULL DEFAULT false,
    ADD COLUMN transformation_updated_at timestamptz,
    ADD COLUMN transformation_last jsonb;
ALTER TABLE subscriptions ADD COLUMN filter text;
-- The filters parse as `jsonpath`: added NOT VALID (no scan under the table's lock), then
-- validated.
ALTER TABLE endpoints ADD CONSTRAINT endpoints_filter_jsonpath
    CHECK (filter IS NULL OR filter::jsonpath IS NOT NULL) NOT VALID;
ALTER TABLE endpoints VALIDATE CONSTRAINT endpoints_filter_jsonpath;
ALTER TABLE subscriptions ADD CONSTRAINT subscriptions_filter_jsonpath
    CHECK (filter IS NULL OR filter::jsonpath IS NOT NULL) NOT VALID;
ALTER TABLE subscriptions VALIDATE CONSTRAINT subscriptions_filter_jsonpath;
ALTER TABLE attempts ADD COLUMN request jsonb;

-- The live subscriptions with their endpoint's scope, channels and filters.
CREATE OR REPLACE FUNCTION railhook_live_subscriptions(p_project text)
RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT coalesce((
        SELECT json_agg(json_build_object('id', s.id, 'endpoint_id', s.endpoint_id,
                                          'event_types', s.event_types, 'ordered', s.ordered,
                                          'application_id', e.application_id,
                                          'channels', e.channels,
                                          'endpoint_filter', e.filter,
                                          'filter', s.filter)
                        ORDER BY s.id)
        FROM subscriptions s JOIN endpoints e ON e.id = s.endpoint_id
        WHERE s.project_id = p_project AND s.deleted_at IS NULL
          AND e.deleted_at IS NULL AND e.enabled), '[]')::text
$$;

-- The id of the Delivery a filtered candidate writes: `dlv_`, the first 20 characters of its
-- Event's ULID (the 48-bit time and 50 random bits), and the candidate's 1-based position in
-- its statement in 6 base-32 digits. The ingest derives the same id (ingest/src/plan/
-- filtered.rs), so the statement answers with positions, not ids, and a declined candidate
-- costs no id anywhere. Unique: positions differ within a statement, and two statements'
-- Events share 20 characters only if their 50 random bits do. The time part is the Event's,
-- so the Delivery lands in its Event's day partition.
CREATE FUNCTION railhook_filtered_delivery_id(p_event_id text, p_n integer)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT 'dlv_' || substr(p_event_id, 5, 20)
        || substr('0123456789abcdefghjkmnpqrstvwxyz', (p_n >> 25 & 31) + 1, 1)
        || substr('0123456789abcdefghjkmnpqrstvwxyz', (p_n >> 20 & 31) + 1, 1)
        || substr('0123456789abcdefghjkmnpqrstvwxyz', (p_n >> 15 & 31) + 1, 1)
        || substr('0123456789abcdefghjkmnpqrstvwxyz', (p_n >> 10 & 31) + 1, 1)
        || substr('0123456789abcdefghjkmnpqrstvwxyz', (p_n >> 5 & 31) + 1, 1)
        || substr('0123456789abcdefghjkmnpqrstvwxyz', (p_n & 31) + 1, 1)
$$;

-- The ingest statement with payload filters. The unfiltered Deliveries come as before (ids
-- fixed by the ingest). The filtered ones come as candidates, three integers each: the
-- Event (1-based position in p_ids), the filter (in p_filters, each distinct filter of the
-- statement once, so each is parsed once) and the route (endpoint, subscription, ordered:
-- in p_route_*, each distinct one once). A candidate is written only if
-- `payload @@ filter` is true: `@@` yields NULL instead of raising for the errors a payload
-- can cause (a missing key, a type mismatch), and NULL declines. Each row returned names the
-- candidates of its Event that were written (their positions), so the answer, the metrics
-- and the Sequence Numbers count only what was written.
--
-- Why candidates and not one row per planned Delivery (the first shape of this function):
-- with 100 filtered endpoints, the ids, texts and joins of 100 rows per Event cost more
-- than the filters themselves (docs/BENCHMARKS.md, "Payload filters"). Otherwise the
-- 16-argument function of migration 20261205000019.
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
    p_candidate_events integer[], p_candidate_filters integer[], p_candidate_routes integer[]
) RETURNS TABLE (id text, created_at timestamptz, passed integer[])
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    -- Each filter parsed once, however many candidates use it, and each payload, into
    -- arrays the candidates index by number: no join and no hash table per candidate
    -- (measured: a candidate costs about half a microsecond beside its `@@`).
    v_paths jsonpath[];
    v_payloads jsonb[];
BEGIN
    -- The per-key lock first, then the insert with a fresh snapshot: see migration
    -- 20261204000011 for why the order matters.
    PERFORM pg_advisory_xact_lock(k)
    FROM (SELECT DISTINCT hashtextextended(p_project || '/' || key, 0) AS k
          FROM unnest(p_keys) AS key WHERE key IS NOT NULL ORDER BY 1) AS ordered_keys;

    IF cardinality(p_filters) > 0 THEN
        -- Casts, not queries: plpgsql evaluates them without starting an executor.
        v_paths := p_filters::jsonpath[];
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
        -- these few only, below).
        SELECT c.n, p_candidate_events[c.n] AS event, p_candidate_routes[c.n] AS route
        FROM generate_series(1, cardinality(p_candidate_events)) AS c(n)
        WHERE v_payloads[p_candidate_events[c.n]] @@ v_paths[p_candidate_filters[c.n]]
    ), passed AS MATERIALIZED (
        SELECT h.n, h.event_id,
               railhook_filtered_delivery_id(h.event_id, h.n::integer) AS delivery_id,
               r.endpoint_id, r.subscription_id, r.ordered
        FROM (SELECT h.n, e.id AS event_id, h.route
              FROM held h JOIN inserted e ON e.n = h.event) AS h
        JOIN unnest(p_route_endpoints, p_route_subscriptions, p_route_ordered)
             WITH ORDINALITY AS r(endpoint_id, subscription_id, ordered, n) ON r.n = h.route
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

-- Checks a filter before it is stored (ingest/src/routes/filters.rs), in one round trip:
-- `error_at` is NULL when it parses, else the 1-based character where parsing fails (the
-- shortest prefix that fails other than by ending early; Postgres's message names the token
-- but not where it is); `predicate` says whether it decides true or false (a path alone,
-- `$.status`, selects values and would decline every Event); `strict` whether it asks for
-- strict mode (filters run in lax mode: the ingest joins an endpoint's and a subscription's
-- filters into one path, where a mode may only lead); `canonical` is the form stored.
CREATE FUNCTION railhook_check_filter(p_filter text)
RETURNS TABLE (error_at integer, predicate boolean, strict boolean, canonical text)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    lo integer := 1;
    hi integer := length(p_filter);
    mid integer;
    msg text;
    found jsonb;
BEGIN
    BEGIN
        found := jsonb_path_query_first('{}', p_filter::jsonpath, '{}', true);
        RETURN QUERY SELECT NULL::integer,
                            found IS NOT NULL AND jsonb_typeof(found) IN ('boolean', 'null'),
                            p_filter::jsonpath::text LIKE 'strict %',
                            p_filter::jsonpath::text;
        RETURN;
    EXCEPTION WHEN others THEN
        NULL;
    END;
    WHILE lo < hi LOOP
        mid := (lo + hi) / 2;
        BEGIN
            PERFORM left(p_filter, mid)::jsonpath;
            lo := mid + 1;
        EXCEPTION WHEN others THEN
            GET STACKED DIAGNOSTICS msg = MESSAGE_TEXT;
            IF msg LIKE '%at end of jsonpath input%' THEN
                lo := mid + 1;
            ELSE
                hi := mid;
            END IF;
        END;
    END LOOP;
    RETURN QUERY SELECT lo, false, false, NULL::text;
END $$;
