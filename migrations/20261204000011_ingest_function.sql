-- Ingest's write (ingest/src/ingest.rs, step 3) as one function, so that an Event with an
-- Idempotency-Key costs one round trip like one without.
--
-- Duplicate window 1 is kept by a transaction-scoped advisory lock per (project, key),
-- taken before the insert looks for an Event holding the key (events is partitioned by day,
-- so no unique index can do it). The lookup must not start before the lock is held: a
-- statement sees the database as of its start, and a concurrent holder may commit while it
-- waits for the lock. In one SQL statement that is impossible to order; a VOLATILE PL/pgSQL
-- function runs each of its statements with a fresh snapshot (READ COMMITTED), so the lock
-- statement comes first and the insert, a statement of its own, sees every Event committed
-- before the lock was granted. Locks are taken in the order of their numbers, so two
-- batches that share keys cannot deadlock; they are held until the caller's transaction
-- ends (the implicit one of a lone statement, or the batch's).
CREATE FUNCTION railhook_ingest(
    p_project text,
    p_ids text[], p_types text[], p_payloads text[], p_keys text[],
    p_delivery_ids text[], p_delivery_events text[], p_delivery_endpoints text[],
    p_delivery_subscriptions text[], p_delivery_ordered boolean[],
    p_window_hours integer
) RETURNS TABLE (id text, created_at timestamptz)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
BEGIN
    PERFORM pg_advisory_xact_lock(k)
    FROM (SELECT DISTINCT hashtextextended(p_project || '/' || key, 0) AS k
          FROM unnest(p_keys) AS key WHERE key IS NOT NULL ORDER BY 1) AS ordered_keys;

    RETURN QUERY
    WITH ev AS (
        -- Skipped: an Event whose key holds an Event of the window, or an earlier Event of
        -- the same batch with the same key.
        INSERT INTO events (id, project_id, event_type, payload, idempotency_key)
        SELECT x.id, p_project, x.event_type, x.payload::jsonb, x.key
        FROM (SELECT u.*, row_number() OVER (PARTITION BY u.key ORDER BY u.n) AS nth
              FROM unnest(p_ids, p_types, p_payloads, p_keys)
                   WITH ORDINALITY AS u(id, event_type, payload, key, n)) AS x
        WHERE x.key IS NULL
           OR (x.nth = 1 AND NOT EXISTS (
                 SELECT 1 FROM events e
                 WHERE e.project_id = p_project AND e.idempotency_key = x.key
                   AND e.id >= railhook_ulid_floor('evt_', now() - make_interval(hours => p_window_hours))))
        ORDER BY x.n
        RETURNING events.id, events.created_at
    ), d AS (
        -- The Deliveries of the Events actually inserted, and one Outbox row each: the same
        -- statement, so neither exists without the other.
        INSERT INTO deliveries (id, project_id, event_id, endpoint_id, subscription_id, ordered)
        SELECT x.id, p_project, x.event_id, x.endpoint_id, x.subscription_id, x.ordered
        FROM unnest(p_delivery_ids, p_delivery_events, p_delivery_endpoints,
                    p_delivery_subscriptions, p_delivery_ordered)
             WITH ORDINALITY AS x(id, event_id, endpoint_id, subscription_id, ordered, n)
        WHERE x.event_id IN (SELECT ev.id FROM ev)
        ORDER BY x.n
        RETURNING deliveries.id, deliveries.endpoint_id
    ), announced AS (
        INSERT INTO outbox (delivery_id, endpoint_id, project_id, reason)
        SELECT d.id, d.endpoint_id, p_project, 'CREATED' FROM d ORDER BY d.id
    )
    SELECT ev.id, ev.created_at FROM ev;
END $$;
