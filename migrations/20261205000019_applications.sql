-- Applications and channels (issue #37, docs/APPLICATIONS.md).
--
-- An application is one customer of the sending team. An endpoint belongs to at most one
-- application (for life: its Deliveries' application is its own, so no Delivery column is
-- needed), and an Event to at most one; an Event reaches only the endpoints of its own scope
-- (the application's, or with none the project's own). Channels narrow that further: an
-- endpoint that lists channels receives only Events sharing one with it.
--
-- Expand only: a new table, nullable columns (or a constant default, which Postgres stores
-- in the catalogue without a rewrite), an index on the events parent only, a new overload of railhook_ingest() (the
-- 13-argument one stays for the previous release's ingest during a rolling deploy), and
-- railhook_live_subscriptions() replaced with the same signature (its JSON gains two keys,
-- which the previous release's parser ignores).
CREATE TABLE applications (
    id                    text PRIMARY KEY,
    project_id            text        NOT NULL REFERENCES projects (id),
    -- The sender's own name for it: unique among the project's live applications, never
    -- starting with `app_`, so an id and a uid cannot be confused.
    uid                   text,
    name                  text        NOT NULL,
    metadata              jsonb       NOT NULL DEFAULT '{}',
    rate_limit_per_second integer,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    deleted_at            timestamptz
);
CREATE UNIQUE INDEX applications_uid_idx ON applications (project_id, uid)
    WHERE deleted_at IS NULL AND uid IS NOT NULL;
CREATE INDEX applications_project_idx ON applications (project_id, id) WHERE deleted_at IS NULL;

ALTER TABLE endpoints ADD COLUMN application_id text REFERENCES applications (id);
ALTER TABLE endpoints ADD COLUMN channels text[];
ALTER TABLE endpoints ADD COLUMN uid text;
ALTER TABLE endpoints ADD COLUMN metadata jsonb NOT NULL DEFAULT '{}';
-- Their indexes are built CONCURRENTLY by the next two migrations.

ALTER TABLE events ADD COLUMN application_id text;
ALTER TABLE events ADD COLUMN channels text[];
-- The sender's own id for the Event (Svix's `eventId`): shown and searchable, not a key.
ALTER TABLE events ADD COLUMN event_uid text;
-- An application's Events, newest first (the Svix-compatible message list). On the parent
-- only, so no existing partition is locked or scanned: every day partition created from
-- now on gets it with its table. The partitions that existed before the upgrade (past days,
-- and the few made ahead) have none; a list that reaches into them is served by
-- events_project_idx, and they age out with retention.
CREATE INDEX events_application_idx ON ONLY events (application_id, id)
    WHERE application_id IS NOT NULL;

-- The live subscriptions with their endpoint's scope and channels, for the ingest's
-- Delivery planning (ingest/src/accept.rs, plan_deliveries).
CREATE OR REPLACE FUNCTION railhook_live_subscriptions(p_project text)
RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT coalesce((
        SELECT json_agg(json_build_object('id', s.id, 'endpoint_id', s.endpoint_id,
                                          'event_types', s.event_types, 'ordered', s.ordered,
                                          'application_id', e.application_id,
                                          'channels', e.channels)
                        ORDER BY s.id)
        FROM subscriptions s JOIN endpoints e ON e.id = s.endpoint_id
        WHERE s.project_id = p_project AND s.deleted_at IS NULL
          AND e.deleted_at IS NULL AND e.enabled), '[]')::text
$$;

-- The ingest statement with each Event's application, channels (joined by commas: a channel
-- holds no comma) and uid. Otherwise the 13-argument function of migration 20261204000013.
CREATE FUNCTION railhook_ingest(
    p_project text,
    p_ids text[], p_types text[], p_payloads text[], p_keys text[],
    p_delivery_ids text[], p_delivery_events text[], p_delivery_endpoints text[],
    p_delivery_subscriptions text[], p_delivery_ordered boolean[],
    p_window_hours integer,
    p_traceparents text[], p_tracestates text[],
    p_applications text[], p_channels text[], p_event_uids text[]
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
    ), d AS (
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
