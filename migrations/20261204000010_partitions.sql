-- Bounded storage: events, deliveries and attempts become range partitioned by day, so
-- retention drops whole partitions instead of deleting rows (docs/ARCHITECTURE.md,
-- "Storage"). This migration converts the existing tables with their rows; what it locks
-- and for how long is in docs/OPERATIONS.md.
--
-- The partition key is the id itself: a prefixed ULID whose first ten characters after the
-- prefix are its creation time in milliseconds, in an alphabet whose byte order is its
-- numeric order. Partitioning by id (not created_at) keeps `PRIMARY KEY (id)` legal and
-- lets every lookup by id touch one partition. Ids are compared byte for byte (COLLATE "C")
-- so the bounds mean the same thing whatever the database's collation is. Attempts are
-- partitioned by their Delivery's id, so a day's Attempts live and die with its Deliveries.

-- The smallest id of `prefix` created at `at`: the partition bound for that instant.
CREATE FUNCTION railhook_ulid_floor(prefix text, at timestamptz) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT AS $$
DECLARE
    alphabet constant text := '0123456789abcdefghjkmnpqrstvwxyz';
    ms bigint := floor(extract(epoch FROM at) * 1000)::bigint;
    encoded text := '';
BEGIN
    FOR i IN 1..10 LOOP
        encoded := substr(alphabet, (ms % 32)::int + 1, 1) || encoded;
        ms := ms / 32;
    END LOOP;
    RETURN prefix || encoded || '0000000000000000';
END $$;

-- The creation time inside an id (any prefix): the inverse of railhook_ulid_floor.
CREATE FUNCTION railhook_ulid_time(id text) RETURNS timestamptz
LANGUAGE plpgsql IMMUTABLE STRICT AS $$
DECLARE
    alphabet constant text := '0123456789abcdefghjkmnpqrstvwxyz';
    body constant text := lower(right(id, 26));
    ms bigint := 0;
BEGIN
    FOR i IN 1..10 LOOP
        ms := ms * 32 + strpos(alphabet, substr(body, i, 1)) - 1;
    END LOOP;
    RETURN to_timestamp(ms / 1000.0);
END $$;

-- Creates the day partitions of events, deliveries and attempts for every UTC day in
-- [first_day, last_day] that has none; returns how many tables it created. Safe to call
-- from several processes: they queue on one advisory lock. A partition is created
-- standalone and then attached, which locks the parent only SHARE UPDATE EXCLUSIVE
-- (inserts go on); a plain CREATE … PARTITION OF would lock it ACCESS EXCLUSIVE.
CREATE FUNCTION railhook_ensure_partitions(first_day date, last_day date) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    day date;
    spec record;
    name text;
    created integer := 0;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('railhook.ensure_partitions'));
    FOR day IN SELECT d::date FROM generate_series(first_day, last_day, interval '1 day') AS d LOOP
        FOR spec IN SELECT * FROM (VALUES ('events', 'evt_'), ('deliveries', 'dlv_'),
                                          ('attempts', 'dlv_')) AS s(parent, prefix) LOOP
            name := spec.parent || '_p' || to_char(day, 'YYYYMMDD');
            CONTINUE WHEN to_regclass(name) IS NOT NULL;
            EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING CONSTRAINTS)',
                           name, spec.parent);
            EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                           spec.parent, name,
                           railhook_ulid_floor(spec.prefix, day::timestamp AT TIME ZONE 'UTC'),
                           railhook_ulid_floor(spec.prefix, (day + 1)::timestamp AT TIME ZONE 'UTC'));
            IF spec.parent = 'deliveries' THEN
                -- Sequence Numbers come from endpoint_sequences, whose row lock hands each
                -- number out once; this per-day index is the backstop a partitioned table
                -- allows (a unique index on the parent would have to include the id).
                EXECUTE format('CREATE UNIQUE INDEX %I ON %I (endpoint_id, sequence_number)
                                WHERE sequence_number IS NOT NULL', name || '_sequence_key', name);
            END IF;
            created := created + 1;
        END LOOP;
    END LOOP;
    RETURN created;
END $$;

-- The conversion: the old tables step aside, the partitioned ones take their names, rows
-- are copied into the day partitions their ids belong to, and the indexes are built once
-- on the filled partitions (faster than maintaining them row by row).
ALTER TABLE attempts RENAME TO attempts_unpartitioned;
ALTER TABLE deliveries RENAME TO deliveries_unpartitioned;
ALTER TABLE events RENAME TO events_unpartitioned;
ALTER SEQUENCE attempts_id_seq OWNED BY NONE;

CREATE TABLE events (
    id                 text COLLATE "C" NOT NULL,
    project_id         text        NOT NULL,
    event_type         text        NOT NULL,
    payload            jsonb       NOT NULL,
    idempotency_key    text,
    source_id          text,
    provider_event_id  text,
    created_at         timestamptz NOT NULL DEFAULT now(),
    raw_body           bytea,
    forward_headers    jsonb,
    expunged_at        timestamptz
) PARTITION BY RANGE (id);

-- No foreign keys on the partitioned tables, in either direction. Dropping a partition
-- that has a foreign key locks the referenced table ACCESS EXCLUSIVE (to remove its
-- triggers): every retired day would stop every reader of projects and endpoints, ingest's
-- authentication included, and wait behind any long transaction that read them (measured:
-- docs/BENCHMARKS.md, "Retention"). What the keys promised is kept instead:
-- - a row's project, endpoint, subscription and replay exist: those rows are never deleted
--   (soft delete, `deleted_at`), and every writer uses ids it has just read;
-- - a Delivery's Event exists: a Delivery is inserted only in the statement that inserts its
--   Event, or by a replay that read it, and retention never drops an Event partition that an
--   open Delivery points into;
-- - an Attempt's Delivery exists: only the Claim's holder inserts one, and it lives in the
--   day partition of its Delivery and is dropped with it.
-- A foreign-key check on every insert also took a KEY SHARE lock on the project's row: one
-- hot row shared by all of a project's concurrent ingests.
CREATE TABLE deliveries (
    id                   text COLLATE "C" NOT NULL,
    project_id           text        NOT NULL,
    event_id             text COLLATE "C" NOT NULL,
    endpoint_id          text        NOT NULL,
    subscription_id      text,
    direction            text        NOT NULL DEFAULT 'outgoing' CHECK (direction IN ('outgoing', 'incoming')),
    origin               text        NOT NULL DEFAULT 'ingest' CHECK (origin IN ('ingest', 'replay')),
    status               text        NOT NULL DEFAULT 'PENDING'
                         CHECK (status IN ('PENDING', 'PROCESSING', 'SUCCEEDED', 'FAILED')),
    claim_token          uuid,
    attempt_count        integer     NOT NULL DEFAULT 0,
    next_retry_at        timestamptz,
    last_attempt_at      timestamptz,
    ordered              boolean     NOT NULL DEFAULT false,
    sequence_number      bigint,
    parked_at            timestamptz,
    failure_reason       text,
    version              bigint      NOT NULL DEFAULT 0,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    ladder_started_at    timestamptz NOT NULL DEFAULT now(),
    deferral_count       integer     NOT NULL DEFAULT 0,
    ordering_skipped_at  timestamptz,
    replay_id            text,
    last_status_code     integer,
    hinted_at            timestamptz
) PARTITION BY RANGE (id);

CREATE TABLE attempts (
    id                bigint      NOT NULL DEFAULT nextval('attempts_id_seq'),
    delivery_id       text COLLATE "C" NOT NULL,
    attempt_number    integer     NOT NULL,
    started_at        timestamptz NOT NULL,
    finished_at       timestamptz NOT NULL,
    status_code       integer,
    outcome           text        NOT NULL,
    duration_ms       integer     NOT NULL,
    error_class       text,
    response_excerpt  text,
    fenced            boolean     NOT NULL DEFAULT false
) PARTITION BY RANGE (delivery_id);
ALTER SEQUENCE attempts_id_seq OWNED BY attempts.id;

-- Every day that holds a row, and a week ahead (the maintenance task keeps it ahead).
SELECT railhook_ensure_partitions(
    least(current_date - 1,
          (SELECT railhook_ulid_time(min(id)) FROM events_unpartitioned)::date,
          (SELECT railhook_ulid_time(min(id)) FROM deliveries_unpartitioned)::date),
    greatest(current_date + 7,
             (SELECT railhook_ulid_time(max(id)) FROM events_unpartitioned)::date,
             (SELECT railhook_ulid_time(max(id)) FROM deliveries_unpartitioned)::date));

INSERT INTO events SELECT * FROM events_unpartitioned;
INSERT INTO deliveries SELECT * FROM deliveries_unpartitioned;
INSERT INTO attempts SELECT * FROM attempts_unpartitioned;
DROP TABLE attempts_unpartitioned, deliveries_unpartitioned, events_unpartitioned;

ALTER TABLE events ADD PRIMARY KEY (id);
-- Idempotency-Key and provider-id lookups. Not unique: a unique index on a partitioned
-- table must contain the partition key. Duplicate windows 1 and 2 are kept by a per-key
-- advisory lock taken before the lookup (ingest/src/ingest.rs, ingest/src/incoming).
CREATE INDEX events_idempotency_key_idx ON events (project_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX events_provider_event_idx ON events (source_id, provider_event_id)
    WHERE provider_event_id IS NOT NULL;
CREATE INDEX events_project_idx ON events (project_id, id);
CREATE INDEX events_project_type_idx ON events (project_id, event_type, id);
CREATE INDEX events_project_created_idx ON events (project_id, created_at);

ALTER TABLE deliveries ADD PRIMARY KEY (id);
CREATE INDEX deliveries_event_idx ON deliveries (event_id);
CREATE INDEX deliveries_project_idx ON deliveries (project_id, id);
CREATE INDEX deliveries_due_idx ON deliveries (next_retry_at) WHERE status = 'PENDING';
CREATE INDEX deliveries_processing_idx ON deliveries (last_attempt_at) WHERE status = 'PROCESSING';
CREATE INDEX deliveries_stranded_idx ON deliveries (updated_at)
    WHERE status = 'PENDING' AND next_retry_at IS NULL;
CREATE INDEX deliveries_ordered_open_idx ON deliveries (endpoint_id, sequence_number)
    WHERE ordered AND ordering_skipped_at IS NULL AND status IN ('PENDING', 'PROCESSING');
CREATE INDEX deliveries_parked_idx ON deliveries (endpoint_id, sequence_number)
    WHERE parked_at IS NOT NULL AND status = 'PENDING';
CREATE INDEX deliveries_failed_idx ON deliveries (project_id, id) WHERE status = 'FAILED';
CREATE INDEX deliveries_replay_idx ON deliveries (replay_id) WHERE replay_id IS NOT NULL;
-- Retention's question for an Event partition: does a Delivery that is not final point
-- into it? Small (only open Deliveries), and answered without reading a day of rows.
CREATE INDEX deliveries_open_event_idx ON deliveries (event_id)
    WHERE status IN ('PENDING', 'PROCESSING');

ALTER TABLE attempts ADD PRIMARY KEY (delivery_id, id);
CREATE INDEX attempts_delivery_idx ON attempts (delivery_id, attempt_number);

-- The per-day unique Sequence Number indexes for the days copied above (new days get theirs
-- from railhook_ensure_partitions). Created after the copy, like the indexes above.
DO $$
DECLARE
    part regclass;
BEGIN
    FOR part IN SELECT inhrelid::regclass FROM pg_inherits
                WHERE inhparent = 'deliveries'::regclass LOOP
        IF to_regclass(part::text || '_sequence_key') IS NULL THEN
            EXECUTE format('CREATE UNIQUE INDEX %I ON %s (endpoint_id, sequence_number)
                            WHERE sequence_number IS NOT NULL', part::text || '_sequence_key', part);
        END IF;
    END LOOP;
END $$;
