-- The operator surface: Replays (the Time Machine), Failed Messages, endpoint failure
-- streaks, and dashboard sessions.

-- A Replay builds new Deliveries from stored Events. It is worked through in bounded
-- transactions by whichever ingest process locks its row (FOR UPDATE SKIP LOCKED); each
-- transaction inserts one batch of Deliveries and Outbox rows and moves `cursor` (the last
-- Event id handled) in the same commit, so a crash between batches neither repeats nor skips
-- an Event.
CREATE TABLE replays (
    id                  text PRIMARY KEY,
    project_id          text        NOT NULL REFERENCES projects (id),
    status              text        NOT NULL DEFAULT 'RUNNING'
                        CHECK (status IN ('RUNNING', 'COMPLETED', 'CANCELLED')),
    -- Either a list of Event ids …
    event_ids           text[],
    -- … or a time range with optional exact event types; both may narrow to one endpoint.
    from_time           timestamptz,
    to_time             timestamptz,
    event_types         text[],
    endpoint_id         text,
    events_total        bigint      NOT NULL,
    events_done         bigint      NOT NULL DEFAULT 0,
    deliveries_created  bigint      NOT NULL DEFAULT 0,
    cursor              text,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    finished_at         timestamptz,
    CHECK ((event_ids IS NOT NULL) <> (from_time IS NOT NULL AND to_time IS NOT NULL))
);
CREATE INDEX replays_project_idx ON replays (project_id, id);
CREATE INDEX replays_running_idx ON replays (updated_at) WHERE status = 'RUNNING';

ALTER TABLE deliveries ADD COLUMN replay_id text REFERENCES replays (id);
-- The status code of the latest Attempt, so Failed Messages can be filtered by it without
-- reading every Attempt.
ALTER TABLE deliveries ADD COLUMN last_status_code integer;
CREATE INDEX deliveries_failed_idx ON deliveries (project_id, id) WHERE status = 'FAILED';
CREATE INDEX deliveries_replay_idx ON deliveries (replay_id) WHERE replay_id IS NOT NULL;
CREATE INDEX events_project_created_idx ON events (project_id, created_at);

-- An endpoint's failure streak: Attempts that went out and did not succeed, in a row, and
-- since when. A success resets it. A streak older than the configured window disables the
-- endpoint; before that the API and dashboard show a warning.
ALTER TABLE endpoints ADD COLUMN consecutive_failures integer NOT NULL DEFAULT 0;
ALTER TABLE endpoints ADD COLUMN failing_since timestamptz;
ALTER TABLE endpoints ADD COLUMN disabled_at timestamptz;

-- Dashboard sign-in: the cookie carries a random token; only its SHA-256 is stored. A
-- session is only as good as the API key it was opened with: revoking the key ends it.
CREATE TABLE dashboard_sessions (
    token_hash  bytea PRIMARY KEY,
    api_key_id  text        NOT NULL REFERENCES api_keys (id),
    project_id  text        NOT NULL REFERENCES projects (id),
    csrf_token  text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL
);
CREATE INDEX dashboard_sessions_expiry_idx ON dashboard_sessions (expires_at);
