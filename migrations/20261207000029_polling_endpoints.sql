-- Receivers without a public URL (issue #56): an endpoint of type `poller` is not pushed to;
-- its receiver reads its Deliveries in Sequence Number order (docs/POLLING.md). An endpoint
-- of type `listen` is a `railhook listen` session's (docs/RECEIVERS.md). Expand only: two new
-- kinds in the transport check, two tables, and the live-subscriptions function
-- numbering a poller's Deliveries like an ordered endpoint's.

ALTER TABLE endpoints DROP CONSTRAINT endpoints_transport_kind;
ALTER TABLE endpoints
    ADD CONSTRAINT endpoints_transport_kind
        CHECK (transport IN ('http', 'kafka', 'sqs', 'rabbitmq', 'nats', 'poller', 'listen'))
        NOT VALID;
ALTER TABLE endpoints VALIDATE CONSTRAINT endpoints_transport_kind;

-- A polling endpoint's poll token (`rhpoll_…`), by its SHA-256: the bearer a customer polls
-- with instead of the project's API key; it opens this endpoint's poller routes and nothing
-- else. One per endpoint (a new one replaces it); looked up by equality on the unique
-- index, like API keys. A table of its own, so no index is built on `endpoints`.
CREATE TABLE poll_tokens (
    endpoint_id  text        PRIMARY KEY REFERENCES endpoints (id),
    token_hash   bytea       NOT NULL UNIQUE CHECK (octet_length(token_hash) = 32),
    created_at   timestamptz NOT NULL DEFAULT now()
);

-- A consumer's committed position in a polling endpoint's stream: the Sequence Number of the
-- last Delivery it has been given. Moved forward by its polls (never back), anywhere by a
-- seek. One row per (endpoint, consumer id), created by the consumer's first poll or seek;
-- an idle consumer is this row and nothing else.
CREATE TABLE poller_consumers (
    endpoint_id  text        NOT NULL REFERENCES endpoints (id),
    consumer_id  text        NOT NULL,
    position     bigint      NOT NULL DEFAULT 0 CHECK (position >= 0),
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (endpoint_id, consumer_id)
);

-- A poller's Deliveries are ordered: the ingest numbers them right after its commit (and the
-- worker's ordering gate any it could not), and a Sequence Number is handed out under the
-- endpoint's counter row lock, so number n+1 becomes visible only after number n did. That is
-- what lets a reader's position be a number it never has to revisit.
CREATE OR REPLACE FUNCTION railhook_live_subscriptions(p_project text)
RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT coalesce((
        SELECT json_agg(json_build_object('id', s.id, 'endpoint_id', s.endpoint_id,
                                          'event_types', s.event_types,
                                          'ordered', s.ordered OR e.transport = 'poller',
                                          'application_id', e.application_id,
                                          'channels', e.channels,
                                          'endpoint_filter', e.filter,
                                          'filter', s.filter)
                        ORDER BY s.id)
        FROM subscriptions s JOIN endpoints e ON e.id = s.endpoint_id
        WHERE s.project_id = p_project AND s.deleted_at IS NULL
          AND e.deleted_at IS NULL AND e.enabled), '[]')::text
$$;
