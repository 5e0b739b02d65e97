-- Audit rows as operational webhooks (issue #57, docs/ACCESS.md): `audit.entry` goes only to
-- an operational endpoint that names it. An endpoint subscribed to `*` before this release
-- keeps receiving exactly what it received (the audit stream can be large and carries who
-- changed what: a receiver opts in). Otherwise as in migration 22; same signature, so the
-- previous release's callers are unaffected.
CREATE OR REPLACE FUNCTION railhook_emit_operational(p_project text, p_type text, p_data jsonb)
RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    event_id text;
    app text;
    n integer;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM endpoints o
                   WHERE o.project_id = p_project AND o.kind = 'operational'
                     AND o.deleted_at IS NULL AND o.enabled
                     AND (p_type = ANY (o.operational_types)
                          OR ('*' = ANY (o.operational_types) AND p_type <> 'audit.entry'))) THEN
        RETURN 0;
    END IF;
    IF p_data ? 'endpoint_id' AND NOT p_data ? 'application_id' THEN
        SELECT e.application_id INTO app FROM endpoints e WHERE e.id = p_data->>'endpoint_id';
        IF app IS NOT NULL THEN
            p_data := p_data || jsonb_build_object('application_id', app);
        END IF;
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
          AND (p_type = ANY (o.operational_types)
               OR ('*' = ANY (o.operational_types) AND p_type <> 'audit.entry'))
        RETURNING id, endpoint_id
    )
    INSERT INTO outbox (delivery_id, endpoint_id, project_id, reason)
    SELECT id, endpoint_id, p_project, 'CREATED' FROM d;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;
