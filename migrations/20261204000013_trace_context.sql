-- W3C Trace Context from the API call to the receiver (common/src/trace_context.rs): the
-- context of the request that created an Event is stored with it and in its Outbox row, in
-- the same transaction, so the relay and the workers continue the same trace.
--
-- Expand only: nullable columns (no rewrite, no lock beyond a moment's ACCESS EXCLUSIVE for
-- the catalogue change), and a new overload of railhook_ingest with two more arguments.
-- The 11-argument function stays for the previous release's ingest during a rolling
-- deploy; it can be dropped once no release calls it (contract, later).
ALTER TABLE events ADD COLUMN traceparent text;
ALTER TABLE events ADD COLUMN tracestate text;
ALTER TABLE outbox ADD COLUMN traceparent text;

CREATE FUNCTION railhook_ingest(
    p_project text,
    p_ids text[], p_types text[], p_payloads text[], p_keys text[],
    p_delivery_ids text[], p_delivery_events text[], p_delivery_endpoints text[],
    p_delivery_subscriptions text[], p_delivery_ordered boolean[],
    p_window_hours integer,
    p_traceparents text[], p_tracestates text[]
) RETURNS TABLE (id text, created_at timestamptz)
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
                            traceparent, tracestate)
        SELECT x.id, p_project, x.event_type, x.payload::jsonb, x.key, x.tp, x.ts
        FROM (SELECT u.*, row_number() OVER (PARTITION BY u.key ORDER BY u.n) AS nth
              FROM unnest(p_ids, p_types, p_payloads, p_keys, p_traceparents, p_tracestates)
                   WITH ORDINALITY AS u(id, event_type, payload, key, tp, ts, n)) AS x
        WHERE x.key IS NULL
           OR (x.nth = 1 AND NOT EXISTS (
                 SELECT 1 FROM events e
                 WHERE e.project_id = p_project AND e.idempotency_key = x.key
                   AND e.id >= railhook_ulid_floor('evt_', now() - make_interval(hours => p_window_hours))))
        ORDER BY x.n
        RETURNING events.id, events.created_at, events.traceparent
    ), d AS (
        -- The Deliveries of the Events actually inserted, and one Outbox row each (carrying
        -- the Event's trace context): the same statement, so neither exists without the other.
        INSERT INTO deliveries (id, project_id, event_id, endpoint_id, subscription_id, ordered)
        SELECT x.id, p_project, x.event_id, x.endpoint_id, x.subscription_id, x.ordered
        FROM unnest(p_delivery_ids, p_delivery_events, p_delivery_endpoints,
                    p_delivery_subscriptions, p_delivery_ordered)
             WITH ORDINALITY AS x(id, event_id, endpoint_id, subscription_id, ordered, n)
        WHERE x.event_id IN (SELECT ev.id FROM ev)
        ORDER BY x.n
        RETURNING deliveries.id, deliveries.endpoint_id, deliveries.event_id
    ), announced AS (
        INSERT INTO outbox (delivery_id, endpoint_id, project_id, reason, traceparent)
        SELECT d.id, d.endpoint_id, p_project, 'CREATED', ev.traceparent
        FROM d JOIN ev ON ev.id = d.event_id ORDER BY d.id
    )
    SELECT ev.id, ev.created_at FROM ev;
END $$;
