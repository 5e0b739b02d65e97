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

-- The ingest statement with a filter per planned Delivery (NULL: none): a Delivery is
-- written only if `payload @@ filter` is true. `@@` yields NULL instead of raising for the
-- errors a payload can cause (a missing key, a type mismatch), and NULL declines. Each row
-- returned names the planned Deliveries of its Event that a filter declined, so the answer,
-- the metrics and the Sequence Numbers count only what was written. Otherwise the
-- 16-argument function of migration 20261205000019.
CREATE FUNCTION railhook_ingest(
    p_project text,
    p_ids text[], p_types text[], p_payloads text[], p_keys text[],
    p_delivery_ids text[], p_delivery_events text[], p_delivery_endpoints text[],
    p_delivery_subscriptions text[], p_delivery_ordered boolean[],
    p_window_hours integer,
    p_traceparents text[], p_tracestates text[],
    p_applications text[], p_channels text[], p_event_uids text[],
    p_delivery_filters text[]
) RETURNS TABLE (id text, created_at timestamptz, declined text[])
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
BEGIN
    -- The per-key lock first, then the insert with a fresh snapshot: see migration
    -- 20261204000011 for why the order matters.
    PERFORM pg_advisory_xact_lock(k)
    FROM (SELECT DISTINCT hashtextextended(p_project || '/' || key, 0) AS k
          FROM unnest(p_keys) AS key WHERE key IS NOT NULL ORDER BY 1) AS ordered_keys;

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
        RETURNING events.id, events.created_at, events.traceparent, events.payload
    ), parsed AS MATERIALIZED (
        -- Each distinct filter of the statement parsed once, however many Events carry it.
        SELECT f.filter, f.filter::jsonpath AS path
        FROM (SELECT DISTINCT u.filter FROM unnest(p_delivery_filters) AS u(filter)
              WHERE u.filter IS NOT NULL) AS f
    ), planned AS MATERIALIZED (
        -- Each planned Delivery of an inserted Event, with its Event's payload by a hash
        -- join (not a lookup per row), and whether its filter holds.
        SELECT x.id, x.event_id, x.endpoint_id, x.subscription_id, x.ordered, x.n,
               x.filter IS NULL OR coalesce(ev.payload @@ pf.path, false) AS pass
        FROM unnest(p_delivery_ids, p_delivery_events, p_delivery_endpoints,
                    p_delivery_subscriptions, p_delivery_ordered, p_delivery_filters)
             WITH ORDINALITY AS x(id, event_id, endpoint_id, subscription_id, ordered, filter, n)
        JOIN ev ON ev.id = x.event_id
        LEFT JOIN parsed pf ON pf.filter = x.filter
    ), d AS (
        INSERT INTO deliveries (id, project_id, event_id, endpoint_id, subscription_id, ordered)
        SELECT p.id, p_project, p.event_id, p.endpoint_id, p.subscription_id, p.ordered
        FROM planned p
        WHERE p.pass
        ORDER BY p.n
        RETURNING deliveries.id, deliveries.endpoint_id, deliveries.event_id
    ), announced AS (
        INSERT INTO outbox (delivery_id, endpoint_id, project_id, reason, traceparent)
        SELECT d.id, d.endpoint_id, p_project, 'CREATED', ev.traceparent
        FROM d JOIN ev ON ev.id = d.event_id ORDER BY d.id
    ), declined AS (
        SELECT p.event_id, array_agg(p.id) AS ids
        FROM planned p WHERE NOT p.pass GROUP BY p.event_id
    )
    SELECT ev.id, ev.created_at, dc.ids
    FROM ev LEFT JOIN declined dc ON dc.event_id = ev.id;
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
