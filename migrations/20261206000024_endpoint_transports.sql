-- Endpoints beyond HTTP (docs/DESTINATIONS.md): an endpoint's transport, what the API shows
-- of its settings, and the whole settings (credentials included) sealed with the keyring
-- that seals signing secrets. Every existing endpoint stays `http`: the default.
ALTER TABLE endpoints
    ADD COLUMN transport text NOT NULL DEFAULT 'http',
    -- The settings without their credentials: what the API, the dashboard and the portal show.
    ADD COLUMN transport_settings jsonb,
    -- The settings with their credentials, sealed (common/src/sealing.rs); read only by the
    -- worker, when an Attempt is made.
    ADD COLUMN transport_secret text;

-- The checks are added NOT VALID (no scan under the table's lock) and validated after.
ALTER TABLE endpoints
    ADD CONSTRAINT endpoints_transport_kind
        CHECK (transport IN ('http', 'kafka', 'sqs', 'rabbitmq', 'nats')) NOT VALID,
    ADD CONSTRAINT endpoints_transport_settings
        CHECK ((transport = 'http') = (transport_settings IS NULL AND transport_secret IS NULL))
        NOT VALID;
ALTER TABLE endpoints VALIDATE CONSTRAINT endpoints_transport_kind;
ALTER TABLE endpoints VALIDATE CONSTRAINT endpoints_transport_settings;

-- The broker kinds a project's customer portal offers beside HTTP (none by default: a
-- project chooses which of its customers' queues it is willing to deliver into).
ALTER TABLE portal_settings ADD COLUMN endpoint_types text[] NOT NULL DEFAULT '{}';
