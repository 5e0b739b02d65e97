-- The Events a Replay covers, defined once: the API counts them when the Replay is made and
-- the engine (ingest/src/replay.rs) reads them in batches after its cursor, both through this
-- function, so the two cannot disagree about which Events a Replay means. A plain SQL
-- function of one SELECT, STABLE: Postgres inlines it into each caller, so each keeps its own
-- plan (the day partitions pruned by the range, the index on (project_id, id)).
CREATE FUNCTION railhook_replay_selection(
    p_project text, p_event_ids text[], p_from timestamptz, p_to timestamptz, p_event_types text[])
RETURNS SETOF events
LANGUAGE sql STABLE AS $$
    SELECT * FROM events
    WHERE project_id = p_project
      AND (p_event_ids IS NULL OR id = ANY (p_event_ids))
      AND (p_from IS NULL OR created_at >= p_from)
      AND (p_to IS NULL OR created_at < p_to)
      AND (p_event_types IS NULL OR event_type = ANY (p_event_types))
$$;

-- A project's live subscriptions on enabled endpoints, as JSON: what ingest matches Event
-- types against. Read in the same round trip as the API key (ingest/src/auth.rs, `Sender`)
-- and by the replay engine's planning; one definition for both (ingest/src/store/subscriptions.rs).
CREATE FUNCTION railhook_live_subscriptions(p_project text)
RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT coalesce((
        SELECT json_agg(json_build_object('id', s.id, 'endpoint_id', s.endpoint_id,
                                          'event_types', s.event_types, 'ordered', s.ordered)
                        ORDER BY s.id)
        FROM subscriptions s JOIN endpoints e ON e.id = s.endpoint_id
        WHERE s.project_id = p_project AND s.deleted_at IS NULL
          AND e.deleted_at IS NULL AND e.enabled), '[]')::text
$$;
