-- People and scoped keys (issue #57, docs/ACCESS.md).
--
-- A key's role decides what it may do (ingest/src/access.rs holds the one table every route
-- passes through). Every key that exists keeps today's rights: `admin` is the default, and
-- `admin` can do everything a key could do before. `application_id` confines a key to one
-- application; `expires_at` ends it on a date. `name` is what a person calls it.
ALTER TABLE api_keys ADD COLUMN role text NOT NULL DEFAULT 'admin';
ALTER TABLE api_keys ADD CONSTRAINT api_keys_role_check
    CHECK (role IN ('sender', 'viewer', 'operator', 'admin')) NOT VALID;
ALTER TABLE api_keys ADD COLUMN application_id text;
ALTER TABLE api_keys ADD CONSTRAINT api_keys_application_fkey
    FOREIGN KEY (application_id) REFERENCES applications (id) NOT VALID;
ALTER TABLE api_keys ADD COLUMN expires_at timestamptz;
ALTER TABLE api_keys ADD COLUMN name text NOT NULL DEFAULT '';

-- The audit log: one append-only row per change, written in the change's own transaction
-- (ingest/src/audit.rs). Partitioned by day on its id like the Events, so retention drops
-- whole days of it. `actor` names who: a key's prefix, a person's subject, the operator's
-- token, a portal session; never a secret. `changes` holds what changed with every secret
-- value replaced by "[redacted]".
CREATE TABLE audit_log (
    id           text COLLATE "C" NOT NULL,
    project_id   text        NOT NULL,
    at           timestamptz NOT NULL DEFAULT now(),
    actor_kind   text        NOT NULL CHECK (actor_kind IN ('key', 'person', 'operator', 'portal')),
    actor        text        NOT NULL,
    actor_email  text,
    object_kind  text        NOT NULL,
    object_id    text,
    action       text        NOT NULL,
    changes      jsonb       NOT NULL DEFAULT '{}'::jsonb,
    PRIMARY KEY (id)
) PARTITION BY RANGE (id);
CREATE INDEX audit_log_project_idx ON audit_log (project_id, id);

-- railhook_ensure_partitions learns the fourth table; otherwise as in migration 10.
CREATE OR REPLACE FUNCTION railhook_ensure_partitions(first_day date, last_day date) RETURNS integer
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
                                          ('attempts', 'dlv_'), ('audit_log', 'aud_'))
                        AS s(parent, prefix) LOOP
            name := spec.parent || '_p' || to_char(day, 'YYYYMMDD');
            CONTINUE WHEN to_regclass(name) IS NOT NULL;
            EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING CONSTRAINTS)',
                           name, spec.parent);
            EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                           spec.parent, name,
                           railhook_ulid_floor(spec.prefix, day::timestamp AT TIME ZONE 'UTC'),
                           railhook_ulid_floor(spec.prefix, (day + 1)::timestamp AT TIME ZONE 'UTC'));
            IF spec.parent = 'deliveries' THEN
                EXECUTE format('CREATE UNIQUE INDEX %I ON %I (endpoint_id, sequence_number)
                                WHERE sequence_number IS NOT NULL', name || '_sequence_key', name);
            END IF;
            created := created + 1;
        END LOOP;
    END LOOP;
    RETURN created;
END $$;

-- The audit log's partitions for every day the other tables already have.
SELECT railhook_ensure_partitions(
    coalesce((SELECT min(to_date(substr(c.relname, length('events_p') + 1), 'YYYYMMDD'))
              FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
              WHERE i.inhparent = 'events'::regclass), current_date),
    greatest(current_date + 2,
             coalesce((SELECT max(to_date(substr(c.relname, length('events_p') + 1), 'YYYYMMDD'))
                       FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                       WHERE i.inhparent = 'events'::regclass), current_date)));
