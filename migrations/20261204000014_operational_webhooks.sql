-- Operational webhooks: a project's own systems told when its endpoints change state or
-- its messages fail (ingest/src/routes/operational.rs). An operational endpoint is an
-- endpoints row of kind 'operational' with the operational event types it wants; it never
-- has subscriptions, so the project's own Events never reach it, and the routes of
-- /v1/endpoints never show it. Operational Events are rows of `events` marked
-- `operational` (hidden from /v1/events), delivered by the same Outbox, relay and workers,
-- signed with the operational endpoint's own secret and retried on its own ladder.
--
-- Expand only: new columns with constant defaults (no rewrite), a CHECK added NOT VALID and
-- validated in its own statement, new functions.
ALTER TABLE endpoints ADD COLUMN kind text NOT NULL DEFAULT 'webhook';
ALTER TABLE endpoints ADD CONSTRAINT endpoints_kind_check CHECK (kind IN ('webhook', 'operational')) NOT VALID;
ALTER TABLE endpoints VALIDATE CONSTRAINT endpoints_kind_check;
ALTER TABLE endpoints ADD COLUMN operational_types text[];
ALTER TABLE events ADD COLUMN operational boolean NOT NULL DEFAULT false;

-- A new id of `prefix` (a ULID: the current millisecond, then 80 random bits), for rows
-- written inside the database; the same layout as common/src/ids.rs, so partitions and
-- ordering treat them alike.
CREATE FUNCTION railhook_new_id(prefix text) RETURNS text
LANGUAGE sql VOLATILE AS $$
    SELECT left(railhook_ulid_floor(prefix, clock_timestamp()), length(prefix) + 10)
        || (SELECT string_agg(substr('0123456789abcdefghjkmnpqrstvwxyz',
                                     1 + floor(random() * 32)::int, 1), '')
            FROM generate_series(1, 16))
$$;

-- Writes one operational Event of `p_type` for project `p_project` and a Delivery, with
-- its Outbox row, for each of the project's live operational endpoints that asked for that
-- type; returns how many Deliveries. Called inside the transaction (or statement) of the
-- change it reports, so it is sent exactly when that change commits. The body is what
-- receivers of other services' operational webhooks parse: {type, timestamp, data}.
CREATE FUNCTION railhook_emit_operational(p_project text, p_type text, p_data jsonb)
RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    event_id text;
    n integer;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM endpoints o
                   WHERE o.project_id = p_project AND o.kind = 'operational'
                     AND o.deleted_at IS NULL AND o.enabled
                     AND (p_type = ANY (o.operational_types) OR '*' = ANY (o.operational_types))) THEN
        RETURN 0;
    END IF;
    event_id := railhook_new_id('evt_');
    INSERT INTO events (id, project_id, event_type, payload, operational)
    VALUES (event_id, p_project, p_type,
            jsonb_build_object('type', p_type,
                               'timestamp', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
                               'data', p_data),
            true);
    WITH d AS (
        INSERT INTO deliveries (id, project_id, event_id, endpoint_id)
        SELECT railhook_new_id('dlv_'), p_project, event_id, o.id
        FROM endpoints o
        WHERE o.project_id = p_project AND o.kind = 'operational'
          AND o.deleted_at IS NULL AND o.enabled
          AND (p_type = ANY (o.operational_types) OR '*' = ANY (o.operational_types))
        RETURNING id, endpoint_id
    )
    INSERT INTO outbox (delivery_id, endpoint_id, project_id, reason)
    SELECT id, endpoint_id, p_project, 'CREATED' FROM d;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;
