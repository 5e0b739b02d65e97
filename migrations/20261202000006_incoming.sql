-- Incoming webhooks: a Source receives one provider's webhooks at POST /in/{source_id}.
CREATE TABLE sources (
    id          text PRIMARY KEY,
    project_id  text        NOT NULL REFERENCES projects (id),
    provider    text        NOT NULL CHECK (provider IN ('github', 'stripe', 'shopify', 'standard', 'generic')),
    name        text        NOT NULL DEFAULT '',
    -- The provider's verification secret (GitHub's webhook secret, Stripe's whsec_…,
    -- Shopify's app secret, a Standard Webhooks whsec_…). Never returned by the API.
    secret      text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    deleted_at  timestamptz
);
CREATE INDEX sources_project_idx ON sources (project_id, id) WHERE deleted_at IS NULL;

-- A Destination is an endpoint that belongs to a Source: the same row, so the same Claim,
-- Attempt Runner, signing, breaker and limits apply; Deliveries to it are 'incoming'.
ALTER TABLE endpoints ADD COLUMN source_id text REFERENCES sources (id);
CREATE INDEX endpoints_source_idx ON endpoints (source_id) WHERE source_id IS NOT NULL AND deleted_at IS NULL;

-- What an incoming Event forwards: the provider's body byte for byte (it may not even be
-- JSON, and re-serialising JSON would break any signature the destination checks), and a
-- safe subset of the provider's headers.
ALTER TABLE events ADD COLUMN raw_body bytea;
ALTER TABLE events ADD COLUMN forward_headers jsonb;
