-- The event-type catalogue: a name per type a project sends, a description, and optionally
-- a JSON Schema (draft 2020-12) that POST /v1/events checks payloads of that type against.
--
-- `schema_version` counts a type's schema changes for people (1, 2, …; a type deleted and
-- created again starts over). `schema_id` is what the ingest's compiled-validator cache is
-- keyed by: drawn from a sequence on every schema change, it is never reused, so a cached
-- validator can never stand for another schema (ingest/src/schemas.rs).
CREATE SEQUENCE event_type_schema_ids;

CREATE TABLE event_types (
    project_id      text        NOT NULL REFERENCES projects (id),
    name            text        NOT NULL,
    description     text        NOT NULL DEFAULT '',
    schema          jsonb,
    schema_version  integer     NOT NULL DEFAULT 1,
    schema_id       bigint      NOT NULL DEFAULT nextval('event_type_schema_ids'),
    deprecated_at   timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (project_id, name)
);
CREATE UNIQUE INDEX event_types_schema_id_idx ON event_types (schema_id);
